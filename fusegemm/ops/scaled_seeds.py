"""The block-scaled seed wrappers: grouped GEMM + sReLU (seed 002), + quant (seed 003) and
+ dSwiGLU (seed 000), with the seeds' parameter names, defaults and return order.

Each wrapper turns its seed options into variant axes, fetches (or compiles) the
:class:`~fusegemm.ops.blockscaled.BlockScaledGemm` of its spec for that variant, passes the
epilogue's inputs by spec name and returns the outputs in the seed's layout: ``(M, N, 1)`` outputs
and kernel-facing SF views for a ``(M, K, 1)`` A, ``(M, N)`` and physical SF buffers for a 2-D A
(exactly as :mod:`fusegemm.reference` returns them). FP8 outputs come back as torch FP8 tensors,
packed FP4 as ``uint8``, SFD in the scale dtype of ``sfa_tensor``. Packed FP4 A/B are ``uint8`` or
``torch.float4_e2m1fn_x2`` (the seeds' two spellings of the same bytes). ``vector_f32=True`` builds
the packed-FP32 epilogue on sm_100a (the same results); sm_90a runs its scalar kernel. An operand
layout valid for an op but not launched here raises UnsupportedError (scaled_layouts.py).

Seed options that only choose a kernel (``mma_tiler_mn``, ``cluster_shape_mn``) default to
None here: the arch's preferred tile and cluster (``fusegemm show SPEC``); the seeds' defaults
((256, 256), (2, 1)) are what sm_100a prefers.
"""
from __future__ import annotations

from typing import Any

from ..arguments import M_ALIGNED
from .. import reference as _reference
from ..base.docstrings import shares_parameters
from ..base.errors import ArgumentError
from ..formats.scales import sf_to_kernel_view
from ..runtime.interop import dlpack_io
from ..runtime.tensors import view
from ..tupledict import TupleDict
from . import arg_checks as checks
from .blockscaled import BlockScaledGemm
from .scaled_operands import SF_AXIS, ab_axis
from .param_docs import GPU
from .prepared import OpCache
from .scaled_layouts import check_layouts, layout_axes

E5M2_RCP_MAX = ("page", "nvidia")
_OPS = OpCache()


def _common(*, acc_dtype: Any, cd_major: str, m_aligned: int, vector_f32: Any, e5m2_rcp_max: str,
            mma_tiler_mn: Any, cluster_shape_mn: Any) -> dict[str, Any]:
    """Options every block-scaled seed shares; the axes they choose."""
    checks.dtype_arg(acc_dtype, "acc_dtype", ("float32",))
    if cd_major != "n":
        raise ArgumentError("cd_major", repr(cd_major), "'n'")
    if m_aligned != M_ALIGNED:
        raise ArgumentError("m_aligned", m_aligned, str(M_ALIGNED))
    # vector_f32: packed FP32 epilogue math on sm_100a, the same results; sm_90a runs it with its
    # scalar math, the same kernel (generator/registry.py ``runs_as``).
    packed = checks.bool_arg(vector_f32, "vector_f32")
    if e5m2_rcp_max not in E5M2_RCP_MAX:
        raise ArgumentError("e5m2_rcp_max", repr(e5m2_rcp_max), "'page', 'nvidia'")
    axes: dict[str, Any] = {"vector_f32": packed}
    if mma_tiler_mn is not None:
        axes["tile_m"], axes["tile_n"] = checks.pair_arg(mma_tiler_mn, "mma_tiler_mn")
    if cluster_shape_mn is not None:
        axes["cluster_m"], axes["cluster_n"] = checks.pair_arg(cluster_shape_mn, "cluster_shape_mn")
    return axes


