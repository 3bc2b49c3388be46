"""AOT kernel bundles: one read-only file of cubins that a runtime loads without NVRTC.

A bundle is a zip archive::

    manifest.json          {"format": "fusegemm-bundle", "schema": 1, "package_version", "created",
                            "toolchain": {...}, "entries": {bundle_key: {...}}}
    manifest.sha256        sha256 of manifest.json (hex)
    cubins/<key>.cubin     one per entry; its size and sha256 are in the manifest

Entries are keyed by the *bundle key* (``fusegemm.pipeline.bundle_key``): the rendered source,
fusegemm's own headers, compile options, arch and package version -- not the NVRTC version
and not third-party header content. A cubin is a finished binary: loading it needs no
compiler, so a bundle built under one NVRTC/CUTLASS and loaded under another stays valid as
long as the source it was compiled from is the same (the manifest records the toolchain that
built it, for the reader; the kernel's exported contract is checked at launch as always).

Every read is verified: the manifest against its hash, each cubin against its size and
sha256; a mismatch is a :class:`CacheError` naming the file and the entry, never a load.
Nothing here writes outside the bundle path given to :func:`write_bundle`.
"""
from __future__ import annotations

import hashlib
import json
import os
import threading
import time
import uuid
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..base.errors import CacheError

FORMAT = "fusegemm-bundle"
SCHEMA = 1


@dataclass(frozen=True)
class BundleEntry:
    """One kernel of a bundle, as the manifest describes it."""

    key: str
    name: str
    kernel: str
    arch: str
    cubin_size: int
    cubin_sha256: str
    compile_seconds: float
    meta: dict[str, Any]


def write_bundle(path: Path, entries: list[tuple[str, dict[str, Any], bytes]],
                 toolchain: dict[str, str]) -> int:
    """Write ``entries`` ((bundle key, manifest fields, cubin) each) to ``path`` atomically
    (a temp file in the same folder, then a rename). Returns the number of kernels written."""
    from ..base.package import __version__
    path = Path(path)
    manifest: dict[str, Any] = {"format": FORMAT, "schema": SCHEMA, "package_version": __version__,
                                "created": time.time(), "toolchain": dict(toolchain), "entries": {}}
    seen: dict[str, bytes] = {}
    for key, fields, cubin in entries:
        if key in seen:
            continue
        seen[key] = cubin
        manifest["entries"][key] = {**fields, "cubin": f"cubins/{key}.cubin", "cubin_size": len(cubin),
                                    "cubin_sha256": hashlib.sha256(cubin).hexdigest()}
    text = json.dumps(manifest, indent=1, sort_keys=True).encode()
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as z:
            for key, cubin in seen.items():
                z.writestr(f"cubins/{key}.cubin", cubin)
            z.writestr("manifest.json", text)
            z.writestr("manifest.sha256", hashlib.sha256(text).hexdigest())
        os.replace(tmp, path)
    except OSError as exc:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise CacheError(f"cannot write the bundle {path}: {exc.strerror or exc}") from None
    return len(seen)


class Bundle:
    """A bundle opened for reading (thread-safe). The manifest is verified on open; each cubin
    when it is read."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        try:
            self._zip = zipfile.ZipFile(self.path)
            text = self._zip.read("manifest.json")
            digest = self._zip.read("manifest.sha256").decode().strip()
        except (OSError, KeyError, zipfile.BadZipFile, UnicodeDecodeError) as exc:
            raise CacheError(f"kernel bundle {self.path}: not a readable fusegemm bundle ({exc})") from None
        if hashlib.sha256(text).hexdigest() != digest:
            raise CacheError(f"kernel bundle {self.path}: manifest.json does not match manifest.sha256 "
                             "(the file was modified or truncated); rebuild it with fusegemm build --bundle")
        try:
            manifest = json.loads(text)
        except ValueError:
            raise CacheError(f"kernel bundle {self.path}: manifest.json is not JSON") from None
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            raise CacheError(f"kernel bundle {self.path}: format {manifest.get('format') if isinstance(manifest, dict) else None!r}; "
                             f"allowed: {FORMAT!r}")
        if manifest.get("schema") != SCHEMA:
            raise CacheError(f"kernel bundle {self.path}: schema {manifest.get('schema')!r}; this fusegemm "
                             f"reads schema {SCHEMA}; rebuild it with this version's fusegemm build --bundle")
        self.manifest = manifest
        self.toolchain: dict[str, str] = dict(manifest.get("toolchain") or {})
        self.entries: dict[str, BundleEntry] = {}
        for key, e in (manifest.get("entries") or {}).items():
            try:
                self.entries[key] = BundleEntry(key=key, name=e["name"], kernel=e["kernel"], arch=e["arch"],
                                                cubin_size=int(e["cubin_size"]), cubin_sha256=e["cubin_sha256"],
                                                compile_seconds=float(e.get("compile_seconds", 0.0)), meta=e)
            except (KeyError, TypeError, ValueError):
                raise CacheError(f"kernel bundle {self.path}: manifest entry {key[:16]} is malformed") from None

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, key: str) -> bool:
        return key in self.entries

    def cubin(self, key: str) -> bytes | None:
        """The verified cubin of ``key``, or None when the bundle has no such entry."""
        e = self.entries.get(key)
        if e is None:
            return None
        with self._lock:
            try:
                data = self._zip.read(e.meta["cubin"])
            except (OSError, KeyError, zipfile.BadZipFile) as exc:
                raise CacheError(f"kernel bundle {self.path}: entry {e.name} cannot be read ({exc})") from None
        if len(data) != e.cubin_size or hashlib.sha256(data).hexdigest() != e.cubin_sha256:
            raise CacheError(f"kernel bundle {self.path}: the cubin of {e.name} does not match its sha256 "
                             "(the file was modified); it is not loaded")
        return data


class BundleSet:
    """The bundles a process loads from (FUSEGEMM_BUNDLE, then :func:`add`), first match wins."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._env: list[Bundle] = []        # FUSEGEMM_BUNDLE's, reopened when the variable changes
        self._env_paths: tuple[Path, ...] | None = None
        self._added: list[Bundle] = []      # add()'s, for the life of the process

    def add(self, path: Path | str) -> Bundle:
        b = Bundle(path)
        with self._lock:
            self._added = [*self._added, b]
        return b

    def active(self) -> list[Bundle]:
        from . import config
        paths = config.bundle_paths()
        if paths != self._env_paths:
            with self._lock:
                if paths != self._env_paths:
                    self._env = [Bundle(p) for p in paths]
                    self._env_paths = paths
        return self._env + self._added

    def find(self, key: str) -> tuple[Bundle, bytes] | None:
        for b in self.active():
            if key in b:
                data = b.cubin(key)
                if data is not None:
                    return b, data
        return None

    def clear(self) -> None:
        with self._lock:
            self._env, self._env_paths, self._added = [], None, []


_default: BundleSet | None = None


def default_bundles() -> BundleSet:
    """The process's bundle set (created on first use)."""
    global _default
    if _default is None:
        _default = BundleSet()
    return _default
