"""The class APIs of the block-scaled seeds: ``GroupedGemmSrelu``, ``GroupedGemmQuant``,
``GroupedGemmDswiglu`` and ``GemmAmax`` (``check_support() -> compile() -> execute()``).

The constructor takes the seed's ``sample_*`` tensors (their dtypes and layouts choose the kernel
variant) and options; ``execute`` takes the inputs and the caller's *output* tensors, checks each
output against the layout the kernel writes (shape, dtype, dense strides, device, no overlap with
an input), resets the reductions (amax to -inf, dprob to 0) on the launch stream and writes into
them. The math, argument names and checks are the wrappers' (fusegemm/ops/scaled_seeds.py), so a
class call and a wrapper call give the same bytes.
"""
from __future__ import annotations

from typing import Any, Mapping

from ..base.errors import ArgumentError
from ..runtime.tensors import TensorView, view
from . import arg_checks as checks
from .. import reference as _reference
from .blockscaled import BlockScaledGemm
from .outputs import as_bytes, check_no_overlap, native_output
from .param_docs import OUTPUTS, class_api
from .scaled_layouts import check_layouts, discrete_weights
from .scaled_seeds import (SEED_NAMES, _OUT, _op, _present, check_epilogue_op, dswiglu_axes, quant_axes,
                           srelu_axes)

# Seed argument name of each output buffer of the grouped seeds (dSwiGLU names D d_row_tensor).
OUT_NAMES = {"c": "c_tensor", "d": "d_tensor", "d_col": "d_col_tensor", "sfd_row": "sfd_row_tensor",
             "sfd_col": "sfd_col_tensor", "amax": "amax_tensor", "dprob": "dprob_tensor"}


class _ScaledSeedOp:
    """What the four classes share: a variant chosen from samples, a compiled op, output checks."""

    SPEC = ""

    def __init__(self, axes: dict[str, Any], sample_a: Any, e5m2_rcp_max: str = "page") -> None:
        self._axes = axes
        self._rcp = e5m2_rcp_max
        self.op: BlockScaledGemm = _op(self.SPEC, sample_a, e5m2_rcp_max, axes)

    def check_support(self) -> bool:
        """True when this device's kernel implements the configuration; UnsupportedError says
        why not (an MN-major operand this arch or fusegemm's host path lacks included)."""
        check_layouts(self.op)
        return self.op.check_support()

    def compile(self) -> "_ScaledSeedOp":
        """Compile (or fetch from the cache) and load the kernel; returns self."""
        self.op.compile()
        return self


class _GroupedSeedOp(_ScaledSeedOp):
    """Grouped block-scaled seeds (002, 003, 000)."""

    def _execute(self, *, a_tensor: Any, b_tensor: Any, sfa_tensor: Any, sfb_tensor: Any, padded_offsets: Any,
                 b_ptrs: Any = None, sfb_ptrs: Any = None, n: Any = None, inputs: Mapping[str, Any],
                 outputs: Mapping[str, Any], current_stream: Any, names: Mapping[str, str] = OUT_NAMES) -> None:
        check_layouts(self.op)
        self.op.execute(a_tensor, sfa_tensor, padded_offsets, b_tensor, sfb_tensor, b_ptrs=b_ptrs, sfb_ptrs=sfb_ptrs,
                        n=n, inputs=_present(**inputs), outputs=outputs, current_stream=current_stream,
                        input_names=SEED_NAMES, output_names=names)


def _sample_dtype(sample: Any, name: str, default: Any) -> Any:
    return view(sample, name).dtype if sample is not None else default


def _sample_out(sample: Any, name: str) -> str:
    """An output dtype from its sample (bfloat16 without one), checked under the sample's name."""
    return checks.dtype_arg(_sample_dtype(sample, name, "bfloat16"), f"{name}.dtype", _OUT)