def _operand_axes(a_tensor: Any, sfa_tensor: Any, sf_vec_size: Any, b_tensor: Any, b_dtype: Any,
                  b_major: str) -> dict[str, Any]:
    """ab_dtype, sf_dtype, sf_vec_size, weight_mode and b_major from the operands."""
    from .scaled_operands import AB_DTYPES, SF_DTYPES
    a = view(a_tensor, "a_tensor")
    if a.dtype not in AB_DTYPES:
        raise ArgumentError("a_tensor.dtype", a.dtype, ", ".join(AB_DTYPES) + " (uint8: packed FP4 bytes)")
    if sfa_tensor is None:
        raise ArgumentError("sfa_tensor", None, "a tensor", "block-scaled A/B need their scale factors")
    sf = view(sfa_tensor, "sfa_tensor").dtype
    if sf not in SF_DTYPES:
        raise ArgumentError("sfa_tensor.dtype", sf, ", ".join(SF_DTYPES) + " (uint8/int8: E8M0 bytes)")
    if isinstance(sf_vec_size, bool) or sf_vec_size not in (16, 32):
        raise ArgumentError("sf_vec_size", repr(sf_vec_size), "16, 32")
    if b_dtype is not None and ab_axis(checks.dtype_arg(b_dtype, "b_dtype", AB_DTYPES)) != ab_axis(a.dtype):
        raise ArgumentError("b_dtype", repr(b_dtype), f"None or {a.dtype} (the dtype of a_tensor)")
    if b_major not in ("k", "n"):
        raise ArgumentError("b_major", repr(b_major), "'k', 'n'")
    return {"ab_dtype": ab_axis(a.dtype), "sf_dtype": SF_AXIS[sf], "sf_vec_size": sf_vec_size,
            "weight_mode": "dense" if b_tensor is not None else "discrete", "b_major": b_major}


# Arch whose variant validates the arguments of a call whose a_tensor is not on a GPU: every check
# runs, then the device check refuses the call (nothing is compiled or launched).
VALIDATION_ARCH = "sm_100a"


def _op(spec: str, a_tensor: Any, e5m2_rcp_max: str, axes: dict[str, Any]) -> BlockScaledGemm:
    """The cached op of this configuration on a_tensor's device (compiled on its first launch)."""
    from .device import device_arch
    from ..generator import registry
    a = view(a_tensor, "a_tensor")
    device = a.device[1] if a.is_cuda else 0
    arch = device_arch(device) if a.is_cuda else VALIDATION_ARCH
    row = registry.lookup(spec, arch)
    if row is not None:   # what this arch runs the axes as (sm_90a: vector_f32 as scalar): one op
        axes = row.canonical(axes)
    key = (spec, arch, device, e5m2_rcp_max, tuple(sorted(axes.items())))
    return _OPS.get_or_create(key, lambda: BlockScaledGemm(spec, arch=arch, device=device,
                                                           e5m2_rcp_max=e5m2_rcp_max, **axes))


def _bias_axis(bias_tensor: Any) -> str:
    return "none" if bias_tensor is None else view(bias_tensor, "bias_tensor").dtype


def _present(**inputs: Any) -> dict[str, Any]:
    return {k: v for k, v in inputs.items() if v is not None}


def _torch_dtype(name: str) -> Any:
    import torch
    return getattr(torch, name)


def _shape_out(out: dict[str, Any], op: BlockScaledGemm, canonical: bool, sf_dtype: str) -> dict[str, Any]:
    """Outputs in the seed's layout: C/D as their dtype (FP8 views of the stored bytes, packed FP4
    as uint8), (M, N, 1) unless canonical; SF in sfa's dtype, kernel-facing unless canonical."""
    dtypes = {o.name: o.dtype for o in op.epilogue.outputs}
    for o in op.epilogue.outputs:
        if o.quantize is not None and o.quantize.col:
            dtypes[o.quantize.col] = o.dtype
    shaped: dict[str, Any] = {}
    for name, t in out.items():
        if name in dtypes:
            if dtypes[name] in ("float8_e4m3fn", "float8_e5m2"):
                t = t.view(_torch_dtype(dtypes[name]))
            shaped[name] = t if canonical else t.unsqueeze(-1)
        elif name in ("sfd_row", "sfd_col"):
            t = t.view(_torch_dtype(sf_dtype))
            shaped[name] = t if canonical else sf_to_kernel_view(t)
        elif name == "dprob":
            shaped[name] = t if canonical else t.view(-1, 1, 1)
        else:
            shaped[name] = t
    return shaped


