"""Autotuning of the grouped GEMM's launch configuration: measure once, record, reuse.

``fusegemm tune grouped_gemm --shape experts=8,tokens=16384,n=4096,k=7168`` (or :func:`tune`)
times every tile and scheduler the device's arch implements (static, dynamic and, on sm_90a, the
stream-K remainder) on a seeded problem of that shape
and records the fastest in the kernel cache, ``<cache>/tuned/<spec>.<arch>.<device>.json``,
under the problem's **bucket**: experts, rows per expert (rounded to a power of two), N, K and
the output/weight options. ``fusegemm.grouped_gemm`` called without ``mma_tiler_mn`` and
``use_dynamic_sched`` reads the record of its call's bucket (on its first call of a new
argument signature: never on the repeat-call fast path) and launches the winner; a bucket with
no record gets the spec's default, or with ``FUSEGEMM_AUTOTUNE=1`` is tuned on that first call
(:func:`first_call`). Later processes, and every rank sharing the cache, reuse
the record. The records are kept by fusegemm/tuning_records.py, which the ops read: this module
writes them, and the ops reach :func:`first_call` through the hook
``fusegemm.base.hooks.FIRST_CALL_TUNE`` the package root installs (tuning times the ops, so the
ops do not import it).

The record names the device (an H100's winner is not an H200's) and the configuration, so a
record never changes numerics: every candidate computes the same FP32-accumulated GEMM.
"""
from __future__ import annotations

import functools
import logging
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from . import tuning_records
from .base.errors import ArgumentError, UnsupportedError
from .tuning_records import Bucket, Candidate

__all__ = ["TuneResult", "tune", "first_call", "parse_shape"]

SPECS = ("grouped_gemm",)        # the families tuning is implemented for
SHAPE_KEYS = ("experts", "tokens", "n", "k")


@dataclass
class TuneResult:
    """What :func:`tune` measured and recorded.

    Attributes
    ----------
    bucket : Bucket
    best : Candidate
    default : Candidate
        The configuration a call without a record gets (the spec's default).
    ms : dict
        Median milliseconds per candidate label.
    path : pathlib.Path or None
        The record file written (None when the cache is read-only or off: the record then
        lasts this process).
    fastest : Candidate
        The fastest measured; ``best`` is it unless the default is within ``margin`` of it.
    """

    bucket: Bucket
    best: Candidate
    default: Candidate
    ms: dict[str, float]
    path: Path | None
    fastest: Candidate

    @property
    def speedup(self) -> float:
        """Default's time over the winner's."""
        return self.ms[self.default.label] / self.ms[self.best.label]


def parse_shape(text: str) -> dict[str, int]:
    """``experts=8,tokens=16384,n=4096,k=7168`` -> a dict; every key required, positive ints.

    Parameters
    ----------
    text : str
        Comma-separated ``key=value`` pairs with the keys experts, tokens, n, k.
    """
    out: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, _, value = part.partition("=")
        if key not in SHAPE_KEYS or not value.isdigit() or int(value) <= 0 or key in out:
            raise ArgumentError("--shape", repr(text), "experts=L,tokens=T,n=N,k=K with positive integers, "
                                "each key once")
        out[key] = int(value)
    missing = [k for k in SHAPE_KEYS if k not in out]
    if missing:
        raise ArgumentError("--shape", repr(text), f"all of {', '.join(SHAPE_KEYS)} (missing {', '.join(missing)})")
    return out


def queued_ms(fn: Callable[[], Any], iters: int) -> float:
    """The device time per call, in ms, of ``iters`` calls of ``fn`` issued back to back between one
    pair of CUDA events on the current stream (the host's issue time hidden where it is shorter);
    bench/_common.py times with it too."""
    import torch
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters


