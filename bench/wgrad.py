"""Benchmark the K-grouped weight gradients of an MoE expert MLP: fusegemm's KGroupedGemm
(specs/grouped_gemm_wgrad.yaml) against torch._grouped_mm (what fusegemm.moe runs today) and
cuBLAS (torch.bmm over equal-size experts, the dense ceiling at equal FLOPs) in the same run;
prints JSON.

dW_e = dY_e^T X_e over each expert's token rows: dY (T, M), X (T, N) token-major BF16, dW
(L, M, N) BF16. The shapes are the MoE layer's two weight gradients (fusegemm.moe):

* fc1: dY = dG (T, 2F), X = x (T, H): dW1 (L, 2F, H)
* fc2: dY = dy (T, H), X = h (T, F): dW2 (L, H, F)

With ``--fp8`` (the default) the FP8 weight gradient of the blockwise recipe runs too
(specs/grouped_gemm_wgrad_fp8.yaml: dY^T and X^T FP8, scaled per row and 128 tokens):
``fusegemm_fp8`` the GEMM on operands quantized beforehand (what the recipe's fused producers
hand it), ``fusegemm_fp8_quant`` with ``torch_blockwise.quantize_wgrad`` of both operands in the
timed call; its difference from torch's BF16 result is reported relative to that result's
largest magnitude (the recipe's quantization error, not a kernel error).

Every fusegemm result is checked against torch._grouped_mm before it is timed. ``--also
NAME=DEFINES`` (repeatable) times the op built with a header's A/B switch as well (e.g.
``--also staged=-DFUSEGEMM_SM90_DEFER_STORE=0``), the FP8 one too (``NAME_fp8``, with whether its
D is bit-equal to ``fusegemm_fp8``'s). ``--fp8-tile-n 128`` times the FP8 kernel (and each --also
build of it) at tile N 128 as well (``fusegemm_fp8_n128``, ``NAME_fp8_n128``).

    python bench/wgrad.py [--out bench/results/wgrad_h200.json]
"""
from __future__ import annotations

import argparse

from _common import (add_also_argument, add_run_arguments, also_builds, expert_sizes, interleaved_ms, nvrtc_defines,
                     run, whole_fill)

# name: (experts, tokens, M, N)
SHAPES = {
    "dsv3-fc1-w": (8, 16384, 4096, 7168),
    "dsv3-fc2-w": (8, 16384, 7168, 2048),
    "dsv3-32-fc1-w": (32, 16384, 4096, 7168),
    "mixtral-fc1-w": (8, 16384, 28672, 4096),
    "mixtral-fc2-w": (8, 16384, 4096, 14336),
}


