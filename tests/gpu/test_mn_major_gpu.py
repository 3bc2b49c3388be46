"""MN-major FP8 operands of the block-scaled ops on the GPU (issue 31): the seeds' M-major A and
N-major B (gemm_amax) and N-major dense B (dSwiGLU) run through a K-major copy that the op makes on
the launch stream (fusegemm/ops/scaled_layouts.py). gemm_amax against the numpy reference on
integer problems (exact); dSwiGLU, both scaling recipes and both B forms, and sReLU's discrete
N-major weights (copied through the pointer table), against the same op on K-major B: every byte
equal (dprob within its atomics' order); and on a stream other than torch's current one."""
from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

import fusegemm  # noqa: E402
import scaled_problems  # noqa: E402  (tests/gpu/scaled_problems.py)
from scaled_problems import RECIPES  # noqa: E402
from fusegemm import reference  # noqa: E402
from fusegemm.output_compare import compare_outputs, device_args  # noqa: E402
from fusegemm.problems import make_batched_problem  # noqa: E402
from epilogue_inputs import epilogue_inputs  # noqa: E402  (tests/epilogue_inputs.py)
from op_helpers import same_outputs  # noqa: E402  (tests/gpu/op_helpers.py)


@pytest.mark.parametrize("batch", [1, 3])
def test_gemm_amax_m_major_a_and_n_major_b_exact(batch):
    pb = make_batched_problem(m=200, n=264, k=320, batch=batch, a_major="m", values="integer", seed=21)
    kw = pb.kwargs()
    assert np.asarray(kw["a_tensor"]).strides[0] == 1 and np.asarray(kw["b_tensor"]).strides[0] == 1
    ref = reference.gemm_amax(**kw)
    dev, keep = device_args(kw)
    assert dev["a_tensor"].stride()[0] == 1 and dev["b_tensor"].stride()[0] == 1   # still MN-major on the GPU
    out = fusegemm.gemm_amax(**dev)
    err, problem = compare_outputs(ref, out, exact=True)
    assert problem is None, (problem, err)
    k_major = fusegemm.gemm_amax(**dict(dev, a_tensor=dev["a_tensor"].contiguous() if batch == 1 else
                                        dev["a_tensor"].permute(2, 0, 1).contiguous().permute(1, 2, 0),
                                        b_tensor=dev["b_tensor"].permute(2, 0, 1).contiguous().permute(1, 2, 0)))
    torch.cuda.synchronize()
    assert torch.equal(out["c_tensor"], k_major["c_tensor"]) and torch.equal(out["amax_tensor"], k_major["amax_tensor"])


def _run(op, operands, inputs, other_stream):
    """``op``'s outputs on torch's current stream, or on a new one ordered after it (the copy and
    the GEMM both go there), synchronised."""
    if other_stream:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        out = op(**operands, inputs=inputs, current_stream=s)
        torch.cuda.current_stream().wait_stream(s)
    else:
        out = op(**operands, inputs=inputs)
    torch.cuda.synchronize()
    return out


def _n_major(b, form):
    """(L, N, K) row-major B as an N-major tensor: canonical (L, N, K) or kernel-facing (N, K, L)."""
    nm = b.transpose(1, 2).contiguous().transpose(1, 2)          # (L, N, K), strides (N K, 1, N)
    return nm if form == "canonical" else nm.permute(1, 2, 0)   # (N, K, L), strides (1, N, N K)


@pytest.mark.parametrize("recipe", ["mx", "blockwise"])
@pytest.mark.parametrize("form", ["canonical", "kernel"])
@pytest.mark.parametrize("other_stream", [False, True])
def test_dswiglu_n_major_dense_b_matches_k_major(recipe, form, other_stream):
    sizes, n, k = [256, 0, 512, 256], 384, 512          # N != K: the B forms are told apart by shape
    rng = np.random.default_rng(5)
    host, per_sfb, _, _ = scaled_problems.operands(sizes, n, k, recipe, rng)
    dev, keep = scaled_problems.on_device(host, per_sfb, n, discrete=False)
    k_op = fusegemm.Op("grouped_gemm_dswiglu", **RECIPES[recipe]).compile()
    n_op = fusegemm.Op("grouped_gemm_dswiglu", b_major="n", **RECIPES[recipe]).compile()
    assert n_op.host_copies == {"b_major": "b_tensor"} and n_op.kernel_variant.b_major == "k"
    g = torch.Generator(device="cuda").manual_seed(9)
    ins = epilogue_inputs(k_op, sum(sizes), n, len(sizes), g, width=k_op.widths(n)[0])
    want = k_op(**dev, inputs=ins)
    b_n = _n_major(dev["b_tensor"], form)
    assert 1 in b_n.stride() and b_n.stride()[-1 if form == "canonical" else 1] != 1
    got = _run(n_op, dict(dev, b_tensor=b_n), ins, other_stream)
    same_outputs(got, want, f"dSwiGLU {recipe} N-major {form} B against K-major B")


