"""Locate the header trees NVRTC needs, from pip wheels only (no CUDA toolkit).

Measured facts (shared/notes/toolchain.md): NVRTC has none of cuda_fp*.h, CCCL or CUTLASS built
in. CUDA 12 wheels put headers in ``nvidia/cuda_runtime/include`` and ``nvidia/cuda_cccl/include``;
CUDA 13 wheels in ``nvidia/cu13/include`` (CCCL under ``cccl/``, which CUTLASS 4.2 includes as
``<cccl/cuda/std/...>`` so the *parent* must be on the path). ``nvidia`` is a namespace package that
can be spread over several site-packages, so each tree is found by the file it must hold, over
all of ``sys.path``.
"""
from __future__ import annotations

import functools
import hashlib
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from ..base.errors import ToolchainError

_INCLUDE_RE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.MULTILINE)


def _search(rel_dirs: tuple[str, ...], must_hold: str) -> Path | None:
    for entry in sys.path:
        base = Path(entry or ".")
        for rel in rel_dirs:
            cand = base / rel
            if (cand / must_hold).is_file():
                return cand.resolve()
    return None


def own_include_dir() -> Path:
    from ..base.package import package_data_dir
    return package_data_dir("templates") / "include"


@dataclass(frozen=True)
class HeaderSet:
    """Include directories for one NVRTC major version, in search order."""

    cuda_major: int
    own: Path
    cutlass: Path
    cuda_runtime: Path
    cccl: Path
    cccl_parent: Path | None = None   # CUDA 13: the folder holding cccl/ (for <cccl/...>)

    @property
    def dirs(self) -> tuple[Path, ...]:
        out: list[Path] = []
        for d in (self.own, self.cutlass, self.cuda_runtime, self.cccl_parent, self.cccl):
            if d is not None and d not in out:
                out.append(d)
        return tuple(out)

    def options(self) -> list[str]:
        return [f"-I{d}" for d in self.dirs]


# Last resort when the CUDA 13 header wheels are missing but a CUDA 13 installation is present
# (the H200 image ships NVRTC 13 without nvidia-cuda-cccl): the same header trees, same layout.
_TOOLKIT_INCLUDES = ("/usr/local/cuda/targets/x86_64-linux/include",
                     "/usr/local/cuda-13.0/targets/x86_64-linux/include",
                     "/usr/local/cuda/targets/sbsa-linux/include")


@functools.lru_cache(maxsize=4)
def header_set(cuda_major: int) -> HeaderSet:
    """Find the header trees matching NVRTC ``cuda_major`` (12 or 13)."""
    cutlass = _search(("cutlass_library/source/include",), "cute/tensor.hpp")
    if cutlass is None:
        raise ToolchainError("CUTLASS/CuTe headers not found: install the nvidia-cutlass wheel "
                             "(pip install nvidia-cutlass==4.2.0.0)")
    if cuda_major >= 13:
        # CUDA 13 puts CCCL under include/cccl. CUTLASS 4.2 includes it as <cccl/cuda/std/...>
        # (parent on the path) while CuTe's config.hpp includes <cuda/std/...> (cccl itself on
        # the path): both are needed.
        runtime = _search(("nvidia/cu13/include",), "cuda_fp16.h")
        parent = _search(("nvidia/cu13/include",), "cccl/cuda/std/type_traits")
        if runtime is None or parent is None:
            for inc in _TOOLKIT_INCLUDES:
                p = Path(inc)
                if (p / "cuda_fp16.h").is_file() and (p / "cccl/cuda/std/type_traits").is_file():
                    runtime, parent = p.resolve(), p.resolve()
                    break
        cccl_dir = parent / "cccl" if parent is not None else None
        want = "nvidia-cuda-runtime and nvidia-cuda-cccl (CUDA 13 wheels: pip install 'fusegemm[cu13]')"
    else:
        parent = None
        runtime = _search(("nvidia/cuda_runtime/include",), "cuda_fp16.h")
        cccl_dir = _search(("nvidia/cuda_cccl/include",), "cuda/std/type_traits")
        want = "nvidia-cuda-runtime-cu12 and nvidia-cuda-cccl-cu12"
    if runtime is None or cccl_dir is None:
        missing = "CUDA runtime headers (cuda_fp16.h)" if runtime is None else "CCCL headers"
        raise ToolchainError(f"{missing} for CUDA {cuda_major} not found on sys.path; install {want}")
    return HeaderSet(cuda_major, own_include_dir().resolve(), cutlass, runtime, cccl_dir, parent)


def _resolve(name: str, current_dir: Path, dirs: tuple[Path, ...]) -> Path | None:
    for d in (current_dir, *dirs):
        cand = d / name
        if cand.is_file():
            return cand
    return None


@functools.lru_cache(maxsize=None)
def _file_digest(path: Path, mtime_ns: int, size: int) -> tuple[str, tuple[str, ...]]:
    data = path.read_bytes()
    names = tuple(_INCLUDE_RE.findall(data.decode("utf-8", "replace")))
    return hashlib.sha256(data).hexdigest(), names


# (top-level include names, dirs) -> ((path, mtime_ns, size), ...): the walk is the costly part
# of a cache key (~20 ms), and thousands of generated units share a handful of include lines.
_closures: dict[tuple, tuple[tuple[Path, int, int], ...]] = {}


def reached_headers(source: str, dirs: tuple[Path, ...]) -> dict[str, str]:
    """Every header reachable by ``#include`` from ``source`` → its sha256.

    Conditional includes are followed regardless of the preprocessor (a superset is safe for a
    cache key). Names that resolve nowhere (e.g. NVRTC built-ins) are skipped. A remembered
    closure is reused only while every file in it keeps its size and mtime.
    """
    roots = tuple(_INCLUDE_RE.findall(source))
    memo = _closures.get((roots, dirs))
    if memo is not None:
        out: dict[str, str] = {}
        for path, mtime, size in memo:
            try:
                st = path.stat()
            except OSError:
                break
            if (st.st_mtime_ns, st.st_size) != (mtime, size):
                break
            out[str(path)] = _file_digest(path, mtime, size)[0]
        else:
            return dict(sorted(out.items()))
    seen: dict[str, str] = {}
    stats: list[tuple[Path, int, int]] = []
    stack = [(n, None) for n in roots]
    while stack:
        name, cur = stack.pop()
        path = _resolve(name, cur or dirs[0], dirs)
        if path is None:
            continue
        key = str(path)
        if key in seen:
            continue
        st = path.stat()
        digest, names = _file_digest(path, st.st_mtime_ns, st.st_size)
        seen[key] = digest
        stats.append((path, st.st_mtime_ns, st.st_size))
        stack.extend((n, path.parent) for n in names)
    _closures[(roots, dirs)] = tuple(stats)
    return dict(sorted(seen.items()))


def headers_digest(source: str, dirs: tuple[Path, ...]) -> str:
    """One hash over the content (not the location) of every reached header."""
    h = hashlib.sha256()
    for path, digest in reached_headers(source, dirs).items():
        rel = path
        for d in dirs:
            if path.startswith(str(d) + "/"):
                rel = path[len(str(d)) + 1:]
                break
        h.update(f"{len(rel)}:{rel}={digest};".encode())
    return h.hexdigest()
