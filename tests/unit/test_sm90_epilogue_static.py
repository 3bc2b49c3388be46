"""The sm_90a BF16 grouped kernel's fused epilogues compiled on the CPU: the paired and reducing
rules (SwiGLU forward, dSwiGLU) take the fragment path (frag_blocks in fusegemm/sm90/epilogue.cuh)
with 0 spills, and the SASS keeps what made it fast on the H200: no call into __fdiv_rn's slow
path (the logistic's division), only 16-byte global stores (NVRTC had split the staged blocks'
stores in four), the L2 prefetch of element inputs (dSwiGLU's C), and the fragment path's
warp-local staging (no named barrier per block, as the engine path has), and its block loop rolled
where that measured faster. What the H200 runs is measured in tests/gpu, bench/epilogue_swiglu.py
and bench/pingpong.py."""
from __future__ import annotations

import pytest

from fusegemm.generator.render import render
from fusegemm.generator.variants import make_variant
from fusegemm.runtime import disasm
from fusegemm.runtime.compile import compile_source
from fusegemm.runtime.cubin_info import Cubin

CASES = [
    ("grouped_gemm_swiglu", dict(d_dtype="bfloat16", generate_c=True)),
    ("grouped_gemm_swiglu", dict(d_dtype="bfloat16", generate_c=True, c_dtype="float32", tile_m=64, tile_n=128)),
    ("grouped_gemm_dswiglu_bf16", {}),
    ("grouped_gemm_dswiglu_bf16", dict(b_major="n", d_dtype="float32")),
]
ENGINE = ("-DFUSEGEMM_SM90_FRAG_BLOCKS=0",)   # the A/B switch back to the block engine


def _compile(spec, axes, extra=()):
    variant = make_variant(spec, arch="sm_90a", **axes)
    src = render(variant)
    assert src.impl.kernel == "fusegemm::sm90::GroupedGemmKernel", src.impl
    return src, compile_source(src.text, arch="sm_90a", kernel=src.symbol, extra=extra)


def _named_barriers(hist):
    return sum(n for op, n in hist.items() if op.startswith("BAR.SYNC") or op.startswith("BAR.ARV"))


@pytest.mark.parametrize("spec,axes", CASES, ids=lambda x: x if isinstance(x, str) else ".".join(map(str, x.values())))
def test_paired_rules_run_on_the_fragment(spec, axes):
    src, cub = _compile(spec, axes)
    res = Cubin(cub.data).resources(src.symbol)
    assert res.local_bytes == 0, (spec, axes, "spills / local memory", res)
    if not disasm.available():
        pytest.skip("nvdisasm is not installed: resources checked, SASS not")
    hist = disasm.sass_histogram(cub.data)
    assert disasm.count_prefix(hist, "CALL") == 0, "a division slow path (or another call) in the epilogue"
    stores = {op: n for op, n in hist.items() if op.startswith("STG")}
    assert stores and set(stores) == {"STG.E.128"}, stores
    # dSwiGLU reads C: its consumers prefetch it into L2 (CCTL.E.PF2) during the mainloop; the
    # SwiGLU forward reads no element input and issues no prefetch.
    # (CCTL.IVALL is the cluster barrier's acquire at the kernel's start and end, not a prefetch.)
    assert (disasm.count_prefix(hist, "CCTL.E.PF2") > 0) == (spec == "grouped_gemm_dswiglu_bf16"), hist.get("CCTL.E.PF2")
    # The engine path synchronises each warpgroup twice per block with a named barrier; the
    # fragment path only with __syncwarp (SASS barrier instructions: 1 against 3 today).
    _, engine = _compile(spec, axes, ENGINE)
    assert _named_barriers(hist) < _named_barriers(disasm.sass_histogram(engine.data))


# The fragment path's block loop (kRollBlocks): rolled for an unpaired accumulator in cooperative
# tiles, one copy of the rule; unrolled, one copy per 32-column block, for ping-pong tiles and
# the paired accumulator. The logistic's exp (MUFU.EX2) counts the copies: 16 per block.
ROLL_CASES = [
    ("grouped_gemm_dswiglu_bf16", dict(tile_m=128, tile_n=256), 1),
    ("grouped_gemm_dswiglu_bf16", dict(tile_m=128, tile_n=128, b_major="n"), 1),
    ("grouped_gemm_dswiglu_bf16", dict(tile_m=64, tile_n=128, b_major="n"), 4),   # ping-pong
    ("grouped_gemm_swiglu", dict(d_dtype="bfloat16", tile_m=128, tile_n=256), 4),  # paired: 64-column blocks
]


