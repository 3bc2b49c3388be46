"""fusegemm.interpret: the numpy interpreter of any spec's epilogue.

1. The numpy twin of every epilogue function on edge values (NaN, +-Inf, -0, subnormals), the
   statement semantics (FP32 numbers, one rounding per operator), pairing, defaults, inputs.
2. Cross-check with the hand-written references of the five seed ops (fusegemm.reference):
   seeded problems, the reference's own accumulator, the seed spec's epilogue resolved for the
   matching variant; C/D/D_col/SFD bytes/amax bit-exact, dprob within FP32 rounding.
3. An independent scalar-loop check of the SwiGLU example spec (silu(alpha*gate) * alpha*up * prob,
   MXFP8 row quantization, the SFD byte layout written from the C++ offset formula).
"""
from __future__ import annotations

import math
import textwrap

import ml_dtypes
import numpy as np
import pytest

from fusegemm import reference as R
from fusegemm.formats import pack_sf, unpack_sf
from fusegemm.generator.functions import FUNCTIONS
from fusegemm.generator.spec import find_spec, parse_spec
from fusegemm.generator.variants import make_variant
from fusegemm.interpret import NUMPY_FUNCTIONS, Interpreted, interpret, paired_col, sfd_block_scales
from fusegemm.problems import make_batched_problem, make_grouped_problem
from fusegemm.reference._operands import parse_grouped

F32 = np.float32
INF, NAN = float("inf"), float("nan")
FLT_MAX = float(np.finfo(np.float32).max)
MIN_SUB = 2.0 ** -149
MIN_NORMAL = 2.0 ** -126
# SFD rl the references use by default (e5m2: the page's 1/57344, e5m2_rcp_max="page").
RL = {"float8_e4m3fn": 1.0 / 448.0, "float8_e5m2": 1.0 / 57344.0, "float4_e2m1fn_x2": 1.0 / 6.0}


def bits32(x) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(x, dtype=F32)).view(np.uint32)


def same32(got, want) -> bool:
    """Bit-identical float32 (NaN: any NaN)."""
    g, w = np.asarray(got, F32), np.asarray(want, F32)
    both_nan = np.isnan(g) & np.isnan(w)
    return bool(np.all(both_nan | (bits32(g) == bits32(w))))


def fn(name, *args):
    return NUMPY_FUNCTIONS[name](*(np.asarray(a, dtype=F32) for a in args))


# ============================================================================================
# 1. Functions
# ============================================================================================
def test_every_function_has_a_numpy_twin():
    """Adding a function to generator/functions.py without its numpy definition fails here."""
    assert set(NUMPY_FUNCTIONS) == set(FUNCTIONS), (
        f"missing numpy twins: {sorted(set(FUNCTIONS) - set(NUMPY_FUNCTIONS))}; "
        f"stale: {sorted(set(NUMPY_FUNCTIONS) - set(FUNCTIONS))}")
    x = np.array([-1.5, 0.0, 2.0], F32)
    for name, f in FUNCTIONS.items():
        out = NUMPY_FUNCTIONS[name](*([x] * f.arity))
        assert out.shape == x.shape
        assert out.dtype == (np.bool_ if name == "isnan" else F32), name


def test_relu_nan_signed_zero_subnormal():
    x = [NAN, -INF, INF, -0.0, 0.0, -MIN_SUB, MIN_SUB, -3.0, 3.0]
    got = fn("relu", x)
    want = [NAN, 0.0, INF, 0.0, 0.0, 0.0, MIN_SUB, 0.0, 3.0]
    assert same32(got, want)
    assert not np.any(np.signbit(got[1:]))                   # -0 and negatives give +0


def test_min_max_clamp_follow_the_cpp_comparisons():
    # fmin_nan(a, b) = (a < b || a != a) ? a : b ; fmax_nan with >.
    a = [NAN, 1.0, NAN, -0.0, 0.0, -INF, 2.0]
    b = [1.0, NAN, NAN, 0.0, -0.0, INF, 2.0]
    assert same32(fn("min", a, b), [NAN, NAN, NAN, 0.0, -0.0, -INF, 2.0])
    assert same32(fn("max", a, b), [NAN, NAN, NAN, 0.0, -0.0, INF, 2.0])
    # signed zeros: equal operands give the second one, bit for bit
    assert bits32(fn("min", -0.0, 0.0)) == bits32(0.0) and bits32(fn("max", 0.0, -0.0)) == bits32(-0.0)
    x = [NAN, -5.0, 0.5, 5.0, -INF, INF]
    assert same32(fn("clamp", x, -1.0, 1.0), [NAN, -1.0, 0.5, 1.0, -1.0, 1.0])
    assert same32(fn("clamp", 0.5, NAN, 1.0), NAN) and same32(fn("clamp", 0.5, 0.0, NAN), NAN)


def test_fma_is_rounded_once():
    # x*y + z = 1 + 3*2^-24 - 2^-70: just below the midpoint between 1+2^-23 and 1+2^-22.
    # A float64 sum rounds it onto the midpoint and then to even (1+2^-22); a true fma gives 1+2^-23.
    x, y, z = F32(2.0**-24 * (1 + 2.0**-23)), F32(1 - 2.0**-23), F32(1 + 2.0**-23)
    assert float(fn("fma", x, y, z)) == 1 + 2.0**-23
    naive = F32(np.float64(x) * np.float64(y) + np.float64(z))
    assert float(naive) == 1 + 2.0**-22                      # what double rounding gives
    # the same just above the midpoint rounds up
    assert float(fn("fma", x, F32(1 + 2.0**-23), z)) == 1 + 2.0**-22
    # exact against rational arithmetic on random operands (including subnormal products)
    from fractions import Fraction
    rng = np.random.default_rng(1)
    xs = (rng.standard_normal(300) * 2.0 ** rng.integers(-80, 60, 300)).astype(F32)
    ys = (rng.standard_normal(300) * 2.0 ** rng.integers(-80, 60, 300)).astype(F32)
    zs = (-(xs.astype(np.float64) * ys) * (1 + rng.standard_normal(300) * 2.0**-20)).astype(F32)
    got = fn("fma", xs, ys, zs)
    for a, b, c, g in zip(xs, ys, zs, got):
        exact = Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c))
        assert float(g) == _round_fraction_to_f32(exact)
    assert same32(fn("fma", [INF, 0.0, 2.0, -0.0], [0.0, 5.0, 3.0, 1.0], [1.0, -0.0, NAN, -0.0]),
                  [NAN, 0.0, NAN, -0.0])


def _round_fraction_to_f32(q) -> float:
    """Correct RNE rounding of a rational to float32 (normal and subnormal results)."""
    from fractions import Fraction
    if q == 0:
        return 0.0
    sign = -1.0 if q < 0 else 1.0
    q = abs(q)
    e = math.floor(math.log2(q.numerator) - math.log2(q.denominator))
    while Fraction(2) ** e > q:
        e -= 1
    while Fraction(2) ** (e + 1) <= q:
        e += 1
    ulp_e = max(e, -126) - 23
    scaled = q / Fraction(2) ** ulp_e
    n = math.floor(scaled)
    rem = scaled - n
    if rem > Fraction(1, 2) or (rem == Fraction(1, 2) and n % 2):
        n += 1
    return sign * float(F32(n * 2.0**ulp_e))