def _options(acc_dtype: Any, m_aligned: Any, vector_f32: Any, e5m2_rcp_max: str, mma_tiler_mn: Any,
             cluster_shape_mn: Any) -> dict[str, Any]:
    """The options every class shares, as the wrappers' ``_common`` takes them (C/D are N-major)."""
    return dict(acc_dtype=acc_dtype, cd_major="n", m_aligned=m_aligned, vector_f32=vector_f32,
                e5m2_rcp_max=e5m2_rcp_max, mma_tiler_mn=mma_tiler_mn, cluster_shape_mn=cluster_shape_mn)


@class_api(_reference.grouped_gemm_srelu, OUTPUTS["grouped_gemm_srelu"])
class GroupedGemmSrelu(_GroupedSeedOp):
    """Seed 002's class API (``cudnn.GroupedGemmSreluSm100``): grouped block-scaled GEMM + sReLU.

    Samples choose the variant: ``sample_a``/``sample_sfa`` the formats, ``sample_c``/``sample_d``
    the output dtypes, ``sample_b`` (dense) or ``num_experts`` + ``b_shape`` (discrete) the weights,
    ``sample_bias`` its presence. ``execute`` takes every input and output tensor (outputs as the
    wrapper returns them); see :func:`fusegemm.grouped_gemm_srelu` for the math.
    """

    SPEC = "grouped_gemm_srelu"

    def __init__(self, sample_a: Any, sample_b: Any = None, sample_c: Any = None, sample_d: Any = None,
                 sample_sfa: Any = None, sample_sfb: Any = None, sample_padded_offsets: Any = None,
                 sample_alpha: Any = None, sample_d_col: Any = None, sample_sfd_row: Any = None,
                 sample_sfd_col: Any = None, sample_amax: Any = None, sample_norm_const: Any = None,
                 sample_prob: Any = None, sample_bias: Any = None, *, num_experts: int | None = None,
                 b_shape: tuple[int, int] | None = None, b_dtype: Any = None, acc_dtype: Any = "float32",
                 mma_tiler_mn: Any = None, cluster_shape_mn: Any = None, sf_vec_size: int = 16,
                 vector_f32: bool = False, m_aligned: int = 256, discrete_col_sfd: bool = False,
                 use_dynamic_sched: bool = False, b_major: str = "k", tanh_clamp_scale: float | None = None,
                 e5m2_rcp_max: str = "page") -> None:
        # b_dtype (discrete weights' format) is checked against sample_a's with the operand axes.
        self._discrete = discrete_weights(sample_a, sample_b, sample_sfb, sample_padded_offsets, num_experts, b_shape)
        axes = srelu_axes(sample_a, sample_sfa, sample_b, sf_vec_size=sf_vec_size, b_dtype=b_dtype, b_major=b_major,
                          c_name=_sample_out(sample_c, "sample_c"), d_name=_sample_out(sample_d, "sample_d"),
                          bias=sample_bias, discrete_col_sfd=discrete_col_sfd, use_dynamic_sched=use_dynamic_sched,
                          tanh_clamp_scale=tanh_clamp_scale, **_options(acc_dtype, m_aligned, vector_f32,
                                                                         e5m2_rcp_max, mma_tiler_mn, cluster_shape_mn))
        super().__init__(axes, sample_a, e5m2_rcp_max)

    def execute(self, a_tensor: Any, b_tensor: Any = None, c_tensor: Any = None, d_tensor: Any = None,
                sfa_tensor: Any = None, sfb_tensor: Any = None, padded_offsets: Any = None,
                alpha_tensor: Any = None, d_col_tensor: Any = None, sfd_row_tensor: Any = None,
                sfd_col_tensor: Any = None, amax_tensor: Any = None, norm_const_tensor: Any = None,
                prob_tensor: Any = None, bias_tensor: Any = None, b_ptrs: Any = None, sfb_ptrs: Any = None,
                n: int | None = None, current_stream: Any = None) -> None:
        """Run once into the given outputs (those the configuration writes are required); an op
        built for discrete weights (``num_experts``, ``b_shape``) takes ``b_ptrs`` and ``sfb_ptrs``
        (N from ``b_shape``)."""
        if self._discrete is not None:
            n = self._discrete.n_for(n, padded_offsets)
        self._execute(a_tensor=a_tensor, b_tensor=b_tensor, sfa_tensor=sfa_tensor, sfb_tensor=sfb_tensor,
                      padded_offsets=padded_offsets, b_ptrs=b_ptrs, sfb_ptrs=sfb_ptrs, n=n,
                      inputs=dict(alpha=alpha_tensor, prob=prob_tensor, bias=bias_tensor, norm_const=norm_const_tensor),
                      outputs=dict(c=c_tensor, d=d_tensor, d_col=d_col_tensor, sfd_row=sfd_row_tensor,
                                   sfd_col=sfd_col_tensor, amax=amax_tensor),
                      current_stream=current_stream)


