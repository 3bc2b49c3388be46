"""The K-grouped weight-gradient family (specs/grouped_gemm_wgrad.yaml, fusegemm.KGroupedGemm) on
the CPU: what a K-grouped spec may declare, the op's argument checks (before any launch), its
numpy reference, and the sm_90a kernel compiled for every tile (0 spills, MN-major WGMMA).
The kernel's numerics on the GPU: tests/gpu/test_wgrad_gpu.py."""
from __future__ import annotations

import numpy as np
import pytest

from fusegemm.base.errors import ArgumentError, SpecError, UnsupportedError
from fusegemm.generator.spec import parse_spec

torch = pytest.importorskip("torch")

SPEC = """\
schema: 2
name: wg
kernel: grouped_gemm_wgrad
problem: kgrouped
summary: test
epilogue:
{epilogue}
choices:
  arch: [sm_90a]
  ab_dtype: [bfloat16]
  d_dtype: [bfloat16, float8_e4m3fn]
  tile_m: [128]
  tile_n: [256]
  cluster_m: [1]
  cluster_n: [1]
defaults: {{d_dtype: bfloat16}}
"""


def _spec(epilogue: str):
    return parse_spec(SPEC.format(epilogue=epilogue), "wg.yaml", expected_name="wg")


@pytest.mark.parametrize("epilogue,message", [
    ("  inputs:\n    prob: {per: row}\n  compute:\n    - g = prob * acc\n  outputs:\n    d: {dtype: d_dtype, value: g}",
     r"epilogue.inputs.prob.per: got 'row' \(a K-grouped problem's output rows are per expert"),
    ("  compute:\n    - g = acc\n  outputs:\n    d: {dtype: d_dtype, value: g}\n  reductions:\n"
     "    - {name: dprob, kind: sum, of: g, scope: row}",
     r"epilogue.reductions: dprob: got scope 'row'"),
    ("  inputs:\n    norm_const: {per: scalar}\n  compute:\n    - g = acc\n  outputs:\n"
     "    d: {dtype: d_dtype, value: g, quantize: {row: true, norm_const: norm_const, convention: quant}}",
     r"epilogue.outputs.d.quantize: got an SFD quantization"),
])
def test_k_grouped_specs_refuse_what_has_no_token_rows(epilogue, message):
    with pytest.raises(SpecError, match=message):
        _spec(epilogue)


def test_a_spec_states_its_kernels_problem():
    """The K-grouped checks above apply because a spec's problem must be its kernel's: a
    grouped_gemm_wgrad spec declaring another problem (which would skip them), or an M-grouped
    kernel declaring kgrouped, is refused."""
    text = SPEC.format(epilogue="  compute:\n    - g = acc\n  outputs:\n    d: {dtype: d_dtype, value: g}")
    with pytest.raises(SpecError, match=r"wg.yaml:4: problem: got 'grouped'; allowed: 'kgrouped'"):
        parse_spec(text.replace("problem: kgrouped", "problem: grouped"), "wg.yaml", expected_name="wg")
    with pytest.raises(SpecError, match=r"problem: got 'kgrouped'; allowed: 'grouped'"):
        parse_spec(text.replace("kernel: grouped_gemm_wgrad", "kernel: grouped_gemm"), "wg.yaml", expected_name="wg")


def test_the_wgrad_spec_is_not_an_epilogue_gemm_and_its_sm100a_limits():
    from fusegemm import EpilogueGemm, KGroupedGemm
    from fusegemm.generator import registry
    with pytest.raises(UnsupportedError, match="EpilogueGemm runs 'grouped_gemm'"):
        EpilogueGemm("grouped_gemm_wgrad", arch="sm_90a")
    with pytest.raises(UnsupportedError, match="KGroupedGemm runs 'grouped_gemm_wgrad'"):
        KGroupedGemm("grouped_gemm", arch="sm_90a")
    assert KGroupedGemm("grouped_gemm_wgrad", arch="sm_100a").check_support()
    with pytest.raises(UnsupportedError, match=r"tile_m=64 is not implemented for grouped_gemm_wgrad on sm_100a; "
                                               r"implemented: 128 \(1-CTA tiles of 128 rows"):
        KGroupedGemm("grouped_gemm_wgrad", arch="sm_100a", tile_m=64).check_support()
    # Not run on a Blackwell GPU yet: its first launch is verified on the device, and the MoE
    # layer's wgrad="auto" keeps torch's kernel there.
    assert not registry.executed("grouped_gemm_wgrad", "sm_100a") and registry.executed("grouped_gemm_wgrad", "sm_90a")


