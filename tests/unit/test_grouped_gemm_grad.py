"""The gradient of ``torch.ops.fusegemm.grouped_gemm`` (fusegemm/torch_library.py), on the CPU:
its formula with the three GPU primitives it calls (the data-gradient GEMM, the K-grouped weight
gradient, the recomputed products) replaced by per-expert float64 matmuls, against autograd of
seed 001's formula written out independently. tests/gpu/test_grouped_gemm_grad_gpu.py runs the
real op."""
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
tl = pytest.importorskip("fusegemm.torch_library")


def _ranges(offsets, m):
    ends = [int(v) for v in offsets]
    return list(zip([0] + ends[:-1], ends))


def _per_expert(x, offsets, w, out_cols):
    # y[rows_e] = x[rows_e] @ w[e]^T for w (L, out_cols, cols of x); rows past the last expert 0.
    y = x.new_zeros((x.shape[0], out_cols), dtype=torch.float64)
    for e, (s, t) in enumerate(_ranges(offsets, x.shape[0])):
        y[s:t] = x[s:t].double() @ w[e].double().T
    return y


@pytest.fixture
def cpu_primitives(monkeypatch):
    monkeypatch.setattr(tl, "_dgrad", lambda u, off, w, alpha: _per_expert(
        u, off, w.transpose(1, 2) * alpha.double()[:, None, None], w.shape[2]))
    monkeypatch.setattr(tl, "_products", lambda a, off, w: _per_expert(a, off, w, w.shape[1]))

    def wgrad(dy, x, off, kernel="auto"):
        dw = torch.zeros(len(off), dy.shape[1], x.shape[1], dtype=torch.float64)
        for e, (s, t) in enumerate(_ranges(off, x.shape[0])):
            dw[e] = dy[s:t].double().T @ x[s:t].double()
        return dw
    monkeypatch.setattr(tl, "grouped_wgrad", wgrad)


def _seed_001(a, offsets, alpha, b, bias, prob):
    """(d, c) of seed 001, from its page: G = alpha_g A_g B_g^T; with bias C = G + p bias[:, g],
    D = C; without, C = G, D = p G. a (M, K, 1), b (N, K, L), bias (N, L), prob (M, 1, 1)."""
    m, n = a.shape[0], b.shape[0]
    d, c = [], []
    for e, (s, t) in enumerate(_ranges(offsets, m)):
        g = alpha[e] * (a[s:t, :, 0] @ b[:, :, e].T)
        p = prob[s:t, :, 0] if prob is not None else torch.ones(t - s, 1, dtype=a.dtype)
        if bias is not None:
            c.append(g + p * bias[:, e])
            d.append(c[-1])
        else:
            c.append(g)
            d.append(p * g)
    tail = a.new_zeros((m - int(offsets[-1]), n))
    return torch.cat(d + [tail])[..., None], torch.cat(c + [tail])[..., None]


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("with_prob", [False, True])
@pytest.mark.parametrize("with_c", [False, True])
@pytest.mark.parametrize("canonical", [False, True])
def test_backward_matches_autograd_of_the_seed_formula(cpu_primitives, with_bias, with_prob, with_c, canonical):
    """The seed's kernel-facing layout (a (M, K, 1), b (N, K, L), prob (M, 1, 1)) and the canonical
    one the op also takes (a (M, K), b (L, N, K), prob (M,))."""
    g = torch.Generator().manual_seed(3)
    m, k, n = 24, 5, 7
    offsets = torch.tensor([8, 8, 20], dtype=torch.int32)          # ragged, one empty expert, 4 rows past
    w = torch.randn(3, n, k, generator=g, dtype=torch.float64)
    leaves = {
        "a": torch.randn(m, k, generator=g, dtype=torch.float64).reshape((m, k) if canonical else (m, k, 1)),
        "alpha": (torch.rand(3, generator=g) + 0.5).double(),     # float32 values: the kernel reads alpha in FP32
        "b": w if canonical else w.permute(1, 2, 0),               # (L, N, K), or the seed's K-major (N, K, L) view
        "bias": torch.randn(3, n, generator=g, dtype=torch.float64).t() if with_bias else None,   # (N, L)
        "prob": torch.rand(m, generator=g, dtype=torch.float64).reshape((m,) if canonical else (m, 1, 1))
        if with_prob else None,
    }
    for v in leaves.values():
        if v is not None:
            v.requires_grad_(True)
    seed_view = {"a": leaves["a"].reshape(m, k, 1), "b": leaves["b"].permute(1, 2, 0) if canonical else leaves["b"],
                 "prob": leaves["prob"].reshape(m, 1, 1) if with_prob else None}
    d, c = _seed_001(seed_view["a"], offsets, leaves["alpha"], seed_view["b"], leaves["bias"], seed_view["prob"])
    if canonical:
        d, c = d[..., 0], c[..., 0]
    gd = torch.randn(*d.shape, generator=g, dtype=torch.float64)
    gc = torch.randn(*d.shape, generator=g, dtype=torch.float64) if with_c else None
    present = [v for v in leaves.values() if v is not None]
    want = dict(zip([k for k, v in leaves.items() if v is not None],
                    torch.autograd.grad((d * gd).sum() + ((c * gc).sum() if with_c else 0), present)))
    saved = (leaves["a"], offsets, leaves["alpha"], leaves["b"], leaves["bias"], leaves["prob"])
    needs = [True, False, True, True, with_bias, False, False, with_prob] + [False] * 4
    # The real setup_context saves what the backward reads (and decides B's layout).
    ctx = SimpleNamespace(needs_input_grad=needs)
    ctx.save_for_backward = lambda *ts: setattr(ctx, "saved_tensors", tuple(x.detach() if x is not None else None
                                                                            for x in ts))
    tl._grouped_gemm_context(ctx, (saved[0], offsets, saved[2], saved[3], saved[4], None, None, saved[5]), ())
    got = tl._grouped_gemm_backward(ctx, gd, gc if with_c else torch.empty(0, dtype=torch.float64))
    assert len(got) == 12
    for name, index in (("a", 0), ("alpha", 2), ("b", 3), ("bias", 4), ("prob", 7)):
        if name not in want:
            assert got[index] is None, name
            continue
        # In the argument's own layout (b (N, K, L) K-major, bias (N, L) column-major: the seed's).
        assert got[index].shape == want[name].shape and got[index].stride() == leaves[name].stride(), name
        torch.testing.assert_close(got[index], want[name], rtol=1e-12, atol=1e-12, msg=lambda s: f"{name}: {s}")
    assert (got[0][20:] == 0).all() and (with_prob is False or (got[7][20:] == 0).all())   # rows past the end


@pytest.mark.parametrize("wanted", [0, 2, 7])    # a, alpha, prob: each needs the weights
def test_discrete_weights_refuse_a_gradient_with_the_argument_named(wanted):
    from fusegemm.base.errors import UnsupportedError
    a = torch.randn(8, 4, 1, dtype=torch.float64)
    saved = (a, torch.tensor([8], dtype=torch.int32), torch.ones(1), None, None, torch.ones(8, 1, 1))
    ctx = SimpleNamespace(saved_tensors=saved, needs_input_grad=[i == wanted for i in range(12)], discrete=True)
    with pytest.raises(UnsupportedError, match="^b_ptrs: "):
        tl._grouped_gemm_backward(ctx, torch.ones(8, 3, 1), None)


def test_the_op_is_registered_differentiable():
    """register_autograd took: the op has an autograd kernel (the dispatcher says so)."""
    assert torch._C._dispatch_has_kernel_for_dispatch_key("fusegemm::grouped_gemm", "Autograd")
