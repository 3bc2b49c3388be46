"""Launch fuzzing and concurrency on the GPU (issue 13).

* Fuzzed problems: hypothesis draws shapes (ragged and empty experts, edge N/K), dtypes and
  options for every op; each call either runs and matches the numpy reference (the selftest's
  case runners: exact on integer problems, stated tolerances otherwise) or is refused before the
  launch, with exactly the refusal the host checks give the same arguments as CPU tensors, or,
  for arguments the host accepts, with a limit of the device's arch. Every case the host accepts
  and the arch implements must run, and every op must run at least a fifth of its drawn cases
  (and at least one). Anything else --
  another exception, another refusal, a mismatch, a device fault -- fails.
* Fuzzed device offsets: ``padded_offsets`` values live on the device and are not checked by
  default, so garbage values (negative, decreasing, past the rows, not multiples of 256) must
  run without a fault; with ``FUSEGEMM_VALIDATE_OFFSETS=1`` the host refuses exactly the invalid ones.
* Concurrency: ``execute()`` of one op object from 8 threads, each on its own stream, gives
  every thread its own correct result (per-thread argument buffers and per-call scratch).

``FUSEGEMM_GPU_FUZZ_EXAMPLES`` sets the examples per family's fuzz test (default 60); the counts of
cases run, refused and matched are printed at the end (``-s``) and written to
``$FUSEGEMM_TEST_OUT/fuzz_gpu.json`` (``fuzz_gpu.<worker>.json`` under xdist) when that is set.
"""
from __future__ import annotations

import json
import os
import threading

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
torch = pytest.importorskip("torch")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import fusegemm  # noqa: E402
from fusegemm import selftest  # noqa: E402
from fusegemm.base.errors import ArgumentError, FusegemmError, UnsupportedError  # noqa: E402
from fusegemm.runtime import config  # noqa: E402

pytestmark = pytest.mark.gpu

EXAMPLES = int(os.environ.get("FUSEGEMM_GPU_FUZZ_EXAMPLES", "60"))
FUZZ = settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
                suppress_health_check=list(HealthCheck))
COUNTS: dict[str, int] = {}


def _count(what: str) -> None:
    COUNTS[what] = COUNTS.get(what, 0) + 1


@pytest.fixture(scope="module", autouse=True)
def _report():
    yield
    torch.cuda.synchronize()   # a fault anywhere above would surface here at the latest
    text = json.dumps(COUNTS, sort_keys=True)
    print("\nGPU fuzz cases:", text)
    out = os.environ.get("FUSEGEMM_TEST_OUT")
    if out:
        worker = os.environ.get("PYTEST_XDIST_WORKER")   # one file per xdist worker
        with open(os.path.join(out, f"fuzz_gpu{'.' + worker if worker else ''}.json"), "w") as fh:
            fh.write(text + "\n")


def _refused(exc: BaseException) -> None:
    """A refusal must be fusegemm's typed error, with got/allowed for argument errors."""
    assert isinstance(exc, FusegemmError), f"{type(exc).__name__}: {exc}"
    if isinstance(exc, ArgumentError):
        assert "got" in str(exc) and "allowed" in str(exc), str(exc)


# ---------------------------------------------------------------- fuzzed problems

TOKENS = st.lists(st.sampled_from([0, 1, 17, 128, 255, 256, 257, 300, 512, 700]), min_size=1, max_size=6)
GEMM_DT = ["bfloat16", "float16", "float32"]
FP8 = ["float8_e4m3fn", "float8_e5m2"]
FAMILIES = ("grouped_gemm", "grouped_gemm_srelu", "grouped_gemm_quant", "grouped_gemm_dswiglu", "gemm_amax")


