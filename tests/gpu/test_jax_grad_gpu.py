"""``jax.grad`` through ``fusegemm.jax_ffi.grouped_gemm`` (its ``jax.custom_vjp``) against
``jax.grad`` of the same loss on a plain ``jnp`` implementation of seed 001, inside ``jax.jit``:
with and without bias and prob, with C, on a shape the K-grouped weight-gradient kernel serves
(N = 256) and one it does not (N = 160: the einsum fallback).

Tolerance: relative Frobenius error <= 1e-2 per gradient (U is rounded to bfloat16 before the
two GEMMs, as in the torch op's backward; the reference runs in float32 on the same inputs)."""
from __future__ import annotations

import numpy as np
import pytest
from jax_gpu import jax_on_gpu

pytestmark = pytest.mark.gpu


def _plain(a, offsets, alpha, b, prob, bias):
    """Seed 001 in jnp (float32): per row, its expert's alpha, weights, bias; rows past the end 0."""
    import jax.numpy as jnp
    rows = jnp.searchsorted(offsets, jnp.arange(a.shape[0]), side="right")
    e = jnp.minimum(rows, alpha.shape[0] - 1)
    valid = (rows < alpha.shape[0])[:, None]
    g = alpha[e][:, None] * jnp.einsum("mk,mnk->mn", a.astype(jnp.float32), b.astype(jnp.float32)[e])
    p = prob[:, None] if prob is not None else 1.0
    if bias is not None:
        c = g + p * bias.astype(jnp.float32)[e]
        d = c
    else:
        c, d = g, p * g
    return jnp.where(valid, d, 0), jnp.where(valid, c, 0)


@pytest.mark.parametrize("n,with_bias,with_prob", [(256, False, True), (256, True, True), (160, False, False)])
def test_jax_grad_matches_a_plain_jnp_implementation(n, with_bias, with_prob):
    jax = jax_on_gpu()
    import jax.numpy as jnp

    import fusegemm.jax_ffi as fj
    rng = np.random.default_rng(5)
    counts, k = [300, 0, 17, 256], 128
    ends = np.cumsum([-(-c // 256) * 256 for c in counts]).astype(np.int32)
    m = int(ends[-1]) + 256
    a = jnp.asarray(rng.standard_normal((m, k)) * 0.5, jnp.bfloat16)
    alpha = jnp.asarray(rng.random(4) + 0.5, jnp.float32)
    b = jnp.asarray(rng.standard_normal((4, n, k)) * 0.1, jnp.bfloat16)
    prob = jnp.asarray(rng.random(m), jnp.float32) if with_prob else None
    bias = jnp.asarray(rng.standard_normal((4, n)), jnp.bfloat16) if with_bias else None
    gd = jnp.asarray(rng.standard_normal((m, n)), jnp.float32)
    gc = jnp.asarray(rng.standard_normal((m, n)), jnp.float32)
    offsets = jnp.asarray(ends)
    valid = (jnp.arange(m) < ends[-1])[:, None]

    def loss(fn):
        def f(a, alpha, b, prob, bias):
            d, c = fn(a, offsets, alpha, b, prob, bias)
            # Rows past the last expert are unspecified in the op's outputs: the loss reads none.
            return (jnp.where(valid, d.astype(jnp.float32), 0) * gd).sum() + (jnp.where(valid, c.astype(jnp.float32), 0)
                                                                              * gc).sum()
        return jax.jit(jax.grad(f, argnums=(0, 1, 2, 3, 4)))

    ours = loss(lambda a, o, al, b, p, bias: fj.grouped_gemm(a, o, al, b, prob=p, bias=bias, generate_c=True,
                                                             c_dtype=jnp.float32, d_dtype=jnp.float32))
    got = ours(a, alpha, b, prob, bias)
    want = loss(_plain)(a, alpha, b, prob, bias)
    for name, g, w in zip(("a", "alpha", "b", "prob", "bias"), got, want):
        if w is None:
            assert g is None, name
            continue
        assert g.shape == w.shape and g.dtype == w.dtype, name
        g32, w32 = np.asarray(g, np.float32), np.asarray(w, np.float32)
        rel = np.linalg.norm(g32 - w32) / max(np.linalg.norm(w32), 1e-30)
        assert rel <= 1e-2, (name, rel)
