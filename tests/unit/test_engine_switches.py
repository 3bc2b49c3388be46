"""The block engine's A/B switches on the CPU (tests/gpu/test_engine_switches_gpu.py checks their
outputs): each reaches the engine of every build the GPU test runs and spills nothing;
``FUSEGEMM_ENGINE_BRANCHLESS`` removes the per-column branch regions of rules whose apply() the
compiler does not if-convert (dSwiGLU: one per column) and leaves rules with 8- or 32-bit element
inputs as they are; ``FUSEGEMM_ENGINE_AMAX_TREE`` turns each SFD_row block's chain of 32
NaN-propagating maxima (three instructions each) into 31 FMNMX.NAN;
``FUSEGEMM_SM90_ENGINE_VEC_STAGE``, with the branch-free engine, stages the sm_90a fragment by 8-byte
stores and reads it back by 16-byte loads; ``FUSEGEMM_ENGINE_COL_SMEM`` takes SFD_col's
column maxima and scales through shared memory instead of REDUX and SHFL, without costing an sm_100a
kernel a pipeline stage; ``FUSEGEMM_SM90_BW_EPI_WG`` gives the blockwise kernel's engine-path rules
an epilogue warpgroup (512 threads, registers split 160 / 152 / 40, or 152 / 152 / 56 with gathered
A) and leaves every other rule's build as it is. The default build is the same as before the
switches (SASS compared in review); since the H200 timed them, the branch-free engine, the max tree
and the vector staging are the default build (the baseline here is every switch off)."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from fusegemm.runtime import disasm

from _switches import switch_build  # (tests/unit/_switches.py)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))
from scaled_problems import RECIPES  # noqa: E402  (tests/gpu/scaled_problems.py)
from test_engine_switches_gpu import (  # noqa: E402  (its builds)
    BASELINE, DEFAULT_ON, KERNEL_CASES, SM90_SWITCHES, SWITCHES, defines)

pytestmark = pytest.mark.skipif(not disasm.available(), reason="needs nvdisasm (the nvidia-cuda-nvdisasm wheel)")

SM100_CASES = [("grouped_gemm_dswiglu", {}),
               ("grouped_gemm_srelu", {"d_dtype": "float8_e4m3fn", "c_dtype": "float8_e4m3fn"})]
CASES = [(s, "sm_90a", {**RECIPES[r], **a}) for s, r, a, _ in KERNEL_CASES]
CASES += [(s, "sm_100a", a) for s, a in SM100_CASES]


def _build(spec: str, arch: str, axes: dict, extra: str, cache):
    """(SASS histogram, resources, SASS text, host contract)."""
    text, resources, cubin, name = switch_build(spec, axes, extra, cache, arch)
    return disasm.histogram(text), resources, text, cubin.contract(name)


def _normalized(text: str) -> str:
    return re.sub(r"/\*[0-9a-f]{4,}\*/|fg_\w+", "", text)


def _ids(x) -> str:
    return x if isinstance(x, str) else ".".join(f"{k}={v}" for k, v in x.items()) or "default"


def _reductions(h: dict) -> int:
    """Warp max reductions: REDUX on sm_90a, CREDUX on sm_100a."""
    return h.get("REDUX.MAX", 0) + h.get("CREDUX.MAX", 0)


def _nan_tests(h: dict) -> int:
    return h.get("FSETP.NAN.OR", 0) + h.get("FSETP.NAN.AND", 0)


@pytest.mark.parametrize("spec,arch,axes", CASES, ids=_ids)
def test_each_switch_reaches_the_engine_and_spills_nothing(spec, arch, axes, session_cache):
    h0, r0, t0, k0 = _build(spec, arch, axes, BASELINE, session_cache)
    assert r0.local_bytes == 0
    built = {}
    every = {**SWITCHES, **(SM90_SWITCHES if arch == "sm_90a" else {})}
    for name, extra in {**every, "all": defines(*every)}.items():
        h1, r1, t1, _ = built[name] = _build(spec, arch, axes, extra, session_cache)
        assert _normalized(t0) != _normalized(t1), f"{name} did not change the build: not an engine rule"
        assert r1.local_bytes == 0, (name, r1.local_bytes)
        assert h1.get("BSSY", 0) <= h0.get("BSSY", 0), name
    hb, ht = built["branchless"][0], built["amax_tree"][0]
    if spec == "grouped_gemm_dswiglu" and arch == "sm_90a":
        # apply() holds a sigmoid: the default build keeps a branch region per column of a block
        assert h0["BSSY"] - hb["BSSY"] >= 31, (h0["BSSY"], hb["BSSY"])
        assert sum(hb.values()) < sum(h0.values())
    # each row-quantized D block: 31 FMNMX.NAN for a chain of 32 NaN tests and selects (paired D: two)
    blocks = 2 if spec == "grouped_gemm_dswiglu" else 1
    assert ht.get("FMNMX.NAN", 0) - h0.get("FMNMX.NAN", 0) >= 31 * blocks
    assert _nan_tests(h0) - _nan_tests(ht) >= 31 * blocks
    assert sum(ht.values()) < sum(h0.values())
    if arch == "sm_90a":
        # with the branch-free engine: each fragment pair staged by one 8-byte store, each row read
        # back by 16-byte loads
        hv = built["vec_stage"][0]
        assert hv.get("STS.64", 0) >= 32 and h0["STS"] - hv.get("STS", 0) >= 64, (h0["STS"], hv.get("STS"))
        assert hv.get("LDS.128", 0) >= h0.get("LDS.128", 0) + 8, (h0.get("LDS.128"), hv.get("LDS.128"))
        # the switch alone (a branching engine) changes nothing: its 8-byte stores alone spilled
        vec_alone = BASELINE.replace("VEC_STAGE=0", "VEC_STAGE=1")
        assert _normalized(_build(spec, arch, axes, vec_alone, session_cache)[2]) == _normalized(t0)
    # each column-quantized D block: 32 REDUX and 32 SHFL fewer (column maxima and scales through
    # shared memory)
    hc, hall = built["col_smem"][0], built["all"][0]
    assert _reductions(h0) - _reductions(hc) >= 32 * blocks, (_reductions(h0), _reductions(hc))
    assert h0.get("SHFL.IDX", 0) - hc.get("SHFL.IDX", 0) >= 32 * blocks
    if arch == "sm_90a":   # (sm_100a's CREDUX blocks were smaller: its count may grow)
        assert sum(hc.values()) < sum(h0.values()) and sum(hall.values()) < sum(hc.values())
    # the column buffer costs no pipeline stage: shared memory grows by at most the buffers
    # (sm_100a: four epilogue warps' 4224 B; sm_90a: nothing, the staged rows are reused)
    grown = built["col_smem"][3].smem_bytes - k0.smem_bytes
    assert 0 <= grown <= (4 * 32 * 33 * 4 if arch == "sm_100a" else 0), grown


@pytest.mark.parametrize("c_dtype", ["float32", "float8_e4m3fn"])
def test_rules_with_8_or_32_bit_element_inputs_keep_the_branching_engine(c_dtype, session_cache):
    """Their per-column loads, hoisted out of the unguarded loop, spilled: the switch leaves them."""
    axes = {**RECIPES["blockwise"], "c_dtype": c_dtype}
    _, r0, t0, _ = _build("grouped_gemm_dswiglu", "sm_90a", axes, BASELINE, session_cache)
    _, r1, t1, _ = _build("grouped_gemm_dswiglu", "sm_90a", axes, SWITCHES["branchless"], session_cache)
    assert _normalized(t0) == _normalized(t1) and r1.local_bytes == 0


@pytest.mark.parametrize("spec,arch,axes", CASES, ids=_ids)
def test_the_default_build_is_the_timed_switches(spec, arch, axes, session_cache):
    """The headers' defaults are the switches the H200 runs kept (DEFAULT_ON), and no other."""
    _, r, t, _ = _build(spec, arch, axes, "", session_cache)
    assert _normalized(t) == _normalized(_build(spec, arch, axes, defines(*DEFAULT_ON), session_cache)[2])
    assert r.local_bytes == 0


