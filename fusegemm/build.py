"""Build many variants into the cache, in parallel processes, with progress.

Only what the registry implements is built. Cache hits are resolved in this process (render +
key + read: milliseconds), so a warm ``fusegemm build`` never starts a worker; only misses go to
the process pool, and each kernel is rendered and keyed once.
"""
from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from .base import interrupts
from .base.errors import FusegemmError, UnsupportedError
from .generator import registry
from .generator.spec import Spec, find_spec, list_specs
from .generator.variants import Variant, make_variant, prebuild_variants, surface
from .pipeline import Planned, compile_planned, lookup, plan
from .runtime.cache import Built, KernelCache, default_cache


@dataclass(frozen=True)
class BuildResult:
    """One row of the build table."""

    name: str
    spec: str
    arch: str
    ok: bool
    cached: bool
    seconds: float            # compile seconds (cold) or lookup seconds (cached)
    registers: int = 0
    smem_bytes: int = 0       # static + dynamic shared memory per CTA
    spill_bytes: int = 0      # local memory frame per thread
    threads: int = 0
    tmem_cols: int = 0        # sm_100a TMEM columns per CTA
    error: str = ""
    variants: int = 1         # variants served by this kernel (e.g. every cluster shape)
    advisories: tuple[str, ...] = ()   # ptxas performance advisories (e.g. C7518: serialized WGMMAs)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class Skipped:
    """A (spec, arch) of the request that builds nothing, and why."""

    spec: str
    arch: str
    status: str               # registry status: none | implemented (all variants out of its limits)
    reason: str


def preflight(cache: KernelCache | None = None) -> None:
    """What every kernel of a build needs, checked once, before any work: the FUSEGEMM_*
    settings (``runtime.config.check``), the bundles of FUSEGEMM_BUNDLE (opened as the runtime
    opens them: the same CacheError the API raises for that value) and, where the build stores
    kernels, a cache folder it can create. Raises ConfigError or CacheError."""
    from .runtime import config
    from .runtime.bundle import default_bundles
    config.check()
    default_bundles().active()
    c = cache or default_cache()
    if c.not_stored() is None:
        c.ensure_root()


def select(specs: Iterable[str] | None, archs: tuple[str, ...], *, all_variants: bool = False,
           choices: dict[str, Any] | None = None) -> tuple[list[Variant], list[Skipped]]:
    """Variants to build (each spec's prebuild list; with ``all_variants`` its whole surface;
    with ``choices`` (a dict, maybe empty) the one point per arch they pick from the defaults),
    restricted to what the registry implements, and the (spec, arch) pairs that build nothing,
    with the reason."""
    if all_variants and choices is not None:
        raise UnsupportedError("--all and --variant: got both; allowed: one of them (--all builds "
                               "the whole implemented surface, --variant one point of it)")
    if choices and "arch" in choices:
        # The arch is --arch's (every spec's arch axis); --variant arch= agreeing with it is
        # redundant, disagreeing is a contradiction, not an axis that "does not reach the kernel".
        want = choices["arch"]
        if tuple(archs) != (want,):
            raise UnsupportedError(f"--variant arch={want}: the arch is chosen with --arch, and --arch gives "
                                   f"{', '.join(archs)}, which disagrees; allowed: --arch {want} (and no arch in "
                                   "--variant)", axis="arch")
        choices = {a: v for a, v in choices.items() if a != "arch"}
    names = list(specs) if specs else [p.stem for p in list_specs()]
    out: list[Variant] = []
    skipped: list[Skipped] = []
    for name in names:
        spec = find_spec(name)
        for arch in archs:
            if arch not in spec.choice_map["arch"]:
                continue
            row = registry.lookup(spec.kernel, arch)
            if row is None:
                skipped.append(Skipped(spec.name, arch, registry.NONE, f"no kernel for {arch}"))
                continue
            requested = _for_arch(spec, arch, row, all_variants, choices)
            got = [v for v in requested if row.problem(v.choices) is None]
            if not got:
                # Say which axis value the kernel lacks (the first variant's), not only that
                # something is missing: the user's next step is to change that value.
                why = row.problem(requested[0].choices) if requested else None
                skipped.append(Skipped(spec.name, arch, row.status, why or "no variant of the request is "
                                       "inside the kernel's implemented limits"))
            out.extend(got)
    return out, skipped