def test_rcp_sqrt_correctly_rounded_with_subnormals():
    assert same32(fn("rcp", [0.0, -0.0, INF, -INF, NAN, 3.0]), [INF, -INF, 0.0, -0.0, NAN, float(F32(1) / F32(3))])
    # 1 / (1.5 * 2^127) = 2^-127 / 1.5: a subnormal result, not flushed
    r = fn("rcp", 1.5 * 2.0**127)
    assert 0 < float(r) < MIN_NORMAL and float(r) == float(F32(2.0**-127 / 1.5))
    assert float(fn("rcp", MIN_SUB)) == INF                   # 2^149 overflows
    assert same32(fn("sqrt", [-0.0, 0.0, -1.0, INF, -INF, NAN, MIN_SUB, 2.0]),
                  [-0.0, 0.0, NAN, INF, NAN, NAN, 2.0**-74.5, float(F32(math.sqrt(2.0)))])
    assert np.signbit(fn("sqrt", -0.0))


def test_exp_log_tanh_edges():
    assert same32(fn("exp", [-INF, INF, NAN, 0.0, -0.0, 89.0, -100.0, -200.0]),
                  [0.0, INF, NAN, 1.0, 1.0, INF, float(F32(math.exp(-100.0))), 0.0])
    assert 0 < float(fn("exp", -100.0)) < MIN_NORMAL                      # subnormal, not flushed
    assert same32(fn("log", [0.0, -0.0, -1.0, INF, NAN, 1.0, MIN_SUB]),
                  [-INF, -INF, NAN, INF, NAN, 0.0, float(F32(-149 * math.log(2)))])
    assert same32(fn("tanh", [INF, -INF, -0.0, NAN, 20.0, MIN_SUB]), [1.0, -1.0, -0.0, NAN, 1.0, MIN_SUB])
    assert np.signbit(fn("tanh", -0.0))


def test_sigmoid_silu_gelu_edges_and_constants():
    assert same32(fn("sigmoid", [-INF, INF, NAN, 0.0, -0.0]), [0.0, 1.0, NAN, 0.5, 0.5])
    # correctly rounded from float64 (the dSwiGLU reference's definition)
    x = np.linspace(-30, 30, 2001).astype(F32)
    want = (1.0 / (1.0 + np.exp(-x.astype(np.float64)))).astype(F32)
    assert same32(fn("sigmoid", x), want)
    assert same32(fn("silu", [-INF, INF, NAN, -0.0, 0.0, -1000.0]), [NAN, INF, NAN, -0.0, 0.0, -0.0])
    assert np.signbit(fn("silu", -1000.0))
    want = (x.astype(np.float64) / (1.0 + np.exp(-x.astype(np.float64)))).astype(F32)
    assert same32(fn("silu", x), want)
    # gelu_tanh uses the C++'s FP32 constants, not the float64 ones
    k0, k1 = float.fromhex("0x1.988454p-1"), float.fromhex("0x1.6e4e26p-5")
    assert k0 == float(F32(math.sqrt(2 / math.pi))) and k1 == float(F32(0.044715))
    x = np.concatenate([np.linspace(-6, 6, 20001), np.linspace(-30, -6, 2001)]).astype(F32)
    # the argument u in FP32, by the C++'s operation sequence; then x * sigmoid(2u) rounded once
    x3 = ((x * x).astype(F32) * x).astype(F32)
    u = (F32(k0) * (x + (F32(k1) * x3).astype(F32)).astype(F32)).astype(F32)
    x64 = x.astype(np.float64)
    with np.errstate(over="ignore"):
        want = (x64 / (1.0 + np.exp(-2.0 * u.astype(np.float64)))).astype(F32)
    assert same32(fn("gelu_tanh", x), want)
    # same function as 0.5 x (1 + tanh u): within 2 ulp wherever 1 + tanh(u) does not cancel
    pos = x[(x > -1) & (x != 0)]
    tanh_form = (0.5 * pos.astype(np.float64) * (1 + np.tanh(u[(x > -1) & (x != 0)].astype(np.float64)))).astype(F32)
    got = fn("gelu_tanh", pos)
    assert np.all(np.abs(got.view(np.int32).astype(np.int64) - tanh_form.view(np.int32)) <= 2)
    # for x < -1 the tanh form cancels; the logistic form keeps the tiny true value
    assert float(fn("gelu_tanh", -8.0)) < 0 and float(fn("gelu_tanh", -8.0)) != 0.0
    k0_64, k1_64 = math.sqrt(2 / math.pi), 0.044715          # the float64 constants round differently
    x = np.linspace(-6, 6, 20001).astype(F32)
    x64 = x.astype(np.float64)
    other = (0.5 * x64 * (1 + np.tanh(k0_64 * (x64 + k1_64 * x64**3)))).astype(F32)
    assert not same32(other, fn("gelu_tanh", x))
    assert same32(fn("gelu_tanh", [INF, -INF, NAN, 0.0, -0.0]), [INF, NAN, NAN, 0.0, -0.0])
    assert same32(fn("isnan", [NAN, INF, 0.0]).astype(F32), [1.0, 0.0, 0.0])


def _ulps(a, b) -> np.ndarray:
    def key(x):
        i = bits32(x).astype(np.int64)
        return np.where(i >= 2**31, -(i - 2**31), i)
    return np.abs(key(a) - key(b))


def test_cpp_compositions_within_declared_ulp():
    """The C++ forms (overflow-free sigmoid: rcp_rn(1 + expf(-x)) for x >= 0, e / (1 + e) with
    e = expf(x) below; silu = x * sigmoid(x)), emulated with a correctly rounded expf, stay within
    the table's ulp wherever the logistic term is normal, and within SUBNORMAL_ABS below that.
    (The device itself is measured by tests/gpu/test_epilogue_gpu.py.)"""
    from fusegemm.generator.functions import SUBNORMAL_ABS
    x = np.linspace(-110.0, 88.0, 400001).astype(F32)
    with np.errstate(all="ignore"):
        pos = x >= 0
        e = np.exp(np.where(pos, -x, x).astype(np.float64)).astype(F32)
        one_e = (F32(1) + e).astype(F32)
        sig = np.where(pos, (F32(1) / one_e).astype(F32), (e / one_e).astype(F32))
        silu = (x * sig).astype(F32)
    for name, cpp in (("sigmoid", sig), ("silu", silu)):
        want = fn(name, x)
        ok = (_ulps(cpp, want) <= FUNCTIONS[name].ulp) | (np.abs(cpp.astype(np.float64) - want) <= SUBNORMAL_ABS)
        assert ok.all(), (name, x[~ok][:3])
    assert (_ulps(sig, fn("sigmoid", x))[x > -87] <= FUNCTIONS["sigmoid"].ulp).all()


