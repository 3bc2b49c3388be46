"""Benchmark the block-scaled fused ops (MXFP8 A/B) against torch in the same run; prints JSON.

Per shape and expert-size distribution, with MXFP8 inputs (e4m3 + E8M0 scales per 32 K) made
from the same BF16 tensors:

* fusegemm, one kernel each (outputs allocated per call, included):
  ``srelu``  grouped GEMM + sReLU, C and D bf16 + per-expert amax (seed 002 defaults);
  ``srelu_fp8``  the same with e4m3 D + SFD_row / SFD_col (C bf16);
  ``quant``  grouped GEMM + quant, e4m3 D + SFD_row / SFD_col (seed 003);
  ``dswiglu`` grouped GEMM + dSwiGLU, e4m3 D + SFD + dprob (seed 000; forward C bf16);
  ``glu``  grouped GEMM + SwiGLU (``grouped_gemm_glu`` with scales: the MoE fc1 forward; N is
  the gate/up accumulator width, D N/2 wide), e4m3 D + SFD_row for the next GEMM.
* fusegemm, the blockwise FP8 recipe (``sf_vec_size=128``, FP32 scales: A 1x128, B 128x128, the
  same BF16 tensors quantized with DeepSeek's amax / 448 scales), through ``fusegemm.Op``:
  ``quant_bw`` (e4m3 D + SFD), ``srelu_bw`` (C and D bf16 + amax; ``srelu_bw_n128``: tile_n 128;
  ``srelu_bw_pp``: ping-pong tiles),
  ``dswiglu_bw`` (e4m3 D + SFD + dprob; ``dswiglu_bw_n128``: tile_n 128; ``dswiglu_bw_pp``: ping-pong
  tiles, tile_m 64 x tile_n 128), ``gemm_bw`` (quant's
  spec with bf16 D: the GEMM and alpha),
  ``glu_bw`` (SwiGLU, bf16 D), ``glu_bw_fp8`` (e4m3 D + SFD_row), ``glu_bw_fp8_1x128`` (e4m3 D with
  the recipe's own 1x128 FP32 row scales, fc2's A as it is) and ``*_c`` (with C, the training
  forward; ``glu_bw_c``: bf16 D), ``dglu_bw`` and ``dsrelu_bw`` (the dGLU and dsReLU backward rules,
  bf16 D, dprob and amax); ``dswiglu_bw_nmajor``:
  dSwiGLU on N-major B, which the op copies K-major on each call (timed with it; ``nmajor_b_copy``:
  the copy alone).
* torch peers:
  ``torch_bf16_grouped_mm``  ``torch._grouped_mm`` on the BF16 tensors (GEMM only);
  ``torch_fp8_scaled_grouped_mm``  ``torch._scaled_grouped_mm``, rowwise FP8 (GEMM only);
  ``unfused_srelu`` / ``unfused_quant`` / ``unfused_dswiglu``  what a user writes without a fused
  kernel: dequantize A and B to BF16, ``torch._grouped_mm``, then the epilogue in eager torch
  (alpha, relu^2 * prob and per-expert amax; prob * alpha and MXFP8 re-quantization with E8M0 row
  scales; the dSwiGLU backward of the forward C, MXFP8 D and dprob).

Reported per method: milliseconds and the GEMM's effective TFLOP/s (2 * rows * N * K / time);
ratios: each fused op over ``torch_bf16_grouped_mm`` (must >= 0.9, aim 1.2) and over its unfused
pipeline (must >= 3); each blockwise op over ``torch_bf16_grouped_mm`` (issue 31: >= 1.3) and over
``torch_fp8_scaled_grouped_mm`` (>= 0.9).

``--also NAME=DEFINES`` (repeatable) builds every blockwise op again with those NVRTC defines (a
header's A/B switch), timed as ``<op>_NAME`` with its largest difference from the default build
(``<op>_NAME_max_abs_diff_vs_<op>``: 0 where the switch must not change a bit; dSwiGLU's dprob
sums by atomics across tiles); ``--blockwise-only`` times the blockwise ops and the torch GEMMs only.

    python bench/blockscaled.py [--out bench/results/blockscaled_h200.json]
    python bench/blockscaled.py --blockwise-only --also w2=-DFUSEGEMM_SM90_ENGINE_WARPS=2

``--power SECONDS`` then runs each method alone under nvidia-smi sampling (``sustained``: ms, clock,
watts and joules per call; ``joules_vs_torch_bf16``: each method's joules over BF16 torch's).
"""
from __future__ import annotations

