"""FP8 weight gradients with the blockwise recipe (specs/grouped_gemm_wgrad_fp8.yaml, the blockwise
kernel's K-grouped mode) on the GPU: dW_e = alpha_e dequant(dY^T)[:, T_e] dequant(X^T)[:, T_e]^T.

``exact`` problems hold small integer FP8 values and power-of-two scales (per row and per column
of each 128-token block), so every product and sum is exact in any order: D must match the numpy
interpreter (``Op.reference``) bit for bit. Realistic problems (normal BF16 values quantized on the
device by ``torch_blockwise.quantize_wgrad``) are compared within a stated tolerance with the
interpreter, and with an independent float64 formula and torch's BF16 weight gradient.
"""
from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

import fusegemm  # noqa: E402
from fusegemm.formats import blockwise_sfa_layout  # noqa: E402
from fusegemm.formats.torch_blockwise import quantize_wgrad  # noqa: E402
from fusegemm.output_compare import compare_outputs  # noqa: E402
from fusegemm.selftest import wgrad_fp8_problem  # noqa: E402


def _exact(tokens, m, n, seed, ab):
    """fusegemm.selftest's exact problem (integers in [-2, 2], power-of-two scales): host tensors."""
    return wgrad_fp8_problem(tokens, m, n, seed, ab)


def _dev(a, sfa, b, sfb, off):
    return (a.cuda(), blockwise_sfa_layout(sfa.cuda()), b.cuda(), blockwise_sfa_layout(sfb.cuda()), off.cuda())


EXACT = [  # (tokens per expert, M, N, axes)
    ([256, 0, 700, 100], 256, 192, {}),                                   # ragged + empty, N tail
    ([512, 300], 128, 200, {"tile_n": 128, "d_dtype": "float32"}),        # N tail at tile N 128
    ([256, 0, 700, 100], 256, 200, {"tile_n": 128}),                      # bf16 D at tile N 128 (bench/wgrad.py
                                                                          # --fp8-tile-n), empty expert, N tail
    ([1000, 0, 0], 384, 256, {"ab_dtype": "float8_e5m2"}),                # L experts, two empty
    ([0, 0], 128, 128, {"d_dtype": "float32"}),                           # no tokens at all: zeros
    ([2048], 256, 512, {}),                                               # L = 1, 16 k-blocks
]


@pytest.mark.parametrize("tokens,m,n,axes", EXACT)
def test_exact_against_the_interpreter(tokens, m, n, axes):
    ab = axes.get("ab_dtype", "float8_e4m3fn")
    a, sfa, b, sfb, off, alpha = _exact(tokens, m, n, len(tokens) + m + n, ab)
    op = fusegemm.Op("grouped_gemm_wgrad_fp8", **axes)
    out = op(*_dev(a, sfa, b, sfb, off), inputs={"alpha": alpha.cuda()})
    torch.cuda.synchronize()
    assert tuple(out["d"].shape) == (len(tokens), m, n)
    ref = op.reference(a, sfa, b, sfb, off, inputs={"alpha": alpha})
    err, problem = compare_outputs({"d": np.asarray(ref["d"])}, {"d": out["d"].reshape(len(tokens) * m, n)},
                                   exact=True)
    assert problem is None, (problem, err)
    if not any(tokens):
        assert not out["d"].any()


def test_many_experts_mostly_empty_and_row_ends():
    """256 experts, three with tokens; row_ends skip the k-blocks past each expert's tokens (the
    padding is zero, so D is unchanged)."""
    tokens = [0] * 256
    tokens[3], tokens[200], tokens[255] = 256, 300, 130
    a, sfa, b, sfb, off, alpha = _exact(tokens, 128, 128, 9, "float8_e4m3fn")
    op = fusegemm.Op("grouped_gemm_wgrad_fp8", tile_n=128)
    starts = np.concatenate([[0], off.numpy()[:-1]])
    row_ends = torch.tensor(starts + np.array(tokens), dtype=torch.int32)
    dev = _dev(a, sfa, b, sfb, off)
    out = op(*dev, inputs={"alpha": alpha.cuda()})
    out_ends = op(*dev, inputs={"alpha": alpha.cuda()}, row_ends=row_ends.cuda())
    torch.cuda.synchronize()
    ref = op.reference(a, sfa, b, sfb, off, inputs={"alpha": alpha})
    for got in (out, out_ends):
        err, problem = compare_outputs({"d": np.asarray(ref["d"])}, {"d": got["d"].reshape(256 * 128, 128)},
                                       exact=True)
        assert problem is None, (problem, err)


