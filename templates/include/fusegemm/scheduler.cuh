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
// 1: the bands restart at each expert's first M block (expert-major order: a band never holds
// two experts' rows, so the CTAs running at once read one expert's B, and each expert's B is
// read once per band of its own); 0: bands over the concatenated blocks of all experts (a band
// that straddles two experts streams both experts' B through L2 at once). Same tiles, same
// bits, another order. The walks of GroupedScheduler and CompactedScheduler (kernels without
// clusters); the cluster walks (cluster.cuh) keep theirs. Measured on an H100 (2026-12-05,
// bench/pingpong.py --also, the MoE layers' routed shapes, 3 interleaved rounds, same run;
// bench/results/pingpong_h100_raster_expert.json): the fused kernels gain at the cooperative
// tile (SwiGLU with C 1.04-1.06x, dSwiGLU 1.02-1.04x) but the plain GEMMs of the same layers lose
// (0.93-0.97x; 64-row ping-pong tiles 0.87-1.07x, the K-grouped weight gradient 0.99x); the
// graphed layer in two processes, mixtral 14.55 -> 13.98 ms, dsv3 with 32 experts 14.85 -> 15.15.
// So it stays off, an A/B switch through FUSEGEMM_NVRTC_EXTRA.
#ifndef FUSEGEMM_RASTER_EXPERT
#define FUSEGEMM_RASTER_EXPERT 0
#endif

namespace fusegemm {

// Block `block` of a bm_blocks x bn_blocks grid rasterised in bands of `band` block rows (N
// blocks iterate inside a band; the last band may be shorter): (M block, N block). GroupedScheduler
// walks its tiles with it (a block is one tile), the cluster walks (cluster.cuh) their blocks, the
// expert-major walks (FUSEGEMM_RASTER_EXPERT) each expert's own grid.
struct BlockCoord {
  int bm, bn;  // block position in the (M blocks x N blocks) grid
};
constexpr BlockCoord grouped_block_coord(int block, int bm_blocks, int bn_blocks, int band) {
  const int b = block / (band * bn_blocks), first = b * band;
  const int rows = bm_blocks - first < band ? bm_blocks - first : band;
  const int local = block - b * band * bn_blocks;
  return BlockCoord{first + local % rows, local / rows};
}
static_assert(grouped_block_coord(0, 20, 3, 16).bm == 0 && grouped_block_coord(1, 20, 3, 16).bm == 1 &&
                  grouped_block_coord(16, 20, 3, 16).bn == 1 && grouped_block_coord(48, 20, 3, 16).bm == 16 &&
                  grouped_block_coord(51, 20, 3, 16).bm == 19 && grouped_block_coord(52, 20, 3, 16).bm == 16 &&
                  grouped_block_coord(52, 20, 3, 16).bn == 1,
              "20 x 3 blocks in bands of 16: a band of 16 rows, then one of 4");

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

  FUSEGEMM_DEVICE int expert_begin(int e) const { return expert_first_row(offsets, e); }
  FUSEGEMM_DEVICE int expert_end(int e) const { return __ldg(offsets + e); }

