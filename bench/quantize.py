"""Benchmark the blockwise FP8 recipe's quantizations: fusegemm.quantize's kernels against
fusegemm.formats.torch_blockwise (torch's operations: what the fp8_block MoE step ran before) in
the same run, on the operands of a dsv3-like layer (8 experts, H 7168, F 2048, 16384 token rows);
prints JSON.

Each row: both results compared bit for bit before timing (a difference stops the run), the
times, the bytes the kernel must move (source read once, FP8 values and float32 scales written)
over its time as GB/s, and the speed-up over torch's route; ``copy_gb_s`` is a plain copy of the
source in the same rounds (its read and write over its time): what the device's memory gives a
pass that moves 4 bytes a value, as the weights' and the paired quantizations do.

    python bench/quantize.py [--out bench/results/quantize_h200.json]
    python bench/quantize.py --also sync=-DFUSEGEMM_QUANTIZE_STAGE_ASYNC=0
    python bench/quantize.py --experts 32 --cases w1_128x128_t,w2_128x128_t    # dsv3-32's weights

``--also NAME=DEFINES`` (repeatable): the kernels built again with those NVRTC defines (a
header's A/B switch), checked bit for bit and timed in the same interleaved rounds as method NAME.
"""
from __future__ import annotations

import argparse

from _common import (add_also_argument, add_layer_arguments, also_builds, also_small_kernels, interleaved_ms,
                     run_layers, with_small_kernels)

TOKENS, HIDDEN, INTER, EXPERTS = 16384, 7168, 2048, 8

# name: (what it is, source shape, source dtype); --experts rebuilds the weights' rows (_weights)
CASES = {
    "x_both": ("fc1's input x: 1x128 rows and tokens-along-columns for the weight gradient", (TOKENS, HIDDEN), "bf16"),
    "dg_both": ("dSwiGLU's dG, both quantizations", (TOKENS, 2 * INTER), "bf16"),
    "dy_both": ("the output gradient dy, both quantizations", (TOKENS, HIDDEN), "bf16"),
    "x_1x128": ("x, 1x128 rows only", (TOKENS, HIDDEN), "bf16"),
    "h_requant": ("fc1's FP8 h requantized along the tokens (via bfloat16)", (TOKENS, INTER), "fp8"),
    "w1_128x128_t": ("w1 (L, 2F, H) 128x128 with its transposed copy", (EXPERTS, 2 * INTER, HIDDEN), "bf16"),
    "w2_128x128_t": ("w2 (L, H, F) 128x128 with its transposed copy", (EXPERTS, HIDDEN, INTER), "bf16"),
}


def _weights(experts: int) -> None:
    """The weight rows of CASES for a layer of ``experts`` experts (the step quantizes every
    expert's weights: dsv3-32's are 4x dsv3-8's bytes)."""
    for name, shape in (("w1_128x128_t", (experts, 2 * INTER, HIDDEN)), ("w2_128x128_t", (experts, HIDDEN, INTER))):
        what, _, kind = CASES[name]
        CASES[name] = (what, shape, kind)


def _methods(name, torch):
    """(the case's methods by name, its source tensor, the bytes the kernel reads, its outputs)."""
    from fusegemm import quantize as qz
    from fusegemm.formats import torch_blockwise as bw
    _, shape, kind = CASES[name]
    g = torch.Generator(device="cuda").manual_seed(0)
    src = torch.randn(shape, device="cuda", generator=g).bfloat16()
    if kind == "fp8":
        hq, sh = bw.quantize_1x128(src)
        return ({"fusegemm": lambda: qz.requantize_wgrad(hq, sh),
                 "torch": lambda: bw.quantize_wgrad(bw.dequantize_1x128(hq, sh).to(torch.bfloat16))},
                hq, hq.numel() + sh.numel() * 4, 1)
    if name.endswith("_both"):
        return ({"fusegemm": lambda: qz.quantize_both(src),
                 "torch": lambda: (bw.quantize_1x128(src), bw.quantize_wgrad(src))}, src, src.numel() * 2, 2)
    if name.endswith("_1x128"):
        return ({"fusegemm": lambda: qz.quantize_1x128(src), "torch": lambda: bw.quantize_1x128(src)},
                src, src.numel() * 2, 1)
    return ({"fusegemm": lambda: qz.quantize_128x128(src, transposed=True),
             "torch": lambda: (lambda q, s: ((q, s), bw.transposed_128x128(q, s)))(*bw.quantize_128x128(src))},
            src, src.numel() * 2, 2)


