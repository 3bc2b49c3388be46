"""The MoE layer's token permutations on the device, one memory pass each
(``templates/include/fusegemm/permute.cuh``): :func:`gather_rows` (expert-sorted rows from
token-major X, zeros for padding; given the routing's ``row_of`` as well, in token order: each
token's row read once) and :func:`sum_rows` (the combine: each token's sum over its k rows, in
choice order, in FP32). fusegemm/routing.py calls them through its torch custom ops.

On the H200 torch's route wrote every intermediate: a copy of X with a zero row appended before
``index_select``, and for the combine ``index_select`` into (T, k, H) and a sum over k, twice the
combine's bytes through memory. Each function returns None (nothing launched) where its kernel
does not serve the tensors (another device type or dtype, rows that are not 16-byte whole, or
no NVRTC): the caller runs torch's.
"""
from __future__ import annotations

import struct
from typing import Any

from .ops.small_kernels import SmallKernels

__all__ = ["gather_rows", "sum_rows", "route_rows"]

_KERNELS = SmallKernels("fusegemm/permute.cuh", "the token-permutation kernels",
                        "the MoE layer's gather and combine run torch's operations")
_THREADS = 256              # kPermuteThreads
_MAX_BLOCKS = 4096          # grid-stride over rows
# PermuteParams: src, dst, index, rows, src_rows, src_ld, dst_ld, vecs, k (64 bytes).
_PARAMS = struct.Struct("<QQQqqqqii")
# SpreadParams: PermuteParams, then row_of (72 bytes).
_SPREAD = struct.Struct("<QQQqqqqiiQ")
_SPREAD_SCAN = 32           # kSpreadScan: rows per item of the padding scan
# RouteParams: experts, offsets, row_of, token_of_row, n, rows, num_experts, k, row_ends (64 bytes).
_ROUTE = struct.Struct("<QQQQqqiiQ")
_ROUTE_MAX_EXPERTS = 256    # kRouteMaxExperts
_ROUTE_THREADS = 1024       # kRouteWarps * 32
_SUMS = {"torch.float32": "fusegemm_sum_rows_float32", "torch.bfloat16": "fusegemm_sum_rows_bfloat16",
         "torch.float16": "fusegemm_sum_rows_float16"}


def _rows_ok(t: Any) -> bool:
    """A CUDA matrix of 16-byte rows at 16-byte-aligned addresses (what the kernels read and write)."""
    row_bytes = t.shape[1] * t.element_size()
    return (t.is_cuda and t.dim() == 2 and t.stride(1) == 1 and row_bytes % 16 == 0 and row_bytes > 0
            and (t.stride(0) * t.element_size()) % 16 == 0 and t.data_ptr() % 16 == 0)


