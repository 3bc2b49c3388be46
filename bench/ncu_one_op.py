"""One blockwise op of bench/blockscaled.py launched three times on one of its shapes (balanced
experts), for a profiler; prints nothing but a line at the end:

    ncu --clock-control none -k regex:fg_grouped --launch-skip 2 --launch-count 1 --set full \\
        -o OUT python bench/ncu_one_op.py {quant_bw,gemm_bw,dswiglu_bw,srelu_bw} [SHAPE]

(bench/results/ncu_h200_blockwise_fc2.json summarises such reports of dSwiGLU and the GEMM.)
"""
from __future__ import annotations

import sys

from _common import SHAPES, expert_sizes
from blockscaled import quantize_1x128, quantize_128x128


def main(which: str, shape: str = "dsv3-fc2") -> None:
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
    spec, axes, inputs = made[which]
    op = fusegemm.Op(spec, sf_dtype="float32", sf_vec_size=128, **axes).compile()
    for _ in range(3):
        op(a_bw, sfa_bw, offsets, b_bw, sfb_bw, inputs=inputs)
    torch.cuda.synchronize()
    print("done", which, shape)


if __name__ == "__main__":
    main(*sys.argv[1:])
