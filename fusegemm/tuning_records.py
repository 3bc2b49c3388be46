"""Tuning records: the launch configuration ``fusegemm tune`` measured fastest, per shape bucket.

A leaf store in the pipeline layer: the ops read it (:func:`lookup`, on the first call of an
argument signature), the tuner (fusegemm/tune.py) writes it (:func:`write`, :func:`remember`).
Records live in the kernel cache, ``<cache>/tuned/<spec>.<arch>.<device>.json``, one file per
spec, arch and device model (an H100's winner is not an H200's), keyed by the problem's
**bucket**: experts, rows per expert (rounded to a power of two), N, K and the output/weight
options. Writes are atomic under a file lock; an unreadable record file reads as empty. A record
never changes numerics: every candidate computes the same FP32-accumulated GEMM.
"""
from __future__ import annotations

import json
import math
import os
import re
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .generator.axes import AXES
from .runtime import config

__all__ = ["Bucket", "Candidate", "lookup", "records", "record_file", "write", "remember", "forget",
           "on_change"]


@dataclass(frozen=True)
class Bucket:
    """The shape class a tuning record applies to.

    Attributes
    ----------
    experts : int
        L.
    rows : int
        Rows per expert (the A allocation's rows / L), rounded to the nearest power of two.
    n : int
        N.
    k : int
        K.
    options : str
        Output and weight options that select a different kernel (d dtype, C, bias, weights).
    """

    experts: int
    rows: int
    n: int
    k: int
    options: str

    @classmethod
    def of(cls, *, experts: int, m_rows: int, n: int, k: int, d_dtype: str = "bfloat16", c_dtype: str | None = None,
           bias: str | None = None, discrete: bool = False, b_major: str = "k") -> "Bucket":
        per = max(1, m_rows // max(1, experts))
        rows = 1 << max(0, round(math.log2(per)))
        opts = [f"d{d_dtype}", f"c{c_dtype}" if c_dtype else "noc", f"bias{bias}" if bias else "nobias",
                "discrete" if discrete else "dense", f"b{b_major}"]
        return cls(experts, rows, n, k, ".".join(opts))

    @property
    def key(self) -> str:
        return f"L{self.experts}.r{self.rows}.n{self.n}.k{self.k}.{self.options}"


@dataclass(frozen=True)
class Candidate:
    """One launch configuration.

    Attributes
    ----------
    tile : (int, int)
        The CTA tile (M, N).
    scheduler : str
        The variant's ``scheduler`` axis: ``static`` (the persistent walk), ``dynamic`` (tiles
        claimed from an atomic counter) or ``streamk`` (the static walk, its last wave split along K
        over every CTA: the sm_90a BF16 grouped kernel's).
    """

    tile: tuple[int, int]
    scheduler: str = "static"

    def __post_init__(self) -> None:
        allowed = AXES["scheduler"].allowed
        if self.scheduler not in allowed:
            raise ValueError(f"scheduler: got {self.scheduler!r}; allowed: {', '.join(allowed)}")

    @property
    def dynamic(self) -> bool:
        return self.scheduler == "dynamic"

    @property
    def stream_k(self) -> bool:
        return self.scheduler == "streamk"

    @property
    def label(self) -> str:
        return f"{self.tile[0]}x{self.tile[1]}:{self.scheduler}"



def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-").lower() or "device"


def record_file(spec: str, arch: str, device_name: str) -> Path:
    """Where the records of ``spec`` on ``arch`` and this device model live.

    Parameters
    ----------
    spec : str
        The spec tuned (``grouped_gemm``).
    arch : str
        ``sm_90a`` or ``sm_100a``.
    device_name : str
        The device's name (``NVIDIA H200``).
    """
    from .runtime.cache import record_dir
    return record_dir("tuned") / f"{spec}.{arch}.{_slug(device_name)}.json"


# Records read from disk, by file: (mtime_ns, {bucket key: record}); and the records of this
# process that could not be written (read-only or disabled cache).
_read_cache: dict[Path, tuple[int, dict[str, Any]]] = {}
_memory: dict[tuple[Path, str], dict[str, Any]] = {}


def _read(path: Path) -> dict[str, Any]:
    try:
        mtime = path.stat().st_mtime_ns
    except OSError:
        return {}
    hit = _read_cache.get(path)
    if hit is not None and hit[0] == mtime:
        return hit[1]
    try:
        data = json.loads(path.read_text())
        records = data.get("records", {}) if isinstance(data, dict) else {}
        records = records if isinstance(records, dict) else {}
    except (OSError, ValueError):
        records = {}          # corrupted: reads as empty; the next tune rewrites it
    _read_cache[path] = (mtime, records)
    return records


def _candidate(record: Any) -> Candidate | None:
    """A record's configuration, or None when it is malformed. A record names its ``scheduler``
    (records written before stream-K name ``dynamic`` only: static or dynamic)."""
    try:
        tm, tn = (int(v) for v in record["tile"])
        scheduler = record.get("scheduler") or ("dynamic" if record["dynamic"] else "static")
        return Candidate((tm, tn), scheduler)
    except (AttributeError, KeyError, TypeError, ValueError):
        return None


def lookup(spec: str, arch: str, device_name: str, bucket: Bucket) -> Candidate | None:
    """The recorded winner of ``bucket``, or None.

    Parameters
    ----------
    spec : str
        The spec (``grouped_gemm``).
    arch : str
        The device's arch.
    device_name : str
        The device's name (records are per device model).
    bucket : Bucket
        The call's shape class.
    """
    path = record_file(spec, arch, device_name)
    rec = _memory.get((path, bucket.key))
    if rec is None and config.disk_cache_enabled():
        rec = _read(path).get(bucket.key)
    return _candidate(rec) if rec is not None else None


def records() -> list[dict[str, Any]]:
    """Every tuning record in the cache, a dict per (file, bucket): ``spec``, ``arch``,
    ``device`` (the file's device slug), ``bucket`` (its key), ``config`` (the recorded
    configuration's label, or None when malformed), ``ms``, ``default_ms``, ``date`` and
    ``file``. What ``fusegemm cache records`` prints."""
    from .runtime.cache import record_dir
    folder = record_dir("tuned")
    out: list[dict[str, Any]] = []
    if not config.disk_cache_enabled() or not folder.is_dir():
        return out
    for path in sorted(folder.glob("*.json")):
        spec, _, rest = path.stem.partition(".")
        arch, _, device = rest.partition(".")
        for key, rec in sorted(_read(path).items()):
            cand = _candidate(rec)
            rec = rec if isinstance(rec, dict) else {}
            out.append({"spec": spec, "arch": arch, "device": device, "bucket": key,
                        "config": cand.label if cand else None, "ms": rec.get("ms"),
                        "default_ms": rec.get("default_ms"), "date": rec.get("date"), "file": str(path)})
    return out


def write(path: Path, key: str, record: dict[str, Any]) -> Path | None:
    """Add ``record`` under ``key`` in the record file ``path`` (read-modify-write under the
    file's lock, atomic replace); None when the cache cannot be written (:func:`remember` keeps
    a record for this process).

    Parameters
    ----------
    path : pathlib.Path
        The record file (:func:`record_file`).
    key : str
        The bucket's key (:attr:`Bucket.key`).
    record : dict
        ``tile`` and ``dynamic``, and what the tuner measured.
    """
    if not config.disk_cache_enabled() or config.cache_readonly():
        return None
    import filelock
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with filelock.FileLock(str(path) + ".lock", timeout=60):
            records = dict(_read(path))
            records[key] = record
            tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
            tmp.write_text(json.dumps({"records": records}, indent=1, sort_keys=True))
            os.replace(tmp, path)
    except OSError:
        return None
    _read_cache.pop(path, None)
    _changed()
    return path


def remember(path: Path, key: str, record: dict[str, Any]) -> None:
    """Keep ``record`` under ``key`` of ``path`` for the rest of this process (what a read-only
    or disabled cache keeps; :func:`lookup` reads it before the file).

    Parameters
    ----------
    path : pathlib.Path
        The record file (:func:`record_file`).
    key : str
        The bucket's key.
    record : dict
        ``tile`` and ``dynamic``, and what the tuner measured.
    """
    _memory[(path, key)] = record
    _changed()


def forget() -> None:
    """Drop this process's records and the files read so far (the next lookup reads the disk)."""
    _memory.clear()
    _read_cache.clear()
    _changed()


# Readers that memoise what a lookup returned (the grouped GEMM wrapper's fast path), by name:
# told when a record changes, so their calls re-resolve the configuration.
_listeners: dict[str, Callable[[], None]] = {}


def on_change(name: str, fn: Callable[[], None]) -> None:
    """Call ``fn`` whenever a record is written, remembered or forgotten (``name``: one
    listener per reader; installing it again replaces it).

    Parameters
    ----------
    name : str
        The reader (``grouped_gemm``).
    fn : callable
        Takes no arguments.
    """
    _listeners[name] = fn


def _changed() -> None:
    for fn in list(_listeners.values()):
        fn()