# ============================================================================================
# Statements, pairing, inputs (small specs written here)
# ============================================================================================
def _resolve(epilogue: str, choices: str, choice: dict, defaults: str = "{}") -> object:
    text = ("schema: 2\nname: demo\nkernel: grouped_gemm\nproblem: grouped\nsummary: t\nepilogue:\n"
            + textwrap.indent(textwrap.dedent(epilogue), "  ")
            + "choices:\n  arch: [sm_90a]\n  tile_m: [128]\n  tile_n: [256]\n  cluster_m: [1]\n"
              "  cluster_n: [1]\n" + textwrap.indent(textwrap.dedent(choices), "  ") + f"defaults: {defaults}\n")
    return parse_spec(text, "demo.yaml", expected_name="demo").epilogue.resolve(choice)


def test_numbers_are_fp32_and_each_operator_rounds_once():
    r = _resolve("""\
        compute:
          - d = acc * 0.1 + acc / 3 - acc
        outputs:
          d: {dtype: float32}
        """, "", {})
    acc = np.array([[1.0, 3.0, 1e-3, 7.0, 5.0, 9.0, 13.0]], F32)
    got = interpret(r, acc, offsets=np.array([1]), m_rows=1, inputs={})
    want = (acc * F32(0.1) + acc / F32(3)) - acc                            # numpy float32 ops
    assert same32(got.values["d"], want) and same32(got.d, want)
    # a float64 constant, or one rounding per statement instead of per operator, would differ
    a64 = acc.astype(np.float64)
    assert not same32(((a64 * 0.1).astype(F32) + acc / F32(3)) - acc, want)
    assert not same32((a64 * float(F32(0.1)) + a64 / 3 - a64).astype(F32), want)


def test_paired_accumulator_column_and_element_inputs_defaults():
    r = _resolve("""\
        inputs:
          alpha: {per: expert}
          prob: {per: row, default: 2.0}
          bias: {per: column, dtype: bias_dtype}
          x: {per: element, dtype: c_dtype, paired: true}
        pairing: {block: 32, roles: [gate, up], acc: true}
        compute:
          - y = where(present(bias), acc.gate * bias.up, acc.up) + x.gate * prob
          - z = y * alpha
        outputs:
          d: {dtype: d_dtype, value: z}
          c: {dtype: float32, value: y}
        """, "c_dtype: [bfloat16]\nd_dtype: [bfloat16]\nbias_dtype: [none, float32]\n",
        {"c_dtype": "bfloat16", "d_dtype": "bfloat16", "bias_dtype": "float32"}, "{bias_dtype: none}")
    rng = np.random.default_rng(0)
    offsets = np.array([2, 2, 5])                       # expert 1 empty
    m_rows, n_acc, w = 6, 128, 64
    acc = rng.standard_normal((5, n_acc)).astype(F32)
    alpha = np.array([1.5, 9.0, -2.0], F32)
    bias = rng.standard_normal((n_acc, 3)).astype(F32)
    x = rng.standard_normal((m_rows, 2 * w)).astype(ml_dtypes.bfloat16)
    got = interpret(r, acc, offsets=offsets, m_rows=m_rows, inputs=dict(alpha=alpha, bias=bias, x=x, prob=None))
    rows_e = np.array([0, 0, 2, 2, 2])
    for m in range(5):
        e = rows_e[m]
        for j in range(w):
            g, u = paired_col(j, 0), paired_col(j, 1)
            y = F32(acc[m, g] * bias[u, e]) + F32(F32(x[m, g]) * F32(2.0))
            assert same32(got.values["y"][m, j], y)
            assert same32(got.values["z"][m, j], F32(y * alpha[e]))
    assert got.d.shape == (m_rows, w) and got.d.dtype == ml_dtypes.bfloat16
    assert not np.any(got.d[5:].astype(F32)) and not np.any(got.c[5:])
    assert same32(got.d[:5].astype(F32), got.values["z"].astype(ml_dtypes.bfloat16).astype(F32))
    # absent bias (the variant with bias_dtype none): the other branch
    r2 = _resolve("""\
        inputs:
          bias: {per: column, dtype: bias_dtype}
        pairing: {block: 32, roles: [gate, up], acc: true}
        compute:
          - y = where(present(bias), acc.gate * bias.up, acc.up)
        outputs:
          d: {dtype: float32, value: y}
        """, "bias_dtype: [none, float32]\n", {"bias_dtype": "none"}, "{bias_dtype: none}")
    got2 = interpret(r2, acc, offsets=offsets, m_rows=m_rows, inputs=dict(bias=bias))  # ignored
    assert same32(got2.d[:5], acc[:, paired_col(np.arange(w), 1)])


def test_inputs_missing_wrong_shape_or_not_representable():
    r = _resolve("""\
        inputs:
          alpha: {per: expert}
          x: {per: element, dtype: bfloat16}
        compute:
          - d = alpha * acc + x
        outputs:
          d: {dtype: float32}
        """, "", {})
    acc = np.ones((4, 8), F32)
    ok = dict(alpha=np.ones(2, F32), x=np.ones((4, 8), ml_dtypes.bfloat16))
    interpret(r, acc, offsets=np.array([2, 4]), m_rows=4, inputs=ok)
    with pytest.raises(ValueError, match="missing required input 'alpha'"):
        interpret(r, acc, offsets=np.array([2, 4]), m_rows=4, inputs={"x": ok["x"]})
    with pytest.raises(ValueError, match=r"input 'alpha': got shape \(3,\); allowed: \(2,\)"):
        interpret(r, acc, offsets=np.array([2, 4]), m_rows=4, inputs={**ok, "alpha": np.ones(3, F32)})
    with pytest.raises(ValueError, match="declared bfloat16, but holds"):
        interpret(r, acc, offsets=np.array([2, 4]), m_rows=4,
                  inputs={**ok, "x": np.full((4, 8), 1 + 2.0**-20, F32)})
    with pytest.raises(ValueError, match="acc must be float32"):
        interpret(r, acc.astype(np.float64), offsets=np.array([2, 4]), m_rows=4, inputs=ok)
    # float32 values that bf16 holds exactly are accepted
    interpret(r, acc, offsets=np.array([2, 4]), m_rows=4, inputs={**ok, "x": np.full((4, 8), 1.5, F32)})


