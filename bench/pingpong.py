"""Benchmark the sm_90a BF16 kernel's two consumer schedules against each other and torch, in the
same run; prints JSON.

TILE_M 128 is cooperative (both consumer warpgroups on one tile, 64 rows each); TILE_M 64 is
ping-pong (each warpgroup on 64-row tiles of its own, in turn, so one's epilogue overlaps the
other's mainloop; fusegemm/sm90/grouped_gemm.cuh). For each op and shape it times:

* ``c128x256`` (every op's default), ``pp64x256`` and ``pp64x128`` (ping-pong);
* ``1wg64x256``: TILE_M 64 built with one consumer warpgroup (``-DFUSEGEMM_SM90_PINGPONG=0``,
  what TILE_M 64 was before ping-pong), the baseline the schedule replaces;
* ``c128x256_cl2``, ``pp64x256_cl2``, ``pp64x128_cl2``: the same tiles in clusters of two CTAs
  along M, each B k-block multicast to both (half B's L2-to-SM traffic: a 64 x 256 tile reads
  320 rows of operands per k-step for 64 x 256 outputs, 1.67x a 128 x 256 tile's bytes per
  FLOP); not for the K-grouped weight gradient, whose spec has no clusters;
* ``c128x128`` (cooperative) and ``pp128x128``: TILE_M 128 as ping-pong, each warpgroup a whole
  128 x 128 tile (``-DFUSEGEMM_SM90_PINGPONG_128=1``: 256 operand rows per 128 x 128 outputs, 20%
  fewer L2 bytes per FLOP than ``pp64x256``; the K-grouped kernel stays cooperative under it);
* the peer where there is one: ``torch._grouped_mm`` for the plain and K-grouped GEMMs.

Ops (``--shapes`` names ``op:shape``):

* ``gemm``: seed 001's BF16 grouped GEMM (``GroupedGemm``: alpha and prob applied, BF16 D) on
  bench/grouped_gemm.py's shapes;
* ``wgrad``: the K-grouped weight gradient (``KGroupedGemm``) on bench/wgrad.py's shapes;
* ``dswiglu`` / ``swiglu``: the MoE layer's fused GEMMs (``EpilogueGemm``: fc2's data gradient
  with dSwiGLU and N-major weights; fc1 with SwiGLU and its pre-activations) at the dsv3 layer
  (8 experts, hidden 7168, intermediate 2048), a qwen3-like one (32, 2048, 768) and mixtral's
  (8, 4096, 14336).

``--row-ends`` (``--dists routed``) calls the fusegemm ops as the MoE layer does: with row ends
(each expert's tokens inside its 256-row padded range, ``row_ends=``) and the padding rows of A,
prob and C zero; the plain GEMM then runs on the layer's op (``EpilogueGemm`` on seed 001's spec).
The padding's whole tiles are skipped; what is left of it is each expert's last tile
(``bench/results/pingpong_h100_idle_padding.json``: a build that idled a cooperative warpgroup on its
half of that tile when the half was all padding ran 0.69-1.01x the default's speed).

``--configs`` picks a subset of these (the default always runs); ``--also NAME=DEFINES``
(repeatable) builds every picked configuration again with those NVRTC defines (a header's A/B
switch), timed as CONFIG_NAME.

Every configuration's output is compared with the default's (``max_abs_diff_vs_default``: the
GEMM configurations accumulate each element in the same order, so 0 except for dprob's
atomics), and the K-grouped peer's with the default's (torch._grouped_mm applies no alpha or
prob to the plain GEMM: not compared). Reported: ms per configuration and each one's
speed-up over the default (default_ms / ms), and that ratio per interleaved round
(``speedup_vs_default_rounds``: median, min, max; a power-capped board's clocks move between
rounds by more than many A/B switches gain).

``--power SECONDS`` then runs each configuration alone for that long under nvidia-smi sampling
(``sustained``: ms per call, clock, watts, joules per call, the share of samples the power cap held;
``joules_vs_default``): on a power-capped board a kernel's time follows its energy per call.

    python bench/pingpong.py [--out bench/results/pingpong_h200.json] [--shapes gemm:dsv3-fc1,...]
"""
from __future__ import annotations

import argparse

from _common import (SHAPES, add_also_argument, add_power_argument, add_run_arguments, also_builds, expert_sizes,
                     expert_tokens, interleaved_ms, nvrtc_defines, power_rows, round_ratios, run)

