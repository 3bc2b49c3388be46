"""First-run verification of each configuration class of a kernel fusegemm has not executed.

fusegemm's sm_100a kernels are compiled and statically checked, but no Blackwell GPU has run
them in the project's own tests (``fusegemm/base/archs.py``: ``executed=False``); a family just
added may likewise not have run on an executed arch yet (its registry row: ``executed=False``,
generator/registry.py), and a mode of an executed kernel may not have run yet
(``registry.UNEXECUTED_MODES``: empty today; the sm_90a stream-K scheduler and the K-grouped
kernel's M-major D stood there until a GPU ran them). One family's
kernel takes different paths for different tiles, clusters, CTA pairs, schedulers, operand
layouts, scaling recipes and weight modes, so a pass on one configuration says little about
another. The gate therefore works per **configuration class**
(:class:`ConfigClass`: family, kernel class, tile, cluster, CTAs per tile, scheduler, operand
majors, recipe, weights, gathered operands): the first time a kernel of a class not yet verified is about to launch
on such an arch, :func:`ensure_verified` runs that class's cases (fusegemm/selftest.py
``class_cases``: the class pinned, every CTA of the cluster given tiles, N and K tails, ragged and
empty experts; every output compared with the numpy reference) and:

* records a pass in the kernel cache (``<cache>/verified/<family>.<arch>.<class>.json``, keyed by
  what changes the kernels or their execution: fusegemm version, NVRTC version, the templates and
  headers, the device model, the driver version), so later processes skip it;
* refuses to launch, with :class:`UnverifiedError` naming the configuration and the failing
  cases, when any case fails, or when the check hangs or faults.

**The watchdog.** The cases run in a child process (``python -m fusegemm.verify``): a kernel that
hangs or faults there cannot hang this process or poison its CUDA context. The child first builds
and loads every kernel the cases need (no launch; compiling may take minutes on a cold cache), then
runs them; the run must finish within ``FUSEGEMM_VERIFY_TIMEOUT`` seconds (default 30), or the
child is killed and the configuration refused as hanging. A child that dies (a device fault ends
its context: the driver reports it there) is a refusal that quotes what it printed.

The ops reach :func:`ensure_verified` through the hook ``fusegemm.base.hooks.FIRST_LAUNCH``,
which the package root installs (fusegemm/__init__.py): this module runs the selftest cases,
which call the ops, so the ops do not import it. ``FUSEGEMM_TRUST_UNVERIFIED=1`` skips the
check. For a kernel that has run (every family on sm_90a but those marked) nothing happens.
``fusegemm selftest --all-configs`` runs every class of every family on the device's arch
through the same watchdog.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import asdict
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

from .base.errors import UnverifiedError
from .base.package import __version__, package_data_dir
from .generator.config_class import ConfigClass, config_class
from .runtime import config
from .runtime.load import device_name

_log = logging.getLogger("fusegemm")
_lock = threading.Lock()
_verified: set[tuple[ConfigClass, int]] = set()
_local = threading.local()   # set while this process runs verification cases (the child)

# What the child runs: "module:function", called as function(cls, device, built) -> [selftest.Row];
# built() is called once every kernel the cases need is loaded, before the first launch.
RUNNER = "fusegemm.selftest:run_class"
RUNNER_PATH: tuple[str, ...] = ()   # folders the child puts first on sys.path (a runner outside fusegemm)
# The child's line protocol on stdout: this prefix, then one JSON object.
_MARK = "FUSEGEMM-VERIFY "
# Building the cases' kernels (NVRTC on a cold cache: minutes for several sm_100a variants) is
# bounded apart from running them: only the run can hang on the device.
BUILD_TIMEOUT = 1800.0


def ensure_verified(variant: Any, device: int, ctas: int | None = None) -> None:
    """Return when ``variant``'s kernel may launch on ``device``; else raise UnverifiedError
    naming its configuration class and what failed (cases, a hang, a fault)."""
    from .generator import registry
    if config.trust_unverified() or running():
        return
    # A mode no GPU has run (registry.UNEXECUTED_MODES) on an executed arch is a configuration
    # class of its own (its scheduler or operand modes), gated as an unexecuted arch's classes are.
    mode = registry.unexecuted_mode(variant.kernel, variant.arch, vars(variant))
    if mode is None and registry.executed(variant.kernel, variant.arch):
        return
    cls = config_class(variant, ctas)
    key = (cls, device)
    if key in _verified:
        return
    with _lock:
        if key in _verified:
            return
        ident = identity(cls, device)
        path = record_path(cls)
        if path is not None and _read(path) == ident:
            _verified.add(key)
            return
        _log.warning("fusegemm: first launch of %s (%s) on %s, where fusegemm has not executed it: running "
                     "its verification cases on device %d first, in a child process under a %g s watchdog "
                     "(FUSEGEMM_TRUST_UNVERIFIED=1 skips this)", cls.family, cls.describe(), cls.arch, device,
                     config.verify_timeout())
        t0 = time.perf_counter()
        rows, problem = check_class(cls, device)
        if not _passed(rows, problem):
            why = mode or f"fusegemm has not executed its {cls.family} kernel on {cls.arch} hardware before"
            failed = [r for r in rows if r.status not in ("pass", "not available")]
            lines = "\n".join(f"  {r.case}: {r.status} {r.detail}" for r in (failed or rows)) or "  (no cases)"
            what = problem or f"{len(failed)} of {len(rows)} verification cases failed"
            raise UnverifiedError(
                f"{cls.family} failed its first-run verification on {cls.arch} (device {device}, "
                f"{ident['device']}), configuration {cls.describe()}: {what}\n{lines}\n"
                f"{why}; please report this with the output of `fusegemm selftest --all-configs --json`. "
                f"FUSEGEMM_TRUST_UNVERIFIED=1 launches anyway, at your own risk.")
        _record(path, ident, rows, t0)
        _verified.add(key)


def _passed(rows: list[Any], problem: str | None) -> bool:
    """A class passes when its check ended (no hang, no death), no case failed and at least one
    ran: a case the arch's kernel does not implement is neither run nor a failure."""
    return (problem is None and all(r.status in ("pass", "not available") for r in rows)
            and any(r.status == "pass" for r in rows))