@class_api(_reference.grouped_gemm_quant, OUTPUTS["grouped_gemm_quant"])
class GroupedGemmQuant(_GroupedSeedOp):
    """Seed 003's class API (``cudnn.GroupedGemmQuantSm100``): grouped block-scaled GEMM + quant.
    See :func:`fusegemm.grouped_gemm_quant` for the math; samples and ``execute`` as
    :class:`GroupedGemmSrelu` (no C)."""

    SPEC = "grouped_gemm_quant"

    def __init__(self, sample_a: Any, sample_b: Any = None, sample_d: Any = None, sample_sfa: Any = None,
                 sample_sfb: Any = None, sample_padded_offsets: Any = None, sample_alpha: Any = None,
                 sample_d_col: Any = None, sample_sfd_row: Any = None, sample_sfd_col: Any = None,
                 sample_amax: Any = None, sample_norm_const: Any = None, sample_prob: Any = None,
                 sample_bias: Any = None, *, acc_dtype: Any = "float32", mma_tiler_mn: Any = None,
                 cluster_shape_mn: Any = None, sf_vec_size: int = 16, vector_f32: bool = False,
                 m_aligned: int = 256, discrete_col_sfd: bool = False, use_dynamic_sched: bool = False,
                 e5m2_rcp_max: str = "page") -> None:
        axes = quant_axes(sample_a, sample_sfa, sample_b, sf_vec_size=sf_vec_size, b_dtype=None, b_major="k",
                          d_name=_sample_out(sample_d, "sample_d"), bias=sample_bias,
                          discrete_col_sfd=discrete_col_sfd, use_dynamic_sched=use_dynamic_sched,
                          **_options(acc_dtype, m_aligned, vector_f32, e5m2_rcp_max, mma_tiler_mn, cluster_shape_mn))
        super().__init__(axes, sample_a, e5m2_rcp_max)

    def execute(self, a_tensor: Any, b_tensor: Any = None, d_tensor: Any = None, sfa_tensor: Any = None,
                sfb_tensor: Any = None, padded_offsets: Any = None, alpha_tensor: Any = None,
                d_col_tensor: Any = None, sfd_row_tensor: Any = None, sfd_col_tensor: Any = None,
                amax_tensor: Any = None, norm_const_tensor: Any = None, prob_tensor: Any = None,
                bias_tensor: Any = None, row_scale_tensor: Any = None, current_stream: Any = None) -> None:
        """Run once into the given outputs (those the configuration writes are required)."""
        self._execute(a_tensor=a_tensor, b_tensor=b_tensor, sfa_tensor=sfa_tensor, sfb_tensor=sfb_tensor,
                      padded_offsets=padded_offsets,
                      inputs=dict(alpha=alpha_tensor, prob=prob_tensor, row_scale=row_scale_tensor, bias=bias_tensor,
                                  norm_const=norm_const_tensor),
                      outputs=dict(d=d_tensor, d_col=d_col_tensor, sfd_row=sfd_row_tensor, sfd_col=sfd_col_tensor,
                                   amax=amax_tensor),
                      current_stream=current_stream)


