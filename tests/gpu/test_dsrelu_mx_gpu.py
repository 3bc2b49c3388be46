"""dsReLU backward on block-scaled operands (spec grouped_gemm_dsrelu_mx, which
``fusegemm.grouped_gemm_dsrelu`` runs when ``sfa_tensor`` is given) on the GPU: MXFP8 and the
blockwise recipe, bf16 D with amax or FP8 D quantized along rows (SFD_row) and columns (D_col,
SFD_col), dprob into the caller's zero-initialised tensor, dbias, dense and discrete weights.

Problems are exact (small integers, power-of-two scales: every product and sum of the GEMM exact
in any order), so the kernel must match the numpy interpreter (``Op.reference``) within one ulp of
bf16 for D (the epilogue's products rounded as the interpreter rounds them), FP8 bytes within one
code (compare_outputs' fp8_steps) with equal scale bytes, dprob and dbias (sums in another order)
within 1e-5 of their magnitude; D also against an independent float64 dsReLU within 2^-7.
"""
from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

import fusegemm  # noqa: E402
from fusegemm.output_compare import compare_outputs  # noqa: E402

import scaled_problems  # noqa: E402  (tests/gpu/scaled_problems.py)

SPEC = "grouped_gemm_dsrelu_mx"


def _problem(sizes, n, k, recipe, seed):
    rng = np.random.default_rng(seed)
    m, l = sum(sizes), len(sizes)
    host, per_expert_sfb, a64, b64 = scaled_problems.operands(sizes, n, k, recipe, rng)
    ins = {"alpha": torch.from_numpy(np.exp2(rng.integers(-1, 2, l)).astype(np.float32)),
           "prob": torch.from_numpy(rng.integers(1, 5, m).astype(np.float32) / 4),
           "c": torch.from_numpy(rng.integers(-8, 9, (m, n)).astype(np.float32) / 4).to(torch.bfloat16),
           "norm_const": torch.ones(1)}
    return host, ins, a64, b64, per_expert_sfb


def _run(sizes, n, k, recipe, *, d_dtype="bfloat16", discrete=False, tile_n=256, seed=0, **axes):
    host, ins, a64, b64, per_sfb = _problem(sizes, n, k, recipe, seed)
    vec = 32 if recipe == "mx" else 128
    dev, keep = scaled_problems.on_device(host, per_sfb, n, discrete)
    dprob = torch.zeros(sum(sizes), device="cuda")
    got = fusegemm.grouped_gemm_dsrelu(
        dev["a_tensor"], dev.get("b_tensor"), ins["c"].cuda(), dev["sfa_tensor"], dev.get("sfb_tensor"),
        dev["padded_offsets"], ins["alpha"].cuda(), ins["prob"].cuda(), dprob, b_ptrs=dev.get("b_ptrs"),
        sfb_ptrs=dev.get("sfb_ptrs"), n=dev.get("n"), norm_const_tensor=ins["norm_const"].cuda(),
        d_dtype=getattr(torch, d_dtype), sf_vec_size=vec, mma_tiler_mn=(128, tile_n), **axes)
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


def _dsrelu64(a64, b64, sizes, ins):
    r = np.maximum(ins["c"].double().numpy(), 0.0)
    prob = ins["prob"].double().numpy()[:, None]
    out, start = [], 0
    for e, rows in enumerate(sizes):
        g = a64[start:start + rows] @ b64[e].T * float(ins["alpha"][e])
        out.append(2 * prob[start:start + rows] * r[start:start + rows] * g)
        start += rows
    return np.concatenate(out)


