"""sm_100a multicast and MN-major checks: CUTLASS's MN-major UMMA descriptors against the
kernels', faulty multicast frames against the CUTLASS model, and the cluster-block tile walk.
The harness is shared with test_sm100_static.py (``_sm100.py``)."""
from __future__ import annotations

import functools
import re

from fusegemm.runtime import cubin_info

from fusegemm.runtime.compile import BASE_OPTIONS, headers

from _sm100 import (CLUSTERS, MC_FIELDS, V, _MC_FN, _skip_without_toolchain, contract_problems,
                    generated_unit, mc_problems, mc_table_cpp)

# ---------------------------------------------------------------------------------------------
# One probe translation unit, no kernel entry point instantiated: CUTLASS's MN-major UMMA
# descriptors next to the kernels' (make_umma_desc is not constexpr: both sides are stored from a
# probe kernel and read back from the PTX, where NVRTC folds them to immediates), the multicast
# tables of two faulty frames, and the cluster-block walk. Each probe's Config and kernel class
# are the generated ones (render() of the probe's variant, see probe_unit).
# ---------------------------------------------------------------------------------------------
# Routes (_sm100.V.route): MN_PROBES 0 and 3 make_variant("gemm_amax"), 1 and 2 gemm_amax's spec with
# problem grouped (no seed spec declares a grouped block-scaled kernel with a chosen C dtype);
# PAIR_COMMIT_FAULTS make_variant("grouped_gemm"). Faults: the generated Config plus one line.
MN_PROBES = [
    V("bs", 128, 256, ab="e4m3", c="f32", batched=True, a_mn=True, b_mn=True),  # SW128, 2 B atoms
    V("bs", 256, 128, ab="e4m3", c="bf16", a_mn=True, b_mn=True),               # 2-CTA: B in SW64
    V("bs", 64, 128, ab="e5m2", c="f16", a_mn=True, b_mn=True),
    V("bs", 128, 256, ab="e4m3", c="f32", batched=True, a_mn=True, b_mn=True, fault=6),  # LBO/SBO swapped
]
PAIR_COMMIT_FAULTS = [V("bf16", 128, 256, fault=5), V("bf16", 256, 256, fault=5)]
# The BF16 kernel's N-major B (make_variant("grouped_gemm", b_major="n")): 4, 2 and 1 atoms per CTA.
BF16_MN_PROBES = [V("bf16", 128, 256, b_mn=True), V("bf16", 256, 256, b_mn=True),
                  V("bf16", 256, 128, b_mn=True, discrete=True)]
BF16_MN_FIELDS = ("hi_b", "lbo_b", "kstep_b", "idesc")
MN_FIELDS = ("hi_a", "lbo_a", "kstep_a", "hi_b", "lbo_b", "kstep_b", "idesc")
WALKS = [(5, 3, 2, 8), (3, 4, 1, 8), (9, 2, 4, 8), (1, 1, 4, 8), (20, 3, 1, 8)]  # (bm, bn, pm, band rows x pm)