@dlpack_io
@shares_parameters(_reference.grouped_gemm_srelu, extra=GPU)
def grouped_gemm_srelu(a_tensor: Any, b_tensor: Any = None, sfa_tensor: Any = None, sfb_tensor: Any = None,
                       padded_offsets: Any = None, alpha_tensor: Any = None, bias_tensor: Any = None,
                       b_ptrs: Any = None, sfb_ptrs: Any = None, n: int | None = None, b_dtype: Any = None,
                       b_major: str = "k", norm_const_tensor: Any = None, prob_tensor: Any = None,
                       acc_dtype: Any = "float32", c_dtype: Any = "bfloat16", d_dtype: Any = "bfloat16",
                       cd_major: str = "n", mma_tiler_mn: Any = None, cluster_shape_mn: Any = None,
                       sf_vec_size: int = 16, vector_f32: bool = False, m_aligned: int = 256,
                       discrete_col_sfd: bool = False, use_dynamic_sched: bool = False,
                       current_stream: Any = None, *, tanh_clamp_scale: float | None = None,
                       e5m2_rcp_max: str = "page") -> TupleDict:
    """Grouped block-scaled GEMM + prob-gated squared ReLU (seed 002).

    ``C = alpha[e] * dequant(A) @ dequant(B_e)^T`` (+ bias, not gated), ``D = prob * relu(C)^2``
    (with ``tanh_clamp_scale=s``: ``prob * (s * min(tanh(relu(C) / s), 1))^2``). FP8/FP4 D is
    quantized with SFD_row / SFD_col; bf16/fp16 D gets a per-expert amax ``(L, 1)``.
    Arguments as :func:`fusegemm.reference.grouped_gemm_srelu` (the host reference), with device
    tensors; discrete weights pass ``b_ptrs``, ``sfb_ptrs`` and ``n``.

    Returns ``TupleDict(c_tensor, d_tensor, d_col_tensor, amax_tensor, sfd_row_tensor,
    sfd_col_tensor)``; absent outputs are None.
    """
    axes = srelu_axes(a_tensor, sfa_tensor, b_tensor, sf_vec_size=sf_vec_size, b_dtype=b_dtype, b_major=b_major,
                      c_name=checks.dtype_arg(c_dtype, "c_dtype", _OUT),
                      d_name=checks.dtype_arg(d_dtype, "d_dtype", _OUT), bias=bias_tensor,
                      discrete_col_sfd=discrete_col_sfd, use_dynamic_sched=use_dynamic_sched,
                      tanh_clamp_scale=tanh_clamp_scale, acc_dtype=acc_dtype, cd_major=cd_major,
                      m_aligned=m_aligned, vector_f32=vector_f32, e5m2_rcp_max=e5m2_rcp_max,
                      mma_tiler_mn=mma_tiler_mn, cluster_shape_mn=cluster_shape_mn)
    op = _op("grouped_gemm_srelu", a_tensor, e5m2_rcp_max, axes)
    check_layouts(op)
    out = op(a_tensor, sfa_tensor, padded_offsets, b_tensor, sfb_tensor, b_ptrs=b_ptrs, sfb_ptrs=sfb_ptrs, n=n,
             inputs=_present(alpha=alpha_tensor, prob=prob_tensor, bias=bias_tensor, norm_const=norm_const_tensor),
             current_stream=current_stream, input_names=SEED_NAMES)
    o = _shape_out(out, op, view(a_tensor, "a_tensor").ndim == 2, view(sfa_tensor, "sfa_tensor").dtype)
    return TupleDict(c_tensor=o.get("c"), d_tensor=o.get("d"), d_col_tensor=o.get("d_col"),
                     amax_tensor=o.get("amax"), sfd_row_tensor=o.get("sfd_row"), sfd_col_tensor=o.get("sfd_col"))


