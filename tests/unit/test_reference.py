"""Tests of fusegemm.reference: hand-computed cases, per-element loop formulas, SFD, amax, errors."""
from __future__ import annotations

import math
import pickle
import time

import ml_dtypes
import numpy as np
import pytest

from fusegemm import formats as F
from fusegemm import reference as R
from fusegemm.base.errors import ArgumentError
from fusegemm.problems import make_batched_problem, make_grouped_problem
from fusegemm.tupledict import TupleDict

E4M3 = ml_dtypes.float8_e4m3fn
E8M0 = ml_dtypes.float8_e8m0fnu
BF16 = ml_dtypes.bfloat16
NEG_INF = float("-inf")


def f32(x) -> np.ndarray:
    return F.to_float32(x)


def codes(x) -> np.ndarray:
    return np.ascontiguousarray(x).view(np.uint8)


# ---------------------------------------------------------------- TupleDict


def test_tupledict_unpacks_indexes_and_is_read_only():
    result = TupleDict(d_tensor=np.zeros((2, 3), np.float32), c_tensor=None)
    d, c = result
    assert d is result["d_tensor"] is result[0] is result[-2] and c is None and result[1] is None
    assert list(result.keys()) == ["d_tensor", "c_tensor"] and len(result) == 2
    assert "d_tensor" in result and isinstance(result, dict)
    assert repr(result) == "TupleDict(d_tensor=array(shape=(2, 3), dtype=float32), c_tensor=None)"
    with pytest.raises(IndexError, match=r"^TupleDict index 2 out of range for 2 items"):
        result[2]
    with pytest.raises(TypeError, match="read-only"):
        result["x"] = 1
    with pytest.raises(TypeError, match="read-only"):
        result.update(x=1)
    with pytest.raises(TypeError, match=r"keys must be str; got key 1"):
        TupleDict({1: 2})
    again = pickle.loads(pickle.dumps(result))
    assert list(again.keys()) == ["d_tensor", "c_tensor"] and again[1] is None
    fast = TupleDict.of(d_tensor=d, c_tensor=None)      # the ops' fast-path constructor
    assert type(fast) is TupleDict and list(fast.items()) == list(result.items())
    with pytest.raises(TypeError, match="read-only"):
        fast["x"] = 1


# ---------------------------------------------------------------- builders of hand-made problems


def e8m0_sf(codes_2d: np.ndarray) -> np.ndarray:
    """Kernel-facing SF view of logical E8M0 codes (rows, sfk) or (L, rows, sfk)."""
    arr = np.asarray(codes_2d, np.uint8).view(E8M0)
    return F.sf_to_kernel_view(F.pack_sf(arr, batch_first=arr.ndim == 3))


def hand_fp8_problem():
    """768 rows (valid_m 512), experts [0, 256), empty, [256, 512); N = 32, K = 32, E8M0 scale 1
    except SFB[expert 0, n 0] = 2. Non-zero data: A[0] = [2, 0..], A[1] = [1, 1, 0..],
    A[256] = [0.5, 0..], A[600] = 4 (past valid_m); B0[n0] = [3, 0..], B0[n1] = [-1, 0..],
    B0[n2] = [0, 2, 0..], B2[n0] = [4, 0..]; alpha = [1, 5, 2]; prob[0] = 0.5, prob[1] = 2,
    prob[256] = 3, else 1.

    acc: row 0 = [12, -2, 0], row 1 = [6, -1, 2], row 256 = [2, 0, 0] (first three columns).
    """
    a = np.zeros((768, 32), np.float32)
    a[0, 0], a[1, :2], a[256, 0], a[600, :] = 2, 1, 0.5, 4
    b = np.zeros((3, 32, 32), np.float32)
    b[0, 0, 0], b[0, 1, 0], b[0, 2, 1], b[2, 0, 0] = 3, -1, 2, 4
    sfb = np.full((3, 32, 1), 127)
    sfb[0, 0, 0] = 128
    prob = np.ones(768, np.float32)
    prob[[0, 1, 256]] = [0.5, 2, 3]
    return dict(
        a_tensor=a.astype(E4M3)[:, :, None],
        b_tensor=F.b_to_kernel(b.astype(E4M3)),
        sfa_tensor=e8m0_sf(np.full((768, 1), 127)),
        sfb_tensor=e8m0_sf(sfb),
        padded_offsets=np.array([256, 256, 512], np.int32),
        alpha_tensor=np.array([1, 5, 2], np.float32),
        prob_tensor=prob[:, None, None],
        sf_vec_size=32,
    )


# ---------------------------------------------------------------- seed 001, BF16 grouped GEMM


def hand_bf16_problem():
    a = np.zeros((768, 4), np.float32)
    a[0], a[256], a[700] = [1, 2, 3, 4], [1, 1, 1, 1], [9, 9, 9, 9]
    b = np.array([[[1, 0, 0, 0], [0, 1, 0, 1]], [[2, 2, 2, 2], [1, -1, 1, -1]]], np.float32)
    prob = np.ones(768, np.float32)
    prob[0], prob[256] = 3, 2
    return dict(
        a_tensor=a.astype(BF16)[:, :, None],
        b_tensor=F.b_to_kernel(b.astype(BF16)),
        padded_offsets=np.array([256, 512], np.int32),
        alpha_tensor=np.array([2, 0.5], np.float32),
        prob_tensor=prob[:, None, None],
    )


def test_grouped_gemm_hand_no_bias():
    out = R.grouped_gemm(**hand_bf16_problem(), generate_c=True, c_dtype="float32", d_dtype="float32")
    assert list(out.keys()) == ["d_tensor", "c_tensor"]
    d, c = out
    assert d.shape == (768, 2, 1)
    assert c[0, :, 0].tolist() == [2, 12] and d[0, :, 0].tolist() == [6, 36]  # C = 2*[1, 6]; D = 3*C
    assert c[256, :, 0].tolist() == [4, 0] and d[256, :, 0].tolist() == [8, 0]  # 0.5*[8, 0]; 2*C
    assert not d[512:].any() and not c[512:].any()  # row 700 is past valid_m: never written


def test_grouped_gemm_hand_bias_and_dtypes():
    bias = np.array([[10, 20], [30, 40]], np.float32).astype(BF16)  # bias[n, e]
    out = R.grouped_gemm(**hand_bf16_problem(), bias_tensor=bias, generate_c=True, c_dtype="float32")
    d, c = out
    assert d.dtype == np.dtype(BF16)
    assert c[0, :, 0].tolist() == [32, 102]  # [2 + 3*10, 12 + 3*30]
    assert c[1, :, 0].tolist() == [10, 30]  # zero A row: prob * bias
    assert c[256, :, 0].tolist() == [44, 80]  # [4 + 2*20, 0 + 2*40]
    assert f32(d[:512]).tolist() == c[:512].tolist()  # D = C with bias
    assert R.grouped_gemm(**hand_bf16_problem())["c_tensor"] is None  # generate_c defaults False


# ---------------------------------------------------------------- seed 002, sReLU


