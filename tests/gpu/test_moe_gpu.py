"""fusegemm.moe.ExpertMLP on the H200: the fusegemm backend (fused SwiGLU fc1, grouped GEMMs for
fc2 and both data gradients) against the torch backend of the same layer (whose backward
gradcheck verifies on the CPU), on ragged and empty experts with zero padding rows.

Tolerance: relative Frobenius error <= 1e-2 per tensor. Both run in bfloat16 with FP32
accumulation; they differ by where bf16 rounding happens (the fused epilogue computes
``silu(gate) * up`` from FP32 accumulators, the torch backend from bf16-rounded GEMM outputs):
one to a few bf16 ulps (2**-8 relative) per element."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from fusegemm import moe  # noqa: E402

pytestmark = pytest.mark.gpu


def _rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


def _problem(tokens, hidden, seed):
    """x, prob and padded_offsets for ragged experts (an empty one) and a 256-row tail past the end."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    padded = [-(-t // 256) * 256 for t in tokens]
    ends = torch.tensor(padded, device="cuda").cumsum(0).to(torch.int32)
    m = int(ends[-1]) + 256
    x = torch.zeros(m, hidden, device="cuda", dtype=torch.bfloat16)
    prob = torch.zeros(m, device="cuda")
    start = 0
    for t, p in zip(tokens, padded):
        x[start:start + t] = torch.randn(t, hidden, generator=g, device="cuda").bfloat16()
        prob[start:start + t] = torch.rand(t, generator=g, device="cuda")
        start += p
    return x, prob, ends


def _both_backends(x, prob, ends, hidden, inter, **layer_kw):
    """One forward + backward of the same layer (seeded weights and dy) on each backend: the
    output and every gradient, by backend name, and the layers."""
    layers = {name: moe.ExpertMLP(4, hidden, inter, backend=name, device="cuda",
                                  generator=torch.Generator().manual_seed(6), **layer_kw)
              for name in ("fusegemm", "torch")}
    out = {}
    for name, layer in layers.items():
        xi, pi = x.clone().requires_grad_(), prob.clone().requires_grad_()
        y = layer(xi, ends, pi)
        dy = torch.randn(y.shape, generator=torch.Generator(device="cuda").manual_seed(7), device="cuda")
        y.backward(dy.bfloat16())
        out[name] = dict(y=y, dx=xi.grad, dprob=pi.grad, dw1=layer.w1.grad, dw2=layer.w2.grad)
    return out, layers


def _within(out, ends, tol):
    """fusegemm's output and gradients finite and within relative Frobenius error ``tol`` of the
    torch backend's; rows past the last expert zero."""
    for key in ("y", "dx", "dprob", "dw1", "dw2"):
        got, want = out["fusegemm"][key], out["torch"][key]
        assert torch.isfinite(got.float()).all(), key
        assert _rel(got, want) <= tol, (key, _rel(got, want))
    valid = int(ends[-1])
    assert not out["fusegemm"]["y"][valid:].any() and not out["fusegemm"]["dx"][valid:].any()


def _fc1_both(step, x, prob, ends):
    """fc1 alone (backend method ``step``: the fused epilogue's quantized h and its scales) on the
    fusegemm backend and in the torch emulation: ((hq, scales), (hq, scales)), valid rows only."""
    from fusegemm.formats.torch_blockwise import quantize_128x128, quantize_1x128
    w1 = moe.ExpertMLP(4, 256, 256, device="cuda", generator=torch.Generator().manual_seed(6)).w1.detach()
    rows, valid = moe._expert_rows(ends), int(ends[-1])
    # (the blockwise recipe's quantized x and weights)
    args = (*quantize_1x128(x), ends, rows, *quantize_128x128(w1), prob, x.dtype) if step == "fc1_bw" else (
        x, ends, rows, w1, prob)
    return [tuple(t[:valid] for t in getattr(moe._BACKENDS[name], step)(*args)[1:]) for name in ("fusegemm", "torch")]


@pytest.mark.parametrize("wgrad,hidden", [("torch", 256), ("fusegemm", 256), ("auto", 256), ("auto", 160)])
def test_expert_mlp_matches_the_torch_layer_forward_and_backward(wgrad, hidden):
    """Every weight-gradient choice (torch._grouped_mm, fusegemm's K-grouped family, auto: the
    K-grouped family where it fits, and torch's for a hidden size that is not whole 128-row
    tiles of fc2's weight gradient)."""
    tokens, inter = [300, 0, 512, 17], 256
    if wgrad == "auto":
        from fusegemm.generator import registry
        from fusegemm.ops.device import device_arch
        from fusegemm.torch_library import _kgrouped_fits
        fits = _kgrouped_fits(hidden, inter, 256, 0)
        arch = device_arch(0)
        has = registry.lookup("grouped_gemm_wgrad", arch) is not None and registry.executed("grouped_gemm_wgrad", arch)
        assert fits == (hidden % 128 == 0 and has)
    x, prob, ends = _problem(tokens, hidden, 5)
    out, _ = _both_backends(x, prob, ends, hidden, inter, wgrad=wgrad)
    _within(out, ends, 1e-2)


