"""``FUSEGEMM_SM90_FRAG_QUANT`` on the GPU: an FP8 D quantized along rows only (SFD_row: the
SwiGLU forward feeding the next GEMM), quantized on the WGMMA fragment by the default build, against
the build that runs it on the epilogue engine (``FUSEGEMM_SM90_FRAG_QUANT=0``), which the family's
own tests check against the interpreter. Every byte of every output must be equal. (A D quantized
along columns too stays on the engine: its fragment path measured slower and was removed.)"""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

pytest.importorskip("torch")

import scaled_problems  # noqa: E402  (tests/gpu/scaled_problems.py)
from op_helpers import same_outputs  # noqa: E402  (tests/gpu/op_helpers.py)

CASES = [
    ("grouped_gemm_glu_mx", "blockwise", {"d_dtype": "float8_e4m3fn"}, 384),
    ("grouped_gemm_glu_mx", "blockwise", {"d_dtype": "float8_e4m3fn"}, 320),     # a partial N tile
    ("grouped_gemm_glu_mx", "blockwise", {"d_dtype": "float8_e5m2", "generate_c": True}, 384),
    ("grouped_gemm_glu_mx", "blockwise", {"d_dtype": "float8_e4m3fn", "tile_n": 128}, 384),
    ("grouped_gemm_glu_mx", "mx", {"d_dtype": "float8_e4m3fn"}, 384),
    ("grouped_gemm_glu_mx", "mx", {"d_dtype": "float8_e4m3fn", "generate_c": True}, 320),
]


@pytest.mark.parametrize("spec,recipe,axes,n", CASES, ids=lambda x: x if isinstance(x, (str, int)) else
                         ".".join(f"{k}={v}" for k, v in x.items()) or "default")
def test_row_quantization_on_the_fragment_matches_the_engine(spec, recipe, axes, n):
    builds = {"engine": "-DFUSEGEMM_SM90_FRAG_QUANT=0", "frag": "-DFUSEGEMM_SM90_FRAG_QUANT=1"}
    outs = scaled_problems.outputs_per_build(spec, recipe, axes, builds, [256, 0, 512, 256], n, 512, seed=7,
                                             input_seed=11)
    engine, frag = outs["engine"], outs["frag"]
    assert "sfd_row" in engine.keys() and "d_col" not in engine.keys(), "the case is not row quantization"
    assert set(frag.keys()) == set(engine.keys())
    same_outputs(frag, engine, f"{spec} {recipe} {axes}: the fragment's row quantization against the engine")
