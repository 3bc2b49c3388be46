"""The stream-K remainder (scheduler ``streamk``, fusegemm/stream_k.cuh) on the CPU: the plan and
walk as NVRTC evaluates them against an independent model, the model's guarantees (every k-block
of every tile run once, at most one partial per CTA, waits that cannot close a cycle, a shorter
remainder), the kernel's fix-up instructions, the registry's limits, the host's grid, scratch and
configuration, and the first-run gate's cases. tests/gpu/test_stream_k_gpu.py runs it."""
from __future__ import annotations

import itertools
import random
import re
from collections import defaultdict

import pytest

from fusegemm.base.errors import UnsupportedError
from fusegemm.generator import registry
from fusegemm.generator.spec import find_spec
from fusegemm.generator.variants import make_variant

MAX_UNITS = 16   # units tabulated per CTA (the walks below take at most 15, their end included)


# ---------------------------------------------------------------------------------------------
# The model: CUTLASS's stream-K over the partial wave, written from its definition (each CTA an
# equal share of the remainder's k-blocks in tile order), not from the header's formulas.
# ---------------------------------------------------------------------------------------------
def model(tiles: int, grid: int, kb: int, min_kb: int) -> list[list[tuple[int, int, int, int, int]]]:
    """Each CTA's units (linear tile, first k-block, end, first and last CTA whose partials a
    head piece adds; else 0, -1), in walk order."""
    full, rem = divmod(tiles, grid)
    ctas = 0
    if min_kb > 0 and rem and 2 * rem <= grid and kb > 1:   # (a last wave at most half full)
        ctas = max(1, min(grid, rem * kb // min_kb))
        if -(-rem * kb // ctas) >= kb:   # the longest share would be no shorter than a tile
            ctas = 0
    dp = tiles - rem if ctas else tiles
    units: list[list[list[int]]] = [[] for _ in range(grid)]
    for t in range(dp):
        units[t % grid].append([t, 0, kb, 0, -1])
    if ctas:
        total = rem * kb
        share = [c * total // ctas for c in range(ctas + 1)]
        holders: dict[int, list[tuple[int, list[int]]]] = defaultdict(list)
        for c in range(ctas):
            blocks = range(share[c], share[c + 1])
            for t, group in itertools.groupby(blocks, key=lambda i: i // kb):
                g = list(group)
                u = [dp + t, g[0] - t * kb, g[-1] + 1 - t * kb, 0, -1]
                units[c].append(u)
                holders[dp + t].append((c, u))
        for pieces in holders.values():
            if len(pieces) > 1:
                head = next(u for _, u in pieces if u[1] == 0)
                others = sorted(c for c, u in pieces if u[1] != 0)
                head[3], head[4] = others[0], others[-1]
    return [[tuple(u) for u in us] for us in units]


# (tiles, grid, k-blocks per tile, min k-blocks per CTA): qwen3-fc1's 768 tiles on 132 SMs, few
# tiles (pure split, heads adding several partials), whole waves plus a remainder, the cases where
# no split helps (no remainder, a remainder too small, one k-block, the split off), edges.
SHAPES = [(768, 132, 32, 4), (24, 132, 16, 4), (48, 132, 16, 4), (24, 132, 4, 4), (324, 132, 8, 4),
          (264, 132, 16, 4), (5, 132, 100, 1), (7, 8, 3, 1), (1000, 132, 2, 1), (13, 132, 1, 1), (0, 132, 8, 4),
          (131, 132, 37, 4), (133, 132, 37, 4), (40, 132, 32, 0), (200, 16, 9, 2), (3, 4, 1000, 4), (1, 132, 64, 4)]


def check_model(tiles: int, grid: int, kb: int, min_kb: int, units) -> None:
    """What the kernel's fix-up relies on, and what the split is for."""
    seen = defaultdict(int)
    for us in units:
        for t, b, e, _, _ in us:
            assert 0 <= t < tiles and 0 <= b < e <= kb
            for i in range(b, e):
                seen[(t, i)] += 1
    assert len(seen) == tiles * kb and set(seen.values()) <= {1}, "every k-block of every tile once"
    first_sk = {}
    for c, us in enumerate(units):
        pieces = [u for u in us if u[1] > 0 or u[2] < kb]
        partials = [u for u in us if u[1] > 0]
        heads = [u for u in us if u[3] <= u[4]]
        assert len(partials) <= 1 and len(heads) <= 1, "one partial slot per CTA; one head"
        if partials:
            assert pieces[0] is partials[0], "a partial is the CTA's first piece"
            first_sk[c] = partials[0]
        if heads:
            assert us[-1] is heads[0], "a head piece is its CTA's last unit"
        assert [u[0] for u in us] == sorted(u[0] for u in us), "tiles in increasing order (the compacted cursor)"
    for c, us in enumerate(units):
        for t, b, e, first, last in us:
            if first <= last:
                assert b == 0 and e < kb and c < first
                waited = {w: first_sk.get(w) for w in range(first, last + 1)}
                assert all(u is not None and u[0] == t for u in waited.values()), "the waited partials: this tile's"
                held = sum(u[2] - u[1] for u in waited.values())
                assert e + held == kb, "the head and the partials it adds are the whole tile"
            elif b == 0 and e < kb:
                pytest.fail(f"CTA {c}: a head piece of tile {t} that waits on nobody")
    full, rem = divmod(tiles, grid)
    longest = max((sum(u[2] - u[1] for u in us) for us in units), default=0)
    split = any(u[1] > 0 or u[2] < kb for us in units for u in us)
    if split:
        assert longest < (full + 1) * kb, "the split shortens the remainder"
    else:
        assert longest == (full + (rem > 0)) * kb or tiles == 0


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_the_model_runs_every_k_block_once_and_its_waits_cannot_cycle(shape):
    check_model(*shape, model(*shape))


def test_the_model_on_random_shapes():
    rng = random.Random(11)
    for _ in range(400):
        shape = (rng.randint(0, 700), rng.randint(1, 140), rng.randint(1, 80), rng.randint(0, 9))
        check_model(*shape, model(*shape))


def test_the_split_engages_where_it_shortens_the_last_wave():
    """A last wave at most half full: 700 tiles of 32 k-blocks on 132 SMs run 660 whole tiles, then
    40 tiles' 1,280 k-blocks over 132 CTAs, 9 or 10 each instead of one tile's 32; few tiles split
    over the SMs; no remainder, one the CTAs cannot shorten, or a last wave more than half full
    (qwen3-fc1's 108 tiles of 132: 0.91x the static walk's kernel time on the H200, dsv3-fc1-2k's
    124: 0.82x) runs the static walk."""
    u = model(700, 132, 32, 4)
    assert [len([x for x in us if x[2] - x[1] == 32 and x[0] < 660]) for us in u] == [5] * 132
    assert sorted({sum(x[2] - x[1] for x in us if x[0] >= 660) for us in u}) == [9, 10]
    assert max(sum(x[2] - x[1] for x in us) for us in model(24, 132, 16, 4)) == 4
    for shape in ((264, 132, 16, 4), (24, 132, 4, 4), (40, 132, 32, 0), (768, 132, 32, 4), (256, 132, 112, 4)):
        assert all(x[1] == 0 and x[2] == shape[2] for us in model(*shape) for x in us)


_TABLE_FN = """
#include "fusegemm/stream_k.cuh"
namespace fg_test {
template <int N> struct Ints { int v[N]; };
template <int N>
constexpr Ints<N> walks(int tiles, int grid, int kb, int min_kb) {
  Ints<N> out{};
  int i = 0;
  const fusegemm::StreamKPlan plan = fusegemm::StreamKPlan::make(tiles, grid, kb, min_kb);
  for (int c = 0; c < grid; ++c) {
    fusegemm::StreamKWalk w(plan, c);
    for (int u = 0; u < %(units)d; ++u) {
      const fusegemm::StreamKUnit x = w.next();
      // the consumers' one-word form, decoded as they decode it (-1: a partial; 0: a whole tile)
      const int word = fusegemm::fixup_word(x.kb_begin, x.wait_first, x.wait_last);
      const int fix[3] = {word < 0 ? 1 : 0, word > 0 ? fusegemm::fixup_first(word) : 0,
                          word > 0 ? fusegemm::fixup_last(word) : -1};
      const int row[8] = {x.linear, x.kb_begin, x.kb_end, x.wait_first, x.wait_last, fix[0], fix[1], fix[2]};
      for (int k = 0; k < 8; ++k) out.v[i++] = row[k];
    }
  }
  return out;
}
}  // namespace fg_test
"""


def test_the_compiled_plan_and_walk_are_the_model():
    """fusegemm/stream_k.cuh as NVRTC evaluates it (constexpr tables in a cubin): every CTA's
    units, in order, are the model's, then the end (-1); and each unit's one-word fix-up, as the
    consumers keep and decode it, says a partial where the piece starts past k-block 0, and
    names a head's CTAs."""
    from fusegemm.runtime.compile import compile_source
    from fusegemm.runtime.cubin_info import Cubin
    src = _TABLE_FN % {"units": MAX_UNITS}
    for i, (tiles, grid, kb, mk) in enumerate(SHAPES):
        n = grid * MAX_UNITS * 8
        src += (f'extern "C" __device__ __attribute__((used)) const fg_test::Ints<{n}> fg_sk{i} = '
                f"fg_test::walks<{n}>({tiles}, {grid}, {kb}, {mk});\n")
    src += 'extern "C" __global__ void fg_probe() {}\n'
    cub = Cubin(compile_source(src, arch="sm_90a", kernel="fg_probe").data)
    for i, shape in enumerate(SHAPES):
        grid = shape[1]
        flat = cub.global_ints(f"fg_sk{i}", grid * MAX_UNITS * 8)
        want = model(*shape)
        assert max(map(len, want)) < MAX_UNITS
        for c in range(grid):
            rows = [tuple(flat[(c * MAX_UNITS + u) * 8:(c * MAX_UNITS + u + 1) * 8]) for u in range(MAX_UNITS)]
            ends = [r[0] for r in rows].index(-1)
            assert [r[:5] for r in rows[:ends]] == want[c], (shape, c)
            assert all(r[0] == -1 for r in rows[ends:]), (shape, c)
            # the word: a partial iff the piece starts past k-block 0; a head's CTAs as the unit's
            for r in rows[:ends]:
                assert r[5:] == ((1, 0, -1) if r[1] > 0 else (0, r[3], r[4])), (shape, c, r)


# ---------------------------------------------------------------------------------------------
# The kernel's fix-up, as compiled (sm_90a BF16 grouped kernel with scheduler streamk)
# ---------------------------------------------------------------------------------------------
BUILDS = [("grouped_gemm", dict(tile_m=128, tile_n=256)), ("grouped_gemm", dict(tile_m=64, tile_n=256)),
          ("grouped_gemm", dict(tile_m=128, tile_n=128)), ("grouped_gemm", dict(a_gather=True)),
          ("grouped_gemm", dict(weight_mode="discrete")), ("grouped_gemm", dict(d_scatter=True)),
          ("grouped_gemm_swiglu", dict()), ("grouped_gemm_dswiglu_bf16", dict(tile_m=64))]


def _build(session_cache, family, axes):
    from fusegemm.pipeline import get_kernel
    from fusegemm.runtime import disasm
    v = make_variant(find_spec(family), arch="sm_90a", **axes)
    b = get_kernel(v, session_cache)
    return v, b, disasm.sass(b.cubin)


@pytest.mark.parametrize("family,axes", BUILDS, ids=lambda x: str(x))
def test_stream_k_builds_fix_up_through_release_and_acquire(session_cache, family, axes):
    """Each streamk build: no local memory; a partial is one 16-byte L2 store per four
    accumulators (a tile's TILE_M x TILE_N floats over its threads) and a head adds one 16-byte
    L2 load per four, once per partial (a rolled loop); the flag is one release store after a
    barrier over the tile's threads (256 cooperative, 128 ping-pong) and acquired by a polling
    load with a backoff. The same build with the static scheduler has none of it."""
    from fusegemm.runtime import disasm
    v, b, text = _build(session_cache, family, {**axes, "scheduler": "streamk"})
    _, base, base_text = _build(session_cache, family, {**axes, "scheduler": "static"})
    h, hb = disasm.histogram(text), disasm.histogram(base_text)
    accum = v.tile_n // 2
    threads = 128 if v.tile_m == 64 else 256
    assert h.get("STG.E.128.STRONG.GPU", 0) == accum // 4, h
    assert h.get("LDG.E.128.STRONG.GPU", 0) == accum // 4
    for op in ("MEMBAR.ALL.GPU", "STG.E.STRONG.GPU", "NANOSLEEP"):   # (discrete weights' map updates fence too)
        assert h.get(op, 0) - hb.get(op, 0) == 1, op
    assert h.get("LDG.E.STRONG.GPU", 0) > hb.get("LDG.E.STRONG.GPU", 0)
    bars = re.findall(r"BAR\.SYNC\.DEFER_BLOCKING (\S+), (0x[0-9a-f]+) ;", text)
    assert sum(1 for _, n in bars if int(n, 16) == threads and (threads == 128 or _ == "0x6")) >= 2, bars
    for op in ("STG.E.128.STRONG.GPU", "LDG.E.128.STRONG.GPU", "NANOSLEEP"):
        assert hb.get(op, 0) == 0, op
    from fusegemm.runtime.cubin_info import Cubin
    assert Cubin(b.cubin).resources(b.kernel_name).local_bytes == 0


@pytest.mark.parametrize("family,axes", [("grouped_gemm", dict()), ("grouped_gemm", dict(a_gather=True)),
                                         ("grouped_gemm_glu", dict()), ("grouped_gemm_dglu", dict()),
                                         ("grouped_gemm_dsrelu", dict())], ids=lambda x: str(x))
def test_the_ring_carries_each_piece_and_the_walk_has_its_slot(session_cache, family, axes):
    """The streamk kernel's shared-memory plan: a second int4 per ring slot (4 slots) and the one
    producer thread's walk (48 bytes; the gathering lanes walk in registers, the slot unused): the
    pipeline keeps its stages, and no build spills (the six specs of the class at their defaults:
    these three, and SwiGLU and dSwiGLU above)."""
    from fusegemm.runtime.cubin_info import Cubin
    _, b, _ = _build(session_cache, family, dict(scheduler="streamk", **axes))
    _, s, _ = _build(session_cache, family, dict(scheduler="static", **axes))
    assert b.contract.smem_bytes - s.contract.smem_bytes == 4 * 16 + 48
    assert Cubin(b.cubin).resources(b.kernel_name).local_bytes == 0


# ---------------------------------------------------------------------------------------------
# Registry, host, configuration, gate
# ---------------------------------------------------------------------------------------------
def test_streamk_is_the_sm90_grouped_kernels_and_refused_elsewhere_with_the_reason():
    spec = find_spec("grouped_gemm")
    v = make_variant(spec, arch="sm_90a", scheduler="streamk")
    assert v.scheduler == "streamk" and ".sk." in v.readable
    with pytest.raises(UnsupportedError, match=r"scheduler='streamk' is not implemented for grouped_gemm on sm_100a; "
                                               r"implemented: static, dynamic \(the stream-K remainder"):
        registry.resolve("grouped_gemm", "sm_100a", make_variant(spec, arch="sm_100a", scheduler="streamk").choices)
    with pytest.raises(UnsupportedError, match=r"cluster_m=2 .* with scheduler=streamk; implemented: 1 \(stream-K "
                                               r"splits a tile's k-blocks between CTAs"):
        registry.resolve("grouped_gemm", "sm_90a", make_variant(spec, arch="sm_90a", scheduler="streamk",
                                                                  cluster_m=2).choices)
    for family, arch in (("grouped_gemm_wgrad", "sm_90a"), ("grouped_gemm_quant", "sm_90a"),
                         ("gemm_amax", "sm_90a"), ("grouped_gemm_srelu", "sm_100a")):
        row = registry.lookup(family, arch)
        assert any(lim.axis == "scheduler" and "streamk" not in lim.values and not lim.when for lim in row.limits), \
            (family, arch)


# How the registry listed stream-K until the H200 ran it (2026-12-05): the gate's machinery, tested
# with it put back.
_GATED = {("grouped", "sm_90a"): (("scheduler", "streamk", "the stream-K remainder has not run on a GPU yet "
                                                          "(tests/gpu/test_stream_k_gpu.py)"),)}


def test_streamk_on_sm90_has_run_and_is_not_gated():
    v = make_variant(find_spec("grouped_gemm"), arch="sm_90a", scheduler="streamk")
    assert registry.unexecuted_mode(v.kernel, v.arch, vars(v)) is None


def test_a_listed_mode_is_gated(monkeypatch):
    monkeypatch.setattr(registry, "UNEXECUTED_MODES", _GATED)
    v = make_variant(find_spec("grouped_gemm"), arch="sm_90a", scheduler="streamk")
    why = registry.unexecuted_mode(v.kernel, v.arch, vars(v))
    assert why is not None and why.startswith("scheduler='streamk' on sm_90a: the stream-K remainder has not run")
    assert registry.unexecuted_mode(v.kernel, v.arch, {**vars(v), "scheduler": "static"}) is None


def _loaded(scheduler: str, tile=(128, 256), sms=132):
    from fusegemm.ops.loaded_kernel import LoadedKernel

    class _Contract:
        ctas_per_tile, tmap_slot_stride, tile_k = 1, 8, 64
    ln = LoadedKernel.__new__(LoadedKernel)
    ln.tile, ln.cluster, ln.sms, ln.contract = tile, (1, 1), sms, _Contract()
    ln.dynamic, ln.stream_k = scheduler == "dynamic", scheduler == "streamk"
    return ln


def test_the_host_grid_feeds_the_split_and_the_scalar_reaches_the_kernel():
    """A streamk launch takes up to one CTA per FUSEGEMM_STREAMK_MIN_K_BLOCKS k-blocks of the
    allocation's tiles (every SM for few tiles of a long K), the static walk's grid otherwise;
    sk_min_k_blocks is the knob (0 for other schedulers, which the kernel reads as no split)."""
    from fusegemm.ops.loaded_kernel import GroupedShape
    from fusegemm.runtime import config
    few = GroupedShape(m=1024, n=320, k=1000, l=4, a_ld=1000, b_sn=1000, b_sl=320000, discrete=False)
    qwen = GroupedShape(m=16384, n=1536, k=2048, l=32, a_ld=2048, b_sn=2048, b_sl=0, discrete=False)
    short = GroupedShape(m=256, n=256, k=64, l=1, a_ld=64, b_sn=64, b_sl=0, discrete=False)
    assert _loaded("static").grid(few) == 16 and _loaded("streamk").grid(few) == 64   # 16 tiles x 16 k-blocks / 4
    assert _loaded("streamk").grid(qwen) == _loaded("static").grid(qwen) == 132
    assert _loaded("streamk").grid(short) == 2
    with config.override(FUSEGEMM_STREAMK_MIN_K_BLOCKS="1"):
        assert _loaded("streamk").grid(few) == 132
        assert _loaded("streamk").scalars(few)["sk_min_k_blocks"] == 1
    assert _loaded("streamk").scalars(few)["sk_min_k_blocks"] == 4
    assert _loaded("static").scalars(few)["sk_min_k_blocks"] == 0
    assert _loaded("streamk").needs_scratch(False) and not _loaded("static").needs_scratch(False)


def test_the_knob_refuses_what_is_not_a_positive_integer():
    from fusegemm.runtime import config
    for bad in ("0", "-3", "four", "2.5"):
        with config.override(FUSEGEMM_STREAMK_MIN_K_BLOCKS=bad):
            with pytest.raises(Exception, match="FUSEGEMM_STREAMK_MIN_K_BLOCKS"):
                config.stream_k_min_k_blocks()


def test_the_params_carry_the_split():
    from fusegemm.generator.params import GROUPED_PARAMS
    kinds = {f.name: f.kind for f in GROUPED_PARAMS.fields}
    assert (kinds["sk_partials"], kinds["sk_flags"], kinds["sk_min_k_blocks"]) == ("ptr", "ptr", "i32")


@pytest.mark.parametrize("tile_m", [64, 128])
def test_the_gate_runs_the_split_on_its_first_launch(tile_m):
    """A streamk class's first-run cases include a problem of few tiles split over CTAs (K 1000:
    16 k-blocks, a K tail) and whole waves before a split last wave with row ends (the compacted
    walk), besides the classes' usual tails: on an H100 PCIe (114 SMs), H100 SXM and H200 (132)
    and a larger part (150), the host's grid and the model say both split."""
    from fusegemm.generator.config_class import config_class
    from fusegemm.ops.loaded_kernel import GroupedShape
    from fusegemm.selftest import class_cases
    v = make_variant(find_spec("grouped_gemm"), arch="sm_90a", scheduler="streamk", tile_m=tile_m)
    cases = dict(class_cases(config_class(v)))
    few = cases["stream-K: few tiles, each split over CTAs"]
    waves = cases["stream-K: whole waves, then a split last wave"]
    assert few["axes"]["scheduler"] == "streamk" and few["axes"]["tile_m"] == tile_m and waves["row_ends"]
    for case, want_waves in ((few, 0), (waves, 1)):
        rows = sum(-(-t // 256) * 256 for t in case["tokens"])
        kb = -(-case["k"] // 64)
        tiles = rows // tile_m * -(-case["n"] // v.tile_n)
        for sms in (114, 132, 150):
            ln = _loaded("streamk", (tile_m, v.tile_n), sms)
            grid = ln.grid(GroupedShape(m=rows, n=case["n"], k=case["k"], l=len(case["tokens"]), a_ld=case["k"],
                                        b_sn=case["k"], b_sl=0, discrete=False))
            units = model(tiles, grid, kb, 4)
            assert any(u[1] > 0 for us in units for u in us), (case["tokens"], sms)          # split
            assert (tiles >= grid) == bool(want_waves), (case["tokens"], sms)                # waves first
    static = make_variant(find_spec("grouped_gemm"), arch="sm_90a", scheduler="static")
    assert not any("stream-K" in label for label, _ in class_cases(config_class(static)))


def test_show_and_the_docs_say_a_listed_mode_has_not_run(monkeypatch):
    """`fusegemm show` and the generated op page name an unexecuted mode beside the sm_90a limits
    (and its JSON lists it); sm_100a, which refuses it, says so as a limit instead; with nothing
    listed (stream-K since the H200 ran it), nothing is said."""
    import json

    from click.testing import CliRunner

    from fusegemm.cli import main
    from fusegemm.describe import spec_info
    from fusegemm.docsgen import surface_rows
    plain = json.loads(CliRunner().invoke(main, ["show", "grouped_gemm", "--json"]).output)
    assert plain["implementations"]["sm_90a"]["unexecuted"] == []
    assert "not yet run" not in CliRunner().invoke(main, ["show", "grouped_gemm"]).output
    monkeypatch.setattr(registry, "UNEXECUTED_MODES", _GATED)
    text = CliRunner().invoke(main, ["show", "grouped_gemm"]).output
    sm90 = text[text.index("  sm_90a:"):]
    assert ("    scheduler=streamk not yet run on a GPU: first-run gated (the stream-K remainder has not run on a "
            "GPU yet (tests/gpu/test_stream_k_gpu.py))") in sm90
    info = json.loads(CliRunner().invoke(main, ["show", "grouped_gemm", "--json"]).output)
    assert info["implementations"]["sm_90a"]["unexecuted"] == [
        {"axis": "scheduler", "value": "streamk", "because": _GATED[("grouped", "sm_90a")][0][2]}]
    assert info["implementations"]["sm_100a"]["unexecuted"] == []
    rows = {axis: per for axis, _, per in surface_rows(spec_info(find_spec("grouped_gemm")))}
    assert "`streamk` not yet run on a GPU, first-run gated" in rows["scheduler"]["sm_90a"]
    assert "static" in rows["scheduler"]["sm_100a"] and "not yet run" not in rows["scheduler"]["sm_100a"]
