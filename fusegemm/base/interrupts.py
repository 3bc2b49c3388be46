"""A Ctrl-C that Python swallows is still seen: the command line's SIGINT latch.

CPython raises KeyboardInterrupt at whichever bytecode runs when SIGINT arrives. Inside a weakref
callback or a ``__del__`` (an import's module-lock cleanup, a finalizer) it is printed as
"Exception ignored in: ..." and lost: a ``fusegemm build`` Ctrl-C'd at that moment ran on to
its end (CI, tests/unit/test_build_interrupt.py: "Exception ignored in: <function
_get_module_lock.<locals>.cb>", then 60 s of compiles). The latch records every SIGINT before
it raises, and long work calls :func:`check` between its steps, so a swallowed Ctrl-C still
stops it at the next step.

Leaf: imports nothing of fusegemm.
"""
from __future__ import annotations

import signal
import threading

_seen = threading.Event()


def _latch(signum: int, frame: object) -> None:
    _seen.set()
    raise KeyboardInterrupt


def install() -> None:
    """Latch SIGINT in this process: Python's default handler (raise KeyboardInterrupt) plus a
    record of the signal. Only over the default handler and in the main thread: an ignored
    SIGINT (a background job of a shell without job control) stays ignored, and a handler the
    embedding program installed stays its own."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _latch)


def record() -> None:
    """Record a Ctrl-C that a handler other than the latch received (the build's pool handler,
    which only sets its own flag while the pool runs)."""
    _seen.set()


def seen() -> bool:
    """Whether a Ctrl-C reached the latch (whether or not its KeyboardInterrupt survived)."""
    return _seen.is_set()


def check() -> None:
    """Raise KeyboardInterrupt if a Ctrl-C was latched: one Python may have swallowed."""
    if _seen.is_set():
        raise KeyboardInterrupt
