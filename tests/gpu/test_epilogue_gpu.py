"""GPU: the epilogue rules generated from YAML, executed on the device, against the interpreter.

1. Every seed spec's epilogue (and the SwiGLU example) through the block harness, the code every
   sm_100a kernel and the sm_90a engine path run (fusegemm/harness.cuh), against
   fusegemm.interpret on the same FP32 accumulators: C, D, D_col, SFD bytes and amax bit-exact for
   rules without transcendental functions; within stated bounds for the rest (below).
2. The fragment path of the sm_90a kernel for element-wise rules (grouped_gemm), bit-exact.
3. The function table's ``ulp`` column measured: each transcendental function on a sweep with
   NaN, +-Inf, -0, subnormals and overflow edges, within its declared bound.
4. End to end: EpilogueGemm on the SwiGLU spec (BF16 and MXFP8 D + SFD_row) against the numpy
   GEMM + interpreter; a YAML edit of grouped_gemm's rule changes what the kernel computes.

Tolerances. Bit-exact wherever every function in the rule has ulp 0 (the IEEE-rounded
operators of generator/functions.py). Rules with exp/sigmoid/silu/tanh: FP32 values may differ
by the table's ulps, which can move a narrow output by one rounding step or an SFD byte by one:
such differences must be one step and in at most 1% of elements. dprob is an atomic sum (order differs):
|got - want| <= 2^-20 * sum |dp| of the row. GEMM end to end: the GPU's FP32 accumulation order
differs from the float64 reference's (|error| ~ K 2^-24 sum |a b|), so BF16 D within 2^-7
relative + 2^-14 absolute, and MXFP8 D, dequantized with its own block scale, within half an FP8
step (2^-4 relative) + the same absolute term.

The module first compiles every harness and kernel it launches in parallel worker processes
(fusegemm.build.compile_all), so device time is not spent compiling one source at a time.
"""
from __future__ import annotations

import os
import textwrap
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from fusegemm.formats.numpy_dtypes import to_numpy
from fusegemm.generator.expr import Call, walk
from fusegemm.generator.functions import FUNCTIONS, SUBNORMAL_ABS
from fusegemm.generator.spec import find_spec, parse_spec
from fusegemm.generator.variants import make_variant

pytestmark = pytest.mark.gpu

F32 = np.float32
NAN, INF = float("nan"), float("inf")
RL = {"float8_e4m3fn": 1.0 / 448.0, "float8_e5m2": 1.0 / 57344.0, "float4_e2m1fn_x2": 1.0 / 6.0}
DEVICE = "cuda:0"


@pytest.fixture(scope="module")
def torch():
    import torch
    return torch


def _function_names() -> list[str]:
    return ["exp", "log", "tanh", "sigmoid", "silu", "gelu_tanh"]


@pytest.fixture(scope="module", autouse=True)
def compiled_ahead(torch, doubled_spec_path):
    """Compile every source this module launches, in parallel, before the first test."""
    from fusegemm.build import compile_all
    from fusegemm.harness_run import plan_harness
    from fusegemm.pipeline import plan
    planned = [plan_harness(make_variant(spec, arch="sm_90a", **axes), "block") for spec, axes in BLOCK_CASES]
    planned += [plan_harness(make_variant("grouped_gemm", arch="sm_90a", **axes), "fragment")
                for axes in FRAGMENT_CASES]
    planned += [plan_harness(make_variant(_function_spec(f), arch="sm_90a"), "block") for f in _function_names()]
    planned.append(plan_harness(make_variant(_kitchen_spec(), arch="sm_90a"), "block"))
    planned += [plan_harness(make_variant(spec, arch="sm_90a", **axes), "block") for spec, axes in BOUNDARY_CASES]
    planned.append(plan_harness(make_variant("grouped_gemm", arch="sm_90a", **EDGE_AXES), "block"))
    planned += [plan(make_variant("grouped_gemm_swiglu", arch="sm_90a", d_dtype=d)) for d in SWIGLU_D]
    planned.append(plan(make_variant("grouped_gemm_swiglu", arch="sm_90a", d_dtype="bfloat16", generate_c=True)))
    planned += [plan(make_variant("grouped_gemm", arch="sm_90a", b_major="n", d_dtype="float32", tile_m=tm,
                                  tile_n=tn, weight_mode=mode)) for tm, tn, mode, *_ in N_MAJOR_CASES]
    planned += [plan(make_variant("grouped_gemm_dswiglu_bf16", arch="sm_90a", d_dtype=d, c_dtype=d))
                for d in ("bfloat16", "float32")]
    planned += [plan(make_variant(s, arch="sm_90a", d_dtype="float32"))
                for s in ("grouped_gemm", find_spec(str(doubled_spec_path)))]
    failed = [r for r in compile_all(planned, jobs=os.cpu_count() or 1) if not r.ok]
    assert not failed, f"{len(failed)} sources failed to compile: {failed[0]}"


# --------------------------------------------------------------------------------------------
# problem construction
# --------------------------------------------------------------------------------------------
def _acc(rng, rows: int, cols: int, specials: bool) -> np.ndarray:
    """FP32 accumulators over many binades; zero rows (SFD byte 0), an overflowing value, NaN
    and Inf when ``specials``."""
    acc = (rng.standard_normal((rows, cols)) * 2.0 ** rng.integers(-6, 6, (rows, cols))).astype(F32)
    acc[5:9] = 0.0
    acc[40, :16] = 2.0 ** rng.integers(-3, 3, 16)       # exact powers of two: SFD boundaries
    if specials:
        acc[33, 3] = 3e38
        acc[34, 40] = NAN
        acc[35, 7] = -INF
        acc[36, 9] = -0.0
        acc[37, 11] = 1e-40                              # subnormal
    return acc


def _inputs(torch, r, rng, *, experts: int, m_rows: int, n_acc: int, w: int, dev: str):
    """Device tensors and host arrays of every input the resolved epilogue reads."""
    dev_in, host = {}, {}
    for inp in r.inputs:
        if inp.per == "scalar":
            x = np.array([0.5], F32)
            dev_in[inp.name] = torch.tensor(x, device=dev)
            host[inp.name] = x
            continue
        shape = {"expert": (experts,), "row": (m_rows,), "column": (experts, n_acc),
                 "element": (m_rows, 2 * w if inp.paired else w)}[inp.per]
        vals = rng.uniform(0.25, 2.0, shape) if inp.per in ("expert", "row") else rng.standard_normal(shape)
        t = torch.tensor(vals.astype(F32), device=dev).to(getattr(torch, inp.dtype))
        if inp.per == "column":
            t = t.T                                     # (N_acc, L), N contiguous
        dev_in[inp.name] = t
        host[inp.name] = to_numpy(t)
    return dev_in, host


