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
// does gather_copy_sw128, so the WGMMA descriptors read the stage as they read a TMA-loaded one.
//
// Completion (fusegemm/sm90/grouped_gemm.cuh, FUSEGEMM_SM90_GATHER_LAG): each lane commits a
// stage's copies as one group and publishes the stage one stage later (waits for the group,
// fence.proxy.async so that WGMMA's async proxy sees the generic-proxy writes, arrives on the
// stage's full barrier: 32 arrivals per copying warp besides TMA's one); or arrives at once through
// cp.async.mbarrier.arrive.noinc and the consumers fence after their full wait. (One arrival per
// warp after __syncwarp instead ran within the noise of this, H200, 2026-12-04: kept simple.)
#pragma once

#include "fusegemm/tma.cuh"

namespace fusegemm {

// One arrival on `bar` once every cp.async this thread issued before it has landed.
FUSEGEMM_DEVICE void cp_async_arrive_noinc(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}

// cp_async_16_zfill, cp_async_commit and the waits: fusegemm/common.cuh.

// A gathered operand: row r of the problem is row index(r) of a row-major (rows x width)
// matrix of 2-byte elements with `ld` elements per row (a multiple of 8: 16-byte rows). Rows
// outside [0, rows) and columns at or past `width` read zeros, so no index value can fault. The
// host keeps rows * ld * 2 / 16 below 2^32 (GatherRows' 32-bit offsets).
struct GatherSource {
  const unsigned char* base;
  long long ld_bytes;
  int rows;
  int width;   // elements per row that exist
};

// A warp's share of gathered rows, 4 * kCopies rows of 128 bytes (64 elements) per 64-column
// chunk: warp instruction i covers share rows 4 i .. 4 i + 3, lane l copying 16-byte piece l % 8 of
// row 4 i + l / 8 (eight lanes per row: each instruction reads four whole cache lines). The lane
// holds, per copy, its piece's source offset in 16-byte units, computed once from the index: a
// copy is then a multiply-add (its address) and the cp.async, and the further 64-column chunks of
// the same rows take immediate offsets. (Shuffling each row's index to its lanes and forming a
// 64-bit address per copy took about 12 instructions per cp.async: H200, 2026-12-04, Nsight
// Compute on the routed dsv3 layer's fc1, the four copying warps issued without pause while the
// consumers waited on the stages' full barriers for most of their time, 0.69x the speed of the
// same kernel on pre-permuted rows; with the offsets 0.91-0.94x, bench/results/gathered_h200_offsets.json.)
template <int kCopies>
struct GatherRows {
  uint32_t off[kCopies];   // the piece's offset from the source's base, 16-byte units
  uint32_t valid;          // bit i: copy i's row exists (else zeros); one register for the tile
  int next[kCopies];       // fetched indices that resolve() turns into offsets

  // Fetch rows index[row0 + 4 i + l / 8]; share rows at or past `rows_left` read zeros. (A fetch
  // ahead of the copies that need it hides the index load's latency: the K-grouped kernels fetch
  // the next k-block's rows while this one's copies issue.)
  FUSEGEMM_DEVICE void fetch(const int* index, int row0, int rows_left, int lane) {
#pragma unroll
    for (int i = 0; i < kCopies; ++i) {
      const int r = 4 * i + (lane >> 3);
      next[i] = r < rows_left ? __ldg(index + row0 + r) : -1;
    }
  }
  // The fetched rows' offsets into `s` (an index outside its rows: zeros).
  FUSEGEMM_DEVICE void resolve(const GatherSource& s, int lane) {
    const uint32_t ld16 = static_cast<uint32_t>(s.ld_bytes >> 4);
    uint32_t mask = 0;
#pragma unroll
    for (int i = 0; i < kCopies; ++i) {
      const bool ok = static_cast<unsigned>(next[i]) < static_cast<unsigned>(s.rows);
      off[i] = (ok ? static_cast<uint32_t>(next[i]) * ld16 : 0u) + static_cast<uint32_t>(lane & 7);
      mask |= ok ? 1u << i : 0u;
    }
    // (Opaque to the optimizer: it would otherwise test each copy's row against s.rows again and
    // keep every fetched index live beside its offset, past the producer's registers.)
    asm("mov.b32 %0, %1;" : "=r"(valid) : "r"(mask));
  }
  FUSEGEMM_DEVICE bool ok(int i) const { return (valid & (1u << i)) != 0; }
  FUSEGEMM_DEVICE void load(const GatherSource& s, const int* index, int row0, int rows_left, int lane) {
    fetch(index, row0, rows_left, lane);
    resolve(s, lane);
  }
};

// A copying lane's stages not yet published, the oldest first (the sm_90a BF16 and blockwise
// kernels' gathered producers, the sm_100a block-scaled kernel's scale copies): issued() commits a
// stage's cp.async copies as one group and publishes the stage kLag stages later (its copies
// landed, fence.proxy.async so that the async proxy's readers, WGMMA or UTCCP, see them, this
// lane's arrival on its full barrier); flush() publishes the rest at the end.
template <int kStages, int kLag>
struct GatherPublisher {
  static_assert(kLag >= 1, "a lag of at least one stage (kLag 0: cp_async_arrive_noinc per copy instead)");
  int pending = 0, oldest = 0;

