// Tile scheduler over padded_offsets, shared by the sm_90a and sm_100a kernels.
//
// Rows of all experts are concatenated; expert e owns rows [offsets[e-1], offsets[e]).
// Every offset is a multiple of 256 and TILE_M divides 256, so an M tile never spans two
// experts, and an empty expert owns no tile: it costs nothing. The linear tile space is
// (valid_m / TILE_M) x ceil(N / TILE_N), rasterised in bands of kGroupM M-blocks (N-blocks
// iterate inside a band) so that concurrently running CTAs share A rows and B columns in L2.
//
// Static persistent scheduling: CTA c runs tiles c, c + grid, c + 2*grid, ... (every role of
// a warp-specialised kernel walks the same sequence, so no scheduler pipeline is needed).
// Dynamic scheduling: tiles are claimed with atomicAdd on a per-call counter that the host
// zeroes before the launch; the claiming thread broadcasts through shared memory.
#pragma once

#include "fusegemm/common.cuh"

// sm_90a kernels: M-blocks per rasterisation band of the tile order (below). A macro so that
// tuning runs can compare bands through FUSEGEMM_NVRTC_EXTRA without a new template axis.
// H200, same-process A/B (bench --configs ...:g8): 16 was 1-2% faster than 8 on
// mixtral-fc1 and dsv3-fc2 (the concurrent B working set of a band fits L2 better), equal
// elsewhere; 4 was no better.
#ifndef FUSEGEMM_RASTER_GROUP
#define FUSEGEMM_RASTER_GROUP 16
#endif

namespace fusegemm {

struct GroupedTile {
  int expert;     // owning expert
  int m_block;    // global M block (row0 = m_block * TILE_M)
  int n_block;    // N block (col0 = n_block * TILE_N)
  int linear;     // linear tile id
  FUSEGEMM_DEVICE bool valid() const { return linear >= 0; }
};

template <int TILE_M, int TILE_N, int kGroupM = 8>
struct GroupedScheduler {
  static_assert(kMAligned % TILE_M == 0, "TILE_M must divide the 256-row expert padding");

  const int* offsets;   // device padded_offsets, int32 (L,)
  int num_experts;
  int m_blocks;         // valid_m / TILE_M, valid_m = min(offsets[L-1], m_rows)
  int n_blocks;

  // m_rows: the rows A, C and D were allocated with (the host checked them). padded_offsets
  // values live on the device and are unchecked unless FUSEGEMM_VALIDATE_OFFSETS is set, so a
  // last offset past the allocation is clamped here: tiles never reach rows that do not exist
  // (wrong offsets give wrong results, never an out-of-bounds store).
  FUSEGEMM_DEVICE GroupedScheduler(const int* offsets_, int num_experts_, int n, int m_rows)
      : offsets(offsets_), num_experts(num_experts_), n_blocks((n + TILE_N - 1) / TILE_N) {
    int valid_m = num_experts_ > 0 ? __ldg(offsets_ + num_experts_ - 1) : 0;
    valid_m = min(valid_m, m_rows);
    m_blocks = valid_m > 0 ? valid_m / TILE_M : 0;
  }

  FUSEGEMM_DEVICE int num_tiles() const { return m_blocks * n_blocks; }

  // Expert owning global row `row`: the first e with offsets[e] > row (binary search, L <= 1024).
  FUSEGEMM_DEVICE int expert_of_row(int row) const {
    int lo = 0, hi = num_experts - 1;
    while (lo < hi) {
      int mid = (lo + hi) >> 1;
      if (__ldg(offsets + mid) > row) hi = mid; else lo = mid + 1;
    }
    return lo;
  }

  FUSEGEMM_DEVICE int expert_begin(int e) const { return e == 0 ? 0 : __ldg(offsets + e - 1); }
  FUSEGEMM_DEVICE int expert_end(int e) const { return __ldg(offsets + e); }

