"""The sm_90a block-scaled kernel (fusegemm/sm90/blockscaled_*.cuh) compiled on the CPU: every
family with a spread of its variants, 0 spills, shared memory within the opt-in limit, and the
instructions it must contain (FP8 WGMMA + promotion math). What the H200 runs is measured in tests/gpu and bench/."""
from __future__ import annotations

import pytest

from fusegemm.generator.render import render
from fusegemm.generator.variants import make_variant
from fusegemm.runtime import disasm
from fusegemm.runtime.compile import compile_source
from fusegemm.runtime.cubin_info import Cubin

SMEM_LIMIT = 232448 - 1024

CASES = [
    ("grouped_gemm_srelu", {}),
    ("grouped_gemm_srelu", dict(d_dtype="float8_e4m3fn", discrete_col_sfd=True, bias_dtype="bfloat16")),
    ("grouped_gemm_srelu", dict(ab_dtype="float8_e5m2", weight_mode="discrete", tile_n=128, c_dtype="float32")),
    ("grouped_gemm_srelu", dict(tanh_clamp_scale=4.0, d_dtype="float8_e5m2")),
    ("grouped_gemm_quant", dict(d_dtype="float8_e4m3fn")),
    ("grouped_gemm_quant", dict(d_dtype="bfloat16", bias_dtype="bfloat16")),
    ("grouped_gemm_dswiglu", {}),
    ("grouped_gemm_dswiglu", dict(prob_dtype="bfloat16")),
    ("grouped_gemm_dswiglu", dict(ab_dtype="float8_e5m2", c_dtype="float8_e5m2", d_dtype="float8_e5m2", tile_n=128)),
    ("gemm_amax", {}),
    ("gemm_amax", dict(cd_major="m", c_dtype="bfloat16", tile_n=256)),
    # the gate/up-paired accumulator (SwiGLU forward), on both mainloops
    ("grouped_gemm_glu_mx", dict(d_dtype="float8_e4m3fn", generate_c=True, bias_dtype="bfloat16")),
    ("grouped_gemm_glu_mx", dict(sf_dtype="float32", sf_vec_size=128, tile_n=128, weight_mode="discrete")),
]
def _compile(spec, axes):
    variant = make_variant(spec, arch="sm_90a", **axes)
    src = render(variant)
    assert src.impl.kernel == "fusegemm::sm90::BlockScaledGemmKernel", src.impl
    cub = compile_source(src.text, arch="sm_90a", kernel=src.symbol)
    return src, cub


@pytest.mark.parametrize("spec,axes", CASES, ids=lambda x: x if isinstance(x, str) else ".".join(map(str, x.values())))
def test_sm90_block_scaled_kernels_compile_clean(spec, axes):
    src, cub = _compile(spec, axes)
    res = Cubin(cub.data).resources(src.symbol)
    contract = Cubin(cub.data).contract(src.symbol)
    assert res.local_bytes == 0, (spec, axes, "spills / local memory", res)
    assert contract.smem_bytes <= SMEM_LIMIT
    assert contract.threads == 384
    assert (contract.sf_box_k, contract.tile_m) == (1, 128)
    # nvdisasm is a test dependency (pyproject's [test] extra): without it this fails, naming the
    # wheels to install, instead of passing with the SASS unchecked.
    hist = disasm.sass_histogram(cub.data)
    assert disasm.count_prefix(hist, "QGMMA") > 0, "FP8 WGMMA"
    assert disasm.count_prefix(hist, "HGMMA") == 0
    assert disasm.count_prefix(hist, "FFMA") >= 64, "the promotion's FFMAs"


def test_configuration_checks_hold_in_the_promoting_kernel():
    """ScaledConfigChecks' static_asserts fire in the promoting kernel (it once named the struct
    without instantiating it, so a configuration it refuses compiled untested): a K-major-only
    kernel handed an MN-major A fails to compile, naming the limit."""
    from fusegemm.base.errors import CompileError
    src = render(make_variant("grouped_gemm_quant", arch="sm_90a"))
    text = src.text.replace("static constexpr bool kAMajorMN = false;", "static constexpr bool kAMajorMN = true;")
    assert text != src.text
    with pytest.raises(CompileError, match="K-major A and B"):
        compile_source(text, arch="sm_90a", kernel=src.symbol)


