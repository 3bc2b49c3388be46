"""Tensor adapter: what an op needs to know about an argument, whatever produced it.

torch tensors take the fast path (attribute reads only). Any other object exposing
``__cuda_array_interface__`` (CuPy, Numba, ...) is described from the interface dict;
objects exposing only ``__dlpack__`` (JAX eager arrays, ...) are wrapped with
``torch.from_dlpack`` (zero copy) when torch is available. Strides are in elements.

Streams: ``None`` means torch's current stream on the tensor's device (the legacy default
stream without torch); ints are raw ``CUstream`` handles; objects with ``cuda_stream``
(torch.cuda.Stream), ``__cuda_stream__`` (cuda.core) or ``getPtr`` / ``int()``
(cuda-bindings ``CUstream``) are accepted.
"""
from __future__ import annotations

import sys
from typing import Any

from ..base.errors import ArgumentError, UnsupportedError

from ..base.dtypes import BY_TYPESTR, DTYPES

class TensorView:
    """Shape, strides (elements), dtype name, device and address of one argument.

    A plain slotted class (not a frozen dataclass): it is built for every argument of every
    call, and construction cost is host overhead per launch.
    """

    __slots__ = ("ptr", "shape", "strides", "dtype", "device", "obj")

    def __init__(self, ptr: int, shape: tuple[int, ...], strides: tuple[int, ...], dtype: str,
                 device: tuple[str, int], obj: Any) -> None:
        self.ptr, self.shape, self.strides, self.dtype, self.device, self.obj = (
            ptr, shape, strides, dtype, device, obj)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def itemsize(self) -> int:
        d = DTYPES.get(self.dtype)
        return d.itemsize if d is not None else 0

    @property
    def is_cuda(self) -> bool:
        return self.device[0] == "cuda"

    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    def __repr__(self) -> str:
        return (f"TensorView(shape={tuple(self.shape)}, strides={self.strides}, "
                f"dtype={self.dtype}, device={self.device})")


def _torch():
    return sys.modules.get("torch")


_torch_dtypes: dict[Any, str] | None = None
_CPU = ("cpu", -1)


def _torch_dtype_names(torch: Any) -> dict[Any, str]:
    # torch spells every table dtype it has by the table's name (torch.bfloat16, torch.uint8...)
    global _torch_dtypes
    if _torch_dtypes is None:
        _torch_dtypes = {getattr(torch, name): name for name in DTYPES if hasattr(torch, name)}
    return _torch_dtypes


def is_torch(x: Any) -> bool:
    torch = _torch()
    return torch is not None and isinstance(x, torch.Tensor)


def view(x: Any, name: str) -> TensorView:
    """Describe argument ``name``; raise :class:`ArgumentError` for unsupported objects."""
    torch = _torch()
    if torch is not None and isinstance(x, torch.Tensor):
        dt = _torch_dtype_names(torch).get(x.dtype) or str(x.dtype).removeprefix("torch.")
        # Not "cpu" for every non-CUDA tensor: a meta (or mps, xpu...) tensor is named as what it is.
        dev = ("cuda", x.get_device()) if x.is_cuda else _CPU if x.device.type == "cpu" else (x.device.type, -1)
        if type(x) is torch.Tensor or not _is_fake(x):
            return TensorView(x.data_ptr(), x.shape, x.stride(), dt, dev, x)
        # A fake tensor (a custom op's fake implementation under torch.compile) has no storage,
        # and its sizes may be symbolic: int() specialises them (a guard, so a new size
        # recompiles) because the checks and the output shapes need plain integers.
        return TensorView(0, tuple(int(d) for d in x.shape), tuple(int(d) for d in x.stride()), dt, dev, x)
    if type(x) is TensorView:    # already described (XLA FFI buffers, fusegemm/jax_ffi.py)
        return x
    if type(x).__module__ == "numpy" and hasattr(x, "__array_interface__"):
        return _from_numpy(x, name)
    try:
        cai = getattr(x, "__cuda_array_interface__", None)
    except Exception:   # noqa: BLE001 -- JAX raises for dtypes CAI cannot spell (bfloat16): use DLPack
        cai = None
    if cai is not None:
        return _from_cai(x, cai, name)
    if hasattr(x, "__dlpack__"):
        if torch is None:
            raise ArgumentError(name, type(x).__name__, "a torch tensor or an object with "
                                "__cuda_array_interface__", "DLPack-only inputs need torch "
                                "installed (they are wrapped with torch.from_dlpack)")
        return view(torch.from_dlpack(x), name)
    raise ArgumentError(name, type(x).__name__, "a torch tensor, or an object with "
                        "__cuda_array_interface__ or __dlpack__")


