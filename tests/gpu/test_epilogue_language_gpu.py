"""GPU: erf() and pow() of the epilogue language executed on the device, against the interpreter.

Each function runs in a one-statement rule through the block harness (fusegemm/harness.cuh: the
epilogue engine of every sm_100a kernel and of the sm_90a engine path, compiled for sm_90a) on
FP32 accumulators, and is compared with its numpy definition (generator/functions.py, the
interpreter's) element by element:

* erf: within the table's ulp bound (CUDA erff: 2 ulp) on a sweep with NaN, +-Inf, +-0,
  subnormals, the range where erf rounds to +-1, and seeded values; the sign of zero kept.
* pow: within the table's ulp bound (CUDA powf: 4 ulp) on a grid of C99 special values by
  special values and on seeded bases and exponents (over- and underflow, negative bases with
  integer and non-integer exponents, bases next to 1 with large exponents); wherever an argument
  is special (NaN, +-Inf, +-0, x = 1, y = 0: Annex F's cases) the bits are identical, and NaN
  where the interpreter has NaN, nowhere else.
* gelu(): within its row's bound (1 ulp plus 2^-23 |x|: ``1 + erf`` cancels for x < -3) of the
  interpreter; bit for bit the exact GELU written with erf, ``0.5 * x * (1 + erf(x *
  0.7071067811865476))`` (the same FP32 steps); torch's ``gelu(approximate='none')`` on
  the device within the same bound of the interpreter (the same formula, built by another
  compiler and CUDA version: bits are not promised).

As in tests/gpu/test_epilogue_gpu.py, where a result is below 2^-119 in magnitude (an
intermediate or the result is subnormal) the table promises SUBNORMAL_ABS absolute instead.
"""
from __future__ import annotations

import textwrap

import numpy as np
import pytest

from fusegemm.generator.functions import FUNCTIONS, SUBNORMAL_ABS
from fusegemm.generator.spec import parse_spec
from fusegemm.generator.variants import make_variant

pytestmark = pytest.mark.gpu

F32 = np.float32
NAN, INF = float("nan"), float("inf")
FLT_MAX = float(np.finfo(np.float32).max)
MIN_SUB = 2.0 ** -149
DEVICE = "cuda:0"
ROWS, COLS = 512, 256          # m_rows a multiple of 256 (the harness's output rows)


@pytest.fixture(scope="module")
def torch():
    import torch
    return torch


def _spec(name: str, epilogue: str):
    """A one-variant grouped_gemm spec with this epilogue (YAML, indented as under epilogue:)."""
    text = (f"schema: 2\nname: {name}\nkernel: grouped_gemm\nproblem: grouped\nsummary: test epilogue\n"
            f"epilogue:\n{textwrap.indent(textwrap.dedent(epilogue), '  ')}"
            "choices:\n  ab_dtype: [bfloat16]\n  tile_m: [128]\n  tile_n: [128]\n  cluster_m: [1]\n"
            "  cluster_n: [1]\ndefaults: {}\n")
    return parse_spec(text, f"{name}.yaml", expected_name=name)


def _run(torch, spec, x: np.ndarray, inputs: dict[str, np.ndarray] | None = None) -> np.ndarray:
    """The rule's output c on accumulators ``x`` (ROWS, COLS), one expert."""
    from fusegemm.harness_run import run_harness
    v = make_variant(spec, arch="sm_90a")
    off = torch.tensor([ROWS], dtype=torch.int32, device=DEVICE)
    dev = {k: torch.tensor(a, device=DEVICE) for k, a in (inputs or {}).items()}
    out = run_harness(v, "block", torch.tensor(x, device=DEVICE), off, dev, m_rows=ROWS)["c"]
    return out.cpu().numpy().reshape(x.shape)


def _ordered(x: np.ndarray) -> np.ndarray:
    """float32 as integers in value order (adjacent floats differ by 1; +0 and -0 are both 0)."""
    i = np.ascontiguousarray(x, dtype=F32).view(np.uint32).astype(np.int64)
    return np.where(i >= 1 << 31, -(i - (1 << 31)), i)


def _fill(values: list[np.ndarray], rng) -> np.ndarray:
    """The values in order, then seeded repeats of them, as (ROWS, COLS) float32."""
    x = np.concatenate([np.asarray(v, np.float64).ravel() for v in values]).astype(F32)
    assert x.size <= ROWS * COLS
    return np.concatenate([x, rng.choice(x, ROWS * COLS - x.size)]).reshape(ROWS, COLS)


