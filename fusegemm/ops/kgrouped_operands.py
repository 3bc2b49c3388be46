"""The operands of the K-grouped kernel class (weight gradients): dY (T, M) and X (T, N),
token-major BF16 as the MoE layer stores them, and padded_offsets; shapes, strides and dtypes
(devices and addresses: the engine, after every other argument).
"""
from __future__ import annotations

from typing import Any

from .. import arguments as args
from ..base.dtypes import DTYPES
from ..base.errors import ArgumentError
from . import arg_checks as checks


class KCall:
    """Validated K-grouped operands (``m``: rows of the dY^T tile, ``m_out``: M of one expert; ``t``
    the token rows the offsets count; gathered operands: their index and their own rows)."""

    def __init__(self, a: Any, b: Any, offsets: Any, t: int, m: int, n: int, l: int, a_index: Any = None,
                 b_index: Any = None) -> None:
        self.a, self.b, self.offsets = a, b, offsets
        self.t, self.m_out, self.n, self.l = t, m, n, l
        self.m = l * m    # rows of the (L * M, N) output the epilogue writes
        self.a_index, self.b_index = a_index, b_index
        self.row_ends: Any = None   # where each expert's tokens end (k-blocks past it skipped)


def token_major(x: Any, name: str, t: int | None, index_name: str | None = None) -> Any:
    """A (T, C) bfloat16 operand, C contiguous, 16-byte row pitch: T a multiple of 256 (``t``
    where given), or for an operand read through ``index_name`` (gathered) any T >= 1."""
    v = args.tensor(x, name, ndims=(2,), dtypes=("bfloat16",))
    rows, cols = v.shape
    if index_name is not None:
        if rows == 0:
            raise ArgumentError(f"{name}.shape[0]", 0, f"at least 1 (the rows {index_name} reads)")
    elif t is not None and rows != t:
        raise ArgumentError(f"{name}.shape[0]", rows, f"{t} (the token rows of dy_tensor)")
    elif rows % args.M_ALIGNED:
        raise ArgumentError(f"{name}.shape[0]", rows, f"a multiple of {args.M_ALIGNED} (padded token rows)")
    if cols < 8 or cols % 8:
        raise ArgumentError(f"{name}.shape[1]", cols, "a multiple of 8, at least 8 (16-byte rows)")
    if rows and (v.strides[1] != 1 or v.strides[0] < cols):
        raise ArgumentError(f"{name}.stride", v.strides, f"row-major: (at least {cols}, 1)")
    checks.row_pitch_aligned(v.strides[0], DTYPES[v.dtype].itemsize, name)
    return v


def _gathered(x: Any, name: str, index: Any, index_name: str, t: int | None) -> tuple[Any, Any, int]:
    """A token-major operand read through ``index`` (one entry per token row of the problem):
    (operand, index, token rows)."""
    v = token_major(x, name, None, index_name)
    idx = checks.row_index(index, index_name, "padded token rows", None if t is None else (t, "the token rows of dy"))
    return v, idx, idx.shape[0]


def parse_kgrouped(tile_m: int, dy_tensor: Any, x_tensor: Any, padded_offsets: Any, dy_index: Any = None,
                   x_index: Any = None) -> KCall:
    dy_idx = x_idx = None
    if dy_index is None:
        dy = token_major(dy_tensor, "dy_tensor", None)
        t = dy.shape[0]
    else:
        dy, dy_idx, t = _gathered(dy_tensor, "dy_tensor", dy_index, "dy_index", None)
    m = dy.shape[1]
    if x_index is None:
        x = token_major(x_tensor, "x_tensor", t)
    else:
        x, x_idx, _ = _gathered(x_tensor, "x_tensor", x_index, "x_index", t)
    off, l = args.offsets(padded_offsets)
    tm = tile_m
    if m % tm or m == 0:
        raise ArgumentError("dy_tensor.shape[1]", m, f"a positive multiple of {tm} (the tile's M: each "
                                                     f"expert's (M, N) block is whole tiles)")
    checks.unit_stride(off, "padded_offsets")
    return KCall(dy, x, off, t, m, x.shape[1], l, dy_idx, x_idx)
