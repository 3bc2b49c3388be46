"""Where the BF16 grouped GEMM wins and loses: a sweep over expert counts and tokens per expert
at one (N, K), against ``torch._grouped_mm`` and cuBLAS dense in the same run; prints JSON.

Every point is balanced (each expert gets ``tokens`` rows, rounded up to the 256-row padding
the kernels require, so 128 tokens per expert run as 256 rows for every method: the ratios
compare equal work). The fusegemm column is the public wrapper ``fusegemm.grouped_gemm`` with
no configuration given, so it launches what the library chooses (a ``fusegemm tune`` record
for the shape's bucket, else the spec's default) and allocates its output per call, as
``torch._grouped_mm`` does. cuBLAS is ``torch.mm`` over all rows with one expert's weights
(equal FLOPs, no grouping). CUDA events; each method's median over interleaved rounds
(bench/_common.py).

    python bench/sweep.py [--n 2048 --k 2048] [--experts 8,16,...] [--tokens 128,...] [--out FILE]
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time

from _common import emit_json, interleaved_ms

EXPERTS = "8,16,32,64,128,256"
TOKENS = "128,256,512,1024,2048,4096,8192"


def bench_point(experts: int, tokens: int, n: int, k: int, args) -> dict:
    import torch

    import fusegemm
    rows_per = -(-tokens // 256) * 256
    m = experts * rows_per
    dev = "cuda"
    torch.manual_seed(0)
    a = (torch.randn((m, k), device=dev) * 0.5).to(torch.bfloat16)
    b = (torch.randn((experts, n, k), device=dev) * 0.5).to(torch.bfloat16)   # (L, N, K)
    offsets = torch.arange(1, experts + 1, device=dev, dtype=torch.int32) * rows_per
    alpha = torch.ones((experts,), device=dev)
    bt = b.transpose(-2, -1)   # (L, K, N) view of K-major storage, as torch._grouped_mm expects
    w = b[0].t()
    methods = {
        "fusegemm": lambda: fusegemm.grouped_gemm(a, offsets, alpha, b_tensor=b),
        "torch_grouped_mm": lambda: torch._grouped_mm(a, bt, offs=offsets),
        "cublas_dense": lambda: torch.mm(a, w),
    }
    # The same numbers from both grouped methods (a sweep of the wrong product is worthless).
    got = methods["fusegemm"]()[0]
    ref = methods["torch_grouped_mm"]()
    err = ((got.float() - ref.float()).abs().max() / ref.float().abs().max().clamp_min(1e-6)).item()
    if not err < 2e-2:
        raise SystemExit(f"experts={experts} tokens={tokens}: fusegemm and torch differ (max rel {err:.3g})")
    del got, ref
    ms = interleaved_ms(methods, args)
    flops = 2.0 * m * n * k
    row = {"experts": experts, "tokens_per_expert": tokens, "rows": m,
           **{f"{key}_ms": round(v, 4) for key, v in ms.items()},
           **{f"{key}_tflops": round(flops / v / 1e9, 1) for key, v in ms.items()},
           "ratio_vs_torch_grouped_mm": round(ms["torch_grouped_mm"] / ms["fusegemm"], 3),
           "ratio_vs_cublas_dense": round(ms["cublas_dense"] / ms["fusegemm"], 3)}
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--n", type=int, default=2048)
    ap.add_argument("--k", type=int, default=2048)
    ap.add_argument("--experts", default=EXPERTS, help="comma list of expert counts")
    ap.add_argument("--tokens", default=TOKENS, help="comma list of tokens per expert")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--iters", type=int, default=5, help="timed launches per round (median)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds per method")
    ap.add_argument("--out", default=None, help="write the JSON here as well")
    args = ap.parse_args(argv)
    experts = [int(x) for x in args.experts.split(",") if x]
    tokens = [int(x) for x in args.tokens.split(",") if x]
    for name, values in (("--experts", experts), ("--tokens", tokens)):
        if not values or min(values) < 1:
            raise SystemExit(f"{name}: got {values}; allowed: a comma list of positive integers")

    import torch
    if not torch.cuda.is_available():
        print(json.dumps({"error": "no CUDA GPU"}))
        return 1
    rows = []
    for e in experts:
        for t in tokens:
            rows.append(bench_point(e, t, args.n, args.k, args))
            torch.cuda.empty_cache()    # the point's tensors are gone with its frame
            r = rows[-1]
            print(f"experts {e:4d} tokens {t:5d}  fusegemm {r['fusegemm_tflops']:6.1f}  grouped_mm "
                  f"{r['torch_grouped_mm_tflops']:6.1f}  dense {r['cublas_dense_tflops']:6.1f}  "
                  f"x{r['ratio_vs_torch_grouped_mm']:.3f}", file=sys.stderr)
    wins = [r for r in rows if r["ratio_vs_torch_grouped_mm"] >= 1.0]
    result = {
        "benchmark": "grouped_gemm sweep (seed 001 wrapper, BF16, library's choice of configuration)",
        "n": args.n, "k": args.k, "device": torch.cuda.get_device_name(0), "torch": torch.__version__,
        "python": platform.python_version(), "date": time.strftime("%Y-%m-%d"),
        "method": f"CUDA events; {args.rounds} interleaved rounds per method, each the median of "
                  f"{args.iters} launches after {args.warmup} warm-ups; median over rounds; tokens per "
                  "expert rounded up to 256 rows for every method; TFLOP/s = 2*rows*N*K/time",
        "summary": {"points": len(rows), "fusegemm_at_least_torch": len(wins),
                    "ratio_vs_torch_min": min(r["ratio_vs_torch_grouped_mm"] for r in rows),
                    "ratio_vs_torch_max": max(r["ratio_vs_torch_grouped_mm"] for r in rows)},
        "rows": rows,
    }
    emit_json(result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
