"""bench/moe_layer.py's peer is the same layer: its plain torch MoE layer (softmax top-k, argsort,
index_select, torch._grouped_mm, SwiGLU, index_add_) against MoEBlock's torch backend on the CPU,
on the same weights and logits, so the benchmark's ratio compares like with like.

Tolerance: 2e-2 relative (both in bfloat16; they round at different places)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from _bench import bench_module  # noqa: E402  (tests/unit/_bench.py)


def _bench():
    return bench_module("moe_layer")


@pytest.mark.parametrize("top_k", [1, 2])
def test_the_torch_peer_is_moe_block(top_k):
    from fusegemm.moe import MoEBlock
    bench = _bench()
    g = torch.Generator().manual_seed(0)
    tokens, hidden, inter, experts = 96, 32, 64, 4
    x = (torch.randn(tokens, hidden, generator=g) * 0.5).bfloat16()
    logits = torch.randn(tokens, experts, generator=g)
    ours = MoEBlock(hidden, inter, experts, top_k, backend="torch", generator=torch.Generator().manual_seed(1))
    peer = bench.TorchLayer(ours.mlp.w1.detach(), ours.mlp.w2.detach(), top_k)
    with torch.no_grad():
        want, got = ours(x, logits).float(), peer(x, logits).float()
    assert float((got - want).norm() / want.norm()) <= 2e-2


def test_the_fp8_block_variant_is_the_block_on_fp8_operands():
    """--also fp8-block: the block's routing and parameters (its gradients land on them) with the
    expert MLP on the blockwise FP8 recipe (torch backend on the CPU: the recipe's quantization
    points), within the recipe's rounding of the block's output and not equal to it."""
    from fusegemm.moe import MoEBlock
    bench = _bench()
    g = torch.Generator().manual_seed(0)
    tokens, hidden, inter, experts = 96, 128, 64, 4
    x = (torch.randn(tokens, hidden, generator=g) * 0.5).requires_grad_()
    logits = torch.randn(tokens, experts, generator=g)
    block = MoEBlock(hidden, inter, experts, 2, backend="torch", dtype=torch.float32,
                     generator=torch.Generator().manual_seed(1))
    fp8 = bench.VARIANTS["fp8-block"](block)
    assert fp8.mlp.recipe == "fp8_block" and fp8.mlp.w1 is block.mlp.w1 and fp8.mlp.w2 is block.mlp.w2
    with torch.no_grad():
        want = block(x, logits)
    got = fp8(x, logits)
    rel = float((got.detach() - want).norm() / want.norm())
    assert 1e-3 < rel < 0.1, rel
    got.sum().backward()
    assert block.mlp.w1.grad is not None and block.mlp.w2.grad is not None and x.grad is not None


def test_the_null_control_is_the_block_itself():
    """--also block-again times the very module the block row times (the same parameters and
    kernels), so its ratio to the block is the method's own spread."""
    from fusegemm.moe import MoEBlock
    block = MoEBlock(32, 64, 4, 2, backend="torch", generator=torch.Generator().manual_seed(1))
    assert _bench().VARIANTS["block-again"](block) is block


@pytest.mark.parametrize("variant,loads,base", [("block-gathered", "gathered", "permuted"),
                                                ("block-permuted", "permuted", "gathered")])
def test_the_loads_variants_are_the_block_with_its_loads_set(variant, loads, base):
    """--also block-gathered / block-permuted: the block's own parameters (its gradients land on
    them) with loads set; the block itself keeps its own; the token-order and unzeroed-padding
    variants run the permuted path, whose gathers their switches change."""
    from fusegemm.moe import MoEBlock
    block = MoEBlock(32, 64, 4, 2, backend="torch", generator=torch.Generator().manual_seed(1), loads=base)
    layer = _bench().VARIANTS[variant](block)
    assert layer.loads == loads and block.loads == base
    assert layer.mlp.w1 is block.mlp.w1 and layer.mlp.w2 is block.mlp.w2
    for name in ("token-order", "unzeroed-padding", "token-order-unzeroed"):
        assert _bench().VARIANTS[name](block).block.loads == "permuted", name


def test_each_methods_peak_is_taken_with_every_methods_gradients_cleared():
    """step_peaks: a method's peak does not count the gradients an earlier method left on its own
    parameters (the torch layer's and the variants' peaks had counted the block's before
    2026-12-06); each method's counters are reset before its step."""
    class Param:   # a parameter whose gradient is its size in bytes
        grad = None
    ours, peer = Param(), Param()

    class Memory:   # the bytes of the gradients alive, its peak since the last reset
        peak = 0

        def live(self):
            return sum(t.grad for t in (ours, peer) if t.grad is not None)

        def synchronize(self):
            self.peak = max(self.peak, self.live())

        def reset_peak_memory_stats(self):
            self.peak = self.live()

        def max_memory_allocated(self):
            return self.peak

    def step(param, size):
        def run():
            param.grad = size
        return run
    methods = {"block": step(ours, 2 ** 32), "torch": step(peer, 2 ** 29)}
    peaks = _bench().step_peaks(methods, (ours, peer), Memory())
    assert peaks == {"block": 4.0, "torch": 0.5}   # GiB: each its own gradient alone
