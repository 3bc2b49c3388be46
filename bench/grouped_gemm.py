"""Benchmark seed 001 (BF16 grouped GEMM) against torch in the same run; prints JSON.

For each MoE shape (experts, sum of tokens, N, K) and expert-size distribution (balanced,
or skewed: a Dirichlet(1) split of the same total), expert sizes rounded up to multiples
of 256, it times with CUDA events (median of --iters after --warmup):

* fusegemm (``GroupedGemm.execute``; alpha and prob applied, BF16 D),
* ``torch._grouped_mm`` (BF16, no epilogue),
* cuBLAS dense ``torch.mm`` over the same total rows (equal FLOPs),

and reports TFLOP/s (2 * rows * N * K / time) and the ratios to both peers.

    python bench/grouped_gemm.py [--out bench/results/grouped_gemm_h200.json] [--shapes dsv3-fc1,...]
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time

SHAPES = {
    "dsv3-fc1": (8, 16384, 4096, 7168),
    "dsv3-fc2": (8, 16384, 7168, 2048),
    "mixtral-fc1": (8, 32768, 28672, 4096),
    "qwen3-fc1": (32, 16384, 1536, 2048),
}


def expert_sizes(experts: int, tokens: int, dist: str, seed: int = 0) -> list[int]:
    import numpy as np
    if dist == "balanced":
        raw = [tokens / experts] * experts
    else:
        raw = list(np.random.default_rng(seed).dirichlet(np.ones(experts)) * tokens)
    return [int(-(-r // 256) * 256) for r in raw]


def time_ms(fn, warmup: int, iters: int) -> float:
    import torch
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def bench_shape(name: str, dist: str, args) -> dict:
    import torch
    from fusegemm.ops.grouped_gemm import GroupedGemm
    from fusegemm.runtime import config
    experts, tokens, n, k = SHAPES[name]
    sizes = expert_sizes(experts, tokens, dist)
    m = sum(sizes)
    dev = "cuda"
    torch.manual_seed(0)
    a = (torch.randn((m, k), device=dev) * 0.5).to(torch.bfloat16)
    b = (torch.randn((experts, n, k), device=dev) * 0.5).to(torch.bfloat16)   # (L, N, K)
    offsets = torch.tensor([sum(sizes[: i + 1]) for i in range(experts)], dtype=torch.int32,
                           device=dev)
    alpha = torch.rand((experts,), device=dev) + 0.5
    prob = torch.rand((m, 1, 1), device=dev)
    d = torch.empty((m, n, 1), dtype=torch.bfloat16, device=dev)
    flops = 2.0 * m * n * k
    row = {"shape": name, "dist": dist, "experts": experts, "tokens": tokens, "rows": m, "n": n,
           "k": k, "sizes": sizes}

    # Every method is timed in each of --rounds interleaved rounds and the median over all
    # samples is reported: clocks and neighbours drift during a run, and interleaving keeps
    # that drift out of the ratios.
    a3, b_view = a.unsqueeze(-1), b.permute(1, 2, 0)
    methods: dict[str, object] = {}
    configs = [c for c in args.configs.split(",") if c]
    for cfg in configs:
        tile_s, sched, *tune = cfg.split(":")
        tile = tuple(int(x) for x in tile_s.split("x"))
        op = GroupedGemm(a3, None, d, offsets, alpha, b_view, None, prob,
                         use_dynamic_sched=sched == "dynamic", mma_tiler_mn=tile)
        op.check_support()
        # Optional tuning suffix "gN": raster band of N M-blocks (a compile-time macro; the
        # NVRTC options are part of the cache key, so both builds coexist in one process).
        defines = " ".join(f"-DFUSEGEMM_RASTER_GROUP={t[1:]}" for t in tune if t.startswith("g"))
        extra = (config.VARS["FUSEGEMM_NVRTC_EXTRA"].raw() or "") + " " + defines
        with config.override(FUSEGEMM_NVRTC_EXTRA=extra.strip()):
            op.compile()
        methods[cfg] = (lambda op=op: op.execute(a3, None, d, offsets, alpha, b_view, None, prob))
    bt = b.transpose(-2, -1)   # (L, K, N), K-major storage, as torch._grouped_mm expects
    if hasattr(torch, "_grouped_mm"):
        methods["torch_grouped_mm"] = lambda: torch._grouped_mm(a, bt, offs=offsets)
    w = b[0].t()               # (K, N) K-major: the same operand layout as the grouped weights
    methods["cublas_dense"] = lambda: torch.mm(a, w)
    samples: dict[str, list[float]] = {key: [] for key in methods}
    for _ in range(args.rounds):
        for key, fn in methods.items():
            samples[key].append(time_ms(fn, args.warmup, args.iters))
    ms = {key: statistics.median(v) for key, v in samples.items()}

    row["configs"] = {cfg: {"ms": ms[cfg], "tflops": flops / ms[cfg] / 1e9} for cfg in configs}
    row["fusegemm_config"], row["fusegemm_ms"] = configs[0], ms[configs[0]]
    row["fusegemm_tflops"] = flops / ms[configs[0]] / 1e9
    best = max(row["configs"].items(), key=lambda kv: kv[1]["tflops"])
    row["fusegemm_best_config"], row["fusegemm_best_tflops"] = best[0], best[1]["tflops"]
    for key in ("torch_grouped_mm", "cublas_dense"):
        if key in ms:
            row[f"{key}_ms"] = ms[key]
            row[f"{key}_tflops"] = flops / ms[key] / 1e9
            row[f"ratio_vs_{key}"] = row["fusegemm_tflops"] / row[f"{key}_tflops"]
            row[f"best_ratio_vs_{key}"] = row["fusegemm_best_tflops"] / row[f"{key}_tflops"]
    methods.clear()
    torch.cuda.empty_cache()
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--dists", default="balanced,skewed")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=10, help="timed launches per round (median)")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds per method")
    ap.add_argument("--configs", default="128x256:static",
                    help="comma list of TILE_MxTILE_N:static|dynamic[:gN]; the first is the headline")
    ap.add_argument("--out", default=None, help="write the JSON here as well")
    args = ap.parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        print(json.dumps({"error": "no CUDA GPU"}))
        return 1
    rows = []
    for name in args.shapes.split(","):
        if name not in SHAPES:
            raise SystemExit(f"--shapes: unknown {name!r}; allowed: {', '.join(SHAPES)}")
        for dist in args.dists.split(","):
            rows.append(bench_shape(name, dist, args))
            r = rows[-1]
            print(f"{name:12s} {dist:8s} fusegemm {r['fusegemm_tflops']:6.1f}  "
                  f"grouped_mm {r.get('torch_grouped_mm_tflops', float('nan')):6.1f}  "
                  f"dense {r['cublas_dense_tflops']:6.1f}  "
                  f"x{r.get('ratio_vs_torch_grouped_mm', float('nan')):.3f}  best "
                  f"{r['fusegemm_best_config']} {r['fusegemm_best_tflops']:6.1f}", file=sys.stderr)
    result = {
        "benchmark": "grouped_gemm (seed 001), BF16 A/B/D, alpha and prob applied",
        "headline_config": args.configs.split(",")[0],
        "device": torch.cuda.get_device_name(0), "torch": torch.__version__,
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d"), "method": f"CUDA events; {args.rounds} interleaved rounds per "
        f"method, each the median of {args.iters} launches after {args.warmup} warm-ups; median "
        f"over rounds; TFLOP/s = 2*rows*N*K/time", "rows": rows,
    }
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
