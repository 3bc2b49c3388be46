"""What sm_100a runs for the blockwise recipe's E8M0 scales, executed on the H200: the scale
expansion (fusegemm.formats.torch_blockwise.mx_scales_of_blockwise, on the device) feeding the MXFP8
kernel gives, bit for bit, what the blockwise kernel gives on the recipe's own scales (exact
problems: small integers and power-of-two scales, so both kernels' sums are exact whatever their
promotion interval, 32 K or 128 K). sm_100a's op is that expansion and its MXFP8 kernel
(tests/unit/test_blockwise_sm100.py checks the op's path and builds the kernel).
"""
from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

import fusegemm  # noqa: E402
from fusegemm.formats import e8m0_bytes  # noqa: E402
from fusegemm.formats.torch_blockwise import mx_scales_of_blockwise  # noqa: E402

E8 = {"sf_dtype": "float8_e8m0fnu", "sf_vec_size": 128}
MX = {"sf_dtype": "float8_e8m0fnu", "sf_vec_size": 32}


def _problem(sizes, n, k, seed):
    import ml_dtypes
    rng = np.random.default_rng(seed)
    m, l = sum(sizes), len(sizes)
    aq = rng.integers(-3, 4, (m, k)).astype(ml_dtypes.float8_e4m3fn)
    bq = rng.integers(-3, 4, (l, n, k)).astype(ml_dtypes.float8_e4m3fn)
    sa = np.exp2(rng.integers(-2, 2, (m, -(-k // 128)))).astype(np.float32)
    sb = np.exp2(rng.integers(-4, -1, (l, -(-n // 128), -(-k // 128)))).astype(np.float32)
    fp8 = lambda x: torch.from_numpy(np.asarray(x).view(np.uint8)).view(torch.float8_e4m3fn).cuda()  # noqa: E731
    return {"a_tensor": fp8(aq), "sfa_tensor": e8m0_bytes(torch.from_numpy(sa)).cuda().view(torch.float8_e8m0fnu),
            "padded_offsets": torch.tensor(np.cumsum(sizes), dtype=torch.int32).cuda(), "b_tensor": fp8(bq),
            "sfb_tensor": e8m0_bytes(torch.from_numpy(sb)).cuda()}


def _inputs(spec, m, l, n):
    g = torch.Generator().manual_seed(m + n)
    ins = {"alpha": torch.exp2(torch.randint(-1, 2, (l,), generator=g).float()),
           "prob": torch.randint(1, 5, (m,), generator=g).float() / 4, "norm_const": torch.full((1,), 0.5)}
    if spec == "grouped_gemm_glu_mx":
        ins.pop("norm_const")
    return {k: v.cuda() for k, v in ins.items()}


@pytest.mark.parametrize("spec,sizes,n,k,axes", [
    ("grouped_gemm_quant", [256, 0, 512], 320, 400, {"d_dtype": "float8_e4m3fn"}),   # N and K tails, FP8 D + SFD
    ("grouped_gemm_quant", [512, 256], 256, 1024, {}),                                # bf16 D + amax
    ("grouped_gemm_srelu", [256, 256], 384, 256, {"tile_n": 128}),
    ("grouped_gemm_glu_mx", [512], 512, 384, {"generate_c": True}),
])
def test_the_expanded_scales_on_the_mx_kernel_are_the_blockwise_kernel(spec, sizes, n, k, axes):
    ops = fusegemm.Op(spec, **E8, **axes), fusegemm.Op(spec, **MX, **axes)
    assert not ops[0].blockwise_mx and ops[0].e8m0_scales   # (sm_90a: the FP32-scale kernel)
    p = _problem(sizes, n, k, seed=n + k)
    ins = _inputs(spec, sum(sizes), len(sizes), n)
    want = ops[0](**p, inputs=ins)
    sfa, sfb = mx_scales_of_blockwise(p["sfa_tensor"], p["sfb_tensor"], n=n, k=k)
    got = ops[1](**{**p, "sfa_tensor": sfa, "sfb_tensor": sfb}, inputs=ins)
    torch.cuda.synchronize()
    assert got.keys() == want.keys()
    for key in want.keys():
        w, g = want[key], got[key]
        if w is None:
            assert g is None, key
            continue
        assert g.dtype == w.dtype and g.shape == w.shape, key
        assert torch.equal(g.view(torch.uint8) if g.element_size() == 1 else g,
                           w.view(torch.uint8) if w.element_size() == 1 else w), key
