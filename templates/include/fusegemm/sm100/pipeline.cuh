// sm_100a pipeline pieces that the arch-neutral fusegemm/tma.cuh does not have: pipeline
// state, 2-CTA (cta_group::2) TMA loads, cluster-scope waits, and the tile stream (static walk
// or a dynamic claim ring) every warp role consumes. Cluster registers, the cluster barrier and
// the multicast geometry are shared with sm_90a (fusegemm/cluster.cuh).
//
// Barrier protocol (sm100-protocol.md §1 "Pipelines", §4; CUTLASS P100/P90, KRN):
//   smem stage  full[s]      count 1: the MMA-leader CTA's producer does arrive.expect_tx with
//                            the bytes of *both* CTAs of a pair; a follower's TMA completes its
//                            bytes on the leader's barrier (address & 0xFEFFFFFF, copy_sm100_tma.hpp:45);
//                            multicast loads of peers complete theirs on it too (fusegemm/cluster.cuh).
//               empty[s]     count cluster_m / cta_group + cluster_n - 1: one tcgen05.commit per
//                            k-tile from every MMA unit of this CTA's cluster row and column
//                            (multicast; P100:565, P100:57-92; 1 when nothing is multicast).
//   accumulator tmem_full[a] count 1: tcgen05.commit after the tile's last k-tile (multicast to the pair).
//               tmem_empty[a] count 128 x cta_group: every epilogue thread of both CTAs arrives on the
//                            leader's barrier (P100:272-276).
//   producer side waits with the inverted phase (starts at phase 1, P90:254-260).
#pragma once

#include "fusegemm/cluster.cuh"
#include "fusegemm/common.cuh"
#include "fusegemm/scheduler.cuh"
#include "fusegemm/tma.cuh"

namespace fusegemm::sm100 {

template <int kStages>
struct PipeState {
  int index = 0;
  uint32_t phase = 0;
  FUSEGEMM_DEVICE void advance() {
    if (++index == kStages) { index = 0; phase ^= 1u; }
  }
};

// ---- 2-CTA TMA loads (copy_sm100_tma.hpp SM100_TMA_2SM_LOAD_*) ---------------------------------
// Both CTAs of the pair load into their own smem; the transaction bytes complete on the
// leader's barrier: clearing the peer bit of the shared::cluster address maps the local
// barrier offset to the even (leader) CTA.
constexpr uint32_t kPeerBitMask = 0xFEFFFFFFu;

FUSEGEMM_DEVICE void tma_load_2sm_2d(const CUtensorMap* desc, uint64_t* bar, void* smem, int c0,
                                     int c1, CacheHint hint = CacheHint::kNormal) {
  asm volatile(
      "cp.async.bulk.tensor.2d.cta_group::2.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%3, %4}], [%2], %5;"
      ::"r"(smem_u32(smem)), "l"(desc), "r"(smem_u32(bar) & kPeerBitMask), "r"(c0), "r"(c1),
        "l"(static_cast<uint64_t>(hint))
      : "memory");
}

FUSEGEMM_DEVICE void tma_load_2sm_3d(const CUtensorMap* desc, uint64_t* bar, void* smem, int c0,
                                     int c1, int c2, CacheHint hint = CacheHint::kNormal) {
  asm volatile(
      "cp.async.bulk.tensor.3d.cta_group::2.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%3, %4, %5}], [%2], %6;"
      ::"r"(smem_u32(smem)), "l"(desc), "r"(smem_u32(bar) & kPeerBitMask), "r"(c0), "r"(c1),
        "r"(c2), "l"(static_cast<uint64_t>(hint))
      : "memory");
}

// 4-D loads (scale-factor atoms: {128 words, k-atoms, mn-atoms, L}): tma_load_4d is in tma.cuh.
FUSEGEMM_DEVICE void tma_load_2sm_4d(const CUtensorMap* desc, uint64_t* bar, void* smem, int c0,
                                     int c1, int c2, int c3, CacheHint hint = CacheHint::kNormal) {
  asm volatile(
      "cp.async.bulk.tensor.4d.cta_group::2.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%3, %4, %5, %6}], [%2], %7;"
      ::"r"(smem_u32(smem)), "l"(desc), "r"(smem_u32(bar) & kPeerBitMask), "r"(c0), "r"(c1),
        "r"(c2), "r"(c3), "l"(static_cast<uint64_t>(hint))
      : "memory");
}

// One TMA load of kDims (2..4) coordinates, 1-CTA or 2-CTA form, chosen at compile time.
template <int kCtaGroup, int kDims>
FUSEGEMM_DEVICE void tma_load_nd(const CUtensorMap* desc, uint64_t* bar, void* smem, int c0, int c1,
                                 int c2 = 0, int c3 = 0, CacheHint hint = CacheHint::kNormal) {
  static_assert(kDims >= 2 && kDims <= 4, "2-D to 4-D maps");
  if constexpr (kCtaGroup == 1) {
    if constexpr (kDims == 2) tma_load_2d(desc, bar, smem, c0, c1, hint);
    if constexpr (kDims == 3) tma_load_3d(desc, bar, smem, c0, c1, c2, hint);
    if constexpr (kDims == 4) tma_load_4d(desc, bar, smem, c0, c1, c2, c3, hint);
  } else {
    if constexpr (kDims == 2) tma_load_2sm_2d(desc, bar, smem, c0, c1, hint);
    if constexpr (kDims == 3) tma_load_2sm_3d(desc, bar, smem, c0, c1, c2, hint);
    if constexpr (kDims == 4) tma_load_2sm_4d(desc, bar, smem, c0, c1, c2, c3, hint);
  }
}

// Four rows r0..r3 of a 2-D map whose box is one row of `c0`.. (gathered operands): the rows land
// one after another at `smem`, 4 x the box's bytes, swizzled as a 4-row box would be (the pattern
// follows the smem address), and complete as that many bytes on `bar`. A row outside the map
// (a negative index included) is filled with zeros and still counts, as any out-of-bounds box.
FUSEGEMM_DEVICE void tma_gather4(const CUtensorMap* desc, uint64_t* bar, void* smem, int c0, int r0, int r1, int r2,
                                 int r3, CacheHint hint = CacheHint::kNormal) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile::gather4.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%3, %4, %5, %6, %7}], [%2], %8;"
      ::"r"(smem_u32(smem)), "l"(desc), "r"(smem_u32(bar)), "r"(c0), "r"(r0), "r"(r1), "r"(r2), "r"(r3),
        "l"(static_cast<uint64_t>(hint))
      : "memory");
}

