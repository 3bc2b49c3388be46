"""One op launched three times on one of its shapes, for a profiler; prints nothing but a line at
the end. The blockwise ops of bench/blockscaled.py (balanced experts), or the routed layer's fc1 as
bench/gathered.py runs it (BF16, tile 128 x 256: ``gathered`` reads x through the routing's index,
``pre_permuted`` the rows gathered beforehand; SHAPE a layer of bench/gathered.py), or its dSwiGLU
data gradient (``dswiglu_*``: dy gathered or permuted, tile TILE_M x 256, default 64: ping-pong):

    ncu --clock-control none -k regex:fg_grouped --launch-skip 2 --launch-count 1 --set full \\
        -o OUT python bench/ncu_one_op.py {quant_bw,gemm_bw,dswiglu_bw,srelu_bw,dswiglu_bw_pp,srelu_bw_pp} \\
        [SHAPE]
    ncu ... python bench/ncu_one_op.py {gathered,pre_permuted} [dsv3-8|mixtral|qwen3]
    ncu ... python bench/ncu_one_op.py {wgrad_gathered,wgrad_pre_permuted} [dsv3-8|mixtral|qwen3]
    ncu ... python bench/ncu_one_op.py {dswiglu_gathered,dswiglu_pre_permuted} [dsv3-8|mixtral|qwen3] [TILE_M]
    ncu -k regex:'fg_grouped|nvjet' ... python bench/ncu_one_op.py {bf16_grouped,cublas_dense} [qwen3-fc1]
    ncu ... python bench/ncu_one_op.py bf16_grouped_c2x1 [qwen3-fc1]

``bf16_grouped`` is bench/grouped_gemm.py's default row (seed 001's class, 128 x 256, static)
and ``cublas_dense`` its dense peer at equal FLOPs (``torch.mm`` over the same rows, expert 0's
weights): what one kernel does that the other does not, on the rows where they differ most.
``bf16_grouped_cMxN`` is the same row on an M x N cluster (TMA multicast: the cluster kernel).

    ncu ... --section SourceCounters python bench/ncu_one_op.py {dswiglu_layer,gemm_layer} \\
        [mixtral-l|dsv3-32-l] [TILE_M] [CLUSTER_M]

``swiglu_layer`` (``python bench/ncu_one_op.py swiglu_layer [dsv3-32-l|mixtral-l]``) is the layer's fc1
with SwiGLU on its routed rows (128 x 256, as the layer runs it); ``dswiglu_layer`` is the MoE
layer's fc2 data gradient with dSwiGLU as bench/pingpong.py times it (routed rows, tile TILE_M x 256,
default 64: ping-pong, the layer's; w2 read N-major; CLUSTER_M 2: on 2 x 1 clusters, B multicast), and
``gemm_layer`` the plain BF16 GEMM of the same shape and tiles (w2 copied K-major): what the
epilogue costs beside the mainloop (bench/results/ncu_h100_qwen3_clusters_dswiglu_source.json,
ncu_h200_dswiglu_mixtral_frag_elem_at.json).

FUSEGEMM_NVRTC_EXTRA builds the header's A/B switches (e.g. -DFUSEGEMM_SM90_COMPACT_ROW_ENDS=0).
(bench/results/ncu_h200_blockwise_fc2.json summarises such reports of dSwiGLU and the GEMM.)
"""
from __future__ import annotations

import sys

from _common import SHAPES, expert_sizes
from blockscaled import quantize_1x128, quantize_128x128


