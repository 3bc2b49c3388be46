"""``FUSEGEMM_SM90_BW_SHARE_A_ALL`` (templates/include/fusegemm/sm90/blockwise_promote.cuh, a
measurement switch, off): the blockwise kernel's paired and row-summing rules share each stage's A
between the 256-column tile's halves instead of running them as two passes over K. Each build
compiles for sm_90a and differs from the default; the SwiGLU forward with an FP8 D keeps 0 local
memory with its pre-activations C (a paired output), dSwiGLU spills no more than the 144 bytes measured when the switch was written."""
from __future__ import annotations

import pytest

from fusegemm import pipeline
from fusegemm.generator.spec import find_spec
from fusegemm.generator.variants import make_variant
from fusegemm.runtime import config, disasm
from fusegemm.runtime.cubin_info import Cubin

pytestmark = pytest.mark.skipif(not disasm.available(), reason="needs nvdisasm (the nvidia-cuda-nvdisasm wheel)")

BLOCKWISE = dict(sf_dtype="float32", sf_vec_size=128)


def _build(spec: str, axes: dict, extra: str, cache):
    with config.override(FUSEGEMM_NVRTC_EXTRA=extra):
        b = pipeline.get_kernel(make_variant(find_spec(spec), arch="sm_90a", **axes), cache)
    return disasm.sass(b.cubin), Cubin(b.cubin).resources(b.kernel_name)


@pytest.mark.parametrize("spec,axes,spill", [("grouped_gemm_dswiglu", BLOCKWISE, 144),
                                             ("grouped_gemm_glu_mx", dict(BLOCKWISE, d_dtype="float8_e4m3fn", generate_c=True), 0)])
def test_shared_a_builds_of_paired_rules(spec, axes, spill, session_cache):
    t0, r0 = _build(spec, axes, "", session_cache)
    t1, r1 = _build(spec, axes, "-DFUSEGEMM_SM90_BW_SHARE_A_ALL=1", session_cache)
    assert r0.local_bytes == 0 and r1.local_bytes <= spill, (r0, r1)
    assert t1 != t0
