"""Seed-style ops generated from one table: a row maps a cuDNN frontend API's parameter names,
defaults, quirks and return order onto a spec, and every face of the op is generated from the
row: the wrapper (``fusegemm.<name>``), the class API (``fusegemm.<cls>``), the torch custom op
(fusegemm/torch_library.py), their cuDNN spellings in :mod:`fusegemm.compat` and their parameter
docs. Every call runs the one engine (:class:`fusegemm.Op`, fusegemm/ops/scaled_seeds.py ``_op``);
the row holds no code.

A row says, for the wrapper's parameters (``params``, its signature as written):

* ``operands`` -- which parameter passes each of the kernel class's operands;
* ``inputs`` -- which parameter passes each of the epilogue's inputs (by spec name);
* ``axes`` -- in order, how each parameter chooses a variant axis or is checked: ``(axis, how,
  parameter)``, ``axis`` None for a check alone, ``"tile_m,tile_n"`` for a pair; each how is a
  name of fusegemm/ops/hows.py (documented there). Block-scaled operands also choose their
  MN-major layouts (``layout_axes``);
* ``accepts`` -- the values ``one_of`` and ``dtype_in`` accept, by parameter (``epilogue_op``:
  accepted and not applied, as NVIDIA's kernel does);
* ``fixed`` -- parameters this op takes at one value only, and why (``ArgumentError`` otherwise);
* ``returns`` -- the wrapper's outputs in order: a spec output, or None where this op produces none;
* ``gates`` -- outputs returned only when a bool parameter is true (seed 003's ``generate_amax``);
* ``unsqueezed`` -- outputs returned with one more trailing dimension (seed 000's amax (L, 1, 1));
* ``into`` -- outputs also written into a caller's tensor when one is passed (cuDNN's
  zero-initialised ``dprob_tensor``);
* ``torch`` -- the torch op's parameters, ``Type name`` in schema order (the schema's names: the
  wrapper's less ``_tensor``). Its Python face (``fusegemm.torch_library.<name>``) takes those
  before ``*`` by position (required unless written ``=value``) and the rest by keyword with the
  wrapper's defaults. Without it the schema is the wrapper's signature;
* ``reference`` -- the numpy reference (:mod:`fusegemm.reference`) whose parameter docs every face
  shares; without one the docs come from the row;
* ``scaled`` -- a second row (same parameters and returns) that serves the calls whose
  ``sfa_tensor`` is given: the op's block-scaled backend, on a spec of its own (cuDNN's GLU
  wrapper takes BF16 or MXFP8 operands);
* ``cls``, ``init``, ``execute``, ``samples`` -- the class API: the constructor's and
  ``execute``'s signatures, and the wrapper parameters a sample stands for (``dtype``: its dtype,
  ``major``: seed 004's C memory order). Other ``sample_<x>`` stand for ``<x>_tensor`` (or
  ``<x>``), options for the wrapper's parameter of their name (an option left None: the
  wrapper's default);
* ``tune`` -- a call that names no tile, cluster or scheduler takes the tuned (or modelled)
  configuration of its shape bucket (fusegemm/ops/tuned.py; seed 001);
* ``align`` -- input alignments (bytes) stricter than the engine's, by spec name (seed 001's
  16-byte bias);
* ``tail`` -- False: the wrapper leaves output rows at or past the last offset unwritten, as
  seed 001 documents (no zeroing launch);
* ``strict`` -- the class checks its samples when built (operands, output samples,
  device), reports an unsupported configuration at ``check_support`` naming the argument that
  chose it, and takes ``arch=`` (seed 001's class).

Output layouts ((M, N, 1) rows for an (M, K, 1) A, SF and FP8 views, seed 004's batched C) are
the kernel class's (fusegemm/ops/scaled_seeds.py). A call with a CPU a_tensor runs every check on
``VALIDATION_ARCH``'s variant, then is refused at the device check. Adding a seed-like op is a
spec and a row here; nothing else changes.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from .ops import faces
from .ops import scaled_seeds as _seeds
from .ops.scaled_operands import FAMILIES


@dataclass(frozen=True)
class Preset:
    """One seed-style op (see the module docstring for the fields)."""

    name: str
    spec: str
    cudnn: str
    params: str
    operands: tuple[tuple[str, str], ...]
    inputs: tuple[tuple[str, str], ...]
    axes: tuple[tuple[str | None, str, str], ...]
    returns: tuple[tuple[str, str | None], ...]
    summary: str
    fixed: tuple[tuple[str, Any, str], ...] = ()
    into: tuple[tuple[str, str], ...] = ()
    accepts: tuple[tuple[str, tuple[Any, ...]], ...] = ()
    gates: tuple[tuple[str, str], ...] = ()
    unsqueezed: tuple[str, ...] = ()
    reference: str | None = None
    torch: str | None = None
    scaled: "Preset | None" = None
    cls: str | None = None
    init: str = ""
    execute: str = ""
    samples: tuple[tuple[str, str, str], ...] = ()
    tune: bool = False
    align: tuple[tuple[str, int], ...] = ()
    tail: bool = True
    strict: bool = False

    def signature(self) -> inspect.Signature:
        """The wrapper's signature, from ``params``."""
        return self._signature

    @cached_property
    def _signature(self) -> inspect.Signature:
        return faces.parse_params(self.params)

    @cached_property
    def kind(self) -> str:
        """The kernel class of the row's spec (``grouped``, ``scaled``, ``batched``)."""
        from .generator.spec import find_spec
        from .ops.engine import kernel_class
        return kernel_class(find_spec(self.spec).kernel)

    @cached_property
    def plan(self) -> tuple:
        """``axes`` with each how looked up once (fusegemm/ops/hows.py ``plan``)."""
        from .ops.hows import plan
        return plan(self.axes, dict(self.accepts))

    def launch_options(self, bound: dict[str, Any]) -> dict[str, Any]:
        """The engine keywords of a wrapper call (``Op.__call__``): the row's stricter alignments,
        its tail rule, the call's ``validate_offsets``."""
        out = dict(self._launch)
        if "validate_offsets" in bound:
            out["validate_offsets"] = bound["validate_offsets"]
        return out

    @cached_property
    def _launch(self) -> dict[str, Any]:
        return {**({"align": dict(self.align)} if self.align else {}), **({} if self.tail else {"tail": False})}

    @cached_property
    def input_names(self) -> dict[str, str]:
        """The parameter of each epilogue input, by spec name (messages name it)."""
        return dict(self.inputs)

    @cached_property
    def output_names(self) -> dict[str, str]:
        """The parameter of each output this op produces, by spec name."""
        return {spec_out: name for name, spec_out in self.returns if spec_out}


