// Tensor memory (TMEM) for sm_100a: allocation, tcgen05 fences, accumulator loads.
//
// Protocol (sm100-protocol.md §1 "TMEM", §4, §5; CUTLASS cute/arch/tmem_allocator_sm100.hpp,
// KRN:557/727/783-803; DeepGEMM impls/sm100_*):
//  * one warp allocates a power-of-two number of columns (32..512) and writes the base address
//    to shared memory; every reader crosses a thread barrier bracketed by
//    tcgen05.fence::before_thread_sync / after_thread_sync before reading it;
//  * cta_group::2 (2-CTA MMA): both CTAs of the pair allocate from the same warp id to the same
//    smem offset, and only after a cluster barrier (KRN:614);
//  * epilogue warp w may only touch TMEM lanes 32*(w%4)..+31, so epilogue warps are
//    warpgroup-aligned; tcgen05.ld -> tcgen05.wait::ld -> fence::before_thread_sync -> release;
//  * dealloc after every tcgen05 op on the columns completed (a final barrier), same cta_group.
#pragma once

#include "fusegemm/common.cuh"

namespace fusegemm::sm100 {

constexpr int kTmemColumns = 512;  // 128 lanes x 512 columns x 32 bit per SM

// Smallest legal allocation (power of two, >= 32) holding `cols` columns.
constexpr int tmem_alloc_columns(int cols) {
  return cols <= 32 ? 32 : cols <= 64 ? 64 : cols <= 128 ? 128 : cols <= 256 ? 256 : 512;
}
static_assert(tmem_alloc_columns(272) == 512 && tmem_alloc_columns(256) == 256, "tmem rounding");

// TMEM address: lane in bits [31:16], column in [15:0].
FUSEGEMM_DEVICE constexpr uint32_t tmem_addr(uint32_t base, uint32_t lane, uint32_t col) {
  return base + (lane << 16) + col;
}

template <int kCtaGroup>
FUSEGEMM_DEVICE void tmem_alloc(uint32_t smem_dst_addr, uint32_t num_cols) {
  if constexpr (kCtaGroup == 1) {
    asm volatile("tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [%0], %1;"
                 :: "r"(smem_dst_addr), "r"(num_cols) : "memory");
  } else {
    asm volatile("tcgen05.alloc.cta_group::2.sync.aligned.shared::cta.b32 [%0], %1;"
                 :: "r"(smem_dst_addr), "r"(num_cols) : "memory");
  }
}

template <int kCtaGroup>
FUSEGEMM_DEVICE void tmem_relinquish() {
  if constexpr (kCtaGroup == 1) {
    asm volatile("tcgen05.relinquish_alloc_permit.cta_group::1.sync.aligned;" ::: "memory");
  } else {
    asm volatile("tcgen05.relinquish_alloc_permit.cta_group::2.sync.aligned;" ::: "memory");
  }
}

template <int kCtaGroup>
FUSEGEMM_DEVICE void tmem_dealloc(uint32_t base, uint32_t num_cols) {
  if constexpr (kCtaGroup == 1) {
    asm volatile("tcgen05.dealloc.cta_group::1.sync.aligned.b32 %0, %1;" :: "r"(base), "r"(num_cols) : "memory");
  } else {
    asm volatile("tcgen05.dealloc.cta_group::2.sync.aligned.b32 %0, %1;" :: "r"(base), "r"(num_cols) : "memory");
  }
}

// DeepGEMM places after_thread_sync after every mbarrier wait that precedes tcgen05 work and
// before_thread_sync before an arrive that releases TMEM (sm100-protocol.md §1 "Fences").
FUSEGEMM_DEVICE void tcgen05_fence_before() {
  asm volatile("tcgen05.fence::before_thread_sync;" ::: "memory");
}
FUSEGEMM_DEVICE void tcgen05_fence_after() {
  asm volatile("tcgen05.fence::after_thread_sync;" ::: "memory");
}
FUSEGEMM_DEVICE void tmem_wait_ld() { asm volatile("tcgen05.wait::ld.sync.aligned;" ::: "memory"); }

// 32 lanes x 32 bit, 16 / 32 consecutive columns: thread t of the warp gets columns
// [col, col+N) of lane (addr.lane + t) (copy_sm100.hpp SM100_TMEM_LOAD_32dp32b{16,32}x).
FUSEGEMM_DEVICE void tmem_ld_32x32b_x16(uint32_t taddr, uint32_t (&r)[16]) {
  asm volatile(
      "tcgen05.ld.sync.aligned.32x32b.x16.b32 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, "
      "%12, %13, %14, %15}, [%16];"
      : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]), "=r"(r[4]), "=r"(r[5]), "=r"(r[6]),
        "=r"(r[7]), "=r"(r[8]), "=r"(r[9]), "=r"(r[10]), "=r"(r[11]), "=r"(r[12]), "=r"(r[13]),
        "=r"(r[14]), "=r"(r[15])
      : "r"(taddr));
}

FUSEGEMM_DEVICE void tmem_ld_32x32b_x32(uint32_t taddr, uint32_t (&r)[32]) {
  asm volatile(
      "tcgen05.ld.sync.aligned.32x32b.x32.b32 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, "
      "%12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, "
      "%30, %31}, [%32];"
      : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]), "=r"(r[4]), "=r"(r[5]), "=r"(r[6]),
        "=r"(r[7]), "=r"(r[8]), "=r"(r[9]), "=r"(r[10]), "=r"(r[11]), "=r"(r[12]), "=r"(r[13]),
        "=r"(r[14]), "=r"(r[15]), "=r"(r[16]), "=r"(r[17]), "=r"(r[18]), "=r"(r[19]),
        "=r"(r[20]), "=r"(r[21]), "=r"(r[22]), "=r"(r[23]), "=r"(r[24]), "=r"(r[25]),
        "=r"(r[26]), "=r"(r[27]), "=r"(r[28]), "=r"(r[29]), "=r"(r[30]), "=r"(r[31])
      : "r"(taddr));
}

// Which TMEM lane holds accumulator row r of the CTA's tile (TRA:505-527):
// M=128 (and each CTA's half of M=256): lane r. 1-CTA M=64: lane (r%16) + 32*(r/16).
template <int kMmaMPerCta>
constexpr int acc_lane_of_row(int r) {
  return kMmaMPerCta == 64 ? (r % 16) + 32 * (r / 16) : r;
}
static_assert(acc_lane_of_row<64>(17) == 33 && acc_lane_of_row<128>(17) == 17, "acc lanes");

}  // namespace fusegemm::sm100