BLOCKWISE_ENGINE = [(s, {**RECIPES[r], **a}) for s, r, a, _ in KERNEL_CASES if r == "blockwise"]
BLOCKWISE_ENGINE += [("grouped_gemm_dswiglu", {**RECIPES["blockwise"], "a_gather": True})]


@pytest.mark.parametrize("spec,axes", BLOCKWISE_ENGINE, ids=_ids)
def test_epilogue_warpgroup_takes_the_engine_rules(spec, axes, session_cache):
    h1, r1, text, k1 = _build(spec, "sm_90a", axes, "-DFUSEGEMM_SM90_BW_EPI_WG=1", session_cache)   # (over the default)
    assert k1.threads == 512
    assert r1.local_bytes == 0
    regs = sorted(int(m, 16) for m in re.findall(r"USETMAXREG\.\S+(?: UP0,)? (0x[0-9a-f]+)", text))
    # producer, consumers (two warpgroups), epilogue warpgroup: the whole register file (512 x 128)
    producer, consumers, epilogue = (56, 152, 152) if axes.get("a_gather") else (40, 160, 152)
    assert regs == sorted([producer, consumers, epilogue]), regs
    assert producer + 2 * consumers + epilogue == 512
    # the consumers hand each pass over and wait for its release: acc_full and acc_empty
    h0 = _build(spec, "sm_90a", axes, "", session_cache)[0]
    assert h1["SYNCS.PHASECHK.TRANS64.TRYWAIT"] > h0["SYNCS.PHASECHK.TRANS64.TRYWAIT"]


@pytest.mark.parametrize("spec,axes", [("grouped_gemm_srelu", {**RECIPES["blockwise"], "d_dtype": "bfloat16"}),
                                       ("grouped_gemm_glu_mx", {**RECIPES["blockwise"], "d_dtype": "float8_e4m3fn"}),
                                       ("grouped_gemm_dswiglu", {})], ids=_ids)
def test_epilogue_warpgroup_leaves_other_rules_and_kernels(spec, axes, session_cache):
    """Fragment-path rules and the MXFP8 kernel build as before."""
    _, _, t0, _ = _build(spec, "sm_90a", axes, "", session_cache)
    _, _, t1, _ = _build(spec, "sm_90a", axes, "-DFUSEGEMM_SM90_BW_EPI_WG=1", session_cache)
    assert _normalized(t0) == _normalized(t1)
