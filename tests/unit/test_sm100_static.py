"""Static verification of the sm_100a kernels, without a Blackwell GPU.

No Blackwell GPU is available to the project, so every sm_100a kernel family is verified by
what a CPU can establish: the translation unit compiles with NVRTC for sm_100a (which also runs
the headers' static_asserts against the golden descriptor values of
shared/notes/sm100-protocol.md), and the cubin then passes the checks of ``static_problems``:
no local memory, registers and shared memory within budget, a legal TMEM allocation, the
instructions the variant must use (UTCHMMA / UTCQMMA / UTCOMMA, UTMALDG, LDTM, UTCCP, UTCBAR,
``.2CTA`` forms for 2-CTA tiles), the transaction-byte and barrier-count protocol values
compared with an independent Python computation, and, on the PTX, the fence order of the
protocol. The last tests prove the checks fail on deliberately broken kernels.
"""
from __future__ import annotations

import functools
import re
import time
from dataclasses import dataclass

import pytest

from fusegemm.generator.params import GROUPED_PARAMS
from fusegemm.runtime import disasm, inspect
from fusegemm.runtime.compile import BASE_OPTIONS, compile_source, headers
from fusegemm.runtime.errors import CompileError, ToolchainError

SMEM_DYNAMIC_LIMIT = 232448      # sm_100 opt-in dynamic shared memory per block (227 KB)
SMEM_SM_LIMIT = 233472           # per SM (228 KB), including the 1 KB the system reserves per block
REGISTER_BUDGET = 232            # 256 threads x 1 CTA/SM allows 255; keep headroom for fused epilogues
TMEM_COLUMNS = 512
THREADS = 256

AB = {"bf16": "cutlass::bfloat16_t", "e4m3": "cutlass::float_e4m3_t",
      "e5m2": "cutlass::float_e5m2_t", "e2m1": "cutlass::float_e2m1_t"}
OUT = {"bf16": "cutlass::bfloat16_t", "f16": "cutlass::half_t", "f32": "float",
       "e4m3": "cutlass::float_e4m3_t", "e5m2": "cutlass::float_e5m2_t", "e2m1": "cutlass::float_e2m1_t"}
SF = {"ue8m0": "cutlass::float_ue8m0_t", "ue4m3": "cutlass::float_ue4m3_t"}


def _b(v: bool) -> str:
    return "true" if v else "false"


# ---------------------------------------------------------------------------------------------
# Translation units, rendered exactly as templates/grouped_gemm.cu.j2 does for sm_100a, plus two
# exported constants the checks read: the TMEM column count and the protocol values.
# ---------------------------------------------------------------------------------------------
_TAIL = """
using Kernel = fusegemm::sm100::{kernel}<fusegemm_gen::Config>;
extern "C" __device__ __attribute__((used)) const int {name}_launch_info[4] = {{
    Kernel::kThreads, Kernel::kSmemBytes, fusegemm_gen::Config::kClusterM, fusegemm_gen::Config::kClusterN}};
extern "C" __device__ __attribute__((used)) const int {name}_tmem_cols = Kernel::kTmemCols;
extern "C" __device__ __attribute__((used)) const int {name}_protocol[8] = {{
    Kernel::kStages, Kernel::Frame::kAccStages, int(Kernel::Frame::kFullCount),
    int(Kernel::Frame::kEmptyCount), int(Kernel::Frame::kTmemFullCount),
    int(Kernel::Frame::kTmemEmptyCount), int(Kernel::Frame::kRingEmptyCount),
    int(Kernel::Frame::kTxBytes)}};
extern "C" __global__ void __launch_bounds__(Kernel::kThreads, 1)
{name}(const __grid_constant__ fusegemm_gen::Params params) {{
  Kernel::run(params);
}}
"""


