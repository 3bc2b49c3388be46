"""The K-grouped weight-gradient kernel (specs/grouped_gemm_wgrad.yaml, fusegemm.KGroupedGemm) on
the GPU: dW_e = alpha_e dY_e^T X_e against the float64 reference within the FP32 accumulation
bound, on ragged and empty experts, N tails, every tile, and against torch._grouped_mm."""
from __future__ import annotations

import numpy as np
import pytest

torch_module = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu


@pytest.fixture
def torch():
    return torch_module


def _problem(torch, tokens, m, n, seed=0):
    """dY (T, M), X (T, N) bfloat16 with each expert's rows padded to 256 with zeros (as the MoE
    layer pads them), padded_offsets, alpha."""
    g = torch.Generator().manual_seed(seed)
    sizes = [-(-t // 256) * 256 for t in tokens]
    t_all = sum(sizes)
    dy = torch.zeros(t_all, m)
    x = torch.zeros(t_all, n)
    start = 0
    for tok, size in zip(tokens, sizes):
        dy[start:start + tok] = torch.randn(tok, m, generator=g)
        x[start:start + tok] = torch.randn(tok, n, generator=g)
        start += size
    off = torch.tensor(np.cumsum(sizes), dtype=torch.int32)
    alpha = torch.rand(len(sizes), generator=g) + 0.5
    return dy.to(torch.bfloat16), x.to(torch.bfloat16), off, alpha


def _check(out, op, dy, x, off, inputs, d_dtype):
    ref = np.asarray(op.reference(dy, x, off, inputs=inputs).out_values["d"], dtype=np.float64)
    l, m, n = off.shape[0], dy.shape[1], x.shape[1]
    got = out["d"].float().cpu().numpy().astype(np.float64).reshape(l * m, n)
    bound = np.zeros_like(ref)
    a64, b64 = np.abs(dy.double().numpy()), np.abs(x.double().numpy())
    start = 0
    for e, end in enumerate(off.tolist()):
        alpha = float(inputs["alpha"][e]) if "alpha" in inputs else 1.0
        bound[e * m:(e + 1) * m] = alpha * (a64[start:end].T @ b64[start:end])
        start = end
    k = max(1, int(np.diff(np.concatenate([[0], off.numpy()])).max()))
    rel = 2.0 ** -8 if d_dtype == "bfloat16" else 2.0 ** -22
    assert np.all(np.abs(got - ref) <= k * 2.0 ** -24 * bound + rel * np.abs(ref) + 1e-30)
    return ref, got


CASES = [  # (tokens per expert, M, N, tile_m, tile_n, d_dtype)
    ([256, 0, 700, 100], 256, 192, 128, 256, "bfloat16"),
    ([512, 300], 128, 200, 128, 128, "float32"),
    ([256, 256, 256], 192, 136, 64, 128, "float32"),
    ([1000, 0, 0], 384, 256, 128, 256, "bfloat16"),
    ([0, 0], 128, 128, 128, 128, "float32"),
    # 256 tiles: several per CTA (D stored during the next tile's mainloop), tokenless experts
    ([512, 0, 1300, 256, 0, 768, 64, 2000], 1024, 1000, 128, 256, "bfloat16"),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, [c[0], *c[1:]])).replace(" ", ""))
def test_weight_gradient_matches_the_reference(torch, case):
    from fusegemm import KGroupedGemm
    tokens, m, n, tm, tn, d_dtype = case
    dy, x, off, alpha = _problem(torch, tokens, m, n)
    op = KGroupedGemm("grouped_gemm_wgrad", d_dtype=d_dtype, tile_m=tm, tile_n=tn)
    inputs = {"alpha": alpha}
    out = op(dy.cuda(), x.cuda(), off.cuda(), inputs={"alpha": alpha.cuda()})
    torch.cuda.synchronize()
    assert out["d"].shape == (len(tokens), m, n)
    ref, got = _check(out, op, dy, x, off, inputs, d_dtype)
    for e, tok in enumerate(tokens):
        if tok == 0:
            assert not got[e * m:(e + 1) * m].any()      # an expert without tokens: zeros
    assert np.abs(got).max() > 0 or not any(tokens)


