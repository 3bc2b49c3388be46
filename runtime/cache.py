"""Content-addressed cubin cache: in-process layer in front of an atomic on-disk store.

Layout (inspectable; raw cubins so cuobjdump/nvdisasm work on them)::

    <cache>/<kernel name>.<key16>/{kernel.cu, kernel.cubin, meta.json}
    <cache>/tuned/<spec>.<arch>.<device>.json       tuning records (fusegemm/tune.py)
    <cache>/verified/<family>.<arch>.json           first-run verification passes (fusegemm/verify.py)

The key hashes labelled, length-prefixed fields: cache schema, package version, rendered
source, the content of every header reached by ``#include``, NVRTC version, options, arch.
Entries are written in a temp dir and renamed into place; a per-key file lock with a re-check
after acquiring means concurrent builders compile once. ``get`` verifies size and sha256 of
the cubin, so a truncated or corrupted entry reads as a miss and is rebuilt. Entries hold only
cubins and metadata, never anything executable on the host.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..base.contract import KernelContract
from ..base.errors import CacheError, FusegemmError
from . import config
from .compile import compile_options, headers, nvrtc_version
from .headers import headers_digest
from .cubin_info import Cubin, Resources

# 2: meta.json "contract" (the kernel's exported host contract) replaces "launch" and "staging".
# Entries written before carriers were removed also hold a "carrier" flag; nothing reads it, so
# they stay valid under this schema.
CACHE_SCHEMA = 2


@dataclass(frozen=True)
class Built:
    """A compiled kernel ready to load: cubin bytes plus what the runtime needs to launch it."""

    name: str
    kernel_name: str
    arch: str
    key: str
    cubin: bytes
    contract: KernelContract
    resources: Resources
    compile_seconds: float
    cached: bool                  # True when served from the disk or memory cache
    path: Path | None = None      # entry folder, when the disk cache is in use
    meta: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def advisories(self) -> tuple[str, ...]:
        """ptxas's performance advisories from the compile (runtime/compile.py; empty when clean,
        and for an entry written before they were recorded)."""
        return tuple(self.meta.get("ptxas_advisories", ()))

    @staticmethod
    def from_cubin(*, name: str, kernel_name: str, arch: str, key: str, cubin: bytes,
                   compile_seconds: float, cached: bool, path: Path | None = None,
                   meta: dict[str, Any] | None = None) -> "Built":
        """A Built whose contract and resources are read from ``cubin`` (one ELF parse)."""
        c = Cubin(cubin)
        return Built(name=name, kernel_name=kernel_name, arch=arch, key=key, cubin=cubin,
                     contract=c.contract(kernel_name), resources=c.resources(kernel_name),
                     compile_seconds=compile_seconds, cached=cached, path=path, meta=meta or {})


def key_fields(source_text: str, arch: str, *, version: str | None = None) -> list[tuple[str, str]]:
    """The labelled inputs of a cache key, in order (tests check each one changes the key)."""
    from ..base.package import __version__
    hs = headers()
    return [
        ("cache_schema", str(CACHE_SCHEMA)),
        ("package_version", version or __version__),
        ("source", source_text),
        ("headers", headers_digest(source_text, hs.dirs)),
        ("nvrtc_version", "%d.%d" % nvrtc_version()),
        ("options", "\0".join(compile_options(arch))),
        ("arch", arch),
    ]


def make_key(fields: list[tuple[str, str]]) -> str:
    h = hashlib.sha256()
    for label, value in fields:
        data = value.encode()
        h.update(f"{len(label)}:{label}|{len(data)}:".encode())
        h.update(data)
    return h.hexdigest()


# Folders of the cache root that hold records beside the kernel entries: never listed, counted
# or cleared as kernels (an entry's name always ends in ".<key16>").
RECORD_DIRS: dict[str, str] = {
    "tuned": "tuning records (fusegemm tune, FUSEGEMM_AUTOTUNE)",
    "verified": "first-run verification passes (unexecuted archs)",
}


def record_dir(kind: str) -> Path:
    """The cache folder of one kind of record (a key of :data:`RECORD_DIRS`)."""
    if kind not in RECORD_DIRS:
        raise ValueError(f"record kind: got {kind!r}; allowed: {', '.join(RECORD_DIRS)}")
    return config.cache_dir() / kind


class KernelCache:
    """The disk store under ``root`` plus an in-process dict. Owned by whoever creates it."""

    def __init__(self, root: Path | None = None, *, disk: bool | None = None) -> None:
        self._root = root
        self.disk = config.disk_cache_enabled() if disk is None else disk
        self._mem: dict[str, Built] = {}
        self._lock = threading.Lock()
        self._swept = False   # stale .tmp-*/.trash-* removed by this object's first put

    @property
    def root(self) -> Path:
        return self._root if self._root is not None else config.cache_dir()

    @property
    def readonly(self) -> bool:
        """Read, never write: FUSEGEMM_CACHE_READONLY, or a cache folder this process cannot
        write (a shared cache on a read-only mount). Misses are then compiled in memory."""
        return self._readonly_reason() is not None

    def _readonly_reason(self) -> tuple[str, str] | None:
        """(why the cache is read-only, how to make it writable), or None when it is not."""
        if config.cache_readonly():
            return (f"FUSEGEMM_CACHE_READONLY={config.raw('FUSEGEMM_CACHE_READONLY')}",
                    "Unset FUSEGEMM_CACHE_READONLY to write it")
        root = self.root
        if root.is_dir() and not os.access(root, os.W_OK):
            return "this process cannot write the folder", "Run as a user who can write it"
        return None

    def not_stored(self) -> str | None:
        """Why :meth:`put` keeps what it is given in this process only ("read-only,
        FUSEGEMM_CACHE_READONLY=1"), or None when it writes the disk: a build says so rather
        than report kernels the next process will not find."""
        if not self.disk:
            off = not config.disk_cache_enabled()
            return "disk cache off" + (f", FUSEGEMM_DISABLE_DISK_CACHE={config.raw('FUSEGEMM_DISABLE_DISK_CACHE')}"
                                       if off else "")
        why = self._readonly_reason()
        return None if why is None else f"read-only, {why[0]}"

    def require_writable(self, consequence: str) -> None:
        """CacheError when the cache is read-only (:attr:`readonly`), naming why and saying
        ``consequence`` ("nothing removed"): for what must not silently skip the disk."""
        why = self._readonly_reason()
        if why is not None:
            raise CacheError(f"the kernel cache at {self.root} is read-only ({why[0]}); {consequence}. {why[1]}")

    def entry_dir(self, name: str, key: str) -> Path:
        """``<root>/<name>.<key16>``: the kernel's name as build prints it (readable part and the
        hash of its source), then the cache key's (which adds the toolchain: NVRTC, headers,
        options). The folder used to drop the source hash, so the one hash it showed was none
        that any command printed (issue 32)."""
        return self.root / f"{name}.{key[:16]}"

    # -- reading --------------------------------------------------------------------------
    def get(self, name: str, key: str) -> Built | None:
        """The entry for ``key`` or None (missing, truncated, corrupted: all read as a miss)."""
        with self._lock:
            hit = self._mem.get(key)
        if hit is not None:
            return hit
        if not self.disk:
            return None
        d = self.entry_dir(name, key)
        try:
            meta = json.loads((d / "meta.json").read_text())
            cubin = (d / "kernel.cubin").read_bytes()
        except (OSError, ValueError):
            return None
        if not isinstance(meta, dict) or meta.get("key") != key or not _cubin_matches(meta, cubin):
            return None
        built = self._from_meta(meta, cubin, d)
        if built is not None:
            with self._lock:
                self._mem[key] = built
        return built

    @staticmethod
    def _from_meta(meta: dict[str, Any], cubin: bytes, d: Path) -> Built | None:
        # The contract and resources are re-read from the cubin (an ELF parse, microseconds):
        # the cubin is what will run, so it is the authority, not a copy in meta.json.
        try:
            return Built.from_cubin(name=meta["name"], kernel_name=meta["kernel"], arch=meta["arch"],
                                    key=meta["key"], cubin=cubin, compile_seconds=meta["compile_seconds"],
                                    cached=True, path=d, meta=meta)
        except (KeyError, TypeError, FusegemmError):
            return None

    # -- writing --------------------------------------------------------------------------
    def put(self, built: Built, source_text: str, meta_extra: dict[str, Any]) -> Built:
        """Store atomically; returns the Built with its path. Memory-only when the disk cache
        is off or read-only."""
        if not self.disk or self.readonly:
            with self._lock:
                self._mem[built.key] = dataclasses.replace(built, cached=True)
            return built
        final = self.entry_dir(built.name, built.key)
        self._sweep_stale()
        tmp = self._mkdir(self.root / f".tmp-{uuid.uuid4().hex}")
        meta = {
            **built.meta,   # what the compile recorded (ptxas_advisories); the fields below win
            "key": built.key, "name": built.name, "kernel": built.kernel_name, "arch": built.arch,
            "cubin_size": len(built.cubin), "cubin_sha256": hashlib.sha256(built.cubin).hexdigest(),
            "contract": built.contract.__dict__, "resources": built.resources.__dict__,
            "compile_seconds": round(built.compile_seconds, 3), "created": time.time(),
            **meta_extra,
        }
        try:
            (tmp / "kernel.cu").write_text(source_text)
            (tmp / "kernel.cubin").write_bytes(built.cubin)
            # meta.json last: an entry without it is incomplete and reads as a miss.
            (tmp / "meta.json").write_text(json.dumps(meta, indent=1, sort_keys=True))
            if final.exists():
                _discard(final)  # corrupted (we hold the key lock and get() missed)
            os.rename(tmp, final)
        except OSError:
            _discard(tmp)
            if self.get(built.name, built.key) is None:
                raise
        stored = dataclasses.replace(built, path=final, meta=meta)
        with self._lock:  # later lookups are hits; this caller sees its own compile
            self._mem[built.key] = dataclasses.replace(stored, cached=True)
        return stored

    # A writer killed mid-put (an interrupted build's worker) leaves its .tmp-* folder behind,
    # and a failed rmtree a .trash-* one; entries() ignores both. Once per cache object, the
    # writer removes those older than an hour (no live writer takes that long).
    _STALE_SECONDS = 3600.0

    def _sweep_stale(self) -> None:
        if self._swept:
            return
        self._swept = True
        now = time.time()
        try:
            leftovers = [d for d in self.root.iterdir() if d.name.startswith((".tmp-", ".trash-"))]
        except OSError:
            return
        for d in leftovers:
            try:
                if now - d.stat().st_mtime > self._STALE_SECONDS:
                    shutil.rmtree(d, ignore_errors=True)
            except OSError:
                pass

    def ensure_root(self) -> Path:
        """Create the cache folder now (CacheError when it cannot be): a build checks this once,
        before compiling, rather than have each kernel fail alike."""
        return self._mkdir(self.root, exist_ok=True)

    def lock(self, key: str):
        if self.readonly:   # nothing will be written: no lock file either
            import contextlib
            return contextlib.nullcontext()
        import filelock
        locks = self._mkdir(self.root / ".locks", exist_ok=True)
        return filelock.FileLock(str(locks / f"{key[:32]}.lock"), timeout=600)

    def _mkdir(self, path: Path, exist_ok: bool = False) -> Path:
        try:
            path.mkdir(parents=True, exist_ok=exist_ok)
        except OSError as exc:
            raise CacheError(f"cannot write the kernel cache at {self.root}: {exc.strerror}. "
                             f"Set FUSEGEMM_CACHE_DIR to a writable folder") from None
        return path

    # -- maintenance ----------------------------------------------------------------------
    def entries(self) -> list[dict[str, Any]]:
        out = []
        if not self.root.is_dir():
            return out
        for d in sorted(self.root.iterdir()):
            if d.name.startswith(".") or not d.is_dir() or d.name in RECORD_DIRS:
                continue
            try:
                meta = json.loads((d / "meta.json").read_text())
            except (OSError, ValueError):
                meta = None
            if not isinstance(meta, dict):
                meta = {"name": d.name, "corrupted": "meta.json unreadable"}
            else:
                try:
                    cubin = (d / "kernel.cubin").read_bytes()
                except OSError:
                    cubin = None
                if cubin is None or not _cubin_matches(meta, cubin):
                    meta["corrupted"] = "cubin missing or not matching its size and sha256"
            meta["path"] = str(d)
            out.append(meta)
        return out

    def clear(self, records: bool = False) -> tuple[int, list[str]]:
        """Remove every kernel entry (and with ``records`` the record folders of
        :data:`RECORD_DIRS` too): (entries and record files removed, "name: reason" of those
        that could not be). CacheError, removing nothing, when the cache is read-only: a cache
        shared read-only (FUSEGEMM_CACHE_READONLY) is not this process's to empty."""
        self.require_writable("nothing removed")
        n, failed = 0, []
        with self._lock:
            self._mem.clear()
        if self.root.is_dir():
            for d in self.root.iterdir():
                if not d.is_dir() or d.name.startswith(".locks"):
                    continue
                if d.name in RECORD_DIRS:
                    if not records:
                        continue
                    files = sum(1 for f in d.iterdir() if f.suffix == ".json")
                    why = _discard(d)
                    if why is None:
                        n += files
                    else:
                        failed.append(f"{d.name}: {why}")
                    continue
                why = _discard(d)
                if why is None:
                    n += not d.name.startswith(".")
                elif not d.name.startswith("."):
                    failed.append(f"{d.name}: {why}")
        return n, failed


def _cubin_matches(meta: dict[str, Any], cubin: bytes) -> bool:
    """``cubin`` has the size and sha256 its meta.json recorded (a truncated, flipped or swapped
    cubin does not)."""
    return meta.get("cubin_size") == len(cubin) and meta.get("cubin_sha256") == hashlib.sha256(cubin).hexdigest()


def _discard(d: Path) -> str | None:
    """Remove a folder without ever exposing a half-deleted entry under its final name; the
    reason when it cannot be removed, else None."""
    trash = d.with_name(f".trash-{uuid.uuid4().hex}")
    try:
        os.rename(d, trash)
    except OSError as exc:
        return exc.strerror or str(exc)
    shutil.rmtree(trash, ignore_errors=True)
    return None


_default: KernelCache | None = None


def default_cache() -> KernelCache:
    """The process-wide cache (created on first use, never at import)."""
    global _default
    if _default is None:
        _default = KernelCache()
    return _default
