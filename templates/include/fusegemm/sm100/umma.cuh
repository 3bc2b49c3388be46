// UMMA (tcgen05.mma) descriptors and issue wrappers for sm_100a.
//
// Descriptors are built by constexpr functions from named fields (bit positions from CUTLASS
// cute/arch/mma_sm100_desc.hpp: InstrDescriptor DESC:412, InstrDescriptorBlockScaled DESC:441,
// SmemDescriptor DESC:98) and pinned by static_asserts against the golden values in
// shared/notes/sm100-protocol.md §2 (printed by host programs on the CUTLASS headers). A wrong
// field therefore fails the build, not a Blackwell run we cannot do.
//
// Issue wrappers are single-thread PTX (the caller elects the lane): the same lane must issue
// the MMAs and the tcgen05.commit that tracks them (a commit tracks only its own thread's
// tcgen05 ops; CUTLASS UMMA:104 / BAR:766 elect inside both wrappers for the same reason).
#pragma once

#include "fusegemm/common.cuh"

namespace fusegemm::sm100 {

// ---------------------------------------------------------------------------------------------
// Instruction descriptors
// ---------------------------------------------------------------------------------------------

// kind::f16 operand formats (DESC F16F32Format) and accumulator format (CFormat).
enum class F16Fmt : uint32_t { F16 = 0, BF16 = 1 };
constexpr uint32_t kCFmtF32 = 1;

// Block-scaled operand formats: kind::mxf8f6f4 (MXF8F6F4Format) and kind::mxf4/mxf4nvf4 (MXF4Format).
enum class MxFmt : uint32_t { E4M3 = 0, E5M2 = 1, E2M3 = 3, E3M2 = 4, E2M1_UNPACKED = 5, E2M1_PACKED = 1 };
enum class ScaleFmt : uint32_t { UE4M3 = 0, UE8M0 = 1 };

// kind::f16, dense, K-major A and B unless told: bits c_fmt[4,6) a_fmt[7,10) b_fmt[10,13)
// a_major[15] b_major[16] N>>3 [17,23) M>>4 [24,29).
constexpr uint32_t idesc_f16(int m, int n, F16Fmt a, F16Fmt b, bool a_mn_major = false,
                             bool b_mn_major = false) {
  return (kCFmtF32 << 4) | (uint32_t(a) << 7) | (uint32_t(b) << 10) |
         (uint32_t(a_mn_major) << 15) | (uint32_t(b_mn_major) << 16) |
         (uint32_t(n >> 3) << 17) | (uint32_t(m >> 4) << 24);
}

// Block-scaled: b_sf_id[4,6) a_fmt[7,10) b_fmt[10,13) majors[15],[16] N>>3 [17,23)
// scale_fmt[23] M>>4 [24,29) a_sf_id[29,31); no c_fmt field.
constexpr uint32_t idesc_block_scaled(int m, int n, MxFmt a, MxFmt b, ScaleFmt sf,
                                      uint32_t a_sf_id = 0, uint32_t b_sf_id = 0,
                                      bool a_mn_major = false, bool b_mn_major = false) {
  return (b_sf_id << 4) | (uint32_t(a) << 7) | (uint32_t(b) << 10) |
         (uint32_t(a_mn_major) << 15) | (uint32_t(b_mn_major) << 16) |
         (uint32_t(n >> 3) << 17) | (uint32_t(sf) << 23) | (uint32_t(m >> 4) << 24) |
         (a_sf_id << 29);
}

// Replace the scale-factor byte selectors (DeepGEMM make_runtime_instr_desc_with_sf_id: sf_id set
// directly, SF TMEM address passed as a plain column address).
constexpr uint32_t idesc_with_sf_id(uint32_t idesc, uint32_t a_sf_id,
                                                    uint32_t b_sf_id) {
  return (idesc & ~((3u << 29) | (3u << 4))) | (a_sf_id << 29) | (b_sf_id << 4);
}

// Golden values (sm100-protocol.md §2, K-major A and B).
static_assert(idesc_f16(128, 256, F16Fmt::BF16, F16Fmt::BF16) == 0x08400490u, "idesc bf16 M128 N256");
static_assert(idesc_f16(128, 128, F16Fmt::BF16, F16Fmt::BF16) == 0x08200490u, "idesc bf16 M128 N128");
static_assert(idesc_f16(64, 128, F16Fmt::BF16, F16Fmt::BF16) == 0x04200490u, "idesc bf16 M64 N128");
static_assert(idesc_f16(256, 256, F16Fmt::BF16, F16Fmt::BF16) == 0x10400490u, "idesc bf16 M256 N256");
static_assert(idesc_block_scaled(128, 256, MxFmt::E4M3, MxFmt::E4M3, ScaleFmt::UE8M0) == 0x08c00000u,
              "idesc mxf8 e4m3/ue8m0 M128 N256");
static_assert(idesc_block_scaled(256, 256, MxFmt::E4M3, MxFmt::E4M3, ScaleFmt::UE8M0) == 0x10c00000u,
              "idesc mxf8 e4m3/ue8m0 M256 N256");
static_assert(idesc_block_scaled(128, 256, MxFmt::E2M1_UNPACKED, MxFmt::E2M1_UNPACKED,
                                 ScaleFmt::UE8M0) == 0x08c01680u, "idesc f8f6f4 with e2m1");
static_assert(idesc_block_scaled(128, 256, MxFmt::E2M1_PACKED, MxFmt::E2M1_PACKED, ScaleFmt::UE8M0) ==
              0x08c00480u, "idesc mxf4 ue8m0");
static_assert(idesc_block_scaled(128, 256, MxFmt::E2M1_PACKED, MxFmt::E2M1_PACKED, ScaleFmt::UE4M3) ==
              0x08400480u, "idesc nvf4 ue4m3 M128");
static_assert(idesc_block_scaled(256, 256, MxFmt::E2M1_PACKED, MxFmt::E2M1_PACKED, ScaleFmt::UE4M3) ==
              0x10400480u, "idesc nvf4 ue4m3 M256");
static_assert(idesc_block_scaled(128, 256, MxFmt::E4M3, MxFmt::E4M3, ScaleFmt::UE8M0, 2, 3) ==
              0x48c00030u, "idesc mxf8 with SFA byte 2, SFB byte 3");
static_assert(idesc_with_sf_id(0x08c00000u, 2, 3) == 0x48c00030u, "sf_id replacement");

// Legal instruction shapes (UMMA static_asserts; protocol §2 "Legal shapes"). Checked by every
// kernel before it issues, so an illegal tile fails at compile time (protocol bug #9).
template <int kCtaGroup, int M, int N>
constexpr bool legal_f16_shape() {
  return kCtaGroup == 1 ? ((M == 64 || M == 128) && N % 8 == 0 && N >= 8 && N <= 256)
                        : ((M == 128 || M == 256) && N % 16 == 0 && N >= 16 && N <= 256);
}
template <int kCtaGroup, int M, int N, bool kMxf8f6f4>
constexpr bool legal_block_scaled_shape() {
  return kCtaGroup == 1 ? (M == 128 && N % 8 == 0 && N >= 8 && N <= 256)
                        : ((kMxf8f6f4 ? M == 256 : (M == 128 || M == 256)) && N % 16 == 0 &&
                           N >= 16 && N <= 256);
}

// ---------------------------------------------------------------------------------------------
// Shared-memory matrix descriptors (DESC:98): start>>4 [0,14) LBO>>4 [16,30) SBO>>4 [32,46)
// version=1 [46,48) base_offset [49,52) lbo_mode [52] layout [61,64).
// SM100 layout codes are NOT SM90's (mma_sm90_desc.hpp: B128 = 1): 128B swizzle is 2 here.
// ---------------------------------------------------------------------------------------------

enum class SmemLayout : uint32_t { NONE = 0, SW128_BASE32B = 1, SW128 = 2, SW64 = 4, SW32 = 6 };

constexpr uint32_t smem_desc_hi(uint32_t sbo_bytes, SmemLayout layout) {
  return (sbo_bytes >> 4) | (1u << 14) /* version, bit 46 */ | (uint32_t(layout) << 29);
}
constexpr uint32_t smem_desc_lo(uint32_t smem_addr, uint32_t lbo_bytes) {
  return ((smem_addr & 0x3FFFFu) >> 4) | ((lbo_bytes >> 4) << 16);
}

// K-major operand tile whose K extent is one 128-byte swizzle atom (bf16 K=64, 8-bit K=128,
// packed fp4 K=256): 8-row core matrices 1024 B apart (SBO); LBO unused (CUTLASS writes 1).
constexpr uint32_t kSw128KMajorHi = smem_desc_hi(1024, SmemLayout::SW128);
constexpr uint32_t kSw128KMajorLbo = 16;
static_assert(kSw128KMajorHi == 0x40004040u, "K-major SW128 descriptor hi (TRA:271-303)");

// MN-major operand of 8-bit elements (FP8 A M-major / B N-major; kind::mxf4/mxf4nvf4 need
// K-major). Canonical MN-major swizzled layout (make_umma_desc<Major::MN>, TRA:176-250), in
// 16-byte units ((S/16, mn_atoms), (8, k_groups)) : ((1, LBO), (S/16, SBO)) for an S-byte swizzle:
// an atom is S bytes (S elements) along MN by 8 K rows. Our stage holds one TMA box of
// S MN-bytes x kBlockK K-rows per MN atom, atoms one after another ([mn atom][K row][S bytes],
// DeepGEMM make_umma_desc MN branch), so
//   SBO = 8 * S               (next group of 8 K rows inside an atom)
//   LBO = kBlockK * S         (next MN atom; with one atom nothing steps to it and CUTLASS
//                             writes 0, the stride of a size-1 mode: we do the same)
//   K advance per instruction = UMMA_K rows * S bytes / 16 (K runs across rows, not along them).
// S is 128 (SW128) when a CTA's MN extent is a multiple of 128 elements, 64 (SW64) for 64
// (2-CTA tile N 128: 64 B columns per CTA), as CUTLASS's sm100 smem selector picks the widest
// swizzle that divides the extent.
constexpr SmemLayout mn_major_layout(int swz_bytes) {
  return swz_bytes == 128 ? SmemLayout::SW128 : swz_bytes == 64 ? SmemLayout::SW64 : SmemLayout::SW32;
}
constexpr int mn_major_swizzle(int mn_bytes) { return mn_bytes % 128 == 0 ? 128 : 64; }
constexpr uint32_t mn_major_sbo(int swz_bytes) { return uint32_t(8 * swz_bytes); }
constexpr uint32_t mn_major_lbo(int swz_bytes, int block_k_rows, int mn_atoms) {
  return mn_atoms > 1 ? uint32_t(block_k_rows * swz_bytes) : 0u;
}
constexpr uint32_t mn_major_hi(int swz_bytes, uint32_t sbo_bytes) {
  return smem_desc_hi(sbo_bytes, mn_major_layout(swz_bytes));
}
constexpr uint32_t mn_major_kstep(int swz_bytes, int umma_k_rows) { return uint32_t(umma_k_rows * swz_bytes / 16); }
// Golden values: CUTLASS make_umma_desc<Major::MN> on tile_to_shape(Layout_MN_SW128_Atom<uint8_t>,
// (256, 128), Step<_2,_1>) gives hi 0x40004040 and LBO 16384 (LBO 0 for (128, 128)); the K=32
// slice starts 4096 B on (tests/unit/test_sm100_static.py recomputes them from the CuTe headers).
static_assert(mn_major_hi(128, mn_major_sbo(128)) == 0x40004040u && mn_major_lbo(128, 128, 2) == 16384 &&
                  mn_major_lbo(128, 128, 1) == 0 && mn_major_kstep(128, 32) == 256,
              "MN-major SW128 descriptor (8-bit, 128 K rows per stage)");
static_assert(mn_major_hi(64, mn_major_sbo(64)) == 0x80004020u && mn_major_lbo(64, 128, 2) == 8192 &&
                  mn_major_kstep(64, 32) == 128,
              "MN-major SW64 descriptor (8-bit, 128 K rows per stage)");

// UTCCP source for one 512-B scale-factor atom: no swizzle, 8x16-B core matrices 128 B apart
// (DeepGEMM make_sf_desc: SBO = 128, LBO = 0).
constexpr uint32_t kSfUtccpHi = smem_desc_hi(128, SmemLayout::NONE);
static_assert(kSfUtccpHi == 0x00004008u, "UTCCP scale-factor descriptor hi");

// Advance along K inside the swizzle atom: add bytes/16 to the low word only (DescriptorIterator,
// TRA:314-337). One instruction consumes 256 bits of K = 32 bytes for every kind we use.
constexpr uint32_t kUmmaKBytes = 32;
constexpr uint32_t kDescKStep = kUmmaKBytes / 16;
static_assert(kDescKStep == 2, "UMMA K advance: +2 per k-block (protocol §2)");

FUSEGEMM_DEVICE uint64_t make_smem_desc(uint32_t smem_addr, uint32_t hi, uint32_t lbo_bytes) {
  return (uint64_t(hi) << 32) | smem_desc_lo(smem_addr, lbo_bytes);
}

// ---------------------------------------------------------------------------------------------
// tcgen05.mma issue (single thread). `accumulate` false on the first k-block of a tile
// (protocol bug #14: the predicate must reset per tile).
// ---------------------------------------------------------------------------------------------

enum class MmaKind { F16, MXF8F6F4, MXF4, MXF4NVF4 };

template <int kCtaGroup>
FUSEGEMM_DEVICE void mma_f16(uint32_t tmem_d, uint64_t desc_a, uint64_t desc_b, uint32_t idesc,
                             bool accumulate) {
  static_assert(kCtaGroup == 1 || kCtaGroup == 2, "cta_group is 1 or 2");
  uint32_t acc = accumulate ? 1u : 0u;
  if constexpr (kCtaGroup == 1) {
    asm volatile(
        "{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %4, 0;\n\t"
        "tcgen05.mma.cta_group::1.kind::f16 [%0], %1, %2, %3, p;\n\t}\n"
        :: "r"(tmem_d), "l"(desc_a), "l"(desc_b), "r"(idesc), "r"(acc));
  } else {
    asm volatile(
        "{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %4, 0;\n\t"
        "tcgen05.mma.cta_group::2.kind::f16 [%0], %1, %2, %3, p;\n\t}\n"
        :: "r"(tmem_d), "l"(desc_a), "l"(desc_b), "r"(idesc), "r"(acc));
  }
}

// Block-scaled MMA; tsfa/tsfb are TMEM column addresses of the scale factors (UMMA:1017).
// Spellings as CUTLASS SM100_MMA_MXF8F6F4_SS / SM100_MMA_MXF4_SS (CUDA >= 12.9 `.blockN`).
template <int kCtaGroup, MmaKind kKind>
FUSEGEMM_DEVICE void mma_block_scaled(uint32_t tmem_d, uint64_t desc_a, uint64_t desc_b,
                                      uint32_t idesc, bool accumulate, uint32_t tsfa,
                                      uint32_t tsfb) {
  static_assert(kKind != MmaKind::F16, "use mma_f16");
  uint32_t acc = accumulate ? 1u : 0u;
#define FUSEGEMM_BS_MMA(STR)                                                                \
  asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %4, 0;\n\t" STR                         \
               " [%0], %1, %2, %3, [%5], [%6], p;\n\t}\n" ::"r"(tmem_d),                    \
               "l"(desc_a), "l"(desc_b), "r"(idesc), "r"(acc), "r"(tsfa), "r"(tsfb))
  if constexpr (kCtaGroup == 1) {
    if constexpr (kKind == MmaKind::MXF8F6F4) FUSEGEMM_BS_MMA("tcgen05.mma.cta_group::1.kind::mxf8f6f4.block_scale");
    if constexpr (kKind == MmaKind::MXF4) FUSEGEMM_BS_MMA("tcgen05.mma.cta_group::1.kind::mxf4.block_scale.block32");
    if constexpr (kKind == MmaKind::MXF4NVF4) FUSEGEMM_BS_MMA("tcgen05.mma.cta_group::1.kind::mxf4nvf4.block_scale.block16");
  } else {
    if constexpr (kKind == MmaKind::MXF8F6F4) FUSEGEMM_BS_MMA("tcgen05.mma.cta_group::2.kind::mxf8f6f4.block_scale");
    if constexpr (kKind == MmaKind::MXF4) FUSEGEMM_BS_MMA("tcgen05.mma.cta_group::2.kind::mxf4.block_scale.block32");
    if constexpr (kKind == MmaKind::MXF4NVF4) FUSEGEMM_BS_MMA("tcgen05.mma.cta_group::2.kind::mxf4nvf4.block_scale.block16");
  }
#undef FUSEGEMM_BS_MMA
}

