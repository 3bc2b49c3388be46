"""The epilogue language's erf(), pow() and gelu(), and the spec errors of unread inputs and of
constant expressions that are not finite.

1. The interpreter's erf, pow and gelu (their rows of generator/functions.py) against independent
   float64 math on seeded inputs and edge values: erf against a 60-digit Taylor series, pow against
   ``math.pow`` and C99 Annex F's special cases written out here, gelu against
   ``0.5 x erfc(-x / sqrt(2))`` (no cancellation) and against the erf formula the language could
   already spell (the same FP32 steps: the same bits).
2. The README's function table names every function of the table, with its bound.
3. Specs using erf, pow and gelu render to erff/powf/fusegemm::epi::gelu and NVRTC-compile,
   spill-free, for sm_90a and sm_100a.
4. Spec errors, exact message with file:line, on YAML written to tmp_path: a declared input that no
   variant reads; constant subexpressions that are Inf or NaN (division by a constant zero,
   sqrt(-1), log(0), rcp(0), pow out of its domain, clamp with lo > hi, overflow).
"""
from __future__ import annotations

import math
import re
import textwrap
from decimal import Decimal, localcontext
from pathlib import Path

import numpy as np
import pytest

from fusegemm.base.errors import SpecError
from fusegemm.generator.functions import FUNCTIONS
from fusegemm.generator.spec import list_specs, load_spec, parse_spec
from fusegemm.interpret import NUMPY_FUNCTIONS

F32 = np.float32
INF, NAN = float("inf"), float("nan")
FLT_MAX = float(np.finfo(np.float32).max)
MIN_SUB = 2.0 ** -149
ROOT = Path(__file__).resolve().parents[2]


def bits_equal(got, want) -> np.ndarray:
    """Per element: the same float32 bits, or both NaN."""
    g = np.ascontiguousarray(np.asarray(got, F32))
    w = np.ascontiguousarray(np.asarray(want, F32))
    return (g.view(np.uint32) == w.view(np.uint32)) | (np.isnan(g) & np.isnan(w))


def assert_bits(got, want, args) -> None:
    ok = bits_equal(got, want)
    if not ok.all():
        i = int(np.flatnonzero(~ok.ravel())[0])
        at = ", ".join(repr(float(np.ravel(a)[i])) for a in args)
        raise AssertionError(f"{int((~ok).sum())} values differ; first at ({at}): got "
                             f"{float(np.ravel(got)[i])!r}, want {float(np.ravel(want)[i])!r}")


# ============================================================================================
# 1. erf and pow in the interpreter
# ============================================================================================
_PI = Decimal("3.14159265358979323846264338327950288419716939937510582097494459230781640628620899863")


def erf_series(x: float) -> float:
    """erf(x) from its Taylor series in 60-digit decimal arithmetic (|x| <= 6: the largest term,
    about 10^14, leaves 45 exact digits), rounded to float64 once."""
    with localcontext() as ctx:
        ctx.prec = 60
        d = Decimal(x)                 # exact: a float is a dyadic rational
        x2, term, total, n = d * d, d, d, 0
        while True:
            n += 1
            term = -term * x2 / n                       # (-1)^n x^(2n+1) / n!
            add = term / (2 * n + 1)
            total += add
            if add == 0 or abs(add) < abs(total) * Decimal(10) ** -50:
                break
        return float(total * 2 / _PI.sqrt())


def erf_reference(x: np.ndarray) -> np.ndarray:
    out = np.empty(x.shape, np.float64)
    for i, v in enumerate(x.astype(np.float64).ravel()):
        if math.isnan(v) or v == 0.0:      # erf is odd: erf(+-0) = +-0
            out.flat[i] = v
        elif abs(v) > 6.0:                 # 1 - erf(6) = 2e-17: +-1 in float64 (and FP32)
            out.flat[i] = math.copysign(1.0, v)
        else:
            out.flat[i] = erf_series(v)
    return out.astype(F32)