def routed_fc1_calls(which: str, layer: str, tile_m: int = 64) -> None:
    """The layer's fc1 of bench/gathered.py, gathered or on pre-permuted rows, its weight
    gradient (``wgrad_gathered``: X's token rows through the index), or its fc2 data gradient with
    dSwiGLU (``dswiglu_gathered``: dy's token rows through the index, tile ``tile_m`` x 256), three
    launches."""
    import torch

    from fusegemm.ops.engine import Op
    from gathered import routed_dswiglu, routed_fc1
    g, x, w, r, idx, rows, ins = routed_fc1(layer)
    axes = dict(tile_m=128, tile_n=256)
    if which.startswith("dswiglu"):
        dy, dy_rows, w2n, dins = routed_dswiglu(layer, g, r)
        gathered = which == "dswiglu_gathered"
        op = Op("grouped_gemm_dswiglu_bf16", a_gather=gathered, b_major="n", tile_m=tile_m, tile_n=256).compile()
        through = {"a_index": idx} if gathered else {}
        call = lambda: op(dy if gathered else dy_rows, r.padded_offsets, w2n, inputs=dins, **through)   # noqa: E731
    elif which.startswith("wgrad"):
        dg = torch.randn(r.rows, w.shape[1], generator=g, device="cuda").bfloat16()
        if which == "wgrad_gathered":
            op = Op("grouped_gemm_wgrad", b_gather=True, **axes).compile()
            call = lambda: op(dg, x, r.padded_offsets, x_index=idx)   # noqa: E731
        else:
            op = Op("grouped_gemm_wgrad", **axes).compile()
            call = lambda: op(dg, rows, r.padded_offsets)   # noqa: E731
    elif which == "gathered":
        op = Op("grouped_gemm", a_gather=True, **axes).compile()
        call = lambda: op(x, r.padded_offsets, w, a_index=idx, inputs=ins)   # noqa: E731
    else:
        op = Op("grouped_gemm", **axes).compile()
        call = lambda: op(rows, r.padded_offsets, w, inputs=ins)   # noqa: E731
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    print("done", which, layer)


def bf16_calls(which: str, shape: str) -> None:
    """bench/grouped_gemm.py's fusegemm row (``bf16_grouped``) or its cuBLAS dense peer, three launches."""
    import torch

    from fusegemm.presets import GroupedGemm
    from grouped_gemm import problem
    _, a, b, offsets, alpha, prob, d = problem(shape, "balanced")
    cluster = None
    if which.startswith("bf16_grouped_c"):   # bf16_grouped_c2x1: the same row on a 2 x 1 cluster
        cm, cn = which[len("bf16_grouped_c"):].split("x")
        cluster = (int(cm), int(cn))
    if which == "cublas_dense":
        w = b[0].t()
        call = lambda: torch.mm(a, w)   # noqa: E731
    else:
        a3, b_view = a.unsqueeze(-1), b.permute(1, 2, 0)
        op = GroupedGemm(a3, None, d, offsets, alpha, b_view, None, prob, mma_tiler_mn=(128, 256),
                         cluster_shape_mn=cluster)
        op.compile()
        call = lambda: op.execute(a3, None, d, offsets, alpha, b_view, None, prob)   # noqa: E731
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    print("done", which, shape)


def layer_fc1_calls(layer: str) -> None:
    """The layer's fc1 with SwiGLU and the pre-activations (bench/pingpong.py's swiglu rows, routed:
    its fused_problem; the cooperative 128 x 256 tile the layer runs), three launches."""
    import torch

    from fusegemm import EpilogueGemm
    from pingpong import fused_problem
    spec, axes, a, off, b, inputs, m, n, _ = fused_problem(torch, "swiglu", layer, "routed")
    op = EpilogueGemm(spec, tile_m=128, tile_n=256, **axes).compile()
    for _ in range(3):
        op(a, off, b, inputs=inputs)
    torch.cuda.synchronize()
    print("done swiglu_layer", layer, m, n)


def layer_dgrad_calls(which: str, layer: str, tile_m: int, cluster_m: int = 1) -> None:
    """The layer's fc2 data gradient (bench/pingpong.py's dswiglu rows, routed: its
    fused_problem), with dSwiGLU or as the plain grouped GEMM, three launches (dSwiGLU on a
    ``cluster_m`` x 1 cluster when it is 2: pingpong.py's ``_cl2`` configurations)."""
    import torch

    from fusegemm import EpilogueGemm
    from fusegemm.presets import GroupedGemm
    from pingpong import fused_problem
    spec, axes, a, off, b, inputs, m, f, _ = fused_problem(torch, "dswiglu", layer, "routed")
    if which == "dswiglu_layer":
        op = EpilogueGemm(spec, tile_m=tile_m, tile_n=256, **{**axes, "cluster_m": cluster_m}).compile()
        call = lambda: op(a, off, b, inputs=inputs)   # noqa: E731
    else:
        one, p3 = inputs["alpha"], inputs["prob"].view(m, 1, 1)
        d = torch.empty((m, f, 1), dtype=torch.bfloat16, device="cuda")
        a3, bv = a.unsqueeze(-1), b.contiguous().permute(1, 2, 0)
        op = GroupedGemm(a3, None, d, off, one, bv, None, p3, mma_tiler_mn=(tile_m, 256))
        op.compile()
        call = lambda: op.execute(a3, None, d, off, one, bv, None, p3)   # noqa: E731
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    print("done", which, layer, tile_m, cluster_m, m)


