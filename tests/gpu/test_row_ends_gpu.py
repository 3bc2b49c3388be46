"""``row_ends`` on the H200: the sm_90a kernels skip the M tiles past each expert's row end (and
the K-grouped k-blocks after it). Every row of a tile that holds a token equals the op without
row ends bit for bit; the rows of skipped tiles come back zero (the tail kernel zeroes them before
the launch); the K-grouped result is unchanged where the padding rows are zero, as an MoE
layer's are. Ragged experts, an empty one, row ends on a tile boundary and inside a tile."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from fusegemm.ops.engine import Op  # noqa: E402

pytestmark = pytest.mark.gpu

TOKENS = [300, 0, 256, 129, 700]   # per expert: ragged, empty, a whole 256, one past a 128 tile


def _problem(seed, k=256, n=256):
    g = torch.Generator(device="cuda").manual_seed(seed)
    padded = [-(-t // 256) * 256 for t in TOKENS]
    off = torch.tensor(padded, device="cuda").cumsum(0).to(torch.int32)
    begin = off - torch.tensor(padded, device="cuda", dtype=torch.int32)
    ends = (begin + torch.tensor(TOKENS, device="cuda", dtype=torch.int32)).to(torch.int32)
    m = sum(padded)
    rows = torch.arange(m, device="cuda")
    e_of = torch.searchsorted(off, rows.to(torch.int32), right=True)
    valid = rows < ends[e_of.clamp(max=len(TOKENS) - 1)]
    a = torch.randn(m, k, generator=g, device="cuda").bfloat16() * valid[:, None]   # padding rows zero
    w = torch.randn(len(TOKENS), n, k, generator=g, device="cuda").bfloat16() * 0.05
    return a, w, off, ends, e_of, valid


@pytest.mark.parametrize("axes", [dict(tile_m=128, tile_n=256), dict(tile_m=64, tile_n=128),
                                  dict(tile_m=128, tile_n=256, scheduler="dynamic")],
                         ids=lambda a: ".".join(map(str, a.values())))
def test_grouped_tiles_past_the_row_end_are_skipped_and_zero(axes):
    a, w, off, ends, e_of, valid = _problem(1)
    l = len(TOKENS)
    inputs = {"alpha": torch.rand(l, device="cuda") + 0.5}
    op = Op("grouped_gemm", **axes)
    got = op(a, off, w, row_ends=ends, inputs=inputs)["d"]
    want = op(a, off, w, inputs=inputs)["d"]
    torch.cuda.synchronize()
    tm = axes["tile_m"]
    rows = torch.arange(a.shape[0], device="cuda")
    tile_start = rows // tm * tm
    computed = tile_start < ends[e_of]            # the tile holds a token of its expert
    assert torch.equal(got[computed], want[computed])
    assert not got[~computed].any()
    assert int((~computed).sum()) > 0             # the problem does skip tiles


@pytest.mark.parametrize("gather", [False, True])
def test_kgrouped_k_blocks_past_the_row_end_are_skipped(gather):
    a, w, off, ends, e_of, valid = _problem(2, k=128, n=256)
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