@pytest.mark.parametrize("recipe,sizes,n,k,tile_n,discrete,dbias", [
    ("mx", [256, 0, 512], 256, 320, 256, False, True),      # an empty expert, a K tail of the 128-K stage
    ("mx", [512, 256], 384, 256, 128, True, True),           # discrete weights, tile N 128
    ("blockwise", [256, 0, 512], 320, 384, 256, False, True),   # an N tail of the 256-column tile
    # without dbias: the build whose two halves share each stage's A (sm90/blockwise_promote.cuh kShareA)
    ("blockwise", [256, 0, 512], 320, 384, 256, False, False),
    ("blockwise", [512, 256], 384, 256, 256, True, False),
])
def test_bf16_d_dprob_dbias_and_amax(recipe, sizes, n, k, tile_n, discrete, dbias):
    got, ref, ins, a64, b64 = _run(sizes, n, k, recipe, discrete=discrete, tile_n=tile_n, generate_dbias=dbias)
    valid = sum(sizes)
    d = got["d_row_tensor"].float().cpu().numpy()
    assert d.shape == (valid, n) and got["sfd_row_tensor"] is None and got["d_col_tensor"] is None
    err, problem = compare_outputs({"d": np.asarray(ref["d"])[:valid]}, {"d": d}, exact=False, rtol=1e-6)
    assert problem is None, (problem, err)
    want = _dsrelu64(a64, b64, sizes, ins)
    assert np.abs(d - want).max() <= 2 ** -7 * np.abs(want).max()
    if not dbias:
        assert got["dbias_tensor"] is None and ref["dbias"] is None
    for name, key in (("dprob", "dprob_tensor"), ("dbias", "dbias_tensor"), ("amax", "amax_tensor")):
        if name == "dbias" and not dbias:
            continue
        r = np.asarray(ref[name], np.float64).reshape(-1)
        g = got[key].double().cpu().numpy().reshape(-1)
        r, g = (r[:valid], g[:valid]) if name == "dprob" else (r, g)
        finite = np.isfinite(r)      # an empty expert's amax stays -inf
        assert np.array_equal(np.isfinite(g), finite) and np.array_equal(g[~finite], r[~finite]), name
        assert np.abs(g[finite] - r[finite]).max(initial=0.0) <= 1e-5 * max(np.abs(r[finite]).max(initial=0.0),
                                                                               1e-30), name
    if dbias and sizes[1] == 0:
        assert got["dbias_tensor"].reshape(len(sizes), n)[1].abs().max() == 0


@pytest.mark.parametrize("recipe,discrete_col_sfd", [("mx", False), ("mx", True), ("blockwise", False)])
def test_fp8_d_row_and_column_quantized(recipe, discrete_col_sfd):
    sizes, n, k = [256, 0, 512], 256, 256
    got, ref, ins, _, _ = _run(sizes, n, k, recipe, d_dtype="float8_e4m3fn", discrete_col_sfd=discrete_col_sfd,
                               seed=3)
    valid = sum(sizes)
    assert got["amax_tensor"] is None
    pairs = {"d": "d_row_tensor", "d_col": "d_col_tensor", "sfd_row": "sfd_row_tensor", "sfd_col": "sfd_col_tensor"}
    want = {name: np.asarray(ref[name]) for name in pairs}
    have = {name: got[key].cpu() for name, key in pairs.items()}
    want["d"], want["d_col"] = want["d"][:valid], want["d_col"][:valid]
    have["d"] = have["d"].reshape(valid, -1)
    have["d_col"] = have["d_col"].reshape(valid, -1)
    want["sfd_row"], want["sfd_col"] = (np.asarray(w).reshape(-1) for w in (want["sfd_row"], want["sfd_col"]))
    have["sfd_row"], have["sfd_col"] = (h.reshape(-1) for h in (have["sfd_row"], have["sfd_col"]))
    err, problem = compare_outputs(want, have, exact=False, rtol=1e-6, fp8_steps=1)
    assert problem is None, (problem, err)
    dprob = got["dprob_tensor"].double().cpu().numpy()[:valid]
    r = np.asarray(ref["dprob"], np.float64)[:valid]
    assert np.abs(dprob - r).max() <= 1e-5 * np.abs(r).max()
