"""Seed-style ops generated from one table: a row maps a cuDNN frontend wrapper's parameter names,
defaults and return order onto a spec, and the wrapper (``fusegemm.<name>``), its cuDNN spelling in
:mod:`fusegemm.compat` and its parameter docs are generated from the row. The call runs the one
engine (:class:`fusegemm.Op`); the row holds no code.

A row says, for the wrapper's parameters:

* ``operands`` -- which parameter passes each of the kernel class's operands;
* ``inputs`` -- which parameter passes each of the epilogue's inputs (by spec name);
* ``axes`` -- which parameter chooses each variant axis, and how (``dtype``: a dtype argument;
  ``tensor_dtype``: the dtype of a tensor, ``none`` without one; ``bool``; ``scheduler``:
  ``use_dynamic_sched``; ``weight_mode``: dense unless the parameter is None);
* ``fixed`` -- parameters this op takes at one value only, and why (``ArgumentError`` otherwise);
* ``returns`` -- the wrapper's outputs in order: a spec output, or None where this op produces none;
* ``into`` -- outputs also written into a caller's tensor when one is passed (cuDNN's
  zero-initialised ``dprob_tensor``).

Adding a seed-like op is a spec and a row here; nothing else changes.
"""
from __future__ import annotations

import ast
import inspect
from dataclasses import dataclass
from typing import Any, Callable

from .base.errors import ArgumentError
from .ops.prepared import OpCache
from .tupledict import TupleDict

_BF16_GLU_WHY = ("the BF16 backend: block-scaled GLU operands need a gate/up-paired accumulator, which the "
                 "block-scaled kernels do not implement")


@dataclass(frozen=True)
class Preset:
    """One seed-style op (see the module docstring for the fields)."""

    name: str
    spec: str
    cudnn: str
    params: str
    operands: tuple[tuple[str, str], ...]
    inputs: tuple[tuple[str, str], ...]
    axes: tuple[tuple[str, str, str], ...]
    returns: tuple[tuple[str, str | None], ...]
    summary: str
    fixed: tuple[tuple[str, Any, str], ...] = ()
    into: tuple[tuple[str, str], ...] = ()

    def signature(self) -> inspect.Signature:
        """The wrapper's signature, from ``params`` (names and literal defaults only: a row is
        data, nothing in it runs)."""
        fn = ast.parse(f"def f({self.params}): pass").body[0]
        a = fn.args
        params = []
        positional = a.args
        defaults = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
        for arg, d in zip(positional, defaults):
            params.append(inspect.Parameter(arg.arg, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                            default=inspect.Parameter.empty if d is None else ast.literal_eval(d)))
        for arg, d in zip(a.kwonlyargs, a.kw_defaults):
            params.append(inspect.Parameter(arg.arg, inspect.Parameter.KEYWORD_ONLY,
                                            default=inspect.Parameter.empty if d is None else ast.literal_eval(d)))
        return inspect.Signature(params)


_COMMON = ("mma_tiler_mn=None, cluster_shape_mn=None, sf_vec_size=16, vector_f32=False, m_aligned=256, "
           "discrete_col_sfd=False")
_FIXED_BF16 = (("acc_dtype", "float32", "FP32 accumulation"), ("cd_major", "n", "row-major C and D"),
               ("m_aligned", 256, "every expert's rows padded to 256"),
               ("discrete_col_sfd", False, "BF16 outputs have no SFD"),
               ("sf_vec_size", 16, "BF16 operands have no scales"),
              ("use_single_group_runtime_offsets", False, "padded_offsets are per expert"))
_NO_SCALES = (("sfa_tensor", None, _BF16_GLU_WHY), ("sfb_tensor", None, _BF16_GLU_WHY),
              ("sfb_ptrs", None, _BF16_GLU_WHY), ("norm_const_tensor", None, "BF16 outputs have no SFD"))
_GLU_ACT = (("linear_offset", None, "SwiGLU has no linear offset"),
            ("geglu_alpha", 1.702, "the BF16 backend takes the default only"),
            ("glu_clamp_max", 7.0, "the BF16 backend takes the default only"),
            ("glu_clamp_min", -7.0, "the BF16 backend takes the default only"))
_DENSE_OR_DISCRETE = (("a_tensor", "a_tensor"), ("padded_offsets", "padded_offsets"), ("b_tensor", "b_tensor"),
                      ("b_ptrs", "b_ptrs"), ("n", "n"))
