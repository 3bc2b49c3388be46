"""Reference of seed 002: block-scaled grouped GEMM + prob-gated squared ReLU.

For rows ``m`` of expert ``e``, with ``acc`` the FP32 dot product of the dequantized operands:

* ``C = fl(alpha[e] * acc)``, or with bias ``C = fma(acc, alpha[e], bias[n, e])`` (bias is not
  multiplied by prob; the fma is emulated in float64 and rounded once to float32);
* ``r = relu(C)``; with ``tanh_clamp_scale=s``: ``r = fl(s * min(tanh(fl(r / s)), 1))``, tanh
  correctly rounded (the kernel's ``tanh.approx`` differs by up to 7.7e-6 absolute, which can move
  an FP8 output by one ulp — see the seed page);
* ``D = fl(fl(r * r) * prob[m])``.

C is stored in ``c_dtype`` (FP8/FP4 C: ``cvt.rn.satfinite`` without a scale). D in bf16/fp16/fp32
is rounded to nearest; bf16/fp16 D also gives the per-expert amax ``(L, 1)`` of ``|D|`` in FP32.
FP8 A/B with an FP8/FP4 D give SFD-quantized ``d``/``d_col`` and E8M0 ``sfd_row``/``sfd_col``
(``_epilogue`` documents the bit-level rules; this kernel's scale byte saturates, its stored byte
does not). NVIDIA's sReLU kernel compiles only e4m3 D; e5m2/e2m1 D follow the same rules here.
``d_col`` is None when D is not quantized (NVIDIA's wrapper allocates none either).
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from .. import arguments
from ..base.errors import ArgumentError
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
from ._epilogue import (
    QUANTIZED_OUTPUTS,
    SFD_RULES,
    alpha_bias_fma,
    cd_layout,
    finish_output,
    output_name,
    place_rows,
    round_output,
)
from ._operands import parse_grouped

__all__ = ["grouped_gemm_srelu"]

C_DTYPES = ("float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "float4_e2m1fn_x2", "uint8")
D_FROM_FP8 = ("float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "float4_e2m1fn_x2", "uint8")
D_FROM_FP4 = ("float16", "bfloat16", "float32")


def _check_clamp(tanh_clamp_scale: Any) -> np.float32 | None:
    if tanh_clamp_scale is None:
        return None
    if isinstance(tanh_clamp_scale, bool) or not isinstance(tanh_clamp_scale, (int, float)) or not (
        math.isfinite(tanh_clamp_scale) and tanh_clamp_scale > 0
    ):
        raise ArgumentError("tanh_clamp_scale", repr(tanh_clamp_scale), "None or a positive finite float")
    return np.float32(tanh_clamp_scale)


def srelu_activation(c: np.ndarray, prob: np.ndarray, clamp: np.float32 | None) -> np.ndarray:
    """``prob * relu(C)^2`` (optionally tanh-clamped) in float32; ``prob`` broadcasts per row."""
    r = np.maximum(c, np.float32(0))  # NaN stays NaN
    if clamp is not None:
        t = np.tanh((r / clamp).astype(np.float64)).astype(np.float32)
        r = clamp * np.minimum(t, np.float32(1))
    return (r * r) * prob


def grouped_gemm_srelu(
    a_tensor: Any,
    b_tensor: Any = None,
    sfa_tensor: Any = None,
    sfb_tensor: Any = None,
    padded_offsets: Any = None,
    alpha_tensor: Any = None,
    bias_tensor: Any = None,
    b_ptrs: Any = None,
    sfb_ptrs: Any = None,
    n: int | None = None,
    b_dtype: Any = None,
    b_major: str = "k",
    norm_const_tensor: Any = None,
    prob_tensor: Any = None,
    acc_dtype: Any = "float32",
    c_dtype: Any = "bfloat16",
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
    tanh_clamp_scale: float | None = None,
    b_list: Sequence[Any] | None = None,
    sfb_list: Sequence[Any] | None = None,
    e5m2_rcp_max: str = "page",
) -> TupleDict:
    """Grouped block-scaled GEMM + squared ReLU (seed 002).

    Parameters
    ----------
    a_tensor : (M, K, 1) or (M, K)
        FP8 (e4m3fn/e5m2) or packed FP4 (``uint8``, K/2 innermost).
    b_tensor : (N, K, L) view or (L, N, K), same dtype as A; exclusive with ``b_list`` (GPU ops: ``b_ptrs``).
    sfa_tensor : scale factors
        Kernel-facing 6-D view, physical ``(L, ceil(mn/128), ceil(sfk/4), 32, 4, 4)`` or flat;
        E8M0 (``uint8``/``int8`` bytes read as E8M0) or e4m3.
    sfb_tensor : scale factors
        Kernel-facing 6-D view, physical ``(L, ceil(mn/128), ceil(sfk/4), 32, 4, 4)`` or flat;
        E8M0 (``uint8``/``int8`` bytes read as E8M0) or e4m3.
    padded_offsets : (L,) int32, nondecreasing multiples of 256.
    alpha_tensor : (L,), (L, 1) or (L, 1, 1) float32.
    bias_tensor : (N, L), optional; added after alpha, not gated by prob.
    norm_const_tensor : (1,) float32; required for SFD outputs (FP8 A/B with FP8/FP4 D).
    prob_tensor : (M, 1, 1) or (M,) float32, required.
    c_dtype : float32, float16, bfloat16 (default), float8_e4m3fn, float8_e5m2, float4_e2m1fn_x2.
    d_dtype : str
        FP8 A/B: float16, bfloat16 (default), float8_e4m3fn, float8_e5m2 or float4_e2m1fn_x2;
        FP4 A/B: float16, bfloat16 or float32.
    sf_vec_size : int
        16 (default, the wrapper's) or 32; FP8 A/B require 32, e4m3 scales 16.
    discrete_col_sfd : bool
        Lay SFD_col out per expert (``formats.scales``).
    tanh_clamp_scale : float, optional
        Soft clamp ``s`` (keyword only).
    b_list : per-expert weights and their SF buffers (host stand-in for b_ptrs/sfb_ptrs).
    sfb_list : per-expert weights and their SF buffers (host stand-in for b_ptrs/sfb_ptrs).
    e5m2_rcp_max : {"page", "nvidia"}
        SFD rcp_max of e5m2 D: the page's 1/57344 (default) or NVIDIA's kernel's 1/128.
    acc_dtype : str
        "float32" (default) or "float64".
    b_ptrs : must be None (device pointers: pass ``b_list``/``sfb_list`` here).
    sfb_ptrs : must be None (device pointers: pass ``b_list``/``sfb_list`` here).
    n : int, optional
        Checked against the weights when given.
    b_dtype : optional
        Checked against A's dtype when given.
    b_major : str
        "k" (default) or "n"
        Memory order of the weights.
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
        ``c_tensor, d_tensor, d_col_tensor, amax_tensor, sfd_row_tensor, sfd_col_tensor``.
        Outputs are (M, N, 1) with kernel-facing SF views, or (M, N) with physical SF buffers
        when ``a_tensor`` is 2-D; rows at or past valid_m are zero.
    """
    acc = check_common(cd_major=cd_major, acc_dtype=acc_dtype)
    ops = parse_grouped(
        a_tensor=a_tensor, b_tensor=b_tensor, b_list=b_list, padded_offsets=padded_offsets,
        m_aligned=m_aligned, acc=acc, n=n, b_dtype=b_dtype, b_major=b_major, b_ptrs=b_ptrs,
        sfa_tensor=sfa_tensor, sfb_tensor=sfb_tensor, sfb_list=sfb_list, sfb_ptrs=sfb_ptrs,
        sf_vec_size=sf_vec_size,
    )
    c_name = output_name(c_dtype, "c_dtype", C_DTYPES)
    allowed, context = d_dtypes_for(ops.is_fp8, D_FROM_FP8, D_FROM_FP4)
    d_name = output_name(d_dtype, "d_dtype", allowed, context)
    clamp = _check_clamp(tanh_clamp_scale)
    quantized = d_name in QUANTIZED_OUTPUTS
    nc = parse_norm_const(norm_const_tensor, quantized)
    rl = rcp_max(d_name, e5m2_rcp_max)
    alpha = host_vector(arguments.vector(alpha_tensor, "alpha_tensor", ops.l, what=PER_EXPERT))
    bias = None
    if bias_tensor is not None:
        bias = host_float32(arguments.bias(bias_tensor, ops.n, ops.l, BIAS_DTYPES))
    prob = parse_prob(prob_tensor, ops.m, required=True)

    rows = row_expert(ops.offsets)
    acc_values = ops.accumulate()
    alpha_rows = alpha[rows][:, None]
    if bias is None:
        c = acc_values * alpha_rows
    else:
        c = alpha_bias_fma(acc_values, alpha_rows, bias.T[rows])
    d = srelu_activation(c, prob[: ops.valid_m, None], clamp)
    out = finish_output(
        d, m=ops.m, d_name=d_name, canonical=ops.canonical, ranges=ops.ranges, offsets=ops.offsets,
        nc=nc, rl=rl, rule=SFD_RULES["srelu"], discrete_col_sfd=discrete_col_sfd, want_amax=True,
    )
    return TupleDict(
        c_tensor=cd_layout(place_rows(round_output(c, c_name), ops.m), ops.canonical),
        d_tensor=out["d"],
        d_col_tensor=out["d_col"],
        amax_tensor=out["amax"],
        sfd_row_tensor=out["sfd_row"],
        sfd_col_tensor=out["sfd_col"],
    )
