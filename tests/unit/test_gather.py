"""Gathered A (``a_gather``: problem row r reads row ``a_index[r]`` of a token-major A) on the CPU:
the axis reaches the sm_90a kernel's source and is refused, with the reason, where no kernel reads
it (the block-scaled families, clusters); the sm_100a kernels' gather4 loads (1-CTA tiles and 2-CTA
pairs) compile
and are first-run gated by cases that pass an index; the sm_90a copies are a few instructions each;
the gathered kernels compile
clean (0 local memory) with the one-row A box their contract exports; ``fusegemm.Op`` parses
``a_index`` (M rows from it, A's own rows for its map) and refuses it where it does not belong.
On the GPU (tests/gpu/test_gather_gpu.py): bit-equal to the same kernel on pre-permuted rows."""
from __future__ import annotations

import pytest

from fusegemm import pipeline
from fusegemm.base.errors import ArgumentError, UnsupportedError
from fusegemm.generator import registry
from fusegemm.generator.render import render
from fusegemm.generator.variants import make_variant
from fusegemm.runtime.cubin_info import Cubin

torch = pytest.importorskip("torch")

from fusegemm.ops.engine import Op  # noqa: E402

from test_op import _launch, no_device  # noqa: E402,F401

BF16 = dict(tile_m=128, tile_n=256, cluster_m=1, cluster_n=1)


def test_the_axes_reach_the_source_and_are_refused_elsewhere():
    src = render(make_variant("grouped_gemm", arch="sm_90a", a_gather=True, **BF16))
    assert "kGatherA = true" in src.text
    assert "kGatherA = false" in render(make_variant("grouped_gemm", arch="sm_90a", **BF16)).text
    # sm_100a: TMA gather4 into each CTA's own stage (a 2-CTA tile's pair: the pair form), so no
    # cluster beyond the tile's own CTAs (rows are not multicast).
    with pytest.raises(UnsupportedError, match=r"cluster_m=4 .* with a_gather=True with tile_m=256; implemented: 2"):
        registry.resolve("grouped_gemm", "sm_100a", {"a_gather": True, "tile_m": 256, "cluster_m": 4})
    with pytest.raises(UnsupportedError, match=r"cluster_m=2 .* with a_gather=True with tile_m=128; implemented: 1"):
        registry.resolve("grouped_gemm", "sm_100a", {"a_gather": True, "tile_m": 128, "cluster_m": 2})
    with pytest.raises(UnsupportedError, match=r"cluster_n=2 .* with a_gather=True; implemented: 1"):
        registry.resolve("grouped_gemm", "sm_100a", {"a_gather": True, "tile_m": 256, "cluster_m": 2, "cluster_n": 2})
    registry.resolve("grouped_gemm", "sm_100a", {"a_gather": True, "tile_m": 128, "cluster_m": 1, "cluster_n": 1})
    registry.resolve("grouped_gemm", "sm_100a", {"a_gather": True, "tile_m": 256, "cluster_m": 2, "cluster_n": 1})
    # A partial choice (tile M not chosen yet) is not judged by the tile's conditional limit, as
    # Implementation.problem does not judge it (it raised UnsupportedError(None)).
    registry.resolve("grouped_gemm", "sm_100a", {"a_gather": True})
    assert "kGatherA = true" in render(make_variant("grouped_gemm", arch="sm_100a", a_gather=True, **BF16)).text
    with pytest.raises(UnsupportedError, match="no clusters"):
        registry.resolve("grouped_gemm", "sm_90a", {"a_gather": True, "cluster_m": 2})
    with pytest.raises(UnsupportedError, match=r"gathered B \(b_index\) is the BF16 K-grouped family's"):
        registry.resolve("grouped_gemm", "sm_90a", {"b_gather": True})
    for arch in ("sm_90a", "sm_100a"):   # (sm_100a: TMA gather4 of token rows, not yet run)
        registry.resolve("grouped_gemm_wgrad", arch, {"a_gather": True, "b_gather": True, "tile_m": 128,
                                                       "cluster_m": 1, "cluster_n": 1})
        assert "kGatherB = true" in render(make_variant("grouped_gemm_wgrad", arch=arch, b_gather=True, **BF16)).text
    # Block-scaled: the sm_90a blockwise kernel gathers A (and its 1x128 scales), sm_100a MXFP8 (and
    # the recipe's E8M0 scales run as MX) on 1-CTA tiles; sm_90a MXFP8 and packed FP4 refuse.
    mx = {"a_gather": True, "ab_dtype": "float8_e4m3fn", "sf_vec_size": 32, "sf_dtype": "float8_e8m0fnu"}
    with pytest.raises(UnsupportedError, match=r"gathered A is the blockwise recipe's \(sf_vec_size 128\) on sm_90a"
                                               r".*\(sm_100a gathers MXFP8\)"):
        registry.resolve("grouped_gemm_srelu", "sm_90a", mx)
    one_cta = {"tile_m": 128, "cluster_m": 1, "cluster_n": 1}
    registry.resolve("grouped_gemm_srelu", "sm_100a", {**mx, **one_cta})
    with pytest.raises(UnsupportedError, match=r"tile_m=256 .* with a_gather=True; implemented: 64, 128 .*a 2-CTA "
                                               r"tile's peer would publish on its leader's"):
        registry.resolve("grouped_gemm_srelu", "sm_100a", {**mx, **one_cta, "tile_m": 256, "cluster_m": 2})
    with pytest.raises(UnsupportedError, match=r"cluster_n=2 .* no clusters"):
        registry.resolve("grouped_gemm_srelu", "sm_100a", {**mx, **one_cta, "cluster_n": 2})
    with pytest.raises(UnsupportedError, match=r"ab_dtype='float4_e2m1fn_x2' .* FP8 token rows"):
        registry.resolve("grouped_gemm_srelu", "sm_100a", {**mx, **one_cta, "ab_dtype": "float4_e2m1fn_x2"})
    with pytest.raises(UnsupportedError, match=r"gathered A \(a_index\) is the BF16 grouped and K-grouped families' "
                                               r"operand mode, and the block-scaled grouped family's \(FP8\)"):
        registry.resolve("gemm_amax", "sm_100a", mx)
    bw = {"ab_dtype": "float8_e4m3fn", "sf_vec_size": 128, "sf_dtype": "float32"}
    registry.resolve("grouped_gemm_srelu", "sm_90a", {"a_gather": True, **bw})
    assert "kGatherA = true" in render(make_variant("grouped_gemm_srelu", arch="sm_90a", a_gather=True, **bw)).text
    assert "kGatherA = false" in render(make_variant("grouped_gemm_srelu", arch="sm_90a", **bw)).text


