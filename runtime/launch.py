"""Launch a loaded kernel: grid, block, cluster dims, dynamic smem, one packed-struct argument.

Every fusegemm kernel takes exactly one ``__grid_constant__`` parameter struct, so the
argument list is always one pointer to the packed bytes (``generator/abi.py`` packs them).
Cluster launches go through ``cuLaunchKernelEx`` with a cluster-dimension attribute; 1x1x1
clusters use plain ``cuLaunchKernel`` (cheaper to build on the host).
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Callable

from ..base.errors import ArgumentError
from .load import LoadedKernel, check, driver


@dataclass(frozen=True)
class LaunchConfig:
    """Launch geometry, validated on construction."""

    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    cluster: tuple[int, int, int] = (1, 1, 1)
    smem_bytes: int = 0

    def __post_init__(self) -> None:
        for name in ("grid", "block", "cluster"):
            dims = getattr(self, name)
            if len(dims) != 3 or any(not isinstance(d, int) or d < 1 for d in dims):
                raise ArgumentError(f"LaunchConfig.{name}", dims, "three positive integers")
        if self.block[0] * self.block[1] * self.block[2] > 1024:
            raise ArgumentError("LaunchConfig.block", self.block, "at most 1024 threads")
        for g, c, axis in zip(self.grid, self.cluster, "xyz"):
            if g % c:
                raise ArgumentError(f"LaunchConfig.grid.{axis}", g,
                                    f"a multiple of the cluster extent {c}")
        if self.smem_bytes < 0:
            raise ArgumentError("LaunchConfig.smem_bytes", self.smem_bytes, ">= 0")

    @property
    def clustered(self) -> bool:
        return self.cluster[0] * self.cluster[1] * self.cluster[2] != 1


class ParamBuffer:
    """Host memory holding the packed struct plus the one-entry ``void*`` argument array.

    cuLaunchKernel copies the argument bytes before it returns, so one buffer per op can be
    refilled for every launch (also while a CUDA graph is being captured).
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._data = ctypes.create_string_buffer(size)
        self.argv = (ctypes.c_void_p * 1)(ctypes.addressof(self._data))
        self.argv_address = ctypes.addressof(self.argv)

    def fill(self, raw: bytes) -> None:
        if len(raw) != self.size:
            raise ArgumentError("params", f"{len(raw)} bytes", f"exactly {self.size} bytes")
        ctypes.memmove(self._data, raw, self.size)


_direct: dict[bool, object] = {}


def _direct_launch(prototyped: bool = True):
    """libcuda's cuLaunchKernel through ctypes, or None where it cannot be loaded.

    cuda-bindings' wrapper converts and checks every argument in Python (several
    microseconds per call); the host budget per launch is ~10 us, so the plain
    (non-cluster) path calls the driver entry point directly. ``prototyped=False`` gives a
    separate function object without argtypes, for callers that pass pointers as ctypes
    objects themselves (:func:`prepare`).
    """
    if prototyped not in _direct:
        fn = None
        try:
            lib = ctypes.CDLL("libcuda.so.1")
            fn = lib["cuLaunchKernel"]      # a new function object: argtypes stay its own
            fn.restype = ctypes.c_int
            if prototyped:
                fn.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
        except (OSError, AttributeError):
            fn = None
        _direct[prototyped] = fn
    return _direct[prototyped]


def _check_fits(kernel: LoadedKernel, cfg: LaunchConfig) -> None:
    if cfg.smem_bytes > kernel.smem_bytes:
        raise ArgumentError("LaunchConfig.smem_bytes", cfg.smem_bytes,
                            f"at most the {kernel.smem_bytes} bytes the kernel was loaded with")
    ctas = cfg.cluster[0] * cfg.cluster[1] * cfg.cluster[2]
    if ctas > kernel.max_cluster_ctas:
        raise ArgumentError("LaunchConfig.cluster", cfg.cluster,
                            f"at most {kernel.max_cluster_ctas} CTAs (the kernel's contract)")