@pytest.mark.parametrize("spec,axes,copies", ROLL_CASES, ids=lambda x: x if isinstance(x, str) else str(x))
def test_block_loop_rolled_where_measured_faster(spec, axes, copies):
    if not disasm.available():
        pytest.skip("nvdisasm is not installed")
    src, cub = _compile(spec, axes)
    assert Cubin(cub.data).resources(src.symbol).local_bytes == 0, "the run-time block selection spilled acc[]"
    exps = disasm.count_prefix(disasm.sass_histogram(cub.data), "MUFU.EX2")
    assert exps == 16 * copies, (spec, axes, exps)
    if copies == 1:   # the A/B switch restores one copy per block
        _, unrolled = _compile(spec, axes, ("-DFUSEGEMM_SM90_FRAG_ROLL=0",))
        assert disasm.count_prefix(disasm.sass_histogram(unrolled.data), "MUFU.EX2") == 16 * axes["tile_n"] // 32


# FUSEGEMM_SM90_FRAG_ROLL_SPAN: ping-pong's overlapped block loop in spans of n blocks, one copy of
# the rule per block of a span; a span of the whole tile is the unrolled default, and cooperative
# tiles (rolled) and paired accumulators (unrolled) do not change.
SPAN_CASES = [
    ("grouped_gemm_dswiglu_bf16", dict(tile_m=64, tile_n=256), 2, 2),
    # (1-block spans at 64 x 256 spill 8 bytes since C pairs unpack by shift and mask, one register
    # more at the margin; that setting measured 0.89-0.98x and is kept only as an A/B switch)
    ("grouped_gemm_dswiglu_bf16", dict(tile_m=64, tile_n=128, b_major="n"), 1, 1),
    ("grouped_gemm_dswiglu_bf16", dict(tile_m=64, tile_n=128, b_major="n"), 2, 2),
    ("grouped_gemm_dswiglu_bf16", dict(tile_m=64, tile_n=128, b_major="n"), 4, 4),
    ("grouped_gemm_dswiglu_bf16", dict(tile_m=128, tile_n=256), 2, 1),
    ("grouped_gemm_swiglu", dict(d_dtype="bfloat16", tile_m=64, tile_n=256), 2, 8),   # paired: two epilogue sites
]


@pytest.mark.parametrize("spec,axes,span,copies", SPAN_CASES, ids=lambda x: x if isinstance(x, str) else str(x))
def test_ping_pong_block_spans(spec, axes, span, copies):
    if not disasm.available():
        pytest.skip("nvdisasm is not installed")
    src, cub = _compile(spec, axes, (f"-DFUSEGEMM_SM90_FRAG_ROLL_SPAN={span}",))
    assert Cubin(cub.data).resources(src.symbol).local_bytes == 0, "the span's run-time selection spilled acc[]"
    exps = disasm.count_prefix(disasm.sass_histogram(cub.data), "MUFU.EX2")
    assert exps == 16 * copies, (spec, axes, span, exps)


def test_engine_path_stores_whole_vectors():
    """The block engine (the rules that quantize; FUSEGEMM_SM90_FRAG_BLOCKS=0 for the others)
    writes its staged 16-bit blocks with 16-byte stores too."""
    if not disasm.available():
        pytest.skip("nvdisasm is not installed")
    _, cub = _compile("grouped_gemm_dswiglu_bf16", {}, ENGINE)
    stores = {op: n for op, n in disasm.sass_histogram(cub.data).items() if op.startswith("STG")}
    assert stores and set(stores) == {"STG.E.128"}, stores