def _uses_inexact_functions(r) -> bool:
    return any(isinstance(n, Call) and n.fn in FUNCTIONS and FUNCTIONS[n.fn].ulp
               for s in r.statements for n in walk(s.expr))


def run_case(torch, spec, *, mode: str = "block", seed: int = 0, offsets=(256, 256, 512, 768),
             n_acc: int = 256, m_rows: int = 1024, specials: bool = True, acc=None, ones=(), **axes):
    """Harness and interpreter on one seeded problem; returns (got, want, resolved, exact).
    ``acc``: the accumulator to use (else seeded); ``ones``: inputs set to 1 (exact scaling)."""
    from fusegemm.harness_run import run_harness
    from fusegemm.interpret import interpret
    v = make_variant(spec, arch="sm_90a", **axes)
    r = v.spec.epilogue.resolve(v.choices)
    rng = np.random.default_rng(seed)
    off = np.asarray(offsets, np.int32)
    valid_m = int(off[-1])
    acc = _acc(rng, valid_m, n_acc, specials) if acc is None else acc
    dev = DEVICE
    dev_in, host = _inputs(torch, r, rng, experts=off.size, m_rows=m_rows, n_acc=n_acc, w=r.width(n_acc), dev=dev)
    for name in (n for n in ones if n in dev_in):
        dev_in[name] = torch.ones_like(dev_in[name])
        host[name] = to_numpy(dev_in[name])
    quantized = [o.dtype for o in r.outputs if o.quantize is not None and o.dtype in RL]
    rl = RL[quantized[0]] if quantized else 0.0
    got = run_harness(v, mode, torch.tensor(acc, device=dev), torch.tensor(off, device=dev), dev_in,
                      m_rows=m_rows, rcp_max=rl)
    want = interpret(r, acc, offsets=off, m_rows=m_rows, inputs=host, rcp_max=rl or None,
                     discrete_col_sfd=v.discrete_col_sfd)
    return {k: to_numpy(t) for k, t in got.items()}, want, r, not _uses_inexact_functions(r)


# --------------------------------------------------------------------------------------------
# comparison
# --------------------------------------------------------------------------------------------
def _bytes(x) -> np.ndarray:
    return np.ascontiguousarray(x).view(np.uint8).ravel()


def _ordered(x: np.ndarray, dtype: str) -> np.ndarray:
    """Integer keys in value order (adjacent representable values differ by 1)."""
    bits = {"float32": np.uint32, "bfloat16": np.uint16, "float16": np.uint16}.get(dtype, np.uint8)
    i = np.ascontiguousarray(x).view(bits).astype(np.int64).ravel()
    top = 1 << (8 * np.dtype(bits).itemsize - 1)
    return np.where(i >= top, -(i - top), i)


def _decoded(x, dtype: str) -> np.ndarray:
    if dtype in ("float32", "float16"):
        return np.asarray(x).astype(np.float64).ravel()
    return np.ascontiguousarray(x).view(getattr(ml_dtypes, dtype)).astype(np.float64).ravel()


def _dtype_of(r, key: str) -> str:
    o = r.output("d" if key == "d_col" else key)
    return o.dtype