def test_amax_nan_propagates_empty_expert_is_minus_inf_global_and_dprob():
    r = _resolve("""\
        compute:
          - d = acc
        outputs:
          d: {dtype: bfloat16}
        reductions:
          - {name: amax, kind: amax, of: d, scope: expert, slot: 1}
          - {name: dprob, kind: sum, of: d, scope: row}
        """, "", {})
    acc = np.array([[1, -7], [2, 3], [NAN, 0], [-INF, 1]], F32)
    got = interpret(r, acc, offsets=np.array([2, 2, 3, 4]), m_rows=6, inputs={})
    assert got.amax.shape == (4, 2)
    assert same32(got.amax[:, 1], [7.0, -INF, NAN, INF]) and same32(got.amax[:, 0], [-INF] * 4)
    assert same32(got.dprob, [-6.0, 5.0, NAN, -INF, 0.0, 0.0])
    rg = _resolve("""\
        compute:
          - c = acc
        outputs:
          c: {dtype: float8_e4m3fn}
        reductions:
          - {name: amax, kind: amax, of: c, scope: global}
        """, "", {})
    acc3 = np.array([[[1, -500.0]], [[2, 3]]], F32)          # (L=2, M=1, N=2)
    got = interpret(rg, acc3, offsets=None, m_rows=1, inputs={}, batched=True)
    assert same32(got.amax, [500.0]) and got.c.shape == (2, 1, 2)
    assert same32(got.c.astype(F32), [[[1, -448.0]], [[2, 3]]])   # satfinite, no scale


def test_sfd_block_scales_conventions():
    a = np.array([0.0, 448.0, NAN, INF, 1e-45], F32)
    nc, rl = F32(1.0), F32(1 / 448)
    scale, stored = sfd_block_scales(a, nc, rl, "quant", col=False)
    assert stored.tolist() == [0, 127, 255, 255, 0]
    assert same32(scale, [FLT_MAX, 1.0, NAN, NAN, FLT_MAX])
    scale, stored = sfd_block_scales(a, nc, rl, "srelu", col=True)
    assert stored.tolist() == [0, 127, 255, 255, 0]             # stored byte does not saturate
    assert same32(scale, [FLT_MAX, 1.0, NAN, 0.0, FLT_MAX])     # scale byte does (0xFE -> r = 0)
    _, stored = sfd_block_scales(a, nc, rl, "dswiglu", col=True)
    assert stored.tolist() == [0, 127, 255, 254, 0]


def test_sfd_association_differs_only_on_the_srelu_dswiglu_column_path():
    """(a*rl)*nc and a*(rl*nc) give different bytes when a product lands on a power of two:
    found by search; quant uses the first on both paths, srelu/dswiglu the second on columns."""
    from fusegemm.reference._epilogue import SFD_RULES, sfd_scale_blocks
    rl = F32(1 / 448)
    for a_hex, nc_hex, quant_byte, alt_byte in [("0x1.a1ffb8p+7", "0x1.125fbap+3", 129, 130),
                                                ("0x1.eb2c2cp-14", "0x1.d2ff2ep+2", 109, 108)]:
        a, nc = np.array([F32(float.fromhex(a_hex))]), F32(float.fromhex(nc_hex))
        for conv in ("quant", "srelu", "dswiglu"):
            _, row = sfd_block_scales(a, nc, rl, conv, col=False)
            _, col = sfd_block_scales(a, nc, rl, conv, col=True)
            assert row[0] == quant_byte and col[0] == (quant_byte if conv == "quant" else alt_byte), conv
            # the hand-written reference agrees (one 32-wide block holding a)
            rule = SFD_RULES[conv]
            block = np.zeros((1, 32), F32)
            block[0, 7] = a[0]
            for assoc, clamp, mine in ((rule.row_assoc, rule.row_clamp, row), (rule.col_assoc, rule.col_clamp, col)):
                _, codes = sfd_scale_blocks(block, nc, rl, assoc, clamp, rule)
                assert codes.view(np.uint8)[0, 0] == mine[0]


# ============================================================================================
# 2. Cross-check with the hand-written references of the seed ops
# ============================================================================================
def _extend_rows(kw: dict, extra: int, seed: int) -> dict:
    """The problem with ``extra`` rows past valid_m (copies of real rows: garbage the kernel
    must not read), so outputs have rows at/after valid_m and SFD buffers padding atoms."""
    if not extra:
        return dict(kw)
    kw = dict(kw)
    rng = np.random.default_rng(seed)
    a = kw["a_tensor"]
    m = a.shape[0]
    idx = rng.integers(0, m, extra)
    kw["a_tensor"] = np.concatenate([a, a[idx]])
    if kw.get("sfa_tensor") is not None:
        phys = kw["sfa_tensor"]
        sfk = phys.shape[2] * 4
        logical = unpack_sf(phys, m, sfk)[:, :, 0]
        kw["sfa_tensor"] = pack_sf(np.concatenate([logical, logical[idx]]))
    for name in ("prob_tensor", "row_scale_tensor"):
        if kw.get(name) is not None:
            kw[name] = np.concatenate([kw[name], rng.uniform(0.5, 2, extra).astype(F32)])
    if kw.get("c_tensor") is not None:
        kw["c_tensor"] = np.concatenate([kw["c_tensor"], kw["c_tensor"][idx]])
    return kw


def _acc(kw: dict, sf_vec_size) -> np.ndarray:
    """The accumulator exactly as the reference computes it (float64 dot products -> FP32)."""
    ops = parse_grouped(a_tensor=kw["a_tensor"], b_tensor=kw.get("b_tensor"), b_list=kw.get("b_list"),
                        padded_offsets=kw["padded_offsets"], m_aligned=256, acc="float64",
                        sfa_tensor=kw.get("sfa_tensor"), sfb_tensor=kw.get("sfb_tensor"),
                        sfb_list=kw.get("sfb_list"), sf_vec_size=sf_vec_size)
    return ops.accumulate()


def _same_bytes(want, got, what: str) -> None:
    assert want is not None and got is not None, f"{what}: reference {want is not None}, interpreter {got is not None}"
    want, got = np.ascontiguousarray(want), np.ascontiguousarray(got)
    assert want.shape == got.shape, f"{what}: shape {got.shape}, reference {want.shape}"
    assert want.dtype.itemsize == got.dtype.itemsize, f"{what}: dtype {got.dtype}, reference {want.dtype}"
    wb, gb = want.view(np.uint8), got.view(np.uint8)
    bad = np.flatnonzero((wb != gb).ravel())
    assert bad.size == 0, f"{what}: {bad.size} bytes differ, first at flat byte {bad[0]}"


def _resolved(spec: str, **axes):
    v = make_variant(spec, arch="sm_90a", **axes)
    return v.spec.epilogue.resolve(v.choices)


GG_CASES = [  # (c_dtype, d_dtype, bias_dtype, prob, skew, discrete, values)
    ("bfloat16", "bfloat16", "none", True, "balanced", False, "nvidia"),
    ("float32", "float16", "none", False, "with_empty", False, "realistic"),
    ("float16", "float32", "bfloat16", True, "with_empty", True, "nvidia"),
    ("float32", "bfloat16", "float16", False, "skewed", False, "realistic"),
    ("bfloat16", "float16", "float32", True, "with_empty", False, "realistic"),
]


