"""MoE routing (fusegemm/routing.py) and the whole layer (fusegemm.moe.MoEBlock, torch backend) on
the CPU: the permutation against a loop over tokens, data-independent shapes (meta tensors: no
step can read a value back), and MoEBlock's output and every gradient against a plain torch MoE
layer (top-k, per-choice expert matmuls, SwiGLU, sum over k) in float64 weights and tokens with
float32 routing weights (both sides), within 1e-6 relative."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from fusegemm.base.errors import ArgumentError  # noqa: E402
from fusegemm.moe import split_gate_up  # noqa: E402
from fusegemm.moe import MoEBlock  # noqa: E402
from fusegemm.routing import combine, gather, padded_rows, route, row_probs  # noqa: E402


def _logits(tokens, experts, seed, cold=()):
    """Random logits; the ``cold`` experts are never among anyone's top k (empty experts)."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(tokens, experts, generator=g, dtype=torch.float64)
    for e in cold:
        z[:, e] = -1e4
    return z


CASES = [(40, 8, 1, ()), (40, 8, 2, (3, 5)), (33, 8, 8, ()), (300, 4, 2, (0,)), (1, 6, 3, ()), (0, 4, 2, ())]


@pytest.mark.parametrize("tokens,experts,top_k,cold", CASES)
def test_rows_are_expert_sorted_padded_and_in_token_order(tokens, experts, top_k, cold):
    r = route(_logits(tokens, experts, 1, cold), top_k)
    off = r.padded_offsets.tolist()
    assert r.padded_offsets.dtype == torch.int32 and r.rows == padded_rows(tokens, experts, top_k)
    assert r.rows % 256 == 0 and all(o % 256 == 0 for o in off) and off == sorted(off) and off[-1] <= r.rows
    starts = [0] + off[:-1]
    experts_of = r.experts.tolist()
    for e in range(experts):
        # The loop reference: expert e's rows hold, in token order, every token that chose e.
        want = [t for t in range(tokens) for j in range(top_k) if experts_of[t][j] == e]
        rows = r.token_of_row[starts[e]:off[e]].tolist()
        assert rows[:len(want)] == want and all(x == -1 for x in rows[len(want):])
        assert off[e] - starts[e] == -(-len(want) // 256) * 256
        if e in cold:
            assert not want and off[e] == starts[e]
    assert (r.token_of_row[off[-1]:] == -1).all() if off else True
    for t in range(tokens):
        for j in range(top_k):
            assert r.token_of_row[r.row_of[t, j]] == t                       # each choice's row reads it
    assert len(set(r.row_of.reshape(-1).tolist())) == tokens * top_k          # one row per choice


def test_probabilities_are_the_softmax_top_k_and_renormalize():
    z = _logits(16, 8, 2)
    r = route(z, 3)
    p = torch.softmax(z.float(), -1)
    want, idx = p.topk(3, -1)
    assert torch.equal(r.experts, idx) and torch.equal(r.probs, want) and r.probs.dtype == torch.float32
    rn = route(z, 3, normalize=True)
    torch.testing.assert_close(rn.probs.sum(-1), torch.ones(16), rtol=0, atol=1e-6)
    rows = row_probs(r)
    assert rows.shape == (r.rows,) and rows[r.token_of_row < 0].abs().sum() == 0
    assert torch.equal(rows[r.row_of], r.probs)


def test_gather_and_combine_are_inverse_over_the_k_copies():
    x = torch.randn(40, 16, dtype=torch.float64)
    r = route(_logits(40, 8, 3, cold=(2,)), 2)
    rows = gather(x, r)
    assert rows.shape == (r.rows, 16) and (rows[r.token_of_row < 0] == 0).all()
    torch.testing.assert_close(combine(rows, r), 2 * x, rtol=0, atol=0)


def test_gather_and_combine_gradients_are_each_others_transpose():
    """Their backwards are written by hand (each the other's forward): gradcheck both, twice."""
    r = route(_logits(11, 6, 3, cold=(4,)), 3)
    x = torch.randn(11, 5, dtype=torch.float64, requires_grad=True)
    rows = torch.randn(r.rows, 5, dtype=torch.float64, requires_grad=True)
    for f, v in ((lambda t: gather(t, r), x), (lambda t: combine(t, r), rows)):
        assert torch.autograd.gradcheck(f, (v,), fast_mode=True)
        assert torch.autograd.gradgradcheck(f, (v,), fast_mode=True)


def test_shapes_depend_on_the_sizes_only():
    """On meta tensors nothing has a value, so any step that read one back (bincount's length,
    nonzero, .item()) would fail here: the routing is free of host synchronisation."""
    r = route(torch.empty(1000, 32, device="meta"), 8)
    assert r.token_of_row.device.type == "meta" and r.rows == padded_rows(1000, 32, 8)
    assert tuple(r.row_of.shape) == (1000, 8) and tuple(r.padded_offsets.shape) == (32,)
    x = torch.empty(1000, 64, device="meta")
    assert tuple(combine(gather(x, r), r).shape) == (1000, 64) and tuple(row_probs(r).shape) == (r.rows,)


@pytest.mark.parametrize("bad,msg", [
    (dict(top_k=0), r"^top_k: got 0; allowed: an int from 1 to 4"),
    (dict(top_k=5), r"^top_k: got 5"),
    (dict(top_k=True), r"^top_k: got True"),
    (dict(logits=torch.zeros(3, 4, dtype=torch.int64)), r"^logits: got \(3, 4\); allowed: a \(tokens, experts\) "
                                                        r"float"),
    (dict(logits=torch.zeros(12)), r"^logits: got \(12,\)"),
    (dict(normalize=1), r"^normalize: got 1"),
])
def test_route_refuses_with_the_argument_named(bad, msg):
    kw = {"logits": torch.zeros(3, 4), "top_k": 2, **bad}
    logits, top_k = kw.pop("logits"), kw.pop("top_k")
    with pytest.raises(ArgumentError, match=msg):
        route(logits, top_k, **kw)


def _plain_layer(x, logits, w1, w2, top_k, normalize):
    """A plain torch MoE layer: softmax top-k, each choice through its expert, weighted sum."""
    probs, idx = torch.softmax(logits.float(), -1).topk(top_k, -1)
    if normalize:
        probs = probs / probs.sum(-1, keepdim=True)
    gate, up = split_gate_up(w1.transpose(1, 2))              # (L, H, F) each
    gate, up = gate.transpose(1, 2)[idx], up.transpose(1, 2)[idx]   # (T, k, F, H)
    h = torch.nn.functional.silu(torch.einsum("tkfh,th->tkf", gate, x)) * torch.einsum("tkfh,th->tkf", up, x)
    h = h * probs.to(h.dtype)[..., None]
    return torch.einsum("tkhf,tkf->th", w2[idx], h)


@pytest.mark.parametrize("top_k,normalize,cold", [(1, False, (1,)), (2, True, (0, 6)), (8, False, ())])
def test_moe_block_matches_a_plain_torch_layer_with_every_gradient(top_k, normalize, cold):
    torch.manual_seed(0)
    block = MoEBlock(16, 64, 8, top_k, normalize=normalize, dtype=torch.float64, backend="torch",
                     generator=torch.Generator().manual_seed(4))
    x = torch.randn(37, 16, dtype=torch.float64, requires_grad=True)
    logits = _logits(37, 8, 5, cold).requires_grad_(True)
    y = block(x, logits)
    dy = torch.randn_like(y)
    (y * dy).sum().backward()
    got = (y.detach(), x.grad, logits.grad, block.mlp.w1.grad, block.mlp.w2.grad)
    x2, z2 = x.detach().clone().requires_grad_(True), logits.detach().clone().requires_grad_(True)
    w1, w2 = (block.mlp.w1.detach().clone().requires_grad_(True), block.mlp.w2.detach().clone().requires_grad_(True))
    y2 = _plain_layer(x2, z2, w1, w2, top_k, normalize)
    (y2 * dy).sum().backward()
    want = (y2.detach(), x2.grad, z2.grad, w1.grad, w2.grad)
    for name, g, w in zip(("y", "dx", "dlogits", "dw1", "dw2"), got, want):
        scale = w.abs().max().item() or 1.0
        assert g.shape == w.shape, name
        assert (g - w).abs().max().item() <= 1e-6 * scale, name
    assert logits.grad[:, list(cold)].abs().max().item() < 1e-300 if cold else True   # unchosen: no gradient


def test_moe_block_refuses_shapes_with_the_argument_named():
    block = MoEBlock(16, 64, 4, 2, dtype=torch.float64, backend="torch")
    with pytest.raises(ArgumentError, match=r"^x.shape: got \(5, 8\); allowed: \(\.\.\., 16\)"):
        block(torch.zeros(5, 8, dtype=torch.float64), torch.zeros(5, 4))
    with pytest.raises(ArgumentError, match=r"^logits.shape: got \(5, 3\); allowed: \(5, 4\)"):
        block(torch.zeros(5, 16, dtype=torch.float64), torch.zeros(5, 3))
    with pytest.raises(ArgumentError, match=r"^top_k: got 5; allowed: an int from 1 to experts \(4\)"):
        MoEBlock(16, 64, 4, 5, backend="torch")
    with pytest.raises(ArgumentError, match=r"^experts: got 0; allowed: an int of at least 1"):
        MoEBlock(16, 64, 0, 1, backend="torch")
    with pytest.raises(ArgumentError, match=r"^logits.shape: got \(6, 4\); allowed: \(2, 3, 4\)"):
        block(torch.zeros(2, 3, 16, dtype=torch.float64), torch.zeros(6, 4))


@pytest.mark.parametrize("block_class", ["MoEBlock", "ExpertParallelMoEBlock"])
def test_blocks_name_dtype_and_device_mismatches(block_class):
    """x in another dtype or on another device than the expert weights, logits on another device
    than x: both blocks name the argument before they route (moe.block_rows), not torch's
    own error from inside the top-k or a matmul."""
    from fusegemm.expert_parallel import ExpertParallelMoEBlock
    cls = {"MoEBlock": MoEBlock, "ExpertParallelMoEBlock": ExpertParallelMoEBlock}[block_class]
    block = cls(16, 64, 4, 2, dtype=torch.float64, backend="torch")
    x, logits = torch.zeros(5, 16, dtype=torch.float64), torch.zeros(5, 4)
    weights = "the expert weights'"
    with pytest.raises(ArgumentError, match=rf"^x\.dtype: got torch\.float32; allowed: torch\.float64: {weights}"):
        block(x.float(), logits)
    with pytest.raises(ArgumentError, match=rf"^x\.device: got meta; allowed: cpu: {weights} device$"):
        block(x.to("meta"), logits)
    with pytest.raises(ArgumentError, match=r"^logits\.device: got meta; allowed: cpu: x's device$"):
        block(x, logits.to("meta"))
    assert block(x, logits).shape == (5, 16)


def test_moe_block_takes_leading_dimensions_as_tokens():
    """x (batch, sequence, H) and logits (batch, sequence, E), as a transformer passes them: the
    block's output has x's shape and every value and gradient is the flattened call's, bit for bit."""
    torch.manual_seed(3)
    block = MoEBlock(16, 64, 4, 2, dtype=torch.float64, backend="torch")
    x = torch.randn(2, 3, 16, dtype=torch.float64, requires_grad=True)
    logits = torch.randn(2, 3, 4, requires_grad=True)
    dy = torch.randn(2, 3, 16, dtype=torch.float64)
    y = block(x, logits)
    (y * dy).sum().backward()
    x2 = x.detach().reshape(6, 16).requires_grad_(True)
    z2 = logits.detach().reshape(6, 4).requires_grad_(True)
    w_grads = (block.mlp.w1.grad.clone(), block.mlp.w2.grad.clone())
    block.zero_grad()
    y2 = block(x2, z2)
    (y2 * dy.reshape(6, 16)).sum().backward()
    assert y.shape == (2, 3, 16)
    assert torch.equal(y.detach().reshape(6, 16), y2.detach())
    assert torch.equal(x.grad.reshape(6, 16), x2.grad) and torch.equal(logits.grad.reshape(6, 4), z2.grad)
    assert torch.equal(w_grads[0], block.mlp.w1.grad) and torch.equal(w_grads[1], block.mlp.w2.grad)


def test_a_batch_without_tokens():
    """T = 0 (a micro-batch or a rank with no tokens): an empty output and empty gradients, the
    weights' gradients zero; the combine's reshape once failed on the empty rows."""
    block = MoEBlock(16, 64, 4, 2, dtype=torch.float64, backend="torch")
    x = torch.zeros(0, 16, dtype=torch.float64, requires_grad=True)
    logits = torch.zeros(0, 4, requires_grad=True)
    y = block(x, logits)
    y.sum().backward()
    assert y.shape == (0, 16) and x.grad.shape == (0, 16) and logits.grad.shape == (0, 4)
    assert block.mlp.w1.grad.abs().max() == 0 and block.mlp.w2.grad.abs().max() == 0


def test_moe_block_with_the_fp8_block_recipe_is_the_bf16_block_within_fp8_rounding():
    """The whole layer (routing, gather, the expert MLP, combine) with recipe="fp8_block" on the
    torch backend: output and every gradient (x, the logits, both weights) within 10% of the same
    block unquantized (relative Frobenius; e4m3 rounding in every GEMM), and not equal."""
    torch.manual_seed(0)
    x = torch.randn(300, 128)
    logits = torch.randn(300, 4)
    dy = torch.randn(300, 128)
    got = {}
    for recipe in ("bf16", "fp8_block"):
        block = MoEBlock(128, 64, 4, 2, dtype=torch.float32, backend="torch", recipe=recipe,
                         generator=torch.Generator().manual_seed(4))
        xi, zi = x.clone().requires_grad_(True), logits.clone().requires_grad_(True)
        y = block(xi, zi)
        (y * dy).sum().backward()
        got[recipe] = (y.detach(), xi.grad, zi.grad, block.mlp.w1.grad, block.mlp.w2.grad)
    for name, a, b in zip(("y", "dx", "dlogits", "dw1", "dw2"), got["fp8_block"], got["bf16"]):
        rel = float((a - b).norm() / b.norm())
        assert 1e-3 < rel < 0.1, (name, rel)
