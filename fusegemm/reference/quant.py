"""Reference of seed 003: block-scaled grouped GEMM + prob gating + output quantization.

For rows ``m`` of expert ``e``, with ``acc`` the FP32 dot product of the dequantized operands and
``s = fl(alpha[e] * row_scale[m])`` (``row_scale`` omitted: ``s = alpha[e]``):

* without bias: ``D = fl(fl(acc * s) * prob[m])`` — the page's ``prob * alpha * G``;
* with bias (NVIDIA's kernel; the page shows none): ``D = fma(acc, s, fl(prob[m] * bias[n, e]))``
  — prob scales only the bias, as in the BF16 op.

``prob_tensor`` may be omitted (p = 1; NVIDIA's kernel compiles the multiply out), although the
page calls it required. bf16/fp16/fp32 D is rounded to nearest, and bf16/fp16 D gives the
per-expert amax ``(L, 1)`` when ``generate_amax`` (default). FP8 A/B with an FP8/FP4 D give
SFD-quantized ``d``/``d_col`` and ``sfd_row``/``sfd_col`` (``_epilogue``; in this kernel neither
the scale byte nor the stored byte saturates, so a scale overflow gives NaN outputs).
``d_col`` is None when D is not quantized.
"""
from __future__ import annotations

from typing import Any, Sequence


from .. import arguments
from ..tupledict import TupleDict
from ._args import (
    BIAS_DTYPES,
    PER_EXPERT,
    check_common,
    d_dtypes_for,
    host_float32,
    host_vector,
    parse_norm_const,
    parse_prob,
    rcp_max,
    row_expert,
)
from ._epilogue import QUANTIZED_OUTPUTS, SFD_RULES, alpha_bias_fma, finish_output, output_name
from ._operands import parse_grouped

__all__ = ["grouped_gemm_quant"]