@pytest.mark.parametrize("case", GG_CASES, ids=lambda c: "-".join(map(str, c)))
def test_cross_check_grouped_gemm(case):
    c_dtype, d_dtype, bias_dtype, with_prob, skew, discrete, values = case
    p = make_grouped_problem("grouped_gemm", num_experts=5, tokens=900, n=96, k=64, skew=skew, seed=11,
                             values=values, layout="canonical", bias=bias_dtype != "none",
                             discrete=discrete, c_dtype=c_dtype, d_dtype=d_dtype)
    kw = _extend_rows(p.kwargs(acc_dtype="float64", generate_c=True), 256, seed=1)
    if bias_dtype != "none":
        kw["bias_tensor"] = np.asarray(kw["bias_tensor"]).astype(F32).astype(
            {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16, "float32": F32}[bias_dtype])
    if not with_prob:
        kw.pop("prob_tensor")
    ref = R.grouped_gemm(**kw)
    r = _resolved("grouped_gemm", c_dtype=c_dtype, d_dtype=d_dtype, bias_dtype=bias_dtype, generate_c=True,
                  weight_mode="discrete" if discrete else "dense")
    m_rows = kw["a_tensor"].shape[0]
    got = interpret(r, _acc(kw, None), offsets=kw["padded_offsets"], m_rows=m_rows,
                    inputs=dict(alpha=kw["alpha_tensor"], prob=kw.get("prob_tensor"), bias=kw.get("bias_tensor")))
    _same_bytes(ref["d_tensor"], got.d, "d")
    _same_bytes(ref["c_tensor"], got.c, "c")
    assert got.amax is None and got.d_col is None and got.sfd_row is None


SRELU_CASES = [  # (ab, c_dtype, d_dtype, bias, discrete_col_sfd, weights, norm_const, values)
    ("float8_e4m3fn", "bfloat16", "bfloat16", False, False, "dense", None, "nvidia"),
    ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fn", True, True, "dense", None, "nvidia"),
    ("float8_e4m3fn", "float32", "float8_e4m3fn", False, False, "discrete", 1.0, "realistic"),
    ("float8_e4m3fn", "float4_e2m1fn_x2", "float8_e5m2", False, True, "dense", None, "realistic"),
    ("float8_e4m3fn", "float8_e4m3fn", "float4_e2m1fn_x2", True, False, "dense", 0.01, "nvidia"),
    ("float8_e5m2", "float16", "float16", True, False, "dense", None, "realistic"),
    ("float8_e5m2", "bfloat16", "float8_e4m3fn", False, True, "discrete", 3e37, "nvidia"),
    ("float8_e4m3fn", "bfloat16", "float8_e4m3fn", False, False, "dense", 1e-40, "nvidia"),
    ("float4_e2m1fn_x2", "float4_e2m1fn_x2", "float32", False, False, "dense", None, "nvidia"),
    ("float4_e2m1fn_x2", "float8_e4m3fn", "bfloat16", True, False, "dense", None, "realistic"),
]


def _blockscaled_axes(ab: str) -> dict:
    if ab == "float4_e2m1fn_x2":
        return dict(ab_dtype=ab, sf_dtype="float8_e4m3fn", sf_vec_size=16)
    return dict(ab_dtype=ab, sf_dtype="float8_e8m0fnu", sf_vec_size=32)


def _grouped_problem(op: str, ab: str, seed: int, values: str, n: int = 96, **kw):
    axes = _blockscaled_axes(ab)
    return make_grouped_problem(op, num_experts=4, tokens=800, n=n, k=128, skew="with_empty", seed=seed,
                                values=values, layout="canonical", ab_dtype=ab, sf_dtype=axes["sf_dtype"],
                                sf_vec_size=axes["sf_vec_size"], pad_rows="random", **kw)


@pytest.mark.parametrize("case", SRELU_CASES, ids=lambda c: "-".join(map(str, c)))
def test_cross_check_srelu(case):
    ab, c_dtype, d_dtype, bias, dcol, weights, nc, values = case
    p = _grouped_problem("grouped_gemm_srelu", ab, 5, values, bias=bias, discrete=weights == "discrete",
                         norm_const=nc, c_dtype=c_dtype, d_dtype=d_dtype)
    kw = _extend_rows(p.kwargs(acc_dtype="float64", discrete_col_sfd=dcol), 256, seed=2)
    ref = R.grouped_gemm_srelu(**kw)
    r = _resolved("grouped_gemm_srelu", **_blockscaled_axes(ab), c_dtype=c_dtype, d_dtype=d_dtype,
                  bias_dtype="bfloat16" if bias else "none", discrete_col_sfd=dcol, weight_mode=weights)
    got = interpret(r, _acc(kw, p.sf_vec_size), offsets=kw["padded_offsets"], m_rows=kw["a_tensor"].shape[0],
                    inputs=dict(alpha=kw["alpha_tensor"], prob=kw["prob_tensor"], bias=kw.get("bias_tensor"),
                                norm_const=kw.get("norm_const_tensor")),
                    rcp_max=RL.get(d_dtype), discrete_col_sfd=dcol)
    _check_quantized_outputs(ref, got, d_key="d_tensor")
    _same_bytes(ref["c_tensor"], got.c, "c")


def _check_quantized_outputs(ref, got, *, d_key: str) -> None:
    _same_bytes(ref[d_key], got.d, "d")
    for key in ("d_col", "sfd_row", "sfd_col"):
        if ref[f"{key}_tensor"] is None:
            assert got[key] is None, key
        else:
            _same_bytes(ref[f"{key}_tensor"], got[key], key)
    if ref["amax_tensor"] is None:
        assert got.amax is None
    else:
        _same_bytes(np.asarray(ref["amax_tensor"], F32).reshape(got.amax.shape), got.amax, "amax")


def test_cross_check_srelu_tanh_clamp_beyond_the_spec_surface():
    """The spec offers tanh_clamp_scale none only; the axis is open, so a value resolves, and the
    spec's statement matches the reference's clamp formula."""
    p = _grouped_problem("grouped_gemm_srelu", "float8_e4m3fn", 9, "realistic", d_dtype="float8_e4m3fn")
    for s in (0.5, 3.0):
        kw = _extend_rows(p.kwargs(acc_dtype="float64", tanh_clamp_scale=s), 0, seed=0)
        ref = R.grouped_gemm_srelu(**kw)
        r = _resolved("grouped_gemm_srelu", tanh_clamp_scale=s, d_dtype="float8_e4m3fn")
        got = interpret(r, _acc(kw, 32), offsets=kw["padded_offsets"], m_rows=kw["a_tensor"].shape[0],
                        inputs=dict(alpha=kw["alpha_tensor"], prob=kw["prob_tensor"],
                                    norm_const=kw["norm_const_tensor"]), rcp_max=RL["float8_e4m3fn"])
        _check_quantized_outputs(ref, got, d_key="d_tensor")


