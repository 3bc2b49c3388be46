"""GPU: cuDNN frontend's newer grouped fusions authored as specs (grouped_gemm_glu, grouped_gemm_dglu,
grouped_gemm_dsrelu) through ``EpilogueGemm(spec, ...)``, against ``.reference(...)`` (the numpy
GEMM + interpreter, tests/unit/test_new_fusions.py holds it to the formulas) and against the
independent float64 formulas of cuDNN's math, on ragged experts with an empty one and padding
rows past the last offset (which must stay zero).

Tolerances: the GPU's FP32 accumulation order differs from the reference's float64 sums rounded
once (|error| ~ K 2^-24 sum |a b|, about 2^-12 of the outputs' magnitude here), so every output is
held to half an ulp of its format plus that (bf16 2^-7, fp16 2^-9, fp32 2^-11 relative) and
2^-12 of the output's largest magnitude; dprob (an atomic FP32 sum over column tiles, in any
order) to 2^-12 of the row's sum of |terms| + 1e-6; amax to 2^-10 relative, an empty expert's
exactly -inf.

The module first compiles every kernel it launches, in parallel worker processes
(fusegemm.build.compile_all), for the device's arch.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

from fusegemm.generator.variants import make_variant

pytestmark = pytest.mark.gpu

SIZES = [256, 0, 512, 256]          # ragged experts, the second one empty
PAD_ROWS = 256
REL = {"bfloat16": 2.0 ** -7, "float16": 2.0 ** -9, "float32": 2.0 ** -11}

# (axes, N, weights): how the weights are passed (_run).
GLU_CASES = [
    ({}, 512, "dense"),
    ({"bias_dtype": "bfloat16", "generate_c": True, "c_dtype": "float32", "d_dtype": "float32"}, 320, "dense"),
    ({"bias_dtype": "float32", "generate_c": True, "d_dtype": "float16", "weight_mode": "discrete"}, 256, "discrete"),
    ({"b_major": "n", "tile_n": 128}, 192, "dense_n"),
]
DGLU_CASES = [
    ({}, 256, "dense"),
    ({"c_dtype": "float32", "d_dtype": "float32"}, 224, "dense"),
    ({"c_dtype": "float16", "d_dtype": "float16", "weight_mode": "discrete", "scheduler": "dynamic"}, 256, "discrete"),
]
DSRELU_CASES = [
    ({}, 256, "dense"),
    ({"c_dtype": "float32", "d_dtype": "float32"}, 200, "dense"),
    ({"c_dtype": "float32", "d_dtype": "float16", "weight_mode": "discrete", "b_major": "n"}, 320, "discrete_n"),
]
CHAIN_AXES = ({"generate_c": True, "c_dtype": "bfloat16"}, {"c_dtype": "bfloat16"})


def _ids(case):
    axes, n, weights = case
    return "-".join([f"n{n}", weights] + [f"{k}={v}" for k, v in axes.items()])


@pytest.fixture(scope="module")
def torch():
    import torch
    return torch


@pytest.fixture(scope="module", autouse=True)
def compiled_ahead(torch):
    """Compile every kernel this module launches, in parallel, before the first test."""
    from fusegemm.build import compile_all
    from fusegemm.ops.device import device_arch
    from fusegemm.pipeline import plan
    arch = device_arch(0)
    cases = ([("grouped_gemm_glu", axes) for axes, _, _ in GLU_CASES]
             + [("grouped_gemm_dglu", axes) for axes, _, _ in DGLU_CASES]
             + [("grouped_gemm_dsrelu", axes) for axes, _, _ in DSRELU_CASES]
             + [("grouped_gemm_glu", CHAIN_AXES[0]), ("grouped_gemm_dglu", CHAIN_AXES[1])])
    planned = [plan(make_variant(spec, arch=arch, **axes)) for spec, axes in cases]
    failed = [r for r in compile_all(planned, jobs=os.cpu_count() or 1) if not r.ok]
    assert not failed, f"{len(failed)} sources failed to compile: {failed[0]}"


# --------------------------------------------------------------------------------------------
# problems, the launch, the independent formulas
# --------------------------------------------------------------------------------------------
def _problem(torch, *, n: int, k: int = 256, seed: int = 0):
    """CPU tensors: bf16 A (M, K) and weights (L, N, K), alpha (L,), prob (M,), offsets (L,)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    offsets = torch.tensor(np.cumsum(SIZES), dtype=torch.int32)
    m = int(offsets[-1]) + PAD_ROWS
    a = (torch.randn(m, k, generator=g) * 0.5).to(torch.bfloat16)
    w = (torch.randn(len(SIZES), n, k, generator=g) * 0.1).to(torch.bfloat16)
    alpha = torch.rand(len(SIZES), generator=g) + 0.5
    prob = torch.rand(m, generator=g)
    return g, a, offsets, w, alpha, prob