// tma_gather4 in a CTA pair's 2-CTA form (cta_group::2): the rows land in this CTA's stage and
// their bytes complete on the barrier of the pair's leader (the peer bit of `bar` cleared), as the
// pair's other loads (tma_load_2sm_2d).
FUSEGEMM_DEVICE void tma_gather4_2sm(const CUtensorMap* desc, uint64_t* bar, void* smem, int c0, int r0, int r1,
                                     int r2, int r3, CacheHint hint = CacheHint::kNormal) {
  asm volatile(
      "cp.async.bulk.tensor.2d.cta_group::2.shared::cluster.global.tile::gather4.mbarrier::complete_tx::bytes"
      ".L2::cache_hint [%0], [%1, {%3, %4, %5, %6, %7}], [%2], %8;"
      ::"r"(smem_u32(smem)), "l"(desc), "r"(smem_u32(bar) & kPeerBitMask), "r"(c0), "r"(r0), "r"(r1), "r"(r2),
        "r"(r3), "l"(static_cast<uint64_t>(hint))
      : "memory");
}

// The tokens of problem rows r .. r + 3 from a gathered operand's index: -1 at or past `rows` (a
// row gather4 reads as zeros, as any row outside the map).
FUSEGEMM_DEVICE void gather4_tokens(const int* index, int r, int rows, int (&tokens)[4]) {
#pragma unroll
  for (int j = 0; j < 4; ++j) tokens[j] = r + j < rows ? __ldg(index + r + j) : -1;
}

