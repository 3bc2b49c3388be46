"""Forward + backward step of the whole MoE layer (``fusegemm.moe.MoEBlock``: routing, gather,
expert MLP, combine) against the same layer in plain torch, in the same run; prints JSON.

The torch layer is what a framework runs without fusegemm: softmax top-k, the token copies
sorted by expert (``argsort``, ``index_select``), ``torch._grouped_mm`` for fc1 and fc2 with
SwiGLU between them, and ``index_add_`` back into token order. Both read the same weights and
routing logits. One step: ``y = layer(x, logits)``, ``y.backward(dy)`` (gradients of x, the
logits and both weights). Times are CUDA-event medians over interleaved rounds; ``speedup`` is
torch_ms / fusegemm_ms; peak memory is ``torch.cuda.max_memory_allocated`` over one step of each.
Issue 33's target: >= 1.5x on these layers (``MoEBlock`` gathers and combines with one-pass
permutation kernels, fusegemm/permute.py, each the other's backward; its GEMMs read permuted
rows: ``fusegemm.moe.RoutedMLPFunction``, the gathered-operand variant, measured slower).

    python bench/moe_layer.py [--layers dsv3-8,dsv3-32,mixtral,qwen3] [--graph] [--out FILE]

``--graph`` captures each step in a CUDA graph first (both layers) and times the replays: the
GPU time without the host's launch gaps, what a framework that captures its step runs.
``--profile`` adds, per layer and method, the kernels' time per eager step, the GEMM kernels'
share of it and the top kernels (torch.profiler); wall minus kernel time is what the GPU idled.
"""
from __future__ import annotations

import argparse

from _common import interleaved_ms, run_layers

# name: (experts, tokens, hidden, intermediate, top_k)
LAYERS = {
    "dsv3-8": (8, 4096, 7168, 2048, 8),
    "dsv3-32": (32, 4096, 7168, 2048, 8),
    "mixtral": (8, 4096, 4096, 14336, 2),
    "qwen3": (128, 4096, 2048, 768, 8),
}


class TorchLayer:
    """The plain torch MoE layer on ``w1`` (E, 2F, H; fusegemm's gate/up interleave) and ``w2``."""

    def __init__(self, w1, w2, top_k):
        self.w1, self.w2, self.top_k = w1, w2, top_k

    def __call__(self, x, logits):
        import torch

        from fusegemm.moe import split_gate_up
        probs, experts = torch.softmax(logits.float(), -1).topk(self.top_k, -1)
        flat = experts.reshape(-1)
        order = torch.argsort(flat, stable=True)
        tokens = order // self.top_k
        counts = torch.zeros(self.w1.shape[0], dtype=torch.int64, device=x.device).scatter_add_(
            0, flat, torch.ones_like(flat))
        offs = counts.cumsum(0).to(torch.int32)
        g = torch._grouped_mm(x.index_select(0, tokens), self.w1.transpose(1, 2), offs=offs)
        gate, up = split_gate_up(g.float())
        h = (torch.nn.functional.silu(gate) * up * probs.reshape(-1)[order][:, None]).to(x.dtype)
        y = torch._grouped_mm(h, self.w2.transpose(1, 2), offs=offs)
        return torch.zeros_like(x).index_add_(0, tokens, y)


