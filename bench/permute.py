"""Benchmark the MoE layer's token permutations (fusegemm/permute.py) against torch's operations
in the same run, on the routed rows of bench/moe_layer.py's layers; prints JSON.

* ``gather``: expert-sorted rows from token-major x (T, H), zeros for padding (what the layer's
  forward runs on x and its backward on dy): ``fusegemm.permute.gather_rows`` in token order (with
  the routing's ``row_of``: each token's row read once, as the layer runs it; ``fusegemm``) and in
  row order (``row_order``: a token's row read once per row, k times) against
  ``fusegemm.routing._rows_of_tokens_torch`` (a copy of x with a zero row appended, then
  ``index_select``);
* ``sum``: each token's sum over its k rows (the combine, and the backward of the gather):
  ``fusegemm.permute.sum_rows`` against ``fusegemm.routing._sum_rows_torch`` (``index_select``
  into (T, k, H), then a sum over k).

Every fusegemm build's gather is checked bit for bit against torch's, its sum bit for bit against
the default build's (and against torch's within a bf16 ulp plus FP32's rounding over k adds)
before timing. GB/s: the bytes the
kernel reads and writes (a gather reads and writes each of its R rows; a sum reads T k rows and
writes T), over its time.

    python bench/permute.py [--layers dsv3-8,dsv3-32,mixtral,qwen3] [--out FILE]
    python bench/permute.py --also plain=-DFUSEGEMM_PERMUTE_STREAM_STORES=0 \\
        --also pipe=-DFUSEGEMM_PERMUTE_GATHER_PIPELINE=1

``--also NAME=DEFINES`` (repeatable): the permutation kernels built again with those NVRTC defines
(permute.cuh's A/B switches), checked and timed in the same interleaved rounds as method NAME.
"""
from __future__ import annotations

import argparse

from _common import (add_also_argument, add_layer_arguments, also_builds, also_small_kernels, interleaved_ms,
                     run_layers, with_small_kernels)

# name: (experts, tokens, hidden, top_k), bench/moe_layer.py's layers
LAYERS = {
    "dsv3-8": (8, 4096, 7168, 8),
    "dsv3-32": (32, 4096, 7168, 8),
    "mixtral": (8, 4096, 4096, 2),
    "qwen3": (128, 4096, 2048, 8),
}

_BUILDS: dict = {}   # --also name -> SmallKernels of permute.cuh built with its defines
DEVICE = "cuda"      # (tests/unit/test_bench_common.py runs a row's checks on the CPU)


def bench_layer(name: str, args) -> dict:
    import torch

    from fusegemm import permute, routing
    experts, tokens, hidden, top_k = LAYERS[name]
    g = torch.Generator(device=DEVICE).manual_seed(0)
    x = torch.randn(tokens, hidden, generator=g, device=DEVICE).bfloat16()
    r = routing.route(torch.randn(tokens, experts, generator=g, device=DEVICE), top_k)
    rows = torch.randn(r.rows, hidden, generator=g, device=DEVICE).bfloat16()
    builds = also_small_kernels(permute, ("fusegemm_spread_rows", "fusegemm_gather_rows", "fusegemm_sum_rows_bfloat16"),
                                args, _BUILDS)
    gather = {"fusegemm": lambda: permute.gather_rows(x, r.token_of_row, r.row_of),
              "row_order": lambda: permute.gather_rows(x, r.token_of_row),
              "torch": lambda: routing._rows_of_tokens_torch(x, r.token_of_row)}
    combine = {"fusegemm": lambda: permute.sum_rows(rows, r.row_of),
               "torch": lambda: routing._sum_rows_torch(rows, r.row_of)}
    for also, kernels in builds.items():
        gather[also] = with_small_kernels(permute, kernels, gather["fusegemm"])
        combine[also] = with_small_kernels(permute, kernels, combine["fusegemm"])
    want_rows, want_sum, torch_sum = gather["torch"](), combine["fusegemm"](), combine["torch"]()
    for method in gather:
        if method != "torch" and not torch.equal(gather[method](), want_rows):
            raise SystemExit(f"{name}: {method}'s gather is not torch's bit for bit")
        if method in combine and method != "torch" and not torch.equal(combine[method](), want_sum):
            raise SystemExit(f"{name}: {method}'s sum is not the default build's bit for bit")
    # Both sum in FP32 and round once to bf16, in other orders: within a bf16 ulp of torch's plus
    # the FP32 sums' own rounding over k adds (the bound of tests/gpu/test_permute_gpu.py).
    bound = torch_sum.float().abs() * 2 ** -7 + top_k * 2 ** -22 * routing._sum_rows_torch(rows.float().abs(), r.row_of)
    worst = ((want_sum.float() - torch_sum.float()).abs() / (bound + 1e-30)).max().item()
    if worst > 1:
        raise SystemExit(f"{name}: the sum is {worst:.2f}x its bound from torch's")
    row_bytes = hidden * x.element_size()
    moved = {"gather": 2 * r.rows * row_bytes, "sum": (tokens * top_k + tokens) * row_bytes}
    row = {"layer": name, "experts": experts, "tokens": tokens, "hidden": hidden, "top_k": top_k,
           "routed_rows": r.rows, "bit_exact": True, "sum_vs_torch_of_bound": round(worst, 3)}
    for what, methods in (("gather", gather), ("sum", combine)):
        ms = interleaved_ms(methods, args)
        row[f"{what}_ms"] = ms
        row[f"{what}_gb_s"] = {m: round(moved[what] / t / 1e6, 1) for m, t in ms.items()}
        row[f"{what}_speedup_vs_torch"] = round(ms["torch"] / ms["fusegemm"], 2)
        if what == "gather":   # the token order against the row order, same run
            row["gather_token_order_vs_row_order"] = round(ms["row_order"] / ms["fusegemm"], 3)
        for also in builds:
            row[f"{what}_{also}_vs_fusegemm"] = round(ms["fusegemm"] / ms[also], 3)
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_layer_arguments(ap, LAYERS, warmup=3, iters=20, rounds=5)
    add_also_argument(ap)
    args = ap.parse_args(argv)
    also_builds(args)   # a malformed --also stops the run before any work
    return run_layers(args, LAYERS, bench_layer,
                      lambda r: (f"gather {r['gather_ms']['fusegemm']:.3f} ms {r['gather_gb_s']['fusegemm']} GB/s, "
                                 f"sum {r['sum_ms']['fusegemm']:.3f} ms {r['sum_gb_s']['fusegemm']} GB/s"
                                 + "".join(f"; {a}: gather x{r[f'gather_{a}_vs_fusegemm']}, "
                                           f"sum x{r[f'sum_{a}_vs_fusegemm']}" for a in _BUILDS)),
                      "MoE token permutations (gather, combine) vs torch", steps="calls",
                      note="; GB/s = bytes read and written / time")


if __name__ == "__main__":
    raise SystemExit(main())