// One gather4, 1-CTA or 2-CTA form, chosen at compile time.
template <int kCtaGroup>
FUSEGEMM_DEVICE void tma_gather4_nd(const CUtensorMap* desc, uint64_t* bar, void* smem, int c0, int r0, int r1,
                                    int r2, int r3, CacheHint hint = CacheHint::kNormal) {
  if constexpr (kCtaGroup == 1) {
    tma_gather4(desc, bar, smem, c0, r0, r1, r2, r3, hint);
  } else {
    tma_gather4_2sm(desc, bar, smem, c0, r0, r1, r2, r3, hint);
  }
}

// ---- multicast TMA loads (copy_sm90_tma.hpp SM90_TMA_LOAD_MULTICAST_*, copy_sm100_tma.hpp
// SM100_TMA_2SM_LOAD_MULTICAST_*) -----------------------------------------------------------------
// One box from global memory lands at the same smem offset in every CTA of `mask`, and the
// transaction bytes complete on the barrier at `bar`'s offset in each destination CTA. The 2-CTA
// form clears the peer bit of the barrier address, so every destination CTA's bytes complete on
// the barrier of its pair's leader (the CTA that expects the pair's bytes), exactly as the
// unicast 2-CTA load above.
#define FUSEGEMM_TMA_MC(DIMS, GROUP, BAR, COORDS, ...)                                            \
  asm volatile("cp.async.bulk.tensor." DIMS GROUP ".shared::cluster.global.mbarrier::complete_tx::bytes" \
               ".multicast::cluster.L2::cache_hint [%0], [%1, " COORDS "], [%2], %3, %4;"          \
               ::"r"(smem_u32(smem)), "l"(desc), "r"(BAR), "h"(mask),                              \
                 "l"(static_cast<uint64_t>(hint)), __VA_ARGS__ : "memory")

template <int kCtaGroup, int kDims>
FUSEGEMM_DEVICE void tma_load_mc_nd(const CUtensorMap* desc, uint64_t* bar, void* smem, uint16_t mask,
                                    int c0, int c1, int c2 = 0, int c3 = 0,
                                    CacheHint hint = CacheHint::kNormal) {
  static_assert(kDims >= 2 && kDims <= 4, "2-D to 4-D maps");
  static_assert(kCtaGroup == 1 || kCtaGroup == 2, "cta_group is 1 or 2");
  const uint32_t b = kCtaGroup == 2 ? (smem_u32(bar) & kPeerBitMask) : smem_u32(bar);
  if constexpr (kCtaGroup == 1) {
    if constexpr (kDims == 2) FUSEGEMM_TMA_MC("2d", "", b, "{%5, %6}", "r"(c0), "r"(c1));
    if constexpr (kDims == 3) FUSEGEMM_TMA_MC("3d", "", b, "{%5, %6, %7}", "r"(c0), "r"(c1), "r"(c2));
    if constexpr (kDims == 4) FUSEGEMM_TMA_MC("4d", "", b, "{%5, %6, %7, %8}", "r"(c0), "r"(c1), "r"(c2), "r"(c3));
  } else {
    if constexpr (kDims == 2) FUSEGEMM_TMA_MC("2d", ".cta_group::2", b, "{%5, %6}", "r"(c0), "r"(c1));
    if constexpr (kDims == 3) FUSEGEMM_TMA_MC("3d", ".cta_group::2", b, "{%5, %6, %7}", "r"(c0), "r"(c1), "r"(c2));
    if constexpr (kDims == 4) FUSEGEMM_TMA_MC("4d", ".cta_group::2", b, "{%5, %6, %7, %8}", "r"(c0), "r"(c1), "r"(c2), "r"(c3));
  }
}
#undef FUSEGEMM_TMA_MC

// ---- cluster-scope barrier pieces ---------------------------------------------------------------
// Wait with cluster-scope acquire: the data guarded by the phase was written by another CTA.
// (FUSEGEMM_WAIT_TIMEOUT_NS: probes under fusegemm/tma.cuh's wait_watchdog.)
FUSEGEMM_DEVICE void mbar_wait_cluster(uint64_t* bar, uint32_t parity) {
#ifdef FUSEGEMM_WAIT_TIMEOUT_NS
  const uint64_t t0 = global_ns();
  while (true) {
    uint32_t done;
    asm volatile(
        "{\n .reg .pred p;\n"
        " mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n"
        " selp.b32 %0, 1, 0, p;\n}\n"
        : "=r"(done) : "r"(smem_u32(bar)), "r"(parity) : "memory");
    if (done) return;
    wait_watchdog(t0, bar, parity);
  }
#else
  asm volatile(
      "{\n .reg .pred p;\n"
      "WAIT_%=:\n"
      " mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%0], %1;\n"
      " @!p bra WAIT_%=;\n}\n"
      ::"r"(smem_u32(bar)), "r"(parity) : "memory");
#endif
}