D_FROM_FP8 = ("float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "float4_e2m1fn_x2", "uint8")
D_FROM_FP4 = ("float16", "bfloat16", "float32")


def grouped_gemm_quant(
    a_tensor: Any,
    sfa_tensor: Any,
    padded_offsets: Any,
    alpha_tensor: Any,
    b_tensor: Any = None,
    sfb_tensor: Any = None,
    bias_tensor: Any = None,
    b_ptrs: Any = None,
    sfb_ptrs: Any = None,
    n: int | None = None,
    b_dtype: Any = None,
    b_major: str = "k",
    norm_const_tensor: Any = None,
    prob_tensor: Any = None,
    acc_dtype: Any = "float32",
    d_dtype: Any = "bfloat16",
    cd_major: str = "n",
    mma_tiler_mn: tuple[int, int] = (256, 256),
    cluster_shape_mn: tuple[int, int] | None = None,
    sf_vec_size: int = 16,
    vector_f32: bool = False,
    m_aligned: int = 256,
    discrete_col_sfd: bool = False,
    use_dynamic_sched: bool = False,
    current_stream: Any = None,
    *,
    row_scale_tensor: Any = None,
    generate_amax: bool = True,
    b_list: Sequence[Any] | None = None,
    sfb_list: Sequence[Any] | None = None,
    e5m2_rcp_max: str = "page",
) -> TupleDict:
    """Grouped block-scaled GEMM + prob gating + quantized output (seed 003).

    Parameters
    ----------
    a_tensor
        As for :func:`~fusegemm.reference.grouped_gemm_srelu`.
    b_tensor
        As for :func:`~fusegemm.reference.grouped_gemm_srelu`.
    sfa_tensor
        As for :func:`~fusegemm.reference.grouped_gemm_srelu`.
    sfb_tensor
        As for :func:`~fusegemm.reference.grouped_gemm_srelu`.
    padded_offsets
        As for :func:`~fusegemm.reference.grouped_gemm_srelu`.
    alpha_tensor
        As for :func:`~fusegemm.reference.grouped_gemm_srelu`.
    bias_tensor
        As for :func:`~fusegemm.reference.grouped_gemm_srelu`.
    norm_const_tensor : (1,) float32; required for SFD outputs (FP8 A/B with FP8/FP4 D).
    prob_tensor : (M, 1, 1) or (M,) float32, optional (1 when omitted).
    d_dtype : str
        FP8 A/B: float16, bfloat16 (default), float8_e4m3fn, float8_e5m2 or float4_e2m1fn_x2;
        FP4 A/B: float16, bfloat16 or float32.
    sf_vec_size : int
        16 (default, the wrapper's) or 32; FP8 A/B require 32, e4m3 scales 16.
    discrete_col_sfd : bool
        Lay SFD_col out per expert.
    row_scale_tensor : (M,), (M, 1) or (M, 1, 1) float32, optional
        Per-row factor of the GEMM term (NVIDIA's kernel; keyword only).
    generate_amax : bool
        Compute amax for bf16/fp16 D (keyword only).
    b_list
        As for :func:`~fusegemm.reference.grouped_gemm_srelu`.
    sfb_list
        As for :func:`~fusegemm.reference.grouped_gemm_srelu`.
    e5m2_rcp_max
        As for :func:`~fusegemm.reference.grouped_gemm_srelu`.
    acc_dtype
        As for :func:`~fusegemm.reference.grouped_gemm_srelu`.
    b_ptrs
        As for :func:`~fusegemm.reference.grouped_gemm_srelu`.
    sfb_ptrs
        As for :func:`~fusegemm.reference.grouped_gemm_srelu`.
    n
        As for :func:`~fusegemm.reference.grouped_gemm_srelu`.
    b_dtype
        As for :func:`~fusegemm.reference.grouped_gemm_srelu`.
    b_major
        As for :func:`~fusegemm.reference.grouped_gemm_srelu`.
    cd_major
        Signature compatibility only.
    mma_tiler_mn
        Signature compatibility only.
    cluster_shape_mn
        Signature compatibility only.
    vector_f32
        Signature compatibility only.
    m_aligned
        Signature compatibility only.
    use_dynamic_sched
        Signature compatibility only.
    current_stream
        Signature compatibility only.

    Returns
    -------
    TupleDict
        ``d_tensor, d_col_tensor, amax_tensor, sfd_row_tensor, sfd_col_tensor``.
    """
    acc = check_common(cd_major=cd_major, acc_dtype=acc_dtype)
    ops = parse_grouped(
        a_tensor=a_tensor, b_tensor=b_tensor, b_list=b_list, padded_offsets=padded_offsets,
        m_aligned=m_aligned, acc=acc, n=n, b_dtype=b_dtype, b_major=b_major, b_ptrs=b_ptrs,
        sfa_tensor=sfa_tensor, sfb_tensor=sfb_tensor, sfb_list=sfb_list, sfb_ptrs=sfb_ptrs,
        sf_vec_size=sf_vec_size,
    )
    allowed, context = d_dtypes_for(ops.is_fp8, D_FROM_FP8, D_FROM_FP4)
    d_name = output_name(d_dtype, "d_dtype", allowed, context)
    nc = parse_norm_const(norm_const_tensor, d_name in QUANTIZED_OUTPUTS)
    rl = rcp_max(d_name, e5m2_rcp_max)
    alpha = host_vector(arguments.vector(alpha_tensor, "alpha_tensor", ops.l, what=PER_EXPERT))
    bias = None
    if bias_tensor is not None:
        bias = host_float32(arguments.bias(bias_tensor, ops.n, ops.l, BIAS_DTYPES))
    prob = parse_prob(prob_tensor, ops.m, required=False)[: ops.valid_m, None]
    rows = row_expert(ops.offsets)
    scale = alpha[rows]
    if row_scale_tensor is not None:
        row_scale = host_vector(arguments.vector(row_scale_tensor, "row_scale_tensor", ops.m,
                                                 what="(one factor per row)"))
        scale = scale * row_scale[: ops.valid_m]
    scale = scale[:, None]

    acc_values = ops.accumulate()
    if bias is None:
        d = (acc_values * scale) * prob
    else:
        d = alpha_bias_fma(acc_values, scale, prob * bias.T[rows])
    out = finish_output(
        d, m=ops.m, d_name=d_name, canonical=ops.canonical, ranges=ops.ranges, offsets=ops.offsets,
        nc=nc, rl=rl, rule=SFD_RULES["quant"], discrete_col_sfd=discrete_col_sfd,
        want_amax=bool(generate_amax),
    )
    return TupleDict(
        d_tensor=out["d"],
        d_col_tensor=out["d_col"],
        amax_tensor=out["amax"],
        sfd_row_tensor=out["sfd_row"],
        sfd_col_tensor=out["sfd_col"],
    )
