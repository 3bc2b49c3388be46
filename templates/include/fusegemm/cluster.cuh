// Cluster geometry, TMA-multicast roles and the cluster-block tile walk, shared by the sm_100a
// kernels and the sm_90a BF16 grouped kernel (whose MMA units are single CTAs: kCtaGroup 1).
//
// The cluster shape is a launch attribute, not a compile-time parameter: the host launches a
// 1-D grid with cluster dims (cluster_m * cluster_n, 1, 1) and passes (cluster_m, cluster_n) in
// the parameter struct. Rank r of the cluster is CTA (m, n) = (r % cluster_m, r / cluster_m);
// 2-CTA pairs (cta_group::2) are ranks (2i, 2i+1), i.e. neighbours along M.
//
// Multicast (CUTLASS sm100_mma_warpspecialized.hpp / sm100_blockscaled_mma_warpspecialized.hpp
// :787-790, create_tma_multicast_mask<2> for A and <1> for B; sm100-protocol.md §1, §3, §4):
//   * A is shared along cluster N: every CTA with the same m (same M tile and, for 2-CTA tiles,
//     the same half of the pair) multiplies the same A rows. SFA follows A.
//   * B is shared along cluster M: every CTA with the same n and the same pair half multiplies
//     the same B rows. SFB follows B.
//   * An operand box of a stage is loaded as kMcSlices (4) slices (the tensor maps' boxes are
//     slices, so they do not depend on the launch cluster; the sm_90a cluster kernel, whose
//     clusters are at most 2x2, loads 2 slices of a K-major box and an N-major B's 64-column
//     chunks, fusegemm/sm90/grouped_gemm.cuh); member j of a share group of g CTAs
//     loads the slices i with i % g == j and multicasts them to the group. Every member loads a
//     part of every stage, as CUTLASS's tma_partition of the box over the multicast CTAs does.
//     That is what makes the empty count below safe: a stage's full barrier then depends on the
//     empty barriers of every CTA of the unit's row and column, whose releases in turn come from
//     every unit of the cluster, so no unit can release round r+1 of a stage before every unit
//     released round r, and no empty barrier can count a release in the wrong phase. (One
//     issuer per k-block would break this: a unit that issues its own A and B could run a whole
//     ring ahead of a unit outside its row and column.) Scale factors (one 512-B atom per
//     k-atom, too small to slice) are loaded whole by member kb % g.
//   * Every CTA still expects its whole stage on its full barrier (the leader of a pair the bytes
//     of both CTAs): a stage receives A + B + SF bytes, whoever issued them.
//   * Empty barriers (PipelineTmaUmmaAsync, P100:565 and calculate_multicast_mask<kRowCol>,
//     P100:57-92): the MMA of an MMA unit (a CTA, or the leader of a pair) commits each consumed
//     stage to every CTA in its unit's row and column; each CTA's empty barrier therefore counts
//     cluster_m / cta_group + cluster_n - 1 arrivals, one per MMA unit that reads smem this CTA
//     may write. A producer that waited on its own empty barrier knows every CTA its multicast
//     reaches has released the stage.
//
// A zero or inconsistent (cluster_m, cluster_n) (an older host, or a product that differs from
// %cluster_nctarank) falls back to "pairs only": each CTA pair (or single CTA) is its own
// sub-cluster and nothing is multicast. This is the behaviour of the kernels before multicast.
#pragma once

#include "fusegemm/common.cuh"
#include "fusegemm/scheduler.cuh"

namespace fusegemm {

// ---- cluster special registers and the cluster barrier ------------------------------------
FUSEGEMM_DEVICE uint32_t cluster_cta_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
FUSEGEMM_DEVICE uint32_t cluster_num_ctas() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(r));
  return r;
}
// Linear cluster id in the grid and number of clusters.
FUSEGEMM_DEVICE uint32_t cluster_linear_id() {
  uint32_t x, y, z, nx, ny;
  asm volatile("mov.u32 %0, %%clusterid.x;" : "=r"(x));
  asm volatile("mov.u32 %0, %%clusterid.y;" : "=r"(y));
  asm volatile("mov.u32 %0, %%clusterid.z;" : "=r"(z));
  asm volatile("mov.u32 %0, %%nclusterid.x;" : "=r"(nx));
  asm volatile("mov.u32 %0, %%nclusterid.y;" : "=r"(ny));
  return x + nx * (y + ny * z);
}
FUSEGEMM_DEVICE uint32_t cluster_count() {
  uint32_t nx, ny, nz;
  asm volatile("mov.u32 %0, %%nclusterid.x;" : "=r"(nx));
  asm volatile("mov.u32 %0, %%nclusterid.y;" : "=r"(ny));
  asm volatile("mov.u32 %0, %%nclusterid.z;" : "=r"(nz));
  return nx * ny * nz;
}
FUSEGEMM_DEVICE uint32_t cta_linear_id() {
  return blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
}

