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
"""
from __future__ import annotations

import time

import pytest

from fusegemm.runtime.compile import BASE_OPTIONS, compile_source, headers

from _sm100 import (Built, CLUSTERS, MC_FIELDS, V, _simulate,
                    _skip_without_toolchain, build, from_cubin,
                    mc_problems, mc_rows, static_problems)

# ---------------------------------------------------------------------------------------------
# The variants. Unmarked ones cover every family once (CI-sized); the rest are marked slow.
# ---------------------------------------------------------------------------------------------
CORE = [
    V("bf16", 128, 256),                                                   # 1-CTA, 2 acc stages = 512 cols
    V("bf16", 256, 256),                                                   # 2-CTA pair
    V("bf16", 64, 128, bias="bf16", generate_c=True, c="f32"),             # M=64 instruction
    V("bf16", 256, 128, dynamic=True, discrete=True, d="f16"),
    V("bs", 128, 256, ab="e4m3", c="f32", batched=True),                   # MXFP8, seed 004
    V("bs", 128, 256, ab="e4m3", c="f32", batched=True, a_mn=True, b_mn=True),  # seed 004 M-/N-major
    V("bs", 256, 256, ab="e2m1", sf="ue4m3", vec=16, discrete=True, dynamic=True),  # NVFP4 2-CTA
    V("bs", 64, 128, ab="e2m1", sf="ue8m0", vec=32, c="bf16"),             # MXFP4, M=64 over padded M=128
]
EXTENDED = [
    V("bs", 128, 128, ab="e2m1", sf="ue4m3", vec=16, c="e4m3", batched=True),  # FP8 C from NVFP4
    V("bf16", 128, 128, dynamic=True),
    V("bf16", 64, 256, discrete=True, d="f32"),
    V("bf16", 128, 256, bias="f32", generate_c=True, c="f16", d="f32"),
    V("bf16", 256, 256, bias="f16"),
    V("bs", 128, 128, ab="e5m2", c="bf16", batched=True),
    V("bs", 128, 256, ab="e2m1", sf="ue4m3", vec=16, c="f16", batched=True),
    V("bs", 128, 256, ab="e2m1", sf="ue8m0", vec=16, c="f32"),             # MXFP4 vec16 -> mxf4nvf4
    V("bs", 256, 128, ab="e4m3", c="f32"),
    V("bs", 256, 256, ab="e2m1", sf="ue8m0", vec=32, c="bf16", dynamic=True),
    V("bs", 64, 256, ab="e4m3", c="f16", discrete=True),
    V("bs", 128, 128, ab="e4m3", c="f32", batched=True, c_major_m=True),   # seed 004 cd_major m
    V("bs", 128, 256, ab="e2m1", sf="ue8m0", vec=32, c="e2m1", batched=True),  # packed FP4 C
    V("bs", 128, 256, ab="e2m1", sf="ue4m3", vec=16, c="e5m2", batched=True, c_major_m=True),
    V("bs", 256, 128, ab="e4m3", c="bf16", a_mn=True, b_mn=True),          # 2-CTA MN-major: B in SW64 atoms
    V("bs", 256, 256, ab="e5m2", c="f32", b_mn=True, discrete=True, dynamic=True),
    V("bs", 64, 256, ab="e4m3", c="f16", a_mn=True),                       # M-major A: a whole 128-row atom
    V("bs", 128, 128, ab="e4m3", c="f32", batched=True, a_mn=True, dynamic=True, c_major_m=True),
]


@pytest.mark.parametrize("v", CORE + [pytest.param(v, marks=pytest.mark.slow) for v in EXTENDED],
                         ids=lambda v: v.label)
def test_variant_passes_static_checks(v: V):
    _skip_without_toolchain()
    b = build(v)
    assert static_problems(b) == [], b.v.label


@pytest.mark.parametrize("spec,choices,expect", [
    ("grouped_gemm", {}, {"family": "bf16"}),  # spec default: t256x256, cluster 2x1
    # seed 004 M-major A, N-major B: the template's kAMajorMN / kBMajorMN flags
    ("gemm_amax", {"a_major": "m", "b_major": "n"},
     {"family": "bs", "ab": "e4m3", "c": "f32", "batched": True, "a_mn": True, "b_mn": True}),
], ids=["grouped_gemm", "gemm_amax.am.bn"])
def test_generated_translation_unit_passes_static_checks(spec, choices, expect):
    """The renderer (templates/{grouped,blockscaled}_gemm.cu.j2) instantiates the same kernels."""
    _skip_without_toolchain()
    from fusegemm.generator.render import render
    from fusegemm.generator.variants import make_variant

    var = make_variant(spec, arch="sm_100a", **choices)
    src = render(var)
    t0 = time.perf_counter()
    cub = compile_source(src.text, arch="sm_100a", kernel=src.symbol)
    b = from_cubin(V(tile_m=var.tile_m, tile_n=var.tile_n, **expect), src.symbol, cub.data, time.perf_counter() - t0)
    assert static_problems(b) == []


# ---------------------------------------------------------------------------------------------
# PTX-level protocol order (fences emit no SASS): bugs #7 and #13 of sm100-protocol.md §8.
# ---------------------------------------------------------------------------------------------
def ptx_of(v: V) -> str:
    from cuda.bindings import nvrtc

    opts = [b"-arch=compute_100a", *(o.encode() for o in BASE_OPTIONS), *(o.encode() for o in headers().options())]
    err, prog = nvrtc.nvrtcCreateProgram(v.source("k").encode(), b"k.cu", 0, [], [])
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
    problems = static_problems(build(V("bf16", 128, 256, fault=1)))
    assert "SASS: no UTCHMMA (the MMA issue path is missing)" in problems



@pytest.mark.slow
def test_checks_catch_missing_block_scaled_mma_issue():
    _skip_without_toolchain()
    problems = static_problems(build(V("bs", 128, 256, ab="e4m3", c="f32", batched=True, fault=1)))
    assert "SASS: no UTCQMMA (the MMA issue path is missing)" in problems


def test_checks_catch_local_memory():
    _skip_without_toolchain()
    problems = static_problems(build(V("bf16", 128, 128, fault=2)))
    assert any(p.startswith("local memory:") for p in problems), problems


def test_wrong_descriptor_fails_the_build():
    _skip_without_toolchain()
    with pytest.raises(match="bug #3"):
        build(V("bf16", 128, 256, fault=3))
    with pytest.raises(match="bug #3"):
        build(V("bs", 128, 256, ab="e4m3", c="f32", fault=3))


def test_checks_catch_protocol_and_pairing_errors():
    """The Python side is independent of the headers: a wrong expectation or a 1-CTA cubin
    presented as a 2-CTA tile is reported."""
    _skip_without_toolchain()
    b = build(CORE[0])
    lie = Built(V("bf16", 256, 256), b.name, b.seconds, b.res, b.launch, b.tmem_cols,
                b.protocol, b.mc, b.hist, b.sass)
    problems = static_problems(lie)
    assert any(p.startswith("protocol: expect_tx") for p in problems), problems
    assert any(p.startswith("protocol: tmem_empty") for p in problems), problems
    assert any(p.startswith("SASS order") for p in problems), problems
    assert any(p.startswith("multicast: table") for p in problems), problems
    broken_ptx = "mbarrier.try_wait.parity.shared::cta.b64 p, [%r1], %r2;\ntcgen05.mma.cta_group::1.kind::f16 [%r3];\n" \
                 "tcgen05.ld.sync.aligned.32x32b.x32.b32 {%r4}, [%r5];\nmbarrier.arrive.shared::cta.b64 _, [%r6];\n"
    problems = ptx_order_problems(broken_ptx)
    assert len(problems) == 3, problems


def test_checks_catch_missing_multicast():
    """Fault 4: every CTA loads its own boxes; the SASS check sees no multicast load forms."""
    _skip_without_toolchain()
    problems = static_problems(build(V("bf16", 128, 256, fault=4)))
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
