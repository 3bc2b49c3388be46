"""Gathered A on the H200 (``a_gather``: problem row r reads row ``a_index[r]`` of token-major A,
copied by the producer warp's cp.async; fusegemm/gather.cuh): every output bit-equal to the same kernel
run on the rows gathered beforehand (zeros for padding indices, for indices past A's rows and
for negative ones), on ragged and empty experts, both tile shapes, both schedulers, discrete
and N-major weights and the SwiGLU epilogue; and the plain GEMM within BF16 rounding of a
float64 product (an independent check of what both compute). The K-grouped weight gradients'
gathered token rows likewise."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from fusegemm.ops.engine import Op  # noqa: E402

pytestmark = pytest.mark.gpu


CASES = [
    ("grouped_gemm", dict(tile_m=128, tile_n=256)),
    ("grouped_gemm", dict(tile_m=64, tile_n=128)),
    ("grouped_gemm", dict(tile_m=128, tile_n=256, scheduler="dynamic")),
    ("grouped_gemm", dict(tile_m=128, tile_n=256, weight_mode="discrete")),
    ("grouped_gemm", dict(tile_m=128, tile_n=128, b_major="n")),
    ("grouped_gemm_swiglu", dict(tile_m=128, tile_n=256, d_dtype="bfloat16", generate_c=True)),
]


def _problem(seed, tokens=700, k=512, n=256, rows=(300, 0, 513, 1)):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(tokens, k, generator=g, device="cuda").bfloat16()
    padded = [-(-r // 256) * 256 for r in rows]
    off = torch.tensor(padded, device="cuda").cumsum(0).to(torch.int32)
    m = sum(padded) + 256                                   # rows past the last offset too
    idx = torch.full((m,), -1, dtype=torch.int32, device="cuda")
    start = 0
    for r, p in zip(rows, padded):
        idx[start:start + r] = torch.randint(0, tokens, (r,), generator=g, device="cuda", dtype=torch.int32)
        start += p
    idx[1], idx[2] = tokens + 5, -7                          # outside A: zeros, never a fault
    l = len(rows)
    w = torch.randn(l, n, k, generator=g, device="cuda").bfloat16() * 0.05
    return x, idx, off, w


def _gathered_rows(x, idx):
    valid = (idx >= 0) & (idx < x.shape[0])
    return torch.where(valid[:, None], x[idx.long().clamp(0, x.shape[0] - 1)], torch.zeros((), dtype=x.dtype,
                                                                                          device=x.device))


def _operands(x_or_rows, off, w, axes):
    if axes.get("weight_mode") == "discrete":
        return (x_or_rows, off), {"b_ptrs": torch.tensor([t.data_ptr() for t in w], device="cuda"), "n": w.shape[1]}, w
    if axes.get("b_major") == "n":
        wn = w.transpose(1, 2).contiguous().transpose(1, 2)   # (L, N, K) with N contiguous
        return (x_or_rows, off, wn), {}, wn
    return (x_or_rows, off, w), {}, w


@pytest.mark.parametrize("spec,axes", CASES, ids=lambda v: v if isinstance(v, str) else ".".join(map(str, v.values())))
def test_gathered_a_equals_the_kernel_on_pre_gathered_rows(spec, axes):
    x, idx, off, w = _problem(1)
    if spec == "grouped_gemm_swiglu":
        w = torch.cat([w, w * 0.5], 1)                        # 2N gate/up columns
    m = idx.shape[0]
    l = off.shape[0]
    inputs = {"alpha": torch.rand(l, device="cuda") + 0.5, "prob": torch.rand(m, device="cuda")}
    gathered = Op(spec, a_gather=True, **axes)
    plain = Op(spec, **axes)
    ops, kw, keep = _operands(x, off, w, axes)
    got = gathered(*ops, a_index=idx, inputs=inputs, **kw)
    rows = _gathered_rows(x, idx)
    ops2, kw2, keep2 = _operands(rows, off, w, axes)
    want = plain(*ops2, inputs=inputs, **kw2)
    torch.cuda.synchronize()
    assert list(got.keys()) == list(want.keys())   # a TupleDict iterates its values
    for name in want.keys():
        assert torch.equal(got[name], want[name]), name
    if spec == "grouped_gemm" and not axes.get("weight_mode"):
        # Independent of both kernels: D = prob * alpha[e] * rows @ w[e]^T, rows past the last offset 0.
        e_of = torch.searchsorted(off, torch.arange(m, device="cuda", dtype=torch.int32), right=True)
        ref = torch.zeros(m, w.shape[1], dtype=torch.float64, device="cuda")
        for e in range(l):
            sel = e_of == e
            ref[sel] = rows[sel].double() @ w[e].double().t() * float(inputs["alpha"][e])
        ref *= inputs["prob"].double()[:, None]
        err = (got["d"].double() - ref).abs()
        assert float((err - 2 ** -7 * ref.abs()).max()) <= 1e-3, float(err.max())


def test_dswiglu_reads_dy_token_rows_through_the_index():
    """fc2's data gradient with the dSwiGLU epilogue on a token-major dy (the MoE layer's output
    gradient, before any permutation): dG bit-equal to the kernel on pre-gathered rows, dprob
    within its atomic sums' order (N tiles add into each row)."""
    x, idx, off, w = _problem(2, k=512, n=256)
    m, l, f = idx.shape[0], off.shape[0], 256
    g = torch.Generator(device="cuda").manual_seed(9)
    c = torch.randn(m, 2 * f, generator=g, device="cuda").bfloat16()
    wn = w.transpose(1, 2).contiguous().transpose(1, 2)     # (L, N, K) read N-major, as the layer's w2
    inputs = {"alpha": torch.ones(l, device="cuda"), "prob": torch.rand(m, generator=g, device="cuda"), "c": c}
    axes = dict(tile_m=64, tile_n=256, b_major="n")
    got = Op("grouped_gemm_dswiglu_bf16", a_gather=True, **axes)(x, off, wn, a_index=idx, inputs=inputs)
    want = Op("grouped_gemm_dswiglu_bf16", **axes)(_gathered_rows(x, idx), off, wn, inputs=inputs)
    torch.cuda.synchronize()
    assert torch.equal(got["d"], want["d"])
    assert torch.allclose(got["dprob"], want["dprob"], rtol=1e-5, atol=1e-6)


