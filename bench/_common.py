"""What the benchmarks under bench/ share: the MoE shapes, expert-size distributions, CUDA-event
timing, interleaved rounds, the command-line options and the JSON they print."""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time

# A method that has not returned after this many seconds is taken for a hung kernel (--hang-s).
HANG_S = 180.0

SHAPES = {
    "dsv3-fc1": (8, 16384, 4096, 7168),
    "dsv3-fc2": (8, 16384, 7168, 2048),
    "mixtral-fc1": (8, 32768, 28672, 4096),
    "qwen3-fc1": (32, 16384, 1536, 2048),
}

# Problems of few tiles, where the last wave's share of the SMs decides (bench/grouped_gemm.py
# --shapes; the stream-K remainder's case): dsv3-fc1 at 2,048 tokens (256 tiles of 128 x 256, 1.9
# waves on 132 SMs, K 7,168), and one expert's 512 rows with a long K (32 tiles, K 8,192).
FEW_TILE_SHAPES = {
    "dsv3-fc1-2k": (8, 2048, 4096, 7168),
    "small-m-long-k": (1, 512, 2048, 8192),
}


def expert_tokens(experts: int, tokens: int, dist: str, seed: int = 0) -> list[float]:
    """Each expert's share of ``tokens`` rows under ``dist`` (seeded): equal ("balanced"), uniform
    random routing ("routed", whole rows), or a Dirichlet draw (any other name)."""
    import numpy as np
    if dist == "balanced":
        return [tokens / experts] * experts
    if dist == "routed":   # uniform random routing, as the MoE layer benchmarks' random logits give
        return [int(r) for r in np.random.default_rng(seed).multinomial(tokens, [1 / experts] * experts)]
    return list(np.random.default_rng(seed).dirichlet(np.ones(experts)) * tokens)