@dataclass(frozen=True)
class V:
    """One kernel configuration of a family ("bf16": GroupedGemmKernel, "bs": BlockScaledGemmKernel)."""

    family: str
    tile_m: int = 128
    tile_n: int = 256
    cluster_m: int = 1
    cluster_n: int = 1
    ab: str = "bf16"
    sf: str = "ue8m0"
    vec: int = 32
    c: str = "bf16"
    d: str = "bf16"
    bias: str = "none"
    generate_c: bool = False
    dynamic: bool = False
    discrete: bool = False
    batched: bool = False
    c_major_m: bool = False
    fault: int = 0  # fusegemm::sm100 kFault* (tests only)

    @property
    def two_cta(self) -> bool:
        return self.tile_m == 256

    @property
    def label(self) -> str:
        parts = [self.family, self.ab]
        if self.family == "bs":
            parts += [self.sf, f"v{self.vec}", "batched" if self.batched else "grouped", f"c{self.c}"]
            if self.c_major_m:
                parts.append("cmajm")
        parts += [f"t{self.tile_m}x{self.tile_n}", f"c{self.cluster_m}x{self.cluster_n}"]
        parts += [x for x, on in (("dyn", self.dynamic), ("disc", self.discrete), ("genc", self.generate_c)) if on]
        if self.bias != "none":
            parts.append(f"bias{self.bias}")
        if self.fault:
            parts.append(f"fault{self.fault}")
        return ".".join(parts)

    def source(self, name: str) -> str:
        extra = f"  static constexpr int kFaultInjection = {self.fault};\n" if self.fault else ""
        if self.family == "bf16":
            head = '#include "fusegemm/sm100/grouped_gemm.cuh"\n'
            cfg = (f"  using ElementA = {AB[self.ab]};\n  using ElementB = {AB[self.ab]};\n"
                   f"  using ElementC = {OUT[self.c]};\n  using ElementD = {OUT[self.d]};\n"
                   f"  using ElementBias = {OUT.get(self.bias, 'float')};\n"
                   f"  static constexpr bool kHasBias = {_b(self.bias != 'none')};\n"
                   f"  static constexpr bool kGenerateC = {_b(self.generate_c)};\n")
            kernel = "GroupedGemmKernel"
        else:
            head = '#include "fusegemm/sm100/blockscaled_gemm.cuh"\n'
            cfg = (f"  using ElementA = {AB[self.ab]};\n  using ElementB = {AB[self.ab]};\n"
                   f"  using ElementSF = {SF[self.sf]};\n  using ElementC = {OUT[self.c]};\n"
                   f"  static constexpr int kSfVec = {self.vec};\n"
                   f"  static constexpr bool kBatched = {_b(self.batched)};\n"
                   f"  static constexpr bool kCMajorM = {_b(self.c_major_m)};\n"
                   "  static constexpr bool kAMajorMN = false;\n  static constexpr bool kBMajorMN = false;\n")
            kernel = "BlockScaledGemmKernel"
        cfg += (f"  static constexpr bool kDynamicSched = {_b(self.dynamic)};\n"
                f"  static constexpr bool kDiscreteB = {_b(self.discrete)};\n"
                f"  static constexpr int kTileM = {self.tile_m};\n  static constexpr int kTileN = {self.tile_n};\n"
                f"  static constexpr int kClusterM = {self.cluster_m};\n"
                f"  static constexpr int kClusterN = {self.cluster_n};\n" + extra)
        return (head + "namespace fusegemm_gen {\n" + GROUPED_PARAMS.cpp() + "\nstruct Config {\n" + cfg
                + "};\n}  // namespace fusegemm_gen\n" + _TAIL.format(kernel=kernel, name=name))

    # Independent expectations (sm100-protocol.md §1-4), computed without the headers.
    def expected_tx_bytes(self) -> int:
        cg = 2 if self.two_cta else 1
        if self.family == "bf16":
            return (self.tile_m // cg * 64 * 2 + self.tile_n // cg * 64 * 2) * cg
        elems_per_byte = 2 if self.ab == "e2m1" else 1
        sf_katoms = 128 * elems_per_byte // (4 * self.vec)
        a = self.tile_m // cg * 128
        b = self.tile_n // cg * 128
        return (a + b + sf_katoms * 512 + self.tile_n // 128 * sf_katoms * 512) * cg

    def expected_mma(self) -> str:
        if self.family == "bf16":
            return "UTCHMMA"
        return "UTCQMMA" if self.ab in ("e4m3", "e5m2") else "UTCOMMA"


@dataclass(frozen=True)
class Built:
    v: V
    name: str
    seconds: float
    res: inspect.Resources
    launch: inspect.LaunchInfo
    tmem_cols: int | None
    protocol: tuple[int, ...] | None
    hist: dict[str, int]
    sass: str


def _skip_without_toolchain() -> None:
    try:
        headers()
        disasm.find_tool()
    except ToolchainError as exc:
        pytest.skip(f"sm_100a static checks need NVRTC, the CUDA/CUTLASS header wheels and nvdisasm: {exc}")


@functools.lru_cache(maxsize=None)
def build(v: V) -> Built:
    name = "fg_sm100_" + re.sub(r"[^A-Za-z0-9]", "_", v.label)
    t0 = time.perf_counter()
    cub = compile_source(v.source(name), arch="sm_100a", kernel=name)
    seconds = time.perf_counter() - t0
    return from_cubin(v, name, cub.data, seconds)


def from_cubin(v: V, name: str, data: bytes, seconds: float) -> Built:
    c = inspect.Cubin(data)
    optional = {}
    for key, sym, n in (("tmem_cols", f"{name}_tmem_cols", 1), ("protocol", f"{name}_protocol", 8)):
        try:
            vals = c.global_ints(sym, n)
            optional[key] = vals[0] if n == 1 else vals
        except inspect.CubinFormatError:
            optional[key] = None
    text = disasm.sass(data)
    return Built(v, name, seconds, c.resources(name), c.launch_info(name), optional["tmem_cols"],
                 optional["protocol"], disasm.histogram(text), text)


def static_problems(b: Built) -> list[str]:
    """Every way the cubin departs from the static contract (empty list = passes)."""
    v, r, h, out = b.v, b.res, b.hist, []
    count = functools.partial(disasm.count_prefix, h)
    if r.local_bytes:
        out.append(f"local memory: {r.local_bytes} bytes per thread (spills or local arrays)")
    if r.registers > REGISTER_BUDGET:
        out.append(f"registers: {r.registers} > budget {REGISTER_BUDGET}")
    if b.launch.threads != THREADS or r.max_threads != THREADS:
        out.append(f"threads: launch {b.launch.threads}, bounds {r.max_threads}; expected {THREADS}")
    if b.launch.smem_bytes > SMEM_DYNAMIC_LIMIT or b.launch.smem_bytes + r.static_shared_bytes > SMEM_SM_LIMIT:
        out.append(f"shared memory: {b.launch.smem_bytes} dynamic + {r.static_shared_bytes} static over the sm_100 limit")
    if b.tmem_cols is not None:
        t = b.tmem_cols
        if not (32 <= t <= TMEM_COLUMNS and t & (t - 1) == 0):
            out.append(f"TMEM: {t} columns is not a power of two in [32, {TMEM_COLUMNS}]")
        if t < (2 if v.family == "bf16" and v.tile_n <= 256 else 1) * v.tile_n:
            out.append(f"TMEM: {t} columns cannot hold the accumulators")
    if b.protocol is not None:
        stages, acc_stages, full, empty, tfull, tempty, ring, tx = b.protocol
        cg = 2 if v.two_cta else 1
        want = {"full": (full, 1), "empty": (empty, 1), "tmem_full": (tfull, 1),
                "tmem_empty": (tempty, 128 * cg), "ring_empty": (ring, 6 + 5 * (cg - 1)),
                "expect_tx": (tx, v.expected_tx_bytes())}
        for what, (got, exp) in want.items():
            if got != exp:
                out.append(f"protocol: {what} = {got}, expected {exp}")
        if stages < 2 or acc_stages not in (1, 2):
            out.append(f"protocol: {stages} smem stages, {acc_stages} accumulator stages")
    mmas = {m: count(m) for m in ("UTCHMMA", "UTCQMMA", "UTCOMMA")}
    want_mma = v.expected_mma()
    if mmas[want_mma] == 0:
        out.append(f"SASS: no {want_mma} (the MMA issue path is missing)")
    for m, n in mmas.items():
        if m != want_mma and n:
            out.append(f"SASS: unexpected {m} x{n}")
    for op in ("UTMALDG", "LDTM", "UTCBAR"):
        if count(op) == 0:
            out.append(f"SASS: no {op}")
    if (count("UTCCP") > 0) != (v.family == "bs"):
        out.append(f"SASS: UTCCP x{count('UTCCP')} (scale factors reach TMEM by UTCCP in block-scaled kernels only)")
    if not any(op.startswith("UTCATOMSWS") and "FIND_AND_SET" in op for op in h):
        out.append("SASS: no TMEM allocation (UTCATOMSWS.FIND_AND_SET)")
    if count("UTCATOMSWS.AND") == 0:
        out.append("SASS: no TMEM deallocation (UTCATOMSWS.AND)")
    # cta_group must not be mixed (bug #8). Dealloc (UTCATOMSWS.AND) carries no .2CTA in SASS.
    must_pair = [op for op in h if op.split(".")[0] in ("UTCHMMA", "UTCQMMA", "UTCOMMA", "UTCCP", "UTCBAR", "UTMALDG")
                 or (op.startswith("UTCATOMSWS") and "FIND_AND_SET" in op)]
    if v.two_cta:
        single = [op for op in must_pair if ".2CTA" not in op]
        if single:
            out.append(f"SASS: 2-CTA tile with 1-CTA forms {single}")
        if any(op.startswith("UTCBAR") and "MULTICAST" not in op for op in h):
            out.append("SASS: 2-CTA commits must multicast to the pair")
        out += _order_problems(b.sass)
    elif any(".2CTA" in op for op in h):
        out.append("SASS: 1-CTA tile with .2CTA forms")
    return out


def _order_problems(sass: str) -> list[str]:
    """Bug #15: a cluster barrier precedes the 2-CTA TMEM allocation and the deallocation."""
    lines = sass.splitlines()
    idx = lambda pred: [i for i, l in enumerate(lines) if pred(l)]  # noqa: E731
    waits = idx(lambda l: "UCGABAR_WAIT" in l)
    allocs = idx(lambda l: "UTCATOMSWS" in l and "FIND_AND_SET" in l)
    deallocs = idx(lambda l: "UTCATOMSWS.AND" in l)
    out = []
    if not waits or not allocs or waits[0] > allocs[0]:
        out.append("SASS order: 2-CTA TMEM allocation before any cluster barrier wait")
    if not deallocs or not any(w < deallocs[0] for w in waits[1:] or []):
        out.append("SASS order: TMEM deallocation not preceded by a second cluster barrier")
    return out


# ---------------------------------------------------------------------------------------------
# The variants. Unmarked ones cover every family once (CI-sized); the rest are marked slow.
# ---------------------------------------------------------------------------------------------
CORE = [
    V("bf16", 128, 256),                                                   # 1-CTA, 2 acc stages = 512 cols
    V("bf16", 256, 256, cluster_m=2),                                      # 2-CTA pair
    V("bf16", 64, 128, bias="bf16", generate_c=True, c="f32"),             # M=64 instruction
    V("bf16", 256, 128, cluster_m=2, dynamic=True, discrete=True, d="f16"),
    V("bs", 128, 256, ab="e4m3", c="f32", batched=True),                   # MXFP8, seed 004
    V("bs", 256, 256, cluster_m=2, ab="e2m1", sf="ue4m3", vec=16, discrete=True, dynamic=True),  # NVFP4 2-CTA
    V("bs", 64, 128, ab="e2m1", sf="ue8m0", vec=32, c="bf16"),             # MXFP4, M=64 over padded M=128
    V("bs", 128, 128, ab="e2m1", sf="ue4m3", vec=16, c="e4m3", batched=True),  # FP8 C from NVFP4
]
EXTENDED = [
    V("bf16", 128, 128, cluster_n=2, dynamic=True),
    V("bf16", 64, 256, discrete=True, d="f32"),
    V("bf16", 128, 256, bias="f32", generate_c=True, c="f16", d="f32"),
    V("bf16", 256, 256, cluster_m=4, cluster_n=2, bias="f16"),
    V("bs", 128, 128, ab="e5m2", c="bf16", batched=True),
    V("bs", 128, 256, ab="e2m1", sf="ue4m3", vec=16, c="f16", batched=True),
    V("bs", 128, 256, ab="e2m1", sf="ue8m0", vec=16, c="f32"),             # MXFP4 vec16 -> mxf4nvf4
    V("bs", 256, 128, cluster_m=2, ab="e4m3", c="f32"),
    V("bs", 256, 256, cluster_m=4, cluster_n=2, ab="e2m1", sf="ue8m0", vec=32, c="bf16", dynamic=True),
    V("bs", 64, 256, ab="e4m3", c="f16", discrete=True),
    V("bs", 128, 128, ab="e4m3", c="f32", batched=True, c_major_m=True),   # seed 004 cd_major m
    V("bs", 128, 256, ab="e2m1", sf="ue8m0", vec=32, c="e2m1", batched=True),  # packed FP4 C
    V("bs", 128, 256, ab="e2m1", sf="ue4m3", vec=16, c="e5m2", batched=True, c_major_m=True),
]


@pytest.mark.parametrize("v", CORE + [pytest.param(v, marks=pytest.mark.slow) for v in EXTENDED],
                         ids=lambda v: v.label)
def test_variant_passes_static_checks(v: V):
    _skip_without_toolchain()
    b = build(v)
    assert static_problems(b) == [], b.v.label


def test_generated_translation_unit_passes_static_checks():
    """The lead's renderer (templates/grouped_gemm.cu.j2) instantiates the same kernel."""
    _skip_without_toolchain()
    from fusegemm.generator.render import render
    from fusegemm.generator.variants import make_variant

    var = make_variant("grouped_gemm", arch="sm_100a")  # spec default: t256x256, cluster 2x1
    src = render(var)
    t0 = time.perf_counter()
    cub = compile_source(src.text, arch="sm_100a", kernel=src.symbol)
    b = from_cubin(V("bf16", var.tile_m, var.tile_n, var.cluster_m, var.cluster_n), src.symbol, cub.data,
                   time.perf_counter() - t0)
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


@pytest.mark.parametrize("v", [CORE[1], CORE[5]], ids=lambda v: v.label)
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
    problems = static_problems(build(V("bs", 128, 256, ab="e4m3", c="f32", batched=True, fault=1)))
    assert "SASS: no UTCQMMA (the MMA issue path is missing)" in problems


def test_checks_catch_local_memory():
    _skip_without_toolchain()
    problems = static_problems(build(V("bf16", 128, 128, fault=2)))
    assert any(p.startswith("local memory:") for p in problems), problems


def test_wrong_descriptor_fails_the_build():
    _skip_without_toolchain()
    with pytest.raises(CompileError, match="bug #3"):
        build(V("bf16", 128, 256, fault=3))
    with pytest.raises(CompileError, match="bug #3"):
        build(V("bs", 128, 256, ab="e4m3", c="f32", fault=3))


def test_checks_catch_protocol_and_pairing_errors():
    """The Python side is independent of the headers: a wrong expectation or a 1-CTA cubin
    presented as a 2-CTA tile is reported."""
    _skip_without_toolchain()
    b = build(CORE[0])
    lie = Built(V("bf16", 256, 256, cluster_m=2), b.name, b.seconds, b.res, b.launch, b.tmem_cols,
                b.protocol, b.hist, b.sass)
    problems = static_problems(lie)
    assert any(p.startswith("protocol: expect_tx") for p in problems), problems
    assert any(p.startswith("protocol: tmem_empty") for p in problems), problems
    assert any(p.startswith("SASS order") for p in problems), problems
    broken_ptx = "mbarrier.try_wait.parity.shared::cta.b64 p, [%r1], %r2;\ntcgen05.mma.cta_group::1.kind::f16 [%r3];\n" \
                 "tcgen05.ld.sync.aligned.32x32b.x32.b32 {%r4}, [%r5];\nmbarrier.arrive.shared::cta.b64 _, [%r6];\n"
    problems = ptx_order_problems(broken_ptx)
    assert len(problems) == 3, problems
