"""NVRTC through ctypes, from either CUDA wheel layout (12.x or 13.x).

cuda-bindings' ``nvrtc`` module loads the NVRTC of its own major only, so NVRTC 13 would need
cuda-bindings 13 -- and cuda-bindings 13 drops CUDA 12 drivers. Loading NVRTC here decouples the
compiler from the driver bindings: the default install (cuda-bindings 12.9, NVRTC 12.9) and
``fusegemm[cu13]`` (adds the NVRTC 13 and header wheels next to it) both resolve, and the
H200 image (cuda-bindings 13, NVRTC 13) works the same. The C API used here is unchanged
between the two majors.

Which library: ``FUSEGEMM_NVRTC_MAJOR`` (12 or 13) when set; otherwise the newest installed
major the CUDA driver can load cubins of (driver 12.x: NVRTC 12; 13.x: 13), or the newest
installed one where no driver is present (a CPU build machine).
"""
from __future__ import annotations

import ctypes
import functools
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from ..base.errors import ToolchainError
from . import config

# (major, folder of the wheel layout, library file) -- CUDA 12 and CUDA 13 pip wheels.
_LAYOUTS = ((13, "nvidia/cu13/lib", "libnvrtc.so.13"), (12, "nvidia/cuda_nvrtc/lib", "libnvrtc.so.12"))
_TOOLKIT = "/usr/local/cuda/lib64"
_lock = threading.Lock()


def installed() -> dict[int, str]:
    """{major: library path} of every NVRTC wheel on ``sys.path`` (``nvidia`` is a namespace
    package that may span several site-packages), else what the system loader finds."""
    found: dict[int, str] = {}
    for major, rel, name in _LAYOUTS:
        for entry in sys.path:
            cand = Path(entry or ".") / rel / name
            if major not in found and cand.is_file():
                found[major] = str(cand.resolve())
    for major, _, name in _LAYOUTS:
        toolkit = Path(_TOOLKIT) / name
        if major not in found and toolkit.is_file():
            found[major] = str(toolkit)       # a CUDA toolkit in its default place (no wheel)
    for major, _, name in _LAYOUTS:
        if major not in found:
            try:
                ctypes.CDLL(name)             # a toolkit on the loader path
                found[major] = name
            except OSError:
                pass
    return found


def driver_major() -> int | None:
    """CUDA major version of the installed driver, or None without one."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        v = ctypes.c_int(0)
        if lib.cuDriverGetVersion(ctypes.byref(v)) == 0 and v.value > 0:
            return v.value // 1000
    except (OSError, AttributeError):
        pass
    return None


def choose(found: dict[int, str], want: int | None, driver: int | None) -> int:
    """The NVRTC major to load (the rule in the module docstring)."""
    if not found:
        raise ToolchainError("no NVRTC library found: install nvidia-cuda-nvrtc-cu12 (CUDA 12.9, the default "
                             "`pip install fusegemm`) or nvidia-cuda-nvrtc (CUDA 13: pip install 'fusegemm[cu13]')")
    if want is not None:
        if want not in found:
            raise ToolchainError(f"FUSEGEMM_NVRTC_MAJOR={want}: no NVRTC {want} is installed (found "
                                 f"{', '.join(str(m) for m in sorted(found))}); install "
                                 + ("nvidia-cuda-nvrtc-cu12" if want == 12 else "'fusegemm[cu13]'"))
        return want
    usable = [m for m in found if driver is None or m <= driver]
    return max(usable) if usable else min(found)


@dataclass(frozen=True)
class Nvrtc:
    """One loaded NVRTC library."""

    path: str
    lib: ctypes.CDLL
    version: tuple[int, int]

    def compile(self, source: str, name: str, options: list[str]) -> tuple[bool, str, bytes]:
        """(ok, log, cubin) of one translation unit."""
        lib = self.lib
        prog = ctypes.c_void_p()
        self._check(lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), name.encode(), 0, None, None),
                    "create")
        try:
            enc = [o.encode() for o in options]
            argv = (ctypes.c_char_p * len(enc))(*enc)
            err = lib.nvrtcCompileProgram(prog, len(enc), argv)
            size = ctypes.c_size_t()
            self._check(lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size)), "log size")
            buf = ctypes.create_string_buffer(size.value or 1)
            self._check(lib.nvrtcGetProgramLog(prog, buf), "log")
            log = buf.value.decode("utf-8", "replace")
            if err != 0:
                return False, log, b""
            self._check(lib.nvrtcGetCUBINSize(prog, ctypes.byref(size)), "cubin size")
            data = ctypes.create_string_buffer(size.value)
            self._check(lib.nvrtcGetCUBIN(prog, data), "get cubin")
            return True, log, data.raw
        finally:
            lib.nvrtcDestroyProgram(ctypes.byref(prog))

    def _check(self, err: int, what: str) -> None:
        if err != 0:
            self.lib.nvrtcGetErrorString.restype = ctypes.c_char_p
            text = self.lib.nvrtcGetErrorString(err) or b"?"
            raise ToolchainError(f"NVRTC {what} failed: {text.decode()} ({err}; {self.path})")


@functools.lru_cache(maxsize=1)
def load() -> Nvrtc:
    """The NVRTC this process compiles with (loaded once)."""
    with _lock:
        found = installed()
        major = choose(found, config.nvrtc_major(), driver_major())
        path = found[major]
        try:
            lib = ctypes.CDLL(path)
        except OSError as exc:
            raise ToolchainError(f"NVRTC {major} at {path} could not be loaded: {exc}") from exc
        for fn in ("nvrtcVersion", "nvrtcCreateProgram", "nvrtcCompileProgram", "nvrtcGetProgramLogSize",
                   "nvrtcGetProgramLog", "nvrtcGetCUBINSize", "nvrtcGetCUBIN", "nvrtcDestroyProgram"):
            getattr(lib, fn).restype = ctypes.c_int
        lib.nvrtcCreateProgram.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p, ctypes.c_char_p,
                                           ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
        lib.nvrtcCompileProgram.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        lib.nvrtcGetProgramLogSize.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)]
        lib.nvrtcGetProgramLog.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        lib.nvrtcGetCUBINSize.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)]
        lib.nvrtcGetCUBIN.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        lib.nvrtcDestroyProgram.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
        ma, mi = ctypes.c_int(), ctypes.c_int()
        if lib.nvrtcVersion(ctypes.byref(ma), ctypes.byref(mi)) != 0:
            raise ToolchainError(f"nvrtcVersion failed ({path})")
        return Nvrtc(path=path, lib=lib, version=(ma.value, mi.value))
