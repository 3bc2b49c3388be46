"""MXFP8 quantization on torch tensors, on the tensors' device: the training-step side of
:mod:`fusegemm.formats` (which is numpy, for references and host preparation).

The MoE layer's MXFP8 recipe quantizes its weights every step and the incoming gradient every
backward; a host round trip through numpy would cost more than the GEMMs. These functions give
the same bytes as :func:`fusegemm.formats.quantize_blockwise` and :func:`fusegemm.formats.pack_sf`
(the tests compare them bit for bit):

* a block's scale is the E8M0 power of two ``2**ceil(log2(amax / elem_max))`` (rounded up, so
  no element saturates; an all-zero block gets the smallest scale, code 0);
* each element is ``x / scale`` rounded to nearest-even in the element format, saturating.

Scales travel in the physical SF atom layout ``(L, ceil(mn/128), ceil(sfk/4), 32, 4, 4)`` that
the block-scaled kernels read (see :mod:`fusegemm.formats.scales`); :func:`kernel_view` gives the
seed pages' 6-D view of it.

    q, sf = quantize_mx(w)                  # w (L, N, K) bfloat16 -> q (L, N, K) e4m3, sf (L, N, K/32)
    sfb = kernel_view(pack_sf(sf))          # what grouped_gemm_quant's sfb_tensor takes
"""
from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["quantize_mx", "dequantize_mx", "pack_sf", "unpack_sf", "kernel_view", "physical_view"]

VEC = 32          # MXFP8: one E8M0 scale per 32 elements along K
_ELEMENTS = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}
_TO_VIEW = (3, 4, 1, 5, 2, 0)
_FROM_VIEW = (5, 2, 4, 0, 1, 3)


def quantize_mx(x: Tensor, dtype: torch.dtype = torch.float8_e4m3fn) -> tuple[Tensor, Tensor]:
    """Quantize along the last dimension (K) to MXFP8.

    Parameters
    ----------
    x : (..., K) float tensor
        K a multiple of 32 (the layer's dimensions are).
    dtype : torch.float8_e4m3fn or torch.float8_e5m2
        Element format.

    Returns
    -------
    q : (..., K) tensor in ``dtype``
    sf : (..., K/32) torch.float8_e8m0fnu tensor
        Logical scales: ``dequantize_mx(q, sf)`` is x rounded to the format.
    """
    if dtype not in _ELEMENTS:
        raise ValueError(f"dtype: got {dtype}; allowed: torch.float8_e4m3fn, torch.float8_e5m2")
    if x.dim() < 1 or x.shape[-1] % VEC or not x.is_floating_point():
        raise ValueError(f"x: got {x.dtype} {tuple(x.shape)}; allowed: a float tensor whose last dimension "
                         f"is a multiple of {VEC}")
    blocks = x.float().contiguous().unflatten(-1, (-1, VEC))    # q comes back row-major (K-major)
    # The scale is computed in float64 as fusegemm.formats does (amax / elem_max is not exact in
    # float32, and the round-up must see the exact quotient's side of a power of two).
    wanted = blocks.abs().amax(-1).double() / _ELEMENTS[dtype]
    mant, exp = torch.frexp(wanted)
    ceil_log2 = exp.long() - (mant == 0.5).long()
    code = torch.where(wanted == 0, 0, ceil_log2.clamp(-127, 127) + 127)
    code = torch.where(wanted.isinf() | (ceil_log2 > 127), 254, code)    # saturate, as formats does
    code = torch.where(wanted.isnan(), 255, code)
    scale = torch.ldexp(torch.ones_like(wanted), code - 127).float()        # exact powers of two
    emax = _ELEMENTS[dtype]
    # x / scale is exact in float32 (scale is a power of two); one rounding, in the cast.
    q = (blocks / scale[..., None]).clamp(-emax, emax).to(dtype).flatten(-2)
    return q, code.to(torch.uint8).view(torch.float8_e8m0fnu)


