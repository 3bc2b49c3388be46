"""Seed spellings (cuDNN frontend names), so code written against the seed pages switches
by changing one import. The same call runs the sm_90a kernel on Hopper and the sm_100a
kernel on Blackwell: the ``Sm100`` in the names is the seed's, not a restriction.
"""
from __future__ import annotations

from .ops.grouped_gemm import GroupedGemm, grouped_gemm
from .ops.scaled_classes import GemmAmax, GroupedGemmDswiglu, GroupedGemmQuant, GroupedGemmSrelu
from .ops.scaled_seeds import gemm_amax, grouped_gemm_dswiglu, grouped_gemm_quant, grouped_gemm_srelu
from . import presets as _presets

__all__ = ["grouped_gemm_wrapper_sm100", "GroupedGemmSm100", "grouped_gemm_srelu_wrapper_sm100",
           "grouped_gemm_quant_wrapper_sm100", "grouped_gemm_dswiglu_wrapper_sm100",
           "gemm_amax_wrapper_sm100", "GroupedGemmSreluSm100", "GroupedGemmQuantSm100",
           "GroupedGemmDswigluSm100", "GemmAmaxSm100"]

#: ``cudnn.grouped_gemm_wrapper_sm100`` (seed 001)
grouped_gemm_wrapper_sm100 = grouped_gemm
#: ``cudnn.GroupedGemmSm100`` (seed 001)
GroupedGemmSm100 = GroupedGemm
#: ``cudnn.grouped_gemm_srelu_wrapper_sm100`` (seed 002)
grouped_gemm_srelu_wrapper_sm100 = grouped_gemm_srelu
#: ``cudnn.grouped_gemm_quant_wrapper_sm100`` (seed 003)
grouped_gemm_quant_wrapper_sm100 = grouped_gemm_quant
#: ``cudnn.grouped_gemm_dswiglu_wrapper_sm100`` (seed 000)
grouped_gemm_dswiglu_wrapper_sm100 = grouped_gemm_dswiglu
#: ``cudnn.gemm_amax_wrapper_sm100`` (seed 004)
gemm_amax_wrapper_sm100 = gemm_amax
#: ``cudnn.GroupedGemmSreluSm100`` (seed 002)
GroupedGemmSreluSm100 = GroupedGemmSrelu
#: ``cudnn.GroupedGemmQuantSm100`` (seed 003)
GroupedGemmQuantSm100 = GroupedGemmQuant
#: ``cudnn.GroupedGemmDswigluSm100`` (seed 000)
GroupedGemmDswigluSm100 = GroupedGemmDswiglu
#: ``cudnn.GemmAmaxSm100`` (seed 004)
GemmAmaxSm100 = GemmAmax

# cuDNN frontend's newer grouped fusions: the wrappers generated from fusegemm.presets' rows.
for _row in _presets.PRESETS:
    globals()[_row.cudnn] = getattr(_presets, _row.name)
    __all__.append(_row.cudnn)
del _row
