"""The first-run gate on an arch the project has not executed on (fusegemm/verify.py), with the
device mocked: when it runs the selftest cases, what it records, when it refuses."""
from __future__ import annotations

import json

import pytest

from fusegemm import verify
from fusegemm.base.errors import UnverifiedError
from fusegemm.runtime import config
from fusegemm.selftest import Row


@pytest.fixture
def gate(monkeypatch, cache_dir):
    """A fresh gate: no process memory, a private cache, a fake device and scripted cases."""
    monkeypatch.setattr(verify, "_verified", set())
    monkeypatch.setattr(verify, "device_name", lambda d: "Fake B200")
    runs = []
    state = {"rows": [Row("grouped_gemm", "case 1", "pass", 1e-3), Row("grouped_gemm", "case 2", "pass", 2e-3)]}

    def run_cases(family, device):
        runs.append((family, device, getattr(verify._local, "active", False)))
        return state["rows"]
    monkeypatch.setattr(verify, "_run_cases", run_cases)
    return runs, state


def test_executed_arch_is_not_checked(gate):
    runs, _ = gate
    verify.ensure_verified("grouped_gemm", "sm_90a", 0)
    assert runs == []


def test_a_family_not_yet_executed_is_gated_on_an_executed_arch(gate, monkeypatch):
    """A registry row marked executed=False (a family just added, as grouped_gemm_wgrad on sm_90a
    was until its GPU tests had run) is verified on first launch like a kernel of an unexecuted
    arch; its failure says which kernel has not run."""
    import dataclasses

    from fusegemm.generator import registry
    runs, state = gate
    key = ("grouped_gemm_wgrad", "sm_90a")
    assert registry.executed(*key)
    monkeypatch.setitem(registry._BY_KEY, key, dataclasses.replace(registry._BY_KEY[key], executed=False))
    assert not registry.executed(*key) and registry.executed("grouped_gemm", "sm_90a")
    state["rows"] = [Row("grouped_gemm_wgrad", "case 1", "FAIL", 1.0)]
    with pytest.raises(UnverifiedError, match=r"not executed its grouped_gemm_wgrad kernel on sm_90a hardware"):
        verify.ensure_verified("grouped_gemm_wgrad", "sm_90a", 0)
    assert runs and runs[0][0] == "grouped_gemm_wgrad"


def test_first_run_checks_once_and_records(gate, cache_dir):
    runs, _ = gate
    verify.ensure_verified("grouped_gemm", "sm_100a", 0)
    verify.ensure_verified("grouped_gemm", "sm_100a", 0)      # same process: remembered
    assert len(runs) == 1
    record = cache_dir / "verified" / "grouped_gemm.sm_100a.json"
    data = json.loads(record.read_text())
    assert data["device"] == "Fake B200" and data["cases"] == 2 and data["arch"] == "sm_100a"
    verify._verified.clear()                                   # a new process reads the record
    verify.ensure_verified("grouped_gemm", "sm_100a", 0)
    assert len(runs) == 1
    # a record for other kernels (another fusegemm version) does not count
    record.write_text(json.dumps({**data, "fusegemm": "0.0.0"}))
    verify._verified.clear()
    verify.ensure_verified("grouped_gemm", "sm_100a", 0)
    assert len(runs) == 2


def test_failure_refuses_and_records_nothing(gate, cache_dir):
    runs, state = gate
    state["rows"] = [Row("grouped_gemm", "dense, ragged", "pass", 1e-3),
                     Row("grouped_gemm", "discrete weights", "FAIL", 3.5, detail="max error 3.5")]
    with pytest.raises(UnverifiedError, match=r"(?s)^grouped_gemm failed its first-run verification on "
                                              r"sm_100a \(device 0, Fake B200\): 1 of 2 selftest cases failed\n"
                                              r"  discrete weights: FAIL max error 3.5\n.*FUSEGEMM_TRUST_UNVERIFIED=1"):
        verify.ensure_verified("grouped_gemm", "sm_100a", 0)
    assert not (cache_dir / "verified" / "grouped_gemm.sm_100a.json").exists()
    with pytest.raises(UnverifiedError):                       # refused again: it ran again
        verify.ensure_verified("grouped_gemm", "sm_100a", 0)
    assert len(runs) == 2


def test_no_cases_is_not_a_pass(gate):
    _, state = gate
    state["rows"] = []
    with pytest.raises(UnverifiedError, match=r"0 of 0 selftest cases failed\n  \(no cases\)"):
        verify.ensure_verified("gemm_amax", "sm_100a", 0)