def test_srelu_hand_values_and_amax():
    c, d, d_col, amax, sfd_row, sfd_col = R.grouped_gemm_srelu(**hand_fp8_problem(), c_dtype="float32")
    assert c[0, :3, 0].tolist() == [12, -2, 0] and c[256, :1, 0].tolist() == [4]  # alpha 2 on expert 2
    assert f32(d[0, :3, 0]).tolist() == [72, 0, 0]  # 0.5 * 12^2
    assert f32(d[1, :3, 0]).tolist() == [72, 0, 8]  # 2 * [36, 0, 4]
    assert f32(d[256, :1, 0]).tolist() == [48]  # 3 * 4^2
    assert d_col is None and sfd_row is None and sfd_col is None
    assert amax.shape == (3, 1) and amax[:, 0].tolist() == [72, NEG_INF, 48]
    assert not f32(d[512:]).any() and not c[512:].any()


def test_srelu_hand_bias_not_gated_by_prob():
    bias = np.zeros((32, 3), np.float32)
    bias[0, 0], bias[2, 0], bias[0, 2] = 10, -5, 1
    out = R.grouped_gemm_srelu(**hand_fp8_problem(), bias_tensor=bias, c_dtype="float32")
    assert out["c_tensor"][0, :3, 0].tolist() == [22, -2, -5]
    assert f32(out["d_tensor"][0, :3, 0]).tolist() == [242, 0, 0]  # 0.5 * 22^2
    assert f32(out["d_tensor"][1, :3, 0]).tolist() == [512, 0, 0]  # 2 * 16^2
    assert f32(out["d_tensor"][5, :3, 0]).tolist() == [100, 0, 0]  # zero A: relu(bias)^2
    assert f32(out["d_tensor"][256, :1, 0]).tolist() == [75]  # 3 * (4 + 1)^2
    assert out["amax_tensor"][:, 0].tolist() == [512, NEG_INF, 75]


def test_srelu_hand_tanh_clamp():
    out = R.grouped_gemm_srelu(**hand_fp8_problem(), tanh_clamp_scale=4.0)
    # row 0: relu(C) = 12 -> 4 * tanh(3) -> 0.5 * 16 * tanh(3)^2 = 7.9210717 -> bf16 7.90625
    assert f32(out["d_tensor"][0, 0, 0]) == 7.90625
    # row 1: relu(C) = 6 -> 2 * 16 * tanh(1.5)^2 = 26.217388, the expert's max
    assert out["amax_tensor"][0, 0] == pytest.approx(26.217388, rel=1e-6)
    assert out["amax_tensor"][2, 0] == pytest.approx(3 * 16 * math.tanh(1.0) ** 2, rel=1e-6)


# ---------------------------------------------------------------- seed 003, quant


def test_quant_hand_bf16_d():
    d, d_col, amax, sfd_row, sfd_col = R.grouped_gemm_quant(**hand_fp8_problem())
    assert f32(d[0, :3, 0]).tolist() == [6, -1, 0]  # 0.5 * 1 * [12, -2, 0]
    assert f32(d[1, :3, 0]).tolist() == [12, -2, 4]  # 2 * [6, -1, 2]
    assert f32(d[256, :1, 0]).tolist() == [12]  # 3 * 2 * 2
    assert amax[:, 0].tolist() == [12, NEG_INF, 12] and d_col is None and sfd_row is None
    no_amax = R.grouped_gemm_quant(**hand_fp8_problem(), generate_amax=False)
    assert no_amax["amax_tensor"] is None


def test_quant_hand_bias_prob_scales_only_bias():
    bias = np.zeros((32, 3), np.float32)
    bias[0, 0], bias[2, 0] = 10, -5
    d = R.grouped_gemm_quant(**hand_fp8_problem(), bias_tensor=bias)[0]
    assert f32(d[0, :3, 0]).tolist() == [17, -2, -2.5]  # 12 + 0.5*10, -2, 0.5*-5
    assert f32(d[1, :3, 0]).tolist() == [26, -1, -8]  # 6 + 2*10, -1, 2 + 2*-5


def test_quant_hand_row_scale():
    rs = np.ones(768, np.float32)
    rs[0] = 4
    d = R.grouped_gemm_quant(**hand_fp8_problem(), row_scale_tensor=rs)[0]
    assert f32(d[0, :2, 0]).tolist() == [24, -4]  # 0.5 * (1 * 4) * [12, -2]


def test_quant_hand_sfd_e4m3_rows_and_columns():
    p = hand_fp8_problem()
    d, d_col, amax, sfd_row, sfd_col = R.grouped_gemm_quant(
        **p, d_dtype="float8_e4m3fn", norm_const_tensor=np.array([1.0], np.float32)
    )
    assert amax is None and sfd_row.shape == (32, 4, 6, 4, 1, 1) and sfd_col.shape == (32, 4, 1, 4, 6, 1)
    # row 0: x = [6, -1, 0..]: 6/448 = 0.0134 -> 2^-6 (byte 121), scale 64 -> [384, -64]
    # row 1: x = [12, -2, 4]: 12/448 -> 2^-5 (byte 122), scale 32 -> [384, -64, 128]
    # row 256: x = [12]: 12/448 -> 2^-5 (byte 122), scale 32 -> [384]
    assert f32(d[0, :3, 0]).tolist() == [384, -64, 0] and f32(d[1, :3, 0]).tolist() == [384, -64, 128]
    assert f32(d[256, :1, 0]).tolist() == [384]
    sr = codes(sfd_row)
    assert sr[0, 0, 0, 0, 0, 0] == 121 and sr[1, 0, 0, 0, 0, 0] == 122 and sr[0, 0, 2, 0, 0, 0] == 122
    assert sr[2, 0, 0, 0, 0, 0] == 0  # all-zero row block -> byte 0, data 0
    assert not codes(sfd_row)[:, :, 4:].any()  # rows >= valid_m (512): zero bytes
    # columns, rows 0..31: col 0 = [6, 12] -> 2^-5 (122), scale 32 -> [192, 384];
    # col 1 = [-1, -2] -> 2/448 -> 2^-7 (120), scale 128 -> [-128, -256]; col 2 = [0, 4] -> 121
    assert f32(d_col[:2, 0, 0]).tolist() == [192, 384] and f32(d_col[:2, 1, 0]).tolist() == [-128, -256]
    assert f32(d_col[1, 2, 0]) == 256
    sc = codes(sfd_col)  # view[n%32, (n//32)%4, n//128, kb%4, kb//4, 0] with kb = m // 32
    assert sc[0, 0, 0, 0, 0, 0] == 122 and sc[1, 0, 0, 0, 0, 0] == 120 and sc[2, 0, 0, 0, 0, 0] == 121
    assert sc[0, 0, 0, 0, 2, 0] == 122  # rows 256..287, column 0: 12 -> byte 122
    assert not f32(d[512:]).any() and not f32(d_col[512:]).any()


def test_quant_hand_sfd_e5m2_page_vs_nvidia_rcp_max():
    kw = dict(hand_fp8_problem(), d_dtype="float8_e5m2", norm_const_tensor=np.array([1.0], np.float32))
    page = R.grouped_gemm_quant(**kw)
    # 6/57344 = 1.05e-4 -> 2^-13 (byte 114), scale 8192 -> [49152, -8192]
    assert codes(page["sfd_row_tensor"])[0, 0, 0, 0, 0, 0] == 114
    assert f32(page["d_tensor"][0, :2, 0]).tolist() == [49152, -8192]
    nv = R.grouped_gemm_quant(**kw, e5m2_rcp_max="nvidia")
    # 6/128 = 0.047 -> 2^-4 (byte 123), scale 16 -> [96, -16]
    assert codes(nv["sfd_row_tensor"])[0, 0, 0, 0, 0, 0] == 123
    assert f32(nv["d_tensor"][0, :2, 0]).tolist() == [96, -16]


