"""The block engine's A/B switches (fusegemm/epilogue.cuh, epilogue_block.cuh) on the GPU, each
against the baseline build (every switch off) and the interpreter; the first, second and fourth
are the default since the H200 timed them:

* ``FUSEGEMM_ENGINE_BRANCHLESS=1``: the rule applied to every column of a block, what lies past the
  row end masked, instead of a branch region per column (rules whose element inputs sit in
  registers);
* ``FUSEGEMM_ENGINE_AMAX_TREE=1``: an SFD_row block's max|x| as a tree of max.NaN instead of a
  chain of 32;
* ``FUSEGEMM_ENGINE_COL_SMEM=1``: SFD_col's column maxima and scales through a warp's shared-memory
  buffer (the sm_90a kernels' staged rows, the harness's and sm_100a's staging) instead of warp
  reductions and shuffles;
* ``FUSEGEMM_SM90_ENGINE_VEC_STAGE=1`` (sm_90a kernels, with the branch-free engine): the
  accumulators staged for the engine by 8-byte stores and read back by 16-byte loads;
* ``FUSEGEMM_SM90_BW_EPI_WG=1`` (the sm_90a blockwise kernel): the engine run by an epilogue
  warpgroup on accumulators the consumers hand over, overlapping the next tile's mainloop.

Outputs must be the baseline build's byte for byte (dprob: the atomics' order), through the block
harness at full and partial widths with NaN, Inf, -0, subnormal and overflowing accumulators (the
masked columns, the clamped column inputs, NaN blocks), and through the sm_90a kernels whose rules
run on the engine (SFD_col quantization, FP8 C out)."""
from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

import scaled_problems  # noqa: E402  (tests/gpu/scaled_problems.py)
import test_epilogue_gpu as harness  # noqa: E402  (its run_case and compare)
from op_helpers import same_outputs  # noqa: E402  (tests/gpu/op_helpers.py)
from fusegemm.runtime import config  # noqa: E402

# Each switch's macros. BRANCHLESS, AMAX_TREE and VEC_STAGE are on by default since the H200 timed
# them (2026-12-05); every build here names all of them, so that a switch's build is the baseline
# (all off, what they replaced) with that switch on, whatever the headers' defaults.
MACROS = {"branchless": ("FUSEGEMM_ENGINE_BRANCHLESS",), "amax_tree": ("FUSEGEMM_ENGINE_AMAX_TREE",),
          "col_smem": ("FUSEGEMM_ENGINE_COL_SMEM",),
          "vec_stage": ("FUSEGEMM_ENGINE_BRANCHLESS", "FUSEGEMM_SM90_ENGINE_VEC_STAGE"),
          "epi_wg": ("FUSEGEMM_SM90_BW_EPI_WG",)}
DEFAULT_ON = ("branchless", "amax_tree", "vec_stage")


def defines(*names: str) -> str:
    """NVRTC defines: the named switches on, every other one off."""
    on = {m for n in names for m in MACROS[n]}
    every = dict.fromkeys(m for ms in MACROS.values() for m in ms)
    return " ".join(f"-D{m}={int(m in on)}" for m in every)


BASELINE = defines()
SWITCHES = {n: defines(n) for n in ("branchless", "amax_tree", "col_smem")}
# the sm_90a kernels' engine path only, where it is branch-free
SM90_SWITCHES = {"vec_stage": defines("vec_stage")}
# the sm_90a blockwise kernel: engine-path rules on an epilogue warpgroup (fusegemm/sm90/epilogue_wg.cuh)
BLOCKWISE_SWITCHES = {"epi_wg": defines("epi_wg")}


HARNESS_CASES = [  # (spec, axes, accumulator columns): every input kind the engine reads
    ("grouped_gemm_srelu", dict(c_dtype="bfloat16", d_dtype="float8_e4m3fn", bias_dtype="bfloat16"), 256),
    ("grouped_gemm_srelu", dict(c_dtype="bfloat16", d_dtype="float8_e4m3fn", bias_dtype="bfloat16"), 200),
    ("grouped_gemm_quant", dict(d_dtype="float8_e5m2", discrete_col_sfd=True), 256),
    ("grouped_gemm_quant", dict(d_dtype="float4_e2m1fn_x2"), 256),
    ("grouped_gemm_dswiglu", dict(c_dtype="bfloat16", d_dtype="float8_e4m3fn"), 256),
    ("grouped_gemm_dswiglu", dict(c_dtype="bfloat16", d_dtype="float8_e5m2", discrete_col_sfd=True), 192),
    ("grouped_gemm", dict(c_dtype="bfloat16", d_dtype="float16", bias_dtype="float32", generate_c=True), 200),
    ("grouped_gemm_swiglu", dict(d_dtype="float8_e4m3fn", generate_c=True, c_dtype="bfloat16"), 256),
    ("gemm_amax", dict(c_dtype="bfloat16"), 256),
]