_SHARED_AXES = (("weight_mode", "weight_mode", "b_tensor"), ("b_major", "value", "b_major"),
                ("scheduler", "scheduler", "use_dynamic_sched"), ("vector_f32", "bool", "vector_f32"))

PRESETS: tuple[Preset, ...] = (
    Preset(
        name="grouped_gemm_glu", spec="grouped_gemm_glu", cudnn="grouped_gemm_glu_wrapper_sm100",
        params=("a_tensor, sfa_tensor=None, padded_offsets=None, alpha_tensor=None, b_tensor=None, sfb_tensor=None, "
                "bias_tensor=None, b_ptrs=None, sfb_ptrs=None, n=None, b_dtype=None, b_major='k', "
                "norm_const_tensor=None, prob_tensor=None, acc_dtype='float32', c_dtype='bfloat16', "
                "d_dtype='bfloat16', cd_major='n', " + _COMMON + ", act_func='swiglu', linear_offset=None, "
                "geglu_alpha=1.702, glu_clamp_max=7.0, glu_clamp_min=-7.0, use_dynamic_sched=False, "
                "use_single_group_runtime_offsets=False, current_stream=None, generate_c=False"),
        operands=_DENSE_OR_DISCRETE,
        inputs=(("alpha", "alpha_tensor"), ("prob", "prob_tensor"), ("bias", "bias_tensor")),
        axes=(("c_dtype", "dtype", "c_dtype"), ("d_dtype", "dtype", "d_dtype"),
              ("bias_dtype", "tensor_dtype", "bias_tensor"), ("generate_c", "bool", "generate_c"), *_SHARED_AXES),
        fixed=(*_FIXED_BF16, *_NO_SCALES, *_GLU_ACT,
               ("act_func", "swiglu", "this op is SwiGLU's spec; another activation is a spec of its own")),
        returns=(("c_tensor", "c"), ("d_tensor", "d"), ("d_col_tensor", None), ("amax_tensor", None),
                 ("sfd_row_tensor", None), ("sfd_col_tensor", None)),
        summary="Grouped BF16 GEMM + SwiGLU (cuDNN's grouped_gemm_glu, act_func='swiglu'): with G = alpha[e] * "
                "A_e @ B_e^T (+ bias) in 32-column gate/up blocks, D = prob * up * silu(gate), half as wide; "
                "C = G with generate_c."),
    Preset(
        name="grouped_gemm_dglu", spec="grouped_gemm_dglu", cudnn="grouped_gemm_dglu_wrapper_sm100",
        params=("a_tensor, c_tensor, sfa_tensor, padded_offsets, alpha_tensor, beta_tensor, prob_tensor, "
                "dprob_tensor, b_tensor=None, sfb_tensor=None, generate_dbias=False, b_ptrs=None, sfb_ptrs=None, "
                "n=None, b_dtype=None, b_major='k', norm_const_tensor=None, acc_dtype='float32', "
                "d_dtype='bfloat16', cd_major='n', " + _COMMON + ", act_func='dswiglu', linear_offset=None, "
                "geglu_alpha=1.702, glu_clamp_max=7.0, glu_clamp_min=-7.0, epilogue_op=None, "
                "use_dynamic_sched=False, use_single_group_runtime_offsets=False, current_stream=None"),
        operands=_DENSE_OR_DISCRETE,
        inputs=(("alpha", "alpha_tensor"), ("beta", "beta_tensor"), ("prob", "prob_tensor"), ("c", "c_tensor")),
        axes=(("c_dtype", "tensor_dtype", "c_tensor"), ("d_dtype", "dtype", "d_dtype"), *_SHARED_AXES),
        fixed=(*_FIXED_BF16, *_NO_SCALES, *_GLU_ACT, ("act_func", "dswiglu", "this op is dSwiGLU's spec; another activation is a spec of its own"),
               ("generate_dbias", False, "the bias gradient of a paired D (gate/up blocks) needs a paired "
                                         "column sum, which the epilogue language does not have yet"),
               ("epilogue_op", None, "NVIDIA's kernel applies none")),
        returns=(("d_row_tensor", "d"), ("d_col_tensor", None), ("dprob_tensor", "dprob"), ("dbias_tensor", None),
                 ("amax_tensor", None), ("sfd_row_tensor", None), ("sfd_col_tensor", None)),
        into=(("dprob", "dprob_tensor"),),
        summary="Grouped BF16 GEMM + dSwiGLU backward (cuDNN's grouped_gemm_dglu, act_func='dswiglu'): R = "
                "alpha[e]^2 * A_e @ B_e^T; with the forward's C (M, 2N) scaled by beta[e], D holds dSwiGLU in the "
                "gate blocks and R * prob * swish(g) in the up blocks; dprob += sum(swish(g) * u * R) per row."),
    Preset(
        name="grouped_gemm_dsrelu", spec="grouped_gemm_dsrelu", cudnn="grouped_gemm_dsrelu_wrapper_sm100",
        params=("a_tensor, b_tensor=None, c_tensor=None, sfa_tensor=None, sfb_tensor=None, padded_offsets=None, "
                "alpha_tensor=None, prob_tensor=None, dprob_tensor=None, generate_dbias=False, b_ptrs=None, "
                "sfb_ptrs=None, n=None, b_dtype=None, b_major='k', norm_const_tensor=None, acc_dtype='float32', "
                "d_dtype='bfloat16', cd_major='n', " + _COMMON + ", use_dynamic_sched=False, current_stream=None"),
        operands=_DENSE_OR_DISCRETE,
        inputs=(("alpha", "alpha_tensor"), ("prob", "prob_tensor"), ("c", "c_tensor")),
        axes=(("c_dtype", "tensor_dtype", "c_tensor"), ("d_dtype", "dtype", "d_dtype"),
              ("generate_dbias", "bool", "generate_dbias"), *_SHARED_AXES),
        fixed=(*_FIXED_BF16[:5], *_NO_SCALES),
        returns=(("d_row_tensor", "d"), ("d_col_tensor", None), ("dprob_tensor", "dprob"), ("dbias_tensor", "dbias"),
                 ("amax_tensor", "amax"), ("sfd_row_tensor", None), ("sfd_col_tensor", None)),
        into=(("dprob", "dprob_tensor"),),
        summary="Grouped BF16 GEMM + dsReLU, the backward of seed 002's sReLU: with G = alpha[e] * A_e @ B_e^T "
                "(the gradient of D) and the forward's pre-activation C, D = 2 * prob * relu(C) * G, dprob += "
                "sum(relu(C)^2 * G) per row, and a per-expert amax of a bf16/fp16 D; generate_dbias adds "
                "dbias (L, N[, 1]) float32, the column sums of D over each expert's rows."),
)
BY_NAME = {p.name: p for p in PRESETS}


