"""Block quantization along K: MXFP8, NVFP4 and MXFP4.

| format | elements                         | scales          | sf_vec_size |
|--------|----------------------------------|-----------------|-------------|
| MXFP8  | float8_e4m3fn or float8_e5m2     | float8_e8m0fnu  | 32          |
| NVFP4  | float4_e2m1fn_x2 (packed)        | float8_e4m3fn   | 16          |
| MXFP4  | float4_e2m1fn_x2 (packed)        | float8_e8m0fnu  | 16 or 32    |

``dequant(x)[..., k] = x[..., k] * sf[..., k // sf_vec_size]``.

Scale choice of :func:`quantize_blockwise`: for each block, ``s = amax / elem_max`` (elem_max =
448, 57344 or 6) rounded **up** to the scale format (E8M0: the next power of two, ``cvt.rp``;
e4m3: the smallest e4m3 value >= s), so no element exceeds ``elem_max`` after division; elements
are then rounded to nearest-even with saturation (which also absorbs a last-ulp overshoot of the
float64 division). All-zero blocks get the smallest scale (E8M0 0x00 = 2^-127; e4m3 0) and zero
elements. A NaN in a block gives a NaN scale (E8M0 0xFF) or NaN e4m3 scale, so the whole block
dequantizes to NaN; ±Inf saturates. e4m3 scales saturate at 448 (amax above 2688 loses range:
fold a global factor into alpha instead).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

from .numpy_dtypes import FORMATS, FP8_NAMES, array_dtype_name, resolve_dtype, to_numpy
from .elements import to_float32, to_format

__all__ = ["BlockFormat", "block_format", "quantize_blockwise", "dequantize_blockwise"]

_ELEMENTS = ("float8_e4m3fn", "float8_e5m2", "float4_e2m1fn_x2", "uint8", "float4_e2m1fn")
_SCALES = ("float8_e8m0fnu", "float8_e4m3fn")
_VEC_SIZES = (16, 32)


@dataclass(frozen=True)
class BlockFormat:
    """A validated (element, scale, block size) combination.

    Attributes
    ----------
    elem : str
        ``float8_e4m3fn``, ``float8_e5m2`` or ``float4_e2m1fn_x2`` (``uint8`` and
        ``float4_e2m1fn`` are normalised to it).
    sf : str
        ``float8_e8m0fnu`` or ``float8_e4m3fn``.
    sf_vec_size : int
        Elements per scale along K: 16 or 32.
    """

    elem: str
    sf: str
    sf_vec_size: int

    def __post_init__(self) -> None:
        elem = resolve_dtype(self.elem, argument="ab_dtype", allowed=_ELEMENTS)
        if elem in ("uint8", "float4_e2m1fn"):
            elem = "float4_e2m1fn_x2"
        object.__setattr__(self, "elem", elem)
        object.__setattr__(self, "sf", resolve_dtype(self.sf, argument="sf_dtype", allowed=_SCALES))
        vec = self.sf_vec_size
        if isinstance(vec, bool) or vec not in _VEC_SIZES:
            raise ValueError(f"sf_vec_size={vec!r} is not supported; allowed: 16, 32")
        if self.sf == "float8_e4m3fn" and vec == 32:
            raise ValueError(
                "sf_vec_size=32 is not allowed with sf_dtype='float8_e4m3fn' (NVFP4 uses 16); "
                "allowed: sf_vec_size=16 with float8_e4m3fn scales, or float8_e8m0fnu scales"
            )
        if elem in FP8_NAMES and vec != 32:
            raise ValueError(
                f"sf_vec_size={vec} is not allowed with ab_dtype={elem!r}; FP8 elements (MXFP8) "
                "need sf_vec_size=32"
            )
        if elem in FP8_NAMES and self.sf != "float8_e8m0fnu":
            raise ValueError(
                f"sf_dtype={self.sf!r} is not allowed with ab_dtype={elem!r}; FP8 elements "
                "(MXFP8) need float8_e8m0fnu scales"
            )

    @property
    def name(self) -> str:
        """``mxfp8``, ``nvfp4`` or ``mxfp4``."""
        if self.elem in FP8_NAMES:
            return "mxfp8"
        return "nvfp4" if self.sf == "float8_e4m3fn" else "mxfp4"

    @property
    def elem_max(self) -> float:
        """Largest finite element magnitude (448, 57344 or 6)."""
        return FORMATS[self.elem].max_finite


def block_format(ab_dtype: Any, sf_dtype: Any, sf_vec_size: int) -> BlockFormat:
    """Validate and normalise a block format; see :class:`BlockFormat` for the errors.

    Parameters
    ----------
    ab_dtype : dtype
        Element format: float8_e4m3fn, float8_e5m2, or float4_e2m1fn_x2 (also spelt uint8 / float4_e2m1fn).
    sf_dtype : dtype
        Scale format: float8_e8m0fnu or float8_e4m3fn.
    sf_vec_size : int
        Elements per scale along K: 16 or 32.
    """
    return BlockFormat(ab_dtype, sf_dtype, sf_vec_size)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _block_amax(values: np.ndarray, vec: int) -> np.ndarray:
    k = values.shape[-1]
    blocks = _ceil_div(k, vec)
    padded = np.zeros(values.shape[:-1] + (blocks * vec,), dtype=np.float64)
    padded[..., :k] = values
    # np.max propagates NaN, which is what makes a NaN block visible after quantization.
    return np.max(np.abs(padded.reshape(values.shape[:-1] + (blocks, vec))), axis=-1)


def _e4m3_round_up(s: np.ndarray) -> np.ndarray:
    """Smallest e4m3fn value >= s (saturating at 448; NaN stays NaN)."""
    q = to_format(s, "float8_e4m3fn", saturate=True)
    codes = q.view(np.uint8).copy()
    below = to_float32(q).astype(np.float64) < s
    # Positive e4m3 codes are ordered like their values, so "next value up" is "code + 1".
    bump = below & (codes < 0x7E)
    codes[bump] += 1
    return codes.view(ml_dtypes.float8_e4m3fn)


def quantize_blockwise(
    x: Any, *, ab_dtype: Any, sf_dtype: Any = "float8_e8m0fnu", sf_vec_size: int = 32
) -> tuple[np.ndarray, np.ndarray]:
    """Quantize FP32/BF16 data along its last axis (K) into a block-scaled format.

    Parameters
    ----------
    x : array or tensor (..., K)
        Values to quantize (numpy or torch; any float dtype).
    ab_dtype : dtype or str
        Element format: ``float8_e4m3fn``, ``float8_e5m2`` or ``float4_e2m1fn_x2`` (packed;
        ``uint8`` means the same).
    sf_dtype : dtype or str
        ``float8_e8m0fnu`` (MX) or ``float8_e4m3fn`` (NVFP4).
    sf_vec_size : int
        16 or 32: MXFP8 needs 32 with E8M0 scales, NVFP4 16 with e4m3 scales, MXFP4 16 or 32 with E8M0.

    Returns
    -------
    data : numpy.ndarray
        ``(..., K)`` FP8, or ``uint8`` ``(..., K/2)`` for packed FP4 (K must then be even).
    scales : numpy.ndarray
        Logical scales ``(..., ceil(K / sf_vec_size))`` in ``sf_dtype``; pack them for a kernel
        with :func:`fusegemm.formats.pack_sf`.
    """
    fmt = block_format(ab_dtype, sf_dtype, sf_vec_size)
    arr = to_numpy(x, argument="x")
    exact = arr if arr.dtype in (np.float32, np.float64) else to_float32(arr)
    values = np.asarray(exact, dtype=np.float64)
    if values.ndim == 0:
        raise ValueError("x must have at least one axis (K)")
    k, vec = values.shape[-1], fmt.sf_vec_size
    if fmt.elem == "float4_e2m1fn_x2" and k % 2:
        raise ValueError(f"x has K={k}; packed FP4 needs an even K")
    wanted = _block_amax(values, vec) / fmt.elem_max
    if fmt.sf == "float8_e8m0fnu":
        scales = to_format(wanted, "float8_e8m0fnu", rounding="up", saturate=True)
    else:
        scales = _e4m3_round_up(wanted)
    scale_values = np.repeat(to_float32(scales).astype(np.float64), vec, axis=-1)[..., :k]
    with np.errstate(divide="ignore", invalid="ignore"):
        scaled = np.where(scale_values == 0, 0.0, values / scale_values)
    scaled = np.where(np.isnan(values) | np.isnan(scale_values), np.nan, scaled)
    return to_format(scaled, fmt.elem, saturate=True), scales


def dequantize_blockwise(data: Any, scales: Any, *, sf_vec_size: int, ab_dtype: Any = None) -> np.ndarray:
    """Dequantize block-scaled data to float32: ``x[..., k] * sf[..., k // sf_vec_size]``.

    Parameters
    ----------
    data : array (..., K) FP8 / ``float4_e2m1fn``, or ``uint8`` (..., K/2) packed FP4
    scales : array (..., ceil(K / sf_vec_size)), E8M0 or e4m3 (``uint8`` is read as E8M0)
    sf_vec_size : int
        16 or 32.
    ab_dtype : dtype or str, optional
        Element format, when ``data`` is ``uint8`` it must be packed FP4 (the default).

    Notes
    -----
    Each product is exact in float32 unless it leaves float32's range (a scale near 2^±127).
    """
    arr = to_numpy(data, argument="data")
    name = array_dtype_name(arr)
    if name == "uint8" and ab_dtype is not None:
        resolve_dtype(ab_dtype, argument="ab_dtype", allowed=("float4_e2m1fn_x2", "uint8"))
    values = to_float32(arr, "float4_e2m1fn_x2") if name == "uint8" else to_float32(arr)
    sf = to_numpy(scales, argument="scales")
    sf_values = to_float32(sf, "float8_e8m0fnu") if array_dtype_name(sf) == "uint8" else to_float32(sf)
    if isinstance(sf_vec_size, bool) or sf_vec_size not in _VEC_SIZES:
        raise ValueError(f"sf_vec_size={sf_vec_size!r} is not supported; allowed: 16, 32")
    k = values.shape[-1]
    blocks = _ceil_div(k, sf_vec_size)
    if sf_values.shape != values.shape[:-1] + (blocks,):
        raise ValueError(
            f"scales has shape {sf_values.shape}; expected {values.shape[:-1] + (blocks,)} for "
            f"data of logical shape {values.shape} and sf_vec_size={sf_vec_size}"
        )
    expanded = np.repeat(sf_values, sf_vec_size, axis=-1)[..., :k]
    return values * expanded