def assert_within_ulps(got: np.ndarray, want: np.ndarray, bound: int, what: str, args) -> None:
    """NaN exactly where ``want`` is NaN; elsewhere at most ``bound`` FP32 ulps apart, the sign of
    a zero result kept (or within SUBNORMAL_ABS where ``want`` is below 2^-119)."""
    got, want = got.ravel(), want.ravel()
    nan = np.isnan(want)
    bad_nan = np.flatnonzero(np.isnan(got) != nan)
    assert bad_nan.size == 0, (f"{what}: NaN positions differ at {bad_nan.size} elements, first at "
                               f"{tuple(float(a.ravel()[bad_nan[0]]) for a in args)}: "
                               f"{got[bad_nan[0]]!r} vs {want[bad_nan[0]]!r}")
    ulps = np.abs(_ordered(got) - _ordered(want))
    ulps[nan] = 0
    with np.errstate(invalid="ignore"):                       # Inf - Inf where both are Inf
        tiny = np.abs(got.astype(np.float64) - want.astype(np.float64)) <= SUBNORMAL_ABS
    ulps[tiny & (np.abs(want) < 2.0 ** -119)] = 0
    worst = int(ulps.argmax())
    assert ulps.max() <= bound, (f"{what}: {ulps.max()} ulp at {tuple(float(a.ravel()[worst]) for a in args)} "
                                 f"({got[worst]!r} vs {want[worst]!r}); the table says {bound}")
    zero = want == 0
    sign = np.flatnonzero(zero & (np.signbit(got) != np.signbit(want)))
    assert sign.size == 0, (f"{what}: the sign of zero differs at {tuple(float(a.ravel()[sign[0]]) for a in args)}: "
                            f"{got[sign[0]]!r} vs {want[sign[0]]!r}")


def assert_same_bits(got: np.ndarray, want: np.ndarray, mask: np.ndarray, what: str, args) -> None:
    g, w = got[mask], want[mask]
    same = (g.view(np.uint32) == w.view(np.uint32)) | (np.isnan(g) & np.isnan(w))
    bad = np.flatnonzero(~same)
    assert bad.size == 0, (f"{what}: {bad.size} special cases differ, first at "
                           f"{tuple(float(a[mask][bad[0]]) for a in args)}: {g[bad[0]]!r} vs {w[bad[0]]!r}")


# --------------------------------------------------------------------------------------------
# erf
# --------------------------------------------------------------------------------------------
def test_erf_within_its_ulp_bound_on_device(torch):
    from fusegemm.interpret import NUMPY_FUNCTIONS
    rng = np.random.default_rng(5)
    edges = [0.0, -0.0, NAN, INF, -INF, MIN_SUB, -MIN_SUB, 1e-40, -1e-40, 2.0 ** -126, -(2.0 ** -126),
             1e-30, 1e-8, -1e-8, 0.5, -0.5, 1.0, -1.0, 2.0, 3.0, 3.9, 3.92, -3.92, 4.0, 6.0, 10.0, 1e10,
             FLT_MAX, -FLT_MAX]
    x = _fill([edges, np.linspace(-6, 6, 60000), np.geomspace(1e-38, 6, 20000), -np.geomspace(1e-38, 6, 20000),
               rng.standard_normal(20000) * 2, np.geomspace(MIN_SUB, 1e-38, 2000)], rng)
    spec = _spec("lang_erf", """\
        compute:
          - y = erf(acc)
        outputs:
          c: {dtype: float32, value: y}
        """)
    got = _run(torch, spec, x)
    assert_within_ulps(got, NUMPY_FUNCTIONS["erf"](x), FUNCTIONS["erf"].ulp, "erf", (x,))


# --------------------------------------------------------------------------------------------
# pow
# --------------------------------------------------------------------------------------------
_SPECIAL_X = [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.0, -2.0, -8.0, INF, -INF, NAN, FLT_MAX, -FLT_MAX, MIN_SUB,
              -MIN_SUB]
_SPECIAL_Y = [0.0, -0.0, 1.0, -1.0, 2.0, -2.0, 3.0, -3.0, 0.5, -0.5, 1.0 / 3.0, INF, -INF, NAN, 2.0 ** 24,
              2.0 ** 24 + 2, -(2.0 ** 25), 149.0, -149.0, 150.5, 127.0, 128.0]


def _pow_arguments(rng) -> tuple[np.ndarray, np.ndarray]:
    gx, gy = np.meshgrid(np.array(_SPECIAL_X), np.array(_SPECIAL_Y), indexing="ij")
    n = 12000
    near1 = 1.0 + rng.integers(-64, 64, n) * 2.0 ** -24
    xs = [gx, np.exp(rng.uniform(-20, 20, n)), rng.uniform(0.5, 2.0, n), -np.exp(rng.uniform(-5, 5, n)),
          -np.exp(rng.uniform(-5, 5, n)), near1, np.geomspace(MIN_SUB, 1e-30, n), rng.uniform(0, 1e6, n)]
    ys = [gy, rng.uniform(-10, 10, n), rng.uniform(-300, 300, n), rng.integers(-40, 41, n),
          rng.integers(-20, 20, n) + rng.uniform(0.01, 0.99, n), np.exp2(rng.uniform(10, 30, n)),
          rng.uniform(-1.5, 1.5, n), rng.uniform(-8, 8, n)]
    x = np.concatenate([np.ravel(a) for a in xs]).astype(F32)
    y = np.concatenate([np.ravel(a) for a in ys]).astype(F32)
    pick = rng.integers(0, x.size, ROWS * COLS - x.size)          # fill the tile with repeats
    return (np.concatenate([x, x[pick]]).reshape(ROWS, COLS), np.concatenate([y, y[pick]]).reshape(ROWS, COLS))