def _axis_value(how: str, value: Any, param: str) -> Any:
    from .formats.numpy_dtypes import dtype_name
    from .runtime.tensors import view
    if how == "dtype":
        name = dtype_name(value)
        if name is None:
            raise ArgumentError(param, repr(value), "a dtype (torch, numpy or its name)")
        return name
    if how == "tensor_dtype":
        return "none" if value is None else view(value, param).dtype
    if how in ("bool", "scheduler"):
        from .ops.arg_checks import bool_arg   # imports numpy: on first use, not at import
        value = bool_arg(value, param)
        return ("dynamic" if value else "static") if how == "scheduler" else value
    if how == "weight_mode":
        return "dense" if value is not None else "discrete"
    return value


def _pair(value: Any, name: str) -> tuple[int, int]:
    if (not isinstance(value, (tuple, list)) or len(value) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)):
        raise ArgumentError(name, repr(value), "None or a pair of ints")
    return int(value[0]), int(value[1])


_OPS = OpCache()


def call(row: Preset, bound: dict[str, Any]) -> TupleDict:
    """Run ``row``'s op on its wrapper's bound arguments; the outputs in the row's return order."""
    from .ops.engine import Op
    from .ops.scaled_seeds import VALIDATION_ARCH
    from .runtime.tensors import view
    for param, allowed, why in row.fixed:
        value = bound.get(param)
        if isinstance(allowed, str) and value is not None and not isinstance(value, str):
            value = _axis_value("dtype", value, param) if param.endswith("_dtype") else value
        if value != allowed and not (param.endswith("_dtype") and value is None):   # a None dtype: the default
            raise ArgumentError(param, repr(bound.get(param)), repr(allowed), why)
    axes = {axis: _axis_value(how, bound[param], param) for axis, how, param in row.axes}
    if bound.get("mma_tiler_mn") is not None:
        axes["tile_m"], axes["tile_n"] = _pair(bound["mma_tiler_mn"], "mma_tiler_mn")
    if bound.get("cluster_shape_mn") is not None:
        axes["cluster_m"], axes["cluster_n"] = _pair(bound["cluster_shape_mn"], "cluster_shape_mn")
    b_dtype = bound.get("b_dtype")
    if b_dtype is not None and _axis_value("dtype", b_dtype, "b_dtype") != "bfloat16":
        raise ArgumentError("b_dtype", repr(b_dtype), "None or bfloat16 (the weights' dtype)")
    a = view(bound["a_tensor"], "a_tensor")
    device = a.device[1] if a.is_cuda else 0
    # A CPU tensor: every check on the validation arch's variant, then the device's refusal.
    arch = None if a.is_cuda else VALIDATION_ARCH
    op = _OPS.get_or_create((row.name, device, tuple(sorted(axes.items()))),
                            lambda: Op(row.spec, device=device, arch=arch, **axes))
    out = op(**{k: bound[p] for k, p in row.operands}, inputs={i: bound[p] for i, p in row.inputs},
             input_names=dict(row.inputs), current_stream=bound.get("current_stream"))
    # The seed's layouts for a (M, K, 1) A: (M, N, 1) rows, (M, 1, 1) dprob, (L, N, 1) dbias.
    rows = set(op.epilogue.row_buffers())
    shaped = {k: (v if a.ndim == 2 else v.unsqueeze(-1) if k in rows or k == "dbias" else v.view(-1, 1, 1)
                  if k == "dprob" else v) for k, v in out.items()}
    for spec_out, param in row.into:
        given = bound.get(param)
        if given is not None and spec_out in shaped:
            given.copy_(shaped[spec_out].view_as(given))   # the caller zero-initialised it, as cuDNN asks
            shaped[spec_out] = given
    return TupleDict(**{name: shaped.get(spec_out) if spec_out else None for name, spec_out in row.returns})


