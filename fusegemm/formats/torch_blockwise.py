"""The blockwise FP8 recipe on torch tensors, on the tensors' device: the training-step side of
:mod:`fusegemm.formats.blockwise` (numpy, for references and host preparation).

* :func:`quantize_1x128` / :func:`quantize_128x128` quantize activations and weights as the
  recipe's kernels take them (SFA already in the M-contiguous layout). The scale is
  :mod:`~fusegemm.formats.blockwise`'s bit for bit (``max(amax, 1e-4) / elem_max``, or rounded up
  to a power of two); each element is ``fl32(x / s)`` converted to FP8 with round-to-nearest-even,
  which is what the kernels' own 1x128 output quantization does (``quantize.vec: 128``). The
  numpy helpers round ``x / s`` once from float64, so where ``fl32(x / s)`` lands exactly halfway
  between two FP8 values the two may differ by one FP8 step (power-of-two scales: never, the
  division is exact).
* :func:`quantize_wgrad` quantizes a token-major matrix for the weight-gradient GEMM
  (``grouped_gemm_wgrad_fp8``): its transpose, tokens contiguous, with one scale per column and
  128 tokens; the same values as ``quantize_1x128(y.t())``.
* :func:`mx_scales_of_blockwise` turns the recipe's E8M0 scales into MXFP8 scale atoms, exactly:
  what sm_100a's MXFP8 kernel reads for them.

    a_q, sfa = quantize_1x128(x)            # x (M, K) bfloat16 on the GPU -> e4m3 (M, K), sfa (M, K/128)
    b_q, sfb = quantize_128x128(w)          # w (L, N, K) -> e4m3 (L, N, K), sfb (L, N/128, K/128)
    op(a_q, sfa, padded_offsets, b_q, sfb, inputs=...)   # an Op built with sf_vec_size=128
"""
from __future__ import annotations

import torch
from torch import Tensor

from .torch_mx import pack_sf

__all__ = ["quantize_1x128", "quantize_128x128", "quantize_wgrad", "dequantize_1x128", "dequantize_128x128",
           "transposed_128x128", "mx_scales_of_blockwise", "mx_scales_of_1x128"]

BLOCK = 128
_ELEMENTS = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}
SCALES = ("amax", "pow2")


def _scale(amax: Tensor, dtype: torch.dtype, scales: str) -> Tensor:
    """float32 ``max(amax, 1e-4) / elem_max`` as numpy's float64 computes it, rounded once (a
    float32 division is that; float32's 1e-4, the only float32 below 1e-4 that numpy's floor does
    not replace, gives numpy's quotient of 1e-4 for both element maxima), NaN kept, optionally
    rounded up to a power of two (exact bit arithmetic)."""
    from .blockwise import AMAX_FLOOR
    # Divided by a tensor on amax's device, not by a Python number: on CUDA torch turns a division
    # by a CPU scalar into a product with its float32 reciprocal, one rounding off the quotient
    # for about half of all amax values (the H200's kernel test found it), and the kernels and
    # numpy divide.
    s = amax.clamp_min(AMAX_FLOOR) / torch.full((), _ELEMENTS[dtype], dtype=torch.float32, device=amax.device)
    if scales == "pow2":
        b = s.view(torch.int32)
        up = (b & 0x7F800000) + 0x00800000
        keep = ((b & 0x7F800000) == 0x7F800000) | ((b & 0x007FFFFF) == 0)
        s = torch.where(keep, b, up).view(torch.float32)
    return s


def _float32_blocks(x: Tensor, dim: int, blocks: int) -> Tensor:
    """``x`` in float32 zero-padded along ``dim`` to ``blocks`` blocks of 128: always a new tensor
    (the quantizers divide it in place: one float32 copy of the operand per call)."""
    pad = blocks * BLOCK - x.shape[dim]
    if pad == 0:
        return x.to(torch.float32, copy=True)
    widths = [0, 0] * (x.dim() - 1 - dim % x.dim()) + [0, pad]
    return torch.nn.functional.pad(x.float(), widths)


def _amax(v: Tensor, dim: int) -> Tensor:
    """max |v| along ``dim`` without an |v| copy (max(max, -min): the same value, NaN kept)."""
    lo, hi = v.aminmax(dim=dim)
    return torch.maximum(hi, -lo)


