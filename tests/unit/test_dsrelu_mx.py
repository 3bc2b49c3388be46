"""dsReLU backward on block-scaled operands (spec grouped_gemm_dsrelu_mx, NVIDIA's dsReLU is
block-scaled only) on the CPU: its kernels compile for both archs without spills, the
interpreter agrees with an independent float64 dsReLU (D, dprob, dbias, D's row and column FP8
quantization), ``fusegemm.grouped_gemm_dsrelu`` with ``sfa_tensor`` runs this spec (every check up
to the device), and selftest has a case for it. (tests/gpu/test_dsrelu_mx_gpu.py runs it.)"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import fusegemm  # noqa: E402
from fusegemm.base.errors import ArgumentError, UnsupportedError  # noqa: E402

import quantized_problems  # noqa: E402  (tests/unit/quantized_problems.py)

SPEC = "grouped_gemm_dsrelu_mx"
MX = {"sf_dtype": "float8_e8m0fnu", "sf_vec_size": 32}
BW = {"sf_dtype": "float32", "sf_vec_size": 128}


@pytest.mark.parametrize("arch,axes", [
    ("sm_90a", {**MX}),
    ("sm_90a", {**MX, "d_dtype": "float8_e4m3fn", "generate_dbias": True, "weight_mode": "discrete",
                "discrete_col_sfd": True, "tile_n": 128}),
    ("sm_90a", {**BW, "d_dtype": "float8_e4m3fn", "generate_dbias": True, "c_dtype": "float32"}),
    ("sm_100a", {**MX}),
    ("sm_100a", {**MX, "d_dtype": "float8_e4m3fn", "generate_dbias": True, "weight_mode": "discrete",
                 "tile_m": 128, "tile_n": 128, "cluster_m": 1}),
])
def test_kernels_compile_without_spills(arch, axes, session_cache):
    from fusegemm.generator.variants import make_variant
    from fusegemm.pipeline import get_kernel
    built = get_kernel(make_variant(SPEC, arch=arch, **axes), session_cache)
    assert built.resources.local_bytes == 0, built.resources
    if arch == "sm_100a":
        assert 0 < built.contract.tmem_cols <= 512


def _problem(recipe, sizes=(256, 0, 512), n=256, k=384, seed=0):
    rng = np.random.default_rng(seed)
    m, l = sum(sizes), len(sizes)
    ops, a64, b64 = quantized_problems.operands(recipe, sizes, n, k, rng)
    ins = {"alpha": torch.from_numpy(rng.uniform(0.5, 1.5, l).astype(np.float32)),
           "prob": torch.from_numpy(rng.uniform(0, 1, m).astype(np.float32)),
           "c": torch.from_numpy(rng.standard_normal((m, n)).astype(np.float32)).to(torch.bfloat16),
           "norm_const": torch.ones(1)}
    return ops, ins, a64.astype(np.float64), b64.astype(np.float64)


def _dsrelu64(a64, b64, sizes, ins):
    """(dC, dprob, dbias) in float64, written out from the definition of sReLU's backward."""
    r = np.maximum(ins["c"].double().numpy(), 0.0)
    prob = ins["prob"].double().numpy()[:, None]
    d, dbias, start = [], [], 0
    for e, rows in enumerate(sizes):
        g = a64[start:start + rows] @ b64[e].T * float(ins["alpha"][e])
        de = 2 * prob[start:start + rows] * r[start:start + rows] * g
        d.append(de)
        dbias.append(de.sum(axis=0))
        start += rows
    d = np.concatenate(d)
    g_all = d / np.where(r * prob == 0, 1.0, 2 * r * prob)   # G itself where it enters dprob
    dprob = (r * r * g_all).sum(axis=1)
    return d, dprob, np.stack(dbias)


@pytest.mark.parametrize("recipe", ["mx", "blockwise"])
def test_interpreter_is_dsrelu_of_the_dequantized_operands(recipe):
    sizes = (256, 0, 512)
    ops, ins, a64, b64 = _problem(recipe, sizes)
    op = fusegemm.Op(SPEC, arch="sm_90a", **(MX if recipe == "mx" else BW), d_dtype="float16", generate_dbias=True)
    out = op.reference(*ops, inputs=ins)
    d, dprob, dbias = (np.asarray(out[k], np.float64) for k in ("d", "dprob", "dbias"))
    want_d, want_dprob, want_dbias = _dsrelu64(a64, b64, sizes, ins)
    assert d.shape == want_d.shape == (768, 256)
    assert np.abs(d - want_d).max() <= 2.0 ** -10 * np.abs(want_d).max()
    assert np.abs(dprob.reshape(-1) - want_dprob).max() <= 1e-5 * np.abs(want_dprob).max()
    assert dbias.reshape(3, 256)[1].tolist() == [0.0] * 256        # the empty expert
    assert np.abs(dbias.reshape(3, 256) - want_dbias).max() <= 1e-4 * np.abs(want_dbias).max()


