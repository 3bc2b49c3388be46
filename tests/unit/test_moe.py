"""fusegemm.moe on the CPU: the gate/up interleave helpers, the dSwiGLU formulas against autograd,
and torch.autograd.gradcheck of ExpertMLPFunction's hand-written backward (torch backend, float64;
ragged and empty experts, a row past the last expert). The fusegemm backend is held to the torch
one on the H200 (tests/gpu/test_moe_gpu.py)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from fusegemm import moe  # noqa: E402


def test_interleave_puts_gate_and_up_in_alternating_32_row_blocks():
    g = torch.Generator().manual_seed(0)
    wg, wu = torch.randn(2, 64, 8, generator=g), torch.randn(2, 64, 8, generator=g)
    w1 = moe.interleave_gate_up(wg, wu)
    assert torch.equal(w1[:, :32], wg[:, :32]) and torch.equal(w1[:, 32:64], wu[:, :32])
    assert torch.equal(w1[:, 64:96], wg[:, 32:]) and torch.equal(w1[:, 96:], wu[:, 32:])
    x = torch.randn(5, 8, generator=g)
    gate, up = moe.split_gate_up(x @ w1[1].T)
    torch.testing.assert_close(gate, x @ wg[1].T)
    torch.testing.assert_close(up, x @ wu[1].T)
    assert torch.equal(moe.join_gate_up(gate, up), x @ w1[1].T)
    with pytest.raises(ValueError, match="w_gate/w_up: got"):
        moe.interleave_gate_up(torch.zeros(1, 48, 8), torch.zeros(1, 48, 8))


def test_swiglu_backward_matches_autograd():
    g = torch.Generator().manual_seed(1)
    pre = torch.randn(7, 128, dtype=torch.float64, generator=g, requires_grad=True)
    prob = torch.rand(7, dtype=torch.float64, generator=g, requires_grad=True)
    dh = torch.randn(7, 64, dtype=torch.float64, generator=g)
    gate, up = moe.split_gate_up(pre)
    (torch.nn.functional.silu(gate) * up * prob[:, None]).backward(dh)
    dg, dprob = moe.swiglu_backward(pre.detach(), dh, prob.detach())
    torch.testing.assert_close(dg, pre.grad)
    torch.testing.assert_close(dprob, prob.grad)


def test_gradcheck_of_the_layers_backward():
    g = torch.Generator().manual_seed(2)
    off = torch.tensor([2, 2, 5], dtype=torch.int32)          # ragged, an empty expert, row 5 past the end
    x = torch.randn(6, 4, dtype=torch.float64, generator=g, requires_grad=True)
    prob = torch.rand(6, dtype=torch.float64, generator=g, requires_grad=True)
    w1 = (torch.randn(3, 64, 4, dtype=torch.float64, generator=g) * 0.5).requires_grad_()
    w2 = (torch.randn(3, 4, 32, dtype=torch.float64, generator=g) * 0.5).requires_grad_()
    fn = lambda x, prob, w1, w2: moe.ExpertMLPFunction.apply(x, off, prob, w1, w2, "torch")  # noqa: E731
    assert torch.autograd.gradcheck(fn, (x, prob, w1, w2), eps=1e-6, atol=1e-7)
    y = fn(x, prob, w1, w2)
    assert torch.equal(y[5], torch.zeros(4, dtype=torch.float64))


def test_module_arguments():
    with pytest.raises(ValueError, match="intermediate: got 48; allowed: a multiple of 32"):
        moe.ExpertMLP(2, 64, 48)
    with pytest.raises(ValueError, match="backend: got 'cublas'; allowed: torch, fusegemm"):
        moe.ExpertMLP(2, 64, 64, backend="cublas")
    m = moe.ExpertMLP(2, 64, 64, backend="torch", dtype=torch.float32)
    assert m.w1.shape == (2, 128, 64) and m.w2.shape == (2, 64, 64)
