"""fusegemm as torch custom ops (``torch.ops.fusegemm.*``): traceable by ``torch.compile``
(fullgraph, no graph breaks) and capturable in CUDA graphs.

Importing this module registers the ops (``torch.library.custom_op``, namespace ``fusegemm``)
with a fake implementation each, which computes output shapes, dtypes and strides exactly as the
real op allocates them. The public wrappers (``fusegemm.grouped_gemm`` ...) stay plain Python
for eager use (their host fast path is cheaper than the dispatcher); inside a compiled region
call the functions here, which return tuples (a custom op's schema has no TupleDict):

    import fusegemm.torch_library as fg
    d, c = fg.grouped_gemm(a, padded_offsets, alpha, b)        # c is an empty tensor unless generate_c

Outputs are new tensors (no argument is mutated or aliased), so the ops are functional for
torch.compile. Rows at or past ``padded_offsets[-1]`` are left unwritten, exactly as in eager.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .arguments import b_is_canonical


@torch.library.custom_op("fusegemm::grouped_gemm", mutates_args=())
def _grouped_gemm(a: Tensor, padded_offsets: Tensor, alpha: Tensor, b: Optional[Tensor],
                  bias: Optional[Tensor], b_ptrs: Optional[Tensor], n: Optional[int],
                  prob: Optional[Tensor], c_dtype: torch.dtype, d_dtype: torch.dtype,
                  generate_c: bool, use_dynamic_sched: bool) -> tuple[Tensor, Tensor]:
    from .ops.grouped_gemm import grouped_gemm as eager
    d, c = eager(a, padded_offsets, alpha, b_tensor=b, bias_tensor=bias, b_ptrs=b_ptrs, n=n,
                 prob_tensor=prob, c_dtype=c_dtype, d_dtype=d_dtype, generate_c=generate_c,
                 use_dynamic_sched=use_dynamic_sched)
    return d, (c if c is not None else a.new_empty((0,), dtype=c_dtype))


@_grouped_gemm.register_fake
def _grouped_gemm_fake(a, padded_offsets, alpha, b, bias, b_ptrs, n, prob, c_dtype, d_dtype,
                       generate_c, use_dynamic_sched):
    m, k, l = a.shape[0], a.shape[1], padded_offsets.shape[0]
    if b is not None:
        canonical = b_is_canonical(tuple(b.shape), tuple(b.stride()), k, l)
        if canonical is None:   # the real op raises the seed's ArgumentError for this
            raise ValueError(f"b_tensor.shape: got {tuple(b.shape)}; allowed: (N, {k}, {l}) or ({l}, N, {k})")
        n = b.shape[1] if canonical else b.shape[0]
    elif n is None:
        raise ValueError("n: got None; allowed: an int (discrete weights need n=)")
    shape = (m, n) if a.dim() == 2 else (m, n, 1)
    d = a.new_empty(shape, dtype=d_dtype)
    c = a.new_empty(shape if generate_c else (0,), dtype=c_dtype)
    return d, c


def grouped_gemm(a: Tensor, padded_offsets: Tensor, alpha: Tensor, b: Optional[Tensor] = None, *,
                 bias: Optional[Tensor] = None, b_ptrs: Optional[Tensor] = None, n: Optional[int] = None,
                 prob: Optional[Tensor] = None, c_dtype: torch.dtype = torch.bfloat16,
                 d_dtype: torch.dtype = torch.bfloat16, generate_c: bool = False,
                 use_dynamic_sched: bool = False) -> tuple[Tensor, Tensor]:
    """``torch.ops.fusegemm.grouped_gemm``: seed 001's grouped GEMM as a custom op. Returns
    ``(d, c)``; ``c`` is an empty tensor unless ``generate_c``. Arguments as
    ``fusegemm.grouped_gemm`` (``b`` = ``b_tensor``, ``bias`` = ``bias_tensor``, ``prob`` =
    ``prob_tensor``)."""
    return torch.ops.fusegemm.grouped_gemm(a, padded_offsets, alpha, b, bias, b_ptrs, n, prob, c_dtype,
                                           d_dtype, generate_c, use_dynamic_sched)
