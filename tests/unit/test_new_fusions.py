"""cuDNN frontend's newer grouped fusions, authored as specs alone (no generator change):
grouped_gemm_glu (GLU forward, act_func "swiglu"), grouped_gemm_dglu (its backward, "dswiglu")
and grouped_gemm_dsrelu (the backward of grouped_gemm_srelu), all on the BF16 grouped kernel.

1. Each spec loads, with the one default prebuild entry (every prebuild kernel is compiled by
   ``fusegemm build`` in CI).
2. Its default variant renders and NVRTC-compiles for sm_90a and sm_100a, spill-free.
3. The numpy interpreter (``EpilogueGemm(...).reference``: float64 GEMM rounded to FP32, then the
   epilogue in FP32) against an independent float64 formula written here from cuDNN's math, on
   ragged experts with an empty one and padding rows past the last offset. Tolerances: FP32
   outputs 2^-20 relative + 2^-20 of the output's largest magnitude (a few FP32 roundings, and
   sigmoid's 3 ulp, over operands that may cancel); 16-bit outputs add half an ulp of the format
   (bf16 2^-8, fp16 2^-10 relative, fp16 subnormals 2^-24 absolute); dprob 2^-20 of the row's
   sum of |terms|; amax 2^-20 relative.
4. The closed forms of (3) are themselves checked: each backward formula equals central finite
   differences of its forward (GLU -> dGLU, sReLU -> dsReLU), so the roles of C and the GEMM,
   the gate/up block order and what dprob sums are those of a gradient, not a transcription.
5. The bias gradients (generate_dbias): dsReLU's and dGLU's variants compile spill-free on both
   archs; dGLU's is a paired column sum, (L, 2N): each column of the interleaved D summed over
   each expert's rows, checked against column sums of the formula's D on ragged experts with an
   empty one (tolerance 2^-20 of the column's sum of |D| plus 2^-20 of the rows times max |D|:
   the per-element bound of (3) summed), and against the sums arranged without the pairing,
   which must not match.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from fusegemm import EpilogueGemm
from fusegemm import build as b
from fusegemm.generator.render import render
from fusegemm.generator.spec import find_spec, load_spec, spec_dir
from fusegemm.generator.variants import make_variant

SPECS = ("grouped_gemm_glu", "grouped_gemm_dglu", "grouped_gemm_dsrelu")
ARCHS = ("sm_90a", "sm_100a")
F32 = np.float32
NP_DTYPES = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16, "float32": np.float32}
SIZES = [256, 0, 512, 256]          # ragged experts, the second one empty
PAD_ROWS = 256                      # rows past padded_offsets[-1]
REL = {"float32": 2.0 ** -20, "float16": 2.0 ** -10, "bfloat16": 2.0 ** -8}


# --------------------------------------------------------------------------------------------
# 1-2. load, render, compile
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", SPECS)
def test_spec_loads_with_one_default_prebuild(name):
    s = load_spec(spec_dir() / f"{name}.yaml")
    assert (s.name, s.kernel, s.problem) == (name, "grouped_gemm", "grouped")
    assert s.prebuild == ((),)
    assert find_spec(name) == s


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", SPECS)
def test_default_variant_renders_and_compiles(name, arch, session_cache):
    v = make_variant(name, arch=arch)
    src = render(v)
    assert src.name.startswith(f"{name}.") and src.name.endswith(f".{arch.replace('_', '')}.{src.digest[:12]}")
    (r,) = b.build([v], cache=session_cache)
    assert r.ok, r.error[:3000]
    assert r.spill_bytes == 0 and r.registers > 0 and r.advisories == (), r


# --------------------------------------------------------------------------------------------
# problems and the independent float64 formulas
# --------------------------------------------------------------------------------------------
def _problem(seed: int, n: int, k: int = 64):
    """bf16 A (M, K) and B (L, N, K), alpha (L,), prob (M,): ragged experts with an empty one."""
    rng = np.random.default_rng(seed)
    off = np.cumsum(SIZES).astype(np.int32)
    m = int(off[-1]) + PAD_ROWS
    a = (rng.standard_normal((m, k)) * 0.5).astype(ml_dtypes.bfloat16)
    w = (rng.standard_normal((len(SIZES), n, k)) * 0.25).astype(ml_dtypes.bfloat16)
    alpha = (rng.random(len(SIZES)) + 0.5).astype(F32)
    prob = rng.random(m).astype(F32)
    return rng, a, off, w, alpha, prob


def _expert_of_rows(off) -> np.ndarray:
    return np.repeat(np.arange(len(off)), np.diff(np.concatenate([[0], off])))


def _gemm64(a, off, w) -> np.ndarray:
    """G[m] = A[m] @ B_e^T in float64 for the rows of each expert e, (valid_m, N)."""
    a64, w64 = np.asarray(a, np.float64), np.asarray(w, np.float64)
    e = _expert_of_rows(off)
    return np.einsum("mk,mnk->mn", a64[: int(off[-1])], w64[e])


def _split(x: np.ndarray):
    """(R, 2W) in alternating 32-column blocks -> even blocks (gate), odd blocks (up), (R, W) each."""
    r, n2 = x.shape
    blocks = x.reshape(r, n2 // 64, 2, 32)
    return blocks[:, :, 0].reshape(r, n2 // 2), blocks[:, :, 1].reshape(r, n2 // 2)


def _interleave(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    r, w = gate.shape
    return np.stack([gate.reshape(r, w // 32, 32), up.reshape(r, w // 32, 32)], axis=2).reshape(r, 2 * w)


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def glu_forward(g, alpha_rows, bias_rows, prob_rows):
    """cuDNN GLU, act_func swiglu: gate/up = alpha * G + bias (even/odd 32-column blocks), C their
    interleave; D = prob * up * silu(gate)."""
    pre = alpha_rows * g + (bias_rows if bias_rows is not None else 0.0)
    gate, up = _split(pre)
    return pre, prob_rows * up * gate * _sigmoid(gate)


def dglu_backward(r, c, beta_rows, prob_rows):
    """cuDNN dGLU, act_func dswiglu: g/u = beta * C (even/odd blocks), R the output gradient;
    D = [R p u s (1 + g (1 - s)) | R p g s] interleaved, dprob = sum g s u R."""
    gate, up = _split(beta_rows * c)
    s = _sigmoid(gate)
    dgate = r * prob_rows * up * s * (1.0 + gate * (1.0 - s))
    dup = r * prob_rows * gate * s
    return _interleave(dgate, dup), np.sum(gate * s * up * r, axis=1)


def srelu_forward(c, prob_rows):
    """seed 002: D = prob * relu(C)^2."""
    return prob_rows * np.maximum(c, 0.0) ** 2


def dsrelu_backward(g, c, prob_rows):
    """Its backward given G = dL/dD: dC = 2 prob relu(C) G, dprob = sum relu(C)^2 G."""
    r = np.maximum(c, 0.0)
    return 2.0 * prob_rows * r * g, np.sum(r * r * g, axis=1)


def _close(got, want, dtype: str, what: str, scale: float | None = None) -> None:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    scale = np.abs(want).max() if scale is None else scale
    bound = REL[dtype] * np.abs(want) + 2.0 ** -20 * scale + (2.0 ** -24 if dtype == "float16" else 0.0)
    err = np.abs(got - want)
    bad = err > bound
    assert not bad.any(), (f"{what}: {bad.sum()} of {bad.size} beyond the bound; worst at "
                           f"{np.unravel_index(np.argmax(err - bound), err.shape)}: got "
                           f"{got[bad][0]!r}, want {want[bad][0]!r}")


def _rows_past_valid_are_zero(out, valid: int, names) -> None:
    for name in names:
        x = np.asarray(getattr(out, name), np.float64)
        assert not x[valid:].any(), f"{name}: rows past padded_offsets[-1] are not zero"


# --------------------------------------------------------------------------------------------
# 3. interpreter vs the formulas
# --------------------------------------------------------------------------------------------
GLU_CASES = [
    {},
    {"bias_dtype": "bfloat16", "generate_c": True, "c_dtype": "float32", "d_dtype": "float32"},
    {"bias_dtype": "float32", "generate_c": True, "c_dtype": "bfloat16", "d_dtype": "float16"},
]


@pytest.mark.parametrize("axes", GLU_CASES, ids=lambda a: "-".join(f"{k}={v}" for k, v in a.items()) or "default")
def test_glu_interpreter_matches_the_formula(axes):
    n = 256                                           # accumulator width: 4 gate/up block pairs
    rng, a, off, w, alpha, prob = _problem(1, n)
    op = EpilogueGemm("grouped_gemm_glu", arch="sm_90a", **axes)
    v = op.variant
    inputs = {"alpha": alpha, "prob": prob}
    bias = None
    if v.bias_dtype != "none":
        bias = rng.standard_normal((n, len(SIZES))).astype(NP_DTYPES[v.bias_dtype])   # (N, L)
        inputs["bias"] = bias
    out = op.reference(a, off, w, inputs=inputs)

    valid, e = int(off[-1]), _expert_of_rows(off)
    bias_rows = np.asarray(bias, np.float64).T[e] if bias is not None else None
    pre, h = glu_forward(_gemm64(a, off, w), alpha[e, None].astype(np.float64), bias_rows,
                         prob[:valid, None].astype(np.float64))
    assert np.asarray(out.d).shape == (a.shape[0], n // 2)
    _close(np.asarray(out.d, np.float64)[:valid], h, v.d_dtype, "d")
    if v.generate_c:
        assert np.asarray(out.c).shape == (a.shape[0], n)
        _close(np.asarray(out.c, np.float64)[:valid], pre, v.c_dtype, "c")
    else:
        assert out.c is None
    _rows_past_valid_are_zero(out, valid, ["d"] + (["c"] if v.generate_c else []))


DGLU_CASES = [{}, {"c_dtype": "float32", "d_dtype": "float32"}, {"c_dtype": "float16", "d_dtype": "float16"}]


@pytest.mark.parametrize("axes", DGLU_CASES, ids=lambda a: "-".join(f"{k}={v}" for k, v in a.items()) or "default")
def test_dglu_interpreter_matches_the_formula(axes):
    n = 128                                           # the forward's output width: C is (M, 256)
    rng, a, off, w, alpha, prob = _problem(2, n)
    op = EpilogueGemm("grouped_gemm_dglu", arch="sm_100a", **axes)
    v = op.variant
    beta = (rng.random(len(SIZES)) + 0.5).astype(F32)
    c = (rng.standard_normal((a.shape[0], 2 * n)) * 2.0).astype(NP_DTYPES[v.c_dtype])
    out = op.reference(a, off, w, inputs={"alpha": alpha, "beta": beta, "prob": prob, "c": c})

    valid, e = int(off[-1]), _expert_of_rows(off)
    r = (alpha.astype(np.float64) ** 2)[e, None] * _gemm64(a, off, w)
    d, dprob = dglu_backward(r, np.asarray(c, np.float64)[:valid], beta.astype(np.float64)[e, None],
                             prob[:valid, None].astype(np.float64))
    assert np.asarray(out.d).shape == (a.shape[0], 2 * n)
    _close(np.asarray(out.d, np.float64)[:valid], d, v.d_dtype, "d")
    terms = np.abs(np.asarray(out.values["dp"], np.float64)).sum(axis=1)
    got_p = np.asarray(out.dprob, np.float64)
    assert got_p.shape == (a.shape[0],)
    assert np.all(np.abs(got_p[:valid] - dprob) <= 2.0 ** -20 * terms + 1e-30), "dprob"
    _rows_past_valid_are_zero(out, valid, ["d", "dprob"])


DSRELU_CASES = [{}, {"c_dtype": "float32", "d_dtype": "float32"}, {"c_dtype": "float32", "d_dtype": "float16"}]


@pytest.mark.parametrize("axes", DSRELU_CASES, ids=lambda a: "-".join(f"{k}={v}" for k, v in a.items()) or "default")
def test_dsrelu_interpreter_matches_the_formula(axes):
    n = 160                                           # not a multiple of the 128/256 tiles
    rng, a, off, w, alpha, prob = _problem(3, n)
    op = EpilogueGemm("grouped_gemm_dsrelu", arch="sm_90a", **axes)
    v = op.variant
    c = (rng.standard_normal((a.shape[0], n)) * 2.0).astype(NP_DTYPES[v.c_dtype])
    out = op.reference(a, off, w, inputs={"alpha": alpha, "prob": prob, "c": c})

    valid, e = int(off[-1]), _expert_of_rows(off)
    g = alpha.astype(np.float64)[e, None] * _gemm64(a, off, w)
    d, dprob = dsrelu_backward(g, np.asarray(c, np.float64)[:valid], prob[:valid, None].astype(np.float64))
    assert np.asarray(out.d).shape == (a.shape[0], n)
    _close(np.asarray(out.d, np.float64)[:valid], d, v.d_dtype, "d")
    terms = np.abs(np.asarray(out.values["dp"], np.float64)).sum(axis=1)
    got_p = np.asarray(out.dprob, np.float64)
    assert np.all(np.abs(got_p[:valid] - dprob) <= 2.0 ** -20 * terms + 1e-30), "dprob"
    _rows_past_valid_are_zero(out, valid, ["d", "dprob"])
    if v.d_dtype in ("bfloat16", "float16"):
        # Per-expert max |D| of the FP32 values, before conversion; the empty expert keeps -inf.
        want = np.full(len(SIZES), -np.inf)
        starts = np.concatenate([[0], off[:-1]])
        for x, (s0, s1) in enumerate(zip(starts, off)):
            if s1 > s0:
                want[x] = np.abs(d[s0:s1]).max()
        got = np.asarray(out.amax, np.float64).reshape(-1)
        assert np.array_equal(np.isinf(got), np.isinf(want)) and got[1] == -np.inf, got
        fin = np.isfinite(want)
        assert np.all(np.abs(got[fin] - want[fin]) <= 2.0 ** -20 * want[fin]), (got, want)
    else:
        assert out.amax is None


# --------------------------------------------------------------------------------------------
# 4. the formulas are gradients of their forwards
# --------------------------------------------------------------------------------------------
def _central(f, x, eps):
    return (f(x + eps) - f(x - eps)) / (2 * eps)


def test_dglu_formula_is_the_gradient_of_the_glu_forward():
    """Elementwise: h = p * u * silu(g); dL/dg, dL/du and dL/dp for the upstream gradient R."""
    rng = np.random.default_rng(4)
    rows, width = 8, 64
    gate, up, r = (rng.standard_normal((rows, width)) * 3 for _ in range(3))
    p = rng.random((rows, 1)) + 0.1
    c = _interleave(gate, up)                       # the forward's C: gate in the even blocks

    def h(g_, u_, p_):
        return glu_forward(_interleave(g_, u_), 1.0, None, p_)[1]

    d, dprob = dglu_backward(r, c, 1.0, p)
    dgate, dup = _split(d)
    eps = 1e-6
    np.testing.assert_allclose(dgate, r * _central(lambda x: h(x, up, p), gate, eps), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(dup, r * _central(lambda x: h(gate, x, p), up, eps), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(dprob, np.sum(r * _central(lambda x: h(gate, up, x), p, eps), axis=1),
                               rtol=1e-6, atol=1e-8)


def test_dsrelu_formula_is_the_gradient_of_the_srelu_forward():
    """Elementwise: D = p * relu(C)^2; dL/dC and dL/dp for the upstream gradient G."""
    rng = np.random.default_rng(5)
    c = rng.standard_normal((8, 96)) * 3
    c[np.abs(c) < 1e-3] = 0.5                        # away from the kink of relu
    g = rng.standard_normal(c.shape)
    p = rng.random((8, 1)) + 0.1
    dc, dprob = dsrelu_backward(g, c, p)
    eps = 1e-6
    np.testing.assert_allclose(dc, g * _central(lambda x: srelu_forward(x, p), c, eps), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(dprob, np.sum(g * _central(lambda x: srelu_forward(c, x), p, eps), axis=1),
                               rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("arch", ARCHS)
def test_dsrelu_with_the_bias_gradient_compiles_spill_free(arch, session_cache):
    """generate_dbias adds the column reduction (kColSum) and keeps the kernel spill-free."""
    v = make_variant("grouped_gemm_dsrelu", arch=arch, generate_dbias=True)
    src = render(v)
    assert "static constexpr bool kColSum = true;" in src.text
    assert src.digest != render(make_variant("grouped_gemm_dsrelu", arch=arch)).digest
    (r,) = b.build([v], cache=session_cache)
    assert r.ok, r.error[:3000]
    assert r.spill_bytes == 0 and r.registers > 0, r


@pytest.mark.parametrize("arch", ARCHS)
def test_dglu_with_the_bias_gradient_compiles_spill_free(arch, session_cache):
    """generate_dbias adds a paired column sum (kPairedColSum: the gate and up values of each element
    column) and keeps the kernel spill-free; on sm_90a the rule runs through the engine."""
    v = make_variant("grouped_gemm_dglu", arch=arch, generate_dbias=True)
    src = render(v)
    for line in ("static constexpr bool kColSum = true;", "static constexpr bool kPairedColSum = true;",
                 "o.colsum0 = v_dgate;", "o.colsum1 = v_dup;"):
        assert line in src.text, line
    plain = render(make_variant("grouped_gemm_dglu", arch=arch))
    assert src.digest != plain.digest and "kPairedColSum = false;" in plain.text
    (r,) = b.build([v], cache=session_cache)
    assert r.ok, r.error[:3000]
    assert r.spill_bytes == 0 and r.registers > 0, r


# --------------------------------------------------------------------------------------------
# 5. dGLU's bias gradient: the column sums of the interleaved D
# --------------------------------------------------------------------------------------------
RAGGED = [100, 0, 317, 45]          # experts' rows: ragged, the second one empty (the interpreter
                                    # takes any offsets; the kernels' are multiples of 256)


def _dglu_dbias_case(seed: int, n: int, axes=None):
    """The dGLU interpreter with generate_dbias on ragged experts (on the FP32 accumulator, as
    ``reference`` runs it: the ops take offsets in multiples of 256 only), and the formula's D."""
    from fusegemm.interpret import interpret
    rng = np.random.default_rng(seed)
    off = np.cumsum(RAGGED).astype(np.int32)
    valid, l = int(off[-1]), len(RAGGED)
    m = valid + PAD_ROWS
    a = (rng.standard_normal((m, 64)) * 0.5).astype(ml_dtypes.bfloat16)
    w = (rng.standard_normal((l, n, 64)) * 0.25).astype(ml_dtypes.bfloat16)
    alpha, beta = (rng.random(l) + 0.5).astype(F32), (rng.random(l) + 0.5).astype(F32)
    prob = rng.random(m).astype(F32)
    c = (rng.standard_normal((m, 2 * n)) * 2.0).astype(ml_dtypes.bfloat16)
    op = EpilogueGemm("grouped_gemm_dglu", arch="sm_90a", generate_dbias=True, **(axes or {}))
    g = _gemm64(a, off, w)
    out = interpret(op.epilogue, g.astype(F32), offsets=off, m_rows=m,
                    inputs={"alpha": alpha, "beta": beta, "prob": prob, "c": c.astype(NP_DTYPES[op.variant.c_dtype])})
    e = _expert_of_rows(off)
    r = (alpha.astype(np.float64) ** 2)[e, None] * g
    c64 = np.asarray(c.astype(NP_DTYPES[op.variant.c_dtype]), np.float64)[:valid]
    d, _ = dglu_backward(r, c64, beta.astype(np.float64)[e, None], prob[:valid, None].astype(np.float64))
    return op, out, off, d


