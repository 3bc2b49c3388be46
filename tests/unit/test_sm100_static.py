"""Static verification of the sm_100a kernels, without a Blackwell GPU.

No Blackwell GPU is available to the project, so every sm_100a kernel family is verified by
what a CPU can establish: the translation unit compiles with NVRTC for sm_100a (which also runs
the headers' static_asserts against the golden descriptor values of
shared/notes/sm100-protocol.md), and the cubin then passes the checks of ``static_problems``:
no local memory, registers and shared memory within budget, a legal TMEM allocation, the
instructions the variant must use (UTCHMMA / UTCQMMA / UTCOMMA, UTMALDG and its cluster-multicast
form for every operand, LDTM, UTCCP, UTCBAR and its multicast form, ``.2CTA`` forms for 2-CTA
tiles), the transaction-byte and barrier-count protocol values compared with an independent
Python computation, and, on the PTX, the fence order of the protocol.

The cluster shape is a launch attribute, so every cubin carries the multicast protocol for every
cluster: each variant exports, for a list of launch clusters, what every CTA computes (its
coordinates, multicast masks, empty-barrier counts, which k-blocks it issues); the checks compare
that with CUTLASS's formulas (create_tma_multicast_mask, calculate_multicast_mask) written here in
Python and simulate one stage of the pipeline on it (every box reaches every CTA exactly once,
every empty barrier gets exactly its count of arrivals, every producer waits for every CTA it
writes). MN-major (FP8) descriptors are compared with CUTLASS's make_umma_desc<Major::MN>
evaluated in the same translation unit. The last tests prove the checks fail on deliberately
broken kernels.

Every unit compiled here is the product's own: each ``V`` maps to a real ``Variant`` rendered by
``fusegemm.generator.render.render`` with its registry row's template (``_sm100.V.route`` says
which), the limits and the minimum cluster come from the generated host contract
(``<symbol>_contract``), and the harness only appends test-only exports after the generated text
(or, for the fault tests, plants one ``kFaultInjection`` line in its Config).
"""
from __future__ import annotations

from dataclasses import replace

import pytest

from fusegemm.generator.variants import make_variant
from fusegemm.runtime.compile import BASE_OPTIONS, headers

from _sm100 import (CLUSTERS, MC_FIELDS, ROUTE_BATCHED, ROUTE_BATCHED_DIRECT, ROUTE_BF16, ROUTE_KGROUPED,
                    ROUTE_KSCALED, ROUTE_SRELU, ROUTE_GROUPED_DIRECT, V, _simulate, _skip_without_toolchain, build,
                    mc_problems,
                    mc_rows, config_problems, plant_fault, static_problems,
                    translation_unit)

