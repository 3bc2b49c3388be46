"""`fusegemm selftest`: no GPU is not a failure; a failing case makes the exit code non-zero."""
from __future__ import annotations

import re

import pytest

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
    monkeypatch.setitem(st.CASE_RUNNERS, "grouped_gemm", lambda case, device: (1e-3, True, "fine"))
    r = CliRunner().invoke(main, ["selftest"])
    assert r.exit_code == 0, r.output
    assert re.search(r"^grouped_gemm +ok case +pass +0.001 ", r.output, re.M)
    assert re.search(r"^gemm_amax +- +not available +- .* gemm_amax on sm_90a: carrier: no kernel for "
                     r"this arch yet", r.output, re.M)
    assert "1 passed, 0 failed, 4 not available" in r.output


def test_failure_exits_one(monkeypatch):
    monkeypatch.setattr(st, "detect_arch", lambda: ("sm_90a", "fake H200"))
    monkeypatch.setitem(st.RUNNERS, "grouped_gemm", lambda: [("bad", {}), ("boom", {"x": 1})])

    def runner(case, device):
        if case:
            raise RuntimeError("device fault")
        return 5.0, False, "too far"
    monkeypatch.setitem(st.CASE_RUNNERS, "grouped_gemm", runner)
    r = CliRunner().invoke(main, ["selftest"])
    assert r.exit_code == 1
    assert "0 passed, 2 failed" in r.output and "RuntimeError: device fault" in r.output


def test_grouped_gemm_cases_logic_on_cpu(monkeypatch):
    """The selftest's problem -> tensors -> compare path, with the reference standing in for
    the GPU op (so a broken conversion or tolerance is caught without a GPU)."""
    torch = pytest.importorskip("torch")
    import numpy as np

    from fusegemm import reference
    from fusegemm.ops import grouped_gemm as op

    def fake_op(**kw):
        def np_(t):
            if t is None or not isinstance(t, torch.Tensor):
                return t
            assert t.device.type == "cpu"
            return t.float().numpy() if t.dtype == torch.bfloat16 else t.numpy()
        if "b_ptrs" in kw:
            pytest.skip("discrete pointers are device-only")
        args = {k: np_(v) for k, v in kw.items()}
        import ml_dtypes
        for k in ("a_tensor", "b_tensor"):
            args[k] = args[k].astype(ml_dtypes.bfloat16)
        res = reference.grouped_gemm(**args)
        return {k: None if v is None else torch.from_numpy(np.asarray(v, dtype=np.float32))
                for k, v in res.items()}
    monkeypatch.setattr(op, "grouped_gemm", fake_op)
    for label, case in st._grouped_gemm_cases():
        if case.get("discrete"):
            continue
        err, ok, detail = st._run_grouped_gemm(case, device="cpu")
        assert ok, (label, err)
