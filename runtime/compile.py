"""NVRTC: CUDA C++ source -> cubin, for the archs of fusegemm/base/archs.py, without a CUDA toolkit."""
from __future__ import annotations

import functools
import re
import time
from dataclasses import dataclass, field

from ..base.archs import ARCH_NAMES
from ..base.errors import CompileError
from . import config, nvrtc
from .headers import HeaderSet, header_set


# -default-device: NVRTC otherwise rejects CuTe's host functions ("host functions are not
# allowed in JIT mode"). -DNDEBUG drops device asserts. C++17 is what CUTLASS 4.2 needs.
BASE_OPTIONS = ("-default-device", "-std=c++17", "-DNDEBUG", "--device-int128")


# ptxas's "Potential Performance Loss" notes, e.g. C7518: "wgmma.mma_async instructions are
# serialized due to ...". The cubin is valid but its WGMMAs wait for each other, and nothing else
# says so: NVRTC succeeds and the note sits in a log nobody reads. (H200: the sm_90a grouped GEMM
# with its deferred D stores in a rolled loop that the last tile left through ran 7-20% slower.)
# Kept with the kernel (Built.advisories), printed by `fusegemm build` and `fusegemm inspect`.
_ADVISORY_RE = re.compile(r"^ptxas info\s*:\s*\((C\d+)\) Potential Performance Loss:\s*(.*?)"
                          r"(?: in the function '[^']*')?\s*$", re.MULTILINE)


def advisories(log: str) -> tuple[str, ...]:
    """ptxas's performance advisories in an NVRTC log, as ``"C7518: <what ptxas says>"``."""
    return tuple(f"{code}: {text}" for code, text in _ADVISORY_RE.findall(log))


@dataclass(frozen=True)
class Cubin:
    """A compiled kernel image plus what produced it."""

    data: bytes
    arch: str
    kernel: str
    log: str = ""
    seconds: float = 0.0
    options: tuple[str, ...] = field(default=())

    @property
    def advisories(self) -> tuple[str, ...]:
        """ptxas's performance advisories for this image (empty for a clean kernel)."""
        return advisories(self.log)


@functools.lru_cache(maxsize=1)
def nvrtc_version() -> tuple[int, int]:
    """(major, minor) of the NVRTC this process compiles with (runtime/nvrtc.py chooses it)."""
    return nvrtc.load().version


def headers() -> HeaderSet:
    return header_set(nvrtc_version()[0])


def compile_options(arch: str, extra: tuple[str, ...] = ()) -> tuple[str, ...]:
    """Every NVRTC option for ``arch``, minus include paths (those are located per machine)."""
    if arch not in ARCH_NAMES:
        raise ValueError(f"arch: got {arch!r}; allowed: {', '.join(ARCH_NAMES)}")
    return (f"-arch={arch}", *BASE_OPTIONS, *extra, *config.nvrtc_extra_options())


_LOC_RE = re.compile(r"^(?P<file>[^\s(]+)\((?P<line>\d+)\): (?:error|catastrophic error)", re.MULTILINE)


def source_excerpt(source: str, log: str, name: str, context: int = 2, limit: int = 5) -> str:
    """Lines of ``source`` that NVRTC's log blames (first ``limit`` places), caret-marked."""
    lines = source.splitlines()
    out: list[str] = []
    blamed: list[int] = []
    for m in _LOC_RE.finditer(log):
        n = int(m.group("line"))
        if m.group("file").endswith(name) and n not in blamed and 1 <= n <= len(lines):
            blamed.append(n)
    for n in blamed[:limit]:
        for i in range(max(1, n - context), min(len(lines), n + context) + 1):
            out.append(f"{'>' if i == n else ' '}{i:5d} | {lines[i - 1]}")
            if i == n:
                text = lines[i - 1]
                indent = len(text) - len(text.lstrip())
                out.append("       | " + " " * indent + "^" * max(1, len(text.strip())))
        out.append("")
    if len(blamed) > limit:
        out.append(f"... and {len(blamed) - limit} more blamed lines (see the log)")
    if not blamed and lines:  # the error is inside a header: show the unit's includes
        out = [f" {i:5d} | {l}" for i, l in enumerate(lines[:12], 1)]
    return "\n".join(out)


def compile_source(source: str, *, arch: str, kernel: str, name: str = "kernel.cu",
                   spec_path: str | None = None, extra: tuple[str, ...] = ()) -> Cubin:
    """Compile one translation unit to a cubin. Raises :class:`CompileError` with context."""
    opts = [*compile_options(arch, extra), *headers().options()]
    t0 = time.perf_counter()
    ok, log, data = nvrtc.load().compile(source, name, opts)
    if not ok:
        raise CompileError(kernel=kernel, spec_path=spec_path, arch=arch, log=log,
                           excerpt=source_excerpt(source, log, name))
    return Cubin(data=bytes(data), arch=arch, kernel=kernel, log=log,
                 seconds=time.perf_counter() - t0, options=tuple(opts))