# ---------------------------------------------------------------------------------------------
# The variants. Unmarked ones cover every family once (CI-sized); the rest are marked slow.
# Route to the real template (_sm100.ROUTE_*, pinned by test_variants_render_through_the_registry):
# "bf16" -> make_variant("grouped_gemm") (K-grouped: "grouped_gemm_wgrad"); batched "bs" -> make_variant("gemm_amax"), or a Variant
# of gemm_amax built directly where its spec excludes the point ("direct" below); grouped "bs"
# -> the grouped_gemm_srelu kernel (FP32 C, "srelu") or gemm_amax's spec with problem grouped
# ("grouped"), since no seed spec declares a grouped block-scaled kernel with a chosen C dtype.
# ---------------------------------------------------------------------------------------------
CORE = [
    V("bf16", 128, 256),                                                   # 1-CTA, 2 acc stages = 512 cols
    V("bf16", 256, 256),                                                   # 2-CTA pair
    V("bf16", 64, 128, bias="bf16", generate_c=True, c="f32"),             # M=64 instruction
    V("bf16", 256, 128, dynamic=True, discrete=True, d="f16"),
    V("bs", 128, 256, ab="e4m3", c="f32", batched=True),                   # MXFP8, seed 004
    V("bs", 128, 256, ab="e4m3", c="f32", batched=True, a_mn=True, b_mn=True),  # seed 004 M-/N-major
    V("bs", 256, 256, ab="e2m1", sf="ue4m3", vec=16, discrete=True, dynamic=True),  # NVFP4 2-CTA; grouped
    V("bs", 64, 128, ab="e2m1", sf="ue8m0", vec=32, c="bf16"),             # MXFP4, M=64 over padded M=128; grouped
    V("bf16", 256, 256, b_mn=True),                                        # N-major B: 2 atoms per CTA of the pair
    V("bf16", 128, 256, b_mn=True, kgrouped=True, c="f32"),               # K-grouped: M-major A, per-tile K
    V("bs", 128, 256, ab="e4m3", c="f32", kgrouped=True),                 # K-grouped MXFP8 (wgrad; no C): 2-D B
    V("bf16", 128, 256, gather=True),                                      # gathered A: TMA gather4 rows
    V("bf16", 256, 256, gather=True),                                      # gathered A, 2-CTA: the pair form
    V("bf16", 128, 256, b_mn=True, kgrouped=True, c="f32", gather_b=True),  # K-grouped gathered X: gather4 token rows
    V("bs", 128, 256, ab="e4m3", c="f32", gather=True),                    # MXFP8 gathered A: gather4 + scale words
]
EXTENDED = [
    V("bs", 128, 128, ab="e2m1", sf="ue4m3", vec=16, c="e4m3", batched=True),  # FP8 C from NVFP4
    V("bf16", 128, 128, dynamic=True),
    V("bf16", 64, 256, discrete=True, d="f32"),
    V("bf16", 128, 256, bias="f32", generate_c=True, c="f16", d="f32"),
    V("bf16", 256, 256, bias="f16"),
    V("bf16", 128, 256, b_mn=True, dynamic=True),                         # N-major B: 4 atoms
    V("bf16", 256, 128, b_mn=True, discrete=True),                        # N-major B: 1 atom (LBO 0), 2-D maps
    V("bf16", 64, 128, b_mn=True, generate_c=True, c="f32"),              # N-major B, M=64 instruction
    V("bf16", 64, 256, gather=True, discrete=True, dynamic=True),          # gathered A, M=64: 16 gathering lanes
    V("bf16", 256, 128, gather=True, b_mn=True, dynamic=True),             # gathered A, 2-CTA, N-major B
    V("bs", 128, 128, ab="e5m2", c="f32", gather=True, discrete=True),     # MXFP8 gathered A, discrete B
    V("bs", 128, 128, ab="e5m2", c="bf16", batched=True),
    V("bs", 128, 256, ab="e2m1", sf="ue4m3", vec=16, c="f16", batched=True),  # direct (N 256 + vec 16 + 16-bit C)
    V("bs", 128, 256, ab="e2m1", sf="ue8m0", vec=16, c="f32"),             # MXFP4 vec16 -> mxf4nvf4; srelu
    V("bs", 256, 128, ab="e4m3", c="f32"),                                 # srelu
    V("bs", 256, 256, ab="e2m1", sf="ue8m0", vec=32, c="bf16", dynamic=True),  # grouped
    V("bs", 64, 256, ab="e4m3", c="f16", discrete=True),                   # grouped
    V("bs", 128, 128, ab="e4m3", c="f32", batched=True, c_major_m=True),   # seed 004 cd_major m
    V("bs", 128, 256, ab="e2m1", sf="ue8m0", vec=32, c="e2m1", batched=True),  # packed FP4 C
    V("bs", 128, 256, ab="e2m1", sf="ue4m3", vec=16, c="e5m2", batched=True, c_major_m=True),
    V("bs", 256, 128, ab="e4m3", c="bf16", a_mn=True, b_mn=True),          # 2-CTA MN-major: B in SW64 atoms; grouped
    V("bs", 256, 256, ab="e5m2", c="f32", b_mn=True, discrete=True, dynamic=True),  # grouped (srelu: no scheduler)
    V("bs", 64, 256, ab="e4m3", c="f16", a_mn=True),                       # M-major A: a whole 128-row atom; grouped
    V("bs", 128, 128, ab="e4m3", c="f32", batched=True, a_mn=True, dynamic=True, c_major_m=True),  # direct (dynamic)
    V("bf16", 128, 128, b_mn=True, kgrouped=True, c="f32", d="f32"),      # K-grouped, N-major B: 2 atoms
    V("bf16", 128, 128, b_mn=True, kgrouped=True, c="f32", gather=True, gather_b=True),  # K-grouped, both gathered
]
# The fault tests' variants (below): the real template plus one planted kFaultInjection line.
FAULTY = [V("bf16", 128, 256, fault=1), V("bs", 128, 256, ab="e4m3", c="f32", batched=True, fault=1),
          V("bf16", 128, 128, fault=2), V("bf16", 128, 256, fault=3), V("bs", 128, 256, ab="e4m3", c="f32", fault=3),
          V("bf16", 128, 256, fault=4)]