@pytest.mark.parametrize("spec,axes", [
    ("grouped_gemm", {}),
    ("grouped_gemm", dict(tile_m=64, tile_n=128)),                 # ping-pong: 2 rows per lane
    ("grouped_gemm", dict(scheduler="dynamic")),                   # one claim per warp, broadcast
    ("grouped_gemm", dict(weight_mode="discrete")),
    ("grouped_gemm", dict(b_major="n")),
    ("grouped_gemm_swiglu", dict(d_dtype="bfloat16", generate_c=True)),
    ("grouped_gemm_dswiglu_bf16", dict(tile_m=64, tile_n=256, b_major="n", cluster_m=1)),   # the layer's dy
])
def test_gathered_kernels_compile_clean_with_one_row_boxes(session_cache, spec, axes):
    v = make_variant(spec, arch="sm_90a", a_gather=True, **{**BF16, **axes})
    built = pipeline.get_kernel(v, session_cache)
    assert Cubin(built.cubin).resources(built.kernel_name).local_bytes == 0, (spec, axes, "spills / local memory")
    c = built.contract
    # A's map keeps its one-row box (encoded, not read: the producer's cp.async reads A through
    # a_gather_ptr, fusegemm/gather.cuh); B, shared memory and threads as ungathered.
    assert (c.box_a_inner, c.box_a_outer, c.tile_m) == (64, 1, v.tile_m)
    plain = pipeline.get_kernel(make_variant(spec, arch="sm_90a", **{**BF16, **axes}), session_cache).contract
    assert (c.box_b_inner, c.box_b_outer, c.smem_bytes, c.threads) == (
        plain.box_b_inner, plain.box_b_outer, plain.smem_bytes, plain.threads)


@pytest.mark.parametrize("spec, axes", [("grouped_gemm", dict(a_gather=True)),
                                        ("grouped_gemm_wgrad", dict(b_gather=True)),
                                        ("grouped_gemm_wgrad", dict(a_gather=True))])