def test_a_gathered_op_reused_on_new_indices_and_tokens():
    """The prepared launch re-reads a_index and A's address every call (the call memo keys
    shapes, not data): a second call with other tokens and indices of the same shapes."""
    op = Op("grouped_gemm", a_gather=True, tile_m=128, tile_n=256)
    for seed in (3, 4):
        x, idx, off, w = _problem(seed)
        inputs = {"alpha": torch.ones(off.shape[0], device="cuda")}
        got = op(x, off, w, a_index=idx, inputs=inputs)["d"]
        want = Op("grouped_gemm", tile_m=128, tile_n=256)(_gathered_rows(x, idx), off, w, inputs=inputs)["d"]
        torch.cuda.synchronize()
        assert torch.equal(got, want), seed


@pytest.mark.parametrize("ends", [False, True], ids=["no-ends", "row-ends"])
@pytest.mark.parametrize("axes", [dict(a_gather=True), dict(b_gather=True), dict(b_gather=True, tile_m=64, tile_n=128)],
                         ids=lambda a: ".".join(map(str, a)))
def test_kgrouped_gathered_tiles_of_several_experts_per_cta(axes, ends):
    """More tiles than SMs, so that each CTA walks tiles of two or three experts (the test above runs
    one tile a CTA): the copying lanes' token rows follow each tile's K range across experts, bit-equal
    to the kernel on rows gathered beforehand, with ragged, short (one k-block) and empty experts, and
    with the row ends, which shorten the K ranges."""
    g = torch.Generator(device="cuda").manual_seed(11)
    tokens, m, n = 900, 512, 1024
    counts = [700, 0, 64, 1, 300, 0, 513, 256, 90, 0, 1000, 5]   # 16 or 32 tiles an expert: 192+ tiles
    padded = [-(-c // 256) * 256 for c in counts]
    off = torch.tensor(padded, device="cuda").cumsum(0).to(torch.int32)
    t = sum(padded)
    idx = torch.full((t,), -1, dtype=torch.int32, device="cuda")
    start = 0
    for c, p in zip(counts, padded):
        idx[start:start + c] = torch.randint(0, tokens, (c,), generator=g, device="cuda", dtype=torch.int32)
        start += p
    row_ends = (off - torch.tensor(padded, device="cuda", dtype=torch.int32)
                + torch.tensor(counts, device="cuda", dtype=torch.int32)) if ends else None
    dy_tok = torch.randn(tokens, m, generator=g, device="cuda").bfloat16()
    x_tok = torch.randn(tokens, n, generator=g, device="cuda").bfloat16()
    got, want = _kgrouped_gathered_and_plain(axes, dy_tok, x_tok, idx, idx, off, row_ends=row_ends)
    assert torch.equal(got, want)
    assert want[4].abs().sum() > 0 and not want[1].any()


def _kgrouped_gathered_and_plain(axes, dy_tok, x_tok, dy_idx, x_idx, off, **kw):
    """The K-grouped weight gradient (FP32 D) with the operands ``axes`` gathers read through their
    indices, and the plain kernel on the rows gathered beforehand: (got, want)."""
    tiles = {"tile_m": axes.get("tile_m", 128), "tile_n": axes.get("tile_n", 256)}
    op = Op("grouped_gemm_wgrad", d_dtype="float32", **{k: v for k, v in axes.items() if k.endswith("gather")}, **tiles)
    plain = Op("grouped_gemm_wgrad", d_dtype="float32", **tiles)
    dy_rows, x_rows = _gathered_rows(dy_tok, dy_idx), _gathered_rows(x_tok, x_idx)
    dy_arg, x_arg = dy_rows, x_rows
    if axes.get("a_gather"):
        dy_arg, kw["dy_index"] = dy_tok, dy_idx
    if axes.get("b_gather"):
        x_arg, kw["x_index"] = x_tok, x_idx
    got = op(dy_arg, x_arg, off, **kw)["d"]
    want = plain(dy_rows, x_rows, off)["d"]
    torch.cuda.synchronize()
    return got, want


@pytest.mark.parametrize("axes", [dict(a_gather=True), dict(b_gather=True), dict(a_gather=True, b_gather=True),
                                  dict(b_gather=True, tile_m=64, tile_n=128)], ids=lambda a: ".".join(map(str, a)))
def test_kgrouped_gathered_token_rows_equal_the_kernel_on_pre_gathered_rows(axes):
    """The weight gradients with dY's and/or X's token rows read through an index (the MoE layer's
    dy and x before the permutation): bit-equal to the K-grouped kernel on the rows gathered
    beforehand, ragged and empty experts, padding and out-of-range indices."""
    g = torch.Generator(device="cuda").manual_seed(7)
    tokens, m, n = 500, 256, 256
    padded = [512, 0, 256, 768]
    t = sum(padded)
    off = torch.tensor(padded, device="cuda").cumsum(0).to(torch.int32)
    dy_tok = torch.randn(tokens, m, generator=g, device="cuda").bfloat16()
    x_tok = torch.randn(tokens + 3, n, generator=g, device="cuda").bfloat16()
    dy_idx = torch.randint(-1, tokens, (t,), generator=g, device="cuda", dtype=torch.int32)
    x_idx = torch.randint(-1, tokens + 3, (t,), generator=g, device="cuda", dtype=torch.int32)
    dy_idx[5], x_idx[6] = tokens + 100, -(2 ** 30)
    got, want = _kgrouped_gathered_and_plain(axes, dy_tok, x_tok, dy_idx, x_idx, off)
    assert torch.equal(got, want)
    assert not want[1].any()                                      # the expert without tokens: zeros
