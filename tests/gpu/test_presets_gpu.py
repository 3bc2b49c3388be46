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


@pytest.mark.parametrize("d_dtype", [torch.bfloat16, torch.float32])
def test_dglu_preset_generates_the_bias_gradient(d_dtype):
    """generate_dbias=True: dbias (L, 2N, 1) float32 for a (M, K, 1) A, each column of the
    interleaved D (dgate in the even 32-column blocks, dup in the odd) summed over each expert's
    rows, of the FP32 values before D's conversion (the empty expert's row zero). Against the
    interpreter (FP32 sums in another order: 1e-5 of the column's sum of |D|), and against column
    sums of the D the kernel returned (a float32 D holds those very values: 1e-5 again; a bf16 D
    their rounding: 2^-8). D is the call's without dbias, bit for bit; dprob within 1e-5."""
    a, b, off, alpha, prob, g = _problem(n_acc=224)           # N = 224: 7 gate/up pairs, a partial tile
    m, n = a.shape[0], b.shape[1]
    c = torch.randn(m, 2 * n, generator=g, device="cuda").to(torch.bfloat16)
    beta = torch.rand(3, generator=g, device="cuda") + 0.5
    dprob = torch.zeros(m, 1, 1, device="cuda")
    got = fusegemm.grouped_gemm_dglu(a.unsqueeze(-1), c.unsqueeze(-1), None, off, alpha, beta, prob.view(-1, 1, 1),
                                     dprob, b_tensor=b, d_dtype=d_dtype, generate_dbias=True)
    dbias = got["dbias_tensor"]
    assert dbias.shape == (3, 2 * n, 1) and dbias.dtype == torch.float32
    dbias = dbias[:, :, 0].double().cpu().numpy()
    op = fusegemm.Op("grouped_gemm_dglu", generate_dbias=True, d_dtype=str(d_dtype).removeprefix("torch."))
    ref = op.reference(_host(a), _host(off), _host(b),
                       inputs={"alpha": _host(alpha), "beta": _host(beta), "prob": _host(prob), "c": _host(c)})
    ranges = ((0, 256), (256, 256), (256, 768))
    vals = np.abs(np.asarray(ref.out_values["d"], np.float64))          # D's FP32 values, interleaved
    bound = np.stack([vals[s:t].sum(axis=0) for s, t in ranges])
    assert np.all(np.abs(dbias - np.asarray(ref["dbias"], np.float64)) <= 1e-5 * bound + 1e-30)
    d = got["d_row_tensor"][:, :, 0].double().cpu().numpy()
    sums = np.stack([d[s:t].sum(axis=0) for s, t in ranges])
    rel = 1e-5 if d_dtype == torch.float32 else 2.0 ** -8
    assert np.all(np.abs(dbias - sums) <= rel * bound + 1e-30)
    assert not dbias[1].any()
    # the check above can fail: the interpreter's sums with the gate and up blocks swapped do not pass it
    swapped = np.asarray(ref["dbias"], np.float64).reshape(3, n // 32, 2, 32)[:, :, ::-1].reshape(3, 2 * n)
    assert not np.all(np.abs(dbias - swapped) <= 1e-5 * bound + 1e-30)
    plain = fusegemm.grouped_gemm_dglu(a.unsqueeze(-1), c.unsqueeze(-1), None, off, alpha, beta, prob.view(-1, 1, 1),
                                       torch.zeros(m, 1, 1, device="cuda"), b_tensor=b, d_dtype=d_dtype)
    assert plain["dbias_tensor"] is None and torch.equal(plain["d_row_tensor"], got["d_row_tensor"])
    # dprob: the same row sums, added in another order where the sm_90a rule leaves the fragment
    # blocks for the engine (a column sum needs lane = row)
    p0, p1 = plain["dprob_tensor"].double().cpu().numpy(), dprob.double().cpu().numpy()
    assert np.abs(p0 - p1).max() <= 1e-5 * max(1.0, np.abs(p0).max())
