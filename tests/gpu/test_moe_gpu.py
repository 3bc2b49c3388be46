"""fusegemm.moe.ExpertMLP on the H200: the fusegemm backend (fused SwiGLU fc1, grouped GEMMs for
fc2 and both data gradients) against the torch backend of the same layer (whose backward
gradcheck verifies on the CPU), on ragged and empty experts with zero padding rows.

Tolerance: relative Frobenius error <= 1e-2 per tensor. Both run in bfloat16 with FP32
accumulation; they differ by where bf16 rounding happens (the fused epilogue computes
``silu(gate) * up`` from FP32 accumulators, the torch backend from bf16-rounded GEMM outputs):
one to a few bf16 ulps (2**-8 relative) per element."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from fusegemm import moe  # noqa: E402

pytestmark = pytest.mark.gpu


def _rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


def test_expert_mlp_matches_the_torch_layer_forward_and_backward():
    tokens, hidden, inter = [300, 0, 512, 17], 256, 256
    g = torch.Generator(device="cuda").manual_seed(5)
    padded = [-(-t // 256) * 256 for t in tokens]
    ends = torch.tensor(padded, device="cuda").cumsum(0).to(torch.int32)
    m = int(ends[-1]) + 256                                        # a tail past the last expert
    x = torch.zeros(m, hidden, device="cuda", dtype=torch.bfloat16)
    prob = torch.zeros(m, device="cuda")
    start = 0
    for t, p in zip(tokens, padded):
        x[start:start + t] = torch.randn(t, hidden, generator=g, device="cuda").bfloat16()
        prob[start:start + t] = torch.rand(t, generator=g, device="cuda")
        start += p
    layers = {name: moe.ExpertMLP(4, hidden, inter, backend=name, device="cuda",
                                  generator=torch.Generator().manual_seed(6)) for name in ("fusegemm", "torch")}
    out = {}
    for name, layer in layers.items():
        xi, pi = x.clone().requires_grad_(), prob.clone().requires_grad_()
        y = layer(xi, ends, pi)
        dy = torch.randn(y.shape, generator=torch.Generator(device="cuda").manual_seed(7), device="cuda")
        y.backward(dy.bfloat16())
        out[name] = dict(y=y, dx=xi.grad, dprob=pi.grad, dw1=layer.w1.grad, dw2=layer.w2.grad)
    for key in ("y", "dx", "dprob", "dw1", "dw2"):
        got, want = out["fusegemm"][key], out["torch"][key]
        assert torch.isfinite(got.float()).all(), key
        assert _rel(got, want) <= 1e-2, (key, _rel(got, want))
    valid = int(ends[-1])
    assert not out["fusegemm"]["y"][valid:].any() and not out["fusegemm"]["dx"][valid:].any()