def _erf_inputs() -> np.ndarray:
    rng = np.random.default_rng(7)
    edges = [0.0, -0.0, INF, -INF, MIN_SUB, -MIN_SUB, 1e-40, -1e-40, 2.0 ** -126, 1e-30, -1e-20, 1e-4,
             0.5, -0.5, 1.0, -1.0, 2.0, 3.0, 3.9, -3.9, 3.92, 4.0, -4.0, 5.9, 6.0, 7.0, -10.0, 1e10, FLT_MAX,
             -FLT_MAX]
    x = np.concatenate([edges, rng.standard_normal(300) * 2.0, rng.uniform(-6, 6, 200),
                        np.geomspace(1e-38, 1.0, 60), -np.geomspace(1e-38, 6.0, 60)])
    return x.astype(F32)


def test_erf_matches_a_high_precision_series():
    """Correctly rounded (float64 erf rounded once) on every seeded and edge value, erf(+-0) keeps
    its sign, erf(+-Inf) = +-1."""
    x = _erf_inputs()
    got = NUMPY_FUNCTIONS["erf"](x)
    assert got.dtype == F32 and got.shape == x.shape
    assert_bits(got, erf_reference(x), [x])
    special = NUMPY_FUNCTIONS["erf"](np.array([0.0, -0.0, INF, -INF, NAN], F32))
    assert_bits(special, [0.0, -0.0, 1.0, -1.0, NAN], [special])
    assert np.signbit(special[1]) and not np.signbit(special[0])


def test_erf_is_odd_and_bounded():
    x = np.abs(_erf_inputs())
    pos, neg = NUMPY_FUNCTIONS["erf"](x), NUMPY_FUNCTIONS["erf"](-x)
    assert_bits(neg, -pos, [x])
    assert (np.abs(pos[~np.isnan(pos)]) <= 1.0).all()


# C99 Annex F (F.9.4.4), which CUDA's powf documents case by case: (x, y, pow(x, y)).
ANNEX_F = [
    (NAN, 0.0, 1.0), (NAN, -0.0, 1.0), (INF, 0.0, 1.0), (-3.0, -0.0, 1.0),          # pow(x, +-0) = 1
    (1.0, NAN, 1.0), (1.0, INF, 1.0), (1.0, -INF, 1.0), (1.0, -7.5, 1.0),           # pow(+1, y) = 1
    (-1.0, INF, 1.0), (-1.0, -INF, 1.0),                                            # pow(-1, +-Inf)
    (-8.0, 1.0 / 3.0, NAN), (-2.0, 0.5, NAN), (-0.5, -2.5, NAN), (-FLT_MAX, 0.5, NAN),  # x < 0, y non-integer
    (-2.0, 3.0, -8.0), (-2.0, 2.0, 4.0), (-2.0, -1.0, -0.5), (-2.0, -2.0, 0.25),    # x < 0, y integer
    (-1.0, 16777216.0, 1.0), (-1.0, 16777217.0, 1.0),         # FP32 2^24 + 1 rounds to 2^24: even
    (0.0, -3.0, INF), (-0.0, -3.0, -INF), (0.0, -2.0, INF), (-0.0, -2.0, INF),      # 0^negative
    (-0.0, -0.5, INF), (0.0, -INF, INF), (-0.0, -INF, INF),
    (0.0, 3.0, 0.0), (-0.0, 3.0, -0.0), (-0.0, 2.0, 0.0), (-0.0, 0.5, 0.0), (-0.0, INF, 0.0),
    (0.5, -INF, INF), (-0.5, -INF, INF), (2.0, -INF, 0.0), (-2.0, -INF, 0.0),       # y = -Inf
    (0.5, INF, 0.0), (-0.5, INF, 0.0), (2.0, INF, INF), (-2.0, INF, INF),           # y = +Inf
    (-INF, -3.0, -0.0), (-INF, -2.0, 0.0), (-INF, -0.5, 0.0),                       # x = -Inf
    (-INF, 3.0, -INF), (-INF, 2.0, INF), (-INF, 0.5, INF),
    (INF, -1.0, 0.0), (INF, -0.5, 0.0), (INF, 0.5, INF), (INF, 2.0, INF),           # x = +Inf
    (NAN, 1.0, NAN), (2.0, NAN, NAN), (-2.0, NAN, NAN), (NAN, NAN, NAN), (0.0, NAN, NAN), (-0.0, NAN, NAN),
    (-1.0, NAN, NAN), (NAN, -1.0, NAN),                       # only +1 and an exponent of 0 hide a NaN
    (2.0, 128.0, INF), (-2.0, 129.0, -INF), (2.0, -149.0, MIN_SUB), (2.0, -150.0, 0.0),   # FP32 range
    (-2.0, -149.0, -MIN_SUB), (-2.0, -151.0, -0.0), (3e38, 2.0, INF), (0.5, 149.5, MIN_SUB),
    (0.5, 150.5, 0.0),
]


