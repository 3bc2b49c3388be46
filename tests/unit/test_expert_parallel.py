"""fusegemm.expert_parallel on two CPU processes (gloo, the torch backend in float64): the
example script's check that forward output and every gradient equal one process running all
experts on the global batch (ragged, skewed routing, an expert that receives no token), for the
expert MLP and for the whole layer from router logits (ExpertParallelMoEBlock vs MoEBlock).

Tolerances: the routing weights travel as float32 (the kernels' prob dtype), so y and dweight
agree to ~1e-8 relative; everything else to float64 rounding (1e-12)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parents[2]


def test_two_processes_equal_one():
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "expert_parallel.py"), "--cpu", "--tokens", "128",
                        "--hidden", "32", "--inter", "64"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    worst = out["max_rel_diff_vs_single_process"]
    assert out["world"] == 2 and [x["experts_local"] for x in out["ranks"]] == [4, 4]
    assert worst["y"] <= 1e-6 and worst["dweight"] <= 1e-6, worst
    assert max(worst["dx"], worst["dw1"], worst["dw2"]) <= 1e-12, worst
    # The whole layer from router logits (ExpertParallelMoEBlock against one process's MoEBlock).
    assert worst["block_y"] <= 1e-6, worst
    assert max(worst["block_dx"], worst["block_dlogits"], worst["block_dw1"], worst["block_dw2"]) <= 1e-12, worst


def test_dispatch_refuses_bad_routes():
    import os
    import tempfile

    import torch
    import torch.distributed as dist

    from fusegemm.expert_parallel import ExpertParallelMLP, dispatch
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{os.path.join(tmp, 'init')}", rank=0, world_size=1)
        try:
            x = torch.zeros(4, 8)
            with pytest.raises(ValueError, match=r"topk_idx: got ids in \[0, 9\]; allowed: \[0, 4\)"):
                dispatch(x, torch.tensor([[0], [9], [1], [2]]), torch.ones(4, 1), 4)
            with pytest.raises(ValueError, match="topk_idx/topk_weight: got"):
                dispatch(x, torch.zeros(4, 2, dtype=torch.long), torch.ones(4, 1), 4)
            assert ExpertParallelMLP(3, 8, 32, backend="torch").experts_per_rank == 3
        finally:
            dist.destroy_process_group()


def test_one_process_without_torch_distributed():
    """ExpertParallelMLP in a process with no process group: every expert local, the same
    routing and padding, equal to the example's per-expert float64 reference."""
    import importlib.util

    import torch
    import torch.distributed as dist

    from fusegemm.expert_parallel import ExpertParallelMLP
    assert not dist.is_initialized()
    spec = importlib.util.spec_from_file_location("expert_parallel_example", ROOT / "examples" / "expert_parallel.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    x, idx, weight, w1, w2, dy, _ = example.make_problem(torch, tokens=96, hidden=32, inter=64, experts=4, topk=2,
                                                      dtype=torch.float64, device="cpu")
    ref = example.reference(torch, x, idx, weight, w1, w2, dy)
    ep = ExpertParallelMLP(4, 32, 64, dtype=torch.float64, backend="torch")
    assert ep.experts_per_rank == 4 and ep.rank == 0
    with torch.no_grad():
        ep.local.w1.copy_(w1), ep.local.w2.copy_(w2)
    xi, wi = x.clone().requires_grad_(), weight.clone().requires_grad_()
    y = ep(xi, idx, wi)
    y.backward(dy)
    rel = lambda a, b: float((a - b).norm() / b.norm())  # noqa: E731
    assert rel(y, ref["y"]) <= 1e-6 and rel(wi.grad, ref["dweight"]) <= 1e-6   # weights travel as float32
    assert max(rel(xi.grad, ref["dx"]), rel(ep.local.w1.grad, ref["dw1"]), rel(ep.local.w2.grad, ref["dw2"])) <= 1e-12


def test_expert_parallel_block_refuses_with_the_argument_named():
    import torch

    from fusegemm.base.errors import ArgumentError
    from fusegemm.expert_parallel import ExpertParallelMoEBlock
    for top_k, normalize, msg in ((0, False, "^top_k: got 0"), (5, False, "^top_k: got 5"), (2, 1, "^normalize: ")):
        with pytest.raises(ArgumentError, match=msg):
            ExpertParallelMoEBlock(8, 32, 4, top_k, normalize=normalize, backend="torch")
    block = ExpertParallelMoEBlock(8, 32, 4, 2, backend="torch", dtype=torch.float64)
    with pytest.raises(ArgumentError, match=r"^logits\.shape: got \(3, 5\); allowed: \(3, 4\)"):
        block(torch.zeros(3, 8, dtype=torch.float64), torch.zeros(3, 5))
    assert block(torch.zeros(3, 8, dtype=torch.float64), torch.zeros(3, 4)).shape == (3, 8)
    with pytest.raises(ArgumentError, match=r"^x\.shape: got \(3, 7\); allowed: \(\.\.\., 8\)"):
        block(torch.zeros(3, 7, dtype=torch.float64), torch.zeros(3, 4))
    # (batch, sequence, H) tokens: the output has x's shape and the flattened call's values.
    torch.manual_seed(2)
    x, logits = torch.randn(2, 3, 8, dtype=torch.float64), torch.randn(2, 3, 4)
    y = block(x, logits)
    assert y.shape == (2, 3, 8) and torch.equal(y.reshape(6, 8), block(x.reshape(6, 8), logits.reshape(6, 4)))