_PROBE_FN = """
template <class K, class Atom, int kMn>
__device__ void cutlass_mn_desc(uint32_t* out, uint8_t* buf) {
  using namespace cute;
  // CUTLASS's MN-major smem layout (sm100 collectives: tile_to_mma_shape(..., Step<_2,_1,_3>)):
  // K tiled first inside an MN atom, then the next MN atom.
  using L = decltype(tile_to_shape(Atom{}, Shape<Int<kMn>, Int<K::kBlockK>>{}, Step<_2, _1>{}));
  UMMA::SmemDescriptor d = UMMA::make_umma_desc<UMMA::Major::MN>(make_tensor(make_smem_ptr(buf), L{}));
  out[0] = d.hi;
  out[1] = (d.lo >> 16) << 4;             // LBO in bytes
  out[2] = uint32_t(L{}(0, K::kUmmaK)) / 16;  // descriptor advance of the next instruction's K slice
}
// The kernels name elements by fusegemm's tags (fusegemm/types.cuh); CUTLASS's descriptor
// builders take CUTLASS's numeric types.
template <class T> struct Cl;
template <> struct Cl<fusegemm::float_e4m3_t> { using type = cutlass::float_e4m3_t; };
template <> struct Cl<fusegemm::float_e5m2_t> { using type = cutlass::float_e5m2_t; };
template <> struct Cl<fusegemm::float_e2m1_t> { using type = cutlass::float_e2m1_t; };
template <> struct Cl<fusegemm::float_ue8m0_t> { using type = cutlass::float_ue8m0_t; };
template <> struct Cl<fusegemm::float_ue4m3_t> { using type = cutlass::float_ue4m3_t; };
template <class K, class C>
__device__ void probe_one(uint32_t* out, uint8_t* buf) {
  using namespace cute;
  using AtomA = UMMA::Layout_MN_SW128_Atom<uint8_t>;
  using AtomB = conditional_t<K::kBSwizzle == 128, UMMA::Layout_MN_SW128_Atom<uint8_t>, UMMA::Layout_MN_SW64_Atom<uint8_t>>;
  cutlass_mn_desc<K, AtomA, K::kRowsA>(out, buf);
  cutlass_mn_desc<K, AtomB, K::kRowsB>(out + 3, buf);
  out[6] = uint32_t(UMMA::make_instr_desc_block_scaled<typename Cl<typename C::ElementA>::type,
      typename Cl<typename C::ElementB>::type, float, typename Cl<typename C::ElementSF>::type, K::kMmaM, K::kTileN, K::kAMn ? UMMA::Major::MN : UMMA::Major::K,
      K::kBMn ? UMMA::Major::MN : UMMA::Major::K>());
  const uint32_t ours[7] = {K::kDescHiA, K::kLboA, K::kKStepA, K::kDescHiB, K::kLboB, K::kKStepB, K::kIdesc};
  for (int i = 0; i < 7; ++i) out[7 + i] = ours[i];
}
// The BF16 kernel's N-major B against CUTLASS's bf16 MN-major SW128 layout (K advance in bytes:
// the layout counts elements) and its kind::f16 instruction descriptor with b_major MN.
template <class K>
__device__ void probe_bf16(uint32_t* out, uint8_t* buf) {
  using namespace cute;
  using T = cutlass::bfloat16_t;
  using L = decltype(tile_to_shape(UMMA::Layout_MN_SW128_Atom<T>{}, Shape<Int<K::kRowsB>, Int<K::kBlockK>>{},
                                   Step<_2, _1>{}));
  UMMA::SmemDescriptor d = UMMA::make_umma_desc<UMMA::Major::MN>(make_tensor(make_smem_ptr(reinterpret_cast<T*>(buf)), L{}));
  out[0] = d.hi;
  out[1] = (d.lo >> 16) << 4;
  out[2] = uint32_t(L{}(0, K::kUmmaK)) * sizeof(T) / 16;
  out[3] = uint32_t(UMMA::make_instr_desc<T, T, float, K::kTileM, K::kTileN, UMMA::Major::K, UMMA::Major::MN>());
  const uint32_t ours[4] = {K::kDescHiB, K::kLboB, K::kKStepB, K::kIdesc};
  for (int i = 0; i < 4; ++i) out[4 + i] = ours[i];
}
"""


_ENTRY = 'extern "C" __global__'


def probe_unit(i: int, v: V) -> str:
    """Probe ``i``'s part of the probe unit: the generated translation unit of ``v`` (fault line
    planted), up to its kernel entry point, renamed so that several fit one unit.

    One unit for all probes, by text substitution, rather than one compile per probe: the probes
    only read each kernel class's constants and Frame, so dropping the generated ``__global__``
    entry (the one thing that would instantiate ``Kernel::run``) keeps this a single ~2 s NVRTC
    compile instead of six, with the Config, the ``using Kernel`` and the contract export exactly
    as generated. Renamed: ``namespace fusegemm_gen`` -> ``fusegemm_gen_p<i>``, ``Kernel`` ->
    ``K<i>``, the symbol -> ``probe_k<i>`` (a fault probe has its good twin's symbol: the fault
    line is planted after the renderer hashed the text).
    """
    symbol, text = generated_unit(v)
    if text.count(_ENTRY) != 1:
        raise AssertionError(f"{v.label}: {text.count(_ENTRY)} kernel entry points in the generated unit, expected 1")
    entry = text[text.index(_ENTRY):]
    if f"\n{symbol}(" not in entry or entry.count("{") != 1:
        raise AssertionError(f"{v.label}: the generated unit does not end with its kernel entry point")
    text = text[:text.index(_ENTRY)]
    text = re.sub(r"\bfusegemm_gen\b", f"fusegemm_gen_p{i}", text)
    text = re.sub(r"\bKernel\b", f"K{i}", text)
    text = text.replace(symbol, f"probe_k{i}")
    if f"using K{i} = " not in text or "fusegemm_gen::" in text or symbol in text:
        raise AssertionError(f"{v.label}: renaming the generated unit for probe {i} failed")
    return text