@pytest.mark.parametrize("wgrad", ["torch", "fusegemm"])
def test_mxfp8_recipe_matches_its_torch_emulation(wgrad):
    """recipe="mxfp8": the fusegemm backend (SwiGLU with an MXFP8 D, seed 003 and seed 000 kernels
    on MXFP8 operands) against the torch backend, which takes the same quantization points with
    torch.formats-exact rounding and FP32 matmuls.

    Tolerance: relative Frobenius error <= 2e-2 per tensor, and the MXFP8 h of fc1 equal in >= 97%
    of its bytes. The kernels and the emulation sum in different orders, so a value near an E4M3
    rounding boundary can land one E4M3 step (2**-3 relative) apart; the rest of the gap is BF16
    rounding as in the BF16 recipe's test."""
    x, prob, ends = _problem([300, 0, 512, 17], 256, 8)
    out, layers = _both_backends(x, prob, ends, 256, 256, recipe="mxfp8", wgrad=wgrad)
    amax = {name: layer.amax for name, layer in layers.items()}
    _within(out, ends, 2e-2)
    for key in ("y", "dx"):
        got, want = amax["fusegemm"][key], amax["torch"][key]
        assert got.shape == (4, 1) and float(got[1, 0]) == float("-inf"), (key, got)   # the empty expert
        finite = torch.isfinite(want)
        torch.testing.assert_close(got[finite], want[finite], rtol=2e-2, atol=0)
    # fc1 alone: the fused epilogue's MXFP8 h against the emulation's, byte by byte.
    (hq, sfh), (hq_t, sfh_t) = _fc1_both("fc1_mx", x, prob, ends)
    assert (hq.view(torch.uint8) == hq_t.view(torch.uint8)).float().mean() >= 0.97
    assert (sfh.view(torch.uint8) == sfh_t.view(torch.uint8)).float().mean() >= 0.97


def test_fp8_block_recipe_matches_its_torch_emulation():
    """recipe="fp8_block" (sm_90a): the fusegemm backend (blockwise SwiGLU with an FP8 h and 1x128
    scales, the blockwise quant GEMM and dSwiGLU, the FP8 weight gradients) against the torch
    backend, which takes the same quantization points with the recipe's own quantizers and FP32
    matmuls. Tolerance as the MXFP8 recipe's: relative Frobenius error <= 2e-2 per tensor (a
    value near an e4m3 rounding boundary can land one step apart when the sums' orders differ),
    and fc1's FP8 h equal in >= 97% of its bytes, its 1x128 scales within 2e-3 relative: a
    scale is a block's max |h| / 448, and Hopper's FP8 WGMMA adds its products inside each
    128-K block at less than FP32's precision (the emulation's matmul is exact FP32), which
    moved the largest |h| of 62% of the blocks by up to 6.5e-4 relative on the H200."""
    x, prob, ends = _problem([300, 0, 512, 17], 256, 8)
    out, _ = _both_backends(x, prob, ends, 256, 256, recipe="fp8_block")
    _within(out, ends, 2e-2)
    (hq, sh), (hq_t, sh_t) = _fc1_both("fc1_bw", x, prob, ends)
    assert (hq.view(torch.uint8) == hq_t.view(torch.uint8)).float().mean() >= 0.97
    torch.testing.assert_close(sh, sh_t, rtol=2e-3, atol=0)