def test_matches_torch_grouped_mm(torch):
    """The MoE layer's weight gradient as torch computes it: torch._grouped_mm(dy.t(), x, offs)."""
    from fusegemm import KGroupedGemm
    if not hasattr(torch, "_grouped_mm"):
        pytest.skip("torch._grouped_mm is not in this torch")
    dy, x, off, _ = _problem(torch, [1024, 512, 0, 768], 512, 384, seed=3)
    dy, x, off = dy.cuda(), x.cuda(), off.cuda()
    ours = KGroupedGemm("grouped_gemm_wgrad")(dy, x, off)["d"]          # BF16, as torch's
    theirs = torch._grouped_mm(dy.t(), x, offs=off)
    assert ours.shape == theirs.shape and ours.dtype == theirs.dtype
    # Sums of up to 1024 products of N(0, 1) values (|d| ~ 32): a BF16 ulp or two apart.
    assert torch.allclose(ours.float(), theirs.float(), rtol=2.0 ** -6, atol=0.25)


@pytest.mark.parametrize("tile", [(64, 128), (64, 256)])
def test_pingpong_short_experts_match_the_cooperative_tile(torch, tile):
    """Ping-pong tiles (TILE_M 64: two consumer warpgroups in turn) on 512 tokens per expert (8
    k-blocks) and 28,672 tiles: without the warpgroups' mainloop order this shape read stages a
    phase early and faulted on the H200. Each output element accumulates the same k16 steps in
    the same order whatever the tile, so the result equals the cooperative 128 x 256 kernel's
    bit for bit."""
    from fusegemm import KGroupedGemm
    g = torch.Generator(device="cuda").manual_seed(5)
    l, per, m, n = 8, 512, 4096, 7168
    dy = torch.randn(l * per, m, generator=g, device="cuda").to(torch.bfloat16)
    x = torch.randn(l * per, n, generator=g, device="cuda").to(torch.bfloat16)
    off = torch.arange(1, l + 1, dtype=torch.int32, device="cuda") * per
    ours = KGroupedGemm("grouped_gemm_wgrad", tile_m=tile[0], tile_n=tile[1])(dy, x, off)["d"]
    coop = KGroupedGemm("grouped_gemm_wgrad", tile_m=128, tile_n=256)(dy, x, off)["d"]
    torch.cuda.synchronize()
    assert torch.equal(ours, coop)
    assert ours.float().abs().max() > 0


def test_output_is_whole_on_reused_memory(torch):
    """D is allocated uninitialised (the kernel stores every tile, zeros for an expert without
    tokens): on memory full of NaN bytes (the outputs land on the poisoned block: asserted) it
    still equals the reference everywhere."""
    from fusegemm import KGroupedGemm
    dy, x, off, alpha = _problem(torch, [512, 0, 300, 256], 512, 1024, seed=4)
    op = KGroupedGemm("grouped_gemm_wgrad", d_dtype="float32")
    dyc, xc, offc = dy.cuda(), x.cuda(), off.cuda()
    op(dyc, xc, offc, inputs={"alpha": alpha.cuda()})
    junk = torch.full((4 * 512 * 1024 * 4,), 255, dtype=torch.uint8, device="cuda")
    ptr = junk.data_ptr()
    torch.cuda.synchronize()
    del junk
    out = op(dyc, xc, offc, inputs={"alpha": alpha.cuda()})
    torch.cuda.synchronize()
    assert out["d"].data_ptr() == ptr, "the output did not reuse the poisoned block"
    _, got = _check(out, op, dy, x, off, {"alpha": alpha}, "float32")
    assert not got[512:1024].any()                # the expert without tokens



M_MAJOR_CASES = [  # (tokens per expert, M, N, tile_m, tile_n, d_dtype)
    ([256, 0, 700, 100], 256, 192, 128, 256, "bfloat16"),     # deferred stores (stmatrix.trans), an N tail
    ([512, 300], 128, 200, 128, 128, "float32"),               # FP32 element stores, a tail inside a chunk
    ([256, 256, 256], 192, 136, 64, 128, "bfloat16"),          # ping-pong tiles: BF16 element stores
    ([512, 0, 1300, 256, 0, 768, 64, 2000], 1024, 1000, 128, 256, "bfloat16"),   # several tiles per CTA
]