def _run(torch, op, a, offsets, w, inputs: dict, weights: str):
    """Launch ``op`` with the (L, N, K) weights ``w`` laid out as ``weights`` says: "dense" (the
    tensor, K-major), "dense_n" (the (L, N, K) view of (L, K, N) weights), "discrete" (pointers
    to per-expert (N, K) copies) or "discrete_n" (pointers to per-expert (K, N) copies); the
    reference on the host, from the same values."""
    dev = {key: (v.cuda() if hasattr(v, "cuda") else v) for key, v in inputs.items()}
    keep = []
    if weights == "dense":
        out = op(a.cuda(), offsets.cuda(), w.cuda(), inputs=dev)
    elif weights == "dense_n":
        out = op(a.cuda(), offsets.cuda(), w.transpose(1, 2).contiguous().cuda().transpose(1, 2), inputs=dev)
    else:
        per_expert = w if weights == "discrete" else w.transpose(1, 2)
        keep = [per_expert[e].contiguous().cuda() for e in range(w.shape[0])]
        ptrs = torch.tensor([t.data_ptr() for t in keep], dtype=torch.int64, device="cuda")
        out = op(a.cuda(), offsets.cuda(), b_ptrs=ptrs, n=w.shape[1], inputs=dev)
    torch.cuda.synchronize()
    del keep
    return out, op.reference(a, offsets, w, inputs=inputs)


def _expert_of_rows() -> np.ndarray:
    return np.repeat(np.arange(len(SIZES)), SIZES)


def _gemm64(a, w) -> np.ndarray:
    """A_e @ B_e^T in float64 for each expert's rows, (valid_m, N)."""
    e = _expert_of_rows()
    a64, w64 = a.double().numpy()[: len(e)], w.double().numpy()
    return np.einsum("mk,mnk->mn", a64, w64[e])


