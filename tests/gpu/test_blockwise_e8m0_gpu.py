"""The blockwise recipe with E8M0 (power-of-two) scale tensors on the GPU: each op, given the
scales as float8_e8m0fnu / uint8 bytes, converts them on the launch stream to the float32 values
they encode and runs the FP32-scale kernel; every byte of every output equals the same op's on
float32 scales (dprob within its atomics' order)."""
from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

import fusegemm  # noqa: E402
import scaled_problems  # noqa: E402  (tests/gpu/scaled_problems.py)
from fusegemm.formats import e8m0_bytes  # noqa: E402
from epilogue_inputs import epilogue_inputs  # noqa: E402  (tests/epilogue_inputs.py)
from op_helpers import same_outputs  # noqa: E402  (tests/gpu/op_helpers.py)

BW = {"sf_vec_size": 128}
CASES = [("grouped_gemm_quant", {"d_dtype": "float8_e4m3fn"}), ("grouped_gemm_srelu", {}),
         ("grouped_gemm_dswiglu", {}), ("grouped_gemm_glu_mx", {"d_dtype": "float8_e4m3fn"})]


@pytest.mark.parametrize("spec,axes", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("as_bytes", [False, True])
def test_e8m0_scales_give_the_fp32_scale_bytes(spec, axes, as_bytes):
    sizes, n, k = [256, 0, 512, 256], 384, 512
    m, l = sum(sizes), len(sizes)
    rng = np.random.default_rng(12)
    host, per_sfb, _, _ = scaled_problems.operands(sizes, n, k, "blockwise", rng)   # power-of-two scales
    dev, keep = scaled_problems.on_device(host, per_sfb, n, discrete=False)
    f32 = fusegemm.Op(spec, sf_dtype="float32", **BW, **axes).compile()
    e8 = fusegemm.Op(spec, sf_dtype="float8_e8m0fnu", **BW, **axes).compile()
    assert e8.e8m0_scales and e8.kernel_variant.choices == f32.kernel_variant.choices
    sfa, sfb = e8m0_bytes(dev["sfa_tensor"]), e8m0_bytes(dev["sfb_tensor"])
    if not as_bytes:
        sfa, sfb = sfa.view(torch.float8_e8m0fnu), sfb.view(torch.float8_e8m0fnu)
    g = torch.Generator(device="cuda").manual_seed(3)
    ins = epilogue_inputs(f32, m, n, l, g, width=f32.widths(n)[0])
    want = f32(**dev, inputs=ins)
    got = e8(**dict(dev, sfa_tensor=sfa.contiguous(), sfb_tensor=sfb), inputs=ins)   # SFA in any layout
    torch.cuda.synchronize()
    same_outputs(got, want, f"{spec}: E8M0 scales against their float32 values")
