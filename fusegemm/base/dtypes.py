"""The one dtype table: every element type fusegemm names, with each of its spellings.

Every other place asks this table: spec axes and the renderer (C++ types), tensor maps (the TMA
data type), the tensor adapter (``__cuda_array_interface__`` typestrs, item sizes), the format
helpers (numpy / ml_dtypes storage, largest finite value) and kernel names (short names).

numpy and ml_dtypes are imported only when a storage type is asked for, so the runtime's hot
path and the CLI can read the table without them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class DType:
    """One element type.

    Attributes
    ----------
    name : str
        Canonical name, as numpy / ml_dtypes / torch spell it (``float4_e2m1fn_x2`` is a byte
        holding two packed FP4 values, torch's spelling).
    short : str
        Short form in kernel names (``bf16``, ``e4m3``).
    bits : int
        Bits per element (4 for packed FP4, whose storage item holds two).
    storage : str
        numpy / ml_dtypes type name of one storage item (``uint8`` for packed FP4).
    max_finite : float
        Largest finite magnitude (``inf`` for integer types).
    cpp : str or None
        Element type in generated C++ (CUTLASS spellings); None where no kernel uses it.
    scale_cpp : str or None
        The type as a block-scale factor (unsigned scale types of the block-scaled MMAs).
    tma : str or None
        ``CUtensorMapDataType`` member (without ``CU_TENSOR_MAP_DATA_TYPE_``) TMA loads it as;
        FP8/FP4 travel as raw bytes.
    typestr : str or None
        ``__cuda_array_interface__`` typestr (bfloat16: the 2-byte void type ml_dtypes reports).
    packed : bool
        Two elements per storage byte.
    """

    name: str
    short: str
    bits: int
    storage: str
    max_finite: float
    cpp: str | None = None
    scale_cpp: str | None = None
    tma: str | None = None
    typestr: str | None = None
    packed: bool = False

    @property
    def itemsize(self) -> int:
        """Bytes of one storage item."""
        return 1 if self.packed else self.bits // 8

    def numpy_type(self) -> Any:
        """The numpy / ml_dtypes scalar type of one storage item (imports them on first use)."""
        import numpy as np
        if hasattr(np, self.storage):
            return getattr(np, self.storage)
        import ml_dtypes
        return getattr(ml_dtypes, self.storage)


_INF = float("inf")
_F32_MAX = 3.4028234663852886e38

DTYPES: dict[str, DType] = {d.name: d for d in (
    DType("bfloat16", "bf16", 16, "bfloat16", 3.3895313892515355e38, "fusegemm::bfloat16_t",
          tma="BFLOAT16", typestr="<V2"),
    DType("float16", "f16", 16, "float16", 65504.0, "fusegemm::half_t", tma="FLOAT16", typestr="<f2"),
    DType("float32", "f32", 32, "float32", _F32_MAX, "float", scale_cpp="float", tma="FLOAT32", typestr="<f4"),
    DType("float64", "f64", 64, "float64", 1.7976931348623157e308, "double", tma="FLOAT64",
          typestr="<f8"),
    DType("float8_e4m3fn", "e4m3", 8, "float8_e4m3fn", 448.0, "fusegemm::float_e4m3_t",
          scale_cpp="fusegemm::float_ue4m3_t", tma="UINT8"),
    DType("float8_e5m2", "e5m2", 8, "float8_e5m2", 57344.0, "fusegemm::float_e5m2_t", tma="UINT8"),
    DType("float8_e8m0fnu", "ue8m0", 8, "float8_e8m0fnu", 2.0**127, "fusegemm::float_ue8m0_t",
          scale_cpp="fusegemm::float_ue8m0_t", tma="UINT8"),
    DType("float4_e2m1fn", "e2m1u", 4, "float4_e2m1fn", 6.0),  # unpacked (ml_dtypes), host only
    DType("float4_e2m1fn_x2", "e2m1", 4, "uint8", 6.0, "fusegemm::float_e2m1_t", tma="UINT8",
          packed=True),
    DType("uint8", "u8", 8, "uint8", _INF, "uint8_t", tma="UINT8", typestr="|u1"),
    DType("int8", "i8", 8, "int8", _INF, "int8_t", typestr="|i1"),
    DType("int32", "i32", 32, "int32", _INF, "int32_t", tma="INT32", typestr="<i4"),
    # Scale-factor atoms travel as uint32 maps (one 512-byte atom = a 128-element box row).
    DType("uint32", "u32", 32, "uint32", _INF, "uint32_t", tma="UINT32", typestr="<u4"),
    DType("int64", "i64", 64, "int64", _INF, "int64_t", tma="INT64", typestr="<i8"),
    DType("uint64", "u64", 64, "uint64", _INF, "uint64_t", tma="UINT64", typestr="<u8"),
    DType("bool", "b", 8, "bool_", _INF, "bool", typestr="|b1"),
)}

# The "none" value of an optional dtype axis (no bias, no C) is named, never a type.
SHORT_NONE = "none"

BY_TYPESTR: dict[str, str] = {d.typestr: d.name for d in DTYPES.values() if d.typestr}


def dtype(name: str) -> DType:
    """The table entry of ``name``; ValueError naming the known types otherwise."""
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"dtype: got {name!r}; allowed: {', '.join(DTYPES)}") from None


def short(name: str) -> str:
    """Short name for kernel names (``none`` stays ``none``)."""
    return SHORT_NONE if name == "none" else dtype(name).short