// Full cluster barrier, all threads of every CTA (CUTLASS cluster_sync: arrive.release +
// wait.acquire; the release orders this thread's smem writes and remote arrivals before it).
FUSEGEMM_DEVICE void cluster_sync_all() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

constexpr int kMaxClusterCtas = 16;  // 16-bit multicast masks (non-portable cluster maximum)
constexpr int kMcSlices = 4;         // slices per operand box = largest share group

template <int kCtaGroup>
struct ClusterGeom {
  int cm = kCtaGroup;  // sub-cluster shape in CTAs along M ...
  int cn = 1;          // ... and along N
  int base = 0;        // hardware cluster rank of the sub-cluster's first CTA
  int mi = 0, ni = 0;  // this CTA's coordinates in the sub-cluster

  constexpr int size() const { return cm * cn; }
  constexpr int pm() const { return cm / kCtaGroup; }  // MMA units along M
  constexpr int rank_of(int m, int n) const { return base + m + cm * n; }

  static constexpr bool legal(int cluster_m, int cluster_n, int ncta) {
    return cluster_m >= 1 && cluster_n >= 1 && cluster_m % kCtaGroup == 0 &&
           cluster_m * cluster_n == ncta && ncta <= kMaxClusterCtas &&
           cluster_n <= kMcSlices && cluster_m / kCtaGroup <= kMcSlices;
  }
  static constexpr ClusterGeom make(int cluster_m, int cluster_n, int rank, int ncta) {
    ClusterGeom g;
    if (legal(cluster_m, cluster_n, ncta)) {
      g.cm = cluster_m;
      g.cn = cluster_n;
    }
    g.base = rank - rank % g.size();
    g.mi = (rank - g.base) % g.cm;
    g.ni = (rank - g.base) / g.cm;
    return g;
  }

  // A share group: same m (same M tile, same pair half), every n (create_tma_multicast_mask<2>).
  constexpr uint16_t a_mask() const {
    uint32_t m = 0;
    for (int n = 0; n < cn; ++n) m |= 1u << rank_of(mi, n);
    return uint16_t(m);
  }
  // B share group: same n, same pair half, every MMA unit along M (create_tma_multicast_mask<1>).
  constexpr uint16_t b_mask() const {
    uint32_t m = 0;
    for (int u = 0; u < pm(); ++u) m |= 1u << rank_of(u * kCtaGroup + mi % kCtaGroup, ni);
    return uint16_t(m);
  }
  // Stage release of this CTA's MMA unit: every CTA of the unit's row (both halves of each pair
  // along N) and of its column (calculate_multicast_mask<kRowCol>, AtomThrShape (cta_group,1)).
  constexpr uint16_t commit_mask() const {
    uint32_t m = 0;
    const int u0 = mi / kCtaGroup * kCtaGroup;
    for (int n = 0; n < cn; ++n)
      for (int h = 0; h < kCtaGroup; ++h) m |= 1u << rank_of(u0 + h, n);
    for (int mm = 0; mm < cm; ++mm) m |= 1u << rank_of(mm, ni);
    return uint16_t(m);
  }
  // Arrivals per phase on each CTA's empty barrier (P100:565: cx/atomM + cy/atomN - 1).
  constexpr uint32_t empty_count() const { return uint32_t(pm() + cn - 1); }
  // Accumulator-full commit of a pair: both CTAs of the pair (calculate_umma_peer_mask).
  constexpr uint16_t pair_mask() const {
    return uint16_t(((1u << kCtaGroup) - 1u) << rank_of(mi / kCtaGroup * kCtaGroup, ni));
  }

