"""Gathered A against the same kernel on pre-permuted rows, in the same run; prints JSON.

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

Outputs of each gathered kernel and its pre-permuted run are checked bit-equal before timing.

    python bench/gathered.py [--layers dsv3-8,mixtral,qwen3] [--out FILE]
"""
from __future__ import annotations

import argparse

from _common import add_layer_arguments, interleaved_ms, run_layers

# name: (experts, tokens, K (hidden), N (2 x intermediate), top_k)
LAYERS = {
    "dsv3-8": (8, 4096, 7168, 4096, 8),
    "mixtral": (8, 4096, 4096, 28672, 2),
    "qwen3": (128, 4096, 2048, 1536, 8),
}


def bench_layer(name: str, args) -> dict:
    import torch

    from fusegemm import permute, routing
    from fusegemm.ops.engine import Op
    experts, tokens, k, n, top_k = LAYERS[name]
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(tokens, k, generator=g, device="cuda").bfloat16()
    w = (torch.randn(experts, n, k, generator=g, device="cuda") * k ** -0.5).bfloat16()
    r = routing.route(torch.randn(tokens, experts, generator=g, device="cuda"), top_k)
    idx = r.token_of_row.int()
    ins = {"alpha": torch.ones(experts, device="cuda")}
    axes = dict(tile_m=128, tile_n=256)
    gathered, plain = Op("grouped_gemm", a_gather=True, **axes), Op("grouped_gemm", **axes)
    rows = permute.gather_rows(x, r.token_of_row)
    equal = torch.equal(gathered(x, r.padded_offsets, w, a_index=idx, inputs=ins)["d"],
                        plain(rows, r.padded_offsets, w, inputs=ins)["d"])
    dg = torch.randn(r.rows, n, generator=g, device="cuda").bfloat16()      # fc1's output gradient rows
    wg, wp = Op("grouped_gemm_wgrad", b_gather=True, **axes), Op("grouped_gemm_wgrad", **axes)
    wequal = torch.equal(wg(dg, x, r.padded_offsets, x_index=idx)["d"], wp(dg, rows, r.padded_offsets)["d"])
    methods = {
        "gathered": lambda: gathered(x, r.padded_offsets, w, a_index=idx, inputs=ins),
        "pre_permuted": lambda: plain(rows, r.padded_offsets, w, inputs=ins),
        "gather_then_gemm": lambda: plain(permute.gather_rows(x, r.token_of_row), r.padded_offsets, w, inputs=ins),
        "wgrad_gathered": lambda: wg(dg, x, r.padded_offsets, x_index=idx),
        "wgrad_pre_permuted": lambda: wp(dg, rows, r.padded_offsets),
    }
    row = {"layer": name, "experts": experts, "tokens": tokens, "k": k, "n": n, "top_k": top_k, "rows": r.rows,
           "gathered_equals_pre_permuted": equal, "wgrad_gathered_equals_pre_permuted": wequal}
    for key, ms in interleaved_ms(methods, args).items():
        row[f"{key}_ms"] = ms
    flops = 2.0 * tokens * top_k * k * n
    row["gathered_tflops"] = flops / row["gathered_ms"] / 1e9
    row["gathered_vs_pre_permuted"] = row["pre_permuted_ms"] / row["gathered_ms"]
    row["gathered_vs_gather_then_gemm"] = row["gather_then_gemm_ms"] / row["gathered_ms"]
    row["wgrad_gathered_vs_pre_permuted"] = row["wgrad_pre_permuted_ms"] / row["wgrad_gathered_ms"]
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_layer_arguments(ap, LAYERS, warmup=3, iters=10, rounds=5)
    args = ap.parse_args(argv)
    return run_layers(args, LAYERS, bench_layer,
                      lambda r: (f"gathered {r['gathered_ms']:.3f} ms  pre-permuted {r['pre_permuted_ms']:.3f} ms  "
                                 f"gather+gemm {r['gather_then_gemm_ms']:.3f} ms  "
                                 f"x{r['gathered_vs_pre_permuted']:.3f} of pre-permuted  "
                                 f"equal {r['gathered_equals_pre_permuted']}  wgrad "
                                 f"x{r['wgrad_gathered_vs_pre_permuted']:.3f} of pre-permuted  "
                                 f"equal {r['wgrad_gathered_equals_pre_permuted']}"),
                      "gathered A vs the same grouped GEMM on pre-permuted rows", steps="calls")


if __name__ == "__main__":
    raise SystemExit(main())
