"""The kernel ABI: one flat ``__grid_constant__`` parameter struct, described once.

The same :class:`ParamStruct` renders the C++ struct (with a ``static_assert`` on the offset of
every field and on the total size, so a mismatch fails at compile time, not at launch) and packs
the argument bytes on the host. Field types come from a closed table; names must be identifiers.
"""
from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from functools import cached_property
from typing import Mapping

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

# kind -> (C++ spelling, size, alignment, struct code). CUtensorMap is declared by
# fusegemm/common.cuh as alignas(128), like CUDA 13's cuda.h (CuTe's NVRTC TmaDescriptor is
# alignas(64): the two must not meet inside one parameter struct).
KINDS: dict[str, tuple[str, int, int, str]] = {
    "tensormap": ("CUtensorMap", 128, 128, "128s"),
    "ptr": ("void*", 8, 8, "Q"),
    "cptr": ("const void*", 8, 8, "Q"),
    "i32": ("int32_t", 4, 4, "i"),
    "u32": ("uint32_t", 4, 4, "I"),
    "i64": ("int64_t", 8, 8, "q"),
    "u64": ("uint64_t", 8, 8, "Q"),
    "f32": ("float", 4, 4, "f"),
}


@dataclass(frozen=True)
class Field:
    name: str
    kind: str
    doc: str = ""

    def __post_init__(self) -> None:
        if not _IDENT.match(self.name):
            raise ValueError(f"Field.name: got {self.name!r}; allowed: a C identifier")
        if self.kind not in KINDS:
            raise ValueError(f"Field.kind: got {self.kind!r}; allowed: {sorted(KINDS)}")

    @property
    def cpp(self) -> str:
        return KINDS[self.kind][0]

    @property
    def size(self) -> int:
        return KINDS[self.kind][1]

    @property
    def align(self) -> int:
        return KINDS[self.kind][2]


@dataclass(frozen=True)
class ParamStruct:
    """A flat C struct: fields in order, natural alignment, padded to its alignment."""

    name: str
    fields: tuple[Field, ...]

    def __post_init__(self) -> None:
        if not _IDENT.match(self.name):
            raise ValueError(f"ParamStruct.name: got {self.name!r}; allowed: a C identifier")
        names = [f.name for f in self.fields]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"ParamStruct.fields: duplicate names {sorted(dup)}")

    @property
    def align(self) -> int:
        return max((f.align for f in self.fields), default=1)

    def offsets(self) -> dict[str, int]:
        out, off = {}, 0
        for f in self.fields:
            off = (off + f.align - 1) // f.align * f.align
            out[f.name] = off
            off += f.size
        return out

    @property
    def size(self) -> int:
        end = 0
        for f in self.fields:
            end = (end + f.align - 1) // f.align * f.align + f.size
        return (end + self.align - 1) // self.align * self.align

    def cpp(self) -> str:
        """C++ definition plus compile-time layout checks.

        NVRTC's ``offsetof`` is not a constant expression, so the layout is pinned another way:
        every field's size and alignment and the struct's total size are asserted. For a
        standard-layout struct those fix every offset to the ones :meth:`offsets` computes with
        the same rules (fields in order, natural alignment).
        """
        lines = [f"struct alignas({self.align}) {self.name} {{"]
        for f in self.fields:
            comment = f"  // {f.doc}" if f.doc else ""
            lines.append(f"  {f.cpp} {f.name};{comment}")
        lines.append("};")
        for f, off in zip(self.fields, self.offsets().values()):
            lines.append(f"static_assert(sizeof({self.name}::{f.name}) == {f.size} && "
                         f"alignof(decltype({self.name}::{f.name})) == {f.align}, "
                         f"\"ABI: {self.name}.{f.name} ({f.cpp}) at byte {off}\");")
        lines.append(f"static_assert(sizeof({self.name}) == {self.size} && alignof({self.name}) == "
                     f"{self.align}, \"ABI: sizeof({self.name}) must be {self.size}\");")
        return "\n".join(lines)

    @cached_property
    def _packer(self) -> tuple[struct.Struct, dict[str, int], tuple[object, ...], tuple[int, ...]]:
        """One precompiled ``struct.Struct`` for the whole layout (the per-launch host path)."""
        fmt, cur, defaults = ["<"], 0, []
        for f, off in zip(self.fields, self.offsets().values()):
            if off > cur:
                fmt.append(f"{off - cur}x")
            fmt.append(KINDS[f.kind][3])
            cur = off + f.size
            defaults.append(b"\0" * 128 if f.kind == "tensormap" else 0)
        if self.size > cur:
            fmt.append(f"{self.size - cur}x")
        index = {f.name: i for i, f in enumerate(self.fields)}
        maps = tuple(i for i, f in enumerate(self.fields) if f.kind == "tensormap")
        return struct.Struct("".join(fmt)), index, tuple(defaults), maps

    def pack(self, values: Mapping[str, object]) -> bytes:
        """Argument bytes. Missing fields are zero (null pointers); unknown names are errors.

        ``tensormap`` values are 128 raw bytes (or anything with ``.opaque``, as cuda-bindings'
        ``CUtensorMap``); pointer values are ints or objects with ``data_ptr()``.
        """
        st, index, defaults, maps = self._packer
        out = list(defaults)
        for k, v in values.items():
            i = index.get(k)
            if i is None:
                unknown = sorted(set(values) - set(index))
                raise ValueError(f"{self.name}.pack: unknown fields {unknown}; allowed: {list(index)}")
            if v is not None:
                out[i] = v.data_ptr() if hasattr(v, "data_ptr") else v
        for i in maps:
            if out[i].__class__ is not bytes or len(out[i]) != 128:
                out[i] = _tensormap_bytes(out[i])
        try:
            return st.pack(*out)
        except struct.error as exc:
            raise ValueError(f"{self.name}.pack: {exc}") from None


def _tensormap_bytes(v: object) -> bytes:
    if isinstance(v, (bytes, bytearray)):
        raw = bytes(v)
    elif hasattr(v, "opaque"):  # cuda.bindings.driver.CUtensorMap: 16 x uint64
        raw = struct.pack("<16Q", *(int(x) for x in v.opaque))  # type: ignore[attr-defined]
    else:
        raise TypeError(f"tensormap: got {type(v).__name__}; allowed: 128 bytes or CUtensorMap")
    if len(raw) != 128:
        raise ValueError(f"tensormap: got {len(raw)} bytes; allowed: exactly 128")
    return raw