def test_pow_within_its_ulp_bound_and_c99_special_cases_on_device(torch):
    from fusegemm.interpret import NUMPY_FUNCTIONS
    x, y = _pow_arguments(np.random.default_rng(9))
    spec = _spec("lang_pow", """\
        inputs:
          e: {per: element, dtype: float32}
        compute:
          - y = pow(acc, e)
        outputs:
          c: {dtype: float32, value: y}
        """)
    got = _run(torch, spec, x, {"e": y})
    want = NUMPY_FUNCTIONS["pow"](x, y)
    assert_within_ulps(got, want, FUNCTIONS["pow"].ulp, "pow", (x, y))
    special = (~np.isfinite(x) | ~np.isfinite(y) | (x == 0) | (y == 0) | (x == 1))
    assert special.sum() > 200
    assert_same_bits(got, want, special, "pow", (x, y))
    # what the sweep is for is in it: NaN from negative bases, signed results, Inf, 0, subnormals
    assert np.isnan(want[(x < 0) & np.isfinite(x) & (np.floor(y) != y) & np.isfinite(y)]).all()
    assert (want < 0).sum() > 1000 and np.isinf(want).sum() > 1000 and (want == 0).sum() > 1000
    assert ((np.abs(want) > 0) & (np.abs(want) < 2.0 ** -126)).sum() > 50


# --------------------------------------------------------------------------------------------
# gelu(): the function, against the interpreter, the erf formula and torch
# --------------------------------------------------------------------------------------------
def _gelu_within_bound(got: np.ndarray, want: np.ndarray, x: np.ndarray, what: str) -> None:
    """Non-finite results bit for bit; the rest within gelu's row: ulp of the result plus abs_x |x|."""
    f = FUNCTIONS["gelu"]
    special = ~np.isfinite(want)
    assert_same_bits(got, want, special, what, (x,))
    g, w = got[~special].astype(np.float64), want[~special].astype(np.float64)
    with np.errstate(over="ignore"):
        ulp = np.spacing(np.abs(want[~special])).astype(np.float64)
    bound = f.ulp * ulp + f.abs_x * np.abs(x[~special].astype(np.float64))
    err = np.abs(g - w)
    worst = int(np.argmax(err - bound))
    assert (err <= bound).all(), (f"{what}: |{g[worst]!r} - {w[worst]!r}| > {f.ulp} ulp + {f.abs_x} |x| at "
                                  f"x = {x[~special][worst]!r}")


def test_gelu_on_device_within_its_bound_and_the_erf_formulas_bits(torch):
    from fusegemm.interpret import interpret
    rng = np.random.default_rng(21)
    x = _fill([[0.0, -0.0, NAN, INF, -INF, MIN_SUB, -MIN_SUB, -1e-40, FLT_MAX, -FLT_MAX, -5.4, -5.5, -3.0],
               np.linspace(-12, 12, 60000), rng.standard_normal(40000) * 3,
               np.geomspace(1e-30, 20, 5000), -np.geomspace(1e-30, 20, 5000)], rng)
    fn = _spec("lang_gelu_fn", """\
        compute:
          - y = gelu(acc)
        outputs:
          c: {dtype: float32, value: y}
        """)
    written = _spec("lang_gelu_written", """\
        compute:
          - y = 0.5 * acc * (1 + erf(acc * 0.7071067811865476))
        outputs:
          c: {dtype: float32, value: y}
        """)
    got = _run(torch, fn, x).ravel()
    r = fn.epilogue.resolve(make_variant(fn, arch="sm_90a").choices)
    want = interpret(r, x, offsets=np.array([ROWS]), m_rows=ROWS, inputs={}).c.ravel()
    xs = x.ravel()
    _gelu_within_bound(got, want, xs, "gelu vs the interpreter")
    assert_same_bits(got, _run(torch, written, x).ravel(), np.ones(xs.shape, bool), "gelu vs the erf formula", (xs,))
    # torch's CUDA GELU: the same formula with its own build of erff (2 ulp too): within the row's
    # bound of the interpreter, as the kernel is
    ref = torch.nn.functional.gelu(torch.tensor(x, device=DEVICE), approximate="none").cpu().numpy().ravel()
    _gelu_within_bound(ref, want, xs, "torch's gelu vs the interpreter")
    # the sweep reaches the cancelling range (tiny negative results) and the -0 below it
    assert ((want < 0) & (want > -1e-6)).sum() > 100 and (np.signbit(want) & (want == 0)).sum() > 100