@class_api(_reference.grouped_gemm_dswiglu, OUTPUTS["grouped_gemm_dswiglu"])
class GroupedGemmDswiglu(_GroupedSeedOp):
    """Seed 000's class API (``cudnn.GroupedGemmDswigluSm100``): grouped block-scaled GEMM +
    dSwiGLU backward. See :func:`fusegemm.grouped_gemm_dswiglu`; ``sample_c`` is the forward's
    ``(M, 2N)`` input, ``d_row_tensor`` the ``(M, 2N)`` output."""

    SPEC = "grouped_gemm_dswiglu"
    NAMES = {**OUT_NAMES, "d": "d_row_tensor"}

    def __init__(self, sample_a: Any, sample_b: Any = None, sample_c: Any = None, sample_d_row: Any = None,
                 sample_sfa: Any = None, sample_sfb: Any = None, sample_padded_offsets: Any = None,
                 sample_alpha: Any = None, sample_beta: Any = None, sample_prob: Any = None,
                 sample_d_col: Any = None, sample_dprob: Any = None, sample_amax: Any = None,
                 sample_sfd_row: Any = None, sample_sfd_col: Any = None, sample_norm_const: Any = None, *,
                 acc_dtype: Any = "float32", mma_tiler_mn: Any = None, cluster_shape_mn: Any = None,
                 sf_vec_size: int = 16, vector_f32: bool = False, m_aligned: int = 256,
                 discrete_col_sfd: bool = False, epilogue_op: str | None = None,
                 e5m2_rcp_max: str = "page") -> None:
        check_epilogue_op(epilogue_op)
        axes = dswiglu_axes(sample_a, sample_sfa, sample_b, sf_vec_size=sf_vec_size, c=sample_c, c_arg="sample_c",
                            d_name=_sample_out(sample_d_row, "sample_d_row"), discrete_col_sfd=discrete_col_sfd,
                            prob=sample_prob, prob_arg="sample_prob",
                            **_options(acc_dtype, m_aligned, vector_f32, e5m2_rcp_max, mma_tiler_mn, cluster_shape_mn))
        super().__init__(axes, sample_a, e5m2_rcp_max)

    def execute(self, a_tensor: Any, b_tensor: Any, c_tensor: Any, d_row_tensor: Any = None, sfa_tensor: Any = None,
                sfb_tensor: Any = None, padded_offsets: Any = None, alpha_tensor: Any = None,
                beta_tensor: Any = None, prob_tensor: Any = None, d_col_tensor: Any = None,
                dprob_tensor: Any = None, amax_tensor: Any = None, sfd_row_tensor: Any = None,
                sfd_col_tensor: Any = None, norm_const_tensor: Any = None, current_stream: Any = None) -> None:
        """Run once into the given outputs (those the configuration writes are required)."""
        amax = amax_tensor.squeeze(-1) if amax_tensor is not None and amax_tensor.dim() == 3 else amax_tensor
        self._execute(a_tensor=a_tensor, b_tensor=b_tensor, sfa_tensor=sfa_tensor, sfb_tensor=sfb_tensor,
                      padded_offsets=padded_offsets,
                      inputs=dict(alpha=alpha_tensor, beta=beta_tensor, prob=prob_tensor, c=c_tensor,
                                  norm_const=norm_const_tensor),
                      outputs=dict(d=d_row_tensor, d_col=d_col_tensor, sfd_row=sfd_row_tensor, sfd_col=sfd_col_tensor,
                                   amax=amax, dprob=dprob_tensor),
                      current_stream=current_stream, names=self.NAMES)


_AMAX_NAMES = {"c": "c_tensor", "amax": "amax_tensor"}


def _c_major(sample_c: Any) -> str:
    """"m" when a (M, N, L) / (M, N) C sample is M-contiguous, else "n" (the default)."""
    if sample_c is None:
        return "n"
    v = view(sample_c, "sample_c")
    if v.ndim in (2, 3) and v.strides[0] == 1 and v.shape[0] > 1 and v.strides[1] != 1:
        return "m"
    return "n"


