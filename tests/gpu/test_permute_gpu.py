"""The MoE layer's permutation kernels (fusegemm/permute.py) on the GPU against plain
indexing: ``gather_rows`` bit-exact (a copy, zeros for padding and for every index outside the
source, so no index value can fault), ``sum_rows`` against a float64 sum of the same rows rounded
once to the dtype (tolerance: one ulp of the dtype, as the kernel rounds an FP32 sum once), and
``route_rows`` equal to torch's operations (padded offsets, the row of every choice, the token of
every row), and the routing functions' results on the kernels equal to torch's operations' results.
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from fusegemm import routing  # noqa: E402
from fusegemm import permute  # noqa: E402

pytestmark = pytest.mark.gpu


# permute.cuh's A/B switches of the gather (streaming stores on by default since the H200 timed
# them, the pipeline off: bench/permute.py --also): every build must copy the same rows.
BUILDS = {"default": "", "pipeline": "-DFUSEGEMM_PERMUTE_GATHER_PIPELINE=1 -DFUSEGEMM_PERMUTE_STREAM_STORES=0",
          "pipeline_stream": "-DFUSEGEMM_PERMUTE_GATHER_PIPELINE=1",
          "plain": "-DFUSEGEMM_PERMUTE_STREAM_STORES=0"}


@pytest.fixture(params=list(BUILDS))
def build(request, monkeypatch):
    """permute.py's kernels built with one of BUILDS' defines for the test."""
    if BUILDS[request.param]:
        monkeypatch.setattr(permute, "_KERNELS", permute._KERNELS.variant(BUILDS[request.param]))
    return request.param


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.int8])
# Rows of 4 .. 1792 16-byte vectors (the pipelined build's whole groups of 4 x 256 and its last,
# shorter group), and more rows than the grid's 4096 blocks (its next index read ahead).
@pytest.mark.parametrize("tokens,hidden,rows", [(700, 256, 1024), (1, 8 * 64, 256), (4096, 7168, 512), (5, 64, 0),
                                                (300, 64, 9000)])
def test_gather_rows_copies_rows_and_reads_zeros_outside_the_source(dtype, tokens, hidden, rows, build):
    g = torch.Generator(device="cuda").manual_seed(1)
    x = (torch.randn(tokens, hidden, generator=g, device="cuda") * 20).to(dtype)
    index = torch.randint(-1, tokens, (rows,), generator=g, device="cuda")
    if rows:
        index[0], index[-1] = tokens, -(2 ** 40)         # past the end, far below: zeros, no fault
    got = permute.gather_rows(x, index)
    want = torch.where(((index >= 0) & (index < tokens))[:, None], x[index.clamp(0, tokens - 1)],
                       torch.zeros((), dtype=dtype, device="cuda"))
    torch.cuda.synchronize()
    assert got.shape == (rows, hidden) and got.dtype == dtype
    assert torch.equal(got, want)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.int8])
# dsv3's x (4096 x 7168, top-k 8 of 32 experts), a single token, rows past the grid's 4096 blocks,
# and experts nobody picks; every build of the switches.
@pytest.mark.parametrize("tokens,experts,top_k,hidden", [(4096, 32, 8, 7168), (1, 4, 2, 64), (5000, 8, 2, 64),
                                                         (300, 160, 8, 256)])
def test_gather_in_token_order_is_the_row_order_gather(dtype, tokens, experts, top_k, hidden, build):
    """gather_rows with the routing's row_of (fusegemm_spread_rows: each token's row read once and
    stored to its k rows, then the padding rows zeroed): the same bytes as the row-order gather
    and as plain indexing, on memory full of NaN bytes beforehand; an entry of row_of outside
    [0, R) (what route_rows writes for an expert outside [0, E)) stores nothing."""
    g = torch.Generator(device="cuda").manual_seed(3)
    x = (torch.randn(tokens, hidden, generator=g, device="cuda") * 20).to(dtype)
    logits = torch.randn(tokens, experts, generator=g, device="cuda")
    logits[:, 0] = -1e4                                  # an expert nobody picks
    r = routing.route(logits, top_k)
    junk = torch.full((r.rows * hidden * x.element_size(),), 255, dtype=torch.uint8, device="cuda")
    del junk                                             # (the output may land on these bytes)
    got = permute.gather_rows(x, r.token_of_row, r.row_of)
    want = permute.gather_rows(x, r.token_of_row)
    torch.cuda.synchronize()
    assert torch.equal(got, want)
    assert torch.equal(got, routing._rows_of_tokens_torch(x, r.token_of_row))
    if tokens > 1:
        row_of = r.row_of.clone()
        dropped = row_of[1, 0].item()
        row_of[1, 0] = r.rows                            # names no row: that row is left as it was
        out = permute.gather_rows(x, r.token_of_row, row_of)
        torch.cuda.synchronize()
        keep = torch.ones(r.rows, dtype=torch.bool, device="cuda")
        keep[dropped] = False
        assert torch.equal(out[keep], want[keep])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("tokens,k,hidden", [(700, 8, 256), (33, 1, 64), (64, 2, 7168), (9, 5, 16), (0, 2, 64)])
def test_sum_rows_is_the_fp32_sum_in_choice_order_rounded_once(dtype, tokens, k, hidden):
    g = torch.Generator(device="cuda").manual_seed(2)
    rows = (torch.randn(tokens * k + 300, hidden, generator=g, device="cuda") * 3).to(dtype)
    index = torch.randperm(rows.shape[0], generator=g, device="cuda")[:tokens * k].view(tokens, k)
    got = permute.sum_rows(rows, index)
    want = rows.double()[index].sum(1)
    torch.cuda.synchronize()
    assert got.shape == (tokens, hidden) and got.dtype == dtype
    ulp = {torch.bfloat16: 2 ** -7, torch.float16: 2 ** -10, torch.float32: 2 ** -22}[dtype]
    # One rounding of the FP32 sum to the dtype, plus FP32's own rounding over k adds.
    tol = ulp * want.abs() + k * 2 ** -23 * rows.double().abs()[index].sum(1) + 1e-30
    assert ((got.double() - want).abs() <= tol).all()


def test_pitched_rows_and_fallbacks():
    x = torch.randn(64, 96, device="cuda").bfloat16()
    view = x[:, :64]                                   # row pitch 192 bytes: served
    index = torch.arange(-1, 63, device="cuda")
    assert torch.equal(permute.gather_rows(view, index)[1:], view[:63])
    assert permute.gather_rows(x[:, :3], index) is None          # 6-byte rows: torch's route
    assert permute.sum_rows(x.to(torch.int32), index.view(32, 2)) is None   # no integer sum
    assert permute.gather_rows(x, index.int()) is None           # int32 index: torch's route
    # The routing functions take torch's route there and agree with it.
    r = routing.route(torch.randn(64, 4, device="cuda"), 2)
    odd = torch.randn(64, 3, device="cuda").bfloat16()
    assert torch.equal(routing.gather(odd, r), routing._rows_of_tokens_torch(odd, r.token_of_row))


@pytest.mark.parametrize("top_k", [1, 2, 8])
def test_routing_on_the_kernels_equals_torch_operations(top_k):
    g = torch.Generator(device="cuda").manual_seed(5)
    tokens, hidden, experts = 300, 128, 8
    logits = torch.randn(tokens, experts, generator=g, device="cuda")
    x = torch.randn(tokens, hidden, generator=g, device="cuda").bfloat16().requires_grad_()
    r = routing.route(logits, top_k)
    rows = routing.gather(x, r)
    assert torch.equal(rows, routing._rows_of_tokens_torch(x.detach(), r.token_of_row))
    y = routing.combine(rows.float() * 1.5, r)
    want = routing._sum_rows_torch(rows.detach().float() * 1.5, r.row_of)
    assert torch.allclose(y, want, rtol=1e-6, atol=1e-6)
    y.sum().backward()                                 # gather's backward: the combine of ones * 1.5
    assert torch.allclose(x.grad.float(), torch.full_like(x.grad.float(), 1.5 * top_k))


def test_the_custom_ops_trace_under_torch_compile():
    r = routing.route(torch.randn(256, 4, device="cuda"), 2)
    x = torch.randn(256, 64, device="cuda").bfloat16()

    def f(x):
        return routing.combine(routing.gather(x, r).float(), r)
    got = torch.compile(f, fullgraph=True)(x)
    assert torch.allclose(got, x.float() * 2, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("tokens,experts,k,skew", [
    (4096, 8, 8, False), (4096, 128, 8, False), (700, 256, 2, True), (3, 4, 4, False), (0, 5, 2, False),
    (1, 1, 1, False), (5000, 64, 1, True)])
def test_route_rows_equals_torchs_stable_sort(tokens, experts, k, skew):
    g = torch.Generator(device="cuda").manual_seed(tokens + experts)
    logits = torch.randn(tokens, experts, generator=g, device="cuda")
    if skew:
        logits[:, :3] += 4.0            # most tokens pick the first experts; many experts empty
    _, choice = routing.top_k(logits, k)
    rows = routing.padded_rows(tokens, experts, k)
    got = permute.route_rows(choice, experts, rows)
    want = routing._route_rows_torch(choice, experts, rows)
    torch.cuda.synchronize()
    assert len(got) == len(want) == 4
    for name, a, b in zip(("padded_offsets", "row_of", "token_of_row", "row_ends"), got, want):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), name


def test_route_rows_refuses_what_it_does_not_serve():
    choice = torch.zeros(4, 2, dtype=torch.int64, device="cuda")
    assert permute.route_rows(choice, 257, 1024) is None          # more experts than its table
    assert permute.route_rows(choice.int(), 8, 1024) is None
    assert permute.route_rows(choice.cpu(), 8, 1024) is None
