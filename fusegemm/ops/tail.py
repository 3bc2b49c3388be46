"""Zeros past the last padded offset, written on the device.

A grouped GEMM stores every row of its row-major outputs (C, D, D_col) below
``valid_m = min(padded_offsets[-1], m_rows)`` and none at or past it, where the ops promise zeros.
The host cannot size that tail without reading the offsets back (a sync, and impossible while a
CUDA graph captures), so the ops used to fill whole outputs before the launch; on the H200 that
fill cost 3-22% of the K-grouped weight gradients' time (``bench/wgrad.py --fill-ab``) and 5-12%
of the MoE layer's step (``bench/moe_mlp.py --fill-ab``). Now the outputs are allocated uninitialised
(``alloc_outputs(..., rows_written=True)``) and :func:`zero_tail` launches one small kernel
(``templates/include/fusegemm/zero_tail.cuh``) that reads the last offset on the device and zeroes
only the tail rows of up to four buffers.

The kernel is compiled with NVRTC on first use (about 0.1 s, no CUTLASS headers) and kept for the
process. Where NVRTC is unavailable (a process running from a kernel bundle only) or a row is not
a multiple of 16 bytes, the buffer is zeroed whole instead, as before.

Scattered outputs (``d_scatter``) have no tail: the rows to zero are the ones no stored problem row
names through ``d_index``. :func:`zero_unnamed` marks the named rows in a bitmask and zeroes the
others' rows (two launches from the same header, a few microseconds where the routing names every
row), where the whole buffers were filled before (0.16 ms of a 1.65 ms GEMM at the dsv3 layer's fc2
on an H100).
"""
from __future__ import annotations

import struct
from typing import Any, Iterable

from .small_kernels import SmallKernels

__all__ = ["prepare", "zero_tail", "zero_unnamed"]

_KERNEL = "fusegemm_zero_tail"
_UNNAMED_KERNELS = ("fusegemm_mark_named", "fusegemm_zero_unnamed")   # scattered outputs' (zero_unnamed)
_KERNELS = SmallKernels("fusegemm/zero_tail.cuh", "the tail-zeroing kernel", "outputs are zero-filled whole")
_MAX_BUFFERS = 4           # ZeroTailParams::kMaxBuffers
_THREADS = 256             # the kernel's __launch_bounds__
_MAX_BLOCKS = 1024         # grid-stride: enough to keep HBM busy on a full-buffer tail
# ZeroTailParams: base[4], row_bytes[4], offsets, num_experts, m_rows, row_ends (88 bytes, 8-aligned).
_PARAMS = struct.Struct("<4Q4qQiiQ")
# ZeroUnnamedParams: base[4], row_bytes[4], index, offsets, row_ends, named, num_experts, m_rows, d_rows,
# pad (112 bytes).
_UNNAMED = struct.Struct("<4Q4q4Q4i")


def _kernel(device: int) -> Any:
    """The loaded kernel for ``device``, or None where it cannot be compiled (logged once)."""
    return _KERNELS.function(device, _KERNEL)


def _rows16(b: Any, rows: int) -> int:
    """The bytes of each of ``b``'s ``rows`` rows where the kernels can zero them with 16-byte
    stores (a contiguous, 16-byte aligned buffer of 16-byte whole rows), else 0."""
    rb = b.numel() * b.element_size() // rows
    return rb if rb % 16 == 0 and b.data_ptr() % 16 == 0 and b.is_contiguous() else 0


def _four(values: list) -> list:
    """``values`` padded with zeros to the parameter structs' kMaxBuffers entries."""
    return values + [0] * (_MAX_BUFFERS - len(values))


def prepare(device: int, scattered: bool = False) -> bool:
    """Compile and load the tail kernel for ``device`` ahead of the first call, and the scattered
    outputs' two with ``scattered`` (the ops do it when they compile: a module load has no place
    inside a CUDA-graph capture). False where they are unavailable and outputs will be zero-filled
    whole.

    Parameters
    ----------
    device : int
        CUDA ordinal.
    scattered : bool
        Also the kernels of :func:`zero_unnamed` (an op with scattered outputs).
    """
    names = (_KERNEL, *_UNNAMED_KERNELS) if scattered else (_KERNEL,)
    return all(_KERNELS.function(device, name) is not None for name in names)


