"""What the kernels need of an argument beyond the seed contract (fusegemm/arguments.py):
strides, alignment, devices, and the plain option types of the op signatures.

Every failure is an :class:`ArgumentError` naming the argument, what was received and what is
allowed, raised before anything is launched.
"""
from __future__ import annotations

from typing import Any

from ..base.errors import ArgumentError
from ..formats.numpy_dtypes import dtype_name
from ..runtime.tensors import TensorView


def dtype_arg(value: Any, name: str, allowed: tuple[str, ...]) -> str:
    """Canonical dtype name of a dtype argument (torch/numpy dtype or string)."""
    got = dtype_name(value) if value is not None else None
    if got is None or got not in allowed:
        raise ArgumentError(name, repr(value), ", ".join(allowed))
    return got


def pair_arg(value: Any, name: str) -> tuple[int, int]:
    """A (tile or cluster) pair of ints."""
    try:
        a, b = value
        a, b = int(a), int(b)
    except (TypeError, ValueError):
        raise ArgumentError(name, repr(value), "a pair of ints, e.g. (128, 256)") from None
    return a, b


def bool_arg(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise ArgumentError(name, repr(value), "True or False")
    return value


def unit_stride(v: TensorView, name: str) -> None:
    """A vector read with unit stride (one element per row / expert)."""
    if v.shape[0] > 1 and v.strides[0] != 1:
        raise ArgumentError(f"{name}.stride", v.strides, "unit stride along the first dimension",
                            f"pass {name}.contiguous()")


def aligned(v: TensorView, name: str, nbytes: int = 16) -> None:
    if v.ptr % nbytes:
        raise ArgumentError(f"{name}.data_ptr", hex(v.ptr), f"a multiple of {nbytes} bytes",
                            "TMA and vector stores need aligned bases; slice offsets break it")


def row_pitch_aligned(stride: int, itemsize: int, name: str, nbytes: int = 16) -> None:
    if (stride * itemsize) % nbytes:
        raise ArgumentError(name, stride, f"a row stride that is a multiple of {nbytes} bytes "
                            f"({nbytes // itemsize} elements)")


def require_cuda(v: TensorView, name: str) -> int:
    if not v.is_cuda:
        raise ArgumentError(f"{name}.device", _dev(v.device), "a CUDA device")
    return v.device[1]


def same_device(views: list[tuple[str, TensorView]], device: tuple[str, int]) -> None:
    for name, v in views:
        if v.device != device:
            raise ArgumentError(f"{name}.device", _dev(v.device), _dev(device),
                                "every tensor must be on a_tensor's device")


def _dev(d: tuple[str, int]) -> str:
    return d[0] if d[1] < 0 else f"{d[0]}:{d[1]}"


def row_ends(value: Any, experts: int) -> TensorView | None:
    """The optional ``row_ends`` of a grouped or K-grouped call: int32 (L,), unit stride, where
    each expert's tokens end inside its padded range (its values live on the device, unchecked,
    and clamped there to the expert's range: fusegemm/scheduler.cuh)."""
    if value is None:
        return None
    from .. import arguments as args
    v = args.tensor(value, "row_ends", ndims=(1,), dtypes=("int32",))
    if v.shape[0] != experts:
        raise ArgumentError("row_ends.shape[0]", v.shape[0], f"{experts} (one per expert, as padded_offsets)")
    unit_stride(v, "row_ends")
    return v


def row_index(index: Any, name: str, rows_are: str, equal: tuple[int, str] | None = None) -> TensorView:
    """The int32 (R,) index of a gathered operand (one entry per row of the problem; an entry
    outside the operand's rows reads zeros): R a multiple of M_ALIGNED (``rows_are`` says what R
    counts) and, with ``equal`` (R, what), that R; unit stride."""
    from .. import arguments as args
    idx = args.tensor(index, name, ndims=(1,), dtypes=("int32",))
    n = idx.shape[0]
    if equal is not None and n != equal[0]:
        raise ArgumentError(f"{name}.shape[0]", n, f"{equal[0]} ({equal[1]})")
    if n % args.M_ALIGNED:
        raise ArgumentError(f"{name}.shape[0]", n, f"a multiple of {args.M_ALIGNED} ({rows_are})")
    unit_stride(idx, name)
    return idx


def a_operand(a_tensor: Any, a_index: Any, dtypes: tuple[str, ...]) -> tuple[Any, int, int, int, bool, Any]:
    """A of an M-grouped op: ``(M, K)`` (or ``(M, K, 1)``) rows, or (gathered A, ``a_index`` given) a
    token-major ``(T, K)`` matrix and its int32 (M,) index (:func:`row_index`); (A, M, K as stored, A's
    rows, canonical, index or None)."""
    from .. import arguments as args
    if a_index is None:
        r = args.rows(a_tensor, dtypes)
        return r.a, r.m, r.k_stored, r.m, r.canonical, None
    a = args.tensor(a_tensor, "a_tensor", ndims=(2,), dtypes=dtypes)
    a_rows, k = a.shape
    idx = row_index(a_index, "a_index", "the problem's padded rows")
    if a_rows == 0:
        raise ArgumentError("a_tensor.shape[0]", 0, "at least 1 (the rows a_index reads; an index outside them "
                                                     "reads zeros)")
    return a, idx.shape[0], k, a_rows, True, idx
