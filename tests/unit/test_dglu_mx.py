"""dGLU backward on block-scaled operands (spec grouped_gemm_dglu_mx, cuDNN's grouped_gemm_dglu
with ``sfa_tensor``) on the CPU: its kernels compile for both archs without spills, its math is
the BF16 dGLU spec's, the interpreter agrees with an independent float64 dSwiGLU backward of the
dequantized operands (D in interleaved gate/up blocks, dprob, dbias, the two-slot amax, D's row
and column FP8 quantization), ``fusegemm.grouped_gemm_dglu`` with ``sfa_tensor`` runs this spec
(every check up to the device, its options reaching the variant), and selftest has a case for
it. (tests/gpu/test_dglu_mx_gpu.py runs it.)"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import fusegemm  # noqa: E402
from fusegemm.base.errors import ArgumentError, UnsupportedError  # noqa: E402
from fusegemm.formats import unpack_sf  # noqa: E402

import quantized_problems  # noqa: E402  (tests/unit/quantized_problems.py)

SPEC = "grouped_gemm_dglu_mx"
MX = {"sf_dtype": "float8_e8m0fnu", "sf_vec_size": 32}
BW = {"sf_dtype": "float32", "sf_vec_size": 128}


# Four compiles (about 10 s of NVRTC each): FP8 D quantized along rows and columns with dbias and
# discrete weights on each arch, the bf16 D with its two-slot amax on each (the blockwise recipe on
# sm_90a). The prebuild list (fusegemm build) covers the defaults.
@pytest.mark.parametrize("arch,axes", [
    ("sm_90a", {**MX, "d_dtype": "float8_e4m3fn", "generate_dbias": True, "weight_mode": "discrete",
                "discrete_col_sfd": True, "tile_n": 128}),
    ("sm_90a", {**BW, "generate_dbias": True, "c_dtype": "float32"}),
    ("sm_100a", {**MX, "d_dtype": "float8_e4m3fn", "generate_dbias": True, "weight_mode": "discrete",
                 "tile_m": 128, "tile_n": 128, "cluster_m": 1}),
    ("sm_100a", {**MX, "generate_dbias": True}),
])
def test_kernels_compile_without_spills(arch, axes, session_cache):
    from fusegemm.generator.variants import make_variant
    from fusegemm.pipeline import get_kernel
    built = get_kernel(make_variant(SPEC, arch=arch, **axes), session_cache)
    assert built.resources.local_bytes == 0, built.resources
    if arch == "sm_100a":
        assert 0 < built.contract.tmem_cols <= 512


def test_the_math_is_the_bf16_dglu_specs():
    """The same statements and D as grouped_gemm_dglu.yaml: only the operands' format differs."""
    from fusegemm.generator.spec import find_spec
    mx, bf16 = (find_spec(name).epilogue for name in (SPEC, "grouped_gemm_dglu"))
    assert [s.text for s in mx.statements] == [s.text for s in bf16.statements]
    assert [(o.name, o.paired) for o in mx.outputs] == [(o.name, o.paired) for o in bf16.outputs]


def _problem(recipe, sizes=(256, 0, 512), n=256, k=384, seed=0):
    """Operands (A, SFA, offsets, B, SFB) as CPU tensors, the inputs, and A and B dequantized."""
    rng = np.random.default_rng(seed)
    m, l = sum(sizes), len(sizes)
    ops, a64, b64 = quantized_problems.operands(recipe, sizes, n, k, rng)
    ins = {"alpha": torch.from_numpy(rng.uniform(0.5, 1.5, l).astype(np.float32)),
           "beta": torch.from_numpy(rng.uniform(0.5, 1.5, l).astype(np.float32)),
           "prob": torch.from_numpy(rng.uniform(0, 1, m).astype(np.float32)),
           "c": torch.from_numpy(rng.standard_normal((m, 2 * n)).astype(np.float32)).to(torch.bfloat16),
           "norm_const": torch.ones(1)}
    return ops, ins, a64.astype(np.float64), b64.astype(np.float64)


