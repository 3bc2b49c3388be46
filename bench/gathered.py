"""Gathered A and scattered D against the same kernel on pre-permuted rows, in the same run; prints JSON.

An MoE layer's fc1 (and its data gradient's dY) reads token-major rows through the routing's
permutation. Three ways to run the grouped GEMM of one routed batch (``fusegemm.routing.route``
over random logits; BF16, ``specs/grouped_gemm.yaml``, tile 128 x 256):

* ``gathered``  the kernel reads row ``a_index[r]`` of x itself (``a_gather=True``: the producer
  warp's cp.async, fusegemm/gather.cuh);
* ``pre_permuted``  the same kernel on rows gathered beforehand (issue 33's baseline: the
  gathered kernel should run at >= 0.95x of this);
* ``gather_then_gemm``  the permutation kernel (fusegemm/permute.py) and then the GEMM: what the
  layer runs without the gathered mode.

and the same for the layer's fc1 weight gradient (``specs/grouped_gemm_wgrad.yaml``, dW1_e =
dG_e^T X_e): ``wgrad_gathered`` reads X's token rows through the index (``b_gather=True``),
``wgrad_pre_permuted`` the rows gathered beforehand.

The blockwise FP8 recipe's fc1 (``specs/grouped_gemm_glu_mx.yaml`` as ``fusegemm.moe``'s
``fp8_block`` recipe builds it: FP8 D with 1x128 scales and the BF16 pre-activations): ``fp8_gathered``
reads x's quantized token rows and their 1x128 scales through the index (``a_gather=True``, the
blockwise kernel's copying warps), ``fp8_pre_permuted`` the rows and scales gathered beforehand.

Scattered outputs, on the layer's fc2 (K = intermediate, N = hidden): ``scattered`` writes row r of
the problem to slot ``token * top_k + j`` of a (tokens * top_k, hidden) output (``d_scatter=True``,
``d_index=``: the combine then sums contiguous rows; the op zeroes the rows no index names, here
none: fusegemm/ops/tail.py ``zero_unnamed``), ``fc2`` the same kernel writing rows in problem order
(the >= 0.95x baseline); ``scattered_whole_fill`` the scattered kernel into a caller's buffer
zeroed whole first (``execute``), what the op did before ``zero_unnamed``; ``scattered_k_major`` the
same slots laid out (top_k, tokens, hidden), slot ``j * tokens + token``.

Outputs of each gathered or scattered kernel and its plain run are checked bit-equal before timing
(the dSwiGLU GEMM's dprob, summed by atomics in a varying order: within 1e-5 of its largest value).

``--stored`` adds ``gathered_stored``: the gathered kernel storing the rows it gathered as well
(``a_gather_store=True``: ``a_rows``, the rows a weight gradient reads next), against
``gather_then_gemm`` (which writes the same rows) and ``gathered``.

``--dswiglu`` adds the layer's fc2 data gradient with dSwiGLU (``specs/grouped_gemm_dswiglu_bf16.yaml``,
w2 read N-major, C the fc1 pre-activations): dy's token rows read through the index against the rows
permuted beforehand, on the ping-pong 64 x 256 tile the layer runs (``dswiglu_pp64x256_*``) and the
cooperative 128 x 256 tile (``dswiglu_c128x256_*``); with ``--also``, the ping-pong tile's gathered
kernel of each build too. ``--also NAME=DEFINES`` builds the gathered fc1, the scattered fc2 and the
gathered weight gradient again under the defines (``gathered_NAME``, ``scattered_NAME``, ``wgrad_gathered_NAME``;
with ``--wgrad-swapped`` the M-major store's kernels too, ``wgrad_swapped_dt_{gathered,pre_permuted}_NAME``, checked
bit-equal to the default build's).

``--wgrad-swapped`` adds the weight gradient with the roles swapped (dW1^T = X^T dG: X gathered as A,
``wgrad_swapped_gathered``, against ``wgrad_swapped_pre_permuted``), and the layer's candidate:
the same gathered kernel storing D M-major (``cd_major="m"``: D_e^T, so dW1 lands as (L, 2F, H)
like ``wgrad_pre_permuted``'s), ``wgrad_swapped_dt_gathered``, whose ratio to
``wgrad_pre_permuted`` is the one issue 33 asks about (>= 0.95x); ``wgrad_swapped_dt_pre_permuted``
(the same store on pre-permuted rows) gives the M-major store's own cost.

``--queued`` times each round's calls back to back between one pair of events (the GPU's time per
call while the host runs ahead, as in a layer's step) instead of each call's latency, which also
counts the host's time to issue a call.

    python bench/gathered.py [--layers dsv3-8,mixtral,qwen3] [--also NAME=DEFINES] [--wgrad-swapped] [--stored]
                             [--dswiglu] [--queued] [--out FILE]
"""
from __future__ import annotations

