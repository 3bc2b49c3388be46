"""SwiGLU forward on block-scaled operands (spec grouped_gemm_glu_mx, which
``fusegemm.grouped_gemm_glu`` runs when ``sfa_tensor`` is given) on the GPU: the kernel's gate/up
paired accumulator on the block-scaled mainloops (MXFP8, and the blockwise recipe on sm_90a).

Exact problems (small integers, power-of-two scales: every product and sum exact in any order)
must match the numpy interpreter (``Op.reference``) within silu's few-ulp libdevice bound and one
ulp of the output dtype. Realistic problems (normal values quantized with fusegemm.formats) differ
from it by about 1e-4 of the largest magnitude, because Hopper's FP8 WGMMA accumulates with fewer
mantissa bits than FP32 between promotions; they are held to 2e-3 of the largest magnitude, as in
tests/gpu/test_blockwise_gpu.py, and to an independent float64 SwiGLU of the dequantized operands
within 2^-7 of it. An FP8 D is compared dequantized with its SFD_row: the scales equal the
interpreter's, and each value lies within one FP8 step of the interpreter's plus 2e-3 of its
32-element block's range (448 times the block scale).
"""
from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

import fusegemm  # noqa: E402
from fusegemm.formats import (dequantize_128x128, dequantize_1x128, dequantize_blockwise, pack_sf,  # noqa: E402
                              quantize_128x128, quantize_1x128, quantize_blockwise, unpack_sf)
from fusegemm.output_compare import compare_outputs, to_device  # noqa: E402
from formulas import swiglu64  # noqa: E402  (tests/formulas.py)

E8M0 = "float8_e8m0fnu"
ARCH: dict = {}   # the device's arch; a host check of this file passes arch="sm_90a"


def _t(x: np.ndarray) -> "torch.Tensor":
    """A numpy array (ml_dtypes FP8 / E8M0 or float32) as a CPU torch tensor of its dtype."""
    return to_device(x, "cpu")


