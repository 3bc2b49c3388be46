"""Cubin bytes -> loaded CUfunction, per CUDA context, with the launch attributes set.

:class:`ModuleCache` is an object with an owner (an op, or the per-process default that
the ops share, created on first use): nothing here touches CUDA at import time. Modules
are keyed by (context, cache key, kernel name), so the same cubin loaded under two devices
gives two modules, and a cubin is loaded once per context.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

from ..base.errors import FusegemmError, ToolchainError


class CudaError(FusegemmError, RuntimeError):
    """A CUDA driver call failed (message names the call and the CUresult)."""


def driver():
    try:
        from cuda.bindings import driver as drv
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ToolchainError("cuda-bindings is not installed (pip install cuda-bindings)") from exc
    return drv


def check(result, what: str):
    """Unwrap a cuda-bindings ``(CUresult, *values)`` tuple or raise :class:`CudaError`."""
    err = result[0]
    if int(err) != 0:
        drv = driver()
        name = drv.cuGetErrorName(err)
        label = name[1].decode() if int(name[0]) == 0 else repr(err)
        raise CudaError(f"{what} failed: {label}")
    if len(result) == 1:
        return None
    return result[1] if len(result) == 2 else result[1:]


def memset32(ptr: int, bits: int, words: int, stream: int) -> None:
    """``words`` 32-bit words at device address ``ptr`` set to ``bits``, on ``stream``."""
    check(driver().cuMemsetD32Async(ptr, bits, words, stream), "cuMemsetD32Async")


_init_lock = threading.Lock()
_initialized = False


def ensure_context(device: int) -> int:
    """Make a context current for ``device`` (torch's primary context if torch made one).

    Returns the context handle as an int. The device primary context is what the runtime
    API (torch, CuPy) uses, so retaining it shares allocations with them.
    """
    global _initialized
    drv = driver()
    with _init_lock:
        if not _initialized:
            check(drv.cuInit(0), "cuInit")
            _initialized = True
    ctx = check(drv.cuCtxGetCurrent(), "cuCtxGetCurrent")
    if ctx is not None and int(ctx) != 0:
        dev = check(drv.cuCtxGetDevice(), "cuCtxGetDevice")
        if int(dev) == device:
            return int(ctx)
    dev = check(drv.cuDeviceGet(device), f"cuDeviceGet({device})")
    ctx = check(drv.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
    check(drv.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    return int(ctx)


_thread = threading.local()


def thread_context(device: int) -> None:
    """Make ``device``'s context current in the calling thread, once per thread and device.

    A thread the op did not start in has no current context until torch (or anything else)
    makes one, and cuTensorMapEncodeTiled, cuMemsetD32Async and cuLaunchKernel need one: an
    ``execute()`` from a fresh worker thread failed with CUDA_ERROR_INVALID_CONTEXT without this.
    A thread-local read per call (~0.05 us) instead of a cuCtxGetCurrent round trip.
    """
    if getattr(_thread, "device", None) != device:
        ensure_context(device)
        _thread.device = device


@dataclass(frozen=True)
class LoadedKernel:
    """A kernel ready to launch in one context."""

    function: object       # CUfunction
    module: object         # CUmodule (kept alive with the function)
    handle: int            # the CUfunction as an integer (direct driver calls)
    name: str
    smem_bytes: int
    context: int
    device: int
    max_cluster_ctas: int = 1   # largest launch cluster the kernel was loaded for


def device_attribute(device: int, name: str) -> int:
    """An integer ``CUdevice_attribute`` (e.g. ``MULTIPROCESSOR_COUNT``) of ``device``."""
    drv = driver()
    attr = getattr(drv.CUdevice_attribute, f"CU_DEVICE_ATTRIBUTE_{name}")
    dev = check(drv.cuDeviceGet(device), f"cuDeviceGet({device})")
    return int(check(drv.cuDeviceGetAttribute(attr, dev), f"cuDeviceGetAttribute({name})"))


def device_name(device: int) -> str:
    """The device's model name as the driver reports it (``NVIDIA H200``): what tuning records
    and first-run verification passes are kept per."""
    drv = driver()
    dev = check(drv.cuDeviceGet(device), f"cuDeviceGet({device})")
    raw = check(drv.cuDeviceGetName(64, dev), "cuDeviceGetName")
    return raw.split(b"\0", 1)[0].decode()


class ModuleCache:
    """Loaded modules by (context, key, kernel name). Thread-safe; owned by its creator."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loaded: dict[tuple[int, str, str], LoadedKernel] = {}

    def get(self, cubin: bytes, kernel_name: str, *, key: str, smem_bytes: int,
            device: int, max_cluster_ctas: int = 1) -> LoadedKernel:
        """The kernel loaded in ``device``'s context (loaded once per context).

        ``max_cluster_ctas``: the largest launch cluster the kernel's contract allows; above
        the portable 8 CTAs the function is marked non-portable-cluster-capable at load.
        """
        ctx = ensure_context(device)
        k = (ctx, key, kernel_name)
        hit = self._loaded.get(k)
        if hit is not None:
            return hit
        with self._lock:
            hit = self._loaded.get(k)
            if hit is None:
                hit = _load(cubin, kernel_name, smem_bytes, ctx, device, max_cluster_ctas)
                self._loaded[k] = hit
        return hit

    def __len__(self) -> int:
        return len(self._loaded)


# Clusters of more than this many CTAs need CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED.
PORTABLE_CLUSTER_CTAS = 8


def _load(cubin: bytes, kernel_name: str, smem_bytes: int, ctx: int, device: int,
          max_cluster_ctas: int) -> LoadedKernel:
    drv = driver()
    optin = device_attribute(device, "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN")
    if smem_bytes > optin:
        raise CudaError(f"kernel {kernel_name} needs {smem_bytes} bytes of dynamic shared memory; "
                        f"device {device} allows at most {optin} per block")
    module = check(drv.cuModuleLoadData(cubin), f"cuModuleLoadData({kernel_name})")
    fn = check(drv.cuModuleGetFunction(module, kernel_name.encode()),
               f"cuModuleGetFunction({kernel_name})")
    check(drv.cuFuncSetAttribute(
        fn, drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem_bytes),
        f"cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES={smem_bytes})")
    if max_cluster_ctas > PORTABLE_CLUSTER_CTAS:
        # sm_100a kernels take clusters of up to 16 CTAs (4x4); without this attribute the
        # launch of such a cluster fails (CUDA_ERROR_CLUSTER_SIZE...).
        check(drv.cuFuncSetAttribute(
            fn, drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1),
            "cuFuncSetAttribute(NON_PORTABLE_CLUSTER_SIZE_ALLOWED=1)")
    return LoadedKernel(function=fn, module=module, handle=int(fn), name=kernel_name,
                        smem_bytes=smem_bytes, context=ctx, device=device,
                        max_cluster_ctas=max_cluster_ctas)


_default: ModuleCache | None = None


def default_modules() -> ModuleCache:
    """The per-process module cache the ops share (created on first use)."""
    global _default
    if _default is None:
        _default = ModuleCache()
    return _default
