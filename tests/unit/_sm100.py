"""Shared harness of the sm_100a static checks (test_sm100_static.py, test_sm100_multicast.py):
variants, translation units, compile + cubin facts and the static checks; the CUTLASS multicast
model with its pipeline simulation is _sm100_model.py. test_sm100_static.py says what is verified
and why.

Every translation unit checked here is the one the product generates: a ``V`` maps to a real
``Variant`` (``V.variant()``, ``V.route``), rendered by ``fusegemm.generator.render.render`` with
its registry row's template; the checks read the generated host contract. The harness only
appends test-only exports after the generated text (protocol values, the multicast table) and,
for the fault tests, plants one ``kFaultInjection`` line in the generated Config."""
from __future__ import annotations

import dataclasses
import functools
import re
import time
from dataclasses import dataclass, replace

import pytest

from fusegemm.base.contract import KernelContract
from fusegemm.base.errors import ToolchainError, UnsupportedError
from fusegemm.generator.render import Source, render
from fusegemm.generator.spec import Spec, find_spec
from fusegemm.generator.variants import NEUTRAL, Variant, make_variant
from fusegemm.runtime import cubin_info, disasm
from fusegemm.runtime.compile import compile_source, headers

from _sm100_model import (CLUSTERS, MC_FIELDS, MC_KBLOCKS, MC_SLICES, _MC_FN, _simulate,  # noqa: F401 (re-exported)
                          cutlass_model, mc_problems, mc_rows, mc_table_cpp)

SMEM_DYNAMIC_LIMIT = 232448      # sm_100 opt-in dynamic shared memory per block (227 KB)
SMEM_SM_LIMIT = 233472           # per SM (228 KB), including the 1 KB the system reserves per block
REGISTER_BUDGET = 232            # 256 threads x 1 CTA/SM allows 255; keep headroom for fused epilogues
TMEM_COLUMNS = 512
THREADS = 256

AB = {"bf16": "fusegemm::bfloat16_t", "e4m3": "fusegemm::float_e4m3_t",
      "e5m2": "fusegemm::float_e5m2_t", "e2m1": "fusegemm::float_e2m1_t"}
OUT = {"bf16": "fusegemm::bfloat16_t", "f16": "fusegemm::half_t", "f32": "float",
       "e4m3": "fusegemm::float_e4m3_t", "e5m2": "fusegemm::float_e5m2_t", "e2m1": "fusegemm::float_e2m1_t"}
SF = {"ue8m0": "fusegemm::float_ue8m0_t", "ue4m3": "fusegemm::float_ue4m3_t"}


def _b(v: bool) -> str:
    return "true" if v else "false"


# ---------------------------------------------------------------------------------------------
# Translation units: what the product generates (fusegemm.generator.render.render of a real
# Variant, the registry row's template), then test-only exports APPENDED after it. The generated
# unit defines ``using Kernel = ...;`` and the kernel ``<symbol>``; the tail adds what the checks
# read and the product does not export: the barrier protocol values and the multicast table.
# The host contract (``<symbol>_contract``) is the generated one, read with Cubin.contract.
# ---------------------------------------------------------------------------------------------
_TEST_TAIL = """
// ---- tests/unit/_sm100.py: test-only exports, appended after the generated translation unit ----
{mc_fn}
extern "C" __device__ __attribute__((used)) const int {name}_protocol[6] = {{
    Kernel::kStages, Kernel::Frame::kAccStages, int(Kernel::Frame::kFullCount),
    int(Kernel::Frame::kTmemFullCount), int(Kernel::Frame::kTmemEmptyCount), int(Kernel::Frame::kTxBytes)}};
{mc_table}"""

_FAULT_ANCHOR = "struct Config {\n"

# V's short names -> dtype names of the axis vocabulary (generator/axes.py).
_AXIS_DTYPE = {"bf16": "bfloat16", "f16": "float16", "f32": "float32", "e4m3": "float8_e4m3fn",
               "e5m2": "float8_e5m2", "e2m1": "float4_e2m1fn_x2", "none": "none"}
_AXIS_SF = {"ue8m0": "float8_e8m0fnu", "ue4m3": "float8_e4m3fn"}