def test_an_fp8_d_is_quantized_along_rows_and_columns():
    ops, ins, _, _ = _problem("mx")
    op = fusegemm.Op(SPEC, arch="sm_90a", **MX, d_dtype="float8_e4m3fn")
    out = op.reference(*ops, inputs=ins)
    assert {k for k in out.keys() if out[k] is not None} == {"d", "d_col", "sfd_row", "sfd_col", "dprob"}
    # discrete_col_sfd: the same column scales in the per-expert atom order (Op.reference reads the
    # variant's; it used to give the default order, which the H200 run of the kernel showed).
    disc = fusegemm.Op(SPEC, arch="sm_90a", **MX, d_dtype="float8_e4m3fn", discrete_col_sfd=True).reference(
        *ops, inputs=ins)
    a, b = (np.asarray(x["sfd_col"]).reshape(-1) for x in (out, disc))
    assert not np.array_equal(a, b) and np.array_equal(np.sort(a), np.sort(b))
    f16 = fusegemm.Op(SPEC, arch="sm_90a", **MX, d_dtype="float16").reference(*ops, inputs=ins)
    assert {k for k in f16.keys() if f16[k] is not None} == {"d", "dprob", "amax"}


def _wrapper_args(recipe):
    (a, sfa, off, b, sfb), ins, _, _ = _problem(recipe)
    return dict(a_tensor=a, b_tensor=b, c_tensor=ins["c"], sfa_tensor=sfa, sfb_tensor=sfb, padded_offsets=off,
                alpha_tensor=ins["alpha"], prob_tensor=ins["prob"], sf_vec_size=32 if recipe == "mx" else 128)


def test_the_dsrelu_wrapper_with_scales_runs_the_block_scaled_spec(monkeypatch):
    from fusegemm.ops import scaled_seeds
    seen = []
    real = scaled_seeds._op
    monkeypatch.setattr(scaled_seeds, "_op", lambda spec, *a: seen.append(spec) or real(spec, *a))
    with pytest.raises(ArgumentError, match=r"^a_tensor\.device: got cpu"):
        fusegemm.grouped_gemm_dsrelu(**_wrapper_args("mx"), d_dtype=torch.float8_e4m3fn, generate_dbias=True,
                                     discrete_col_sfd=True, norm_const_tensor=torch.ones(1))
    with pytest.raises(ArgumentError, match=r"^norm_const_tensor: got None; allowed: a scalar input"):
        fusegemm.grouped_gemm_dsrelu(**_wrapper_args("mx"), d_dtype=torch.float8_e4m3fn)   # SFD needs it
    monkeypatch.setattr(scaled_seeds, "VALIDATION_ARCH", "sm_90a")   # the blockwise recipe: sm_90a
    with pytest.raises(ArgumentError, match=r"^a_tensor\.device: got cpu"):
        fusegemm.grouped_gemm_dsrelu(**_wrapper_args("blockwise"))
    assert set(seen) == {SPEC}
    with pytest.raises(ArgumentError, match=r"^use_dynamic_sched: got True; allowed: False\. the block-scaled dsReLU"):
        fusegemm.grouped_gemm_dsrelu(**_wrapper_args("mx"), use_dynamic_sched=True)
    with pytest.raises(ArgumentError, match=r"^c_tensor: got None; allowed: a tensor: the forward.s saved input"):
        fusegemm.grouped_gemm_dsrelu(**{**_wrapper_args("mx"), "c_tensor": None})


def test_sm100a_refuses_the_blockwise_recipe():
    with pytest.raises(UnsupportedError, match=r"sf_vec_size=128 is not implemented.*sm_100a"):
        fusegemm.Op(SPEC, arch="sm_100a", **BW).check_support()


def test_selftest_has_a_case_for_the_spec():
    from fusegemm import selftest
    cases = selftest.RUNNERS["grouped_gemm_srelu"]()
    assert [c for c in cases if c[1].get("spec") == SPEC]
