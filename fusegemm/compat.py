"""Seed spellings (cuDNN frontend names), so code written against the seed pages switches
by changing one import. The same call runs the sm_90a kernel on Hopper and the sm_100a
kernel on Blackwell: the ``Sm100`` in the names is the seed's, not a restriction.
"""
from __future__ import annotations

from .ops.grouped_gemm import GroupedGemm, grouped_gemm

__all__ = ["grouped_gemm_wrapper_sm100", "GroupedGemmSm100"]

#: ``cudnn.grouped_gemm_wrapper_sm100`` (seed 001)
grouped_gemm_wrapper_sm100 = grouped_gemm
#: ``cudnn.GroupedGemmSm100`` (seed 001)
GroupedGemmSm100 = GroupedGemm
