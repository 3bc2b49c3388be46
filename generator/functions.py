"""The epilogue language's functions: each written once, with its FP32 definition on both sides.

Every row gives how the generated C++ computes the function (``cpp``), how the numpy interpreter
(fusegemm/interpret.py) computes it (``numpy``), and how far the two may differ in FP32 units in
the last place (``ulp``: 0 means bit-exact; a NaN input gives NaN on both sides, except where a row
says otherwise). A formula that cancels cannot promise a few ulps of its result: its row adds
``abs_x`` times |x| (x its first argument) of absolute difference (gelu: ``1 + erf`` for x below
about -3), and ``ulp`` is then in units of the result beside that term. The C++ uses correctly
rounded IEEE intrinsics (``__fadd_rn``...) for arithmetic, so nothing contracts into an FMA behind
the spec's back; transcendental functions use the CUDA math library (libdevice, no fast
``__expf``-style intrinsics), whose documented maximum errors (CUDA C++ Programming Guide,
Mathematical Functions appendix) are the ``ulp`` column. The numpy side rounds the float64 result
once to float32 (correctly rounded). The ulp bounds hold while every intermediate is a normal
number. Where one is subnormal (the logistic term of sigmoid, silu and gelu_tanh for x < -87.3,
x < -10 for gelu_tanh; erf and pow results below 2^-126), the result, whose magnitude is then below
2^-119, agrees within ``SUBNORMAL_ABS`` = 2^-138 absolute instead. Neither side flushes subnormals
to zero. tests/gpu/test_epilogue_gpu.py and tests/gpu/test_epilogue_language_gpu.py measure every
bound on the device.

The numpy definitions take and return float32 arrays (``isnan``: bool). numpy is imported when
one is first called: loading a spec, and so the CLI, needs none.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

# Absolute agreement where an intermediate is subnormal (see above): |x| <= 104 times the
# logistic term's 3 subnormal ulps (2^-149 each) is below 2^-140.7; 2^-138 leaves margin.
SUBNORMAL_ABS = 2.0 ** -138


@dataclass(frozen=True)
class Function:
    name: str
    arity: int
    cpp: str          # C++ expression template, arguments as {0}, {1}, ... (each already FP32)
    numpy: Callable[..., Any]   # the interpreter's definition: float32 arrays -> float32 array
    ulp: int          # max distance between the C++ and numpy results, FP32 ulps
    doc: str
    abs_x: float = 0.0   # plus this times |x| absolute, where the formula cancels (module docstring)


def _np():
    import numpy  # on first use (start-up time: spec loading and the CLI import no numpy)
    return numpy


# --------------------------------------------------------------------------------------------
# numpy definitions (the C++ of each is its row's ``cpp``)
# --------------------------------------------------------------------------------------------
def _f32(x: Any):
    np = _np()
    return np.asarray(x, dtype=np.float32)


def _round64(x):
    """float64 -> float32, round to nearest even (overflow to +-Inf)."""
    np = _np()
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(x, dtype=np.float64).astype(np.float32)


def _abs(x):
    return _np().abs(_f32(x))


def _relu(x):
    np = _np()
    x = _f32(x)
    # C++: x > 0 ? x : (x != x ? x : 0.0f)  -- NaN stays NaN, -0 and negatives become +0.
    return np.where(x > 0, x, np.where(np.isnan(x), x, np.float32(0))).astype(np.float32)


def _square(x):
    x = _f32(x)
    return (x * x).astype(x.dtype)


def _fmin_nan(a, b):
    np = _np()
    a, b = _f32(a), _f32(b)
    # C++: (a < b || a != a) ? a : b   (keeps the operand order's signed-zero choice)
    return np.where((a < b) | np.isnan(a), a, b).astype(np.float32)


def _fmax_nan(a, b):
    np = _np()
    a, b = _f32(a), _f32(b)
    # C++: (a > b || a != a) ? a : b
    return np.where((a > b) | np.isnan(a), a, b).astype(np.float32)


def _clamp(x, lo, hi):
    return _fmin_nan(_fmax_nan(x, lo), hi)


def _fma(x, y, z):
    """``x * y + z`` rounded once (IEEE fma), exactly.

    The float32 product is exact in float64; the float64 sum is made round-to-odd with TwoSum
    (the exact error of the rounded sum nudges an even result to its odd neighbour), so the
    final float64 -> float32 rounding is the correct rounding of the exact value (53 >= 24 + 2
    bits). A plain float64 sum rounded twice would differ on float64 ties of float32 midpoints.
    """
    np = _np()
    x64, y64, z64 = (np.asarray(_f32(v), dtype=np.float64) for v in (x, y, z))
    with np.errstate(all="ignore"):
        p = x64 * y64
        s = p + z64
        bb = s - p
        err = (p - (s - bb)) + (z64 - bb)
        s = np.asarray(s)
        even = (s.view(np.uint64) & np.uint64(1)) == 0
        fix = np.isfinite(s) & np.isfinite(err) & (err != 0) & even
        s = np.where(fix, np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s)
        return _round64(s)


def _rcp(x):
    np = _np()
    with np.errstate(all="ignore"):
        return (np.float32(1) / _f32(x)).astype(np.float32)   # IEEE float32 division: correctly rounded


def _sqrt(x):
    np = _np()
    with np.errstate(all="ignore"):
        return np.sqrt(_f32(x)).astype(np.float32)            # correctly rounded; sqrt(-0) = -0


def _via64(fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """The float64 function ``fn`` on FP32 inputs, rounded once to FP32."""
    def f(x):
        np = _np()
        with np.errstate(all="ignore"):
            return _round64(fn(np.asarray(_f32(x), dtype=np.float64)))
    return f


def _sigmoid64(x):
    return 1.0 / (1.0 + _np().exp(-x))


# The FP32 constants of fusegemm::epi::gelu_tanh (sqrt(2/pi) and 0.044715 as the C++ spells them).
GELU_K0 = float.fromhex("0x1.988454p-1")
GELU_K1 = float.fromhex("0x1.6e4e26p-5")


def _gelu_tanh(x):
    """x * sigmoid(2u): u in FP32 by the C++'s own operation sequence (so the argument's
    roundings, which 2u's steep exponent would amplify, are the same on both sides), then the
    product with the true logistic rounded once."""
    np = _np()
    f32 = np.float32
    with np.errstate(all="ignore"):
        x = _f32(x)
        x3 = (x * x).astype(f32) * x
        u = (f32(GELU_K0) * (x + (f32(GELU_K1) * x3.astype(f32)).astype(f32)).astype(f32)).astype(f32)
        z = (f32(2) * u).astype(np.float64)
        return _round64(x.astype(np.float64) * _sigmoid64(z))


# The FP32 constant of fusegemm::epi::gelu: 1/sqrt(2) (M_SQRT1_2 rounded to FP32, as torch's
# CUDA GELU spells its kAlpha).
GELU_RSQRT2 = float.fromhex("0x1.6a09e6p-1")
# How far the C++ gelu and its model may differ beyond 1 ulp of the result, per unit of |x|: erff is
# within 2 ulp (2.5 * 2^-24 absolute) of the correctly rounded erf the model uses, so 1 + erf
# differs by at most 2^-22 after its rounding, and (x * 0.5) carries that to 2^-23 |x|.
GELU_ABS_X = 2.0 ** -23


def _gelu(x):
    """Exact GELU, 0.5 x (1 + erf(x / sqrt(2))), by the C++'s FP32 operation sequence (torch's
    order: ``(x * 0.5) * (1 + erf(x * 1/sqrt(2)))``), each step rounded once and erf by its own
    row's model. Where CUDA's erff returns the correctly rounded erf, the bits are the C++'s."""
    np = _np()
    f32 = np.float32
    with np.errstate(all="ignore"):
        x = _f32(x)
        e = _via64(_erf64)((x * f32(GELU_RSQRT2)).astype(f32))
        return ((x * f32(0.5)).astype(f32) * (f32(1) + e).astype(f32)).astype(f32)