def _median_ms(fns: dict[str, Callable[[], Any]], warmup: int, iters: int, rounds: int) -> dict[str, float]:
    """CUDA-event median per function over interleaved rounds of ``iters`` calls each."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for key, fn in fns.items():
            times[key].append(queued_ms(fn, iters))
    return {k: statistics.median(v) for k, v in times.items()}


def _sizes(experts: int, tokens: int, dist: str, seed: int) -> list[int]:
    """Tokens per expert: equal, or skewed (half the tokens on an eighth of the experts)."""
    import numpy as np
    if dist == "balanced":
        base = [tokens // experts] * experts
        base[0] += tokens - sum(base)
        return base
    rng = np.random.default_rng(seed)
    w = rng.pareto(1.2, experts) + 0.05
    raw = np.floor(w / w.sum() * tokens).astype(int)
    raw[0] += tokens - raw.sum()
    return [int(v) for v in raw]


def tune(spec: str = "grouped_gemm", *, experts: int, tokens: int, n: int, k: int, dist: str = "balanced",
         d_dtype: str = "bfloat16", device: int = 0, warmup: int = 2, iters: int = 10, rounds: int = 5,
         margin: float = 0.05, write: bool = True, progress: Callable[[str], None] | None = None,
         bucket: Bucket | None = None, gated_modes: bool = True) -> TuneResult:
    """Measure every configuration the device's arch implements for this shape; record the best.

    Parameters
    ----------
    spec : str
        ``grouped_gemm`` (the one family tuning covers today).
    experts : int
        L.
    tokens : int
        Rows of all experts before padding; each expert's rows are padded to 256.
    n : int
        N.
    k : int
        K.
    dist : {"balanced", "skewed"}
        How tokens spread over the experts (the bucket is the same; this only changes the
        measured problem).
    d_dtype : str
        D's dtype (part of the bucket).
    device : int
        CUDA device ordinal.
    warmup : int
        Untimed calls per candidate.
    iters : int
        Calls per timed round.
    rounds : int
        Interleaved rounds; each candidate's median is kept.
    margin : float
        The fastest configuration is recorded only when it beats the default by more than this
        fraction (0.05: 5%); otherwise the default is recorded (run-to-run noise on the H200 is
        1-5%: a 2.6% winner of one run lost by 1-5% in the next).
    write : bool
        Record the winner in the cache (always: for the rest of this process).
    progress : callable, optional
        Called with a line of text per candidate measured.
    bucket : Bucket, optional
        Record under this bucket instead of the measured shape's own (the first-call tuner
        records under its call's bucket, whose rows per expert the seeded problem may round
        differently). Its options must be those of the measured problem.
    gated_modes : bool
        Also time configurations of a mode no GPU has run yet (``registry.UNEXECUTED_MODES``;
        none at present), each of which passes the first-run gate before its first
        launch (tens of seconds per configuration class, once per cache); first-call tuning leaves
        them out.

    Returns
    -------
    TuneResult
    """
    if spec not in SPECS:
        raise UnsupportedError(f"spec: got {spec!r}; tuning is implemented for {', '.join(SPECS)}")
    if dist not in ("balanced", "skewed"):
        raise ArgumentError("dist", repr(dist), "'balanced' or 'skewed'")
    for name, value in (("experts", experts), ("tokens", tokens), ("n", n), ("k", k), ("iters", iters),
                        ("rounds", rounds)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ArgumentError(name, repr(value), "a positive int")
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not 0 <= margin < 1:
        raise ArgumentError("margin", repr(margin), "a fraction in [0, 1)")
    sizes = _sizes(experts, tokens, dist, seed=0)
    padded = [-(-s // 256) * 256 for s in sizes]
    m = sum(padded)
    measured = Bucket.of(experts=experts, m_rows=m, n=n, k=k, d_dtype=d_dtype)
    if bucket is None:
        bucket = measured
    elif bucket.options != measured.options:
        raise ArgumentError("bucket", bucket.key, f"options {measured.options} (those of the measured problem)")
    import torch

    from .generator import registry
    from .generator.spec import find_spec
    from .generator.variants import default_choice
    from .ops.device import device_arch
    from .presets import GroupedGemm
    from .runtime.load import device_name
    arch = device_arch(device)
    name = device_name(device)
    spec_ = find_spec(spec)
    dev = torch.device("cuda", device)
    g = torch.Generator(device=dev).manual_seed(0)
    a = (torch.randn(m, k, generator=g, device=dev) * 0.5).bfloat16()
    b = (torch.randn(experts, n, k, generator=g, device=dev) * k ** -0.5).bfloat16()
    off = torch.tensor(padded, device=dev).cumsum(0).to(torch.int32)
    alpha = torch.ones(experts, device=dev)
    d_t = torch.empty(m, n, dtype=getattr(torch, d_dtype), device=dev)
    defaults = default_choice(spec_, arch)
    default = Candidate((defaults["tile_m"], defaults["tile_n"]), defaults.get("scheduler", "static"))
    fns: dict[str, Callable[[], Any]] = {}
    cands: dict[str, Candidate] = {}
    spec_choices = spec_.choice_map
    for tm in spec_choices["tile_m"]:
        for tn in spec_choices["tile_n"]:
            for sched in spec_choices.get("scheduler", ("static",)):
                c = Candidate((tm, tn), sched)
                if c.stream_k:
                    if not gated_modes and registry.unexecuted_mode(spec_.kernel, arch, {"scheduler": c.scheduler}):
                        continue
                    fn = _stream_k_candidate(spec, c, device, d_dtype, (a, off, b), alpha, progress)
                    if fn is None:
                        continue
                else:
                    op = GroupedGemm(a, None, d_t, off, alpha, b, d_dtype=d_dtype, use_dynamic_sched=c.dynamic,
                                     mma_tiler_mn=c.tile, arch=arch)
                    if op.support_problem() is not None:
                        continue          # outside what this arch's kernel implements
                    op.compile()
                    fn = functools.partial(op.execute, a, None, d_t, off, alpha, b)
                fns[c.label] = fn
                cands[c.label] = c
                if progress:
                    progress(f"compiled {c.label}")
    if default.label not in fns:      # pragma: no cover - the default is always implemented
        raise UnsupportedError(f"the default configuration {default.label} does not run on {arch}")
    ms = _median_ms(fns, warmup, iters, rounds)
    if progress:
        for label, t in sorted(ms.items(), key=lambda kv: kv[1]):
            progress(f"{label:18s} {t:.4f} ms")
    fastest = cands[min(ms, key=ms.get)]
    # Run-to-run noise on the H200 is 1-5% (64x256 dynamic led dsv3-fc1 by 2.6% here and then
    # lost to the default by 1-5% in the next benchmark): a winner within `margin` of the default
    # is noise, not a reason to leave the configuration every test exercises.
    best = fastest if ms[default.label] > ms[fastest.label] * (1 + margin) else default
    record = {"tile": list(best.tile), "dynamic": best.dynamic, "scheduler": best.scheduler,
              "ms": round(ms[best.label], 5),
              "fastest": fastest.label, "margin": margin,
              "default_ms": round(ms[default.label], 5), "measured": {k_: round(v, 5) for k_, v in ms.items()},
              "shape": {"experts": experts, "tokens": tokens, "n": n, "k": k, "dist": dist},
              "device": name, "date": time.strftime("%Y-%m-%d")}
    # The store tells its readers (the wrapper's memoised calls re-resolve their configuration).
    file = tuning_records.record_file(spec, arch, name)
    tuning_records.remember(file, bucket.key, record)
    path = tuning_records.write(file, bucket.key, record) if write else None
    return TuneResult(bucket, best, default, ms, path, fastest)


def _stream_k_candidate(spec: str, c: Candidate, device: int, d_dtype: str, operands: tuple, alpha: Any,
                        progress: Callable[[str], None] | None) -> Callable[[], Any] | None:
    """The stream-K scheduler's launch of ``c`` (not a seed argument: the spec-driven op on the
    same operands and alpha), or None where this arch's kernel does not implement it or its
    first launch fails (the first-run gate of a mode no GPU has run: its cases, in the watchdog
    child); the reason goes to ``progress``."""
    from .base.errors import FusegemmError
    from .ops.engine import Op
    try:
        op = Op(spec, device=device, scheduler="streamk", tile_m=c.tile[0], tile_n=c.tile[1], d_dtype=d_dtype)
        op.check_support()
        op(*operands, inputs={"alpha": alpha})
    except FusegemmError as exc:
        if progress:
            progress(f"skipped {c.label}: {str(exc).splitlines()[0]}")
        return None
    return lambda: op(*operands, inputs={"alpha": alpha})


_log = logging.getLogger("fusegemm")
_first_lock = threading.Lock()
_tuning = threading.local()      # set while this thread tunes: calls made meanwhile are not tuned
_first_done: dict[tuple[str, str, int, str], Candidate | None] = {}


def first_call(spec: str, arch: str, device: int, device_name: str, bucket: Bucket, *, experts: int,
               m_rows: int, n: int, k: int, d_dtype: str, stream: int = 0) -> Candidate | None:
    """First-call tuning (``FUSEGEMM_AUTOTUNE=1``): tune ``bucket`` now and return its winner.

    Called by ``fusegemm.grouped_gemm`` on the first call of an argument signature whose bucket
    has no record. Runs :func:`tune` once per (bucket, device) per process, on a balanced seeded
    problem of the call's experts, rows, N and K, and records the winner under the call's bucket.
    Returns None, and the caller launches its default, when the bucket's options are ones
    :func:`tune` does not measure (C, bias, discrete or N-major weights), for a call with fewer
    than 256 rows, while ``stream`` is capturing a CUDA graph (tuning allocates and
    synchronises), while this thread tunes or runs a first-run verification
    (:mod:`fusegemm.verify`), or when tuning fails (logged once; not retried in this process).

    Parameters
    ----------
    spec : str
        The spec (``grouped_gemm``).
    arch : str
        The device's arch.
    device : int
        CUDA device ordinal.
    device_name : str
        The device's name (records are per device model).
    bucket : Bucket
        The call's shape class.
    experts : int
        L of the call.
    m_rows : int
        Rows of the call's A (the padded total).
    n : int
        N.
    k : int
        K.
    d_dtype : str
        D's dtype.
    stream : int
        The call's stream (raw handle), checked for graph capture.
    """
    if bucket.options != Bucket.of(experts=experts, m_rows=m_rows, n=n, k=k, d_dtype=d_dtype).options:
        return None
    from . import verify
    if getattr(_tuning, "on", False) or verify.running():
        # A call made while this thread tunes, or while it runs the first-run verification of
        # an unexecuted arch (whose selftest cases call the wrappers, and which tuning's own
        # compiles can enter): its default. Tuning inside verification would record the
        # selftest's shapes, verify a tuned configuration instead of the default, and could
        # deadlock against another thread holding the tuning lock while it waits to verify.
        return None
    if m_rows < 256:
        return None     # no row tile (an empty rank): nothing to measure, and its bucket is r1
    from .runtime.tensors import is_capturing
    if is_capturing(stream):
        return None
    key = (spec, arch, device, bucket.key)
    if key in _first_done:
        return _first_done[key]
    with _first_lock:
        if key in _first_done:
            return _first_done[key]
        _log.warning("fusegemm: FUSEGEMM_AUTOTUNE=1: tuning %s bucket %s on device %d (%s) before its "
                     "first launch", spec, bucket.key, device, device_name)
        _tuning.on = True
        try:
            res = tune(spec, experts=experts, tokens=m_rows, n=n, k=k, d_dtype=d_dtype, device=device,
                       bucket=bucket, gated_modes=False)   # (no first-run gates inside a user's call)
            best: Candidate | None = res.best
            _log.warning("fusegemm: %s bucket %s: %s recorded (%s)", spec, bucket.key, best.label,
                         ", ".join(f"{lab} {t:.4f} ms" for lab, t in sorted(res.ms.items(), key=lambda kv: kv[1])))
        except Exception as exc:     # tuning is an optimisation: the call goes on with its default
            best = None
            _log.warning("fusegemm: tuning %s bucket %s failed (%s: %s); launching the default "
                         "configuration, and not tuning this bucket again in this process",
                         spec, bucket.key, type(exc).__name__, exc)
        finally:
            _tuning.on = False
        _first_done[key] = best
        return best
