"""TMA descriptors: ``cuTensorMapEncodeTiled`` through cuda-bindings, as pure functions.

A :class:`TiledMapSpec` says everything about a map except the base address (dtype, global
shape and strides, box, swizzle, L2 promotion, out-of-bounds fill) and is validated when it
is built, so the driver never sees an argument it would reject with a bare
``CUDA_ERROR_INVALID_VALUE``. :func:`encode_tiled` turns (address, spec) into the 128 bytes
that go into a ``__grid_constant__`` parameter struct. :class:`TensorMapCache` is a small
bounded memo an op owns: encoding costs a driver call, and training loops reuse addresses.

Dimensions and coordinates are listed innermost first, as the driver and PTX take them.
"""
from __future__ import annotations

import struct
from collections import OrderedDict
from dataclasses import dataclass

from ..base.dtypes import DTYPES
from ..base.errors import ArgumentError, ToolchainError

# The element types a map can be encoded for: the dtype table's rows whose ``tma`` is their own
# type (FP8/FP4 rows travel as uint8 maps).
MAP_DTYPES: tuple[str, ...] = tuple(d.name for d in DTYPES.values()
                                    if d.tma is not None and d.tma == d.name.upper())
SWIZZLES: dict[int, str] = {
    0: "CU_TENSOR_MAP_SWIZZLE_NONE", 32: "CU_TENSOR_MAP_SWIZZLE_32B",
    64: "CU_TENSOR_MAP_SWIZZLE_64B", 128: "CU_TENSOR_MAP_SWIZZLE_128B",
}
L2_PROMOTIONS: dict[int, str] = {
    0: "CU_TENSOR_MAP_L2_PROMOTION_NONE", 64: "CU_TENSOR_MAP_L2_PROMOTION_L2_64B",
    128: "CU_TENSOR_MAP_L2_PROMOTION_L2_128B", 256: "CU_TENSOR_MAP_L2_PROMOTION_L2_256B",
}
OOB_FILLS: dict[str, str] = {
    "zero": "CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE",  # NONE fills zeros
    "nan": "CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA",
}


@dataclass(frozen=True)
class TiledMapSpec:
    """Everything about a tiled tensor map but its base address.

    Parameters
    ----------
    dtype : str
        Element type name (see ``MAP_DTYPES``).
    shape : tuple of int
        Global extent per dimension, innermost first (rank 1..5).
    strides : tuple of int
        Byte strides of dimensions 1..rank-1 (dimension 0 is contiguous).
    box : tuple of int
        Box (tile) extent per dimension, each 1..256.
    swizzle : int
        Shared-memory swizzle span in bytes: 0, 32, 64 or 128.
    l2_promotion : int
        L2 sector promotion in bytes: 0, 64, 128 or 256.
    oob_fill : str
        ``"zero"`` or ``"nan"`` for box elements outside the global extent.
    """

    dtype: str
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    box: tuple[int, ...]
    swizzle: int = 128
    l2_promotion: int = 256
    oob_fill: str = "zero"

    def __post_init__(self) -> None:
        if self.dtype not in MAP_DTYPES:
            raise ArgumentError("tensor map dtype", repr(self.dtype), ", ".join(MAP_DTYPES))
        rank = len(self.shape)
        if not 1 <= rank <= 5:
            raise ArgumentError("tensor map rank", rank, "1 to 5 dimensions")
        if len(self.strides) != rank - 1:
            raise ArgumentError("tensor map strides", self.strides,
                                f"{rank - 1} byte strides (dimensions 1..{rank - 1})")
        if len(self.box) != rank:
            raise ArgumentError("tensor map box", self.box, f"{rank} extents, one per dimension")
        for i, d in enumerate(self.shape):
            if not isinstance(d, int) or not 1 <= d <= 2**32:
                raise ArgumentError(f"tensor map shape[{i}]", d, "an integer in [1, 2**32]")
        for i, s in enumerate(self.strides):
            if not isinstance(s, int) or s <= 0 or s % 16 or s >= 2**40:
                raise ArgumentError(f"tensor map stride[{i + 1}]", s,
                                    "a positive multiple of 16 bytes below 2**40",
                                    "TMA needs 16-byte aligned rows: pad the inner dimension")
        elem = DTYPES[self.dtype].itemsize
        for i, b in enumerate(self.box):
            if not isinstance(b, int) or not 1 <= b <= 256:
                raise ArgumentError(f"tensor map box[{i}]", b, "an integer in [1, 256]")
        if (self.box[0] * elem) % 16:
            raise ArgumentError("tensor map box[0]", self.box[0],
                                f"a multiple of {16 // elem} elements (16 bytes)")
        if self.swizzle not in SWIZZLES:
            raise ArgumentError("tensor map swizzle", self.swizzle, "0, 32, 64 or 128 bytes")
        if self.swizzle and self.box[0] * elem > self.swizzle:
            raise ArgumentError("tensor map box[0]", self.box[0],
                                f"at most {self.swizzle // elem} elements with a "
                                f"{self.swizzle}-byte swizzle")
        if self.l2_promotion not in L2_PROMOTIONS:
            raise ArgumentError("tensor map l2_promotion", self.l2_promotion, "0, 64, 128 or 256")
        if self.oob_fill not in OOB_FILLS:
            raise ArgumentError("tensor map oob_fill", repr(self.oob_fill), "'zero' or 'nan'")

    @property
    def box_bytes(self) -> int:
        n = DTYPES[self.dtype].itemsize
        for b in self.box:
            n *= b
        return n