def test_bench_no_epilogue_build_keeps_the_mainloop():
    """bench/ceiling.py times the kernel built with FUSEGEMM_SM90_BENCH_NO_EPILOGUE=1 as the
    mainloop's own speed: that build must keep the default's WGMMA code (a removed epilogue call
    let NVRTC fold the mainloop's 28 HGMMA sites into 7), and the default must store."""
    if not disasm.available():
        pytest.skip("nvdisasm is not installed")
    axes = dict(tile_m=128, tile_n=256, cluster_m=1)
    _, cub = _compile("grouped_gemm", axes)
    _, bare = _compile("grouped_gemm", axes, ("-DFUSEGEMM_SM90_BENCH_NO_EPILOGUE=1",))
    h, hb = disasm.sass_histogram(cub.data), disasm.sass_histogram(bare.data)
    assert disasm.count_prefix(h, "HGMMA") == disasm.count_prefix(hb, "HGMMA") > 0, (h, hb)
    assert disasm.count_prefix(h, "STG") > 0


# Deferred D (FUSEGEMM_SM90_DEFER_STORE): cooperative kernels whose rule is element-wise with a
# 16-bit D, no C and no column input store each tile's D during the next tile's first k-blocks;
# the others keep the staged stores between the tiles.
DEFER_CASES = [
    ("grouped_gemm", dict(tile_m=128, tile_n=256, cluster_m=1), True),
    ("grouped_gemm", dict(tile_m=128, tile_n=128, cluster_m=1), True),
    ("grouped_gemm", dict(tile_m=128, tile_n=256, cluster_m=2), True),
    ("grouped_gemm", dict(tile_m=128, tile_n=256, cluster_m=1, cluster_n=2), True),
    ("grouped_gemm", dict(tile_m=128, tile_n=256, cluster_m=1, scheduler="dynamic"), True),
    ("grouped_gemm", dict(tile_m=128, tile_n=256, cluster_m=1, weight_mode="discrete"), True),
    ("grouped_gemm", dict(tile_m=128, tile_n=256, cluster_m=1, b_major="n", d_dtype="float16"), True),
    ("grouped_gemm_wgrad", {}, True),
    ("grouped_gemm_wgrad", dict(d_dtype="float32"), False),
    ("grouped_gemm", dict(tile_m=128, tile_n=256, cluster_m=1, bias_dtype="bfloat16"), False),
    ("grouped_gemm", dict(tile_m=64, tile_n=256, cluster_m=1), False),   # ping-pong overlaps already
]


@pytest.mark.parametrize("spec,axes,deferred", DEFER_CASES, ids=lambda x: x if isinstance(x, str) else str(x))
def test_deferred_d_stores(spec, axes, deferred):
    src, cub = _compile(spec, axes)
    res = Cubin(cub.data).resources(src.symbol)
    assert res.local_bytes == 0, (spec, axes, "spills / local memory", res)
    if not disasm.available():
        pytest.skip("nvdisasm is not installed: resources checked, SASS not")
    _, base = _compile(spec, axes, ("-DFUSEGEMM_SM90_DEFER_STORE=0",))
    text, text_base = disasm.sass(cub.data), disasm.sass(base.data)
    if deferred:
        # The D stores sit in the head of the next tile's mainloop, between its WGMMAs (the
        # last tile's drain follows them); staged, every store follows the mainloop.
        assert _stores_between_wgmmas(text) > 0 and _stores_between_wgmmas(text_base) == 0
    else:
        assert text == text_base, "a kernel without deferred stores changed with the switch"


def _stores_between_wgmmas(text: str) -> int:
    """Global stores placed between the first and the last WGMMA of the SASS text."""
    ops = disasm.opcodes(text)
    wgmma = [i for i, op in enumerate(ops) if op.startswith("HGMMA")]
    return sum(1 for i in range(wgmma[0] + 1, wgmma[-1]) if ops[i].startswith("STG")) if wgmma else 0


# The fragment path's element inputs (dSwiGLU's C) at constant offsets (FUSEGEMM_SM90_FRAG_ELEM_AT)
# and its outputs masked past N only where its quantization reads them (FUSEGEMM_SM90_FRAG_MASK_ALL):
# the default against the A/B baselines. H100, 2026-12-05 (bench/pingpong.py --also, five rounds,
# same bits): the ping-pong dSwiGLU 1.03-1.12x at the MoE layers' shapes.
def _marks(text):
    """The SASS as a string of C loads at a constant offset (L), logistic exps (m) and 16-byte
    stores (S), in order."""
    out = []
    for line in text.splitlines():
        if "LDG.E.CONSTANT" in line and ".64+0x" in line:
            out.append("L")
        elif "MUFU.EX2" in line:
            out.append("m")
        elif "STG.E.128" in line:
            out.append("S")
    return "".join(out)