@st.composite
def cases(draw, family):
    """(family, selftest case dict) for ``family``'s op; some combinations are meant to be refused."""
    if family == "grouped_gemm":
        case = dict(tokens=draw(TOKENS), n=draw(st.sampled_from([8, 64, 128, 136, 200, 256, 264, 520])),
                    k=draw(st.sampled_from([8, 64, 72, 128, 136, 200, 256])),
                    d_dtype=draw(st.sampled_from(GEMM_DT)))
        if draw(st.booleans()):
            case.update(generate_c=True, c_dtype=draw(st.sampled_from(GEMM_DT)))
        case.update(bias=draw(st.booleans()), discrete=draw(st.booleans()),
                    use_dynamic_sched=draw(st.booleans()))
        if draw(st.integers(0, 3)) == 0:
            case["mma_tiler_mn"] = draw(st.sampled_from([(128, 128), (128, 256), (64, 128), (256, 256)]))
        return family, case
    if family == "gemm_amax":
        return family, dict(m=draw(st.sampled_from([1, 7, 128, 200, 256, 300])),
                            n=draw(st.sampled_from([32, 128, 136, 264])),
                            k=draw(st.sampled_from([32, 64, 128, 320])),
                            batch=draw(st.integers(1, 3)), ab_dtype=draw(st.sampled_from(FP8)),
                            c_dtype=draw(st.sampled_from(GEMM_DT)),
                            call=dict(c_major=draw(st.sampled_from(["n", "m"]))))
    n_choices = [32, 64, 96, 128, 160, 256, 296, 384]
    # dSwiGLU with FP8 A/B stores FP8 D only: bfloat16 is drawn last, as the refusal (drawn first,
    # hypothesis chose it for every dSwiGLU case and the op never ran).
    d_dtypes = FP8 + ["bfloat16"] if family == "grouped_gemm_dswiglu" else ["bfloat16"] + FP8
    case = dict(tokens=draw(TOKENS), n=draw(st.sampled_from(n_choices)),
                k=draw(st.sampled_from([32, 64, 128, 160, 256, 320])),
                ab_dtype=draw(st.sampled_from(FP8)),
                d_dtype=draw(st.sampled_from(d_dtypes)))
    if family != "grouped_gemm_dswiglu":
        case.update(bias=draw(st.booleans()), discrete=draw(st.booleans()))
    if family == "grouped_gemm_srelu" and case["d_dtype"] != "bfloat16" and draw(st.booleans()):
        case["call"] = dict(discrete_col_sfd=True)
    return family, case


def _host_verdict(family: str, case: dict) -> str | None:
    """The wrapper's verdict on the case's arguments as CPU tensors, where it checks every
    argument and then stops at the device check: None when every argument passed (the GPU must
    run the case), else the refusal the GPU must give word for word."""
    try:
        selftest.CASE_RUNNERS[family](dict(case), "cpu")
    except FusegemmError as exc:
        return None if str(exc).startswith("a_tensor.device: got cpu;") else str(exc)
    raise AssertionError(f"{family} {case} ran on CPU tensors")


def _arch_limit(exc: BaseException, arch: str) -> bool:
    """A refusal only the device can give: a configuration the registry row of its arch does
    not implement (generator/registry.py's Implementation.problem words it)."""
    return isinstance(exc, UnsupportedError) and f" on {arch}" in str(exc) and "is not implemented for" in str(exc)


# Executed calls per family: at least a fifth of the cases drawn, and at least one (a strategy whose
# draws are nearly all refused would otherwise pass while testing nothing).
FLOOR_FRACTION = 5