def _operands(t=1280, m=256, n=192, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(t, m, generator=g).to(torch.bfloat16), torch.randn(t, n, generator=g).to(torch.bfloat16),
            torch.tensor([256, 256, 768, 1024], dtype=torch.int32))


@pytest.mark.parametrize("change,message", [
    (lambda dy, x, off: (dy[:, :200], x, off), r"dy_tensor.shape\[1\]: got 200; allowed: a positive multiple of 128"),
    (lambda dy, x, off: (dy, x[:1024], off), r"x_tensor.shape\[0\]: got 1024; allowed: 1280"),
    (lambda dy, x, off: (dy, x.float(), off), r"x_tensor.dtype: got float32; allowed: bfloat16"),
    (lambda dy, x, off: (dy.t().contiguous().t(), x, off), r"dy_tensor.stride: got \(1, 1280\); allowed: row-major"),
    (lambda dy, x, off: (dy, x[:, :190], off), r"x_tensor.shape\[1\]: got 190; allowed: a multiple of 8"),
    (lambda dy, x, off: (dy[:1000], x[:1000], off), r"dy_tensor.shape\[0\]: got 1000; allowed: a multiple of 256"),
    (lambda dy, x, off: (dy, x, off.long()), r"padded_offsets.dtype: got int64; allowed: int32"),
    (lambda dy, x, off: (dy, x[:, :0], off), r"x_tensor.shape\[1\]: got 0; allowed: a multiple of 8, at least 8"),
    (lambda dy, x, off: (dy, x[:1].expand(1280, 192), off), r"x_tensor.stride: got \(0, 1\); allowed: row-major"),
])
def test_bad_arguments_are_refused_before_any_launch(change, message):
    from fusegemm import KGroupedGemm
    from fusegemm.ops.prepared import dry_run
    op = KGroupedGemm("grouped_gemm_wgrad", arch="sm_90a")
    with dry_run(), pytest.raises(ArgumentError, match=message):
        op(*change(*_operands()))
    with dry_run(), pytest.raises(ArgumentError, match=r"inputs\['alpha'\].shape: got \(3,\)"):
        op(*_operands(), inputs={"alpha": torch.ones(3)})
    with dry_run():
        assert op(*_operands())["d"].shape == (4, 256, 192)


def test_reference_is_each_experts_token_reduction():
    from fusegemm import KGroupedGemm
    dy, x, off = _operands()
    alpha = torch.tensor([0.5, 1.0, 2.0, -1.0])
    r = KGroupedGemm("grouped_gemm_wgrad", arch="sm_90a", d_dtype="float32").reference(dy, x, off, inputs={"alpha": alpha})
    d = np.asarray(r.out_values["d"]).reshape(4, 256, 192)
    bounds = [0, 256, 256, 768, 1024]
    for e in range(4):
        want = alpha[e].item() * (dy[bounds[e]:bounds[e + 1]].double().T @ x[bounds[e]:bounds[e + 1]].double()).numpy()
        assert np.allclose(d[e], want, rtol=1e-6, atol=1e-5), e
    assert not d[1].any()           # expert 1 has no tokens


