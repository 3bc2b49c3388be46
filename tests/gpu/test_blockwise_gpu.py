"""The blockwise FP8 recipe (sf_vec_size 128, FP32 scales: A 1x128, B 128x128) on the GPU.

``exact`` problems hold small integer FP8 values and power-of-two scales, so every product and sum
is exact in any order: every output, the quantized bytes and SFD included, must match the numpy
interpreter (``Op.reference``, float64 products of the dequantized operands) bit for bit. Realistic
problems (normal values quantized with fusegemm.formats' blockwise helpers) are compared within a
stated tolerance, and once against an independent formula.
"""
from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

import fusegemm  # noqa: E402
from fusegemm.formats import (blockwise_sfa_layout, dequantize_1x128, dequantize_128x128,  # noqa: E402
                              quantize_1x128, quantize_128x128)
from fusegemm.output_compare import compare_outputs  # noqa: E402

BLOCKWISE = {"sf_dtype": "float32", "sf_vec_size": 128}


def _fp8(x: np.ndarray, dtype: str):
    return torch.from_numpy(np.ascontiguousarray(x).view(np.uint8)).view(getattr(torch, dtype))


def _problem(sizes, n, k, *, exact, seed, ab="float8_e4m3fn", discrete=False):
    """Operands as (host torch tensors, device tensors, pointer-table keep-alive list)."""
    import ml_dtypes
    rng = np.random.default_rng(seed)
    l, m = len(sizes), sum(sizes)
    sfk, nb = -(-k // 128), -(-n // 128)
    if exact:
        cast = getattr(ml_dtypes, ab)
        aq = rng.integers(-2, 3, (m, k)).astype(cast)
        bq = rng.integers(-2, 3, (l, n, k)).astype(cast)
        sa = np.exp2(rng.integers(-2, 3, (m, sfk))).astype(np.float32)
        sb = np.exp2(rng.integers(-2, 3, (l, nb, sfk))).astype(np.float32)
    else:
        aq, sa = quantize_1x128(rng.standard_normal((m, k)) * 3, ab)
        bq, sb = quantize_128x128(rng.standard_normal((l, n, k)) * k ** -0.5, ab)
    host = {"a": _fp8(aq, ab), "sfa": blockwise_sfa_layout(torch.from_numpy(sa)),
            "off": torch.tensor(np.cumsum(sizes), dtype=torch.int32), "b": _fp8(bq, ab),
            "sfb": torch.from_numpy(sb)}
    dev = {"a_tensor": host["a"].cuda(), "sfa_tensor": blockwise_sfa_layout(torch.from_numpy(sa).cuda()),
           "padded_offsets": host["off"].cuda()}
    keep = []
    if discrete:
        bs = [host["b"][e].cuda() for e in range(l)]
        sbs = [host["sfb"][e].cuda() for e in range(l)]
        keep = bs + sbs
        dev.update(b_ptrs=torch.tensor([t.data_ptr() for t in bs], dtype=torch.int64, device="cuda"),
                   sfb_ptrs=torch.tensor([t.data_ptr() for t in sbs], dtype=torch.int64, device="cuda"), n=n)
    else:
        dev.update(b_tensor=host["b"].cuda(), sfb_tensor=host["sfb"].cuda())
    return host, dev, keep, (aq, sa, bq, sb)


def _inputs(spec, m, n, l, seed):
    rng = np.random.default_rng(seed + 100)
    ins = {"alpha": torch.from_numpy(np.exp2(rng.integers(-1, 2, l)).astype(np.float32)),
           "prob": torch.from_numpy(rng.integers(1, 4, m).astype(np.float32) / 4),
           "norm_const": torch.full((1,), 0.5)}
    if spec == "grouped_gemm_dswiglu":
        ins["beta"] = torch.from_numpy(np.exp2(rng.integers(-1, 2, l)).astype(np.float32))
        ins["c"] = torch.from_numpy(rng.integers(-4, 5, (m, 2 * n)).astype(np.float32) / 4).to(torch.bfloat16)
    return ins


def _run(spec, sizes, n, k, *, exact, seed, discrete=False, ab="float8_e4m3fn", **axes):
    op = fusegemm.Op(spec, **BLOCKWISE, ab_dtype=ab, weight_mode="discrete" if discrete else "dense", **axes)
    host, dev, keep, raw = _problem(sizes, n, k, exact=exact, seed=seed, ab=ab, discrete=discrete)
    ins = _inputs(spec, sum(sizes), n, len(sizes), seed)
    out = op(**dev, inputs={name: v.cuda() for name, v in ins.items()})
    torch.cuda.synchronize()
    ref = op.reference(host["a"], host["sfa"], host["off"], host["b"], host["sfb"], inputs=ins)
    return op, out, ref, raw, ins


def _check(out, ref, *, exact, rtol=1e-5, valid):
    got = {k: (v[:valid] if k in ("c", "d", "dprob") else v) for k, v in out.items()}
    want = {k: (np.asarray(ref[k])[:valid] if k in ("c", "d", "dprob") else ref[k]) for k in got}
    err, problem = compare_outputs(want, got, exact=exact, rtol=rtol)
    assert problem is None, (problem, err)


CASES = [
    # spec, sizes (rows per expert, padded), n, k, axes
    ("grouped_gemm_quant", [256, 0, 768, 256], 256, 512, {}),
    ("grouped_gemm_quant", [512, 256], 384, 400, {"d_dtype": "float8_e4m3fn"}),       # K tail, FP8 D + SFD
    ("grouped_gemm_srelu", [256, 512, 0], 200, 640, {}),                             # N tail, C + D + amax
    ("grouped_gemm_srelu", [256, 256], 256, 256, {"tile_n": 128, "d_dtype": "float8_e4m3fn"}),
    ("grouped_gemm_srelu", [768], 512, 1024, {"tile_n": 128}),                      # L = 1
    ("grouped_gemm_dswiglu", [256, 0, 512], 256, 384, {}),                           # FP8 D + dprob
]


@pytest.mark.parametrize("spec,sizes,n,k,axes", CASES)
def test_exact_against_the_interpreter(spec, sizes, n, k, axes):
    _, out, ref, _, _ = _run(spec, sizes, n, k, exact=True, seed=len(sizes) + n + k, **axes)
    # dSwiGLU's dprob sums sigmoid terms across columns with atomics (an order-dependent FP32 sum):
    # within 1e-5 of its largest magnitude; its D bytes and every other output exact.
    exact = spec != "grouped_gemm_dswiglu"
    _check(out, ref, exact=exact, valid=sum(sizes))


def test_e5m2_and_discrete_weights_exact():
    _, out, ref, _, _ = _run("grouped_gemm_srelu", [256, 0, 512], 256, 256, exact=True, seed=5,
                             ab="float8_e5m2", discrete=True)
    _check(out, ref, exact=True, valid=768)


def test_many_experts_mostly_empty():
    sizes = [0] * 256
    sizes[3], sizes[200], sizes[255] = 256, 512, 256
    _, out, ref, _, _ = _run("grouped_gemm_quant", sizes, 128, 256, exact=True, seed=9)
    _check(out, ref, exact=True, valid=sum(sizes))


def test_realistic_values_and_an_independent_formula():
    """Normal inputs quantized with the recipe's helpers; D (bf16) of grouped GEMM + quant within
    2e-3 of the largest magnitude (plus one bf16 ulp) of the interpreter's, and of alpha * prob *
    dequant(A) @ dequant(B)^T computed here in float64."""
    sizes, n, k = [512, 0, 256, 768], 384, 1536
    op, out, ref, (aq, sa, bq, sb), ins = _run("grouped_gemm_quant", sizes, n, k, exact=False, seed=3)
    _check(out, ref, exact=False, rtol=2e-3, valid=sum(sizes))
    a = dequantize_1x128(aq, sa).astype(np.float64)
    want, start = [], 0
    for e, rows in enumerate(sizes):
        b = dequantize_128x128(bq[e], sb[e]).astype(np.float64)
        want.append(a[start:start + rows] @ b.T * float(ins["alpha"][e]))
        start += rows
    want = np.concatenate(want) * ins["prob"].numpy()[:, None].astype(np.float64)
    got = out["d"].float().cpu().numpy()
    assert np.abs(got - want).max() <= 2e-3 * np.abs(want).max() + 2 ** -7 * np.abs(want).max()


def test_execute_into_caller_outputs():
    op, out, _, _, _ = _run("grouped_gemm_quant", [256, 256], 256, 256, exact=True, seed=4)
    host, dev, _, _ = _problem([256, 256], 256, 256, exact=True, seed=4)
    ins = {k: v.cuda() for k, v in _inputs("grouped_gemm_quant", 512, 256, 2, 4).items()}
    outs = {k: torch.empty_like(v) for k, v in out.items()}
    op.execute(**dev, inputs=ins, outputs=outs)
    torch.cuda.synchronize()
    for name in out.keys():
        assert torch.equal(outs[name].view(torch.uint8) if outs[name].dtype.itemsize == 1 else outs[name],
                           out[name].view(torch.uint8) if out[name].dtype.itemsize == 1 else out[name]), name
