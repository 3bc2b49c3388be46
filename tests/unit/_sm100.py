"""Shared harness of the sm_100a static checks (test_sm100_static.py, test_sm100_multicast.py):
variants, translation units, compile + cubin facts, the static checks, and the CUTLASS multicast
model with its pipeline simulation. test_sm100_static.py says what is verified and why."""
from __future__ import annotations

import functools
import re
import time
from dataclasses import dataclass

import pytest

from fusegemm.generator.params import GROUPED_PARAMS
from fusegemm.runtime import disasm, inspect
from fusegemm.runtime.compile import compile_source, headers
from fusegemm.runtime.errors import ToolchainError

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
# Launch clusters whose multicast protocol every variant exports: (cluster_m, cluster_n, CTAs of
# the launch cluster). The last rows are what an older host (zeros) or an inconsistent shape
# produce: the kernel must fall back to pairs only.
# ---------------------------------------------------------------------------------------------
CLUSTERS = {
    1: [(1, 1, 1), (2, 1, 2), (1, 2, 2), (2, 2, 4), (4, 1, 4), (1, 4, 4), (4, 2, 8), (2, 4, 8),
        (4, 4, 16), (3, 1, 3), (0, 0, 1), (0, 0, 4), (2, 2, 8), (1, 2, 4)],
    2: [(2, 1, 2), (4, 1, 4), (2, 2, 4), (4, 2, 8), (2, 4, 8), (4, 4, 16), (0, 0, 2), (0, 0, 8),
        (1, 2, 2), (2, 2, 8)],
}
MC_FIELDS = ("mi", "ni", "base", "size", "a_mask", "b_mask", "commit", "pair", "empty", "ring", "issues")
MC_SLICES, MC_KBLOCKS = 4, 8
# issues (what the CTA loads when its operands are shared): bit i = A slice i, bit 4 + i = B
# slice i, bit 8 + kb = the SFA box of k-block kb, bit 16 + kb = the SFB box.


# What every CTA computes, tabulated at compile time from the kernel's own Frame (the same
# constexpr functions the kernel runs) for each launch cluster of CLUSTERS.
_MC_FN = """
namespace fusegemm_test {
template <int N> struct Ints { int v[N]; };
template <class F, int kRows, int kShapes>
constexpr Ints<kRows * 11> mc_table(const int (&shapes)[kShapes][3]) {
  Ints<kRows * 11> t{};
  int i = 0;
  for (int s = 0; s < kShapes; ++s) {
    for (int r = 0; r < shapes[s][2]; ++r) {
      const auto g = F::Geom::make(shapes[s][0], shapes[s][1], r, shapes[s][2]);
      const auto sa = F::share_a_of(g);
      const auto sb = F::share_b_of(g, true);
      int issues = 0;
      for (int j = 0; j < 4; ++j) issues |= (int(sa.issues_slice(j)) << j) | (int(sb.issues_slice(j)) << (4 + j));
      for (int kb = 0; kb < 8; ++kb) issues |= (int(sa.issues_whole(kb)) << (8 + kb)) | (int(sb.issues_whole(kb)) << (16 + kb));
      const int row[11] = {g.mi, g.ni, g.base, g.size(), int(g.a_mask()), int(g.b_mask()),
                           int(F::stage_commit_mask(g)), int(g.pair_mask()), int(F::empty_count(g)),
                           int(F::ring_empty_count(g)), issues};
      for (int k = 0; k < 11; ++k) t.v[i++] = row[k];
    }
  }
  return t;
}
}  // namespace fusegemm_test
"""


def mc_table_cpp(frame: str, cg: int, symbol: str) -> str:
    """C++ defining ``symbol``: the multicast table of ``frame`` (a KernelFrame type)."""
    shapes = CLUSTERS[cg]
    rows = sum(ncta for _, _, ncta in shapes)
    init = ", ".join(f"{{{cm}, {cn}, {n}}}" for cm, cn, n in shapes)
    return (f"constexpr int {symbol}_shapes[][3] = {{{init}}};\n"
            f'extern "C" __device__ __attribute__((used)) const fusegemm_test::Ints<{rows * len(MC_FIELDS)}> '
            f"{symbol} = fusegemm_test::mc_table<{frame}, {rows}>({symbol}_shapes);\n")


