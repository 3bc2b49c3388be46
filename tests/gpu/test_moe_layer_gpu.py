"""fusegemm.moe.MoEBlock and fusegemm.routing on the GPU: the fusegemm backend against the torch
backend of the same layer (whose output and every gradient match a plain torch MoE layer on the
CPU: tests/unit/test_routing.py), and the routing captured in a CUDA graph (it reads nothing back
to the host) and replayed on new logits.

Tolerance: relative Frobenius error <= 2e-2 per tensor (both in bfloat16 with FP32 accumulation;
they round to bf16 at different places, one to a few bf16 ulps per element, and the logits'
gradient sums those over the hidden size)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from fusegemm import moe, routing  # noqa: E402
from op_helpers import poison_free_blocks  # noqa: E402  (tests/gpu/op_helpers.py)

pytestmark = pytest.mark.gpu


def _rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


@pytest.mark.parametrize("top_k", [1, 2, 8])
def test_moe_block_matches_the_torch_backend_forward_and_backward(top_k):
    g = torch.Generator(device="cuda").manual_seed(3)
    tokens, hidden, inter, experts = 700, 256, 256, 8
    x = torch.randn(tokens, hidden, generator=g, device="cuda").bfloat16()
    logits = torch.randn(tokens, experts, generator=g, device="cuda")
    logits[:, 5] = -1e4          # an expert nobody prefers: empty unless top_k = experts (then weight ~0)
    dy = torch.randn(tokens, hidden, generator=g, device="cuda").bfloat16()
    out = {}
    for backend in ("fusegemm", "torch"):
        block = moe.MoEBlock(hidden, inter, experts, top_k, backend=backend, device="cuda",
                             generator=torch.Generator().manual_seed(4))
        xi, zi = x.clone().requires_grad_(), logits.clone().requires_grad_()
        y = block(xi, zi)
        (y.float() * dy.float()).sum().backward()
        out[backend] = (y, xi.grad, zi.grad, block.mlp.w1.grad, block.mlp.w2.grad)
    for name, got, want in zip(("y", "dx", "dlogits", "dw1", "dw2"), out["fusegemm"], out["torch"]):
        assert got.shape == want.shape, name
        assert _rel(got, want) <= 2e-2, (name, _rel(got, want))


def _routed_and_permuted(top_k: int, wgrad: str = "auto") -> dict:
    """Output and gradients (y, dx, dlogits, dw1, dw2) of RoutedMLPFunction ("routed", as the
    module's switches stand) and of the block's permuted path ("permuted") on one seeded batch:
    900 tokens, hidden 256, intermediate 384, 8 experts, expert 2 picked by nobody."""
    g = torch.Generator(device="cuda").manual_seed(5)
    tokens, hidden, inter, experts = 900, 256, 384, 8
    x = torch.randn(tokens, hidden, generator=g, device="cuda").bfloat16()
    logits = torch.randn(tokens, experts, generator=g, device="cuda")
    logits[:, 2] = -1e4
    dy = torch.randn(tokens, hidden, generator=g, device="cuda").bfloat16()
    block = moe.MoEBlock(hidden, inter, experts, top_k, wgrad=wgrad, device="cuda",
                         generator=torch.Generator().manual_seed(6))
    out = {}
    for path in ("routed", "permuted"):
        block.zero_grad(set_to_none=True)
        xi, zi = x.clone().requires_grad_(), logits.clone().requires_grad_()
        r = routing.route(zi, top_k)
        if path == "routed":
            y = moe.RoutedMLPFunction.apply(xi, r.token_of_row, r.row_of, r.padded_offsets, r.row_ends,
                                            routing.row_probs(r), block.mlp.w1, block.mlp.w2, wgrad)
        else:
            y = block(xi, zi)
        (y.float() * dy.float()).sum().backward()
        out[path] = (y, xi.grad, zi.grad, block.mlp.w1.grad, block.mlp.w2.grad)
    return out


def _sm90a_only():
    from fusegemm.ops.device import device_arch
    if device_arch(torch.cuda.current_device()) != "sm_90a":
        pytest.skip("the gathered kernels, the row ends' tile skipping and the M-major D are sm_90a's")


@pytest.mark.parametrize("top_k,wgrad", [(1, "auto"), (8, "auto"), (2, "torch")])
@pytest.mark.parametrize("gathered", [False, True, "stored"])
def test_routed_mlp_is_bit_equal_to_the_permuted_block(top_k, wgrad, gathered, monkeypatch):
    """RoutedMLPFunction (the routing's row ends skip the padding's tiles; with GATHERED_LOADS the
    GEMMs read x's and dy's token rows through the index; with STORED_GATHERS fc1 and the dSwiGLU
    GEMM do, and store the rows for the weight gradients): output and every gradient equal the
    block's permuted path bit for bit (the same kernels on the same values; the logits' gradient
    within 1e-5, dprob's atomic sums), with an empty expert and padding rows."""
    _sm90a_only()
    monkeypatch.setattr(moe, "GATHERED_LOADS", gathered is True)
    monkeypatch.setattr(moe, "STORED_GATHERS", gathered == "stored")
    out = _routed_and_permuted(top_k, wgrad)
    for name, got, want in zip(("y", "dx", "dlogits", "dw1", "dw2"), out["routed"], out["permuted"]):
        if name == "dlogits":   # dprob sums N tiles with atomics: their order varies run to run
            assert _rel(got, want) <= 1e-5, (name, _rel(got, want))
        else:
            assert torch.equal(got, want), (name, _rel(got, want))


@pytest.mark.parametrize("top_k", [1, 8])
def test_moe_block_with_gathered_loads_is_bit_equal_to_its_permuted_path(top_k):
    """MoEBlock(loads="gathered") runs RoutedMLPFunction's gathered kernels (no gather kernel in
    the step) and gives the permuted block's output and gradients bit for bit (the logits'
    gradient within 1e-5: dprob's atomic sums), with an expert nobody picks."""
    _sm90a_only()
    x, logits, dy = _step_inputs(tokens=900, experts=8, seed=7)
    logits[:, 3] = -1e4
    out = {}
    for loads in ("permuted", "gathered"):
        block = moe.MoEBlock(256, 384, 8, top_k, device="cuda", generator=torch.Generator().manual_seed(6),
                             loads=loads)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            out[loads] = _step(block, x, logits, dy)
            torch.cuda.synchronize()
        calls = [e.name for e in prof.events() if "gather_rows" in e.name]
        assert bool(calls) == (loads == "permuted"), (loads, calls)
    for name, got, want in zip(("y", "dx", "dlogits", "dw1", "dw2"), out["gathered"], out["permuted"]):
        if name == "dlogits":
            assert _rel(got, want) <= 1e-5, (name, _rel(got, want))
        else:
            assert torch.equal(got, want), (name, _rel(got, want))


def test_moe_block_auto_loads_follow_the_intermediate_size():
    """MoEBlock's default loads="auto": the gathered kernels (no gather kernel in the step) below
    moe.PERMUTED_MIN_INTERMEDIATE, the permuted path (gather kernels) from it up."""
    _sm90a_only()
    x, logits, dy = _step_inputs(tokens=300, experts=2, seed=8)
    for inter, permuted in ((moe.PERMUTED_MIN_INTERMEDIATE - 256, False), (moe.PERMUTED_MIN_INTERMEDIATE, True)):
        block = moe.MoEBlock(256, inter, 2, 1, device="cuda", generator=torch.Generator().manual_seed(6))
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            _step(block, x, logits, dy)
            torch.cuda.synchronize()
        calls = [e.name for e in prof.events() if "gather_rows" in e.name]
        assert bool(calls) == permuted, (inter, calls)


@pytest.mark.parametrize("top_k", [2, 8])
def test_routed_mlp_with_the_swapped_weight_gradient(top_k, monkeypatch):
    """GATHERED_LOADS with SWAPPED_WGRAD: fc1's weight gradient as (X^T dG)^T, X's token rows
    gathered as A and D stored M-major (cd_major m). Everything else is the permuted block's bit
    for bit; dW1 sums the same products with the WGMMA roles swapped, within a BF16 rounding of
    the block's (relative Frobenius 2**-8), zero for the expert nobody picks."""
    _sm90a_only()
    monkeypatch.setattr(moe, "GATHERED_LOADS", True)
    monkeypatch.setattr(moe, "SWAPPED_WGRAD", True)
    out = _routed_and_permuted(top_k)
    for name, got, want in zip(("y", "dx", "dlogits", "dw1", "dw2"), out["routed"], out["permuted"]):
        if name == "dlogits":
            assert _rel(got, want) <= 1e-5, (name, _rel(got, want))
        elif name == "dw1":
            assert _rel(got, want) <= 2.0 ** -8, (name, _rel(got, want))
            assert not got[2].any()
        else:
            assert torch.equal(got, want), (name, _rel(got, want))


@pytest.mark.parametrize("top_k", [1, 8])
def test_gathers_in_token_order_change_no_value_of_the_block(top_k, monkeypatch):
    """routing.TOKEN_ORDER (x's and dy's gathers by fusegemm_spread_rows, each token's row read
    once): the block's output and every gradient bit for bit those of the row-order gathers, and
    so is RoutedMLPFunction's."""
    _sm90a_only()
    with_rows = {}
    for order in (False, True):
        monkeypatch.setattr(routing, "TOKEN_ORDER", order)
        with_rows[order] = _routed_and_permuted(top_k)
    for path in ("routed", "permuted"):
        for name, got, want in zip(("y", "dx", "dlogits", "dw1", "dw2"), with_rows[True][path], with_rows[False][path]):
            if name == "dlogits":
                assert _rel(got, want) <= 1e-5, (path, name, _rel(got, want))
            else:
                assert torch.equal(got, want), (path, name, _rel(got, want))


def _batch(seed: int, experts: int, tokens: int = 1100, hidden: int = 256) -> tuple:
    """x, logits (expert 1 picked by nobody) and the output gradient of one seeded batch."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=g, device="cuda").bfloat16()
    logits = torch.randn(tokens, experts, generator=g, device="cuda")
    logits[:, 1] = -1e4
    dy = torch.randn(tokens, hidden, generator=g, device="cuda").bfloat16()
    return x, logits, dy


def _assert_same_values(got_all, want_all):
    """(y, dx, dlogits, dw1, dw2) bit for bit, the logits' gradient within 1e-5 (dprob's atomic
    sums), every value finite."""
    for name, got, want in zip(("y", "dx", "dlogits", "dw1", "dw2"), got_all, want_all):
        assert torch.isfinite(got.float()).all(), name
        if name == "dlogits":
            assert _rel(got, want) <= 1e-5, (name, _rel(got, want))
        else:
            assert torch.equal(got, want), (name, _rel(got, want))


@pytest.mark.parametrize("top_k,experts,recipe", [(2, 8, "bf16"), (8, 32, "bf16"), (8, 32, "fp8_block")])
def test_row_ends_change_no_value_of_the_block(top_k, experts, recipe):
    """MoEBlock passes the routing's row ends to its GEMMs (the compacted tile walk skips the
    padding's tiles, the K-grouped weight gradients its k-blocks; fp8_block: the FP8 weight
    gradients its 128-token blocks): output and every gradient equal the same layer without them
    bit for bit (the logits' gradient within 1e-5: dprob's atomic sums), with an empty expert."""
    x, logits, dy = _batch(8, experts)
    block = moe.MoEBlock(x.shape[1], 384, experts, top_k, device="cuda", recipe=recipe,
                         generator=torch.Generator().manual_seed(9))
    out = {}
    for ends in (True, False):
        block.zero_grad(set_to_none=True)
        xi, zi = x.clone().requires_grad_(), logits.clone().requires_grad_()
        r = routing.route(zi, top_k)
        y = routing.combine(block.mlp(routing.gather(xi, r), r.padded_offsets, routing.row_probs(r),
                                      r.row_ends if ends else None), r)
        (y.float() * dy.float()).sum().backward()
        out[ends] = (y, xi.grad, zi.grad, block.mlp.w1.grad, block.mlp.w2.grad)
    _assert_same_values(out[True], out[False])


@pytest.mark.parametrize("top_k,experts,wgrad", [(2, 8, "auto"), (8, 32, "auto"), (8, 32, "fusegemm"),
                                                 (2, 8, "torch")])
def test_unzeroed_padding_changes_no_value_of_the_block(top_k, experts, wgrad, monkeypatch):
    """moe.UNZEROED_PADDING: the BF16 GEMMs leave the padding rows no tile writes unzeroed where
    moe._padding_unread finds that nothing reads them (the K-grouped weight gradients; with
    wgrad="torch" they stay zeroed, torch's _grouped_mm reads every row). The caching allocator
    is first filled with NaN, so a padding row that some kernel does read shows up as NaN in a
    gradient: output and every gradient are bit for bit the zeroed run's (dlogits within 1e-5:
    dprob's atomic sums), with an empty expert."""
    _sm90a_only()
    x, logits, dy = _batch(12, experts)
    block = moe.MoEBlock(x.shape[1], 384, experts, top_k, wgrad=wgrad, device="cuda",
                         generator=torch.Generator().manual_seed(13))
    r = routing.route(logits, top_k)
    left = moe._padding_unread("fusegemm", wgrad, r.row_ends, routing.gather(x, r), block.mlp.w1)
    assert left == (wgrad != "torch"), "the K-grouped kernel fits these shapes"
    out = {}
    for unzeroed in (False, True):
        monkeypatch.setattr(moe, "UNZEROED_PADDING", unzeroed)
        poison_free_blocks([((512 << 20,), torch.uint8)] * 4)   # 2 GiB of NaN bytes, split by the step's allocations
        out[unzeroed] = _step(block, x, logits, dy)
    _assert_same_values(out[True], out[False])


def test_routing_runs_in_a_cuda_graph():
    """route, gather, row_probs and combine captured once, replayed on new logits and tokens:
    the same rows as an eager call (nothing in them synchronises with the host)."""
    tokens, experts, top_k, hidden = 1000, 32, 8, 64
    logits = torch.randn(tokens, experts, device="cuda")
    x = torch.randn(tokens, hidden, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):                                     # warm-up outside the capture
        routing.route(logits, top_k)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        r = routing.route(logits, top_k)
        y = routing.combine(routing.gather(x, r), r)
        p = routing.row_probs(r)
    logits.copy_(torch.randn(tokens, experts, device="cuda"))
    x.copy_(torch.randn(tokens, hidden, device="cuda"))
    graph.replay()
    torch.cuda.synchronize()
    eager = routing.route(logits, top_k)
    assert torch.equal(r.token_of_row, eager.token_of_row) and torch.equal(r.padded_offsets, eager.padded_offsets)
    assert torch.equal(p, routing.row_probs(eager))
    torch.testing.assert_close(y, top_k * x, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("loads", ["permuted", "gathered"])
def test_moe_block_on_batch_sequence_tokens(loads):
    """x (batch, sequence, H) and logits (batch, sequence, E): the output has x's shape, and it
    and every gradient are the flattened call's bit for bit (the logits' within 1e-5: dprob's
    atomic sums), on both loads."""
    x, logits, dy = _step_inputs(tokens=600, experts=8, seed=9)
    block = moe.MoEBlock(256, 384, 8, 2, device="cuda", generator=torch.Generator().manual_seed(6), loads=loads)
    flat = _step(block, x, logits, dy)
    batched = _step(block, x.view(4, 150, 256), logits.view(4, 150, 8), dy.view(4, 150, 256))
    assert batched[0].shape == (4, 150, 256) and batched[1].shape == (4, 150, 256) and batched[2].shape == (4, 150, 8)
    for name, got, want in zip(("y", "dx", "dlogits", "dw1", "dw2"), batched, flat):
        got = got.reshape(want.shape)
        if name == "dlogits":
            assert _rel(got, want) <= 1e-5, (name, _rel(got, want))
        else:
            assert torch.equal(got, want), (name, _rel(got, want))


def _step_inputs(tokens=600, hidden=256, experts=8, seed=5):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=g, device="cuda").bfloat16()
    logits = torch.randn(tokens, experts, generator=g, device="cuda")
    dy = torch.randn(tokens, hidden, generator=g, device="cuda").bfloat16()
    return x, logits, dy


def _step(block, x, logits, dy):
    """One forward + backward; (y, dx, dlogits, dw1, dw2)."""
    xi, zi = x.clone().requires_grad_(), logits.clone().requires_grad_()
    block.mlp.w1.grad = block.mlp.w2.grad = None
    y = block(xi, zi)
    y.backward(dy)
    return y.detach(), xi.grad, zi.grad, block.mlp.w1.grad, block.mlp.w2.grad


@pytest.mark.parametrize("loads", ["permuted", "gathered"])
def test_moe_block_under_torch_compile_fullgraph(loads):
    """The whole layer traced by torch.compile(fullgraph=True) (routing, the expert MLP's custom
    ops and its autograd.Function, the weight gradient's op), forward and backward: the same
    numbers as eager (loads="gathered": eager runs the gathered kernels, the compiled step the
    permuted path)."""
    x, logits, dy = _step_inputs()
    block = moe.MoEBlock(256, 256, 8, 2, device="cuda", generator=torch.Generator().manual_seed(4), loads=loads)
    eager = _step(block, x, logits, dy)
    block.forward = torch.compile(block.forward, fullgraph=True)
    compiled = _step(block, x, logits, dy)
    for name, got, want in zip(("y", "dx", "dlogits", "dw1", "dw2"), compiled, eager):
        assert _rel(got, want) <= 1e-3, (name, _rel(got, want))


@pytest.mark.parametrize("loads", ["permuted", "gathered"])
def test_moe_block_step_in_a_cuda_graph(loads):
    """Forward and backward of the whole layer captured once and replayed on new tokens and
    logits: nothing in the step synchronises with the host or allocates outside the graph."""
    x, logits, dy = _step_inputs()
    block = moe.MoEBlock(256, 256, 8, 2, device="cuda", generator=torch.Generator().manual_seed(4), loads=loads)
    xs, zs = x.clone().requires_grad_(), logits.clone().requires_grad_()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):                                     # warm-up (compiles, loads) outside the capture
        for _ in range(2):
            block(xs, zs).backward(dy)
    torch.cuda.current_stream().wait_stream(s)
    block.mlp.w1.grad = block.mlp.w2.grad = xs.grad = zs.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = block(xs, zs)
        y.backward(dy)
    x2, z2, _ = _step_inputs(seed=6)
    with torch.no_grad():
        xs.copy_(x2)
        zs.copy_(z2)
    graph.replay()
    torch.cuda.synchronize()
    got = (y.detach().clone(), xs.grad.clone(), zs.grad.clone(), block.mlp.w1.grad.clone(), block.mlp.w2.grad.clone())
    want = _step(block, x2, z2, dy)
    for name, g, w in zip(("y", "dx", "dlogits", "dw1", "dw2"), got, want):
        assert _rel(g, w) <= 1e-3, (name, _rel(g, w))