@dlpack_io
@shares_parameters(_reference.grouped_gemm_quant, extra=GPU)
def grouped_gemm_quant(a_tensor: Any, sfa_tensor: Any, padded_offsets: Any, alpha_tensor: Any,
                       b_tensor: Any = None, sfb_tensor: Any = None, bias_tensor: Any = None, b_ptrs: Any = None,
                       sfb_ptrs: Any = None, n: int | None = None, b_dtype: Any = None, b_major: str = "k",
                       norm_const_tensor: Any = None, prob_tensor: Any = None, acc_dtype: Any = "float32",
                       d_dtype: Any = "bfloat16", cd_major: str = "n", mma_tiler_mn: Any = None,
                       cluster_shape_mn: Any = None, sf_vec_size: int = 16, vector_f32: bool = False,
                       m_aligned: int = 256, discrete_col_sfd: bool = False, use_dynamic_sched: bool = False,
                       current_stream: Any = None, *, row_scale_tensor: Any = None, generate_amax: bool = True,
                       e5m2_rcp_max: str = "page") -> TupleDict:
    """Grouped block-scaled GEMM + prob gating + output quantization (seed 003).

    ``D = prob * alpha[e] * row_scale * dequant(A) @ dequant(B_e)^T`` (with bias: prob scales only
    the bias); FP8/FP4 D is quantized with SFD_row / SFD_col, bf16/fp16 D gets a per-expert amax
    ``(L, 1)`` (``generate_amax``). Arguments as :func:`fusegemm.reference.grouped_gemm_quant`.

    Returns ``TupleDict(d_tensor, d_col_tensor, amax_tensor, sfd_row_tensor, sfd_col_tensor)``.
    """
    axes = quant_axes(a_tensor, sfa_tensor, b_tensor, sf_vec_size=sf_vec_size, b_dtype=b_dtype, b_major=b_major,
                      d_name=checks.dtype_arg(d_dtype, "d_dtype", _OUT), bias=bias_tensor,
                      discrete_col_sfd=discrete_col_sfd, use_dynamic_sched=use_dynamic_sched, acc_dtype=acc_dtype,
                      cd_major=cd_major, m_aligned=m_aligned, vector_f32=vector_f32, e5m2_rcp_max=e5m2_rcp_max,
                      mma_tiler_mn=mma_tiler_mn, cluster_shape_mn=cluster_shape_mn)
    want_amax = checks.bool_arg(generate_amax, "generate_amax")
    op = _op("grouped_gemm_quant", a_tensor, e5m2_rcp_max, axes)
    check_layouts(op)
    out = op(a_tensor, sfa_tensor, padded_offsets, b_tensor, sfb_tensor, b_ptrs=b_ptrs, sfb_ptrs=sfb_ptrs, n=n,
             inputs=_present(alpha=alpha_tensor, prob=prob_tensor, row_scale=row_scale_tensor, bias=bias_tensor,
                             norm_const=norm_const_tensor),
             current_stream=current_stream, input_names=SEED_NAMES)
    o = _shape_out(out, op, view(a_tensor, "a_tensor").ndim == 2, view(sfa_tensor, "sfa_tensor").dtype)
    return TupleDict(d_tensor=o.get("d"), d_col_tensor=o.get("d_col"),
                     amax_tensor=o.get("amax") if want_amax else None,
                     sfd_row_tensor=o.get("sfd_row"), sfd_col_tensor=o.get("sfd_col"))


