"""The one place that reads ``FUSEGEMM_*`` environment variables.

Each variable is declared once with its type, default and documentation; values are parsed
on every access (cheap) so tests can change them with :func:`override`. A bad value raises
:class:`ConfigError` naming the variable, the value and what is allowed.
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Callable, Iterator

from ..base.archs import ARCH_NAMES
from ..base.errors import ConfigError

_overrides: dict[str, str | None] = {}


@dataclass(frozen=True)
class Var:
    name: str
    default: str | None
    parse: Callable[[str], object]
    allowed: str
    doc: str

    def raw(self) -> str | None:
        if self.name in _overrides:
            return _overrides[self.name]
        return os.environ.get(self.name, self.default)

    def get(self) -> object:
        raw = self.raw()
        # Parsed once per raw value: the ops read FUSEGEMM_VALIDATE_OFFSETS on every call.
        hit = _parsed.get((self.name, raw), _MISSING)
        if hit is not _MISSING:
            return hit
        if raw is None or raw == "":
            value = None if self.default is None else self.parse(self.default)
        else:
            try:
                value = self.parse(raw)
            except (ValueError, TypeError):
                raise ConfigError(f"{self.name}={raw!r} is invalid; allowed: {self.allowed}") from None
        if len(_parsed) < 256:
            _parsed[(self.name, raw)] = value
        return value


_MISSING = object()
_parsed: dict[tuple[str, str | None], object] = {}


def _bool(s: str) -> bool:
    v = s.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    raise ValueError(s)


def _positive_int(s: str) -> int:
    v = int(s)
    if v < 1:
        raise ValueError(s)
    return v


def _nvrtc_major(s: str) -> int | None:
    v = s.strip().lower()
    if v == "auto":
        return None
    if v in ("12", "13"):
        return int(v)
    raise ValueError(s)


def _seconds(s: str, *, zero: bool) -> float:
    """A finite number of seconds, above 0 (or 0 as well where ``zero`` means off); NaN fails both."""
    value = float(s)
    if not ((0 <= value if zero else 0 < value) and value < float("inf")):
        raise ValueError(s)
    return value


def _archs(s: str) -> tuple[str, ...]:
    items = tuple(a.strip() for a in s.split(",") if a.strip())
    if not items or any(a not in ARCH_NAMES for a in items):
        raise ValueError(s)
    return items


VARS: dict[str, Var] = {v.name: v for v in (
    Var("FUSEGEMM_CACHE_DIR", None, lambda s: Path(s).expanduser(), "a directory path",
        "Kernel cache root. Default: the user cache dir (platformdirs), e.g. ~/.cache/fusegemm."),
    Var("FUSEGEMM_DISABLE_DISK_CACHE", "0", _bool, "0/1, true/false",
        "Compile in memory only; nothing is read from or written to the disk cache."),
    Var("FUSEGEMM_JOBS", None, _positive_int, "a positive integer",
        "Parallel compile processes for `fusegemm build` (default: CPU count)."),
    Var("FUSEGEMM_ARCHS", ",".join(ARCH_NAMES), _archs, "comma list of " + ", ".join(ARCH_NAMES),
        "Architectures `fusegemm build` compiles when --arch is not given."),
    Var("FUSEGEMM_VALIDATE_OFFSETS", "0", _bool, "0/1, true/false",
        "Copy padded_offsets to the host and check their values before each launch "
        "(never during CUDA graph capture)."),
    Var("FUSEGEMM_NVRTC_MAJOR", "auto", _nvrtc_major, "auto, 12, 13",
        "NVRTC major to compile with when both the CUDA 12 and 13 wheels are installed. auto: the "
        "newest whose cubins the driver loads (the newest installed without a driver)."),
    Var("FUSEGEMM_NVRTC_EXTRA", "", lambda s: tuple(s.split()), "space-separated NVRTC options",
        "Extra NVRTC options appended to every compile (part of the cache key)."),
    Var("FUSEGEMM_WAIT_TIMEOUT", "0", partial(_seconds, zero=True), "seconds, a number >= 0 (0: off)",
        "Diagnosis of a hung kernel: kernels compiled while this is set stop a barrier wait that has "
        "not completed after this many seconds, print the block, thread, barrier (its shared-memory "
        "offset) and phase parity from the device, and trap, so the launch fails with an error instead "
        "of hanging its stream. Part of the cache key; the waits poll a clock, so such kernels run a "
        "little slower."),
    Var("FUSEGEMM_BUNDLE", "", lambda s: tuple(Path(p).expanduser() for p in s.split(os.pathsep) if p),
        "bundle paths separated by " + repr(os.pathsep),
        "Kernel bundles (`fusegemm build --bundle PATH`) the runtime loads kernels from before the "
        "cache, read-only, without NVRTC; the first bundle holding a kernel wins."),
    Var("FUSEGEMM_CACHE_READONLY", "0", _bool, "0/1, true/false",
        "Read the disk cache but never write it (no lock files, no entries): kernels it lacks are "
        "compiled in memory. A cache folder the process cannot write is read-only without this."),
    Var("FUSEGEMM_AUTOTUNE", "0", _bool, "0/1, true/false",
        "First-call tuning: when `fusegemm.grouped_gemm` is called with no configuration and its "
        "shape bucket has no `fusegemm tune` record for this device, tune that bucket first (once "
        "per process: compiles and times every implemented configuration on a seeded problem of the "
        "call's shape, seconds, with memory for one more copy of the operands), record the winner "
        "and launch it. Never during CUDA graph capture; a failed tuning logs a warning and the call "
        "gets the default."),
    Var("FUSEGEMM_TRUST_UNVERIFIED", "0", _bool, "0/1, true/false",
        "Skip the first-run verification of kernel families on an arch fusegemm has not executed "
        "on (sm_100a today), and of modes no GPU has run yet (the sm_90a stream-K scheduler): launch "
        "without running their selftest cases first."),
    Var("FUSEGEMM_STREAMK_MIN_K_BLOCKS", "4", _positive_int, "a positive integer",
        "Stream-K (scheduler streamk): the fewest k-blocks (64 K each) a CTA takes of the last wave's "
        "split; a smaller remainder is shared by fewer CTAs, and none is split when that would not "
        "shorten it. Read when an op plans a call pattern's launch (its first call), not part of the "
        "cubin."),
    Var("FUSEGEMM_VERIFY_TIMEOUT", "30", partial(_seconds, zero=False), "seconds, a positive number",
        "How long the first-run verification cases of a configuration may run on the device (after "
        "their kernels are built) before the check is stopped and the configuration refused as "
        "hanging. The cases run in a child process, so a hang or a fault there leaves this process "
        "and its CUDA context usable."),
)}


def get(name: str) -> object:
    """Parsed value of the declared variable ``name``."""
    try:
        var = VARS[name]
    except KeyError:
        raise ConfigError(f"unknown configuration variable {name!r}; declared: {sorted(VARS)}") from None
    return var.get()


def raw(name: str) -> str | None:
    """The unparsed value of the declared variable ``name`` (None: unset, no default), for
    messages that name the setting as the user wrote it."""
    try:
        var = VARS[name]
    except KeyError:
        raise ConfigError(f"unknown configuration variable {name!r}; declared: {sorted(VARS)}") from None
    return var.raw()


def cache_dir() -> Path:
    value = get("FUSEGEMM_CACHE_DIR")
    if value is not None:
        return value  # type: ignore[return-value]
    import platformdirs
    return Path(platformdirs.user_cache_dir("fusegemm", appauthor=False))


def disk_cache_enabled() -> bool:
    return not get("FUSEGEMM_DISABLE_DISK_CACHE")


def jobs() -> int:
    value = get("FUSEGEMM_JOBS")
    return int(value) if value is not None else max(1, os.cpu_count() or 1)


def default_archs() -> tuple[str, ...]:
    return get("FUSEGEMM_ARCHS")  # type: ignore[return-value]


def validate_offsets() -> bool:
    return bool(get("FUSEGEMM_VALIDATE_OFFSETS"))


def bundle_paths() -> tuple[Path, ...]:
    return get("FUSEGEMM_BUNDLE")  # type: ignore[return-value]


def cache_readonly() -> bool:
    return bool(get("FUSEGEMM_CACHE_READONLY"))


def autotune() -> bool:
    return bool(get("FUSEGEMM_AUTOTUNE"))


def trust_unverified() -> bool:
    return bool(get("FUSEGEMM_TRUST_UNVERIFIED"))


def stream_k_min_k_blocks() -> int:
    return get("FUSEGEMM_STREAMK_MIN_K_BLOCKS")  # type: ignore[return-value]


def verify_timeout() -> float:
    return get("FUSEGEMM_VERIFY_TIMEOUT")  # type: ignore[return-value]


def nvrtc_major() -> int | None:
    return get("FUSEGEMM_NVRTC_MAJOR")  # type: ignore[return-value]


def nvrtc_extra_options() -> tuple[str, ...]:
    """FUSEGEMM_NVRTC_EXTRA's options, after the define FUSEGEMM_WAIT_TIMEOUT asks for."""
    wait_s: float = get("FUSEGEMM_WAIT_TIMEOUT")  # type: ignore[assignment]
    wait = (f"-DFUSEGEMM_WAIT_TIMEOUT_NS={max(int(wait_s * 1e9), 1)}ull",) if wait_s > 0 else ()
    return wait + get("FUSEGEMM_NVRTC_EXTRA")  # type: ignore[operator]