  // kBounded false: the caller's walk yields tiles below num_tiles() or -1 only (the stream-K
  // walk: a test fewer, and two fewer registers in the producer that calls it).
  template <bool kBounded = true>
  FUSEGEMM_DEVICE GroupedTile tile(int linear) const {
    GroupedTile t{-1, 0, 0, -1};
    if (linear < 0 || (kBounded && linear >= num_tiles())) return t;
    if constexpr (FUSEGEMM_RASTER_EXPERT) {
      // Expert-major: every expert owns n_blocks tiles per M block, so linear / n_blocks is an
      // M block of the tile's expert, and the expert's tiles are banded among themselves.
      const int gb = linear / n_blocks;
      const int e = expert_of_row(gb * TILE_M);
      const int first = expert_first_row(offsets, e) / TILE_M;
      const int last = min(__ldg(offsets + e) / TILE_M, m_blocks);
      if (first <= gb && gb < last) {   // (else offsets out of order: the walk below)
        // (local < (last - first) * n_blocks: every band it reaches has a row)
        const BlockCoord c = grouped_block_coord(linear - first * n_blocks, last - first, n_blocks, kGroupM);
        t.m_block = first + c.bm;
        t.n_block = c.bn;
        t.expert = e;
        t.linear = linear;
        return t;
      }
    }
    const BlockCoord c = grouped_block_coord(linear, m_blocks, n_blocks, kGroupM);
    t.m_block = c.bm;
    t.n_block = c.bn;
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
// 256-row padding, zero in an MoE layer (with 32 experts of about 1024 tokens each, 12% of the
// rows). An M block that starts at or past its expert's row end holds no token. The sm_90a
// M-grouped kernels walk a compacted tile space without those blocks (the op zero-filled their
// rows before the launch): the blocks that hold a token, expert after expert, rasterised in
// bands as GroupedScheduler's. Skipping the blocks inside GroupedScheduler's walk instead was
// slower than computing them (H200, bench/moe_layer.py --also routed: fc1 2.97 -> 3.60 ms at
// dsv3 with 32 experts), most likely because a CTA that skips runs ahead of the others into
// later bands, where the tiles running at once no longer share their A rows and B columns in L2.
//
// The expert of a compacted block: a cursor per walker (the producer's lanes) from the expert of
// its band's first block, scanning forward; walks claim tiles in increasing order (static and
// dynamic), so each band's cursor starts where the previous one stopped and a lookup scans
// about one expert.
template <int TILE_M, int TILE_N, int kGroupM = 8>
struct CompactedScheduler {
  using Grouped = GroupedScheduler<TILE_M, TILE_N, kGroupM>;
  Grouped g;           // the problem's full tile space (its m_blocks: the valid blocks)
  const int* row_ends; // null: g's tile space
  int m_blocks;        // blocks that hold a token, over all experts (count())
  int band_e = 0;      // cursor: the expert holding (or after) the first block of the band
  int band_p = 0;      // last looked up, and the compacted blocks before that expert

  // (first global M block, blocks holding a token) of expert e, clamped to the valid blocks
  // (offsets and row ends live on the device and are unchecked: wrong ones give wrong results,
  // never a block outside the allocation).
  FUSEGEMM_DEVICE static int2 span(const int* offsets, const int* row_ends, int valid_blocks, int e) {
    const int valid_m = valid_blocks * TILE_M;
    const int lo = min(max(expert_first_row(offsets, e), 0), valid_m);
    const int hi = min(min(__ldg(offsets + e), __ldg(row_ends + e)), valid_m);
    const int first = lo / TILE_M;
    return make_int2(first, max((hi + TILE_M - 1) / TILE_M - first, 0));
  }
  FUSEGEMM_DEVICE int2 span(int e) const { return span(g.offsets, row_ends, g.m_blocks, e); }

  // The blocks that hold a token, summed over the experts by the 32 lanes of a warp (every lane
  // calls it and gets the sum).
  FUSEGEMM_DEVICE static int count(const Grouped& g, const int* row_ends) {
    const int lane = threadIdx.x % 32;
    int sum = 0;
    for (int e = lane; e < g.num_experts; e += 32) sum += span(g.offsets, row_ends, g.m_blocks, e).y;
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, d);
    return sum;
  }

  // row_ends_ null: the grouped walk itself; else blocks is count()'s value.
  FUSEGEMM_DEVICE CompactedScheduler(const Grouped& grouped, const int* row_ends_, int blocks)
      : g(grouped), row_ends(row_ends_), m_blocks(blocks) {}

  FUSEGEMM_DEVICE int num_tiles() const { return row_ends == nullptr ? g.num_tiles() : m_blocks * g.n_blocks; }

  // The cursor moved forward to the expert holding compacted block `block` (the last expert if
  // none does), from the first expert when `block` lies before it (a walk that went back starts
  // over): band_e and band_p are then that expert and the compacted blocks before it; returns
  // its span.
  FUSEGEMM_DEVICE int2 seek(int block) {
    if (block < band_p) {
      band_e = 0;
      band_p = 0;
    }
    int2 s = span(band_e);
    while (band_e + 1 < g.num_experts && block >= band_p + s.y) {
      band_p += s.y;
      s = span(++band_e);
    }
    return s;
  }

  template <bool kBounded = true>   // (GroupedScheduler::tile's)
  FUSEGEMM_DEVICE GroupedTile tile(int linear) {
    if (row_ends == nullptr) return g.template tile<kBounded>(linear);
    GroupedTile t{-1, 0, 0, -1};
    const int n_blocks = g.n_blocks;
    if (linear < 0 || (kBounded && linear >= m_blocks * n_blocks)) return t;
    if constexpr (FUSEGEMM_RASTER_EXPERT) {
      // Expert-major (GroupedScheduler::tile's): linear / n_blocks is a compacted block of the
      // tile's expert; the cursor holds that expert and the compacted blocks before it.
      const int cb = linear / n_blocks;
      const int2 s = seek(cb);
      if (cb >= band_p + s.y) return t;   // (past count()'s blocks: unreachable on a bounded walk)
      const BlockCoord c = grouped_block_coord(linear - band_p * n_blocks, s.y, n_blocks, kGroupM);
      t.expert = band_e;
      t.m_block = s.x + c.bm;
      t.n_block = c.bn;
      t.linear = linear;
      return t;
    }
    // (grouped_block_coord's raster, written out: the cursor starts from the band's first block,
    // which the formula has at hand; deriving it from the coordinate changed the kernels' SASS.)
    const int b = linear / (kGroupM * n_blocks);
    const int first_m = b * kGroupM;
    const int band_rows = min(kGroupM, m_blocks - first_m);
    const int local = linear - b * kGroupM * n_blocks;
    const int cm = first_m + local % band_rows;   // compacted block
    t.n_block = local / band_rows;
    int2 s = seek(first_m);
    int e = band_e, before = band_p;
    while (e + 1 < g.num_experts && cm >= before + s.y) {
      before += s.y;
      s = span(++e);
    }
    t.expert = e;
    t.m_block = s.x + (cm - before);
    t.linear = linear;
    return t;
  }
};

// K-grouped problems (weight gradients dW_e = dY_e^T X_e, shared by the sm_90a and sm_100a
// kernels): the K range of expert e is its token rows [offsets[e-1], offsets[e]), clamped to the
// k rows the operands were allocated with (offsets live on the device and are unchecked: wrong
// ones give wrong results, never an out-of-bounds load), and with row ends to the k-blocks that
// hold a token (the rows after the row end in the last one are padding, zero by the ops'
// contract). Returns (first row, k-blocks of kBlockK rows); an expert without tokens has none
// (its tiles store alpha * 0).
template <int kBlockK>
FUSEGEMM_DEVICE int2 kgrouped_k_range(const int* offsets, const int* row_ends, int expert, int k) {
  const int begin = min(expert_first_row(offsets, expert), k);
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
