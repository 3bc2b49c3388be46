"""Caller-owned outputs of an op (``Op.execute``, the seed classes): each checked against the buffer
the kernel writes, no output overlapping another or an input; the fill patterns of the
reductions the kernels accumulate into with atomics (the engine resets them on the launch stream,
fusegemm/ops/prepared_launch.py).
"""
from __future__ import annotations

from typing import Any

from ..base.errors import ArgumentError

# 32-bit fill patterns of the reductions the kernels accumulate into with atomics.
RESET_BITS = {"amax": 0xFF800000, "dprob": 0, "dbias": 0}     # -inf, +0.0, +0.0


def extent(v: Any) -> int:
    """The offset of the last byte a view touches from its first (-1: it touches none)."""
    span = sum((d - 1) * abs(s) for d, s in zip(v.shape, v.strides) if d > 0) if v.numel() else -1
    return (span + 1) * max(v.itemsize, 1) - 1


def _extent(v: Any) -> tuple[int, int]:
    """[first, last] byte addresses a view touches."""
    return v.ptr, v.ptr + extent(v)


def _squeezed(shape: Any) -> list[int]:
    """Extents other than 1: the seed's (M, N, 1) and the kernel's (M, N) hold the same data."""
    return [int(d) for d in shape if d != 1]


# Outputs the kernel writes as raw bytes: FP8, E8M0 / int8 scales, packed FP4 (uint8 or
# torch.float4_e2m1fn_x2, the seeds' two spellings).
_BYTE_DTYPES = ("float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu", "int8", "float4_e2m1fn_x2")


def as_bytes(t: Any) -> Any:
    """A torch output of a byte dtype viewed as the uint8 bytes the kernel writes."""
    import torch
    return t.view(torch.uint8) if str(t.dtype).removeprefix("torch.") in _BYTE_DTYPES else t


def native_output(x: Any, name: str, shape: tuple[int, ...], store: str, m_major_view: bool = False) -> Any:
    """The caller's output ``x`` (seed layout) as the dense buffer the kernel writes: C/D
    ``(M, N[, 1])`` rows, FP8 as its bytes, SF as the physical atoms, amax ``(L, slots[, 1])``,
    dprob ``(M[, 1, 1])``; ``m_major_view``: 1x128 scales, whose ``(M, ceil(N/128))`` view (unit
    stride along M, as the op returns them) stands for the ``(ceil(N/128), pitch)`` buffer."""
    from ..runtime.tensors import TensorView, dense_strides, view
    if x is None:
        raise ArgumentError(name, None, f"a tensor (the kernel writes {shape} {store} here)")
    if type(x) is TensorView:   # a buffer described already (an XLA result): exactly the kernel's
        if tuple(x.shape) != tuple(shape) or x.dtype != store or tuple(x.strides) != dense_strides(tuple(shape)):
            raise ArgumentError(name, x, f"a dense {shape} {store} buffer (the layout the kernel writes)")
        return x
    from ..formats.scales import sf_from_kernel_view
    v = view(x, name)
    t = x
    if m_major_view and v.ndim == 2 and tuple(v.strides) == (1, shape[1]) and v.shape[1] == shape[0] \
            and v.shape[0] <= shape[1]:
        t = t.as_strided(shape, (shape[1], 1))     # 1x128 scales' (M, ceil(N/128)) view -> (ceil(N/128), pitch)
    if len(shape) == 6 and v.ndim == 6 and tuple(v.shape[3:]) != (32, 4, 4):
        t = sf_from_kernel_view(t)                       # kernel-facing SF view -> physical atoms
    t = as_bytes(t)
    if tuple(t.shape) != tuple(shape) and _squeezed(t.shape) == _squeezed(shape):
        try:
            t = t.view(shape)                            # (M, N, 1) -> (M, N), (M, 1, 1) -> (M,), ...
        except RuntimeError:
            raise ArgumentError(f"{name}.stride", tuple(v.strides), "the dense layout the kernel writes "
                                "(as the wrapper returns it)") from None
    got = view(t, name)
    if tuple(got.shape) != tuple(shape):
        raise ArgumentError(f"{name}.shape", tuple(v.shape), f"the layout the kernel writes ({shape} {store}, "
                            "or its seed view)")
    if got.dtype != store:
        raise ArgumentError(f"{name}.dtype", v.dtype, f"{store} storage (the op's output dtype)")
    if not t.is_contiguous():
        raise ArgumentError(f"{name}.stride", tuple(v.strides), "the dense layout the kernel writes "
                            "(as the wrapper returns it)")
    return got


def check_no_overlap(outputs: list[tuple[str, Any]], inputs: list[Any]) -> None:
    """No output shares memory with a later output or with an input (named by the first)."""
    for i, (name, v) in enumerate(outputs):
        lo, hi = _extent(v)
        for other, w in outputs[i + 1:]:
            wlo, whi = _extent(w)
            if lo <= whi and wlo <= hi:
                raise ArgumentError(name, "memory shared with " + other, "its own buffer")
        for inp in inputs:
            if inp is None:
                continue
            ilo, ihi = _extent(inp)
            if lo <= ihi and ilo <= hi:
                raise ArgumentError(name, "memory shared with an input", "its own buffer (outputs may not "
                                    "alias inputs)")