def dequantize_mx(q: Tensor, sf: Tensor) -> Tensor:
    """``q * sf`` per 32-element block along the last dimension, in float32.

    Parameters
    ----------
    q : (..., K) FP8 tensor
    sf : (..., K/32) torch.float8_e8m0fnu (or uint8 codes) tensor
        Logical scales, as :func:`quantize_mx` returns or :func:`unpack_sf` recovers.
    """
    codes = sf.view(torch.uint8).long() if sf.dtype != torch.uint8 else sf.long()
    scale = torch.ldexp(torch.ones(codes.shape, device=q.device, dtype=torch.float32), codes - 127)
    return (q.float().unflatten(-1, (-1, VEC)) * scale[..., None]).flatten(-2)


def pack_sf(sf: Tensor) -> Tensor:
    """Logical scales (mn, sfk) or (L, mn, sfk) -> the physical atom buffer
    ``(L, ceil(mn/128), ceil(sfk/4), 32, 4, 4)``, zero padded, in sf's dtype.

    Parameters
    ----------
    sf : (mn, sfk) or (L, mn, sfk) tensor
        ``phys[l, m//128, k//4, m%32, (m%128)//32, k%4] = sf[l, m, k]``.
    """
    if sf.dim() not in (2, 3):
        raise ValueError(f"sf: got shape {tuple(sf.shape)}; allowed: (mn, sfk) or (L, mn, sfk)")
    sf3 = sf if sf.dim() == 3 else sf[None]
    l, mn, sfk = sf3.shape
    rt, kt = -(-mn // 128), -(-sfk // 4)
    padded = torch.zeros((l, rt * 128, kt * 4), dtype=torch.uint8, device=sf.device)
    padded[:, :mn, :sfk] = sf3.view(torch.uint8)
    # (l, rt, 4, 32, kt, 4) -> (l, rt, kt, 32, 4, 4): m = rt*128 + (m%128)//32 * 32 + m%32
    phys = padded.view(l, rt, 4, 32, kt, 4).permute(0, 1, 4, 3, 2, 5).contiguous()
    return phys.view(sf.dtype) if sf.dtype != torch.uint8 else phys


def physical_view(sf: Tensor) -> Tensor:
    """The physical atom buffer of a kernel-facing 6-D view ``(32, 4, R, 4, C, L)`` (what the
    block-scaled ops return), or ``sf`` itself when it is already physical ``(L, R, C, 32, 4, 4)``.

    Parameters
    ----------
    sf : 6-D tensor
        Either form; anything else raises ``ValueError`` naming the shapes allowed.
    """
    if sf.dim() == 6 and sf.shape[:2] == (32, 4) and sf.shape[3] == 4:
        return sf.permute(*_FROM_VIEW)
    if sf.dim() == 6 and sf.shape[3:] == (32, 4, 4):
        return sf
    raise ValueError(f"sf: got shape {tuple(sf.shape)}; allowed: a physical (L, R, C, 32, 4, 4) buffer or its "
                     f"kernel view (32, 4, R, 4, C, L)")


def unpack_sf(sf: Tensor, mn: int, sfk: int) -> Tensor:
    """The inverse of :func:`pack_sf`: (L, mn, sfk) logical scales from a physical buffer or its
    kernel view.

    Parameters
    ----------
    sf : 6-D tensor
        Physical ``(L, R, C, 32, 4, 4)`` or kernel view ``(32, 4, R, 4, C, L)``.
    mn : int
        Rows and scale columns to keep (the padding is dropped).
    sfk : int
        Rows and scale columns to keep (the padding is dropped).
    """
    phys = physical_view(sf)
    l, rt, kt = phys.shape[:3]
    logical = phys.permute(0, 1, 4, 3, 2, 5).reshape(l, rt * 128, kt * 4)
    return logical[:, :mn, :sfk]


def kernel_view(phys: Tensor) -> Tensor:
    """The seed pages' SF view ``(32, 4, R, 4, C, L)`` of a physical buffer (no copy).

    Parameters
    ----------
    phys : (L, R, C, 32, 4, 4) tensor
    """
    return phys.permute(*_TO_VIEW)