WGRAD = {"dsv3-fc1-w": (8, 16384, 4096, 7168), "dsv3-fc2-w": (8, 16384, 7168, 2048),
         "dsv3-32-fc1-w": (32, 16384, 4096, 7168), "mixtral-fc1-w": (8, 16384, 28672, 4096),
         "mixtral-fc2-w": (8, 16384, 4096, 14336),
         # bench/moe_layer.py's layers (4096 tokens; dist "routed" pads as its routing does)
         "dsv3-32-l-fc1-w": (32, 32768, 4096, 7168), "dsv3-32-l-fc2-w": (32, 32768, 7168, 2048),
         "mixtral-l-fc1-w": (8, 8192, 28672, 4096), "mixtral-l-fc2-w": (8, 8192, 4096, 14336)}
LAYERS = {"dsv3": (8, 16384, 7168, 2048), "qwen3": (32, 16384, 2048, 768),   # experts, tokens, hidden, F
          "mixtral": (8, 16384, 4096, 14336), "dsv3-32-l": (32, 32768, 7168, 2048), "mixtral-l": (8, 8192, 4096, 14336)}
# (the layers' data gradients "-dgrad" with K-major B here; the layer reads w1 N-major)
GEMM = {**SHAPES, "dsv3-32-l-fc2": (32, 32768, 7168, 2048), "dsv3-32-l-dgrad": (32, 32768, 7168, 4096),
        "mixtral-l-fc2": (8, 8192, 4096, 14336), "mixtral-l-dgrad": (8, 8192, 4096, 28672)}
ALL = ([f"gemm:{s}" for s in GEMM] + [f"wgrad:{s}" for s in WGRAD]
       + [f"{op}:{s}" for op in ("dswiglu", "swiglu") for s in LAYERS])
# name: (tile_m, tile_n, NVRTC defines, cluster_m)
CONFIGS = {"c128x256": (128, 256, "", 1), "pp64x256": (64, 256, "", 1), "pp64x128": (64, 128, "", 1),
           "1wg64x256": (64, 256, "-DFUSEGEMM_SM90_PINGPONG=0", 1),
           "c128x256_cl2": (128, 256, "", 2), "pp64x256_cl2": (64, 256, "", 2), "pp64x128_cl2": (64, 128, "", 2),
           "c128x128": (128, 128, "", 1), "pp128x128": (128, 128, "-DFUSEGEMM_SM90_PINGPONG_128=1", 1)}
DEFAULT = "c128x256"


def _build(make, extra: str):
    with nvrtc_defines(extra):
        return make()


def _methods(config, args, clusters: bool = True) -> dict:
    """The run's configurations (args.picked, each again per args.also_pairs) as timed callables;
    without ``clusters``, those with a cluster are left out."""
    out = {}
    for key in args.picked:
        tm, tn, extra, cm = CONFIGS[key]
        if cm != 1 and not clusters:
            continue
        out[key] = config(tm, tn, extra, cm)
        for name, defines in args.also_pairs:
            out[f"{key}_{name}"] = config(tm, tn, (extra + " " + defines).strip(), cm)
    return out


def _offsets(torch, sizes):
    return torch.tensor([sum(sizes[: i + 1]) for i in range(len(sizes))], dtype=torch.int32, device="cuda")


def _row_ends(torch, args, experts, tokens, dist, sizes, *rows):
    """With --row-ends: each expert's row end (int32, on the rows' device), the padding rows of ``rows``
    (tensors whose first dimension is the problem's rows) zeroed; else None."""
    if not args.row_ends:
        return None
    if dist != "routed":
        raise SystemExit(f"--row-ends: got --dists {dist}; allowed: routed (the layer's padding)")
    counts = expert_tokens(experts, tokens, dist)
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    for t in rows:
        for s, c, z in zip(starts, counts, sizes):
            t[s + c: s + z].zero_()
    return torch.tensor([s + c for s, c in zip(starts, counts)], dtype=torch.int32, device=rows[0].device)


