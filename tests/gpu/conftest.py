"""GPU test gate: every test marked ``gpu`` is skipped, with the reason, when no usable GPU
is present (torch missing, no CUDA device, or an architecture without a fusegemm kernel).
Nothing here touches CUDA unless torch reports a device."""
from __future__ import annotations

import functools
import os

import pytest

# JAX takes 75% of the GPU at its first use unless told not to: the tests share it with torch
# (and with the other xdist workers).
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

# Tests append their error and timing records under $FUSEGEMM_TEST_OUT when it is set: a fresh
# machine has no such folder yet, and a record must never fail the test it describes.
if os.environ.get("FUSEGEMM_TEST_OUT"):
    os.makedirs(os.environ["FUSEGEMM_TEST_OUT"], exist_ok=True)


@functools.lru_cache(maxsize=1)
def gpu_skip_reason() -> str | None:
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        return "no CUDA GPU (torch.cuda.is_available() is False)"
    from fusegemm.base.archs import arch_of_capability, supported_capabilities
    cc = torch.cuda.get_device_capability(0)
    if arch_of_capability(*cc) is None:     # the arch table decides, as the ops do
        return f"GPU compute capability {cc[0]}.{cc[1]} has no fusegemm kernel (needs {supported_capabilities()})"
    return None


def pytest_collection_modifyitems(config, items):
    reason = None
    for item in items:
        if item.get_closest_marker("gpu") is None:
            continue
        if reason is None:
            reason = gpu_skip_reason() or ""
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))