def _quantize_along(x: Tensor, dim: int, dtype: torch.dtype, scales: str) -> tuple[Tensor, Tensor]:
    """2-D ``x`` quantized with one scale per 128 elements along ``dim`` (and per index of the
    other dimension): FP8 values shaped as ``x`` and the float32 scales, ``dim`` in blocks."""
    size = x.shape[dim]
    nb = -(-size // BLOCK)
    v = _float32_blocks(x, dim, nb).unflatten(dim, (nb, BLOCK))
    s = _scale(_amax(v, dim + 1), dtype, scales)
    return v.div_(s.unsqueeze(dim + 1)).to(dtype).flatten(dim, dim + 1).narrow(dim, 0, size), s


def _check(x: Tensor, dtype: torch.dtype, scales: str, name: str, dims: str, ndim: int) -> None:
    if not isinstance(x, Tensor) or x.dim() < ndim:
        raise ValueError(f"{name}: got {getattr(x, 'shape', type(x).__name__)}; allowed: a torch tensor {dims}")
    if dtype not in _ELEMENTS:
        raise ValueError(f"dtype: got {dtype}; allowed: torch.float8_e4m3fn, torch.float8_e5m2")
    if scales not in SCALES:
        raise ValueError(f"scales: got {scales!r}; allowed: {', '.join(map(repr, SCALES))}")


def quantize_1x128(x: Tensor, dtype: torch.dtype = torch.float8_e4m3fn, scales: str = "amax"
                   ) -> tuple[Tensor, Tensor]:
    """Quantize activations ``(M, K)`` with one FP32 scale per row and 128-element K block, on
    ``x``'s device.

    Parameters
    ----------
    x : torch tensor (M, K)
        Values (bfloat16, float32, ...).
    dtype : torch.float8_e4m3fn or torch.float8_e5m2
        The element format.
    scales : {"amax", "pow2"}
        ``amax / max`` per block (DeepSeek-V3) or that rounded up to a power of two (UE8M0).

    Returns
    -------
    (values, scales)
        FP8 ``(M, K)`` and float32 ``(M, ceil(K/128))`` scales in the kernels' SFA layout (unit
        stride along M, a 16-byte pitch: :func:`fusegemm.formats.blockwise_sfa_layout`).
    """
    from .blockwise import blockwise_sfa_layout
    _check(x, dtype, scales, "x", "(M, K)", 2)
    q, s = _quantize_along(x, 1, dtype, scales)
    return q.contiguous(), blockwise_sfa_layout(s)


def quantize_wgrad(y: Tensor, dtype: torch.dtype = torch.float8_e4m3fn, scales: str = "amax"
                   ) -> tuple[Tensor, Tensor]:
    """Quantize a token-major matrix ``y`` (T, C) (an MoE layer's activations X or output
    gradients dY) as an operand of the FP8 weight-gradient GEMM (``grouped_gemm_wgrad_fp8``,
    dW_e = dY_e^T X_e): one FP32 scale per column and 128 tokens, on ``y``'s device.

    Parameters
    ----------
    y : torch tensor (T, C)
        Values (bfloat16, float32, ...), token rows.
    dtype : torch.float8_e4m3fn or torch.float8_e5m2
        The element format.
    scales : {"amax", "pow2"}
        As :func:`quantize_1x128`.

    Returns
    -------
    (values, scales)
        FP8 ``y^T`` (C, T), tokens contiguous, and float32 ``(C, ceil(T/128))`` scales in the
        kernels' SFA layout: the same values as ``quantize_1x128(y.t())``, without a transposed
        BF16 copy (the FP8 bytes are transposed instead).
    """
    from .blockwise import blockwise_sfa_layout
    _check(y, dtype, scales, "y", "(T, C)", 2)
    q, s = _quantize_along(y, 0, dtype, scales)                 # s: (T/128, C)
    return q.t().contiguous(), blockwise_sfa_layout(s.t())


def dequantize_1x128(q: Tensor, scales: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """``q[..., k] * scales[..., k // 128]`` in ``dtype``, on ``q``'s device (what the recipe's GEMMs
    multiply: FP8 values times FP32 scales are exact in float32).

    Parameters
    ----------
    q : FP8 tensor (..., K)
        Values from :func:`quantize_1x128` (or :func:`quantize_wgrad`).
    scales : float32 (..., ceil(K/128))
        Their scales (any strides).
    dtype : torch.dtype
        The result's (float32, or float64 for references).
    """
    s = scales.to(dtype).repeat_interleave(BLOCK, dim=-1)[..., : q.shape[-1]]
    return q.to(dtype) * s


def dequantize_128x128(q: Tensor, scales: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """``q[..., n, k] * scales[..., n // 128, k // 128]`` in ``dtype``, on ``q``'s device.

    Parameters
    ----------
    q : FP8 tensor (..., N, K)
        Values from :func:`quantize_128x128`.
    scales : float32 (..., ceil(N/128), ceil(K/128))
        Their scales.
    dtype : torch.dtype
        The result's.
    """
    s = scales.to(dtype).repeat_interleave(BLOCK, dim=-2).repeat_interleave(BLOCK, dim=-1)
    return q.to(dtype) * s[..., : q.shape[-2], : q.shape[-1]]


def transposed_128x128(q: Tensor, scales: Tensor) -> tuple[Tensor, Tensor]:
    """The 128x128 quantization of ``w^T`` (its last two dimensions swapped) from ``w``'s own
    ``(q, scales)``: the same blocks, so exactly ``quantize_128x128(w.transpose(-1, -2))`` without
    quantizing again (a layer's weights quantized once serve its data gradient too)."""
    return q.transpose(-1, -2).contiguous(), scales.transpose(-1, -2).contiguous()


def quantize_128x128(w: Tensor, dtype: torch.dtype = torch.float8_e4m3fn, scales: str = "amax"
                     ) -> tuple[Tensor, Tensor]:
    """Quantize weights ``(..., N, K)`` with one FP32 scale per 128 x 128 block, on ``w``'s device.

    Parameters
    ----------
    w : torch tensor (..., N, K)
        Values.
    dtype : torch.float8_e4m3fn or torch.float8_e5m2
        The element format.
    scales : {"amax", "pow2"}
        As :func:`quantize_1x128`.

    Returns
    -------
    (values, scales)
        FP8 ``(..., N, K)`` and float32 ``(..., ceil(N/128), ceil(K/128))`` scales (contiguous:
        the kernels' SFB layout).
    """
    _check(w, dtype, scales, "w", "(..., N, K)", 2)
    *lead, n, k = w.shape
    nb, kb = -(-n // BLOCK), -(-k // BLOCK)
    if nb * BLOCK == n and kb * BLOCK == k:   # (a copy either way: divided in place below)
        v = w.to(torch.float32, copy=True)
    else:
        v = torch.nn.functional.pad(w.float(), (0, kb * BLOCK - k, 0, nb * BLOCK - n))
    v = v.reshape(-1, nb, BLOCK, kb, BLOCK)
    s = _scale(torch.maximum(v.amax(dim=(2, 4)), -v.amin(dim=(2, 4))), dtype, scales)   # max |w|, no |w| copy
    q = v.div_(s[:, :, None, :, None]).to(dtype).reshape(-1, nb * BLOCK, kb * BLOCK)[:, :n, :k]
    return q.reshape(*lead, n, k).contiguous(), s.reshape(*lead, nb, kb).contiguous()


def mx_scales_of_blockwise(sfa: Tensor, sfb: Tensor, *, n: int, k: int) -> tuple[Tensor, Tensor]:
    """The blockwise recipe's E8M0 (power-of-two) scales as MXFP8's, exactly, on their device:
    A's 1x128 scale repeated over its four 32-K blocks, B's 128x128 one over its 128 rows and
    four 32-K blocks (a power of two scales every element of its block alike, so the MX GEMM
    computes the blockwise one's products). What sm_100a's block-scaled MMA
    (tcgen05 ``kind::mxf8f6f4``) reads for the recipe's UE8M0 scales.

    Parameters
    ----------
    sfa : (M, ceil(K/128)) float8_e8m0fnu or uint8 tensor
        A's scales, any strides.
    sfb : (L, ceil(N/128), ceil(K/128)) float8_e8m0fnu or uint8 tensor
        B's scales.
    n, k : int
        B's rows and the GEMM's K.

    Returns
    -------
    (sfa, sfb)
        Physical atom buffers (:func:`pack_sf`) of the (M, ceil(K/32)) and (L, N, ceil(K/32))
        MX scales, in the inputs' dtype.
    """
    sfk = -(-k // 32)
    b = sfb.view(torch.uint8).repeat_interleave(128, dim=-2)[..., :n, :].repeat_interleave(4, dim=-1)[..., :sfk]
    return mx_scales_of_1x128(sfa, k), pack_sf(b).view(sfb.dtype)


def mx_scales_of_1x128(sf: Tensor, k: int) -> Tensor:
    """1x128 E8M0 (power-of-two) scales ``(rows, ceil(K/128))`` as MXFP8's, exactly: each repeated
    over its four 32-K blocks, packed into the physical atom buffer of ``(rows, ceil(K/32))``
    (:func:`pack_sf`), in ``sf``'s dtype. Both operands of the FP8 weight gradient take this on
    sm_100a (their K is the tokens)."""
    return pack_sf(sf.view(torch.uint8).repeat_interleave(4, dim=-1)[..., :-(-k // 32)]).view(sf.dtype)