def _ldg_with_offset(text):
    return _marks(text).count("L")


def test_fragment_inputs_at_constant_offsets():
    """Each in-range block reads its 16 C pairs per thread at immediate offsets from two row
    addresses per role (three of a role's four loads per row carry one), where the baseline
    computed a 64-bit address per load; the SASS shrinks and spills nothing."""
    if not disasm.available():
        pytest.skip("nvdisasm is not installed")
    axes = dict(tile_m=64, tile_n=256)
    src, cub = _compile("grouped_gemm_dswiglu_bf16", axes)
    _, base = _compile("grouped_gemm_dswiglu_bf16", axes, ("-DFUSEGEMM_SM90_FRAG_ELEM_AT=0",))
    assert Cubin(cub.data).resources(src.symbol).local_bytes == 0
    text, base_text = disasm.sass(cub.data), disasm.sass(base.data)
    blocks = axes["tile_n"] // 32
    assert _ldg_with_offset(text) >= 12 * blocks > _ldg_with_offset(base_text), (
        _ldg_with_offset(text), _ldg_with_offset(base_text))
    assert len(text.splitlines()) < len(base_text.splitlines()) - 8 * blocks * 4


@pytest.mark.parametrize("spec,axes", [
    ("grouped_gemm_dswiglu_bf16", dict(tile_m=64, tile_n=256)),
    ("grouped_gemm_swiglu", dict(d_dtype="bfloat16", tile_m=64, tile_n=256, generate_c=True)),
], ids=["dswiglu", "swiglu"])
def test_fragment_outputs_masked_only_for_quantization(spec, axes):
    """Stored outputs past N are never written (the staged flush skips those vectors) and the
    reductions mask their own inputs: no select per stored output and element, so a 64 x 256
    tile (128 accumulator values per thread) has at least 256 fewer selects than with every
    output masked."""
    if not disasm.available():
        pytest.skip("nvdisasm is not installed")
    src, cub = _compile(spec, axes)
    _, masked = _compile(spec, axes, ("-DFUSEGEMM_SM90_FRAG_MASK_ALL=1",))
    assert Cubin(cub.data).resources(src.symbol).local_bytes == 0

    def selects(c):
        h = disasm.sass_histogram(c.data)
        return disasm.count_prefix(h, "FSEL") + disasm.count_prefix(h, "SEL")
    assert selects(cub) <= selects(masked) - 2 * 128, (selects(cub), selects(masked))


def test_fragment_inputs_loaded_a_block_ahead():
    """FUSEGEMM_SM90_FRAG_LOAD_AHEAD (on by default; 0 is the A/B switch's baseline): the ping-pong
    dSwiGLU's last block finds its C loaded during the block before (no C load between the
    previous block's stores and its exps); with the switch at 0 each block loads its own as it
    starts. 0 spills either way."""
    if not disasm.available():
        pytest.skip("nvdisasm is not installed")
    axes = dict(tile_m=64, tile_n=256)
    src, cub = _compile("grouped_gemm_dswiglu_bf16", axes)
    _, base = _compile("grouped_gemm_dswiglu_bf16", axes, ("-DFUSEGEMM_SM90_FRAG_LOAD_AHEAD=0",))
    assert Cubin(cub.data).resources(src.symbol).local_bytes == 0

    def last_block(c):   # the marks from the last block's stores back to the stores before them
        s = _marks(disasm.sass(c.data)).rstrip("L")   # (the tile's trailing loads: the next tile's)
        blocks = [b for b in s.split("S") if "m" in b]
        return blocks[-1]
    assert "L" not in last_block(cub).split("m")[0], last_block(cub)
    assert "L" in last_block(base).split("m")[0], last_block(base)
    # An FP32 C would hold 32 registers a block ahead (it spilled): it loads as each block starts.
    fp32 = dict(axes, c_dtype="float32", b_major="n")
    src32, on = _compile("grouped_gemm_dswiglu_bf16", fp32)
    _, off = _compile("grouped_gemm_dswiglu_bf16", fp32, ("-DFUSEGEMM_SM90_FRAG_LOAD_AHEAD=0",))
    assert Cubin(on.data).resources(src32.symbol).local_bytes == 0
    assert disasm.sass_histogram(on.data) == disasm.sass_histogram(off.data)