def _flat(result):
    if isinstance(result, tuple):
        return [t for r in result for t in _flat(r)]
    return [result]


def _equal(a, b, torch):
    return a.shape == b.shape and bool(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) if a.element_size() == 1
                                       else torch.equal(a.view(torch.int32), b.view(torch.int32)))


_BUILDS: dict = {}   # --also name -> SmallKernels of the quantize header built with its defines


def bench_case(name: str, args) -> dict:
    import torch

    from fusegemm import quantize as qz
    methods, src, read_bytes, copies = _methods(name, torch)
    for also, kernels in also_small_kernels(qz, qz._SOURCES.values(), args, _BUILDS).items():
        methods[also] = with_small_kernels(qz, kernels, methods["fusegemm"])
    want = _flat(methods["torch"]())
    for method, run in methods.items():
        got = _flat(run())
        if not (len(got) == len(want) and all(_equal(a, b, torch) for a, b in zip(got, want))):
            raise SystemExit(f"{name}: {method}'s result is not torch_blockwise's bit for bit")
    written = sum(t.numel() * t.element_size() for t in _flat(methods["fusegemm"]()))
    # The ceiling: the source copied into a buffer of its size (read and write, the bytes a
    # kernel moving 4 bytes a value moves), timed in the same rounds; not a quantization.
    dst = torch.empty_like(src)
    ms = interleaved_ms({**methods, "copy": lambda: dst.copy_(src)}, args)
    ms_copy = ms.pop("copy")
    moved = read_bytes + written
    row = {"case": name, "what": CASES[name][0], "shape": list(CASES[name][1]), "outputs": copies,
           "bit_exact": True, "ms": ms, "bytes_moved": moved,
           "fusegemm_gb_s": round(moved / ms["fusegemm"] / 1e6, 1),
           "speedup_vs_torch": round(ms["torch"] / ms["fusegemm"], 2),
           "copy_gb_s": round(2 * src.numel() * src.element_size() / ms_copy / 1e6, 1)}
    for also in _BUILDS:
        row[f"{also}_gb_s"] = round(moved / ms[also] / 1e6, 1)
        row[f"fusegemm_vs_{also}"] = round(ms[also] / ms["fusegemm"], 3)
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_layer_arguments(ap, CASES, warmup=3, iters=10, rounds=3, flag="--cases")
    add_also_argument(ap)
    ap.add_argument("--experts", type=int, default=EXPERTS,
                    help="experts of the weights' rows (default %(default)s: dsv3-8; 32: dsv3-32)")
    args = ap.parse_args(argv)
    if args.experts < 1:
        ap.error(f"--experts: got {args.experts}; allowed: a positive number of experts")
    _weights(args.experts)
    also_builds(args)   # a malformed --also stops the run before any work
    return run_layers(args, CASES, bench_case,
                      lambda r: (f"{r['ms']['fusegemm']:.3f} ms {r['fusegemm_gb_s']} GB/s "
                                 f"x{r['speedup_vs_torch']} vs torch"
                                 + "".join(f"  {a} {r[a + '_gb_s']} GB/s (x{r['fusegemm_vs_' + a]})" for a in _BUILDS)),
                      "quantize", steps="calls", note="; GB/s = (source bytes + output bytes) / time")


if __name__ == "__main__":
    raise SystemExit(main())
