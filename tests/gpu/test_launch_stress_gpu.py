"""Back-to-back launches of the routed layer's grouped GEMMs (gathered and pre-permuted fc1 and
K-grouped weight gradients, bursts of 1, 3 and 10 without a synchronize, interleaved). Bench runs of
this pattern hung on the H200 on 2026-12-04: a start-up race of the gathered kernels (copying warps
waiting on the tile ring by a parity that the consumers could already have moved past; README, "A hang
of the gathered kernels"), which this test caught on the default build before the fix (the dsv3-8
case). Each case runs in a child process under a wall-clock limit, with and without FUSEGEMM_WAIT_TIMEOUT,
so a hang fails this test with the burst that hung and the device's report of the barrier wait that timed
out (block, thread, barrier, parity) instead of hanging the suite."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

CHILD = Path(__file__).parent / "helpers" / "launch_stress.py"
# (experts, tokens, K, N, top_k): the dsv3-8 and mixtral layers' fc1 (bench/gathered.py).
LAYERS = {"dsv3-8": (8, 4096, 7168, 4096, 8), "mixtral": (8, 4096, 4096, 28672, 2)}


@pytest.mark.parametrize("wait_s", ["0", "5"], ids=["plain-build", "wait-timeout-build"])
@pytest.mark.parametrize("layer", list(LAYERS))
def test_interleaved_bursts_finish(layer, wait_s, tmp_path):
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "FUSEGEMM_WAIT_TIMEOUT": wait_s, "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    args = [sys.executable, str(CHILD), *(str(v) for v in LAYERS[layer]), "3"]
    try:
        res = subprocess.run(args, env=env, capture_output=True, text=True, timeout=240)
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        last = [line for line in out.splitlines() if line.startswith("run ")][-1:]
        pytest.fail(f"{layer}: no result within 240 s (a hung kernel); last burst started: {last}")
    timed_out = [line for line in res.stdout.splitlines() if "wait timed out" in line]
    assert res.returncode == 0 and "DONE" in res.stdout, (
        f"{layer}: exit {res.returncode}; barrier waits that timed out: {timed_out[:8]}; "
        f"last lines: {res.stdout.splitlines()[-3:]}; stderr: {res.stderr[-1500:]}")