// 32-bit store into CTA `cta`'s shared memory at the same offset as `local`.
FUSEGEMM_DEVICE void st_shared_cluster(const void* local, uint32_t cta, int value) {
  asm volatile(
      "{\n .reg .b32 remote;\n"
      " mapa.shared::cluster.u32 remote, %0, %1;\n"
      " st.shared::cluster.b32 [remote], %2;\n}\n"
      ::"r"(smem_u32(local)), "r"(cta), "r"(value) : "memory");
}

// ---- tile stream ---------------------------------------------------------------------------------
// Every role walks the same sequence of block ids (one block per sub-cluster step, see
// fusegemm/cluster.cuh). Static: unit u takes u, u+U, u+2U... Dynamic: the first block is
// u (no atomic), later ones U + atomicAdd(counter) (host zeroes the counter per call). The
// scheduler warp of the sub-cluster's first CTA (the owner) claims into a small smem ring and
// writes every CTA's ring of the sub-cluster (st.shared::cluster, then a release.cluster arrival
// on that CTA's `full`); consumers of every CTA release a slot on the owner's `empty` (one
// arrival per consuming warp: TMA and epilogue warps of every CTA, the MMA warp of every MMA
// unit). A claim past the last block is pushed too: it tells every consumer to stop.
constexpr int kSchedStages = 4;

struct TileRing {
  uint64_t full[kSchedStages];
  uint64_t empty[kSchedStages];
  int tile[kSchedStages];
};

template <bool kDynamic>
struct TileStream {
  TileRing* ring;
  int unit, num_units;
  uint32_t owner;  // cluster rank of the claiming CTA
  bool is_owner;
  PipeState<kSchedStages> st;
  bool first = true;

  FUSEGEMM_DEVICE TileStream(TileRing* r, int unit_, int num_units_, uint32_t owner_, uint32_t rank)
      : ring(r), unit(unit_), num_units(num_units_), owner(owner_), is_owner(owner_ == rank) {}

  // Whole warp calls; returns the same id in every lane. One arrival per warp on the owner.
  FUSEGEMM_DEVICE int next() {
    if constexpr (!kDynamic) {
      int t = first ? unit : unit + num_units;
      unit = t;
      first = false;
      return t;
    } else {
      mbar_wait_cluster(&ring->full[st.index], st.phase);
      int t = ring->tile[st.index];
      __syncwarp();
      if (elect_one()) {
        if (is_owner) mbar_arrive(&ring->empty[st.index]);
        else mbar_arrive_cluster(&ring->empty[st.index], owner);
      }
      st.advance();
      return t;
    }
  }
};

// Scheduler warp body (one lane), dynamic scheduling only, owner CTA only: claims for the
// `ctas` CTAs of ranks [rank, rank + ctas).
FUSEGEMM_DEVICE void run_tile_claimer(TileRing* ring, unsigned int* counter, int unit, int num_units,
                                      int num_tiles, uint32_t rank, int ctas) {
  PipeState<kSchedStages> st;
  for (int i = 0;; ++i) {
    int t = i == 0 ? unit : num_units + dynamic_claim(counter);
    // Cluster-scope acquire: remote consumers' reads of the slot precede our remote rewrite.
    mbar_wait_cluster(&ring->empty[st.index], st.phase ^ 1u);
    ring->tile[st.index] = t;
    mbar_arrive(&ring->full[st.index]);
    for (int c = 1; c < ctas; ++c) {
      st_shared_cluster(&ring->tile[st.index], rank + c, t);
      mbar_arrive_cluster(&ring->full[st.index], rank + c);  // release.cluster orders the store
    }
    if (t >= num_tiles) break;
    st.advance();
  }
}

}  // namespace fusegemm::sm100