def _cluster_config(cfg: LaunchConfig, stream: int | None = None):
    """``cfg`` as the driver's CUlaunchConfig with its cluster-dimension attribute (what
    cuLaunchKernelEx launches and cuOccupancyMaxActiveClusters sizes); ``stream`` where it is
    launched."""
    drv = driver()
    lc = drv.CUlaunchConfig()
    lc.gridDimX, lc.gridDimY, lc.gridDimZ = cfg.grid
    lc.blockDimX, lc.blockDimY, lc.blockDimZ = cfg.block
    lc.sharedMemBytes = cfg.smem_bytes
    if stream is not None:
        lc.hStream = drv.CUstream(stream)
    attr = drv.CUlaunchAttribute()
    attr.id = drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z = cfg.cluster
    lc.attrs = [attr]
    lc.numAttrs = 1
    return lc


_ACTIVE_CLUSTERS: dict[tuple[int, int, int], int] = {}


def max_active_clusters(kernel: LoadedKernel, threads: int, cluster_ctas: int) -> int:
    """Clusters of ``cluster_ctas`` CTAs of ``threads`` threads that ``kernel`` can run at once on
    its device (``cuOccupancyMaxActiveClusters``; cached). A persistent launch of more clusters
    runs the rest in a second wave: on the H200, 2x2 clusters of the 216 KB sm_90a BF16 kernel fit
    30 at a time (120 of 132 SMs), and a grid of 33 took 2.1 ms where one wave takes 1.3."""
    key = (kernel.handle, threads, cluster_ctas)
    if key not in _ACTIVE_CLUSTERS:
        one = (cluster_ctas, 1, 1)   # one cluster: the grid the occupancy query asks about
        lc = _cluster_config(LaunchConfig(grid=one, block=(threads, 1, 1), cluster=one,
                                          smem_bytes=kernel.smem_bytes))
        n = check(driver().cuOccupancyMaxActiveClusters(kernel.function, lc),
                  f"cuOccupancyMaxActiveClusters({kernel.name}, {cluster_ctas} CTAs)")
        _ACTIVE_CLUSTERS[key] = max(1, int(n))
    return _ACTIVE_CLUSTERS[key]


def prepare(kernel: LoadedKernel, cfg: LaunchConfig) -> Callable[[ParamBuffer, int], None]:
    """``go(params, stream)``: launches of ``kernel`` with ``cfg``, checked once here.

    The host fast paths launch one geometry many times, so the fit checks run when the launch
    is prepared, and the driver is called without ctypes' per-argument conversion: the handle
    and the argument array go as ready pointer objects, the dimensions as plain ints (all below
    2**31: grid and block limits, shared memory <= 228 KiB). ~0.5 us less per call than
    :func:`launch`.
    """
    _check_fits(kernel, cfg)
    raw = _direct_launch(prototyped=False) if not cfg.clustered else None
    if raw is None:
        return lambda params, stream: launch(kernel, cfg, params, stream)
    handle = ctypes.c_void_p(kernel.handle)
    (gx, gy, gz), (bx, by, bz), smem = cfg.grid, cfg.block, cfg.smem_bytes
    streams: dict[int, ctypes.c_void_p] = {}

    def go(params: ParamBuffer, stream: int) -> None:
        s = None
        if stream:
            s = streams.get(stream)
            if s is None:
                if len(streams) >= 64:
                    streams.clear()
                s = streams[stream] = ctypes.c_void_p(stream)
        err = raw(handle, gx, gy, gz, bx, by, bz, smem, s, params.argv, None)
        if err:
            check((driver().CUresult(err),), f"cuLaunchKernel({kernel.name})")
    return go


def launch(kernel: LoadedKernel, cfg: LaunchConfig, params: ParamBuffer, stream: int) -> None:
    """Enqueue ``kernel`` on ``stream`` (a raw CUstream handle as int; 0 = legacy default)."""
    _check_fits(kernel, cfg)
    if not cfg.clustered:
        fn = _direct_launch()
        if fn is not None:
            err = fn(kernel.handle, *cfg.grid, *cfg.block, cfg.smem_bytes, stream or None,
                     params.argv_address, None)
            if err:
                check((driver().CUresult(err),), f"cuLaunchKernel({kernel.name})")
            return
        drv = driver()
        check(drv.cuLaunchKernel(kernel.function, *cfg.grid, *cfg.block, cfg.smem_bytes, stream,
                                 params.argv_address, 0), f"cuLaunchKernel({kernel.name})")
        return
    check(driver().cuLaunchKernelEx(_cluster_config(cfg, stream), kernel.function, params.argv_address, 0),
          f"cuLaunchKernelEx({kernel.name}, cluster={cfg.cluster})")