def test_variants_render_through_the_registry():
    """No toolchain needed: every V renders through its registry row's real template by the route
    documented above, its generated Config has every constant the V implies (V.expected_config,
    written from the V's fields alone), and a fault plants exactly one line."""
    direct = {"bs.e2m1.ue4m3.v16.batched.cf16.t128x256": ROUTE_BATCHED_DIRECT,
              "bs.e4m3.ue8m0.v32.batched.cf32.cmajm.amn.t128x128.dyn": ROUTE_BATCHED_DIRECT,
              "bs.e2m1.ue8m0.v16.grouped.cf32.t128x256": ROUTE_SRELU,
              "bs.e4m3.ue8m0.v32.grouped.cf32.t256x128": ROUTE_SRELU,
              "bs.e4m3.ue8m0.v32.grouped.cf32.t128x256.fault3": ROUTE_SRELU,
              "bs.e4m3.ue8m0.v32.grouped.cf32.gather.t128x256": ROUTE_SRELU,
              "bs.e5m2.ue8m0.v32.grouped.cf32.gather.t128x128.disc": ROUTE_SRELU}
    assert set(direct) <= {v.label for v in CORE + EXTENDED + FAULTY}
    for v in CORE + EXTENDED + FAULTY:
        if v.kgrouped:
            want = ROUTE_KSCALED if v.family == "bs" else ROUTE_KGROUPED
        elif v.family == "bf16":
            want = ROUTE_BF16
        elif v.batched:
            want = direct.get(v.label, ROUTE_BATCHED)
        else:
            want = direct.get(v.label, ROUTE_GROUPED_DIRECT)
        assert v.route == want, v.label
        symbol, text = translation_unit(v)  # raises if the generated Config departs from the V
        assert text.count(f"{symbol}_contract[") == 1 and text.count(f"\n{symbol}(") == 1, v.label
        assert text.count("kFaultInjection") == (1 if v.fault else 0), v.label
        impl = v.variant().spec.kernel
        assert impl == {ROUTE_BF16: "grouped_gemm", ROUTE_SRELU: "grouped_gemm_srelu",
                        ROUTE_KGROUPED: "grouped_gemm_wgrad",
                        ROUTE_KSCALED: "grouped_gemm_wgrad_fp8"}.get(v.route, "gemm_amax")
    # The Config comparison and the fault planting can fail: another V's unit, a unit with no or
    # two Config anchors.
    text = translation_unit(CORE[5])[1]
    assert config_problems(CORE[4], text) == [f"{CORE[4].label}: generated Config lacks {line!r}" for line in
                                              ("static constexpr bool kAMajorMN = false;",
                                               "static constexpr bool kBMajorMN = false;")]
    assert config_problems(replace(CORE[5], fault=6), text)
    for bad in (text.replace("struct Config {\n", "struct Config{\n"), text + text):
        with pytest.raises(AssertionError, match="fault injection"):
            plant_fault(bad, 1)


@pytest.mark.parametrize("v", CORE + [pytest.param(v, marks=pytest.mark.slow) for v in EXTENDED],
                         ids=lambda v: v.label)
