"""Reference of seed 001: BF16 grouped GEMM (``grouped_gemm_wrapper_sm100``).

For rows ``m`` of expert ``e`` (``[padded_offsets[e-1], padded_offsets[e])``), with
``G = fl(alpha[e] * acc)`` and ``acc`` the FP32 dot product of A's row with B_e's rows:

* with bias: ``C = fl(G + fl(prob[m] * bias[n, e]))`` and ``D = C``;
* without bias: ``C = G`` and ``D = fl(prob[m] * G)`` (``prob`` omitted means 1).

C and D are rounded (RNE) to ``c_dtype`` / ``d_dtype`` independently. Rows at or past
``valid_m = padded_offsets[-1]`` are never written by the kernel; the reference returns zeros
there.
"""
from __future__ import annotations

from typing import Any, Sequence

from .. import arguments
from ..formats.numpy_dtypes import FLOAT_OUTPUT_NAMES
from ..tupledict import TupleDict
from ._args import BIAS_DTYPES, PER_EXPERT, check_common, host_float32, host_vector, parse_prob, row_expert
from ._epilogue import cd_layout, output_name, place_rows, round_output
from ._operands import parse_grouped

__all__ = ["grouped_gemm"]


def grouped_gemm(
    a_tensor: Any,
    padded_offsets: Any,
    alpha_tensor: Any,
    b_tensor: Any = None,
    bias_tensor: Any = None,
    b_ptrs: Any = None,
    n: int | None = None,
    b_dtype: Any = None,
    b_major: str = "k",
    prob_tensor: Any = None,
    acc_dtype: Any = "float32",
    c_dtype: Any = "bfloat16",
    d_dtype: Any = "bfloat16",
    cd_major: str = "n",
    mma_tiler_mn: tuple[int, int] = (256, 256),
    cluster_shape_mn: tuple[int, int] | None = None,
    vector_f32: bool = False,
    m_aligned: int = 256,
    generate_c: bool = False,
    use_dynamic_sched: bool = False,
    current_stream: Any = None,
    *,
    b_list: Sequence[Any] | None = None,
) -> TupleDict:
    """Grouped BF16 GEMM with alpha, prob and optional bias (seed 001).

    Parameters
    ----------
    a_tensor : (M, K, 1) or (M, K), bfloat16
        Rows of all experts; M may exceed ``valid_m``.
    padded_offsets : (L,) int32
        Cumulative expert row ends, nondecreasing multiples of 256 (checked), L <= 1024.
    alpha_tensor : (L,), (L, 1) or (L, 1, 1) float32
    b_tensor : (N, K, L) kernel-facing view or (L, N, K) canonical, bfloat16
        Dense weights; exclusive with ``b_list`` (on the GPU ops: with ``b_ptrs``).
    bias_tensor : (N, L) bfloat16/float16/float32, optional
    b_ptrs : must be None
        Device pointers cannot be read on the host: pass ``b_list`` instead.
    n : optional
        Checked against the weights when given (discrete mode on the GPU).
    b_dtype : optional
        Checked against the weights when given (discrete mode on the GPU).
    b_major : optional
        Checked against the weights when given (discrete mode on the GPU).
    prob_tensor : (M, 1, 1) or (M,) float32, optional
        Per-row gate; 1 when omitted.
    acc_dtype : str
        "float32" (default) or "float64"
        float64 gives the correctly rounded FP32 dot product (fusegemm/reference/_operands.py).
    c_dtype : bfloat16 (default), float16 or float32
    d_dtype : bfloat16 (default), float16 or float32
    generate_c : bool
        Return C (else ``c_tensor`` is None).
    cd_major
        Signature compatibility; must be ``"n"`` (the math does not change).
    mma_tiler_mn
        Signature compatibility only.
    cluster_shape_mn
        Signature compatibility only.
    vector_f32
        Signature compatibility only.
    m_aligned
        Signature compatibility; must be 256 (the math does not change).
    use_dynamic_sched
        Signature compatibility only.
    current_stream
        Signature compatibility only.
    b_list : sequence of L arrays (N, K), optional
        Per-expert weights (the host stand-in for ``b_ptrs``).

    Returns
    -------
    TupleDict
        ``d_tensor``, ``c_tensor`` in that order; (M, N, 1) outputs, or (M, N) when ``a_tensor``
        is 2-D. Rows at or past valid_m are zero.
    """
    acc = check_common(cd_major=cd_major, acc_dtype=acc_dtype)
    ops = parse_grouped(
        a_tensor=a_tensor, b_tensor=b_tensor, b_list=b_list, padded_offsets=padded_offsets,
        m_aligned=m_aligned, acc=acc, n=n, b_dtype=b_dtype, b_major=b_major, b_ptrs=b_ptrs,
    )
    c_name = output_name(c_dtype, "c_dtype", FLOAT_OUTPUT_NAMES)
    d_name = output_name(d_dtype, "d_dtype", FLOAT_OUTPUT_NAMES)
    alpha = host_vector(arguments.vector(alpha_tensor, "alpha_tensor", ops.l, what=PER_EXPERT))
    bias = None
    if bias_tensor is not None:
        bias = host_float32(arguments.bias(bias_tensor, ops.n, ops.l, BIAS_DTYPES))
    prob = parse_prob(prob_tensor, ops.m, required=False)

    rows = row_expert(ops.offsets)
    p = prob[: ops.valid_m, None]
    g = ops.accumulate() * alpha[rows][:, None]
    if bias is not None:
        c = g + p * bias.T[rows]
        d = c
    else:
        c = g
        d = p * g
    c_out = cd_layout(place_rows(round_output(c, c_name), ops.m), ops.canonical) if generate_c else None
    d_out = cd_layout(place_rows(round_output(d, d_name), ops.m), ops.canonical)
    return TupleDict(d_tensor=d_out, c_tensor=c_out)
