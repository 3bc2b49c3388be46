"""Scattered outputs on the H200 (``d_scatter``: problem row r's C and D rows are written to row
``d_index[r]`` of (``d_rows``, N) outputs, from the sm_90a fragment path's per-warp row stores;
fusegemm/sm90/epilogue.cuh): every output bit-equal to the same kernel's rows placed by the index
(rows no index names zero; indices outside [0, d_rows), the routing's -1 padding included, write
nothing and never fault), on ragged and empty experts, both tile shapes (deferred stores and
ping-pong), both schedulers, discrete and N-major weights, C with a column bias, gathered A in the
same kernel and row ends; ``execute`` leaves the unnamed rows of the caller's buffers as they were;
the torch op under ``torch.compile(fullgraph=True)``."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from fusegemm.ops.engine import Op  # noqa: E402

pytestmark = pytest.mark.gpu

TILE = dict(tile_m=128, tile_n=256)
CASES = [
    dict(TILE),                                                              # deferred D stores
    dict(tile_m=64, tile_n=128),                                             # ping-pong
    dict(TILE, scheduler="dynamic"),
    dict(TILE, weight_mode="discrete"),
    dict(tile_m=128, tile_n=128, b_major="n"),
    dict(TILE, bias_dtype="bfloat16", generate_c=True, c_dtype="float32"),   # staged C and D, a column input
    dict(TILE, d_dtype="float32"),
]


def _problem(seed, k=512, n=384, rows=(300, 0, 513, 1)):
    """A, padded_offsets, B (L, N, K) and a scatter index: each expert's valid rows sent to distinct
    output rows in random order (d_rows = the tokens plus 40 rows no index names), the padding -1,
    and two rows sent outside [0, d_rows)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    padded = [-(-r // 256) * 256 for r in rows]
    off = torch.tensor(padded, device="cuda").cumsum(0).to(torch.int32)
    m = sum(padded) + 256                                   # rows past the last offset too
    a = torch.randn(m, k, generator=g, device="cuda").bfloat16()
    tokens = sum(rows)
    d_rows = tokens + 40
    slots = torch.randperm(d_rows, generator=g, device="cuda").to(torch.int32)[:tokens]
    idx = torch.full((m,), -1, dtype=torch.int32, device="cuda")
    start, used = 0, 0
    for r, p in zip(rows, padded):
        idx[start:start + r] = slots[used:used + r]
        start, used = start + p, used + r
    idx[1], idx[2] = d_rows + 5, -7                          # outside the outputs: not written
    w = torch.randn(len(rows), n, k, generator=g, device="cuda").bfloat16() * 0.05
    return a, idx, off, w, d_rows


def _operands(a, off, w, axes):
    if axes.get("weight_mode") == "discrete":
        return (a, off), {"b_ptrs": torch.tensor([t.data_ptr() for t in w], device="cuda"), "n": w.shape[1]}
    if axes.get("b_major") == "n":
        return (a, off, w.transpose(1, 2).contiguous().transpose(1, 2)), {}
    return (a, off, w), {}


def _placed(rows, idx, d_rows):
    """``rows`` (M, N) placed at ``idx`` in zero (d_rows, N) rows (entries outside: dropped)."""
    out = torch.zeros((d_rows, rows.shape[1]), dtype=rows.dtype, device=rows.device)
    ok = (idx >= 0) & (idx < d_rows)
    out[idx[ok].long()] = rows[ok]
    return out


def _inputs(axes, l, m, n, g):
    inputs = {"alpha": torch.rand(l, generator=g, device="cuda") + 0.5,
              "prob": torch.rand(m, generator=g, device="cuda")}
    if axes.get("bias_dtype"):
        inputs["bias"] = torch.randn(l, n, generator=g, device="cuda").bfloat16().t()
    return inputs


@pytest.mark.parametrize("axes", CASES, ids=lambda a: ".".join(map(str, a.values())))
def test_scattered_outputs_equal_the_kernels_rows_placed_by_the_index(axes):
    a, idx, off, w, d_rows = _problem(1)
    g = torch.Generator(device="cuda").manual_seed(2)
    inputs = _inputs(axes, off.shape[0], a.shape[0], w.shape[1], g)
    ops, kw = _operands(a, off, w, axes)
    got = Op("grouped_gemm", d_scatter=True, **axes)(*ops, d_index=idx, d_rows=d_rows, inputs=inputs, **kw)
    want = Op("grouped_gemm", **axes)(*ops, inputs=inputs, **kw)
    torch.cuda.synchronize()
    assert list(got.keys()) == list(want.keys())
    for name in want.keys():
        assert got[name].shape == (d_rows, w.shape[1]), name
        assert torch.equal(got[name], _placed(want[name], idx, d_rows)), name


def test_gathered_a_and_scattered_outputs_in_one_kernel_with_row_ends():
    """The MoE layer's permutation both ways in one GEMM: rows read from token-major A through
    a_index and written through d_index, with the routing's row ends (the padding's tiles skipped;
    their indices are -1): equal to the plain kernel on pre-gathered rows, placed."""
    a, idx, off, w, d_rows = _problem(3)
    g = torch.Generator(device="cuda").manual_seed(4)
    m, l = a.shape[0], off.shape[0]
    tokens = torch.randn(700, a.shape[1], generator=g, device="cuda").bfloat16()
    a_idx = torch.randint(0, 700, (m,), generator=g, device="cuda", dtype=torch.int32)
    rows = (300, 0, 513, 1)
    starts = [0] + off.tolist()[:-1]
    ends = torch.tensor([s + r for s, r in zip(starts, rows)], dtype=torch.int32, device="cuda")
    for s, r, e in zip(starts, rows, off.tolist()):
        a_idx[s + r:e] = -1                                     # padding reads zeros, as the routing's
    a_idx[off[-1]:] = -1
    inputs = _inputs({}, l, m, w.shape[1], g)
    got = Op("grouped_gemm", a_gather=True, d_scatter=True, **TILE)(
        tokens, off, w, a_index=a_idx, d_index=idx, d_rows=d_rows, row_ends=ends, inputs=inputs)["d"]
    pre = torch.where((a_idx >= 0)[:, None], tokens[a_idx.long().clamp(min=0)], torch.zeros((), dtype=tokens.dtype,
                                                                                             device="cuda"))
    want = Op("grouped_gemm", **TILE)(pre, off, w, inputs=inputs)["d"]
    torch.cuda.synchronize()
    assert torch.equal(got, _placed(want, idx, d_rows))


def test_execute_and_tail_false_leave_unnamed_rows_as_they_were():
    """Caller outputs (execute) and tail=False: only the rows an index names are written; the
    others keep what the buffer held. A second call of the pattern with other indices (the
    prepared launch re-reads d_index and the outputs' addresses)."""
    op = Op("grouped_gemm", d_scatter=True, **TILE)
    for seed in (5, 6):
        a, idx, off, w, d_rows = _problem(seed)
        inputs = {"alpha": torch.ones(off.shape[0], device="cuda")}
        want = _placed(Op("grouped_gemm", **TILE)(a, off, w, inputs=inputs)["d"], idx, d_rows)
        named = torch.zeros(d_rows, dtype=torch.bool, device="cuda")
        named[idx[(idx >= 0) & (idx < d_rows)].long()] = True
        d = torch.full((d_rows, w.shape[1]), 7.0, dtype=torch.bfloat16, device="cuda")
        op.execute(a, off, w, d_index=idx, d_rows=d_rows, outputs={"d": d}, inputs=inputs)
        lazy = op(a, off, w, d_index=idx, d_rows=d_rows, inputs=inputs, tail=False)["d"]
        torch.cuda.synchronize()
        assert torch.equal(d[named], want[named]) and bool((d[~named] == 7.0).all()), seed
        assert torch.equal(lazy[named], want[named]), seed


def test_unnamed_rows_read_zero_on_reused_memory_and_past_the_row_ends():
    """The rows no stored problem row names are zeroed by the small kernels (fusegemm/zero_tail.cuh
    mark_named and zero_unnamed), not by a fill of the whole buffers: on a block just freed full of
    NaN they read zero, among them the rows named only by problem rows past their expert's row end
    (whose tiles the kernel may skip; their A rows are zero, as padding is), and every other row is
    the plain kernel's; again on a second call of the memoised pattern with another index."""
    op = Op("grouped_gemm", d_scatter=True, **TILE)
    rows = (300, 0, 513, 1)
    for seed in (11, 12):
        a, idx, off, w, d_rows = _problem(seed, rows=rows)
        starts = [0] + off.tolist()[:-1]
        ends = [s + min(r, 100) for s, r in zip(starts, rows)]
        for e, o in zip(ends, off.tolist()):
            a[e:o] = 0
        inputs = {"alpha": torch.rand(off.shape[0], device="cuda") + 0.5}
        want = _placed(Op("grouped_gemm", **TILE)(a, off, w, inputs=inputs)["d"], idx, d_rows)
        poison = torch.full((d_rows, w.shape[1]), float("nan"), dtype=torch.bfloat16, device="cuda")
        poisoned = poison.data_ptr()
        del poison
        got = op(a, off, w, d_index=idx, d_rows=d_rows, row_ends=torch.tensor(ends, dtype=torch.int32, device="cuda"),
                 inputs=inputs)["d"]
        torch.cuda.synchronize()
        assert got.data_ptr() == poisoned, "the allocator did not hand the NaN block back: the case tests nothing"
        past = torch.zeros(d_rows, dtype=torch.bool, device="cuda")   # rows named only past a row end
        for s, e, o in zip(starts, ends, off.tolist()):
            named = idx[e:o]
            past[named[(named >= 0) & (named < d_rows)].long()] = True
        assert bool(past.any()) and bool((want[past] == 0).all())
        assert torch.equal(got, want), seed


def test_the_torch_op_scatters_under_torch_compile():
    """``torch.ops.fusegemm.<name>`` of the scattered variant: d_index a tensor operand and d_rows an
    int, traced by torch.compile(fullgraph=True) (its fake sizes the outputs by d_rows)."""
    import fusegemm.torch_library as fg
    a, idx, off, w, d_rows = _problem(8)
    inputs = {"alpha": torch.ones(off.shape[0], device="cuda")}
    face = fg.register("grouped_gemm", name="t_gpu_scatter", d_scatter=True, **TILE)
    compiled = torch.compile(lambda a, off, w, idx: face(a, off, w, d_index=idx, d_rows=d_rows, inputs=inputs),
                             fullgraph=True)
    got = compiled(a, off, w, idx)["d"]
    want = _placed(Op("grouped_gemm", **TILE)(a, off, w, inputs=inputs)["d"], idx, d_rows)
    torch.cuda.synchronize()
    assert got.shape == (d_rows, w.shape[1]) and torch.equal(got, want)


@pytest.mark.parametrize("axes", [dict(), dict(bias_dtype="bfloat16", generate_c=True, c_dtype="float32"),
                                  dict(d_dtype="float32")], ids=["d-bf16", "c-f32-bias", "d-f32"])
def test_the_sm100_engines_scattered_stores_run_on_the_h200(axes):
    """The sm_100a kernels store scattered rows from their epilogue engine
    (fusegemm/epilogue_block.cuh store_vals_rows); its block harness runs that code on the H200:
    every output equal to the unscattered harness's rows placed by the index (unnamed rows zero,
    indices outside [0, d_rows) and the padding's -1 write nothing), on ragged and empty experts."""
    from fusegemm.generator.variants import make_variant
    from fusegemm.harness_run import run_harness
    a, idx, off, w, d_rows = _problem(9)
    m, l, n = a.shape[0], off.shape[0], 384
    g = torch.Generator(device="cuda").manual_seed(10)
    valid = int(off[-1])
    acc = torch.randn(valid, n, generator=g, device="cuda")
    inputs = _inputs(axes, l, m, n, g)
    plain = run_harness(make_variant("grouped_gemm", arch="sm_100a", **axes), "block", acc, off, inputs, m_rows=m)
    got = run_harness(make_variant("grouped_gemm", arch="sm_100a", d_scatter=True, **axes), "block", acc, off,
                      inputs, m_rows=m, d_index=idx, d_rows=d_rows)
    assert sorted(got) == sorted(plain)
    for name in plain:
        assert got[name].shape == (d_rows, n), name
        rows = plain[name].clone()
        rows[valid:] = 0          # (the harness writes the problem's rows only)
        assert torch.equal(got[name], _placed(rows, idx, d_rows)), name