def expert_sizes(experts: int, tokens: int, dist: str, seed: int = 0) -> list[int]:
    """:func:`expert_tokens` padded to multiples of 256 rows, as the MoE routing pads them."""
    return [int(-(-r // 256) * 256) for r in expert_tokens(experts, tokens, dist, seed)]


def time_ms(fn, warmup: int, iters: int) -> float:
    import torch
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def queued_ms(fn, warmup: int, iters: int) -> float:
    """The GPU's time per call over ``iters`` calls issued back to back between one pair of events:
    the host's issue time is hidden wherever it is shorter than the GPU's, as in a training step
    whose host runs ahead. (:func:`time_ms` waits for each call, so it charges every call the
    host's time to reach its first kernel as well: the latency of one call, not the throughput.)"""
    import torch

    from fusegemm.tune import queued_ms as back_to_back
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    return back_to_back(fn, iters)


def host_ms(fn, iters: int = 5) -> float:
    """The host's time to issue one call of ``fn`` (the median of ``iters``, each after the GPU
    went idle): above the GPU's time per call, an eager loop waits on Python, not kernels."""
    import time

    import torch
    times = []
    for _ in range(iters):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    torch.cuda.synchronize()
    return statistics.median(times)


@contextlib.contextmanager
def watchdog(what: str, seconds: float, stop=os._exit):
    """Stop the process (``stop(124)``) when the block has not finished after ``seconds``, naming
    ``what`` on stderr: a kernel that never finishes blocks the next synchronize for good, and a run
    stopped from outside (the device tool's limit) would not say which method hung. The rows already
    finished are on disk (write_partial). ``seconds`` <= 0: no watchdog."""
    if seconds <= 0:
        yield
        return

    def fire() -> None:
        print(f"bench: {what} did not finish within {seconds:g} s (a hung kernel?); stopping the run",
              file=sys.stderr, flush=True)
        stop(124)

    timer = threading.Timer(seconds, fire)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def prebuild(ops, what: str = "kernels") -> None:
    """Compile the kernels of ``ops`` (``fusegemm.Op`` instances, built or not) into the disk cache
    in parallel worker processes (``fusegemm.build``: FUSEGEMM_JOBS, else every CPU) before their
    first calls, which would compile them one after another: on a fresh GPU machine a benchmark of
    a dozen blockwise kernels spent minutes of its device time in NVRTC, serially. Kernels the
    cache holds are read, not rebuilt; a kernel that fails to compile is reported on stderr and
    left to its first call, which raises the compile error itself."""
    from fusegemm import build
    from fusegemm.runtime import config
    start = time.perf_counter()
    try:
        rows = build.build([op.kernel_variant for op in ops], jobs=config.jobs())
    except Exception as exc:   # (a broken worker pool, e.g. a __main__ the workers cannot import)
        print(f"bench: {what}: prebuild failed ({type(exc).__name__}: {exc}); each compiles at its first call",
              file=sys.stderr, flush=True)
        return
    for r in rows:
        if not r.ok:
            print(f"bench: prebuild of {r.name} failed: {r.error.splitlines()[0] if r.error else '?'}",
                  file=sys.stderr)
    built = sum(1 for r in rows if r.ok and not r.cached)
    print(f"bench: {what}: {built} compiled, {sum(1 for r in rows if r.cached)} cached, "
          f"{time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)


def round_order(methods, r: int) -> list:
    """The methods' order in round ``r``: row r (mod the rows) of a Williams design, a Latin square
    whose rows also balance who runs right before whom. Over its n rows (2n for an odd count n of
    methods) every method takes every place equally often and follows every other method equally
    often. A rotation alone (round r starting at method r) keeps each method's predecessor: on an
    H100 (2026-12-06, bench/moe_layer.py's null control, mixtral) the block timed again right after
    the torch layer in every round ran 0.944x-0.962x of itself in four processes, whichever order
    the graphs were captured in (bench/results/moe_layer_h100_capture_order_*.json)."""
    keys = list(methods)
    n = len(keys)
    if n <= 1:
        return keys
    first, lo, hi = [0], 1, n - 1   # 0, 1, n-1, 2, n-2, ...: the design's first row
    while len(first) < n:
        first.append(lo)
        lo += 1
        if len(first) < n:
            first.append(hi)
            hi -= 1
    rows = [[(f + i) % n for f in first] for i in range(n)]
    if n % 2:
        rows += [row[::-1] for row in rows]
    return [keys[j] for j in rows[r % len(rows)]]


def interleaved_ms(methods: dict, args, timer=time_ms, rounds_out: dict | None = None) -> dict[str, float]:
    """Every method timed in each of ``args.rounds`` interleaved rounds; the median over all
    samples. Clocks and neighbours drift during a run, and interleaving keeps that drift out of
    the ratios. Round r runs the methods in :func:`round_order`'s row r, so that over the rounds every
    method takes every place in the order and follows every other method: a method's place alone moved its
    time by 4% (H100, 2026-12-06, bench/moe_layer.py's null control ``--also block-again``, the block timed
    twice in fixed order: 0.96x of itself at dsv3 and mixtral, 1.00x at qwen3;
    bench/results/moe_layer_h100_null_fixed_order.json), and so did the method run before it (round_order).
    Each method's round runs under :func:`watchdog` (``args.hang_s``). ``timer``:
    :func:`time_ms` (each call's latency) or :func:`queued_ms` (calls back to back).
    ``rounds_out``, when given, receives each method's per-round times (for paired ratios:
    :func:`round_ratios`)."""
    samples: dict[str, list[float]] = {} if rounds_out is None else rounds_out
    samples.update({key: [] for key in methods})
    hang_s = getattr(args, "hang_s", HANG_S)
    for r in range(args.rounds):
        for key in round_order(methods, r):
            with watchdog(f"method {key!r} (round {r + 1})", hang_s):
                samples[key].append(timer(methods[key], args.warmup, args.iters))
    return {key: statistics.median(samples[key]) for key in methods}


def round_ratios(rounds: dict[str, list[float]], num: str, den: str) -> dict[str, float]:
    """The ratio rounds[num][r] / rounds[den][r] of each interleaved round (two methods timed side
    by side in the same round share its clocks): their median, min and max, the spread a ratio of
    medians hides (on a power-capped board the clocks move by more than a kernel's gain)."""
    r = [a / b for a, b in zip(rounds[num], rounds[den])]
    if not r:
        raise ValueError(f"round_ratios: no rounds of {num!r} and {den!r}")
    return {"median": statistics.median(r), "min": min(r), "max": max(r)}


def _add_hang_argument(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--hang-s", type=float, default=HANG_S,
                    help="stop the run, naming the method, when one round of it takes longer (0: never)")


def add_run_arguments(ap: argparse.ArgumentParser, shapes: str) -> None:
    ap.add_argument("--shapes", default=shapes)
    ap.add_argument("--dists", default="balanced,skewed")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=10, help="timed launches per round (median)")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds per method")
    ap.add_argument("--out", default=None, help="write the JSON here as well")
    _add_hang_argument(ap)


def add_layer_arguments(ap: argparse.ArgumentParser, names, *, warmup: int, iters: int, rounds: int,
                        flag: str = "--layers") -> None:
    """The options of a benchmark over named rows (:func:`run_layers`): ``flag`` (the names, all by
    default; read back as ``args.layers``), --warmup, --iters, --rounds, --out, --hang-s."""
    ap.add_argument(flag, dest="layers", metavar="NAMES", default=",".join(names))
    ap.add_argument("--warmup", type=int, default=warmup)
    ap.add_argument("--iters", type=int, default=iters)
    ap.add_argument("--rounds", type=int, default=rounds)
    ap.add_argument("--out", default=None, help="write the JSON here as well")
    _add_hang_argument(ap)


def run(args, bench_shape, summary, header: dict, method_note: str = "", shapes: dict | None = None) -> int:
    """``bench_shape(name, dist, args)`` for every --shapes x --dists row (``summary(row)`` goes
    to stderr as each finishes); prints the JSON (``header``, the run's facts and method with
    ``method_note`` appended, the rows) and writes it to --out. 1 without a CUDA GPU.
    ``shapes``: the names --shapes may take (default: SHAPES, the grouped GEMMs')."""
    import torch
    if not torch.cuda.is_available():
        print(json.dumps({"error": "no CUDA GPU"}))
        return 1
    rows = []
    known = SHAPES if shapes is None else shapes
    result = {
        **header,
        "device": torch.cuda.get_device_name(0), "torch": torch.__version__,
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d"), "method": f"CUDA events; {args.rounds} interleaved rounds per "
        f"method, each the median of {args.iters} launches after {args.warmup} warm-ups; median "
        f"over rounds{method_note}", "rows": rows,
    }
    names = args.shapes.split(",")
    for name in names:
        if name not in known:
            raise SystemExit(f"--shapes: unknown {name!r}; allowed: {', '.join(known)}")
    dists = args.dists.split(",")
    for name in names:
        for dist in dists:
            rows.append(bench_shape(name, dist, args))
            print(f"{name:12s} {dist:8s} {summary(rows[-1])}", file=sys.stderr)
            write_partial(result, args.out, len(names) * len(dists))
    emit_json(result, args.out)
    return 0


def write_partial(result: dict, out: str | None, total: int) -> None:
    """Write ``result`` as it stands to ``out`` after each row (marked ``partial`` until the last):
    a run stopped by a time limit keeps the rows it finished."""
    if out and len(result["rows"]) < total:
        with open(out, "w") as fh:
            fh.write(json.dumps({**result, "partial": f"{len(result['rows'])} of {total} rows: the run "
                                 "stopped before the rest"}, indent=1) + "\n")


def emit_json(result: dict, out: str | None) -> None:
    """Print a benchmark's JSON, and write it to ``out`` as well when given."""
    text = json.dumps(result, indent=1)
    print(text)
    if out:
        with open(out, "w") as fh:
            fh.write(text + "\n")


def run_layers(args, layers: dict, bench_layer, summary, benchmark: str, steps: str = "steps", note: str = "",
               **fields) -> int:
    """``bench_layer(name, args)`` for every name of ``args.layers`` (keys of ``layers``),
    ``summary(row)`` to stderr as each finishes; prints the JSON (``benchmark``, the run's facts,
    the timing method with ``note`` appended, ``fields`` and the rows) and writes it to --out. 1
    without a CUDA GPU."""
    import torch
    if not torch.cuda.is_available():
        print(json.dumps({"error": "no CUDA GPU"}))
        return 1
    rows: list = []
    result = {"benchmark": benchmark, "device": torch.cuda.get_device_name(0), "torch": torch.__version__,
              "python": platform.python_version(), "date": time.strftime("%Y-%m-%d"),
              "method": f"CUDA events; {args.rounds} interleaved rounds, each the median of {args.iters} {steps} "
                        f"after {args.warmup} warm-ups; median over rounds" + note, **fields, "rows": rows}
    names = args.layers.split(",")
    for name in names:
        if name not in layers:
            raise SystemExit(f"--layers: unknown {name!r}; allowed: {', '.join(layers)}")
    for name in names:
        rows.append(bench_layer(name, args))
        print(f"{name:8s} {summary(rows[-1])}", file=sys.stderr)
        write_partial(result, args.out, len(names))
    emit_json(result, args.out)
    return 0


@contextlib.contextmanager
def nvrtc_defines(defines: str):
    """Kernels compiled inside the block get ``defines`` (``-DNAME=VALUE ...``) after the run's
    own FUSEGEMM_NVRTC_EXTRA: the A/B switches of the headers. The NVRTC options are part of the
    cache key, so both builds coexist in one process."""
    from fusegemm.runtime import config
    base = config.VARS["FUSEGEMM_NVRTC_EXTRA"].raw() or ""
    with config.override(FUSEGEMM_NVRTC_EXTRA=(base + " " + defines).strip()):
        yield


def add_also_argument(ap: argparse.ArgumentParser) -> None:
    """``--also NAME=DEFINES`` (repeatable): the benchmark's fusegemm op built again with these
    NVRTC defines (a header's A/B switch, see nvrtc_defines), timed as method NAME."""
    ap.add_argument("--also", action="append", default=[], metavar="NAME=DEFINES",
                    help="another build of fusegemm's op with these NVRTC defines (repeatable)")


def also_builds(args) -> list[tuple[str, str]]:
    """The (name, defines) pairs of --also; a malformed one stops the run naming it."""
    out = []
    for x in args.also:
        name, _, defines = x.partition("=")
        if not name.isidentifier() or not defines:
            raise SystemExit(f"--also: got {x!r}; expected NAME=DEFINES, e.g. staged=-DFUSEGEMM_SM90_DEFER_STORE=0")
        out.append((name, defines))
    return out


def also_small_kernels(module, names, args, builds: dict) -> dict:
    """Each --also build of ``module``'s small kernels (``module._KERNELS``, a SmallKernels:
    fusegemm.quantize's, fusegemm.permute's) under its defines, kept in ``builds`` (name ->
    SmallKernels) and compiled once: kernels ``names`` must load, else the run stops naming the
    build."""
    import torch
    for name, defines in also_builds(args):
        if name not in builds:
            k = module._KERNELS.variant(defines)
            for kernel in names:
                if k.function(torch.cuda.current_device(), kernel) is None:
                    raise SystemExit(f"--also {name}: {module._KERNELS.header} does not build with {defines}")
            builds[name] = k
    return builds


def with_small_kernels(module, kernels, run):
    """``run`` with ``module``'s small kernels swapped for ``kernels`` (an :func:`also_small_kernels`
    build) while it runs."""
    def go():
        saved, module._KERNELS = module._KERNELS, kernels
        try:
            return run()
        finally:
            module._KERNELS = saved
    return go


def whole_fill(run):
    """``run`` with the spec ops' outputs zero-filled whole before each GEMM (their allocation
    before fusegemm/ops/tail.py) instead of uninitialised rows and a tail kernel."""
    import fusegemm.ops.epilogue_gemm as eg
    import fusegemm.ops.kgrouped as kg
    from fusegemm.ops.device import alloc_outputs

    def filled(*a, rows_written=False, **k):
        return alloc_outputs(*a, **k)

    def wrapped():
        saved = eg.alloc_outputs, eg.zero_tail, kg.alloc_outputs
        eg.alloc_outputs, eg.zero_tail, kg.alloc_outputs = filled, (lambda *a, **k: None), filled
        try:
            run()
        finally:
            eg.alloc_outputs, eg.zero_tail, kg.alloc_outputs = saved
    return wrapped


def kernel_table(run, steps: int = 3, top: int = 12) -> dict:
    """torch.profiler over ``steps`` steps of ``run``: the kernels' total time per step, the
    ``top`` kernels by time (ms per step, launches per step, name) and the GPU's idle time
    (:func:`device_gaps`). The wall time under the profiler minus the kernels' is not that idle
    time: it also holds the host's start and the profiler's own cost (a graphed dsv3-32 step,
    H200: 0.77 ms of it, the GPU idle 0.02 ms)."""
    prof, wall = _profiled(run, steps)
    events = sorted((e for e in prof.key_averages() if e.self_device_time_total > 0),
                    key=lambda e: -e.self_device_time_total)
    total = sum(e.self_device_time_total for e in events) / steps / 1e3
    # GEMM kernels: fusegemm's (fg_*) and torch's grouped GEMMs (CUTLASS); the rest is everything around them.
    gemm = sum(e.self_device_time_total for e in events if e.key.startswith("fg_") or "cutlass" in e.key) / steps / 1e3
    return {"wall_ms_per_step": wall, "kernel_ms_per_step": total, "gemm_ms_per_step": gemm,
            "top": [(e.self_device_time_total / steps / 1e3, e.count // steps, e.key[:120]) for e in events[:top]],
            **device_gaps(_device_spans(prof), steps, top)}


def kernel_calls(run, steps: int = 3, min_ms: float = 0.0) -> list:
    """torch.profiler over ``steps`` steps of ``run`` (after one unprofiled step): the device
    operations of one step in launch order, each as (ms, name), the median of its ``steps``
    launches, those under ``min_ms`` left out. Which call is which role (fc1, its data gradient,
    ...) is read from the order, where ``kernel_table``'s totals by name merge a kernel's calls
    (torch's layer runs three CUTLASS kernels twice each)."""
    prof, _ = _profiled(run, steps)
    return launch_order(_device_spans(prof), steps, min_ms)


def _profiled(run, steps: int):
    """torch.profiler (CUDA activity) over ``steps`` steps of ``run`` after one unprofiled step:
    the profile and the wall time per step under it (ms)."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            run()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - start) * 1e3 / steps
    return prof, wall


def _device_spans(prof) -> list:
    """The profile's device operations as (start, end, name), microseconds."""
    from torch.autograd import DeviceType
    return [(e.time_range.start, e.time_range.end, e.name) for e in prof.events()
            if e.device_type == DeviceType.CUDA and e.time_range.end > e.time_range.start]


def launch_order(spans, steps: int, min_ms: float = 0.0, name_chars: int = 120) -> list:
    """``spans`` (start, end, name in microseconds) of ``steps`` equal steps as one step's
    operations in order of start, each (ms, name) with the median of its ``steps`` durations
    (operation i of the step is operation i of every step); those under ``min_ms`` left out."""
    order = sorted(spans)
    if not order or len(order) % steps:
        raise RuntimeError(f"kernel_calls: {len(order)} device operations over {steps} steps: the steps differ")
    per = len(order) // steps
    calls = []
    for i in range(per):
        names = {order[i + s * per][2] for s in range(steps)}
        if len(names) > 1:
            raise RuntimeError(f"kernel_calls: operation {i} of a step is {sorted(names)} in different steps")
        times = sorted(order[i + s * per][1] - order[i + s * per][0] for s in range(steps))
        ms = times[len(times) // 2] / 1e3
        if ms >= min_ms:
            calls.append((ms, order[i][2][:name_chars]))
    return calls


# What sustained() asks nvidia-smi for every 50 ms.
SMI_QUERY = "timestamp,clocks.sm,power.draw,clocks_event_reasons.active"


def parse_smi(text: str) -> list[tuple[float, float, float, str]]:
    """(unix time, SM MHz, watts, reasons) per nvidia-smi CSV line; unparsable lines skipped."""
    out = []
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 4:
            continue
        try:
            stamp, frac = parts[0].split(".")
            t = time.mktime(time.strptime(stamp, "%Y/%m/%d %H:%M:%S")) + float("0." + frac)
            out.append((t, float(parts[1]), float(parts[2]), parts[3]))
        except ValueError:
            continue
    return out


def sustained(methods: dict, seconds: float) -> dict[str, dict]:
    """Each method alone for ``seconds`` under nvidia-smi sampling: ms per launch (CUDA events
    over the window) and :func:`window_stats` of the samples in the window less its first 0.8 s.
    Clock fields are None without nvidia-smi."""
    import torch
    try:
        smi = subprocess.Popen(["nvidia-smi", f"--query-gpu={SMI_QUERY}", "--format=csv,noheader,nounits",
                                "-lms", "50"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    except OSError:
        smi = None
    time.sleep(0.5)
    windows = {}
    for key, fn in methods.items():
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0, launches = time.time(), 0
        start.record()
        while time.time() - t0 < seconds:
            for _ in range(5):
                fn()
            launches += 5
            torch.cuda.synchronize()
        end.record()
        end.synchronize()
        windows[key] = (t0 + 0.8, time.time(), start.elapsed_time(end) / launches)
        time.sleep(0.3)
    samples = []
    if smi is not None:
        smi.terminate()
        samples = parse_smi(smi.communicate()[0])
    return {key: window_stats([s for s in samples if a <= s[0] <= b], ms) for key, (a, b, ms) in windows.items()}


def add_power_argument(ap: argparse.ArgumentParser, what: str = "method") -> None:
    """``--power SECONDS``: after the rounds, each ``what`` (a method, a configuration) alone for
    that long under nvidia-smi sampling (:func:`sustained`); 0 (the default) for none. A negative
    value is refused."""
    ap.add_argument("--power", type=seconds_type, default=0.0, metavar="SECONDS",
                    help=f"after the rounds, each {what} alone for SECONDS under nvidia-smi sampling (ms, clock, "
                         f"watts, joules per call; on a power-capped board the time follows the joules; 0: none)")


def seconds_type(text: str) -> float:
    """argparse type of a duration option (``--power``, ceiling.py's ``--seconds``): a float >= 0."""
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"got {text}; allowed: seconds >= 0 (0: none)")
    return value


seconds_type.__name__ = "seconds"   # (argparse names the type in its message for a non-number)


def power_rows(methods: dict, seconds: float, base: str, label: str | None = None) -> dict:
    """:func:`sustained` windows of ``methods`` (``sustained``) and each one's joules per call
    over ``base``'s (``joules_vs_<label>``, label defaulting to base; only where both have samples)."""
    windows = sustained(methods, seconds)
    ref = windows[base]["joules"]
    return {"sustained": windows,
            f"joules_vs_{label or base}": {key: w["joules"] / ref for key, w in windows.items()
                                           if key != base and w["joules"] and ref}}


# clocks_event_reasons bits (nvml's nvmlClocksEventReason*): the board's own power limit (SwPowerCap),
# and the slowdowns besides it (HwSlowdown, SwThermalSlowdown, HwThermalSlowdown, HwPowerBrakeSlowdown).
SW_POWER_CAP, SLOWDOWNS = 0x4, 0x8 | 0x20 | 0x40 | 0x80


def _reason_bits(text: str) -> int:
    """nvidia-smi's clocks_event_reasons.active ("0x0000000000000004") as an int; 0 if unreadable."""
    try:
        return int(text, 16)
    except ValueError:
        return 0


def window_stats(samples: list[tuple[float, float, float, str]], ms: float) -> dict:
    """One sustained window's figures from its nvidia-smi ``samples`` (parse_smi's tuples) and
    its ``ms`` per launch: the mean and median SM clock, the mean power, the energy of one
    launch at that power (``joules``: what a power-capped board trades for time), the share of
    samples in which the power cap held the clock down and in which a thermal or hardware slowdown
    did, and the reasons seen. The clock and power fields are None without samples."""
    out = {"ms": ms, "samples": len(samples), "clock_event_reasons": sorted({s[3] for s in samples})}
    if not samples:
        return {**out, **dict.fromkeys(("sm_mhz", "sm_mhz_median", "watts", "joules", "power_capped", "slowdown"))}
    bits = [_reason_bits(s[3]) for s in samples]
    watts = statistics.mean(s[2] for s in samples)
    return {**out, "sm_mhz": statistics.mean(s[1] for s in samples),
            "sm_mhz_median": statistics.median(s[1] for s in samples), "watts": watts, "joules": watts * ms / 1000,
            "power_capped": sum(1 for b in bits if b & SW_POWER_CAP) / len(bits),
            "slowdown": sum(1 for b in bits if b & SLOWDOWNS) / len(bits)}


def device_gaps(spans, steps: int, top: int = 12, name_chars: int = 60) -> dict:
    """Where the GPU idles between its own operations: ``spans`` are the device's (start, end,
    name) in microseconds (kernels, copies, fills, from any number of streams). Returns the idle
    time per step between the first start and the last end (time no span covers) and the
    ``top`` transitions by idle time (ms per step, occurrences per step, "previous -> next",
    each name cut to ``name_chars``): a wall time above the kernels' sum is located there."""
    order = sorted(spans)
    idle, by_pair = 0.0, {}
    reach, last = None, None
    for start, end, name in order:
        if reach is not None and start > reach:
            gap = start - reach
            idle += gap
            key = f"{last[:name_chars]} -> {name[:name_chars]}"
            total, count = by_pair.get(key, (0.0, 0))
            by_pair[key] = (total + gap, count + 1)
        if reach is None or end >= reach:
            reach, last = end, name
    pairs = sorted(by_pair.items(), key=lambda kv: -kv[1][0])[:top]
    return {"idle_ms_per_step": idle / steps / 1e3,
            "top_gaps": [(total / steps / 1e3, count / steps, key) for key, (total, count) in pairs]}
