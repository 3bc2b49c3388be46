"""The operands of the K-grouped block-scaled kernel class (FP8 weight gradients): A = dY^T (M, T)
and B = X^T (N, T), FP8 with the tokens contiguous (FP8 MMAs read K-major operands, and K is the
tokens here), their scales along the tokens, and padded_offsets over the tokens. The scales are
the blockwise recipe's (sf_vec_size 128: FP32 per row and 128 tokens, ``sfa`` (M, T/128) and
``sfb`` (N, T/128) with unit stride along the rows; ``torch_blockwise.quantize_wgrad`` makes an
operand and its scales from a token-major BF16 matrix) or MXFP8's (sf_vec_size 32: E8M0 per row
and 32 tokens in the 32x4x4 atom layout of :mod:`fusegemm.formats.scales`, over (M, T/32) and
(N, T/32)). Shapes, strides and dtypes are checked here; devices and addresses by the engine
(fusegemm/ops/engine.py), after every other argument.
"""
from __future__ import annotations

from typing import Any

from .. import arguments as args
from ..base.errors import ArgumentError
from . import arg_checks as checks
from .scaled_operands import BLOCKWISE, SF_AXIS, blockwise_sfa, sf_buffer

FP8 = ("float8_e4m3fn", "float8_e5m2")


class KSCall:
    """Validated K-grouped block-scaled operands (``m_out``: M of one expert's block, ``m``: rows of
    the (L * M, N) output, ``t``: token columns, ``vec``: tokens per scale, ``sfk``: scales per row)."""

    def __init__(self, a: Any, sfa: Any, b: Any, sfb: Any, offsets: Any, t: int, m: int, n: int, l: int,
                 vec: int) -> None:
        self.a, self.sfa, self.b, self.sfb, self.offsets = a, sfa, b, sfb, offsets
        self.t, self.m_out, self.n, self.l, self.vec = t, m, n, l, vec
        self.m = l * m
        self.sfk = -(-t // vec)
        self.blockwise = vec == BLOCKWISE
        self.ab = a.dtype
        self.sf = "float32"
        self.sfa_ld = self.sfb_ld = 0        # K-block pitches of blockwise scales, in floats
        self.row_ends: Any = None


def token_contiguous(x: Any, name: str, t: int | None, what: str) -> Any:
    """An (rows, T) FP8 operand with the tokens contiguous and a 16-byte row pitch."""
    v = args.tensor(x, name, ndims=(2,), dtypes=FP8)
    rows, cols = v.shape
    if t is not None and cols != t:
        raise ArgumentError(f"{name}.shape[1]", cols, f"{t} (the token columns of a_tensor)")
    if cols % args.M_ALIGNED:
        raise ArgumentError(f"{name}.shape[1]", cols, f"a multiple of {args.M_ALIGNED} (padded token columns)")
    if rows == 0:
        raise ArgumentError(f"{name}.shape[0]", rows, f"at least 1 ({what})")
    if cols and (v.strides[1] != 1 or v.strides[0] < cols):
        raise ArgumentError(f"{name}.stride", v.strides, f"token-contiguous: (at least {cols}, 1)",
                            f"{name} is {what} transposed, tokens contiguous "
                            "(fusegemm.formats.torch_blockwise.quantize_wgrad makes it from the token-major matrix)")
    checks.row_pitch_aligned(v.strides[0], 1, name)
    return v


def parse_kscaled(tile_m: int, a_tensor: Any, sfa_tensor: Any, b_tensor: Any, sfb_tensor: Any,
                  padded_offsets: Any, sf_vec_size: int = BLOCKWISE) -> KSCall:
    a = token_contiguous(a_tensor, "a_tensor", None, "dY^T (M, T)")
    t, m = a.shape[1], a.shape[0]
    b = token_contiguous(b_tensor, "b_tensor", t, "X^T (N, T)")
    if b.dtype != a.dtype:
        raise ArgumentError("b_tensor.dtype", b.dtype, f"{a.dtype} (a_tensor's format)")
    n = b.shape[0]
    if m % tile_m:
        raise ArgumentError("a_tensor.shape[0]", m, f"a positive multiple of {tile_m} (the tile's M: each "
                                                    "expert's (M, N) block is whole tiles)")
    if n % 8:
        raise ArgumentError("b_tensor.shape[0]", n, "a multiple of 8 (16-byte rows of D)")
    off, l = args.offsets(padded_offsets)
    checks.unit_stride(off, "padded_offsets")
    call = KSCall(a, None, b, None, off, t, m, n, l, sf_vec_size)
    if call.blockwise:
        call.sfa, call.sfa_ld, _ = blockwise_sfa(sfa_tensor, "sfa_tensor", m, call.sfk, 1, False, "A = dY^T")
        call.sfb, call.sfb_ld, _ = blockwise_sfa(sfb_tensor, "sfb_tensor", n, call.sfk, 1, False, "B = X^T")
    else:   # MXFP8: E8M0 atoms over (M, T/32) and (N, T/32)
        call.sfa = sf_buffer(sfa_tensor, "sfa_tensor", m, call.sfk, 1)
        call.sfb = sf_buffer(sfb_tensor, "sfb_tensor", n, call.sfk, 1)
        if call.sfb.dtype != call.sfa.dtype:
            raise ArgumentError("sfb_tensor.dtype", call.sfb.dtype, f"{call.sfa.dtype} (sfa_tensor's)")
        call.sf = SF_AXIS[call.sfa.dtype]
    return call