def bench_layer(name: str, args) -> dict:
    import torch

    from fusegemm.moe import MoEBlock
    experts, tokens, hidden, inter, top_k = LAYERS[name]
    g = torch.Generator(device="cuda").manual_seed(0)
    x = (torch.randn(tokens, hidden, generator=g, device="cuda") * 0.5).bfloat16().requires_grad_()
    logits = torch.randn(tokens, experts, generator=g, device="cuda").requires_grad_()
    dy = torch.randn(tokens, hidden, generator=g, device="cuda").bfloat16()
    ours = MoEBlock(hidden, inter, experts, top_k, device="cuda", generator=torch.Generator().manual_seed(1))
    w1 = ours.mlp.w1.detach().clone().requires_grad_()
    w2 = ours.mlp.w2.detach().clone().requires_grad_()
    peer = TorchLayer(w1, w2, top_k)
    row = {"layer": name, "experts": experts, "tokens": tokens, "hidden": hidden, "intermediate": inter,
           "top_k": top_k}

    def step(layer, params):
        def run():
            for p in (x, logits, *params):
                p.grad = None
            layer(x, logits).backward(dy)
        return run

    methods = {"fusegemm": step(ours, (ours.mlp.w1, ours.mlp.w2)), "torch": step(peer, (w1, w2))}
    with torch.no_grad():
        yo, yt = ours(x, logits).float(), peer(x, logits).float()
    row["rel_diff_y_vs_torch"] = float((yo - yt).norm() / yt.norm())
    for key, run in methods.items():
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        run()
        torch.cuda.synchronize()
        row[f"{key}_peak_gib"] = torch.cuda.max_memory_allocated() / 2 ** 30
    eager = methods
    if args.graph:      # after the eager peaks: a graph's pool is allocated once, at capture
        methods = {key: _graphed(run) for key, run in methods.items()}
    for key, ms in interleaved_ms(methods, args).items():
        row[f"{key}_ms"] = ms
    if args.profile:    # after the timing: the profiler's hooks outlive it and slow the host
        for key, run in eager.items():
            row[f"{key}_kernels"] = _kernel_table(run)
    row["speedup_vs_torch"] = row["torch_ms"] / row["fusegemm_ms"]
    torch.cuda.empty_cache()
    return row


def _kernel_table(run, steps: int = 3, top: int = 12) -> dict:
    """torch.profiler over ``steps`` steps of ``run``: the kernels' total time per step and the
    ``top`` kernels by time (ms per step, launches per step, name); the step's wall time minus the
    kernels' is the GPU's idle time in it."""
    import time

    import torch
    from torch.profiler import ProfilerActivity, profile
    run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            run()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - start) * 1e3 / steps
    events = sorted((e for e in prof.key_averages() if e.self_device_time_total > 0),
                    key=lambda e: -e.self_device_time_total)
    total = sum(e.self_device_time_total for e in events) / steps / 1e3
    # GEMM kernels: fusegemm's (fg_*) and torch's grouped GEMMs (CUTLASS); the rest is everything around them.
    gemm = sum(e.self_device_time_total for e in events if e.key.startswith("fg_") or "cutlass" in e.key) / steps / 1e3
    return {"wall_ms_per_step": wall, "kernel_ms_per_step": total, "gemm_ms_per_step": gemm,
            "top": [(e.self_device_time_total / steps / 1e3, e.count // steps, e.key[:120]) for e in events[:top]]}


def _graphed(run):
    """``run`` (one step) captured in a CUDA graph after two warm-up steps on a side stream; the
    replay, which is what a framework that captures its training step launches."""
    import torch
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            run()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    return graph.replay


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--layers", default=",".join(LAYERS))
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--graph", action="store_true", help="time both steps as CUDA-graph replays (no host gaps)")
    ap.add_argument("--profile", action="store_true",
                    help="add each layer's kernel-time table (torch.profiler, eager steps) to the JSON")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    def summary(r: dict) -> str:
        split = ""
        if args.profile:
            ours, peer = r["fusegemm_kernels"], r["torch_kernels"]
            split = (f"  GEMMs {ours['gemm_ms_per_step']:.2f} / {peer['gemm_ms_per_step']:.2f} ms of kernels "
                     f"{ours['kernel_ms_per_step']:.2f} / {peer['kernel_ms_per_step']:.2f} ms")
        return (f"fusegemm {r['fusegemm_ms']:.2f} ms  torch {r['torch_ms']:.2f} ms  x{r['speedup_vs_torch']:.2f}  "
                f"peak {r['fusegemm_peak_gib']:.1f} / {r['torch_peak_gib']:.1f} GiB" + split)
    return run_layers(args, LAYERS, bench_layer, summary,
                      "MoE layer forward + backward step (routing, gather, expert MLP, combine) vs torch",
                      note="; each step a CUDA-graph replay" if args.graph else "; eager steps", graph=args.graph)


if __name__ == "__main__":
    raise SystemExit(main())
