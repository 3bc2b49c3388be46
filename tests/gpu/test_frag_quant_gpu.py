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


def _inputs(op, m, n, l, rng):
    """Every epilogue input the op's spec declares, on the GPU, with non-trivial values."""
    w, _ = op.widths(n)
    out = {}
    for inp in op.epilogue.inputs:
        dt = getattr(torch, inp.dtype)
        if inp.per == "scalar":
            x = torch.tensor([0.5])
        elif inp.per == "expert":
            x = torch.from_numpy(rng.uniform(0.5, 1.5, l))
        elif inp.per == "row":
            x = torch.from_numpy(rng.uniform(0.0, 1.0, m))
        elif inp.per == "column":
            x = torch.from_numpy(rng.standard_normal((l, n))).t()        # (N, L), N contiguous
        else:
            x = torch.from_numpy(rng.standard_normal((m, 2 * w if inp.paired else w)))
        x = x.to(dt)
        out[inp.name] = x.t().contiguous().t().cuda() if inp.per == "column" else x.cuda()
    return out


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
        ins = _inputs(op, sum(sizes), n, len(sizes), np.random.default_rng(11))
        outs.append(op(**dev, inputs=ins))
    torch.cuda.synchronize()
    engine, frag = outs
    compared = 0
    for key in engine.keys():
        a, b = engine[key], frag[key]
        if a is None:
            assert b is None, key
            continue
        if key == "dprob":
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
        else:
            assert torch.equal(b.view(torch.uint8) if b.element_size() == 1 else b,
                               a.view(torch.uint8) if a.element_size() == 1 else a), (spec, key)
        compared += 1
    assert {"sfd_col"} <= {k for k in engine.keys() if engine[k] is not None}, "the case quantizes no column"
    assert compared >= 3