def test_sm90_gathered_copies_take_a_few_instructions_each(session_cache, spec, axes):
    """The copying warps issue a k-block's cp.async copies from row offsets they hold (per tile
    M-grouped, fetched a k-block ahead K-grouped): at most 6 SASS instructions per copy from the
    first copy to the last. (Shuffling each row's index and forming its address per copy took
    about 12, and the copying warps' issue rate held gathered A at 0.69x the speed of pre-permuted
    rows on the H200; the offsets brought it to 0.91-0.94x, fusegemm/gather.cuh.)"""
    from fusegemm.runtime import disasm
    if not disasm.available():
        pytest.fail("nvdisasm (the nvidia-cuda-nvdisasm wheel, a test dependency) is missing")
    built = pipeline.get_kernel(make_variant(spec, arch="sm_90a", **axes, **BF16), session_cache)
    ops = disasm.opcodes(disasm.sass(built.cubin))
    at = [i for i, op in enumerate(ops) if op.startswith("LDGSTS")]
    # M-grouped: 8 rows per lane, one path; K-grouped: 4 rows per lane in each of the operand's
    # 64-column chunks, in a path for whole chunks and one for chunks past N (or M).
    copies, paths = (8, 1) if spec == "grouped_gemm" else (4 * (256 if axes.get("b_gather") else 128) // 64, 2)
    assert len(at) == copies * paths, (len(at), "one unrolled copy per row group and chunk")
    first = at[:copies]
    assert (first[-1] - first[0] + 1) / copies <= 6, ops[first[0]:first[-1] + 1]


def test_sm90_gathered_64_row_tiles_copy_with_every_warp():
    """FUSEGEMM_SM90_GATHER_ROWS_16 (default 1): a 64-row tile's gathered stage is copied by the
    producer warpgroup's four warps, 16 rows each, four cp.async a lane (LDGSTS sites: 4, against 8
    for two warps of 32 rows); 0 spills either way."""
    from fusegemm.runtime import disasm
    from fusegemm.runtime.compile import compile_source
    src = render(make_variant("grouped_gemm", arch="sm_90a", a_gather=True, **{**BF16, "tile_m": 64, "tile_n": 128}))
    sites = {}
    for flag in ("1", "0"):
        cub = compile_source(src.text, arch="sm_90a", kernel=src.symbol,
                             extra=(f"-DFUSEGEMM_SM90_GATHER_ROWS_16={flag}",))
        assert Cubin(cub.data).resources(src.symbol).local_bytes == 0, flag
        if disasm.available():
            sites[flag] = disasm.count_prefix(disasm.sass_histogram(cub.data), "LDGSTS")
    if sites:
        assert sites == {"1": 4, "0": 8}, sites


def test_sm90_gathered_a_publishes_early_where_measured_faster(session_cache):
    """FUSEGEMM_SM90_GATHER_EARLY: the M-grouped gathered kernel's copying lanes test the next
    stage's empty barrier without waiting (mbarrier.test_wait: SYNCS.PHASECHK without TRYWAIT)
    and publish their lagging stage when it is still in use (H200: gathered fc1 +3-7%); the
    K-grouped gathered kernel, 3-8% slower with it, and the plain kernel have no such test."""
    from fusegemm.runtime import disasm
    if not disasm.available():
        pytest.fail("nvdisasm (the nvidia-cuda-nvdisasm wheel, a test dependency) is missing")

    def tests(spec, **axes):
        built = pipeline.get_kernel(make_variant(spec, arch="sm_90a", **axes, **BF16), session_cache)
        return disasm.sass_histogram(built.cubin).get("SYNCS.PHASECHK.TRANS64", 0)

    assert tests("grouped_gemm", a_gather=True) == 1
    assert tests("grouped_gemm") == 0
    assert tests("grouped_gemm_wgrad", b_gather=True) == 0


def test_sm90_gathered_sources_past_32_bit_offsets_are_refused():
    """sm_90a gathered loads hold row offsets in 16-byte units in 32 bits: a source past 64 GiB is
    an UnsupportedError naming the operand (sm_100a's gather4 reads rows through its tensor map)."""
    from types import SimpleNamespace

    from fusegemm.ops.prepared_launch import _gather_source
    ok = SimpleNamespace(shape=(1 << 22, 7168), strides=(7168, 1), dtype="bfloat16", ptr=1 << 20)
    assert _gather_source("a", ok, "a_tensor", "sm_90a")["a_gather_rows"] == 1 << 22
    edge = SimpleNamespace(shape=(1 << 23, 4096), strides=(4096, 1), dtype="bfloat16", ptr=1 << 20)   # 64 GiB
    assert _gather_source("b", edge, "x_tensor", "sm_90a")["b_gather_rows"] == 1 << 23
    big = SimpleNamespace(shape=((1 << 23) + 1, 4096), strides=(4096, 1), dtype="bfloat16", ptr=1 << 20)
    with pytest.raises(UnsupportedError, match=r"x_tensor: 8388609 rows of 8192 bytes; sm_90a"):
        _gather_source("b", big, "x_tensor", "sm_90a")
    assert _gather_source("b", big, "x_tensor", "sm_100a")["b_gather_rows"] == (1 << 23) + 1


def gathered_operands(t=300, m=512, n=256, k=64):
    """A gathered grouped op's CPU operands: A's t token rows (t, k), two experts' (2, n, k) weights,
    offsets of m rows and an (m,) index of padding (-1)."""
    a = torch.zeros((t, k), dtype=torch.bfloat16)
    b = torch.zeros((2, n, k), dtype=torch.bfloat16)
    off = torch.tensor([m // 2, m], dtype=torch.int32)
    return a, b, off, torch.full((m,), -1, dtype=torch.int32)


def test_op_parses_a_index_and_maps_a_by_its_own_rows(no_device):  # noqa: F811
    op = Op("grouped_gemm", arch="sm_90a", a_gather=True)
    t, m, k = 300, 512, 64
    a, b, off, idx = gathered_operands(t, m, 256, k)
    call = op._parse((a, off, b), {"a_index": idx})
    assert (call.m, call.a_rows, call.k) == (m, t, k)
    from fusegemm.ops.grouped_operands import shape_of
    assert shape_of(call).a_rows == t and shape_of(call).m == m
    values, _ = _launch(op, call, {"alpha": 0}, {"d": 1000})
    assert values["a_index"] == idx.data_ptr() and values["m_rows"] == m
    # What the producer's cp.async reads: A's own address, row pitch and rows (T, not M).
    assert (values["a_gather_ptr"], values["a_gather_ld"], values["a_gather_rows"]) == (a.data_ptr(), k, t)


def test_a_index_is_refused_where_it_does_not_belong():
    a = torch.zeros((300, 64), dtype=torch.bfloat16)
    b = torch.zeros((1, 128, 64), dtype=torch.bfloat16)
    off = torch.tensor([256], dtype=torch.int32)
    gathered, plain = Op("grouped_gemm", arch="sm_90a", a_gather=True), Op("grouped_gemm", arch="sm_90a")
    with pytest.raises(ArgumentError, match=r"^a_index: got None; allowed: an int32 \(M,\) row index"):
        gathered._parse((a, off, b), {})
    with pytest.raises(ArgumentError, match=r"^a_index: got given; allowed: .*a_gather=True, else None"):
        plain._parse((torch.zeros((256, 64), dtype=torch.bfloat16), off, b),
                     {"a_index": torch.zeros(256, dtype=torch.int32)})
    with pytest.raises(ArgumentError, match=r"^a_index.dtype"):
        gathered._parse((a, off, b), {"a_index": torch.zeros(256, dtype=torch.int64)})
    with pytest.raises(ArgumentError, match=r"^a_index.shape\[0\]: got 300; allowed: a multiple of 256"):
        gathered._parse((a, off, b), {"a_index": torch.zeros(300, dtype=torch.int32)})
    with pytest.raises(ArgumentError, match=r"^a_tensor.shape\[0\]: got 0; allowed: at least 1"):
        gathered._parse((a[:0], off, b), {"a_index": torch.zeros(256, dtype=torch.int32)})


def test_an_unexecuted_mode_is_gated_at_launch_with_its_reason(monkeypatch):
    """registry.UNEXECUTED_MODES: a variant that selects a mode listed there passes the first-run
    gate (its configuration class's cases, in the watchdog child) before it launches, and a failure
    names the mode's reason (FUSEGEMM_TRUST_UNVERIFIED=1 launches it); other variants of the row
    are not affected. The gathered modes have run on the H200 and are no longer listed."""
    from fusegemm import verify
    from fusegemm.base.errors import UnverifiedError
    from fusegemm.selftest import Row
    monkeypatch.delenv("FUSEGEMM_TRUST_UNVERIFIED", raising=False)
    monkeypatch.setattr(verify, "_verified", set())
    monkeypatch.setattr(verify, "record_path", lambda cls: None)
    monkeypatch.setattr(verify, "identity", lambda cls, device: {"device": "Fake H200"})
    runs = []
    monkeypatch.setattr(verify, "check_class", lambda cls, device: (runs.append(cls) or
                                                                    [Row(cls.family, "case", "FAIL", 1.0)], None))
    v = make_variant("grouped_gemm", arch="sm_90a", a_gather=True, **BF16)
    verify.ensure_verified(v, 0)                                                    # run on the H200: launches
    assert runs == []
    monkeypatch.setitem(registry.UNEXECUTED_MODES, ("grouped", "sm_90a"), (("a_gather", True, "written today"),))
    with pytest.raises(UnverifiedError, match=r"(?s)failed its first-run verification on sm_90a .*\n  case: FAIL.*"
                                              r"a_gather=True on sm_90a: written today; please report"):
        verify.ensure_verified(v, 0)
    assert len(runs) == 1 and runs[0].operands == ("a_gather",)
    verify.ensure_verified(make_variant("grouped_gemm", arch="sm_90a", **BF16), 0)   # the row's other variants
    assert len(runs) == 1
    monkeypatch.setenv("FUSEGEMM_TRUST_UNVERIFIED", "1")
    verify.ensure_verified(v, 0)
    assert len(runs) == 1


@pytest.mark.parametrize("axes", [dict(a_gather=True), dict(b_gather=True), dict(a_gather=True, b_gather=True),
                                  dict(b_gather=True, tile_m=64, tile_n=128)])
def test_kgrouped_gathered_kernels_compile_clean_with_one_row_boxes(session_cache, axes):
    """The weight gradients' token rows through an index: dY's (a_gather) and/or X's (b_gather),
    copied by the producer warp's cp.async (a gathered operand's map keeps a one-row box, unread)."""
    v = make_variant("grouped_gemm_wgrad", arch="sm_90a", **{**BF16, **axes})
    built = pipeline.get_kernel(v, session_cache)
    assert Cubin(built.cubin).resources(built.kernel_name).local_bytes == 0, (axes, "spills / local memory")
    c = built.contract
    assert (c.box_a_inner, c.box_a_outer) == (64, 1 if axes.get("a_gather") else 64)
    assert (c.box_b_inner, c.box_b_outer) == (64, 1 if axes.get("b_gather") else 64)


def test_kgrouped_op_parses_its_indices(no_device):  # noqa: F811
    op = Op("grouped_gemm_wgrad", arch="sm_90a", a_gather=True, b_gather=True)
    tokens, t, m, n = 300, 512, 256, 128
    dy = torch.zeros((tokens, m), dtype=torch.bfloat16)
    x = torch.zeros((tokens + 7, n), dtype=torch.bfloat16)
    off = torch.tensor([256, 512], dtype=torch.int32)
    dy_idx, x_idx = torch.zeros(t, dtype=torch.int32), torch.full((t,), -1, dtype=torch.int32)
    call = op._parse((dy, x, off), {"dy_index": dy_idx, "x_index": x_idx})
    assert (call.t, call.m_out, call.n, call.l) == (t, m, n, 2)
    assert call.a_index.ptr == dy_idx.data_ptr() and call.b_index.ptr == x_idx.data_ptr()
    values, _ = _launch(op, call, {}, {"d": 1000})
    assert (values["a_gather_ptr"], values["a_gather_ld"], values["a_gather_rows"]) == (dy.data_ptr(), m, tokens)
    assert (values["b_gather_ptr"], values["b_gather_ld"], values["b_gather_rows"]) == (x.data_ptr(), n, tokens + 7)
    with pytest.raises(ArgumentError, match=r"^x_index.shape\[0\]: got 256; allowed: 512 \(the token rows of dy\)"):
        op._parse((dy, x, off), {"dy_index": dy_idx, "x_index": x_idx[:256]})
    with pytest.raises(ArgumentError, match=r"^dy_index: got None; allowed: an int32 \(T,\) token-row index"):
        op._parse((dy, x, off), {"x_index": x_idx})
    plain = Op("grouped_gemm_wgrad", arch="sm_90a")
    with pytest.raises(ArgumentError, match=r"^x_index: got given; allowed: .*b_gather=True, else None"):
        plain._parse((torch.zeros((t, m), dtype=torch.bfloat16), torch.zeros((t, n), dtype=torch.bfloat16), off),
                     {"x_index": x_idx})


@pytest.mark.parametrize("spec,axes", [("grouped_gemm", dict(a_gather=True)),
                                       ("grouped_gemm_wgrad", dict(b_gather=True))])
def test_the_jax_target_refuses_gathered_operands(spec, axes):
    """JAX passes the class's positional operands only: a gathered variant is refused, naming
    where it runs (before JAX is imported: CI has none)."""
    from fusegemm import jax_ffi
    with pytest.raises(UnsupportedError, match=r"gathered operands .* run through fusegemm.Op and the torch ops"):
        jax_ffi.spec_op(spec, **axes)


def test_row_ends_are_parsed_packed_and_checked(no_device):  # noqa: F811
    """``row_ends`` (the routing's, fusegemm/scheduler.cuh): int32 (L,), packed into the ABI field
    of the grouped and the K-grouped classes; 0 without; a wrong shape or dtype named."""
    off = torch.tensor([256, 512], dtype=torch.int32)
    ends = torch.tensor([100, 300], dtype=torch.int32)
    op = Op("grouped_gemm", arch="sm_90a")
    a, b = torch.zeros((512, 64), dtype=torch.bfloat16), torch.zeros((2, 128, 64), dtype=torch.bfloat16)
    values, _ = _launch(op, op._parse((a, off, b), {"row_ends": ends}), {"alpha": 0}, {"d": 1000})
    assert values["row_ends"] == ends.data_ptr()
    assert _launch(op, op._parse((a, off, b), {}), {"alpha": 0}, {"d": 1000})[0]["row_ends"] == 0
    wg = Op("grouped_gemm_wgrad", arch="sm_90a")
    dy, x = torch.zeros((512, 128), dtype=torch.bfloat16), torch.zeros((512, 128), dtype=torch.bfloat16)
    values, _ = _launch(wg, wg._parse((dy, x, off), {"row_ends": ends}), {}, {"d": 1000})
    assert values["row_ends"] == ends.data_ptr()
    with pytest.raises(ArgumentError, match=r"^row_ends.shape\[0\]: got 3; allowed: 2 \(one per expert"):
        op._parse((a, off, b), {"row_ends": torch.zeros(3, dtype=torch.int32)})
    with pytest.raises(ArgumentError, match=r"^row_ends.dtype"):
        wg._parse((dy, x, off), {"row_ends": ends.long()})


def test_row_ends_reach_the_tail_kernel_on_every_call(monkeypatch, no_device):  # noqa: F811
    """The tail kernel zeroes the rows past the row ends (the kernel may skip their tiles): the
    launch hands it the address of this call's row ends, on the full path and on the memoised
    one, and 0 without them."""
    from test_op import _Driver, _Packed
    tails = []
    monkeypatch.setattr("fusegemm.runtime.launch.prepare", lambda kernel, cfg: lambda buf, stream: None)
    monkeypatch.setattr(Op, "_check_devices", lambda self, call, more: 0)
    monkeypatch.setattr("fusegemm.ops.tail.zero_tail", lambda *a: tails.append(a[-1]))
    monkeypatch.setattr("fusegemm.runtime.load.driver", lambda: _Driver())
    monkeypatch.setattr("fusegemm.runtime.load.check", lambda *a: None)
    monkeypatch.setattr("fusegemm.ops.engine.alloc", lambda shape, dtype, device: torch.empty(shape))
    op = Op("grouped_gemm", arch="sm_90a")
    op._launcher = _Packed()
    off = torch.tensor([256, 512], dtype=torch.int32)
    a, b = torch.zeros((512, 64), dtype=torch.bfloat16), torch.zeros((2, 128, 64), dtype=torch.bfloat16)
    ends1, ends2 = torch.tensor([100, 300], dtype=torch.int32), torch.tensor([10, 400], dtype=torch.int32)
    for ends in (ends1, ends2, None):
        op(a, off, b, row_ends=ends, inputs={"alpha": torch.ones(2)})
    assert len(op._memo) == 2 and tails == [ends1.data_ptr(), ends2.data_ptr(), 0]


def test_the_unlagged_build_compiles_with_every_copying_warp(tmp_path):
    """FUSEGEMM_SM90_GATHER_LAG=0 (each copy arrives by itself) was refused with more than one
    copying warp, for a deadlock on the tile ring's parity waits. The deadlock was the copying
    warps' own ring wait (only the lead writes the ring; the others no longer wait on it, see
    tests/gpu/test_launch_stress_gpu.py), so the A/B switch builds with four warps again."""
    from fusegemm.runtime import config
    from fusegemm.runtime.cache import KernelCache
    variant = make_variant("grouped_gemm", arch="sm_90a", a_gather=True, **BF16)
    with config.override(FUSEGEMM_NVRTC_EXTRA="-DFUSEGEMM_SM90_GATHER_LAG=0"):
        built = pipeline.get_kernel(variant, KernelCache(tmp_path / "a"))
    res = Cubin(built.cubin).resources(built.kernel_name)
    assert res.registers > 0 and res.local_bytes == 0


SM100_GATHER_CASES = [dict(tile_m=128, tile_n=256), dict(tile_m=64, tile_n=256),
                      dict(tile_m=128, tile_n=128, weight_mode="discrete"),
                      dict(tile_m=128, tile_n=256, scheduler="dynamic", b_major="n"),
                      dict(tile_m=256, tile_n=256, cluster_m=2),                    # the default: a 2-CTA pair
                      dict(tile_m=256, tile_n=128, cluster_m=2, weight_mode="discrete")]


@pytest.mark.parametrize("axes", SM100_GATHER_CASES, ids=lambda a: "-".join(f"{k}{v}" for k, v in a.items()))
def test_sm100_gathered_kernels_load_a_by_gather4(session_cache, axes):
    """sm_100a gathered A (not run on a Blackwell GPU): each producer lane's TMA gather4 of four
    rows replaces A's boxes (a 2-CTA pair's in the pair form, as its boxes), B and everything else
    as the plain kernel's; no local memory, A's map one row per box (the stage's expected bytes stay
    the plain kernel's, a static_assert in the header: gather4 moves a box's bytes in four rows)."""
    from fusegemm.runtime import disasm
    base = dict(dict(cluster_m=1, cluster_n=1), **axes)
    pair = ".2CTA" if axes["tile_m"] == 256 else ""
    gathered = pipeline.get_kernel(make_variant("grouped_gemm", arch="sm_100a", a_gather=True, **base), session_cache)
    plain = pipeline.get_kernel(make_variant("grouped_gemm", arch="sm_100a", **base), session_cache)
    assert Cubin(gathered.cubin).resources(gathered.kernel_name).local_bytes == 0
    c, pc = gathered.contract, plain.contract
    assert (c.box_a_inner, c.box_a_outer) == (64, 1)
    assert (c.box_b_inner, c.box_b_outer, c.smem_bytes, c.threads, c.tmem_cols) == (
        pc.box_b_inner, pc.box_b_outer, pc.smem_bytes, pc.threads, pc.tmem_cols)
    hist, plain_hist = disasm.sass_histogram(gathered.cubin), disasm.sass_histogram(plain.cubin)
    gather4 = [op for op in hist if op.startswith("UTMALDG.2D.GATHER4")]
    assert gather4 == ["UTMALDG.2D.GATHER4" + pair] and not any("GATHER4" in op for op in plain_hist)
    # Dense B loads 3-D boxes: the plain kernel's only 2-D unicast loads are A's, gone here.
    if axes.get("weight_mode") != "discrete":
        assert plain_hist.get("UTMALDG.2D" + pair, 0) >= 1 and hist.get("UTMALDG.2D" + pair, 0) == 0
    assert disasm.count_prefix(hist, "UTCHMMA") == disasm.count_prefix(plain_hist, "UTCHMMA")


@pytest.mark.parametrize("gather", [dict(b_gather=True), dict(a_gather=True), dict(a_gather=True, b_gather=True)],
                         ids=lambda g: "-".join(g))
def test_sm100_kgrouped_gathered_operands_load_token_rows_by_gather4(session_cache, gather):
    """sm_100a K-grouped gathered dY and/or X (not run on a Blackwell GPU): the operand's 64 token
    rows of a k-block arrive by TMA gather4 where its boxes would put them; the map one token row per
    box, the other operand, shared memory and TMEM as the plain kernel's, no local memory."""
    from fusegemm.runtime import disasm
    axes = dict(tile_m=128, tile_n=256, cluster_m=1, cluster_n=1)
    gathered = pipeline.get_kernel(make_variant("grouped_gemm_wgrad", arch="sm_100a", **gather, **axes), session_cache)
    plain = pipeline.get_kernel(make_variant("grouped_gemm_wgrad", arch="sm_100a", **axes), session_cache)
    assert Cubin(gathered.cubin).resources(gathered.kernel_name).local_bytes == 0
    c, pc = gathered.contract, plain.contract
    for operand in ("a", "b"):
        box = (getattr(c, f"box_{operand}_inner"), getattr(c, f"box_{operand}_outer"))
        plain_box = (getattr(pc, f"box_{operand}_inner"), getattr(pc, f"box_{operand}_outer"))
        assert box == ((64, 1) if gather.get(f"{operand}_gather") else plain_box), operand
    assert (c.smem_bytes, c.threads, c.tmem_cols) == (pc.smem_bytes, pc.threads, pc.tmem_cols)
    hist, plain_hist = disasm.sass_histogram(gathered.cubin), disasm.sass_histogram(plain.cubin)
    assert hist.get("UTMALDG.2D.GATHER4", 0) >= 1 and "UTMALDG.2D.GATHER4" not in plain_hist
    assert disasm.count_prefix(hist, "UTCHMMA") == disasm.count_prefix(plain_hist, "UTCHMMA")


@pytest.mark.parametrize("spec,axes,modes", [
    ("grouped_gemm", dict(a_gather=True, tile_m=128, tile_n=256, cluster_m=1, cluster_n=1), ("a_gather",)),
    ("grouped_gemm_wgrad", dict(b_gather=True), ("b_gather",)),
    ("grouped_gemm_wgrad", dict(a_gather=True, b_gather=True), ("a_gather", "b_gather")),
    ("grouped_gemm_quant", dict(a_gather=True, ab_dtype="float8_e4m3fn", sf_dtype="float8_e8m0fnu", sf_vec_size=32),
     ("a_gather",))])
def test_sm100_gathered_variants_are_first_run_gated_by_cases_that_pass_an_index(spec, axes, modes):
    """sm_100a gathered operands (TMA gather4, not run on a Blackwell GPU) are configuration classes
    of their own: the first-run gate (fusegemm/verify.py) runs that class's cases, which read the
    operands through an index (fusegemm/selftest.py _gathered: repeated tokens, an index past the
    source and the padding's -1), before the first launch; no blanket refusal stands in."""
    from fusegemm import selftest
    from fusegemm.generator.config_class import ConfigClass, config_class
    v = make_variant(spec, arch="sm_100a", **axes)
    assert registry.unexecuted_mode(spec, "sm_100a", vars(v)) is None and not registry.executed(spec, "sm_100a")
    cls = config_class(v)
    assert cls.operands == modes and cls.slug.endswith("".join(f".{m.replace('_', '-')}" for m in modes))
    assert cls != config_class(make_variant(spec, arch="sm_100a", **{k: x for k, x in axes.items() if k not in modes}))
    assert ConfigClass.from_json(cls.to_json()) == cls and "gathered" in cls.describe()
    cases = selftest.class_cases(cls)
    assert cases and all(all(c["axes"].get(m) for m in modes) for _, c in cases)
    assert cls in selftest.all_classes("sm_100a", (spec,))


def test_gathered_case_operands_read_zeros_outside_the_source():
    """The gate's gathered operands (selftest._gathered): valid rows read source rows (some twice),
    the first valid row an index past the source, padding rows -1; both of those read zeros."""
    import numpy as np

    from fusegemm import selftest
    rng = np.random.default_rng(0)
    valid = selftest._valid_rows([3, 0, 200], [256, 0, 256])
    assert valid.sum() == 203 and valid[:3].all() and not valid[3:256].any()
    source = rng.standard_normal((40, 8)).astype(np.float32) + 5.0   # no zero rows
    index, rows = selftest._gathered(rng, source, valid)
    assert index.dtype == np.int32 and index[0] == 43 and (index[~valid] == -1).all()
    assert not rows[0].any() and not rows[~valid].any()
    inside = valid.copy()
    inside[0] = False
    np.testing.assert_array_equal(rows[inside], source[index[inside]])
    assert len(set(index[inside].tolist())) < inside.sum()   # tokens read twice, as top-k routing does


def _rows_through(source, index):
    """The stand-in kernels' gathered load: row r is ``source[index[r]]``, zeros for an index
    outside the source (the kernels' contract; routing's torch gather serves -1 only)."""
    if index is None:
        return source
    idx = index.long()
    inside = (idx >= 0) & (idx < source.shape[0])
    rows = torch.zeros((len(idx), source.shape[1]), dtype=source.dtype)
    rows[inside] = source[idx[inside]]
    return rows


@pytest.mark.parametrize("axes", [dict(a_gather=True, b_gather=True), dict(b_gather=True), dict(a_gather=True)])
def test_the_gathered_weight_gradient_case_passes_sources_and_indices(monkeypatch, axes):
    """selftest._run_wgrad's gathered case (the first-run gate's) against a stand-in for the kernel
    that gathers what it is given: the case passes the token-major sources with their indices, and
    its reference is the gathered problem (a case that passed the gathered rows with the index, or
    the sources to the reference, would fail here)."""
    import numpy as np

    from fusegemm import selftest
    from fusegemm.ops import device, kgrouped

    def kernel(self, dy, x, off, inputs=None, dy_index=None, x_index=None):
        dyg, xg = (_rows_through(src, idx).float().numpy() for src, idx in ((dy, dy_index), (x, x_index)))
        ends = off.numpy().tolist()
        blocks = [dyg[s:e].T @ xg[s:e] for s, e in zip([0] + ends[:-1], ends)]
        return {"d": torch.from_numpy(np.concatenate(blocks)).to(torch.bfloat16)}

    monkeypatch.setattr(kgrouped.KGroupedGemm, "__call__", kernel)
    monkeypatch.setattr(kgrouped.KGroupedGemm, "check_support", lambda self: None)
    monkeypatch.setattr(device, "device_arch", lambda d: "sm_90a")
    err, ok, _ = selftest._run_wgrad(dict(tokens=[256, 0, 300], m=128, n=128, axes=axes), "cpu")
    assert ok, err


@pytest.mark.parametrize("spec", ["grouped_gemm", "grouped_gemm_swiglu", "grouped_gemm_dswiglu_bf16"])
def test_the_gathered_spec_case_passes_the_source_and_its_index(monkeypatch, spec):
    """selftest._run_spec's gathered case (the first-run gate's, for every spec offering a_gather)
    against a stand-in for the kernel that gathers A's rows from what it is given and then takes the
    interpreter's outputs: the case passes the token-major source with a_index and gives its
    reference the gathered rows."""
    import numpy as np

    from fusegemm import selftest
    from fusegemm.ops import device

    def kernel(self, a, off, *rest, inputs=None, a_index=None, **kw):
        ref = self.reference(_rows_through(a, a_index), off, *rest, inputs=inputs)
        return {k: torch.from_numpy(np.asarray(v, np.float32)) for k, v in ref.items()}

    monkeypatch.setattr(Op, "__call__", kernel)
    monkeypatch.setattr(device, "device_arch", lambda d: "sm_90a")
    err, ok, detail = selftest._run_spec(dict(spec=spec, tokens=[256, 0, 300], n=256, k=64, axes={"a_gather": True}),
                                         "cpu")
    assert ok, (err, detail)


BW = dict(sf_vec_size=128, sf_dtype="float32")


@pytest.mark.parametrize("spec,axes", [("grouped_gemm_quant", {}), ("grouped_gemm_dswiglu", {}),
                                       ("grouped_gemm_srelu", {"weight_mode": "discrete", "tile_n": 128})])
def test_sm90_blockwise_gathered_a_copies_rows_and_scales(session_cache, spec, axes):
    """The blockwise kernel with gathered A (fusegemm/sm90/blockwise_promote.cuh produce_gathered):
    no local memory; at every copy site of the producer's stage loop (one, or two where NVVM
    unrolls it, as for dSwiGLU's kernel), a lane's 8 rows of A as 16-byte cp.async copies and its
    row's 1x128 scale as one 4-byte copy, and B as the only TMA load (A's and SFA's boxes gone).
    The plain kernel copies nothing. (Whether the stage loop follows the consumers' passes cannot
    be seen here: dSwiGLU's case in tests/gpu/test_gather_blockwise_gpu.py hangs when it does not.)"""
    from fusegemm.runtime import disasm
    if not disasm.available():
        pytest.fail("nvdisasm (the nvidia-cuda-nvdisasm wheel, a test dependency) is missing")

    def hist(**extra):
        built = pipeline.get_kernel(make_variant(spec, arch="sm_90a", **BW, **axes, **extra), session_cache)
        assert built.resources.local_bytes == 0, built.resources
        return disasm.sass_histogram(built.cubin)

    h = hist(a_gather=True)
    sites = h.get("LDGSTS.E", 0)   # the 4-byte scale copies
    assert sites >= 1 and h.get("LDGSTS.E.BYPASS.128", 0) == 8 * sites, h
    assert sum(v for op, v in h.items() if op.startswith("UTMALDG")) == sites, h
    plain = hist()
    assert not any(op.startswith("LDGSTS") for op in plain), plain


def test_blockwise_op_parses_a_index_and_reads_a_and_its_scales_by_their_own_rows(no_device):  # noqa: F811
    op = Op("grouped_gemm_quant", arch="sm_90a", a_gather=True, **BW)
    t, m, n, k, l = 300, 512, 256, 256, 2
    a = torch.zeros((t, k), dtype=torch.float8_e4m3fn)
    sa = torch.zeros((2, 304), dtype=torch.float32).t()   # (T, K/128), T-contiguous, pitch 304
    b = torch.zeros((l, n, k), dtype=torch.float8_e4m3fn)
    sb = torch.zeros((l, n // 128, k // 128), dtype=torch.float32)
    off = torch.tensor([256, 512], dtype=torch.int32)
    idx = torch.full((m,), -1, dtype=torch.int32)
    call = op._parse((a, sa[:t], off, b, sb), {"a_index": idx})
    assert (call.m, call.a_rows, call.a_map_rows, call.sfa_ld) == (m, t, t, 304)
    values, _ = _launch(op, call, {"alpha": 0}, {"d": 1000})
    assert values["a_index"] == idx.data_ptr() and values["m_rows"] == m
    # What the copying warps read: A's address, pitch and rows (T, not M), and its scales' own.
    assert (values["a_gather_ptr"], values["a_gather_ld"], values["a_gather_rows"]) == (a.data_ptr(), k, t)
    assert (values["sfa_gather_ptr"], values["sfa_gather_ld"]) == (sa.data_ptr(), 304)
    plain = Op("grouped_gemm_quant", arch="sm_90a", **BW)
    call = plain._parse((torch.zeros((m, k), dtype=torch.float8_e4m3fn), torch.zeros((2, m)).t(), off, b, sb), {})
    values, _ = _launch(plain, call, {"alpha": 0}, {"d": 1000})
    assert values["a_index"] == values["a_gather_ptr"] == values["sfa_gather_ptr"] == values["sfa_gather_ld"] == 0


def test_blockwise_a_index_is_refused_where_it_does_not_belong():
    a = torch.zeros((300, 256), dtype=torch.float8_e4m3fn)
    b = torch.zeros((1, 128, 256), dtype=torch.float8_e4m3fn)
    sb = torch.zeros((1, 1, 2), dtype=torch.float32)
    off = torch.tensor([256], dtype=torch.int32)
    gathered, plain = Op("grouped_gemm_quant", arch="sm_90a", a_gather=True, **BW), Op("grouped_gemm_quant",
                                                                                       arch="sm_90a", **BW)
    sa = torch.zeros((2, 300)).t()
    with pytest.raises(ArgumentError, match=r"^a_index: got None; allowed: an int32 \(M,\) row index"):
        gathered._parse((a, sa, off, b, sb), {})
    with pytest.raises(ArgumentError, match=r"^a_index: got given; allowed: .*a_gather=True, else None"):
        plain._parse((a[:256], sa[:256], off, b, sb), {"a_index": torch.zeros(256, dtype=torch.int32)})
    with pytest.raises(ArgumentError, match=r"^a_index.shape\[0\]: got 300; allowed: a multiple of 256"):
        gathered._parse((a, sa, off, b, sb), {"a_index": torch.zeros(300, dtype=torch.int32)})
    # The scales are A's (T rows), not the problem's M.
    with pytest.raises(ArgumentError, match=r"^sfa_tensor.shape: got \(512, 2\); allowed: \(300, 2\)"):
        gathered._parse((a, torch.zeros((2, 512)).t(), off, b, sb), {"a_index": torch.zeros(512, dtype=torch.int32)})
    with pytest.raises(UnsupportedError, match=r"gathered A is the blockwise recipe's"):
        Op("grouped_gemm_quant", arch="sm_90a", a_gather=True).check_support()


def test_the_reference_reads_a_through_the_index_as_the_kernels_do():
    """Op.reference of a gathered op takes a_index and reads A's rows (and the blockwise recipe's
    scales) through it: the same outputs as the plain op's reference on the rows gathered
    beforehand (zeros, and zero scales, where the index is outside A)."""
    import numpy as np

    from fusegemm.formats import quantize_128x128
    from fusegemm.formats.blockwise import quantize_1x128
    rng = np.random.default_rng(5)
    t, k, n, l = 40, 256, 128, 2
    off = np.array([256, 512], dtype=np.int32)
    idx = np.full(512, -1, dtype=np.int32)
    idx[:200] = rng.integers(0, t, 200)
    idx[300:350] = rng.integers(0, t, 50)
    idx[3], idx[4] = t + 2, -5
    inside = (idx >= 0) & (idx < t)
    ins = {"alpha": np.ones(l, np.float32)}
    x = rng.standard_normal((t, k)).astype(np.float32)
    w = rng.standard_normal((l, n, k)).astype(np.float32) * 0.1
    import ml_dtypes
    xb, wb = x.astype(ml_dtypes.bfloat16), w.astype(ml_dtypes.bfloat16)
    rows = np.where(inside[:, None], xb[np.clip(idx, 0, t - 1)], ml_dtypes.bfloat16(0))
    got = Op("grouped_gemm", arch="sm_90a", a_gather=True).reference(xb, off, wb, a_index=idx, inputs=ins)
    want = Op("grouped_gemm", arch="sm_90a").reference(rows, off, wb, inputs=ins)
    np.testing.assert_array_equal(np.asarray(got["d"]), np.asarray(want["d"]))
    # Without the index, A holds the problem's rows already gathered; an index for a plain op is refused.
    again = Op("grouped_gemm", arch="sm_90a", a_gather=True).reference(rows, off, wb, inputs=ins)
    np.testing.assert_array_equal(np.asarray(again["d"]), np.asarray(want["d"]))
    with pytest.raises(ArgumentError, match="^a_index: got given"):
        Op("grouped_gemm", arch="sm_90a").reference(rows, off, wb, a_index=idx, inputs=ins)

    xq, sx = quantize_1x128(x * 3, "float8_e4m3fn")
    wq, sw = quantize_128x128(w, "float8_e4m3fn")
    rq = np.where(inside[:, None], xq[np.clip(idx, 0, t - 1)], xq.dtype.type(0))
    rs = np.where(inside[:, None], sx[np.clip(idx, 0, t - 1)], np.float32(0))
    ins = {"alpha": np.ones(l, np.float32), "prob": np.ones(512, np.float32)}
    got = Op("grouped_gemm_quant", arch="sm_90a", a_gather=True, d_dtype="bfloat16", **BW).reference(
        xq, sx, off, wq, sw, a_index=idx, inputs=ins)
    want = Op("grouped_gemm_quant", arch="sm_90a", d_dtype="bfloat16", **BW).reference(rq, rs, off, wq, sw, inputs=ins)
    np.testing.assert_array_equal(np.asarray(got["d"]), np.asarray(want["d"]))


MX = dict(ab_dtype="float8_e4m3fn", sf_dtype="float8_e8m0fnu", sf_vec_size=32, cluster_m=1, cluster_n=1)


@pytest.mark.parametrize("spec,axes", [
    ("grouped_gemm_quant", dict(tile_m=128, tile_n=256)),
    ("grouped_gemm_dswiglu", dict(tile_m=64, tile_n=256)),                     # 16 lanes, the stage's half
    ("grouped_gemm_glu_mx", dict(tile_m=128, tile_n=256, ab_dtype="float8_e5m2")),
    ("grouped_gemm_srelu", dict(tile_m=128, tile_n=128, weight_mode="discrete")),
    ("grouped_gemm_quant", dict(tile_m=128, tile_n=256, sf_vec_size=128)),    # the recipe's E8M0, run as MX
], ids=lambda x: x if isinstance(x, str) else "-".join(f"{k}{v}" for k, v in x.items()))
def test_sm100_block_scaled_gathered_a_loads_rows_by_gather4_and_scale_words(session_cache, spec, axes):
    """sm_100a block-scaled gathered A (not run on a Blackwell GPU; its configuration class's
    first-run cases read A and its scales through an index): each producer lane's TMA gather4 of
    four token rows replaces A's boxes, and its four 4-byte cp.async copies of those rows' scale
    words (one copy site) replace SFA's 4-D box; B, SFB, shared memory, threads and TMEM as the
    plain kernel's, no local memory, A's map one row per box. (The full barrier's count, 1 + the
    copying lanes, and the expected bytes without SFA's: tests/unit/test_sm100_static.py.)"""
    from fusegemm.runtime import disasm
    if not disasm.available():
        pytest.fail("nvdisasm (the nvidia-cuda-nvdisasm wheel, a test dependency) is missing")
    base = {**MX, **axes}
    gathered = pipeline.get_kernel(make_variant(spec, arch="sm_100a", a_gather=True, **base), session_cache)
    plain = pipeline.get_kernel(make_variant(spec, arch="sm_100a", **base), session_cache)
    assert gathered.resources.local_bytes == 0, gathered.resources
    c, pc = gathered.contract, plain.contract
    assert (c.box_a_inner, c.box_a_outer) == (128, 1)
    assert (c.box_b_inner, c.box_b_outer, c.smem_bytes, c.threads, c.tmem_cols) == (
        pc.box_b_inner, pc.box_b_outer, pc.smem_bytes, pc.threads, pc.tmem_cols)
    h, ph = disasm.sass_histogram(gathered.cubin), disasm.sass_histogram(plain.cubin)
    # (4-byte copies: LDGSTS.E, or its .ZFILL form where ptxas chooses it)
    assert h.get("UTMALDG.2D.GATHER4", 0) == 1 and h.get("LDGSTS.E", 0) + h.get("LDGSTS.E.ZFILL", 0) == 4, h
    assert not any(op.startswith(("LDGSTS", "UTMALDG.2D.GATHER4")) for op in ph)
    # SFA's box (unicast and multicast forms) gone, SFB's kept; A's 2-D boxes gone (dense B is 3-D).
    for form in ("UTMALDG.4D", "UTMALDG.4D.MULTICAST"):
        assert (h.get(form, 0), ph.get(form, 0)) == (1, 2), form
    if axes.get("weight_mode") != "discrete":
        assert h.get("UTMALDG.2D", 0) == 0 and ph.get("UTMALDG.2D", 0) >= 1
    assert disasm.count_prefix(h, "UTCQMMA") == disasm.count_prefix(ph, "UTCQMMA") > 0


def test_sm100_scale_word_addresses_are_the_atom_layout():
    """fusegemm/gather.cuh sf_atom_word, as compiled: token row r's scales of k-atom ka are the
    4-byte word it names in the atom buffer pack_sf lays out (fusegemm/formats/scales.py), for rows
    across three 128-row atom groups and three k-atoms; and row r of a stage's atom is word
    sf_atom_word(r) of it."""
    import numpy as np

    from fusegemm.formats import pack_sf
    from fusegemm.runtime.compile import compile_source
    from fusegemm.runtime.cubin_info import Cubin as CubinInfo
    rows, katoms = 300, 3
    pairs = [(r, ka) for r in range(rows) for ka in range(katoms)]
    calls = ", ".join(f"int(fusegemm::sf_atom_word({r}, {ka}, {katoms * 128}u))" for r, ka in pairs)
    local = ", ".join(f"int(fusegemm::sf_atom_word({r}))" for r in range(128))
    src = ('#include "fusegemm/gather.cuh"\n'
           f'extern "C" __device__ __attribute__((used)) const int fg_words[{len(pairs)}] = {{{calls}}};\n'
           f'extern "C" __device__ __attribute__((used)) const int fg_local[128] = {{{local}}};\n'
           'extern "C" __global__ void fg_probe() {}\n')
    cub = compile_source(src, arch="sm_100a", kernel="fg_probe")
    words = CubinInfo(cub.data).global_ints("fg_words", len(pairs))
    local_words = CubinInfo(cub.data).global_ints("fg_local", 128)
    rng = np.random.default_rng(3)
    logical = rng.integers(0, 256, (rows, 4 * katoms), dtype=np.uint8)
    packed = pack_sf(logical).reshape(-1, 4)
    for (r, ka), w in zip(pairs, words):
        np.testing.assert_array_equal(packed[w], logical[r, 4 * ka:4 * ka + 4], err_msg=str((r, ka, w)))
    one = pack_sf(logical[:128, :4]).reshape(-1, 4)
    for r, w in enumerate(local_words):
        np.testing.assert_array_equal(one[w], logical[r, :4], err_msg=str((r, w)))


def test_sm100_block_scaled_op_parses_a_index_and_maps_a_and_its_scales_by_their_own_rows(monkeypatch,
                                                                                         no_device):  # noqa: F811
    """The sm_100a MXFP8 op with gathered A: M from the index, A's map and SFA's atom map over A's T
    rows, and the kernel's copying lanes told where SFA's atoms are and how far apart 128 rows'
    atom groups lie (ceil(ceil(K/32) / 4) * 128 words)."""
    from fusegemm.formats import pack_sf
    from fusegemm.ops import scaled_operands
    op = Op("grouped_gemm_quant", arch="sm_100a", a_gather=True, tile_m=128, **MX)
    t, m, n, k, l = 300, 512, 256, 640, 2      # ceil(K/32) = 20 scales per row: 5 k-atoms
    a = torch.zeros((t, k), dtype=torch.float8_e4m3fn)
    sfa = torch.from_numpy(pack_sf(torch.zeros((t, k // 32), dtype=torch.uint8).numpy()))
    b = torch.zeros((l, n, k), dtype=torch.float8_e4m3fn)
    sfb = torch.from_numpy(pack_sf(torch.zeros((l, n, k // 32), dtype=torch.uint8).numpy(), batch_first=True))
    off = torch.tensor([256, 512], dtype=torch.int32)
    idx = torch.full((m,), -1, dtype=torch.int32)
    call = op._parse((a, sfa, off, b, sfb), {"a_index": idx})
    assert (call.m, call.a_rows, call.a_map_rows) == (m, t, t)
    mapped = []
    atom_map = scaled_operands.sf_atom_map
    monkeypatch.setattr(scaled_operands, "sf_atom_map", lambda tiled, ptr, mn, *rest: (
        mapped.append((ptr, mn)), atom_map(tiled, ptr, mn, *rest))[1])
    values, _ = _launch(op, call, {"alpha": 0}, {"d": 1000})
    assert mapped[0] == (sfa.data_ptr(), t)
    assert values["a_index"] == idx.data_ptr() and values["m_rows"] == m
    assert (values["sfa_gather_ptr"], values["sfa_gather_ld"]) == (sfa.data_ptr(), 5 * 128)
    assert (values["a_gather_ptr"], values["a_gather_rows"]) == (a.data_ptr(), t)
    # The scales are A's (T rows), not the problem's M.
    with pytest.raises(ArgumentError, match=r"^sfa_tensor"):
        op._parse((a, torch.from_numpy(pack_sf(torch.zeros((m, k // 32), dtype=torch.uint8).numpy())), off, b, sfb),
                  {"a_index": idx})


def _mx_rows_by_words(source_atoms, index, t, k):
    """The sm_100a kernel's scale copies, word by word (sf_atom_word's formula, written here): problem
    row r's word of k-atom ka is token index[r]'s, zeros outside [0, t)."""
    import numpy as np
    katoms = -(-(k // 32) // 4)
    src = np.asarray(source_atoms).view(np.uint8).reshape(-1, 4)
    m = len(index)
    out = np.zeros((-(-m // 128) * katoms * 128, 4), np.uint8)

    def word(r, ka):
        return (r // 128 * katoms + ka) * 128 + (r % 32) * 4 + (r % 128) // 32

    for r, tok in enumerate(np.asarray(index).tolist()):
        if 0 <= tok < t:
            for ka in range(katoms):
                out[word(r, ka)] = src[word(tok, ka)]
    return out.reshape(-1)


def test_the_mx_gathered_case_and_the_reference_read_scales_as_the_kernel_copies_them(monkeypatch):
    """selftest._run_spec's gathered MXFP8 case (the sm_100a first-run gate's) against a stand-in
    kernel that gathers A's rows and copies the scale words with the kernel's own addressing
    (_mx_rows_by_words), then takes the interpreter's outputs on them: the case passes the
    token-major sources and the index, its reference reads the same scales. Op.reference with the
    index gives the same outputs as on the rows and scales gathered beforehand."""
    import ml_dtypes
    import numpy as np

    from fusegemm import selftest
    from fusegemm.formats.numpy_dtypes import to_numpy
    from fusegemm.ops import device

    def kernel(self, a, sfa, off, b, sfb, inputs=None, a_index=None, **kw):
        t, k = a.shape
        rows = _rows_through(a.view(torch.uint8), a_index).view(a.dtype)
        words = _mx_rows_by_words(to_numpy(sfa), a_index.numpy(), t, k)
        ref = self.reference(rows, words.view(ml_dtypes.float8_e8m0fnu), off, b, sfb, inputs=inputs)
        via_index = self.reference(a, sfa, off, b, sfb, a_index=a_index, inputs=inputs)
        for name in ref.keys():
            np.testing.assert_array_equal(np.asarray(ref[name]), np.asarray(via_index[name]), err_msg=name)
        return {n: torch.from_numpy(np.asarray(v, np.float32)) for n, v in ref.items()}

    monkeypatch.setattr(Op, "__call__", kernel)
    monkeypatch.setattr(device, "device_arch", lambda d: "sm_100a")
    axes = {"a_gather": True, **MX, "tile_m": 128, "d_dtype": "bfloat16"}
    err, ok, detail = selftest._run_spec(dict(spec="grouped_gemm_quant", tokens=[300, 0, 700, 17], n=256, k=320,
                                              axes=axes), "cpu")
    assert ok, (err, detail)


def test_default_launch_axes_yield_to_the_gathered_modes_limits():
    """A launch axis left at its default moves to the nearest value the kernel implements with the
    chosen mode (sm_100a block-scaled gathered A: the default 2-CTA tile of 256 rows in a cluster
    of 2 becomes 128 rows without a cluster); a chosen one is refused with the limit's reason, and
    other variants keep their defaults."""
    mx = {k: v for k, v in MX.items() if not k.startswith("cluster")}   # (the launch axes left unset)
    plain = make_variant("grouped_gemm_srelu", arch="sm_100a", **mx)
    assert (plain.tile_m, plain.cluster_m, plain.cluster_n) == (256, 2, 1)
    for vec in (32, 128):   # (128: the recipe's E8M0 scales, run as MX)
        v = make_variant("grouped_gemm_srelu", arch="sm_100a", a_gather=True, **{**mx, "sf_vec_size": vec})
        assert (v.tile_m, v.tile_n, v.cluster_m, v.cluster_n) == (128, plain.tile_n, 1, 1)
        registry.resolve("grouped_gemm_srelu", "sm_100a", vars(v))
    bf16 = make_variant("grouped_gemm", arch="sm_100a", a_gather=True)   # (gathers on its 2-CTA pair)
    assert (bf16.tile_m, bf16.cluster_m) == (256, 2)
    with pytest.raises(UnsupportedError, match=r"^tile_m=256 .* with a_gather=True; implemented: 64, 128"):
        Op("grouped_gemm_srelu", arch="sm_100a", a_gather=True, tile_m=256, **mx).check_support()