@pytest.mark.parametrize("case", M_MAJOR_CASES, ids=lambda c: "-".join(map(str, [c[0], *c[1:]])).replace(" ", ""))
def test_m_major_d_is_the_n_major_kernels_transpose(torch, case):
    """cd_major m stores D_e^T, (L, N, M): bit for bit the N-major kernel's D transposed (the same
    accumulation; only the stores differ: TileTransposedStore for the deferred BF16 D, else
    WarpTransposedStore), and within the reference's bound; zeros for an expert without tokens, on
    an output allocated uninitialised."""
    from fusegemm import KGroupedGemm
    tokens, m, n, tm, tn, d_dtype = case
    dy, x, off, alpha = _problem(torch, tokens, m, n, seed=6)
    kw = dict(d_dtype=d_dtype, tile_m=tm, tile_n=tn)
    n_major = KGroupedGemm("grouped_gemm_wgrad", **kw)
    args, inputs = (dy.cuda(), x.cuda(), off.cuda()), {"alpha": alpha.cuda()}
    got = KGroupedGemm("grouped_gemm_wgrad", cd_major="m", **kw)(*args, inputs=inputs)["d"]
    want = n_major(*args, inputs=inputs)["d"]
    torch.cuda.synchronize()
    assert got.shape == (len(tokens), n, m) and got.is_contiguous()
    assert torch.equal(got, want.transpose(1, 2))
    _check({"d": got.transpose(1, 2)}, n_major, dy, x, off, {"alpha": alpha}, d_dtype)
    for e, tok in enumerate(tokens):
        if tok == 0:
            assert not got[e].any()


def test_swapped_gathered_weight_gradient(torch):
    """The MoE layer's fc1 weight gradient with its roles swapped: dW1_e = (X_e^T dG_e)^T, X's
    token rows gathered as A (dy_index) and D stored M-major, so that it lands as (L, 2F, H) like
    dG^T X on pre-permuted rows (the layer's kernel today). The products are the same, summed in
    WGMMAs with the operands' roles swapped: equal within the FP32 accumulation's bound (and the
    padding rows, index -1, read zeros)."""
    from fusegemm import KGroupedGemm
    from fusegemm.routing import _rows_of_tokens_torch
    g = torch.Generator(device="cuda").manual_seed(9)
    tokens, hidden, two_f = 700, 384, 256
    padded = [512, 0, 256, 768]
    t = sum(padded)
    off = torch.tensor(padded, device="cuda").cumsum(0).to(torch.int32)
    x_tok = torch.randn(tokens, hidden, generator=g, device="cuda").bfloat16()
    idx = torch.randint(-1, tokens, (t,), generator=g, device="cuda", dtype=torch.int32)
    rows = _rows_of_tokens_torch(x_tok, idx.long())     # the layer's gather (zeros for -1)
    dg = torch.randn(t, two_f, generator=g, device="cuda").bfloat16()
    dg[idx < 0] = 0                        # (the layer's padding rows hold zeros in both operands)
    got = KGroupedGemm("grouped_gemm_wgrad", d_dtype="float32", a_gather=True, cd_major="m")(
        x_tok, dg, off, dy_index=idx)["d"]
    plain = KGroupedGemm("grouped_gemm_wgrad", d_dtype="float32")
    want = plain(dg, rows, off)["d"]
    swapped_plain = KGroupedGemm("grouped_gemm_wgrad", d_dtype="float32", cd_major="m")(rows, dg, off)["d"]
    torch.cuda.synchronize()
    assert got.shape == want.shape == (4, two_f, hidden)
    assert torch.equal(got, swapped_plain)         # gathered: bit-equal to the same kernel on the rows
    _check({"d": got}, plain, dg.cpu(), rows.cpu(), off.cpu(), {}, "float32")
    assert not got[1].any()