def test_variant_passes_static_checks(v: V):
    _skip_without_toolchain()
    b = build(v)
    assert static_problems(b) == [], b.v.label


@pytest.mark.parametrize("spec,choices,v", [
    ("grouped_gemm", {}, V("bf16", 256, 256)),  # spec default: t256x256, cluster 2x1 (= CORE[1])
    # seed 004 M-major A, N-major B: the template's kAMajorMN / kBMajorMN flags
    ("gemm_amax", {"a_major": "m", "b_major": "n"},
     V("bs", 128, 128, ab="e4m3", c="f32", batched=True, a_mn=True, b_mn=True)),
    # the sReLU kernel of the spec default (t256x256 MXFP8, cluster 2x1) with FP32 C
    ("grouped_gemm_srelu", {"c_dtype": "float32"}, V("bs", 256, 256, ab="e4m3", c="f32")),
], ids=["grouped_gemm", "gemm_amax.am.bn", "grouped_gemm_srelu.cf32"])
def test_spec_default_variant_passes_static_checks(spec, choices, v):
    """Every V is rendered by the product's renderer now; this pins that a spec's default variant
    (what `fusegemm build` makes first) is exactly the variant its V maps to, and checks it."""
    assert v.variant() == make_variant(spec, arch="sm_100a", **choices)
    _skip_without_toolchain()
    assert static_problems(build(v)) == []


def _product_build(spec: str, axes: dict, v: V):
    """The product's own translation unit of make_variant(spec, sm_100a, **axes) (render, no
    Config checks), compiled with the test-only exports; ``v`` states the mainloop it must be."""
    from fusegemm.generator.render import render
    from fusegemm.runtime.compile import compile_source

    from _sm100 import _MC_FN, _TEST_TAIL, from_cubin, mc_table_cpp

    variant = make_variant(spec, arch="sm_100a", **axes)
    mainloop = {"tile_m": v.tile_m, "tile_n": v.tile_n, "weight_mode": "discrete" if v.discrete else "dense"}
    if v.family == "bs":
        mainloop.update(ab_dtype=v.variant().ab_dtype, sf_dtype=v.variant().sf_dtype, sf_vec_size=v.vec,
                        b_major="n" if v.b_mn else "k")
    assert {k: getattr(variant, k) for k in mainloop} == mainloop, (spec, axes, v.label)
    _skip_without_toolchain()
    src = render(variant)
    text = src.text + _TEST_TAIL.format(mc_fn=_MC_FN, name=src.symbol,
                                        mc_table=mc_table_cpp("Kernel::Frame", v.cta_group, f"{src.symbol}_mc"))
    cub = compile_source(text, arch="sm_100a", kernel=src.symbol)
    return src, from_cubin(v, src.symbol, cub.data, 0.0)


@pytest.mark.parametrize("d_dtype", ["float8_e4m3fn", "bfloat16"])
def test_yaml_authored_epilogue_passes_static_checks(d_dtype):
    """specs/grouped_gemm_swiglu.yaml (a paired accumulator, MXFP8 D + SFD_row, written in YAML
    only) builds for sm_100a through the product's renderer, and its cubin passes the checks of
    the kernel it instantiates: the spec default is the BF16 family's t256x256 2-CTA kernel, so
    V("bf16", 256, 256) states the mainloop's expectations; only the epilogue rule differs."""
    src, b = _product_build("grouped_gemm_swiglu", {"d_dtype": d_dtype}, V("bf16", 256, 256))
    assert "kPairedAcc = true" in src.text
    assert f"kQuantRowD = {'true' if d_dtype != 'bfloat16' else 'false'}" in src.text
    assert static_problems(b) == []


