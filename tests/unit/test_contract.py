"""Host <-> device contracts: every kernel exports what its launcher needs (fusegemm/base/
contract.py), the host checks it against what it will launch, and the registry never offers
what a kernel's contract refuses."""
from __future__ import annotations

import dataclasses

import pytest

from fusegemm import pipeline
from fusegemm.base.dtypes import DTYPES
from fusegemm.base.errors import ContractError
from fusegemm.generator import registry
from fusegemm.generator.spec import find_spec
from fusegemm.generator.variants import make_variant, surface
from fusegemm.ops.prepared import check_contract, tma_dtype_name
from fusegemm.runtime.cache import Built
from fusegemm.runtime.compile import compile_source


def _built(session_cache, spec, arch, **choices):
    return pipeline.get_kernel(make_variant(spec, arch=arch, **choices), session_cache)


def test_sm90a_grouped_contract(session_cache):
    c = _built(session_cache, "grouped_gemm", "sm_90a").contract
    assert (c.threads, c.tile_m, c.tile_n, c.tile_k, c.m_aligned) == (384, 128, 256, 64, 256)
    assert (c.box_a_inner, c.box_a_outer, c.box_b_inner, c.box_b_outer) == (64, 128, 64, 256)
    assert (c.swizzle_a, c.swizzle_b, c.tmap_slot_stride, c.tmem_cols) == (128, 128, 0, 0)
    assert (c.min_cluster_m, c.min_cluster_n, c.max_cluster_ctas, c.ctas_per_tile) == (1, 1, 1, 1)
    # A multi-CTA cluster builds the cluster kernel (the cluster reaches the sm_90a source): A's
    # 128 and B's 256 rows per stage as 2 slices each (fusegemm/cluster.cuh), so that clusters up
    # to 2x2 multicast them; an N-major B is shared by whole chunks.
    mc = _built(session_cache, "grouped_gemm", "sm_90a", cluster_m=2).contract
    assert (mc.box_a_inner, mc.box_a_outer, mc.box_b_inner, mc.box_b_outer) == (64, 64, 64, 128)
    assert (mc.min_cluster_m, mc.min_cluster_n, mc.max_cluster_ctas) == (1, 1, 4)
    assert ".mc.t128x256.sm90a." in _built(session_cache, "grouped_gemm", "sm_90a", cluster_n=2).name
    nmaj = _built(session_cache, "grouped_gemm", "sm_90a", b_major="n", cluster_m=2, cluster_n=2).contract
    assert (nmaj.box_b_inner, nmaj.box_b_outer, nmaj.max_cluster_ctas) == (64, 64, 4)
    row = registry.lookup("grouped_gemm", "sm_90a")
    assert row.problem({"cluster_m": 2, "cluster_n": 2}) is None and row.problem({"cluster_m": 4}) is not None
    assert "scheduler=dynamic" in row.problem({"scheduler": "dynamic", "cluster_m": 2})
    assert tma_dtype_name(c.tma_dtype_a) == tma_dtype_name(c.tma_dtype_b) == "bfloat16"
    d = _built(session_cache, "grouped_gemm", "sm_90a", weight_mode="discrete").contract
    assert d.tmap_slot_stride == 8


def test_sm100a_grouped_contract(session_cache):
    c = _built(session_cache, "grouped_gemm", "sm_100a").contract   # 256x256: a 2-CTA tile
    assert (c.threads, c.tile_m, c.tile_n, c.tile_k) == (256, 256, 256, 64)
    assert (c.min_cluster_m, c.min_cluster_n, c.max_cluster_ctas, c.ctas_per_tile) == (2, 1, 16, 2)
    # each CTA holds 128 of A's and B's rows, loaded as 4 slices (cluster.cuh)
    assert (c.box_a_inner, c.box_a_outer, c.box_b_inner, c.box_b_outer) == (64, 32, 64, 32)
    assert c.tmem_cols == 512 and c.tmap_slot_stride == 0
    d = _built(session_cache, "grouped_gemm", "sm_100a", weight_mode="discrete").contract
    assert d.tmap_slot_stride == 8


def test_block_scaled_contract(session_cache):
    c = _built(session_cache, "gemm_amax", "sm_100a").contract     # MXFP8, 128x128, K-major
    assert (c.tile_k, c.ctas_per_tile, c.box_a_inner, c.box_a_outer) == (128, 1, 128, 32)
    assert tma_dtype_name(c.tma_dtype_a) == "uint8" and c.swizzle_a == 128
    mn = _built(session_cache, "gemm_amax", "sm_100a", a_major="m", b_major="n").contract
    assert (mn.box_a_inner, mn.box_a_outer) == (128, 32)   # (128 M bytes, a 32-row K slice)


