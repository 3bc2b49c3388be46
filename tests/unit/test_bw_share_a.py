"""Which blockwise rules share each stage's A between the 256-column tile's halves
(templates/include/fusegemm/sm90/blockwise_promote.cuh kShareA). Since 2026-12-06 these share A
by default (measured faster on an H100): the SwiGLU forward with its pre-activations C (a paired
output) and an FP8 D quantized per 32 columns (1.05-1.20x), and, with a 16-bit D, the SwiGLU
forward with C (1.06-1.19x) and dsReLU with its dprob row sums (1.01-1.14x). Their builds are the
measurement switch's (``FUSEGEMM_SM90_BW_SHARE_A_ALL=1``, under which their GPU tests passed) and
spill nothing. dSwiGLU keeps its two passes over K (the switch's build differs and spills at most
the 144 bytes measured), as do dGLU with a bf16 D (0.95-1.10x: not faster) and dsReLU's bias
gradient (column sums)."""
from __future__ import annotations

import pytest

from fusegemm.runtime import disasm

from _switches import switch_build  # (tests/unit/_switches.py)

pytestmark = pytest.mark.skipif(not disasm.available(), reason="needs nvdisasm (the nvidia-cuda-nvdisasm wheel)")

BLOCKWISE = dict(sf_dtype="float32", sf_vec_size=128)


@pytest.mark.parametrize("spec,axes,spill,shared", [
    ("grouped_gemm_dswiglu", BLOCKWISE, 144, False),
    ("grouped_gemm_glu_mx", dict(BLOCKWISE, d_dtype="float8_e4m3fn", generate_c=True), 0, True),
    ("grouped_gemm_glu_mx", dict(BLOCKWISE, d_dtype="float8_e5m2", generate_c=True, weight_mode="discrete"), 0, True),
    ("grouped_gemm_glu_mx", dict(BLOCKWISE, generate_c=True), 0, True),
    ("grouped_gemm_dsrelu_mx", dict(BLOCKWISE, d_dtype="float16", weight_mode="discrete"), 0, True),
    ("grouped_gemm_dsrelu_mx", dict(BLOCKWISE, generate_dbias=True), 0, False),
    ("grouped_gemm_dglu_mx", BLOCKWISE, 0, False)])
def test_shared_a_builds_of_paired_rules(spec, axes, spill, shared, session_cache):
    t0, r0, _, _ = switch_build(spec, axes, "", session_cache)
    t1, r1, _, _ = switch_build(spec, axes, "-DFUSEGEMM_SM90_BW_SHARE_A_ALL=1", session_cache)
    assert r0.local_bytes == 0 and r1.local_bytes <= spill, (r0, r1)
    assert (t1 == t0) == shared