def wrapper(row: Preset) -> Callable[..., TupleDict]:
    """The seed-style function of ``row``: its signature, docs and the engine call."""
    from .runtime.interop import dlpack_io
    sig = row.signature()

    def run(*args: Any, **kwargs: Any) -> TupleDict:
        try:
            b = sig.bind(*args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"{row.name}(): {exc}") from None
        b.apply_defaults()
        return call(row, dict(b.arguments))
    run.__name__ = run.__qualname__ = row.name
    run.__module__ = __name__
    run.__signature__ = sig   # type: ignore[attr-defined]
    outs = ", ".join(name for name, spec_out in row.returns)
    run.__doc__ = (f"{row.summary}\n\nGenerated from the preset row of spec ``{row.spec}`` (cuDNN: "
                   f"``{row.cudnn}``). Returns ``TupleDict({outs})``; outputs this op does not produce are None.\n\n"
                   "Parameters\n----------\n" + "\n".join(f"{p}\n    {_param_doc(row, p)}" for p in sig.parameters))
    return dlpack_io(run)


def _param_doc(row: Preset, param: str) -> str:
    """What a parameter does in this op, from the row."""
    for i, p in row.inputs:
        if p == param:
            return f"The epilogue's input ``{i}`` (``fusegemm show {row.spec}``)."
    for o, p in row.operands:
        if p == param:
            return f"The ``{o}`` operand (:class:`fusegemm.Op`)."
    for axis, how, p in row.axes:
        if p == param:
            return f"Chooses the ``{axis}`` axis ({how})."
    for p, allowed, why in row.fixed:
        if p == param:
            return f"Only {allowed!r} here: {why}."
    for spec_out, p in row.into:
        if p == param:
            return f"Optional zero-initialised output: ``{spec_out}`` is written into it."
    return {"mma_tiler_mn": "(int, int), optional: the MMA tile; default the arch kernel's.",
            "cluster_shape_mn": "(int, int), optional: the cluster; default the arch kernel's.",
            "current_stream": "Where to launch; default torch's current stream.",
            "b_dtype": "dtype of discrete weights (bfloat16)."}.get(param, "As in the cuDNN frontend wrapper.")


# The generated wrappers, as module attributes (fusegemm.<name> and fusegemm.compat read them here).
for _row in PRESETS:
    globals()[_row.name] = wrapper(_row)
del _row
