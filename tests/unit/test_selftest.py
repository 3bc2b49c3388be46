"""`fusegemm selftest`: no GPU is not a failure but not a pass either (exit 3: nothing verified);
a failing case exits 1."""
from __future__ import annotations

import re

import numpy as np
import pytest

from click.testing import CliRunner

from fusegemm import selftest as st
from fusegemm.cli import main


def test_no_gpu_exits_3_with_reason(monkeypatch):
    monkeypatch.setattr(st, "detect_arch", lambda: (None, "no CUDA GPU present"))
    r = CliRunner().invoke(main, ["selftest"])
    assert r.exit_code == 3 and r.output == "selftest: nothing to run, nothing verified: no CUDA GPU present\n"


def _only(monkeypatch, family, cases, runner):
    """Run only ``family`` (the others get no cases) with a fake case runner."""
    for fam in list(st.RUNNERS):
        monkeypatch.setitem(st.RUNNERS, fam, (lambda: cases) if fam == family else (lambda: []))
    monkeypatch.setitem(st.CASE_RUNNERS, family, runner)


def test_every_family_has_cases_on_sm90a(monkeypatch):
    """The five families all run on the H200: each has selftest cases and a public op."""
    from fusegemm.generator import registry
    assert set(st.RUNNERS) == set(registry.families())
    monkeypatch.setattr(st, "detect_arch", lambda: ("sm_90a", "fake H200"))
    for fam in list(st.RUNNERS):
        monkeypatch.setitem(st.CASE_RUNNERS, fam, lambda case, device: (1e-3, True, "fine"))
    r = CliRunner().invoke(main, ["selftest"])
    assert r.exit_code == 0, r.output
    for fam in ("grouped_gemm", "gemm_amax", "grouped_gemm_srelu", "grouped_gemm_quant", "grouped_gemm_dswiglu"):
        assert re.search(rf"^{fam} +.+ +pass +0.001 ", r.output, re.M), fam
    assert re.search(r"\b0 failed, 0 not available", r.output), r.output


def test_family_without_a_kernel_is_not_available():
    """A family with no registry row on the arch is listed with the reason, not run."""
    rows = st.run("sm_90a", families=("no_such_family",))
    assert rows == [st.Row("no_such_family", "-", "not available",
                           detail="no_such_family on sm_90a: no kernel for this arch")]


def test_failure_exits_one(monkeypatch):
    monkeypatch.setattr(st, "detect_arch", lambda: ("sm_90a", "fake H200"))

    def runner(case, device):
        if case:
            raise RuntimeError("device fault")
        return 5.0, False, "too far"
    _only(monkeypatch, "grouped_gemm", [("bad", {}), ("boom", {"x": 1})], runner)
    r = CliRunner().invoke(main, ["selftest"])
    assert r.exit_code == 1
    assert "0 passed, 2 failed" in r.output and "RuntimeError: device fault" in r.output


def test_a_case_the_arch_does_not_implement_is_not_available(monkeypatch):
    """A case runner raising CaseNotAvailable (the K-grouped tile-64 case on sm_100a, whose kernel
    has 128-row tiles only) gives a "not available" row with the reason: not a failure."""
    monkeypatch.setattr(st, "detect_arch", lambda: ("sm_90a", "fake H200"))

    def runner(case, device):
        if case:
            raise st.CaseNotAvailable("tile_m=64 is not implemented")
        return 1e-3, True, "fine"
    _only(monkeypatch, "grouped_gemm_wgrad", [("tile 128", {}), ("tile 64", {"x": 1})], runner)
    rows = st.run_family("grouped_gemm_wgrad")
    assert [r.status for r in rows] == ["pass", "not available"] and rows[1].detail == "tile_m=64 is not implemented"
    r = CliRunner().invoke(main, ["selftest"])
    assert r.exit_code == 0 and re.search(r"\b0 failed, 1 not available", r.output), r.output


def test_grouped_gemm_cases_logic_on_cpu(monkeypatch):
    """The selftest's problem -> tensors -> compare path, with the reference standing in for
    the GPU op (so a broken conversion or tolerance is caught without a GPU)."""
    torch = pytest.importorskip("torch")
    import numpy as np

    from fusegemm import reference
    from fusegemm import presets as op

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

    class FakeEpilogueGemm:
        """The N-major case's op: checks what the case hands it (spec, b_major, an (L, N, K)
        view with N contiguous, the seed's alpha and prob) and answers with the reference."""

        def __init__(self, spec, device=0, **axes):
            assert spec == "grouped_gemm" and axes["b_major"] == "n", (spec, axes)
            assert set(axes) <= {"b_major", "d_dtype", "tile_m", "cluster_m"}, axes
            seen_axes.append(axes)
            self.d_dtype = axes["d_dtype"]

        def __call__(self, a, off, b, *, inputs):
            assert b.stride(1) == 1 and b.stride(2) == b.shape[1], b.stride()   # N contiguous, in place
            assert set(inputs) == {"alpha", "prob"}
            canonical = b.contiguous()     # (L, N, K) values of the N-major view
            res = fake_op(a_tensor=a, padded_offsets=off, alpha_tensor=inputs["alpha"], b_tensor=canonical,
                          prob_tensor=inputs["prob"])
            return {"d": res["d_tensor"]}
    from fusegemm.ops import epilogue_gemm
    monkeypatch.setattr(epilogue_gemm, "EpilogueGemm", FakeEpilogueGemm)
    seen_axes = []
    labels = [label for label, _ in st._grouped_gemm_cases()]
    assert any(case.get("b_major") == "n" for _, case in st._grouped_gemm_cases()), labels
    for label, case in st._grouped_gemm_cases():
        if case.get("discrete"):
            continue
        err, ok, detail = st._run_grouped_gemm(case, device="cpu")
        assert ok, (label, err)
    assert {"tile_m": 128, "cluster_m": 1}.items() <= seen_axes[-1].items()   # the 1-CTA N-major case


