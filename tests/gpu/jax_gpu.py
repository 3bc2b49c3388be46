"""What the GPU tests that use JAX share: ``jax_on_gpu()`` returns the jax module, or skips the
test (with the reason) where JAX is missing or sees no GPU. tests/gpu/conftest.py turns JAX's
preallocation off for every test."""
from __future__ import annotations

import pytest


def jax_on_gpu():
    jax = pytest.importorskip("jax")
    if not any(d.platform == "gpu" for d in jax.devices()):
        pytest.skip(f"JAX {jax.__version__} sees no GPU ({jax.devices()})")
    return jax