# The fused block-scaled ops on the block-scaled tcgen05 kernel: (spec, axes, the mainloop's V).
_MX8 = dict(ab="e4m3")
_NVFP4 = dict(ab="e2m1", sf="ue4m3", vec=16)
_NVFP4_AXES = dict(ab_dtype="float4_e2m1fn_x2", sf_dtype="float8_e4m3fn", sf_vec_size=16)
FUSED_CORE = [
    ("grouped_gemm_srelu", {}, V("bs", 256, 256, **_MX8)),
    ("grouped_gemm_srelu", dict(c_dtype="float8_e4m3fn", d_dtype="float8_e4m3fn", discrete_col_sfd=True,
                                bias_dtype="bfloat16"), V("bs", 256, 256, **_MX8)),
    ("grouped_gemm_quant", dict(d_dtype="float8_e4m3fn", bias_dtype="bfloat16"), V("bs", 256, 256, **_MX8)),
    ("grouped_gemm_dswiglu", {}, V("bs", 256, 256, **_MX8)),
    ("grouped_gemm_dswiglu", dict(prob_dtype="bfloat16"), V("bs", 256, 256, **_MX8)),
    ("grouped_gemm_dswiglu", dict(d_dtype="bfloat16", **_NVFP4_AXES), V("bs", 256, 256, **_NVFP4)),
    # MXFP8 weight gradients: the K-grouped mode (per-tile token range, batched tile walk)
    ("grouped_gemm_wgrad_fp8", {}, V("bs", 128, 256, kgrouped=True, c="f32", **_MX8)),   # sm_100a's default: MXFP8
]
FUSED_EXTENDED = [
    ("grouped_gemm_quant", dict(d_dtype="float4_e2m1fn_x2", tile_m=128, cluster_m=1), V("bs", 128, 256, **_MX8)),
    ("grouped_gemm_quant", dict(d_dtype="float32", **_NVFP4_AXES), V("bs", 256, 256, **_NVFP4)),
    ("grouped_gemm_srelu", dict(ab_dtype="float8_e5m2", weight_mode="discrete", b_major="n", tile_m=128,
                                tile_n=128, cluster_m=1, d_dtype="float8_e5m2"),
     V("bs", 128, 128, ab="e5m2", b_mn=True, discrete=True)),
    ("grouped_gemm_srelu", dict(c_dtype="float4_e2m1fn_x2", d_dtype="float4_e2m1fn_x2"), V("bs", 256, 256, **_MX8)),
    ("grouped_gemm_dswiglu", dict(ab_dtype="float8_e5m2", c_dtype="float8_e5m2", d_dtype="float8_e5m2",
                                  discrete_col_sfd=True, tile_n=128), V("bs", 256, 128, ab="e5m2")),
    ("grouped_gemm_wgrad_fp8", dict(sf_dtype="float8_e8m0fnu", sf_vec_size=32, ab_dtype="float8_e5m2", tile_n=128,
                                    d_dtype="float32"), V("bs", 128, 128, ab="e5m2", c="f32", kgrouped=True)),
]


@pytest.mark.parametrize("case", FUSED_CORE + [pytest.param(c, marks=pytest.mark.slow) for c in FUSED_EXTENDED],
                         ids=lambda c: c[0] + "." + ".".join(f"{v}" for v in c[1].values()))
def test_fused_block_scaled_ops_pass_static_checks(case):
    """sReLU, quant and dSwiGLU are kernels on sm_100a: the block-scaled tcgen05 mainloop with
    the rule generated from each spec; 0 spills and every static check."""
    spec, axes, v = case
    src, b = _product_build(spec, axes, v)
    assert src.impl.kernel == "fusegemm::sm100::BlockScaledGemmKernel", (spec, src.impl)
    assert static_problems(b) == [], (spec, axes)


# ---------------------------------------------------------------------------------------------
# PTX-level protocol order (fences emit no SASS): bugs #7 and #13 of sm100-protocol.md §8.
# ---------------------------------------------------------------------------------------------
def ptx_of(v: V) -> str:
    from cuda.bindings import nvrtc

    opts = [b"-arch=compute_100a", *(o.encode() for o in BASE_OPTIONS), *(o.encode() for o in headers().options())]
    err, prog = nvrtc.nvrtcCreateProgram(translation_unit(v)[1].encode(), b"k.cu", 0, [], [])
    try:
        assert int(nvrtc.nvrtcCompileProgram(prog, len(opts), opts)[0]) == 0
        size = nvrtc.nvrtcGetPTXSize(prog)[1]
        buf = b" " * size
        nvrtc.nvrtcGetPTX(prog, buf)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    return buf.rstrip(b"\0").decode()