@dlpack_io
@shares_parameters(_reference.grouped_gemm_dswiglu, extra=GPU)
def grouped_gemm_dswiglu(a_tensor: Any, b_tensor: Any, c_tensor: Any, sfa_tensor: Any, sfb_tensor: Any,
                         padded_offsets: Any, alpha_tensor: Any, beta_tensor: Any, prob_tensor: Any,
                         norm_const_tensor: Any = None, acc_dtype: Any = "float32", d_dtype: Any = "bfloat16",
                         cd_major: str = "n", mma_tiler_mn: Any = None, cluster_shape_mn: Any = None,
                         sf_vec_size: int = 16, vector_f32: bool = False, m_aligned: int = 256,
                         discrete_col_sfd: bool = False, epilogue_op: str | None = None,
                         current_stream: Any = None, *, e5m2_rcp_max: str = "page") -> TupleDict:
    """Grouped block-scaled GEMM + dSwiGLU backward epilogue (seed 000).

    ``R = alpha[e]^2 * dequant(A) @ dequant(B_e)^T``; with the forward C ``(M, 2N)`` scaled by
    ``beta[e]`` (32-column gate/up blocks), D ``(M, 2N)`` holds dSwiGLU in the gate blocks and
    ``R * prob * swish(g)`` in the up blocks, ``dprob += sum(swish(g) * u * R)`` per row.
    Arguments as :func:`fusegemm.reference.grouped_gemm_dswiglu`; ``epilogue_op`` is accepted
    and not applied, as NVIDIA's kernel does.

    Returns ``TupleDict(d_row_tensor, d_col_tensor, dprob_tensor, amax_tensor, sfd_row_tensor,
    sfd_col_tensor)``.
    """
    check_epilogue_op(epilogue_op)
    axes = dswiglu_axes(a_tensor, sfa_tensor, b_tensor, sf_vec_size=sf_vec_size, c=c_tensor, c_arg="c_tensor",
                        d_name=checks.dtype_arg(d_dtype, "d_dtype", _OUT), discrete_col_sfd=discrete_col_sfd,
                        prob=prob_tensor, prob_arg="prob_tensor", acc_dtype=acc_dtype, cd_major=cd_major,
                        m_aligned=m_aligned, vector_f32=vector_f32, e5m2_rcp_max=e5m2_rcp_max,
                        mma_tiler_mn=mma_tiler_mn, cluster_shape_mn=cluster_shape_mn)
    op = _op("grouped_gemm_dswiglu", a_tensor, e5m2_rcp_max, axes)
    check_layouts(op)
    out = op(a_tensor, sfa_tensor, padded_offsets, b_tensor, sfb_tensor,
             inputs=_present(alpha=alpha_tensor, beta=beta_tensor, prob=prob_tensor, c=c_tensor,
                             norm_const=norm_const_tensor),
             current_stream=current_stream, input_names=SEED_NAMES)
    o = _shape_out(out, op, view(a_tensor, "a_tensor").ndim == 2, view(sfa_tensor, "sfa_tensor").dtype)
    amax = o.get("amax")
    return TupleDict(d_row_tensor=o.get("d"), d_col_tensor=o.get("d_col"), dprob_tensor=o.get("dprob"),
                     amax_tensor=amax.unsqueeze(-1) if amax is not None else None,
                     sfd_row_tensor=o.get("sfd_row"), sfd_col_tensor=o.get("sfd_col"))


EPILOGUE_OPS = (None, "none", "identity", "relu", "srelu")   # seed 000's epilogue_op values


def check_epilogue_op(epilogue_op: Any) -> None:
    """Seed 000's ``epilogue_op`` (wrapper and class): one of its values (accepted and not
    applied, as NVIDIA's kernel does)."""
    if epilogue_op not in EPILOGUE_OPS:
        raise ArgumentError("epilogue_op", repr(epilogue_op), ", ".join(map(repr, EPILOGUE_OPS)))


# Seed argument name of each spec input (messages name what the caller passed).
SEED_NAMES = {"alpha": "alpha_tensor", "beta": "beta_tensor", "prob": "prob_tensor", "bias": "bias_tensor",
              "norm_const": "norm_const_tensor", "row_scale": "row_scale_tensor", "c": "c_tensor"}
