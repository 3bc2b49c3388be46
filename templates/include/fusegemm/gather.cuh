// Gathered operand rows into a shared-memory stage with cp.async, for the grouped kernels'
// gathered modes (an MoE layer's token-major x or dy read through the routing's row index).
//
// Why not TMA: one TMA box per gathered row (1 row x 64 elements, 128 bytes) ran the sm_90a
// grouped GEMM at 0.18-0.21x the speed of the same kernel on pre-gathered rows on the H200
// (bench/gathered.py, 2026-12-03), and the K-grouped weight gradient at 0.09-0.11x: a stage took
// 128-384 boxes where the ungathered kernel issues 1-6, and the cost is per box. cp.async moves
// the same bytes as 16-byte requests from the producer warps (FUSEGEMM_SM90_GATHER_WARPS), eight
// lanes per 128-byte row, so each warp instruction reads four whole rows (cache lines).
//
// Layout: every destination is a 128-byte-swizzled (SW128) stage whose 1024-byte atoms hold 8
// rows of 128 bytes; TMA places 16-byte chunk c of row r at chunk c ^ (r % 8) of the row, and so
// does gather_rows_sw128, so the WGMMA descriptors read the stage as they read a TMA-loaded one.
//
// Completion (fusegemm/sm90/grouped_gemm.cuh, FUSEGEMM_SM90_GATHER_LAG): each lane commits a
// stage's copies as one group and publishes the stage one stage later (waits for the group,
// fence.proxy.async so that WGMMA's async proxy sees the generic-proxy writes, arrives on the
// stage's full barrier: 32 arrivals per copying warp besides TMA's one); or arrives at once through
// cp.async.mbarrier.arrive.noinc and the consumers fence after their full wait.
#pragma once

#include "fusegemm/tma.cuh"

namespace fusegemm {

// One arrival on `bar` once every cp.async this thread issued before it has landed.
FUSEGEMM_DEVICE void cp_async_arrive_noinc(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}

// cp_async_16_zfill, cp_async_commit and the waits: fusegemm/common.cuh.

// A gathered operand: row r of the problem is row index(r) of a row-major (rows x width)
// matrix of 2-byte elements with `ld` elements per row. Rows outside [0, rows) and columns at or
// past `width` read zeros, so no index value can fault.
struct GatherSource {
  const unsigned char* base;
  long long ld_bytes;
  int rows;
  int width;   // elements per row that exist
};

// kRows rows of 128 bytes (64 elements from column col0) into the SW128 stage `dst`, by the
// whole warp. Lane l holds the source rows of stage rows l + 32 j in src_row[j] (kRows / 32 of
// them); warp instruction i covers stage rows 4 i .. 4 i + 3, lane l taking 16-byte chunk l % 8
// of row 4 i + l / 8 (the row's source index travels by shuffle from the lane that holds it).
template <int kRows>
FUSEGEMM_DEVICE void gather_rows_sw128(uint8_t* dst, const GatherSource& s, const int (&src_row)[kRows / 32],
                                       int col0, int lane) {
  static_assert(kRows % 32 == 0, "whole warps of rows");
  const int chunk = lane & 7;
  const int col = col0 + chunk * 8;
  const bool col_ok = col < s.width;   // widths are multiples of 8 (16-byte rows): all or nothing
  const uint32_t base = smem_u32(dst);
#pragma unroll
  for (int j = 0; j < kRows / 32; ++j) {   // rows 32 j .. 32 j + 31: their indices are in src_row[j]
    const int mine = src_row[j];
    // Partly unrolled: a whole unroll lets the scheduler hoist every row's 64-bit address ahead
    // of the copies, more registers than the producer's setmaxnreg budget (local memory).
#pragma unroll 2
    for (int i = 0; i < 8; ++i) {
      const int r = 32 * j + 4 * i + (lane >> 3);
      const int src = __shfl_sync(0xffffffffu, mine, r & 31);
      const bool ok = col_ok && static_cast<unsigned>(src) < static_cast<unsigned>(s.rows);
      const unsigned char* g = s.base + (ok ? src * s.ld_bytes + col * 2ll : 0ll);
      cp_async_16_zfill(base + r * 128 + ((chunk ^ (r & 7)) << 4), g, ok);
    }
  }
}

}  // namespace fusegemm
