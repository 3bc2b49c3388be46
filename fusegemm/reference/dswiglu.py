"""Reference of seed 000: block-scaled grouped GEMM + dSwiGLU backward epilogue.

For rows ``m`` of expert ``e`` and GEMM column ``n`` (block ``j = n // 32``, lane ``i = n % 32``):

* ``R = fl(fl(alpha[e] * alpha[e]) * acc)`` — alpha applies to both operands (squared);
* C ``(M, 2N)`` alternates 32-column blocks: block ``2j`` is the gate ``g``, block ``2j + 1`` the
  input/up ``u``; both are scaled by ``beta[e]`` (``g = fl(beta * C[m, 64j + i])``,
  ``u = fl(beta * C[m, 64j + 32 + i])``);
* ``sig = sigmoid(g)`` (correctly rounded; the kernel's ``ex2``/``rcp.approx`` differ by a few
  ulp), ``swish = fl(g * sig)``, ``rp = fl(R * prob[m])``;
* ``ab = fl(rp * swish)`` goes to D's **odd** block ``2j + 1``;
* ``dswiglu = fl(fl(fl(rp * u) * sig) * fl(1 + fl(g * fl(1 - sig))))`` goes to D's **even**
  block ``2j``;
* ``dprob[m] = sum_n swish * u * R`` (prob is not a factor), summed in float64 and rounded once
  (the kernel's FP32 atomics make its order nondeterministic).

bf16/fp16 D gives amax ``(L, 2, 1)``: ``[e, 0] = max |dswiglu|``, ``[e, 1] = max |ab|``. FP8 A/B
with FP8 D give SFD-quantized ``d_row``/``d_col`` (32-column blocks never mix dswiglu and ab).
``d_col`` is None when D is not quantized (NVIDIA's wrapper returns an unwritten buffer then).
``epilogue_op`` is validated and, as in NVIDIA's kernel, not applied.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .. import arguments
from ..base.errors import ArgumentError
from ..formats.numpy_dtypes import to_numpy
from ..tupledict import TupleDict
from ._args import (
    EPILOGUE_OPS,
    PER_EXPERT,
    check_common,
    d_dtypes_for,
    host_vector,
    parse_norm_const,
    parse_prob,
    rcp_max,
    row_expert,
)
from ._epilogue import QUANTIZED_OUTPUTS, SFD_RULES, expert_amax, finish_output, output_name, place_rows, vector_layout
from ._operands import decode, elem_of, parse_grouped

__all__ = ["grouped_gemm_dswiglu", "interleave_blocks", "split_blocks"]

BLOCK = 32
C_DTYPES = ("float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2")
D_FROM_FP8 = ("float8_e4m3fn", "float8_e5m2")
D_FROM_FP4 = ("bfloat16", "float32")


def split_blocks(c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Even (gate) and odd (up) 32-column blocks of ``c`` (M, 2N), each (M, N)."""
    m, two_n = c.shape
    blocks = c.reshape(m, two_n // (2 * BLOCK), 2, BLOCK)
    return blocks[:, :, 0].reshape(m, two_n // 2), blocks[:, :, 1].reshape(m, two_n // 2)


def interleave_blocks(even: np.ndarray, odd: np.ndarray) -> np.ndarray:
    """Inverse of :func:`split_blocks`: (M, N) and (M, N) to (M, 2N), even blocks first."""
    m, n = even.shape
    out = np.stack([even.reshape(m, n // BLOCK, BLOCK), odd.reshape(m, n // BLOCK, BLOCK)], axis=2)
    return out.reshape(m, 2 * n)


def _sigmoid(g: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return (1.0 / (1.0 + np.exp(-g.astype(np.float64)))).astype(np.float32)


def grouped_gemm_dswiglu(
    a_tensor: Any,
    b_tensor: Any,
    c_tensor: Any,
    sfa_tensor: Any,
    sfb_tensor: Any,
    padded_offsets: Any,
    alpha_tensor: Any,
    beta_tensor: Any,
    prob_tensor: Any,
    norm_const_tensor: Any = None,
    acc_dtype: Any = "float32",
    d_dtype: Any = "bfloat16",
    cd_major: str = "n",
    mma_tiler_mn: tuple[int, int] = (256, 256),
    cluster_shape_mn: tuple[int, int] | None = None,
    sf_vec_size: int = 16,
    vector_f32: bool = False,
    m_aligned: int = 256,
    discrete_col_sfd: bool = False,
    epilogue_op: str | None = None,
    current_stream: Any = None,
    *,
    e5m2_rcp_max: str = "page",
) -> TupleDict:
    """Grouped block-scaled GEMM + dSwiGLU backward (seed 000).

    Parameters
    ----------
    a_tensor
        As for :func:`~fusegemm.reference.grouped_gemm_srelu` (dense B only).
    b_tensor
        As for :func:`~fusegemm.reference.grouped_gemm_srelu` (dense B only).
    sfa_tensor
        As for :func:`~fusegemm.reference.grouped_gemm_srelu` (dense B only).
    sfb_tensor
        As for :func:`~fusegemm.reference.grouped_gemm_srelu` (dense B only).
    padded_offsets
        As for :func:`~fusegemm.reference.grouped_gemm_srelu` (dense B only).
    alpha_tensor
        As for :func:`~fusegemm.reference.grouped_gemm_srelu` (dense B only).
    c_tensor : (M, 2N, 1) or (M, 2N)
        Forward intermediate: float32, float16, bfloat16, float8_e4m3fn or float8_e5m2.
    beta_tensor : (L,), (L, 1) or (L, 1, 1) float32, or None (1).
    prob_tensor : (M, 1, 1) or (M,), float32 or bfloat16; required.
    norm_const_tensor : (1,) float32; required for FP8 D.
    d_dtype : FP8 A/B: float8_e4m3fn, float8_e5m2; FP4 A/B: bfloat16 (default), float32.
    sf_vec_size : 16 (default, the wrapper's) or 32; FP8 A/B require 32.
    discrete_col_sfd : bool
    epilogue_op : None, "none", "identity", "relu" or "srelu"; not applied (as NVIDIA).
    e5m2_rcp_max : {"page", "nvidia"}
        SFD rcp_max of an e5m2 D: the page's 1/57344 (default) or NVIDIA's kernel's 1/128.
    acc_dtype : str
        "float32" (default) or "float64".
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
    current_stream
        Signature compatibility only.

    Returns
    -------
    TupleDict
        ``d_row_tensor, d_col_tensor, dprob_tensor, amax_tensor, sfd_row_tensor,
        sfd_col_tensor``; D is (M, 2N, 1) and dprob (M, 1, 1), or (M, 2N) and (M,) when
        ``a_tensor`` is 2-D. Rows at or past valid_m are zero.
    """
    acc = check_common(cd_major=cd_major, acc_dtype=acc_dtype)
    arguments.choice(epilogue_op, "epilogue_op", EPILOGUE_OPS)
    ops = parse_grouped(
        a_tensor=a_tensor, b_tensor=b_tensor, b_list=None, padded_offsets=padded_offsets,
        m_aligned=m_aligned, acc=acc, sfa_tensor=sfa_tensor, sfb_tensor=sfb_tensor,
        sf_vec_size=sf_vec_size,
    )
    if ops.n % BLOCK:
        raise ArgumentError("b_tensor N", ops.n, f"a multiple of {BLOCK}",
                            "dSwiGLU interleaves 32-column gate/up blocks")
    allowed, context = d_dtypes_for(ops.is_fp8, D_FROM_FP8, D_FROM_FP4)
    d_name = output_name(d_dtype, "d_dtype", allowed, context)
    nc = parse_norm_const(norm_const_tensor, d_name in QUANTIZED_OUTPUTS)
    rl = rcp_max(d_name, e5m2_rcp_max)
    alpha = host_vector(arguments.vector(alpha_tensor, "alpha_tensor", ops.l, what=PER_EXPERT))
    beta = (
        np.ones(ops.l, np.float32)
        if beta_tensor is None
        else host_vector(arguments.vector(beta_tensor, "beta_tensor", ops.l, what=PER_EXPERT))
    )
    prob = parse_prob(prob_tensor, ops.m, required=True, allowed=("float32", "bfloat16"))
    c_view = arguments.output(c_tensor, "c_tensor", ops.m, 2 * ops.n, C_DTYPES,
                              what="(M, 2N) or (M, 2N, 1)")
    c = to_numpy(c_tensor, argument="c_tensor")
    c = c if c.ndim == 2 else c[:, :, 0]
    c_values = decode(c[: ops.valid_m], elem_of(c_view.dtype))

    rows = row_expert(ops.offsets)
    alpha_sq = (alpha * alpha)[rows][:, None]
    r = alpha_sq * ops.accumulate()
    gate, up = split_blocks(c_values)
    beta_rows = beta[rows][:, None]
    g = beta_rows * gate
    u = beta_rows * up
    sig = _sigmoid(g)
    swish = g * sig
    rp = r * prob[: ops.valid_m, None]
    ab = rp * swish
    one = np.float32(1)
    dswiglu = ((rp * u) * sig) * (one + g * (one - sig))
    dprob_valid = np.sum(swish.astype(np.float64) * u * r, axis=1).astype(np.float32)

    d = interleave_blocks(dswiglu, ab)
    out = finish_output(
        d, m=ops.m, d_name=d_name, canonical=ops.canonical, ranges=ops.ranges, offsets=ops.offsets,
        nc=nc, rl=rl, rule=SFD_RULES["dswiglu"], discrete_col_sfd=discrete_col_sfd, want_amax=False,
    )
    amax = None
    if d_name in ("bfloat16", "float16"):
        amax = np.stack([expert_amax(dswiglu, ops.ranges), expert_amax(ab, ops.ranges)], axis=1)[:, :, None]
    dprob = vector_layout(place_rows(dprob_valid, ops.m), ops.canonical)
    return TupleDict(
        d_row_tensor=out["d"],
        d_col_tensor=out["d_col"],
        dprob_tensor=dprob,
        amax_tensor=amax,
        sfd_row_tensor=out["sfd_row"],
        sfd_col_tensor=out["sfd_col"],
    )