def bench_shape(name: str, dist: str, args) -> dict:
    import torch

    from fusegemm import KGroupedGemm
    experts, tokens, m, n = SHAPES[name]
    sizes = expert_sizes(experts, tokens, dist)
    t = sum(sizes)
    torch.manual_seed(0)
    dy = torch.randn(t, m, device="cuda").to(torch.bfloat16)
    x = torch.randn(t, n, device="cuda").to(torch.bfloat16)
    off = torch.tensor([sum(sizes[: i + 1]) for i in range(experts)], dtype=torch.int32, device="cuda")
    op = KGroupedGemm("grouped_gemm_wgrad").compile()
    flops = 2.0 * t * m * n
    row = {"shape": name, "dist": dist, "experts": experts, "tokens": t, "m": m, "n": n}
    ours = op(dy, x, off)["d"].float()
    theirs = torch._grouped_mm(dy.t(), x, offs=off).float()
    row["max_rel_diff_vs_torch"] = float(((ours - theirs).abs() / (theirs.abs() + 1.0)).max())
    del ours, theirs
    methods = {"fusegemm": lambda: op(dy, x, off),
               "torch_grouped_mm": lambda: torch._grouped_mm(dy.t(), x, offs=off)}
    for key, defines in also_builds(args):   # the same op built with a header's A/B switch
        with nvrtc_defines(defines):
            other = KGroupedGemm("grouped_gemm_wgrad").compile()
        row[f"{key}_equal_to_fusegemm"] = bool(torch.equal(other(dy, x, off)["d"], op(dy, x, off)["d"]))
        methods[key] = (lambda other=other: other(dy, x, off))
    if args.fill_ab:   # D zero-filled before the GEMM, as before fusegemm/ops/tail.py
        methods["fusegemm_whole_fill"] = whole_fill(lambda: op(dy, x, off))
    fp8_builds: list[str] = []   # the FP8 kernel's other builds (--fp8-tile-n, --also), timed against fusegemm_fp8
    if args.fp8:
        from fusegemm import Op
        from fusegemm.formats.torch_blockwise import quantize_wgrad
        op8 = Op("grouped_gemm_wgrad_fp8").compile()
        q = (*quantize_wgrad(dy), *quantize_wgrad(x))
        d8 = op8(*q, off)["d"]
        ref = torch._grouped_mm(dy.t(), x, offs=off).float()
        row["fp8_max_diff_vs_torch_bf16_rel_to_max"] = float((d8.float() - ref).abs().max() / ref.abs().max())
        del ref
        methods["fusegemm_fp8"] = lambda: op8(*q, off)
        methods["fusegemm_fp8_quant"] = lambda: op8(*quantize_wgrad(dy), *quantize_wgrad(x), off)
        # --fp8-tile-n: the FP8 kernel at other tile widths too (suffix _n<N>), and each --also
        # build at them; every one checked bit for bit against fusegemm_fp8 (the same sums per element)
        for tile_n in [None, *args.fp8_tile_n]:
            sfx = f"_n{tile_n}" if tile_n else ""
            axes = {"tile_n": tile_n} if tile_n else {}
            builds = [("fusegemm", "")] if tile_n else []
            builds += also_builds(args)   # the FP8 kernel's A/B switches (sm90/blockwise_promote.cuh)
            for key, defines in builds:
                with nvrtc_defines(defines):
                    other8 = Op("grouped_gemm_wgrad_fp8", **axes).compile()
                equal_key = f"fp8{sfx}" if key == "fusegemm" else f"{key}_fp8{sfx}"
                row[f"{equal_key}_equal_to_fusegemm_fp8"] = bool(torch.equal(other8(*q, off)["d"], d8))
                methods[f"{key}_fp8{sfx}"] = (lambda other8=other8: other8(*q, off))
                fp8_builds.append(f"{key}_fp8{sfx}")
    if dist == "balanced":
        dyb, xb = dy.view(experts, t // experts, m), x.view(experts, t // experts, n)
        methods["cublas_bmm"] = lambda: torch.bmm(dyb.transpose(1, 2), xb)
    for key, ms in interleaved_ms(methods, args).items():
        row[f"{key}_ms"], row[f"{key}_tflops"] = ms, flops / ms / 1e9
    row["ratio_vs_torch_grouped_mm"] = row["torch_grouped_mm_ms"] / row["fusegemm_ms"]
    for key in ("fusegemm_fp8", "fusegemm_fp8_quant"):
        if f"{key}_ms" in row:
            row[f"{key}_ratio_vs_torch_grouped_mm"] = row["torch_grouped_mm_ms"] / row[f"{key}_ms"]
    for key, _ in also_builds(args):
        row[f"{key}_ratio_vs_torch_grouped_mm"] = row["torch_grouped_mm_ms"] / row[f"{key}_ms"]
    for key in fp8_builds:
        row[f"{key}_ratio_vs_torch_grouped_mm"] = row["torch_grouped_mm_ms"] / row[f"{key}_ms"]
        row[f"{key}_speed_vs_fusegemm_fp8"] = row["fusegemm_fp8_ms"] / row[f"{key}_ms"]
    if "fusegemm_whole_fill_ms" in row:
        row["whole_fill_ratio_vs_torch_grouped_mm"] = row["torch_grouped_mm_ms"] / row["fusegemm_whole_fill_ms"]
    if "cublas_bmm_ms" in row:
        row["ratio_vs_cublas_bmm"] = row["cublas_bmm_ms"] / row["fusegemm_ms"]
    torch.cuda.empty_cache()
    return row


def _summary(r: dict) -> str:
    also = "".join(f"  {k[:-len('_ratio_vs_torch_grouped_mm')]} x{v:.2f}" for k, v in r.items()
                   if k.endswith("_ratio_vs_torch_grouped_mm") and not k.startswith("whole_fill"))
    return (f"fusegemm {r['fusegemm_tflops']:.0f} TFLOP/s, torch {r['torch_grouped_mm_tflops']:.0f}: "
            f"x{r['ratio_vs_torch_grouped_mm']:.2f}{also}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_run_arguments(ap, ",".join(SHAPES))
    ap.add_argument("--fill-ab", action="store_true",
                    help="also time fusegemm with D zero-filled before the GEMM (the allocation before "
                         "fusegemm/ops/tail.py)")
    ap.add_argument("--fp8", action=argparse.BooleanOptionalAction, default=True,
                    help="also time the blockwise recipe's FP8 weight gradient (default: on)")
    ap.add_argument("--fp8-tile-n", type=lambda v: [int(x) for x in v.split(",") if x], default=[],
                    metavar="N[,N]", help="also time the FP8 weight gradient at these tile widths (e.g. 128)")
    add_also_argument(ap)
    args = ap.parse_args(argv)
    also_builds(args)   # refuse a malformed --also before any work
    return run(args, bench_shape, _summary,
               {"benchmark": "K-grouped weight gradients (specs/grouped_gemm_wgrad.yaml) vs torch._grouped_mm"},
               method_note="; TFLOP/s = 2*T*M*N/time", shapes=SHAPES)


if __name__ == "__main__":
    raise SystemExit(main())