@pytest.mark.parametrize("tile", [(64, 128), (128, 128), (128, 256)])
@pytest.mark.parametrize("d_dtype", ["bfloat16", "float32"])
def test_kernel_compiles_clean(tile, d_dtype):
    from fusegemm.generator.render import render
    from fusegemm.generator.variants import make_variant
    from fusegemm.runtime import disasm
    from fusegemm.runtime.compile import compile_source
    from fusegemm.runtime.cubin_info import Cubin
    v = make_variant("grouped_gemm_wgrad", arch="sm_90a", d_dtype=d_dtype, tile_m=tile[0], tile_n=tile[1])
    src = render(v)
    assert "kKGrouped = true" in src.text and "kBMajorMN = true" in src.text
    cub = compile_source(src.text, arch="sm_90a", kernel=src.symbol)
    cubin = Cubin(cub.data)
    assert cubin.resources(src.symbol).local_bytes == 0
    c = cubin.contract(src.symbol)
    assert (c.box_a_inner, c.box_a_outer, c.box_b_inner, c.box_b_outer) == (64, 64, 64, 64)
    assert (c.tile_m, c.tile_n, c.max_cluster_ctas) == (tile[0], tile[1], 1)
    if disasm.available():
        hist = disasm.sass_histogram(cub.data)
        assert disasm.count_prefix(hist, "HGMMA") > 0
        assert ".tnspA.tnspB" in disasm.sass(cub.data)   # both operands MN-major (token-major)


@pytest.mark.parametrize("tile_n", [128, 256])
@pytest.mark.parametrize("d_dtype", ["bfloat16", "float32"])
def test_sm100_kernel_compiles_clean(tile_n, d_dtype):
    """The sm_100a K-grouped kernel (tcgen05, both operands M/N-major: the instruction descriptor's
    a_major and b_major bits and the MN-major SW128 descriptors are static_asserted against
    CUTLASS's golden values in the header): 0 local memory, TMEM and shared memory within the
    limits, 2-D boxes of 64 elements x 16 token rows (a k-block's four K slices), and the SASS
    issues tcgen05 MMAs (UTCHMMA) fed by TMA (UTMALDG)."""
    from fusegemm.generator.render import render
    from fusegemm.generator.variants import make_variant
    from fusegemm.runtime import disasm
    from fusegemm.runtime.compile import compile_source
    from fusegemm.runtime.cubin_info import Cubin
    v = make_variant("grouped_gemm_wgrad", arch="sm_100a", d_dtype=d_dtype, tile_n=tile_n)
    src = render(v)
    assert src.impl.kernel == "fusegemm::sm100::GroupedGemmKernel"
    assert "kKGrouped = true" in src.text and "kBMajorMN = true" in src.text
    cub = compile_source(src.text, arch="sm_100a", kernel=src.symbol)
    cubin = Cubin(cub.data)
    res = cubin.resources(src.symbol)
    assert res.local_bytes == 0 and res.max_threads == 256 and res.registers <= 232, res
    c = cubin.contract(src.symbol)
    assert (c.box_a_inner, c.box_a_outer, c.box_b_inner, c.box_b_outer) == (64, 16, 64, 16)
    assert (c.tile_m, c.tile_n, c.ctas_per_tile) == (128, tile_n, 1)
    assert c.tmem_cols == (512 if tile_n == 256 else 256) and c.smem_bytes <= 232448 - 1024
    if disasm.available():
        hist = disasm.sass_histogram(cub.data)
        assert disasm.count_prefix(hist, "UTCHMMA") > 0 and disasm.count_prefix(hist, "UTMALDG") > 0, hist


@pytest.mark.parametrize("tile_n", [128, 256])
@pytest.mark.parametrize("d_dtype", ["bfloat16", "float32"])
def test_sm100_m_major_kernel_compiles_clean(tile_n, d_dtype):
    """The sm_100a K-grouped kernel's M-major D (the block engine's kDMajorM: lane = row, each of a
    block's 32 columns one store of the warp's 32 consecutive rows): 0 local memory, no staging
    for D, and only element stores to global memory (the N-major kernel stages 16-byte rows)."""
    from fusegemm.generator.render import render
    from fusegemm.generator.variants import make_variant
    from fusegemm.runtime import disasm
    from fusegemm.runtime.compile import compile_source
    from fusegemm.runtime.cubin_info import Cubin
    src = render(make_variant("grouped_gemm_wgrad", arch="sm_100a", d_dtype=d_dtype, tile_n=tile_n, cd_major="m"))
    assert "kDMajorM = true" in src.text
    cub = compile_source(src.text, arch="sm_100a", kernel=src.symbol)
    res = Cubin(cub.data).resources(src.symbol)
    assert res.local_bytes == 0 and res.registers <= 232, res
    if disasm.available():
        stores = {op for op in disasm.sass_histogram(cub.data) if op.startswith("STG")}
        assert stores == {"STG.E.U16" if d_dtype == "bfloat16" else "STG.E"}, stores


