"""The first-run gate (fusegemm/verify.py): per configuration class, with the device mocked
(when it checks, what it records, when it refuses), and its watchdog with real child processes
standing in for the device (tests/unit/helpers/verify_runners.py: pass, hang, die, raise)."""
from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import pytest

from fusegemm import verify
from fusegemm.base.errors import UnverifiedError
from fusegemm.generator import registry
from fusegemm.generator.config_class import ConfigClass, config_class
from fusegemm.generator.spec import find_spec
from fusegemm.generator.variants import make_variant
from fusegemm.runtime import config
from fusegemm.selftest import Row

HELPERS = str(Path(__file__).parent / "helpers")


def variant(family="grouped_gemm", arch="sm_100a", **axes):
    return make_variant(find_spec(family), arch=arch, **axes)


@pytest.fixture
def gate(monkeypatch, cache_dir):
    """A fresh gate: no process memory, a private cache, a fake device and scripted checks."""
    monkeypatch.setattr(verify, "_verified", set())
    monkeypatch.setattr(verify, "device_name", lambda d: "Fake B200")
    monkeypatch.setattr(verify, "driver_version", lambda: 13000)
    runs = []
    state = {"rows": [Row("grouped_gemm", "case 1", "pass", 1e-3), Row("grouped_gemm", "case 2", "pass", 2e-3)],
             "problem": None}

    def check_class(cls, device, **kw):
        runs.append((cls, device))
        return state["rows"], state["problem"]
    monkeypatch.setattr(verify, "check_class", check_class)
    return runs, state


def test_a_class_is_what_changes_the_kernels_paths():
    v = variant()                                          # sm_100a default: 256x256, cluster 2x1
    cls = config_class(v, 2)
    assert cls == config_class(v)                          # 2 CTAs: the sm_100a 256-row tile's
    assert cls.slug == "t256x256.c2x1.cta2.static.kk.bf16.dense"
    assert cls.describe() == ("tile 256x256, cluster 2x1, 2 CTAs per tile, static scheduler, k-major A, k-major B, "
                              "bfloat16, dense weights")
    assert ConfigClass.from_json(json.loads(json.dumps(cls.to_json()))) == cls
    # What does not change the paths (the output dtypes, the bias) keeps the class; what does changes it.
    assert config_class(variant(d_dtype="float32", bias_dtype="bfloat16")) == cls
    for other in ({"weight_mode": "discrete"}, {"b_major": "n"}, {"cluster_m": 4}, {"tile_n": 128},
                  {"scheduler": "dynamic", "tile_m": 128, "cluster_m": 1}):
        assert config_class(variant(**other)) != cls, other
    scaled = config_class(variant("grouped_gemm_srelu", "sm_90a", sf_vec_size=128, sf_dtype="float32"))
    assert scaled.kind == "scaled" and scaled.slug.endswith(".e4m3-f32x128.dense")
    # The pinned axes rebuild the class.
    spec = find_spec("grouped_gemm")
    pin = {k: x for k, x in cls.axes().items() if k in spec.choice_map}
    assert config_class(make_variant(spec, arch="sm_100a", **pin)) == cls