def _dglu64(a64, b64, sizes, ins):
    """(D (M, 2N), dprob, dbias (L, 2N), amax (L, 2)) in float64, from the definition: R =
    alpha^2 A_e B_e^T; C's even 32-column blocks are the gate g, odd ones the up u, scaled by
    beta; dgate = R p u s (1 + g (1 - s)) and dup = R p g s (s = sigmoid(g)) interleaved the same
    way; dprob = sum g s u R; dbias and amax per expert."""
    n = b64.shape[1]
    j = np.arange(n)
    gate_col, up_col = (j // 32) * 64 + j % 32, (j // 32) * 64 + 32 + j % 32
    c = ins["c"].double().numpy()
    prob = ins["prob"].double().numpy()[:, None]
    d, dprob, dbias, amax, start = [], [], [], [], 0
    for e, rows in enumerate(sizes):
        span = slice(start, start + rows)
        r = float(ins["alpha"][e]) ** 2 * (a64[span] @ b64[e].T)
        g, u = float(ins["beta"][e]) * c[span][:, gate_col], float(ins["beta"][e]) * c[span][:, up_col]
        s = 1 / (1 + np.exp(-g))
        dgate, dup = r * prob[span] * u * s * (1 + g * (1 - s)), r * prob[span] * g * s
        de = np.empty((rows, 2 * n))
        de[:, gate_col], de[:, up_col] = dgate, dup
        d.append(de)
        dprob.append((g * s * u * r).sum(axis=1))
        dbias.append(de.sum(axis=0))
        amax.append([np.abs(x).max(initial=-np.inf) if rows else -np.inf for x in (dgate, dup)])
        start += rows
    return np.concatenate(d), np.concatenate(dprob), np.stack(dbias), np.array(amax)


@pytest.mark.parametrize("recipe", ["mx", "blockwise"])
def test_interpreter_is_dglu_of_the_dequantized_operands(recipe):
    sizes = (256, 0, 512)
    ops, ins, a64, b64 = _problem(recipe, sizes)
    op = fusegemm.Op(SPEC, arch="sm_90a", **(MX if recipe == "mx" else BW), d_dtype="float16", generate_dbias=True)
    out = op.reference(*ops, inputs=ins)
    d, dprob, dbias, amax = (np.asarray(out[k], np.float64) for k in ("d", "dprob", "dbias", "amax"))
    want_d, want_dprob, want_dbias, want_amax = _dglu64(a64, b64, sizes, ins)
    assert d.shape == want_d.shape == (768, 512)
    assert np.abs(d - want_d).max() <= 2.0 ** -10 * np.abs(want_d).max()
    assert np.abs(dprob.reshape(-1) - want_dprob).max() <= 1e-5 * np.abs(want_dprob).max()
    assert dbias.reshape(3, 512)[1].tolist() == [0.0] * 512        # the empty expert
    assert np.abs(dbias.reshape(3, 512) - want_dbias).max() <= 1e-4 * np.abs(want_dbias).max()
    amax = amax.reshape(3, 2)
    assert amax[1].tolist() == [-np.inf, -np.inf]                  # the empty expert: nothing seen
    full = [0, 2]
    assert np.abs(amax[full] - want_amax[full]).max() <= 1e-5 * want_amax[full].max()
    assert not np.allclose(want_amax[full, 0], want_amax[full, 1], rtol=1e-3)   # slot 0 is dgate's, 1 dup's


def test_an_fp8_d_is_quantized_along_rows_and_columns():
    """D and D_col dequantized with SFD_row / SFD_col are the float64 dGLU within one e4m3 rounding
    (2^-4 relative) plus 2^-17 of the largest |D| (the smallest e4m3 step under the largest
    block's scale): a 32-column block of D is all dgate or all dup (the dSwiGLU convention)."""
    import ml_dtypes
    sizes = (256, 0, 512)
    ops, ins, a64, b64 = _problem("mx", sizes)
    op = fusegemm.Op(SPEC, arch="sm_90a", **MX, d_dtype="float8_e4m3fn")
    out = op.reference(*ops, inputs=ins)
    assert {k for k in out.keys() if out[k] is not None} == {"d", "d_col", "sfd_row", "sfd_col", "dprob"}
    want = _dglu64(a64, b64, sizes, ins)[0]
    m, w = want.shape
    e8m0 = ml_dtypes.float8_e8m0fnu        # SFD comes back as its E8M0 bytes
    sf_row = unpack_sf(np.asarray(out["sfd_row"]).view(e8m0), m, w // 32)[:, :, 0].astype(np.float64)
    sf_col = unpack_sf(np.asarray(out["sfd_col"]).view(e8m0), w, m // 32)[:, :, 0].astype(np.float64)
    rows = np.asarray(out["d"]).astype(np.float64) * np.repeat(sf_row, 32, axis=1)
    cols = np.asarray(out["d_col"]).astype(np.float64) * np.repeat(sf_col.T, 32, axis=0)
    for got in (rows, cols):
        assert np.all(np.abs(got - want) <= 2.0 ** -4 * np.abs(want) + 2.0 ** -17 * np.abs(want).max())
    # discrete_col_sfd: the same column scales in the per-expert atom order.
    disc = fusegemm.Op(SPEC, arch="sm_90a", **MX, d_dtype="float8_e4m3fn", discrete_col_sfd=True).reference(
        *ops, inputs=ins)
    a, b = (np.asarray(x["sfd_col"]).reshape(-1) for x in (out, disc))
    assert not np.array_equal(a, b) and np.array_equal(np.sort(a), np.sort(b))
    bf16 = fusegemm.Op(SPEC, arch="sm_90a", **MX, d_dtype="bfloat16").reference(*ops, inputs=ins)
    assert {k for k in bf16.keys() if bf16[k] is not None} == {"d", "dprob", "amax"}
    f32 = fusegemm.Op(SPEC, arch="sm_90a", **MX, d_dtype="float32").reference(*ops, inputs=ins)
    assert {k for k in f32.keys() if f32[k] is not None} == {"d", "dprob"}


def _wrapper_args(recipe):
    (a, sfa, off, b, sfb), ins, _, _ = _problem(recipe)
    return dict(a_tensor=a, c_tensor=ins["c"], sfa_tensor=sfa, padded_offsets=off, alpha_tensor=ins["alpha"],
                beta_tensor=ins["beta"], prob_tensor=ins["prob"], dprob_tensor=torch.zeros(len(ins["prob"])),
                b_tensor=b, sfb_tensor=sfb, sf_vec_size=32 if recipe == "mx" else 128)


def _discrete(args):
    """The same call with per-expert weight pointers (CPU addresses: every check runs, then the
    device check refuses the call)."""
    b, sfb = args.pop("b_tensor"), args.pop("sfb_tensor")
    return dict(args, b_ptrs=torch.tensor([t.data_ptr() for t in b], dtype=torch.int64),
                sfb_ptrs=torch.tensor([t.data_ptr() for t in sfb], dtype=torch.int64), n=b.shape[1])


def test_the_dglu_wrapper_with_scales_runs_the_block_scaled_spec(monkeypatch):
    from fusegemm.ops import scaled_seeds
    seen = []
    real = scaled_seeds._op
    monkeypatch.setattr(scaled_seeds, "_op", lambda spec, *a: seen.append((spec, dict(a[2]))) or real(spec, *a))
    with pytest.raises(ArgumentError, match=r"^a_tensor\.device: got cpu"):
        fusegemm.grouped_gemm_dglu(**_wrapper_args("mx"), d_dtype=torch.float8_e4m3fn, discrete_col_sfd=True,
                                   norm_const_tensor=torch.ones(1))
    with pytest.raises(ArgumentError, match=r"^a_tensor\.device: got cpu"):
        fusegemm.grouped_gemm_dglu(**_discrete(_wrapper_args("mx")), generate_dbias=True)
    with pytest.raises(ArgumentError, match=r"^norm_const_tensor: got None; allowed: a scalar input"):
        fusegemm.grouped_gemm_dglu(**_wrapper_args("mx"), d_dtype=torch.float8_e4m3fn)   # SFD needs it
    monkeypatch.setattr(scaled_seeds, "VALIDATION_ARCH", "sm_90a")   # the blockwise recipe: sm_90a
    with pytest.raises(ArgumentError, match=r"^a_tensor\.device: got cpu"):
        fusegemm.grouped_gemm_dglu(**_wrapper_args("blockwise"))
    assert {spec for spec, _ in seen} == {SPEC}
    (_, fp8), (_, discrete), *_, (_, blockwise) = seen
    assert (fp8["d_dtype"], fp8["discrete_col_sfd"], fp8["weight_mode"], fp8["generate_dbias"]) == (
        "float8_e4m3fn", True, "dense", False)
    assert (discrete["weight_mode"], discrete["generate_dbias"], discrete["d_dtype"]) == ("discrete", True, "bfloat16")
    assert (blockwise["sf_dtype"], blockwise["sf_vec_size"]) == ("float32", 128)


@pytest.mark.parametrize("change,message", [
    ({"use_dynamic_sched": True}, r"^use_dynamic_sched: got True; allowed: False\. the block-scaled dGLU kernel"),
    ({"act_func": "dgeglu"}, r"^act_func: got 'dgeglu'; allowed: 'dswiglu'\. this op is dSwiGLU's spec"),
    ({"glu_clamp_min": -5.0}, r"^glu_clamp_min: got -5\.0; allowed: -7\.0\. a GeGLU parameter"),
    ({"epilogue_op": "relu"}, r"^epilogue_op: got 'relu'; allowed: None\. NVIDIA's kernel applies none"),
    ({"use_single_group_runtime_offsets": True}, r"^use_single_group_runtime_offsets: got True; allowed: False"),
    ({"sf_vec_size": 64}, r"^sf_vec_size: got 64; allowed: 16, 32 \(MX scales\), 128"),
    ({"c_tensor": None}, r"^c_tensor: got None; allowed: a tensor: the forward.s saved input"),
    ({"beta_tensor": None}, r"^beta_tensor: got None; allowed: an? expert input"),
    ({"b_major": "n"}, r"^b_major: got 'n'; spec grouped_gemm_dglu_mx allows: k"),
    ({"d_dtype": torch.float8_e8m0fnu}, r"^d_dtype: got torch\.float8_e8m0fnu; allowed: float32, float16"),
])
def test_refused_options_name_their_argument(change, message):
    with pytest.raises((ArgumentError, UnsupportedError), match=message):
        fusegemm.grouped_gemm_dglu(**{**_wrapper_args("mx"), **change})


def test_sm100a_refuses_the_blockwise_recipe():
    with pytest.raises(UnsupportedError, match=r"sf_vec_size=128 is not implemented.*sm_100a"):
        fusegemm.Op(SPEC, arch="sm_100a", **BW).check_support()


def test_selftest_has_a_case_for_the_spec():
    from fusegemm import selftest
    cases = selftest.RUNNERS["grouped_gemm_srelu"]()
    assert [c for c in cases if c[1].get("spec") == SPEC]