def test_m_major_d_is_each_experts_transpose():
    """cd_major m: D_e^T, (L, N, M), for a weight stored transposed to the problem (the swapped
    weight gradient X^T dY with X gathered as A). The reference's D and FP32 values are the
    N-major reference's blocks transposed and the op returns that shape; an epilogue with a column
    input is refused naming the axis; the mode is a configuration class of its own (gated at
    first launch where no GPU has run it: sm_100a's classes are all gated; on sm_90a it ran on an
    H100 on 2026-12-06, so it is not)."""
    from fusegemm import KGroupedGemm
    from fusegemm.generator import registry
    from fusegemm.generator.config_class import config_class
    from fusegemm.ops.prepared import dry_run
    dy, x, off = _operands()
    inputs = {"alpha": torch.tensor([0.5, 1.0, 2.0, -1.0])}
    n_major = KGroupedGemm("grouped_gemm_wgrad", arch="sm_90a", d_dtype="float32")
    m_major = KGroupedGemm("grouped_gemm_wgrad", arch="sm_90a", d_dtype="float32", cd_major="m")
    rn, rm = n_major.reference(dy, x, off, inputs=inputs), m_major.reference(dy, x, off, inputs=inputs)
    for got, want in ((rm.d, rn.d), (rm.out_values["d"], rn.out_values["d"])):
        assert np.asarray(got).shape == (4 * 192, 256)
        assert np.array_equal(np.asarray(got).reshape(4, 192, 256),
                              np.asarray(want).reshape(4, 256, 192).transpose(0, 2, 1))
    with dry_run():
        assert m_major(dy, x, off, inputs=inputs)["d"].shape == (4, 192, 256)
    shapes = {"dy_tensor": (1280, 256), "x_tensor": (1280, 192), "padded_offsets": (4,)}
    assert m_major.dims_of(shapes) == (256, 4 * 192, 4) and n_major.dims_of(shapes) == (192, 4 * 256, 4)
    assert KGroupedGemm("grouped_gemm_wgrad", arch="sm_100a", cd_major="m").check_support()
    text = SPEC.format(epilogue="  inputs:\n    bias: {per: column}\n  compute:\n    - g = acc + bias\n  outputs:\n"
                                "    d: {dtype: d_dtype, value: g}").replace("  tile_m: [128]", "  cd_major: [n, m]\n"
                                                                                                 "  tile_m: [128]")
    text = text.replace("defaults: {d_dtype: bfloat16}", "defaults: {d_dtype: bfloat16, cd_major: n}")
    spec = parse_spec(text, "wg.yaml", expected_name="wg")
    assert KGroupedGemm(spec, arch="sm_90a").check_support()
    with pytest.raises(UnsupportedError, match=r"cd_major: got 'm' for an epilogue with outputs \['d'\] and "
                                               r"column/element inputs \['bias'\]"):
        KGroupedGemm(spec, arch="sm_90a", cd_major="m").check_support()
    cls = config_class(m_major.variant)
    assert cls.operands == ("d_m_major",) and cls.axes()["cd_major"] == "m" and "d-m-major" in cls.slug
    assert config_class(n_major.variant).operands == ()
    assert registry.unexecuted_mode("grouped_gemm_wgrad", "sm_90a", {"cd_major": "m"}) is None
    assert registry.unexecuted_mode("grouped_gemm_wgrad", "sm_90a", {"cd_major": "n"}) is None


@pytest.mark.parametrize("axes", [{}, dict(d_dtype="float32"), dict(tile_m=64, tile_n=128), dict(a_gather=True),
                                  dict(tile_n=128)],
                         ids=lambda a: ".".join(f"{k}={v}" for k, v in a.items()) or "default")
