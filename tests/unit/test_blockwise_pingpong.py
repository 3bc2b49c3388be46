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


def test_blockwise_dswiglu_offers_pingpong_tiles_on_sm90():
    fusegemm.Op("grouped_gemm_dswiglu", arch="sm_90a", **BW, **PINGPONG).check_support()


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


def test_pingpong_tiles_are_first_run_gated_until_a_gpu_runs_them():
    v = make_variant(find_spec("grouped_gemm_dswiglu"), arch="sm_90a", cluster_m=1, **BW, **PINGPONG)
    why = registry.unexecuted_mode(v.kernel, v.arch, vars(v))
    assert why is not None and why.startswith("tile_m=64 on sm_90a: the blockwise kernel's ping-pong tiles")
    assert registry.unexecuted_mode(v.kernel, v.arch, {**vars(v), "tile_m": 128}) is None


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


@pytest.mark.parametrize("axes", [
    {},
    {"ab_dtype": "float8_e5m2", "d_dtype": "float8_e5m2", "prob_dtype": "bfloat16"},
    {"c_dtype": "float32"},                 # 32-bit C: the branching engine
    {"discrete_col_sfd": True},
], ids=["default", "e5m2_bf16_prob", "fp32_c", "discrete_col_sfd"])
def test_pingpong_kernels_compile_clean(axes, session_cache):
    from fusegemm.pipeline import get_kernel
    from fusegemm.runtime import disasm
    from fusegemm.runtime.cubin_info import Cubin
    built = get_kernel(make_variant(find_spec("grouped_gemm_dswiglu"), arch="sm_90a", cluster_m=1, **BW, **PINGPONG,
                                    **axes), session_cache)
    assert Cubin(built.cubin).resources(built.kernel_name).local_bytes == 0      # no register spills
    assert built.advisories == ()                                                # no serialized WGMMAs
    c = built.contract
    assert (c.threads, c.tile_m, c.tile_n, c.box_a_outer, c.box_b_outer) == (384, 64, 128, 64, 128)
    text = disasm.sass(built.cubin)
    # Three issue sites of a k-block's four 64 x 128 x 32 WGMMAs (the first block, then t1 and t0
    # in the rolled loop), each later one waited for with one batch still in flight.
    assert text.count("QGMMA.64x128x32") == 12
    assert text.count("WARPGROUP.DEPBAR.LE gsb0, 0x1") == 2
    # The warpgroups' order: an arrival after a mainloop's last issue (three: the one-block exit and
    # the two ends of the loop) and a 256-thread wait before one.
    assert text.count("BAR.ARV") == 3 and "BAR.SYNC.DEFER_BLOCKING R" in text
