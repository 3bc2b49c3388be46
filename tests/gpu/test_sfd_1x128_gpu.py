"""1x128 output scales (``quantize.vec: 128``, ``sfd_vec_size=128``) on the GPU: an FP8 D with one
FP32 scale per row and 128 columns, M-contiguous, which the next blockwise GEMM takes as its A
and sfa_tensor as they are.

* A user's linear epilogue (tests/data/user_sfd_1x128.yaml) on exact problems (small integers,
  power-of-two operand scales: the accumulator is exact in any order) must match the numpy
  interpreter bit for bit: D's bytes and the scales, tile N 128 and 256 (one and two groups per
  epilogue), e4m3 and e5m2, ragged and empty experts, a partial last group.
* SwiGLU (grouped_gemm_glu_mx), whose silu differs from the interpreter's by a few ulp: the
  scales within 2^-20 relative of the interpreter's, the dequantized D within one FP8 step of
  the interpreter's, and against a float64 SwiGLU of the dequantized operands; with C (the
  training forward) C as the interpreter's within 2e-3 of its largest magnitude.
* The chain: that D and its scales are fc2's A (grouped_gemm_quant, blockwise, bf16 D) without a
  copy or a conversion, against fc2's interpreter on the same bytes.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

import fusegemm  # noqa: E402
from fusegemm.formats import (blockwise_sfa_layout, dequantize_128x128, dequantize_1x128,  # noqa: E402
                              quantize_128x128, quantize_1x128)
from formulas import swiglu64  # noqa: E402  (tests/formulas.py)

USER = str(Path(__file__).resolve().parents[1] / "data" / "user_sfd_1x128.yaml")
BW = {"sf_dtype": "float32", "sf_vec_size": 128}
STEP = {"float8_e4m3fn": 2.0 ** -3, "float8_e5m2": 2.0 ** -2}


def _fp8(x: np.ndarray, dtype: str) -> "torch.Tensor":
    return torch.from_numpy(np.ascontiguousarray(x).view(np.uint8)).view(getattr(torch, dtype))


def _problem(sizes, n, k, seed, *, exact, ab="float8_e4m3fn"):
    """Host operands (fusegemm.Op's keywords) and A, B dequantized (float64)."""
    import ml_dtypes
    rng = np.random.default_rng(seed)
    m, l = sum(sizes), len(sizes)
    sfk, nb = -(-k // 128), -(-n // 128)
    if exact:
        cast = getattr(ml_dtypes, ab)
        aq, bq = rng.integers(-3, 4, (m, k)).astype(cast), rng.integers(-3, 4, (l, n, k)).astype(cast)
        sa = np.exp2(rng.integers(-2, 2, (m, sfk))).astype(np.float32)
        sb = np.exp2(rng.integers(-4, -1, (l, nb, sfk))).astype(np.float32)
    else:
        aq, sa = quantize_1x128(rng.standard_normal((m, k)) * 2, ab)
        bq, sb = quantize_128x128(rng.standard_normal((l, n, k)) * k ** -0.5, ab)
    host = {"a_tensor": _fp8(aq, ab), "sfa_tensor": blockwise_sfa_layout(torch.from_numpy(sa)),
            "padded_offsets": torch.tensor(np.cumsum(sizes), dtype=torch.int32), "b_tensor": _fp8(bq, ab),
            "sfb_tensor": torch.from_numpy(sb)}
    return host, dequantize_1x128(aq, sa).astype(np.float64), dequantize_128x128(bq, sb).astype(np.float64)


def _device(host):
    dev = {k: v.cuda() for k, v in host.items()}
    dev["sfa_tensor"] = blockwise_sfa_layout(host["sfa_tensor"].contiguous().cuda())
    return dev


def _inputs(sizes, seed, norm_const, *, exact):
    rng = np.random.default_rng(seed + 5)
    m, l = sum(sizes), len(sizes)
    if exact:
        alpha, prob = np.exp2(rng.integers(-1, 2, l)), rng.integers(1, 5, m) / 4
    else:
        alpha, prob = rng.uniform(0.5, 1.5, l), rng.uniform(0, 1, m)
    return {"alpha": torch.from_numpy(alpha.astype(np.float32)), "prob": torch.from_numpy(prob.astype(np.float32)),
            "norm_const": torch.full((1,), norm_const)}


def _check_layout(sfd, m, w):
    """sfd_row: the (M, ceil(W/128)) float32 view, unit stride along M, a 16-byte pitch."""
    pitch = -(-m // 4) * 4
    assert sfd.dtype == torch.float32 and tuple(sfd.shape) == (m, -(-w // 128))
    assert tuple(sfd.stride()) == (1, pitch)


@pytest.mark.parametrize("sizes,n,k,tile_n,d_dtype,nc,pow2", [
    ([256, 0, 512, 256], 512, 384, 256, "float8_e4m3fn", 1.0, False),   # two groups per 256-column epilogue
    ([512, 256], 320, 256, 128, "float8_e4m3fn", 0.5, False),            # tile N 128; a 64-column last group
    ([512, 0], 320, 512, 256, "float8_e5m2", 2.0, False),                # e5m2 (elem max 57344), empty last
    ([256], 128, 128, 256, "float8_e4m3fn", 1.0, False),                 # L = 1, one group, half a tile
    ([256, 0, 512, 256], 512, 384, 256, "float8_e4m3fn", 0.5, True),    # UE8M0 scales
    ([512, 256], 320, 256, 128, "float8_e5m2", 1.0, True),
])
def test_user_epilogue_bit_exact(sizes, n, k, tile_n, d_dtype, nc, pow2):
    host, _, _ = _problem(sizes, n, k, seed=n + k, exact=True)
    ins = _inputs(sizes, seed=k, norm_const=nc, exact=True)
    op = fusegemm.Op(USER, d_dtype=d_dtype, tile_n=tile_n, sfd_pow2=pow2)
    out = op(**_device(host), inputs={k2: v.cuda() for k2, v in ins.items()})
    torch.cuda.synchronize()
    ref = op.reference(*host.values(), inputs=ins)
    m = sum(sizes)
    _check_layout(out["sfd_row"], m, n)
    s_got, s_ref = out["sfd_row"].cpu().numpy(), np.asarray(ref["sfd_row"])
    np.testing.assert_array_equal(s_got, s_ref)
    d_got, d_ref = out["d"].cpu().numpy(), np.asarray(ref["d"]).view(np.uint8)
    np.testing.assert_array_equal(d_got, d_ref)
    assert (s_got[:m] > 0).all() and np.isfinite(s_got).all()
    if pow2:   # each scale a power of two (an exact E8M0 byte)
        assert (np.frexp(s_got[:m])[0] == 0.5).all()


@pytest.mark.parametrize("tile_n", [128, 256])
def test_a_quotient_on_an_fp8_midpoint_rounds_to_even(tile_n):
    """The kernel's quotient t / s must be div.rn's (Group1x128::div, three operations): here row 5
    holds D = 336 p and 186 p (p = 1.0162736, float32), so s = fl(fl(336 p) / 448) and
    fl(fl(186 p) / s) = 248.0, exactly halfway between e4m3 240 and 256: it rounds to even (256,
    byte 0x78). A product with the reciprocal, fl(t * fl(1 / s)) = 247.99998, gives 240 (0x77).
    The interpreter divides correctly (tests/unit: the same midpoint), so the bytes must match."""
    import ml_dtypes
    m, n, k, row, p = 256, 256, 256, 5, np.float32(1.0162736)
    a = np.zeros((m, k), np.float32)
    a[row] = 2.0
    b = np.zeros((1, n, k), np.float32)
    b[0, 7, :168] = 1.0     # acc[row, 7] = 336: the group's maximum
    b[0, 40, :93] = 1.0     # acc[row, 40] = 186
    cast = ml_dtypes.float8_e4m3fn
    host = {"a_tensor": _fp8(a.astype(cast), "float8_e4m3fn"),
            "sfa_tensor": blockwise_sfa_layout(torch.ones(m, k // 128)),
            "padded_offsets": torch.tensor([m], dtype=torch.int32), "b_tensor": _fp8(b.astype(cast), "float8_e4m3fn"),
            "sfb_tensor": torch.ones(1, n // 128, k // 128)}
    prob = torch.ones(m)
    prob[row] = float(p)
    ins = {"alpha": torch.ones(1), "prob": prob, "norm_const": torch.ones(1)}
    op = fusegemm.Op(USER, tile_n=tile_n)
    out = op(**_device(host), inputs={k2: v.cuda() for k2, v in ins.items()})
    torch.cuda.synchronize()
    ref = op.reference(*host.values(), inputs=ins)
    d_ref = np.asarray(ref["d"]).view(np.uint8)
    assert d_ref[row, 40] == 0x78 and d_ref[row, 7] == 0x7E     # 256 (even), and 448 for the maximum
    np.testing.assert_array_equal(out["sfd_row"].cpu().numpy(), np.asarray(ref["sfd_row"]))
    np.testing.assert_array_equal(out["d"].cpu().numpy(), d_ref)


def _dequant(d_bytes, s, dtype):
    import ml_dtypes
    q = np.ascontiguousarray(d_bytes).view(getattr(ml_dtypes, dtype)).astype(np.float64)
    return q * np.repeat(np.asarray(s, dtype=np.float64), 128, axis=1)[:, : q.shape[1]]


@pytest.mark.parametrize("sizes,n_acc,k,generate_c,exact,pow2", [
    ([256, 0, 512], 512, 640, False, False, False),
    ([512, 256], 768, 384, True, False, False),     # with C (the training forward); three groups
    ([256, 256], 320, 256, True, True, False),      # a partial last group
    ([256, 0, 512], 512, 640, True, False, True),   # UE8M0 scales
])
def test_swiglu_against_the_interpreter_and_the_formula(sizes, n_acc, k, generate_c, exact, pow2):
    host, a64, b64 = _problem(sizes, n_acc, k, seed=k, exact=exact)
    ins = _inputs(sizes, seed=n_acc, norm_const=1.0, exact=exact)
    op = fusegemm.Op("grouped_gemm_glu_mx", **BW, d_dtype="float8_e4m3fn", sfd_vec_size=128,
                     generate_c=generate_c, sfd_pow2=pow2)
    out = op(**_device(host), inputs={k2: v.cuda() for k2, v in ins.items()})
    torch.cuda.synchronize()
    ref = op.reference(*host.values(), inputs=ins)
    m, w = sum(sizes), n_acc // 2
    _check_layout(out["sfd_row"], m, w)
    s_got, s_ref = out["sfd_row"].cpu().numpy(), np.asarray(ref["sfd_row"])
    # Exact operands: silu's few ulps move a group's max by as much; realistic ones: Hopper's FP8
    # WGMMA accumulation (about 1e-4 of the largest magnitude, tests/gpu/test_blockwise_gpu.py).
    # (power-of-two scales: equal, or one step apart where the group's max sits at a power of two)
    np.testing.assert_allclose(s_got, s_ref, rtol=1.0 if pow2 else 2.0 ** -18 if exact else 2e-3, atol=0)
    if pow2:
        assert (np.frexp(s_got)[0] == 0.5).all() and (s_got == s_ref).mean() > 0.99
    d_got = _dequant(out["d"].cpu().numpy(), s_got, "float8_e4m3fn")
    d_ref = _dequant(np.asarray(ref["d"]).view(np.uint8), s_ref, "float8_e4m3fn")
    group_max = np.repeat(s_ref.astype(np.float64), 128, axis=1)[:, :w] * 448
    step = STEP["float8_e4m3fn"] * np.maximum(np.abs(d_ref), 2.0 ** -8 * group_max) + (0 if exact else 4e-3) * group_max
    bad = np.abs(d_got - d_ref) > step
    assert not bad.any(), (np.argwhere(bad)[:5], d_got[bad][:5], d_ref[bad][:5])
    same = (out["d"].cpu().numpy() == np.asarray(ref["d"]).view(np.uint8)).mean()   # the bytes
    assert same > 0.98, same
    want = swiglu64(a64, b64, sizes, ins)
    bad = np.abs(d_got - want) > group_max * (2.0 ** -4 + (0 if exact else 4e-3))
    assert not bad.any(), (np.argwhere(bad)[:5], d_got[bad][:5], want[bad][:5])
    if generate_c:
        c_got, c_ref = out["c"].float().cpu().numpy(), np.asarray(ref["c"], dtype=np.float32)
        # bf16 C: exact operands bit for bit; else 2e-3 of the largest magnitude plus a bf16 ulp
        assert np.all(np.abs(c_got - c_ref) <= (0 if exact else 2e-3 * np.abs(c_ref).max() + 2.0 ** -7 * np.abs(c_ref)))


def test_the_output_is_fc2s_operand_as_it_is():
    """fc1 (SwiGLU, 1x128 FP8 D) -> fc2 (blockwise GEMM, bf16 D): fc2 reads fc1's D bytes and its
    sfd_row view directly; its result is fc2's interpreter on the same bytes and scales."""
    sizes, n1, k1, n2 = [256, 0, 512], 512, 256, 384
    host, _, _ = _problem(sizes, n1, k1, seed=3, exact=False)
    ins = _inputs(sizes, seed=3, norm_const=1.0, exact=False)
    fc1 = fusegemm.Op("grouped_gemm_glu_mx", **BW, d_dtype="float8_e4m3fn", sfd_vec_size=128)
    h = fc1(**_device(host), inputs={k2: v.cuda() for k2, v in ins.items()})
    w2 = np.random.default_rng(4).standard_normal((len(sizes), n2, n1 // 2)) * (n1 // 2) ** -0.5
    bq, sb = quantize_128x128(w2)
    fc2 = fusegemm.Op("grouped_gemm_quant", **BW, d_dtype="bfloat16")
    a2 = h["d"].view(torch.float8_e4m3fn)
    alpha2 = torch.ones(len(sizes))
    y = fc2(a2, h["sfd_row"], host["padded_offsets"].cuda(), _fp8(bq, "float8_e4m3fn").cuda(),
            torch.from_numpy(sb).cuda(), inputs={"alpha": alpha2.cuda()})
    torch.cuda.synchronize()
    ref = fc2.reference(a2.cpu(), blockwise_sfa_layout(h["sfd_row"].cpu().contiguous()), host["padded_offsets"],
                        _fp8(bq, "float8_e4m3fn"), torch.from_numpy(sb), inputs={"alpha": alpha2})
    got, want = y["d"].float().cpu().numpy(), np.asarray(ref["d"], dtype=np.float32)
    # 2e-3 of the largest magnitude (FP8 WGMMA accumulation) plus one bf16 ulp of each value
    assert np.all(np.abs(got - want) <= 2e-3 * np.abs(want).max() + 2.0 ** -7 * np.abs(want))


@pytest.mark.parametrize("tile_m,generate_c,pow2", [(128, False, False), (64, True, False), (128, True, True)])
def test_bf16_swiglu_emits_the_recipe_format(tile_m, generate_c, pow2):
    """The BF16 grouped kernel's SwiGLU (grouped_gemm_swiglu: BF16 x and w1) with an FP8 D in
    1x128 FP32 scales, cooperative (tile M 128) and ping-pong (64): fc1 of a BF16 layer whose fc2
    runs the blockwise recipe. Against the interpreter (silu's ulps: the scales within 2^-18,
    D within one FP8 step) and its C bit for bit (alpha * acc in BF16)."""
    sizes, n_acc, k = [256, 0, 512], 512, 256
    g = torch.Generator().manual_seed(11)
    a = torch.randn(sum(sizes), k, generator=g).to(torch.bfloat16)
    b = (torch.randn(len(sizes), n_acc, k, generator=g) * k ** -0.5).to(torch.bfloat16)
    off = torch.tensor(np.cumsum(sizes), dtype=torch.int32)
    ins = {"alpha": torch.full((len(sizes),), 1.0), "prob": torch.rand(sum(sizes), generator=g),
           "norm_const": torch.full((1,), 1.0)}
    op = fusegemm.Op("grouped_gemm_swiglu", d_dtype="float8_e4m3fn", sfd_vec_size=128, sfd_pow2=pow2,
                     generate_c=generate_c, tile_m=tile_m, tile_n=256, cluster_m=1)
    out = op(a.cuda(), off.cuda(), b.cuda(), inputs={k2: v.cuda() for k2, v in ins.items()})
    torch.cuda.synchronize()
    ref = op.reference(a, off, b, inputs=ins)
    m, w = sum(sizes), n_acc // 2
    _check_layout(out["sfd_row"], m, w)
    s_got, s_ref = out["sfd_row"].cpu().numpy(), np.asarray(ref["sfd_row"])
    # (the BF16 WGMMA sums in another order than the interpreter's float64: a few ulps)
    np.testing.assert_allclose(s_got, s_ref, rtol=1.0 if pow2 else 2.0 ** -18, atol=0)
    if pow2:
        assert (s_got == s_ref).mean() > 0.99
    d_got = _dequant(out["d"].cpu().numpy(), s_got, "float8_e4m3fn")
    d_ref = _dequant(np.asarray(ref["d"]).view(np.uint8), s_ref, "float8_e4m3fn")
    group_max = np.repeat(s_ref.astype(np.float64), 128, axis=1)[:, :w] * 448
    step = STEP["float8_e4m3fn"] * np.maximum(np.abs(d_ref), 2.0 ** -8 * group_max) + 1e-3 * group_max
    assert not (np.abs(d_got - d_ref) > step).any()
    if generate_c:
        c_got, c_ref = out["c"].float().cpu().numpy(), np.asarray(ref["c"], dtype=np.float32)
        assert np.all(np.abs(c_got - c_ref) <= 2.0 ** -7 * np.abs(c_ref) + 1e-6 * np.abs(c_ref).max())
