"""The block engine's A/B switches (fusegemm/epilogue.cuh, epilogue_block.cuh) on the GPU, each
against the default build and the interpreter:

* ``FUSEGEMM_ENGINE_BRANCHLESS=1``: the rule applied to every column of a block, what lies past the
  row end masked, instead of a branch region per column (rules whose element inputs sit in
  registers);
* ``FUSEGEMM_ENGINE_AMAX_TREE=1``: an SFD_row block's max|x| as a tree of max.NaN instead of a
  chain of 32;
* ``FUSEGEMM_ENGINE_COL_SMEM=1``: SFD_col's column maxima and scales through a warp's shared-memory
  buffer (the sm_90a kernels' staged rows, the harness's and sm_100a's staging) instead of warp
  reductions and shuffles;
* ``FUSEGEMM_SM90_ENGINE_VEC_STAGE=1`` (sm_90a kernels, with the branch-free engine): the
  accumulators staged for the engine by 8-byte stores and read back by 16-byte loads.

Outputs must be the default build's byte for byte (dprob: the atomics' order), through the block
harness at full and partial widths with NaN, Inf, -0, subnormal and overflowing accumulators (the
masked columns, the clamped column inputs, NaN blocks), and through the sm_90a kernels whose rules
run on the engine (SFD_col quantization, FP8 C out)."""
from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

import fusegemm  # noqa: E402
import scaled_problems  # noqa: E402  (tests/gpu/scaled_problems.py)
import test_epilogue_gpu as harness  # noqa: E402  (its run_case and compare)
from epilogue_inputs import epilogue_inputs  # noqa: E402  (tests/epilogue_inputs.py)
from op_helpers import same_outputs  # noqa: E402  (tests/gpu/op_helpers.py)
from fusegemm.runtime import config  # noqa: E402

SWITCHES = {"branchless": "-DFUSEGEMM_ENGINE_BRANCHLESS=1", "amax_tree": "-DFUSEGEMM_ENGINE_AMAX_TREE=1",
            "col_smem": "-DFUSEGEMM_ENGINE_COL_SMEM=1"}
# the sm_90a kernels' engine path only, where it is branch-free
SM90_SWITCHES = {"vec_stage": "-DFUSEGEMM_ENGINE_BRANCHLESS=1 -DFUSEGEMM_SM90_ENGINE_VEC_STAGE=1"}

HARNESS_CASES = [  # (spec, axes, accumulator columns): every input kind the engine reads
    ("grouped_gemm_srelu", dict(c_dtype="bfloat16", d_dtype="float8_e4m3fn", bias_dtype="bfloat16"), 256),
    ("grouped_gemm_srelu", dict(c_dtype="bfloat16", d_dtype="float8_e4m3fn", bias_dtype="bfloat16"), 200),
    ("grouped_gemm_quant", dict(d_dtype="float8_e5m2", discrete_col_sfd=True), 256),
    ("grouped_gemm_quant", dict(d_dtype="float4_e2m1fn_x2"), 256),
    ("grouped_gemm_dswiglu", dict(c_dtype="bfloat16", d_dtype="float8_e4m3fn"), 256),
    ("grouped_gemm_dswiglu", dict(c_dtype="bfloat16", d_dtype="float8_e5m2", discrete_col_sfd=True), 200),
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
    base, _, _, _ = harness.run_case(torch, spec, offsets=offsets, n_acc=n_acc, m_rows=1024, **axes)
    for key, v in base.items():
        if key == "dprob":
            np.testing.assert_allclose(got[key], v, rtol=1e-5, atol=1e-5, err_msg=key)
        else:
            harness._assert_same_bytes(got[key], v, f"{spec} {switch}: {key} against the default build")


RECIPES = {"mx": {}, "blockwise": {"sf_dtype": "float32", "sf_vec_size": 128}}
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
    sizes, k = [256, 0, 512, 256], 512
    rng = np.random.default_rng(13)
    host, per_sfb, _, _ = scaled_problems.operands(sizes, n, k, recipe, rng)
    dev, keep = scaled_problems.on_device(host, per_sfb, n, discrete=False)
    outs = {}
    every = {**SWITCHES, **SM90_SWITCHES}
    for name, extra in {"default": "", **every, "all": " ".join(every.values())}.items():
        with config.override(FUSEGEMM_NVRTC_EXTRA=extra):
            op = fusegemm.Op(spec, **RECIPES[recipe], **axes).compile()
        g = torch.Generator(device="cuda").manual_seed(17)   # the same inputs for every build
        ins = epilogue_inputs(op, sum(sizes), n, len(sizes), g, width=op.widths(n)[0])
        outs[name] = op(**dev, inputs=ins)
    torch.cuda.synchronize()
    for name in (n for n in outs if n != "default"):
        same_outputs(outs[name], outs["default"], f"{spec} {recipe} {axes}: {name} against the default build")