def _for_arch(spec: Spec, arch: str, row: registry.Implementation, all_variants: bool,
              choices: dict[str, Any] | None) -> list[Variant]:
    """The variants requested on ``arch``, before the kernel's limits are applied (a single
    ``choices`` point out of them is an error here, naming the limit)."""
    if choices is not None:
        row.reaching(choices, spec.epilogue.axes_read())
        v = make_variant(spec, arch=arch, **choices)
        why = row.problem(v.choices)
        if why is not None:
            raise UnsupportedError(why)
        return [v]
    if all_variants:
        return list(surface(spec, arch, as_variants=True))
    return prebuild_variants(spec, (arch,))


def _result(v: Variant, b: Built, seconds: float) -> BuildResult:
    # b.name is the kernel's name (readable + source hash), shared by its variants
    return BuildResult(name=b.name, spec=v.spec.name, arch=v.arch, ok=True, cached=b.cached,
                       seconds=seconds, registers=b.resources.registers,
                       smem_bytes=b.resources.static_shared_bytes + b.contract.smem_bytes,
                       spill_bytes=b.resources.local_bytes, threads=b.contract.threads,
                       tmem_cols=b.contract.tmem_cols, advisories=b.advisories)


def _failed(v: Variant, seconds: float, exc: Exception) -> BuildResult:
    return BuildResult(name=v.readable, spec=v.spec.name, arch=v.arch, ok=False, cached=False,
                       seconds=seconds, error=str(exc))


def _compile_one(p: Planned, cache: KernelCache | None = None) -> BuildResult:
    """Worker body: compile a planned kernel (rendered and keyed in the parent)."""
    t0 = time.perf_counter()
    try:
        b = compile_planned(p, cache)
    except FusegemmError as exc:
        return _failed(p.variant, time.perf_counter() - t0, exc)
    return _result(p.variant, b, b.compile_seconds if not b.cached else time.perf_counter() - t0)


def _build_planned(ps: list[Planned], *, jobs: int, cache: KernelCache | None,
                   done: Callable[[int, BuildResult], None]) -> None:
    """Cache hits are read here; misses are compiled, in ``jobs`` worker processes (forkserver)
    unless ``jobs`` is 1 or a custom ``cache`` is given (in-process). ``done(i, row)`` for each."""
    misses: list[int] = []
    for i, p in enumerate(ps):
        interrupts.check()
        t0 = time.perf_counter()
        try:
            hit = lookup(p, cache or default_cache())
        except FusegemmError as exc:
            done(i, _failed(p.variant, 0.0, exc))
            continue
        if hit is not None:
            done(i, _result(p.variant, hit, time.perf_counter() - t0))
        else:
            misses.append(i)
    if jobs <= 1 or len(misses) <= 1 or cache is not None:
        for i in misses:
            interrupts.check()
            done(i, _compile_one(ps[i], cache))
    elif misses:
        # forkserver: safe when the caller has threads (torch, CUDA); workers need no CUDA.
        ctx = multiprocessing.get_context("forkserver" if sys.platform.startswith("linux") else "spawn")
        with _interrupt_flag() as interrupted:
            pool = _start_pool(min(jobs, len(misses)), ctx)
            futures = {pool.submit(_compile_one, ps[i]): i for i in misses}
            try:
                pending = set(futures)
                while pending:
                    if interrupted.is_set():
                        raise KeyboardInterrupt
                    finished, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
                    for fut in finished:
                        done(futures[fut], fut.result())
            except BaseException:
                # Ctrl-C (or a failing callback): start nothing new and stop the running
                # compiles now. A stopped compile leaves at most a .tmp-* folder, which entries()
                # ignores; every finished kernel is already in the cache for the next build.
                _stop(pool)
                raise
            pool.shutdown(wait=True)
        if interrupted.is_set():
            raise KeyboardInterrupt