// tcgen05.commit: arrive once on an mbarrier when this thread's prior tcgen05 ops complete
// (BAR:762-860). `mask` selects the CTAs of the cluster whose barrier at the same smem offset
// receives the arrival (multicast); commit is an implicit tcgen05.fence::before_thread_sync.
template <int kCtaGroup>
FUSEGEMM_DEVICE void umma_commit(uint32_t bar_addr) {
  if constexpr (kCtaGroup == 1) {
    asm volatile("tcgen05.commit.cta_group::1.mbarrier::arrive::one.shared::cluster.b64 [%0];"
                 :: "r"(bar_addr) : "memory");
  } else {
    asm volatile("tcgen05.commit.cta_group::2.mbarrier::arrive::one.shared::cluster.b64 [%0];"
                 :: "r"(bar_addr) : "memory");
  }
}
template <int kCtaGroup>
FUSEGEMM_DEVICE void umma_commit_multicast(uint32_t bar_addr, uint16_t mask) {
  if constexpr (kCtaGroup == 1) {
    asm volatile("tcgen05.commit.cta_group::1.mbarrier::arrive::one.shared::cluster.multicast::cluster.b64 [%0], %1;"
                 :: "r"(bar_addr), "h"(mask) : "memory");
  } else {
    asm volatile("tcgen05.commit.cta_group::2.mbarrier::arrive::one.shared::cluster.multicast::cluster.b64 [%0], %1;"
                 :: "r"(bar_addr), "h"(mask) : "memory");
  }
}

// UTCCP: one 512-B scale-factor atom (32 lanes x 128 bit) broadcast to the 4 TMEM
// subpartitions: lane r%32, columns [col, col+4) (copy_sm100.hpp SM100_UTCCP_4x32dp128bit_*).
// Issued by the MMA thread just before the k-tile's MMAs; cp and mma execute in order.
template <int kCtaGroup>
FUSEGEMM_DEVICE void utccp_sf_atom(uint64_t src_desc, uint32_t tmem_col) {
  if constexpr (kCtaGroup == 1) {
    asm volatile("tcgen05.cp.cta_group::1.32x128b.warpx4 [%0], %1;" :: "r"(tmem_col), "l"(src_desc));
  } else {
    asm volatile("tcgen05.cp.cta_group::2.32x128b.warpx4 [%0], %1;" :: "r"(tmem_col), "l"(src_desc));
  }
}

}  // namespace fusegemm::sm100
