"""``FUSEGEMM_BENCH_NO_STORE`` (templates/include/fusegemm/epilogue.cuh, benchmark only) drops the
epilogues' vector stores at run time and nothing else: every store instruction stays (guarded by a
data test, so that all the work that forms the stored values still runs), with the same registers
and no local memory. Checked on the blockwise GEMM with a bf16 D and with an FP8 D quantized along
rows and columns (the engine's stores), the BF16 grouped GEMM and the layer's ping-pong dSwiGLU."""
from __future__ import annotations

import re

import pytest

from fusegemm.runtime import disasm

from _switches import switch_build  # (tests/unit/_switches.py)

pytestmark = pytest.mark.skipif(not disasm.available(), reason="needs nvdisasm (the nvidia-cuda-nvdisasm wheel)")

BLOCKWISE = dict(sf_dtype="float32", sf_vec_size=128)
CASES = [("grouped_gemm_quant", dict(BLOCKWISE, d_dtype="bfloat16")),
         ("grouped_gemm_quant", dict(BLOCKWISE, d_dtype="float8_e4m3fn")),
         ("grouped_gemm", {}),
         ("grouped_gemm_dswiglu_bf16", dict(tile_m=64, b_major="n"))]


def _stores(spec: str, axes: dict, extra: str, cache) -> tuple[dict, object, str]:
    text, resources, _, _ = switch_build(spec, axes, extra, cache)
    stg: dict[str, int] = {}
    for op in re.findall(r"\bSTG(?:\.[A-Z0-9]+)*", text):
        stg[op] = stg.get(op, 0) + 1
    return stg, resources, text


@pytest.mark.parametrize("spec,axes", CASES, ids=[f"{s}-{a.get('d_dtype', a.get('tile_m', 'default'))}"
                                                   for s, a in CASES])
def test_the_no_store_build_keeps_every_store_and_its_resources(spec, axes, session_cache):
    base, r0, t0 = _stores(spec, axes, "", session_cache)
    nost, r1, t1 = _stores(spec, axes, "-DFUSEGEMM_BENCH_NO_STORE=1", session_cache)
    assert base.get("STG.E.128", 0) > 0 and nost == base, (base, nost)
    assert t1 != t0   # the guard is there
    # The engine's build with FP8 D and both SFDs spills 24 bytes under the data test (its
    # no-store figure understates what its stores cost); the others spill nothing.
    assert r1.registers == r0.registers and r0.local_bytes == 0
    assert r1.local_bytes <= (24 if axes.get("d_dtype") == "float8_e4m3fn" else 0), r1