def ptx_order_problems(ptx: str) -> list[str]:
    """try_wait -> fence::after -> mma ... mma -> commit (same block); ld -> wait::ld -> fence::before -> arrive."""
    ops = []
    for line in ptx.splitlines():
        s = line.strip()
        for key in ("mbarrier.try_wait", "tcgen05.fence::after_thread_sync", "tcgen05.fence::before_thread_sync",
                    "tcgen05.mma", "tcgen05.commit", "tcgen05.ld", "tcgen05.wait::ld", "tcgen05.cp",
                    "mbarrier.arrive"):
            if s.startswith(key):
                ops.append(key)
                break
    out = []
    for i, op in enumerate(ops):
        if op in ("tcgen05.mma", "tcgen05.cp"):
            prev = [o for o in ops[:i] if o in ("mbarrier.try_wait", "tcgen05.fence::after_thread_sync")]
            if not prev or prev[-1] != "tcgen05.fence::after_thread_sync":
                out.append(f"op {i} {op}: no tcgen05.fence::after_thread_sync since the last barrier wait")
            nxt = [o for o in ops[i + 1:] if o in ("mbarrier.try_wait", "tcgen05.commit")]
            if not nxt or nxt[0] != "tcgen05.commit":
                out.append(f"op {i} {op}: not followed by tcgen05.commit before the next barrier wait")
        if op == "tcgen05.ld":
            rest = ops[i + 1:]
            w = rest.index("tcgen05.wait::ld") if "tcgen05.wait::ld" in rest else None
            a = rest.index("mbarrier.arrive") if "mbarrier.arrive" in rest else None
            if w is None or (a is not None and a < w):
                out.append(f"op {i} tcgen05.ld: an mbarrier arrive precedes its tcgen05.wait::ld")
            elif a is not None and "tcgen05.fence::before_thread_sync" not in rest[w:a]:
                out.append(f"op {i} tcgen05.ld: no tcgen05.fence::before_thread_sync between wait::ld and arrive")
    if "tcgen05.mma" not in ops or "tcgen05.ld" not in ops:
        out.append("PTX has no tcgen05.mma / tcgen05.ld")
    return out


@pytest.mark.parametrize("v", [CORE[1], CORE[6]], ids=lambda v: v.label)
def test_ptx_fence_and_commit_order(v: V):
    _skip_without_toolchain()
    assert ptx_order_problems(ptx_of(v)) == []


# ---------------------------------------------------------------------------------------------
# The checks can fail: deliberately broken kernels (Config::kFaultInjection, tests only).
# ---------------------------------------------------------------------------------------------
def test_checks_catch_missing_mma_issue():
    _skip_without_toolchain()
    problems = static_problems(build(FAULTY[0]))
    assert "SASS: no UTCHMMA (the MMA issue path is missing)" in problems



@pytest.mark.slow
def test_checks_catch_missing_block_scaled_mma_issue():
    _skip_without_toolchain()
    problems = static_problems(build(FAULTY[1]))
    assert "SASS: no UTCQMMA (the MMA issue path is missing)" in problems


def test_checks_catch_local_memory():
    _skip_without_toolchain()
    problems = static_problems(build(FAULTY[2]))
    assert any(p.startswith("local memory:") for p in problems), problems


def test_wrong_descriptor_fails_the_build():
    _skip_without_toolchain()
    with pytest.raises(match="bug #3"):
        build(FAULTY[3])
    with pytest.raises(match="bug #3"):
        build(FAULTY[4])