def test_quant_fp4_d_is_packed():
    kw = dict(hand_fp8_problem(), d_dtype="float4_e2m1fn_x2", norm_const_tensor=np.array([1.0], np.float32))
    d = R.grouped_gemm_quant(**kw)["d_tensor"]
    assert d.dtype == np.uint8 and d.shape == (768, 16, 1)
    # row 1: x = [12, -2, 4]: 12/6 = 2 -> byte 128 (2.0), scale 0.5 -> [6, -1, 2]
    assert F.to_float32(d[1, :, 0], "float4_e2m1fn_x2")[:3].tolist() == [6, -1, 2]


# ---------------------------------------------------------------- seed 000, dSwiGLU


def dswiglu_problem(n_blocks: int = 2, l_empty: bool = False):
    """MXFP4 (e2m1, E8M0, vec 32) inputs, N = 32 * n_blocks, K = 32, all scales 1."""
    n = 32 * n_blocks
    offsets = np.array([256, 256, 512] if l_empty else [256, 512], np.int32)
    a = np.zeros((512, 32), np.float32)
    b = np.zeros((offsets.size, n, 32), np.float32)
    return a, b, offsets


def run_dswiglu(a, b, offsets, c, *, alpha, beta, prob, d_dtype="float32"):
    return R.grouped_gemm_dswiglu(
        a_tensor=F.a_to_kernel(F.to_format(a, "float4_e2m1fn_x2")),
        b_tensor=F.b_to_kernel(F.to_format(b, "float4_e2m1fn_x2")),
        c_tensor=F.cd_to_kernel(c.astype(BF16)),
        sfa_tensor=e8m0_sf(np.full((a.shape[0], 1), 127)),
        sfb_tensor=e8m0_sf(np.full((b.shape[0], b.shape[1], 1), 127)),
        padded_offsets=offsets,
        alpha_tensor=np.asarray(alpha, np.float32),
        beta_tensor=np.asarray(beta, np.float32),
        prob_tensor=F.prob_to_kernel(np.asarray(prob, np.float32)),
        d_dtype=d_dtype,
        sf_vec_size=32,
    )


def test_dswiglu_block_positions_even_gate_odd_up():
    """acc = 1 everywhere in row 0; C blocks: gate0 = 0, up0 = 1, gate1 = 100, up1 = 3.

    D block 0 = dswiglu(g=0, u=1) = 1 * 1 * 0.5 * (1 + 0) = 0.5; block 1 = ab(g=0) = 0;
    block 2 = dswiglu(g=100, u=3) = 3 * 1 * (1 + 100 * 0) = 3; block 3 = ab(g=100) = 100.
    """
    a, b, offsets = dswiglu_problem()
    a[0, 0] = 1
    b[0, :, 0] = 1
    c = np.zeros((512, 128), np.float32)
    c[0, 32:64], c[0, 64:96], c[0, 96:128] = 1, 100, 3
    out = run_dswiglu(a, b, offsets, c, alpha=[1, 1], beta=[1, 1], prob=np.ones(512))
    assert list(out.keys()) == ["d_row_tensor", "d_col_tensor", "dprob_tensor", "amax_tensor",
                                "sfd_row_tensor", "sfd_col_tensor"]
    row = out["d_row_tensor"][0, :, 0]
    assert row.tolist() == [0.5] * 32 + [0.0] * 32 + [3.0] * 32 + [100.0] * 32
    # dprob = sum swish * u * R = 32 * (0 * 1) + 32 * (100 * 3 * 1) = 9600
    assert out["dprob_tensor"][0, 0, 0] == 9600 and out["dprob_tensor"].shape == (512, 1, 1)
    assert out["amax_tensor"] is None and out["d_col_tensor"] is None  # float32 D: no amax


def test_dswiglu_hand_alpha_squared_beta_prob_amax():
    """Row 0: acc[n=0] = 2*3 = 6, acc[n=32] = 2*1 = 2; alpha 0.5 -> R = 0.25 * acc = [1.5, 0.5];
    beta 2: C gate(n0) = 50 -> g = 100, up(n0) = 1 -> u = 2; gate(n32) = 0, up(n32) = -2 -> u = -4;
    prob 2. n0: ab = 1.5*2*100 = 300, dswiglu = 1.5*2*2*1*1 = 6; n32: ab = 0,
    dswiglu = 0.5*2*(-4)*0.5*(1 + 0) = -2. dprob = 100*2*1.5 + 0 = 300.
    """
    a, b, offsets = dswiglu_problem(l_empty=True)
    a[0, 0] = 2
    b[0, 0, 0], b[0, 32, 0] = 3, 1
    c = np.zeros((512, 128), np.float32)
    c[0, 0], c[0, 32], c[0, 64], c[0, 96] = 50, 1, 0, -2
    prob = np.ones(512)
    prob[0] = 2
    out = run_dswiglu(a, b, offsets, c, alpha=[0.5, 1, 1], beta=[2, 1, 1], prob=prob, d_dtype="bfloat16")
    d = f32(out["d_row_tensor"][0, :, 0])
    assert [d[0], d[32], d[64], d[96]] == [6, 300, -2, 0]
    assert out["dprob_tensor"][0, 0, 0] == 300
    assert out["amax_tensor"].shape == (3, 2, 1)
    assert out["amax_tensor"][:, :, 0].tolist() == [[6, 300], [NEG_INF, NEG_INF], [0, 0]]


def test_dswiglu_canonical_outputs():
    a, b, offsets = dswiglu_problem()
    a[0, 0] = 1
    b[0, :, 0] = 1
    c = np.zeros((512, 128), np.float32)
    kernel = run_dswiglu(a, b, offsets, c, alpha=[1, 1], beta=[1, 1], prob=np.ones(512))
    canon = R.grouped_gemm_dswiglu(
        a_tensor=F.to_format(a, "float4_e2m1fn_x2"), b_tensor=F.to_format(b, "float4_e2m1fn_x2"),
        c_tensor=c.astype(BF16), sfa_tensor=F.pack_sf(np.full((512, 1), 127, np.uint8)).ravel(),
        sfb_tensor=F.pack_sf(np.full((2, 64, 1), 127, np.uint8), batch_first=True),
        padded_offsets=offsets, alpha_tensor=np.ones(2, np.float32), beta_tensor=np.ones(2, np.float32),
        prob_tensor=np.ones(512, np.float32), d_dtype="float32", sf_vec_size=32,
    )
    assert canon["d_row_tensor"].shape == (512, 128) and canon["dprob_tensor"].shape == (512,)
    assert np.array_equal(canon["d_row_tensor"], kernel["d_row_tensor"][:, :, 0])


# ---------------------------------------------------------------- seed 004, GEMM + amax


