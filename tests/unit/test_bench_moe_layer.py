"""bench/moe_layer.py's peer is the same layer: its plain torch MoE layer (softmax top-k, argsort,
index_select, torch._grouped_mm, SwiGLU, index_add_) against MoEBlock's torch backend on the CPU,
on the same weights and logits, so the benchmark's ratio compares like with like.

Tolerance: 2e-2 relative (both in bfloat16; they round at different places)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parents[2]


def _bench():
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        spec = importlib.util.spec_from_file_location("moe_layer_bench", ROOT / "bench" / "moe_layer.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(ROOT / "bench"))
    return mod


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
