"""Element conversions: FP32/BF16 to and from e4m3fn, e5m2, e2m1 (FP4) and E8M0, plus FP4 packing.

Rounding and special values
---------------------------
* ``rounding="nearest"`` (every format) is ml_dtypes' cast, bit for bit: round to nearest, ties to
  even. ml_dtypes' FP8 casts do **not** saturate: e4m3fn overflow and ±Inf become NaN, e5m2
  overflow becomes ±Inf. e2m1 has no Inf/NaN: ml_dtypes saturates overflow and ±Inf to ±6 and
  turns NaN into ±0. E8M0 (unsigned powers of two 2^-127..2^127, 0xFF = NaN) rounds the mantissa
  to nearest; 0, negatives, NaN and overflow become NaN (0xFF).
* ``saturate=True`` first clamps to ±max finite, as the kernels' ``cvt.rn.satfinite`` does:
  overflow and ±Inf give ±max, NaN stays NaN, except e2m1, which has no NaN: NaN gives +6
  (0x7), as CUDA's conversion does. For E8M0 it clamps to 2^127.
* ``rounding="up"`` (E8M0 only) is ``cvt.rp[.satfinite].ue8m0x2.f32``, the rounding the SFD
  epilogues use: the byte is ``clamp(ceil(log2 |x|), -127, 127) + 127``. The sign is ignored
  (as in CUDA's host emulation), 0 and anything at or below 2^-127 give 0x00, NaN gives 0xFF,
  anything above 2^127 (Inf included) gives 0xFE with ``saturate=True`` and 0xFF without.

float64 input is rounded once, correctly (through a round-to-odd float32); ml_dtypes would
round it to float32 first and then again, so for float64 only, results can differ from a plain
ml_dtypes cast (on values within 2^-24 relative of a tie). FP32/BF16/FP16 input is bit-exact.

Decoding (``to_float32``) is exact for every format: each code is a float32 value (E8M0 0x00 is
the float32 subnormal 2^-127).
"""
from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from .numpy_dtypes import FORMATS, array_dtype_name, resolve_dtype, to_numpy

__all__ = ["to_format", "to_float32", "pack_fp4", "unpack_fp4", "ROUNDINGS"]

ROUNDINGS = ("nearest", "up")
_TARGETS = (
    "float8_e4m3fn",
    "float8_e5m2",
    "float4_e2m1fn",
    "float4_e2m1fn_x2",
    "float8_e8m0fnu",
    "bfloat16",
    "float16",
    "float32",
)
_E8M0 = np.dtype(ml_dtypes.float8_e8m0fnu)


def _as_float(x: Any, argument: str) -> np.ndarray:
    """float32 (or float64) array of the input values, exactly."""
    arr = to_numpy(x, argument=argument)
    if arr.dtype == np.float64 or arr.dtype == np.float32:
        return arr
    if arr.dtype.kind in "biu" or arr.dtype == np.dtype(bool):
        return arr.astype(np.float64)
    if array_dtype_name(arr) == "float4_e2m1fn_x2" or arr.dtype == np.uint8:
        raise TypeError(
            f"{argument} has dtype uint8, which is ambiguous (packed FP4 or raw codes); "
            "decode it with to_float32(x, dtype=...) first"
        )
    # bfloat16, float16 and the 8/4-bit formats are all exactly representable in float32.
    return arr.astype(np.float32)


def _to_float32_sticky(x: np.ndarray) -> np.ndarray:
    """float64 to float32 rounded to odd (truncate, then set the last bit if inexact).

    float32 keeps far more than two bits beyond every target here, so rounding this
    "sticky" value to nearest gives the correctly rounded result of the float64 input; a plain
    float64->float32->target cast (what ml_dtypes does) rounds twice. Same trick as CUDA's
    ``__internal_double_to_float_with_sticky``.
    """
    with np.errstate(over="ignore"):
        f = x.astype(np.float32)
    back = f.astype(np.float64)
    u = f.view(np.uint32).copy()
    finite = np.isfinite(x)
    away = finite & (((x > 0) & (back > x)) | ((x < 0) & (back < x)))
    u[away] -= 1
    u[finite & (back != x)] |= 1
    return u.view(np.float32)


def _e8m0_round_up(x: np.ndarray, saturate: bool) -> np.ndarray:
    mag = np.abs(x)
    mant, exp = np.frexp(mag)  # mag = mant * 2**exp, mant in [0.5, 1); exact for every input
    # ceil(log2 mag): exact powers of two (mant == 0.5) stay, anything above rounds up.
    ceil_log2 = exp.astype(np.int64) - (mant == 0.5)
    code = np.clip(ceil_log2, -127, 127) + 127
    code = np.where(mag == 0, 0, code)
    overflow = (ceil_log2 > 127) | np.isinf(mag)
    code = np.where(overflow, 0xFE if saturate else 0xFF, code)
    code = np.where(np.isnan(mag), 0xFF, code)
    return code.astype(np.uint8).view(_E8M0)


