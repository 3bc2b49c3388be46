"""First-run verification on an arch the project has not executed kernels on.

fusegemm's sm_100a kernels are compiled and statically checked, but no Blackwell GPU has run
them in the project's own tests (``fusegemm/base/archs.py``: ``executed=False``); a family just
added may likewise not have run on an executed arch yet (its registry row: ``executed=False``,
generator/registry.py). So the first
time a kernel family is about to launch on such an arch, :func:`ensure_verified` runs that
family's selftest cases on the device (seconds; fusegemm/selftest.py compares every output with
the numpy reference) and:

* records a pass in the kernel cache (``<cache>/verified/<family>.<arch>.json``, keyed by what
  changes the kernels: fusegemm version, NVRTC version, the templates and headers, the device),
  so later processes skip it;
* refuses to launch, with :class:`UnverifiedError` and the failing cases, when any case fails.

The ops reach :func:`ensure_verified` through the hook ``fusegemm.base.hooks.FIRST_LAUNCH``,
which the package root installs (fusegemm/__init__.py): this module runs the selftest cases,
which call the ops, so the ops do not import it.

``FUSEGEMM_TRUST_UNVERIFIED=1`` skips the check. For a kernel that has run (every family on
sm_90a but those marked) nothing happens.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
import uuid
from functools import lru_cache
from pathlib import Path
from typing import Any

from .base.errors import UnverifiedError
from .base.package import __version__, package_data_dir
from .runtime import config
from .runtime.load import device_name

_log = logging.getLogger("fusegemm")
_lock = threading.Lock()
_verified: set[tuple[str, str, int]] = set()
_local = threading.local()   # set while the cases run: their own launches pass the gate


def ensure_verified(family: str, arch: str, device: int) -> None:
    """Return when ``family`` may launch on ``device`` (an ``arch`` device); else raise
    UnverifiedError naming the failing selftest cases."""
    from .generator import registry
    if registry.executed(family, arch) or config.trust_unverified() or getattr(_local, "active", False):
        return
    key = (family, arch, device)
    if key in _verified:
        return
    with _lock:
        if key in _verified:
            return
        ident = identity(family, arch, device)
        path = record_path(family, arch)
        if path is not None and _read(path) == ident:
            _verified.add(key)
            return
        _log.warning("fusegemm: first launch of %s on %s, where fusegemm has not executed it: "
                     "running its selftest cases on device %d first (FUSEGEMM_TRUST_UNVERIFIED=1 "
                     "skips this)", family, arch, device)
        t0 = time.perf_counter()
        rows = _run_cases(family, device)
        # A case the arch's kernel does not implement (a tile) is neither run nor a failure;
        # at least one case must pass.
        failed = [r for r in rows if r.status not in ("pass", "not available")]
        if failed or not any(r.status == "pass" for r in rows):
            lines = "\n".join(f"  {r.case}: {r.status} {r.detail}" for r in (failed or rows)) or "  (no cases)"
            raise UnverifiedError(
                f"{family} failed its first-run verification on {arch} (device {device}, "
                f"{ident['device']}): {len(failed)} of {len(rows)} selftest cases failed\n{lines}\n"
                f"fusegemm has not executed its {family} kernel on {arch} hardware before; please report this "
                f"with the output of `fusegemm selftest --json`. FUSEGEMM_TRUST_UNVERIFIED=1 launches "
                f"anyway, at your own risk.")
        from .runtime.cache import default_cache
        if path is not None and not default_cache().readonly:   # read-only: the pass lasts the process
            _write(path, {**ident, "cases": len(rows), "seconds": round(time.perf_counter() - t0, 3)})
        _verified.add(key)


def running() -> bool:
    """True while this thread runs a family's first-run verification cases."""
    return getattr(_local, "active", False)


def _run_cases(family: str, device: int) -> list[Any]:
    """The family's selftest rows, with this thread's launches let through the gate."""
    from . import selftest
    if family not in selftest.RUNNERS:
        return []
    _local.active = True
    try:
        return selftest.run_family(family, device)
    finally:
        _local.active = False


def identity(family: str, arch: str, device: int) -> dict[str, Any]:
    """What a recorded pass is valid for: anything that changes the kernels or the device."""
    from .base.errors import ToolchainError
    from .runtime.compile import nvrtc_version
    try:
        nvrtc = "%d.%d" % nvrtc_version()
    except ToolchainError:   # kernels from a bundle on a machine without NVRTC
        nvrtc = "none"
    return {"family": family, "arch": arch, "fusegemm": __version__,
            "nvrtc": nvrtc, "templates": _templates_digest(),
            "device": device_name(device)}


def record_path(family: str, arch: str) -> Path | None:
    """Where a pass is recorded (None when the disk cache is off: the pass lasts the process)."""
    if not config.disk_cache_enabled():
        return None
    from .runtime.cache import record_dir
    return record_dir("verified") / f"{family}.{arch}.json"


def passes() -> list[dict[str, Any]]:
    """The first-run verification passes recorded in the cache: ``family``, ``arch``,
    ``device``, ``fusegemm`` and ``nvrtc`` versions, ``cases`` run and ``file``, one dict per
    record (an unreadable one has only ``file``). What ``fusegemm cache records`` prints."""
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
        row = {k: data.get(k) for k in ("family", "arch", "device", "fusegemm", "nvrtc", "cases")} \
            if isinstance(data, dict) else {}
        out.append({**row, "file": str(path)})
    return out


def _read(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    return {k: data.get(k) for k in ("family", "arch", "fusegemm", "nvrtc", "templates", "device")}


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