  // Share groups: A along N (cn members, this CTA is member ni), B along M (pm() members,
  // member mi / cta_group).
  constexpr int a_group() const { return cn; }
  constexpr int a_member() const { return ni; }
  constexpr int b_group() const { return pm(); }
  constexpr int b_member() const { return mi / kCtaGroup; }
};

// What one CTA loads of one shared operand: slice i of a sliced box when i % group == member,
// a whole box (scale factors) of k-block kb when kb % group == member; a private operand
// (group of one, or not shared) is loaded whole by the CTA itself.
struct Share {
  bool shared;
  int group, member;
  uint16_t mask;
  constexpr bool issues_slice(int i) const { return !shared || i % group == member; }
  constexpr bool issues_whole(int kb) const { return !shared || kb % group == member; }
};

// Spot checks of the rank mapping (the test suite compares full tables with an independent model).
static_assert(ClusterGeom<2>::make(4, 2, 5, 8).mi == 1 && ClusterGeom<2>::make(4, 2, 5, 8).ni == 1, "rank 5 of 4x2 is (1,1)");
static_assert(ClusterGeom<2>::make(4, 2, 5, 8).a_mask() == 0x22 && ClusterGeom<2>::make(4, 2, 5, 8).b_mask() == 0xA0,
              "4x2 pairs: A along N (ranks 1,5), B along M (ranks 5,7)");
static_assert(ClusterGeom<2>::make(4, 2, 5, 8).commit_mask() == 0xF3 && ClusterGeom<2>::make(4, 2, 5, 8).empty_count() == 3,
              "4x2 pairs: row {0,1,4,5} + column {4..7}, 2 + 2 - 1 arrivals");
static_assert(ClusterGeom<2>::make(0, 0, 3, 4).size() == 2 && ClusterGeom<2>::make(0, 0, 3, 4).base == 2 &&
                  ClusterGeom<2>::make(0, 0, 3, 4).empty_count() == 1,
              "no cluster shape from the host: pairs only");
static_assert(ClusterGeom<1>::make(2, 2, 3, 4).commit_mask() == 0xE && ClusterGeom<1>::make(1, 1, 0, 1).a_mask() == 1,
              "1-CTA 2x2: rank 3 releases ranks 1, 2, 3");
static_assert(ClusterGeom<1>::make(8, 1, 0, 8).size() == 1, "a share group of more than 4: no multicast");

// ---- cluster-block tile walk -----------------------------------------------------------------
// The sub-cluster is the scheduling unit: step s of a unit takes one block of pm() x cn
// neighbouring tiles (pm() MMA units along M, one tile each; cn along N), and CTA (m, n) takes
// tile (block_m * pm() + m / cta_group, block_n * cn + n). With a 1x1 sub-cluster the walk is
// exactly the per-tile walk of fusegemm/scheduler.cuh.
//
// Tiles past the problem edge (the last block of M or N) are "phantoms": the CTA still runs the
// barrier protocol (its loads may feed peers, its commits release peers' stages; TMA zero-fills
// out-of-bounds boxes and still counts their bytes) but its epilogue stores nothing. The grouped
// walk never lets a block's B be multicast across an expert boundary: expert offsets are
// multiples of 256 rows, so a block of pm() * TILE_M rows crosses one when pm() * TILE_M > 256
// (or does not divide 256); such a block loads B per CTA (share_b = false), everything else,
// barrier counts included, unchanged.
struct ClusterTile {
  int expert;     // expert (grouped) or batch (batched) whose B this CTA multiplies
  int m_block;    // global M tile (row0 = m_block * TILE_M)
  int n_block;    // N tile
  int linear;     // block id (< 0: the walk is over)
  bool in_range;  // the tile is inside the problem: the epilogue stores it
  bool share_b;   // block-uniform: every MMA unit of the block multiplies the same B
  FUSEGEMM_DEVICE bool valid() const { return linear >= 0; }
};

// Pure parts of the walk (constexpr, so the test suite can tabulate them); the grouped raster,
// grouped_block_coord, is scheduler.cuh's (the expert-major walks band with it too).
// Batched raster inside one batch: consecutive blocks share B columns.
constexpr BlockCoord batched_block_coord(int local, int bm_blocks) {
  return BlockCoord{local % bm_blocks, local / bm_blocks};
}
// B may be multicast along M when the block's pm M tiles are all inside the problem and inside
// the expert that owns the first one (expert_end: offsets[e] of that expert).
constexpr bool block_shares_b(int m0, int pm, int m_blocks, int tile_m, int expert_end) {
  return m0 + pm <= m_blocks && expert_end >= (m0 + pm) * tile_m;
}
static_assert(grouped_block_coord(9, 3, 4, 8).bm == 0 && grouped_block_coord(9, 3, 4, 8).bn == 3,
              "one band of 3 block rows: block 9 is (0, 3)");
