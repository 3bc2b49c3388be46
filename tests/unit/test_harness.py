"""The epilogue harness (CPU side): rendering, refusals, compilation, argument checks.

Its execution against the interpreter is tests/gpu/test_epilogue_gpu.py; here every harness
kind compiles with NVRTC and the host checks run before anything touches a GPU.
"""
from __future__ import annotations

import pytest

from fusegemm.base.errors import ArgumentError, UnsupportedError
from fusegemm.generator.harness import render_harness
from fusegemm.generator.variants import make_variant
from fusegemm.pipeline import compile_planned


def test_fragment_mode_refuses_rules_that_are_not_elementwise():
    v = make_variant("grouped_gemm_swiglu", arch="sm_90a")
    with pytest.raises(UnsupportedError, match="fragment runs element-wise rules only"):
        render_harness(v, "fragment")
    with pytest.raises(UnsupportedError, match="allowed: block, fragment"):
        render_harness(v, "warp")


def test_harness_is_compiled_for_the_executable_arch_from_either_variant():
    a = render_harness(make_variant("grouped_gemm_swiglu", arch="sm_100a"), "block")
    b = render_harness(make_variant("grouped_gemm_swiglu", arch="sm_90a"), "block")
    assert a.variant.arch == b.variant.arch == "sm_90a"
    rule = lambda src: src.text[src.text.index("struct Rule"):src.text.index("struct Config")]  # noqa: E731
    assert rule(a) == rule(b) and "BlockHarness" in a.text           # one rule, whichever arch asked


@pytest.mark.parametrize("spec, axes, mode", [
    ("grouped_gemm_swiglu", {"d_dtype": "float8_e4m3fn"}, "block"),
    ("grouped_gemm_dswiglu", {"c_dtype": "float8_e5m2", "d_dtype": "float8_e5m2", "discrete_col_sfd": True}, "block"),
    ("grouped_gemm", {"c_dtype": "bfloat16", "bias_dtype": "bfloat16", "generate_c": True}, "fragment"),
    ("grouped_gemm_quant", {"d_dtype": "float4_e2m1fn_x2"}, "block"),               # packed FP4 D
    ("grouped_gemm_swiglu", {"d_dtype": "bfloat16", "generate_c": True}, "block"),  # paired C, packed pairs
    ("grouped_gemm_dswiglu_bf16", {}, "block"),
], ids=["swiglu-block", "dswiglu-block", "grouped-fragment", "quant-fp4-block", "swiglu-genc-block",
        "dswiglu-bf16-block"])
def test_harness_compiles_without_spills(spec, axes, mode):
    from fusegemm.harness_run import plan_harness
    built = compile_planned(plan_harness(make_variant(spec, arch="sm_90a", **axes), mode))
    assert built.resources.local_bytes == 0, f"{built.resources.local_bytes} bytes of local memory (spills)"
    assert built.contract.threads == 128


def test_run_harness_checks_the_accumulator_before_compiling():
    torch = pytest.importorskip("torch")
    from fusegemm.harness_run import run_harness
    v = make_variant("grouped_gemm", arch="sm_90a")
    offsets = torch.tensor([256, 512], dtype=torch.int32)
    with pytest.raises(ArgumentError, match=r"acc.*float32 \(512, N\) row-major"):
        run_harness(v, "block", torch.zeros(256, 64), offsets, {}, m_rows=512)
    with pytest.raises(ArgumentError, match=r"acc"):
        run_harness(v, "block", torch.zeros(512, 64, dtype=torch.float16), offsets, {}, m_rows=512)
    # The kernels store 16-byte row segments: an N that is not a multiple of 8 is refused.
    with pytest.raises(ArgumentError, match=r"acc.shape\[1\]: got 100; allowed: a multiple of 8"):
        run_harness(v, "block", torch.zeros(512, 100), offsets, {}, m_rows=512)
    # A scattered variant's harness takes the index and the output rows; another variant neither.
    scattered = make_variant("grouped_gemm", arch="sm_100a", d_scatter=True)
    with pytest.raises(ArgumentError, match=r"d_index/d_rows: got NoneType/None; allowed: an int32 \(m_rows,\)"):
        run_harness(scattered, "block", torch.zeros(512, 64), offsets, {}, m_rows=512)
    with pytest.raises(ArgumentError, match=r"d_index/d_rows: got Tensor/600; allowed: None/None"):
        run_harness(v, "block", torch.zeros(512, 64), offsets, {}, m_rows=512,
                    d_index=torch.zeros(512, dtype=torch.int32), d_rows=600)
    with pytest.raises(UnsupportedError, match=r"d_scatter: the fragment harness stores rows in place"):
        run_harness(scattered, "fragment", torch.zeros(512, 64), offsets, {}, m_rows=512,
                    d_index=torch.zeros(512, dtype=torch.int32), d_rows=600)
