"""``row_ends`` on the H200: the sm_90a kernels walk only the M tiles that hold a token (the
compacted tile space, fusegemm/scheduler.cuh) and skip the K-grouped k-blocks after each
expert's row end. Every row of a tile that holds a token equals the op without row ends bit for
bit; the rows of the other tiles come back zero (the tail kernel zeroes them before the launch);
the K-grouped result is unchanged where the padding rows are zero, as an MoE layer's are.
Ragged experts, an empty one, row ends on a tile boundary and inside a tile; 160 experts over
several bands of the raster; row ends outside their expert's range (clamped to it). The cluster
kernel runs every tile (no compacted walk); its tiles past the row end come back zero from the zero
rows."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from fusegemm.ops.engine import Op  # noqa: E402

pytestmark = pytest.mark.gpu

TOKENS = [300, 0, 256, 129, 700]   # per expert: ragged, empty, a whole 256, one past a 128 tile


def _problem(seed, k=256, n=256, tokens=TOKENS, shift=None):
    """``shift``: added to each row end (a row end outside its expert's range is clamped to it)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    padded = [-(-t // 256) * 256 for t in tokens]
    off = torch.tensor(padded, device="cuda").cumsum(0).to(torch.int32)
    begin = off - torch.tensor(padded, device="cuda", dtype=torch.int32)
    ends = (begin + torch.tensor(tokens, device="cuda", dtype=torch.int32)).to(torch.int32)
    if shift is not None:
        ends = (ends + torch.tensor(shift, device="cuda", dtype=torch.int32)).to(torch.int32)
    m = sum(padded)
    rows = torch.arange(m, device="cuda")
    e_of = torch.searchsorted(off, rows.to(torch.int32), right=True)
    valid = rows < ends[e_of.clamp(max=len(tokens) - 1)]
    a = torch.randn(m, k, generator=g, device="cuda").bfloat16() * valid[:, None]   # padding rows zero
    w = torch.randn(len(tokens), n, k, generator=g, device="cuda").bfloat16() * 0.05
    return a, w, off, ends, e_of, valid, begin


def _many(seed=7, experts=160):
    """160 experts of 0 to 700 tokens (a fifth empty): the compacted walk crosses many bands."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 701, (experts,), generator=g)
    return [0 if i % 5 == 3 else int(t) for i, t in enumerate(tokens)]


# (tokens, row-end shift): the ragged five; 160 experts; row ends past their padded range
# (expert 0: +1000, the whole range) and before it (expert 2: -600, no tile).
PROBLEMS = {"ragged": (TOKENS, None), "many": (_many(), None), "outside": (TOKENS, [1000, 0, -600, 0, 0])}


@pytest.mark.parametrize("problem", list(PROBLEMS))
@pytest.mark.parametrize("axes", [dict(tile_m=128, tile_n=256), dict(tile_m=64, tile_n=128),
                                  dict(tile_m=128, tile_n=256, scheduler="dynamic"),
                                  dict(tile_m=128, tile_n=256, a_gather=True),
                                  dict(tile_m=128, tile_n=256, cluster_m=2)],
                         ids=lambda a: ".".join(map(str, a.values())))
def test_grouped_tiles_past_the_row_end_are_skipped_and_zero(axes, problem):
    tokens, shift = PROBLEMS[problem]
    a, w, off, ends, e_of, valid, begin = _problem(1, n=768 if problem == "many" else 256, tokens=tokens,
                                                   shift=shift)
    l = len(tokens)
    inputs = {"alpha": torch.rand(l, device="cuda") + 0.5}
    op = Op("grouped_gemm", **axes)
    kw = {}
    if axes.get("a_gather"):   # A's rows through an index (here the identity): the copying warps' walk
        kw["a_index"] = torch.arange(a.shape[0], device="cuda", dtype=torch.int32)
    got = op(a, off, w, row_ends=ends, inputs=inputs, **kw)["d"]
    want = op(a, off, w, inputs=inputs, **kw)["d"]
    torch.cuda.synchronize()
    tm = axes["tile_m"]
    rows = torch.arange(a.shape[0], device="cuda")
    tile_start = rows // tm * tm
    end = torch.minimum(torch.maximum(ends, begin), off)   # a row end clamped to its expert's range
    computed = tile_start < end[e_of]             # the tile holds a token of its expert
    assert torch.equal(got[computed], want[computed])
    assert not got[~computed].any()
    assert int((~computed).sum()) > 0             # the problem does skip tiles


@pytest.mark.parametrize("gather", [False, True])
def test_kgrouped_k_blocks_past_the_row_end_are_skipped(gather):
    a, w, off, ends, e_of, valid, _ = _problem(2, k=128, n=256)
    dy = torch.randn(a.shape[0], 256, device="cuda").bfloat16() * valid[:, None]
    kw, x = {}, a
    op = Op("grouped_gemm_wgrad", d_dtype="float32", b_gather=gather)
    if gather:   # x's token rows through an index: padding rows read -1 (zeros)
        idx = torch.where(valid, torch.arange(a.shape[0], device="cuda"), -1).to(torch.int32)
        kw["x_index"] = idx
    got = op(dy, x, off, row_ends=ends, **kw)["d"]
    want = Op("grouped_gemm_wgrad", d_dtype="float32")(dy, a, off)["d"]
    torch.cuda.synchronize()
    assert torch.equal(got, want)
    # The k-blocks after the row end are not read: garbage there (dY and X both) leaves the
    # result as it was, and changes it without row ends.
    rows = torch.arange(a.shape[0], device="cuda")
    begin = off - torch.tensor([-(-t // 256) * 256 for t in TOKENS], device="cuda", dtype=torch.int32)
    read_to = begin + (ends - begin + 63) // 64 * 64
    unread = rows >= read_to[e_of]
    dirty_dy, dirty_x = dy.clone(), a.clone()
    dirty_dy[unread], dirty_x[unread] = 1.0, 1.0
    if gather:
        kw["x_index"] = torch.where(unread, 0, kw["x_index"]).to(torch.int32)   # row 0: not zero
        dirty_x[unread] = a[0]
    assert torch.equal(op(dirty_dy, dirty_x if not gather else x, off, row_ends=ends, **kw)["d"], want)
    assert not torch.equal(Op("grouped_gemm_wgrad", d_dtype="float32")(dirty_dy, dirty_x, off)["d"], want)


@pytest.mark.parametrize("experts,row_bytes,most", [(5, 512, 600), (160, 1536, 600), (1024, 16, 2)],
                         ids=["5-experts", "160-experts", "1024-experts-narrow"])
def test_the_tail_kernel_zeroes_exactly_the_rows_past_each_row_end(experts, row_bytes, most):
    """fusegemm/zero_tail.cuh on dirty buffers: rows at or past the last offset and each expert's
    rows past its row end become zero, every other byte is untouched; experts share the grid
    (more blocks than experts, and fewer: 1024 experts of at most one token in 16-byte rows get a
    grid of about 512 blocks)."""
    from fusegemm.ops import tail
    g = torch.Generator().manual_seed(experts)
    tokens = torch.randint(0, most, (experts,), generator=g)
    padded = (tokens + 255) // 256 * 256
    off = padded.cumsum(0)
    m = int(off[-1]) + 512                                    # a tail past the last offset too
    ends = off - padded + tokens
    ends[::7] += 1000                                         # past the range: nothing of it zeroed
    bufs = [torch.full((m, row_bytes // 2), 7, dtype=torch.int16, device="cuda") for _ in range(2)]
    off_d, ends_d = off.to(torch.int32).cuda(), ends.to(torch.int32).cuda()
    tail.zero_tail(bufs, off_d.data_ptr(), experts, m, torch.cuda.current_stream().cuda_stream, 0, ends_d.data_ptr())
    torch.cuda.synchronize()
    rows = torch.arange(m)
    e_of = torch.searchsorted(off, rows, right=True).clamp(max=experts - 1)
    zero = (rows >= int(off[-1])) | (rows >= torch.minimum(ends, off)[e_of])
    for b in bufs:
        got = b.cpu()
        assert not got[zero].any()
        assert (got[~zero] == 7).all()
