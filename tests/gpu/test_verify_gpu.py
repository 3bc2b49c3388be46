"""The first-run gate on a real device (fusegemm/verify.py), exercised on the H200 by pretending
sm_90a is an arch the project has not executed on: the selftest cases run on the device before
the first launch, a pass is recorded, a failing case refuses the launch."""
from __future__ import annotations

import dataclasses
import json

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu


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
    """The device's arch marked unexecuted, a fresh gate and op cache."""
    from fusegemm import verify
    from fusegemm.base import archs
    from fusegemm.ops import grouped_gemm as op
    from fusegemm.ops.device import device_arch
    arch = device_arch(0)
    monkeypatch.setitem(archs.ARCHS, arch, dataclasses.replace(archs.ARCHS[arch], executed=False))
    monkeypatch.setattr(verify, "_verified", set())
    monkeypatch.setattr(op, "_OPS", None)
    return arch


def _problem():
    g = torch.Generator(device="cuda").manual_seed(3)
    a = (torch.rand((512, 128), generator=g, device="cuda") - 0.5).to(torch.bfloat16).unsqueeze(-1)
    b = (torch.rand((2, 256, 128), generator=g, device="cuda") - 0.5).to(torch.bfloat16).permute(1, 2, 0)
    offsets = torch.tensor([256, 512], dtype=torch.int32, device="cuda")
    alpha = torch.ones(2, device="cuda")
    return a, b, offsets, alpha


def test_first_launch_runs_the_selftest_and_records_it(unexecuted_arch, cache_dir):
    import fusegemm
    from fusegemm import selftest
    calls = []
    real = selftest.run_family

    def counted(family, device=0):
        rows = real(family, device)
        calls.append([r.status for r in rows])
        return rows
    selftest.run_family = counted
    try:
        a, b, offsets, alpha = _problem()
        out = fusegemm.grouped_gemm(a, offsets, alpha, b)["d_tensor"]
        torch.cuda.synchronize()
        ref = (a[:, :, 0].float() @ b[:, :, 0].float().t()).to(torch.bfloat16)[:256]
        assert torch.allclose(out[:256, :, 0].float(), ref.float(), rtol=2**-7, atol=1e-2)
        fusegemm.grouped_gemm(a, offsets, alpha, b)   # the second call does not check again
    finally:
        selftest.run_family = real
    assert len(calls) == 1 and calls[0] and all(s == "pass" for s in calls[0]), calls
    record = json.loads((cache_dir / "verified" / f"grouped_gemm.{unexecuted_arch}.json").read_text())
    assert record["cases"] == len(calls[0]) and record["arch"] == unexecuted_arch


def test_a_failing_case_refuses_the_launch(unexecuted_arch, monkeypatch, cache_dir):
    from fusegemm import selftest
    from fusegemm.base.errors import UnverifiedError
    from fusegemm.ops.grouped_gemm import GroupedGemm
    # A planted defect in what the cases compare: every case now "fails".
    monkeypatch.setattr(selftest, "_compare", lambda got, ref, scale, dtype: (1.0, False))
    a, b, offsets, alpha = _problem()
    d = torch.empty(512, 256, 1, dtype=torch.bfloat16, device="cuda")
    op = GroupedGemm(a, None, d, offsets, alpha, b, None, None)
    # Every case compared through _compare fails: the grouped GEMM's own (counted where they are
    # declared); the spec cases compare through output_compare and still pass.
    n = len(selftest._grouped_gemm_cases())
    total = len(selftest.RUNNERS["grouped_gemm"]())
    with pytest.raises(UnverifiedError, match=r"grouped_gemm failed its first-run verification on "
                                              rf"sm_\w+ \(device 0, .*\): {n} of {total} selftest cases failed"):
        op.compile()
    assert op._launcher is None
    assert not (cache_dir / "verified").exists()