# ---------------------------------------------------------------------------------------------
# Translation units, rendered as templates/{grouped,blockscaled}_gemm.cu.j2 do for sm_100a, plus
# exported constants the checks read: TMEM columns, protocol values and the multicast table.
# ---------------------------------------------------------------------------------------------
_TAIL = """
using Kernel = fusegemm::sm100::{kernel}<fusegemm_gen::Config>;
extern "C" __device__ __attribute__((used)) const int {name}_launch_info[4] = {{
    Kernel::kThreads, Kernel::kSmemBytes, {min_cluster_m}, 1}};
extern "C" __device__ __attribute__((used)) const int {name}_tmem_cols = Kernel::kTmemCols;
extern "C" __device__ __attribute__((used)) const int {name}_protocol[6] = {{
    Kernel::kStages, Kernel::Frame::kAccStages, int(Kernel::Frame::kFullCount),
    int(Kernel::Frame::kTmemFullCount), int(Kernel::Frame::kTmemEmptyCount), int(Kernel::Frame::kTxBytes)}};
{mc_table}extern "C" __global__ void __launch_bounds__(Kernel::kThreads, 1)
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
    b_mn: bool = False  # block-scaled FP8: N-major B
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
            parts += [x for x, on in (("amn", self.a_mn), ("bnn", self.b_mn)) if on]
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

    def source(self, name: str) -> str:
        head = '#include "fusegemm/sm100/grouped_gemm.cuh"\n' if self.family == "bf16" else \
            '#include "fusegemm/sm100/blockscaled_gemm.cuh"\n'
        table = mc_table_cpp("Kernel::Frame", self.cta_group, f"{name}_mc")
        return (head + "namespace fusegemm_gen {\n" + GROUPED_PARAMS.cpp() + "\n" + self.config_cpp("Config")
                + "}  // namespace fusegemm_gen\n" + _MC_FN
                + _TAIL.format(kernel=self.kernel, name=name, min_cluster_m=self.cta_group, mc_table=table))

    def config_cpp(self, struct: str) -> str:
        extra = f"  static constexpr int kFaultInjection = {self.fault};\n" if self.fault else ""
        if self.family == "bf16":
            cfg = (f"  using ElementA = {AB[self.ab]};\n  using ElementB = {AB[self.ab]};\n"
                   f"  using ElementC = {OUT[self.c]};\n  using ElementD = {OUT[self.d]};\n"
                   f"  using ElementBias = {OUT.get(self.bias, 'float')};\n"
                   f"  static constexpr bool kHasBias = {_b(self.bias != 'none')};\n"
                   f"  static constexpr bool kGenerateC = {_b(self.generate_c)};\n")
        else:
            cfg = (f"  using ElementA = {AB[self.ab]};\n  using ElementB = {AB[self.ab]};\n"
                   f"  using ElementSF = {SF[self.sf]};\n  using ElementC = {OUT[self.c]};\n"
                   f"  static constexpr int kSfVec = {self.vec};\n"
                   f"  static constexpr bool kBatched = {_b(self.batched)};\n"
                   f"  static constexpr bool kCMajorM = {_b(self.c_major_m)};\n"
                   f"  static constexpr bool kAMajorMN = {_b(self.a_mn)};\n"
                   f"  static constexpr bool kBMajorMN = {_b(self.b_mn)};\n")
        cfg += (f"  static constexpr bool kDynamicSched = {_b(self.dynamic)};\n"
                f"  static constexpr bool kDiscreteB = {_b(self.discrete)};\n"
                f"  static constexpr int kTileM = {self.tile_m};\n  static constexpr int kTileN = {self.tile_n};\n"
                + extra)
        return f"struct {struct} {{\n{cfg}}};\n"

    # Independent expectations (sm100-protocol.md §1-4), computed without the headers.
    def expected_tx_bytes(self) -> int:
        cg = 2 if self.two_cta else 1
        if self.family == "bf16":
            return (self.tile_m // cg * 64 * 2 + self.tile_n // cg * 64 * 2) * cg
        elems_per_byte = 2 if self.ab == "e2m1" else 1
        sf_katoms = 128 * elems_per_byte // (4 * self.vec)
        # M-major A loads whole 128-row M atoms (TILE_M 64 included); K-major A only its rows.
        a = max(self.tile_m // cg, 128 if self.a_mn else 0) * 128
        b = self.tile_n // cg * 128
        return (a + b + sf_katoms * 512 + self.tile_n // 128 * sf_katoms * 512) * cg

    def expected_multicast_dims(self) -> set[str]:
        """TMA dimensionalities that must appear in multicast form: A, B (and the 4-D SF maps)."""
        a = "3D" if self.family == "bs" and self.batched else "2D"
        b = "2D" if self.discrete else "3D"
        return {a, b} | ({"4D"} if self.family == "bs" else set())

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
    mc: tuple[int, ...] | None
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
    mc_len = sum(ncta for _, _, ncta in CLUSTERS[v.cta_group]) * len(MC_FIELDS)
    for key, sym, n in (("tmem_cols", f"{name}_tmem_cols", 1), ("protocol", f"{name}_protocol", 6),
                        ("mc", f"{name}_mc", mc_len)):
        try:
            vals = c.global_ints(sym, n)
            optional[key] = vals[0] if n == 1 else vals
        except inspect.CubinFormatError:
            optional[key] = None
    text = disasm.sass(data)
    return Built(v, name, seconds, c.resources(name), c.launch_info(name), optional["tmem_cols"],
                 optional["protocol"], optional["mc"], disasm.histogram(text), text)


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
    if b.launch.cluster_m != v.cta_group or b.launch.cluster_n != 1:
        out.append(f"launch_info: minimum cluster {b.launch.cluster_m}x{b.launch.cluster_n}, expected {v.cta_group}x1")
    if b.protocol is not None:
        stages, acc_stages, full, tfull, tempty, tx = b.protocol
        cg = v.cta_group
        want = {"full": (full, 1), "tmem_full": (tfull, 1), "tmem_empty": (tempty, 128 * cg),
                "expect_tx": (tx, v.expected_tx_bytes())}
        for what, (got, exp) in want.items():
            if got != exp:
                out.append(f"protocol: {what} = {got}, expected {exp}")
        if stages < 2 or acc_stages not in (1, 2):
            out.append(f"protocol: {stages} smem stages, {acc_stages} accumulator stages")
    if b.mc is not None:
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


# ---------------------------------------------------------------------------------------------
# The multicast protocol, independently: CUTLASS's formulas, then a one-stage simulation.
# ---------------------------------------------------------------------------------------------
def cutlass_model(cg: int, cluster_m: int, cluster_n: int, ncta: int, r: int) -> dict[str, int]:
    """What CTA ``r`` must compute, from CUTLASS's definitions: the vmnk coordinates of
    tiled_divide(cluster, AtomThrID) (v = pair half, m = MMA unit, n), create_tma_multicast_mask
    <2> (A: every n) / <1> (B: every m), calculate_multicast_mask<kRowCol> (release: same unit
    row or same n), calculate_umma_peer_mask (the pair), PipelineTmaUmmaAsync's consumer count
    and our ring count (TMA + 4 epilogue warps per CTA, one MMA warp per unit)."""
    legal = cluster_m >= 1 and cluster_n >= 1 and cluster_m % cg == 0 and cluster_m * cluster_n == ncta <= 16
    cm, cn = (cluster_m, cluster_n) if legal else (cg, 1)
    size = cm * cn
    base = r - r % size
    x, y = (r - base) % cm, (r - base) // cm
    ctas = [(xx, yy) for yy in range(cn) for xx in range(cm)]

    def mask(pred) -> int:
        return sum(1 << (base + xx + cm * yy) for xx, yy in ctas if pred(xx, yy))

    return {"mi": x, "ni": y, "base": base, "size": size,
            "a_mask": mask(lambda xx, yy: xx % cg == x % cg and xx // cg == x // cg),
            "b_mask": mask(lambda xx, yy: xx % cg == x % cg and yy == y),
            "commit": mask(lambda xx, yy: xx // cg == x // cg or yy == y),
            "pair": mask(lambda xx, yy: xx // cg == x // cg and yy == y),
            "empty": cm // cg + cn - 1, "ring": size * 5 + size // cg}


def mc_rows(cg: int, table: tuple[int, ...]):
    n, i = len(MC_FIELDS), 0
    for cm, cn, ncta in CLUSTERS[cg]:
        rows = [dict(zip(MC_FIELDS, table[(i + r) * n:(i + r + 1) * n])) for r in range(ncta)]
        i += ncta
        yield (cm, cn, ncta), rows


def _simulate(cg: int, tag: str, rows: list[dict[str, int]]) -> list[str]:
    """One stage of the pipeline on the kernel's table (CTAs = ranks, MMA units = even ranks of a
    pair): every A/B slice and SF box reaches every CTA exactly once, from a member of its share
    group; every member loads part of every stage; each empty barrier receives exactly its count
    of releases; every CTA a producer writes into releases the stage to that producer; and no
    unit can release round r+1 of a stage before every unit released round r (its full barrier
    waits, through the producers that fill it, on every unit's release), so no empty barrier can
    count a release in the wrong phase."""
    out, n = [], len(rows)
    units = [r for r in range(n) if rows[r]["mi"] % cg == 0]
    unit_of = {r: r - rows[r]["mi"] % cg for r in range(n)}
    releasers = {x: {u for u in units if rows[u]["commit"] >> x & 1} for x in range(n)}
    for d in range(n):
        if len(releasers[d]) != rows[d]["empty"]:
            out.append(f"multicast: {tag} rank {d}: {len(releasers[d])} stage releases per phase, "
                       f"empty barrier counts {rows[d]['empty']}")
    for same_b in (True, False):
        for kb in range(MC_KBLOCKS):  # the stage of k-block kb
            writers = {d: {d} for d in range(n)}  # CTAs whose loads land in d's stage
            for op, key, first, sf_bit in (("A", "a_mask", 0, 8 + kb), ("B", "b_mask", 4, 16 + kb)):
                for d in range(n):
                    group = [x for x in range(n) if rows[d][key] >> x & 1]
                    if len(group) == 1:  # private: the CTA loads every slice itself
                        if (rows[d]["issues"] >> first) & 0xF != 0xF:
                            out.append(f"multicast: {tag} rank {d} does not load all of its private {op}")
                        continue
                    if op == "B" and not same_b:  # a block across experts: every CTA loads its own B
                        continue
                    for x in group:
                        if rows[x][key] != rows[d][key]:
                            out.append(f"multicast: {tag}: ranks {x} and {d} disagree on the {op} group")
                        if (rows[x]["issues"] >> first) & 0xF == 0:
                            out.append(f"multicast: {tag}: rank {x} loads no {op} slice (the stages of its "
                                       f"group would not wait for its empty barrier)")
                    for bit in [first + i for i in range(MC_SLICES)] + [sf_bit]:
                        src = [x for x in group if rows[x]["issues"] >> bit & 1]
                        if len(src) != 1:
                            out.append(f"multicast: {tag}: {op} bit {bit} reaches rank {d} from {src}")
                        writers[d] |= set(src)
            for d in range(n):
                for x in writers[d]:
                    if unit_of[d] not in releasers[x]:
                        out.append(f"multicast: {tag}: rank {x} writes into rank {d}, whose MMA unit (rank "
                                   f"{unit_of[d]}) never releases the stage to it")
            for u in units:
                feeders = {u} | set().union(*(writers[d] for d in range(u, u + cg)))
                waits = set().union(*(releasers[x] for x in feeders))
                peers = {v for v in units if rows[v]["base"] == rows[u]["base"]}  # its sub-cluster
                if waits != peers:
                    out.append(f"multicast: {tag} (B shared: {same_b}): unit {u} can release a stage a "
                               f"round ahead of units {sorted(peers - waits)}")
    return list(dict.fromkeys(out))


def mc_problems(cg: int, table: tuple[int, ...]) -> list[str]:
    """The kernel's multicast table against CUTLASS's formulas, then a simulated stage."""
    out = []
    want_len = sum(ncta for _, _, ncta in CLUSTERS[cg]) * len(MC_FIELDS)
    if len(table) != want_len:
        return [f"multicast: table of {len(table)} values, expected {want_len} (cta_group {cg})"]
    for (cm, cn, ncta), rows in mc_rows(cg, table):
        tag = f"cluster {cm}x{cn} ({ncta} CTAs)"
        for r, row in enumerate(rows):
            want = cutlass_model(cg, cm, cn, ncta, r)
            bad = {k: (row[k], v) for k, v in want.items() if row[k] != v}
            if bad:
                out.append(f"multicast: {tag} rank {r}: (got, expected) {bad}")
        if out:
            return out
        out += _simulate(cg, tag, rows)
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