def _erf64(x):
    """erf of a float64 array: Python's math.erf (C99 erf, float64-accurate) element by element
    (numpy has no erf, and scipy is not a dependency). erf(+-0) = +-0, erf(+-Inf) = +-1."""
    np = _np()
    return np.asarray(np.frompyfunc(math.erf, 1, 1)(x), dtype=np.float64)


def _pow(x, y):
    """C99 ``powf`` (Annex F, which CUDA's powf documents case by case), from float64:

    * ``pow(x, +-0) = 1`` for any x, even NaN; ``pow(+1, y) = 1`` for any y, even NaN;
    * a finite negative x with a finite non-integer y is NaN; with an integer y it is
      ``+-|x|^y``, negative for odd y (every FP32 |y| >= 2^24 is an even integer);
    * ``pow(+-0, y)``: y < 0 gives +-Inf for odd integer y, else +Inf; y > 0 gives +-0 for odd
      integer y, else +0; ``pow(-Inf, y)`` likewise gives -0 / +0 / -Inf / +Inf;
    * ``pow(x, -Inf)`` is +Inf for |x| < 1 and +0 for |x| > 1, ``pow(x, +Inf)`` the reverse;
      ``pow(-1, +-Inf) = 1``;
    * otherwise a NaN argument gives NaN (``pow(-1, NaN)`` too: only +1 is exempt).

    The magnitude ``|x|^y`` is numpy's float64 power of a non-negative base (whose special cases
    are the same as C99's for x >= 0), rounded once to FP32 (overflow to Inf, underflow to a
    subnormal or 0); the sign and the NaN of a negative base are applied here, so the result
    does not depend on how a platform's libm treats negative bases."""
    np = _np()
    with np.errstate(all="ignore"):
        x64 = np.asarray(_f32(x), dtype=np.float64)
        y64 = np.asarray(_f32(y), dtype=np.float64)
        finite_y = np.isfinite(y64)
        integral = finite_y & (np.floor(y64) == y64)
        odd = integral & (np.fmod(y64, 2.0) != 0.0)
        mag = np.power(np.abs(x64), y64)
        r = np.where(np.signbit(x64) & odd, -mag, mag)
        # NaN where |x| hides it: a negative x with a non-integer y, and pow(-1, NaN) (|-1| = 1)
        r = np.where((x64 < 0) & np.isfinite(x64) & finite_y & ~integral, np.nan, r)
        r = np.where(np.isnan(y64), np.nan, r)
        r = np.where((y64 == 0) | (x64 == 1), 1.0, r)
        return _round64(r)


