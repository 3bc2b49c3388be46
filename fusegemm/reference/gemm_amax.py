"""Reference of seed 004: block-scaled batched dense GEMM + global amax.

``C[:, :, l] = dequant(A_l) @ dequant(B_l)^T`` accumulated in FP32 (no alpha, no prob);
``amax = max |C|`` over every element of every batch, taken on the FP32 accumulator before C is
converted, shape ``(1, 1, 1)`` float32. amax starts at -inf and NaN propagates (NVIDIA's kernel
drops NaN). C in bf16/fp16/fp32 is rounded to nearest; FP8/FP4 C is ``cvt.rn.satfinite``
without a scale (FP4 C packed two per byte along N, n-major only).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..formats.blockscale import block_format
from ..formats.dtypes import FP8_NAMES, to_numpy
from ..tupledict import TupleDict
from ._args import check_choice, resolve_acc
from ._epilogue import output_name, round_output
from ._operands import BLOCKSCALED_AB, dequant, elem_name, logical_k, parse_scales, sf_name

__all__ = ["gemm_amax"]

C_DTYPES = ("float32", "float16", "bfloat16", "float8_e5m2", "float8_e4m3fn", "float4_e2m1fn_x2", "uint8")


def _batched(x: Any, argument: str, dims: str) -> tuple[np.ndarray, bool]:
    """``(L, rows, K_stored)`` from the kernel-facing ``(rows, K, L)`` or a 2-D ``(rows, K)``."""
    arr = to_numpy(x, argument=argument)
    if arr.ndim == 3:
        return np.transpose(arr, (2, 0, 1)), False
    if arr.ndim == 2:
        return arr[None], True
    raise ValueError(f"{argument} has shape {tuple(arr.shape)}; expected {dims} or a 2-D matrix (L = 1)")


def gemm_amax(
    a_tensor: Any,
    b_tensor: Any,
    sfa_tensor: Any,
    sfb_tensor: Any,
    c_major: str = "n",
    c_dtype: Any = "float32",
    acc_dtype: Any = "float32",
    mma_tiler_mn: tuple[int, int] = (128, 128),
    cluster_shape_mn: tuple[int, int] = (1, 1),
    sf_vec_size: int = 32,
    stream: Any = None,
) -> TupleDict:
    """Batched block-scaled GEMM + global amax (seed 004).

    Parameters
    ----------
    a_tensor : (M, K, L) (any strides: m- or k-major), or (M, K) for L = 1
        FP8 or packed FP4 (``uint8``, K/2, k-major only).
    b_tensor : (N, K, L) or (N, K); same dtype as A.
    sfa_tensor, sfb_tensor : kernel-facing view, physical buffer or flat; E8M0 (``int8``/``uint8``
        bytes read as E8M0) or e4m3.
    c_major : "n" (default) or "m": memory order of the returned C (values are the same).
    c_dtype : float32 (default), float16, bfloat16, float8_e5m2, float8_e4m3fn,
        float4_e2m1fn_x2 (``uint8``). FP8 A/B with FP8 C is rejected, as on the GPU; FP4 C needs
        FP4 A/B and ``c_major="n"``.
    acc_dtype : "float32" (default) or "float64".
    sf_vec_size : 32 (default) or 16.
    mma_tiler_mn, cluster_shape_mn, stream
        Signature compatibility only.

    Returns
    -------
    TupleDict
        ``c_tensor`` (M, N, L) — (M, N/2, L) for FP4 — or 2-D for 2-D inputs, and ``amax_tensor``
        (1, 1, 1) float32.
    """
    acc = resolve_acc(acc_dtype)
    check_choice(c_major, "c_major", ("m", "n"))
    a, canonical = _batched(a_tensor, "a_tensor", "(M, K, L)")
    b, _ = _batched(b_tensor, "b_tensor", "(N, K, L)")
    ab = elem_name(a, "a_tensor", BLOCKSCALED_AB)
    if elem_name(b, "b_tensor", BLOCKSCALED_AB) != ab:
        raise ValueError(f"b_tensor dtype {b.dtype} must match a_tensor dtype {a.dtype}")
    if a.shape[0] != b.shape[0] or a.shape[2] != b.shape[2]:
        raise ValueError(
            f"a_tensor (L={a.shape[0]}, K={a.shape[2]}) and b_tensor (L={b.shape[0]}, "
            f"K={b.shape[2]}) must agree in K and L"
        )
    c_name = output_name(c_dtype, "c_dtype", C_DTYPES)
    if ab in FP8_NAMES and c_name in FP8_NAMES:
        raise ValueError(f"c_dtype={c_name!r} with FP8 A/B ({ab}) is disabled; allowed: float32, float16, bfloat16")
    if c_name == "float4_e2m1fn_x2" and (ab in FP8_NAMES or c_major != "n"):
        raise ValueError(f"an FP4 C needs FP4 A/B and c_major='n'; got ab={ab}, c_major={c_major!r}")
    sf = sf_name(to_numpy(sfa_tensor, argument="sfa_tensor"), "sfa_tensor")
    block_format(ab, sf, sf_vec_size)
    l, m, n, k = a.shape[0], a.shape[1], b.shape[1], logical_k(a.shape[2], ab)
    sfk = -(-k // sf_vec_size)
    sfa, _ = parse_scales(sfa_tensor, "sfa_tensor", m, sfk, l)
    sfb, sfb_dtype = parse_scales(sfb_tensor, "sfb_tensor", n, sfk, l)
    if sfb_dtype != sf:
        raise ValueError(f"SFB dtype {sfb_dtype} must match SFA dtype {sf}")

    acc_type = np.float64 if acc == "float64" else np.float32
    c = np.empty((l, m, n), dtype=np.float32)
    for i in range(l):
        a_i = dequant(a[i], ab, sfa[i], sf_vec_size).astype(acc_type, copy=False)
        b_i = dequant(b[i], ab, sfb[i], sf_vec_size).astype(acc_type, copy=False)
        c[i] = a_i @ b_i.T
    amax = np.full((1, 1, 1), -np.inf, dtype=np.float32)
    if c.size:
        amax[...] = np.max(np.abs(c))
    stored = round_output(c, c_name)  # (L, M, N) or packed (L, M, N/2): C-contiguous
    if canonical:
        c_out = stored[0]
    elif c_major == "n":
        c_out = np.transpose(stored, (1, 2, 0))  # strides (N, 1, M*N)
    else:
        c_out = np.transpose(np.ascontiguousarray(np.transpose(stored, (0, 2, 1))), (2, 1, 0))
    return TupleDict(c_tensor=c_out, amax_tensor=amax)