def _column_sums(x: np.ndarray, off) -> np.ndarray:
    starts = np.concatenate([[0], off[:-1]])
    return np.stack([x[s:t].sum(axis=0) for s, t in zip(starts, off)])


def _dbias_ok(got: np.ndarray, want: np.ndarray, d: np.ndarray, off) -> np.ndarray:
    """Per element: within the per-element bound of (3) summed over the expert's rows."""
    rows = np.diff(np.concatenate([[0], off]))[:, None]
    bound = 2.0 ** -20 * (_column_sums(np.abs(d), off) + rows * np.abs(d).max())
    return np.abs(np.asarray(got, np.float64) - want) <= bound


@pytest.mark.parametrize("axes", [{}, {"d_dtype": "float32", "c_dtype": "float32"}],
                         ids=lambda a: "-".join(f"{k}={v}" for k, v in a.items()) or "default")
def test_dglu_dbias_is_the_column_sums_of_the_interleaved_d(axes):
    n = 160                                           # 5 gate/up block pairs: D is (M, 320)
    op, out, off, d = _dglu_dbias_case(7, n, axes)
    assert op.epilogue.buffers(n, 1024, len(RAGGED))["dbias"] == ((len(RAGGED), 2 * n), "float32", 0.0)
    got = np.asarray(out.dbias)
    assert got.shape == (len(RAGGED), 2 * n) and got.dtype == F32
    want = _column_sums(d, off)                       # D as stored: dgate even blocks, dup odd ones
    ok = _dbias_ok(got, want, d, off)
    assert ok.all(), f"{(~ok).sum()} sums beyond the bound, first at {np.argwhere(~ok)[0]}"
    assert not got[1].any()                           # the empty expert
    # The same comparison rejects sums that ignore the pairing: the roles concatenated instead of
    # interleaved, the roles swapped, or the gate values alone (an unpaired sum, as wide as one role).
    gate, up = _split(d)
    for what, wrong in (("concatenated", np.concatenate([gate, up], axis=1)), ("swapped", _interleave(up, gate)),
                        ("gate twice", _interleave(gate, gate))):
        assert not _dbias_ok(got, _column_sums(wrong, off), d, off).all(), what


