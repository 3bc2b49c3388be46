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

from .. import arguments
from ..base.errors import ArgumentError
from ..formats.blockscale import block_format
from ..formats.numpy_dtypes import FLOAT_OUTPUT_NAMES, FP8_NAMES, to_numpy
from ..runtime.tensors import TensorView
from ..tupledict import TupleDict
from ._args import resolve_acc
from ._epilogue import output_name, round_output
from ._operands import (
    BLOCKSCALED_AB,
    dequant,
    elem_of,
    logical_k,
    parse_scales,
    same_elements,
    same_scales,
    scale_tensor,
    sf_of,
)

__all__ = ["gemm_amax"]

C_DTYPES = ("float32", "float16", "bfloat16", "float8_e5m2", "float8_e4m3fn", "float4_e2m1fn_x2", "uint8")


def _batched(x: Any, name: str) -> tuple[np.ndarray, TensorView]:
    """``(L, rows, K_stored)`` from the kernel-facing ``(rows, K, L)`` or a 2-D ``(rows, K)``."""
    v = arguments.tensor(x, name, ndims=(2, 3), dtypes=BLOCKSCALED_AB)
    arr = to_numpy(x, argument=name)
    return (arr[None] if v.ndim == 2 else np.transpose(arr, (2, 0, 1))), v


def _check_b_extents(a: np.ndarray, b: np.ndarray, b_view: TensorView) -> None:
    """B shares A's K (stored) and L."""
    l, kb = a.shape[0], a.shape[2]
    if b.shape[0] != l or b.shape[2] != kb:
        two_d = f" or (N, {kb})" if l == 1 else ""
        raise ArgumentError("b_tensor.shape", tuple(b_view.shape),
                            f"(N, {kb}, {l}){two_d} (K and L from a_tensor)")


def _check_c(c_name: str, c_major: str, ab: str) -> None:
    """C dtypes the kernels build: FP8 A/B give a float C; FP4 C is n-major (packed along N)."""
    if ab in FP8_NAMES and c_name not in FLOAT_OUTPUT_NAMES:
        raise ArgumentError("c_dtype", repr(c_name), f"{', '.join(FLOAT_OUTPUT_NAMES)} (with FP8 A/B)",
                            "FP8 and FP4 C need FP4 A/B, as on the GPU")
    if c_name == "float4_e2m1fn_x2" and c_major != "n":
        raise ArgumentError("c_major", repr(c_major), "'n' (with an FP4 C)",
                            "Packed FP4 C holds two elements per byte along N")


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
    sfa_tensor : kernel-facing view, physical buffer or flat; E8M0 (``int8``/``uint8``
        bytes read as E8M0) or e4m3.
    sfb_tensor : kernel-facing view, physical buffer or flat; E8M0 (``int8``/``uint8``
        bytes read as E8M0) or e4m3.
    c_major : str
        "n" (default) or "m": memory order of the returned C (values are the same).
    c_dtype : float32 (default), float16, bfloat16, float8_e5m2, float8_e4m3fn,
        float4_e2m1fn_x2 (``uint8``). FP8 A/B with FP8 C is rejected, as on the GPU; FP4 C needs
        FP4 A/B and ``c_major="n"``.
    acc_dtype : str
        "float32" (default) or "float64".
    sf_vec_size : int
        32 (default) or 16.
    mma_tiler_mn
        Signature compatibility only.
    cluster_shape_mn
        Signature compatibility only.
    stream
        Signature compatibility only.

    Returns
    -------
    TupleDict
        ``c_tensor`` (M, N, L) — (M, N/2, L) for FP4 — or 2-D for 2-D inputs, and ``amax_tensor``
        (1, 1, 1) float32.
    """
    acc = resolve_acc(acc_dtype)
    arguments.choice(c_major, "c_major", ("m", "n"))
    a, a_view = _batched(a_tensor, "a_tensor")
    b, b_view = _batched(b_tensor, "b_tensor")
    ab = elem_of(a_view.dtype)
    same_elements(b_view, "b_tensor", ab)
    _check_b_extents(a, b, b_view)
    c_name = output_name(c_dtype, "c_dtype", C_DTYPES)
    _check_c(c_name, c_major, ab)
    sf = sf_of(scale_tensor(sfa_tensor, "sfa_tensor").dtype)
    block_format(ab, sf, sf_vec_size)
    l, m, n, k = a.shape[0], a.shape[1], b.shape[1], logical_k(a.shape[2], ab)
    sfk = -(-k // sf_vec_size)
    sfa, _ = parse_scales(sfa_tensor, "sfa_tensor", m, sfk, l)
    sfb, sfb_dtype = parse_scales(sfb_tensor, "sfb_tensor", n, sfk, l)
    same_scales(sfb_dtype, "sfb_tensor", sf)
    canonical = a_view.ndim == 2

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