import argparse

from _common import (SHAPES, add_also_argument, add_power_argument, add_run_arguments, also_builds, expert_sizes,
                     interleaved_ms, nvrtc_defines, power_rows, prebuild, run)

DEFAULT_SHAPES = ",".join(SHAPES)
# --power: each method's joules over BF16 torch's, as row["joules_vs_" + POWER_LABEL]
POWER_LABEL = "torch_bf16"
E4M3_MAX = 448.0


def quantize_mx(x, fmt):
    """MXFP8 of a BF16/FP32 (rows, K) tensor: (e4m3 values, E8M0 exponent bytes (rows, K/32))."""
    import torch
    rows, k = x.shape
    blocks = x.float().view(rows, k // 32, 32)
    amax = blocks.abs().amax(-1).clamp_min(2.0 ** -126)
    exp = torch.ceil(torch.log2(amax / E4M3_MAX)).clamp(-127, 127)
    q = (blocks / torch.exp2(exp).unsqueeze(-1)).to(fmt).view(rows, k)
    return q, (exp + 127).to(torch.uint8)


def pack_sf(sf, l):
    """Logical (L * mn, sfk) E8M0 bytes -> the physical atom buffer (L, mn/128, sfk/4, 32, 4, 4)."""
    mn, sfk = sf.shape[0] // l, sf.shape[1]
    t = sf.view(l, mn // 128, 4, 32, sfk // 4, 4)            # l, mt, m1, m0, kt, k0
    return t.permute(0, 1, 4, 3, 2, 5).contiguous()           # l, mt, kt, m0, m1, k0


def dequant(q, sf):
    """BF16 values of MXFP8 (rows, K) data with its E8M0 bytes (rows, K/32)."""
    import torch
    scale = torch.exp2(sf.float() - 127.0).repeat_interleave(32, dim=1)
    return (q.float() * scale).to(torch.bfloat16)


def quantize_1x128(x, fmt):
    """The blockwise recipe's activations: (FP8 (rows, K), FP32 scales (rows, K/128)), M-contiguous
    scales with a 16-byte pitch (fusegemm.formats.blockwise_sfa_layout)."""
    import fusegemm.formats as ff
    rows, k = x.shape
    blocks = x.float().view(rows, k // 128, 128)
    s = blocks.abs().amax(-1).clamp_min(1e-4) / E4M3_MAX
    return (blocks / s.unsqueeze(-1)).to(fmt).view(rows, k), ff.blockwise_sfa_layout(s)


def quantize_128x128(w, fmt):
    """The blockwise recipe's weights (L, N, K): (FP8, FP32 scales (L, N/128, K/128))."""
    l, n, k = w.shape
    blocks = w.float().view(l, n // 128, 128, k // 128, 128)
    s = blocks.abs().amax(dim=(2, 4)).clamp_min(1e-4) / E4M3_MAX
    return (blocks / s[:, :, None, :, None]).to(fmt).view(l, n, k), s.contiguous()


def dequant_1x128(q, s):
    import torch
    return (q.float() * s.repeat_interleave(128, dim=1)).to(torch.bfloat16)


def dequant_128x128(q, s):
    import torch
    full = s.repeat_interleave(128, dim=1).repeat_interleave(128, dim=2)
    return (q.float() * full).to(torch.bfloat16)


def bench_shape(name: str, dist: str, args) -> dict:
    import torch

    import fusegemm
    experts, tokens, n, k = SHAPES[name]
    sizes = expert_sizes(experts, tokens, dist)
    m = sum(sizes)
    dev = "cuda"
    fmt = torch.float8_e4m3fn
    torch.manual_seed(0)
    a_bf = torch.randn((m, k), device=dev).to(torch.bfloat16)
    b_bf = (torch.randn((experts, n, k), device=dev) * k ** -0.5).to(torch.bfloat16)   # (L, N, K)
    a_q, sfa = quantize_mx(a_bf, fmt)
    b_q, sfb = quantize_mx(b_bf.view(experts * n, k), fmt)
    b_q = b_q.view(experts, n, k)
    sfa_p, sfb_p = pack_sf(sfa, 1), pack_sf(sfb, experts)
    offsets = torch.tensor([sum(sizes[: i + 1]) for i in range(experts)], dtype=torch.int32, device=dev)
    alpha = torch.rand((experts,), device=dev) + 0.5
    beta = torch.rand((experts,), device=dev) + 0.5
    prob = torch.rand((m,), device=dev)
    norm_const = torch.ones((1,), device=dev)
    c_fwd = torch.randn((m, 2 * n), device=dev).to(torch.bfloat16)
    flops = 2.0 * m * n * k
    row = {"shape": name, "dist": dist, "experts": experts, "rows": m, "n": n, "k": k, "sizes": sizes}

    common = dict(a_tensor=a_q, b_tensor=b_q, sfa_tensor=sfa_p, sfb_tensor=sfb_p, padded_offsets=offsets,
                  alpha_tensor=alpha, sf_vec_size=32)
    methods = {} if args.blockwise_only else {
        "srelu": lambda: fusegemm.grouped_gemm_srelu(**common, prob_tensor=prob),
        "srelu_fp8": lambda: fusegemm.grouped_gemm_srelu(**common, prob_tensor=prob, d_dtype=fmt,
                                                         norm_const_tensor=norm_const),
        "quant": lambda: fusegemm.grouped_gemm_quant(**common, prob_tensor=prob, d_dtype=fmt,
                                                     norm_const_tensor=norm_const),
        "dswiglu": lambda: fusegemm.grouped_gemm_dswiglu(a_q, b_q, c_fwd, sfa_p, sfb_p, offsets, alpha, beta, prob,
                                                         norm_const_tensor=norm_const, d_dtype=fmt, sf_vec_size=32),
        "glu": lambda: fusegemm.grouped_gemm_glu(a_q, sfa_p, offsets, alpha, b_q, sfb_p, prob_tensor=prob,
                                                 d_dtype=fmt, norm_const_tensor=norm_const, sf_vec_size=32),
    }
    fused = tuple(methods)

    # The blockwise recipe: FP32 scales per 1 x 128 (A) and 128 x 128 (B) blocks.
    a_bw, sfa_bw = quantize_1x128(a_bf, fmt)
    b_bw, sfb_bw = quantize_128x128(b_bf, fmt)
    bw = dict(sf_dtype="float32", sf_vec_size=128)
    made = {"quant_bw": ("grouped_gemm_quant", dict(d_dtype="float8_e4m3fn")),
            "gemm_bw": ("grouped_gemm_quant", dict(d_dtype="bfloat16")),
            "srelu_bw": ("grouped_gemm_srelu", {}),
            "srelu_bw_n128": ("grouped_gemm_srelu", dict(tile_n=128)),
            "srelu_bw_pp": ("grouped_gemm_srelu", dict(tile_m=64, tile_n=128)),       # ping-pong tiles
            "dswiglu_bw": ("grouped_gemm_dswiglu", {}),
            "dswiglu_bw_n128": ("grouped_gemm_dswiglu", dict(tile_n=128)),
            "dswiglu_bw_pp": ("grouped_gemm_dswiglu", dict(tile_m=64, tile_n=128)),   # ping-pong tiles
            "glu_bw": ("grouped_gemm_glu_mx", {}),
            "glu_bw_fp8": ("grouped_gemm_glu_mx", dict(d_dtype="float8_e4m3fn")),
            # 1x128 output scales (the blockwise recipe's A format for fc2), without and with C
            "glu_bw_fp8_1x128": ("grouped_gemm_glu_mx", dict(d_dtype="float8_e4m3fn", sfd_vec_size=128)),
            "glu_bw_fp8_c": ("grouped_gemm_glu_mx", dict(d_dtype="float8_e4m3fn", generate_c=True)),
            "glu_bw_fp8_1x128_c": ("grouped_gemm_glu_mx", dict(d_dtype="float8_e4m3fn", sfd_vec_size=128,
                                                                generate_c=True)),
            # bf16 D: the SwiGLU forward with C, and the backward rules dGLU (the dSwiGLU math,
            # grouped_gemm_dglu_mx) and dsReLU (grouped_gemm_dsrelu_mx) with dprob and amax
            "glu_bw_c": ("grouped_gemm_glu_mx", dict(generate_c=True)),
            "dglu_bw": ("grouped_gemm_dglu_mx", {}),
            "dsrelu_bw": ("grouped_gemm_dsrelu_mx", {})}
    # method -> (the op's key in `made`, the op); --also: each op again, built with its defines
    ops = {key: (key, fusegemm.Op(spec, **bw, **axes)) for key, (spec, axes) in made.items()}
    for name, defines in args.also_pairs:
        for key, (spec, axes) in made.items():
            with nvrtc_defines(defines):
                ops[f"{key}_{name}"] = (key, fusegemm.Op(spec, **bw, **axes).compile())
    bw_inputs = {"quant_bw": {"alpha": alpha, "prob": prob, "norm_const": norm_const}, "gemm_bw": {"alpha": alpha},
                 "srelu_bw": {"alpha": alpha, "prob": prob},
                 "dswiglu_bw": {"alpha": alpha, "beta": beta, "prob": prob, "c": c_fwd, "norm_const": norm_const},
                 "glu_bw": {"alpha": alpha, "prob": prob},
                 "glu_bw_fp8": {"alpha": alpha, "prob": prob, "norm_const": norm_const}}
    # other tiles of an op (tile N 128, ping-pong) take its default build's inputs
    retiled = {key: key.rsplit("_", 1)[0] for key in made if key.endswith(("_n128", "_pp"))}
    for key, base in retiled.items():
        bw_inputs[key] = bw_inputs[base]
    for key in ("glu_bw_fp8_1x128", "glu_bw_fp8_c", "glu_bw_fp8_1x128_c"):
        bw_inputs[key] = bw_inputs["glu_bw_fp8"]
    bw_inputs["glu_bw_c"] = bw_inputs["glu_bw"]
    bw_inputs["dglu_bw"] = bw_inputs["dswiglu_bw"]
    c_srelu = c_fwd[:, :n].contiguous()   # dsReLU's C: the forward's (M, N) pre-activation
    bw_inputs["dsrelu_bw"] = {"alpha": alpha, "prob": prob, "c": c_srelu, "norm_const": norm_const}
    for key, (base, op) in ops.items():
        methods[key] = (lambda op=op, ins=bw_inputs[base]: op(a_bw, sfa_bw, offsets, b_bw, sfb_bw, inputs=ins))
    # dSwiGLU on N-major B (seed 000's other layout): the op copies B K-major on each call first
    # (fusegemm/ops/scaled_layouts.py), which this times with it.
    b_bw_n = b_bw.transpose(1, 2).contiguous().transpose(1, 2)        # (L, N, K), N contiguous
    nmajor = fusegemm.Op("grouped_gemm_dswiglu", b_major="n", **bw)
    methods["dswiglu_bw_nmajor"] = lambda: nmajor(a_bw, sfa_bw, offsets, b_bw_n, sfb_bw, inputs=bw_inputs["dswiglu_bw"])
    ops["dswiglu_bw_nmajor"] = ("dswiglu_bw", nmajor)
    prebuild([op for _, op in ops.values()], f"{name} blockwise kernels")   # in parallel, before the first call
    from fusegemm.ops.scaled_layouts import k_major_operands   # the copy alone
    methods["nmajor_b_copy"] = lambda: k_major_operands(nmajor, (a_bw, sfa_bw, offsets, b_bw_n, sfb_bw), {}, None)[0]
    blockwise = tuple(ops)

    bt = b_bf.transpose(-2, -1)                                   # (L, K, N) view, as _grouped_mm expects
    counts = torch.tensor(sizes, device=dev)
    alpha_rows = alpha.repeat_interleave(counts).unsqueeze(1)
    prob_col = prob.unsqueeze(1)
    bounds = [0] + [sum(sizes[: i + 1]) for i in range(experts)]

    methods["torch_bf16_grouped_mm"] = lambda: torch._grouped_mm(a_bf, bt, offs=offsets)
    if hasattr(torch, "_scaled_grouped_mm"):
        a8, b8 = a_bf.to(fmt), b_bf.to(fmt)                       # rowwise scales of 1: the GEMM's cost
        sa = torch.ones((m,), device=dev)
        sb = torch.ones((experts, n), device=dev)
        b8t = b8.transpose(-2, -1)
        methods["torch_fp8_scaled_grouped_mm"] = lambda: torch._scaled_grouped_mm(
            a8, b8t, sa, sb, offs=offsets, out_dtype=torch.bfloat16)

    def gemm_dequant():
        a_d = dequant(a_q, sfa)
        b_d = dequant(b_q.view(experts * n, k), sfb).view(experts, n, k)
        return torch._grouped_mm(a_d, b_d.transpose(-2, -1), offs=offsets)

    def expert_amax(x):
        return torch.stack([x[bounds[e]:bounds[e + 1]].abs().amax() if sizes[e] else x.new_zeros(())
                            for e in range(experts)])

    def unfused_srelu():
        c = (gemm_dequant().float() * alpha_rows)
        d = (torch.relu(c).square() * prob_col).to(torch.bfloat16)
        return c.to(torch.bfloat16), d, expert_amax(d)

    def unfused_quant():
        d = gemm_dequant().float() * alpha_rows * prob_col
        return quantize_mx(d, fmt)

    def unfused_dswiglu():
        r = gemm_dequant().float() * (alpha_rows * alpha_rows)
        beta_rows = beta.repeat_interleave(counts).unsqueeze(1)
        c = c_fwd.float().view(m, n // 32, 2, 32)
        g = c[:, :, 0].reshape(m, n) * beta_rows
        u = c[:, :, 1].reshape(m, n) * beta_rows
        sig = torch.sigmoid(g)
        swish = g * sig
        rp = r * prob_col
        d = torch.stack([(rp * u * sig * (1 + g * (1 - sig))).view(m, n // 32, 32),
                         (rp * swish).view(m, n // 32, 32)], dim=2).view(m, 2 * n)
        dprob = (swish * u * r).sum(dim=1)
        return quantize_mx(d, fmt), dprob

    if not args.blockwise_only:
        methods["unfused_srelu"] = unfused_srelu
        methods["unfused_quant"] = unfused_quant
        methods["unfused_dswiglu"] = unfused_dswiglu

    # correctness guard: the blockwise GEMM agrees with BF16 torch on the dequantized operands
    want = torch._grouped_mm(dequant_1x128(a_bw, sfa_bw), dequant_128x128(b_bw, sfb_bw).transpose(-2, -1),
                             offs=offsets).float() * alpha.repeat_interleave(counts).unsqueeze(1)
    got = methods["gemm_bw"]()["d"].float()
    row["gemm_bw_max_rel_diff_vs_dequant_bf16"] = float((got - want).abs().max() / (want.abs().max() + 1e-6))

    # correctness guard: the 1x128-quantized SwiGLU, dequantized, against the bf16 one (norm_const x)
    h = methods["glu_bw"]()["d"].float() * norm_const
    q = methods["glu_bw_fp8_1x128"]()
    got = dequant_1x128(q["d"].view(fmt)[:, : h.shape[1]], q["sfd_row"]).float()
    row["glu_bw_fp8_1x128_max_rel_diff_vs_bf16"] = float((got - h).abs().max() / (h.abs().max() + 1e-6))

    # every --also build computes what the default build does, and the ping-pong tiles what the
    # cooperative ones do
    pingpong = [(key, base) for key, base in retiled.items() if key.endswith("_pp")]
    for key, base in [(key, ops[key][0]) for key in ops if key not in made] + pingpong:
        ours, theirs = methods[key](), methods[base]()
        row[f"{key}_max_abs_diff_vs_{base}"] = max(
            float((ours[o].float() - theirs[o].float()).abs().max()) if ours[o].is_floating_point()
            else float((ours[o] != theirs[o]).sum()) for o in theirs.keys() if theirs[o] is not None)

    if not args.blockwise_only:
        # correctness guard: the fused sReLU agrees with its unfused pipeline (same MXFP8 inputs)
        ours = methods["srelu"]()["d_tensor"].float()
        theirs = unfused_srelu()[1].float()
        row["srelu_max_rel_diff_vs_unfused"] = float(((ours - theirs).abs() / (theirs.abs().max() + 1e-6)).max())

    for key, ms in interleaved_ms(methods, args).items():
        row[f"{key}_ms"], row[f"{key}_tflops"] = ms, flops / ms / 1e9
    if args.power:   # each method alone after the rounds: clock, power, joules per call against BF16 torch's
        row.update(power_rows(methods, args.power, "torch_bf16_grouped_mm", POWER_LABEL))
    for key in blockwise:
        row[f"{key}_vs_bf16_grouped_mm"] = row["torch_bf16_grouped_mm_ms"] / row[f"{key}_ms"]
        if "torch_fp8_scaled_grouped_mm_ms" in row:
            row[f"{key}_vs_fp8_scaled_grouped_mm"] = row["torch_fp8_scaled_grouped_mm_ms"] / row[f"{key}_ms"]
    for key in fused:
        row[f"{key}_vs_bf16_grouped_mm"] = row["torch_bf16_grouped_mm_ms"] / row[f"{key}_ms"]
        peer = {"quant": "unfused_quant", "dswiglu": "unfused_dswiglu", "srelu": "unfused_srelu",
                "srelu_fp8": "unfused_srelu"}.get(key)     # glu: no unfused pipeline here
        if peer is not None:
            row[f"{key}_vs_{peer}"] = row[f"{peer}_ms"] / row[f"{key}_ms"]
    methods.clear()
    torch.cuda.empty_cache()
    return row


def _summary(r: dict) -> str:
    joules = r.get("joules_vs_" + POWER_LABEL)
    power = ("  joules / BF16 torch's: " + " ".join(f"{k} {v:.2f}" for k, v in joules.items())) if joules else ""
    return _timing_summary(r) + power


def _timing_summary(r: dict) -> str:
    if "srelu_tflops" not in r:      # --blockwise-only
        return " ".join(f"{k[:-10]} x{v:.2f}" for k, v in r.items()
                        if k.endswith("_vs_bf16_grouped_mm") and isinstance(v, float))
    return (f"blockwise: gemm {r['gemm_bw_tflops']:.0f} quant {r['quant_bw_tflops']:.0f} srelu "
            f"{r['srelu_bw_tflops']:.0f}/{r['srelu_bw_n128_tflops']:.0f} dswiglu {r['dswiglu_bw_tflops']:.0f} "
            f"glu {r['glu_bw_tflops']:.0f}/{r['glu_bw_fp8_tflops']:.0f} (x{r['glu_bw_vs_bf16_grouped_mm']:.2f}) "
            f"mx glu {r['glu_tflops']:.0f} "
            f"(x{r['quant_bw_vs_bf16_grouped_mm']:.2f} bf16, x{r.get('quant_bw_vs_fp8_scaled_grouped_mm', 0):.2f} "
            f"rowwise fp8); "
            f"srelu {r['srelu_tflops']:.0f} quant {r['quant_tflops']:.0f} dswiglu {r['dswiglu_tflops']:.0f} "
            f"bf16 {r['torch_bf16_grouped_mm_tflops']:.0f} TF/s  x{r['srelu_vs_bf16_grouped_mm']:.2f} vs bf16, "
            f"x{r['srelu_vs_unfused_srelu']:.1f} / {r['quant_vs_unfused_quant']:.1f} / "
            f"{r['dswiglu_vs_unfused_dswiglu']:.1f} vs unfused")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_run_arguments(ap, DEFAULT_SHAPES)
    add_also_argument(ap)
    ap.add_argument("--blockwise-only", action="store_true",
                    help="time the blockwise ops and the torch GEMMs only (no MXFP8 or unfused methods)")
    add_power_argument(ap)
    args = ap.parse_args(argv)
    args.also_pairs = also_builds(args)
    return run(args, bench_shape, _summary,
               {"benchmark": "block-scaled fused grouped GEMMs (MXFP8 A/B) vs torch", "also": dict(args.also_pairs)})


if __name__ == "__main__":
    raise SystemExit(main())