def test_gemm_amax_hand():
    a = np.zeros((3, 32, 2), np.float32)  # (M, K, L)
    b = np.zeros((2, 32, 2), np.float32)  # (N, K, L)
    a[0, :2, 0], b[0, :2, 0], b[1, :2, 0] = [1, 2], [3, 1], [0, -4]
    a[2, 0, 1], b[1, 0, 1] = 0.5, -16
    sfa = np.full((2, 3, 1), 127)
    sfa[1, 2, 0] = 129  # A[l=1, row 2] scale 4
    out = R.gemm_amax(
        a.astype(E4M3), b.astype(E4M3), e8m0_sf(sfa), e8m0_sf(np.full((2, 2, 1), 127))
    )
    c, amax = out
    assert list(out.keys()) == ["c_tensor", "amax_tensor"] and c.shape == (3, 2, 2)
    assert c[0, :, 0].tolist() == [5, -8]  # [1*3 + 2*1, 2*-4]
    assert c[2, :, 1].tolist() == [0, -32]  # 0.5 * 4 * -16
    assert c.strides == (2 * 4, 4, 3 * 2 * 4)  # c_major "n": (N, 1, M*N)
    assert amax.shape == (1, 1, 1) and amax.dtype == np.float32 and amax[0, 0, 0] == 32
    m_major = R.gemm_amax(a.astype(E4M3), b.astype(E4M3), e8m0_sf(sfa), e8m0_sf(np.full((2, 2, 1), 127)),
                          c_major="m")["c_tensor"]
    assert m_major.strides == (4, 3 * 4, 3 * 2 * 4) and np.array_equal(m_major, c)


# ---------------------------------------------------------------- per-element loop formulas


def decode_ab(x: np.ndarray, packed: bool) -> np.ndarray:
    if not packed:
        return x.astype(np.float64)
    out = np.empty(x.shape[:-1] + (2 * x.shape[-1],), np.uint8)
    out[..., 0::2], out[..., 1::2] = x & 0xF, x >> 4
    return out.view(ml_dtypes.float4_e2m1fn).astype(np.float64)