# How a V reaches a real template (``V.route``):
ROUTE_BF16 = "grouped_gemm"                # make_variant("grouped_gemm"): the op's kernel
ROUTE_KGROUPED = "grouped_gemm_wgrad"      # make_variant("grouped_gemm_wgrad"): the K-grouped kernel
ROUTE_KSCALED = "grouped_gemm_wgrad_fp8"   # make_variant("grouped_gemm_wgrad_fp8"): K-grouped MXFP8
ROUTE_BATCHED = "gemm_amax"                # make_variant("gemm_amax"): the op's kernel
ROUTE_BATCHED_DIRECT = "gemm_amax:direct"  # Variant(...) of the gemm_amax spec: the spec's
#   choices/constraints exclude the point (scheduler dynamic, which gemm_amax does not offer;
#   tile N 256 + sf_vec_size 16 + a 16-bit C), the template and row still instantiate it.
ROUTE_SRELU = "grouped_gemm_srelu"       # make_variant("grouped_gemm_srelu"): the sReLU op's
#   kernel with FP32 C (and its default BF16 D); used for grouped V's with FP32 C whose axes the
#   srelu spec offers (static scheduler, K-major A, tile M 128/256, its constraints).
ROUTE_GROUPED_DIRECT = "gemm_amax@grouped:direct"  # Variant(...) of gemm_amax's spec with
#   problem "grouped" (the template reads spec.problem for kBatched) rendered through gemm_amax's
#   row: no seed spec declares a grouped block-scaled kernel with a chosen C dtype, so every
#   other grouped V (BF16/F16 C, scheduler dynamic, M-major A, tile M 64) goes this way.


@functools.lru_cache(maxsize=None)
def _spec(name: str, problem: str | None = None) -> Spec:
    spec = find_spec(name)
    if problem is not None and problem != spec.problem:
        spec = dataclasses.replace(spec, name=f"{name}_{problem}", problem=problem)
    return spec


