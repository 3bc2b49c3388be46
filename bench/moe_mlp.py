"""Forward + backward step of the MoE expert MLP (``fusegemm.moe.ExpertMLP``, BF16, MXFP8 and blockwise FP8
recipes) against
the same layer in torch with ``torch._grouped_mm`` (fc1 -> SwiGLU -> fc2, autograd backward), in
the same run; prints JSON.

One step: ``y = layer(x, padded_offsets, prob)``, ``y.backward(dy)`` (gradients of x, prob and
both weights). Tokens balanced over the experts, every expert's rows padded to 256. Times are
CUDA-event medians over interleaved rounds; ``speedup`` is torch_ms / fusegemm_ms. Issue 14's
targets: BF16 step >= 1.1x, MXFP8 >= 1.5x. H200, dsv3-8 / dsv3-32 / mixtral: BF16 1.18x / 1.18x /
1.39x (bench/results/moe_mlp_h200_bf16.json, 2026-12-01); MXFP8 0.21x / 0.12x / 0.34x
(bench/results/moe_mlp_h200.json). The MXFP8 recipe is for B200: on Hopper (no block-scaled MMA)
its kernels dequantize in shared memory and run far below BF16 (issue 10), so its H200 figure
measures the recipe's cost there, not its purpose. ``--recipes bf16,fp8_block`` times the blockwise
FP8 recipe (sm_90a; issue 31's target: >= 1.3x torch's BF16 layer on dsv3 and mixtral), and
with ``weight_cache=True`` as a micro-batch of gradient accumulation runs it (the weights'
quantization reused: ``fusegemm_fp8_block_weight_cache``).
--wgrad-ab also times the BF16 layer with each weight-gradient kernel (ExpertMLP(wgrad=...)).
--dswiglu-ab also times it with the dSwiGLU GEMM at its spec's default tile instead of the
layer's choice (fusegemm.moe._DSWIGLU_TILE["bf16"]: ping-pong 64-row tiles on sm_90a); --fill-ab with
every output of the spec ops zero-filled whole before its GEMM, as before fusegemm/ops/tail.py.
--fp8-dswiglu-ab also times the fp8_block layer with its dSwiGLU GEMM at the spec's default tile
instead of the layer's choice (fusegemm.moe._DSWIGLU_TILE["fp8_block"]: the blockwise kernel's
64 x 128 ping-pong tiles up to F 2048 on sm_90a).
--profile adds each method's kernel times per step and the GPU's idle time (torch.profiler), as
bench/moe_layer.py's. ``*_host_ms`` is the host's time to issue a step (H200,
dsv3-8: the fp8_block step 3.77 ms before register() kept its faces, 2.46 after; BF16 1.7).

    python bench/moe_mlp.py [--layers dsv3-8,dsv3-32,mixtral] [--out bench/results/moe_mlp_h200.json]
"""
from __future__ import annotations

import argparse

from _common import host_ms, interleaved_ms, kernel_table, run_layers, whole_fill

# name: (local experts, tokens, hidden, intermediate)
LAYERS = {
    "dsv3-8": (8, 16384, 7168, 2048),
    "dsv3-32": (32, 16384, 7168, 2048),
    "mixtral": (8, 16384, 4096, 14336),
}


class TorchMLP:
    """The same layer with torch._grouped_mm (what a framework runs without fusegemm)."""

    def __init__(self, w1, w2):
        self.w1, self.w2 = w1, w2

    def __call__(self, x, ends, prob):
        import torch

        from fusegemm.moe import split_gate_up
        g = torch._grouped_mm(x, self.w1.transpose(1, 2), offs=ends)
        gate, up = split_gate_up(g.float())
        h = (torch.nn.functional.silu(gate) * up * prob[:, None]).to(torch.bfloat16)
        return torch._grouped_mm(h, self.w2.transpose(1, 2), offs=ends)