def check() -> None:
    """Parse every declared variable now, and check that the cache folder, where the disk cache
    is on, is a folder (or can be one): ConfigError naming the variable, its value and what is
    allowed. Commands call it before any work, so a bad setting is one error, not a traceback
    from wherever it is first read, nor one identical failure per kernel of a build."""
    for var in VARS.values():
        var.get()
    if disk_cache_enabled():
        root = cache_dir()
        # The nearest existing part of the path decides: a file there (the folder itself or a
        # parent) cannot hold the cache, and nothing below it can be created.
        for part in (root, *root.parents):
            if part.exists():
                break
        if part.exists() and not part.is_dir():
            given = raw("FUSEGEMM_CACHE_DIR")
            if given:
                raise ConfigError(f"FUSEGEMM_CACHE_DIR={given!r} is invalid: {part} is a file; allowed: a "
                                  f"directory path")
            raise ConfigError(f"the default kernel cache folder {root} cannot be used: {part} is a file; "
                              f"allowed: set FUSEGEMM_CACHE_DIR to a directory path")


@contextlib.contextmanager
def override(**values: str | None) -> Iterator[None]:
    """Temporarily set variables (``None`` = unset), e.g. ``override(FUSEGEMM_JOBS="2")``."""
    for name in values:
        if name not in VARS:
            raise ConfigError(f"unknown configuration variable {name!r}; declared: {sorted(VARS)}")
    saved = dict(_overrides)
    _overrides.update(values)
    try:
        yield
    finally:
        _overrides.clear()
        _overrides.update(saved)


def environment(**values: str) -> dict[str, str]:
    """The environment for a child process that must see this process's configuration: the
    process environment with every variable's value here (overrides included), then ``values``."""
    return {**os.environ, **{v.name: str(raw) for v in VARS.values() if (raw := v.raw()) is not None}, **values}


def describe() -> list[tuple[str, str, str]]:
    """(name, current raw value, documentation) for every variable, for docs and the CLI."""
    return [(v.name, str(v.raw()), v.doc) for v in VARS.values()]
