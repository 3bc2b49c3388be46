"""How far the BF16 grouped GEMM is from what the H200 allows: clocks, power and the epilogue's
share, against torch and cuBLAS in the same run; prints JSON.

For each bench/grouped_gemm.py shape it times, in interleaved rounds:

* ``fusegemm``: the default kernel (128 x 256, alpha and prob applied, BF16 D);
* ``fusegemm_no_epilogue``: the same kernel built with ``-DFUSEGEMM_SM90_BENCH_NO_EPILOGUE=1``
  (fusegemm/sm90/grouped_gemm.cuh): the same mainloop with the epilogue skipped, so nothing is
  stored. Not a result: the ceiling any epilogue work (TMA stores, overlap, fewer
  instructions) could reach on this mainloop;
* ``torch_grouped_mm`` and ``cublas_dense`` (``torch.mm`` at equal FLOPs), the peers.

Then each method runs alone for ``--seconds`` while ``nvidia-smi`` samples the SM clock, board
power and clock-event reasons every 50 ms. From the window's own time and mean clock:

* ``tflops_per_ghz``: throughput per GHz of SM clock;
* ``fraction_of_clock_peak``: that over the tensor cores' dense BF16 peak per GHz, SMs x 4096
  FLOP per clock (H100/H200 SXM: 989.4 TFLOP/s at 1830 MHz over 132 SMs);
* ``needed_for_1.10x_torch``: the fraction 1.10x torch's throughput would take at the same
  clock (a power-capped board does not clock higher for a faster kernel).

``--also NAME=DEFINES`` (repeatable) adds the default kernel built with those NVRTC defines, a
header's A/B switch (e.g. ``--also staged=-DFUSEGEMM_SM90_DEFER_STORE=0``), timed the same way.

    python bench/ceiling.py [--out bench/results/ceiling_h200.json] [--shapes dsv3-fc1,...]
"""
from __future__ import annotations

import argparse

from _common import (SHAPES, add_also_argument, add_run_arguments, also_builds, expert_sizes, interleaved_ms,
                     nvrtc_defines, run, seconds_type, sustained)

NO_EPILOGUE = "-DFUSEGEMM_SM90_BENCH_NO_EPILOGUE=1"
FLOP_PER_CLOCK_PER_SM = 4096   # sm_90 dense BF16 tensor-core throughput


def bench_shape(name: str, dist: str, args) -> dict:
    import torch
    from fusegemm.presets import GroupedGemm
    experts, tokens, n, k = SHAPES[name]
    sizes = expert_sizes(experts, tokens, dist)
    m = sum(sizes)
    torch.manual_seed(0)
    a = (torch.randn((m, k, 1), device="cuda") * 0.5).to(torch.bfloat16)
    b = (torch.randn((experts, n, k), device="cuda") * 0.5).to(torch.bfloat16)
    offsets = torch.tensor([sum(sizes[: i + 1]) for i in range(experts)], dtype=torch.int32, device="cuda")
    alpha = torch.rand((experts,), device="cuda") + 0.5
    prob = torch.rand((m, 1, 1), device="cuda")
    b_view = b.permute(1, 2, 0)
    flops = 2.0 * m * n * k
    methods = {}
    builds = [("fusegemm", ""), ("fusegemm_no_epilogue", NO_EPILOGUE)]
    builds += also_builds(args)
    for key, defines in builds:
        d = torch.empty((m, n, 1), dtype=torch.bfloat16, device="cuda")
        op = GroupedGemm(a, None, d, offsets, alpha, b_view, None, prob, mma_tiler_mn=(128, 256))
        with nvrtc_defines(defines):
            op.compile()
        methods[key] = (lambda op=op, d=d: op.execute(a, None, d, offsets, alpha, b_view, None, prob))
    a2, bt, w = a[..., 0], b.transpose(-2, -1), b[0].t()
    methods["torch_grouped_mm"] = lambda: torch._grouped_mm(a2, bt, offs=offsets)
    methods["cublas_dense"] = lambda: torch.mm(a2, w)
    ms = interleaved_ms(methods, args)
    peak_per_ghz = torch.cuda.get_device_properties(0).multi_processor_count * FLOP_PER_CLOCK_PER_SM / 1000.0
    row = {"shape": name, "dist": dist, "experts": experts, "rows": m, "n": n, "k": k,
           "tflops": {key: flops / v / 1e9 for key, v in ms.items()}}
    t = row["tflops"]
    row["ratio_vs_torch"] = t["fusegemm"] / t["torch_grouped_mm"]
    row["ratio_vs_cublas"] = t["fusegemm"] / t["cublas_dense"]
    row["no_epilogue_vs_torch"] = t["fusegemm_no_epilogue"] / t["torch_grouped_mm"]
    row["epilogue_share"] = 1.0 - t["fusegemm"] / t["fusegemm_no_epilogue"]
    for key, _ in also_builds(args):
        row[f"{key}_vs_fusegemm"] = t[key] / t["fusegemm"]
    if args.seconds > 0:
        win = sustained(methods, args.seconds)
        for v in win.values():
            v["tflops"] = flops / v["ms"] / 1e9
            v["tflops_per_ghz"] = v["tflops"] / (v["sm_mhz"] / 1000.0) if v["sm_mhz"] else None
            v["fraction_of_clock_peak"] = v["tflops_per_ghz"] / peak_per_ghz if v["tflops_per_ghz"] else None
        row["sustained"] = win
        tf = win["torch_grouped_mm"]["fraction_of_clock_peak"]
        row["needed_for_1.10x_torch"] = 1.10 * tf if tf else None
    methods.clear()
    torch.cuda.empty_cache()
    return row


def _summary(r: dict) -> str:
    s = r.get("sustained", {})
    frac = " ".join(f"{k}={v['fraction_of_clock_peak']:.3f}@{v['sm_mhz']:.0f}MHz" for k, v in s.items()
                    if v.get("fraction_of_clock_peak"))
    also = " ".join(f"{k}={v:.3f}" for k, v in r.items() if k.endswith("_vs_fusegemm"))
    return (f"{also} x{r['ratio_vs_torch']:.3f} torch, x{r['ratio_vs_cublas']:.3f} cuBLAS, no-epilogue "
            f"x{r['no_epilogue_vs_torch']:.3f} torch (epilogue {100 * r['epilogue_share']:.1f}%)  {frac}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_run_arguments(ap, ",".join(SHAPES))
    ap.add_argument("--seconds", type=seconds_type, default=2.0,
                    help="sustained window per method under nvidia-smi sampling (0: none)")
    add_also_argument(ap)
    args = ap.parse_args(argv)
    also_builds(args)   # refuse a malformed --also before any work
    header = {"benchmark": "ceiling: the BF16 grouped GEMM (seed 001) against the clock, the power cap "
                           "and its own mainloop without the epilogue",
              "flop_per_clock_per_sm": FLOP_PER_CLOCK_PER_SM}
    return run(args, bench_shape, _summary, header,
               method_note=f"; then each method alone for {args.seconds} s under nvidia-smi sampling "
                           "(50 ms), the window's first 0.8 s dropped")


if __name__ == "__main__":
    raise SystemExit(main())
