"""The blockwise FP8 recipe (DeepSeek-V3): FP32 scales per 128 K, 1x128 for activations (one scale
per row and 128-element K block) and 128x128 for weights (one scale per 128 x 128 block).

``dequant(a)[m, k] = a[m, k] * sfa[m, k // 128]`` and ``dequant(b)[n, k] = b[n, k] *
sfb[n // 128, k // 128]``. Scale choice: ``s = amax / elem_max`` over the block (448 for e4m3,
57344 for e5m2), with amax clamped below at ``1e-4`` as DeepSeek's kernels do, so an all-zero block
gets a tiny positive scale and zero elements; with ``scales="pow2"`` that scale rounded up to a
power of two (the UE8M0 scales of DeepSeek-V3.1's recipe: each is exactly an E8M0 byte, and
dividing by it is exact); elements are ``x / s`` rounded to nearest-even with saturation. The
kernels take the scales as float32 either way; power-of-two scales may also be stored as E8M0
bytes (:func:`e8m0_bytes`, :func:`e8m0_to_float32`), which the ops convert to float32 on the device.
The kernels' SFA layout is M-contiguous (:func:`blockwise_sfa_layout`).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .elements import to_float32, to_format
from .numpy_dtypes import FORMATS, resolve_dtype, to_numpy

__all__ = ["BLOCK", "quantize_1x128", "quantize_128x128", "dequantize_1x128", "dequantize_128x128",
           "blockwise_sfa_layout", "e8m0_bytes", "e8m0_to_float32"]

BLOCK = 128
_ELEMENTS = ("float8_e4m3fn", "float8_e5m2")
AMAX_FLOOR = 1e-4
SCALES = ("amax", "pow2")   # s = amax / max, or that rounded up to a power of two


def _blocks(n: int) -> int:
    return -(-n // BLOCK)


def _pad_to(x: np.ndarray, axis: int) -> np.ndarray:
    """``x`` zero-padded along ``axis`` to a multiple of BLOCK."""
    pad = _blocks(x.shape[axis]) * BLOCK - x.shape[axis]
    if not pad:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, pad)
    return np.pad(x, widths)


def _quantize(x: np.ndarray, scales: np.ndarray, dtype: str) -> np.ndarray:
    return to_format(x / scales, dtype, saturate=True)


def _scale(amax: np.ndarray, dtype: str, scales: str) -> np.ndarray:
    s = np.maximum(amax, AMAX_FLOOR) / FORMATS[dtype].max_finite
    if scales == "pow2":
        # The smallest power of two >= s, exactly: s = m * 2^e with m in [0.5, 1) (frexp), so
        # 2^(e - 1) when m is 0.5 (s is one), else 2^e. A log2 in floating point could round a
        # value just above a power of two down to it.
        m, e = np.frexp(s)
        s = np.ldexp(1.0, np.where(m == 0.5, e - 1, e))
    return s.astype(np.float32)


def _scales_arg(scales: Any) -> str:
    if scales not in SCALES:
        raise ValueError(f"scales: got {scales!r}; allowed: {', '.join(map(repr, SCALES))}")
    return scales


def quantize_1x128(x: Any, dtype: Any = "float8_e4m3fn", scales: str = "amax") -> tuple[np.ndarray, np.ndarray]:
    """Quantize activations ``(..., K)`` with one FP32 scale per row and 128-element K block.

    Parameters
    ----------
    x : array-like or torch tensor (..., K)
        Values (FP32, BF16, ...).
    dtype : str or dtype
        ``float8_e4m3fn`` (default) or ``float8_e5m2``.
    scales : {"amax", "pow2"}
        ``amax / max`` per block (DeepSeek-V3, the default) or that rounded up to a power of two
        (UE8M0, DeepSeek-V3.1).

    Returns
    -------
    (values, scales)
        FP8 values ``(..., K)`` and float32 scales ``(..., ceil(K / 128))`` (row-major; the kernels
        take them through :func:`blockwise_sfa_layout`).
    """
    name = resolve_dtype(dtype, argument="dtype", allowed=_ELEMENTS)
    how = _scales_arg(scales)
    v = to_float32(to_numpy(x, argument="x")).astype(np.float64)
    k = v.shape[-1]
    blocks = _pad_to(v, -1).reshape(*v.shape[:-1], _blocks(k), BLOCK)
    s = _scale(np.abs(blocks).max(-1), name, how)
    q = _quantize(blocks, s[..., None].astype(np.float64), name).reshape(*v.shape[:-1], -1)[..., :k]
    return q, s


def quantize_128x128(w: Any, dtype: Any = "float8_e4m3fn", scales: str = "amax") -> tuple[np.ndarray, np.ndarray]:
    """Quantize weights ``(..., N, K)`` with one FP32 scale per 128 x 128 block.

    Parameters
    ----------
    w : array-like or torch tensor (..., N, K)
        Values (FP32, BF16, ...).
    dtype : str or dtype
        ``float8_e4m3fn`` (default) or ``float8_e5m2``.
    scales : {"amax", "pow2"}
        As :func:`quantize_1x128`.

    Returns
    -------
    (values, scales)
        FP8 values ``(..., N, K)`` and float32 scales ``(..., ceil(N / 128), ceil(K / 128))``
        (contiguous: the kernels' SFB layout).
    """
    name = resolve_dtype(dtype, argument="dtype", allowed=_ELEMENTS)
    how = _scales_arg(scales)
    v = to_float32(to_numpy(w, argument="w")).astype(np.float64)
    if v.ndim < 2:
        raise ValueError(f"w: got {v.ndim} dimensions; allowed: (..., N, K)")
    n, k = v.shape[-2:]
    p = _pad_to(_pad_to(v, -1), -2)
    lead = v.shape[:-2]
    blocks = p.reshape(*lead, _blocks(n), BLOCK, _blocks(k), BLOCK)
    s = _scale(np.abs(blocks).max(axis=(-3, -1)), name, how)
    q = _quantize(blocks, s[..., :, None, :, None].astype(np.float64), name)
    q = q.reshape(*lead, _blocks(n) * BLOCK, _blocks(k) * BLOCK)[..., :n, :k]
    return q, np.ascontiguousarray(s)


def dequantize_1x128(q: Any, scales: Any) -> np.ndarray:
    """float32 ``q[..., k] * scales[..., k // 128]``.

    Parameters
    ----------
    q : FP8 array or torch tensor (..., K)
        Values from :func:`quantize_1x128`.
    scales : float32 (..., ceil(K / 128))
        Their scales.
    """
    v = to_float32(to_numpy(q, argument="q"))
    s = np.asarray(to_numpy(scales, argument="scales"), dtype=np.float32)
    return v * np.repeat(s, BLOCK, axis=-1)[..., : v.shape[-1]]


def dequantize_128x128(q: Any, scales: Any) -> np.ndarray:
    """float32 ``q[..., n, k] * scales[..., n // 128, k // 128]``.

    Parameters
    ----------
    q : FP8 array or torch tensor (..., N, K)
        Values from :func:`quantize_128x128`.
    scales : float32 (..., ceil(N / 128), ceil(K / 128))
        Their scales.
    """
    v = to_float32(to_numpy(q, argument="q"))
    s = np.asarray(to_numpy(scales, argument="scales"), dtype=np.float32)
    full = np.repeat(np.repeat(s, BLOCK, axis=-2), BLOCK, axis=-1)
    return v * full[..., : v.shape[-2], : v.shape[-1]]


def blockwise_sfa_layout(scales: Any) -> Any:
    """A's scales ``(M, ceil(K/128))`` in the kernels' layout: the same values with unit stride
    along M and a pitch of ``ceil(M / 4) * 4`` floats (16 bytes, TMA's row alignment). A torch
    tensor stays a torch tensor on its device; anything else becomes a numpy array.

    Parameters
    ----------
    scales : float32 (M, ceil(K / 128))
        A's scales, e.g. from :func:`quantize_1x128`.
    """
    if hasattr(scales, "new_zeros"):   # torch, without importing it here
        m, sfk = scales.shape
        buf = scales.new_zeros((sfk, -(-m // 4) * 4), dtype=scales.dtype)
        buf[:, :m] = scales.t()
        return buf[:, :m].t()
    s = np.asarray(to_numpy(scales, argument="scales"), dtype=np.float32)
    m, sfk = s.shape
    buf = np.zeros((sfk, -(-m // 4) * 4), dtype=np.float32)
    buf[:, :m] = s.T
    return buf[:, :m].T


# E8M0 byte b is 2^(b - 127): FP32 exponent field b for 1..254 (mantissa 0), 2^-127 (the FP32
# subnormal 0x00400000) for 0x00, NaN for 0xFF (cvt's encoding, OCP MX's E8M0).
_E8M0_ZERO_BITS, _E8M0_NAN_BITS = 0x00400000, 0x7FC00000


def e8m0_to_float32(x: Any) -> Any:
    """E8M0 bytes as the float32 values they encode, exactly: ``2^(b - 127)``, 0x00 -> 2^-127,
    0xFF -> NaN.

    Parameters
    ----------
    x : array or tensor of ``float8_e8m0fnu`` or ``uint8``
        The bytes, any shape. A torch tensor stays a torch tensor on its device (the conversion
        runs there); anything else becomes a numpy array.
    """
    if hasattr(x, "new_zeros"):   # torch, without importing it here
        import torch
        b = x.view(torch.uint8).to(torch.int32)
        bits = torch.where(b == 0, _E8M0_ZERO_BITS, torch.where(b == 255, _E8M0_NAN_BITS, b << 23))
        return bits.view(torch.float32)
    a = np.asarray(to_numpy(x, argument="scales"))
    if a.dtype.itemsize != 1:
        raise ValueError(f"scales: got {a.dtype}; allowed: float8_e8m0fnu or uint8 (E8M0 bytes)")
    b = a.view(np.uint8).astype(np.uint32)
    bits = np.where(b == 0, _E8M0_ZERO_BITS, np.where(b == 255, _E8M0_NAN_BITS, b << 23)).astype(np.uint32)
    return bits.view(np.float32)


def e8m0_bytes(scales: Any) -> Any:
    """Power-of-two float32 scales as E8M0 bytes (uint8), exactly: 2^e for e in [-127, 127], NaN
    as 0xFF.

    Parameters
    ----------
    scales : float32 array or tensor
        E.g. from ``quantize_1x128(..., scales="pow2")``. Torch in, torch out (on its device).

    Raises
    ------
    ValueError
        Naming the first value that is not one (zero, negative, infinite or not a power of two).
    """
    torch_in = hasattr(scales, "new_zeros")
    s = np.asarray(scales.detach().cpu() if torch_in else to_numpy(scales, argument="scales"), dtype=np.float32)
    bits = s.view(np.uint32)
    exp, man = (bits >> 23) & 0xFF, bits & 0x7FFFFF
    nan = np.isnan(s)
    normal = (bits >> 31 == 0) & (man == 0) & (exp >= 1) & (exp <= 254)
    tiny = bits == _E8M0_ZERO_BITS
    bad = ~(normal | tiny | nan)
    if bad.any():
        i = tuple(int(v) for v in np.argwhere(bad)[0])
        raise ValueError(f"scales{list(i)}: got {s[i]!r}; allowed: powers of two from 2^-127 to 2^127 (E8M0), or NaN")
    out = np.where(nan, 255, np.where(tiny, 0, exp)).astype(np.uint8)
    if torch_in:
        import torch
        return torch.from_numpy(out).to(scales.device)
    return out