  FUSEGEMM_DEVICE void issued(int stage, uint64_t* full) {
    cp_async_commit();
    if (pending++ == 0) oldest = stage;
    if (pending > kLag) {
      cp_async_wait_all_but<kLag>();
      fence_async_shared();
      mbar_arrive(&full[oldest]);
      if (++oldest == kStages) oldest = 0;
      --pending;
    }
  }
  FUSEGEMM_DEVICE void flush(uint64_t* full) {
    if (pending == 0) return;
    cp_async_wait_all();
    fence_async_shared();
    for (; pending > 0; --pending) {
      mbar_arrive(&full[oldest]);
      if (++oldest == kStages) oldest = 0;
    }
  }
};

// MX scale atoms (fusegemm/formats/scales.py pack_sf: 32x4x4 bytes, 128 rows x 4 scales of 32 K
// each): row r's four scales of k-atom ka are one 4-byte word, word (r / 128 * k_atoms + ka) * 128 +
// (r % 32) * 4 + (r % 128) / 32 of the buffer, where k_atoms = ceil(ceil(K / 32) / 4);
// `atom_pitch` is k_atoms * 128 words (Params::sfa_gather_ld). A row's word inside its atom:
constexpr uint32_t sf_atom_word(int r) { return uint32_t((r % 32) * 4 + (r % 128) / 32); }
constexpr uint32_t sf_atom_word(int r, int k_atom, uint32_t atom_pitch) {
  return uint32_t(r / 128) * atom_pitch + uint32_t(k_atom) * 128u + sf_atom_word(r);
}

// A copying lane's four gathered rows' MX scales (the sm_100a block-scaled kernel's gathered A:
// the rows its TMA gather4 loads): each k-atom's four scales of a row are one 4-byte cp.async
// from the token's word in a token-major atom buffer into the row's word of the stage's atom (a
// row outside the source: zeros, whose E8M0 2^-127 meets the zero row the map reads there).
struct GatherSfRows {
  uint32_t word[4];   // the rows' k-atom 0 words in the source
  uint32_t valid;     // bit j: row j exists

  // Rows `tokens` (an index outside [0, rows): zeros) of a buffer with `atom_pitch` words per
  // 128 rows.
  FUSEGEMM_DEVICE void resolve(const int (&tokens)[4], int rows, uint32_t atom_pitch) {
    uint32_t mask = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const bool ok = static_cast<unsigned>(tokens[j]) < static_cast<unsigned>(rows);
      word[j] = ok ? sf_atom_word(tokens[j], 0, atom_pitch) : 0u;
      mask |= ok ? 1u << j : 0u;
    }
    valid = mask;
  }
  // k-atom `ka` of the four rows into the atom at `atom` (shared memory), as rows r0 .. r0 + 3 of
  // it (r0 a multiple of 4: the rows share r / 32 and take consecutive r % 32).
  FUSEGEMM_DEVICE void copy(uint32_t atom, const uint32_t* src, int ka, int r0) const {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      cp_async_4_zfill(atom + 4 * sf_atom_word(r0 + j), src + word[j] + uint32_t(ka) * 128u, (valid >> j) & 1u);
    }
  }
};

// The copies of gather_copy_sw128 (below): copy i's row, chunk c from its piece's source at
// `base` + offset into its destination, with the row's validity and (kWhole false) chunk c's bit
// of `cols`. (A template flag, not a run-time one: the whole-chunk loop keeps one predicate.)
template <bool kWhole, int kChunks, int kChunkBytes, int kCopies>
FUSEGEMM_DEVICE void gather_copies(uint32_t even, uint32_t odd, const uint4* base, const GatherRows<kCopies>& rows,
                                   uint32_t cols) {
#pragma unroll
  for (int i = 0; i < kCopies; ++i) {
    const uint4* src = base + rows.off[i];
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      cp_async_16_zfill((i % 2 ? odd : even) + 512 * i + kChunkBytes * c, src + 8 * c,
                        rows.ok(i) && (kWhole || (cols & (1u << c)) != 0));
    }
  }
}

// The share's kChunks chunks of 64 columns from col0 (chunk c from column col0 + 64 c, kChunkBytes
// apart in the stage) into the SW128 stage rows at `dst` (the share's first row, a whole 8-row
// atom): TMA places 16-byte piece p of row r at piece p ^ (r % 8), and row 4 i + q has r % 8 =
// 4 (i % 2) + q, so a lane's destinations are two offsets plus immediates.
template <int kChunks, int kChunkBytes, int kCopies>
FUSEGEMM_DEVICE void gather_copy_sw128(uint8_t* dst, const GatherSource& s, const GatherRows<kCopies>& rows, int col0,
                                       int lane) {
  const int q = lane >> 3, piece = lane & 7;
  const uint4* base = reinterpret_cast<const uint4*>(s.base + col0 * 2ll);
  const uint32_t row = smem_u32(dst) + q * 128;
  const uint32_t even = row + ((piece ^ q) << 4), odd = row + ((piece ^ (q + 4)) << 4);
  // Row by row (one 64-bit address live at a time), its chunks at immediate offsets. Several
  // chunks inside the rows take the rows' validity alone (one chunk: one path, fewer registers).
  if (kChunks > 1 && col0 + 64 * kChunks <= s.width) {
    gather_copies<true, kChunks, kChunkBytes>(even, odd, base, rows, 0u);
  } else {
    // Widths are multiples of 8 (16-byte rows): a piece is all there or all past the end.
    uint32_t cols = 0;   // bit c: chunk c's piece exists
#pragma unroll
    for (int c = 0; c < kChunks; ++c) cols |= col0 + 64 * c + piece * 8 < s.width ? 1u << c : 0u;
    gather_copies<false, kChunks, kChunkBytes>(even, odd, base, rows, cols);
  }
}

}  // namespace fusegemm