# ---------------------------------------------------------------- the rows
# Why a BF16 row takes no B scales: its sfa_tensor chooses the row's block-scaled backend (``scaled``).
_SFB_WHY = "BF16 operands have no scales; block-scaled operands pass sfa_tensor too (the block-scaled backend)"
_COMMON = ("mma_tiler_mn=None, cluster_shape_mn=None, sf_vec_size=16, vector_f32=False, m_aligned=256, "
           "discrete_col_sfd=False")
_FIXED_BF16 = (("acc_dtype", "float32", "FP32 accumulation"), ("cd_major", "n", "row-major C and D"),
               ("m_aligned", 256, "every expert's rows padded to 256"),
               ("discrete_col_sfd", False, "BF16 outputs have no SFD"),
               ("sf_vec_size", 16, "BF16 operands have no scales"),
               ("use_single_group_runtime_offsets", False, "padded_offsets are per expert"))


def _no_scales(why: str, with_sfa: bool = True) -> tuple[tuple[str, Any, str], ...]:
    """The scale parameters a BF16 row takes at None only (``with_sfa`` False: sfa_tensor chooses the
    row's block-scaled backend instead)."""
    return tuple((p, None, why) for p in ("sfa_tensor",) * with_sfa + ("sfb_tensor", "sfb_ptrs")) + (
        ("norm_const_tensor", None, "BF16 outputs have no SFD"),)


_GEGLU_ONLY = "a GeGLU parameter; SwiGLU does not read it (another value is refused, not ignored)"
_GLU_ACT = (("linear_offset", None, "SwiGLU has no linear offset"), ("geglu_alpha", 1.702, _GEGLU_ONLY),
            ("glu_clamp_max", 7.0, _GEGLU_ONLY), ("glu_clamp_min", -7.0, _GEGLU_ONLY))
_DENSE_OR_DISCRETE = (("a_tensor", "a_tensor"), ("padded_offsets", "padded_offsets"), ("b_tensor", "b_tensor"),
                      ("b_ptrs", "b_ptrs"), ("n", "n"))
_SHARED_AXES = (("weight_mode", "weight_mode", "b_tensor"), ("b_major", "value", "b_major"),
                ("scheduler", "scheduler", "use_dynamic_sched"), ("vector_f32", "bool", "vector_f32"),
                ("tile_m,tile_n", "int_pair", "mma_tiler_mn"), ("cluster_m,cluster_n", "int_pair", "cluster_shape_mn"),
                (None, "bf16_weights", "b_dtype"))