def test_pow_special_cases_are_c99_powf():
    x = np.array([c[0] for c in ANNEX_F], F32)
    y = np.array([c[1] for c in ANNEX_F], F32)
    assert_bits(NUMPY_FUNCTIONS["pow"](x, y), np.array([c[2] for c in ANNEX_F], F32), [x, y])


def _pow_reference(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """math.pow in float64 on finite arguments whose float64 power is finite and defined (what
    the seeded cases hold), rounded once to FP32."""
    out = np.array([math.pow(float(a), float(b)) for a, b in zip(x, y)], np.float64)
    with np.errstate(over="ignore"):
        return out.astype(F32)


def test_pow_matches_math_pow_on_seeded_inputs():
    rng = np.random.default_rng(11)
    n = 600
    pos_x = np.concatenate([np.exp(rng.uniform(-9, 9, n)), rng.uniform(0.5, 2.0, n)])
    pos_y = np.concatenate([rng.uniform(-20, 20, n), rng.uniform(-300, 300, n)])      # over/underflow too
    neg_x = -np.exp(rng.uniform(-4, 4, n))
    int_y = rng.integers(-40, 41, n).astype(np.float64)
    big_y = np.array([2.0 ** 24, 2.0 ** 24 + 2, 2.0 ** 30, -(2.0 ** 25)])           # even integers
    near1 = np.array([-(1 + 2.0 ** -23), -(1 - 2.0 ** -24), 1 + 2.0 ** -23, 1 - 2.0 ** -24])
    x = np.concatenate([pos_x, neg_x, np.repeat(near1, 4)]).astype(F32)
    y = np.concatenate([pos_y, int_y, np.tile(big_y, 4)]).astype(F32)
    got = NUMPY_FUNCTIONS["pow"](x, y)
    assert got.dtype == F32 and got.shape == x.shape
    assert_bits(got, _pow_reference(x, y), [x, y])
    # the seeds reach what they are for: negative results, overflow to Inf, subnormals and 0
    assert (got < 0).sum() > 100 and np.isinf(got).sum() > 10
    assert ((got > 0) & (got < 2.0 ** -126)).sum() > 3 and (got == 0).sum() > 10


def test_pow_negative_base_non_integer_exponent_is_nan():
    rng = np.random.default_rng(3)
    x = -np.exp(rng.uniform(-5, 5, 300)).astype(F32)
    y = (rng.integers(-20, 20, 300) + rng.uniform(0.01, 0.99, 300)).astype(F32)
    assert np.isnan(NUMPY_FUNCTIONS["pow"](x, y)).all()
    assert not np.isnan(NUMPY_FUNCTIONS["pow"](x, np.round(y))).any()


def test_loading_specs_imports_no_numpy():
    """The numpy definitions sit in the function table, but numpy is imported only when one is
    called (a constant call folded at load, the interpreter): loading the specs, and so the CLI,
    stays as fast to start as before."""
    import subprocess
    import sys
    code = ("import sys; from fusegemm.generator.spec import list_specs, load_spec; "
            "[load_spec(p) for p in list_specs()]; sys.exit('numpy' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_erf_pow_rows():
    """The rows the C++ is rendered from: the CUDA math library calls and their documented
    maximum errors (CUDA C++ Programming Guide: erff 2 ulp, powf 4 ulp)."""
    assert (FUNCTIONS["erf"].arity, FUNCTIONS["erf"].cpp, FUNCTIONS["erf"].ulp) == (1, "erff({0})", 2)
    assert (FUNCTIONS["pow"].arity, FUNCTIONS["pow"].cpp, FUNCTIONS["pow"].ulp) == (2, "powf({0}, {1})", 4)


# --------------------------------------------------------------------------------------------
# gelu: exact GELU, 0.5 x (1 + erf(x / sqrt(2)))
# --------------------------------------------------------------------------------------------
def test_gelu_row():
    """The C++ it renders to (fusegemm::epi::gelu: torch's FP32 steps with erff), and its bound: 1 ulp
    of the result plus 2^-23 |x| absolute, where 1 + erf cancels."""
    f = FUNCTIONS["gelu"]
    assert (f.arity, f.cpp, f.ulp, f.abs_x) == (1, "fusegemm::epi::gelu({0})", 1, 2.0 ** -23)
    assert all(g.abs_x == 0.0 for name, g in FUNCTIONS.items() if name != "gelu")


def _gelu_inputs() -> np.ndarray:
    rng = np.random.default_rng(17)
    return np.concatenate([np.linspace(-12, 12, 24001), rng.standard_normal(20000) * 3,
                           np.geomspace(1e-30, 20, 2000), -np.geomspace(1e-30, 20, 2000)]).astype(F32)


def _gelu_true(x: np.ndarray) -> np.ndarray:
    """GELU in float64 as 0.5 x erfc(-x / sqrt(2)): the same function without the cancellation of
    1 + erf (and without the interpreter's FP32 steps or its erf)."""
    return np.array([0.5 * v * math.erfc(-v / math.sqrt(2.0)) for v in x.astype(np.float64)])


def test_gelu_matches_float64_gelu_within_its_stated_tolerance():
    """Against the true GELU: within 2^-25 |x| plus 1 ulp of the result everywhere (the FP32 steps
    round erf to 2^-25 absolute and 1 + erf cancels it for x < -3), within 2 ulp for x >= 0."""
    x = _gelu_inputs()
    got = NUMPY_FUNCTIONS["gelu"](x)
    assert got.dtype == F32 and got.shape == x.shape
    true = _gelu_true(x)
    ulp = np.spacing(np.abs(true.astype(F32))).astype(np.float64)
    err = np.abs(got.astype(np.float64) - true)
    bound = 2.0 ** -25 * np.abs(x.astype(np.float64)) + ulp
    worst = int(np.argmax(err - bound))
    assert (err <= bound).all(), f"x = {x[worst]!r}: {got[worst]!r} vs {true[worst]!r}"
    assert (err[x >= 0] <= 2 * ulp[x >= 0]).all()
    # not gelu_tanh, and negative x reach the cancelling range (tiny negative results)
    assert not bits_equal(got, NUMPY_FUNCTIONS["gelu_tanh"](x)).all()
    assert ((got < 0) & (got > -1e-4)).sum() > 1000


def test_gelu_edges():
    """NaN stays NaN; gelu(-Inf) = -Inf * (1 + erf(-Inf)) = -Inf * 0 is NaN, as torch's FP32 formula
    gives; the sign of zero is kept; below about -5.4 erf is -1 in FP32 and the result is -0; at
    FLT_MAX, (x * 0.5) * 2 is exact."""
    x = np.array([0.0, -0.0, INF, -INF, NAN, MIN_SUB, -MIN_SUB, -10.0, FLT_MAX, 3.0], F32)
    got = NUMPY_FUNCTIONS["gelu"](x)
    assert_bits(got[:9], [0.0, -0.0, INF, NAN, NAN, 0.0, -0.0, -0.0, FLT_MAX], [x[:9]])   # 0.5 * 2^-149: 0
    assert float(got[9]) == float(F32(1.5 * (1 + math.erf(3 / math.sqrt(2)))))   # correctly rounded here


def test_gelu_is_the_erf_formula_the_language_spells():
    """gelu(x) takes the same FP32 steps as ``0.5 * x * (1 + erf(x * 0.7071067811865476))``
    written in a spec (whose C++, __fmul_rn(__fmul_rn(0.5, x), __fadd_rn(1, erff(...))), is pinned
    by test_erf_and_pow_render_and_compile): the interpreter gives the same bits for both."""
    from fusegemm.generator.variants import make_variant
    from fusegemm.interpret import interpret
    spec = parse_spec(GELU_SPEC.replace("- d = gelu(x)", "- d = 0.5 * x * (1 + erf(x * 0.7071067811865476))"),
                      "demo.yaml", expected_name="demo")
    both = parse_spec(GELU_SPEC, "demo.yaml", expected_name="demo")
    x = _gelu_inputs()[: 64 * 256].reshape(256, 64)
    x[0, :5] = [NAN, INF, -INF, 0.0, -0.0]
    got = []
    for sp in (both, spec):
        r = sp.epilogue.resolve(make_variant(sp, arch="sm_90a").choices)
        ins = {"alpha": np.ones(1, F32), "bias": np.full((64, 1), -0.0, F32)}     # fma(1, x, -0) = x
        got.append(interpret(r, x, offsets=np.array([256]), m_rows=256, inputs=ins).out_values["d"])
    assert_bits(got[0], got[1], [x])
    assert_bits(got[0], NUMPY_FUNCTIONS["gelu"](x), [x])


def test_gelu_bound_holds_for_any_erf_within_its_ulp():
    """The table's bound for gelu is what erff's own 2 ulp allow: the model with its erf moved by
    -2 .. +2 ulp (what CUDA's erff may return) stays within 1 ulp plus 2^-23 |x| of the model, and
    the same test with half the absolute term fails (the term is needed, not decoration)."""
    from fusegemm.generator.functions import GELU_RSQRT2
    x = _gelu_inputs()
    model = NUMPY_FUNCTIONS["gelu"](x).astype(np.float64)
    e = NUMPY_FUNCTIONS["erf"]((x * F32(GELU_RSQRT2)).astype(F32))
    ulp = np.spacing(np.abs(model.astype(F32))).astype(np.float64)
    f = FUNCTIONS["gelu"]
    worst_needed = 0.0
    for k in (-2, -1, 1, 2):
        ek = e
        for _ in range(abs(k)):
            ek = np.nextafter(ek, F32(INF if k > 0 else -INF)).astype(F32)
        ek = np.clip(ek, F32(-1), F32(1))                                    # erff never leaves [-1, 1]
        cpp = ((x * F32(0.5)).astype(F32) * (F32(1) + ek).astype(F32)).astype(F32).astype(np.float64)
        err = np.abs(cpp - model)
        abs_term = f.abs_x * np.abs(x.astype(np.float64))
        assert (err <= f.ulp * ulp + abs_term).all(), k
        worst_needed = max(worst_needed, float(np.max((err - f.ulp * ulp) / np.maximum(abs_term, 1e-300))))
    assert worst_needed > 0.5


# ============================================================================================
# 2. The README's function table is the table's
# ============================================================================================
def test_readme_function_table_lists_every_function_with_its_bound():
    text = (ROOT / "README.md").read_text()
    head = text.index("| function | C++ | max C++ vs numpy distance |")
    rows = text[head:].split("\n\n", 1)[0].splitlines()[2:]
    documented: dict[str, tuple[int, float]] = {}
    for row in rows:
        names, _, bound = (c.strip() for c in row.strip("|").split("|"))
        ulp = int(re.match(r"(\d+) ulp", bound).group(1))
        absolute = re.search(r"plus 2\^(-\d+) abs\(x\) absolute", bound)
        for name in names.split(","):
            documented[name.strip()] = (ulp, 2.0 ** int(absolute.group(1)) if absolute else 0.0)
    assert documented == {name: (f.ulp, f.abs_x) for name, f in FUNCTIONS.items()}


# ============================================================================================
# 3. erf and pow render and compile on both archs
# ============================================================================================
ERF_POW_SPEC = textwrap.dedent("""\
    schema: 2
    name: demo
    kernel: grouped_gemm
    problem: grouped
    summary: exact GELU raised to a per-row power
    epilogue:
      inputs:
        alpha: {per: expert}
        prob: {per: row, default: 1.0}
      compute:
        - x = alpha * acc
        - g = 0.5 * x * (1 + erf(x * 0.7071067811865476))
        - d = pow(abs(g), prob)
      outputs:
        d: {dtype: bfloat16}
    choices:
      tile_m: [128]
      tile_n: [256]
      cluster_m: [1]
      cluster_n: [1]
    defaults: {}
    """)


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_erf_and_pow_render_and_compile(arch, session_cache):
    from fusegemm import build as b
    from fusegemm.generator.render import render
    from fusegemm.generator.variants import make_variant
    v = make_variant(parse_spec(ERF_POW_SPEC, "demo.yaml", expected_name="demo"), arch=arch)
    text = render(v).text
    assert "v_g = __fmul_rn(__fmul_rn(0x1.0000000000000p-1f, v_x), __fadd_rn(0x1.0000000000000p+0f, " \
           "erff(__fmul_rn(v_x, 0x1.6a09e60000000p-1f))));" in text
    assert "v_d = powf(fabsf(v_g), ri.prob);" in text
    (r,) = b.build([v], cache=session_cache)
    assert r.ok, r.error[:3000]
    assert r.spill_bytes == 0 and r.registers > 0 and r.advisories == ()


GELU_SPEC = textwrap.dedent("""\
    schema: 2
    name: demo
    kernel: grouped_gemm
    problem: grouped
    summary: exact GELU of the scaled accumulator plus a bias
    epilogue:
      inputs:
        alpha: {per: expert}
        bias: {per: column, dtype: bfloat16}
      compute:
        - x = fma(alpha, acc, bias)
        - d = gelu(x)
      outputs:
        d: {dtype: bfloat16}
    choices:
      vector_f32: [false, true]
      tile_m: [128]
      tile_n: [256]
      cluster_m: [1]
      cluster_n: [1]
    defaults: {vector_f32: false}
    """)


@pytest.mark.parametrize("arch,vector_f32", [("sm_90a", False), ("sm_100a", False), ("sm_100a", True)])
def test_gelu_renders_and_compiles(arch, vector_f32, session_cache):
    """gelu() renders to fusegemm::epi::gelu (per lane in the packed vector_f32 rule) and compiles
    spill-free on both archs. (With a bias, as an MLP applies it: without column or element inputs
    the sm_90a kernel keeps a 16-bit D of the whole tile in registers (deferred D), and at TILE_N
    256 erff's temporaries spill a few bytes there, gelu's or a bare erf's alike.)"""
    from fusegemm import build as b
    from fusegemm.generator.render import render
    from fusegemm.generator.variants import make_variant
    v = make_variant(parse_spec(GELU_SPEC, "demo.yaml", expected_name="demo"), arch=arch, vector_f32=vector_f32)
    text = render(v).text
    assert "v_d = fusegemm::epi::gelu(v_x);" in text
    if vector_f32:
        assert "return fusegemm::epi::gelu(x0); }, v_x)" in text
    (r,) = b.build([v], cache=session_cache)
    assert r.ok, r.error[:3000]
    assert r.spill_bytes == 0 and r.registers > 0 and r.advisories == ()


# ============================================================================================
# 4. Spec errors: unread inputs, constant subexpressions that are not finite
# ============================================================================================
BASE = textwrap.dedent("""\
    schema: 2
    name: demo
    kernel: grouped_gemm
    problem: grouped
    summary: test spec
    epilogue:
      inputs:
        alpha: {per: expert}
        prob: {per: row, default: 1.0}
        bias: {per: column, dtype: bias_dtype}
        norm_const: {per: scalar}
      compute:
        - g = alpha * acc
        - d = where(present(bias), g + prob * bias, g)
      outputs:
        d: {dtype: d_dtype, quantize: {norm_const: norm_const}}
    choices:
      d_dtype: [bfloat16, float8_e4m3fn]
      bias_dtype: [none, bfloat16]
      tile_m: [128]
      tile_n: [256]
      cluster_m: [1]
      cluster_n: [1]
    defaults:
      d_dtype: bfloat16
      bias_dtype: none
    """)
ALPHA = "    alpha: {per: expert}\n"                                   # line 8
G = "- g = alpha * acc"                                                # line 13
D = "- d = where(present(bias), g + prob * bias, g)"                   # line 14
UNREAD = "is declared but no variant reads it"
READ_IT = "allowed: read it in a statement an output or reduction uses, or remove it"
DROPPED = ("every place that names it is dropped in every variant (a statement no output or reduction uses, a "
           "where(present(...)) branch no variant takes, or present() itself, which reads no data)")
FINITE = "allowed: constant subexpressions whose FP32 value is finite"
NONZERO = "divides by a constant zero (every element would be +-Inf or NaN); allowed: a divisor that is not a constant zero"


def edit(old: str, new: str, base: str = BASE) -> str:
    assert base.count(old) == 1, f"edit target {old!r} not found exactly once"
    return base.replace(old, new)


def load_error(tmp_path: Path, text: str) -> str:
    """The SpecError of loading ``text`` from a file, as a user sees it."""
    path = tmp_path / "demo.yaml"
    path.write_text(text)
    with pytest.raises(SpecError) as info:
        load_spec(path)
    return str(info.value)


def test_base_loads_with_inputs_read_only_under_some_variants(tmp_path):
    """The control: prob is read only when bias is present, norm_const only when D is FP8, bias
    only when bias_dtype is not none; each is read by some variant, so the spec is legal."""
    path = tmp_path / "demo.yaml"
    path.write_text(BASE)
    ep = load_spec(path).epilogue
    assert [i.name for i in ep.resolve({"d_dtype": "bfloat16", "bias_dtype": "none"}).inputs] == ["alpha"]
    assert {i.name for i in ep.resolve({"d_dtype": "float8_e4m3fn", "bias_dtype": "bfloat16"}).inputs} == \
        {"alpha", "prob", "bias", "norm_const"}


@pytest.mark.parametrize("path", list_specs(), ids=lambda p: p.stem)
def test_every_spec_still_loads(path):
    assert load_spec(path).epilogue.inputs is not None


UNREAD_CASES = [
    pytest.param(edit(ALPHA, ALPHA + "    gamma: {per: expert}\n"),
                 f"demo.yaml:9: epilogue.inputs.gamma: 'gamma' {UNREAD}: no statement names it and no "
                 f"quantize: takes it as norm_const; {READ_IT}", id="never named"),
    pytest.param(edit(G, G + "\n    - t = gamma * acc", edit(ALPHA, ALPHA + "    gamma: {per: row}\n")),
                 f"demo.yaml:9: epilogue.inputs.gamma: 'gamma' {UNREAD}: {DROPPED}; {READ_IT}",
                 id="named only by a statement nothing uses"),
    pytest.param(edit(D, "- d = where(present(bias), g, prob * g)"),
                 f"demo.yaml:10: epilogue.inputs.bias: 'bias' {UNREAD}: {DROPPED}; {READ_IT}",
                 id="named only in present()"),
    pytest.param(edit("bias_dtype: [none, bfloat16]", "bias_dtype: [none]"),
                 f"demo.yaml:9: epilogue.inputs.prob: 'prob' {UNREAD}: {DROPPED}; {READ_IT}",
                 id="named only in a branch no variant takes"),
    pytest.param(edit("bias_dtype: [none, bfloat16]", "bias_dtype: [none]",
                      edit(D, "- d = where(present(bias), g + prob * bias, g * prob)")),
                 f"demo.yaml:10: epilogue.inputs.bias: 'bias' {UNREAD}: it is absent in every variant "
                 f"(bias_dtype offers only none); {READ_IT}", id="absent in every variant"),
]


@pytest.mark.parametrize("text,message", UNREAD_CASES)
def test_unread_input_is_a_spec_error(tmp_path, text, message):
    assert load_error(tmp_path, text) == f"{tmp_path}/{message}"


def _stmt(line: int, index: int, text: str, sub: str, what: str) -> str:
    col = text.index(sub) + 1
    return f"demo.yaml:{line}: epilogue.compute[{index}]: {sub!r} at column {col} of {text!r} {what}"


OVERFLOW = f"is +Inf for every element (beyond the largest FP32 value, 3.4028235e+38); {FINITE}"
CONSTANT_CASES = [(G, 13, 0, t, sub, what) for t, sub, what in [
    ("g = alpha * acc / 0", "alpha * acc / 0", NONZERO),
    ("g = alpha * acc / -0.0", "alpha * acc / -0.0", NONZERO),
    ("g = alpha * acc / (0.5 - 0.5)", "alpha * acc / (0.5 - 0.5)", NONZERO),
    ("g = alpha * acc / (1e-30 * 1e-30)", "alpha * acc / (1e-30 * 1e-30)", NONZERO),     # underflows to 0
    ("g = alpha * sqrt(-1) * acc", "sqrt(-1)",
     f"is NaN for every element (the square root of a negative number); {FINITE}"),
    ("g = alpha * acc + log(0)", "log(0)", f"is -Inf for every element (the log of 0); {FINITE}"),
    ("g = alpha * acc + log(-2)", "log(-2)", f"is NaN for every element (the log of a negative number); {FINITE}"),
    ("g = alpha * acc * rcp(0)", "rcp(0)", f"is +Inf for every element (1 / 0); {FINITE}"),
    ("g = alpha * pow(-8, 0.5) * acc", "pow(-8, 0.5)",
     f"is NaN for every element (a negative number to a non-integer power); {FINITE}"),
    ("g = alpha * acc * pow(-0.0, -3)", "pow(-0.0, -3)",
     f"is -Inf for every element (0 to a negative power); {FINITE}"),
    ("g = pow(alpha * acc, pow(2, 200))", "pow(2, 200)", OVERFLOW),
    ("g = clamp(alpha * acc, 1, 0)", "clamp(alpha * acc, 1, 0)",
     "has constant bounds lo = 1 > hi = 0 (every element would be 0); allowed: lo <= hi"),
    ("g = clamp(alpha * acc, 0.25 * 2, -1.5)", "clamp(alpha * acc, 0.25 * 2, -1.5)",
     "has constant bounds lo = 0.5 > hi = -1.5 (every element would be -1.5); allowed: lo <= hi"),
    ("g = alpha * acc * (1e38 * 10)", "(1e38 * 10)", OVERFLOW),
    ("g = alpha * exp(89) * acc", "exp(89)", OVERFLOW),
    ("g = where(alpha > 0, acc, -(3e38 + 3e38))", "(3e38 + 3e38)", OVERFLOW),
    ("g = alpha * acc * fma(2e38, 2, 2e38)", "fma(2e38, 2, 2e38)", OVERFLOW),
]] + [
    (D, 14, 1, "d = where(present(bias), g + prob * bias / 0, g)", "prob * bias / 0", NONZERO),
]


@pytest.mark.parametrize("old,line,index,text,sub,what", CONSTANT_CASES, ids=[c[3] for c in CONSTANT_CASES])
def test_constant_that_is_not_finite_is_a_spec_error(tmp_path, old, line, index, text, sub, what):
    assert load_error(tmp_path, edit(old, f"- {text}")) == f"{tmp_path}/{_stmt(line, index, text, sub, what)}"


@pytest.mark.parametrize("text", [
    "g = alpha * acc * exp(-200)",              # underflows to 0: finite
    "g = alpha * acc + log(1e-45)",             # the smallest subnormal: finite
    "g = clamp(alpha * acc, 0.5, 0.5)",         # lo == hi
    "g = alpha * acc * pow(-2, 3) / 1e-45",     # a negative base to an integer power; a tiny divisor
    "g = alpha * acc * (3.4e38 + 1e31)",        # rounds to FLT_MAX, not past it
    "g = alpha * acc * fma(2e38, 2, -2e38)",    # 4e38 only before fma's one rounding
    "g = where(1 < 2, alpha * acc, 0)",         # a constant condition
    "g = alpha * acc * pow(0, 2) + pow(0, 0)",  # 0 and 1
])
def test_finite_constants_load(tmp_path, text):
    path = tmp_path / "demo.yaml"
    path.write_text(edit(G, f"- {text}"))
    assert load_spec(path).epilogue.statements[0].text == text
