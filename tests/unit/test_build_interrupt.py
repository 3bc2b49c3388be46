"""Ctrl-C during a parallel ``fusegemm build``: the build stops promptly (exit 130), leaves no
process behind, and the next build uses the cache without error (issue 13)."""
from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time

import pytest

# Every seed spec (30 kernels, ~10 s at -j 2): a round's build cannot finish before its Ctrl-C.
SPECS: list[str] = []


def _group_alive(pgid: int) -> list[str]:
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":   # fields[2]: pgrp; fields[0]: state
            out.append(pid)
    return out


def _foreground_job() -> None:
    """preexec_fn: SIGINT as a terminal's foreground job has it (default, unblocked), whatever
    the test runner inherited. A runner started by a shell without job control (`.ci/run &` in a
    script) has SIGINT ignored, its children too, and such a build rightly ignores Ctrl-C (next
    test): 10-12 of 20 rounds then ran to the end."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_interrupting_a_parallel_build_at_random_moments(tmp_path):
    rng = random.Random(13)
    cache = tmp_path / "cache"
    env = {**os.environ, "FUSEGEMM_CACHE_DIR": str(cache)}
    cmd = [sys.executable, "-m", "fusegemm.cli", "build", *SPECS, "-j", "2"]
    interrupted = 0
    for _ in range(20):
        # Keep work for the build: drop about 80% of what earlier rounds finished (the rest is
        # read as hits, so every round also checks the cache an interrupted build left). With half
        # dropped, faster compiles let up to 6 of 20 rounds finish before their Ctrl-C landed.
        for entry in (cache.iterdir() if cache.is_dir() else ()):
            if not entry.name.startswith(".") and rng.random() < 0.8:
                shutil.rmtree(entry)
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True, start_new_session=True, preexec_fn=_foreground_job)
        time.sleep(rng.uniform(0.1, 1.6))
        os.killpg(proc.pid, signal.SIGINT)          # what a terminal's Ctrl-C does: the whole group
        try:
            # 60 s: the stop is bounded (~25 s worst case); 30 s was exceeded once with a CI run and
            # another build sharing the 2 cores.
            _, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail("the build did not stop within 60 s of Ctrl-C")
        # 130, or killed by SIGINT (-2, CPython's exit after a KeyboardInterrupt, rare), or 0: the
        # Ctrl-C landed in the microseconds between blocking SIGINT and ignoring it while the pool
        # starts (setting SIG_IGN discards a pending signal; the build then simply finishes).
        assert proc.returncode in (0, 130, -signal.SIGINT), err[-2000:]
        if proc.returncode != 0:
            interrupted += 1
            # The build's own report, or click's when the Ctrl-C landed before the build began
            # (while it parsed its arguments); both exit 130. On a loaded machine the Ctrl-C can
            # land before any fusegemm code runs, while Python imports the CLI module: CPython's
            # KeyboardInterrupt traceback (exit -2), which no program can turn into a report;
            # the build must never be in such a traceback.
            started = "Traceback" not in err
            assert (("interrupted after" in err or err.strip() == "Aborted!") if started else
                    (proc.returncode == -signal.SIGINT and err.rstrip().endswith("KeyboardInterrupt")
                     and "fusegemm/build.py" not in err and "build_cmd" not in err)), err[-2000:]
        deadline = time.time() + 10
        while _group_alive(proc.pid) and time.time() < deadline:
            time.sleep(0.1)
        assert _group_alive(proc.pid) == [], "processes of the interrupted build are still running"
    assert interrupted >= 18   # 14 of 20 before the resource tracker started outside the SIG_IGN window
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert " 0 failed" in res.stdout


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="POSIX process groups and signal dispositions")
def test_a_build_started_with_sigint_ignored_ignores_ctrl_c(tmp_path):
    """A background job of a shell without job control (SIGINT ignored) is not stopped by a
    Ctrl-C sent to its group, before or after its worker pool starts: it builds everything."""
    env = {**os.environ, "FUSEGEMM_CACHE_DIR": str(tmp_path / "cache")}
    cmd = [sys.executable, "-m", "fusegemm.cli", "build", "gemm_amax", "-j", "2"]

    def ignored() -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=ignored)
    for delay in (0.3, 1.5, 1.0):   # during imports, planning and the compiles
        time.sleep(delay)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-2000:]
    assert "interrupted" not in err and " 0 failed" in out + err, (out + err)[-2000:]


def test_a_ctrl_c_outside_the_command_exits_130(monkeypatch):
    """A Ctrl-C that lands while click resolves the command (before the build's own handler)
    exits 130 like one inside it; click's standalone mode said 1 ("Aborted!")."""
    import click
    from click.testing import CliRunner

    from fusegemm.cli import main

    def interrupted(self, ctx, args):
        raise KeyboardInterrupt
    monkeypatch.setattr(click.Group, "resolve_command", interrupted)
    result = CliRunner().invoke(main, ["build", "grouped_gemm"])
    assert result.exit_code == 130 and "Aborted!" in result.output


# A build's pool whose parent is killed outright (kill -9: no handler, no atexit, no _stop).
_KILLED_PARENT = """
import multiprocessing, sys, time
from fusegemm import build
from multiprocessing import forkserver
pool = build._start_pool(2, multiprocessing.get_context("forkserver"))
running = [pool.submit(time.sleep, 120) for _ in range(2)]   # long compiles, as far as the pool knows
while len(pool._processes) < 2:
    time.sleep(0.05)
time.sleep(0.3)
print(forkserver._forkserver._forkserver_pid, *pool._processes, flush=True)
time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"   # a zombie has exited
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forkserver pool; reads /proc")
def test_workers_exit_when_the_build_is_killed():
    """kill -9 of the build's process: its pool's workers (mid-compile) exit within seconds
    instead of running on, orphaned (they lived 45 s and more: issue 32, probe 5)."""
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_PARENT], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    pids: list[int] = []
    try:
        pids += [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 3, pids     # the forkserver and two workers
        assert all(_alive(p) for p in pids)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        deadline = time.monotonic() + 5
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [p for p in pids if _alive(p)] == []
    finally:
        for p in pids:
            if _alive(p):
                os.kill(p, signal.SIGKILL)
        proc.kill()


# A Ctrl-C whose KeyboardInterrupt Python swallows: raised inside a finalizer it is only printed
# ("Exception ignored in: ..."), as CI saw with an import's module-lock callback.
_SWALLOWED = """
import signal, sys
from fusegemm import build
from fusegemm.base import interrupts
from fusegemm.generator.spec import find_spec
from fusegemm.generator.variants import prebuild_variants
if sys.argv[1] == "latched":
    interrupts.install()
vs = prebuild_variants(find_spec("gemm_amax"), ("sm_90a",))
class Finalized:
    def __del__(self):
        signal.raise_signal(signal.SIGINT)
Finalized()
try:
    rows = build.build(vs)
except KeyboardInterrupt:
    print("stopped", flush=True)
else:
    print("built", len(rows), flush=True)
"""


@pytest.mark.skipif(not hasattr(signal, "raise_signal"), reason="signal.raise_signal")
@pytest.mark.parametrize("mode", ["latched", "bare"])
def test_a_swallowed_ctrl_c_still_stops_the_build(tmp_path, mode):
    """The command line latches SIGINT (base/interrupts.py): a Ctrl-C whose KeyboardInterrupt
    Python swallowed stops the build at its next step. Without the latch (a library caller
    that installed nothing) the same program builds: the swallowing is real, not simulated."""
    env = {**os.environ, "FUSEGEMM_CACHE_DIR": str(tmp_path / "cache")}
    res = subprocess.run([sys.executable, "-c", _SWALLOWED, mode], env=env, capture_output=True, text=True,
                         timeout=300, preexec_fn=_foreground_job)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "Exception ignored" in res.stderr and "KeyboardInterrupt" in res.stderr, res.stderr[-2000:]
    assert res.stdout.split()[0] == ("stopped" if mode == "latched" else "built"), res.stdout


def test_every_command_latches_ctrl_c():
    """The command line installs the latch before any command runs (the random-moment test above
    cannot show it: a swallowed Ctrl-C is rare there)."""
    prog = ("import signal; from fusegemm.cli import main; from fusegemm.base import interrupts\n"
            "main(['list', '--json'], standalone_mode=False)\n"
            "print(signal.getsignal(signal.SIGINT) is interrupts._latch)")
    res = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, timeout=120,
                         preexec_fn=_foreground_job)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split()[-1] == "True", res.stdout[-500:]


def test_a_stopped_pool_leaves_no_wakeup_for_the_exit_hook():
    """build._stop (Ctrl-C during a parallel build) drops the stopped pool's manager from the
    interpreter's exit-hook table: the hook's wakeup write could race the manager closing its pipe
    ("Exception ignored ... Bad file descriptor" after the build's report, seen in CI). _stop read
    the manager after shutdown(), which forgets it, so the entry was never dropped."""
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures import process as futures_process

    from fusegemm import build
    pool = ProcessPoolExecutor(max_workers=1)
    assert pool.submit(abs, -3).result(timeout=60) == 3
    manager = pool._executor_manager_thread
    assert manager is not None and manager in futures_process._threads_wakeups
    build._stop(pool)
    assert manager not in futures_process._threads_wakeups