def to_format(
    x: Any, dtype: Any, *, saturate: bool = False, rounding: str = "nearest"
) -> np.ndarray:
    """Round values to an element format.

    Parameters
    ----------
    x : array-like or torch tensor
        FP32, BF16, FP16 (or FP64 / lower-precision float) values.
    dtype : dtype or str
        Target: ``float8_e4m3fn``, ``float8_e5m2``, ``float4_e2m1fn`` (one element per byte),
        ``float4_e2m1fn_x2`` (packed, see :func:`pack_fp4`), ``float8_e8m0fnu``, ``bfloat16``,
        ``float16`` or ``float32``.
    saturate : bool
        Clamp to ±max finite before rounding (``cvt.rn.satfinite``). NaN stays NaN.
    rounding : {"nearest", "up"}
        ``"up"`` is only defined for ``float8_e8m0fnu`` (see the module notes).

    Returns
    -------
    numpy.ndarray
        ml_dtypes array of the target format (``uint8`` for packed FP4).

    Raises
    ------
    ValueError
        Unknown target, unknown rounding, or ``rounding="up"`` for a format other than E8M0.
    """
    name = resolve_dtype(dtype, argument="dtype", allowed=_TARGETS)
    if rounding not in ROUNDINGS:
        raise ValueError(f"rounding={rounding!r} is not supported; allowed: {', '.join(ROUNDINGS)}")
    if rounding == "up" and name != "float8_e8m0fnu":
        raise ValueError(
            f"rounding='up' is only defined for float8_e8m0fnu; got dtype={name!r} "
            "(use rounding='nearest')"
        )
    values = _as_float(x, "x")
    if name == "float4_e2m1fn_x2":
        return pack_fp4(to_format(values, "float4_e2m1fn", saturate=saturate))
    if rounding == "up":
        return _e8m0_round_up(values, saturate)
    fmt = FORMATS[name]
    if values.dtype == np.float64 and name != "float32":
        values = _to_float32_sticky(values)
    with np.errstate(over="ignore", invalid="ignore"):
        if saturate:
            top = fmt.max_finite
            if name == "float8_e8m0fnu":
                values = np.minimum(values, top)  # E8M0 has no sign: clamp only the top
            elif name == "float4_e2m1fn":
                # e2m1 has no NaN: satfinite turns NaN into +6 (CUDA's cuda_fp4.hpp: "NaN converts
                # to positive FP4_MAXNORM"; measured on the H200 through the epilogue harness)
                values = np.where(np.isnan(values), top, np.clip(values, -top, top))
            else:
                values = np.clip(values, -top, top)
        return values.astype(fmt.storage)


def _lut(name: str) -> np.ndarray:
    return np.arange(256, dtype=np.uint8).view(FORMATS[name].storage).astype(np.float32)


_LUTS = {name: _lut(name) for name in ("float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu")}
_FP4_VALUES = np.arange(16, dtype=np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float32)
# Value pair of every packed byte: [low nibble (even element), high nibble (odd element)].
_FP4X2_LUT = np.stack([_FP4_VALUES[np.arange(256) & 0xF], _FP4_VALUES[np.arange(256) >> 4]], -1)


def to_float32(q: Any, dtype: Any = None) -> np.ndarray:
    """Decode an element array to float32, exactly.

    Parameters
    ----------
    q : numpy array or torch tensor
        FP8/E8M0/FP4/BF16/FP16/FP32 values, or ``uint8`` bytes together with ``dtype``.
    dtype : dtype or str, optional
        How to read ``uint8`` bytes: ``float4_e2m1fn_x2`` unpacks two elements per byte (the last
        axis doubles); ``float8_e4m3fn``, ``float8_e5m2`` or ``float8_e8m0fnu`` read one code
        per byte. Required for ``uint8`` input, ignored otherwise.
    """
    arr = to_numpy(q, argument="q")
    name = array_dtype_name(arr)
    if name in ("uint8", "float4_e2m1fn_x2"):
        if dtype is None:
            raise ValueError(
                "q has dtype uint8, which is ambiguous; pass dtype= one of float4_e2m1fn_x2, "
                "float8_e4m3fn, float8_e5m2, float8_e8m0fnu"
            )
        name = resolve_dtype(
            dtype,
            argument="dtype",
            allowed=("float4_e2m1fn_x2", "uint8", "float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu"),
        )
        if name in ("float4_e2m1fn_x2", "uint8"):
            pairs = _FP4X2_LUT[arr]
            return pairs.reshape(*arr.shape[:-1], arr.shape[-1] * 2)
        return _LUTS[name][arr]
    if name in _LUTS:
        return _LUTS[name][arr.view(np.uint8)]
    if name == "float4_e2m1fn":
        return _FP4_VALUES[arr.view(np.uint8) & 0xF]
    return arr.astype(np.float32)


def pack_fp4(x: Any) -> np.ndarray:
    """Pack e2m1 values two per byte: element 2i in the low nibble, 2i+1 in the high nibble.

    Parameters
    ----------
    x : array of float4_e2m1fn, or float values (rounded to e2m1 to nearest first)
        The last axis (K) must be even.

    Returns
    -------
    numpy.ndarray
        ``uint8`` array whose last axis is K/2.
    """
    arr = to_numpy(x, argument="x")
    if arr.dtype != np.dtype(ml_dtypes.float4_e2m1fn):
        arr = to_format(arr, "float4_e2m1fn")
    if arr.ndim == 0 or arr.shape[-1] % 2:
        raise ValueError(
            f"x must have an even last axis to pack two FP4 values per byte; got shape {arr.shape}"
        )
    codes = arr.view(np.uint8) & 0xF
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)


def unpack_fp4(packed: Any) -> np.ndarray:
    """Inverse of :func:`pack_fp4`: ``uint8`` (..., K/2) to ``float4_e2m1fn`` (..., K).

    Parameters
    ----------
    packed : uint8 array (..., K/2)
        Two e2m1 values per byte (element 2i in the low nibble).
    """
    arr = to_numpy(packed, argument="packed")
    if arr.dtype != np.uint8:
        raise TypeError(f"packed must be uint8 (two FP4 values per byte); got dtype {arr.dtype}")
    codes = np.stack([arr & 0xF, arr >> 4], axis=-1).reshape(*arr.shape[:-1], arr.shape[-1] * 2)
    return codes.astype(np.uint8).view(ml_dtypes.float4_e2m1fn)