def require_torch(why: str, fix: str = "install torch") -> Any:
    """The torch module, or UnsupportedError saying ``why`` fusegemm needs it here and the ``fix``."""
    try:
        import torch
    except ImportError:
        raise UnsupportedError(f"{why}; {fix}") from None
    return torch


def _is_fake(x: Any) -> bool:
    from torch._subclasses.fake_tensor import is_fake
    return is_fake(x)


def _from_numpy(x: Any, name: str) -> TensorView:
    """A host numpy array (the references validate their arguments with the ops' rules)."""
    dt = x.dtype.name  # numpy's and ml_dtypes' names are the table's
    if dt not in DTYPES:
        raise ArgumentError(f"{name}.dtype", repr(x.dtype.name), ", ".join(DTYPES))
    item = x.dtype.itemsize
    strides = tuple(s // item if s % item == 0 else s for s in x.strides)
    return TensorView(int(x.__array_interface__["data"][0]), tuple(x.shape), strides, dt, _CPU, x)


def _from_cai(x: Any, cai: dict, name: str) -> TensorView:
    shape = tuple(int(d) for d in cai["shape"])
    typestr = cai["typestr"]
    dtype = BY_TYPESTR.get(typestr)
    if dtype is None:
        # CuPy has no bfloat16; ml_dtypes-backed arrays report a 2-byte void type.
        raise ArgumentError(f"{name}.dtype", repr(typestr), ", ".join(sorted(BY_TYPESTR)))
    item = DTYPES[dtype].itemsize
    if cai.get("strides") is None:
        strides_t = dense_strides(shape)
    else:
        bs = tuple(int(s) for s in cai["strides"])
        if any(s % item for s in bs):
            raise ArgumentError(f"{name}.strides", bs, f"multiples of the {item}-byte element")
        strides_t = tuple(s // item for s in bs)
    ptr = int(cai["data"][0])
    return TensorView(ptr=ptr, shape=shape, strides=strides_t, dtype=dtype,
                      device=("cuda", pointer_device(ptr) if ptr else -1), obj=x)


def dense_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Strides (elements) of a C-contiguous array of ``shape``."""
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= d
    return tuple(reversed(out))


def pointer_device(ptr: int) -> int:
    """CUDA device ordinal owning ``ptr`` (driver query; used only for non-torch inputs)."""
    from .load import check, driver
    drv = driver()
    attr = drv.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
    return int(check(drv.cuPointerGetAttribute(attr, ptr), "cuPointerGetAttribute"))


def resolve_stream(stream: Any, device: int) -> int:
    """Raw ``CUstream`` handle (int) for ``stream`` on ``device``."""
    if stream is None:
        torch = _torch()
        if torch is None:
            return 0
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        if raw is not None:
            return int(raw(device))
        return int(torch.cuda.current_stream(device).cuda_stream)
    if isinstance(stream, bool):
        raise ArgumentError("current_stream", stream, "None, a stream object or a raw handle")
    if isinstance(stream, int):
        if stream < 0:
            raise ArgumentError("current_stream", stream, "a non-negative CUstream handle")
        return stream
    handle = getattr(stream, "cuda_stream", None)           # torch.cuda.Stream
    if isinstance(handle, int):
        return handle
    proto = getattr(stream, "__cuda_stream__", None)         # cuda.core Stream
    if callable(proto):
        return int(proto()[1])
    get_ptr = getattr(stream, "getPtr", None)                # cuda-bindings CUstream
    if callable(get_ptr):
        return int(stream)
    raise ArgumentError("current_stream", type(stream).__name__,
                        "None (torch's current stream), an int handle, torch.cuda.Stream, "
                        "a cuda.core Stream or a cuda.bindings CUstream")


def is_capturing(stream: int) -> bool:
    """True when ``stream`` is capturing a CUDA graph (offsets must not be read back then)."""
    torch = _torch()
    if torch is not None and torch.cuda.is_available():
        try:
            if torch.cuda.is_current_stream_capturing():
                return True
        except RuntimeError:
            pass
    from .load import check, driver
    drv = driver()
    status = check(drv.cuStreamIsCapturing(drv.CUstream(stream)), "cuStreamIsCapturing")
    return int(status) != int(drv.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE)