def _gemm(torch, shape, dist, args):
    from fusegemm.presets import GroupedGemm
    experts, tokens, n, k = GEMM[shape]
    sizes = expert_sizes(experts, tokens, dist)
    m = sum(sizes)
    g = torch.Generator(device="cuda").manual_seed(0)
    a = (torch.randn((m, k, 1), generator=g, device="cuda") * 0.5).bfloat16()
    b = (torch.randn((experts, n, k), generator=g, device="cuda") * 0.5).bfloat16()
    off = _offsets(torch, sizes)
    alpha = torch.rand((experts,), generator=g, device="cuda") + 0.5
    prob = torch.rand((m, 1, 1), generator=g, device="cuda")
    b_view = b.permute(1, 2, 0)
    ends = _row_ends(torch, args, experts, tokens, dist, sizes, a, prob)

    def config(tm, tn, extra, cm=1):
        if ends is not None:   # the layer's op: EpilogueGemm on seed 001's spec, with row ends
            from fusegemm import EpilogueGemm
            ins = {"alpha": alpha, "prob": prob[:, 0, 0]}
            cl = {"cluster_m": cm} if cm != 1 else {}
            eop = _build(lambda: EpilogueGemm("grouped_gemm", tile_m=tm, tile_n=tn, **cl).compile(), extra)
            return lambda: eop(a[..., 0], off, b, inputs=ins, row_ends=ends)["d"]
        d = torch.empty((m, n, 1), dtype=torch.bfloat16, device="cuda")
        cl = {"cluster_shape_mn": (cm, 1)} if cm != 1 else {}
        op = _build(lambda: GroupedGemm(a, None, d, off, alpha, b_view, None, prob, mma_tiler_mn=(tm, tn),
                                        **cl).compile(), extra)

        def call():
            op.execute(a, None, d, off, alpha, b_view, None, prob)
            return d
        return call
    methods = _methods(config, args)
    bt, a2 = b.transpose(-2, -1), a[..., 0]
    methods["torch_grouped_mm"] = lambda: torch._grouped_mm(a2, bt, offs=off)
    # torch._grouped_mm applies neither alpha nor prob: its output is not compared.
    return methods, {"torch_grouped_mm": None}, 2.0 * m * n * k, {"experts": experts, "rows": m, "n": n, "k": k}


def _wgrad(torch, shape, dist, args):
    from fusegemm import KGroupedGemm
    experts, tokens, mm, n = WGRAD[shape]
    sizes = expert_sizes(experts, tokens, dist)
    t = sum(sizes)
    g = torch.Generator(device="cuda").manual_seed(0)
    dy = torch.randn(t, mm, generator=g, device="cuda").bfloat16()
    x = torch.randn(t, n, generator=g, device="cuda").bfloat16()
    off = _offsets(torch, sizes)
    ends = _row_ends(torch, args, experts, tokens, dist, sizes, dy, x)
    kw = {"row_ends": ends} if ends is not None else {}

    def config(tm, tn, extra, cm=1):
        op = _build(lambda: KGroupedGemm("grouped_gemm_wgrad", tile_m=tm, tile_n=tn).compile(), extra)
        return lambda: op(dy, x, off, **kw)["d"]
    methods = _methods(config, args, clusters=False)   # (the K-grouped spec has no clusters)
    methods["torch_grouped_mm"] = lambda: torch._grouped_mm(dy.t(), x, offs=off)
    return methods, {}, 2.0 * t * mm * n, {"experts": experts, "tokens": t, "m": mm, "n": n}


def fused_problem(torch, op_name, shape, dist):
    """The layer's fused GEMM ``op_name`` ("dswiglu" or "swiglu") on LAYERS[shape]'s rows (seeded):
    spec, axes, the operands a, offsets and b, its inputs, and rows / N / K. bench/ncu_one_op.py
    profiles the same problem."""
    experts, tokens, hidden, f = LAYERS[shape]
    sizes = expert_sizes(experts, tokens, dist)
    m = sum(sizes)
    gen = torch.Generator(device="cuda").manual_seed(0)
    off = _offsets(torch, sizes)
    prob = torch.rand(m, generator=gen, device="cuda")
    one = torch.ones(experts, device="cuda")
    if op_name == "dswiglu":   # fc2's data gradient: dy (M, H) @ w2 (L, H, F) read N-major
        a = (torch.randn(m, hidden, generator=gen, device="cuda") * 0.5).bfloat16()
        b = (torch.randn(experts, hidden, f, generator=gen, device="cuda") * 0.05).bfloat16().transpose(1, 2)
        c = torch.randn(m, 2 * f, generator=gen, device="cuda").bfloat16()
        spec, axes, inputs, n, k = ("grouped_gemm_dswiglu_bf16", {"b_major": "n"},
                                    {"alpha": one, "prob": prob, "c": c}, f, hidden)
    else:                      # fc1: x (M, H) @ w1 (L, 2F, H), SwiGLU, with the pre-activations
        a = (torch.randn(m, hidden, generator=gen, device="cuda") * 0.5).bfloat16()
        b = (torch.randn(experts, 2 * f, hidden, generator=gen, device="cuda") * 0.05).bfloat16()
        spec, axes, inputs, n, k = ("grouped_gemm_swiglu", {"d_dtype": "bfloat16", "generate_c": True,
                                                            "c_dtype": "bfloat16"},
                                    {"alpha": one, "prob": prob}, 2 * f, hidden)
    return spec, axes, a, off, b, inputs, m, n, k


