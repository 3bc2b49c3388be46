"""The sm_90a BF16 grouped kernel's TILE_M 64 build compiled on the CPU: two ping-pong consumer
warpgroups (384 threads with the producer), 0 spills, and the named barriers that order their
mainloops (a BAR.SYNC before each mainloop but a warpgroup's first, a BAR.ARV after each, both
for 256 threads). FUSEGEMM_SM90_PINGPONG=0 builds the one-warpgroup baseline, which has neither.
What the H200 runs is tested in tests/gpu (test_pingpong_*)."""
from __future__ import annotations

import re

import pytest

from fusegemm.generator.render import render
from fusegemm.generator.variants import make_variant
from fusegemm.runtime import disasm
from fusegemm.runtime.compile import compile_source
from fusegemm.runtime.cubin_info import Cubin

CASES = [
    ("grouped_gemm", dict(tile_m=64, tile_n=256)),
    ("grouped_gemm", dict(tile_m=64, tile_n=128, scheduler="dynamic", weight_mode="discrete")),
    ("grouped_gemm", dict(tile_m=64, tile_n=256, cluster_m=2, cluster_n=1)),   # the cluster kernel
    ("grouped_gemm_wgrad", dict(tile_m=64, tile_n=128)),
    ("grouped_gemm_dswiglu_bf16", dict(tile_m=64, tile_n=256, b_major="n")),
]


def _compile(spec, axes, extra=()):
    src = render(make_variant(spec, arch="sm_90a", **axes))
    cub = compile_source(src.text, arch="sm_90a", kernel=src.symbol, extra=extra)
    return cub, Cubin(cub.data).resources(src.symbol)


def _order_barriers(text):
    """(syncs, arrives) on a 256-thread named barrier other than 0 in the SASS."""
    sync = len(re.findall(r"BAR\.SYNC\S*\s+R\d+, 0x100", text))
    arv = len(re.findall(r"BAR\.ARV\s+R\d+, 0x100", text))
    return sync, arv


@pytest.mark.parametrize("spec,axes", CASES, ids=lambda x: x if isinstance(x, str) else ".".join(map(str, x.values())))
def test_tile_m_64_builds_two_ordered_ping_pong_warpgroups(spec, axes):
    cub, res = _compile(spec, axes)
    assert res.local_bytes == 0, (spec, axes, "spills / local memory", res)
    assert res.max_threads == 384, (spec, axes, res)
    if not disasm.available():
        pytest.skip("nvdisasm is not installed: resources checked, SASS not")
    sync, arv = _order_barriers(disasm.sass(cub.data))
    assert sync >= 1 and arv >= 1, (spec, axes, sync, arv)
    base, base_res = _compile(spec, axes, ("-DFUSEGEMM_SM90_PINGPONG=0",))
    assert base_res.max_threads == 256 and _order_barriers(disasm.sass(base.data)) == (0, 0)


PP128_CASES = [
    ("grouped_gemm", dict(tile_m=128, tile_n=128)),
    ("grouped_gemm", dict(tile_m=128, tile_n=128, b_major="n", cluster_m=2, cluster_n=1)),
    ("grouped_gemm_swiglu", dict(tile_m=128, tile_n=128, d_dtype="bfloat16", generate_c=True, c_dtype="bfloat16")),
    ("grouped_gemm_dswiglu_bf16", dict(tile_m=128, tile_n=128, b_major="n")),
]
_PP128 = ("-DFUSEGEMM_SM90_PINGPONG_128=1",)


def _hgmma(text):
    """WGMMA instructions in the SASS, by shape (e.g. {'64x128x16': 8})."""
    out = {}
    for shape in re.findall(r"HGMMA\.(\d+x\d+x\d+)", text):
        out[shape] = out.get(shape, 0) + 1
    return out


@pytest.mark.parametrize("spec,axes", PP128_CASES,
                         ids=lambda x: x if isinstance(x, str) else ".".join(map(str, x.values())))
def test_tile_m_128_ping_pong_builds_two_m64_wgmmas_per_k_step(spec, axes):
    """FUSEGEMM_SM90_PINGPONG_128=1: TILE_M 128 x TILE_N 128 as ping-pong (each warpgroup a whole
    128-row tile): 0 spills (the load-ahead left out beside the second half's accumulators), the
    ordering barriers of ping-pong, and twice the m64n128k16 WGMMAs of the 64-row ping-pong build
    of the same variant (one k-step site each: each warpgroup issues both 64-row halves)."""
    cub, res = _compile(spec, axes, _PP128)
    assert res.local_bytes == 0, (spec, axes, "spills / local memory", res)
    assert res.max_threads == 384, (spec, axes, res)
    if not disasm.available():
        pytest.skip("nvdisasm is not installed: resources checked, SASS not")
    text = disasm.sass(cub.data)
    sync, arv = _order_barriers(text)
    assert sync >= 1 and arv >= 1, (spec, axes, sync, arv)
    base, _ = _compile(spec, axes)
    assert _order_barriers(disasm.sass(base.data)) == (0, 0), "the default TILE_M 128 is cooperative"
    pp64, _ = _compile(spec, {**axes, "tile_m": 64})
    got, half = _hgmma(text), _hgmma(disasm.sass(pp64.data))
    assert set(got) == {"64x128x16"} and got["64x128x16"] == 2 * half["64x128x16"], (got, half)


def test_tile_m_128_ping_pong_leaves_tile_n_256_and_the_k_grouped_kernel_cooperative():
    """The switch changes no other build: TILE_N 256 (two halves of 128 accumulators a thread
    would spill) and the K-grouped kernel (its A chunks are laid out per 64-row warpgroup)."""
    for spec, axes in (("grouped_gemm", dict(tile_m=128, tile_n=256)), ("grouped_gemm_wgrad", dict(tile_m=128))):
        cub, res = _compile(spec, axes, _PP128)
        base, _ = _compile(spec, axes)
        assert res.local_bytes == 0
        if disasm.available():
            assert disasm.opcodes(disasm.sass(cub.data)) == disasm.opcodes(disasm.sass(base.data)), (spec, axes)
