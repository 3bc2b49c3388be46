"""``FUSEGEMM_ENGINE_BRANCHLESS`` (fusegemm/epilogue.cuh) on the CPU: the switch reaches the block
engine of every build tests/gpu/test_engine_branchless_gpu.py runs, removes the per-column branch
regions of rules whose apply() the compiler does not if-convert (dSwiGLU: one per column), and
spills nothing; rules with 8- or 32-bit element inputs keep the default engine. The GPU test
checks the outputs."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from fusegemm import pipeline
from fusegemm.generator.spec import find_spec
from fusegemm.generator.variants import make_variant
from fusegemm.runtime import config, disasm
from fusegemm.runtime.cubin_info import Cubin

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))
from test_engine_branchless_gpu import KERNEL_CASES, ON, RECIPES  # noqa: E402  (the GPU test's builds)

pytestmark = pytest.mark.skipif(not disasm.available(), reason="needs nvdisasm (the nvidia-cuda-nvdisasm wheel)")

SM100_CASES = [("grouped_gemm_dswiglu", {}),
               ("grouped_gemm_srelu", {"d_dtype": "float8_e4m3fn", "c_dtype": "float8_e4m3fn"})]


def _build(spec: str, arch: str, axes: dict, extra: str, cache):
    with config.override(FUSEGEMM_NVRTC_EXTRA=extra):
        b = pipeline.get_kernel(make_variant(find_spec(spec), arch=arch, **axes), cache)
    text = disasm.sass(b.cubin)
    return disasm.histogram(text), Cubin(b.cubin).resources(b.kernel_name), text


def _normalized(text: str) -> str:
    return re.sub(r"/\*[0-9a-f]{4,}\*/|fg_\w+", "", text)


CASES = [(s, "sm_90a", {**RECIPES[r], **a}) for s, r, a, _ in KERNEL_CASES]
CASES += [(s, "sm_100a", a) for s, a in SM100_CASES]


@pytest.mark.parametrize("spec,arch,axes", CASES, ids=lambda x: x if isinstance(x, str) else
                         ".".join(f"{k}={v}" for k, v in x.items()) or "default")
def test_the_switch_reaches_the_engine_and_spills_nothing(spec, arch, axes, session_cache):
    h0, r0, t0 = _build(spec, arch, axes, "", session_cache)
    h1, r1, t1 = _build(spec, arch, axes, ON, session_cache)
    assert _normalized(t0) != _normalized(t1), "the switch did not change the build: not an engine rule"
    assert r0.local_bytes == 0 and r1.local_bytes == 0, (r0.local_bytes, r1.local_bytes)
    assert h1.get("BSSY", 0) <= h0.get("BSSY", 0)
    if spec == "grouped_gemm_dswiglu" and arch == "sm_90a":
        # apply() holds a sigmoid: the default build keeps a branch region per column of a block
        assert h0["BSSY"] - h1["BSSY"] >= 31, (h0["BSSY"], h1["BSSY"])
        assert sum(h1.values()) < sum(h0.values())



@pytest.mark.parametrize("c_dtype", ["float32", "float8_e4m3fn"])
def test_rules_with_8_or_32_bit_element_inputs_keep_the_default_engine(c_dtype, session_cache):
    """Their per-column loads, hoisted out of the unguarded loop, spilled: the switch leaves them."""
    axes = {**RECIPES["blockwise"], "c_dtype": c_dtype}
    _, r0, t0 = _build("grouped_gemm_dswiglu", "sm_90a", axes, "", session_cache)
    _, r1, t1 = _build("grouped_gemm_dswiglu", "sm_90a", axes, ON, session_cache)
    assert _normalized(t0) == _normalized(t1) and r1.local_bytes == 0