@contextlib.contextmanager
def _interrupt_flag():
    """While the pool runs, Ctrl-C only sets a flag that the wait loop checks (every 0.2 s).

    A KeyboardInterrupt raised at an arbitrary bytecode can leave one of the executor's locks
    held (a `with lock:` interrupted between acquire and its try), and the shutdown that follows
    then waits forever: seen once in 20 interrupted builds. Outside the main thread, nothing to do.
    A process started with SIGINT ignored keeps ignoring it: a shell without job control starts
    `fusegemm build &` so, to keep a terminal's Ctrl-C meant for the foreground from reaching it
    (POSIX); this handler used to re-enable it halfway through such a build.
    """
    import signal
    import threading
    flag = threading.Event()
    if interrupts.seen():   # latched earlier, its KeyboardInterrupt swallowed: stop at once
        flag.set()
    ignored = signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    if ignored or threading.current_thread() is not threading.main_thread():
        yield flag
        return

    def handler(signum: int, frame: Any) -> None:
        flag.set()
        interrupts.record()
    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield flag
    finally:
        signal.signal(signal.SIGINT, previous)


def _start_pool(workers: int, ctx: Any) -> ProcessPoolExecutor:
    """A worker pool whose helper processes (forkserver, resource tracker, workers) ignore
    SIGINT, started without losing a Ctrl-C meant for this process.

    While they start, SIGINT is ignored *and* blocked here. The children inherit both across
    fork and exec (the forkserver hands SIG_IGN on to every worker it forks), so a Ctrl-C that
    reaches the process group while one of them is still importing cannot print a traceback or
    break the pool. On Linux a blocked signal stays pending even while ignored, so when the
    handler (_interrupt_flag's) and then the mask are restored below, a Ctrl-C that arrived
    meanwhile is delivered to it.
    """
    import signal
    import threading
    from multiprocessing import resource_tracker
    # The resource tracker first, outside the window below: its ensure_running() blocks SIGINT
    # around the spawn and then *unblocks* it, which inside the window would deliver a pending
    # Ctrl-C to SIG_IGN (lost: 6 of 20 interrupted builds ran to the end). It protects itself
    # (spawned with SIGINT blocked, ignores it in its main), and it runs once per process.
    resource_tracker.ensure_running()
    main = threading.current_thread() is threading.main_thread()
    masked = main and hasattr(signal, "pthread_sigmask")
    previous_mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT}) if masked else None
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
    try:
        pool = ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_worker_init)
        pool.submit(int).result()   # starts the forkserver, the resource tracker and a worker now
    finally:
        if main:
            signal.signal(signal.SIGINT, previous)
        if masked:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous_mask)
    return pool


def _worker_init() -> None:
    """Workers ignore SIGINT: a terminal's Ctrl-C reaches the whole process group, and the parent
    alone decides (it terminates them), so no worker dies mid-queue with a traceback. And a
    worker exits when the build's process does, however it ends (_exit_with_parent)."""
    import signal
    import threading
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent = multiprocessing.parent_process()
    if parent is not None:
        threading.Thread(target=_exit_with_parent, args=(parent.sentinel,), name="fusegemm-parent-watch",
                         daemon=True).start()


def _exit_with_parent(sentinel: int) -> None:
    """Wait until the build's process ends, then end this worker.

    A build killed outright (kill -9, the OOM killer) runs no cleanup, and its workers lived on,
    compiling for nobody and then blocked on the task queue (45 s and more; issue 32): each holds
    a write end of that queue and of the forkserver's liveness pipe, so neither ever reads EOF.
    PR_SET_PDEATHSIG does not help either: a worker's parent is the forkserver, which outlives the
    build for as long as a worker does. What does end with the build is multiprocessing's parent
    sentinel (a pipe whose only write end the build's process holds), on every platform and
    start method: it is ready the moment that process is gone, with no polling.
    """
    import os
    from multiprocessing.connection import wait
    wait([sentinel])
    os._exit(1)   # not sys.exit: the main thread may be inside NVRTC; a .tmp-* entry is swept later