def _with_dswiglu_tile(run, recipe: str, pick):
    """``run`` with the layer's dSwiGLU GEMM under ``recipe`` on tile ``pick`` (a function of the
    intermediate size; None: the spec's default) on sm_90a: fusegemm.moe._DSWIGLU_TILE, which the
    backward reads while ``run`` waits for it."""
    import fusegemm.moe as moe

    def wrapped():
        saved = moe._DSWIGLU_TILE
        moe._DSWIGLU_TILE = {**saved, recipe: {} if pick is None else {"sm_90a": pick}}
        try:
            run()
        finally:
            moe._DSWIGLU_TILE = saved
    return wrapped


def bench_layer(name: str, args) -> dict:
    import torch

    from fusegemm.moe import ExpertMLP
    experts, tokens, hidden, inter = LAYERS[name]
    per = -(-(tokens // experts) // 256) * 256
    m = per * experts
    ends = torch.arange(1, experts + 1, device="cuda", dtype=torch.int32) * per
    g = torch.Generator(device="cuda").manual_seed(0)
    x = (torch.randn(m, hidden, generator=g, device="cuda") * 0.5).bfloat16().requires_grad_()
    prob = torch.rand(m, generator=g, device="cuda").requires_grad_()
    dy = torch.randn(m, hidden, generator=g, device="cuda").bfloat16()
    ours = ExpertMLP(experts, hidden, inter, device="cuda", generator=torch.Generator().manual_seed(1))
    w1 = ours.w1.detach().clone().requires_grad_()
    w2 = ours.w2.detach().clone().requires_grad_()
    peer = TorchMLP(w1, w2)
    flops = 3 * 2.0 * m * hidden * 3 * inter          # fc1 (2F) + fc2 (F), forward + two backward GEMMs each
    row = {"layer": name, "experts": experts, "rows": m, "hidden": hidden, "intermediate": inter}

    def step(layer, params):
        def run():
            for p in (x, prob, *params):
                p.grad = None
            layer(x, ends, prob).backward(dy)
        return run

    methods = {"fusegemm_bf16": step(ours, (ours.w1, ours.w2))}
    if args.wgrad_ab:   # the same layer with each weight-gradient kernel, for the A/B in one run
        for kernel in ("torch", "fusegemm"):
            ab = ExpertMLP(experts, hidden, inter, device="cuda", wgrad=kernel,
                           generator=torch.Generator().manual_seed(1))
            methods[f"fusegemm_bf16_wgrad_{kernel}"] = step(ab, (ab.w1, ab.w2))
    row["wgrad_default"] = ours.wgrad
    if args.dswiglu_ab:
        methods["fusegemm_bf16_dswiglu_default_tile"] = _with_dswiglu_tile(step(ours, (ours.w1, ours.w2)), "bf16",
                                                                           None)
    if args.fill_ab:
        methods["fusegemm_bf16_whole_fill"] = whole_fill(step(ours, (ours.w1, ours.w2)))
    low = {}   # the low-precision recipes asked for: recipe -> layer
    for recipe in (r for r in ("mxfp8", "fp8_block") if r in args.recipes.split(",")):
        low[recipe] = ExpertMLP(experts, hidden, inter, device="cuda", recipe=recipe,
                                generator=torch.Generator().manual_seed(1))
        methods[f"fusegemm_{recipe}"] = step(low[recipe], (low[recipe].w1, low[recipe].w2))
        if recipe == "fp8_block" and args.fp8_dswiglu_ab:
            methods["fusegemm_fp8_block_dswiglu_default_tile"] = _with_dswiglu_tile(
                step(low[recipe], (low[recipe].w1, low[recipe].w2)), "fp8_block", None)
    if "fp8_block" in low:
        # A micro-batch of gradient accumulation: the weights unchanged since the last call, so
        # weight_cache reuses their quantization (a training step with one micro-batch per
        # optimizer step is the row above: the weights quantized every step).
        cached = ExpertMLP(experts, hidden, inter, device="cuda", recipe="fp8_block", weight_cache=True,
                           generator=torch.Generator().manual_seed(1))
        methods["fusegemm_fp8_block_weight_cache"] = step(cached, (cached.w1, cached.w2))
    try:
        with torch.no_grad():
            yo, yt = ours(x, ends, prob).float(), peer(x, ends, prob).float()
        row["rel_diff_y_vs_torch"] = float((yo - yt).norm() / yt.norm())
        for recipe, layer in low.items():
            with torch.no_grad():
                row[f"rel_diff_y_{recipe}_vs_torch"] = float((layer(x, ends, prob).float() - yt).norm() / yt.norm())
        methods["torch_grouped_mm"] = step(peer, (w1, w2))
    except (RuntimeError, AttributeError) as exc:       # a torch without _grouped_mm (or its backward)
        row["torch_error"] = f"{type(exc).__name__}: {exc}"[:300]
    for key, ms in interleaved_ms(methods, args).items():
        row[f"{key}_ms"], row[f"{key}_tflops"] = ms, flops / ms / 1e9
    for key, run in methods.items():
        row[f"{key}_host_ms"] = host_ms(run)
    if args.profile:    # after the timing: the profiler's hooks outlive it and slow the host
        for key, run in methods.items():
            row[f"{key}_kernels"] = kernel_table(run)
    if "torch_grouped_mm_ms" in row:
        row["speedup_bf16_vs_torch"] = row["torch_grouped_mm_ms"] / row["fusegemm_bf16_ms"]
        for recipe in low:
            row[f"speedup_{recipe}_vs_torch_bf16"] = row["torch_grouped_mm_ms"] / row[f"fusegemm_{recipe}_ms"]
        if "fusegemm_fp8_block_weight_cache_ms" in row:
            row["speedup_fp8_block_weight_cache_vs_torch_bf16"] = (row["torch_grouped_mm_ms"]
                                                                   / row["fusegemm_fp8_block_weight_cache_ms"])
    torch.cuda.empty_cache()
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--layers", default=",".join(LAYERS))
    ap.add_argument("--recipes", default="bf16,mxfp8",
                    help="bf16 always runs; add mxfp8 and/or fp8_block to time those recipes too")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--wgrad-ab", action="store_true",
                    help="also time the BF16 layer with each weight-gradient kernel (wgrad='torch' and 'fusegemm')")
    ap.add_argument("--fp8-dswiglu-ab", action="store_true",
                    help="also time the fp8_block layer with its dSwiGLU GEMM on ping-pong tiles (64 x 128)")
    ap.add_argument("--dswiglu-ab", action="store_true",
                    help="also time the BF16 layer with the dSwiGLU GEMM at the spec's default tile")
    ap.add_argument("--fill-ab", action="store_true",
                    help="also time the BF16 layer with the spec ops' outputs zero-filled whole (the old allocation)")
    ap.add_argument("--profile", action="store_true",
                    help="add each method's kernel-time table (torch.profiler, eager steps) to the JSON")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    nan = float("nan")
    return run_layers(args, LAYERS, bench_layer,
                      lambda r: (f"fusegemm {r['fusegemm_bf16_ms']:.2f} ms  "
                                 f"torch {r.get('torch_grouped_mm_ms', nan):.2f} ms  "
                                 f"x{r.get('speedup_bf16_vs_torch', nan):.2f}  "
                                 f"mxfp8 {r.get('fusegemm_mxfp8_ms', nan):.2f} ms  "
                                 f"fp8_block {r.get('fusegemm_fp8_block_ms', nan):.2f} ms "
                                 f"(x{r.get('speedup_fp8_block_vs_torch_bf16', nan):.2f}; weight cache "
                                 f"{r.get('fusegemm_fp8_block_weight_cache_ms', nan):.2f} ms, "
                                 f"x{r.get('speedup_fp8_block_weight_cache_vs_torch_bf16', nan):.2f})"),
                      "MoE expert MLP forward + backward step (BF16, MXFP8 and blockwise FP8 recipes vs torch BF16)")


if __name__ == "__main__":
    raise SystemExit(main())
