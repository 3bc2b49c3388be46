"""Child process of tests/gpu/test_launch_stress_gpu.py: the routed layer's grouped GEMMs (gathered
and pre-permuted fc1, gathered and pre-permuted K-grouped weight gradients) launched in interleaved
bursts without a synchronize between launches, the pattern under which bench runs hung on the H200
(2026-12-04: the gathered kernels' start-up race, fixed). Prints one line per burst before it runs
("run NAME BURST"), and "DONE" at the end.

    python launch_stress.py EXPERTS TOKENS K N TOP_K ROUNDS
"""
from __future__ import annotations

import sys


def main(experts: int, tokens: int, k: int, n: int, top_k: int, rounds: int) -> None:
    import torch

    from fusegemm import permute, routing
    from fusegemm.ops.engine import Op
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(tokens, k, generator=g, device="cuda").bfloat16()
    w = (torch.randn(experts, n, k, generator=g, device="cuda") * k ** -0.5).bfloat16()
    r = routing.route(torch.randn(tokens, experts, generator=g, device="cuda"), top_k)
    idx = r.token_of_row.int()
    rows = permute.gather_rows(x, r.token_of_row)
    dg = torch.randn(r.rows, n, generator=g, device="cuda").bfloat16()
    ins = {"alpha": torch.ones(experts, device="cuda")}
    axes = dict(tile_m=128, tile_n=256)
    gathered, plain = Op("grouped_gemm", a_gather=True, **axes), Op("grouped_gemm", **axes)
    wg, wp = Op("grouped_gemm_wgrad", b_gather=True, **axes), Op("grouped_gemm_wgrad", **axes)
    methods = {
        "wgrad_gathered": lambda: wg(dg, x, r.padded_offsets, x_index=idx),
        "wgrad_plain": lambda: wp(dg, rows, r.padded_offsets),
        "gathered": lambda: gathered(x, r.padded_offsets, w, a_index=idx, inputs=ins),
        "plain": lambda: plain(rows, r.padded_offsets, w, inputs=ins),
    }
    for _ in range(rounds):
        for name, fn in methods.items():
            for burst in (1, 3, 10):
                print("run", name, burst, flush=True)
                for _ in range(burst):
                    fn()
                torch.cuda.synchronize()
    print("DONE", flush=True)


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:7]))