@class_api(_reference.gemm_amax, OUTPUTS["gemm_amax"])
class GemmAmax(_ScaledSeedOp):
    """Seed 004's class API (``cudnn.GemmAmaxSm100``): block-scaled batched GEMM + global amax.

    ``sample_c`` chooses C's dtype and memory order (N- or M-contiguous); ``execute`` writes C
    ``(M, N, L)`` (or 2-D for L = 1) and amax ``(1, 1, 1)`` in place. See :func:`fusegemm.gemm_amax`.
    """

    SPEC = "gemm_amax"

    def __init__(self, sample_a: Any, sample_b: Any, sample_sfa: Any, sample_sfb: Any, sample_c: Any = None,
                 sample_amax: Any = None, *, acc_dtype: Any = "float32", mma_tiler_mn: Any = None,
                 cluster_shape_mn: Any = None, sf_vec_size: int = 32) -> None:
        from .scaled_seeds import amax_axes
        c_dtype = _sample_dtype(sample_c, "sample_c", "float32")
        axes = amax_axes(sample_a, sample_b, sample_sfa, sf_vec_size, c_dtype, _c_major(sample_c), acc_dtype,
                         mma_tiler_mn, cluster_shape_mn)
        super().__init__(axes, sample_a)

    def execute(self, a_tensor: Any, b_tensor: Any, sfa_tensor: Any, sfb_tensor: Any, c_tensor: Any,
                amax_tensor: Any, current_stream: Any = None) -> None:
        """Run once: C and amax (reset to -inf first) in place."""
        from .scaled_operands import parse_batched
        op = self.op
        check_layouts(op)
        call = parse_batched(a_tensor, b_tensor, sfa_tensor, sfb_tensor, op.variant.sf_vec_size)
        op.check_operands(call)
        (c_shape, c_store, _), (a_shape, a_store, _) = (op.epilogue.buffers(call.n, call.l * call.m, 1)[k]
                                                        for k in ("c", "amax"))
        c = self._native_c(c_tensor, call, c_shape, c_store)
        amax = native_output(amax_tensor, "amax_tensor", a_shape, a_store)
        check_no_overlap([("amax_tensor", amax), ("c_tensor", c)], [call.a, call.b, call.sfa, call.sfb])
        op.check_device(call, [("c_tensor", c, 16), ("amax_tensor", amax, 4)])
        # The engine writes C through the kernel's rows (an M-major C's (L * N, M) bytes under the
        # (L * M, N) shape its buffer table gives every batched C; ldc says the pitch).
        op.execute(a_tensor, b_tensor, sfa_tensor, sfb_tensor, outputs={"c": c.obj.reshape(c_shape), "amax": amax.obj},
                   current_stream=current_stream, output_names=_AMAX_NAMES)

    def _native_c(self, c_tensor: Any, call: Any, shape: tuple[int, ...], store: str) -> TensorView:
        """C as the kernel's rows: (L * M, N) for N-major, (L * N, M) for M-major (packed FP4 C:
        N / 2 bytes per row, the seed's (M, N // 2, L))."""
        if c_tensor is None:
            raise ArgumentError("c_tensor", None, "a tensor (the kernel writes C here)")
        v = view(c_tensor, "c_tensor")
        m, cols, l = call.m, shape[1], call.l
        want = (m, cols, l) if v.ndim == 3 else (m, cols)
        if tuple(v.shape) != want or (v.ndim == 2 and l != 1):
            what = "(M, N // 2, L): packed FP4" if cols != call.n else "(M, N, L)"
            raise ArgumentError("c_tensor.shape", tuple(v.shape), f"{(m, cols, l)} = {what}")
        t = c_tensor if v.ndim == 3 else c_tensor.unsqueeze(-1)
        t = as_bytes(t)
        m_major = self.op.variant.cd_major == "m"
        phys = t.permute(2, 1, 0) if m_major else t.permute(2, 0, 1)   # (L, N, M) or (L, M, N)
        if not phys.is_contiguous():
            order = "(1, M, M*N)" if m_major else "(N, 1, M*N)"
            raise ArgumentError("c_tensor.stride", tuple(v.strides), f"{order}: the {'m' if m_major else 'n'}-major C "
                                "this op was built for (from sample_c)")
        got = view(phys.reshape(-1, m if m_major else cols), "c_tensor")
        if got.dtype != store:
            raise ArgumentError("c_tensor.dtype", v.dtype, f"{store} storage (the op's C dtype)")
        return got