def sf_at(phys: np.ndarray, l: int, mn: int, kb: int) -> float:
    return float(phys[l, mn // 128, kb // 4, mn % 32, (mn % 128) // 32, kb % 4].astype(np.float64))


def loop_acc(p) -> np.ndarray:
    """Exact FP32 accumulators, one element at a time (canonical problem)."""
    packed = p.ab_dtype == "float4_e2m1fn_x2"
    a, vec = decode_ab(p.a_tensor, packed), p.sf_vec_size
    b = decode_ab(p.b_tensor if p.b_tensor is not None else np.stack(p.b_list), packed)
    sfb = p.sfb_tensor if p.sfb_tensor is not None else np.concatenate(p.sfb_list)
    k, n = a.shape[1], b.shape[1]
    out = np.zeros((p.valid_m, n), np.float32)
    start = 0
    for e, end in enumerate(p.padded_offsets.tolist()):
        bd = b[e] * np.array([[sf_at(sfb, e, j, kk // vec) for kk in range(k)] for j in range(n)])
        for m in range(start, end):
            ad = a[m] * np.array([sf_at(p.sfa_tensor, 0, m, kk // vec) for kk in range(k)])
            for j in range(n):
                out[m, j] = math.fsum(ad * bd[j])
        start = end
    return out


def row_expert(offsets) -> np.ndarray:
    return np.repeat(np.arange(len(offsets)), np.diff(np.concatenate([[0], offsets])))


def e8m0_up(s: float, sat: bool) -> int:
    if math.isnan(s):
        return 0xFF
    if s == 0:
        return 0
    if math.isinf(s):
        return 0xFE if sat else 0xFF
    mant, exp = math.frexp(abs(s))
    c = exp - (mant == 0.5)
    return (0xFE if sat else 0xFF) if c > 127 else max(c, -127) + 127


def loop_sfd(x: np.ndarray, nc: float, rl: float, assoc: str, clamp: str, scale_sat: bool, store_sat: bool):
    """Scalar SFD rules per 32-element block of each row: (scaled values, stored bytes)."""
    nc, rl = np.float32(nc), np.float32(rl)
    y = np.zeros_like(x)
    stored = np.zeros((x.shape[0], -(-x.shape[1] // 32)), np.uint8)
    for i in range(x.shape[0]):
        for j in range(stored.shape[1]):
            blk = x[i, 32 * j : 32 * j + 32]
            a = np.float32(max(abs(float(v)) for v in blk))
            s = np.float32(np.float32(a * rl) * nc) if assoc == "a_rl_nc" else np.float32(a * np.float32(rl * nc))
            byte = e8m0_up(float(s), scale_sat)
            stored[i, j] = e8m0_up(float(s), store_sat)
            q = math.nan if byte == 0xFF else 2.0 ** (byte - 127)
            r = math.inf if q < 2.0**-126 else (0.0 if 1 / q < 2.0**-126 else 1 / q)
            flt_max = float(np.finfo(np.float32).max)
            if clamp == "after":
                scale = min(float(np.float32(nc * np.float32(r))), flt_max)
            else:
                scale = float(nc * np.float32(min(r, flt_max)))
            for t, v in enumerate(blk):
                y[i, 32 * j + t] = np.float32(v * np.float32(scale))
    return y, stored


def sat_cast(y: np.ndarray, name: str) -> np.ndarray:
    top = {"float8_e4m3fn": 448.0, "float8_e5m2": 57344.0, "float4_e2m1fn_x2": 6.0}[name]
    target = ml_dtypes.float4_e2m1fn if name == "float4_e2m1fn_x2" else getattr(ml_dtypes, name)
    return np.clip(y, -top, top).astype(target).astype(np.float32)


def check_sfd(out, x, p, name, rule, rl):
    """Compare D / D_col / SFD bytes of ``out`` with the loop rules applied to ``x``."""
    nc = float(p.norm_const_tensor[0])
    y_row, b_row = loop_sfd(x, nc, rl, "a_rl_nc", "after", *rule)
    col_assoc, col_clamp = ("a_rl_nc", "after") if rule == (False, False) else ("a_rlnc", "before")
    y_col, b_col = loop_sfd(np.ascontiguousarray(x.T), nc, rl, col_assoc, col_clamp, *rule)
    kind = "float4_e2m1fn_x2" if name == "float4_e2m1fn_x2" else name
    got_d = F.to_float32(out["d_tensor"], kind) if kind == "float4_e2m1fn_x2" else f32(out["d_tensor"])
    got_dc = F.to_float32(out["d_col_tensor"], kind) if kind == "float4_e2m1fn_x2" else f32(out["d_col_tensor"])
    vm = p.valid_m
    assert np.array_equal(got_d[:vm], sat_cast(y_row, name), equal_nan=True)
    assert np.array_equal(got_dc[:vm], sat_cast(y_col, name).T, equal_nan=True)
    assert np.array_equal(F.unpack_sf(codes(out["sfd_row_tensor"]), vm, b_row.shape[1])[:, :, 0], b_row)
    assert np.array_equal(F.unpack_sf(codes(out["sfd_col_tensor"]), x.shape[1], vm // 32)[:, :, 0], b_col)


@pytest.fixture(scope="module")
def fp8_problem():
    return make_grouped_problem(
        "grouped_gemm_quant", num_experts=3, tokens=[300, 0, 100], n=64, k=64, layout="canonical",
        pad_rows="random", seed=11, norm_const=0.37,
    )


@pytest.fixture(scope="module")
def fp8_acc(fp8_problem):
    return loop_acc(fp8_problem)


def test_loop_accumulator_matches_reference_exactly(fp8_problem, fp8_acc):
    out = R.grouped_gemm_quant(**fp8_problem.kwargs(d_dtype="bfloat16", sf_vec_size=32, prob_tensor=None),
                               acc_dtype="float64", generate_amax=True)
    alpha = fp8_problem.alpha_tensor[row_expert(fp8_problem.padded_offsets)][:, None]
    assert np.array_equal(f32(out["d_tensor"]), (fp8_acc * alpha).astype(BF16).astype(np.float32))
    fast = R.grouped_gemm_quant(**fp8_problem.kwargs(d_dtype="bfloat16", prob_tensor=None))
    assert np.allclose(f32(fast["d_tensor"]), f32(out["d_tensor"]), rtol=2**-7, atol=0)


@pytest.mark.parametrize("d_dtype", ["float8_e4m3fn", "float8_e5m2", "float4_e2m1fn_x2"])
def test_quant_loop_formula_with_sfd(fp8_problem, fp8_acc, d_dtype):
    p = fp8_problem
    bias = (np.arange(64 * 3, dtype=np.float32).reshape(64, 3) % 7 - 3).astype(BF16)
    out = R.grouped_gemm_quant(**p.kwargs(d_dtype=d_dtype, bias_tensor=bias, discrete_col_sfd=False),
                               acc_dtype="float64")
    rows = row_expert(p.padded_offsets)
    x = np.empty_like(fp8_acc)
    for m in range(p.valid_m):
        e, prob = rows[m], np.float32(p.prob_tensor[m])
        for j in range(64):
            x[m, j] = np.float32(float(fp8_acc[m, j]) * float(p.alpha_tensor[e])
                                 + float(np.float32(prob * np.float32(f32(bias[j, e])))))
    rl = {"float8_e4m3fn": 1 / 448, "float8_e5m2": 1 / 57344, "float4_e2m1fn_x2": 1 / 6}[d_dtype]
    check_sfd(out, x, p, d_dtype, (False, False), rl)


def test_srelu_loop_formula_with_sfd_and_discrete_col(fp8_problem, fp8_acc):
    p = fp8_problem
    kw = p.kwargs(d_dtype="float8_e4m3fn", c_dtype="bfloat16", discrete_col_sfd=True)
    out = R.grouped_gemm_srelu(**kw, acc_dtype="float64")
    rows = row_expert(p.padded_offsets)
    c = np.empty_like(fp8_acc)
    x = np.empty_like(fp8_acc)
    for m in range(p.valid_m):
        for j in range(64):
            c[m, j] = np.float32(fp8_acc[m, j] * p.alpha_tensor[rows[m]])
            r = max(c[m, j], np.float32(0))
            x[m, j] = np.float32(np.float32(r * r) * p.prob_tensor[m])
    assert np.array_equal(f32(out["c_tensor"])[: p.valid_m], c.astype(BF16).astype(np.float32))
    nc = float(p.norm_const_tensor[0])
    y, b_row = loop_sfd(x, nc, 1 / 448, "a_rl_nc", "after", True, False)
    assert np.array_equal(f32(out["d_tensor"])[: p.valid_m], sat_cast(y, "float8_e4m3fn"))
    _, b_col = loop_sfd(np.ascontiguousarray(x.T), nc, 1 / 448, "a_rlnc", "before", True, False)
    got_col = F.unpack_sf_discrete_col(codes(out["sfd_col_tensor"]), 64, p.valid_m, p.padded_offsets)
    assert np.array_equal(got_col, b_col)
    assert np.array_equal(F.unpack_sf(codes(out["sfd_row_tensor"]), p.valid_m, 2)[:, :, 0], b_row)


def test_grouped_gemm_loop_formula_random():
    p = make_grouped_problem("grouped_gemm", num_experts=2, tokens=[256, 200], n=24, k=40, layout="canonical",
                             pad_rows="random", seed=3, bias=True)
    out = R.grouped_gemm(**p.kwargs(generate_c=True, c_dtype="float32", d_dtype="float16"), acc_dtype="float64")
    a, b = p.a_tensor.astype(np.float64), p.b_tensor.astype(np.float64)
    rows = row_expert(p.padded_offsets)
    for m in range(0, p.valid_m, 7):
        e = rows[m]
        for j in range(24):
            g = np.float32(np.float32(math.fsum(a[m] * b[e, j])) * p.alpha_tensor[e])
            cval = np.float32(g + np.float32(p.prob_tensor[m] * np.float32(f32(p.bias_tensor[j, e]))))
            assert out["c_tensor"][m, j] == cval and out["d_tensor"][m, j] == np.float16(cval)


def test_dswiglu_loop_formula_random_fp8_and_fp4():
    for ab, d_dtype in [("float8_e4m3fn", "float8_e4m3fn"), ("float4_e2m1fn_x2", "bfloat16")]:
        p = make_grouped_problem("grouped_gemm_dswiglu", num_experts=2, tokens=[100, 256], n=64, k=64,
                                 layout="canonical", ab_dtype=ab, d_dtype=d_dtype, seed=5, pad_rows="random")
        out = R.grouped_gemm_dswiglu(**p.kwargs(), acc_dtype="float64")
        acc = loop_acc(p)
        rows = row_expert(p.padded_offsets)
        c = f32(p.c_tensor)
        d = np.empty((p.valid_m, 128), np.float32)
        dprob = np.zeros(p.valid_m)
        for m in range(p.valid_m):
            e = rows[m]
            for j in range(64):
                blk, lane = divmod(j, 32)
                r = np.float32(np.float32(p.alpha_tensor[e] * p.alpha_tensor[e]) * acc[m, j])
                g = np.float32(p.beta_tensor[e] * c[m, 64 * blk + lane])
                u = np.float32(p.beta_tensor[e] * c[m, 64 * blk + 32 + lane])
                sig = np.float32(1 / (1 + math.exp(-float(g))))
                swish = np.float32(g * sig)
                rp = np.float32(r * p.prob_tensor[m])
                d[m, 64 * blk + 32 + lane] = np.float32(rp * swish)
                one = np.float32(1)
                d[m, 64 * blk + lane] = np.float32(np.float32(np.float32(rp * u) * sig)
                                                   * np.float32(one + np.float32(g * np.float32(one - sig))))
                dprob[m] += float(swish) * float(u) * float(r)
        assert np.allclose(out["dprob_tensor"][: p.valid_m], dprob, rtol=1e-6, atol=1e-6)
        if d_dtype == "bfloat16":
            assert np.array_equal(f32(out["d_row_tensor"])[: p.valid_m], d.astype(BF16).astype(np.float32))
            amax = out["amax_tensor"][:, :, 0]
            gate_pos = np.concatenate([np.arange(0, 32), np.arange(64, 96)])
            assert amax[0, 0] == np.abs(d[:256, gate_pos]).max() and amax[0, 1] == np.abs(d[:256, gate_pos + 32]).max()
        else:
            y, b_row = loop_sfd(d, float(p.norm_const_tensor[0]), 1 / 448, "a_rl_nc", "after", True, True)
            assert np.array_equal(f32(out["d_row_tensor"])[: p.valid_m], sat_cast(y, d_dtype))
            assert np.array_equal(F.unpack_sf(codes(out["sfd_row_tensor"]), p.valid_m, 4)[:, :, 0], b_row)


def test_gemm_amax_loop_formula_random():
    p = make_batched_problem(m=130, n=40, k=64, batch=2, ab_dtype="float4_e2m1fn_x2", sf_vec_size=16,
                             c_dtype="bfloat16", a_major="k", seed=9)
    c, amax = R.gemm_amax(**p.kwargs(c_dtype="float32"), acc_dtype="float64")
    a = decode_ab(np.transpose(p.a_tensor, (2, 0, 1)), True)
    b = decode_ab(np.transpose(p.b_tensor, (2, 0, 1)), True)
    sfa, sfb = F.sf_from_kernel_view(p.sfa_tensor), F.sf_from_kernel_view(p.sfb_tensor)
    best = -math.inf
    for l in range(2):
        for m in range(0, 130, 3):
            ad = a[l, m] * np.array([sf_at(sfa, l, m, kk // 16) for kk in range(64)])
            for j in range(40):
                bd = b[l, j] * np.array([sf_at(sfb, l, j, kk // 16) for kk in range(64)])
                assert c[m, j, l] == np.float32(math.fsum(ad * bd))
    assert amax[0, 0, 0] == np.abs(c).max()


# ---------------------------------------------------------------- properties


@pytest.mark.parametrize("d_dtype,rel,half_sub,top", [
    ("float8_e4m3fn", 2**-4, 2**-10, 448), ("float8_e5m2", 2**-3, 2**-17, 57344),
    ("float4_e2m1fn_x2", 2**-2, 0.25, 6)])
def test_sfd_dequant_approximates_norm_const_times_d(d_dtype, rel, half_sub, top):
    p = make_grouped_problem("grouped_gemm_quant", num_experts=4, tokens=900, n=96, k=64, values="realistic",
                             skew="skewed", seed=2, norm_const=0.37)
    vm = p.valid_m
    # x = alpha * acc * prob from the public helpers, accumulated in float64
    a = F.dequantize_blockwise(p.a_tensor[:, :, 0], F.unpack_sf(p.sfa_tensor, vm, 2)[:, :, 0], sf_vec_size=32)
    sfb = F.unpack_sf(p.sfb_tensor, 96, 2, batch_first=True)
    x = np.zeros((vm, 96))
    for e, (start, end) in enumerate(zip([0, *p.padded_offsets[:-1]], p.padded_offsets)):
        b = F.dequantize_blockwise(F.b_from_kernel(p.b_tensor)[e], sfb[e], sf_vec_size=32)
        x[start:end] = a[start:end].astype(np.float64) @ b.T * p.alpha_tensor[e] * p.prob_tensor[start:end, 0]
    out = R.grouped_gemm_quant(**p.kwargs(d_dtype=d_dtype))
    q = F.unpack_sf(out["sfd_row_tensor"], vm, 3)[:, :, 0].astype(np.float32)
    q_elem = np.repeat(q, 32, axis=1)
    d = F.to_float32(out["d_tensor"][:, :, 0], d_dtype)[:vm] if d_dtype.startswith("float4") else f32(out["d_tensor"][:vm, :, 0])
    target = 0.37 * x
    # the format's half-ulp bounds the error (plus float32 accumulation and scaling slack)
    assert np.all(np.abs(d * q_elem - target) <= np.abs(target) * (rel + 2**-10) + half_sub * q_elem)
    # scale rounded up: SFD >= nc * amax_block * rcp_max > SFD / 2, so no block saturates
    amax_block = np.abs(target).reshape(vm, 3, 32).max(-1)
    wanted = amax_block / top
    live = wanted > 2.0**-126
    assert np.all(q[live] >= wanted[live] * (1 - 2**-9)) and np.all(q[live] / 2 < wanted[live] * (1 + 2**-9))


def test_amax_padding_rows_count_and_nan_propagates():
    base = hand_fp8_problem()
    a = f32(base["a_tensor"][:, :, 0])
    a[200, 0] = 4  # a padding row of expert 0 (no token there, but inside its range)
    out = R.grouped_gemm_quant(**dict(base, a_tensor=a.astype(E4M3)[:, :, None]))
    assert out["amax_tensor"][0, 0] == 24  # row 200: 1 * 4 * 3 * 2 (prob 1)
    a[1, 5] = np.nan
    out = R.grouped_gemm_quant(**dict(base, a_tensor=a.astype(E4M3)[:, :, None]))
    assert np.isnan(out["amax_tensor"][0, 0]) and out["amax_tensor"][2, 0] == 12


def test_kernel_canonical_torch_and_discrete_inputs_agree():
    kw = dict(num_experts=3, tokens=[300, 0, 180], n=64, k=128, seed=4, ab_dtype="float4_e2m1fn_x2",
              sf_vec_size=32, sf_dtype="float8_e8m0fnu")
    kernel = make_grouped_problem("grouped_gemm_srelu", **kw)
    canon = make_grouped_problem("grouped_gemm_srelu", layout="canonical", **kw)
    discrete = make_grouped_problem("grouped_gemm_srelu", discrete=True, **kw)
    r1 = R.grouped_gemm_srelu(**kernel.kwargs(d_dtype="float32"))
    r2 = R.grouped_gemm_srelu(**canon.kwargs(d_dtype="float32"))
    r3 = R.grouped_gemm_srelu(**discrete.kwargs(d_dtype="float32"))
    assert np.array_equal(r1["d_tensor"][:, :, 0], r2["d_tensor"]) and np.array_equal(r1["d_tensor"], r3["d_tensor"])
    torch = pytest.importorskip("torch")
    tk = {k: (torch.from_numpy(np.array(v)) if isinstance(v, np.ndarray) and v.dtype != np.dtype(E8M0) else v)
          for k, v in canon.kwargs(d_dtype="float32").items()}
    tk["sfa_tensor"] = torch.from_numpy(codes(canon.sfa_tensor).copy()).view(torch.float8_e8m0fnu)
    tk["sfb_tensor"] = torch.from_numpy(codes(canon.sfb_tensor).copy()).view(torch.float8_e8m0fnu)
    r4 = R.grouped_gemm_srelu(**tk)
    assert np.array_equal(r4["d_tensor"], r2["d_tensor"])


def test_many_experts_and_empty_ones():
    p = make_grouped_problem("grouped_gemm_quant", num_experts=1024, tokens=3000, n=32, k=32,
                             skew="with_empty", seed=1)
    out = R.grouped_gemm_quant(**p.kwargs())
    empty = np.array(p.tokens) == 0
    assert empty.sum() >= 256 and np.all(out["amax_tensor"][empty, 0] == NEG_INF)
    assert np.all(np.isfinite(out["amax_tensor"][~empty, 0]))


@pytest.mark.parametrize("op", ["grouped_gemm", "grouped_gemm_srelu", "grouped_gemm_quant", "grouped_gemm_dswiglu"])
def test_all_experts_empty(op):
    p = make_grouped_problem(op, num_experts=2, tokens=0, n=64, k=64)
    quantized = {} if op in ("grouped_gemm", "grouped_gemm_dswiglu") else {"d_dtype": "float8_e4m3fn"}
    out = getattr(R, op)(**p.kwargs(**quantized))
    assert out[0].shape[0] == 0
    fp4 = make_grouped_problem(op, num_experts=2, tokens=0, n=64, k=64,
                               ab_dtype=None if op == "grouped_gemm" else "float4_e2m1fn_x2")
    amax = getattr(R, op)(**fp4.kwargs()).get("amax_tensor")
    assert amax is None or np.all(amax == NEG_INF)


# ---------------------------------------------------------------- errors


def test_errors_name_argument_value_and_allowed():
    """Seed rules (fusegemm.arguments, shared with the ops) and reference options."""
    base = hand_fp8_problem()
    cases = [
        (dict(padded_offsets=np.array([100, 256, 512], np.int32)),
         r"^padded_offsets\[0\]: got 100; allowed: nondecreasing multiples of 256 \(previous end 0\)$"),
        (dict(padded_offsets=np.array([512, 256, 512], np.int32)),
         r"^padded_offsets\[1\]: got 256; allowed: nondecreasing multiples of 256 \(previous end 512\)$"),
        (dict(padded_offsets=np.array([256, 512, 1024], np.int32)),
         r"^padded_offsets\[-1\]: got 1024; allowed: <= 768 \(rows of a_tensor\)$"),
        (dict(padded_offsets=np.array([256, 512, 768], np.float32)),
         r"^padded_offsets\.dtype: got float32; allowed: int32, int64$"),
        (dict(padded_offsets=np.zeros(0, np.int32)),
         r"^padded_offsets\.shape: got \(0,\); allowed: \(L,\) with 1 <= L <= 1024$"),
        (dict(a_tensor=np.zeros((700, 32, 1), E4M3)),
         r"^a_tensor\.shape\[0\]: got 700; allowed: a multiple of 256 \(padded rows\)$"),
        (dict(a_tensor=np.zeros((768, 32, 2), E4M3)), r"^a_tensor\.shape: got \(768, 32, 2\); allowed: \(M, K, 1\) or \(M, K\)$"),
        (dict(d_dtype="float32"), r"^d_dtype: got 'float32'; allowed: float16, bfloat16, float8_e4m3fn, float8_e5m2, "
                                  r"float4_e2m1fn_x2, uint8 \(with FP8 A/B\)$"),
        (dict(d_dtype="float8_e4m3fn"), r"^norm_const_tensor: got None; allowed: a \(1,\) float32 tensor\. It is required "
                                        r"when FP8 A/B produce an FP8/FP4 D \(SFD outputs\), e\.g\. "),
        (dict(d_dtype="float8_e4m3fn", norm_const_tensor=np.ones(2, np.float32)),
         r"^norm_const_tensor\.shape: got \(2,\); allowed: \(1,\) or \(1, 1, 1\)$"),
        (dict(b_ptrs=np.zeros(3, np.int64)), r"^b_ptrs: got device pointers; allowed: None \(the host reference cannot "
                                             r"read device memory\)\. Pass the per-expert arrays as b_list instead$"),
        (dict(alpha_tensor=np.ones(2, np.float32)),
         r"^alpha_tensor\.shape: got \(2,\); allowed: \(3,\) or \(3, 1, 1\) \(one scale per expert\)$"),
        (dict(alpha_tensor=np.ones(3, np.float16)), r"^alpha_tensor\.dtype: got float16; allowed: float32$"),
        (dict(prob_tensor=np.ones(768, np.float64)), r"^prob_tensor\.dtype: got float64; allowed: float32$"),
        (dict(prob_tensor=np.ones(512, np.float32)),
         r"^prob_tensor\.shape: got \(512,\); allowed: \(768,\) or \(768, 1, 1\) \(one gate per row\)$"),
        (dict(row_scale_tensor=np.ones((768, 2), np.float32)),
         r"^row_scale_tensor\.shape: got \(768, 2\); allowed: \(768,\) or \(768, 1, 1\) \(one factor per row\)$"),
        (dict(bias_tensor=np.zeros((3, 32), np.float32)), r"^bias_tensor\.shape: got \(3, 32\); allowed: \(32, 3\) = \(N, L\)$"),
        (dict(bias_tensor=np.zeros((32, 3), np.int32)), r"^bias_tensor\.dtype: got int32; allowed: bfloat16, float16, float32$"),
        (dict(m_aligned=128), r"^m_aligned: got 128; allowed: 256$"),
        (dict(cd_major="m"), r"^cd_major: got 'm'; allowed: 'n'$"),
        (dict(acc_dtype="float16"), r"^acc_dtype: got 'float16'; allowed: float32, float64$"),
        (dict(acc_dtype=np.float16), r"^acc_dtype: got 'float16'; allowed: float32, float64$"),
        (dict(e5m2_rcp_max="exact"), r"^e5m2_rcp_max: got 'exact'; allowed: 'page', 'nvidia'$"),
        (dict(b_tensor=np.zeros((32, 16, 3), E4M3)),
         r"^b_tensor\.shape: got \(32, 16, 3\); allowed: \(N, 32, 3\) \(kernel-facing\) or \(3, N, 32\) \(canonical\), "
         r"with K from a_tensor and L from padded_offsets$"),
    ]
    for change, message in cases:
        with pytest.raises(ArgumentError, match=message):
            R.grouped_gemm_quant(**dict(base, **change))
    # block-format combinations keep the format helpers' explanation (fusegemm.formats.blockscale)
    with pytest.raises(ValueError, match=r"^sf_vec_size=16 is not allowed with ab_dtype='float8_e4m3fn'; FP8 "
                                         r"elements \(MXFP8\) need sf_vec_size=32$"):
        R.grouped_gemm_quant(**dict(base, sf_vec_size=16))
    with pytest.raises(ArgumentError, match=r"^prob_tensor: got None; allowed: a \(768,\) or \(768, 1, 1\) float32 "
                                            r"tensor\. The kernel multiplies by the per-row gating probability; "
                                            r"pass ones of shape \(768, 1, 1\) for no gating$"):
        R.grouped_gemm_srelu(**dict(base, prob_tensor=None))
    with pytest.raises(ArgumentError, match=r"^tanh_clamp_scale: got -1\.0; allowed: None or a positive finite float$"):
        R.grouped_gemm_srelu(**base, tanh_clamp_scale=-1.0)
    with pytest.raises(ArgumentError, match=r"^a_tensor\.dtype: got float8_e4m3fn; allowed: bfloat16$"):
        R.grouped_gemm(a_tensor=base["a_tensor"], padded_offsets=base["padded_offsets"],
                       alpha_tensor=base["alpha_tensor"], b_tensor=base["b_tensor"])
    with pytest.raises(ArgumentError, match=r"^padded_offsets: got None; allowed: a tensor\. padded_offsets is required$"):
        R.grouped_gemm_srelu(**dict(base, padded_offsets=None))


def test_reference_only_rules_name_argument_value_and_allowed():
    """Rules of the host reference itself: per-expert lists, pointers, scale buffers, options."""
    base = hand_fp8_problem()
    b_list = [np.zeros((32, 32), E4M3)] * 3
    sfb_list = [e8m0_sf(np.full((32, 1), 127))] * 3
    cases = [
        (dict(b_tensor=None), r"^b_tensor/b_list: got neither; allowed: exactly one of b_tensor \(dense weights\) and "
                              r"b_list \(one \(N, K\) array per expert\)$"),
        (dict(b_list=b_list), r"^b_tensor/b_list: got both; allowed: exactly one of b_tensor"),
        (dict(b_tensor=None, b_list=b_list[:2]), r"^len\(b_list\): got 2; allowed: 3 \(L, the length of padded_offsets\)$"),
        (dict(b_tensor=None, b_list=[np.zeros((32, 16), E4M3)] * 3),
         r"^b_list\[0\]\.shape: got \(32, 16\); allowed: \(N, 32\) with K from a_tensor$"),
        (dict(b_tensor=None, b_list=b_list[:2] + [np.zeros((64, 32), E4M3)]),
         r"^b_list\[2\]\.shape: got \(64, 32\); allowed: \(32, 32\), as b_list\[0\]$"),
        (dict(b_tensor=None, b_list=b_list[:1] + [np.zeros((32, 32), ml_dtypes.float8_e5m2)] * 2),
         r"^b_list\[1\]\.dtype: got float8_e5m2; allowed: float8_e4m3fn \(the dtype of a_tensor\)$"),
        (dict(b_tensor=np.zeros((32, 32, 3), ml_dtypes.float8_e5m2)),
         r"^b_tensor\.dtype: got float8_e5m2; allowed: float8_e4m3fn \(the dtype of a_tensor\)$"),
        (dict(sfb_ptrs=np.zeros(3, np.int64)), r"^sfb_ptrs: got device pointers; allowed: None \(the host reference "
                                               r"cannot read device memory\)\. Pass the per-expert arrays as sfb_list instead$"),
        (dict(sfb_list=sfb_list), r"^sfb_tensor/sfb_list: got both; allowed: exactly one of sfb_tensor \(dense\) and "
                                  r"sfb_list \(one SF buffer per expert\)$"),
        (dict(sfb_tensor=None, sfb_list=sfb_list[:2]), r"^len\(sfb_list\): got 2; allowed: 3 \(L, the length of padded_offsets\)$"),
        (dict(sfa_tensor=None), r"^sfa_tensor: got None; allowed: a tensor\. sfa_tensor is required for block-scaled "
                                r"A/B \(float8_e4m3fn\)$"),
        (dict(sfa_tensor=np.zeros(10, np.uint8)),
         r"^sfa_tensor\.shape: got \(10,\); allowed: the kernel-facing view \(32, 4, 6, 4, 1, 1\), the physical buffer "
         r"\(1, 6, 1, 32, 4, 4\) or a flat \(3072,\) buffer \(scales of mn=768, sfk=1, L=1\)$"),
        (dict(sfa_tensor=np.zeros(3072, np.float32)),
         r"^sfa_tensor\.dtype: got float32; allowed: float8_e8m0fnu, float8_e4m3fn, uint8, int8$"),
        (dict(sfb_tensor=np.zeros(base["sfb_tensor"].shape, E4M3)),
         r"^sfb_tensor\.dtype: got float8_e4m3fn; allowed: float8_e8m0fnu \(the scale type of sfa_tensor\)$"),
        (dict(b_dtype="float8_e5m2"), r"^b_dtype: got 'float8_e5m2'; allowed: None or float8_e4m3fn \(the dtype of the weights\)$"),
        (dict(b_major="m"), r"^b_major: got 'm'; allowed: 'k', 'n' \(with float8_e4m3fn weights\)$"),
        (dict(n=64), r"^n: got 64; allowed: None or 32 \(the weights' N\)$"),
    ]
    for change, message in cases:
        with pytest.raises(ArgumentError, match=message):
            R.grouped_gemm_quant(**dict(base, **change))
    # int64 offsets and the per-expert lists are host conveniences the reference accepts
    sfb_codes = np.full((3, 32, 1), 127)
    sfb_codes[0, 0, 0] = 128  # as hand_fp8_problem
    listed = dict(base, b_tensor=None, b_list=[F.b_from_kernel(base["b_tensor"])[e] for e in range(3)],
                  sfb_tensor=None, sfb_list=[e8m0_sf(sfb_codes[e]) for e in range(3)],
                  padded_offsets=base["padded_offsets"].astype(np.int64))
    assert np.array_equal(f32(R.grouped_gemm_quant(**listed)[0]), f32(R.grouped_gemm_quant(**base)[0]))


def test_dswiglu_and_gemm_amax_errors():
    a, b, offsets = dswiglu_problem()
    b = np.zeros((2, 48, 32), np.float32)
    with pytest.raises(ArgumentError, match=r"^b_tensor N: got 48; allowed: a multiple of 32\. dSwiGLU interleaves "
                                            r"32-column gate/up blocks$"):
        run_dswiglu(a, b, offsets, np.zeros((512, 96)), alpha=[1, 1], beta=[1, 1], prob=np.ones(512))
    a, b, offsets = dswiglu_problem()
    with pytest.raises(ArgumentError, match=r"^c_tensor\.shape: got \(512, 64, 1\); allowed: \(512, 128, 1\) = "
                                            r"\(M, 2N\) or \(M, 2N, 1\)$"):
        run_dswiglu(a, b, offsets, np.zeros((512, 64)), alpha=[1, 1], beta=[1, 1], prob=np.ones(512))
    with pytest.raises(ArgumentError, match=r"^beta_tensor\.shape: got \(3,\); allowed: \(2,\) or \(2, 1, 1\) "
                                            r"\(one scale per expert\)$"):
        run_dswiglu(a, b, offsets, np.zeros((512, 128)), alpha=[1, 1], beta=[1, 1, 1], prob=np.ones(512))
    with pytest.raises(ArgumentError, match=r"^epilogue_op: got 'gelu'; allowed: None, 'none', 'identity', 'relu', "
                                            r"'srelu'$"):
        R.grouped_gemm_dswiglu(None, None, None, None, None, None, None, None, None, epilogue_op="gelu")
    p = make_batched_problem(m=128, n=128, k=64)
    with pytest.raises(ArgumentError, match=r"^c_dtype: got 'float8_e4m3fn'; allowed: float32, float16, bfloat16 "
                                            r"\(with FP8 A/B\)\. FP8 and FP4 C need FP4 A/B, as on the GPU$"):
        R.gemm_amax(**p.kwargs(c_dtype="float8_e4m3fn"))
    with pytest.raises(ArgumentError, match=r"^c_major: got 'k'; allowed: 'm', 'n'$"):
        R.gemm_amax(**p.kwargs(), c_major="k")
    with pytest.raises(ArgumentError, match=r"^b_tensor\.shape: got \(128, 32, 1\); allowed: \(N, 64, 1\) or "
                                            r"\(N, 64\) \(K and L from a_tensor\)$"):
        R.gemm_amax(**p.kwargs(b_tensor=np.zeros((128, 32, 1), E4M3)))
    with pytest.raises(ArgumentError, match=r"^b_tensor\.dtype: got float8_e5m2; allowed: float8_e4m3fn "
                                            r"\(the dtype of a_tensor\)$"):
        R.gemm_amax(**p.kwargs(b_tensor=np.zeros((128, 64, 1), ml_dtypes.float8_e5m2)))
    with pytest.raises(ArgumentError, match=r"^a_tensor\.shape: got \(128, 64, 1, 1\); allowed: 2-D or 3-D tensor$"):
        R.gemm_amax(**p.kwargs(a_tensor=np.zeros((128, 64, 1, 1), E4M3)))
    fp4 = make_batched_problem(m=128, n=128, k=64, ab_dtype="float4_e2m1fn_x2")
    with pytest.raises(ArgumentError, match=r"^c_major: got 'm'; allowed: 'n' \(with an FP4 C\)\. Packed FP4 C holds "
                                            r"two elements per byte along N$"):
        R.gemm_amax(**fp4.kwargs(c_dtype="float4_e2m1fn_x2"), c_major="m")


# ---------------------------------------------------------------- speed


@pytest.mark.slow
def test_large_grouped_bf16_runs_under_60_seconds():
    p = make_grouped_problem("grouped_gemm", num_experts=8, tokens=16384, n=4096, k=7168)
    start = time.perf_counter()
    out = R.grouped_gemm(**p.kwargs(generate_c=True))
    elapsed = time.perf_counter() - start
    print(f"\n16384 x 4096 x 7168 grouped BF16 reference: {elapsed:.1f} s")
    assert out["d_tensor"].shape == (16384, 4096, 1)
    assert elapsed < 60
