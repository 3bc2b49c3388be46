"""Epilogue building blocks: output rounding, SFD output quantization, amax, output layouts.

The SFD rules follow ``notes/sfd-semantics.md`` §1–2 step by step, every step in float32
(IEEE round-to-nearest, no flush-to-zero except where the PTX instruction flushes):

1. ``a = max|x_i|`` over a 32-element block (NaN-propagating, zero padded past the edge);
2. ``s = fl(fl(a * rl) * nc)`` (row path of every kernel, column path of Quant) or
   ``s = fl(a * fl(rl * nc))`` (column path of sReLU / dSwiGLU);
3. E8M0 byte rounded **up** (``cvt.rp``), with or without ``.satfinite`` per kernel;
4. ``q = decode(byte)`` (0x00 is 2^-127, 0xFF is NaN); ``r = rcp.approx.ftz(q)``: 1/q with
   subnormal input and output flushed (q = 2^-127 gives +Inf, q = 2^127 gives 0);
5. ``scale = min.NaN(fl(nc * r), FLT_MAX)`` (row path; Quant col) or
   ``fl(nc * min.NaN(r, FLT_MAX))`` (sReLU / dSwiGLU col);
6. ``D = cvt.rn.satfinite(fl(x * scale))``: RNE, saturating to ±max, NaN stays NaN (e2m1 has
   no NaN: ±0, as ml_dtypes does; the PTX result there is unverified).

SFD blocks are always 32 wide and SFD is always E8M0 (FP8 inputs force sf_vec_size 32 with
E8M0 scales), whatever ``sf_vec_size`` the page's SF shape formula shows.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..formats.numpy_dtypes import FORMATS
from ..formats.elements import to_float32, to_format
from ..formats.scales import pack_sf, pack_sf_discrete_col, sf_to_kernel_view
from ..formats.views import cd_to_kernel, prob_to_kernel
from ._args import dtype_option

FLT_MAX = np.float32(np.finfo(np.float32).max)
_TINY = np.float32(2.0**-126)  # smallest normal float32: rcp.approx.ftz flushes below it
SFD_BLOCK = 32
QUANTIZED_OUTPUTS = ("float8_e4m3fn", "float8_e5m2", "float4_e2m1fn_x2")


def output_name(dtype: object, argument: str, allowed: tuple[str, ...], context: str = "") -> str:
    """Canonical output dtype name (``uint8`` means packed FP4 ``float4_e2m1fn_x2``)."""
    name = dtype_option(dtype, argument, allowed, context=context)
    return "float4_e2m1fn_x2" if name == "uint8" else name


def round_output(x: np.ndarray, name: str) -> np.ndarray:
    """Round float32 results to an output dtype as a kernel's store does.

    bf16/fp16/fp32: round to nearest even (overflow to ±Inf, as ``cvt.rn`` does). FP8/FP4
    (stored without a scale, e.g. C): ``cvt.rn.satfinite``. FP4 comes back packed ``uint8``.
    """
    if name in ("float32", "float16", "bfloat16"):
        with np.errstate(over="ignore"):
            return x.astype(FORMATS[name].storage)
    if name == "float4_e2m1fn_x2" and x.shape[-1] % 2:
        raise ValueError(f"a packed FP4 output needs an even number of columns; got {x.shape[-1]}")
    return to_format(x, name, saturate=True)


def alpha_bias_fma(acc: np.ndarray, scale: np.ndarray, addend: np.ndarray) -> np.ndarray:
    """``fma(acc, scale, addend)`` in float32: the exact product plus addend, rounded once.

    The product of two float32 values is exact in float64; the sum is rounded to float64 and then
    to float32 (double rounding differs from a true fma only on exact float64 ties).
    """
    return (acc.astype(np.float64) * scale + addend).astype(np.float32)


def place_rows(x: np.ndarray, m: int) -> np.ndarray:
    """``x`` (rows below valid_m) inside an ``m``-row output whose other rows are zero."""
    out = np.zeros((m,) + x.shape[1:], dtype=x.dtype)
    out[: x.shape[0]] = x
    return out


def cd_layout(x: np.ndarray, canonical: bool) -> np.ndarray:
    """``(M, N)`` for canonical callers, the kernel-facing ``(M, N, 1)`` view otherwise."""
    return x if canonical else cd_to_kernel(x)


def vector_layout(x: np.ndarray, canonical: bool) -> np.ndarray:
    """``(M,)`` for canonical callers, ``(M, 1, 1)`` otherwise."""
    return x if canonical else prob_to_kernel(x)


def sf_layout(phys: np.ndarray, canonical: bool) -> np.ndarray:
    """Physical ``(1, ..., 32, 4, 4)`` for canonical callers, the kernel-facing view otherwise."""
    return phys if canonical else sf_to_kernel_view(phys)


def expert_amax(x: np.ndarray, ranges: list[tuple[int, int]]) -> np.ndarray:
    """Per-expert ``max |x|`` over the expert's rows (padding rows included), float32 ``(L,)``.

    Starts at -inf, so an expert without rows gives -inf. NaN propagates (NVIDIA's kernel drops
    NaN: its ``max.f32`` merge discards a NaN row block; a NaN here is the louder failure).
    """
    out = np.full(len(ranges), -np.inf, dtype=np.float32)
    if x.shape[1] == 0:
        return out
    row_max = np.max(np.abs(x), axis=1)
    for e, (start, end) in enumerate(ranges):
        if end > start:
            out[e] = np.max(row_max[start:end])
    return out


@dataclass(frozen=True)
class SfdRule:
    """How one kernel computes its SFD scales (operation order and saturation).

    ``*_assoc``: ``"a_rl_nc"`` is ``fl(fl(a * rl) * nc)``, ``"a_rlnc"`` is ``fl(a * fl(rl * nc))``.
    ``*_clamp``: ``"after"`` is ``min.NaN(fl(nc * r), FLT_MAX)``, ``"before"`` is
    ``fl(nc * min.NaN(r, FLT_MAX))``. ``scale_satfinite`` / ``store_satfinite``: whether the E8M0
    byte used for the scale / the byte stored in SFD saturate overflow to 0xFE (else 0xFF, NaN).
    """

    row_assoc: str
    col_assoc: str
    row_clamp: str
    col_clamp: str
    scale_satfinite: bool
    store_satfinite: bool


SFD_RULES = {
    "quant": SfdRule("a_rl_nc", "a_rl_nc", "after", "after", False, False),
    "srelu": SfdRule("a_rl_nc", "a_rlnc", "after", "before", True, False),
    "dswiglu": SfdRule("a_rl_nc", "a_rlnc", "after", "before", True, True),
}


def _rcp_approx_ftz(q: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        flushed = np.where(np.abs(q) < _TINY, np.float32(0), q)
        r = np.float32(1) / flushed
        return np.where(np.abs(r) < _TINY, np.float32(0), r).astype(np.float32)


def sfd_scale_blocks(
    x: np.ndarray, nc: np.float32, rl: np.float32, assoc: str, clamp: str, rule: SfdRule
) -> tuple[np.ndarray, np.ndarray]:
    """Scale each 32-column block of ``x`` (R, C) for quantization.

    Returns
    -------
    y : float32 (R, C)
        ``fl(x * scale)``, ready for ``cvt.rn.satfinite``.
    codes : float8_e8m0fnu (R, ceil(C/32))
        The SFD bytes as stored.
    """
    rows, cols = x.shape
    nb = -(-cols // SFD_BLOCK)
    padded = np.zeros((rows, nb * SFD_BLOCK), dtype=np.float32)
    padded[:, :cols] = x
    blocks = padded.reshape(rows, nb, SFD_BLOCK)
    with np.errstate(over="ignore", invalid="ignore"):
        a = np.max(np.abs(blocks), axis=-1) if nb else np.zeros((rows, 0), np.float32)
        s = (a * rl) * nc if assoc == "a_rl_nc" else a * (rl * nc)
        byte = to_format(s, "float8_e8m0fnu", rounding="up", saturate=rule.scale_satfinite)
        stored = to_format(s, "float8_e8m0fnu", rounding="up", saturate=rule.store_satfinite)
        r = _rcp_approx_ftz(to_float32(byte))
        scale = np.minimum(nc * r, FLT_MAX) if clamp == "after" else nc * np.minimum(r, FLT_MAX)
        y = (blocks * scale[:, :, None].astype(np.float32)).reshape(rows, nb * SFD_BLOCK)[:, :cols]
    return y.astype(np.float32, copy=False), stored


@dataclass(frozen=True)
class Quantized:
    """Row- and column-quantized output with its SFD scales (physical buffers)."""

    d: np.ndarray
    d_col: np.ndarray
    sfd_row: np.ndarray
    sfd_col: np.ndarray


def quantize_output(
    x: np.ndarray,
    *,
    m: int,
    name: str,
    nc: np.float32,
    rl: np.float32,
    rule: SfdRule,
    offsets: np.ndarray,
    discrete_col_sfd: bool,
) -> Quantized:
    """SFD-quantize ``x`` (valid_m, N) float32 into ``m``-row outputs.

    SFD_row is the atom layout of ``sf[m, n // 32]`` (mn = M); SFD_col that of ``sf[n, m // 32]``
    (mn = N), or the ``discrete_col_sfd`` order. Rows at or past valid_m: zero data, zero bytes.
    """
    valid_m, n = x.shape
    y_row, row_codes = sfd_scale_blocks(x, nc, rl, rule.row_assoc, rule.row_clamp, rule)
    y_col_t, col_codes = sfd_scale_blocks(
        np.ascontiguousarray(x.T), nc, rl, rule.col_assoc, rule.col_clamp, rule
    )
    d = place_rows(round_output(y_row, name), m)
    d_col = place_rows(round_output(np.ascontiguousarray(y_col_t.T), name), m)
    sf_row = place_rows(row_codes, m)
    sf_col = np.zeros((n, -(-m // SFD_BLOCK)), dtype=col_codes.dtype)
    sf_col[:, : col_codes.shape[1]] = col_codes
    if discrete_col_sfd:
        sfd_col = pack_sf_discrete_col(sf_col, offsets, rows=m)
    else:
        sfd_col = pack_sf(sf_col)
    return Quantized(d=d, d_col=d_col, sfd_row=pack_sf(sf_row), sfd_col=sfd_col)


def finish_output(
    x: np.ndarray,
    *,
    m: int,
    d_name: str,
    canonical: bool,
    ranges: list[tuple[int, int]],
    offsets: np.ndarray,
    nc: np.float32 | None,
    rl: np.float32 | None,
    rule: SfdRule,
    discrete_col_sfd: bool,
    want_amax: bool,
) -> dict[str, np.ndarray | None]:
    """D, D_col, per-expert amax ``(L, 1)`` and SFD row/col for a D computed as float32 ``x``.

    FP8/FP4 D: SFD-quantized row and column outputs (``nc`` and ``rl`` required). Other D:
    rounded ``x``, with ``d_col``/``sfd_*`` None and amax when ``want_amax`` and D is bf16/fp16.
    """
    out: dict[str, np.ndarray | None] = dict(d=None, d_col=None, amax=None, sfd_row=None, sfd_col=None)
    if d_name in QUANTIZED_OUTPUTS:
        q = quantize_output(
            x, m=m, name=d_name, nc=nc, rl=rl, rule=rule, offsets=offsets,
            discrete_col_sfd=discrete_col_sfd,
        )
        out.update(
            d=cd_layout(q.d, canonical),
            d_col=cd_layout(q.d_col, canonical),
            sfd_row=sf_layout(q.sfd_row, canonical),
            sfd_col=sf_layout(q.sfd_col, canonical),
        )
    else:
        out["d"] = cd_layout(place_rows(round_output(x, d_name), m), canonical)
    if want_amax and d_name in ("bfloat16", "float16"):
        out["amax"] = expert_amax(x, ranges)[:, None]
    return out
