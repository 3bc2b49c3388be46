"""The JAX VJP of ``fusegemm.jax_ffi.grouped_gemm`` on the CPU (where JAX is installed): its
formula (``_grouped_gemm_vjp``) with the GPU primitives it calls (this op for the data gradient
and the products, the K-grouped kernel for the weight gradient) replaced by plain ``jnp``, against
``jax.vjp`` of seed 001's formula in float64; both weight-gradient paths (the kernel's and the
per-expert masked matmuls). Skipped where JAX is not installed (CI); tests/gpu/test_jax_grad_gpu.py
runs the real op under ``jax.jit``."""
from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
fj = pytest.importorskip("fusegemm.jax_ffi")


@pytest.fixture
def x64():
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", False)


def _rows(offsets, m):
    return jnp.searchsorted(offsets, jnp.arange(m, dtype=offsets.dtype), side="right")


def _seed_001(a, offsets, alpha, b, prob, bias):
    """(d, c) with rows past the last expert 0; b (L, N, K), bias (L, N), prob (M,)."""
    rows = _rows(offsets, a.shape[0])
    e = jnp.minimum(rows, alpha.shape[0] - 1)
    valid = (rows < alpha.shape[0])[:, None]
    g = alpha[e][:, None] * jnp.einsum("mk,mnk->mn", a, b[e])
    p = prob[:, None] if prob is not None else 1.0
    c = g + p * bias[e] if bias is not None else g
    d = c if bias is not None else p * g
    return jnp.where(valid, d, 0), jnp.where(valid, c, 0)


@pytest.fixture
def jnp_primitives(monkeypatch):
    def grouped_gemm(a, offsets, alpha, b, *, prob=None, bias=None, d_dtype=None, c_dtype=None, generate_c=False):
        return _seed_001(a, offsets, alpha, b, prob, bias)[0]

    def wgrad(u, a, offsets):
        rows = _rows(offsets, u.shape[0])
        return {"d": jnp.stack([jnp.where((rows == e)[:, None], u, 0).T @ a for e in range(len(offsets))])}
    monkeypatch.setattr(fj, "grouped_gemm", grouped_gemm)
    monkeypatch.setattr(fj, "_wgrad_op", lambda: wgrad)
    import fusegemm.ops.device as device
    monkeypatch.setattr(device, "device_arch", lambda index: "sm_90a")
    return monkeypatch


@pytest.mark.parametrize("kernel", [True, False])
@pytest.mark.parametrize("with_bias,with_prob", [(False, False), (False, True), (True, True), (True, False)])
def test_vjp_matches_jax_vjp_of_the_seed_formula(x64, jnp_primitives, kernel, with_bias, with_prob):
    import fusegemm.ops.kgrouped as kg
    jnp_primitives.setattr(kg, "wgrad_fits", lambda n, k, m, arch: kernel)
    rng = np.random.default_rng(4)
    m, k, n = 24, 5, 7
    offsets = jnp.asarray([8, 8, 20], jnp.int32)             # ragged, an empty expert, 4 rows past
    a = jnp.asarray(rng.standard_normal((m, k)))
    alpha = jnp.asarray(rng.random(3) + 0.5)
    b = jnp.asarray(rng.standard_normal((3, n, k)))
    prob = jnp.asarray(rng.random(m)) if with_prob else None
    bias = jnp.asarray(rng.standard_normal((3, n))) if with_bias else None
    gd, gc = jnp.asarray(rng.standard_normal((m, n))), jnp.asarray(rng.standard_normal((m, n)))
    gd, gc = gd.at[20:].set(0), gc.at[20:].set(0)            # the op's rows past the end are unspecified

    def f(a, alpha, b, prob, bias):
        return _seed_001(a, offsets, alpha, b, prob, bias)
    _, vjp = jax.vjp(f, a, alpha, b, prob, bias)
    want = dict(zip(("a", "alpha", "b", "prob", "bias"), vjp((gd, gc))))
    got = dict(zip(("a", "offsets", "alpha", "b", "prob", "bias"),
                   fj._grouped_gemm_vjp((a, offsets, alpha, b, prob, bias), gd, gc)))
    assert got["offsets"] is None
    for name in ("a", "alpha", "b", "prob", "bias"):
        if want[name] is None:
            assert got[name] is None, name
            continue
        np.testing.assert_allclose(np.asarray(got[name]), np.asarray(want[name]), rtol=1e-12, atol=1e-12,
                                   err_msg=name)