def _case_id(c) -> str:
    return f"{c[0]}-{'-'.join(map(str, c[1].values()))}-n{c[2]}"


@pytest.mark.parametrize("switch", SWITCHES)
@pytest.mark.parametrize("case", HARNESS_CASES, ids=_case_id)
def test_harness_matches_the_interpreter_and_the_default_build(case, switch):
    spec, axes, n_acc = case
    offsets = (0, 256, 256, 512, 768)     # an empty expert first and one in the middle
    with config.override(FUSEGEMM_NVRTC_EXTRA=SWITCHES[switch]):
        got, want, r, exact = harness.run_case(torch, spec, offsets=offsets, n_acc=n_acc, m_rows=1024, **axes)
    harness.compare(got, want, r, exact)
    with config.override(FUSEGEMM_NVRTC_EXTRA=BASELINE):
        base, _, _, _ = harness.run_case(torch, spec, offsets=offsets, n_acc=n_acc, m_rows=1024, **axes)
    for key, v in base.items():
        if key == "dprob":   # (one atomic per row and 32-column block, in any order; NaN and Inf rows)
            np.testing.assert_allclose(got[key], v, rtol=1e-5, atol=scaled_problems.dprob_atol(base), err_msg=key)
        else:
            harness._assert_same_bytes(got[key], v, f"{spec} {switch}: {key} against the baseline build")


# (spec, recipe, axes, n): sm_90a builds whose rule runs on the engine (tests/unit/test_engine_switches.py
# checks that each switch changes each one's code)
KERNEL_CASES = [
    ("grouped_gemm_dswiglu", "blockwise", {}, 384),
    ("grouped_gemm_dswiglu", "blockwise", {"tile_n": 128}, 384),
    ("grouped_gemm_dswiglu", "mx", {}, 320),
    ("grouped_gemm_quant", "blockwise", {"d_dtype": "float8_e4m3fn", "bias_dtype": "bfloat16"}, 384),
    ("grouped_gemm_srelu", "blockwise", {"d_dtype": "float8_e4m3fn", "tile_n": 128}, 384),
    ("grouped_gemm_srelu", "blockwise", {"d_dtype": "float8_e4m3fn"}, 384),
    ("grouped_gemm_srelu", "mx", {"d_dtype": "float8_e5m2", "c_dtype": "float8_e4m3fn"}, 320),
]


@pytest.mark.parametrize("spec,recipe,axes,n", KERNEL_CASES, ids=lambda x: x if isinstance(x, (str, int)) else
                         ".".join(f"{k}={v}" for k, v in x.items()) or "default")
def test_kernels_match_the_default_build(spec, recipe, axes, n):
    every = {**SWITCHES, **SM90_SWITCHES, **(BLOCKWISE_SWITCHES if recipe == "blockwise" else {})}
    builds = {"baseline": BASELINE, "default": "", **every, "all": defines(*every)}
    outs = scaled_problems.outputs_per_build(spec, recipe, axes, builds, [256, 0, 512, 256], n, 512, seed=13,
                                             input_seed=17)
    for name in (n for n in outs if n != "baseline"):
        same_outputs(outs[name], outs["baseline"], f"{spec} {recipe} {axes}: {name} against the baseline build",
                     dprob_atol=scaled_problems.dprob_atol(outs["baseline"]))


@pytest.mark.parametrize("spec,axes", [("grouped_gemm_dswiglu", {}),
                                       ("grouped_gemm_quant", {"d_dtype": "float8_e4m3fn", "bias_dtype": "bfloat16"})],
                         ids=["dswiglu", "quant"])
def test_epilogue_warpgroup_over_many_tiles_per_cta(spec, axes):
    """More tiles than SMs (256 at N 2048): the handoff buffer is refilled tile after tile, each
    256-column tile in two passes, an empty expert between two others."""
    builds = {"default": "", "epi_wg": "-DFUSEGEMM_SM90_BW_EPI_WG=1"}   # (over the default's other switches)
    outs = scaled_problems.outputs_per_build(spec, "blockwise", axes, builds, [2048, 0, 1280, 768], 2048, 256,
                                             seed=29, input_seed=31)
    same_outputs(outs["epi_wg"], outs["default"], f"{spec}: the epilogue warpgroup against the default build",
                 dprob_atol=scaled_problems.dprob_atol(outs["default"]))
