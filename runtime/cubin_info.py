"""Read a cubin without a GPU: per-kernel resources and the host contract the kernel exports.

A cubin is an ELF file. Register counts and stack frames are EIATTR records in ``.nv.info``
(keyed by symbol index), per-kernel limits (max threads from ``__launch_bounds__``) in
``.nv.info.<kernel>``, and static shared memory is the size of ``.nv.shared.<kernel>``.
The values agree with ``cuobjdump -res-usage`` (REG, SHARED, STACK); tests cross-check them.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

from ..base.contract import FIELDS, SYMBOL_SUFFIX, KernelContract, from_ints
from ..base.errors import FusegemmError

EIATTR_MAX_THREADS = 0x05
EIATTR_FRAME_SIZE = 0x11
EIATTR_MIN_STACK_SIZE = 0x12
EIATTR_REGCOUNT = 0x2F
EIFMT_SVAL = 0x04


class CubinFormatError(FusegemmError, ValueError):
    """The bytes are not a cubin this module can read."""


@dataclass(frozen=True)
class Resources:
    """Per-kernel resource use read from the cubin itself."""

    kernel: str
    registers: int
    static_shared_bytes: int
    local_bytes: int          # stack frame per thread: local arrays and register spills
    max_threads: int | None   # from __launch_bounds__, when present


@dataclass(frozen=True)
class _Section:
    name: str
    type: int
    offset: int
    size: int
    info: int


class Cubin:
    """A parsed ELF cubin."""

    def __init__(self, data: bytes) -> None:
        if len(data) < 64 or data[:4] != b"\x7fELF" or data[4] != 2:
            raise CubinFormatError("not a 64-bit ELF cubin")
        self.data = data
        shoff = struct.unpack_from("<Q", data, 0x28)[0]
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
        if shoff + shnum * shentsize > len(data):
            raise CubinFormatError("truncated cubin: section headers past the end")
        raw = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
        strtab = raw[shstrndx]
        self.sections = [_Section(self._str(strtab[4], s[0]), s[1], s[4], s[5], s[7]) for s in raw]
        self._symbols = self._read_symbols()

    def _str(self, base: int, off: int) -> str:
        end = self.data.index(b"\0", base + off)
        return self.data[base + off:end].decode("utf-8", "replace")

    def section(self, name: str) -> _Section | None:
        return next((s for s in self.sections if s.name == name), None)

    def _read_symbols(self) -> list[tuple[str, int, int, int]]:
        """(name, section index, value, size) per symbol index."""
        symtab = next((s for s in self.sections if s.type == 2), None)
        if symtab is None:
            return []
        # .symtab's sh_link names the string table; cubins always call it .strtab.
        strsec = self.section(".strtab")
        out = []
        for i in range(symtab.size // 24):
            name, _info, _other, shndx, value, size = struct.unpack_from(
                "<IBBHQQ", self.data, symtab.offset + i * 24)
            out.append((self._str(strsec.offset, name) if strsec else "", shndx, value, size))
        return out

    def kernels(self) -> list[str]:
        return [s.name[len(".text."):] for s in self.sections if s.name.startswith(".text.")]

    def _records(self, section: _Section):
        off, end = section.offset, section.offset + section.size
        while off + 4 <= end:
            fmt, attr, val = struct.unpack_from("<BBH", self.data, off)
            off += 4
            if fmt == EIFMT_SVAL:
                yield attr, self.data[off:off + val]
                off += val
            else:
                yield attr, struct.pack("<H", val)

    def resources(self, kernel: str) -> Resources:
        if kernel not in self.kernels():
            raise CubinFormatError(f"kernel {kernel!r} not in cubin; kernels: {self.kernels()}")
        sym = next(i for i, s in enumerate(self._symbols) if s[0] == kernel)
        regs = frame = 0
        info = self.section(".nv.info")
        if info is not None:
            for attr, data in self._records(info):
                if attr in (EIATTR_REGCOUNT, EIATTR_FRAME_SIZE) and len(data) >= 8:
                    idx, value = struct.unpack_from("<II", data)
                    if idx == sym:
                        if attr == EIATTR_REGCOUNT:
                            regs = value
                        else:
                            frame = value
        max_threads = None
        kinfo = self.section(f".nv.info.{kernel}")
        if kinfo is not None:
            for attr, data in self._records(kinfo):
                if attr == EIATTR_MAX_THREADS and len(data) >= 12:
                    x, y, z = struct.unpack_from("<III", data)
                    max_threads = x * y * z
        shared = self.section(f".nv.shared.{kernel}")
        return Resources(kernel, regs, shared.size if shared else 0, frame, max_threads)

    def global_ints(self, symbol: str, count: int) -> tuple[int, ...]:
        """Initial value of a ``__device__ const int symbol[count]`` global (exactly that size)."""
        for name, shndx, value, size in self._symbols:
            if name == symbol:
                sec = self.sections[shndx]
                if size != 4 * count or sec.type == 8:  # NOBITS: no initial data
                    raise CubinFormatError(f"symbol {symbol!r} holds {size} bytes; expected {count} "
                                           f"initialised ints ({4 * count} bytes)")
                return struct.unpack_from(f"<{count}i", self.data, sec.offset + value)
        raise CubinFormatError(f"symbol {symbol!r} with {count} initialised ints not in cubin")

    def has_symbol(self, symbol: str) -> bool:
        return any(name == symbol for name, *_ in self._symbols)

    def contract(self, kernel: str) -> KernelContract:
        """The host contract ``kernel`` exports (fusegemm/base/contract.py).

        A cubin built against another field list has an array of another size and is refused
        (CubinFormatError), never misread.
        """
        return from_ints(self.global_ints(kernel + SYMBOL_SUFFIX, len(FIELDS)))


def resources(cubin: bytes, kernel: str) -> Resources:
    return Cubin(cubin).resources(kernel)


def contract(cubin: bytes, kernel: str) -> KernelContract:
    return Cubin(cubin).contract(kernel)