def _record(path: Path | None, ident: dict[str, Any], rows: list[Any], t0: float) -> None:
    """Record a pass at ``path`` (None: the disk cache is off; a read-only cache: nothing is
    written either, and the pass lasts the process)."""
    from .runtime.cache import default_cache
    if path is not None and not default_cache().readonly:
        _write(path, {**ident, "cases": len(rows), "seconds": round(time.perf_counter() - t0, 3)})


def running() -> bool:
    """True while this process runs verification cases (the watchdog's child)."""
    return getattr(_local, "active", False)


# ---------------------------------------------------------------- the watchdog
def check_class(cls: ConfigClass, device: int, *, timeout: float | None = None, runner: str | None = None,
                path: tuple[str, ...] | None = None) -> tuple[list[Any], str | None]:
    """Run ``cls``'s verification cases on ``device`` in a child process under the watchdog.

    Returns ``(rows, problem)``: the cases' :class:`fusegemm.selftest.Row` s, and None, or why the
    check ended without a verdict (a hang past ``timeout`` seconds of running, default
    ``FUSEGEMM_VERIFY_TIMEOUT``; the child dying, e.g. of a device fault, with what it printed).

    Parameters
    ----------
    cls : ConfigClass
        The configuration class.
    device : int
        CUDA device ordinal.
    timeout : float, optional
        Seconds the cases may run once their kernels are built.
    runner : str, optional
        ``"module:function"`` the child calls as ``function(cls, device, built)``; default
        :data:`RUNNER` (read at each call).
    path : tuple of str, optional
        Folders the child puts first on ``sys.path`` (a runner outside the package); default
        :data:`RUNNER_PATH`.
    """
    from .selftest import Row
    limit = config.verify_timeout() if timeout is None else float(timeout)
    request = {"class": cls.to_json(), "device": device, "runner": runner or RUNNER,
               "path": list(RUNNER_PATH if path is None else path)}
    # The child sees this process's configuration (overrides too: the same kernel cache), passes its
    # own gate (it is the check) and never tunes.
    env = config.environment(FUSEGEMM_TRUST_UNVERIFIED="1", FUSEGEMM_AUTOTUNE="0")
    proc = subprocess.Popen([sys.executable, "-m", "fusegemm.verify"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    messages: queue.Queue = queue.Queue()
    tail: list[str] = []
    threading.Thread(target=_read_messages, args=(proc.stdout, messages), daemon=True).start()
    # The stderr reader is joined before the report: the child's stdout closing (the loop below ends)
    # says nothing about whether its last stderr lines, e.g. the device fault's message, were read.
    stderr_reader = threading.Thread(target=_read_tail, args=(proc.stderr, tail), daemon=True)
    stderr_reader.start()
    try:
        proc.stdin.write(json.dumps(request))
        proc.stdin.close()
    except OSError:
        pass   # the child died at once: its exit status and stderr say why (below)
    phase, deadline = "build", time.monotonic() + BUILD_TIMEOUT
    rows: list[Any] | None = None
    error = None
    while True:
        try:
            msg = messages.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            _kill(proc)
            if phase == "run":
                return [], (f"the cases did not finish within {limit:g} s of running on the device: a hang "
                            "(the verification process was stopped; this process and its CUDA context are "
                            "unaffected; FUSEGEMM_VERIFY_TIMEOUT sets the limit)")
            return [], f"building the cases' kernels took longer than {BUILD_TIMEOUT:g} s (stopped)"
        if msg is None:
            break
        if msg.get("phase") == "built":
            phase, deadline = "run", time.monotonic() + limit
        elif "rows" in msg:
            rows = [Row(**r) for r in msg["rows"]]
        elif "error" in msg:
            error = msg["error"]
    try:
        code = proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        _kill(proc)
        code = proc.wait()
    stderr_reader.join(timeout=10)   # bounded: a grandchild may hold the pipe open
    if rows is not None and code == 0:
        return rows, None
    how = f"exit status {code}" if code is None or code >= 0 else f"signal {signal.Signals(-code).name}"
    said = error or "".join(tail).strip()[-1500:] or "(nothing printed)"
    return rows or [], (f"the verification process died while {'running' if phase == 'run' else 'building'} "
                        f"the cases ({how}; this process and its CUDA context are unaffected): {said}")


def _read_messages(stream: Any, out: queue.Queue) -> None:
    for line in stream:
        if line.startswith(_MARK):
            try:
                out.put(json.loads(line[len(_MARK):]))
            except ValueError:
                pass
    out.put(None)


def _read_tail(stream: Any, tail: list[str]) -> None:
    for line in stream:
        tail.append(line)
        if len(tail) > 200:
            del tail[:100]


def _kill(proc: subprocess.Popen) -> None:
    """Stop the child and anything it started (its own process group)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def _child_main() -> None:
    """The watchdog's child: read the request on stdin, build, report ``built``, run, report the
    rows (or the exception) on stdout."""
    import importlib
    request = json.loads(sys.stdin.read())
    sys.path[:0] = request.get("path", [])

    def emit(obj: dict[str, Any]) -> None:
        sys.stdout.write(_MARK + json.dumps(obj) + "\n")
        sys.stdout.flush()
    _local.active = True
    try:
        module, _, name = request["runner"].partition(":")
        runner: Callable[..., Any] = getattr(importlib.import_module(module), name)
        rows = runner(ConfigClass.from_json(request["class"]), int(request["device"]),
                      lambda: emit({"phase": "built"}))
    except BaseException as exc:   # reported to the parent, which refuses the configuration
        emit({"error": f"{type(exc).__name__}: {exc}"[:2000]})
        sys.exit(1)
    emit({"rows": [asdict(r) for r in rows]})


def run_all_configs(arch: str, device: int, *, families: tuple[str, ...] | None = None, jobs: int = 1,
                    timeout: float | None = None, progress: Callable[[str], None] | None = None) -> list[Any]:
    """Every configuration class ``arch``'s kernels implement (fusegemm/selftest.py
    ``all_classes``), each through :func:`check_class`'s watchdog, ``jobs`` children at a time;
    the rows of every case, and one FAIL row for a class whose check hung or died. A class of a
    kernel fusegemm has not executed that passes is recorded as the gate would record it
    (``fusegemm selftest --all-configs``).

    Parameters
    ----------
    arch : str
        The device's arch.
    device : int
        CUDA device ordinal.
    families : tuple of str, optional
        Only these kernel families (default: every family with cases).
    jobs : int
        Classes checked at once (each in a child process: building their kernels is CPU work).
    timeout : float, optional
        Seconds each class's cases may run (default ``FUSEGEMM_VERIFY_TIMEOUT``).
    progress : callable, optional
        Called with one line per class as its check ends.
    """
    from concurrent.futures import ThreadPoolExecutor

    from .generator import registry
    from .selftest import Row, all_classes
    classes = all_classes(arch, families)

    def one(cls: ConfigClass) -> list[Any]:
        t0 = time.perf_counter()
        rows, problem = check_class(cls, device, timeout=timeout)
        if problem is None and not any(r.status == "pass" for r in rows):
            problem = "no case ran (every case not available): the class is not verified"
        if _passed(rows, problem) and not registry.executed(cls.family, cls.arch):
            _record(record_path(cls), identity(cls, device), rows, t0)
        return rows + ([Row(cls.family, cls.slug, "FAIL", detail=problem)] if problem else [])

    out: list[Any] = []
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for i, (cls, rows) in enumerate(zip(classes, pool.map(one, classes)), 1):
            if progress is not None:
                verdict = "FAIL" if any(r.status == "FAIL" for r in rows) else "pass"
                progress(f"[{i}/{len(classes)}] {cls.family} {cls.slug}: {verdict}")
            out += rows
    return out


# ---------------------------------------------------------------- records
def identity(cls: ConfigClass, device: int) -> dict[str, Any]:
    """What a recorded pass is valid for: anything that changes the kernels, the device or how it
    runs them."""
    from .base.errors import ToolchainError
    from .runtime.compile import nvrtc_version
    try:
        nvrtc = "%d.%d" % nvrtc_version()
    except ToolchainError:   # kernels from a bundle on a machine without NVRTC
        nvrtc = "none"
    return {"family": cls.family, "arch": cls.arch, "class": cls.slug, "fusegemm": __version__,
            "nvrtc": nvrtc, "templates": _templates_digest(), "device": device_name(device),
            "driver": driver_version()}


def driver_version() -> int:
    """The CUDA driver's version (``13000`` for 13.0), 0 when it cannot be read."""
    try:
        from .runtime.load import check, driver
        return int(check(driver().cuDriverGetVersion(), "cuDriverGetVersion"))
    except Exception:   # no driver: a pass recorded here is only valid without one
        return 0


def record_path(cls: ConfigClass) -> Path | None:
    """Where a pass is recorded (None when the disk cache is off: the pass lasts the process)."""
    if not config.disk_cache_enabled():
        return None
    from .runtime.cache import record_dir
    return record_dir("verified") / f"{cls.family}.{cls.arch}.{cls.slug}.json"


_FIELDS = ("family", "arch", "class", "fusegemm", "nvrtc", "templates", "device", "driver")


def passes() -> list[dict[str, Any]]:
    """The first-run verification passes recorded in the cache: ``family``, ``arch``, ``class``,
    ``device``, ``driver``, ``fusegemm`` and ``nvrtc`` versions, ``cases`` run and ``file``, one
    dict per record (an unreadable one has only ``file``). What ``fusegemm cache records``
    prints."""
    from .runtime.cache import record_dir
    folder = record_dir("verified")
    if not config.disk_cache_enabled() or not folder.is_dir():
        return []
    out = []
    for path in sorted(folder.glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            data = None
        row = {k: data.get(k) for k in ("family", "arch", "class", "device", "driver", "fusegemm", "nvrtc",
                                        "cases")} if isinstance(data, dict) else {}
        out.append({**row, "file": str(path)})
    return out


def _read(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    return {k: data.get(k) for k in _FIELDS}


def _write(path: Path, data: dict[str, Any]) -> None:
    # Atomic (temp file + rename); a cache that cannot be written only costs a rerun next time.
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        os.replace(tmp, path)
    except OSError as exc:
        _log.warning("fusegemm: could not record the verification in %s: %s", path, exc.strerror)


@lru_cache(maxsize=1)
def _templates_digest() -> str:
    root = package_data_dir("templates")
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file() and p.suffix in (".j2", ".cuh", ".h", ".hpp"):
            h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes())
    return h.hexdigest()[:16]


if __name__ == "__main__":   # run as the canonical module, whose state the package reads
    from fusegemm.verify import _child_main as _main
    _main()
