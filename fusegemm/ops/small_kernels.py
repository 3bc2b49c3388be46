"""Small CUDA kernels beside the GEMMs (the tail zeroing, the MoE token permutations), compiled
with NVRTC on first use from one header under templates/include (no CUTLASS: about 0.1 s) and
kept for the process, one cubin per arch. Where NVRTC is unavailable (a process running from a
kernel bundle only) the first compile's failure is logged once and remembered, and callers take
their torch fallback.
"""
from __future__ import annotations

import hashlib
import logging
import threading
from typing import Any, Callable

_LOG = logging.getLogger("fusegemm")


class SmallKernels:
    """The kernels of one header: ``function(device, name)`` loads one (None where it cannot be
    compiled), ``launch(device, name, grid, block, raw, stream)`` launches it with packed parameter
    bytes (each geometry's launch prepared once, one parameter buffer per thread and size).

    Parameters
    ----------
    header : str
        The header's include path (``"fusegemm/zero_tail.cuh"``): its ``extern "C"`` kernels.
    what : str
        How the log names the kernels when they cannot be compiled.
    fallback : str
        What the callers do then (the log's last words).
    defines : tuple of str
        NVRTC options the header is built with besides the run's own (``-DNAME=VALUE``: its A/B
        switches; :meth:`variant`).
    """

    def __init__(self, header: str, what: str, fallback: str, defines: tuple[str, ...] = ()) -> None:
        self.header, self.what, self.fallback = header, what, fallback
        self.defines = tuple(defines)
        self._lock = threading.Lock()
        self._cubins: dict[str, Any] = {}     # arch -> Cubin, or the exception its compile raised
        self._functions: dict[tuple[int, str], Any] = {}   # (device, name) -> loaded kernel or None
        self._launches: dict[tuple, Callable[..., None]] = {}
        self._local = threading.local()

    def variant(self, defines: str) -> "SmallKernels":
        """The same header's kernels built again with ``defines`` (``"-DNAME=VALUE ..."``, after
        this instance's own): a header's A/B switch, loaded beside this build's modules (they are
        keyed by the cubin's digest)."""
        return SmallKernels(self.header, self.what, self.fallback, (*self.defines, *defines.split()))

    def function(self, device: int, name: str) -> Any:
        """Kernel ``name`` loaded on ``device``, or None where NVRTC cannot build the header
        (looked up once per device: the tail kernel's callers are every grouped op's calls)."""
        key = (device, name)
        if key not in self._functions:
            self._functions[key] = self._load(device, name)
        return self._functions[key]

    def _load(self, device: int, name: str) -> Any:
        from ..runtime.load import default_modules
        from .device import device_arch
        arch = device_arch(device)
        with self._lock:
            if arch not in self._cubins:
                try:
                    from ..runtime.compile import compile_source
                    self._cubins[arch] = compile_source(f'#include "{self.header}"\n', arch=arch, kernel=name,
                                                        name=self.header.rsplit("/", 1)[-1] + ".cu",
                                                        extra=self.defines)
                except Exception as exc:   # no NVRTC (bundle-only processes) or no headers
                    _LOG.info("fusegemm: %s is unavailable (%s: %s); %s", self.what, type(exc).__name__,
                              str(exc)[:200], self.fallback)
                    self._cubins[arch] = exc
        cub = self._cubins[arch]
        if isinstance(cub, Exception):
            return None
        # the cubin's digest in the key: another instance built under other NVRTC defines (a
        # benchmark's A/B build) loads its own module, not this header's first one
        digest = hashlib.sha256(cub.data).hexdigest()[:16]
        return default_modules().get(cub.data, name, key=f"{self.header}:{name}.{arch}.{digest}", smem_bytes=0,
                                     device=device)

    def run_on(self, lead: Any, name: str, grid: tuple[int, int, int], block: tuple[int, int, int], raw: bytes
               ) -> bool:
        """:meth:`launch` on torch tensor ``lead``'s device and torch's current stream there."""
        from ..runtime.load import thread_context
        from ..runtime.tensors import resolve_stream
        device = lead.device.index if lead.device.index is not None else 0
        thread_context(device)   # (autograd's backward thread and compiled graphs' may have none current)
        return self.launch(device, name, grid, block, raw, resolve_stream(None, device))

    def launch(self, device: int, name: str, grid: tuple[int, int, int], block: tuple[int, int, int], raw: bytes,
               stream: int) -> bool:
        """Launch kernel ``name`` on ``device`` with parameter bytes ``raw`` on ``stream``; False
        (nothing launched) where the kernel is unavailable. Each geometry's launch is prepared
        once (runtime/launch.py checks the fit there); the driver copies the bytes at launch, so
        one buffer per thread and size serves every call."""
        key = (device, name, grid, block)
        go = self._launches.get(key)
        if go is None:
            k = self.function(device, name)
            if k is None:
                return False
            from ..runtime.launch import LaunchConfig, prepare
            go = self._launches[key] = prepare(k, LaunchConfig(grid=grid, block=block))
        bufs = getattr(self._local, "bufs", None)
        if bufs is None:
            bufs = self._local.bufs = {}
        params = bufs.get(len(raw))
        if params is None:
            from ..runtime.launch import ParamBuffer
            params = bufs[len(raw)] = ParamBuffer(len(raw))
        params.fill(raw)
        go(params, stream)
        return True
