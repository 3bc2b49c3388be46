"""The K-grouped FP8 weight gradient's D through TMA stores (FUSEGEMM_SM90_BW_TMA_STORE_D,
templates/include/fusegemm/sm90/blockwise_promote.cuh kTmaD; staging in fusegemm/epilogue.cuh
TmaStagedStore): the build stores D with UTMASTG instead of the warps' 16-byte vector stores,
spills nothing, keeps four pipeline stages at two buffers per warp, and states its store map in
the kernel contract (box_d_*), which the host reads to encode ``tma_d``. Builds without the switch
state no map (the host then encodes none) and are unchanged."""
from __future__ import annotations

import pytest

from fusegemm.runtime import disasm

from _switches import switch_build  # (tests/unit/_switches.py)

pytestmark = pytest.mark.skipif(not disasm.available(), reason="needs nvdisasm (the nvidia-cuda-nvdisasm wheel)")

SWITCH = "-DFUSEGEMM_SM90_BW_TMA_STORE_D=1"


@pytest.mark.parametrize("axes,cols", [({}, 32), ({"d_dtype": "float32"}, 16), ({"tile_n": 128}, 32)])
def test_switch_build_stores_d_through_tma(axes, cols, session_cache):
    base, r0, cubin0, name0 = switch_build("grouped_gemm_wgrad_fp8", axes, "", session_cache)
    sass, r1, cubin1, name1 = switch_build("grouped_gemm_wgrad_fp8", axes, SWITCH, session_cache)
    assert r0.local_bytes == 0 and r1.local_bytes == 0, (r0, r1)
    assert "UTMASTG" not in base and "UTMASTG" in sass
    assert "STG.E" in base and "STG.E" not in sass   # the warps' vector stores: all D's, all gone
    c0, c1 = cubin0.contract(name0), cubin1.contract(name1)
    assert (c0.box_d_inner, c0.box_d_outer, c0.swizzle_d) == (0, 0, 0)
    assert (c1.box_d_inner, c1.box_d_outer, c1.swizzle_d) == (cols, 16, 64)


@pytest.mark.parametrize("bufs,stages", [(1, 4), (2, 4), (4, 3)])
def test_staging_buffers_and_pipeline_stages(bufs, stages, session_cache):
    """Each buffer is 1 KB per warp (eight warps): two keep the default build's four 50 KB stages
    (the epilogue's region was 18 KB), four leave three."""
    _, res, cubin, name = switch_build("grouped_gemm_wgrad_fp8", {}, f"{SWITCH} -DFUSEGEMM_SM90_TMA_D_BUFS={bufs}",
                                       session_cache)
    stage = 128 * 128 + 256 * 128 + (128 + 256) * 4   # A, B, their token-block scales
    smem = cubin.contract(name).smem_bytes
    assert res.local_bytes == 0
    assert stages * stage + 8 * 1024 * bufs <= smem < (stages + 1) * stage, smem
