"""Small CUDA kernels beside the GEMMs (the tail zeroing, the MoE token permutations), compiled
with NVRTC on first use from one header under templates/include (no CUTLASS: about 0.1 s) and
kept for the process, one cubin per arch. Where NVRTC is unavailable (a process running from a
kernel bundle only) the first compile's failure is logged once and remembered, and callers take
their torch fallback.
"""
from __future__ import annotations

import logging
import threading
from typing import Any, Callable

_LOG = logging.getLogger("fusegemm")


class SmallKernels:
    """The kernels of one header: ``function(device, name)`` loads one (None where it cannot be
    compiled), ``launcher(device, name, grid, block)`` prepares its launch for a geometry.

    Parameters
    ----------
    header : str
        The header's include path (``"fusegemm/zero_tail.cuh"``): its ``extern "C"`` kernels.
    what : str
        How the log names the kernels when they cannot be compiled.
    fallback : str
        What the callers do then (the log's last words).
    """

    def __init__(self, header: str, what: str, fallback: str) -> None:
        self.header, self.what, self.fallback = header, what, fallback
        self._lock = threading.Lock()
        self._cubins: dict[str, Any] = {}     # arch -> Cubin, or the exception its compile raised
        self._launches: dict[tuple, Callable[..., None]] = {}

    def function(self, device: int, name: str) -> Any:
        """Kernel ``name`` loaded on ``device``, or None where NVRTC cannot build the header."""
        from ..runtime.load import default_modules
        from .device import device_arch
        arch = device_arch(device)
        with self._lock:
            if arch not in self._cubins:
                try:
                    from ..runtime.compile import compile_source
                    self._cubins[arch] = compile_source(f'#include "{self.header}"\n', arch=arch, kernel=name,
                                                        name=self.header.rsplit("/", 1)[-1] + ".cu")
                except Exception as exc:   # no NVRTC (bundle-only processes) or no headers
                    _LOG.info("fusegemm: %s is unavailable (%s: %s); %s", self.what, type(exc).__name__, str(exc)[:200],
                              self.fallback)
                    self._cubins[arch] = exc
        cub = self._cubins[arch]
        if isinstance(cub, Exception):
            return None
        return default_modules().get(cub.data, name, key=f"{self.header}:{name}.{arch}", smem_bytes=0, device=device)

    def launcher(self, device: int, name: str, grid: tuple[int, int, int], block: tuple[int, int, int]
                 ) -> Callable[..., None] | None:
        """``go(params, stream)`` for kernel ``name`` on ``device`` with this geometry (prepared once:
        runtime/launch.py checks the fit there), or None where the kernel is unavailable."""
        key = (device, name, grid, block)
        go = self._launches.get(key)
        if go is None:
            k = self.function(device, name)
            if k is None:
                return None
            from ..runtime.launch import LaunchConfig, prepare
            go = self._launches[key] = prepare(k, LaunchConfig(grid=grid, block=block))
        return go
