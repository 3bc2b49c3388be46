"""Seed spellings (cuDNN frontend names), so code written against the seed pages switches
by changing one import. The same call runs the sm_90a kernel on Hopper and the sm_100a
kernel on Blackwell: the ``Sm100`` in the names is the seed's, not a restriction.
"""
from __future__ import annotations

from . import presets as _presets

__all__: list[str] = []

# The seeds and cuDNN frontend's newer grouped fusions: the wrappers and class APIs
# generated from fusegemm.presets' rows (cuDNN's class names are ours with ``Sm100``).
for _row in _presets.SEEDS + _presets.PRESETS:
    globals()[_row.cudnn] = getattr(_presets, _row.name)
    __all__.append(_row.cudnn)
    if _row.cls:
        globals()[_row.cls + "Sm100"] = getattr(_presets, _row.cls)
        __all__.append(_row.cls + "Sm100")
del _row
