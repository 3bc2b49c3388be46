"""Ping-pong tiles of the sm_90a blockwise kernel (tile_m 64, fusegemm/sm90/blockwise_promote.cuh)
on the CPU: what the registry implements and refuses, the first-run gate that holds the tiles until a
GPU has run them, the gate's cases, and the compiled kernels (no spills, no serialized WGMMAs; the
two temporary sets and the warpgroups' order in the SASS). tests/gpu/test_blockwise_pingpong_gpu.py
runs them."""
from __future__ import annotations

import pytest

import fusegemm
from fusegemm.base.errors import UnsupportedError
from fusegemm.generator import registry
from fusegemm.generator.spec import find_spec
from fusegemm.generator.variants import make_variant

BW = {"sf_dtype": "float32", "sf_vec_size": 128}
PINGPONG = {"tile_m": 64, "tile_n": 128}


@pytest.mark.parametrize("spec", ["grouped_gemm_dswiglu", "grouped_gemm_dglu_mx", "grouped_gemm_srelu"])
def test_blockwise_dswiglu_offers_pingpong_tiles_on_sm90(spec):
    fusegemm.Op(spec, arch="sm_90a", **BW, **PINGPONG).check_support()


@pytest.mark.parametrize("axes,match", [
    ({**BW, "tile_m": 64, "tile_n": 256}, r"tile_n=256 is not implemented.*ping-pong \(tile_m 64\): a warpgroup's two "
                                          r"temporary accumulator sets"),
    ({"sf_vec_size": 32, **PINGPONG}, r"tile_m=64 is not implemented.*MXFP8 \(promoted per 32 K\)"),
    ({**BW, **PINGPONG, "a_gather": True}, r"a_gather=True is not implemented.*ping-pong \(tile_m 64\): the "
                                           r"gathering producer warps copy 128-row tiles"),
], ids=["tile_n_256", "mxfp8", "gathered_a"])
def test_what_pingpong_refuses_is_named(axes, match):
    with pytest.raises(UnsupportedError, match=match):
        fusegemm.Op("grouped_gemm_dswiglu", arch="sm_90a", **axes).check_support()


def test_pingpong_tiles_are_executed_modes():
    """tests/gpu/test_blockwise_pingpong_gpu.py passed on the H200 (2026-12-05): the first-run gate
    no longer stands before tile_m 64 on sm_90a."""
    v = make_variant(find_spec("grouped_gemm_dswiglu"), arch="sm_90a", cluster_m=1, **BW, **PINGPONG)
    assert registry.unexecuted_mode(v.kernel, v.arch, vars(v)) is None


