"""Vectorized numpy references of the five seed ops (CPU only, numpy + ml_dtypes).

Same function names and keyword parameters as the seed wrappers, same ``TupleDict`` return keys
in the same order:

* :func:`grouped_gemm` (seed 001) -> ``d_tensor, c_tensor``
* :func:`grouped_gemm_srelu` (002) -> ``c_tensor, d_tensor, d_col_tensor, amax_tensor,
  sfd_row_tensor, sfd_col_tensor``
* :func:`grouped_gemm_quant` (003) -> ``d_tensor, d_col_tensor, amax_tensor, sfd_row_tensor,
  sfd_col_tensor``
* :func:`grouped_gemm_dswiglu` (000) -> ``d_row_tensor, d_col_tensor, dprob_tensor, amax_tensor,
  sfd_row_tensor, sfd_col_tensor``
* :func:`gemm_amax` (004) -> ``c_tensor, amax_tensor``

Inputs may be numpy arrays or torch tensors, in the seeds' kernel-facing shapes or canonical
row-major shapes (A ``(M, K)``, B ``(L, N, K)``, prob ``(M,)``, flat/physical SF buffers); a 2-D
``a_tensor`` selects canonical outputs (2-D C/D, 1-D dprob, physical SF buffers). Discrete
(per-expert pointer) weights are passed as ``b_list``/``sfb_list`` arrays. Packed FP4 is ``uint8``
(or torch ``float4_e2m1fn_x2``) with K/2 innermost; an unpacked ml_dtypes ``float4_e2m1fn`` array
(one element per byte) is accepted too. Rows at or past
``valid_m`` are returned as zeros (the kernels never write them).

Differences from the GPU kernels, by design: accumulation order (BLAS vs tensor cores),
correctly rounded tanh/sigmoid (kernels use approximations), amax propagates NaN (kernels drop
it), and e5m2 SFD uses the page's rcp_max 1/57344 unless ``e5m2_rcp_max="nvidia"`` (1/128).
"""
from __future__ import annotations

from .dswiglu import grouped_gemm_dswiglu
from .gemm_amax import gemm_amax
from .grouped_gemm import grouped_gemm
from .quant import grouped_gemm_quant
from .srelu import grouped_gemm_srelu

__all__ = [
    "gemm_amax",
    "grouped_gemm",
    "grouped_gemm_dswiglu",
    "grouped_gemm_quant",
    "grouped_gemm_srelu",
]
