"""Benchmark seed 001 (BF16 grouped GEMM) against torch in the same run; prints JSON.

For each MoE shape (experts, sum of tokens, N, K) and expert-size distribution (balanced,
or skewed: a Dirichlet(1) split of the same total), expert sizes rounded up to multiples
of 256, it times with CUDA events (median of --iters after --warmup):

* fusegemm (``GroupedGemm.execute``; alpha and prob applied, BF16 D),
* ``torch._grouped_mm`` (BF16, no epilogue),
* cuBLAS dense ``torch.mm`` over the same total rows (equal FLOPs),

and reports TFLOP/s (2 * rows * N * K / time) and the ratios to both peers. Each sample waits
for its call, so a method's time includes its host's latency to the first kernel (fusegemm's
class path issues a call in 11-17 us, torch.mm in fewer): on the small rows (qwen3-fc1, about
0.15 ms) that latency is a tenth of the time. Two more measures, in the same run:

* ``--queued``: the same methods, each round's calls issued back to back between one pair of
  events (``queued``: ms and ratios): the GPU's time per call when the host runs ahead, as in a
  training step;
* ``--kernel-times``: the device time of each method's kernels per call under torch.profiler
  (``kernel_us``: fusegemm's GEMM and its tail-zeroing kernel, cuBLAS's kernels), and the ratios
  of those.

    python bench/grouped_gemm.py [--out bench/results/grouped_gemm_h200.json] [--shapes dsv3-fc1,...]
    python bench/grouped_gemm.py --tune --configs auto,128x256:static     # the tuned choice vs the default
    python bench/grouped_gemm.py --configs 128x256:static,128x256:static:c2x1,128x256:static:c2x2  # clusters
    python bench/grouped_gemm.py --configs 128x256:static,128x256:streamk --shapes qwen3-fc1      # stream-K
    python bench/grouped_gemm.py --configs 128x256:static,128x256:streamk --shapes dsv3-fc1-2k,small-m-long-k

A ``streamk`` config (the last wave's tiles split along K, fusegemm/stream_k.cuh; not a seed
argument) runs the spec-driven ``fusegemm.Op`` on the same operands and epilogue inputs; its first
launch passes the first-run gate (its configuration class's cases, in a child process) until a GPU
run has cleared the mode. FUSEGEMM_STREAMK_MIN_K_BLOCKS sets the split's smallest share. An
``opstatic`` config runs the static walk through that same ``fusegemm.Op`` call, so that the two
differ only in the schedule (``GroupedGemm.execute`` is the lighter host path).
"""
from __future__ import annotations

import argparse

from _common import (FEW_TILE_SHAPES, SHAPES, add_run_arguments, expert_sizes, interleaved_ms, kernel_table,
                     nvrtc_defines, queued_ms, run)

ALL_SHAPES = {**SHAPES, **FEW_TILE_SHAPES}   # (the few-tile rows by --shapes only)


def problem(name: str, dist: str) -> tuple:
    """One row's operands on the GPU (seeded): expert sizes, A (rows, K), B (L, N, K), the
    offsets, alpha, prob (rows, 1, 1) and D (rows, N, 1); bench/ncu_one_op.py profiles the same."""
    import torch
    experts, tokens, n, k = ALL_SHAPES[name]
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
    return sizes, a, b, offsets, alpha, prob, d