def test_m_major_kernel_compiles_clean(axes):
    """The M-major D's stores (fusegemm/epilogue.cuh WarpTransposedStore, TileTransposedStore): 0
    spills, only 16-byte global stores (each staged column a whole output row segment); the
    cooperative BF16 kernel's deferred D staged by stmatrix.trans (STSM .MT88: four 8 x 8 matrices
    transposed per instruction) by the tile's eight warps together, between syncs of named barrier
    8 for its 256 threads (FUSEGEMM_SM90_DT_TILE_STORE; with 0, per warp, no such barrier), the
    staged paths (FP32 D, ping-pong tiles) by element stores. The N-major kernel's source does not
    see the mode."""
    from fusegemm.generator.render import render
    from fusegemm.generator.variants import make_variant
    from fusegemm.runtime import disasm
    from fusegemm.runtime.compile import compile_source
    from fusegemm.runtime.cubin_info import Cubin
    src = render(make_variant("grouped_gemm_wgrad", arch="sm_90a", cd_major="m", **axes))
    assert "kDMajorM = true" in src.text
    assert "kDMajorM" not in render(make_variant("grouped_gemm_wgrad", arch="sm_90a", **axes)).text
    cub = compile_source(src.text, arch="sm_90a", kernel=src.symbol)
    assert Cubin(cub.data).resources(src.symbol).local_bytes == 0
    if not disasm.available():
        pytest.skip("nvdisasm is not installed: resources checked, SASS not")
    hist = disasm.sass_histogram(cub.data)
    assert {op for op in hist if op.startswith("STG")} == {"STG.E.128"}, hist
    stmatrix = disasm.count_prefix(hist, "STSM.16.MT88")
    deferred = axes.get("d_dtype", "bfloat16") == "bfloat16" and axes.get("tile_m", 128) == 128
    assert (stmatrix > 0) == deferred, (stmatrix, axes)
    tile_syncs = disasm.sass(cub.data).count("BAR.SYNC.DEFER_BLOCKING 0x8, 0x100")
    assert (tile_syncs > 0) == deferred, (tile_syncs, axes)
    if deferred:   # the A/B baseline: each warp's own pieces, no tile barrier
        base = compile_source(src.text, arch="sm_90a", kernel=src.symbol, extra=("-DFUSEGEMM_SM90_DT_TILE_STORE=0",))
        assert "BAR.SYNC.DEFER_BLOCKING 0x8" not in disasm.sass(base.data)
        assert Cubin(base.data).resources(src.symbol).local_bytes == 0


@pytest.mark.parametrize("cd_major", ["n", "m"])
def test_launch_values_give_the_output_its_row_pitch(cd_major):
    """The parameter struct the kernel gets: D's pitch ldd is N for (L * M, N) rows and M for an
    M-major D's (L * N, M) rows (the kernel addresses output row e * N + n at that pitch), with
    m_rows = M and n = N as the tile walk needs either way."""
    from fusegemm import KGroupedGemm
    from fusegemm.generator.render import render
    from fusegemm.runtime.compile import compile_source
    from fusegemm.runtime.cubin_info import Cubin

    class Maps:
        def tiled(self, *a, **k):
            return b"\0" * 128

    class Launcher:
        def __init__(self, variant):
            src = render(variant)
            self.contract = Cubin(compile_source(src.text, arch="sm_90a", kernel=src.symbol).data).contract(src.symbol)
            self.tmaps, self.sms, self.cluster = Maps(), 132, (1, 1)
            self.tile, self.tma_dtype = (self.contract.tile_m, self.contract.tile_n), "bfloat16"

    dy, x, off = _operands()
    op = KGroupedGemm("grouped_gemm_wgrad", arch="sm_90a", cd_major=cd_major)
    op._launcher = Launcher(op.kernel_variant)
    v = op._launch_values(op._parse((dy, x, off), {}), {"d": 4096})
    assert (v["m_rows"], v["n"], v["d_out"]) == (256, 192, 4096)
    assert v["ldd"] == (256 if cd_major == "m" else 192)