@pytest.mark.parametrize("arch", ["sm_100a", "sm_90a"])
def test_prebuild_kernels_satisfy_their_host(session_cache, arch):
    """What the op will launch for each prebuild variant agrees with the kernel's contract."""
    s = find_spec("grouped_gemm")
    for entry in s.prebuild:
        e = dict(entry)
        if e.pop("arch", arch) != arch:
            continue
        v = make_variant(s, arch=arch, **e)
        b = pipeline.get_kernel(v, session_cache)
        check_contract(b.contract, kernel=b.name, tile=(v.tile_m, v.tile_n), ab_dtype=v.ab_dtype,
                       cluster=(v.cluster_m, v.cluster_n), discrete=v.weight_mode == "discrete")


def test_check_contract_catches_each_disagreement(session_cache):
    b = _built(session_cache, "grouped_gemm", "sm_100a", weight_mode="discrete")
    ok = dict(kernel=b.name, tile=(256, 256), ab_dtype="bfloat16", cluster=(2, 1), discrete=True)
    check_contract(b.contract, **ok)
    cases = [
        (dict(tile=(128, 256)), r"contract tile_m is 256; the host launches 128"),
        (dict(ab_dtype="float8_e4m3fn"), r"contract tma_dtype_a is 'bfloat16'; the host launches 'uint8'"),
        (dict(cluster=(1, 1)), r"cluster 1x1 is outside the kernel's contract \(a multiple of 2x1"),
        (dict(cluster=(4, 8)), r"cluster 4x8 is outside the kernel's contract .* at most 16 CTAs"),
    ]
    for over, msg in cases:
        with pytest.raises(ContractError, match=msg):
            check_contract(b.contract, **{**ok, **over})
    with pytest.raises(ContractError, match="tmap_slot_stride 0"):
        check_contract(dataclasses.replace(b.contract, tmap_slot_stride=0), **ok)
    with pytest.raises(ContractError, match="m_aligned is 128; the host launches 256"):
        check_contract(dataclasses.replace(b.contract, m_aligned=128), **ok)


def test_a_kernel_that_disagrees_with_its_variant_is_refused(session_cache):
    """A header change the host does not know about (here: the kernel instantiated with FP16
    elements while the variant says BF16) shows up in the contract and is refused before any
    tensor map is encoded."""
    v = make_variant("grouped_gemm", arch="sm_100a", tile_m=128, cluster_m=1)
    src = pipeline.plan(v).source
    text = src.text.replace("using ElementA = fusegemm::bfloat16_t;\n  using ElementB = fusegemm::bfloat16_t;",
                            "using ElementA = fusegemm::half_t;\n  using ElementB = fusegemm::half_t;")
    assert text != src.text
    cub = compile_source(text, arch="sm_100a", kernel=src.symbol)
    b = Built.from_cubin(name=src.name, kernel_name=src.symbol, arch="sm_100a", key="x", cubin=cub.data,
                         compile_seconds=0.0, cached=False)
    assert tma_dtype_name(b.contract.tma_dtype_a) == "float16"
    with pytest.raises(ContractError, match=r"tma_dtype_a is 'float16'; the host launches 'bfloat16'"):
        check_contract(b.contract, kernel=b.name, tile=(128, 256), ab_dtype="bfloat16", cluster=(1, 1),
                       discrete=False)


# (a family without a kernel on an arch, the FP8 weight gradient on sm_100a, has no row there)
@pytest.mark.parametrize("row", [r for f in registry.families() for a in ("sm_100a", "sm_90a")
                                 if (r := registry.lookup(f, a)) is not None],
                         ids=lambda r: f"{r.family}.{r.arch}")
def test_registry_never_offers_a_cluster_the_kernel_refuses(row, session_cache):
    """The registry's implemented surface (spec choices within the row's limits) fits the
    largest cluster the row's kernel of that cluster exports: sm_90a's BF16 kernel takes up to
    2x2 (its multi-CTA build), its other kernels no clusters, and the rows limit them so."""
    spec = find_spec(row.family)   # every family has a seed spec named after it
    ok = [c for c in surface(spec, row.arch) if row.problem(c) is None]
    top = max(ok, key=lambda c: c["cluster_m"] * c["cluster_n"])
    biggest = top["cluster_m"] * top["cluster_n"]
    c = _built(session_cache, spec.name, row.arch, cluster_m=top["cluster_m"], cluster_n=top["cluster_n"]).contract
    assert biggest <= c.max_cluster_ctas, (row.family, row.arch, biggest, c.max_cluster_ctas)


def test_dtype_table_tma_names_are_driver_types():
    from cuda.bindings import driver
    for d in DTYPES.values():
        if d.tma:
            getattr(driver.CUtensorMapDataType, f"CU_TENSOR_MAP_DATA_TYPE_{d.tma}")