def bench_shape(name: str, dist: str, args) -> dict:
    import torch
    from fusegemm.presets import GroupedGemm
    experts, tokens, n, k = ALL_SHAPES[name]
    sizes, a, b, offsets, alpha, prob, d = problem(name, dist)
    m = sum(sizes)
    flops = 2.0 * m * n * k
    row = {"shape": name, "dist": dist, "experts": experts, "tokens": tokens, "rows": m, "n": n,
           "k": k, "sizes": sizes}

    # Every method is timed in interleaved rounds (_common.interleaved_ms).
    a3, b_view = a.unsqueeze(-1), b.permute(1, 2, 0)
    methods: dict[str, object] = {}
    configs = [c for c in args.configs.split(",") if c]
    if args.tune and dist == "balanced":
        # Record the fastest configuration of this shape's bucket first (fusegemm.tune): the
        # "auto" config below then launches it, as a user's fusegemm.grouped_gemm call would.
        # The bucket does not see the distribution: the skewed row reuses the balanced record.
        from fusegemm import tune as tn
        res = tn.tune(experts=experts, tokens=tokens, n=n, k=k, dist=dist)
        row["tuned"] = {"bucket": res.bucket.key, "recorded": res.best.label, "fastest": res.fastest.label,
                        "default": res.default.label, "measured_ms": res.ms}
    for cfg in configs:
        if cfg == "auto":
            # What fusegemm.grouped_gemm would launch for this call (a tuned record's
            # configuration, else the default), run through the same class path as the other
            # configs so that only the configuration differs.
            from fusegemm.ops.tuned import _tuned
            from fusegemm.ops.grouped_operands import parse_call
            call = parse_call(a3, offsets, alpha, b_view, None, None, prob, ab_dtypes=("bfloat16",),
                              bias_dtypes=("bfloat16",))
            tile, sched, _ = _tuned(call, torch.cuda.current_device(), None, "bfloat16", "k")
            row["auto_config"] = f"{tile[0]}x{tile[1]}:{sched}" if tile else "default"
            cfg_s = row["auto_config"] if tile else "128x256:static"
        else:
            cfg_s = cfg
        tile_s, sched, *tune = cfg_s.split(":")
        tile = tuple(int(x) for x in tile_s.split("x"))
        if sched in ("streamk", "opstatic"):   # (opstatic: the static walk through the same Op call)
            from fusegemm.ops.engine import Op
            sk = Op("grouped_gemm", scheduler="streamk" if sched == "streamk" else "static", tile_m=tile[0],
                    tile_n=tile[1], d_dtype="bfloat16")
            ins = {"alpha": alpha, "prob": prob.reshape(-1)}
            methods[cfg] = (lambda sk=sk, ins=ins: sk(a, offsets, b, inputs=ins))
            continue
        # Optional suffix "cMxN": the launch cluster (sm_90a: the cluster kernel, TMA multicast of
        # B along M and A along N).
        cluster = next((tuple(int(x) for x in t[1:].split("x")) for t in tune if t.startswith("c")), None)
        op = GroupedGemm(a3, None, d, offsets, alpha, b_view, None, prob,
                         use_dynamic_sched=sched == "dynamic", mma_tiler_mn=tile, cluster_shape_mn=cluster)
        op.check_support()
        # Optional tuning suffix "gN": raster band of N M-blocks (a compile-time macro; the
        # NVRTC options are part of the cache key, so both builds coexist in one process).
        defines = " ".join(f"-DFUSEGEMM_RASTER_GROUP={t[1:]}" for t in tune if t.startswith("g"))
        with nvrtc_defines(defines):
            op.compile()
        methods[cfg] = (lambda op=op: op.execute(a3, None, d, offsets, alpha, b_view, None, prob))
    bt = b.transpose(-2, -1)   # (L, K, N), K-major storage, as torch._grouped_mm expects
    if hasattr(torch, "_grouped_mm"):
        methods["torch_grouped_mm"] = lambda: torch._grouped_mm(a, bt, offs=offsets)
    w = b[0].t()               # (K, N) K-major: the same operand layout as the grouped weights
    methods["cublas_dense"] = lambda: torch.mm(a, w)
    ms = interleaved_ms(methods, args)
    extra = {}
    if args.queued:
        extra["queued"] = interleaved_ms(methods, args, timer=queued_ms)
    if args.kernel_times:   # (after the timing: the profiler's hooks outlive it and slow the host)
        extra["kernel_us"] = {key: kernel_table(fn, steps=args.iters)["kernel_ms_per_step"] * 1e3
                              for key, fn in methods.items()}

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
    for name, times in extra.items():   # the headline config's speed over each peer's, by this measure
        row[name] = {"per_method": times, **{f"ratio_vs_{key}": times[key] / times[configs[0]]
                                             for key in ("torch_grouped_mm", "cublas_dense") if key in times}}
    methods.clear()
    torch.cuda.empty_cache()
    return row


def _summary(r: dict) -> str:
    more = "".join(f"  {name} x{r[name].get('ratio_vs_torch_grouped_mm', float('nan')):.3f} / "
                   f"x{r[name]['ratio_vs_cublas_dense']:.3f} dense" for name in ("queued", "kernel_us") if name in r)
    return (f"fusegemm {r['fusegemm_tflops']:6.1f}  grouped_mm {r.get('torch_grouped_mm_tflops', float('nan')):6.1f}  "
            f"dense {r['cublas_dense_tflops']:6.1f}  x{r.get('ratio_vs_torch_grouped_mm', float('nan')):.3f} / "
            f"x{r.get('ratio_vs_cublas_dense', float('nan')):.3f} dense  best "
            f"{r['fusegemm_best_config']} {r['fusegemm_best_tflops']:6.1f}{more}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_run_arguments(ap, ",".join(SHAPES))
    ap.add_argument("--configs", default="128x256:static",
                    help="comma list of TILE_MxTILE_N:static|dynamic|streamk[:gN], or auto (fusegemm.grouped_gemm "
                         "choosing: a tuned record, else the default); the first is the headline")
    ap.add_argument("--tune", action="store_true",
                    help="run fusegemm.tune on each shape first (records land in the kernel cache)")
    ap.add_argument("--queued", action="store_true",
                    help="time every method again with its calls back to back (the GPU's time per call)")
    ap.add_argument("--kernel-times", action="store_true",
                    help="add each method's kernels' device time per call (torch.profiler)")
    args = ap.parse_args(argv)
    header = {"benchmark": "grouped_gemm (seed 001), BF16 A/B/D, alpha and prob applied",
              "headline_config": args.configs.split(",")[0]}
    return run(args, bench_shape, _summary, header, method_note="; TFLOP/s = 2*rows*N*K/time", shapes=ALL_SHAPES)


if __name__ == "__main__":
    raise SystemExit(main())
