"""dGLU backward on block-scaled operands (spec grouped_gemm_dglu_mx, which
``fusegemm.grouped_gemm_dglu`` runs when ``sfa_tensor`` is given) on the GPU: MXFP8 and the
blockwise recipe, bf16 D with its two-slot amax (dgate, dup) or FP8 D quantized along rows
(SFD_row) and columns (D_col, SFD_col), dprob into the caller's zero-initialised tensor, dbias of
the interleaved D, dense and discrete weights, ragged and empty experts.

Problems are exact up to the sigmoid (small integers, power-of-two scales, alpha and beta: every
product and sum of the GEMM exact in any order, and g, u exact), so the kernel differs from the
numpy interpreter (``Op.reference``) only by the sigmoid's few ulp and the FP32 order of sums:
bf16 D within one bf16 ulp plus 1e-5 of the largest magnitude (compare_outputs); FP8 bytes within
one code (fp8_steps) and equal scale bytes; amax within 2^-10 relative, an empty expert's exactly
-inf; dprob and dbias (FP32 atomic sums of inexact terms in another order) within 2^-12 of the
row's or column's sum of |terms| plus 1e-6; D also against an independent float64 dSwiGLU within
2^-7 of its largest magnitude.
"""
from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

import fusegemm  # noqa: E402
from fusegemm.output_compare import compare_outputs  # noqa: E402

import scaled_problems  # noqa: E402  (tests/gpu/scaled_problems.py)

SPEC = "grouped_gemm_dglu_mx"


def _problem(sizes, n, k, recipe, seed):
    rng = np.random.default_rng(seed)
    m, l = sum(sizes), len(sizes)
    host, per_expert_sfb, a64, b64 = scaled_problems.operands(sizes, n, k, recipe, rng)
    ins = {"alpha": torch.from_numpy(np.exp2(rng.integers(-1, 2, l)).astype(np.float32)),
           "beta": torch.from_numpy(np.exp2(rng.integers(-1, 2, l)).astype(np.float32)),
           "prob": torch.from_numpy(rng.integers(1, 5, m).astype(np.float32) / 4),
           "c": torch.from_numpy(rng.integers(-8, 9, (m, 2 * n)).astype(np.float32) / 4).to(torch.bfloat16),
           "norm_const": torch.ones(1)}
    return host, ins, a64, b64, per_expert_sfb


def _run(sizes, n, k, recipe, *, d_dtype="bfloat16", discrete=False, tile_n=256, seed=0, **axes):
    host, ins, a64, b64, per_sfb = _problem(sizes, n, k, recipe, seed)
    vec = 32 if recipe == "mx" else 128
    dev, keep = scaled_problems.on_device(host, per_sfb, n, discrete)
    dprob = torch.zeros(sum(sizes), device="cuda")
    got = fusegemm.grouped_gemm_dglu(
        dev["a_tensor"], ins["c"].cuda(), dev["sfa_tensor"], dev["padded_offsets"], ins["alpha"].cuda(),
        ins["beta"].cuda(), ins["prob"].cuda(), dprob, dev.get("b_tensor"), dev.get("sfb_tensor"),
        b_ptrs=dev.get("b_ptrs"), sfb_ptrs=dev.get("sfb_ptrs"), n=dev.get("n"),
        norm_const_tensor=ins["norm_const"].cuda(), d_dtype=getattr(torch, d_dtype), sf_vec_size=vec,
        mma_tiler_mn=(128, tile_n), **axes)
    torch.cuda.synchronize()
    del keep
    assert got["dprob_tensor"] is dprob
    recipe_axes = {"sf_dtype": "float8_e8m0fnu", "sf_vec_size": 32} if recipe == "mx" else \
        {"sf_dtype": "float32", "sf_vec_size": 128}
    op = fusegemm.Op(SPEC, **recipe_axes, d_dtype=d_dtype, tile_n=tile_n,
                     **{k: v for k, v in axes.items() if k in ("generate_dbias", "discrete_col_sfd")})
    ref = op.reference(*(host[k] for k in ("a_tensor", "sfa_tensor", "padded_offsets", "b_tensor", "sfb_tensor")),
                       inputs=ins)
    return got, ref, ins, a64, b64


