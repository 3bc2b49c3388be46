"""`fusegemm selftest`: no GPU is not a failure; a failing case makes the exit code non-zero."""
from __future__ import annotations

import re

from click.testing import CliRunner

from fusegemm import selftest as st
from fusegemm.cli import main


def test_no_gpu_exits_zero_with_reason(monkeypatch):
    monkeypatch.setattr(st, "detect_arch", lambda: (None, "no CUDA GPU present"))
    r = CliRunner().invoke(main, ["selftest"])
    assert r.exit_code == 0 and r.output == "selftest: nothing to run: no CUDA GPU present\n"


def test_unavailable_families_are_listed_not_failed(monkeypatch):
    monkeypatch.setattr(st, "detect_arch", lambda: ("sm_90a", "fake H200"))
    monkeypatch.setitem(st.RUNNERS, "grouped_gemm", lambda: [("ok case", {})])
    monkeypatch.setitem(st.CASE_RUNNERS, "grouped_gemm", lambda case: (1e-3, True, "fine"))
    r = CliRunner().invoke(main, ["selftest"])
    assert r.exit_code == 0, r.output
    assert re.search(r"^grouped_gemm +ok case +pass +0.001 ", r.output, re.M)
    assert re.search(r"^gemm_amax +- +not available +- .*staging carrier", r.output, re.M)
    assert "1 passed, 0 failed, 4 not available" in r.output


def test_failure_exits_one(monkeypatch):
    monkeypatch.setattr(st, "detect_arch", lambda: ("sm_90a", "fake H200"))
    monkeypatch.setitem(st.RUNNERS, "grouped_gemm", lambda: [("bad", {}), ("boom", {"x": 1})])

    def runner(case):
        if case:
            raise RuntimeError("device fault")
        return 5.0, False, "too far"
    monkeypatch.setitem(st.CASE_RUNNERS, "grouped_gemm", runner)
    r = CliRunner().invoke(main, ["selftest"])
    assert r.exit_code == 1
    assert "0 passed, 2 failed" in r.output and "RuntimeError: device fault" in r.output
