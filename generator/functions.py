"""The epilogue language's functions: each written once, with its FP32 definition on both sides.

Every function lists how the generated C++ computes it and how the numpy interpreter
(fusegemm/interpret.py) computes it, and how far the two may differ in FP32 units in the last
place (``ulp``: 0 means bit-exact; a NaN input gives NaN on both sides). The C++ uses
correctly rounded IEEE intrinsics (``__fadd_rn``...) for arithmetic, so nothing contracts into
an FMA behind the spec's back; transcendental functions use the CUDA math library (libdevice,
no fast ``__expf``-style intrinsics), whose documented error bounds are the ``ulp`` column.
The numpy side rounds the float64 result once to float32 (correctly rounded). The ulp bounds
hold while every intermediate is a normal number. Where one is subnormal (the logistic term of
sigmoid, silu and gelu_tanh for x < -87.3, x < -10 for gelu_tanh), the result, whose magnitude is
then below 2^-119, agrees within ``SUBNORMAL_ABS`` = 2^-138 absolute instead. Neither side flushes
subnormals to zero. tests/gpu/test_epilogue_gpu.py measures every bound on the device.
"""
from __future__ import annotations

from dataclasses import dataclass


# Absolute agreement where an intermediate is subnormal (see above): |x| <= 104 times the
# logistic term's 3 subnormal ulps (2^-149 each) is below 2^-140.7; 2^-138 leaves margin.
SUBNORMAL_ABS = 2.0 ** -138


@dataclass(frozen=True)
class Function:
    name: str
    arity: int
    cpp: str          # C++ expression template, arguments as {0}, {1}, ... (each already FP32)
    ulp: int          # max distance between the C++ and numpy results, FP32 ulps
    doc: str


def _f(name: str, arity: int, cpp: str, ulp: int, doc: str) -> Function:
    return Function(name, arity, cpp, ulp, doc)


# NaN rules: relu/min/max/clamp propagate NaN (numpy's maximum/minimum do; CUDA's fmaxf would
# not, so the C++ spells the comparison out); where() picks by its condition.
FUNCTIONS: dict[str, Function] = {f.name: f for f in (
    _f("abs", 1, "fabsf({0})", 0, "|x|"),
    _f("relu", 1, "fusegemm::epi::relu({0})", 0, "max(x, 0); NaN stays NaN, -0 becomes +0"),
    _f("square", 1, "__fmul_rn({0}, {0})", 0, "x * x"),
    _f("min", 2, "fusegemm::epi::fmin_nan({0}, {1})", 0, "the smaller; NaN if either is NaN"),
    _f("max", 2, "fusegemm::epi::fmax_nan({0}, {1})", 0, "the larger; NaN if either is NaN"),
    _f("clamp", 3, "fusegemm::epi::fmin_nan(fusegemm::epi::fmax_nan({0}, {1}), {2})", 0,
       "min(max(x, lo), hi)"),
    _f("fma", 3, "__fmaf_rn({0}, {1}, {2})", 0, "x * y + z rounded once"),
    _f("rcp", 1, "__frcp_rn({0})", 0, "1 / x, correctly rounded"),
    _f("sqrt", 1, "__fsqrt_rn({0})", 0, "square root, correctly rounded"),
    _f("exp", 1, "expf({0})", 2, "e^x (CUDA expf: 2 ulp)"),
    _f("log", 1, "logf({0})", 1, "natural log (CUDA logf: 1 ulp)"),
    _f("tanh", 1, "tanhf({0})", 2, "hyperbolic tangent (CUDA tanhf: 2 ulp)"),
    _f("sigmoid", 1, "fusegemm::epi::sigmoid({0})", 3, "1 / (1 + e^-x), overflow-free (expf then "
       "a correctly rounded add and divide: 3 ulp)"),
    _f("silu", 1, "__fmul_rn({0}, fusegemm::epi::sigmoid({0}))", 4, "x * sigmoid(x)"),
    _f("gelu_tanh", 1, "fusegemm::epi::gelu_tanh({0})", 4,
       "0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3), computed as x sigmoid(2u); "
       "u is evaluated by the same FP32 operation sequence on both sides"),
    _f("isnan", 1, "({0} != {0})", 0, "true where x is NaN (a condition)"),
)}

# Functions whose result is a condition (usable only in where()'s first argument).
BOOL_FUNCTIONS = frozenset({"isnan"})
# Special forms handled by the parser and type checker, not the table.
SPECIAL = frozenset({"where", "present"})