@dataclass(frozen=True)
class V:
    """One kernel configuration of a family ("bf16": GroupedGemmKernel, "bs": BlockScaledGemmKernel),
    rendered through the product's templates (``variant`` / ``route`` / ``translation_unit``)."""

    family: str
    tile_m: int = 128
    tile_n: int = 256
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
    a_mn: bool = False  # block-scaled FP8: M-major A
    b_mn: bool = False  # N-major B (block-scaled FP8, BF16)
    kgrouped: bool = False  # K-grouped (weight gradients), per-tile K: BF16 M-major A and N-major B, MXFP8 K-major
    gather: bool = False  # gathered A (a_gather): TMA gather4 rows (BF16 2-CTA tiles: the pair form; K-grouped: dY's
    #                       token rows; block-scaled FP8: 1-CTA tiles, each row's scale word by a 4-byte cp.async)
    gather_b: bool = False  # BF16 K-grouped gathered X (b_gather): TMA gather4 token rows
    fault: int = 0  # fusegemm::sm100 kFault* (tests only)

    @property
    def two_cta(self) -> bool:
        return self.tile_m == 256

    @property
    def cta_group(self) -> int:
        return 2 if self.two_cta else 1

    @property
    def label(self) -> str:
        parts = [self.family, self.ab]
        if self.family == "bs":
            parts += [self.sf, f"v{self.vec}", "batched" if self.batched else "grouped", f"c{self.c}"]
            if self.c_major_m:
                parts.append("cmajm")
            parts += [x for x, on in (("amn", self.a_mn), ("bnn", self.b_mn), ("kgrouped", self.kgrouped)) if on]
        elif self.kgrouped:
            parts.append("kgrouped")
        elif self.b_mn:
            parts.append("bnn")
        if self.gather:
            parts.append("gather")
        if self.gather_b:
            parts.append("gatherb")
        parts.append(f"t{self.tile_m}x{self.tile_n}")
        parts += [x for x, on in (("dyn", self.dynamic), ("disc", self.discrete), ("genc", self.generate_c)) if on]
        if self.bias != "none":
            parts.append(f"bias{self.bias}")
        if self.fault:
            parts.append(f"fault{self.fault}")
        return ".".join(parts)

    @property
    def kernel(self) -> str:
        return "GroupedGemmKernel" if self.family == "bf16" else "BlockScaledGemmKernel"

    # -- the real variant ----------------------------------------------------------------------
    def axes(self) -> dict[str, object]:
        """The variant axes of this configuration. The cluster is a launch attribute (it never
        reaches the source); a 2-CTA tile takes cluster M 2, the smallest the specs allow."""
        common = {"ab_dtype": _AXIS_DTYPE[self.ab], "c_dtype": _AXIS_DTYPE[self.c],
                  "scheduler": "dynamic" if self.dynamic else "static",
                  "weight_mode": "discrete" if self.discrete else "dense",
                  "tile_m": self.tile_m, "tile_n": self.tile_n, "cluster_m": self.cta_group, "cluster_n": 1}
        if self.kgrouped:   # the wgrad spec's axes: both majors and the C dtype follow from the problem
            sf = {"sf_dtype": _AXIS_SF[self.sf], "sf_vec_size": self.vec} if self.family == "bs" else {}
            gather = {"a_gather": self.gather, "b_gather": self.gather_b} if self.family == "bf16" else {}
            return {"ab_dtype": _AXIS_DTYPE[self.ab], "d_dtype": _AXIS_DTYPE[self.d], "tile_m": self.tile_m,
                    "tile_n": self.tile_n, "cluster_m": 1, "cluster_n": 1, **sf, **gather}
        if self.family == "bf16":
            return {**common, "d_dtype": _AXIS_DTYPE[self.d], "bias_dtype": _AXIS_DTYPE[self.bias],
                    "generate_c": self.generate_c, "b_major": "n" if self.b_mn else "k", "a_gather": self.gather}
        return {**common, "sf_dtype": _AXIS_SF[self.sf], "sf_vec_size": self.vec,
                "a_major": "m" if self.a_mn else "k", "b_major": "n" if self.b_mn else "k",
                "cd_major": "m" if self.c_major_m else "n", "a_gather": self.gather}

    @property
    def route(self) -> str:
        return _variant_of(replace(self, fault=0))[0]

    def variant(self) -> Variant:
        return _variant_of(replace(self, fault=0))[1]

    # Independent expectations (sm100-protocol.md §1-4), computed without the headers.
    def expected_config(self) -> list[str]:
        """Lines the generated ``struct Config`` must contain, written from this V's fields
        alone: the V -> variant -> template mapping must reproduce every one of them."""
        lines = [f"using ElementA = {AB[self.ab]};", f"using ElementB = {AB[self.ab]};"]
        if self.family == "bf16":
            # Bias and C reach the kernel through the rule generated from the spec's epilogue:
            # a column input read in the bias's dtype, an output c only with generate_c.
            lines += [f"using ElementC = {OUT[self.c]};", f"using ElementD = {OUT[self.d]};",
                      f"static constexpr bool kHasC = {_b(self.generate_c)};",
                      f"static constexpr bool kBMajorMN = {_b(self.b_mn)};",
                      f"static constexpr bool kKGrouped = {_b(self.kgrouped)};",
                      f"static constexpr bool kGatherA = {_b(self.gather)};",
                      f"static constexpr bool kGatherB = {_b(self.gather_b)};"]
            if self.bias != "none":
                lines.append(f"e.bias = fusegemm::epi::ldf<{OUT[self.bias]}>(col_base_bias, col);")
        else:
            lines += [f"using ElementSF = {SF[self.sf]};", f"using ElementC = {OUT[self.c]};",
                      f"static constexpr int kSfVec = {self.vec};",
                      f"static constexpr bool kBatched = {_b(self.batched)};",
                      f"static constexpr bool kCMajorM = {_b(self.c_major_m)};",
                      f"static constexpr bool kAMajorMN = {_b(self.a_mn)};",
                      f"static constexpr bool kBMajorMN = {_b(self.b_mn)};",
                      f"static constexpr bool kKGrouped = {_b(self.kgrouped)};",
                      f"static constexpr bool kGatherA = {_b(self.gather)};"]
        lines += [f"static constexpr bool kDynamicSched = {_b(self.dynamic)};",
                  f"static constexpr bool kDiscreteB = {_b(self.discrete)};",
                  f"static constexpr int kTileM = {self.tile_m};", f"static constexpr int kTileN = {self.tile_n};"]
        if self.fault:
            lines.append(f"static constexpr int kFaultInjection = {self.fault};")
        return lines

    def expected_tx_bytes(self) -> int:
        cg = 2 if self.two_cta else 1
        if self.family == "bf16":
            return (self.tile_m // cg * 64 * 2 + self.tile_n // cg * 64 * 2) * cg
        elems_per_byte = 2 if self.ab == "e2m1" else 1
        sf_katoms = 128 * elems_per_byte // (4 * self.vec)
        # M-major A loads whole 128-row M atoms (TILE_M 64 included); K-major A only its rows.
        a = max(self.tile_m // cg, 128 if self.a_mn else 0) * 128
        b = self.tile_n // cg * 128
        # Gathered A: its scale words arrive by the producer lanes' cp.async, not by TMA.
        sfa = 0 if self.gather else sf_katoms * 512
        return (a + b + sfa + self.tile_n // 128 * sf_katoms * 512) * cg

    def expected_full_arrivals(self) -> int:
        """Arrivals on a stage's full barrier: the expect_tx, and (block-scaled gathered A) one per
        producer lane that copies scale words (four rows each, of the CTA's tile_m rows)."""
        return 1 + (self.tile_m // 4 if self.family == "bs" and self.gather else 0)

    def expected_multicast_dims(self) -> set[str]:
        """TMA dimensionalities that must appear in multicast form: A, B (and the 4-D SF maps)."""
        a = "3D" if self.family == "bs" and self.batched else "2D"
        b = "2D" if self.discrete or self.kgrouped else "3D"   # K-grouped: X (N, tokens), 2-D
        # A gathered operand: gather4 rows into the CTA's own stage, no multicast form (the other
        # operand keeps its; K-grouped A and B are both 2-D).
        return ({a} if not self.gather else set()) | ({b} if not self.gather_b else set()) | (
            {"4D"} if self.family == "bs" else set())

    def expected_mma(self) -> str:
        if self.family == "bf16":
            return "UTCHMMA"
        return "UTCQMMA" if self.ab in ("e4m3", "e5m2") else "UTCOMMA"


@functools.lru_cache(maxsize=None)
def _variant_of(v: V) -> tuple[str, Variant]:
    """(route, Variant) of ``v`` (fault 0); the routes are described at ROUTE_*."""
    axes = v.axes()
    if v.kgrouped and v.family == "bs":
        return ROUTE_KSCALED, make_variant("grouped_gemm_wgrad_fp8", arch="sm_100a", **axes)
    if v.kgrouped:
        return ROUTE_KGROUPED, make_variant("grouped_gemm_wgrad", arch="sm_100a", **axes)
    if v.family == "bf16":
        return ROUTE_BF16, make_variant("grouped_gemm", arch="sm_100a", **axes)
    if v.batched:
        try:
            return ROUTE_BATCHED, make_variant("gemm_amax", arch="sm_100a", **axes)
        except UnsupportedError:
            return ROUTE_BATCHED_DIRECT, Variant(spec=_spec("gemm_amax"), arch="sm_100a", **{**NEUTRAL, **axes})
    if v.c == "f32":
        try:
            return ROUTE_SRELU, make_variant("grouped_gemm_srelu", arch="sm_100a", **axes)
        except UnsupportedError:
            pass
    return ROUTE_GROUPED_DIRECT, Variant(spec=_spec("gemm_amax", "grouped"), arch="sm_100a", **{**NEUTRAL, **axes})


@functools.lru_cache(maxsize=None)
def rendered(v: V) -> Source:
    """The product's translation unit of ``v`` (fault 0): render(variant)."""
    return render(_variant_of(replace(v, fault=0))[1])


def plant_fault(text: str, fault: int) -> str:
    """The generated unit plus one planted line, ``kFaultInjection`` in its Config."""
    if text.count(_FAULT_ANCHOR) != 1:
        raise AssertionError(f"fault injection: {text.count(_FAULT_ANCHOR)} occurrences of "
                             f"{_FAULT_ANCHOR!r} in the generated unit, expected exactly 1")
    return text.replace(_FAULT_ANCHOR, f"{_FAULT_ANCHOR}  static constexpr int kFaultInjection = {fault};\n")


def config_problems(v: V, text: str) -> list[str]:
    """``v.expected_config()`` lines missing from the (only) ``struct Config`` and the generated
    epilogue ``struct Rule`` of ``text``."""
    have: set[str] = set()
    for struct in ("Config", "Rule"):
        m = re.findall(rf"^struct {struct} \{{\n(.*?)^\}};", text, re.M | re.S)
        if len(m) != 1:
            return [f"{len(m)} struct {struct} definitions in the generated unit, expected 1"]
        have |= {line.split("//")[0].strip() for line in m[0].splitlines()}   # (without trailing comments)
    return [f"{v.label}: generated Config lacks {line!r}" for line in v.expected_config() if line not in have]


def generated_unit(v: V) -> tuple[str, str]:
    """(symbol, text): the rendered translation unit of ``v``, fault line planted if any, checked
    against ``v``'s expected Config (the V -> template mapping loses nothing)."""
    src = rendered(v)
    text = plant_fault(src.text, v.fault) if v.fault else src.text
    problems = config_problems(v, text)
    if problems:
        raise AssertionError(f"{v.label} ({v.route}): " + "; ".join(problems))
    return src.symbol, text


def translation_unit(v: V) -> tuple[str, str]:
    """(kernel symbol, text): the generated unit of ``v`` plus the test-only exports."""
    symbol, text = generated_unit(v)
    table = mc_table_cpp("Kernel::Frame", v.cta_group, f"{symbol}_mc")
    return symbol, text + _TEST_TAIL.format(mc_fn=_MC_FN, name=symbol, mc_table=table)


@dataclass(frozen=True)
class Built:
    v: V
    name: str
    seconds: float
    res: cubin_info.Resources
    contract: KernelContract
    protocol: tuple[int, ...]
    mc: tuple[int, ...]
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
    name, text = translation_unit(v)
    t0 = time.perf_counter()
    cub = compile_source(text, arch="sm_100a", kernel=name)
    seconds = time.perf_counter() - t0
    return from_cubin(v, name, cub.data, seconds)


def from_cubin(v: V, name: str, data: bytes, seconds: float) -> Built:
    c = cubin_info.Cubin(data)
    mc_len = sum(ncta for _, _, ncta in CLUSTERS[v.cta_group]) * len(MC_FIELDS)
    text = disasm.sass(data)
    return Built(v, name, seconds, c.resources(name), c.contract(name), c.global_ints(f"{name}_protocol", 6),
                 c.global_ints(f"{name}_mc", mc_len), disasm.histogram(text), text)


def static_problems(b: Built) -> list[str]:
    """Every way the cubin departs from the static contract (empty list = passes)."""
    v, r, h, out = b.v, b.res, b.hist, []
    count = functools.partial(disasm.count_prefix, h)
    if r.local_bytes:
        out.append(f"local memory: {r.local_bytes} bytes per thread (spills or local arrays)")
    if r.registers > REGISTER_BUDGET:
        out.append(f"registers: {r.registers} > budget {REGISTER_BUDGET}")
    k = b.contract
    if k.threads != THREADS or r.max_threads != THREADS:
        out.append(f"threads: contract {k.threads}, bounds {r.max_threads}; expected {THREADS}")
    if k.smem_bytes > SMEM_DYNAMIC_LIMIT or k.smem_bytes + r.static_shared_bytes > SMEM_SM_LIMIT:
        out.append(f"shared memory: {k.smem_bytes} dynamic + {r.static_shared_bytes} static over the sm_100 limit")
    t = k.tmem_cols
    if not (32 <= t <= TMEM_COLUMNS and t & (t - 1) == 0):
        out.append(f"TMEM: {t} columns is not a power of two in [32, {TMEM_COLUMNS}]")
    if t < (2 if v.family == "bf16" and v.tile_n <= 256 else 1) * v.tile_n:
        out.append(f"TMEM: {t} columns cannot hold the accumulators")
    out += contract_problems(v, k)
    stages, acc_stages, full, tfull, tempty, tx = b.protocol
    cg = v.cta_group
    want = {"full": (full, v.expected_full_arrivals()), "tmem_full": (tfull, 1), "tmem_empty": (tempty, 128 * cg),
            "expect_tx": (tx, v.expected_tx_bytes())}
    for what, (got, exp) in want.items():
        if got != exp:
            out.append(f"protocol: {what} = {got}, expected {exp}")
    if stages < 2 or acc_stages not in (1, 2):
        out.append(f"protocol: {stages} smem stages, {acc_stages} accumulator stages")
    out += mc_problems(v.cta_group, b.mc)
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
    # Multicast: every operand has a multicast load form (A along N, B along M, SFs with them),
    # and stage releases can reach the cluster (a 1-CTA tile also has the plain form, 1x1).
    for dims in sorted(v.expected_multicast_dims()):
        if not any(op.startswith(f"UTMALDG.{dims}") and "MULTICAST" in op.split(".") for op in h):
            out.append(f"SASS: no multicast UTMALDG.{dims} (operand loads are not shared in the cluster)")
    if not any(op.startswith("UTCBAR") and "MULTICAST" in op.split(".") for op in h):
        out.append("SASS: no UTCBAR.MULTICAST (stage releases cannot reach the cluster)")
    # K-grouped: A and B are 2-D token maps (no expert coordinate): a 3-D load reads a map wrongly.
    if v.kgrouped and any(op.startswith("UTMALDG.3D") for op in h):
        out.append("SASS: a 3-D UTMALDG in a K-grouped kernel (its A and B maps are 2-D)")
    # Gathered operands: their rows come by TMA gather4, which no other kernel issues; with every
    # operand gathered no box load is left.
    # (A 2-CTA tile's pair gathers in the pair form, UTMALDG.2D.GATHER4.2CTA, as its boxes are .2CTA.)
    gather4 = "UTMALDG.2D.GATHER4" + (".2CTA" if v.cta_group == 2 else "")
    if (v.gather or v.gather_b) != (gather4 in h) or any(op.startswith("UTMALDG.2D.GATHER4") and op != gather4
                                                         for op in h):
        out.append(f"SASS: {gather4} {'missing' if v.gather or v.gather_b else 'present'} or another gather4 form "
                   f"(gathered A {v.gather}, gathered X {v.gather_b})")
    if v.gather and v.gather_b and any(op.startswith("UTMALDG") and "GATHER4" not in op.split(".") for op in h):
        out.append("SASS: a box UTMALDG in a kernel whose operands are both gathered")
    # Block-scaled gathered A: each copying lane's four rows' scale words, 4-byte cp.async copies
    # (LDGSTS.E, no .128), published after fence.proxy.async (FENCE.VIEW.ASYNC.S); no other
    # sm_100a kernel copies through cp.async.
    # (ptxas may give a copy its .ZFILL form: a 4-byte copy either way.)
    wide = [op for op in h if op.startswith("LDGSTS") and {"64", "128"} & set(op.split("."))]
    words = count("LDGSTS") - sum(h[op] for op in wide)
    if (words > 0) != (v.family == "bs" and v.gather) or words % 4:
        out.append(f"SASS: LDGSTS x{words} (block-scaled gathered A copies 4 scale words per lane)")
    if wide:
        out.append(f"SASS: cp.async wider than a scale word {wide}")
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


def contract_problems(v: V, k: KernelContract) -> list[str]:
    """The generated host contract against what the variant implies, written independently."""
    out = []
    want_dtype = 9 if v.family == "bf16" else 0  # CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 / _UINT8 (packed bytes)
    want = {"min_cluster_m": v.cta_group, "min_cluster_n": 1, "max_cluster_ctas": 16,
            "ctas_per_tile": v.cta_group, "tile_m": v.tile_m, "tile_n": v.tile_n,
            "tma_dtype_a": want_dtype, "tma_dtype_b": want_dtype}
    for field, exp in want.items():
        got = getattr(k, field)
        if got != exp:
            out.append(f"contract: {field} = {got}, expected {exp}")
    # A gathered operand's map reads one token row per box (gather4 takes four at a time).
    for field, gathered in (("box_a_outer", v.gather), ("box_b_outer", v.gather_b)):
        if gathered and getattr(k, field) != 1:
            out.append(f"contract: {field} = {getattr(k, field)}, expected 1 "
                       "(a gathered operand's map: one row per box)")
    if (k.tmap_slot_stride != 0) != v.discrete:
        out.append(f"contract: tmap_slot_stride = {k.tmap_slot_stride} with weight_mode "
                   f"{'discrete' if v.discrete else 'dense'} (a tensor-map workspace is for discrete B only)")
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