def _operands(sizes, n_acc, k, seed, recipe, exact=False):
    """(host operands in the wrapper's canonical layouts, A and B dequantized as float64)."""
    rng = np.random.default_rng(seed)
    m, l = sum(sizes), len(sizes)
    x = rng.standard_normal((m, k)).astype(np.float32) * 2
    w = rng.standard_normal((l, n_acc, k)).astype(np.float32) * np.float32(k ** -0.5)
    if exact:   # small integers with power-of-two scales: every product and partial sum exact
        import ml_dtypes
        e4m3, vec = ml_dtypes.float8_e4m3fn, 32 if recipe == "mx" else 128
        aq, bq = np.rint(x).clip(-3, 3).astype(e4m3), np.rint(w * k ** 0.5).clip(-3, 3).astype(e4m3)
        sfk = -(-k // vec)
        sa = np.exp2(rng.integers(-1, 2, (m, sfk))).astype(np.float32)
        sb = np.exp2(rng.integers(-1, 2, (l, n_acc if recipe == "mx" else -(-n_acc // 128), sfk))).astype(np.float32)
        if recipe == "mx":
            sa, sb = sa.astype(ml_dtypes.float8_e8m0fnu), sb.astype(ml_dtypes.float8_e8m0fnu)
    if recipe == "mx":
        if not exact:
            aq, sa = quantize_blockwise(x, ab_dtype="float8_e4m3fn", sf_dtype=E8M0, sf_vec_size=32)
            bq, sb = quantize_blockwise(w, ab_dtype="float8_e4m3fn", sf_dtype=E8M0, sf_vec_size=32)
        a64 = dequantize_blockwise(aq, sa, sf_vec_size=32).astype(np.float64)
        b64 = dequantize_blockwise(bq, sb, sf_vec_size=32).astype(np.float64)
        sfa, sfb = _t(pack_sf(sa)), _t(pack_sf(sb, batch_first=True))
    else:   # the blockwise recipe: A 1x128, B 128x128, FP32 scales
        from fusegemm.formats import blockwise_sfa_layout
        if not exact:
            aq, sa = quantize_1x128(x, "float8_e4m3fn")
            bq, sb = quantize_128x128(w, "float8_e4m3fn")
        a64, b64 = dequantize_1x128(aq, sa).astype(np.float64), dequantize_128x128(bq, sb).astype(np.float64)
        sfa, sfb = blockwise_sfa_layout(torch.from_numpy(sa)), torch.from_numpy(sb)
    host = {"a_tensor": _t(aq), "sfa_tensor": sfa,
            "padded_offsets": torch.tensor(np.cumsum(sizes), dtype=torch.int32),
            "b_tensor": _t(bq), "sfb_tensor": sfb}
    return host, a64, b64


def _inputs(sizes, n_acc, seed, bias):
    rng = np.random.default_rng(seed + 7)
    m, l = sum(sizes), len(sizes)
    ins = {"alpha": torch.from_numpy(rng.uniform(0.5, 1.5, l).astype(np.float32)),
           "prob": torch.from_numpy(rng.uniform(0, 1, m).astype(np.float32)),
           "norm_const": torch.full((1,), 1.0)}
    if bias:
        ins["bias"] = torch.from_numpy(rng.standard_normal((l, n_acc)).astype(np.float32)).to(torch.bfloat16).T
    return ins


def _call(host, ins, keep, *, sf_vec_size, discrete=False, **kw):
    """fusegemm.grouped_gemm_glu on the device; ``discrete``: per-expert weight pointers (the
    blockwise recipe's SFB is per expert already: (nb, sfk) each), kept alive in ``keep``."""
    dev = {k: v.cuda() for k, v in host.items()}
    if discrete:
        assert sf_vec_size == 128, "the test splits blockwise SFB per expert only"
        bs = [t.contiguous() for t in dev.pop("b_tensor")]
        sbs = [t.contiguous() for t in dev.pop("sfb_tensor")]
        keep += bs + sbs
        dev.update(b_ptrs=torch.tensor([t.data_ptr() for t in bs], dtype=torch.int64, device="cuda"),
                   sfb_ptrs=torch.tensor([t.data_ptr() for t in sbs], dtype=torch.int64, device="cuda"),
                   n=bs[0].shape[0])
    got = fusegemm.grouped_gemm_glu(
        dev["a_tensor"], dev["sfa_tensor"], dev["padded_offsets"], ins["alpha"].cuda(), dev.get("b_tensor"),
        dev.get("sfb_tensor"), bias_tensor=ins["bias"].cuda() if "bias" in ins else None,
        b_ptrs=dev.get("b_ptrs"), sfb_ptrs=dev.get("sfb_ptrs"), n=dev.get("n"),
        norm_const_tensor=ins["norm_const"].cuda(), prob_tensor=ins["prob"].cuda(), sf_vec_size=sf_vec_size, **kw)
    torch.cuda.synchronize()
    return got


def _op(sf_vec_size, **axes):
    recipe = {"sf_dtype": E8M0, "sf_vec_size": 32} if sf_vec_size == 32 else {"sf_dtype": "float32",
                                                                              "sf_vec_size": 128}
    return fusegemm.Op("grouped_gemm_glu_mx", **recipe, **axes, **ARCH)


def _check_rows(got, want, valid, rtol):
    """Rows [:valid] within ``rtol`` of the largest magnitude plus one ulp of the output dtype."""
    err, problem = compare_outputs({"x": np.asarray(want)[:valid]}, {"x": got[:valid]}, exact=False, rtol=rtol)
    assert problem is None, (problem, err)


@pytest.mark.parametrize("recipe,sizes,n_acc,k,tile_n,exact", [
    ("mx", [256, 0, 512, 256], 256, 512, 256, False),         # an empty expert
    ("mx", [768], 448, 320, 128, False),                      # L = 1, a half tile of N
    ("mx", [512, 0, 256], 256, 256, 256, True),
    ("blockwise", [256, 0, 512], 256, 640, 256, False),
    ("blockwise", [512, 256], 512, 384, 128, False),
    ("blockwise", [256, 512], 320, 384, 256, True),           # N tail of the 256-column tile
])
def test_bf16_d_and_c_against_the_interpreter_and_the_formula(recipe, sizes, n_acc, k, tile_n, exact):
    host, a64, b64 = _operands(sizes, n_acc, k, seed=n_acc + k, recipe=recipe, exact=exact)
    ins = _inputs(sizes, n_acc, seed=k, bias=False)
    sf = 32 if recipe == "mx" else 128
    got = _call(host, ins, [], sf_vec_size=sf, generate_c=True, mma_tiler_mn=(128, tile_n))
    valid = sum(sizes)
    op = _op(sf, generate_c=True, tile_n=tile_n)
    ref = op.reference(*(host[k] for k in ("a_tensor", "sfa_tensor", "padded_offsets", "b_tensor", "sfb_tensor")),
                       inputs={k: v for k, v in ins.items() if k != "norm_const"})
    d, c = got["d_tensor"].float().cpu().numpy(), got["c_tensor"].float().cpu().numpy()
    assert d.shape == (valid, n_acc // 2) and c.shape == (valid, n_acc)
    assert got["sfd_row_tensor"] is None and got["amax_tensor"] is None
    rtol = 1e-6 if exact else 2e-3
    _check_rows(d, ref["d"], valid, rtol)
    _check_rows(c, ref["c"], valid, 0.0 if exact else rtol)
    want = swiglu64(a64, b64, sizes, ins)
    assert np.abs(d - want).max() <= 2 ** -7 * np.abs(want).max()


def test_fp8_d_with_sfd_row_bias_and_discrete_weights():
    """FP8 D row-quantized for the next GEMM, a column bias, per-expert weight pointers (blockwise
    recipe) against the interpreter, dequantized."""
    sizes, n_acc, k = [256, 0, 512], 256, 512
    host, _, _ = _operands(sizes, n_acc, k, seed=11, recipe="blockwise")
    ins = _inputs(sizes, n_acc, seed=11, bias=True)
    keep: list = []
    got = _call(host, ins, keep, sf_vec_size=128, discrete=True, d_dtype=torch.float8_e4m3fn,
                mma_tiler_mn=(128, 256))
    op = _op(128, d_dtype="float8_e4m3fn", bias_dtype="bfloat16", weight_mode="discrete")
    ref = op.reference(*(host[k] for k in ("a_tensor", "sfa_tensor", "padded_offsets", "b_tensor", "sfb_tensor")),
                       inputs=ins)
    valid, w = sum(sizes), n_acc // 2
    sfd_got = unpack_sf(got["sfd_row_tensor"].cpu().view(torch.uint8).numpy(), valid, w // 32).reshape(valid, -1)
    sfd_ref = unpack_sf(np.asarray(ref["sfd_row"]).view(np.uint8), valid, w // 32).reshape(valid, -1)
    assert np.array_equal(sfd_got, sfd_ref)
    d_got = dequantize_blockwise(got["d_tensor"].cpu().view(torch.uint8).numpy()[:valid].view(_e4m3()),
                                 sfd_got.view(_e8m0()), sf_vec_size=32)
    d_ref = dequantize_blockwise(np.asarray(ref["d"])[:valid].view(_e4m3()), sfd_ref.view(_e8m0()), sf_vec_size=32)
    # One e4m3 step (3 mantissa bits) of the larger value, plus 2e-3 of the block's range.
    scale = np.repeat(sfd_ref.view(_e8m0()).astype(np.float32), 32, axis=1)
    tol = np.maximum(np.abs(d_ref), np.abs(d_got)) * 2.0 ** -3 + 2e-3 * 448 * scale
    assert np.all(np.abs(d_got - d_ref) <= tol)
    assert (d_got == d_ref).mean() > 0.98


def _e4m3():
    import ml_dtypes
    return ml_dtypes.float8_e4m3fn


def _e8m0():
    import ml_dtypes
    return ml_dtypes.float8_e8m0fnu


def test_wrapper_is_the_op_and_its_torch_op_compiles():
    """The wrapper's bytes are the Op's; torch.ops.fusegemm.grouped_gemm_glu with MXFP8 operands
    under torch.compile(fullgraph=True) gives the same."""
    import fusegemm.torch_library  # noqa: F401  (registers the ops)
    sizes, n_acc, k = [256, 256], 256, 256
    host, _, _ = _operands(sizes, n_acc, k, seed=3, recipe="mx")
    ins = _inputs(sizes, n_acc, seed=3, bias=False)
    got = _call(host, ins, [], sf_vec_size=32)
    dev = {k: v.cuda() for k, v in host.items()}
    op = _op(32)
    want = op(dev["a_tensor"], dev["sfa_tensor"], dev["padded_offsets"], dev["b_tensor"], dev["sfb_tensor"],
              inputs={"alpha": ins["alpha"].cuda(), "prob": ins["prob"].cuda()})
    assert torch.equal(got["d_tensor"], want["d"])
    alpha, prob = ins["alpha"].cuda(), ins["prob"].cuda()
    f = torch.compile(lambda a, sfa, b, sfb: torch.ops.fusegemm.grouped_gemm_glu(
        a, sfa, dev["padded_offsets"], alpha, b, sfb, prob=prob, sf_vec_size=32)[1], fullgraph=True)
    assert torch.equal(f(dev["a_tensor"], dev["sfa_tensor"], dev["b_tensor"], dev["sfb_tensor"]), want["d"])