  FUSEGEMM_DEVICE GroupedTile tile(int linear) const {
    GroupedTile t{-1, 0, 0, -1};
    if (linear < 0 || linear >= num_tiles()) return t;
    int band = linear / (kGroupM * n_blocks);
    int first_m = band * kGroupM;
    int band_rows = min(kGroupM, m_blocks - first_m);
    int local = linear - band * kGroupM * n_blocks;
    t.m_block = first_m + local % band_rows;
    t.n_block = local / band_rows;
    t.expert = expert_of_row(t.m_block * TILE_M);
    t.linear = linear;
    return t;
  }
};

// Batched dense tile space (seed 004: L batches of M x N): ceil(M / TILE_M) x ceil(N / TILE_N)
// tiles per batch, batch-major, each batch rasterised in bands of kGroupM M-blocks as above.
// GroupedTile.expert is the batch and m_block counts within it (rows past M are TMA-filled
// zeros and never stored).
template <int TILE_M, int TILE_N, int kGroupM = 8>
struct BatchedScheduler {
  int batches;
  int m_blocks;   // per batch
  int n_blocks;

  FUSEGEMM_DEVICE BatchedScheduler(int m, int n, int batches_)
      : batches(batches_), m_blocks((m + TILE_M - 1) / TILE_M), n_blocks((n + TILE_N - 1) / TILE_N) {}

  FUSEGEMM_DEVICE int num_tiles() const { return batches * m_blocks * n_blocks; }

  FUSEGEMM_DEVICE GroupedTile tile(int linear) const {
    GroupedTile t{-1, 0, 0, -1};
    if (linear < 0 || linear >= num_tiles()) return t;
    const int per_batch = m_blocks * n_blocks;
    t.expert = linear / per_batch;
    const int rest = linear - t.expert * per_batch;
    const int band = rest / (kGroupM * n_blocks);
    const int first_m = band * kGroupM;
    const int band_rows = min(kGroupM, m_blocks - first_m);
    const int local = rest - band * kGroupM * n_blocks;
    t.m_block = first_m + local % band_rows;
    t.n_block = local / band_rows;
    t.linear = linear;
    return t;
  }
};

// Row ends (the ops' row_ends=, optional: null reads as absent): row_ends[e] is where expert
// e's tokens end inside its padded range [offsets[e-1], offsets[e]); the rows after it are the
// 256-row padding, zero in an MoE layer. An M tile that starts at or past its expert's row end
// holds no token: the sm_90a kernels skip it (no loads, no MMA, no store; the op zero-filled its
// rows before the launch). With 32 experts of about 1024 tokens each, padding is 12% of the rows.
template <int TILE_M>
FUSEGEMM_DEVICE bool tile_past_row_end(const int* row_ends, const GroupedTile& t) {
  return row_ends != nullptr && t.valid() && t.m_block * TILE_M >= __ldg(row_ends + t.expert);
}

// K-grouped problems (weight gradients dW_e = dY_e^T X_e, shared by the sm_90a and sm_100a
// kernels): the K range of expert e is its token rows [offsets[e-1], offsets[e]), clamped to the
// k rows the operands were allocated with (offsets live on the device and are unchecked: wrong
// ones give wrong results, never an out-of-bounds load), and with row ends to the k-blocks that
// hold a token (the rows after the row end in the last one are padding, zero by the ops'
// contract). Returns (first row, k-blocks of kBlockK rows); an expert without tokens has none
// (its tiles store alpha * 0).
template <int kBlockK>
FUSEGEMM_DEVICE int2 kgrouped_k_range(const int* offsets, const int* row_ends, int expert, int k) {
  const int begin = min(expert == 0 ? 0 : __ldg(offsets + expert - 1), k);
  int end = min(__ldg(offsets + expert), k);
  if (row_ends != nullptr) {
    const int tokens = max(__ldg(row_ends + expert) - begin, 0);
    end = min(end, begin + (tokens + kBlockK - 1) / kBlockK * kBlockK);
  }
  return make_int2(begin, end > begin ? (end - begin) / kBlockK : 0);
}

// Static persistent walk: first tile of this CTA, then stride by the grid.
struct StaticWalk {
  int next;
  int stride;
  FUSEGEMM_DEVICE StaticWalk(int cta, int grid) : next(cta), stride(grid) {}
  FUSEGEMM_DEVICE int claim() { int t = next; next += stride; return t; }
};

// Dynamic walk: one thread claims from the global counter. Callers broadcast the result to
// the other roles themselves (through shared memory and a barrier they already own).
FUSEGEMM_DEVICE int dynamic_claim(unsigned int* counter) {
  return static_cast<int>(atomicAdd(counter, 1u));
}

}  // namespace fusegemm