def test_cases_the_arch_does_not_implement_are_neither_run_nor_failures(gate):
    """A selftest case whose tile the arch's kernel does not implement comes back "not
    available" (fusegemm.selftest.CaseNotAvailable): the gate passes on the other cases, and
    refuses when none passed."""
    runs, state = gate
    state["rows"] = [Row("grouped_gemm_wgrad", "tile 128x256", "pass", 1e-3),
                     Row("grouped_gemm_wgrad", "tile 64x128", "not available", detail="tile_m=64 is not implemented")]
    verify.ensure_verified("grouped_gemm_wgrad", "sm_100a", 0)
    state["rows"] = [state["rows"][1]]
    with pytest.raises(UnverifiedError, match=r"0 of 1 selftest cases failed\n  tile 64x128: not available tile_m=64"):
        verify.ensure_verified("grouped_gemm", "sm_100a", 0)


def test_trust_unverified_skips(gate):
    runs, _ = gate
    with config.override(FUSEGEMM_TRUST_UNVERIFIED="1"):
        verify.ensure_verified("grouped_gemm", "sm_100a", 0)
    assert runs == []


def test_the_cases_own_launches_pass_the_gate(monkeypatch, cache_dir):
    """The selftest cases call the public op, which calls the gate again: that inner call
    returns at once (the cases run with the gate open for this thread), and the gate is shut
    again afterwards."""
    from fusegemm import selftest
    monkeypatch.setattr(verify, "_verified", set())
    monkeypatch.setattr(verify, "device_name", lambda d: "Fake B200")
    seen = []

    def run_family(family, device):
        seen.append(verify._local.active)
        verify.ensure_verified(family, "sm_100a", device)   # would recurse without the guard
        return [Row(family, "c", "pass", 0.0)]
    monkeypatch.setattr(selftest, "run_family", run_family)
    verify.ensure_verified("grouped_gemm", "sm_100a", 0)
    assert seen == [True] and verify._local.active is False


def test_op_compile_runs_the_gate_before_loading(gate, monkeypatch, session_cache):
    """GroupedGemm.compile() on an unexecuted arch: the gate runs after the kernel is built and
    before it is loaded; a failing gate leaves nothing loaded."""
    torch = pytest.importorskip("torch")
    from fusegemm import pipeline
    from fusegemm.ops import arg_checks as checks
    from fusegemm.ops.grouped_gemm import GroupedGemm
    from fusegemm.runtime import load
    real_get = pipeline.get_kernel
    monkeypatch.setattr(checks, "require_cuda", lambda v, n: 0)
    monkeypatch.setattr(checks, "same_device", lambda views, dev: None)
    monkeypatch.setattr(pipeline, "get_kernel", lambda v, *a, **k: real_get(v, session_cache))
    monkeypatch.setattr(load, "default_modules", lambda: pytest.fail("loaded before the gate passed"))
    runs, state = gate
    state["rows"] = [Row("grouped_gemm", "c", "FAIL", 9.0, detail="wrong")]
    a = torch.zeros(512, 64, 1, dtype=torch.bfloat16)
    op = GroupedGemm(a, None, torch.zeros(512, 128, 1, dtype=torch.bfloat16),
                     torch.tensor([256, 512], dtype=torch.int32), torch.ones(2),
                     torch.zeros(2, 128, 64, dtype=torch.bfloat16).permute(1, 2, 0), None,
                     torch.ones(512, 1, 1), arch="sm_100a")
    with pytest.raises(UnverifiedError, match="grouped_gemm failed its first-run verification on sm_100a"):
        op.compile()
    assert op._op is None and runs == [("grouped_gemm", -1, False)]   # CPU tensors: device -1


def test_the_ops_reach_the_gate_through_the_hook_the_package_root_installs(gate):
    """The launcher does not import this module (it runs the selftest cases, which call the
    ops): it calls fusegemm.base.hooks.FIRST_LAUNCH, which the package root fills in before
    any fusegemm module can run, without importing the gate until a launch calls it."""
    import subprocess
    import sys

    from fusegemm.base import hooks
    code = ("import sys, fusegemm.ops.loaded_kernel\nfrom fusegemm.base import hooks\n"
            "print(hooks.FIRST_LAUNCH.installed, hooks.FIRST_CALL_TUNE.installed, 'fusegemm.verify' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.split() == ["True", "True", "False"], out.stdout + out.stderr
    runs, _ = gate
    hooks.FIRST_LAUNCH("grouped_gemm", "sm_100a", 0)           # what the launcher calls
    assert [r[:2] for r in runs] == [("grouped_gemm", 0)]


def test_an_empty_gate_refuses_the_launch(monkeypatch):
    """Fails closed: with nothing installed, no kernel launches unverified."""
    from fusegemm.base import hooks
    from fusegemm.base.errors import FusegemmError
    monkeypatch.setattr(hooks.FIRST_LAUNCH, "_fn", None)
    with pytest.raises(FusegemmError, match=r"^fusegemm: nothing is installed for the first-run verification hook"):
        hooks.FIRST_LAUNCH("grouped_gemm", "sm_90a", 0)