def _launch(name: str, src: Any, dst: Any, index: Any, k: int, row_of: Any = None) -> bool:
    rows = dst.shape[0]
    if rows == 0:
        return True
    es = src.element_size()
    fields = (src.data_ptr(), dst.data_ptr(), index.data_ptr(), rows, src.shape[0], src.stride(0) * es,
              dst.stride(0) * es, src.shape[1] * es // 16, k)
    if row_of is None:
        return _KERNELS.run_on(src, name, (min(rows, _MAX_BLOCKS), 1, 1), (_THREADS, 1, 1), _PARAMS.pack(*fields))
    items = src.shape[0] + -(-rows // _SPREAD_SCAN)    # the tokens, then the padding scan's items
    return _KERNELS.run_on(src, name, (min(items, _MAX_BLOCKS), 1, 1), (_THREADS, 1, 1),
                           _SPREAD.pack(*fields, row_of.data_ptr()))


def gather_rows(x: Any, index: Any, row_of: Any = None) -> Any:
    """(R, H) rows: row r is ``x[index[r]]`` for x (T, H), zeros where ``index[r]`` is outside
    [0, T); None where the kernel does not serve these tensors.

    Given ``row_of``, the rows are written in token order (``fusegemm_spread_rows``): each token's
    row is read once and stored to its k rows, where the expert-ordered walk reads it k times
    (at dsv3's top-k 8, with x larger than L2, each such read came from DRAM). The two must be
    each other's inverse, as :func:`fusegemm.routing.route` makes them: ``index[row_of[t, j]] ==
    t`` for every ``row_of[t, j]`` in [0, R), and every row whose index is in [0, T) named in
    ``row_of``; a row named twice gets one of its writes. The same bytes as without it.

    Parameters
    ----------
    x : (T, H) CUDA tensor
        Token-major rows (any dtype; H times its size a multiple of 16 bytes).
    index : (R,) int64 CUDA tensor
        The token of each row, -1 for padding.
    row_of : (T, k) int64 CUDA tensor, optional
        The rows of each token (an entry outside [0, R) names none).
    """
    import torch
    if not _rows_ok(x) or index.dtype != torch.int64 or index.device != x.device or index.dim() != 1:
        return None
    if row_of is not None and (row_of.dtype != torch.int64 or row_of.device != x.device or row_of.dim() != 2
                               or row_of.shape[0] != x.shape[0]):
        return None
    out = torch.empty((index.shape[0], x.shape[1]), dtype=x.dtype, device=x.device)
    if row_of is None:
        return out if _launch("fusegemm_gather_rows", x, out, index.contiguous(), 0) else None
    return out if _launch("fusegemm_spread_rows", x, out, index.contiguous(), row_of.shape[1],
                          row_of.contiguous()) else None


def sum_rows(rows: Any, index: Any) -> Any:
    """(T, H): row t is ``sum_j rows[index[t, j]]`` in choice order j, in FP32, rounded once to
    ``rows``' dtype; None where the kernel does not serve these tensors.

    Parameters
    ----------
    rows : (R, H) CUDA tensor
        float32, bfloat16 or float16 rows.
    index : (T, k) int64 CUDA tensor
        The rows of each token.
    """
    import torch
    name = _SUMS.get(str(rows.dtype))
    if (name is None or not _rows_ok(rows) or index.dtype != torch.int64 or index.device != rows.device
            or index.dim() != 2):
        return None
    out = torch.empty((index.shape[0], rows.shape[1]), dtype=rows.dtype, device=rows.device)
    return out if _launch(name, rows, out, index.contiguous(), index.shape[1]) else None


def route_rows(experts: Any, num_experts: int, rows: int) -> Any:
    """(padded_offsets (E,) int32, row_of (T, k) int64, token_of_row (R,) int64, row_ends (E,)
    int32: where each expert's rows end before its padding) of the choices
    ``experts`` (T, k): :func:`fusegemm.routing.route`'s rows in one kernel (a stable counting
    sort: within an expert, rows in token order); None where the kernel does not serve them
    (another device type, E above 256, T k of 2^31 or more).

    Parameters
    ----------
    experts : (T, k) int64 CUDA tensor
        Each token's chosen experts, in [0, E).
    num_experts : int
        E.
    rows : int
        R, the rows' bound (:func:`fusegemm.routing.padded_rows`).
    """
    import torch
    if (not experts.is_cuda or experts.dtype != torch.int64 or experts.dim() != 2 or num_experts > _ROUTE_MAX_EXPERTS
            or experts.numel() >= 2 ** 31 or rows >= 2 ** 31):
        return None
    choices = experts.contiguous()
    offsets = torch.empty(num_experts, dtype=torch.int32, device=experts.device)
    row_ends = torch.empty_like(offsets)
    row_of = torch.empty_like(choices)
    token_of_row = torch.empty(rows, dtype=torch.int64, device=experts.device)
    raw = _ROUTE.pack(choices.data_ptr(), offsets.data_ptr(), row_of.data_ptr(), token_of_row.data_ptr(),
                      choices.numel(), rows, num_experts, choices.shape[1], row_ends.data_ptr())
    ok = _KERNELS.run_on(choices, "fusegemm_route_rows", (1, 1, 1), (_ROUTE_THREADS, 1, 1), raw)
    return (offsets, row_of, token_of_row, row_ends) if ok else None