def _split(x):
    r, n2 = x.shape
    blocks = x.reshape(r, n2 // 64, 2, 32)
    return blocks[:, :, 0].reshape(r, n2 // 2), blocks[:, :, 1].reshape(r, n2 // 2)


def _interleave(gate, up):
    r, w = gate.shape
    return np.stack([gate.reshape(r, w // 32, 32), up.reshape(r, w // 32, 32)], axis=2).reshape(r, 2 * w)


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _host(t) -> np.ndarray:
    return t.float().cpu().numpy().astype(np.float64)


def _close(got, want, dtype: str, what: str) -> None:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    bound = REL[dtype] * np.abs(want) + 2.0 ** -12 * np.abs(want).max()
    bad = np.abs(got - want) > bound
    assert not bad.any(), f"{what}: {bad.sum()} of {bad.size} beyond the bound (got {got[bad][:4]}, want {want[bad][:4]})"


def _dprob_close(got, want, terms, what: str) -> None:
    assert np.all(np.abs(got - want) <= 2.0 ** -12 * terms + 1e-6), what


def _tails_zero(out, valid: int, names) -> None:
    for name in names:
        assert not out[name][valid:].any(), f"{name}: rows past padded_offsets[-1] are not zero"


# --------------------------------------------------------------------------------------------
# the ops
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", GLU_CASES, ids=_ids)
def test_glu_end_to_end(torch, case):
    """D = prob * up * silu(gate) (and C = the pre-activations, bias included) against the
    reference and against the formula; N = 320 and 192 end inside a tile."""
    from fusegemm import EpilogueGemm
    axes, n, weights = case
    g, a, offsets, w, alpha, prob = _problem(torch, n=n, seed=1)
    op = EpilogueGemm("grouped_gemm_glu", **axes)
    v = op.variant
    inputs = {"alpha": alpha, "prob": prob}
    if v.bias_dtype != "none":
        # (N, L) with N contiguous, as column inputs are laid out
        inputs["bias"] = torch.randn(len(SIZES), n, generator=g).to(getattr(torch, v.bias_dtype)).t()
    out, ref = _run(torch, op, a, offsets, w, inputs, weights)

    valid, e = int(offsets[-1]), _expert_of_rows()
    assert out["d"].shape == (a.shape[0], n // 2)
    _close(_host(out["d"])[:valid], np.asarray(ref.out_values["d"], np.float64)[:valid], v.d_dtype, "d vs reference")
    pre = alpha.double().numpy()[e, None] * _gemm64(a, w)
    if "bias" in inputs:
        pre = pre + inputs["bias"].double().numpy().T[e]
    gate, up = _split(pre)
    h = prob.double().numpy()[:valid, None] * up * gate * _sigmoid(gate)
    _close(_host(out["d"])[:valid], h, v.d_dtype, "d vs formula")
    names = ["d"]
    if v.generate_c:
        assert out["c"].shape == (a.shape[0], n)
        _close(_host(out["c"])[:valid], np.asarray(ref.out_values["c"], np.float64)[:valid], v.c_dtype, "c vs reference")
        _close(_host(out["c"])[:valid], pre, v.c_dtype, "c vs formula")
        names.append("c")
    else:
        assert "c" not in out
    _tails_zero(out, valid, names)


@pytest.mark.parametrize("case", DGLU_CASES, ids=_ids)
def test_dglu_end_to_end(torch, case):
    """dSwiGLU from the forward's C: D (gate/up blocks) and dprob against the reference and the
    formula (R = alpha^2 G)."""
    from fusegemm import EpilogueGemm
    axes, n, weights = case
    g, a, offsets, w, alpha, prob = _problem(torch, n=n, seed=2)
    op = EpilogueGemm("grouped_gemm_dglu", **axes)
    v = op.variant
    beta = torch.rand(len(SIZES), generator=g) + 0.5
    c = (torch.randn(a.shape[0], 2 * n, generator=g) * 2).to(getattr(torch, v.c_dtype))
    out, ref = _run(torch, op, a, offsets, w, {"alpha": alpha, "beta": beta, "prob": prob, "c": c}, weights)

    valid, e = int(offsets[-1]), _expert_of_rows()
    assert out["d"].shape == (a.shape[0], 2 * n) and out["dprob"].shape == (a.shape[0],)
    _close(_host(out["d"])[:valid], np.asarray(ref.out_values["d"], np.float64)[:valid], v.d_dtype, "d vs reference")
    r = alpha.double().numpy()[e, None] ** 2 * _gemm64(a, w)
    gate, up = _split(beta.double().numpy()[e, None] * c.double().numpy()[:valid])
    p = prob.double().numpy()[:valid, None]
    s = _sigmoid(gate)
    d = _interleave(r * p * up * s * (1 + gate * (1 - s)), r * p * gate * s)
    _close(_host(out["d"])[:valid], d, v.d_dtype, "d vs formula")
    terms = np.abs(np.asarray(ref.values["dp"], np.float64)).sum(axis=1)
    got_p = _host(out["dprob"])[:valid]
    _dprob_close(got_p, np.asarray(ref.dprob, np.float64)[:valid], terms, "dprob vs reference")
    _dprob_close(got_p, np.sum(gate * s * up * r, axis=1), terms, "dprob vs formula")
    _tails_zero(out, valid, ["d", "dprob"])


@pytest.mark.parametrize("case", DSRELU_CASES, ids=_ids)
def test_dsrelu_end_to_end(torch, case):
    """dsReLU from the forward's pre-activation C: D = 2 prob relu(C) G, dprob, and the
    per-expert amax of a 16-bit D, against the reference and the formula."""
    from fusegemm import EpilogueGemm
    axes, n, weights = case
    g, a, offsets, w, alpha, prob = _problem(torch, n=n, seed=3)
    op = EpilogueGemm("grouped_gemm_dsrelu", **axes)
    v = op.variant
    c = (torch.randn(a.shape[0], n, generator=g) * 2).to(getattr(torch, v.c_dtype))
    out, ref = _run(torch, op, a, offsets, w, {"alpha": alpha, "prob": prob, "c": c}, weights)

    valid, e = int(offsets[-1]), _expert_of_rows()
    _close(_host(out["d"])[:valid], np.asarray(ref.out_values["d"], np.float64)[:valid], v.d_dtype, "d vs reference")
    gg = alpha.double().numpy()[e, None] * _gemm64(a, w)
    rc = np.maximum(c.double().numpy()[:valid], 0.0)
    d = 2.0 * prob.double().numpy()[:valid, None] * rc * gg
    _close(_host(out["d"])[:valid], d, v.d_dtype, "d vs formula")
    terms = np.abs(np.asarray(ref.values["dp"], np.float64)).sum(axis=1)
    got_p = _host(out["dprob"])[:valid]
    _dprob_close(got_p, np.asarray(ref.dprob, np.float64)[:valid], terms, "dprob vs reference")
    _dprob_close(got_p, np.sum(rc * rc * gg, axis=1), terms, "dprob vs formula")
    _tails_zero(out, valid, ["d", "dprob"])
    if v.d_dtype in ("bfloat16", "float16"):
        got = out["amax"].cpu().numpy().astype(np.float64).reshape(-1)
        want = np.asarray(ref.amax, np.float64).reshape(-1)
        assert got[1] == -np.inf and want[1] == -np.inf, (got, want)   # the empty expert
        fin = np.isfinite(want)
        assert fin.sum() == 3 and np.all(np.abs(got[fin] - want[fin]) <= 2.0 ** -10 * want[fin]), (got, want)
    else:
        assert "amax" not in out


def test_glu_forward_then_dglu_backward(torch):
    """The MoE pairing: the GLU's stored C (bf16, bias-free, alpha applied) read by dGLU with
    beta = 1, as cuDNN's training loop chains the two; the backward against the reference
    computed from the C the forward kernel wrote."""
    from fusegemm import EpilogueGemm
    n_fwd = 256
    g, a, offsets, w1, alpha, prob = _problem(torch, n=n_fwd, k=128, seed=4)
    fwd = EpilogueGemm("grouped_gemm_glu", **CHAIN_AXES[0])
    out_f = fwd(a.cuda(), offsets.cuda(), w1.cuda(), inputs={"alpha": alpha.cuda(), "prob": prob.cuda()})
    dy = (torch.randn(a.shape[0], 128, generator=g) * 0.5).to(torch.bfloat16)
    w2t = (torch.randn(len(SIZES), n_fwd // 2, 128, generator=g) * 0.1).to(torch.bfloat16)   # (L, F, H)
    bwd = EpilogueGemm("grouped_gemm_dglu", **CHAIN_AXES[1])
    ones = torch.ones(len(SIZES))
    dev = {"alpha": ones.cuda(), "beta": ones.cuda(), "prob": prob.cuda(), "c": out_f["c"]}
    out_b = bwd(dy.cuda(), offsets.cuda(), w2t.cuda(), inputs=dev)
    torch.cuda.synchronize()
    c_host = out_f["c"].cpu()
    ref = bwd.reference(dy, offsets, w2t, inputs={"alpha": ones, "beta": ones, "prob": prob, "c": c_host})
    valid = int(offsets[-1])
    _close(_host(out_b["d"])[:valid], np.asarray(ref.out_values["d"], np.float64)[:valid], "bfloat16", "dG")
    terms = np.abs(np.asarray(ref.values["dp"], np.float64)).sum(axis=1)
    _dprob_close(_host(out_b["dprob"])[:valid], np.asarray(ref.dprob, np.float64)[:valid], terms, "dprob")
    _tails_zero(out_b, valid, ["d", "dprob"])