def test_dswiglu_seed_wrapper_takes_n_major_b():
    """Seed 000's wrapper with an N-major (N, K, L) B (the layout its page allows) gives the bytes
    of the K-major call."""
    sizes, n, k = [256, 256], 256, 512
    rng = np.random.default_rng(6)
    host, per_sfb, _, _ = scaled_problems.operands(sizes, n, k, "mx", rng)
    dev, keep = scaled_problems.on_device(host, per_sfb, n, discrete=False)
    m, l = sum(sizes), len(sizes)
    g = torch.Generator(device="cuda").manual_seed(2)
    c = torch.randn(m, 2 * n, generator=g, device="cuda").to(torch.bfloat16)
    alpha, beta = torch.rand(l, generator=g, device="cuda"), torch.rand(l, generator=g, device="cuda")
    prob = torch.rand(m, generator=g, device="cuda")
    norm_const = torch.ones((1,), device="cuda")
    outs = []
    for b in (dev["b_tensor"], _n_major(dev["b_tensor"], "kernel")):   # (L, N, K) K-major; (N, K, L) N-major
        outs.append(fusegemm.grouped_gemm_dswiglu(dev["a_tensor"], b, c, dev["sfa_tensor"], dev["sfb_tensor"],
                                                  dev["padded_offsets"], alpha, beta, prob, sf_vec_size=32,
                                                  d_dtype=torch.float8_e4m3fn, norm_const_tensor=norm_const))
    torch.cuda.synchronize()
    want, got = outs
    for key, w in want.items():
        if w is None:
            continue
        if key.startswith("dprob"):
            torch.testing.assert_close(got[key], w, rtol=1e-5, atol=1e-5)
        else:
            assert torch.equal(got[key].view(torch.uint8), w.view(torch.uint8)), key


@pytest.mark.parametrize("recipe", ["mx", "blockwise"])
@pytest.mark.parametrize("other_stream", [False, True])
def test_srelu_discrete_n_major_weights_match_k_major(recipe, other_stream):
    """Seed 002's discrete weights with b_major='n' (each expert's (N, K) matrix N-major, apart):
    copied K-major through the pointer table; every byte equal to the discrete K-major call's."""
    sizes, n, k = [256, 0, 512, 256], 384, 512
    m, l = sum(sizes), len(sizes)
    rng = np.random.default_rng(8)
    host, per_sfb, _, _ = scaled_problems.operands(sizes, n, k, recipe, rng)
    dev, keep = scaled_problems.on_device(host, per_sfb, n, discrete=True)   # K-major (N, K) per expert
    b = host["b_tensor"].cuda()                                               # (L, N, K)
    n_major = [b[e].t().contiguous() for e in range(l)]                      # (K, N) storage: N-major
    n_ptrs = torch.tensor([t.data_ptr() for t in n_major], dtype=torch.int64, device="cuda")
    k_op = fusegemm.Op("grouped_gemm_srelu", weight_mode="discrete", **RECIPES[recipe]).compile()
    n_op = fusegemm.Op("grouped_gemm_srelu", weight_mode="discrete", b_major="n", **RECIPES[recipe]).compile()
    assert n_op.host_copies == {"b_major": "b_ptrs"}
    g = torch.Generator(device="cuda").manual_seed(4)
    ins = epilogue_inputs(k_op, m, n, l, g)
    want = k_op(**dev, inputs=ins)
    got = _run(n_op, dict(dev, b_ptrs=n_ptrs), ins, other_stream)
    same_outputs(got, want, f"sReLU {recipe} discrete N-major weights against K-major ones")


def test_gemm_amax_m_major_a_with_an_unaligned_pitch():
    """An M-major A whose K steps are M + 1 bytes apart (not word-aligned): the copy kernel's byte
    path on every tile; the same bytes as the aligned M-major call."""
    pb = make_batched_problem(m=200, n=264, k=320, batch=2, a_major="m", values="integer", seed=22)
    dev, keep = device_args(pb.kwargs())
    a = dev["a_tensor"]                                            # (M, K, L), strides (1, M, M K)
    m, k, l = a.shape
    buf = torch.zeros(l, k, m + 1, dtype=torch.uint8, device="cuda")
    buf[:, :, :m] = a.view(torch.uint8).permute(2, 1, 0)
    a_pad = buf[:, :, :m].permute(2, 1, 0).view(a.dtype)          # strides (1, M + 1, K (M + 1))
    assert a_pad.stride()[:2] == (1, m + 1) and torch.equal(a_pad.view(torch.uint8), a.view(torch.uint8))
    want = fusegemm.gemm_amax(**dev)
    got = fusegemm.gemm_amax(**dict(dev, a_tensor=a_pad))
    torch.cuda.synchronize()
    assert torch.equal(got["c_tensor"], want["c_tensor"]) and torch.equal(got["amax_tensor"], want["amax_tensor"])