PROB_DTYPES = ("float32", "bfloat16")   # dSwiGLU's prob (seed 000)
_OUT = ("float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "float4_e2m1fn_x2")


def prob_axis(prob: Any, name: str) -> str:
    """dSwiGLU's prob_dtype axis from its prob tensor (float32 or bfloat16, seed 000)."""
    if prob is None:
        return "float32"
    dtype = view(prob, name).dtype
    if dtype not in PROB_DTYPES:
        raise ArgumentError(f"{name}.dtype", dtype, ", ".join(PROB_DTYPES))
    return dtype


def _clamp(tanh_clamp_scale: Any) -> Any:
    import math
    if tanh_clamp_scale is None:
        return "none"
    if isinstance(tanh_clamp_scale, bool) or not isinstance(tanh_clamp_scale, (int, float)) or not (
            math.isfinite(tanh_clamp_scale) and tanh_clamp_scale > 0):
        raise ArgumentError("tanh_clamp_scale", repr(tanh_clamp_scale), "None or a positive finite float")
    return float(tanh_clamp_scale)


@dlpack_io
@shares_parameters(_reference.gemm_amax, extra=GPU)
def gemm_amax(a_tensor: Any, b_tensor: Any, sfa_tensor: Any, sfb_tensor: Any, c_major: str = "n",
              c_dtype: Any = "float32", acc_dtype: Any = "float32", mma_tiler_mn: Any = None,
              cluster_shape_mn: Any = None, sf_vec_size: int = 32, stream: Any = None) -> TupleDict:
    """Block-scaled batched dense GEMM + global amax (seed 004).

    ``C[:, :, l] = dequant(A_l) @ dequant(B_l)^T``, ``amax = max |C|`` over everything.
    A ``(M, K, L)`` / B ``(N, K, L)`` K-major (or 2-D for L = 1), scales as the kernel-facing view,
    the physical buffer or a flat one. ``c_major`` "n" returns C with strides (N, 1, M*N), "m"
    with (1, M, M*N). Arguments as :func:`fusegemm.reference.gemm_amax`.

    Returns ``TupleDict(c_tensor, amax_tensor)``: C (M, N, L) (2-D for 2-D inputs), amax (1, 1, 1).
    """
    axes = amax_axes(a_tensor, b_tensor, sfa_tensor, sf_vec_size, c_dtype, c_major, acc_dtype, mma_tiler_mn,
                     cluster_shape_mn)
    op = _op("gemm_amax", a_tensor, "page", axes)
    check_layouts(op)
    out = op.batched(a_tensor, b_tensor, sfa_tensor, sfb_tensor, current_stream=stream)
    a = view(a_tensor, "a_tensor")
    m, l = a.shape[0], a.shape[2] if a.ndim == 3 else 1
    c = out["c"]
    if c_dtype_name(op) in ("float8_e4m3fn", "float8_e5m2"):
        c = c.view(_torch_dtype(c_dtype_name(op)))
    cols = c.shape[1]
    if c_major == "n":
        c = c.view(l, m, cols).permute(1, 2, 0)            # strides (N, 1, M*N)
    else:
        c = c.view(l, cols, m).permute(2, 1, 0)            # strides (1, M, M*N)
    if a.ndim == 2:
        c = c[:, :, 0]
    return TupleDict(c_tensor=c, amax_tensor=out["amax"].view(1, 1, 1))


def srelu_axes(a: Any, sfa: Any, b: Any, *, sf_vec_size: Any, b_dtype: Any, b_major: str, c_name: str,
               d_name: str, bias: Any, discrete_col_sfd: Any, use_dynamic_sched: Any, tanh_clamp_scale: Any,
               **options: Any) -> dict[str, Any]:
    """The variant axes of a seed 002 call (wrapper and class; output dtypes already checked,
    ``options``: :func:`_common`'s)."""
    axes = _common(**options)
    axes.update(_operand_axes(a, sfa, sf_vec_size, b, b_dtype, b_major))
    axes.update(c_dtype=c_name, d_dtype=d_name, bias_dtype=_bias_axis(bias),
                discrete_col_sfd=checks.bool_arg(discrete_col_sfd, "discrete_col_sfd"),
                scheduler=_scheduler(use_dynamic_sched), tanh_clamp_scale=_clamp(tanh_clamp_scale))
    axes.update(layout_axes("grouped_gemm_srelu", axes, a, b, batched=False))
    return axes


def quant_axes(a: Any, sfa: Any, b: Any, *, sf_vec_size: Any, b_dtype: Any, b_major: str, d_name: str, bias: Any,
               discrete_col_sfd: Any, use_dynamic_sched: Any, **options: Any) -> dict[str, Any]:
    """The variant axes of a seed 003 call (wrapper and class)."""
    axes = _common(**options)
    axes.update(_operand_axes(a, sfa, sf_vec_size, b, b_dtype, b_major))
    axes.update(d_dtype=d_name, bias_dtype=_bias_axis(bias),
                discrete_col_sfd=checks.bool_arg(discrete_col_sfd, "discrete_col_sfd"),
                scheduler=_scheduler(use_dynamic_sched))
    axes.update(layout_axes("grouped_gemm_quant", axes, a, b, batched=False))
    return axes


def dswiglu_axes(a: Any, sfa: Any, b: Any, *, sf_vec_size: Any, c: Any, c_arg: str, d_name: str,
                 discrete_col_sfd: Any, prob: Any, prob_arg: str, **options: Any) -> dict[str, Any]:
    """The variant axes of a seed 000 call (wrapper and class): C's dtype from the forward input
    ``c`` (named ``c_arg``), prob's from ``prob``."""
    axes = _common(**options)
    axes.update(_operand_axes(a, sfa, sf_vec_size, b, None, "k"))
    if b is None:
        raise ArgumentError("b_tensor", None, "a dense (N, K, L) tensor (dSwiGLU has no discrete weights)")
    if c is None:
        raise ArgumentError(c_arg, None, "the forward's (M, 2N) input (its dtype chooses the kernel)")
    axes.update(c_dtype=view(c, c_arg).dtype, d_dtype=d_name,
                discrete_col_sfd=checks.bool_arg(discrete_col_sfd, "discrete_col_sfd"),
                prob_dtype=prob_axis(prob, prob_arg))
    axes.update(layout_axes("grouped_gemm_dswiglu", axes, a, b, batched=False))
    return axes


def _scheduler(use_dynamic_sched: Any) -> str:
    return "dynamic" if checks.bool_arg(use_dynamic_sched, "use_dynamic_sched") else "static"


def amax_axes(a_tensor: Any, b_tensor: Any, sfa_tensor: Any, sf_vec_size: Any, c_dtype: Any, c_major: Any,
              acc_dtype: Any, mma_tiler_mn: Any, cluster_shape_mn: Any) -> dict[str, Any]:
    """The variant axes of a seed 004 call (wrapper and class)."""
    if c_major not in ("n", "m"):
        raise ArgumentError("c_major", repr(c_major), "'n', 'm'")
    axes = _common(acc_dtype=acc_dtype, cd_major="n", m_aligned=M_ALIGNED, vector_f32=False,
                   e5m2_rcp_max="page", mma_tiler_mn=mma_tiler_mn, cluster_shape_mn=cluster_shape_mn)
    axes.update(_operand_axes(a_tensor, sfa_tensor, sf_vec_size, b_tensor, None, "k"))
    del axes["weight_mode"], axes["b_major"]
    c_name = checks.dtype_arg(c_dtype, "c_dtype", _OUT + ("uint8",))   # seed 004: uint8 is packed FP4 C
    axes.update(c_dtype=ab_axis(c_name), cd_major=c_major)
    axes.update(layout_axes("gemm_amax", axes, a_tensor, b_tensor, batched=True))
    return axes


def c_dtype_name(op: BlockScaledGemm) -> str:
    """The C output's dtype of an op's resolved epilogue."""
    return next(o.dtype for o in op.epilogue.outputs if o.name == "c")