static_assert(!block_shares_b(4, 4, 8, 128, 768) && block_shares_b(4, 4, 8, 128, 1024) &&
                  !block_shares_b(4, 4, 7, 128, 1024),
              "a 512-row block at row 512 crosses an expert ending at row 768; past m_blocks it never shares");

template <int TILE_M, int TILE_N, int kCtaGroup, int kGroupM = 8>
struct GroupedClusterScheduler {
  GroupedScheduler<TILE_M, TILE_N, kGroupM> g;
  int pm, pn, unit_m, ni, bm_blocks, bn_blocks;
  static constexpr int band_blocks(int pm) { return kGroupM / pm > 1 ? kGroupM / pm : 1; }

  FUSEGEMM_DEVICE GroupedClusterScheduler(const int* offsets, int num_experts, int n, int m_rows,
                                          const ClusterGeom<kCtaGroup>& geom)
      : g(offsets, num_experts, n, m_rows), pm(geom.pm()), pn(geom.cn), unit_m(geom.mi / kCtaGroup), ni(geom.ni) {
    bm_blocks = (g.m_blocks + pm - 1) / pm;
    bn_blocks = (g.n_blocks + pn - 1) / pn;
  }
  FUSEGEMM_DEVICE int num_tiles() const { return bm_blocks * bn_blocks; }  // cluster blocks

  FUSEGEMM_DEVICE ClusterTile tile(int block) const {
    ClusterTile t{-1, 0, 0, -1, false, false};
    if (block < 0 || block >= num_tiles()) return t;
    const BlockCoord c = grouped_block_coord(block, bm_blocks, bn_blocks, band_blocks(pm));
    const int m0 = c.bm * pm;
    t.m_block = m0 + unit_m;
    t.n_block = c.bn * pn + ni;
    t.linear = block;
    t.in_range = t.m_block < g.m_blocks && t.n_block < g.n_blocks;
    const int e0 = g.expert_of_row(m0 * TILE_M);
    t.share_b = block_shares_b(m0, pm, g.m_blocks, TILE_M, g.expert_end(e0));
    t.expert = (t.share_b || t.m_block >= g.m_blocks) ? e0 : g.expert_of_row(t.m_block * TILE_M);
    return t;
  }
};

// Batched tile space: (ceil(M/TILE_M) x ceil(N/TILE_N)) tiles per batch, batch-major; blocks
// never span two batches, so B is always shareable along M.
template <int TILE_M, int TILE_N, int kCtaGroup>
struct BatchedClusterScheduler {
  int m_blocks, n_blocks, batches, pm, pn, unit_m, ni, bm_blocks, bn_blocks;
  FUSEGEMM_DEVICE BatchedClusterScheduler(int m, int n, int l, const ClusterGeom<kCtaGroup>& geom)
      : m_blocks((m + TILE_M - 1) / TILE_M), n_blocks((n + TILE_N - 1) / TILE_N), batches(l),
        pm(geom.pm()), pn(geom.cn), unit_m(geom.mi / kCtaGroup), ni(geom.ni) {
    bm_blocks = (m_blocks + pm - 1) / pm;
    bn_blocks = (n_blocks + pn - 1) / pn;
  }
  FUSEGEMM_DEVICE int num_tiles() const { return bm_blocks * bn_blocks * batches; }
  FUSEGEMM_DEVICE ClusterTile tile(int block) const {
    ClusterTile t{-1, 0, 0, -1, false, false};
    if (block < 0 || block >= num_tiles()) return t;
    const int per = bm_blocks * bn_blocks;
    const BlockCoord c = batched_block_coord(block % per, bm_blocks);
    t.expert = block / per;
    t.m_block = c.bm * pm + unit_m;
    t.n_block = c.bn * pn + ni;
    t.linear = block;
    t.in_range = t.m_block < m_blocks && t.n_block < n_blocks;
    t.share_b = true;
    return t;
  }
};

}  // namespace fusegemm