def probe_source() -> str:
    probes = MN_PROBES + PAIR_COMMIT_FAULTS + BF16_MN_PROBES
    src = [probe_unit(i, v) for i, v in enumerate(probes)]
    src += ["#include <cute/atom/mma_traits_sm100.hpp>", _MC_FN, _PROBE_FN]
    for j, v in enumerate(PAIR_COMMIT_FAULTS):
        src.append(mc_table_cpp(f"K{len(MN_PROBES) + j}::Frame", v.cta_group, f"probe_mc{j}"))
    walk = []
    for bm, bn, pm, band in WALKS:
        for blk in range(bm * bn):
            c = f"fusegemm::grouped_block_coord({blk}, {bm}, {bn}, {max(1, band // pm)})"
            walk.append(f"{c}.bm, {c}.bn")
    src.append(f'extern "C" __device__ __attribute__((used)) const int probe_walk[{2 * len(walk)}] = {{'
               + ", ".join(walk) + "};")
    body = "".join(f"  probe_one<K{i}, fusegemm_gen_p{i}::Config>(out + {16 * i}, buf);\n"
                   for i in range(len(MN_PROBES)))
    first = len(MN_PROBES) + len(PAIR_COMMIT_FAULTS)
    body += "".join(f"  probe_bf16<K{first + j}>(out + {_bf16_word(j)}, buf);\n" for j in range(len(BF16_MN_PROBES)))
    src.append('extern "C" __global__ void probe(uint32_t* out) {\n'
               "  __shared__ alignas(1024) uint8_t buf[32768];\n" + body + "}")
    return "\n".join(src) + "\n"


def _bf16_word(j: int) -> int:
    """First output word of BF16 probe j (after the 16 words of each block-scaled probe)."""
    return 16 * len(MN_PROBES) + 8 * j


@functools.lru_cache(maxsize=1)
def probe() -> tuple[str, bytes]:
    from cuda.bindings import nvrtc

    opts = [b"-arch=sm_100a", *(o.encode() for o in BASE_OPTIONS), *(o.encode() for o in headers().options())]
    err, prog = nvrtc.nvrtcCreateProgram(probe_source().encode(), b"probe.cu", 0, [], [])
    try:
        if int(nvrtc.nvrtcCompileProgram(prog, len(opts), opts)[0]) != 0:
            log = b" " * nvrtc.nvrtcGetProgramLogSize(prog)[1]
            nvrtc.nvrtcGetProgramLog(prog, log)
            raise AssertionError("the probe unit did not compile:\n" + log.decode(errors="replace")[:4000])
        ptx = b" " * nvrtc.nvrtcGetPTXSize(prog)[1]
        nvrtc.nvrtcGetPTX(prog, ptx)
        cubin = b" " * nvrtc.nvrtcGetCUBINSize(prog)[1]
        nvrtc.nvrtcGetCUBIN(prog, cubin)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    return ptx.rstrip(b"\0").decode(), cubin


def ptx_stored_constants(ptx: str) -> dict[int, int]:
    """Byte offset -> value of every ``st.global.u32 [%rd+off], imm-or-%r`` of the probe kernel."""
    regs, out = {}, {}
    for m in re.finditer(r"mov\.(?:b|u)32\s+(%r\d+),\s*(-?\d+);", ptx):
        regs[m.group(1)] = int(m.group(2)) & 0xFFFFFFFF
    for m in re.finditer(r"st\.global\.u32\s+\[%rd\d+(?:\+(\d+))?\],\s*(%r\d+|-?\d+);", ptx):
        v = m.group(2)
        out[int(m.group(1) or 0)] = regs[v] if v.startswith("%") else int(v) & 0xFFFFFFFF
    return out


def mn_desc_problems(i: int, stored: dict[int, int]) -> list[str]:
    """Probe i: the kernel's MN-major descriptor constants against CUTLASS's."""
    base = 64 * i
    cut = [stored.get(base + 4 * k) for k in range(7)]
    ours = [stored.get(base + 28 + 4 * k) for k in range(7)]
    v = MN_PROBES[i]
    return [f"{v.label}: {f} = {o:#x}, CUTLASS {c:#x}" for f, o, c in zip(MN_FIELDS, ours, cut)
            if (f.endswith("_a") and v.a_mn or f.endswith("_b") and v.b_mn or f == "idesc") and o != c]


