"""A gathered A stored as well (``a_gather_store``, sm_90a) on the GPU: the op's ``a_rows`` holds, bit
for bit, row ``a_index[r]`` of A in each problem row r (zeros for an index outside A, the padding's
-1 included), zeros past the last offset and past the row ends; every other output equals the same
op's without the store (dprob within its atomic sums' order). Ragged and empty experts, cooperative
and ping-pong tiles, the plain, SwiGLU and dSwiGLU epilogues, with and without row ends, and an op
reused on new indices."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from fusegemm.ops.engine import Op  # noqa: E402

from test_gather_gpu import _gathered_rows, _problem  # noqa: E402

pytestmark = pytest.mark.gpu

CASES = [
    ("grouped_gemm", dict(tile_m=128, tile_n=256)),
    ("grouped_gemm", dict(tile_m=64, tile_n=128)),
    ("grouped_gemm_swiglu", dict(tile_m=128, tile_n=256, d_dtype="bfloat16", generate_c=True)),
    ("grouped_gemm_dswiglu_bf16", dict(tile_m=64, tile_n=256, b_major="n")),
]
ROWS = (300, 0, 513, 1)   # per expert (test_gather_gpu._problem): ragged, empty, a row past 512


def _row_ends(off):
    begin = torch.cat([torch.zeros(1, dtype=torch.int32, device="cuda"), off[:-1]])
    return (begin + torch.tensor(ROWS, dtype=torch.int32, device="cuda")).to(torch.int32)


def _inputs(spec, m, l, n, g):
    inputs = {"alpha": torch.rand(l, generator=g, device="cuda") + 0.5,
              "prob": torch.rand(m, generator=g, device="cuda")}
    if spec == "grouped_gemm_dswiglu_bf16":
        inputs["c"] = torch.randn(m, 2 * n, generator=g, device="cuda").bfloat16()
    return inputs


@pytest.mark.parametrize("ends", [False, True], ids=["whole", "row_ends"])
@pytest.mark.parametrize("spec,axes", CASES, ids=lambda v: v if isinstance(v, str) else ".".join(map(str, v.values())))
def test_a_rows_are_the_gathered_rows_and_the_outputs_unchanged(spec, axes, ends):
    x, idx, off, w = _problem(5, rows=ROWS)
    if spec == "grouped_gemm_swiglu":
        w = torch.cat([w, w * 0.5], 1)                       # 2N gate/up columns
    if axes.get("b_major") == "n":
        w = w.transpose(1, 2).contiguous().transpose(1, 2)   # (L, N, K) with N contiguous
    m, l = idx.shape[0], off.shape[0]
    g = torch.Generator(device="cuda").manual_seed(3)
    inputs = _inputs(spec, m, l, w.shape[1], g)
    kw = {"row_ends": _row_ends(off)} if ends else {}
    got = Op(spec, a_gather=True, a_gather_store=True, **axes)(x, off, w, a_index=idx, inputs=inputs, **kw)
    want = Op(spec, a_gather=True, **axes)(x, off, w, a_index=idx, inputs=inputs, **kw)
    torch.cuda.synchronize()
    assert list(got.keys()) == [*want.keys(), "a_rows"]
    for name in want.keys():
        if name == "dprob":
            assert torch.allclose(got[name], want[name], rtol=1e-5, atol=1e-6)
        else:
            assert torch.equal(got[name], want[name]), name
    rows = _gathered_rows(x, idx)
    r = torch.arange(m, device="cuda")
    held = r < int(off[-1])                                   # rows past the last offset: zero
    if ends:   # rows past each expert's row end: zero (the padding, whose index is -1 here anyway)
        e_of = torch.searchsorted(off, r.to(torch.int32), right=True).clamp(max=l - 1)
        held &= r < _row_ends(off)[e_of]
    assert got["a_rows"].shape == (m, x.shape[1]) and got["a_rows"].dtype == x.dtype
    assert torch.equal(got["a_rows"][held], rows[held])
    assert not got["a_rows"][~held].any()


def test_a_stored_op_reused_on_new_indices_and_tokens():
    """The prepared launch re-encodes a_rows' map at each new output address (the call memo keys
    shapes, not data): two calls with other tokens and indices of the same shapes."""
    op = Op("grouped_gemm", a_gather=True, a_gather_store=True, tile_m=128, tile_n=256)
    for seed in (6, 7):
        x, idx, off, w = _problem(seed, rows=ROWS)
        got = op(x, off, w, a_index=idx, inputs={"alpha": torch.ones(off.shape[0], device="cuda")})
        torch.cuda.synchronize()
        held = torch.arange(idx.shape[0], device="cuda") < int(off[-1])
        assert torch.equal(got["a_rows"][held], _gathered_rows(x, idx)[held]), seed
        assert not got["a_rows"][~held].any()