QUANT_CASES = [  # (ab, d_dtype, bias, prob, row_scale, discrete_col_sfd, norm_const, values)
    ("float8_e4m3fn", "bfloat16", False, True, False, False, None, "nvidia"),
    ("float8_e4m3fn", "float16", True, False, True, False, None, "realistic"),
    ("float8_e4m3fn", "float8_e4m3fn", False, True, True, True, None, "realistic"),
    ("float8_e4m3fn", "float8_e5m2", True, True, False, False, 0.01, "nvidia"),
    ("float8_e4m3fn", "float4_e2m1fn_x2", False, False, False, True, None, "realistic"),
    ("float8_e5m2", "float8_e4m3fn", True, True, True, True, 3e38, "nvidia"),
    ("float8_e5m2", "float4_e2m1fn_x2", False, True, False, False, 1e-37, "realistic"),
    ("float4_e2m1fn_x2", "float32", True, True, False, False, None, "nvidia"),
    ("float4_e2m1fn_x2", "float16", False, False, True, False, None, "realistic"),
]


@pytest.mark.parametrize("case", QUANT_CASES, ids=lambda c: "-".join(map(str, c)))
def test_cross_check_quant(case):
    ab, d_dtype, bias, with_prob, row_scale, dcol, nc, values = case
    p = _grouped_problem("grouped_gemm_quant", ab, 7, values, bias=bias, norm_const=nc, d_dtype=d_dtype)
    kw = p.kwargs(acc_dtype="float64", discrete_col_sfd=dcol)
    if row_scale:
        kw["row_scale_tensor"] = np.random.default_rng(3).uniform(0.25, 4, kw["a_tensor"].shape[0]).astype(F32)
    kw = _extend_rows(kw, 256, seed=3)
    if not with_prob:
        kw.pop("prob_tensor")
    ref = R.grouped_gemm_quant(**kw)
    r = _resolved("grouped_gemm_quant", **_blockscaled_axes(ab), d_dtype=d_dtype,
                  bias_dtype="bfloat16" if bias else "none", discrete_col_sfd=dcol)
    got = interpret(r, _acc(kw, p.sf_vec_size), offsets=kw["padded_offsets"], m_rows=kw["a_tensor"].shape[0],
                    inputs=dict(alpha=kw["alpha_tensor"], prob=kw.get("prob_tensor"), bias=kw.get("bias_tensor"),
                                row_scale=kw.get("row_scale_tensor"), norm_const=kw.get("norm_const_tensor")),
                    rcp_max=RL.get(d_dtype), discrete_col_sfd=dcol)
    _check_quantized_outputs(ref, got, d_key="d_tensor")


DSWIGLU_CASES = [  # (ab, c_dtype, d_dtype, beta, discrete_col_sfd, norm_const, values)
    ("float8_e4m3fn", "bfloat16", "float8_e4m3fn", True, False, None, "nvidia"),
    ("float8_e4m3fn", "float32", "float8_e5m2", False, True, None, "realistic"),
    ("float8_e4m3fn", "float8_e4m3fn", "float8_e4m3fn", True, True, 1.0, "realistic"),
    ("float8_e5m2", "float8_e5m2", "float8_e4m3fn", True, False, 3e37, "nvidia"),
    ("float8_e4m3fn", "float16", "float8_e5m2", True, False, 1e-36, "nvidia"),
    ("float4_e2m1fn_x2", "bfloat16", "bfloat16", True, False, None, "nvidia"),
    ("float4_e2m1fn_x2", "float16", "float32", False, False, None, "realistic"),
]


@pytest.mark.parametrize("case", DSWIGLU_CASES, ids=lambda c: "-".join(map(str, c)))
def test_cross_check_dswiglu(case):
    ab, c_dtype, d_dtype, with_beta, dcol, nc, values = case
    p = _grouped_problem("grouped_gemm_dswiglu", ab, 13, values, n=128, norm_const=nc, c_dtype=c_dtype,
                         d_dtype=d_dtype)
    kw = _extend_rows(p.kwargs(acc_dtype="float64", discrete_col_sfd=dcol), 256, seed=4)
    if not with_beta:
        kw["beta_tensor"] = None
    ref = R.grouped_gemm_dswiglu(**kw)
    r = _resolved("grouped_gemm_dswiglu", **_blockscaled_axes(ab), c_dtype=c_dtype, d_dtype=d_dtype,
                  discrete_col_sfd=dcol)
    m_rows = kw["a_tensor"].shape[0]
    got = interpret(r, _acc(kw, p.sf_vec_size), offsets=kw["padded_offsets"], m_rows=m_rows,
                    inputs=dict(alpha=kw["alpha_tensor"], beta=kw["beta_tensor"], prob=kw["prob_tensor"],
                                c=kw["c_tensor"], norm_const=kw.get("norm_const_tensor")),
                    rcp_max=RL.get(d_dtype), discrete_col_sfd=dcol)
    got_keys = dict(d_row_tensor=got.d, d_col_tensor=got.d_col, amax_tensor=got.amax,
                    sfd_row_tensor=got.sfd_row, sfd_col_tensor=got.sfd_col)
    ref_keys = {k: ref[k] for k in got_keys}
    _check_quantized_outputs({**ref_keys, "d_col_tensor": ref["d_col_tensor"]},
                             _AsResult(got_keys), d_key="d_row_tensor")
    # dprob: the kernel sums FP32 products in FP32; the reference sums float64 products in float64,
    # the interpreter float64 sums of the FP32 dp values: within 2 roundings per term.
    want, mine = np.asarray(ref["dprob_tensor"], np.float64), got.dprob.astype(np.float64)
    valid_m = int(kw["padded_offsets"][-1])
    bound = np.sum(np.abs(got.values["dp"].astype(np.float64)), axis=1) * 2.0**-22 + 2.0**-140
    assert np.all(np.abs(mine[:valid_m] - want[:valid_m]) <= bound)
    assert np.all(mine[valid_m:] == 0) and np.all(want[valid_m:] == 0)
    assert np.count_nonzero(mine[:valid_m] != want[:valid_m]) < valid_m   # mostly bit-exact anyway


class _AsResult(dict):
    """The interpreter's outputs under the reference's key names (for _check_quantized_outputs)."""

    def __getitem__(self, key):
        return dict.get(self, {"d_col": "d_col_tensor", "sfd_row": "sfd_row_tensor",
                               "sfd_col": "sfd_col_tensor"}.get(key, key))

    @property
    def d(self):
        return dict.get(self, "d_row_tensor")

    @property
    def amax(self):
        return dict.get(self, "amax_tensor")


AMAX_CASES = [  # (ab, c_dtype, batch, values)
    ("float8_e4m3fn", "float32", 1, "nvidia"),
    ("float8_e4m3fn", "bfloat16", 3, "realistic"),
    ("float8_e5m2", "float16", 2, "nvidia"),
    ("float4_e2m1fn_x2", "float4_e2m1fn_x2", 2, "nvidia"),
    ("float4_e2m1fn_x2", "float8_e4m3fn", 1, "realistic"),
    ("float4_e2m1fn_x2", "float8_e5m2", 2, "nvidia"),
    ("float4_e2m1fn_x2", "bfloat16", 1, "realistic"),
]


