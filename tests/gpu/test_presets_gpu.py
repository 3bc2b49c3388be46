"""The preset wrappers (fusegemm/presets.py) on the GPU: each gives the bytes of fusegemm.Op on its
spec (the one engine), matches the interpreter, and writes dprob into a caller's zero-initialised
tensor as cuDNN's wrappers do."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import fusegemm  # noqa: E402

pytestmark = pytest.mark.gpu


def _problem(n_acc=256, k=128, tokens=(256, 0, 512), seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    m, l = sum(tokens), len(tokens)
    a = torch.randn(m, k, generator=g, device="cuda").to(torch.bfloat16)
    b = (0.2 * torch.randn(l, n_acc, k, generator=g, device="cuda")).to(torch.bfloat16)
    off = torch.tensor(np.cumsum(tokens), dtype=torch.int32, device="cuda")
    alpha = torch.rand(l, generator=g, device="cuda") + 0.5
    prob = torch.rand(m, generator=g, device="cuda")
    return a, b, off, alpha, prob, g


def _host(x):
    import ml_dtypes
    x = x.detach().cpu()
    return x.view(torch.uint16).numpy().view(ml_dtypes.bfloat16) if x.dtype == torch.bfloat16 else x.numpy()


def test_glu_preset_is_the_engine_on_its_spec():
    a, b, off, alpha, prob, _ = _problem()
    got = fusegemm.grouped_gemm_glu(a, None, off, alpha, b, prob_tensor=prob, generate_c=True, c_dtype=torch.float32)
    op = fusegemm.Op("grouped_gemm_glu", generate_c=True, c_dtype="float32")
    want = op(a, off, b, inputs={"alpha": alpha, "prob": prob})
    assert torch.equal(got["d_tensor"], want["d"]) and torch.equal(got["c_tensor"], want["c"])
    assert got["d_col_tensor"] is None and got["amax_tensor"] is None
    ref = op.reference(_host(a), _host(off), _host(b), inputs={"alpha": _host(alpha), "prob": _host(prob)})
    valid = int(off[-1])
    np.testing.assert_allclose(got["d_tensor"].float().cpu().numpy()[:valid], np.asarray(ref["d"], np.float32)[:valid],
                               rtol=2 ** -7, atol=1e-2)


@pytest.mark.parametrize("name", ["grouped_gemm_dglu", "grouped_gemm_dsrelu"])
def test_backward_presets_write_dprob_into_the_callers_tensor(name):
    a, b, off, alpha, prob, g = _problem()
    m, n_acc = a.shape[0], b.shape[1]
    if name == "grouped_gemm_dglu":
        c = torch.randn(m, 2 * n_acc, generator=g, device="cuda").to(torch.bfloat16)
        beta = torch.rand(3, generator=g, device="cuda") + 0.5
        dprob = torch.zeros(m, device="cuda")
        got = fusegemm.grouped_gemm_dglu(a, c, None, off, alpha, beta, prob, dprob, b_tensor=b)
        inputs = {"alpha": alpha, "beta": beta, "prob": prob, "c": c}
    else:
        c = torch.randn(m, n_acc, generator=g, device="cuda").to(torch.bfloat16)
        dprob = torch.zeros(m, device="cuda")
        got = fusegemm.grouped_gemm_dsrelu(a, b, c, padded_offsets=off, alpha_tensor=alpha, prob_tensor=prob,
                                           dprob_tensor=dprob)
        inputs = {"alpha": alpha, "prob": prob, "c": c}
    want = fusegemm.Op(name)(a, off, b, inputs=inputs)
    assert got["dprob_tensor"] is dprob and torch.equal(dprob, want["dprob"])
    assert torch.equal(got["d_row_tensor"], want["d"])
    ref = fusegemm.Op(name).reference(_host(a), _host(off), _host(b), inputs={k: _host(v) for k, v in inputs.items()})
    valid = int(off[-1])
    r = np.asarray(ref["dprob"], np.float64)[:valid]
    assert np.abs(dprob.cpu().numpy()[:valid] - r).max() <= 1e-3 * max(1.0, np.abs(r).max())


def test_preset_torch_op_under_torch_compile():
    import fusegemm.torch_library  # noqa: F401  (registers torch.ops.fusegemm.<preset>)
    a, b, off, alpha, prob, _ = _problem()
    want = fusegemm.grouped_gemm_glu(a, None, off, alpha, b, prob_tensor=prob)["d_tensor"]
    f = torch.compile(lambda x, w: torch.ops.fusegemm.grouped_gemm_glu(x, None, off, alpha, w, prob=prob)[1],
                      fullgraph=True)
    assert torch.equal(f(a, b), want)


def test_dsrelu_preset_generates_the_bias_gradient():
    """generate_dbias=True: dbias (L, N, 1) float32 for a (M, K, 1) A, the column sums of dC over
    each expert's rows (the empty expert's row zero), against the interpreter."""
    a, b, off, alpha, prob, g = _problem(n_acc=136)
    m, n = a.shape[0], b.shape[1]
    c = torch.randn(m, n, generator=g, device="cuda").to(torch.bfloat16)
    got = fusegemm.grouped_gemm_dsrelu(a.unsqueeze(-1), b, c.unsqueeze(-1), padded_offsets=off, alpha_tensor=alpha,
                                       prob_tensor=prob.view(-1, 1, 1), dprob_tensor=torch.zeros(m, 1, 1, device="cuda"),
                                       generate_dbias=True)
    dbias = got["dbias_tensor"]
    assert dbias.shape == (3, n, 1) and dbias.dtype == torch.float32
    ref = fusegemm.Op("grouped_gemm_dsrelu", generate_dbias=True).reference(
        _host(a), _host(off), _host(b), inputs={"alpha": _host(alpha), "prob": _host(prob), "c": _host(c)})
    want = np.asarray(ref["dbias"], np.float64)
    bound = np.zeros_like(want)
    vals = np.abs(np.asarray(ref.values["d"], np.float64))
    for e, (s, t) in enumerate(((0, 256), (256, 256), (256, 768))):
        bound[e] = vals[s:t].sum(axis=0)
    assert np.all(np.abs(dbias[:, :, 0].cpu().numpy() - want) <= 1e-5 * bound + 1e-30)
    assert not dbias[1].any()
    plain = fusegemm.grouped_gemm_dsrelu(a, b, c, padded_offsets=off, alpha_tensor=alpha, prob_tensor=prob)
    assert plain["dbias_tensor"] is None and torch.equal(plain["d_row_tensor"], got["d_row_tensor"][:, :, 0])