def _close_steps(got, want, dtype: str, what: str, skip: np.ndarray | None = None) -> None:
    """Values equal, or one rounding step apart in at most 1% of elements (NaN where NaN)."""
    g, w = _decoded(got, dtype), _decoded(want, dtype)
    assert g.shape == w.shape, f"{what}: shape {g.shape} vs {w.shape}"
    nan = np.isnan(w)
    assert np.array_equal(np.isnan(g), nan), f"{what}: NaN positions differ ({np.isnan(g).sum()} vs {nan.sum()})"
    steps = np.abs(_ordered(got, dtype) - _ordered(want, dtype))
    steps[nan] = 0
    if skip is not None:
        steps[skip.ravel()] = 0
    bad = np.flatnonzero(steps > 1)
    assert bad.size == 0, (f"{what}: {bad.size} elements more than one step apart, first at {bad[0]}: "
                           f"{g[bad[0]]} vs {w[bad[0]]}")
    assert np.count_nonzero(steps) <= max(2, steps.size // 100), f"{what}: {np.count_nonzero(steps)} differ"


def _assert_same_values(got, want, dtype: str, what: str) -> None:
    """Bit-identical, except that a NaN equals any NaN (payload and sign are not part of the
    contract: CUDA's conversions write canonical NaNs, numpy keeps payloads)."""
    if dtype == "float4_e2m1fn_x2":                  # no NaN encoding
        return _assert_same_bytes(got, want, what)
    g, w = _decoded(got, dtype), _decoded(want, dtype)
    nan = np.isnan(w)
    assert np.array_equal(np.isnan(g), nan), f"{what}: NaN positions differ ({np.isnan(g).sum()} vs {nan.sum()})"
    keys_g, keys_w = _ordered(got, dtype), _ordered(want, dtype)
    bad = np.flatnonzero((keys_g != keys_w) & ~nan)
    assert bad.size == 0, f"{what}: {bad.size} elements differ, first at {bad[0]}: {g[bad[0]]!r} vs {w[bad[0]]!r}"


def _assert_same_bytes(got, want, what: str) -> None:
    gb, wb = _bytes(got), _bytes(want)
    assert gb.size == wb.size, f"{what}: {gb.size} bytes vs {wb.size}"
    bad = np.flatnonzero(gb != wb)
    assert bad.size == 0, f"{what}: {bad.size} bytes differ, first at byte {bad[0]} ({gb[bad[0]]} vs {wb[bad[0]]})"


def compare(got: dict, want, r, exact: bool) -> None:
    keys = [k for k in ("c", "d", "d_col", "sfd_row", "sfd_col", "amax", "dprob") if want[k] is not None]
    assert sorted(keys) == sorted(got), f"buffers {sorted(got)}, interpreter {keys}"
    for key in keys:
        g, w = got[key], want[key]
        if key == "dprob":
            dp = np.abs(want.values["dp"].astype(np.float64)).sum(axis=1)
            tol = 2.0 ** -20 * np.concatenate([dp, np.zeros(w.size - dp.size)])
            g64, w64 = g.astype(np.float64).ravel(), w.astype(np.float64).ravel()
            nan = np.isnan(w64)
            assert np.array_equal(np.isnan(g64), nan), "dprob: NaN rows differ"
            fin = ~nan & np.isfinite(w64)
            err = np.abs(g64[fin] - w64[fin])
            assert np.array_equal(g64[np.isinf(w64)], w64[np.isinf(w64)]), "dprob: Inf rows differ"
            assert np.all(err <= tol[fin]), f"dprob: worst {err.max()} beyond 2^-20 sum|dp|"
            continue
        if key.startswith("sfd") and exact:
            _assert_same_bytes(g, w, key)
        elif key == "amax" and exact:
            _assert_same_values(np.asarray(g, F32), np.asarray(w, F32), "float32", key)
        elif exact:
            dtype = _dtype_of(r, key)
            _assert_same_values(g.reshape(np.shape(w)) if dtype in RL else g, w, dtype, key)
        elif key.startswith("sfd"):
            diff = np.abs(_bytes(g).astype(int) - _bytes(w).astype(int))
            assert diff.max() <= 1 and np.count_nonzero(diff) <= max(2, diff.size // 100), f"{key}: {diff.max()}"
        elif key == "amax":
            # the max of thousands of values, each within the rule's ulps: a few steps, any count
            steps = np.abs(_ordered(np.asarray(g, F32), "float32") - _ordered(np.asarray(w, F32), "float32"))
            assert np.array_equal(np.isnan(np.asarray(g, F32)), np.isnan(np.asarray(w, F32))), "amax: NaN"
            assert steps[~np.isnan(np.asarray(w, F32)).ravel()].max(initial=0) <= 8, f"amax: {steps.max()} steps"
        else:
            dtype = _dtype_of(r, key)
            if dtype == "float4_e2m1fn_x2":
                _assert_same_bytes(g, w, key)
                continue
            _close_steps(g.reshape(np.shape(w)) if dtype in RL else g, w, dtype, key)


# --------------------------------------------------------------------------------------------
# 1. block harness: every seed epilogue
# --------------------------------------------------------------------------------------------
BLOCK_CASES = [  # (spec, axes)
    ("grouped_gemm", dict(c_dtype="float32", d_dtype="bfloat16", bias_dtype="bfloat16", generate_c=True)),
    ("grouped_gemm", dict(c_dtype="float16", d_dtype="float32", bias_dtype="none", generate_c=True)),
    ("grouped_gemm_srelu", dict(c_dtype="bfloat16", d_dtype="float8_e4m3fn", bias_dtype="bfloat16")),
    ("grouped_gemm_srelu", dict(c_dtype="float32", d_dtype="float8_e5m2", discrete_col_sfd=True)),
    ("grouped_gemm_srelu", dict(ab_dtype="float4_e2m1fn_x2", sf_dtype="float8_e4m3fn", sf_vec_size=16,
                                c_dtype="float32", d_dtype="bfloat16")),
    ("grouped_gemm_quant", dict(d_dtype="float8_e4m3fn", bias_dtype="bfloat16")),
    ("grouped_gemm_quant", dict(d_dtype="float8_e5m2", discrete_col_sfd=True)),
    ("grouped_gemm_quant", dict(d_dtype="float4_e2m1fn_x2")),
    ("grouped_gemm_srelu", dict(c_dtype="float4_e2m1fn_x2", d_dtype="float4_e2m1fn_x2")),
    ("grouped_gemm_dswiglu", dict(c_dtype="bfloat16", d_dtype="float8_e4m3fn")),
    ("grouped_gemm_dswiglu", dict(c_dtype="float8_e5m2", d_dtype="float8_e5m2", discrete_col_sfd=True)),
    ("grouped_gemm_dswiglu", dict(ab_dtype="float4_e2m1fn_x2", sf_dtype="float8_e4m3fn", sf_vec_size=16,
                                  c_dtype="float32", d_dtype="bfloat16")),
    ("gemm_amax", dict(c_dtype="bfloat16")),
    ("gemm_amax", dict(ab_dtype="float4_e2m1fn_x2", sf_dtype="float8_e4m3fn", sf_vec_size=16,
                       c_dtype="float8_e4m3fn")),
    ("grouped_gemm_swiglu", dict(d_dtype="float8_e4m3fn")),
    ("grouped_gemm_swiglu", dict(d_dtype="float8_e5m2")),
    ("grouped_gemm_swiglu", dict(d_dtype="bfloat16")),
    ("grouped_gemm_swiglu", dict(d_dtype="bfloat16", generate_c=True, c_dtype="float32")),   # paired C
    ("grouped_gemm_swiglu", dict(d_dtype="float8_e4m3fn", generate_c=True, c_dtype="bfloat16")),
    ("grouped_gemm_dswiglu_bf16", dict(c_dtype="bfloat16", d_dtype="bfloat16")),
    ("grouped_gemm_dswiglu_bf16", dict(c_dtype="float32", d_dtype="bfloat16")),
]


def _axes_id(case) -> str:
    spec, axes = case
    return spec + "-" + "-".join(f"{v}" for v in axes.values())


@pytest.mark.parametrize("case", BLOCK_CASES, ids=_axes_id)
def test_block_harness_matches_interpreter(torch, case):
    spec, axes = case
    got, want, r, exact = run_case(torch, spec, **axes)
    compare(got, want, r, exact)
    assert any(np.any(_bytes(got[k])) for k in got if k not in ("amax", "dprob")), "all outputs zero"


def _boundary_acc(rows: int, cols: int) -> np.ndarray:
    """Each 32-column block's largest |value| at or next to a power of two times an FP8/FP4 top
    (448, 57344, 6, 1): where the E8M0 byte rounds up or not. Plus all-zero blocks, saturating
    blocks (3e38, +-Inf) and a NaN block."""
    rng = np.random.default_rng(11)
    acc = (rng.uniform(-0.5, 0.5, (rows, cols))).astype(F32)
    tops = [448.0, 57344.0, 6.0, 1.0]
    cand = []
    for top in tops:
        for j in range(-24, 24, 3):
            v = F32(top * 2.0 ** j)
            cand += [v, np.nextafter(v, F32(np.inf)), np.nextafter(v, F32(0))]
    cand = np.array(cand, F32)
    blocks = cols // 32
    for r in range(rows):
        for b in range(blocks):
            k = (r * blocks + b) % (cand.size + 4)
            blk = acc[r, 32 * b: 32 * b + 32]
            if k < cand.size:
                blk *= cand[k]                       # the rest stays below the maximum
                blk[(r + b) % 32] = cand[k] * (1 if (r + b) % 2 else -1)
            elif k == cand.size:
                blk[:] = 0.0
            elif k == cand.size + 1:
                blk[3] = 3e38
            elif k == cand.size + 2:
                blk[5] = -np.inf
            else:
                blk[7] = np.nan
    return acc


BOUNDARY_CASES = [
    ("grouped_gemm_quant", dict(d_dtype="float8_e4m3fn")),
    ("grouped_gemm_quant", dict(d_dtype="float8_e5m2", discrete_col_sfd=True)),
    ("grouped_gemm_quant", dict(d_dtype="float4_e2m1fn_x2")),
    ("grouped_gemm_srelu", dict(c_dtype="float32", d_dtype="float8_e4m3fn")),
    ("grouped_gemm_swiglu", dict(d_dtype="float8_e4m3fn")),
]


@pytest.mark.parametrize("case", BOUNDARY_CASES, ids=_axes_id)
def test_sfd_rounding_boundaries(torch, case):
    """Block maxima at and next to the powers of two where the scale byte changes, with every
    scaling input 1 and norm_const 0.5, so the boundaries survive to the quantizer."""
    spec, axes = case
    got, want, r, exact = run_case(torch, spec, acc=_boundary_acc(512, 256), offsets=(256, 512), m_rows=512,
                                   ones=("alpha", "prob", "row_scale"), **axes)
    compare(got, want, r, exact)
    if exact:
        sfd = _bytes(want["sfd_row"] if want["sfd_row"] is not None else want["sfd_col"])
        assert len(set(sfd.tolist())) > 20, "the boundary problem should exercise many scale bytes"


def test_block_harness_transcendental_rules_are_mostly_bit_exact(torch):
    """The tolerance of inexact rules is a safety margin, not the norm: > 99% identical bytes."""
    got, want, _, exact = run_case(torch, "grouped_gemm_swiglu", d_dtype="bfloat16", seed=3)
    assert not exact
    same = np.count_nonzero(_bytes(got["d"]) == _bytes(want.d))
    assert same >= 0.99 * _bytes(want.d).size


EDGE_AXES = dict(c_dtype="bfloat16", d_dtype="float16", bias_dtype="float32", generate_c=True)


def test_block_harness_empty_experts_and_partial_width(torch):
    """Empty experts first and last, width not a multiple of 32 (the engine's column guard)."""
    got, want, r, exact = run_case(torch, "grouped_gemm", offsets=(0, 256, 256, 512, 512), n_acc=200,
                                   m_rows=768, **EDGE_AXES)
    compare(got, want, r, exact)


# --------------------------------------------------------------------------------------------
# 2. fragment path (sm_90a element-wise rules)
# --------------------------------------------------------------------------------------------
FRAGMENT_CASES = [
    dict(c_dtype="bfloat16", d_dtype="bfloat16", bias_dtype="bfloat16", generate_c=True),
    dict(c_dtype="float32", d_dtype="float16", bias_dtype="none", generate_c=True),
    dict(c_dtype="bfloat16", d_dtype="float32", bias_dtype="float16", generate_c=False),
]


@pytest.mark.parametrize("axes", FRAGMENT_CASES, ids=lambda a: "-".join(map(str, a.values())))
def test_fragment_harness_matches_interpreter(torch, axes):
    got, want, r, exact = run_case(torch, "grouped_gemm", mode="fragment", n_acc=384, **axes)
    assert exact
    compare(got, want, r, exact)


# --------------------------------------------------------------------------------------------
# 3. the ulp column of the function table, measured
# --------------------------------------------------------------------------------------------
def _test_spec_text(name: str, epilogue: str) -> str:
    """A one-variant grouped_gemm spec with this epilogue (YAML, indented as under epilogue:)."""
    return (f"schema: 2\nname: {name}\nkernel: grouped_gemm\nproblem: grouped\nsummary: test epilogue\n"
            f"epilogue:\n{textwrap.indent(textwrap.dedent(epilogue), '  ')}"
            "choices:\n  ab_dtype: [bfloat16]\n  tile_m: [128]\n  tile_n: [128]\n  cluster_m: [1]\n"
            "  cluster_n: [1]\ndefaults: {}\n")


def _test_spec(name: str, epilogue: str):
    return parse_spec(_test_spec_text(name, epilogue), f"{name}.yaml", expected_name=name)


def _function_spec(fn: str):
    return _test_spec(f"fn_{fn}", f"""\
        compute:
          - y = {fn}(acc)
        outputs:
          c: {{dtype: float32, value: y}}
        """)


def _sweep(rows: int, cols: int) -> np.ndarray:
    edges = [0.0, -0.0, NAN, INF, -INF, 1e-45, -1e-45, 1e-40, -1e-40, 1.1754944e-38, 88.7, 88.8, -88.7,
             -88.8, -90.0, -100.0, -103.0, -104.0, 20.0, -20.0, 1.0, -1.0, 0.5, 1e-3, -1e-3, 3e38, -3e38]
    x = np.concatenate([np.array(edges), np.linspace(-110, 110, 40000), np.linspace(-10, 10, 40000),
                        np.geomspace(1e-30, 1e3, 20000), -np.geomspace(1e-30, 1e3, 20000)])
    x = np.resize(x.astype(F32), rows * cols).reshape(rows, cols)
    return x


@pytest.mark.parametrize("fn", _function_names())
def test_function_table_ulp_bounds_hold_on_device(torch, fn):
    from fusegemm.harness_run import run_harness
    from fusegemm.interpret import NUMPY_FUNCTIONS
    spec = _function_spec(fn)
    v = make_variant(spec, arch="sm_90a")
    rows, cols = 512, 256
    x = _sweep(rows, cols)
    off = torch.tensor([rows], dtype=torch.int32, device=DEVICE)
    got = run_harness(v, "block", torch.tensor(x, device=DEVICE), off, {}, m_rows=rows)["c"].cpu().numpy()
    want = NUMPY_FUNCTIONS[fn](x).ravel()
    got = got.ravel()
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan), f"{fn}: NaN positions differ"
    ulps = np.abs(_ordered(got, "float32") - _ordered(want, "float32"))
    ulps[nan] = 0
    # where an intermediate is subnormal the table promises SUBNORMAL_ABS absolute instead
    with np.errstate(invalid="ignore"):                     # Inf - Inf where both are Inf
        tiny = np.abs(got.astype(np.float64) - want.astype(np.float64)) <= SUBNORMAL_ABS
    ulps[tiny & (np.abs(want) < 2.0 ** -119)] = 0
    worst = int(ulps.argmax())
    assert ulps.max() <= FUNCTIONS[fn].ulp, (f"{fn}: {ulps.max()} ulp at x={x.ravel()[worst]!r} "
                                             f"({got[worst]!r} vs {want[worst]!r}); "
                                             f"the table says {FUNCTIONS[fn].ulp}")


KITCHEN_EPILOGUE = """\
        inputs:
          alpha: {per: expert}
          prob: {per: row, dtype: bfloat16}
          bias: {per: column, dtype: float16}
          res: {per: element, dtype: bfloat16}
          k: {per: scalar}
        compute:
          - a = alpha * acc * 0.1 + acc / 3 - bias
          - b = clamp(fma(a, prob, res), -4.5, 7) + rcp(abs(a) + 1) - sqrt(abs(acc))
          - y = where(isnan(b), -1.25, max(min(b, k * 8), -(k * 8)))
        outputs:
          c: {dtype: float32, value: y}
          d: {dtype: bfloat16, value: b}
        reductions:
          - {name: amax, kind: amax, of: a, scope: expert}
        """


DIV_PROBE = r"""
#include "fusegemm/epilogue.cuh"
struct DivProbe { unsigned long long* bad; unsigned int lo, hi; };
// Every e in [lo, hi] (float bits): the logistic's two divisions by d = 1 + e, n = 1 and n = e,
// against __fdiv_rn, bit for bit; mismatches counted.
extern "C" __global__ void fg_div_probe(const __grid_constant__ DivProbe p) {
  for (unsigned long long b = p.lo + blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; b <= p.hi;
       b += (unsigned long long)gridDim.x * blockDim.x) {
    const float e = __uint_as_float((unsigned int)b), d = __fadd_rn(1.0f, e);
    const float a1 = fusegemm::epi::div_unit_range(1.0f, d), a2 = fusegemm::epi::div_unit_range(e, d);
    if (__float_as_uint(a1) != __float_as_uint(__fdiv_rn(1.0f, d)) ||
        __float_as_uint(a2) != __float_as_uint(__fdiv_rn(e, d))) atomicAdd(p.bad, 1ull);
  }
}
"""


def test_logistic_division_is_correctly_rounded_for_every_operand(torch):
    """fusegemm::epi::div_unit_range (the logistic's division without __fdiv_rn's range check and
    slow-path call) equals __fdiv_rn bit for bit for every e = e^-|x| in [0, 1] (subnormals
    included: 2^30 values), both numerators the logistic divides (1 and e)."""
    import struct

    from fusegemm.runtime.compile import compile_source
    from fusegemm.runtime.launch import LaunchConfig, ParamBuffer, launch
    from fusegemm.runtime.load import default_modules
    cub = compile_source(DIV_PROBE, arch="sm_90a", kernel="fg_div_probe", name="div_probe.cu")
    kernel = default_modules().get(cub.data, "fg_div_probe", key="div_probe", smem_bytes=0,
                                   device=torch.cuda.current_device())
    bad = torch.zeros(1, dtype=torch.int64, device="cuda")
    params = ParamBuffer(16)
    params.fill(struct.pack("<QII", bad.data_ptr(), 0, 0x3F800000))
    launch(kernel, LaunchConfig(grid=(4096, 1, 1), block=(256, 1, 1)), params,
           torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    assert int(bad.item()) == 0


def _kitchen_spec():
    return _test_spec("kitchen", KITCHEN_EPILOGUE)


def test_exact_operators_and_inputs_of_every_kind(torch):
    """min/max/clamp/fma/rcp/sqrt/abs/where/isnan, FP32 literals, inputs of each kind and dtype."""
    spec = _kitchen_spec()
    got, want, r, exact = run_case(torch, spec, n_acc=224)
    assert exact
    compare(got, want, r, exact)


# --------------------------------------------------------------------------------------------
# 4. end to end: EpilogueGemm
# --------------------------------------------------------------------------------------------
def _gemm_problem(torch, *, n: int, k: int = 256, seed: int = 0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    sizes = [256, 0, 512, 256]                    # an empty expert
    offsets = torch.tensor(np.cumsum(sizes), dtype=torch.int32)
    m = int(offsets[-1]) + 256                    # padding rows past valid_m
    a = (torch.randn(m, k, generator=g) * 0.5).to(torch.bfloat16)
    b = (torch.randn(len(sizes), n, k, generator=g) * 0.1).to(torch.bfloat16)
    alpha = torch.rand(len(sizes), generator=g) + 0.5
    prob = torch.rand(m, generator=g)
    return a, offsets, b, alpha, prob


SWIGLU_D = ["bfloat16", "float8_e4m3fn"]


@pytest.mark.parametrize("d_dtype", SWIGLU_D)
def test_swiglu_gemm_end_to_end(torch, d_dtype):
    from fusegemm import EpilogueGemm
    a, offsets, b, alpha, prob = _gemm_problem(torch, n=512)
    op = EpilogueGemm("grouped_gemm_swiglu", d_dtype=d_dtype)
    inputs = {"alpha": alpha, "prob": prob, "norm_const": 1.0}
    if d_dtype == "bfloat16":
        del inputs["norm_const"]
    dev = {k: (v.cuda() if hasattr(v, "cuda") else v) for k, v in inputs.items()}
    out = op(a.cuda(), offsets.cuda(), b.cuda(), inputs=dev)
    ref = op.reference(a, offsets, b, inputs=inputs)
    valid = int(offsets[-1])
    h = ref.values["h"][:valid].astype(np.float64)
    if d_dtype == "bfloat16":
        d = out["d"].float().cpu().numpy()[:valid]
        assert np.all(np.abs(d - h) <= 2.0 ** -7 * np.abs(h) + 2.0 ** -14)
    else:
        d = out["d"].cpu().numpy().view(ml_dtypes.float8_e4m3fn).astype(np.float64)[:valid]
        from fusegemm.formats import unpack_sf
        m_rows, blocks = out["d"].shape[0], d.shape[1] // 32
        byte = unpack_sf(to_numpy(out["sfd_row"]).view(np.uint8), m_rows, blocks)[:valid, :, 0]
        scale = np.repeat(2.0 ** (byte.astype(np.float64) - 127), 32, axis=1)       # norm_const 1
        deq = d * scale
        assert np.all(np.abs(deq - h) <= 2.0 ** -4 * 1.01 * np.abs(h) + scale * 2.0 ** -9 + 2.0 ** -14)
        ref_bytes = unpack_sf(np.ascontiguousarray(ref.sfd_row).view(np.uint8), m_rows, blocks)[:valid, :, 0]
        assert np.count_nonzero(byte != ref_bytes) <= max(2, byte.size // 100)
    assert not out["d"][valid:].any()             # rows past valid_m untouched (zero)


@pytest.mark.parametrize("n, tile_n, c_dtype", [(512, None, "bfloat16"), (192, 256, "bfloat16"),
                                                (320, 128, "float32")])
def test_swiglu_gemm_stores_the_pre_activations(torch, n, tile_n, c_dtype):
    """generate_c: the same kernel stores C = alpha * G (paired, as wide as the accumulator) next
    to h; both within the GEMM tolerance of the numpy GEMM + interpreter, tails zero. N = 192 and
    320 end inside a tile (the fragment path skips the gate/up pairs past N)."""
    from fusegemm import EpilogueGemm
    a, offsets, b, alpha, prob = _gemm_problem(torch, n=n, seed=2)
    tiles = {} if tile_n is None else {"tile_m": 128, "tile_n": tile_n}
    op = EpilogueGemm("grouped_gemm_swiglu", d_dtype="bfloat16", generate_c=True, c_dtype=c_dtype, **tiles)
    out = op(a.cuda(), offsets.cuda(), b.cuda(), inputs={"alpha": alpha.cuda(), "prob": prob.cuda()})
    ref = op.reference(a, offsets, b, inputs={"alpha": alpha, "prob": prob})
    valid = int(offsets[-1])
    assert out["c"].shape == (a.shape[0], n) and out["d"].shape == (a.shape[0], n // 2)
    for name in ("c", "d"):
        want = ref.out_values[name]
        want = np.asarray(want, dtype=np.float64)[:valid]
        got = out[name].float().cpu().numpy()[:valid]
        assert np.all(np.abs(got - want) <= 2.0 ** -7 * np.abs(want) + 2.0 ** -14), name
        assert not out[name][valid:].any(), name


def test_row_outputs_are_whole_on_reused_memory(torch):
    """C and D are allocated uninitialised (fusegemm/ops/tail.py): the kernel stores every row
    below padded_offsets[-1] and the tail kernel zeroes the rows past it, also when the allocator
    hands back memory full of NaN bytes (asserted: the outputs land on the poisoned blocks). C and
    D of 4 and 2 MiB: the allocator's large pool, whose free blocks are reused by size."""
    from fusegemm import EpilogueGemm
    g = torch.Generator(device="cpu").manual_seed(9)
    sizes = [512, 0, 768, 256]
    offsets = torch.tensor(np.cumsum(sizes), dtype=torch.int32)
    m, n, k = 2048, 1024, 128                     # 512 rows past the last offset
    a = (torch.randn(m, k, generator=g) * 0.5).to(torch.bfloat16)
    b = (torch.randn(len(sizes), n, k, generator=g) * 0.1).to(torch.bfloat16)
    alpha, prob = torch.rand(len(sizes), generator=g) + 0.5, torch.rand(m, generator=g)
    op = EpilogueGemm("grouped_gemm_swiglu", d_dtype="bfloat16", generate_c=True, c_dtype="bfloat16").compile()
    ac, oc, bc = a.cuda(), offsets.cuda(), b.cuda()
    inputs = {"alpha": alpha.cuda(), "prob": prob.cuda()}
    op(ac, oc, bc, inputs=inputs)                 # loads everything; its outputs are freed
    from op_helpers import poison_free_blocks   # (tests/gpu/op_helpers.py)
    ptrs = poison_free_blocks([((m, n), torch.bfloat16), ((m, n // 2), torch.bfloat16)])
    out = op(ac, oc, bc, inputs=inputs)
    torch.cuda.synchronize()
    assert {out["c"].data_ptr(), out["d"].data_ptr()} <= ptrs, "the outputs did not reuse the poisoned blocks"
    ref = op.reference(a, offsets, b, inputs={"alpha": alpha, "prob": prob})
    valid = int(offsets[-1])
    for name in ("c", "d"):
        got = out[name].float().cpu().numpy()
        want = np.asarray(ref.out_values[name], dtype=np.float64)[:valid]
        assert np.all(np.abs(got[:valid] - want) <= 2.0 ** -7 * np.abs(want) + 2.0 ** -14), name
        assert not got[valid:].any(), f"{name}: rows past the last offset are not zero"


@pytest.mark.parametrize("c_pitch", [512, 515])
@pytest.mark.parametrize("d_dtype", ["bfloat16", "float32"])
def test_dswiglu_bf16_gemm_end_to_end(torch, d_dtype, c_pitch):
    """The BF16 dSwiGLU spec (the MoE layer's fc2 data gradient): dG (paired D) and dprob against
    the numpy GEMM + interpreter on ragged and empty experts. dprob sums 256 products of the row:
    |error| <= 2^-12 * sum |dp| (FP32 accumulation and atomic order) + the D tolerance's share.
    c_pitch: C's row pitch in elements; 515 (a view of a wider tensor) leaves most rows off the
    16-byte alignment the engine's block loads of C need, so they take the element path."""
    _dswiglu_bf16_case(torch, d_dtype, c_pitch, n=256)


@pytest.mark.parametrize("n, tile_n", [(224, 256), (224, 128), (96, 128)])
def test_dswiglu_bf16_gemm_partial_tiles(torch, n, tile_n):
    """The sm_90a fragment path of paired rules on tiles that N ends inside: whole 32-column
    blocks past N are skipped, the rest stored (7 of 8 blocks, 3 of 4, 3 of 4)."""
    _dswiglu_bf16_case(torch, "bfloat16", 2 * n, n=n, tile_n=tile_n)


@pytest.mark.parametrize("span", [1, 2, 4])
@pytest.mark.parametrize("n, tile_n", [(256, 256), (224, 256), (160, 256), (96, 128)])
def test_dswiglu_bf16_ping_pong_block_spans(torch, span, n, tile_n):
    """FUSEGEMM_SM90_FRAG_ROLL_SPAN (fusegemm/sm90/epilogue.cuh): ping-pong's overlapped fragment
    path run as a loop over spans of 1, 2 or 4 blocks, each span's accumulators selected at run
    time, against the same reference as the unrolled default: whole tiles, and tiles that N ends
    inside a span (224: block 7 of the fourth 2-block span; 160: the second 4-block span's blocks
    1-3) or the span past the tile (span 4 at 4 blocks: the unrolled loop)."""
    from fusegemm.runtime import config
    with config.override(FUSEGEMM_NVRTC_EXTRA=f"-DFUSEGEMM_SM90_FRAG_ROLL_SPAN={span}"):
        _dswiglu_bf16_case(torch, "bfloat16", 2 * n, n=n, tile_n=tile_n, tile_m=64)


@pytest.mark.parametrize("ahead", [1, 0])
@pytest.mark.parametrize("n, c_pitch", [(256, 515), (224, 515), (224, 448)])
def test_dswiglu_bf16_ping_pong_inputs(torch, ahead, n, c_pitch):
    """Ping-pong's unrolled fragment blocks read C a block ahead as raw bits
    (FUSEGEMM_SM90_FRAG_LOAD_AHEAD=1, the default) or as each block starts (0, the A/B baseline):
    C rows off the pair alignment (pitch 515: element by element), N ending inside the tile (224:
    block 7 of 8), and both, against the same reference."""
    from fusegemm.runtime import config
    with config.override(FUSEGEMM_NVRTC_EXTRA=f"-DFUSEGEMM_SM90_FRAG_LOAD_AHEAD={ahead}"):
        _dswiglu_bf16_case(torch, "bfloat16", c_pitch, n=n, tile_n=256, tile_m=64)


@pytest.mark.parametrize("n, c_pitch", [(256, 515), (224, 448), (992, 2000)])
def test_dswiglu_bf16_ping_pong_128_rows(torch, n, c_pitch):
    """FUSEGEMM_SM90_PINGPONG_128=1 at 128 x 128: the dSwiGLU epilogue run on each warpgroup's two
    64-row halves in turn (the second as the tile of rows 64..), C off the pair alignment, N ending
    inside a tile, against the reference."""
    from fusegemm.runtime import config
    with config.override(FUSEGEMM_NVRTC_EXTRA="-DFUSEGEMM_SM90_PINGPONG_128=1"):
        _dswiglu_bf16_case(torch, "bfloat16", c_pitch, n=n, tile_n=128, tile_m=128)


def _dswiglu_bf16_case(torch, d_dtype, c_pitch, n, tile_n=None, tile_m=128):
    from fusegemm import EpilogueGemm
    a, offsets, b, alpha, prob = _gemm_problem(torch, n=n, seed=3)
    wide = (torch.randn(a.shape[0], c_pitch, generator=torch.Generator().manual_seed(9)) * 2).to(torch.bfloat16)
    c = wide[:, :2 * n]
    beta = torch.rand(alpha.shape[0]) + 0.5
    tiles = {} if tile_n is None else {"tile_m": tile_m, "tile_n": tile_n}
    op = EpilogueGemm("grouped_gemm_dswiglu_bf16", d_dtype=d_dtype, c_dtype="bfloat16", **tiles)
    inputs = {"alpha": alpha, "beta": beta, "prob": prob, "c": c}
    dev = {k: v.cuda() for k, v in inputs.items()}
    dev["c"] = wide.cuda()[:, :2 * n]         # .cuda() of the view would make it contiguous
    assert dev["c"].stride(0) == c_pitch
    out = op(a.cuda(), offsets.cuda(), b.cuda(), inputs=dev)
    ref = op.reference(a, offsets, b, inputs=inputs)
    valid = int(offsets[-1])
    want = np.asarray(ref.out_values["d"], dtype=np.float64)[:valid]
    got = out["d"].float().cpu().numpy()[:valid]
    tol = 2.0 ** -7 if d_dtype == "bfloat16" else 2.0 ** -12
    assert np.all(np.abs(got - want) <= tol * np.abs(want) + 2.0 ** -12 * np.abs(want).max())
    dp = np.asarray(ref.values["dp"], dtype=np.float64)[:valid]
    want_p = np.asarray(ref.dprob, dtype=np.float64)[:valid]
    got_p = out["dprob"].cpu().numpy().astype(np.float64)[:valid]
    assert np.all(np.abs(got_p - want_p) <= 2.0 ** -12 * np.abs(dp).sum(1) + 1e-6)
    assert not out["d"][valid:].any() and not out["dprob"][valid:].any()


N_MAJOR_CASES = [  # (tile_m, tile_n, weight_mode, N, K, cluster): edges in N (not a multiple of 64)
    (128, 256, "dense", 512, 256, (1, 1)),          # and K; clusters multicast the K slices of
    (64, 128, "dense", 200, 136, (1, 1)),           # each 64-column chunk (an odd N-tile count
    (128, 128, "discrete", 320, 192, (1, 1)),       # leaves a phantom tile in a 1x2 block)
    (128, 256, "discrete", 264, 72, (1, 1)),
    (128, 256, "dense", 520, 256, (2, 2)),
    (128, 128, "discrete", 200, 1000, (2, 1)),
    (64, 128, "dense", 328, 72, (1, 2)),
]


@pytest.mark.parametrize("case", N_MAJOR_CASES, ids=lambda c: "-".join(map(str, c)))
def test_n_major_weights(torch, case):
    """b_major n on sm_90a: B read in place from (L, K, N) weights (dense: the (L, N, K) view
    w.transpose(1, 2); discrete: per-expert (K, N) pointers), against the numpy GEMM of the same
    weights: FP32 D within the FP32 accumulation bound |error| <= K 2^-24 sum_k |a b| (+ the
    epilogue's roundings, 2^-22 |d|); a wrong layout or descriptor gives O(1) relative errors."""
    from fusegemm import EpilogueGemm
    tile_m, tile_n, mode, n, k, cluster = case
    a, offsets, _, alpha, prob = _gemm_problem(torch, n=n, k=k, seed=5)
    w = (torch.randn(alpha.shape[0], k, n, generator=torch.Generator().manual_seed(6)) * 0.1).to(torch.bfloat16)
    op = EpilogueGemm("grouped_gemm", b_major="n", d_dtype="float32", tile_m=tile_m, tile_n=tile_n, weight_mode=mode,
                      cluster_m=cluster[0], cluster_n=cluster[1])
    inputs = {"alpha": alpha, "prob": prob}
    dev_inputs = {key: v.cuda() for key, v in inputs.items()}
    if mode == "dense":
        out = op(a.cuda(), offsets.cuda(), w.cuda().transpose(1, 2), inputs=dev_inputs)
    else:
        experts = [w[e].cuda().contiguous() for e in range(w.shape[0])]
        ptrs = torch.tensor([t.data_ptr() for t in experts], dtype=torch.int64, device="cuda")
        out = op(a.cuda(), offsets.cuda(), b_ptrs=ptrs, n=n, inputs=dev_inputs)
    ref = op.reference(a, offsets, w.transpose(1, 2), inputs=inputs)
    valid = int(offsets[-1])
    want = np.asarray(ref.out_values["d"], dtype=np.float64)[:valid]
    got = out["d"].cpu().numpy().astype(np.float64)[:valid]
    bound = np.zeros_like(want)
    start = 0
    a64, w64 = a.double().numpy(), w.double().numpy()
    for e, end in enumerate(offsets.tolist()):
        bound[start:end] = np.abs(a64[start:end]) @ np.abs(w64[e]) * float(alpha[e]) * prob[start:end, None].numpy()
        start = end
    assert np.all(np.abs(got - want) <= k * 2.0 ** -24 * bound + 2.0 ** -22 * np.abs(want) + 2.0 ** -30)
    assert np.abs(got).max() > 0 and not out["d"][valid:].any()


def test_n_major_weights_are_refused_where_not_read():
    """A K-major op given an N-major view (and the reverse) is refused before any launch."""
    import torch
    from fusegemm import EpilogueGemm
    from fusegemm.base.errors import ArgumentError
    a = torch.zeros(256, 64, dtype=torch.bfloat16, device="cuda")
    off = torch.tensor([256], dtype=torch.int32, device="cuda")
    w = torch.zeros(1, 64, 128, dtype=torch.bfloat16, device="cuda")     # (L, K, N)
    with pytest.raises(ArgumentError, match="b_tensor.stride: got .*allowed: K-major"):
        EpilogueGemm("grouped_gemm")(a, off, w.transpose(1, 2), inputs={"alpha": torch.ones(1, device="cuda")})
    with pytest.raises(ArgumentError, match="b_tensor.stride: got .*allowed: N-major"):
        EpilogueGemm("grouped_gemm", b_major="n")(a, off, w.transpose(1, 2).contiguous(),
                                                   inputs={"alpha": torch.ones(1, device="cuda")})


@pytest.fixture(scope="module")
def doubled_spec_path(tmp_path_factory) -> Path:
    """grouped_gemm.yaml with D's rule edited to twice its value, saved as a user's file."""
    src = Path(find_spec("grouped_gemm").path).read_text()
    edited = src.replace("name: grouped_gemm\n", "name: grouped_gemm_x2\n").replace(
        "- d = where(present(bias), c, prob * g)", "- d = where(present(bias), c, 2 * prob * g)")
    assert edited.count("2 * prob * g") == 1 and "name: grouped_gemm_x2" in edited
    path = tmp_path_factory.mktemp("specs") / "grouped_gemm_x2.yaml"
    path.write_text(edited)
    return path


def test_yaml_edit_changes_the_kernel(torch, doubled_spec_path):
    """Doubling D in grouped_gemm.yaml's rule doubles what the compiled GEMM writes."""
    from fusegemm import EpilogueGemm
    a, offsets, b, alpha, prob = _gemm_problem(torch, n=256, seed=4)
    args = (a.cuda(), offsets.cuda(), b.cuda())
    inputs = {"alpha": alpha.cuda(), "prob": prob.cuda()}
    base = EpilogueGemm("grouped_gemm", d_dtype="float32")(*args, inputs=inputs)["d"]
    twice = EpilogueGemm(doubled_spec_path, d_dtype="float32")(*args, inputs=inputs)["d"]
    assert torch.equal(twice, 2 * base) and base.abs().max() > 0


def test_reducing_rule_with_inputs_of_every_kind_end_to_end(torch, tmp_path):
    """The kitchen rule (per-expert amax; row, column, element and scalar inputs; FP32 C and BF16
    D) through the compiled sm_90a GEMM, where it takes the fragment path of reducing rules
    (frag_blocks: column and element inputs read by pairs, amax flushed per tile), against the
    numpy GEMM + interpreter on ragged and empty experts; N = 200 ends inside the second
    128-column tile and inside its third 32-column block (the pair-by-pair tail).
    Tolerances: the GEMM's FP32 accumulation order differs from numpy's, so C within 2^-12
    relative (+ 2^-12 of its largest value), D within BF16's 2^-7, amax within 2^-10."""
    from fusegemm import EpilogueGemm
    path = tmp_path / "kitchen.yaml"
    path.write_text(_test_spec_text("kitchen", KITCHEN_EPILOGUE))
    n = 200
    a, offsets, b, alpha, _ = _gemm_problem(torch, n=n, seed=11)
    g = torch.Generator().manual_seed(12)
    inputs = {"alpha": alpha, "prob": torch.rand(a.shape[0], generator=g).to(torch.bfloat16),
              # (N, L) with N contiguous, as column inputs are laid out (the op refuses others)
              "bias": torch.randn(alpha.shape[0], n, generator=g).to(torch.float16).t(),
              "res": torch.randn(a.shape[0], n, generator=g).to(torch.bfloat16), "k": 0.5}
    op = EpilogueGemm(path)
    dev = {key: (v.cuda() if hasattr(v, "cuda") else v) for key, v in inputs.items()}
    out = op(a.cuda(), offsets.cuda(), b.cuda(), inputs=dev)
    ref = op.reference(a, offsets, b, inputs=inputs)
    valid = int(offsets[-1])
    for name, rel in (("c", 2.0 ** -12), ("d", 2.0 ** -7)):
        want = np.asarray(ref.out_values[name], dtype=np.float64)[:valid]
        got = out[name].float().cpu().numpy().astype(np.float64)[:valid]
        assert np.all(np.abs(got - want) <= rel * np.abs(want) + 2.0 ** -12 * np.abs(want).max()), name
        assert not out[name][valid:].any(), name
    want_amax = np.asarray(ref.amax, dtype=np.float64)
    got_amax = out["amax"].cpu().numpy().astype(np.float64).reshape(want_amax.shape)
    finite = np.isfinite(want_amax)               # the empty expert keeps the buffer's -inf
    assert np.array_equal(got_amax[~finite], want_amax[~finite]) and finite.sum() == 3, (got_amax, want_amax)
    assert np.all(np.abs(got_amax - want_amax)[finite] <= 2.0 ** -10 * np.abs(want_amax)[finite]), (got_amax, want_amax)


def test_swiglu_gemm_with_no_tokens(torch):
    """A spec-driven op on an A of zero rows (an expert-parallel rank that received no tokens):
    empty outputs, nothing launched, no refusal."""
    from fusegemm import EpilogueGemm
    op = EpilogueGemm("grouped_gemm_swiglu", d_dtype="bfloat16")
    a = torch.empty((0, 128), dtype=torch.bfloat16, device="cuda")
    b = torch.zeros((2, 512, 128), dtype=torch.bfloat16, device="cuda")
    offsets = torch.zeros(2, dtype=torch.int32, device="cuda")
    out = op(a, offsets, b, inputs={"alpha": torch.ones(2, device="cuda"),
                                    "prob": torch.ones(0, device="cuda")})
    torch.cuda.synchronize()
    assert out["d"].shape[0] == 0
