"""Host time per call of the BF16 grouped GEMM, against ``torch._grouped_mm`` in the same run;
prints JSON.

A tiny cached problem (the kernel is a few microseconds of GPU time), so what is timed is the
Python and driver work of one call: ``time.perf_counter_ns`` around ``--calls`` back-to-back
calls (no synchronisation inside; fewer calls than the launch queue holds, so the host never
waits on the GPU), median over ``--rounds`` interleaved rounds. Methods:

* ``class_execute``  ``GroupedGemm.execute`` with caller-owned outputs and ``current_stream``;
* ``class_execute_default_stream``  the same, stream looked up (torch's current stream);
* ``wrapper``  ``fusegemm.grouped_gemm`` (allocates D per call, as the seed wrapper does);
* ``torch_grouped_mm``  ``torch._grouped_mm`` (allocates its output per call);
* ``op_call`` / ``op_execute``  ``fusegemm.Op("grouped_gemm")`` on the same problem, allocating D
  or writing the caller's (the one engine's per-signature prepared path);
* ``srelu_wrapper`` / ``srelu_class_execute`` / ``srelu_op_call``  the block-scaled family on the
  same sizes (MXFP8 grouped GEMM + sReLU, seed 002): its wrapper, its class and ``fusegemm.Op``;
* ``driver_launch_floor``  ``cuLaunchKernel`` of the same kernel and packed arguments through
  ctypes with argtypes, nothing else;
* ``prepared_launch``  the op's prepared launch of the same (``runtime.launch.prepare``: no
  per-call argument conversion): the floor under the class path.

Goals (issue 11): class <= 6 us, wrapper <= 10 us. ``--profile`` adds cProfile's top entries
for the two fusegemm paths (to stderr).

    python bench/host_overhead.py [--out bench/results/host_overhead_h200.json]
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

from _common import emit_json, round_order


def per_call_us(fn, calls: int) -> float:
    import torch
    torch.cuda.synchronize()
    t0 = time.perf_counter_ns()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter_ns()
    torch.cuda.synchronize()
    return (t1 - t0) / calls / 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--experts", type=int, default=4)
    ap.add_argument("--rows", type=int, default=256, help="rows per expert (a multiple of 256)")
    ap.add_argument("--n", type=int, default=256)
    ap.add_argument("--k", type=int, default=256)
    ap.add_argument("--calls", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    import torch
    if not torch.cuda.is_available():
        print(json.dumps({"error": "no CUDA GPU"}))
        return 1
    import fusegemm
    L, m, n, k = args.experts, args.experts * args.rows, args.n, args.k
    dev = "cuda"
    a = torch.randn(m, k, device=dev).to(torch.bfloat16)
    b = torch.randn(L, n, k, device=dev).to(torch.bfloat16)
    off = torch.arange(1, L + 1, device=dev, dtype=torch.int32) * args.rows
    alpha = torch.ones(L, device=dev)
    d = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
    stream = torch.cuda.current_stream()
    op = fusegemm.GroupedGemm(a, None, d, off, alpha, b).compile()
    op.execute(a, d_tensor=d, padded_offsets=off, alpha_tensor=alpha, b_tensor=b, current_stream=stream)

    methods = {
        "class_execute": lambda: op.execute(a, d_tensor=d, padded_offsets=off, alpha_tensor=alpha,
                                            b_tensor=b, current_stream=stream),
        "class_execute_default_stream": lambda: op.execute(a, d_tensor=d, padded_offsets=off,
                                                           alpha_tensor=alpha, b_tensor=b),
        "wrapper": lambda: fusegemm.grouped_gemm(a, off, alpha, b_tensor=b),
        "torch_grouped_mm": lambda: torch._grouped_mm(a, b.transpose(-2, -1), offs=off),
    }
    # The one engine on the same spec and problem: fusegemm.Op allocating D (as the wrapper) and
    # writing into caller buffers (as the class), through its per-signature prepared path.
    engine = fusegemm.Op("grouped_gemm", tile_m=op.tile[0], tile_n=op.tile[1], cluster_m=op.cluster[0],
                         cluster_n=op.cluster[1])
    engine_inputs = {"alpha": alpha}
    methods["op_call"] = lambda: engine(a, off, b, inputs=engine_inputs, current_stream=stream)
    methods["op_execute"] = lambda: engine.execute(a, off, b, inputs=engine_inputs, outputs={"d": d},
                                                   current_stream=stream)
    # The block-scaled family (seed 002, MXFP8 sReLU) on the same sizes: its wrapper, its class
    # and fusegemm.Op, all over the one engine's prepared launch.
    from fusegemm.output_compare import device_args
    from fusegemm.problems import make_grouped_problem
    pb = make_grouped_problem("grouped_gemm_srelu", num_experts=L, tokens=[args.rows] * L, n=n, k=k, seed=0)
    mx, _ = device_args(pb.kwargs(sf_vec_size=32))
    mx = {key: v for key, v in mx.items() if key not in ("c_dtype", "d_dtype", "sf_vec_size")}
    mx_out = {key: v for key, v in fusegemm.grouped_gemm_srelu(**mx, sf_vec_size=32).items() if v is not None}
    mx_class = fusegemm.GroupedGemmSrelu(sample_a=mx["a_tensor"], sample_b=mx["b_tensor"], sample_sfa=mx["sfa_tensor"],
                                         sample_sfb=mx["sfb_tensor"], sample_c=mx_out["c_tensor"],
                                         sample_d=mx_out["d_tensor"], sf_vec_size=32).compile()
    mx_op = fusegemm.Op("grouped_gemm_srelu", sf_vec_size=32)
    mx_operands = tuple(mx[x] for x in ("a_tensor", "sfa_tensor", "padded_offsets", "b_tensor", "sfb_tensor"))
    mx_inputs = {"alpha": mx["alpha_tensor"], "prob": mx["prob_tensor"]}
    methods["srelu_wrapper"] = lambda: fusegemm.grouped_gemm_srelu(**mx, sf_vec_size=32, current_stream=stream)
    methods["srelu_class_execute"] = lambda: mx_class.execute(**mx, **mx_out, current_stream=stream)
    methods["srelu_op_call"] = lambda: mx_op(*mx_operands, inputs=mx_inputs, current_stream=stream)
    # The floor: the driver's cuLaunchKernel of the same kernel through ctypes, nothing else
    # (what any Python launch path pays; the other methods add their own work on top).
    from fusegemm.runtime.launch import _direct_launch
    entry = next(iter(op.op._memo.values()))        # the class's call pattern in the engine's memo
    buf = next(iter(entry.bufs.values())) if entry.bufs else None
    raw = _direct_launch()
    if buf is not None and raw is not None:
        ln = op.op._launcher
        kern, cfg, handle = ln.kernel, ln.config(entry.grid), stream.cuda_stream
        methods["driver_launch_floor"] = lambda: raw(kern.handle, *cfg.grid, *cfg.block, cfg.smem_bytes,
                                                     handle, buf.argv_address, None)
        # The op's own prepared launch (runtime/launch.py prepare: pointers pre-converted, no
        # argtypes): the driver part of class_execute.
        methods["prepared_launch"] = lambda: entry.go(buf, handle)
    # Same numbers from both (the timing is meaningless if the op does something else).
    ref = torch._grouped_mm(a, b.transpose(-2, -1), offs=off)
    got = fusegemm.grouped_gemm(a, off, alpha, b_tensor=b)[0]
    if not torch.allclose(got.float(), ref.float(), rtol=2e-2, atol=2e-2):
        raise SystemExit("fusegemm and torch disagree on the benchmark problem")
    if not torch.equal(engine(a, off, b, inputs=engine_inputs)["d"], got):
        raise SystemExit("fusegemm.Op and the seed wrapper disagree on the benchmark problem")
    for fn in methods.values():
        for _ in range(20):
            fn()
    samples: dict[str, list[float]] = {key: [] for key in methods}
    for r in range(args.rounds):
        for key in round_order(methods, r):   # (no method always first, nor always after the same one)
            samples[key].append(per_call_us(methods[key], args.calls))
    us = {key: round(statistics.median(v), 2) for key, v in samples.items()}
    gpu_us = {}
    for key in ("class_execute", "torch_grouped_mm"):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(100):
            methods[key]()
        end.record()
        end.synchronize()
        gpu_us[key] = round(start.elapsed_time(end) * 10, 2)   # ms per 100 calls -> us per call
    result = {
        "benchmark": "host_overhead", "device": torch.cuda.get_device_name(0), "torch": torch.__version__,
        "python": platform.python_version(), "date": time.strftime("%Y-%m-%d"),
        "problem": {"experts": L, "rows": m, "n": n, "k": k},
        "method": f"perf_counter_ns around {args.calls} back-to-back calls, median of {args.rounds} "
                  "interleaved rounds (host time; no synchronisation inside)",
        "host_us_per_call": us,
        "class_python_us": round(us["class_execute"] - us["prepared_launch"], 2) if "prepared_launch" in us else None,
        "ratios": {"class_over_torch": round(us["class_execute"] / us["torch_grouped_mm"], 2),
                   "wrapper_over_torch": round(us["wrapper"] / us["torch_grouped_mm"], 2),
                   "op_call_over_wrapper": round(us["op_call"] / us["wrapper"], 2),
                   "op_execute_over_class": round(us["op_execute"] / us["class_execute"], 2)},
        "goals_us": {"class_execute": 6.0, "wrapper": 10.0},
        "gpu_us_per_call_back_to_back": gpu_us,
    }
    emit_json(result, args.out)
    if args.profile:
        import cProfile
        import pstats
        import sys
        for key in ("class_execute", "wrapper", "srelu_wrapper", "op_call"):
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(300):
                methods[key]()
            prof.disable()
            print(f"--- cProfile {key} (300 calls)", file=sys.stderr)
            pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(22)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