# What the block-scaled rows share (the seeds, cuDNN frontend's pages 000, 002-004, and GLU's
# block-scaled backend).
_OUT = ("float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "float4_e2m1fn_x2")
_ACCEPTS = (("acc_dtype", ("float32",)), ("cd_major", ("n",)), ("m_aligned", (256,)),
            ("e5m2_rcp_max", ("page", "nvidia")), ("b_major", ("k", "n")), ("c_dtype", _OUT), ("d_dtype", _OUT),
            ("epilogue_op", (None, "none", "identity", "relu", "srelu")))
_TILES = (("tile_m,tile_n", "pair", "mma_tiler_mn"), ("cluster_m,cluster_n", "pair", "cluster_shape_mn"))
_FORMATS = (("ab_dtype", "ab_format", "a_tensor"), ("sf_dtype", "sf_format", "sfa_tensor"),
            ("sf_vec_size", "sf_vec", "sf_vec_size"))
# Options every grouped seed shares, then its operands' formats (discrete weights: b_dtype, b_major).
_GROUPED = ((None, "dtype_in", "acc_dtype"), (None, "one_of", "cd_major"), (None, "one_of", "m_aligned"),
            ("vector_f32", "bool", "vector_f32"), (None, "one_of", "e5m2_rcp_max"), *_TILES, *_FORMATS)
_WEIGHTS = (("weight_mode", "weight_mode", "b_tensor"), (None, "b_format", "b_dtype"), ("b_major", "one_of", "b_major"))
_SCALED_OPERANDS = (("a_tensor", "a_tensor"), ("sfa_tensor", "sfa_tensor"), ("padded_offsets", "padded_offsets"),
                    ("b_tensor", "b_tensor"), ("sfb_tensor", "sfb_tensor"))
_SFD = (("sfd_row_tensor", "sfd_row"), ("sfd_col_tensor", "sfd_col"))

# cuDNN's GLU wrapper with sfa_tensor: its block-scaled backend (spec grouped_gemm_glu_mx), the
# same parameters and returns as the BF16 row that dispatches to it.
_GLU_PARAMS = ("a_tensor, sfa_tensor=None, padded_offsets=None, alpha_tensor=None, b_tensor=None, sfb_tensor=None, "
               "bias_tensor=None, b_ptrs=None, sfb_ptrs=None, n=None, b_dtype=None, b_major='k', "
               "norm_const_tensor=None, prob_tensor=None, acc_dtype='float32', c_dtype='bfloat16', "
               "d_dtype='bfloat16', cd_major='n', " + _COMMON + ", act_func='swiglu', linear_offset=None, "
               "geglu_alpha=1.702, glu_clamp_max=7.0, glu_clamp_min=-7.0, use_dynamic_sched=False, "
               "use_single_group_runtime_offsets=False, current_stream=None, generate_c=False")
_GLU_RETURNS = (("c_tensor", "c"), ("d_tensor", "d"), ("d_col_tensor", None), ("amax_tensor", None),
                ("sfd_row_tensor", "sfd_row"), ("sfd_col_tensor", None))
_GLU_SWIGLU = ("act_func", "swiglu", "this op is SwiGLU's spec; another activation is a spec of its own")
_GLU_MX = Preset(
    name="grouped_gemm_glu", spec="grouped_gemm_glu_mx", cudnn="grouped_gemm_glu_wrapper_sm100",
    params=_GLU_PARAMS,
    operands=(*_SCALED_OPERANDS, ("b_ptrs", "b_ptrs"), ("sfb_ptrs", "sfb_ptrs"), ("n", "n")),
    inputs=(("alpha", "alpha_tensor"), ("prob", "prob_tensor"), ("bias", "bias_tensor"),
            ("norm_const", "norm_const_tensor")),
    # cuDNN's GLU signature has no e5m2_rcp_max: an e5m2 D takes the page's 1 / 57344.
    axes=(("c_dtype", "dtype_in", "c_dtype"), ("d_dtype", "dtype_in", "d_dtype"),
          *(a for a in _GROUPED if a[2] != "e5m2_rcp_max"), *_WEIGHTS,
          ("bias_dtype", "tensor_dtype", "bias_tensor"), ("generate_c", "bool", "generate_c")),
    accepts=_ACCEPTS,
    fixed=(*_GLU_ACT, _GLU_SWIGLU, ("discrete_col_sfd", False, "D is row-quantized only (SFD_row)"),
           ("use_dynamic_sched", False, "the block-scaled GLU kernel schedules statically"),
           ("use_single_group_runtime_offsets", False, "padded_offsets are per expert")),
    returns=_GLU_RETURNS,
    summary="Grouped block-scaled GEMM + SwiGLU (cuDNN's grouped_gemm_glu with sfa_tensor): with G = alpha[e] * "
            "dequant(A_e) @ dequant(B_e)^T (+ bias) in 32-column gate/up blocks, D = prob * up * silu(gate), half "
            "as wide; an FP8 D is row-quantized (SFD_row); C = G with generate_c.")

# cuDNN's dsReLU with sfa_tensor: its block-scaled backend (spec grouped_gemm_dsrelu_mx; NVIDIA ships
# dsReLU block-scaled only), the same parameters and returns as the BF16 row that dispatches to it.
_DSRELU_PARAMS = ("a_tensor, b_tensor=None, c_tensor=None, sfa_tensor=None, sfb_tensor=None, padded_offsets=None, "
                  "alpha_tensor=None, prob_tensor=None, dprob_tensor=None, generate_dbias=False, b_ptrs=None, "
                  "sfb_ptrs=None, n=None, b_dtype=None, b_major='k', norm_const_tensor=None, acc_dtype='float32', "
                  "d_dtype='bfloat16', cd_major='n', " + _COMMON + ", use_dynamic_sched=False, current_stream=None")
_DSRELU_RETURNS = (("d_row_tensor", "d"), ("d_col_tensor", "d_col"), ("dprob_tensor", "dprob"),
                   ("dbias_tensor", "dbias"), ("amax_tensor", "amax"), ("sfd_row_tensor", "sfd_row"),
                   ("sfd_col_tensor", "sfd_col"))
_DSRELU_MX = Preset(
    name="grouped_gemm_dsrelu", spec="grouped_gemm_dsrelu_mx", cudnn="grouped_gemm_dsrelu_wrapper_sm100",
    params=_DSRELU_PARAMS,
    operands=(*_SCALED_OPERANDS, ("b_ptrs", "b_ptrs"), ("sfb_ptrs", "sfb_ptrs"), ("n", "n")),
    inputs=(("alpha", "alpha_tensor"), ("prob", "prob_tensor"), ("c", "c_tensor"),
            ("norm_const", "norm_const_tensor")),
    # cuDNN's dsReLU signature has no e5m2_rcp_max: an e5m2 D takes the page's 1 / 57344.
    axes=(("c_dtype", "forward_dtype", "c_tensor"), ("d_dtype", "dtype_in", "d_dtype"),
          *(a for a in _GROUPED if a[2] != "e5m2_rcp_max"), *_WEIGHTS,
          ("generate_dbias", "bool", "generate_dbias"), ("discrete_col_sfd", "bool", "discrete_col_sfd")),
    accepts=_ACCEPTS,
    fixed=(("use_dynamic_sched", False, "the block-scaled dsReLU kernel schedules statically"),),
    returns=_DSRELU_RETURNS,
    into=(("dprob", "dprob_tensor"),),
    summary="Grouped block-scaled GEMM + dsReLU (cuDNN's grouped_gemm_dsrelu with sfa_tensor): with G = alpha[e] * "
            "dequant(A_e) @ dequant(B_e)^T and the forward's pre-activation C, D = 2 * prob * relu(C) * G (an FP8 D "
            "quantized along rows, SFD_row, and columns, D_col with SFD_col), dprob += sum(relu(C)^2 * G) per row, a "
            "per-expert amax of a bf16/fp16 D; generate_dbias adds dbias, the column sums of D.")

# cuDNN's dGLU with sfa_tensor: its block-scaled backend (spec grouped_gemm_dglu_mx, the BF16 spec's
# math with seed 000's FP8 D quantization and two-slot amax), the same parameters and returns as the
# BF16 row that dispatches to it.
_DGLU_PARAMS = ("a_tensor, c_tensor, sfa_tensor, padded_offsets, alpha_tensor, beta_tensor, prob_tensor, "
                "dprob_tensor, b_tensor=None, sfb_tensor=None, generate_dbias=False, b_ptrs=None, sfb_ptrs=None, "
                "n=None, b_dtype=None, b_major='k', norm_const_tensor=None, acc_dtype='float32', "
                "d_dtype='bfloat16', cd_major='n', " + _COMMON + ", act_func='dswiglu', linear_offset=None, "
                "geglu_alpha=1.702, glu_clamp_max=7.0, glu_clamp_min=-7.0, epilogue_op=None, "
                "use_dynamic_sched=False, use_single_group_runtime_offsets=False, current_stream=None")
_DGLU_RETURNS = (("d_row_tensor", "d"), ("d_col_tensor", "d_col"), ("dprob_tensor", "dprob"),
                 ("dbias_tensor", "dbias"), ("amax_tensor", "amax"), ("sfd_row_tensor", "sfd_row"),
                 ("sfd_col_tensor", "sfd_col"))
_DGLU_DSWIGLU = ("act_func", "dswiglu", "this op is dSwiGLU's spec; another activation is a spec of its own")
_DGLU_MX = Preset(
    name="grouped_gemm_dglu", spec="grouped_gemm_dglu_mx", cudnn="grouped_gemm_dglu_wrapper_sm100",
    params=_DGLU_PARAMS,
    operands=(*_SCALED_OPERANDS, ("b_ptrs", "b_ptrs"), ("sfb_ptrs", "sfb_ptrs"), ("n", "n")),
    inputs=(("alpha", "alpha_tensor"), ("beta", "beta_tensor"), ("prob", "prob_tensor"), ("c", "c_tensor"),
            ("norm_const", "norm_const_tensor")),
    # cuDNN's dGLU signature has no e5m2_rcp_max: an e5m2 D takes the page's 1 / 57344.
    axes=(("c_dtype", "forward_dtype", "c_tensor"), ("d_dtype", "dtype_in", "d_dtype"),
          *(a for a in _GROUPED if a[2] != "e5m2_rcp_max"), *_WEIGHTS,
          ("generate_dbias", "bool", "generate_dbias"), ("discrete_col_sfd", "bool", "discrete_col_sfd")),
    accepts=_ACCEPTS,
    fixed=(*_GLU_ACT, _DGLU_DSWIGLU, ("epilogue_op", None, "NVIDIA's kernel applies none"),
           ("use_dynamic_sched", False, "the block-scaled dGLU kernel schedules statically"),
           ("use_single_group_runtime_offsets", False, "padded_offsets are per expert")),
    returns=_DGLU_RETURNS,
    # Seed 000's layout of the same two-slot amax: (L, 2, 1), [e, 0] of dgate, [e, 1] of dup.
    unsqueezed=("amax",),
    into=(("dprob", "dprob_tensor"),),
    summary="Grouped block-scaled GEMM + dSwiGLU backward (cuDNN's grouped_gemm_dglu with sfa_tensor): R = "
            "alpha[e]^2 * dequant(A_e) @ dequant(B_e)^T; with the forward's C (M, 2N) scaled by beta[e], D holds "
            "dSwiGLU in the gate blocks and R * prob * swish(g) in the up blocks (an FP8 D quantized along rows, "
            "SFD_row, and columns, D_col with SFD_col); dprob += sum(swish(g) * u * R) per row; a bf16/fp16 D gets "
            "a per-expert amax (L, 2, 1) of its gate and up blocks; generate_dbias adds dbias, the column sums of "
            "D (2N interleaved columns).")

PRESETS: tuple[Preset, ...] = (
    Preset(
        name="grouped_gemm_glu", spec="grouped_gemm_glu", cudnn="grouped_gemm_glu_wrapper_sm100",
        params=_GLU_PARAMS, scaled=_GLU_MX,
        operands=_DENSE_OR_DISCRETE,
        inputs=(("alpha", "alpha_tensor"), ("prob", "prob_tensor"), ("bias", "bias_tensor")),
        axes=(("c_dtype", "dtype", "c_dtype"), ("d_dtype", "dtype", "d_dtype"),
              ("bias_dtype", "tensor_dtype", "bias_tensor"), ("generate_c", "bool", "generate_c"), *_SHARED_AXES),
        fixed=(*_FIXED_BF16, *_no_scales(_SFB_WHY, with_sfa=False), *_GLU_ACT, _GLU_SWIGLU),
        returns=tuple((name, None if name == "sfd_row_tensor" else out) for name, out in _GLU_RETURNS),
        summary="Grouped BF16 GEMM + SwiGLU (cuDNN's grouped_gemm_glu, act_func='swiglu'): with G = alpha[e] * "
                "A_e @ B_e^T (+ bias) in 32-column gate/up blocks, D = prob * up * silu(gate), half as wide; "
                "C = G with generate_c. With sfa_tensor the block-scaled backend runs (spec grouped_gemm_glu_mx: "
                "MXFP8, or the blockwise recipe on sm_90a; an FP8 D comes with SFD_row)."),
    Preset(
        name="grouped_gemm_dglu", spec="grouped_gemm_dglu", cudnn="grouped_gemm_dglu_wrapper_sm100",
        params=_DGLU_PARAMS, scaled=_DGLU_MX,
        operands=_DENSE_OR_DISCRETE,
        inputs=(("alpha", "alpha_tensor"), ("beta", "beta_tensor"), ("prob", "prob_tensor"), ("c", "c_tensor")),
        axes=(("c_dtype", "tensor_dtype", "c_tensor"), ("d_dtype", "dtype", "d_dtype"),
              ("generate_dbias", "bool", "generate_dbias"), *_SHARED_AXES),
        fixed=(*_FIXED_BF16, *_no_scales(_SFB_WHY, with_sfa=False), *_GLU_ACT, _DGLU_DSWIGLU,
               ("epilogue_op", None, "NVIDIA's kernel applies none")),
        returns=tuple((name, out if out in ("d", "dprob", "dbias") else None) for name, out in _DGLU_RETURNS),
        into=(("dprob", "dprob_tensor"),),
        summary="Grouped BF16 GEMM + dSwiGLU backward (cuDNN's grouped_gemm_dglu, act_func='dswiglu'): R = "
                "alpha[e]^2 * A_e @ B_e^T; with the forward's C (M, 2N) scaled by beta[e], D holds dSwiGLU in the "
                "gate blocks and R * prob * swish(g) in the up blocks; dprob += sum(swish(g) * u * R) per row; "
                "generate_dbias adds dbias (L, 2N[, 1]) float32, the column sums of D (all 2N interleaved columns, "
                "gate and up blocks as D stores them) over each expert's rows (NVIDIA's BF16 kernel returns it "
                "bfloat16). With sfa_tensor the block-scaled backend runs (spec grouped_gemm_dglu_mx: MXFP8, or the "
                "blockwise recipe on sm_90a; an FP8 D comes with SFD_row, D_col and SFD_col, a bf16/fp16 D with "
                "amax)."),
    Preset(
        name="grouped_gemm_dsrelu", spec="grouped_gemm_dsrelu", cudnn="grouped_gemm_dsrelu_wrapper_sm100",
        params=_DSRELU_PARAMS, scaled=_DSRELU_MX,
        operands=_DENSE_OR_DISCRETE,
        inputs=(("alpha", "alpha_tensor"), ("prob", "prob_tensor"), ("c", "c_tensor")),
        axes=(("c_dtype", "forward_dtype", "c_tensor"), ("d_dtype", "dtype", "d_dtype"),
              ("generate_dbias", "bool", "generate_dbias"), *_SHARED_AXES),
        fixed=(*_FIXED_BF16[:5], *_no_scales(_SFB_WHY, with_sfa=False)),
        returns=tuple((name, out if out in ("d", "dprob", "dbias", "amax") else None) for name, out in _DSRELU_RETURNS),
        into=(("dprob", "dprob_tensor"),),
        summary="Grouped BF16 GEMM + dsReLU, the backward of seed 002's sReLU: with G = alpha[e] * A_e @ B_e^T "
                "(the gradient of D) and the forward's pre-activation C, D = 2 * prob * relu(C) * G, dprob += "
                "sum(relu(C)^2 * G) per row, and a per-expert amax of a bf16/fp16 D; generate_dbias adds "
                "dbias (L, N[, 1]) float32, the column sums of D over each expert's rows. With sfa_tensor the "
                "block-scaled backend runs (spec grouped_gemm_dsrelu_mx: MXFP8, or the blockwise recipe on sm_90a; an "
                "FP8 D comes with SFD_row, D_col and SFD_col)."),
)

_BF16_OUT = ("bfloat16", "float16", "float32")
SEEDS: tuple[Preset, ...] = (
    Preset(
        name="grouped_gemm", spec="grouped_gemm", cudnn="grouped_gemm_wrapper_sm100", reference="grouped_gemm",
        cls="GroupedGemm",
        params=("a_tensor, padded_offsets, alpha_tensor, b_tensor=None, bias_tensor=None, b_ptrs=None, n=None, "
                "b_dtype=None, b_major='k', prob_tensor=None, acc_dtype='float32', c_dtype='bfloat16', "
                "d_dtype='bfloat16', cd_major='n', mma_tiler_mn=None, cluster_shape_mn=None, vector_f32=False, "
                "m_aligned=256, generate_c=False, use_dynamic_sched=False, current_stream=None, *, "
                "validate_offsets=None"),
        operands=_DENSE_OR_DISCRETE,
        inputs=(("alpha", "alpha_tensor"), ("prob", "prob_tensor"), ("bias", "bias_tensor")),
        axes=((None, "one_of", "cd_major"), ("vector_f32", "bool", "vector_f32"), (None, "one_of", "m_aligned"),
              (None, "dtype_in", "acc_dtype"), ("c_dtype", "dtype_in", "c_dtype"), ("d_dtype", "dtype_in", "d_dtype"),
              ("generate_c", "bool", "generate_c"), ("scheduler", "scheduler", "use_dynamic_sched"),
              ("tile_m,tile_n", "pair", "mma_tiler_mn"), ("cluster_m,cluster_n", "pair", "cluster_shape_mn"),
              ("weight_mode", "weight_mode", "b_tensor"), ("b_major", "one_of", "b_major"),
              (None, "bf16_weights", "b_dtype"), ("bias_dtype", "tensor_dtype_in", "bias_tensor")),
        accepts=(("acc_dtype", ("float32",)), ("cd_major", ("n",)), ("m_aligned", (256,)), ("b_major", ("k",)),
                 ("c_dtype", _BF16_OUT), ("d_dtype", _BF16_OUT), ("bias_tensor", _BF16_OUT)),
        returns=(("d_tensor", "d"), ("c_tensor", "c")),
        torch=("Tensor a, Tensor padded_offsets, Tensor alpha, Tensor? b=None, *, Tensor? bias, Tensor? b_ptrs, "
               "SymInt? n, Tensor? prob, ScalarType c_dtype, ScalarType d_dtype, bool generate_c, "
               "bool use_dynamic_sched"),
        init=("sample_a, sample_c=None, sample_d=None, sample_padded_offsets=None, sample_alpha=None, sample_b=None, "
              "sample_bias=None, sample_prob=None, *, num_experts=None, b_shape=None, b_dtype=None, b_major='k', "
              "acc_dtype='float32', c_dtype='bfloat16', d_dtype='bfloat16', generate_c=False, use_dynamic_sched=False, "
              "mma_tiler_mn=None, cluster_shape_mn=None, m_aligned=256, vector_f32=False, arch=None"),
        execute=("a_tensor, c_tensor=None, d_tensor=None, padded_offsets=None, alpha_tensor=None, b_tensor=None, "
                 "bias_tensor=None, prob_tensor=None, *, b_ptrs=None, current_stream=None, validate_offsets=None"),
        samples=(("c_dtype", "sample_c", "dtype"), ("d_dtype", "sample_d", "dtype")),
        tune=True, align=(("bias", 16),), tail=False, strict=True,
        summary="Grouped BF16 GEMM (seed 001).\n\nFor the rows of expert e: ``G = alpha[e] * A_e @ B_e^T`` (FP32 "
                "accumulation); with bias ``C = G + prob * bias[:, e]``, ``D = C``; without bias ``C = G``, ``D = prob "
                "* G``. ``c_tensor`` is None unless ``generate_c``. Rows at or past ``padded_offsets[-1]`` are left "
                "unwritten. Without ``mma_tiler_mn``, ``cluster_shape_mn`` and ``use_dynamic_sched`` a call takes the "
                "configuration ``fusegemm tune`` recorded for its shape bucket (``FUSEGEMM_AUTOTUNE=1``: tuned on the "
                "first call; on sm_100a the roofline model's choice; else the spec's default)."),
    Preset(
        name="grouped_gemm_srelu", spec="grouped_gemm_srelu", cudnn="grouped_gemm_srelu_wrapper_sm100",
        reference="grouped_gemm_srelu", cls="GroupedGemmSrelu",
        params=("a_tensor, b_tensor=None, sfa_tensor=None, sfb_tensor=None, padded_offsets=None, alpha_tensor=None, "
                "bias_tensor=None, b_ptrs=None, sfb_ptrs=None, n=None, b_dtype=None, b_major='k', "
                "norm_const_tensor=None, prob_tensor=None, acc_dtype='float32', c_dtype='bfloat16', "
                "d_dtype='bfloat16', cd_major='n', " + _COMMON + ", use_dynamic_sched=False, current_stream=None, *, "
                "tanh_clamp_scale=None, e5m2_rcp_max='page'"),
        operands=(*_SCALED_OPERANDS, ("b_ptrs", "b_ptrs"), ("sfb_ptrs", "sfb_ptrs"), ("n", "n")),
        inputs=(("alpha", "alpha_tensor"), ("prob", "prob_tensor"), ("bias", "bias_tensor"),
                ("norm_const", "norm_const_tensor")),
        axes=(("c_dtype", "dtype_in", "c_dtype"), ("d_dtype", "dtype_in", "d_dtype"), *_GROUPED, *_WEIGHTS,
              ("bias_dtype", "tensor_dtype", "bias_tensor"), ("discrete_col_sfd", "bool", "discrete_col_sfd"),
              ("scheduler", "scheduler", "use_dynamic_sched"), ("tanh_clamp_scale", "tanh_clamp", "tanh_clamp_scale")),
        accepts=_ACCEPTS,
        returns=(("c_tensor", "c"), ("d_tensor", "d"), ("d_col_tensor", "d_col"), ("amax_tensor", "amax"), *_SFD),
        torch=("Tensor a, Tensor? b, Tensor sfa, Tensor? sfb, Tensor padded_offsets, Tensor alpha, *, Tensor? bias, "
               "Tensor? b_ptrs, Tensor? sfb_ptrs, SymInt? n, Tensor? norm_const, Tensor? prob, ScalarType c_dtype, "
               "ScalarType d_dtype, SymInt sf_vec_size, bool discrete_col_sfd, bool use_dynamic_sched, "
               "float? tanh_clamp_scale, str e5m2_rcp_max"),
        init=("sample_a, sample_b=None, sample_c=None, sample_d=None, sample_sfa=None, sample_sfb=None, "
              "sample_padded_offsets=None, sample_alpha=None, sample_d_col=None, sample_sfd_row=None, "
              "sample_sfd_col=None, sample_amax=None, sample_norm_const=None, sample_prob=None, sample_bias=None, *, "
              "num_experts=None, b_shape=None, b_dtype=None, acc_dtype='float32', " + _COMMON + ", "
              "use_dynamic_sched=False, b_major='k', "
              "tanh_clamp_scale=None, e5m2_rcp_max='page'"),
        execute=("a_tensor, b_tensor=None, c_tensor=None, d_tensor=None, sfa_tensor=None, sfb_tensor=None, "
                 "padded_offsets=None, alpha_tensor=None, d_col_tensor=None, sfd_row_tensor=None, sfd_col_tensor=None, "
                 "amax_tensor=None, norm_const_tensor=None, prob_tensor=None, bias_tensor=None, b_ptrs=None, "
                 "sfb_ptrs=None, n=None, current_stream=None"),
        samples=(("c_dtype", "sample_c", "dtype"), ("d_dtype", "sample_d", "dtype")),
        summary="Grouped block-scaled GEMM + prob-gated squared ReLU (seed 002).\n\n``C = alpha[e] * dequant(A) @ "
                "dequant(B_e)^T`` (+ bias, not gated), ``D = prob * relu(C)^2`` (with ``tanh_clamp_scale=s``: "
                "``prob * (s * min(tanh(relu(C) / s), 1))^2``). FP8/FP4 D is quantized with SFD_row / SFD_col; "
                "bf16/fp16 D gets a per-expert amax ``(L, 1)``. Discrete weights pass ``b_ptrs``, ``sfb_ptrs`` and "
                "``n`` (the class: ``num_experts=`` and ``b_shape=`` instead of ``sample_b``)."),
    Preset(
        name="grouped_gemm_quant", spec="grouped_gemm_quant", cudnn="grouped_gemm_quant_wrapper_sm100",
        reference="grouped_gemm_quant", cls="GroupedGemmQuant",
        params=("a_tensor, sfa_tensor, padded_offsets, alpha_tensor, b_tensor=None, sfb_tensor=None, bias_tensor=None, "
                "b_ptrs=None, sfb_ptrs=None, n=None, b_dtype=None, b_major='k', norm_const_tensor=None, "
                "prob_tensor=None, acc_dtype='float32', d_dtype='bfloat16', cd_major='n', " + _COMMON + ", "
                "use_dynamic_sched=False, current_stream=None, *, row_scale_tensor=None, generate_amax=True, "
                "e5m2_rcp_max='page'"),
        operands=(*_SCALED_OPERANDS, ("b_ptrs", "b_ptrs"), ("sfb_ptrs", "sfb_ptrs"), ("n", "n")),
        inputs=(("alpha", "alpha_tensor"), ("prob", "prob_tensor"), ("row_scale", "row_scale_tensor"),
                ("bias", "bias_tensor"), ("norm_const", "norm_const_tensor")),
        axes=(("d_dtype", "dtype_in", "d_dtype"), *_GROUPED, *_WEIGHTS, ("bias_dtype", "tensor_dtype", "bias_tensor"),
              ("discrete_col_sfd", "bool", "discrete_col_sfd"), ("scheduler", "scheduler", "use_dynamic_sched")),
        accepts=_ACCEPTS, gates=(("amax", "generate_amax"),),
        returns=(("d_tensor", "d"), ("d_col_tensor", "d_col"), ("amax_tensor", "amax"), *_SFD),
        torch=("Tensor a, Tensor sfa, Tensor padded_offsets, Tensor alpha, Tensor? b=None, Tensor? sfb=None, *, "
               "Tensor? bias, Tensor? b_ptrs, Tensor? sfb_ptrs, SymInt? n, Tensor? norm_const, Tensor? prob, "
               "Tensor? row_scale, ScalarType d_dtype, SymInt sf_vec_size, bool discrete_col_sfd, "
               "bool use_dynamic_sched, bool generate_amax, str e5m2_rcp_max"),
        init=("sample_a, sample_b=None, sample_d=None, sample_sfa=None, sample_sfb=None, sample_padded_offsets=None, "
              "sample_alpha=None, sample_d_col=None, sample_sfd_row=None, sample_sfd_col=None, sample_amax=None, "
              "sample_norm_const=None, sample_prob=None, sample_bias=None, *, acc_dtype='float32', " + _COMMON + ", "
              "use_dynamic_sched=False, "
              "e5m2_rcp_max='page'"),
        execute=("a_tensor, b_tensor=None, d_tensor=None, sfa_tensor=None, sfb_tensor=None, padded_offsets=None, "
                 "alpha_tensor=None, d_col_tensor=None, sfd_row_tensor=None, sfd_col_tensor=None, amax_tensor=None, "
                 "norm_const_tensor=None, prob_tensor=None, bias_tensor=None, row_scale_tensor=None, "
                 "current_stream=None"),
        samples=(("d_dtype", "sample_d", "dtype"),),
        summary="Grouped block-scaled GEMM + prob gating + output quantization (seed 003).\n\n``D = prob * alpha[e] "
                "* row_scale * dequant(A) @ dequant(B_e)^T`` (with bias: prob scales only the bias); FP8/FP4 D is "
                "quantized with SFD_row / SFD_col, bf16/fp16 D gets a per-expert amax ``(L, 1)`` (returned with "
                "``generate_amax``)."),
    Preset(
        name="grouped_gemm_dswiglu", spec="grouped_gemm_dswiglu", cudnn="grouped_gemm_dswiglu_wrapper_sm100",
        reference="grouped_gemm_dswiglu", cls="GroupedGemmDswiglu",
        params=("a_tensor, b_tensor, c_tensor, sfa_tensor, sfb_tensor, padded_offsets, alpha_tensor, beta_tensor, "
                "prob_tensor, norm_const_tensor=None, acc_dtype='float32', d_dtype='bfloat16', cd_major='n', "
                + _COMMON + ", epilogue_op=None, current_stream=None, *, e5m2_rcp_max='page'"),
        operands=_SCALED_OPERANDS,
        inputs=(("alpha", "alpha_tensor"), ("beta", "beta_tensor"), ("prob", "prob_tensor"), ("c", "c_tensor"),
                ("norm_const", "norm_const_tensor")),
        axes=((None, "one_of", "epilogue_op"), ("d_dtype", "dtype_in", "d_dtype"), *_GROUPED,
              ("weight_mode", "dense_b", "b_tensor"), ("c_dtype", "forward_dtype", "c_tensor"),
              ("discrete_col_sfd", "bool", "discrete_col_sfd"), ("prob_dtype", "prob_dtype", "prob_tensor")),
        accepts=_ACCEPTS, unsqueezed=("amax",),
        returns=(("d_row_tensor", "d"), ("d_col_tensor", "d_col"), ("dprob_tensor", "dprob"), ("amax_tensor", "amax"),
                 *_SFD),
        torch=("Tensor a, Tensor b, Tensor c, Tensor sfa, Tensor sfb, Tensor padded_offsets, Tensor alpha, "
               "Tensor beta, Tensor prob, *, Tensor? norm_const, ScalarType d_dtype, SymInt sf_vec_size, "
               "bool discrete_col_sfd, str e5m2_rcp_max"),
        init=("sample_a, sample_b=None, sample_c=None, sample_d_row=None, sample_sfa=None, sample_sfb=None, "
              "sample_padded_offsets=None, sample_alpha=None, sample_beta=None, sample_prob=None, sample_d_col=None, "
              "sample_dprob=None, sample_amax=None, sample_sfd_row=None, sample_sfd_col=None, sample_norm_const=None, "
              "*, acc_dtype='float32', " + _COMMON + ", epilogue_op=None, e5m2_rcp_max='page'"),
        execute=("a_tensor, b_tensor, c_tensor, d_row_tensor=None, sfa_tensor=None, sfb_tensor=None, "
                 "padded_offsets=None, alpha_tensor=None, beta_tensor=None, prob_tensor=None, d_col_tensor=None, "
                 "dprob_tensor=None, amax_tensor=None, sfd_row_tensor=None, sfd_col_tensor=None, "
                 "norm_const_tensor=None, current_stream=None"),
        samples=(("d_dtype", "sample_d_row", "dtype"),),
        summary="Grouped block-scaled GEMM + dSwiGLU backward epilogue (seed 000).\n\n``R = alpha[e]^2 * "
                "dequant(A) @ dequant(B_e)^T``; with the forward C ``(M, 2N)`` scaled by ``beta[e]`` (32-column "
                "gate/up blocks), D ``(M, 2N)`` holds dSwiGLU in the gate blocks and ``R * prob * swish(g)`` in the "
                "up blocks, ``dprob += sum(swish(g) * u * R)`` per row. ``epilogue_op`` is accepted and not "
                "applied, as NVIDIA's kernel does."),
    Preset(
        name="gemm_amax", spec="gemm_amax", cudnn="gemm_amax_wrapper_sm100", reference="gemm_amax", cls="GemmAmax",
        params=("a_tensor, b_tensor, sfa_tensor, sfb_tensor, c_major='n', c_dtype='float32', acc_dtype='float32', "
                "mma_tiler_mn=None, cluster_shape_mn=None, sf_vec_size=32, stream=None"),
        operands=(("a_tensor", "a_tensor"), ("b_tensor", "b_tensor"), ("sfa_tensor", "sfa_tensor"),
                  ("sfb_tensor", "sfb_tensor")),
        inputs=(),
        axes=(("cd_major", "one_of", "c_major"), (None, "dtype_in", "acc_dtype"), *_TILES, *_FORMATS,
              ("c_dtype", "dtype_in", "c_dtype")),
        accepts=(("c_major", ("n", "m")), ("acc_dtype", ("float32",)), ("c_dtype", _OUT + ("uint8",))),  # uint8: FP4
        returns=(("c_tensor", "c"), ("amax_tensor", "amax")),
        torch="Tensor a, Tensor b, Tensor sfa, Tensor sfb, *, str c_major, ScalarType c_dtype, SymInt sf_vec_size",
        init=("sample_a, sample_b, sample_sfa, sample_sfb, sample_c=None, sample_amax=None, *, acc_dtype='float32', "
              "mma_tiler_mn=None, cluster_shape_mn=None, sf_vec_size=32"),
        execute="a_tensor, b_tensor, sfa_tensor, sfb_tensor, c_tensor, amax_tensor, current_stream=None",
        samples=(("c_dtype", "sample_c", "dtype"), ("c_major", "sample_c", "major")),
        summary="Block-scaled batched dense GEMM + global amax (seed 004).\n\n``C[:, :, l] = dequant(A_l) @ "
                "dequant(B_l)^T``, ``amax = max |C|`` over everything. A ``(M, K, L)`` / B ``(N, K, L)`` K-major "
                "(or 2-D for L = 1), scales as the kernel-facing view, the physical buffer or a flat one. "
                "``c_major`` \"n\" returns C with strides (N, 1, M*N), \"m\" with (1, M, M*N); amax is (1, 1, 1). "
                "The class's ``sample_c`` chooses C's dtype and memory order."),
)
BY_NAME = {p.name: p for p in PRESETS + SEEDS}


# The generated faces, as module attributes (fusegemm.<name>, fusegemm.compat and the torch ops
# read them here); fusegemm.selftest calls the block-scaled wrappers through ops.scaled_seeds.
for _row in PRESETS + SEEDS:
    globals()[_row.name] = faces.wrapper(_row, __name__)
    if _row.cls:
        globals()[_row.cls] = faces.seed_class(_row, __name__)
    if _row.name in FAMILIES:
        setattr(_seeds, _row.name, globals()[_row.name])
del _row
