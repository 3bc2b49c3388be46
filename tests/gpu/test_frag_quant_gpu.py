"""``FUSEGEMM_SM90_FRAG_QUANT=2`` on the GPU: an FP8 D quantized along columns on the WGMMA
fragment (SFD_col's 32-row maxima shared by the two warps that hold the rows) against the default
build, which runs those rules on the epilogue engine and is checked against the interpreter by
the family's own tests. Every byte of D, D_col, SFD_row and SFD_col and every other output must be
equal; dprob within 1e-5 relative (its per-row sums add in another order). Level 2 becomes the
default once this passes on a GPU (README, "Epilogue paths"); it has compiled without spills and
shown the fragment path's SASS on the CPU (tests/unit/test_sm90_scaled_epilogue_static.py)."""
from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

import fusegemm  # noqa: E402
import scaled_problems  # noqa: E402  (tests/gpu/scaled_problems.py)
from op_helpers import epilogue_inputs, same_outputs  # noqa: E402  (tests/gpu/op_helpers.py)
from fusegemm.runtime import config  # noqa: E402

RECIPES = {"mx": {}, "blockwise": {"sf_dtype": "float32", "sf_vec_size": 128}}
CASES = [
    ("grouped_gemm_quant", "blockwise", {"d_dtype": "float8_e4m3fn"}, 384),
    ("grouped_gemm_quant", "blockwise", {"d_dtype": "float8_e4m3fn"}, 320),     # a partial N tile
    ("grouped_gemm_quant", "mx", {"d_dtype": "float8_e4m3fn"}, 384),
    ("grouped_gemm_quant", "mx", {"d_dtype": "float8_e5m2", "discrete_col_sfd": True}, 384),
    ("grouped_gemm_srelu", "blockwise", {"d_dtype": "float8_e4m3fn"}, 384),
    ("grouped_gemm_srelu", "mx", {"d_dtype": "float8_e4m3fn"}, 384),
    ("grouped_gemm_dswiglu", "blockwise", {}, 384),
    ("grouped_gemm_dswiglu", "blockwise", {"tile_n": 128}, 384),
    ("grouped_gemm_dswiglu", "mx", {}, 384),
    ("grouped_gemm_dsrelu_mx", "blockwise", {"d_dtype": "float8_e4m3fn", "generate_dbias": False}, 384),
]


@pytest.mark.parametrize("spec,recipe,axes,n", CASES, ids=lambda x: x if isinstance(x, (str, int)) else
                         ".".join(f"{k}={v}" for k, v in x.items()) or "default")
def test_column_quantization_on_the_fragment_matches_the_engine(spec, recipe, axes, n):
    sizes, k = [256, 0, 512, 256], 512
    rng = np.random.default_rng(7)
    host, per_sfb, _, _ = scaled_problems.operands(sizes, n, k, recipe, rng)
    dev, keep = scaled_problems.on_device(host, per_sfb, n, discrete=False)
    outs = []
    for level in ("1", "2"):
        with config.override(FUSEGEMM_NVRTC_EXTRA=f"-DFUSEGEMM_SM90_FRAG_QUANT={level}"):
            op = fusegemm.Op(spec, **RECIPES[recipe], **axes).compile()
        g = torch.Generator(device="cuda").manual_seed(11)   # the same inputs for both builds
        ins = epilogue_inputs(op, sum(sizes), n, len(sizes), g, width=op.widths(n)[0])
        outs.append(op(**dev, inputs=ins))
    torch.cuda.synchronize()
    engine, frag = outs
    assert {"d_col", "sfd_col"} <= set(engine.keys()), "the case quantizes no column"
    assert set(frag.keys()) == set(engine.keys())
    same_outputs(frag, engine, f"{spec} {recipe} {axes}: FRAG_QUANT=2 against the engine", dprob_atol=1e-6)