@pytest.mark.parametrize("tile_n", [128, 256])
def test_realistic_values_quantized_on_the_device(tile_n):
    """Normal BF16 dY and X quantized by quantize_wgrad on the GPU: D (float32) within 2e-3 of the
    interpreter's largest magnitude (the FP8 WGMMA's accumulator within a 128-token block is not
    FP32; the blockwise M-grouped tests' bound), within 2e-3 of alpha dequant(dY^T) dequant(X^T)^T
    computed here in float64, and within the recipe's quantization error of torch's BF16 gradient
    (5e-2 of the largest magnitude; the reference's own gap on these operands: 0.036)."""
    g = torch.Generator().manual_seed(5)
    tokens, m, n = [512, 0, 1280, 256], 256, 384
    t_all = sum(tokens)
    dy = torch.randn(t_all, m, generator=g).to(torch.bfloat16).cuda()
    x = torch.randn(t_all, n, generator=g).to(torch.bfloat16).cuda()
    off = torch.tensor(np.cumsum(tokens), dtype=torch.int32).cuda()
    alpha = torch.tensor([1.0, 2.0, 0.5, 1.5]).cuda()
    a, sfa = quantize_wgrad(dy)
    b, sfb = quantize_wgrad(x)
    op = fusegemm.Op("grouped_gemm_wgrad_fp8", tile_n=tile_n, d_dtype="float32")
    out = op(a, sfa, b, sfb, off, inputs={"alpha": alpha})["d"].cpu().double().numpy()
    torch.cuda.synchronize()
    ref = np.asarray(op.reference(a, sfa, b, sfb, off, inputs={"alpha": alpha})["d"], np.float64).reshape(4, m, n)
    scale = np.abs(ref).max()
    assert np.abs(out - ref).max() <= 2e-3 * scale
    ad = a.cpu().float().double().numpy() * np.repeat(sfa.cpu().double().numpy(), 128, axis=1)
    bd = b.cpu().float().double().numpy() * np.repeat(sfb.cpu().double().numpy(), 128, axis=1)
    bf16 = torch.zeros(4, m, n, dtype=torch.float64)
    start = 0
    for e, tok in enumerate(tokens):
        want = float(alpha[e]) * ad[:, start:start + tok] @ bd[:, start:start + tok].T
        assert np.abs(out[e] - want).max() <= 2e-3 * scale, e
        bf16[e] = float(alpha[e]) * (dy[start:start + tok].double().t() @ x[start:start + tok].double()).cpu()
        start += tok
    assert np.abs(out - bf16.numpy()).max() <= 5e-2 * np.abs(bf16.numpy()).max()


def test_power_of_two_e8m0_scales():
    """The recipe's UE8M0 scales (sf_dtype float8_e8m0fnu at 128): converted to FP32 on the device
    per call, exactly: D bit for bit the FP32-scale op's and the reference's."""
    from fusegemm.formats import e8m0_bytes
    a, sfa, b, sfb, off, alpha = _exact([256, 0, 700, 100], 256, 192, 12, "float8_e4m3fn")
    ea, eb = e8m0_bytes(sfa.contiguous()).cuda(), e8m0_bytes(sfb.contiguous()).cuda()
    op = fusegemm.Op("grouped_gemm_wgrad_fp8", sf_dtype="float8_e8m0fnu", sf_vec_size=128)
    out = op(a.cuda(), ea, b.cuda(), eb, off.cuda(), inputs={"alpha": alpha.cuda()})
    fp32 = fusegemm.Op("grouped_gemm_wgrad_fp8")(*_dev(a, sfa, b, sfb, off), inputs={"alpha": alpha.cuda()})
    torch.cuda.synchronize()
    assert torch.equal(out["d"], fp32["d"])
    ref = op.reference(a, ea.cpu(), b, eb.cpu(), off, inputs={"alpha": alpha})
    err, problem = compare_outputs({"d": np.asarray(ref["d"])}, {"d": out["d"].reshape(4 * 256, 192)}, exact=True)
    assert problem is None, (problem, err)


def test_execute_into_a_caller_buffer():
    a, sfa, b, sfb, off, _ = _exact([256, 512], 128, 256, 4, "float8_e4m3fn")
    dev = _dev(a, sfa, b, sfb, off)
    op = fusegemm.Op("grouped_gemm_wgrad_fp8")
    out = op(*dev)["d"]
    buf = torch.full((2 * 128, 256), float("nan"), dtype=torch.bfloat16, device="cuda")
    op.execute(*dev, outputs={"d": buf})
    torch.cuda.synchronize()
    assert torch.equal(buf, out.reshape(256, 256))