def _stop(pool: ProcessPoolExecutor) -> None:
    procs = list((getattr(pool, "_processes", None) or {}).values())
    # (Taken before shutdown(), which forgets it: the wakeup entry below was never dropped while
    # this was read after it, and the exit hook's race still showed in CI.)
    manager = getattr(pool, "_executor_manager_thread", None)
    for proc in procs:
        try:
            proc.terminate()
        except (OSError, ValueError):
            pass
    pool.shutdown(wait=False, cancel_futures=True)
    for proc in procs:   # bounded: a worker that ignores SIGTERM is killed
        try:
            proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join(5)
        except (OSError, ValueError, AssertionError):
            pass
    if manager is not None:   # it closes the pool's queues (their semaphores) once it sees the pool broken
        manager.join(5)
        # The interpreter's exit hook (concurrent.futures.process._python_exit) writes to every
        # manager's wakeup pipe; a manager still closing its own pipe on the way out races that
        # write: "Exception ignored ... Bad file descriptor" after the build's Ctrl-C report (seen
        # in CI on a loaded machine). This pool needs no wakeup any more (shutdown sent one), and
        # the manager, a non-daemon thread, is still joined at exit: drop its entry.
        from concurrent.futures import process as _futures_process
        getattr(_futures_process, "_threads_wakeups", {}).pop(manager, None)


def compile_all(planned: list[Planned], *, jobs: int = 1) -> list[BuildResult]:
    """Compile rendered-and-keyed sources (kernels or epilogue harnesses) that the disk cache
    does not hold yet, in ``jobs`` worker processes; one row per distinct source, in order,
    hits included."""
    ps = list({p.key: p for p in planned}.values())
    rows: list[BuildResult | None] = [None] * len(ps)
    _build_planned(ps, jobs=jobs, cache=None, done=rows.__setitem__)
    return [r for r in rows if r is not None]


def build(vs: list[Variant], *, jobs: int = 1, cache: KernelCache | None = None,
          on_done: Callable[[BuildResult], None] | None = None,
          on_plan: Callable[[int], None] | None = None) -> list[BuildResult]:
    """Build the kernels of ``vs``: one row per distinct kernel, in first-seen order.

    Each variant is rendered and keyed once, here; variants with the same key (they differ
    only in launch attributes such as the cluster shape) share one kernel and one row
    (``variants`` counts them). Cache hits are read here; only misses go to worker processes
    (forkserver), which compile the planned source. Failures are rows, not exceptions. A
    custom ``cache`` builds in-process.
    """
    planned: dict[str, Planned] = {}
    served: dict[str, int] = {}
    failed_early: list[BuildResult] = []
    for v in vs:
        interrupts.check()   # a Ctrl-C that Python swallowed (base/interrupts.py) stops here
        try:
            p = plan(v)
        except FusegemmError as exc:
            failed_early.append(_failed(v, 0.0, exc))
            continue
        planned.setdefault(p.key, p)
        served[p.key] = served.get(p.key, 0) + 1
    order = list(planned)
    if on_plan:
        on_plan(len(order) + len(failed_early))
    results: list[BuildResult | None] = [None] * len(order)

    def done(i: int, r: BuildResult) -> None:
        results[i] = dataclasses.replace(r, variants=served[order[i]])
        if on_done:
            on_done(results[i])

    for r in failed_early:
        if on_done:
            on_done(r)
    _build_planned([planned[key] for key in order], jobs=jobs, cache=cache, done=done)
    return failed_early + [r for r in results if r is not None]


def write_bundle(vs: list[Variant], path: Any, cache: KernelCache | None = None) -> tuple[int, int]:
    """Write the kernels of ``vs`` (built already, or compiled here) into one bundle file at
    ``path`` (runtime/bundle.py). Returns (kernels, bytes of the file)."""
    import os
    from pathlib import Path

    from .pipeline import bundle_key
    from .runtime import bundle
    from .runtime.compile import nvrtc_version
    entries = []
    for v in vs:
        p = plan(v)
        b = lookup(p, cache or default_cache()) or compile_planned(p, cache)
        entries.append((bundle_key(p.source), {
            "name": b.name, "kernel": b.kernel_name, "arch": b.arch, "cache_key": b.key,
            "compile_seconds": round(b.compile_seconds, 3), "spec": v.spec.name,
            "variant": dict(v.choices)}, b.cubin))
    n = bundle.write_bundle(Path(path), entries, _toolchain(nvrtc_version()))
    return n, os.path.getsize(path)


def _toolchain(nvrtc: tuple[int, int]) -> dict[str, str]:
    """What built a bundle's cubins (recorded for the reader; loading does not depend on it)."""
    from importlib import metadata

    from .base.package import __version__
    out = {"fusegemm": __version__, "nvrtc": "%d.%d" % nvrtc}
    for dist in ("nvidia-cutlass", "nvidia-cuda-nvrtc-cu12", "nvidia-cuda-nvrtc"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return out
