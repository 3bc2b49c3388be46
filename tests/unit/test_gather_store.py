"""A gathered A stored as well (``a_gather_store``: the op's ``a_rows``, the rows the kernel gathered,
in problem order) on the CPU: the axis reaches the sm_90a grouped source and is refused, with the
reason, where nothing implements it (sm_100a, without ``a_gather``, a scheduler but the static walk, the
families that do not offer it); the three specs that offer it compile with 0 spills, TMA stores in
the copying warps and the box a warp's share of a stage; ``fusegemm.Op`` sizes
``a_rows`` (M, K), zeroes its tail with C and D and maps it as tma_a. On the GPU
(tests/gpu/test_gather_store_gpu.py): a_rows equals the index's rows, every other output the same
op's without the store."""
from __future__ import annotations

import pytest

from fusegemm import pipeline
from fusegemm.base.errors import UnsupportedError
from fusegemm.generator import registry
from fusegemm.generator.config_class import config_class
from fusegemm.generator.render import render
from fusegemm.generator.variants import make_variant
from fusegemm.runtime import disasm
from fusegemm.runtime.cubin_info import Cubin

torch = pytest.importorskip("torch")

from fusegemm.ops.engine import Op  # noqa: E402

from test_gather import gathered_operands  # noqa: E402
from test_op import _Launcher, no_device  # noqa: E402,F401

BF16 = dict(tile_m=128, tile_n=256, cluster_m=1, cluster_n=1)
SPECS = [("grouped_gemm", {}),
         ("grouped_gemm", dict(tile_m=64, tile_n=128)),   # ping-pong: each warpgroup stores its own tiles
         ("grouped_gemm_swiglu", dict(d_dtype="bfloat16", generate_c=True)),
         ("grouped_gemm_dswiglu_bf16", dict(tile_m=64, tile_n=256, b_major="n"))]


def test_the_axis_reaches_the_sm90_source_and_is_refused_elsewhere():
    for spec in ("grouped_gemm", "grouped_gemm_swiglu", "grouped_gemm_dswiglu_bf16"):
        v = make_variant(spec, arch="sm_90a", a_gather=True, a_gather_store=True, **BF16)
        assert "kStoreA = true" in render(v).text and "gstore" in v.readable
        assert "kStoreA" not in render(make_variant(spec, arch="sm_90a", a_gather=True, **BF16)).text
        with pytest.raises(UnsupportedError, match=r"a_gather=False but a_rows are the rows a gathered A reads"):
            make_variant(spec, arch="sm_90a", a_gather_store=True, **BF16)
    # (the three specs' kernel family)
    with pytest.raises(UnsupportedError, match=r"a_gather_store.*sm_90a kernel's; sm_100a gathers A"):
        registry.resolve("grouped_gemm", "sm_100a", {"a_gather": True, "a_gather_store": True, "tile_m": 128,
                                                     "cluster_m": 1, "cluster_n": 1})
    for sched in ("streamk", "dynamic"):
        with pytest.raises(UnsupportedError, match=r"a_gather_store.*in the static walk"):
            registry.resolve("grouped_gemm", "sm_90a", {"a_gather": True, "a_gather_store": True, "scheduler": sched,
                                                        "tile_m": 128, "cluster_m": 1, "cluster_n": 1})
    with pytest.raises(UnsupportedError, match="does not offer this axis"):
        make_variant("grouped_gemm_wgrad", arch="sm_90a", a_gather=True, a_gather_store=True)


def test_a_stored_gathered_variant_is_a_class_of_its_own():
    v = make_variant("grouped_gemm", arch="sm_90a", a_gather=True, a_gather_store=True, **BF16)
    cls = config_class(v)
    assert cls.operands == ("a_gather", "a_gather_store") and "gathered A stored" in cls.describe()
    assert cls.axes()["a_gather_store"] is True
    assert config_class(make_variant("grouped_gemm", arch="sm_90a", a_gather=True, **BF16)).operands == ("a_gather",)


@pytest.mark.parametrize("spec,axes", SPECS, ids=lambda x: x if isinstance(x, str) else ".".join(map(str, x.values())))
def test_stored_gathered_kernels_compile_with_a_store_per_k_step(session_cache, spec, axes):
    """The store build: 0 spills, no ptxas advisory, TMA stores (UTMASTG) where the build without
    the store has none (issued by the copying producer warps, off the consumers' WGMMA path), the
    same WGMMA sites, and the contract's A box a copying warp's share of a stage (a quarter of the
    tile's rows: four copying warps; the host encodes a_rows' map with it; the gathered build's map
    keeps one-row boxes)."""
    full = {**BF16, **axes}
    store = pipeline.get_kernel(make_variant(spec, arch="sm_90a", a_gather=True, a_gather_store=True, **full),
                                session_cache)
    plain = pipeline.get_kernel(make_variant(spec, arch="sm_90a", a_gather=True, **full), session_cache)
    assert Cubin(store.cubin).resources(store.kernel_name).local_bytes == 0
    assert store.advisories == ()
    assert (store.contract.box_a_inner, store.contract.box_a_outer) == (64, full["tile_m"] // 4)
    assert (plain.contract.box_a_inner, plain.contract.box_a_outer) == (64, 1)
    assert store.contract.smem_bytes == plain.contract.smem_bytes
    if not disasm.available():
        pytest.skip("nvdisasm is not installed: resources checked, SASS not")
    h1, h0 = disasm.sass_histogram(store.cubin), disasm.sass_histogram(plain.cubin)
    assert disasm.count_prefix(h0, "UTMASTG") == 0 and disasm.count_prefix(h1, "UTMASTG") > 0
    assert disasm.count_prefix(h1, "HGMMA") == disasm.count_prefix(h0, "HGMMA") > 0


def test_op_sizes_a_rows_zeroes_its_tail_and_maps_it_as_tma_a(no_device):  # noqa: F811
    op = Op("grouped_gemm", arch="sm_90a", a_gather=True, a_gather_store=True)
    t, m, k = 300, 512, 64
    a, b, off, idx = gathered_operands(t, m, 256, k)
    call = op._parse((a, off, b), {"a_index": idx})
    assert op._buffers(call)["a_rows"] == ((m, k), "bfloat16", 0.0)
    assert "a_rows" in op._rows   # zeroed past the last offset and the row ends, as C and D
    seen = []

    class Recording(_Launcher):
        def maps(self, s, a_ptr, b_ptr):
            seen.append((a_ptr, s.k, s.a_rows, s.a_ld))
            return super().maps(s, a_ptr, b_ptr)
    op._launcher = Recording()
    values = op._launch_values(call, {"d": 1000, "a_rows": 4096}, {"alpha": 0})
    assert seen == [(4096, k, m, k)]   # tma_a: a_rows' dense (M, K) rows, not A's (T, K)
    # The cp.async copies still read A itself.
    assert (values["a_gather_ptr"], values["a_gather_rows"]) == (a.data_ptr(), t)
    plain = Op("grouped_gemm", arch="sm_90a", a_gather=True)
    assert "a_rows" not in plain._buffers(plain._parse((a, off, b), {"a_index": idx}))