def _dglu64(a64, b64, sizes, ins):
    """(D (M, 2N) interleaved as stored, dprob's |terms| summed per row, dbias's per column (L, 2N)) in
    float64: R = alpha^2 A_e B_e^T; g, u = beta * C's even / odd 32-column blocks, s = sigmoid(g);
    dgate = R p u s (1 + g (1 - s)), dup = R p g s."""
    n = b64.shape[1]
    j = np.arange(n)
    gate_col, up_col = (j // 32) * 64 + j % 32, (j // 32) * 64 + 32 + j % 32
    c = ins["c"].double().numpy()
    prob = ins["prob"].double().numpy()[:, None]
    d, dprob_terms, dbias_terms, start = [], [], [], 0
    for e, rows in enumerate(sizes):
        span = slice(start, start + rows)
        r = float(ins["alpha"][e]) ** 2 * (a64[span] @ b64[e].T)
        g, u = float(ins["beta"][e]) * c[span][:, gate_col], float(ins["beta"][e]) * c[span][:, up_col]
        s = 1 / (1 + np.exp(-g))
        de = np.empty((rows, 2 * n))
        de[:, gate_col], de[:, up_col] = r * prob[span] * u * s * (1 + g * (1 - s)), r * prob[span] * g * s
        d.append(de)
        dprob_terms.append(np.abs(g * s * u * r).sum(axis=1))
        dbias_terms.append(np.abs(de).sum(axis=0))
        start += rows
    return np.concatenate(d), np.concatenate(dprob_terms), np.stack(dbias_terms)


def _sums_close(got, want, terms, name):
    """FP32 atomic sums of inexact terms: within 2^-12 of the sum of |terms| (+ 1e-6)."""
    assert got.shape == want.shape == terms.shape, name
    bad = np.abs(got - want) > 2.0 ** -12 * terms + 1e-6
    assert not bad.any(), (name, int(bad.sum()), np.abs(got - want).max())


@pytest.mark.parametrize("recipe,sizes,n,k,tile_n,discrete", [
    ("mx", [256, 0, 512], 256, 320, 256, False),      # an empty expert, a K tail of the 128-K stage
    ("mx", [512, 256], 384, 256, 128, True),           # discrete weights, tile N 128
    ("blockwise", [256, 0, 512], 320, 384, 256, False),   # an N tail of the 256-column tile
])
def test_bf16_d_dprob_dbias_and_amax(recipe, sizes, n, k, tile_n, discrete):
    got, ref, ins, a64, b64 = _run(sizes, n, k, recipe, discrete=discrete, tile_n=tile_n, generate_dbias=True)
    valid = sum(sizes)
    d = got["d_row_tensor"].float().cpu().numpy()
    assert d.shape == (valid, 2 * n) and got["sfd_row_tensor"] is None and got["d_col_tensor"] is None
    err, problem = compare_outputs({"d": np.asarray(ref["d"])[:valid]}, {"d": d}, exact=False, rtol=1e-5)
    assert problem is None, (problem, err)
    want, dprob_terms, dbias_terms = _dglu64(a64, b64, sizes, ins)
    assert np.abs(d - want).max() <= 2 ** -7 * np.abs(want).max()
    dprob = got["dprob_tensor"].double().cpu().numpy()[:valid]
    _sums_close(dprob, np.asarray(ref["dprob"], np.float64).reshape(-1)[:valid], dprob_terms, "dprob")
    dbias = got["dbias_tensor"].double().cpu().numpy().reshape(len(sizes), 2 * n)
    _sums_close(dbias, np.asarray(ref["dbias"], np.float64).reshape(len(sizes), 2 * n), dbias_terms, "dbias")
    if 0 in sizes:
        assert not dbias[sizes.index(0)].any()       # the empty expert's sums stay zero
    amax = got["amax_tensor"]
    assert tuple(amax.shape) == (len(sizes), 2, 1)   # seed 000's layout: [e, 0] dgate, [e, 1] dup
    g = amax.double().cpu().numpy().reshape(-1)
    r = np.asarray(ref["amax"], np.float64).reshape(-1)
    finite = np.isfinite(r)      # an empty expert's amax stays -inf
    assert np.array_equal(np.isfinite(g), finite) and np.array_equal(g[~finite], r[~finite])
    assert np.all(np.abs(g[finite] - r[finite]) <= 2.0 ** -10 * np.abs(r[finite]))


@pytest.mark.parametrize("recipe,discrete_col_sfd", [("mx", False), ("mx", True), ("blockwise", False)])
def test_fp8_d_row_and_column_quantized(recipe, discrete_col_sfd):
    sizes, n, k = [256, 0, 512], 256, 256
    got, ref, ins, a64, b64 = _run(sizes, n, k, recipe, d_dtype="float8_e4m3fn", discrete_col_sfd=discrete_col_sfd,
                                   seed=3)
    valid = sum(sizes)
    assert got["amax_tensor"] is None and got["dbias_tensor"] is None
    pairs = {"d": "d_row_tensor", "d_col": "d_col_tensor", "sfd_row": "sfd_row_tensor", "sfd_col": "sfd_col_tensor"}
    want = {name: np.asarray(ref[name]) for name in pairs}
    have = {name: got[key].cpu() for name, key in pairs.items()}
    want["d"], want["d_col"] = want["d"][:valid], want["d_col"][:valid]
    have["d"] = have["d"].reshape(valid, -1)
    have["d_col"] = have["d_col"].reshape(valid, -1)
    assert tuple(have["d"].shape) == (valid, 2 * n)
    want["sfd_row"], want["sfd_col"] = (np.asarray(w).reshape(-1) for w in (want["sfd_row"], want["sfd_col"]))
    have["sfd_row"], have["sfd_col"] = (h.reshape(-1) for h in (have["sfd_row"], have["sfd_col"]))
    err, problem = compare_outputs(want, have, exact=False, rtol=1e-6, fp8_steps=1)
    assert problem is None, (problem, err)
    _, dprob_terms, _ = _dglu64(a64, b64, sizes, ins)
    dprob = got["dprob_tensor"].double().cpu().numpy()[:valid]
    _sums_close(dprob, np.asarray(ref["dprob"], np.float64).reshape(-1)[:valid], dprob_terms, "dprob")
