"""Framework interop for the public wrappers: DLPack producers in, the caller's array type out.

A wrapper call whose arguments are torch tensors, host numpy arrays (refused later by the
device rule) or plain values goes straight to the op: one ``isinstance`` per argument. A call
with any other argument that has ``__dlpack__`` (a JAX or CuPy array, ...) is *foreign*:

1. Launch stream: ``current_stream`` when given, else torch's current stream on the array's
   device. The call runs with that stream current in torch, so every DLPack exchange below
   synchronises with the stream the kernel runs on.
2. Inputs: every argument with ``__dlpack__`` that is not a torch tensor is imported with
   ``torch.from_dlpack`` (zero copy); the producer makes its data ready on the launch stream
   (the DLPack stream handshake: CuPy waits on its current stream, JAX on the array's ready
   event). The imported buffers are kept alive until the launch stream has passed the kernel,
   so the caller may drop its arrays right after the call.
3. Outputs: when ``a_tensor`` itself is foreign, each is handed to its framework (``jax.dlpack.from_dlpack``, or the
   ``from_dlpack`` of the array's top-level module, e.g. ``cupy.from_dlpack``). A consumer that
   names its stream gets a stream-ordered hand-over; one that does not gets outputs whose
   kernel has finished (the launch stream is synchronised first). An output dtype the
   framework cannot represent (CuPy has no bfloat16 or FP8) stays a torch tensor.

torch is required for foreign calls: outputs come from its stream-ordered allocator.
"""
from __future__ import annotations

import collections
import contextlib
import functools
import inspect
import sys
import threading
from typing import Any, Callable

from .tensors import require_torch, resolve_stream

_KDL_CUDA = 2      # DLDeviceType of CUDA memory
_pending: collections.deque = collections.deque()   # (event, imported tensors) in launch order
_lock = threading.Lock()


def foreign(x: Any) -> bool:
    """An array fusegemm imports through DLPack: not torch, not a host numpy array."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        return False    # first: the common case costs one isinstance
    return x is not None and hasattr(x, "__dlpack__") and type(x).__module__ != "numpy"


def framework(x: Any) -> str:
    """Top-level package that produced ``x`` ("jax" for jaxlib arrays)."""
    root = type(x).__module__.split(".", 1)[0]
    return "jax" if root in ("jax", "jaxlib") else root


def dlpack_io(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Give a public wrapper the foreign-call path described in the module docstring."""
    sig = inspect.signature(fn)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        torch = sys.modules.get("torch")
        native = torch.Tensor if torch is not None else ()
        for v in (*args, *kwargs.values()):
            if v is not None and not isinstance(v, native) and foreign(v):
                return _foreign_call(fn, sig, args, kwargs)
        return fn(*args, **kwargs)

    return wrapper


def _foreign_call(fn: Callable[..., Any], sig: inspect.Signature, args: tuple, kwargs: dict) -> Any:
    bound = sig.bind(*args, **kwargs)
    a = bound.arguments["a_tensor"]
    first = a if foreign(a) else next(v for v in bound.arguments.values() if foreign(v))
    torch = require_torch(f"got a {type(first).__module__}.{type(first).__name__} argument: arrays from other "
                          f"frameworks are imported through torch's DLPack support and outputs come from "
                          f"torch's allocator", "install torch, or pass torch tensors")
    kind, device = (a if isinstance(a, torch.Tensor) else first).__dlpack_device__()
    if int(kind) != _KDL_CUDA:
        # Host (or other) memory: import as is and let the op's device check name it.
        for name, value in bound.arguments.items():
            if foreign(value):
                bound.arguments[name] = torch.from_dlpack(value)
        return fn(*bound.args, **bound.kwargs)
    device = int(device)
    raw = resolve_stream(bound.arguments.get("current_stream"), device)
    with torch.cuda.device(device), _current(torch, raw, device) as stream:
        imported = []
        for name, value in bound.arguments.items():
            if foreign(value):
                t = torch.from_dlpack(value)        # handshake with the launch stream
                bound.arguments[name] = t
                imported.append(t)
        out = fn(*bound.args, **bound.kwargs)
        _hold(torch, imported, stream)
        return _export(out, framework(a), stream) if foreign(a) else out


@contextlib.contextmanager
def _current(torch: Any, raw: int, device: int):
    """Make ``raw`` torch's current stream for the call (the DLPack handshakes use it)."""
    cur = torch.cuda.current_stream(device)
    if cur.cuda_stream == raw:
        yield cur
        return
    stream = torch.cuda.ExternalStream(raw, device=device)
    with torch.cuda.stream(stream):
        yield stream


def _hold(torch: Any, tensors: list, stream: Any) -> None:
    """Keep imported buffers alive until ``stream`` passes this point (the producer may free
    them as soon as the call returns; its allocator does not know about our stream)."""
    if not tensors or torch.cuda.is_current_stream_capturing():
        return   # a captured graph reads them at replay: the caller keeps them, as for any capture
    ev = torch.cuda.Event()
    ev.record(stream)
    with _lock:
        _pending.append((ev, tensors))
        while _pending and _pending[0][0].query():
            _pending.popleft()


class _Handover:
    """An output offered to a DLPack consumer: a consumer that names its stream is ordered
    after the kernel by torch's handshake; one that names none gets a finished kernel."""

    def __init__(self, t: Any, stream: Any) -> None:
        self.t, self.stream = t, stream

    def __dlpack_device__(self) -> tuple:
        return self.t.__dlpack_device__()

    def __dlpack__(self, stream: Any = None, **kw: Any) -> Any:
        if stream is None:
            self.stream.synchronize()
        return self.t.__dlpack__(stream=stream, **kw)


def _export(out: Any, kind: str, stream: Any) -> Any:
    if kind == "jax":
        import jax.dlpack
        consume = jax.dlpack.from_dlpack
    else:
        consume = getattr(sys.modules.get(kind), "from_dlpack", None)
    if consume is None:
        return out

    def one(t: Any) -> Any:
        if t is None:
            return None
        try:
            return consume(_Handover(t, stream))
        except (BufferError, TypeError, ValueError, RuntimeError, NotImplementedError):
            return t    # a dtype the framework cannot hold (CuPy: bfloat16, FP8): stays torch
    return type(out)(**{k: one(v) for k, v in out.items()})   # the wrappers' TupleDict
