"""A spec's variant built under NVRTC defines (a header's A/B switch through
FUSEGEMM_NVRTC_EXTRA), for the tests that compare a switch's build with the default's
(test_engine_switches.py, test_bw_share_a.py, test_store_policy.py)."""
from __future__ import annotations

from fusegemm import pipeline
from fusegemm.generator.spec import find_spec
from fusegemm.generator.variants import make_variant
from fusegemm.runtime import config, disasm
from fusegemm.runtime.cubin_info import Cubin, Resources


def switch_build(spec: str, axes: dict, extra: str, cache, arch: str = "sm_90a") -> tuple[str, Resources, Cubin, str]:
    """(SASS text, resources, cubin, kernel name) of ``spec``'s variant with ``axes`` on ``arch``,
    compiled with FUSEGEMM_NVRTC_EXTRA = ``extra`` into ``cache``."""
    with config.override(FUSEGEMM_NVRTC_EXTRA=extra):
        b = pipeline.get_kernel(make_variant(find_spec(spec), arch=arch, **axes), cache)
    cubin = Cubin(b.cubin)
    return disasm.sass(b.cubin), cubin.resources(b.kernel_name), cubin, b.kernel_name