def zero_tail(buffers: Iterable[Any], offsets_ptr: int, experts: int, m_rows: int, stream: int,
              device: int, row_ends_ptr: int = 0) -> None:
    """Zero rows ``[min(padded_offsets[-1], m_rows), m_rows)`` of each of ``buffers`` (contiguous
    torch tensors of ``m_rows`` rows) on ``stream``. Call it before the op's launch: a buffer
    the kernel cannot serve is zeroed whole instead.

    Parameters
    ----------
    buffers : iterable of tensors
        Contiguous, ``m_rows`` rows each (C, D, D_col of an op's outputs).
    offsets_ptr : int
        Device address of padded_offsets (int32, ``experts`` values).
    experts : int
        L.
    m_rows : int
        Rows of every buffer.
    stream : int
        Raw CUstream handle.
    device : int
        CUDA ordinal.
    row_ends_ptr : int
        Device address of the op's row ends (int32, ``experts`` values; 0: none): each expert's
        rows past its row end are zeroed too (the kernel may skip their tiles).
    """
    bufs = [b for b in buffers if b.numel()]
    if not bufs or m_rows == 0:
        return
    direct, whole = [], []
    for b in bufs:
        rb = _rows16(b, m_rows)
        (direct if rb else whole).append((b, rb))
    if direct and _kernel(device) is None:
        whole += direct
        direct = []
    for b, _ in whole:
        b.zero_()   # torch's fill on torch's current stream, before the op's launch (as before)
    for i in range(0, len(direct), _MAX_BUFFERS):
        group = direct[i:i + _MAX_BUFFERS]
        base = _four([b.data_ptr() for b, _ in group])
        row_bytes = _four([rb for _, rb in group])
        blocks = min(_MAX_BLOCKS, max(1, -(-max(row_bytes) * m_rows // (16 * _THREADS))))
        _KERNELS.launch(device, _KERNEL, (blocks, len(group), 1), (_THREADS, 1, 1),
                        _PARAMS.pack(*base, *row_bytes, offsets_ptr, experts, m_rows, row_ends_ptr), stream)


def zero_unnamed(buffers: Iterable[Any], index_ptr: int, d_rows: int, offsets_ptr: int, experts: int, m_rows: int,
                 stream: int, device: int, row_ends_ptr: int = 0) -> bool:
    """Zero the rows of scattered outputs that no stored problem row names, on ``stream``, before
    the op's launch: row ``o`` of each buffer unless ``index[r] == o`` for a problem row ``r``
    below ``min(padded_offsets[-1], m_rows)`` and, with row ends, below its expert's row end.
    False (nothing done) where the kernels are unavailable or a buffer's rows are not 16-byte
    pieces: the caller zeroes the buffers whole.

    Parameters
    ----------
    buffers : iterable of tensors
        Contiguous, ``d_rows`` rows each (the scattered C and D).
    index_ptr : int
        Device address of d_index (int32, ``m_rows`` values).
    d_rows : int
        Rows of every buffer.
    offsets_ptr, experts, m_rows, row_ends_ptr
        As :func:`zero_tail` (``m_rows``: the problem's rows, d_index's length).
    stream : int
        Raw CUstream handle.
    device : int
        CUDA ordinal.
    """
    import torch

    from . import device as _device
    from ..runtime import load as _load
    bufs = [b for b in buffers if b.numel()]
    if not bufs or d_rows == 0:
        return True
    row_bytes = [_rows16(b, d_rows) for b in bufs]
    if len(bufs) > _MAX_BUFFERS or not all(row_bytes):
        return False
    if any(_KERNELS.function(device, k) is None for k in _UNNAMED_KERNELS):
        return False
    mark, zero = _UNNAMED_KERNELS
    words = -(-d_rows // 32)
    named = torch.empty(words, dtype=torch.int32, device=bufs[0].device)
    _device.record_stream(named, stream)   # (freed by the allocator after this stream's work)
    _load.memset32(named.data_ptr(), 0, words, stream)
    raw = _UNNAMED.pack(*_four([b.data_ptr() for b in bufs]), *_four(row_bytes), index_ptr, offsets_ptr, row_ends_ptr,
                        named.data_ptr(), experts, m_rows, d_rows, 0)
    if m_rows > 0 and experts > 0:
        _KERNELS.launch(device, mark, (min(_MAX_BLOCKS, -(-m_rows // _THREADS)), 1, 1), (_THREADS, 1, 1), raw, stream)
    _KERNELS.launch(device, zero, (min(_MAX_BLOCKS, -(-d_rows // (_THREADS // 32))), len(bufs), 1), (_THREADS, 1, 1),
                    raw, stream)
    return True