@pytest.mark.parametrize("family", ["grouped_gemm_srelu", "grouped_gemm_quant", "grouped_gemm_dswiglu", "gemm_amax"])
def test_block_scaled_cases_logic_on_cpu(monkeypatch, family):
    """Each block-scaled case's problem -> tensors -> compare path, with the reference standing in
    for the GPU op on CPU tensors: conversions and the comparison rules are checked without a GPU."""
    torch = pytest.importorskip("torch")

    from fusegemm import reference
    from fusegemm.ops import scaled_seeds

    def host(t):
        if not isinstance(t, torch.Tensor):
            return t
        if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e8m0fnu):
            import ml_dtypes
            return t.view(torch.uint8).numpy().view(getattr(ml_dtypes, str(t.dtype).split(".")[1]))
        if t.dtype == torch.bfloat16:
            import ml_dtypes
            return t.view(torch.uint16).numpy().view(ml_dtypes.bfloat16)
        return t.numpy()

    def fake(**kw):
        if "b_ptrs" in kw:   # pointer tables are device-only: stand in with the lists
            pytest.skip("discrete pointers are device-only")
        return getattr(reference, family)(**{k: host(v) for k, v in kw.items()})
    monkeypatch.setattr(scaled_seeds, family, fake)   # the wrapper selftest calls
    for label, case in st.RUNNERS[family]():
        if case.get("discrete") or "spec" in case:   # spec cases: the next test
            continue
        err, ok, detail = st._run_scaled(family, case, "cpu")
        assert ok and err == 0.0, (label, detail)


def test_spec_cases_cover_every_spec_authored_epilogue_and_can_fail(monkeypatch):
    """Every packaged spec of an M-grouped kernel but the seeds' has a selftest case in its kernel
    family (so a new spec appears in `fusegemm selftest` and the first-run gate with nothing else
    to write); the case's problem -> inputs -> compare path runs on the CPU with the interpreter
    standing in for the kernel, BF16 and block-scaled operands alike, and a wrong output fails it."""
    torch = pytest.importorskip("torch")
    from fusegemm.generator.spec import list_specs, load_spec
    from fusegemm.ops.engine import Op, kernel_class
    specs = [load_spec(p) for p in list_specs()]
    names = {s.name for s in specs if kernel_class(s.kernel) in ("grouped", "scaled") and s.name != s.kernel}
    cases = [(fam, case) for fam in st.RUNNERS for _, case in st.RUNNERS[fam]() if "spec" in case]
    assert {c["spec"] for _, c in cases} == names and {"grouped_gemm_glu", "grouped_gemm_dglu",
                                                       "grouped_gemm_dsrelu", "grouped_gemm_glu_mx"} <= names
    assert all(fam == load_spec(next(p for p in list_specs() if load_spec(p).name == c["spec"])).kernel
               for fam, c in cases)
    monkeypatch.setattr("fusegemm.ops.device.device_arch", lambda d: "sm_90a")
    bump = {"on": False}

    def fake_call(self, *operands, inputs=None, **kw):
        import ml_dtypes

        def host(t):
            name = str(t.dtype).split(".")[1]
            if t.dtype.itemsize <= 2 and name in ("bfloat16", "float8_e4m3fn", "float8_e8m0fnu"):
                raw = torch.uint16 if t.dtype.itemsize == 2 else torch.uint8
                return t.view(raw).numpy().view(getattr(ml_dtypes, name))
            return t.numpy()
        ref = self.reference(*map(host, operands), inputs={k: host(v) for k, v in (inputs or {}).items()})
        out = {k: torch.from_numpy(np.array(v)) for k, v in ref.out_values.items()}
        if bump["on"]:
            k0 = next(iter(out))
            out[k0] = out[k0] * 1.5 + 1
        return out
    monkeypatch.setattr(Op, "__call__", fake_call)
    for fam, case in cases:
        err, ok, detail = st.CASE_RUNNERS[fam](case, "cpu")
        assert ok, (case, detail)
    bump["on"] = True
    for fam, case in (cases[0], cases[-1]):
        err, ok, detail = st.CASE_RUNNERS[fam](case, "cpu")
        assert not ok
