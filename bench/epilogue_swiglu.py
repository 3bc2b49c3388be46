"""Benchmark the YAML-authored SwiGLU epilogue (specs/grouped_gemm_swiglu.yaml) against torch in
the same run; prints JSON.

The FC1 of an MoE layer with gate and up projections interleaved in 32-column blocks
(N = 2 * intermediate): D = prob * silu(alpha[e] * G.gate) * (alpha[e] * G.up), half as wide.

* fusegemm: ``EpilogueGemm("grouped_gemm_swiglu")``, one kernel: BF16 D, MXFP8 D with its E8M0
  row scales (SFD_row) for the next GEMM, and e4m3 D with the blockwise recipe's 1x128 FP32 row
  scales (``fusegemm_fp8_1x128``, sm_90a). Each call allocates its outputs (included).
* torch: ``torch._grouped_mm`` to a BF16 (M, N) tensor, then the same epilogue in eager torch
  (per-row alpha, silu, products; BF16). This is what a framework runs without fusion.

Shapes and expert-size distributions are bench/grouped_gemm.py's; times are CUDA-event medians
over interleaved rounds. Reported: milliseconds, the GEMM's TFLOP/s (2 * rows * N * K / time),
and fusegemm's speed-up over torch (torch_ms / fusegemm_ms).

``--also NAME=DEFINES`` (repeatable) adds both ops built with those NVRTC defines (a header's A/B
switch), timed as NAME_bf16 and NAME_mxfp8.

    python bench/epilogue_swiglu.py [--out bench/results/epilogue_swiglu_h200.json]
"""
from __future__ import annotations

import argparse

from _common import (SHAPES, add_also_argument, add_run_arguments, also_builds, expert_sizes, interleaved_ms,
                     nvrtc_defines, run)

DEFAULT_SHAPES = "dsv3-fc1,qwen3-fc1"