def test_every_class_is_enumerated_with_cases_for_each_cta():
    """fusegemm selftest --all-configs covers what the per-family gate never ran: 2x2, 4x1 and 4x4
    clusters, 2-CTA tiles with cluster M 4 and with tile N 128; each class's cases give every CTA
    of its cluster tiles and end N and K in partial tiles."""
    from fusegemm import selftest
    classes = selftest.all_classes("sm_100a", ("grouped_gemm",))
    got = {(c.tile, c.cluster, c.ctas) for c in classes}
    for want in (((128, 256), (2, 2), 1), ((128, 256), (4, 1), 1), ((128, 256), (4, 4), 1),
                 ((256, 256), (4, 1), 2), ((256, 128), (2, 1), 2)):
        assert want in got, want
    assert all(c.ctas == (2 if c.tile[0] == 256 else 1) for c in classes)
    assert len(classes) == len(set(classes))
    for c in (x for x in classes if x.cluster == (4, 4)):
        for _, case in selftest.class_cases(c):
            rows = sum(-(-t // 256) * 256 for t in case["tokens"])
            assert rows // c.tile[0] >= c.cluster[0] // c.ctas and case["n"] > c.tile[1] * c.cluster[1] - 1
    sm90 = selftest.all_classes("sm_90a")
    assert {c.family for c in sm90} == {"grouped_gemm", "grouped_gemm_wgrad", "grouped_gemm_srelu",
                                        "grouped_gemm_quant", "grouped_gemm_dswiglu", "gemm_amax",
                                        "grouped_gemm_wgrad_fp8"}
    assert all(c.majors == ("k", "k") for c in sm90 if c.kind in ("scaled", "batched"))   # FP8 WGMMA: K-major
    assert any(c.recipe[2] == 128 for c in sm90) and any(c.scheduler == "dynamic" for c in sm90)


def test_executed_arch_is_not_checked(gate):
    runs, _ = gate
    verify.ensure_verified(variant(arch="sm_90a"), 0)
    assert runs == []


def test_a_family_not_yet_executed_is_gated_on_an_executed_arch(gate, monkeypatch):
    """A registry row marked executed=False (a family just added) is verified on first launch like a
    kernel of an unexecuted arch; its failure names the kernel and the configuration."""
    runs, state = gate
    key = ("kgrouped", "sm_90a")    # grouped_gemm_wgrad's kernel class
    monkeypatch.setitem(registry._BY_CLASS, key, dataclasses.replace(registry._BY_CLASS[key], executed=False))
    state["rows"] = [Row("grouped_gemm_wgrad", "case 1", "FAIL", 1.0)]
    with pytest.raises(UnverifiedError, match=r"not executed its grouped_gemm_wgrad kernel on sm_90a hardware"):
        verify.ensure_verified(variant("grouped_gemm_wgrad", "sm_90a"), 0)
    assert runs and runs[0][0].family == "grouped_gemm_wgrad"


def test_each_class_is_checked_once_and_recorded(gate, cache_dir):
    runs, _ = gate
    v = variant()
    verify.ensure_verified(v, 0, 2)
    verify.ensure_verified(v, 0, 2)                           # same process: remembered
    verify.ensure_verified(variant(d_dtype="float32"), 0, 2)  # another variant of the class
    assert len(runs) == 1
    record = cache_dir / "verified" / "grouped_gemm.sm_100a.t256x256.c2x1.cta2.static.kk.bf16.dense.json"
    data = json.loads(record.read_text())
    assert data["device"] == "Fake B200" and data["cases"] == 2 and data["driver"] == 13000
    verify.ensure_verified(variant(cluster_m=4), 0, 2)        # another class: checked too
    assert len(runs) == 2 and runs[1][0].cluster == (4, 1)
    verify._verified.clear()                                   # a new process reads the records
    verify.ensure_verified(v, 0, 2)
    assert len(runs) == 2
    for stale in ({"fusegemm": "0.0.0"}, {"driver": 12080}, {"device": "Other B200"}):
        record.write_text(json.dumps({**data, **stale}))     # made for other kernels, driver or device
        verify._verified.clear()
        verify.ensure_verified(v, 0, 2)
    assert len(runs) == 5


def test_failure_names_the_configuration_refuses_and_records_nothing(gate, cache_dir):
    runs, state = gate
    state["rows"] = [Row("grouped_gemm", "dense, ragged", "pass", 1e-3),
                     Row("grouped_gemm", "discrete weights", "FAIL", 3.5, detail="max error 3.5")]
    with pytest.raises(UnverifiedError, match=r"(?s)^grouped_gemm failed its first-run verification on sm_100a "
                                              r"\(device 0, Fake B200\), configuration tile 256x256, cluster 2x1, 2 "
                                              r"CTAs per tile, .*: 1 of 2 verification cases failed\n"
                                              r"  discrete weights: FAIL max error 3.5\n.*FUSEGEMM_TRUST_UNVERIFIED=1"):
        verify.ensure_verified(variant(), 0, 2)
    assert not list((cache_dir / "verified").glob("*.json")) if (cache_dir / "verified").exists() else True
    with pytest.raises(UnverifiedError):                       # refused again: it ran again
        verify.ensure_verified(variant(), 0, 2)
    assert len(runs) == 2
    state["rows"], state["problem"] = [], "the cases did not finish within 30 s of running on the device: a hang"
    with pytest.raises(UnverifiedError, match=r"configuration tile 256x256.*: the cases did not finish within 30 s"):
        verify.ensure_verified(variant(), 0, 2)


def test_no_cases_or_none_run_is_not_a_pass(gate):
    _, state = gate
    state["rows"] = []
    with pytest.raises(UnverifiedError, match=r"0 of 0 verification cases failed\n  \(no cases\)"):
        verify.ensure_verified(variant("gemm_amax"), 0, 2)
    state["rows"] = [Row("grouped_gemm", "tile 64x128", "not available", detail="tile_m=64 is not implemented")]
    with pytest.raises(UnverifiedError, match=r"0 of 1 verification cases failed\n  tile 64x128: not available"):
        verify.ensure_verified(variant(), 0, 2)


def test_trust_unverified_skips(gate):
    runs, _ = gate
    with config.override(FUSEGEMM_TRUST_UNVERIFIED="1"):
        verify.ensure_verified(variant(), 0, 2)
    assert runs == []


def test_the_verify_timeout_setting_is_checked():
    assert config.verify_timeout() == 30.0
    with config.override(FUSEGEMM_VERIFY_TIMEOUT="2.5"):
        assert config.verify_timeout() == 2.5
    for bad in ("0", "-1", "inf", "soon"):
        with config.override(FUSEGEMM_VERIFY_TIMEOUT=bad), pytest.raises(Exception, match="FUSEGEMM_VERIFY_TIMEOUT"):
            config.verify_timeout()


# ---------------------------------------------------------------- the watchdog (real child processes)
CLS = config_class(variant(), 2)


def test_watchdog_returns_the_childs_rows():
    rows, problem = verify.check_class(CLS, 3, runner="verify_runners:passing", path=(HELPERS,))
    assert problem is None and [(r.case, r.status, r.detail) for r in rows] == [
        (f"{CLS.slug}: case", "pass", "device 3")]


def test_watchdog_bounds_the_run_not_the_build():
    rows, problem = verify.check_class(CLS, 0, timeout=1.0, runner="verify_runners:slow_build", path=(HELPERS,))
    assert problem is None and rows[0].status == "pass"


def test_watchdog_stops_a_hang_within_its_limit(tmp_path, monkeypatch):
    """A hang becomes a verdict after the limit; the child and what it started (its process group)
    are gone."""
    pidfile = tmp_path / "pid"
    monkeypatch.setenv("VERIFY_TEST_PIDFILE", str(pidfile))
    t0 = time.monotonic()
    rows, problem = verify.check_class(CLS, 0, timeout=1.0, runner="verify_runners:hanging", path=(HELPERS,))
    took = time.monotonic() - t0
    assert rows == [] and problem.startswith("the cases did not finish within 1 s of running on the device: a hang")
    assert "this process and its CUDA context are unaffected" in problem
    assert took < 20, took
    for pid in map(int, pidfile.read_text().split()):   # the child, and what it started
        assert _gone(pid), pid


def _gone(pid: int, wait: float = 5.0) -> bool:
    """The process has ended: no such pid, or a zombie (killed; an orphan is reaped by whatever
    adopts it, which a container's init may do late)."""
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state == "Z":
            return True
        time.sleep(0.05)
    return False


def test_watchdog_reports_a_dead_child_with_what_it_printed():
    rows, problem = verify.check_class(CLS, 0, runner="verify_runners:dying", path=(HELPERS,))
    assert rows == [] and problem.startswith("the verification process died while running the cases (exit status 134")
    assert "an illegal memory access" in problem
    rows, problem = verify.check_class(CLS, 0, runner="verify_runners:raising", path=(HELPERS,))
    assert "while building" in problem and "RuntimeError: the kernel could not be loaded" in problem


def test_watchdog_waits_for_the_childs_last_words(monkeypatch):
    """The child's stdout closing does not mean its stderr was read: a slow stderr reader (CI's
    loaded machine once lost the device fault's message this way) still gets the message reported."""
    read_tail = verify._read_tail

    def slow_reader(stream, tail):
        time.sleep(1.0)
        read_tail(stream, tail)
    monkeypatch.setattr(verify, "_read_tail", slow_reader)
    rows, problem = verify.check_class(CLS, 0, runner="verify_runners:dying", path=(HELPERS,))
    assert "an illegal memory access" in problem


def test_the_gate_refuses_what_the_watchdog_reports(monkeypatch, cache_dir):
    """End to end through a real child: failing cases refuse the launch with the child's rows."""
    monkeypatch.setattr(verify, "_verified", set())
    monkeypatch.setattr(verify, "device_name", lambda d: "Fake B200")
    monkeypatch.setattr(verify, "RUNNER", "verify_runners:failing")
    monkeypatch.setattr(verify, "RUNNER_PATH", (HELPERS,))
    with pytest.raises(UnverifiedError, match=r"(?s)1 of 2 verification cases failed\n  discrete: FAIL max error 3.5"):
        verify.ensure_verified(variant(), 0, 2)
    monkeypatch.setattr(verify, "RUNNER", "verify_runners:passing")
    verify.ensure_verified(variant(), 0, 2)
    assert len(verify.passes()) == 1 and verify.passes()[0]["class"] == CLS.slug


def test_op_compile_runs_the_gate_before_loading(gate, monkeypatch, session_cache):
    """GroupedGemm.compile() on an unexecuted arch: the gate runs after the kernel is built (with
    the contract's CTAs per tile) and before it is loaded; a failing gate leaves nothing loaded."""
    torch = pytest.importorskip("torch")
    from fusegemm import pipeline
    from fusegemm.ops import arg_checks as checks
    from fusegemm.presets import GroupedGemm
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
    assert op.op._launcher is None and len(runs) == 1 and runs[0][1] == 0    # CPU samples: the default device
    assert runs[0][0].ctas == 2 and runs[0][0].tile == (256, 256)


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
    hooks.FIRST_LAUNCH(variant(), 0, 2)                        # what the launcher calls
    assert [(r[0].family, r[1]) for r in runs] == [("grouped_gemm", 0)]


def test_an_empty_gate_refuses_the_launch(monkeypatch):
    """Fails closed: with nothing installed, no kernel launches unverified."""
    from fusegemm.base import hooks
    from fusegemm.base.errors import FusegemmError
    monkeypatch.setattr(hooks.FIRST_LAUNCH, "_fn", None)
    with pytest.raises(FusegemmError, match=r"^fusegemm: nothing is installed for the first-run verification hook"):
        hooks.FIRST_LAUNCH(variant(arch="sm_90a"), 0, 1)


def test_the_child_sees_this_process_configuration(tmp_path):
    """An override in this process (a private kernel cache) reaches the child, which passes its own
    gate (it is the check)."""
    with config.override(FUSEGEMM_CACHE_DIR=str(tmp_path / "c")):
        rows, problem = verify.check_class(CLS, 0, runner="verify_runners:config_echo", path=(HELPERS,))
    assert problem is None and rows[0].detail == f"{tmp_path / 'c'} True"


def test_selftest_all_configs_options_are_checked():
    from click.testing import CliRunner

    from fusegemm.cli import main
    r = CliRunner().invoke(main, ["selftest", "--family", "grouped_gemm"])
    assert r.exit_code == 2 and "--family, --jobs and --timeout go with --all-configs" in r.output
    r = CliRunner().invoke(main, ["selftest", "--all-configs", "--family", "nope"])
    assert r.exit_code == 2 and "got 'nope'; allowed: grouped_gemm" in r.output
    r = CliRunner().invoke(main, ["selftest", "--all-configs", "--jobs", "0"])
    assert r.exit_code == 2 and "--jobs" in r.output


def _seed_variant(cls, case, arch):
    """The variant the block-scaled seed wrapper runs for a seed case (fusegemm/selftest.py
    ``_run_scaled``): its row's axes resolved from the problem's arguments."""
    from fusegemm import presets, problems
    from fusegemm.ops.hows import resolve
    opts = {k: v for k, v in case.items() if k not in ("run", "call")}
    if cls.kind == "batched":
        pb = problems.make_batched_problem(values="integer", seed=7, **opts)
    else:
        tokens = opts.pop("tokens")
        pb = problems.make_grouped_problem(cls.family, num_experts=len(tokens), tokens=tokens, seed=7,
                                           values="integer", **opts)
    row = presets.BY_NAME[cls.family]
    bound = {k: p.default for k, p in row.signature().parameters.items()}
    bound.update(pb.kwargs(**case["call"]))
    if "b_list" in bound:
        bound["b_ptrs"], bound["sfb_ptrs"] = bound.pop("b_list"), bound.pop("sfb_list")
    return make_variant(find_spec(row.spec), arch=arch, **resolve(row, bound))


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_each_class_case_builds_a_variant_of_its_class(arch):
    """The cases pin their class: the variant a spec case builds (its float output choices added)
    is of the class it verifies, and the arch's kernel implements it."""
    from fusegemm import selftest
    for cls in selftest.all_classes(arch):
        for label, case in selftest.class_cases(cls):
            assert case["run"] in ("spec", "seed", "wgrad", "wgrad_fp8"), label
            if case["run"] == "seed":   # the seed wrapper resolves the class from the problem and options
                assert cls.kind == "batched" or cls.recipe[0] == "float4_e2m1fn_x2", (cls, label)
                assert config_class(_seed_variant(cls, case, arch)) == cls, (cls, label)
                continue
            spec = find_spec(cls.family)
            v = make_variant(spec, arch=arch, **case["axes"])
            registry.resolve(cls.family, arch, v.choices)
            assert config_class(v) == cls, (cls, label)
            # The case finds output formats the spec allows with its operands (selftest._with_outputs).
            from fusegemm.base.errors import UnsupportedError
            ds = [d for d in selftest._OUTPUTS if d in spec.choice_map.get("d_dtype", ())] or [None]
            cs = [c for c in selftest._OUTPUTS if c in spec.choice_map.get("c_dtype", ())] or [None]
            found = []
            for d in ds:
                for c in cs:
                    outs = {k: x for k, x in (("d_dtype", d), ("c_dtype", c)) if x is not None}
                    try:
                        w = make_variant(spec, arch=arch, **{**outs, **case["axes"]})
                        registry.resolve(cls.family, arch, w.choices)
                        found.append(w)
                    except UnsupportedError:
                        pass
            assert found and config_class(found[0]) == cls, (cls, label)


def test_all_configs_runs_every_class_and_a_class_without_a_passing_case_fails(monkeypatch, cache_dir):
    from fusegemm import selftest
    monkeypatch.setattr(verify, "RUNNER_PATH", (HELPERS,))
    monkeypatch.setattr(verify, "RUNNER", "verify_runners:passing")
    lines = []
    classes = selftest.all_classes("sm_90a", ("grouped_gemm_wgrad",))
    rows = verify.run_all_configs("sm_90a", 0, families=("grouped_gemm_wgrad",), jobs=4, progress=lines.append)
    assert [r.case for r in rows] == [f"{c.slug}: case" for c in classes] and all(r.status == "pass" for r in rows)
    assert lines[0].startswith(f"[1/{len(classes)}] grouped_gemm_wgrad t") and lines[0].endswith(": pass")
    assert not (cache_dir / "verified").exists()          # an executed kernel's classes record nothing
    monkeypatch.setattr(verify, "RUNNER", "verify_runners:unavailable")
    rows = verify.run_all_configs("sm_90a", 0, families=("grouped_gemm_wgrad",), jobs=4, progress=lines.append)
    fails = [r for r in rows if r.status == "FAIL"]
    assert len(fails) == len(classes) and fails[0].detail.startswith("no case ran")
    assert lines[-1].endswith(": FAIL")


def test_all_configs_records_passes_as_the_gate_does(monkeypatch, cache_dir):
    """A passing class of a kernel fusegemm has not executed is recorded, except in a read-only
    cache (where the gate's passes last the process too)."""
    monkeypatch.setattr(verify, "RUNNER_PATH", (HELPERS,))
    monkeypatch.setattr(verify, "RUNNER", "verify_runners:passing")
    monkeypatch.setattr(verify, "device_name", lambda d: "Fake H200")
    key = ("kgrouped", "sm_90a")    # grouped_gemm_wgrad's kernel class
    monkeypatch.setitem(registry._BY_CLASS, key, dataclasses.replace(registry._BY_CLASS[key], executed=False))
    from fusegemm.runtime.cache import default_cache
    with config.override(FUSEGEMM_CACHE_READONLY="1"):
        assert default_cache().readonly
        verify.run_all_configs("sm_90a", 0, families=("grouped_gemm_wgrad",), jobs=4)
    assert not (cache_dir / "verified").exists()
    verify.run_all_configs("sm_90a", 0, families=("grouped_gemm_wgrad",), jobs=4)
    from fusegemm import selftest
    assert len(verify.passes()) == len(selftest.all_classes("sm_90a", ("grouped_gemm_wgrad",)))