@pytest.mark.parametrize("family", FAMILIES)
def test_fuzzed_problems_match_the_reference_or_are_refused(family):
    """Each drawn case runs and matches the reference, or is refused with exactly what the host
    checks refuse on CPU tensors, or (host-valid) with a limit of the device's arch. Floors,
    from the drawn cases: every case the host accepts and the arch implements ran, and the
    family ran at least ``max(1, drawn // FLOOR_FRACTION)`` cases."""
    from fusegemm.ops.device import device_arch
    arch = device_arch(0)
    seen: dict[str, int] = {}

    def note(what: str) -> None:
        seen[what] = seen.get(what, 0) + 1
        _count(what)

    @FUZZ
    @given(drawn=cases(family))
    def one(drawn):
        family, case = drawn
        if family == "grouped_gemm_dswiglu" and case["n"] % 32:
            return   # the problem builder's own rule (dSwiGLU pairs columns), not the op's
        expected = _host_verdict(family, case)
        note(f"{family}: drawn")
        try:
            err, ok, detail = selftest.CASE_RUNNERS[family](dict(case))
        except FusegemmError as exc:
            _refused(exc)
            if expected is not None:
                assert str(exc) == expected, f"{family} {case}: refused on the GPU with {exc!r}; on CPU: {expected!r}"
                note(f"{family}: refused by the host checks")
            else:
                assert _arch_limit(exc, arch), f"{family} {case}: the host accepts it, the GPU refused: {exc!r}"
                note(f"{family}: refused by an {arch} limit")
            note(f"refused because: {str(exc).split(';')[0][:90]}")
            return
        assert expected is None, f"{family} {case}: ran, but the host checks refuse it: {expected}"
        note(f"{family}: ran")
        assert ok, f"{family} {case}: {detail} (error {err:.3e})"

    one()
    drawn, ran = seen.get(f"{family}: drawn", 0), seen.get(f"{family}: ran", 0)
    refused = seen.get(f"{family}: refused by the host checks", 0) + seen.get(f"{family}: refused by an {arch} limit", 0)
    assert ran + refused == drawn, seen
    assert ran >= max(1, drawn // FLOOR_FRACTION), f"{family}: {ran} of {drawn} drawn cases ran: {seen}"


@pytest.mark.parametrize("family", ["grouped_gemm", "grouped_gemm_srelu", "grouped_gemm_quant",
                                    "grouped_gemm_dswiglu"])
def test_a_rank_that_received_no_tokens(family):
    """A has zero rows (an expert-parallel rank with no tokens; numpy gives such arrays (0, 0)
    strides): the call returns empty outputs, launches nothing, and is not refused."""
    case = dict(tokens=[0, 0], n=128, k=128)
    if family != "grouped_gemm":
        case["d_dtype"] = "float8_e4m3fn"
    err, ok, detail = selftest.CASE_RUNNERS[family](case)
    assert ok, detail


# ---------------------------------------------------------------- fuzzed device offsets

def _offset_values(l: int):
    v = st.one_of(st.integers(-2**31, 2**31 - 1), st.sampled_from([-256, -1, 0, 1, 255, 256, 512, 768, 4096]))
    return st.lists(v, min_size=l, max_size=l)


_PROBLEMS: dict[str, tuple] = {}


def _problem(family: str):
    """One valid call per grouped op (built once): (kwargs for the wrapper, rows of A, keep)."""
    if family not in _PROBLEMS:
        from fusegemm.output_compare import device_args
        from fusegemm.problems import make_grouped_problem
        values = "realistic" if family == "grouped_gemm" else "integer"
        pb = make_grouped_problem(family, num_experts=3, tokens=[256, 0, 300], n=128, k=128, values=values,
                                  seed=21, layout="canonical" if family == "grouped_gemm" else "kernel")
        kw = pb.kwargs() if family == "grouped_gemm" else pb.kwargs(sf_vec_size=32)
        dev, keep = device_args(kw)
        _PROBLEMS[family] = (dev, pb.valid_m, keep)
    return _PROBLEMS[family]


def _valid(values: list[int], m: int) -> bool:
    prev = 0
    for v in values:
        if v < prev or v % 256:
            return False
        prev = v
    return prev <= m


@FUZZ
@given(family=st.sampled_from(["grouped_gemm", "grouped_gemm_srelu", "grouped_gemm_quant",
                               "grouped_gemm_dswiglu"]), values=_offset_values(3))
def test_garbage_device_offsets_never_fault(family, values):
    dev, m, _ = _problem(family)
    offsets = torch.tensor(values, dtype=torch.int32, device="cuda")
    call = getattr(fusegemm, family)
    out = call(**{**dev, "padded_offsets": offsets})          # unchecked: wrong rows, never a fault
    torch.cuda.synchronize()
    assert all(t is None or t.is_cuda for t in out.values())
    _count("device offsets: launched unchecked")
    with config.override(FUSEGEMM_VALIDATE_OFFSETS="1"):
        if _valid(values, m):
            call(**{**dev, "padded_offsets": offsets})
            _count("device offsets: valid, accepted when checked")
        else:
            with pytest.raises(ArgumentError, match="padded_offsets"):
                call(**{**dev, "padded_offsets": offsets})
            _count("device offsets: invalid, refused when checked")
    torch.cuda.synchronize()


# ---------------------------------------------------------------- 8 threads, 8 streams

THREADS, ITERS = 8, 12


def _in_threads(body) -> None:
    """Run body(i) in THREADS threads started together; re-raise the first failure."""
    start = threading.Barrier(THREADS)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            start.wait()
            body(i)
        except BaseException as exc:   # noqa: BLE001 -- handed to the main thread
            errors.append(exc)

    workers = [threading.Thread(target=run, args=(i,)) for i in range(THREADS)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    if errors:
        raise errors[0]


@pytest.mark.parametrize("mode", ["static", "dynamic", "discrete"])
def test_one_grouped_gemm_op_from_8_threads_on_8_streams(mode):
    """Each thread executes one shared op on its own stream with its own data (even threads
    name the stream, odd ones set it current): every D must equal its own reference."""
    from test_grouped_gemm_gpu import check, make_problem, reference

    from fusegemm.presets import GroupedGemm
    discrete = mode == "discrete"
    pbs = [make_problem([256, 0, 512, 256], 256, 192, discrete=discrete, canonical=True, seed=40 + i)
           for i in range(THREADS)]
    ds = [torch.full((pb["m"], 256), float("nan"), dtype=torch.bfloat16, device="cuda") for pb in pbs]
    a0 = pbs[0]["args"]
    op = GroupedGemm(pbs[0]["a"], None, ds[0], a0["padded_offsets"], a0["alpha_tensor"],
                     None if discrete else a0["b_tensor"], None, a0["prob_tensor"],
                     num_experts=4 if discrete else None, b_shape=(256, 192) if discrete else None,
                     use_dynamic_sched=mode == "dynamic").compile()
    streams = [torch.cuda.Stream() for _ in range(THREADS)]
    torch.cuda.synchronize()

    def body(i: int) -> None:
        args, s = pbs[i]["args"], streams[i]
        kw = dict(d_tensor=ds[i], padded_offsets=args["padded_offsets"], alpha_tensor=args["alpha_tensor"],
                  b_tensor=args.get("b_tensor"), prob_tensor=args["prob_tensor"], b_ptrs=args.get("b_ptrs"))
        for _ in range(ITERS):
            if i % 2:
                with torch.cuda.stream(s):
                    op.execute(args["a_tensor"], **kw)
            else:
                op.execute(args["a_tensor"], **kw, current_stream=s)
        s.synchronize()

    _in_threads(body)
    torch.cuda.synchronize()
    for i, pb in enumerate(pbs):
        _, rd, scale = reference(pb)
        check(ds[i], rd, scale, "bfloat16", sum(pb["sizes"]), f"thread {i} ({mode})")
    _count(f"threads: grouped_gemm {mode}, {THREADS}x{ITERS} executes")


def test_wrapper_from_8_threads_on_8_streams():
    """The wrappers' shared op cache and fast path under concurrent calls."""
    from test_grouped_gemm_gpu import check, make_problem, reference
    pbs = [make_problem([512, 256], 128, 128, canonical=True, seed=60 + i) for i in range(THREADS)]
    outs: list = [None] * THREADS
    streams = [torch.cuda.Stream() for _ in range(THREADS)]
    torch.cuda.synchronize()

    def body(i: int) -> None:
        with torch.cuda.stream(streams[i]):
            for _ in range(ITERS):
                outs[i] = fusegemm.grouped_gemm(**pbs[i]["args"])["d_tensor"]
        streams[i].synchronize()

    _in_threads(body)
    for i, pb in enumerate(pbs):
        _, rd, scale = reference(pb)
        valid = sum(pb["sizes"])
        check(outs[i][:valid], rd, scale, "bfloat16", valid, f"wrapper thread {i}")
    _count(f"threads: grouped_gemm wrapper, {THREADS}x{ITERS} calls")


def test_one_srelu_op_from_8_threads_on_8_streams():
    """A block-scaled class op (amax reset and SFD on the launch stream) shared by 8 threads:
    every thread's bytes equal the wrapper's single-threaded result for its data."""
    from fusegemm.output_compare import device_args
    from fusegemm.problems import make_grouped_problem
    devs, wants, keep = [], [], []
    for i in range(THREADS):
        pb = make_grouped_problem("grouped_gemm_srelu", num_experts=3, tokens=[256, 0, 300], n=256, k=256,
                                  values="integer", d_dtype="float8_e4m3fn", seed=80 + i)
        dev, kp = device_args(pb.kwargs(sf_vec_size=32))
        devs.append(dev)
        keep.append(kp)
        wants.append(fusegemm.grouped_gemm_srelu(**dev))
    torch.cuda.synchronize()
    raw = (lambda t: t.view(torch.uint8) if t.dtype.itemsize == 1 else t)
    outs = [{k: torch.full_like(raw(v), 7).view(v.dtype) for k, v in w.items() if v is not None} for w in wants]
    d0 = devs[0]
    op = fusegemm.GroupedGemmSrelu(sample_a=d0["a_tensor"], sample_b=d0["b_tensor"], sample_sfa=d0["sfa_tensor"],
                                   sample_sfb=d0["sfb_tensor"], sample_c=wants[0]["c_tensor"],
                                   sample_d=wants[0]["d_tensor"], sf_vec_size=32)
    op.compile()
    streams = [torch.cuda.Stream() for _ in range(THREADS)]
    torch.cuda.synchronize()

    def body(i: int) -> None:
        args = {k: v for k, v in devs[i].items() if k not in ("c_dtype", "d_dtype", "sf_vec_size")}
        for _ in range(ITERS):
            op.execute(**args, **outs[i], current_stream=streams[i])
        streams[i].synchronize()

    _in_threads(body)
    for i in range(THREADS):
        for key, w in wants[i].items():
            if w is not None:
                assert torch.equal(raw(outs[i][key]), raw(w)), (i, key)
    _count(f"threads: grouped_gemm_srelu class, {THREADS}x{ITERS} executes")


def test_the_context_is_still_healthy():
    """Last in the module: a known-good case still runs and matches after all of the above."""
    err, ok, detail = selftest.CASE_RUNNERS["grouped_gemm"](dict(tokens=[300, 0, 256], n=256, k=128))
    assert ok, detail
    assert np.isfinite(err)