def test_bf16_inputs_unpack_without_permutes():
    """A BF16 C pair becomes two FP32 values with a shift and a mask (common.cuh's
    bf16x2_to_f32, behind epi::Cvt<bfloat16_t>::unpack2): no byte permute per pair. The ping-pong
    dSwiGLU's unrolled 64 x 256 tile reads 128 C pairs per thread; through __bfloat1622float2
    each pair's high half took a PRMT and a shift (136 PRMTs in the kernel; 8 now, none of them
    C's)."""
    if not disasm.available():
        pytest.skip("nvdisasm is not installed")
    src, cub = _compile("grouped_gemm_dswiglu_bf16", dict(tile_m=64, tile_n=256, b_major="n"))
    assert Cubin(cub.data).resources(src.symbol).local_bytes == 0
    prmt = disasm.count_prefix(disasm.sass_histogram(cub.data), "PRMT")
    assert prmt < 32, prmt


@pytest.mark.parametrize("coupling", [2, 1, 0])
def test_bench_cluster_coupling_builds(coupling):
    """bench/pingpong.py's cluster A/B (FUSEGEMM_SM90_BENCH_CLUSTER_COUPLING): 2, the default, multicasts
    B and releases stages to the peer CTA (a remote arrive); 1 keeps the remote releases and loads B per
    CTA; 0 has neither. Each build must be what its timing is said to measure."""
    if not disasm.available():
        pytest.skip("nvdisasm is not installed")
    extra = () if coupling == 2 else (f"-DFUSEGEMM_SM90_BENCH_CLUSTER_COUPLING={coupling}",)
    _, cub = _compile("grouped_gemm", dict(tile_m=128, tile_n=256, cluster_m=2), extra)
    h = disasm.sass_histogram(cub.data)
    multicast = sum(n for op, n in h.items() if op.startswith("UTMALDG") and "MULTICAST" in op.split("."))
    remote = sum(n for op, n in h.items() if op.startswith("SYNCS.ARRIVE") and "RED" in op.split("."))
    assert (multicast > 0, remote > 0) == (coupling == 2, coupling >= 1), (coupling, multicast, remote)
    assert disasm.count_prefix(h, "UTMALDG") > 0


@pytest.mark.parametrize("spec,axes", [
    ("grouped_gemm_dswiglu_bf16", dict(tile_m=64, tile_n=256, b_major="n", cluster_m=2)),
    ("grouped_gemm", dict(tile_m=128, tile_n=256, b_major="n", cluster_m=2, weight_mode="discrete")),
], ids=["dswiglu_pp64_2x1", "discrete_128_2x1"])
def test_cluster_n_major_b_in_k_halves(spec, axes):
    """FUSEGEMM_SM90_CLUSTER_BMN_SPLIT_K=1 shares the cluster kernel's N-major B by K halves: the
    tensor map's K box halves (the host reads it from the contract), every chunk's half is a load
    of its own (twice the default's TMA loads of B), and nothing spills."""
    src, cub = _compile(spec, axes)
    _, split = _compile(spec, axes, ("-DFUSEGEMM_SM90_CLUSTER_BMN_SPLIT_K=1",))
    base, half = Cubin(cub.data), Cubin(split.data)
    assert (base.contract(src.symbol).box_b_outer, half.contract(src.symbol).box_b_outer) == (64, 32)
    assert half.contract(src.symbol).box_b_inner == 64 and half.resources(src.symbol).local_bytes == 0
    if not disasm.available():
        pytest.skip("nvdisasm is not installed: the contract checked, the SASS not")
    h0, h1 = disasm.sass_histogram(cub.data), disasm.sass_histogram(split.data)
    loads = lambda h: sum(n for op, n in h.items() if op.startswith("UTMALDG"))   # noqa: E731
    assert loads(h1) > loads(h0), (h0, h1)
