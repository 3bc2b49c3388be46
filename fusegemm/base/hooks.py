"""Calls a lower layer makes into a layer above it, filled in from above.

Two things the ops must do on a launch belong to layers above them: the first-run verification
of a kernel fusegemm has not executed (fusegemm/verify.py runs the selftest cases, which call
the ops) and first-call tuning under ``FUSEGEMM_AUTOTUNE=1`` (fusegemm/tune.py times the ops).
The ops call a :class:`Hook` here instead of importing those modules; the package root
(fusegemm/__init__.py), which every ``import fusegemm.<anything>`` runs first, installs them.
So layers only look down, and a hook is in place before any op can launch.

Leaf: imports nothing of fusegemm but the errors.
"""
from __future__ import annotations

from typing import Any, Callable

from .errors import FusegemmError


class Hook:
    """One call slot: the lower layer calls it, the layer above installs what it does.

    Parameters
    ----------
    name : str
        What the slot does, for the error raised when it is called empty.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._fn: Callable[..., Any] | None = None

    def install(self, fn: Callable[..., Any] | None) -> Callable[..., Any] | None:
        """Make ``fn`` what the slot calls (None empties it); returns what was installed."""
        previous, self._fn = self._fn, fn
        return previous

    @property
    def installed(self) -> bool:
        """Whether something is installed."""
        return self._fn is not None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        fn = self._fn
        if fn is None:
            # Fails closed: an empty first-launch gate must not let an unverified kernel run.
            raise FusegemmError(f"fusegemm: nothing is installed for the {self.name} hook (the package "
                                f"root, fusegemm/__init__.py, installs it on import)")
        return fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"Hook({self.name!r}, installed={self.installed})"


# fn(variant, device, ctas_per_tile) -> None; raises UnverifiedError to refuse the launch.
FIRST_LAUNCH = Hook("first-run verification")
# fn(spec, arch, device, device_name, bucket, *, experts, m_rows, n, k, d_dtype, stream)
#   -> the tuned configuration (a tuning_records.Candidate) or None for the default.
FIRST_CALL_TUNE = Hook("first-call tuning")
