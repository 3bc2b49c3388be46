"""The first-run gate on a real device (fusegemm/verify.py), exercised on the H200 by pretending
sm_90a is an arch the project has not executed on: a configuration class's cases run on the device
in a child process before the first launch of that class, a pass is recorded per class; failing
cases, a planted kernel that hangs and one that faults each refuse the launch within the
watchdog's limit, and this process and its CUDA context stay usable."""
from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu
PLANTS = str(Path(__file__).parent / "helpers")


@pytest.fixture(scope="module")
def kernel_cache(tmp_path_factory):
    """One private kernel cache for this module (the cases' kernels compile once)."""
    return tmp_path_factory.mktemp("verify-cache")


@pytest.fixture
def cache_dir(kernel_cache):
    """The module's cache with no verification record in it."""
    import shutil

    from fusegemm.runtime import config
    shutil.rmtree(kernel_cache / "verified", ignore_errors=True)
    with config.override(FUSEGEMM_CACHE_DIR=str(kernel_cache), FUSEGEMM_DISABLE_DISK_CACHE="0"):
        yield kernel_cache


@pytest.fixture
def unexecuted_arch(monkeypatch, cache_dir):
    """The device's arch marked unexecuted, a fresh gate and op cache; the checks counted."""
    from fusegemm import verify
    from fusegemm.base import archs
    from fusegemm.ops import faces
    from fusegemm.ops import scaled_seeds as op
    from fusegemm.ops.device import device_arch
    arch = device_arch(0)
    monkeypatch.setitem(archs.ARCHS, arch, dataclasses.replace(archs.ARCHS[arch], executed=False))
    monkeypatch.setattr(verify, "_verified", set())
    monkeypatch.setattr(op, "_OPS", type(op._OPS)())
    monkeypatch.setattr(faces, "_RESOLVED", {})
    monkeypatch.setattr(verify, "RUNNER_PATH", (PLANTS,))
    checks = []
    real = verify.check_class

    def counted(cls, device, **kw):
        t0 = time.monotonic()
        rows, problem = real(cls, device, **kw)
        checks.append((cls, rows, problem, time.monotonic() - t0))
        return rows, problem
    monkeypatch.setattr(verify, "check_class", counted)
    return arch, checks


def _problem():
    g = torch.Generator(device="cuda").manual_seed(3)
    a = (torch.rand((512, 128), generator=g, device="cuda") - 0.5).to(torch.bfloat16).unsqueeze(-1)
    b = (torch.rand((2, 256, 128), generator=g, device="cuda") - 0.5).to(torch.bfloat16).permute(1, 2, 0)
    offsets = torch.tensor([256, 512], dtype=torch.int32, device="cuda")
    alpha = torch.ones(2, device="cuda")
    return a, b, offsets, alpha


def _check_result(fn):
    a, b, offsets, alpha = _problem()
    out = fn(a, offsets, alpha, b)["d_tensor"]
    torch.cuda.synchronize()
    ref = (a[:, :, 0].float() @ b[:, :, 0].float().t()).to(torch.bfloat16)[:256]
    assert torch.allclose(out[:256, :, 0].float(), ref.float(), rtol=2**-7, atol=1e-2)


def test_first_launch_verifies_its_class_in_a_child_and_records_it(unexecuted_arch, cache_dir):
    import fusegemm
    arch, checks = unexecuted_arch
    _check_result(fusegemm.grouped_gemm)
    _check_result(fusegemm.grouped_gemm)                 # the same class: not checked again
    assert len(checks) == 1
    cls, rows, problem, took = checks[0]
    assert problem is None and rows and all(r.status == "pass" for r in rows), rows
    record = json.loads((cache_dir / "verified" / f"grouped_gemm.{arch}.{cls.slug}.json").read_text())
    assert record["cases"] == len(rows) and record["class"] == cls.slug and record["driver"] > 0
    # Another class of the family (tile 64x256, ping-pong on sm_90a) is checked on its first launch.
    _check_result(lambda a, off, alpha, b: fusegemm.grouped_gemm(a, off, alpha, b, mma_tiler_mn=(64, 256)))
    assert len(checks) == 2 and checks[1][0].tile == (64, 256) and checks[1][2] is None


@pytest.mark.parametrize("plant,says", [
    ("wrong", r"2 of 2 verification cases failed"),
    ("hang", r"the cases did not finish within 5 s of running on the device: a hang"),
    ("fault", r"the verification process died while running the cases .*ILLEGAL_ADDRESS"),
])
def test_a_planted_defect_refuses_the_launch_and_leaves_this_process_usable(unexecuted_arch, monkeypatch,
                                                                            cache_dir, plant, says):
    import fusegemm
    from fusegemm import verify
    from fusegemm.base.errors import UnverifiedError
    from fusegemm.runtime import config
    _, checks = unexecuted_arch
    monkeypatch.setattr(verify, "RUNNER", f"verify_plants:{plant}")
    a, b, offsets, alpha = _problem()
    with config.override(FUSEGEMM_VERIFY_TIMEOUT="5"), pytest.raises(UnverifiedError, match=says):
        fusegemm.grouped_gemm(a, offsets, alpha, b)
    took = checks[-1][3]
    assert took < 120, took                             # building the cases, then at most 5 s of running
    assert not list((cache_dir / "verified").glob("*.json")) if (cache_dir / "verified").exists() else True
    # This process and its CUDA context: unaffected (a torch kernel, then fusegemm trusted).
    x = torch.ones(64, 64, device="cuda")
    assert float((x @ x).sum()) == 64.0 ** 3
    with config.override(FUSEGEMM_TRUST_UNVERIFIED="1"):
        _check_result(fusegemm.grouped_gemm)


def test_all_configs_of_a_family_pass_under_the_watchdog(cache_dir):
    """fusegemm selftest --all-configs for the K-grouped family: every class on the device."""
    from fusegemm import selftest, verify
    from fusegemm.ops.device import device_arch
    arch = device_arch(0)
    classes = selftest.all_classes(arch, ("grouped_gemm_wgrad",))
    rows = verify.run_all_configs(arch, 0, families=("grouped_gemm_wgrad",), jobs=4)
    assert len(classes) >= 2
    assert rows and all(r.status == "pass" for r in rows), [(r.case, r.status, r.detail) for r in rows]
    assert len(rows) == sum(len(selftest.class_cases(c)) for c in classes)