def _isnan(x):
    return _np().isnan(_f32(x))


def _f(name: str, arity: int, cpp: str, numpy: Callable[..., Any], ulp: int, doc: str,
       abs_x: float = 0.0) -> Function:
    return Function(name, arity, cpp, numpy, ulp, doc, abs_x)


# NaN rules: relu/min/max/clamp propagate NaN (numpy's maximum/minimum do; CUDA's fmaxf would
# not, so the C++ spells the comparison out); where() picks by its condition.
FUNCTIONS: dict[str, Function] = {f.name: f for f in (
    _f("abs", 1, "fabsf({0})", _abs, 0, "|x|"),
    _f("relu", 1, "fusegemm::epi::relu({0})", _relu, 0, "max(x, 0); NaN stays NaN, -0 becomes +0"),
    _f("square", 1, "__fmul_rn({0}, {0})", _square, 0, "x * x"),
    _f("min", 2, "fusegemm::epi::fmin_nan({0}, {1})", _fmin_nan, 0, "the smaller; NaN if either is NaN"),
    _f("max", 2, "fusegemm::epi::fmax_nan({0}, {1})", _fmax_nan, 0, "the larger; NaN if either is NaN"),
    _f("clamp", 3, "fusegemm::epi::fmin_nan(fusegemm::epi::fmax_nan({0}, {1}), {2})", _clamp, 0,
       "min(max(x, lo), hi)"),
    _f("fma", 3, "__fmaf_rn({0}, {1}, {2})", _fma, 0, "x * y + z rounded once"),
    _f("rcp", 1, "__frcp_rn({0})", _rcp, 0, "1 / x, correctly rounded"),
    _f("sqrt", 1, "__fsqrt_rn({0})", _sqrt, 0, "square root, correctly rounded"),
    _f("exp", 1, "expf({0})", _via64(lambda x: _np().exp(x)), 2, "e^x (CUDA expf: 2 ulp)"),
    _f("log", 1, "logf({0})", _via64(lambda x: _np().log(x)), 1, "natural log (CUDA logf: 1 ulp)"),
    _f("tanh", 1, "tanhf({0})", _via64(lambda x: _np().tanh(x)), 2, "hyperbolic tangent (CUDA tanhf: 2 ulp)"),
    _f("erf", 1, "erff({0})", _via64(_erf64), 2,
       "error function, 2/sqrt(pi) times the integral of e^(-t^2) from 0 to x (CUDA erff: 2 ulp); "
       "erf(+-Inf) = +-1"),
    _f("pow", 2, "powf({0}, {1})", _pow, 4,
       "x^y with C99 powf's special cases (CUDA powf: 4 ulp): pow(x, 0) = pow(1, y) = 1 even for NaN; "
       "a negative x with a non-integer y is NaN, with an integer y it is +-|x|^y; pow(+-0, y < 0) "
       "is +-Inf"),
    _f("sigmoid", 1, "fusegemm::epi::sigmoid({0})", _via64(_sigmoid64), 3,
       "1 / (1 + e^-x), overflow-free (expf then a correctly rounded add and divide: 3 ulp)"),
    _f("silu", 1, "__fmul_rn({0}, fusegemm::epi::sigmoid({0}))", _via64(lambda x: x * _sigmoid64(x)), 4,
       "x * sigmoid(x)"),
    _f("gelu_tanh", 1, "fusegemm::epi::gelu_tanh({0})", _gelu_tanh, 4,
       "0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3), computed as x sigmoid(2u); "
       "u is evaluated by the same FP32 operation sequence on both sides"),
    _f("gelu", 1, "fusegemm::epi::gelu({0})", _gelu, 1,
       "exact GELU, 0.5 x (1 + erf(x / sqrt(2))) (torch's gelu(approximate='none')), in FP32 as "
       "(x * 0.5) * (1 + erf(x * 1/sqrt(2))) with CUDA erff; 1 + erf cancels for x below about -3, so "
       "the bound there is absolute: 1 ulp plus 2^-23 |x|", GELU_ABS_X),
    _f("isnan", 1, "({0} != {0})", _isnan, 0, "true where x is NaN (a condition)"),
)}

# Functions whose result is a condition (usable only in where()'s first argument).
BOOL_FUNCTIONS = frozenset({"isnan"})
# Special forms handled by the parser and type checker, not the table.
SPECIAL = frozenset({"where", "present"})