def _fused(torch, op_name, shape, dist, args):
    from fusegemm import EpilogueGemm
    spec, axes, a, off, b, inputs, m, n, k = fused_problem(torch, op_name, shape, dist)
    experts, tokens = LAYERS[shape][:2]
    sizes = expert_sizes(experts, tokens, dist)
    zeroed = [a, inputs["prob"]] + ([inputs["c"]] if "c" in inputs else [])
    ends = _row_ends(torch, args, experts, tokens, dist, sizes, *zeroed)
    kw = {"row_ends": ends} if ends is not None else {}

    def config(tm, tn, extra, cm=1):
        cl = {"cluster_m": cm} if cm != 1 else {}
        op = _build(lambda: EpilogueGemm(spec, tile_m=tm, tile_n=tn, **cl, **axes).compile(), extra)
        return lambda: op(a, off, b, inputs=inputs, **kw)["d"]
    methods = _methods(config, args)
    return methods, {}, 2.0 * m * n * k, {"experts": LAYERS[shape][0], "rows": m, "n": n, "k": k}


def bench_shape(name: str, dist: str, args) -> dict:
    import torch
    op, shape = name.split(":")
    if op == "gemm":
        methods, skip, flops, facts = _gemm(torch, shape, dist, args)
    elif op == "wgrad":
        methods, skip, flops, facts = _wgrad(torch, shape, dist, args)
    else:
        methods, skip, flops, facts = _fused(torch, op, shape, dist, args)
    row = {"op": op, "shape": shape, "dist": dist, **facts}
    ref = methods[DEFAULT]().float().clone()
    row["max_abs_diff_vs_default"] = {
        key: float((fn().float() - ref).abs().max()) for key, fn in methods.items()
        if key != DEFAULT and key not in skip}
    del ref
    rounds: dict[str, list[float]] = {}
    ms = interleaved_ms(methods, args, rounds_out=rounds)
    row["ms"] = ms
    row["tflops"] = {key: flops / v / 1e9 for key, v in ms.items()}
    row["speedup_vs_default"] = {key: ms[DEFAULT] / v for key, v in ms.items() if key != DEFAULT}
    # Each round's own ratio (the two builds under that round's clocks): median, min, max.
    row["speedup_vs_default_rounds"] = {key: round_ratios(rounds, DEFAULT, key) for key in ms if key != DEFAULT}
    best = min((k for k in ms if k != "torch_grouped_mm"), key=ms.get)
    row["best_config"] = best
    if "torch_grouped_mm" in ms:
        row["best_vs_torch"] = ms["torch_grouped_mm"] / ms[best]
        row["default_vs_torch"] = ms["torch_grouped_mm"] / ms[DEFAULT]
    if args.power:   # each configuration alone, after the rounds: its clock, power and energy per call
        row.update(power_rows(methods, args.power, DEFAULT, "default"))
    methods.clear()
    torch.cuda.empty_cache()
    return row


def _summary(r: dict) -> str:
    s = "  ".join(f"{k} {v:.3f}" for k, v in r["ms"].items())
    if "sustained" in r:
        s += "  alone: " + "  ".join(f"{k} {w['ms']:.3f} ms {w['watts'] or 0:.0f} W {w['joules'] or 0:.3f} J"
                                     for k, w in r["sustained"].items())
    return f"{s}  best {r['best_config']}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_run_arguments(ap, ",".join(ALL))
    ap.add_argument("--configs", default=",".join(CONFIGS),
                    help=f"comma list of {', '.join(CONFIGS)} ({DEFAULT} always runs)")
    add_also_argument(ap)
    ap.add_argument("--row-ends", action="store_true",
                    help="(--dists routed) the ops get the layer's row ends and zero padding rows")
    add_power_argument(ap, "configuration")
    args = ap.parse_args(argv)
    picked = [c for c in args.configs.split(",") if c]
    unknown = [c for c in picked if c not in CONFIGS]
    if unknown:
        raise SystemExit(f"--configs: unknown {', '.join(unknown)}; allowed: {', '.join(CONFIGS)}")
    args.picked = [DEFAULT] + [c for c in picked if c != DEFAULT]
    args.also_pairs = also_builds(args)
    header = {"benchmark": "sm_90a consumer schedules: cooperative 128-row tiles vs ping-pong 64-row tiles",
              "default": DEFAULT,
              "configs": {k: {"tile": v[:2], "nvrtc_extra": v[2], "cluster_m": v[3]}
                          for k, v in CONFIGS.items() if k in args.picked},
              "also": dict(args.also_pairs), "row_ends": args.row_ends}
    return run(args, bench_shape, _summary, header, shapes=ALL)


if __name__ == "__main__":
    raise SystemExit(main())