@pytest.mark.parametrize("case", AMAX_CASES, ids=lambda c: "-".join(map(str, c)))
def test_cross_check_gemm_amax(case):
    ab, c_dtype, batch, values = case
    axes = _blockscaled_axes(ab)
    bp = make_batched_problem(m=192, n=128, k=128, batch=batch, ab_dtype=ab, sf_dtype=axes["sf_dtype"],
                              sf_vec_size=axes["sf_vec_size"], c_dtype=c_dtype, seed=21, values=values)
    ref = R.gemm_amax(**bp.kwargs(acc_dtype="float64"))
    # gemm_amax's C is the accumulator: the reference's FP32 C is its accumulator, exactly.
    acc = np.ascontiguousarray(np.transpose(R.gemm_amax(**bp.kwargs(acc_dtype="float64", c_dtype="float32"))
                                            ["c_tensor"], (2, 0, 1)))
    r = _resolved("gemm_amax", **axes, c_dtype=c_dtype)
    got = interpret(r, acc, offsets=None, m_rows=bp.m, inputs={}, batched=True)
    _same_bytes(np.transpose(ref["c_tensor"], (2, 0, 1)), got.c, "c")
    _same_bytes(np.asarray(ref["amax_tensor"], F32).reshape(1), got.amax, "amax")


# ============================================================================================
# 3. The SwiGLU example spec, checked element by element
# ============================================================================================
def _e8m0_up_scalar(s: float) -> int:
    """cvt.rp.ue8m0 without satfinite, from the definition: ceil(log2 s) + 127."""
    if math.isnan(s):
        return 0xFF
    s = abs(s)
    if s == 0 or s <= 2.0**-127:
        return 0
    if math.isinf(s) or s > 2.0**127:
        return 0xFF
    mant, exp = math.frexp(s)                     # s = mant * 2**exp, mant in [0.5, 1)
    return (exp - (1 if mant == 0.5 else 0)) + 127


def _f(x) -> float:
    """Python float rounded to float32 (RNE)."""
    with np.errstate(all="ignore"):
        return float(F32(x))