def _driver():
    try:
        from cuda.bindings import driver
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ToolchainError("cuda-bindings is not installed (pip install cuda-bindings)") from exc
    return driver


def encode_tiled(address: int, spec: TiledMapSpec) -> bytes:
    """The 128-byte CUtensorMap for ``spec`` at device address ``address``."""
    if not isinstance(address, int) or address <= 0 or address % 16:
        raise ArgumentError("tensor map address", hex(address) if isinstance(address, int) else address,
                            "a non-null 16-byte aligned device address")
    drv = _driver()
    rank = len(spec.shape)
    err, tmap = drv.cuTensorMapEncodeTiled(
        getattr(drv.CUtensorMapDataType, f"CU_TENSOR_MAP_DATA_TYPE_{DTYPES[spec.dtype].tma}"), rank, address,
        [drv.cuuint64_t(d) for d in spec.shape], [drv.cuuint64_t(x) for x in spec.strides],
        [drv.cuuint32_t(b) for b in spec.box], [drv.cuuint32_t(1)] * rank,
        drv.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        getattr(drv.CUtensorMapSwizzle, SWIZZLES[spec.swizzle]),
        getattr(drv.CUtensorMapL2promotion, L2_PROMOTIONS[spec.l2_promotion]),
        getattr(drv.CUtensorMapFloatOOBfill, OOB_FILLS[spec.oob_fill]))
    if int(err) != 0:
        raise ArgumentError("tensor map", f"{err!r} from cuTensorMapEncodeTiled for {spec}",
                            "a shape/stride/box the driver accepts")
    return struct.pack("<16Q", *(int(x) for x in tmap.opaque))


class TensorMapCache:
    """Bounded memo of :func:`encode_tiled` owned by one op (never process-global).

    The value depends only on the key (address and spec), so a hit is always correct; the
    bound keeps a long run with changing addresses from growing without limit.
    """

    def __init__(self, capacity: int = 64) -> None:
        if capacity < 1:
            raise ArgumentError("capacity", capacity, "a positive integer")
        self.capacity = capacity
        self._entries: OrderedDict[tuple, bytes] = OrderedDict()

    def get(self, address: int, spec: TiledMapSpec) -> bytes:
        key = (address, spec)
        hit = self._entries.get(key)
        if hit is not None:
            self._entries.move_to_end(key)
            return hit
        raw = encode_tiled(address, spec)
        self._entries[key] = raw
        if len(self._entries) > self.capacity:
            self._entries.popitem(last=False)
        return raw

    def tiled(self, address: int, dtype: str, shape: tuple[int, ...], strides: tuple[int, ...],
              box: tuple[int, ...], swizzle: int = 128, l2_promotion: int = 256,
              oob_fill: str = "zero") -> bytes:
        """Like :meth:`get` but keyed by plain values: a hit builds no spec object (this is
        the per-launch host path)."""
        key = (address, dtype, shape, strides, box, swizzle, l2_promotion, oob_fill)
        hit = self._entries.get(key)  # type: ignore[call-overload]
        if hit is not None:
            return hit
        raw = self.get(address, TiledMapSpec(dtype, shape, strides, box, swizzle, l2_promotion,
                                             oob_fill))
        self._entries[key] = raw  # type: ignore[index]
        if len(self._entries) > self.capacity:
            self._entries.popitem(last=False)
        return raw

    def __len__(self) -> int:
        return len(self._entries)