def test_the_gate_runs_several_tiles_per_warpgroup():
    """The class's cases include a problem of more tiles than two per CTA (both warpgroups take
    turns) with an odd number of k-blocks."""
    from fusegemm.generator.config_class import config_class
    from fusegemm.selftest import _padded, class_cases
    cls = config_class(make_variant(find_spec("grouped_gemm_dswiglu"), arch="sm_90a", cluster_m=1, **BW, **PINGPONG))
    cases = dict(class_cases(cls))
    case = cases["ping-pong: several tiles per warpgroup"]
    tiles = sum(_padded(case["tokens"])) // 64 * -(-case["n"] // 128)
    assert tiles >= 3 * 132 and -(-case["k"] // 128) % 2 == 1
    assert case["axes"]["tile_m"] == 64 and case["axes"]["tile_n"] == 128


def _clean_build(spec: str, axes: dict, cache, extra: str = "", arch: str = "sm_90a", recipe: dict = BW):
    """The kernel of ``spec`` with ``recipe`` and ``axes`` on ``arch`` (NVRTC defines ``extra``; by
    default the sm_90a blockwise kernel) and its SASS, checked free of register spills and of
    ptxas advisories (serialized WGMMAs)."""
    from fusegemm.pipeline import get_kernel
    from fusegemm.runtime import config, disasm
    from fusegemm.runtime.cubin_info import Cubin
    with config.override(FUSEGEMM_NVRTC_EXTRA=extra):
        built = get_kernel(make_variant(find_spec(spec), arch=arch, cluster_m=1, **recipe, **axes), cache)
    assert Cubin(built.cubin).resources(built.kernel_name).local_bytes == 0, (spec, axes, extra)
    assert built.advisories == (), (spec, axes, extra, built.advisories)
    return built, disasm.sass(built.cubin)


@pytest.mark.parametrize("spec,axes", [
    ("grouped_gemm_dswiglu", {}),
    ("grouped_gemm_dswiglu", {"ab_dtype": "float8_e5m2", "d_dtype": "float8_e5m2", "prob_dtype": "bfloat16"}),
    ("grouped_gemm_dswiglu", {"c_dtype": "float32"}),                 # 32-bit C: the branching engine
    ("grouped_gemm_dswiglu", {"discrete_col_sfd": True}),
    # the fp8_block layer's dSwiGLU: BF16 dG on the fragment path, with its bias gradient, discrete
    # weights; FP8 dG on the engine
    ("grouped_gemm_dglu_mx", {"d_dtype": "bfloat16"}),
    ("grouped_gemm_dglu_mx", {"d_dtype": "bfloat16", "generate_dbias": True, "weight_mode": "discrete"}),
    ("grouped_gemm_dglu_mx", {"d_dtype": "float8_e4m3fn"}),
    # sReLU: C and D bf16 on the fragment path; FP8 D on the engine, discrete weights and SFD_col
    ("grouped_gemm_srelu", {}),
    ("grouped_gemm_srelu", {"d_dtype": "float8_e4m3fn", "weight_mode": "discrete", "discrete_col_sfd": True}),
], ids=["default", "e5m2_bf16_prob", "fp32_c", "discrete_col_sfd", "dglu_bf16", "dglu_dbias_discrete", "dglu_fp8",
        "srelu_bf16", "srelu_fp8_discrete"])
def test_pingpong_kernels_compile_clean(spec, axes, session_cache):
    built, text = _clean_build(spec, {**PINGPONG, **axes}, session_cache)
    c = built.contract
    assert (c.threads, c.tile_m, c.tile_n, c.box_a_outer, c.box_b_outer) == (384, 64, 128, 64, 128)
    # Three issue sites of a k-block's four 64 x 128 x 32 WGMMAs (the first block, then t1 and t0
    # in the rolled loop), each later one waited for with one batch still in flight.
    assert text.count("QGMMA.64x128x32") == 12
    assert text.count("WARPGROUP.DEPBAR.LE gsb0, 0x1") == 2
    # The warpgroups' order: an arrival right after a mainloop's last issue (four sites: no k-block,
    # one k-block, and each of the loop's two steps) and a 256-thread wait before one.
    assert text.count("BAR.ARV") == 4 and "BAR.SYNC.DEFER_BLOCKING R" in text


def test_the_layers_take_their_dswiglu_tiles_from_one_table(monkeypatch):
    """fusegemm.moe._DSWIGLU_TILE picks each recipe's dSwiGLU tile per arch and intermediate size
    (an arch not listed: the spec's default tile): the BF16 layer's ping-pong tiles on sm_90a, the
    fp8_block layer's 64 x 128 ping-pong tiles up to F 2048 (measured faster on dsv3, not on
    mixtral's F 14336); another tile is an op of its own name (bench/moe_mlp.py --fp8-dswiglu-ab
    times the ping-pong tiles through it)."""
    import fusegemm.moe as moe
    import fusegemm.ops.device as device
    monkeypatch.setattr(device, "device_arch", lambda index: "sm_90a")
    assert moe._dswiglu_tile("bf16", 0, 768) == (("tile_m", 64), ("tile_n", 128))
    assert moe._dswiglu_tile("bf16", 0, 2048) == (("tile_m", 64), ("tile_n", 256))
    assert moe._dswiglu_tile("fp8_block", 0, 2048) == (("tile_m", 64), ("tile_n", 128))
    assert moe._dswiglu_tile("fp8_block", 0, 14336) == ()
    default = moe._recipe_op("dswiglu")
    assert default.name == "moe_fp8_block_dswiglu" and "tile_m" not in default._axes
    monkeypatch.setattr(moe, "_DSWIGLU_TILE", {**moe._DSWIGLU_TILE, "fp8_block": {"sm_90a": lambda f: PINGPONG}})
    over = moe._dswiglu_tile("fp8_block", 0, 2048)
    assert over == (("tile_m", 64), ("tile_n", 128))
    pp = moe._recipe_op("dswiglu", over)
    assert pp.name == "moe_fp8_block_dswiglu_tile_m64_tile_n128" and pp is not default
    assert pp._axes == {**moe._RECIPE_OPS["dswiglu"][1], **PINGPONG}
    assert moe._recipe_op("dswiglu", over) is pp
    monkeypatch.setattr(device, "device_arch", lambda index: "sm_100a")
    assert moe._dswiglu_tile("bf16", 0, 768) == () and moe._dswiglu_tile("fp8_block", 0, 768) == ()


@pytest.mark.parametrize("spec,axes,two_sets", [
    ("grouped_gemm_dswiglu", {}, True),                                  # 128-column passes
    ("grouped_gemm_dswiglu", {"tile_n": 128, "a_gather": True}, True),
    ("grouped_gemm_srelu", {"tile_n": 128, "d_dtype": "float8_e4m3fn"}, True),
    ("grouped_gemm_quant", {"d_dtype": "float8_e4m3fn"}, False),        # halves sharing A: no registers
    ("grouped_gemm_dglu_mx", {"d_dtype": "bfloat16", "generate_dbias": True}, False),   # column sums
], ids=["dswiglu", "dswiglu_gathered", "srelu_n128", "quant_shared_a", "dglu_dbias"])
def test_two_set_mainloop_switch_reaches_the_cooperative_passes(spec, axes, two_sets, session_cache):
    """FUSEGEMM_SM90_BW_TWO_TEMPS=1 gives cooperative 128-column passes the ping-pong mainloop's two
    temporary sets (each k-block waited for with the next one in flight), without spills; tiles
    whose halves share A, and rules with column sums, keep one set (the same SASS)."""
    texts = [_clean_build(spec, axes, session_cache, extra)[1] for extra in ("", "-DFUSEGEMM_SM90_BW_TWO_TEMPS=1")]
    assert texts[0].count("WARPGROUP.DEPBAR.LE gsb0, 0x1") == 0
    assert texts[1].count("WARPGROUP.DEPBAR.LE gsb0, 0x1") == (2 if two_sets else 0)
    assert (texts[0] != texts[1]) == two_sets


@pytest.mark.parametrize("spec,axes", [
    ("grouped_gemm_dglu_mx", {"d_dtype": "bfloat16", "generate_dbias": True}),
    ("grouped_gemm_dglu_mx", {"d_dtype": "float8_e4m3fn", "tile_n": 256}),
    ("grouped_gemm_srelu", {"d_dtype": "float8_e4m3fn", "weight_mode": "discrete"}),
    ("grouped_gemm_srelu", {"bias_dtype": "bfloat16", "tile_n": 256}),
], ids=["dglu_bf16_dbias", "dglu_fp8_n256", "srelu_fp8_discrete", "srelu_bias_n256"])
def test_sm100a_builds_the_specs_new_64_row_tiles(spec, axes, session_cache):
    """The specs that gained tile_m 64 for the sm_90a ping-pong tiles (dGLU-MX, sReLU) offer it on
    sm_100a too: 1-CTA 64-row MXFP8 tiles, compiled without spills or advisories (the arch's
    first-run gate verifies them where a GPU runs them)."""
    built, _ = _clean_build(spec, {"tile_m": 64, "tile_n": 128, **axes}, session_cache, arch="sm_100a", recipe={})
    assert (built.contract.tile_m, built.contract.ctas_per_tile) == (64, 1)