import argparse

from _common import (add_also_argument, add_layer_arguments, also_builds, interleaved_ms, nvrtc_defines, prebuild,
                     queued_ms, round_ratios, run_layers, time_ms)

# name: (experts, tokens, K (hidden), N (2 x intermediate), top_k)
LAYERS = {
    "dsv3-8": (8, 4096, 7168, 4096, 8),
    "mixtral": (8, 4096, 4096, 28672, 2),
    "qwen3": (128, 4096, 2048, 1536, 8),
}


def routed_fc1(name: str):
    """Layer ``name``'s routed fc1, seeded: (generator, x, w, routing, a_index, rows gathered
    beforehand, the epilogue's inputs); the generator goes on for the rest of a row's tensors."""
    import torch

    from fusegemm import permute, routing
    experts, tokens, k, n, top_k = LAYERS[name]
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(tokens, k, generator=g, device="cuda").bfloat16()
    w = (torch.randn(experts, n, k, generator=g, device="cuda") * k ** -0.5).bfloat16()
    r = routing.route(torch.randn(tokens, experts, generator=g, device="cuda"), top_k)
    ins = {"alpha": torch.ones(experts, device="cuda")}
    return g, x, w, r, r.token_of_row.int(), permute.gather_rows(x, r.token_of_row), ins