@pytest.mark.parametrize("d_dtype", ["float8_e4m3fn", "float8_e5m2", "bfloat16"])
def test_swiglu_example_spec_elementwise(d_dtype):
    spec = find_spec("grouped_gemm_swiglu")
    v = make_variant(spec, arch="sm_90a", d_dtype=d_dtype)
    r = spec.epilogue.resolve(v.choices)
    assert r.paired_acc and [i.name for i in r.inputs] == (
        ["alpha", "prob", "norm_const"] if d_dtype != "bfloat16" else ["alpha", "prob"])
    rng = np.random.default_rng(5)
    offsets = np.array([64, 64, 160])             # ragged, expert 1 empty
    valid_m, m_rows, n_acc = 160, 200, 128
    w = n_acc // 2
    acc = (rng.standard_normal((valid_m, n_acc)) * 2.0 ** rng.integers(-4, 6, (valid_m, n_acc))).astype(F32)
    acc[10:20] = 0.0                              # zero blocks: SFD byte 0
    acc[30, 3] = 3e38                             # overflows: an Inf in a block (NaN scale: quant)
    acc[31, 70] = NAN
    alpha = np.array([1.5, 3.0, 0.75], F32)
    prob = rng.uniform(0, 1, m_rows).astype(F32)
    nc = F32(0.5)
    rl = RL.get(d_dtype)
    got = interpret(r, acc, offsets=offsets, m_rows=m_rows,
                    inputs=dict(alpha=alpha, prob=prob, norm_const=np.array([nc])), rcp_max=rl)
    expert = np.repeat(np.arange(3), np.diff(np.concatenate([[0], offsets])))
    h = np.zeros((valid_m, w), F32)
    for m in range(valid_m):
        a = float(alpha[expert[m]])
        for j in range(w):
            gate = _f(a * float(acc[m, (j // 32) * 64 + j % 32]))
            up = _f(a * float(acc[m, (j // 32) * 64 + j % 32 + 32]))
            try:
                silu = _f(gate / (1.0 + math.exp(-gate)))
            except OverflowError:                 # exp overflow: gate / inf
                silu = -0.0 if gate < 0 else NAN
            h[m, j] = _f(_f(silu * up) * float(prob[m]))
    assert same32(got.values["h"], h)
    assert got.d.shape == (m_rows, w) and not np.any(got.d[valid_m:].astype(F32))
    if d_dtype == "bfloat16":
        assert same32(got.d[:valid_m].astype(F32), h.astype(ml_dtypes.bfloat16).astype(F32))
        assert got.sfd_row is None and got.d_col is None and got.sfd_col is None
        return
    # MXFP8 rows, quant convention: s = fl(fl(a*rl)*nc), byte rounded up (no satfinite),
    # r = rcp.approx.ftz(2^(b-127)), scale = min.NaN(fl(nc*r), FLT_MAX), D = satfinite(fl(h*scale)).
    top = 448.0 if d_dtype == "float8_e4m3fn" else 57344.0
    kt = ((w + 31) // 32 + 3) // 4
    sfd = np.zeros(((m_rows + 127) // 128) * kt * 512, np.uint8)
    d = np.zeros((m_rows, w), F32)
    for m in range(valid_m):
        for blk in range(w // 32):
            vals = [float(x) for x in h[m, 32 * blk: 32 * blk + 32]]
            amax = NAN if any(math.isnan(x) for x in vals) else max(abs(x) for x in vals)
            s = _f(_f(amax * _f(rl)) * float(nc))
            b = _e8m0_up_scalar(s)
            r_ = INF if b == 0 else NAN if b == 0xFF else 0.0 if b == 0xFE else 2.0 ** (127 - b)
            prod = _f(float(nc) * r_) if not (math.isnan(r_)) else NAN
            scale = prod if math.isnan(prod) else min(prod, FLT_MAX)
            for i, x in enumerate(vals):
                y = _f(x * scale)
                d[m, 32 * blk + i] = y if math.isnan(y) else max(-top, min(top, y))
            off = ((m >> 7) * kt + (blk >> 2)) * 512 + (m & 31) * 16 + ((m >> 5) & 3) * 4 + (blk & 3)
            sfd[off] = b
    want_d = d.astype(getattr(ml_dtypes, d_dtype))
    assert np.array_equal(got.d.view(np.uint8), want_d.view(np.uint8))
    assert np.array_equal(got.sfd_row.ravel(), sfd)
    assert got.d_col is None and got.sfd_col is None              # row quantization only
    assert np.isnan(got.d[30].astype(F32)).sum() == 32            # the Inf's block: NaN scale


def test_interpreted_mapping_access():
    res = Interpreted(d=np.zeros(1))
    assert res["d"] is res.d and res["c"] is None and res.keys()[0] == "c"
    assert dict(res.items())["d"] is res.d
    with pytest.raises(KeyError):
        res["e"]


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")   # the reference's matmul
@pytest.mark.parametrize("op,d_dtype", [
    ("grouped_gemm_quant", "bfloat16"), ("grouped_gemm_quant", "float8_e4m3fn"),
    ("grouped_gemm_srelu", "bfloat16"), ("grouped_gemm_srelu", "float8_e4m3fn"),
    ("grouped_gemm_dswiglu", "float8_e4m3fn")])
def test_cross_check_nan_and_inf_rows(op, d_dtype):
    """NaN and Inf in A (e5m2 holds both) reach the accumulator: NaN amax, 0xFF SFD bytes, NaN D."""
    ab = "float8_e5m2"
    p = _grouped_problem(op, ab, 17, "nvidia", d_dtype=d_dtype, **({"n": 128} if op.endswith("dswiglu") else {}))
    kw = p.kwargs(acc_dtype="float64")
    a = np.array(kw["a_tensor"])
    a[3, 5] = np.nan
    a[300, 7] = np.inf
    a[301, 7], a[301, 9] = np.inf, -np.inf
    kw["a_tensor"] = a
    kw = _extend_rows(kw, 256, seed=6)
    fn_ref = {"grouped_gemm_quant": R.grouped_gemm_quant, "grouped_gemm_srelu": R.grouped_gemm_srelu,
              "grouped_gemm_dswiglu": R.grouped_gemm_dswiglu}[op]
    ref = fn_ref(**kw)
    axes = dict(**_blockscaled_axes(ab), d_dtype=d_dtype)
    if op == "grouped_gemm_dswiglu":
        axes["c_dtype"] = "bfloat16"
    r = _resolved(op, **axes)
    inputs = dict(alpha=kw["alpha_tensor"], prob=kw["prob_tensor"], norm_const=kw["norm_const_tensor"],
                  beta=kw.get("beta_tensor"), c=kw.get("c_tensor"))
    got = interpret(r, _acc(kw, 32), offsets=kw["padded_offsets"], m_rows=kw["a_tensor"].shape[0],
                    inputs=inputs, rcp_max=RL.get(d_dtype))
    assert np.isnan(got.values["d" if op != "grouped_gemm_dswiglu" else "dswiglu"]).any()
    if op == "grouped_gemm_dswiglu":
        ref = {**ref, "d_tensor": ref["d_row_tensor"]}
    for key in ("d", "d_col", "sfd_row", "sfd_col"):
        if ref[f"{key}_tensor"] is None:
            assert got[key] is None, key
        else:
            _same_bytes(ref[f"{key}_tensor"], got[key], key)
    if d_dtype == "bfloat16":
        want = np.asarray(ref["amax_tensor"], F32).reshape(got.amax.shape)
        assert np.isnan(got.amax).any() and same32(got.amax, want)
    else:
        assert (got.sfd_row.view(np.uint8) == 0xFF).any()


def test_batched_inputs_are_per_batch_and_per_row_of_the_batch():
    r = _resolve("""\
        inputs:
          alpha: {per: expert}
          prob: {per: row}
        compute:
          - d = alpha * acc + prob
        outputs:
          d: {dtype: float32}
        """, "", {})
    acc = np.arange(2 * 3 * 4, dtype=F32).reshape(2, 3, 4)
    alpha, prob = np.array([2.0, -1.0], F32), np.array([0.5, 0.25, 0.125], F32)
    got = interpret(r, acc, offsets=None, m_rows=3, inputs=dict(alpha=alpha, prob=prob), batched=True)
    assert same32(got.d, alpha[:, None, None] * acc + prob[None, :, None])
    assert got.values["d"].shape == (2, 3, 4)
    with pytest.raises(ValueError, match="offsets=None"):
        interpret(r, acc, offsets=np.array([3]), m_rows=3, inputs=dict(alpha=alpha, prob=prob), batched=True)


def test_interpreter_does_not_import_the_references():
    import subprocess
    import sys
    code = ("import sys, fusegemm.interpret; "
            "bad = [m for m in sys.modules if m.startswith('fusegemm.reference')]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_swiglu_generate_c_stores_the_pre_activations_paired():
    """generate_c: C (a paired output, as wide as the accumulator) holds alpha * acc in the
    accumulator's own gate/up interleave next to h; the rule writes both (kPairedC)."""
    from fusegemm.generator.emit import rule_model
    spec = find_spec("grouped_gemm_swiglu")
    v = make_variant(spec, arch="sm_90a", d_dtype="bfloat16", generate_c=True, c_dtype="float32")
    r = spec.epilogue.resolve(v.choices)
    model = rule_model(r)
    assert dict(model.traits)["kPairedC"] == "true" and dict(model.traits)["kElementwise"] == "false"
    assert [f for f, _ in model.out_fields][:3] == ["c0", "c1", "d"]
    assert r.columns(128) == {"c": 128, "d": 64}
    rng = np.random.default_rng(3)
    offsets, m_rows = np.array([64, 64, 96]), 128
    acc = rng.standard_normal((96, 128)).astype(F32)
    alpha = np.array([1.5, 3.0, 0.75], F32)
    got = interpret(r, acc, offsets=offsets, m_rows=m_rows, inputs=dict(alpha=alpha, prob=np.ones(m_rows, F32)))
    scale = np.repeat(alpha, np.diff(np.concatenate([[0], offsets])))[:, None]
    assert same32(got.c[:96], (scale * acc).astype(F32)) and not got.c[96:].any()
    off = spec.epilogue.resolve(make_variant(spec, arch="sm_90a", d_dtype="bfloat16").choices)
    assert off.output("c") is None and dict(rule_model(off).traits)["kPairedC"] == "false"


def test_dswiglu_bf16_spec_is_the_swiglu_backward():
    """specs/grouped_gemm_dswiglu_bf16.yaml computes the gradients of h = p * silu(g) * u
    (fusegemm.moe.swiglu_backward, checked against autograd in test_moe.py) from dh = acc."""
    torch = pytest.importorskip("torch")
    from fusegemm.moe import swiglu_backward
    spec = find_spec("grouped_gemm_dswiglu_bf16")
    r = spec.epilogue.resolve(make_variant(spec, arch="sm_90a", c_dtype="float32", d_dtype="float32").choices)
    rng = np.random.default_rng(4)
    valid, n = 96, 64
    acc = rng.standard_normal((valid, n)).astype(F32)
    c = (rng.standard_normal((valid, 2 * n)) * 3).astype(F32)
    prob = rng.uniform(0, 1, valid).astype(F32)
    got = interpret(r, acc, offsets=np.array([valid]), m_rows=valid,
                    inputs=dict(alpha=np.ones(1, F32), prob=prob, c=c))
    dg, dprob = swiglu_backward(torch.from_numpy(c).double(), torch.from_numpy(acc).double(),
                                torch.from_numpy(prob).double())
    assert np.allclose(got.out_values["d"], dg.numpy(), rtol=1e-5, atol=1e-5)
    assert np.allclose(got.dprob, dprob.numpy(), rtol=1e-5, atol=1e-4)