def test_checks_catch_protocol_and_pairing_errors():
    """The Python side is independent of the headers: a wrong expectation or a 1-CTA cubin
    presented as a 2-CTA tile is reported."""
    _skip_without_toolchain()
    b = build(CORE[0])
    problems = static_problems(replace(b, v=V("bf16", 256, 256)))
    assert any(p.startswith("protocol: expect_tx") for p in problems), problems
    assert any(p.startswith("protocol: tmem_empty") for p in problems), problems
    assert any(p.startswith("SASS order") for p in problems), problems
    assert any(p.startswith("multicast: table") for p in problems), problems
    # The contract side: the 1-CTA kernel's contract contradicts a 2-CTA tile, and a contract
    # that disagrees with its variant anywhere is reported field by field.
    assert "contract: min_cluster_m = 1, expected 2" in problems, problems
    assert "contract: ctas_per_tile = 1, expected 2" in problems, problems
    for change, field in [({"tile_n": 128}, "tile_n"), ({"max_cluster_ctas": 8}, "max_cluster_ctas"),
                          ({"tma_dtype_b": 0}, "tma_dtype_b"), ({"tmap_slot_stride": 16}, "tmap_slot_stride"),
                          ({"min_cluster_n": 2}, "min_cluster_n"), ({"tmem_cols": 384}, "TMEM"),
                          ({"threads": 384}, "threads"), ({"smem_bytes": 240000}, "shared memory")]:
        problems = static_problems(replace(b, contract=replace(b.contract, **change)))
        assert any(field in p for p in problems), (field, problems)
    broken_ptx = "mbarrier.try_wait.parity.shared::cta.b64 p, [%r1], %r2;\ntcgen05.mma.cta_group::1.kind::f16 [%r3];\n" \
                 "tcgen05.ld.sync.aligned.32x32b.x32.b32 {%r4}, [%r5];\nmbarrier.arrive.shared::cta.b64 _, [%r6];\n"
    problems = ptx_order_problems(broken_ptx)
    assert len(problems) == 3, problems


def test_checks_catch_missing_multicast():
    """Fault 4: every CTA loads its own boxes; the SASS check sees no multicast load forms."""
    _skip_without_toolchain()
    problems = static_problems(build(FAULTY[5]))
    assert "SASS: no multicast UTMALDG.2D (operand loads are not shared in the cluster)" in problems, problems
    assert "SASS: no multicast UTMALDG.3D (operand loads are not shared in the cluster)" in problems, problems


def test_multicast_model_catches_protocol_errors():
    """The model side alone: perturbing a good table (a dropped release bit, an off-by-one empty
    count, a second issuer of a slice, a group member that loads nothing) is reported."""
    _skip_without_toolchain()
    good = list(build(CORE[1]).mc)
    assert mc_problems(2, tuple(good)) == []
    n, f = len(MC_FIELDS), MC_FIELDS.index
    i = sum(ncta for _, _, ncta in CLUSTERS[2][:3]) * n  # cluster 4x2, rank 0
    # Cluster 4x2 of pairs: rank 0 drops a release bit / miscounts its empty barrier / issues A
    # slice 1 too (its A group partner rank 4 already does); rank 4 loads no A slice at all.
    cases = [(0, "commit", lambda x: x & ~(1 << 5)), (0, "empty", lambda x: x + 1),
             (0, "issues", lambda x: x | 0x2), (4, "issues", lambda x: x & ~0xF)]
    for r, field, change in cases:
        bad = good.copy()
        bad[i + r * n + f(field)] = change(bad[i + r * n + f(field)])
        assert mc_problems(2, tuple(bad)), (r, field)
    # One issuer per k-block instead of slices (every member loading part of every stage): in a
    # 1-CTA 2x2 cluster, at k-block 0 rank 0 feeds itself A and B, and could release that stage a
    # whole ring ahead of rank 3, which shares neither its row nor its column.
    rows = dict(mc_rows(1, build(CORE[0]).mc))[(2, 2, 4)]
    for r in rows:
        r["issues"] = (r["issues"] & ~0xFF) | (0xF if r["ni"] == 0 else 0) | (0xF0 if r["mi"] == 0 else 0)
    problems = _simulate(1, "2x2", rows)
    assert "multicast: 2x2 (B shared: True): unit 0 can release a stage a round ahead of units [3]" in problems