def test_a_column_sum_of_one_role_is_the_paired_sums_columns():
    """``of: dgate`` (a value, unpaired) in the same spec gives (L, N): the paired sums' gate
    columns, bit for bit (the same FP32 values summed in the same order)."""
    from fusegemm.generator.spec import parse_spec
    from fusegemm.interpret import interpret, paired_col
    text = (spec_dir() / "grouped_gemm_dglu.yaml").read_text()
    old = "{name: dbias, kind: sum, of: d, scope: column"
    assert old in text
    one = parse_spec(text.replace(old, old.replace("of: d,", "of: dgate,")), "grouped_gemm_dglu.yaml",
                     expected_name="grouped_gemm_dglu")
    both = find_spec("grouped_gemm_dglu")
    n, rng = 96, np.random.default_rng(3)
    off = np.cumsum(RAGGED).astype(np.int32)
    m, l = int(off[-1]) + PAD_ROWS, len(RAGGED)
    acc = rng.standard_normal((int(off[-1]), n)).astype(F32)
    ins = {"alpha": (rng.random(l) + 0.5).astype(F32), "beta": (rng.random(l) + 0.5).astype(F32),
           "prob": rng.random(m).astype(F32), "c": rng.standard_normal((m, 2 * n)).astype(ml_dtypes.bfloat16)}
    sums = []
    for spec in (both, one):
        r = spec.epilogue.resolve(make_variant(spec, arch="sm_90a", generate_dbias=True).choices)
        sums.append(interpret(r, acc, offsets=off, m_rows=m, inputs=ins).dbias)
    paired, gate = sums
    assert paired.shape == (l, 2 * n) and gate.shape == (l, n)
    assert np.array_equal(gate, paired[:, paired_col(np.arange(n), 0)])