def routed_dswiglu(name: str, g, r):
    """Layer ``name``'s fc2 data gradient with dSwiGLU on routing ``r`` (generator ``g`` goes on):
    dy (T, H), its rows permuted beforehand, w2 (E, H, F) as an N-major B view (E, F, H), and the
    epilogue's inputs (C: the fc1 pre-activations (R, 2F); prob: each row's weight)."""
    import torch

    from fusegemm import permute
    experts, tokens, k, n, _ = LAYERS[name]
    dy = torch.randn(tokens, k, generator=g, device="cuda").bfloat16()
    w2n = (torch.randn(experts, k, n // 2, generator=g, device="cuda") * k ** -0.5).bfloat16().transpose(1, 2)
    inputs = {"alpha": torch.ones(experts, device="cuda"), "prob": torch.rand(r.rows, generator=g, device="cuda"),
              "c": torch.randn(r.rows, n, generator=g, device="cuda").bfloat16()}
    return dy, permute.gather_rows(dy, r.token_of_row), w2n, inputs


def bench_layer(name: str, args) -> dict:
    import torch

    from fusegemm import permute
    from fusegemm.moe import _RECIPE_OPS
    from fusegemm.ops.engine import Op
    experts, tokens, k, n, top_k = LAYERS[name]
    g, x, w, r, idx, rows, ins = routed_fc1(name)
    axes = dict(tile_m=128, tile_n=256)
    gathered, plain = Op("grouped_gemm", a_gather=True, **axes), Op("grouped_gemm", **axes)
    wg, wp = Op("grouped_gemm_wgrad", b_gather=True, **axes), Op("grouped_gemm_wgrad", **axes)
    scattered = Op("grouped_gemm", d_scatter=True, **axes)
    spec8, axes8 = _RECIPE_OPS["fc1"]
    g8, p8 = Op(spec8, a_gather=True, **axes8), Op(spec8, **axes8)
    optional = []   # the kernels of the asked-for extras (--wgrad-swapped, --stored, --dswiglu)
    if args.wgrad_swapped:
        sg, sp = Op("grouped_gemm_wgrad", a_gather=True, **axes), Op("grouped_gemm_wgrad", **axes)   # (sp: wp's kernel)
        sdt = Op("grouped_gemm_wgrad", a_gather=True, cd_major="m", **axes)
        pdt = Op("grouped_gemm_wgrad", cd_major="m", **axes)
        optional += [sg, sdt, pdt]
    if args.stored:
        st = Op("grouped_gemm", a_gather=True, a_gather_store=True, **axes)
        optional.append(st)
    dswiglu_ops = {}
    if args.dswiglu:
        for tag, tile in (("pp64x256", dict(tile_m=64, tile_n=256)), ("c128x256", dict(tile_m=128, tile_n=256))):
            dswiglu_ops[tag] = (Op("grouped_gemm_dswiglu_bf16", a_gather=True, b_major="n", **tile),
                                Op("grouped_gemm_dswiglu_bf16", b_major="n", **tile))
            optional += dswiglu_ops[tag]
    prebuild([gathered, plain, wg, wp, scattered, g8, p8, *optional], f"{name} kernels")   # in parallel, first
    equal = torch.equal(gathered(x, r.padded_offsets, w, a_index=idx, inputs=ins)["d"],
                        plain(rows, r.padded_offsets, w, inputs=ins)["d"])
    dg = torch.randn(r.rows, n, generator=g, device="cuda").bfloat16()      # fc1's output gradient rows
    wequal = torch.equal(wg(dg, x, r.padded_offsets, x_index=idx)["d"], wp(dg, rows, r.padded_offsets)["d"])
    # fc2 (rows, F) @ w2 (E, H, F) with its rows scattered to their (token, j) slots.
    h = torch.randn(r.rows, n // 2, generator=g, device="cuda").bfloat16()
    w2 = (torch.randn(experts, k, n // 2, generator=g, device="cuda") * (n // 2) ** -0.5).bfloat16()
    slots = tokens * top_k

    def slot_index(slot_of_pair):   # problem row -> output slot of its (token, j) pair; padding -1
        d = torch.full((r.rows,), -1, dtype=torch.int32, device="cuda")
        d[r.row_of.reshape(-1)] = slot_of_pair
        return d
    pairs = torch.arange(slots, dtype=torch.int32, device="cuda")   # (token, j) pairs in token-major order
    d_index = slot_index(pairs)
    # The same slots k-major, (top_k, tokens, hidden): slot j * tokens + t, so that an expert's rows
    # (tokens in order, each at its own j) land in top_k bands of consecutive rows, not top_k rows apart.
    d_index_km = slot_index(pairs.view(top_k, tokens).t().reshape(-1))
    y = plain(h, r.padded_offsets, w2, inputs=ins)["d"]
    sequal = torch.equal(scattered(h, r.padded_offsets, w2, d_index=d_index, d_rows=slots, inputs=ins)["d"],
                         y[r.row_of.reshape(-1)])
    filled = torch.empty((slots, k), dtype=torch.bfloat16, device="cuda")
    methods = {
        "gathered": lambda: gathered(x, r.padded_offsets, w, a_index=idx, inputs=ins),
        "pre_permuted": lambda: plain(rows, r.padded_offsets, w, inputs=ins),
        "gather_then_gemm": lambda: plain(permute.gather_rows(x, r.token_of_row), r.padded_offsets, w, inputs=ins),
        "wgrad_gathered": lambda: wg(dg, x, r.padded_offsets, x_index=idx),
        "wgrad_pre_permuted": lambda: wp(dg, rows, r.padded_offsets),
        "scattered": lambda: scattered(h, r.padded_offsets, w2, d_index=d_index, d_rows=slots, inputs=ins),
        "fc2": lambda: plain(h, r.padded_offsets, w2, inputs=ins),
        "scattered_k_major": lambda: scattered(h, r.padded_offsets, w2, d_index=d_index_km, d_rows=slots, inputs=ins),
        "scattered_whole_fill": lambda: (filled.zero_(), scattered.execute(h, r.padded_offsets, w2, d_index=d_index,
                                                                           d_rows=slots, outputs={"d": filled},
                                                                           inputs=ins)),
    }
    # The blockwise FP8 fc1: x quantized 1x128 per token, its rows and scales gathered beforehand
    # for the plain kernel (padding rows: zero bytes and zero scales, as the gathered loads read).
    from fusegemm.formats import blockwise_sfa_layout
    from fusegemm.quantize import quantize_128x128, quantize_1x128
    xq, sx = quantize_1x128(x)
    wq, sw = quantize_128x128(w)
    pad = (idx < 0)[:, None]
    rows8 = torch.where(pad, 0, xq.view(torch.uint8)[idx.long().clamp(0)]).view(xq.dtype)
    srows8 = blockwise_sfa_layout(torch.where(pad, 0.0, sx[idx.long().clamp(0)]))
    ins8 = {"alpha": torch.ones(experts, device="cuda"), "prob": torch.ones(r.rows, device="cuda"),
            "norm_const": torch.ones(1, device="cuda")}
    o8g, o8p = g8(xq, sx, r.padded_offsets, wq, sw, a_index=idx, inputs=ins8), p8(rows8, srows8, r.padded_offsets, wq,
                                                                                  sw, inputs=ins8)
    raw = lambda t: t.view(torch.uint8) if t.element_size() == 1 else t   # noqa: E731 (FP8: compare bytes)
    equal8 = all(torch.equal(raw(o8g[key]), raw(o8p[key])) for key in o8p.keys() if o8p[key] is not None)
    methods["fp8_gathered"] = lambda: g8(xq, sx, r.padded_offsets, wq, sw, a_index=idx, inputs=ins8)
    methods["fp8_pre_permuted"] = lambda: p8(rows8, srows8, r.padded_offsets, wq, sw, inputs=ins8)
    if args.wgrad_swapped:
        # The same weight gradient with the operands' roles swapped, dW1^T = X^T dG: X on the M side,
        # gathered as A (a_gather, dy_index=), half the gathered bytes of a 128 x 256 tile's stage
        # (64 token rows x 128 columns where b_gather copies 64 x 256), against the swapped kernel
        # on pre-permuted rows: whether the gathered loads' cost follows their bytes (the
        # gathered / pre-permuted ratio held at 0.86-0.93 at every tile shape on the H100,
        # 2026-12-05). The layer would then need D stored transposed.
        swapped_equal = torch.equal(sg(x, dg, r.padded_offsets, dy_index=idx)["d"], sp(rows, dg, r.padded_offsets)["d"])
        methods["wgrad_swapped_gathered"] = lambda: sg(x, dg, r.padded_offsets, dy_index=idx)
        methods["wgrad_swapped_pre_permuted"] = lambda: sp(rows, dg, r.padded_offsets)
        # The candidate: D_e^T stored (M-major), dW1 as the layer's (L, 2F, H). Its sums are the
        # pre-permuted kernel's products in swapped WGMMA roles: compared, not asked to be equal.
        dw_dt_out = sdt(x, dg, r.padded_offsets, dy_index=idx)["d"]
        dw_dt_pre_out = pdt(rows, dg, r.padded_offsets)["d"]   # (the --also builds' references)
        dw_dt = dw_dt_out.float()
        dw_ref = wp(dg, rows, r.padded_offsets)["d"].float()
        swapped_dt_diff = ((dw_dt - dw_ref).norm() / dw_ref.norm().clamp(min=1e-30)).item()
        methods["wgrad_swapped_dt_gathered"] = lambda: sdt(x, dg, r.padded_offsets, dy_index=idx)
        methods["wgrad_swapped_dt_pre_permuted"] = lambda: pdt(rows, dg, r.padded_offsets)   # the store's own cost
    if args.stored:
        # The gathered kernel storing the rows it gathered (a_gather_store: a_rows, what a weight
        # gradient reads next), against the gather kernel followed by the GEMM, which writes them too.
        o = st(x, r.padded_offsets, w, a_index=idx, inputs=ins)
        stored_equal = torch.equal(o["d"], plain(rows, r.padded_offsets, w, inputs=ins)["d"]) and torch.equal(
            o["a_rows"], rows)
        methods["gathered_stored"] = lambda: st(x, r.padded_offsets, w, a_index=idx, inputs=ins)
    dswiglu_equal, dswiglu_dprob_err, dt_equal = {}, {}, {}
    if args.dswiglu:
        dy, dy_rows, w2n, dins = routed_dswiglu(name, g, r)
        for tag, (dgo, dpo) in dswiglu_ops.items():
            og = dgo(dy, r.padded_offsets, w2n, a_index=idx, inputs=dins)
            op_ = dpo(dy_rows, r.padded_offsets, w2n, inputs=dins)
            # dprob sums the N tiles' partial sums with atomics, in an order that varies: compared by
            # value, against its largest magnitude (a row's sum can cancel to near zero, where an
            # element-wise relative bound fails on rounding alone); D bit for bit.
            dprob_err = ((og["dprob"] - op_["dprob"]).abs().max() / op_["dprob"].abs().max().clamp(min=1e-30)).item()
            dswiglu_dprob_err[tag] = dprob_err
            dswiglu_equal[tag] = torch.equal(og["d"], op_["d"]) and dprob_err <= 1e-5
            if tag == "pp64x256":
                dswiglu_ref = op_
            methods[f"dswiglu_{tag}_gathered"] = lambda dgo=dgo: dgo(dy, r.padded_offsets, w2n, a_index=idx,
                                                                     inputs=dins)
            methods[f"dswiglu_{tag}_pre_permuted"] = lambda dpo=dpo: dpo(dy_rows, r.padded_offsets, w2n, inputs=dins)
    for tag, defines in args.also_pairs:   # the gathered and scattered ops built again (A/B switches)
        with nvrtc_defines(defines):
            g_also = Op("grouped_gemm", a_gather=True, **axes).compile()
            s_also = Op("grouped_gemm", d_scatter=True, **axes).compile()
            w_also = Op("grouped_gemm_wgrad", b_gather=True, **axes).compile()
        methods[f"wgrad_gathered_{tag}"] = lambda w_also=w_also: w_also(dg, x, r.padded_offsets, x_index=idx)
        methods[f"gathered_{tag}"] = lambda g_also=g_also: g_also(x, r.padded_offsets, w, a_index=idx, inputs=ins)
        methods[f"scattered_{tag}"] = lambda s_also=s_also: s_also(h, r.padded_offsets, w2, d_index=d_index,
                                                                     d_rows=slots, inputs=ins)
        if args.wgrad_swapped:   # and the M-major store's two kernels, checked against the default build
            with nvrtc_defines(defines):
                sdt_also = Op("grouped_gemm_wgrad", a_gather=True, cd_major="m", **axes).compile()
                pdt_also = Op("grouped_gemm_wgrad", cd_major="m", **axes).compile()
            dt_equal[tag] = (torch.equal(sdt_also(x, dg, r.padded_offsets, dy_index=idx)["d"], dw_dt_out)
                             and torch.equal(pdt_also(rows, dg, r.padded_offsets)["d"], dw_dt_pre_out))
            methods[f"wgrad_swapped_dt_gathered_{tag}"] = lambda o=sdt_also: o(x, dg, r.padded_offsets, dy_index=idx)
            methods[f"wgrad_swapped_dt_pre_permuted_{tag}"] = lambda o=pdt_also: o(rows, dg, r.padded_offsets)
        if args.dswiglu:   # and the gathered dSwiGLU's ping-pong tile, checked against its plain run first
            with nvrtc_defines(defines):
                d_also = Op("grouped_gemm_dswiglu_bf16", a_gather=True, b_major="n", tile_m=64, tile_n=256).compile()
            o_also = d_also(dy, r.padded_offsets, w2n, a_index=idx, inputs=dins)
            dswiglu_equal[f"pp64x256_{tag}"] = torch.equal(o_also["d"], dswiglu_ref["d"])
            methods[f"dswiglu_pp64x256_gathered_{tag}"] = lambda d_also=d_also: d_also(dy, r.padded_offsets, w2n,
                                                                                       a_index=idx, inputs=dins)
    row = {"layer": name, "experts": experts, "tokens": tokens, "k": k, "n": n, "top_k": top_k, "rows": r.rows,
           "gathered_equals_pre_permuted": equal, "wgrad_gathered_equals_pre_permuted": wequal,
           "scattered_equals_fc2_placed": sequal, "fp8_gathered_equals_pre_permuted": equal8}
    rounds: dict = {}
    row["timer"] = "queued" if args.queued else "latency"
    for key, ms in interleaved_ms(methods, args, timer=queued_ms if args.queued else time_ms,
                                  rounds_out=rounds).items():
        row[f"{key}_ms"] = ms
    # Paired per-round ratios (median, min, max) of the bars' comparisons: this board's clocks move
    # by more than the effects measured here, and a round's two methods share its clocks.
    for num, den in (("pre_permuted", "gathered"), ("wgrad_pre_permuted", "wgrad_gathered"), ("fc2", "scattered"),
                     ("fc2", "scattered_k_major")):
        row[f"{den}_vs_{num}_rounds"] = round_ratios(rounds, num, den)
    flops = 2.0 * tokens * top_k * k * n
    row["gathered_tflops"] = flops / row["gathered_ms"] / 1e9
    row["gathered_vs_pre_permuted"] = row["pre_permuted_ms"] / row["gathered_ms"]
    row["gathered_vs_gather_then_gemm"] = row["gather_then_gemm_ms"] / row["gathered_ms"]
    row["wgrad_gathered_vs_pre_permuted"] = row["wgrad_pre_permuted_ms"] / row["wgrad_gathered_ms"]
    row["scattered_vs_fc2"] = row["fc2_ms"] / row["scattered_ms"]
    row["scattered_whole_fill_vs_fc2"] = row["fc2_ms"] / row["scattered_whole_fill_ms"]
    row["scattered_k_major_vs_fc2"] = row["fc2_ms"] / row["scattered_k_major_ms"]
    row["fp8_gathered_vs_pre_permuted"] = row["fp8_pre_permuted_ms"] / row["fp8_gathered_ms"]
    if args.wgrad_swapped:
        row["wgrad_swapped_gathered_equals_pre_permuted"] = swapped_equal
        swapped_ms = row["wgrad_swapped_gathered_ms"]
        row["wgrad_swapped_gathered_vs_pre_permuted"] = row["wgrad_swapped_pre_permuted_ms"] / swapped_ms
        row["wgrad_swapped_gathered_vs_wgrad_pre_permuted"] = row["wgrad_pre_permuted_ms"] / swapped_ms
        row["wgrad_swapped_dt_rel_diff_vs_pre_permuted"] = swapped_dt_diff
        row["wgrad_swapped_dt_gathered_vs_wgrad_pre_permuted"] = (row["wgrad_pre_permuted_ms"] /
                                                                  row["wgrad_swapped_dt_gathered_ms"])
        # The M-major store against the N-major one, both on pre-permuted rows.
        row["wgrad_swapped_dt_store_vs_n_major"] = (row["wgrad_swapped_pre_permuted_ms"] /
                                                    row["wgrad_swapped_dt_pre_permuted_ms"])
    if args.stored:
        row["gathered_stored_equals_pre_permuted_and_rows"] = stored_equal
        row["gathered_stored_vs_gather_then_gemm"] = row["gather_then_gemm_ms"] / row["gathered_stored_ms"]
        row["gathered_stored_vs_pre_permuted"] = row["pre_permuted_ms"] / row["gathered_stored_ms"]
        row["gathered_stored_vs_gathered"] = row["gathered_ms"] / row["gathered_stored_ms"]
    for tag, same in dswiglu_equal.items():   # (tag: a tile, or a tile and an --also build)
        tile, _, also = tag.partition("_")
        key = f"dswiglu_{tile}_gathered" + (f"_{also}" if also else "")
        row[f"{key}_equals_pre_permuted"] = same
        if tag in dswiglu_dprob_err:
            row[f"{key}_dprob_err_of_max"] = dswiglu_dprob_err[tag]
        row[f"{key}_vs_pre_permuted"] = row[f"dswiglu_{tile}_pre_permuted_ms"] / row[f"{key}_ms"]
    for tag, _ in args.also_pairs:
        row[f"gathered_{tag}_vs_pre_permuted"] = row["pre_permuted_ms"] / row[f"gathered_{tag}_ms"]
        row[f"wgrad_gathered_{tag}_vs_pre_permuted"] = row["wgrad_pre_permuted_ms"] / row[f"wgrad_gathered_{tag}_ms"]
        row[f"scattered_{tag}_vs_fc2"] = row["fc2_ms"] / row[f"scattered_{tag}_ms"]
        if args.wgrad_swapped:
            row[f"wgrad_swapped_dt_{tag}_equals_default"] = dt_equal[tag]
            row[f"wgrad_swapped_dt_gathered_{tag}_vs_wgrad_pre_permuted"] = (
                row["wgrad_pre_permuted_ms"] / row[f"wgrad_swapped_dt_gathered_{tag}_ms"])
            row[f"wgrad_swapped_dt_store_{tag}_vs_n_major"] = (row["wgrad_swapped_pre_permuted_ms"] /
                                                              row[f"wgrad_swapped_dt_pre_permuted_{tag}_ms"])
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_layer_arguments(ap, LAYERS, warmup=3, iters=10, rounds=5)
    add_also_argument(ap)
    ap.add_argument("--wgrad-swapped", action="store_true",
                    help="also time the weight gradient with X gathered on the M side (dW1^T = X^T dG)")
    ap.add_argument("--stored", action="store_true",
                    help="also time the gathered GEMM storing the rows it gathered (a_gather_store)")
    ap.add_argument("--queued", action="store_true",
                    help="time each round's calls back to back (the GPU's time per call when the host runs ahead) "
                         "instead of each call's latency")
    ap.add_argument("--dswiglu", action="store_true",
                    help="also time the layer's dSwiGLU GEMM with dy gathered (ping-pong 64 x 256 and 128 x 256)")
    args = ap.parse_args(argv)
    args.also_pairs = also_builds(args)
    return run_layers(args, LAYERS, bench_layer,
                      lambda r: (f"gathered {r['gathered_ms']:.3f} ms  pre-permuted {r['pre_permuted_ms']:.3f} ms  "
                                 f"gather+gemm {r['gather_then_gemm_ms']:.3f} ms  "
                                 f"x{r['gathered_vs_pre_permuted']:.3f} of pre-permuted  "
                                 f"equal {r['gathered_equals_pre_permuted']}  wgrad "
                                 f"x{r['wgrad_gathered_vs_pre_permuted']:.3f} of pre-permuted  "
                                 f"equal {r['wgrad_gathered_equals_pre_permuted']}  scattered fc2 "
                                 f"x{r['scattered_vs_fc2']:.3f} of plain  equal {r['scattered_equals_fc2_placed']}"),
                      "gathered A and scattered D vs the same grouped GEMM on pre-permuted rows", steps="calls")


if __name__ == "__main__":
    raise SystemExit(main())