def main(which: str, shape: str | None = None, tile_m: str = "64", cluster_m: str = "1") -> None:
    if which == "swiglu_layer":
        return layer_fc1_calls(shape or "dsv3-32-l")
    if which in ("dswiglu_layer", "gemm_layer"):
        return layer_dgrad_calls(which, shape or "mixtral-l", int(tile_m), int(cluster_m))
    if which in ("gathered", "pre_permuted", "wgrad_gathered", "wgrad_pre_permuted"):
        return routed_fc1_calls(which, shape or "dsv3-8")
    if which in ("dswiglu_gathered", "dswiglu_pre_permuted"):
        return routed_fc1_calls(which, shape or "mixtral", int(tile_m))
    if which in ("bf16_grouped", "cublas_dense") or which.startswith("bf16_grouped_c"):
        return bf16_calls(which, shape or "qwen3-fc1")
    shape = shape or "dsv3-fc2"
    import torch

    import fusegemm
    experts, tokens, n, k = SHAPES[shape]
    sizes = expert_sizes(experts, tokens, "balanced")
    m, dev, fmt = sum(sizes), "cuda", torch.float8_e4m3fn
    torch.manual_seed(0)
    a_bf = torch.randn((m, k), device=dev).to(torch.bfloat16)
    b_bf = (torch.randn((experts, n, k), device=dev) * k ** -0.5).to(torch.bfloat16)
    offsets = torch.tensor([sum(sizes[: i + 1]) for i in range(experts)], dtype=torch.int32, device=dev)
    alpha, beta = torch.rand((experts,), device=dev) + 0.5, torch.rand((experts,), device=dev) + 0.5
    prob, norm_const = torch.rand((m,), device=dev), torch.ones((1,), device=dev)
    c_fwd = torch.randn((m, 2 * n), device=dev).to(torch.bfloat16)
    a_bw, sfa_bw = quantize_1x128(a_bf, fmt)
    b_bw, sfb_bw = quantize_128x128(b_bf, fmt)
    made = {"quant_bw": ("grouped_gemm_quant", {"d_dtype": "float8_e4m3fn"},
                         {"alpha": alpha, "prob": prob, "norm_const": norm_const}),
            "gemm_bw": ("grouped_gemm_quant", {"d_dtype": "bfloat16"}, {"alpha": alpha}),
            "dswiglu_bw": ("grouped_gemm_dswiglu", {},
                           {"alpha": alpha, "beta": beta, "prob": prob, "c": c_fwd, "norm_const": norm_const}),
            "srelu_bw": ("grouped_gemm_srelu", {}, {"alpha": alpha, "prob": prob})}
    # The blockwise kernel's ping-pong tiles of the same ops (64 x 128, each consumer warpgroup on
    # tiles of its own): where their time goes beside the cooperative tiles'.
    for name in ("dswiglu_bw", "srelu_bw"):
        spec_, axes_, inputs_ = made[name]
        made[name + "_pp"] = (spec_, {**axes_, "tile_m": 64, "tile_n": 128}, inputs_)
    spec, axes, inputs = made[which]
    op = fusegemm.Op(spec, sf_dtype="float32", sf_vec_size=128, **axes).compile()
    for _ in range(3):
        op(a_bw, sfa_bw, offsets, b_bw, sfb_bw, inputs=inputs)
    torch.cuda.synchronize()
    print("done", which, shape)


if __name__ == "__main__":
    main(*sys.argv[1:])