def test_mn_major_descriptors_match_cutlass():
    _skip_without_toolchain()
    stored = ptx_stored_constants(probe()[0])
    assert len(stored) == 14 * len(MN_PROBES) + 8 * len(BF16_MN_PROBES), sorted(stored)
    for i in range(len(MN_PROBES) - 1):
        assert mn_desc_problems(i, stored) == []
    # The kernel's own constants, pinned (sm100-protocol.md §2 style): SW128 hi 0x40004040, LBO
    # 16 KB between two N atoms (0 for a single M atom, as CUTLASS) and K advance 256; 2-CTA N 128
    # puts 64 columns per CTA in one SW64 atom.
    assert [stored[28 + 4 * k] for k in range(7)] == [0x40004040, 0, 256, 0x40004040, 16384, 256, 0x08C18000]
    assert [stored[64 + 40 + 4 * k] for k in range(3)] == [0x80004020, 0, 128]
    # The broken probe (fault 6, LBO and SBO swapped) is caught.
    bad = mn_desc_problems(len(MN_PROBES) - 1, stored)
    assert any("hi_a" in p for p in bad) and any("lbo_a" in p for p in bad) and any("hi_b" in p for p in bad), bad


def test_bf16_n_major_descriptors_match_cutlass():
    """The BF16 kernel's N-major B (hi word, LBO, K advance, instruction descriptor) equals
    CUTLASS's make_umma_desc<Major::MN> / make_instr_desc on the same bf16 layout, for 4, 2 and 1
    64-column atoms per CTA; pinned: SW128 hi 0x40004040, LBO 8 KB between atoms (0 for one),
    K advance 128 (2 KB), and the golden bf16 descriptor with the b_major bit."""
    _skip_without_toolchain()
    stored = ptx_stored_constants(probe()[0])
    for j, v in enumerate(BF16_MN_PROBES):
        base = 4 * _bf16_word(j)
        cut = [stored.get(base + 4 * k) for k in range(4)]
        ours = [stored.get(base + 16 + 4 * k) for k in range(4)]
        assert None not in cut + ours, (v.label, sorted(stored))
        assert ours == cut, f"{v.label}: ours {[hex(x) for x in ours]}, CUTLASS {[hex(x) for x in cut]}"
        atoms = v.tile_n // v.cta_group // 64
        assert ours[:3] == [0x40004040, 8192 if atoms > 1 else 0, 128], v.label
        shape = ((v.tile_n >> 3) << 17) | ((v.tile_m >> 4) << 24)
        assert ours[3] == (0x00010490 | shape), v.label


def test_probe_kernels_are_the_generated_ones():
    """The probes' kernel classes come from the generated units: each exports its generated
    contract (renamed probe_k<i>), which agrees with the probe's variant."""
    _skip_without_toolchain()
    c = cubin_info.Cubin(probe()[1])
    for i, v in enumerate(MN_PROBES + PAIR_COMMIT_FAULTS + BF16_MN_PROBES):
        assert contract_problems(v, c.contract(f"probe_k{i}")) == [], v.label


def test_pair_only_release_fails_the_multicast_model():
    """Fault 5: stage releases to the pair only, empty count 1, whatever the launch cluster."""
    _skip_without_toolchain()
    c = cubin_info.Cubin(probe()[1])
    for j, v in enumerate(PAIR_COMMIT_FAULTS):
        n = sum(ncta for _, _, ncta in CLUSTERS[v.cta_group]) * len(MC_FIELDS)
        problems = mc_problems(v.cta_group, c.global_ints(f"probe_mc{j}", n))
        assert any("commit" in p or "empty" in p for p in problems), problems


def test_cluster_block_walk_covers_every_tile_once():
    """grouped_block_coord is a bijection onto the block grid; cluster blocks of pm x pn tiles
    cover every tile of the problem exactly once (the rest are phantoms past the edge)."""
    _skip_without_toolchain()
    c = cubin_info.Cubin(probe()[1])
    vals = c.global_ints("probe_walk", 2 * sum(bm * bn for bm, bn, _, _ in WALKS))
    i = 0
    for bm, bn, pm, _ in WALKS:
        coords = [(vals[i + 2 * b], vals[i + 2 * b + 1]) for b in range(bm * bn)]
        i += 2 * bm * bn
        assert sorted(coords) == [(x, y) for x in range(bm) for y in range(bn)], (bm, bn, pm)
        for pn in (1, 2, 4):
            m_tiles, n_tiles = bm * pm - (pm - 1), bn * pn - (pn - 1)  # ragged last block
            tiles = [(x * pm + u, y * pn + w) for x, y in coords for u in range(pm) for w in range(pn)]
            inside = [t for t in tiles if t[0] < m_tiles and t[1] < n_tiles]
            assert sorted(inside) == [(m, n) for m in range(m_tiles) for n in range(n_tiles)]