def bench_shape(name: str, dist: str, args) -> dict:
    import torch
    from fusegemm import EpilogueGemm
    experts, tokens, n, k = SHAPES[name]
    sizes = expert_sizes(experts, tokens, dist)
    m = sum(sizes)
    dev = "cuda"
    torch.manual_seed(0)
    a = (torch.randn((m, k), device=dev) * 0.5).to(torch.bfloat16)
    b = (torch.randn((experts, n, k), device=dev) * 0.05).to(torch.bfloat16)   # (L, N, K)
    offsets = torch.tensor([sum(sizes[: i + 1]) for i in range(experts)], dtype=torch.int32, device=dev)
    alpha = torch.rand((experts,), device=dev) + 0.5
    prob = torch.rand((m,), device=dev)
    flops = 2.0 * m * n * k
    row = {"shape": name, "dist": dist, "experts": experts, "rows": m, "n": n, "k": k, "sizes": sizes}

    ops = {"fusegemm_bf16": EpilogueGemm("grouped_gemm_swiglu", d_dtype="bfloat16").compile(),
           "fusegemm_mxfp8": EpilogueGemm("grouped_gemm_swiglu", d_dtype="float8_e4m3fn").compile(),
           # e4m3 D with the blockwise recipe's 1x128 FP32 row scales (sm_90a)
           "fusegemm_fp8_1x128": EpilogueGemm("grouped_gemm_swiglu", d_dtype="float8_e4m3fn",
                                              sfd_vec_size=128).compile()}
    inputs = {"fusegemm_bf16": {"alpha": alpha, "prob": prob},
              "fusegemm_mxfp8": {"alpha": alpha, "prob": prob, "norm_const": 1.0}}
    inputs["fusegemm_fp8_1x128"] = inputs["fusegemm_mxfp8"]
    if args.engine_baseline:
        # The same BF16 kernel with the sm_90a epilogue's fragment path for paired rules switched
        # off (the block engine instead): a same-run A/B of that path.
        with nvrtc_defines("-DFUSEGEMM_SM90_FRAG_BLOCKS=0"):
            ops["fusegemm_bf16_engine"] = EpilogueGemm("grouped_gemm_swiglu", d_dtype="bfloat16").compile()
        inputs["fusegemm_bf16_engine"] = inputs["fusegemm_bf16"]
    for key, defines in also_builds(args):   # both ops built with a header's A/B switch
        with nvrtc_defines(defines):
            for d_name, d_dtype in (("bf16", "bfloat16"), ("mxfp8", "float8_e4m3fn")):
                ops[f"{key}_{d_name}"] = EpilogueGemm("grouped_gemm_swiglu", d_dtype=d_dtype).compile()
                inputs[f"{key}_{d_name}"] = inputs[f"fusegemm_{d_name}"]
    methods = {key: (lambda op=op, key=key: op(a, offsets, b, inputs=inputs[key])) for key, op in ops.items()}

    bt = b.transpose(-2, -1)                                        # (L, K, N), as _grouped_mm expects
    alpha_rows = alpha.repeat_interleave(torch.tensor(sizes, device=dev)).unsqueeze(1)
    prob_col = prob.unsqueeze(1)

    def torch_swiglu():
        g = torch._grouped_mm(a, bt, offs=offsets).view(m, n // 64, 2, 32)
        gate = (g[:, :, 0].reshape(m, n // 2) * alpha_rows)
        up = (g[:, :, 1].reshape(m, n // 2) * alpha_rows)
        return (torch.nn.functional.silu(gate) * up * prob_col).to(torch.bfloat16)

    if hasattr(torch, "_grouped_mm"):
        methods["torch_grouped_mm_eager"] = torch_swiglu
    # correctness guard: the two BF16 results agree (a benchmark of wrong output is no benchmark)
    if "torch_grouped_mm_eager" in methods:
        ours = methods["fusegemm_bf16"]()["d"].float()
        theirs = torch_swiglu().float()
        row["max_rel_diff_vs_torch"] = float(((ours - theirs).abs() / (theirs.abs() + 1e-2)).max())
    for key, ms in interleaved_ms(methods, args).items():
        row[f"{key}_ms"], row[f"{key}_tflops"] = ms, flops / ms / 1e9
    if "torch_grouped_mm_eager_ms" in row:
        for key in ops:
            row[f"speedup_{key}_vs_torch"] = row["torch_grouped_mm_eager_ms"] / row[f"{key}_ms"]
    methods.clear()
    torch.cuda.empty_cache()
    return row


def _summary(r: dict) -> str:
    also = "".join(f"  {k[len('speedup_'):-len('_vs_torch')]} x{v:.3f}" for k, v in r.items()
                   if k.startswith("speedup_") and not k.startswith("speedup_fusegemm_"))
    return (f"bf16 {r['fusegemm_bf16_ms']:.3f} ms  mxfp8 {r['fusegemm_mxfp8_ms']:.3f} ms  "
            f"torch {r.get('torch_grouped_mm_eager_ms', float('nan')):.3f} ms  "
            f"x{r.get('speedup_fusegemm_bf16_vs_torch', float('nan')):.3f} (mxfp8 "
            f"x{r.get('speedup_fusegemm_mxfp8_vs_torch', float('nan')):.3f}){also}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_run_arguments(ap, DEFAULT_SHAPES)
    ap.add_argument("--engine-baseline", action="store_true",
                    help="also time the BF16 kernel built with the sm_90a block-engine epilogue "
                         "(FUSEGEMM_SM90_FRAG_BLOCKS=0)")
    add_also_argument(ap)
    args = ap.parse_args(argv)
    also_builds(args)   # refuse a malformed --also before any work
    return run(args, bench_shape, _summary,
               {"benchmark": "grouped GEMM + SwiGLU (specs/grouped_gemm_swiglu.yaml), BF16 A/B"})


if __name__ == "__main__":
    raise SystemExit(main())
