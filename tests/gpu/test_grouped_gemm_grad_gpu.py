"""``torch.ops.fusegemm.grouped_gemm``'s gradient on the GPU (fusegemm/torch_library.py): the op's
backward (data gradient on the grouped GEMM, weight gradient on the K-grouped family, alpha, prob
and bias by per-expert reductions) against autograd of seed 001's formula in float32 on the same
bfloat16 inputs, eager and under ``torch.compile(fullgraph=True)``.

Tolerance: relative Frobenius error <= 1e-2 per gradient (the op rounds U, the gradient at
alpha * A B^T, to bfloat16 before both GEMMs, as torch._grouped_mm's backward rounds its
incoming gradient; everything else accumulates in FP32)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu


def _rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


def _problem(with_bias, with_prob, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    counts, k, n = [300, 0, 17, 256], 256, 384       # ragged, an empty expert
    ends = torch.tensor(counts).add(255).div(256, rounding_mode="floor").mul(256).cumsum(0)
    m = int(ends[-1]) + 256                           # rows past the last expert
    leaves = {
        "a": (torch.randn(m, k, 1, generator=g, device="cuda") * 0.5).bfloat16(),
        "alpha": torch.rand(4, generator=g, device="cuda") + 0.5,
        "b": (torch.randn(4, n, k, generator=g, device="cuda") * 0.1).bfloat16().permute(1, 2, 0),
        "bias": torch.randn(4, n, generator=g, device="cuda").bfloat16().t() if with_bias else None,
        "prob": torch.rand(m, 1, 1, generator=g, device="cuda") if with_prob else None,
    }
    return leaves, ends.to(torch.int32).cuda()


def _seed_001(a, offsets, alpha, b, bias, prob):
    """(d, c) of seed 001 in float32, rows past the last expert zero."""
    d, c, start = torch.zeros(a.shape[0], b.shape[0], device="cuda"), None, 0
    c = torch.zeros_like(d)
    for e, end in enumerate(offsets.tolist()):
        g = alpha[e] * (a[start:end, :, 0].float() @ b[:, :, e].float().T)
        p = prob[start:end, :, 0] if prob is not None else 1.0
        c[start:end] = g + p * bias[:, e].float() if bias is not None else g
        d[start:end] = c[start:end] if bias is not None else p * g
        start = end
    return d[..., None], c[..., None]


@pytest.mark.parametrize("with_bias,with_prob", [(False, False), (False, True), (True, True)])
@pytest.mark.parametrize("compiled", [False, True])
def test_gradients_match_autograd_of_the_seed_formula(with_bias, with_prob, compiled):
    import fusegemm.torch_library as fg
    leaves, offsets = _problem(with_bias, with_prob)
    names = [k for k, v in leaves.items() if v is not None]

    def op(a, alpha, b, bias, prob):
        d, c = fg.grouped_gemm(a, offsets, alpha, b, bias=bias, prob=prob, generate_c=True)
        return d, c
    run = torch.compile(op, fullgraph=True) if compiled else op
    g = torch.Generator(device="cuda").manual_seed(9)
    gd = torch.randn(leaves["a"].shape[0], leaves["b"].shape[0], 1, generator=g, device="cuda")
    gc = torch.randn_like(gd)
    got, want = {}, {}
    for side, fn in (("got", run), ("want", lambda *x: _seed_001(x[0], offsets, *x[1:]))):
        xs = {k: (v.detach().clone().requires_grad_(True) if v is not None else None) for k, v in leaves.items()}
        d, c = fn(xs["a"], xs["alpha"], xs["b"], xs["bias"], xs["prob"])
        grads = torch.autograd.grad((d.float() * gd).sum() + (c.float() * gc).sum(), [xs[k] for k in names])
        (got if side == "got" else want).update(zip(names, grads))
    for name in names:
        assert got[name].shape == want[name].shape, name
        assert _rel(got[name], want[name]) <= 1e-2, (name, _rel(got[name], want[name]))
    end = int(offsets[-1])
    assert got["a"][end:].abs().max() == 0 and (not with_prob or got["prob"][end:].abs().max() == 0)


def test_discrete_weights_refuse_the_gradient_of_a():
    import fusegemm.torch_library as fg
    from fusegemm.base.errors import UnsupportedError
    leaves, offsets = _problem(False, False)
    w = leaves["b"].permute(2, 0, 1).contiguous()
    ptrs = torch.tensor([w[e].data_ptr() for e in range(4)], dtype=torch.int64, device="cuda")
    a = leaves["a"].clone().requires_grad_(True)
    d, _ = fg.grouped_gemm(a, offsets, leaves["alpha"], b_ptrs=ptrs, n=w.shape[1])
    with pytest.raises(UnsupportedError, match="^b_ptrs: "):
        d.float().sum().backward()


def test_gradients_with_canonical_operands():
    """The canonical layout the op also takes (a (M, K), b (L, N, K) contiguous, d (M, N)): the
    backward reads B as the op did and returns dB as (L, N, K)."""
    import fusegemm.torch_library as fg
    leaves, offsets = _problem(False, True)
    a = leaves["a"][..., 0].clone().requires_grad_(True)                       # (M, K)
    b = leaves["b"].permute(2, 0, 1).contiguous().clone().requires_grad_(True)  # (L, N, K)
    prob = leaves["prob"].reshape(-1).clone().requires_grad_(True)              # (M,)
    d, _ = fg.grouped_gemm(a, offsets, leaves["alpha"], b, prob=prob)
    g = torch.Generator(device="cuda").manual_seed(9)
    gd = torch.randn(d.shape, generator=g, device="cuda")
    got = torch.autograd.grad((d.float() * gd).sum(), [a, b, prob])
    a2, b2, p2 = (t.detach().clone().requires_grad_(True) for t in (a, b, prob))
    d_ref, _ = _seed_001(a2[..., None], offsets, leaves["alpha"], b2.permute(1, 2, 0), None, p2[:, None, None])
    want = torch.autograd.grad((d_ref[..., 0] * gd).sum(), [a2, b2, p2])
    for name, x, y in zip(("a", "b", "prob"), got, want):
        assert x.shape == y.shape, name
        assert _rel(x, y) <= 1e-2, (name, _rel(x, y))