def test_mxfp8_training_tracks_bf16():
    """examples/moe_training.py, shortened: 40 steps of a router + 8 experts (H 512, F 256) under
    each recipe from the same start on the same data. Both losses stay finite and fall; the MXFP8
    loss stays within 5% of the BF16 loss at every step (the full 200-step run is the example)."""
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[2] / "examples" / "moe_training.py"
    spec = importlib.util.spec_from_file_location("moe_training", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    r = example.run(torch, cpu=False, steps=40, tokens=2048, experts=8, hidden=512, inter=256, topk=2, lr=1e-3)
    assert r["finite"], r
    assert r["track"] <= 0.05, r["track"]
    assert max(r["final_over_first"].values()) < 0.9, r["final_over_first"]


def _outputs_on(fill, call):
    """``call()``'s tensors on memory full of ``fill`` bytes: a call's outputs are filled with
    them and freed, and the next call, asking torch's caching allocator for the same sizes in the
    same order, gets the same blocks back (asserted for each output of 1 MiB or more). A first
    call compiles and settles the op's path. Returns the last call's tensors."""
    call()
    first = [t for t in call() if isinstance(t, torch.Tensor)]
    ptrs = set()
    for t in first:
        whole = torch.empty(0, dtype=torch.uint8, device="cuda").set_(t.untyped_storage())
        whole.fill_(fill)
        ptrs.add(whole.data_ptr())
    torch.cuda.synchronize()
    del first, whole, t
    out = [t for t in call() if isinstance(t, torch.Tensor)]
    torch.cuda.synchronize()
    for t in out:
        if t.untyped_storage().nbytes() >= 1 << 20:
            assert t.untyped_storage().data_ptr() in ptrs, "an output did not reuse a filled block"
    return out


@pytest.mark.parametrize("step", ["fc1_bw", "gemm_bw", "dswiglu_bw", "gemm_mx", "dswiglu_mx"])
def test_block_scaled_row_outputs_are_whole_on_reused_memory(step):
    """The block-scaled class's row outputs (C, D, D_col) are allocated uninitialised and its tail
    rows zeroed by the tail kernel (fusegemm/ops/tail.py), as the BF16 class's: each of the MoE
    recipes' block-scaled kernels run on memory full of zero bytes and again on memory full of
    0xFF bytes (NaN in every float format) gives the same bytes, so the kernel stored every row
    below the last offset, and the 256 rows past it are zeros. dprob (an atomic sum of one
    partial per row and N tile, in any order: four at the fp8_block dSwiGLU's 64 x 128 ping-pong
    tiles) within 1e-5; an unwritten row would differ by NaN."""
    from fusegemm.formats.torch_blockwise import quantize_128x128, quantize_1x128
    from fusegemm.formats.torch_mx import quantize_mx
    hidden, inter = 512, 512
    x, prob, ends = _problem([700, 0, 1024, 17], hidden, 11)          # 2048 rows + a 256-row tail
    layer = moe.ExpertMLP(4, hidden, inter, device="cuda", generator=torch.Generator().manual_seed(6))
    w1, w2 = layer.w1.detach(), layer.w2.detach()
    be, rows, valid = moe._BACKENDS["fusegemm"], None, int(ends[-1])
    g = torch.randn(x.shape[0], 2 * inter, generator=torch.Generator(device="cuda").manual_seed(3),
                    device="cuda").bfloat16()
    # operands made once: the calls below allocate their outputs and little else
    xb, w1b, w2tb = quantize_1x128(x), quantize_128x128(w1), quantize_128x128(w2.transpose(1, 2).contiguous())
    xm, w1m, w2tm = quantize_mx(x), quantize_mx(w1), quantize_mx(w2.transpose(1, 2))
    calls = {
        "fc1_bw": lambda: be.fc1_bw(*xb, ends, rows, *w1b, prob, x.dtype),
        "gemm_bw": lambda: (be.gemm_bw(*xb, ends, rows, *w1b, x.dtype),),
        "dswiglu_bw": lambda: be.dswiglu_bw(*xb, ends, rows, *w2tb, g, prob),
        "gemm_mx": lambda: be.gemm_mx(*xm, ends, rows, *w1m, x.dtype),
        "dswiglu_mx": lambda: be.dswiglu_mx(*xm, ends, rows, *w2tm, g, prob),
    }
    zeros, nans = _outputs_on(0, calls[step]), _outputs_on(255, calls[step])
    for a, b in zip(zeros, nans):
        if a.shape == prob.shape and a.dtype == torch.float32:            # dprob
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
            continue
        assert torch.equal(a.view(torch.uint8) if a.element_size() == 1 else a,
                           b.view(torch.uint8) if b.element_size() == 1 else b), (step, a.shape, a.dtype)
        if a.dim() == 2 and a.shape[0] == x.shape[0]:                       # a row output (or its scales)
            tail = b[valid:].view(torch.uint8) if b.element_size() == 1 else b[valid:]
            assert not (tail != 0).any(), (step, "rows past the last offset are not zero")   # NaN != 0


def test_weight_cache_gives_the_uncached_step():
    """ExpertMLP(recipe="fp8_block", weight_cache=True) against the same layer without the cache:
    output and every gradient bit for bit (dprob, an atomic sum, within 1e-5) over three steps
    with an SGD update after the second (the cache is made once for steps 1 and 2, micro-batches
    of gradient accumulation, and again after the update)."""
    x, prob, ends = _problem([300, 0, 512, 17], 256, 12)
    layers = [moe.ExpertMLP(4, 256, 256, recipe="fp8_block", weight_cache=cache, device="cuda",
                            generator=torch.Generator().manual_seed(6)) for cache in (True, False)]
    opts = [torch.optim.SGD(layer.parameters(), lr=0.1) for layer in layers]
    dy = torch.randn(x.shape, generator=torch.Generator(device="cuda").manual_seed(7), device="cuda").bfloat16()
    keys = []
    for step in range(3):
        got = []
        for layer in layers:
            xi, pi = x.clone().requires_grad_(), prob.clone().requires_grad_()
            layer(xi, ends, pi).backward(dy)
            got.append([layer(x, ends, prob).detach(), xi.grad, pi.grad, layer.w1.grad, layer.w2.grad])
        for i, (a, b) in enumerate(zip(*got)):
            if i == 2:   # dprob: the dSwiGLU kernel's atomic sums, in any order
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
            else:
                assert torch.equal(a, b), (step, i)
        keys.append(layers[0]._cached[0])
        if step == 1:
            for opt in opts:
                opt.step()
        for opt in opts:
            opt.zero_grad()
    assert keys[0] == keys[1] != keys[2]
