// The persistent warp-specialised frame shared by the sm_100a kernels (BF16 grouped GEMM,
// block-scaled GEMMs): shared-memory plan, barrier init, TMEM allocation, the three role loops
// (TMA producer, MMA issuer, accumulator consumer), the dynamic tile claimer and teardown.
// A kernel supplies only what differs: what a stage loads, which MMAs a stage issues, and the
// per-tile epilogue.
//
// Protocol sources: CUTLASS sm100_gemm_tma_warpspecialized.hpp (KRN) + sm100_pipeline.hpp
// (P100) + sm90_pipeline.hpp (P90) for barrier counts, phases, tails and the 2-CTA rules;
// DeepGEMM impls/sm100_bf16_gemm.cuh and sm100_fp8_fp4_gemm_1d1d.cuh for fence placement and
// the single-thread MMA issue. Counts and fences are listed in fusegemm/sm100/pipeline.cuh.
#pragma once

#include "fusegemm/scheduler.cuh"
#include "fusegemm/tma.cuh"
#include "fusegemm/cluster.cuh"
#include "fusegemm/sm100/pipeline.cuh"
#include "fusegemm/sm100/tmem.cuh"
#include "fusegemm/sm100/umma.cuh"
#include "fusegemm/sm100/epilogue_tmem.cuh"

namespace fusegemm::sm100 {

// ---- warp roles -------------------------------------------------------------------------------
constexpr int kWarpTma = 0, kWarpMma = 1, kWarpTmem = 2, kWarpSched = 3, kFirstEpiWarp = 4;
constexpr int kNumEpiWarps = 4, kNumWarps = kFirstEpiWarp + kNumEpiWarps;
static_assert(kFirstEpiWarp % 4 == 0, "bug #12: epilogue warps must be warpgroup-aligned");
constexpr int kSmemLimit = 232448;  // sm_100 max dynamic shared memory per block (227 KB)
constexpr int kMaxStages = 8;

// ---- fault injection (tests only): Config::kFaultInjection, absent in generated configs ----
// Lets tests/unit/test_sm100_static.py prove each static check fails on a broken kernel.
enum : int {
  kFaultNone = 0, kFaultSkipMma = 1, kFaultSpill = 2, kFaultWrongFormat = 3,
  kFaultNoMulticast = 4,   // every CTA loads its own boxes (no multicast instructions)
  kFaultPairCommit = 5,    // stage release to the pair only, empty count 1, whatever the cluster
  kFaultMnDescSwap = 6,    // MN-major smem descriptors with LBO and SBO swapped
};
template <class...> using void_t = void;
template <class C, class = void> struct FaultOf { static constexpr int value = kFaultNone; };
template <class C> struct FaultOf<C, void_t<decltype(C::kFaultInjection)>> {
  static constexpr int value = C::kFaultInjection;
};
template <class C> constexpr int fault_injection() { return FaultOf<C>::value; }

FUSEGEMM_DEVICE void spill_through_local(float (&v)[32], int lane) {
  float tmp[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) tmp[i] = v[i];
  volatile int shift = lane;  // runtime index: the array must live in local memory
#pragma unroll
  for (int i = 0; i < 32; ++i) v[i] = tmp[(i + shift) & 31];
}

template <class T> constexpr F16Fmt f16_fmt() {
  return fusegemm::is_same_v<T, fusegemm::half_t> ? F16Fmt::F16 : F16Fmt::BF16;
}
constexpr uint32_t kIdescShapeMask = (0x3Fu << 17) | (0x1Fu << 24);

// ---- the frame --------------------------------------------------------------------------------
// kStageA/B/SF: bytes one CTA receives per k-block; kAccStride: TMEM columns per accumulator
// stage; kEpiSmem: epilogue staging bytes; kTmapsPerCta: device-rewritten tensor maps
// (discrete weights: B, plus SFB for block-scaled), each with kStages slots per CTA;
// kTxPerCta: bytes TMA delivers per CTA and stage (< stage bytes when A is half-loaded);
// kCopyArrivals: arrivals on a stage's full barrier besides the expect_tx (producer lanes that
// publish their own cp.async copies of the stage, fusegemm/gather.cuh GatherPublisher).
// A tile's k-blocks: every tile's (an int), or a tile's own (a callable on the tile: K-grouped
// problems, one K range per expert).
template <class Tile>
FUSEGEMM_DEVICE int tile_k_blocks(int k_blocks, const Tile&) { return k_blocks; }
template <class F, class Tile>
FUSEGEMM_DEVICE auto tile_k_blocks(const F& k_blocks_of, const Tile& t) -> decltype(int(k_blocks_of(t))) {
  return k_blocks_of(t);
}

struct NoDone {
  FUSEGEMM_DEVICE void operator()() const {}
};

template <int kCtaGroup_, bool kDynamic, int kStageA, int kStageB, int kStageSF, int kAccStages_,
          int kAccStride, int kTmemCols_, int kEpiSmem, int kTmapsPerCta,
          int kTxPerCta = kStageA + kStageB + kStageSF, int kFault = kFaultNone, int kCopyArrivals = 0>
struct KernelFrame {
  static constexpr int kCtaGroup = kCtaGroup_;
  static constexpr int kAccStages = kAccStages_;
  static constexpr int kTmemCols = kTmemCols_;
  static constexpr int kThreads = kNumWarps * 32;
  static constexpr int kStageBytes = kStageA + kStageB + kStageSF;
  // Every CTA receives its whole stage per k-block, from its own loads or from peers' multicast;
  // the leader of a pair expects the bytes of both CTAs.
  static constexpr uint32_t kTxBytes = uint32_t(kTxPerCta) * kCtaGroup;
  static constexpr int kAuxBytes = 512;
  static constexpr int kFixedBytes = 1024 /* base alignment */ + kEpiSmem + 128 * kTmapsPerCta + kAuxBytes;
  static constexpr int kStagesFit = (kSmemLimit - kFixedBytes) / kStageBytes;
  static constexpr int kStages = kStagesFit < kMaxStages ? kStagesFit : kMaxStages;
  // Device-rewritten maps (tma.cuh DeviceTmap): kStages slots per map, rotated; the host
  // reserves 8 slots of 128 B per map per CTA, CTA c at slot c * kTmapSlotStride
  // (exported to the host as kTmapSlotStride, fusegemm/base/contract.py; block-scaled discrete: [B x 8][SFB x 8]).
  static constexpr int kTmapSlots = kStages;
  static constexpr int kTmapSlotsPerMap = 8;
  static constexpr int kTmapSlotStride = kTmapSlotsPerMap * (kTmapsPerCta > 0 ? kTmapsPerCta : 1);
  // Shared-memory plan (offsets from a 1024-aligned base). Every A/B stage starts 1024-aligned:
  // the SW128 descriptors carry base_offset 0 (bug #5). Multicast lands a box at the same
  // offset in every destination CTA: all CTAs of a launch share this plan.
  static constexpr int kOffA = 0;
  static constexpr int kOffB = kOffA + kStages * kStageA;
  static constexpr int kOffSF = kOffB + kStages * kStageB;
  static constexpr int kOffEpi = kOffSF + kStages * kStageSF;
  static constexpr int kOffTmap = (kOffEpi + kEpiSmem + 127) / 128 * 128;
  static constexpr int kOffAux = kOffTmap + 128 * kTmapsPerCta;
  static constexpr int kSmemBytes = 1024 + kOffAux + kAuxBytes;
  static_assert(kStages >= 2, "at least two pipeline stages must fit in shared memory");
  static_assert(kStageA % 1024 == 0 && kStageB % 1024 == 0 && kOffB % 1024 == 0,
                "bug #5: every SW128 stage must be 1024-B aligned (descriptor base_offset = 0)");
  static_assert(kStageSF % 128 == 0 && kOffSF % 128 == 0, "SF stages 128-B aligned for TMA/UTCCP");
  static_assert(kSmemBytes <= kSmemLimit, "shared memory over the sm_100 limit");
  static_assert(kStages <= kTmapSlotsPerMap, "more stages than reserved tensor-map slots");
  static_assert(kAccStages * kAccStride <= kTmemCols && kTmemCols <= kTmemColumns &&
                    (kTmemCols & (kTmemCols - 1)) == 0 && kTmemCols >= 32,
                "bug #10: accumulators fit a power-of-two TMEM allocation <= 512 columns");

  struct Aux {
    uint64_t full[kStages], empty[kStages];
    uint64_t tmem_full[kAccStages], tmem_empty[kAccStages];
    TileRing ring;
    uint32_t tmem_base;
  };
  static_assert(sizeof(Aux) <= kAuxBytes, "aux region");

  // ---- protocol (sm100-protocol.md §1 table, §4; fusegemm/cluster.cuh) ----
  using Geom = ClusterGeom<kCtaGroup>;
  static constexpr uint32_t kFullCount = 1 + kCopyArrivals, kTmemFullCount = 1;
  static_assert(kCopyArrivals == 0 || kCtaGroup == 1,
                "copies published by the producer's lanes arrive on their own CTA's barrier: 1-CTA tiles");
  static constexpr uint32_t kTmemEmptyCount = 32 * kNumEpiWarps * kCtaGroup;
  static constexpr bool kMulticast = kFault != kFaultNoMulticast;
  // Arrivals per phase on a stage's empty barrier, and the CTAs a stage release reaches.
  static constexpr uint32_t empty_count(const Geom& g) {
    return kFault == kFaultPairCommit ? 1u : g.empty_count();
  }
  static constexpr uint16_t stage_commit_mask(const Geom& g) {
    return kFault == kFaultPairCommit ? g.pair_mask() : g.commit_mask();
  }
  // Ring consumers (on the owner CTA): TMA + epilogue warps of every CTA, the MMA warp of every
  // MMA unit.
  static constexpr uint32_t ring_empty_count(const Geom& g) {
    return uint32_t(g.size() * (1 + kNumEpiWarps) + g.size() / kCtaGroup);
  }

  uint8_t* base;
  Aux* aux;
  uint8_t* staging;
  CUtensorMap* tmap_staging;
  int warp, lane;
  uint32_t rank, ncta;
  Geom geom;
  uint16_t mask_commit;
  bool is_leader;
  int cta_half;
  int unit, num_units;
  uint32_t tmem_base;
  int cur_acc = 0;

  FUSEGEMM_DEVICE uint8_t* smem_a(int s) const { return base + kOffA + s * kStageA; }
  FUSEGEMM_DEVICE uint8_t* smem_b(int s) const { return base + kOffB + s * kStageB; }
  FUSEGEMM_DEVICE uint8_t* smem_sf(int s) const { return base + kOffSF + s * kStageSF; }
  // A cluster of more than one CTA synchronises cluster-wide (peers multicast into this CTA and
  // arrive on its barriers); a single CTA only needs its own threads.
  FUSEGEMM_DEVICE void sync_cluster_or_cta() const {
    if (kCtaGroup == 2 || ncta > 1) cluster_sync_all(); else __syncthreads();
  }

  template <class Params>
  FUSEGEMM_DEVICE void setup(const Params& p) {
    extern __shared__ uint8_t fusegemm_smem[];
    uint32_t raw = smem_u32(fusegemm_smem);
    base = fusegemm_smem + (((raw + 1023u) & ~1023u) - raw);
    aux = reinterpret_cast<Aux*>(base + kOffAux);
    staging = base + kOffEpi;
    tmap_staging = reinterpret_cast<CUtensorMap*>(base + kOffTmap);
    warp = __shfl_sync(0xffffffffu, int(threadIdx.x) / 32, 0);
    lane = int(threadIdx.x) % 32;
    rank = cluster_cta_rank();
    ncta = cluster_num_ctas();
    geom = Geom::make(p.cluster_m, p.cluster_n, int(rank), int(ncta));
    mask_commit = stage_commit_mask(geom);
    is_leader = kCtaGroup == 1 || (rank & 1u) == 0;
    cta_half = kCtaGroup == 2 ? int(rank & 1u) : 0;
    unit = int((cluster_linear_id() * ncta + rank) / uint32_t(geom.size()));
    num_units = int(cluster_count() * ncta / uint32_t(geom.size()));

    if (warp == kWarpTma && lane == 0) {
      prefetch_tmap(&p.tma_a);
      prefetch_tmap(&p.tma_b);
      if constexpr (kStageSF > 0) { prefetch_tmap(&p.tma_sfa); prefetch_tmap(&p.tma_sfb); }
    }
    // cta_group::2 allocation needs the peer CTA running: cluster barrier first (KRN:614).
    if constexpr (kCtaGroup == 2) cluster_sync_all();
    if (warp == kWarpMma && lane == 0) {
      const uint32_t empty = empty_count(geom);
      for (int s = 0; s < kStages; ++s) { mbar_init(&aux->full[s], kFullCount); mbar_init(&aux->empty[s], empty); }
      for (int a = 0; a < kAccStages; ++a) {
        mbar_init(&aux->tmem_full[a], kTmemFullCount);
        mbar_init(&aux->tmem_empty[a], kTmemEmptyCount);
      }
      const uint32_t ring_empty = ring_empty_count(geom);
      for (int i = 0; i < kSchedStages; ++i) { mbar_init(&aux->ring.full[i], 1); mbar_init(&aux->ring.empty[i], ring_empty); }
      mbar_fence_init();  // release.cluster: peers multicast into / arrive on these barriers
    }
    if (warp == kWarpTmem) {  // Allocator1Sm/2Sm: one full warp, same warp id in both CTAs
      tmem_alloc<kCtaGroup>(smem_u32(&aux->tmem_base), kTmemCols);
      tmem_relinquish<kCtaGroup>();
    }
    tcgen05_fence_before();
    sync_cluster_or_cta();  // barrier inits visible cluster-wide before any multicast (P90:1364-1385)
    tcgen05_fence_after();
    tmem_base = aux->tmem_base;
  }

  FUSEGEMM_DEVICE TileStream<kDynamic> tile_stream() const {
    return TileStream<kDynamic>(&aux->ring, unit, num_units, uint32_t(geom.base), rank);
  }

  // ---- TMA producer (whole warp; lane 0 issues) -------------------------------------------------
  // load(tile, k_block, full_barrier, stage) issues this CTA's TMA loads of one stage (through
  // load_slice / load_whole, which multicast shared boxes); it runs on lane 0 only, right after
  // the stage's `empty` wait (tma.cuh DeviceTmap reuse rule; and every CTA a multicast reaches
  // has released the stage: its MMA unit is one of the empty barrier's arrivals).
  // k_blocks: every tile's count, or a callable giving a tile's (tile_k_blocks).
  // kWarpLoads: load runs on every lane (after lane 0's expect_tx), for loads the lanes share
  // (gathered rows: each lane's TMA gather4 of four rows); it decides itself what lane 0 alone does.
  // done() runs on every lane after the last stage's load and before the tail's waits (lanes that
  // publish their copies late publish the rest there: the tail waits on the MMA, which waits on them).
  template <bool kWarpLoads = false, class Params, class Sched, class KBlocks, class Load, class Done = NoDone>
  FUSEGEMM_DEVICE void producer(const Params& p, const Sched& sched, const KBlocks& k_blocks, Load&& load,
                                Done&& done = Done{}) {
    auto ts = tile_stream();
    PipeState<kStages> ps;
    for (;;) {
      const auto tile = sched.tile(ts.next());
      if (!tile.valid()) break;
      const int nk = tile_k_blocks(k_blocks, tile);
      for (int kb = 0; kb < nk; ++kb) {
        mbar_wait(&aux->empty[ps.index], ps.phase ^ 1u);
        if constexpr (kWarpLoads) {
          if (lane == 0 && is_leader) mbar_arrive_expect_tx(&aux->full[ps.index], kTxBytes);
          __syncwarp();   // (the stage's bytes are expected before any lane's load can complete)
          load(tile, kb, &aux->full[ps.index], ps.index);
        } else if (lane == 0) {
          if (is_leader) mbar_arrive_expect_tx(&aux->full[ps.index], kTxBytes);
          load(tile, kb, &aux->full[ps.index], ps.index);
        }
        __syncwarp();
        ps.advance();
      }
    }
    done();
    // Producer tail (P90 producer_tail): every commit arrival on our empty barriers (from every
    // MMA unit of our cluster row and column) has landed before the CTA may exit.
    for (int s = 0; s < kStages; ++s) { mbar_wait(&aux->empty[ps.index], ps.phase ^ 1u); ps.advance(); }
  }

  // Multicast roles (cluster.cuh): A and SFA are shared along cluster N; B and SFB along
  // cluster M when the block's MMA units multiply the same B.
  static constexpr Share share_a_of(const Geom& g) {
    return Share{kMulticast && g.a_group() > 1, g.a_group(), g.a_member(), g.a_mask()};
  }
  static constexpr Share share_b_of(const Geom& g, bool same_b) {
    return Share{kMulticast && same_b && g.b_group() > 1, g.b_group(), g.b_member(), g.b_mask()};
  }
  FUSEGEMM_DEVICE Share share_a() const { return share_a_of(geom); }
  FUSEGEMM_DEVICE Share share_b(bool same_b) const { return share_b_of(geom, same_b); }
  // Slice i of a sliced operand box / the whole box of k-block kb: loaded privately, or by its
  // issuer only and multicast to the share group (each destination's pair leader counts the
  // bytes). Every slice lands at the same offset in every destination.
  template <int kDims>
  FUSEGEMM_DEVICE void load_slice(const Share& sh, int i, const CUtensorMap* desc, uint64_t* bar, void* smem,
                                  int c0, int c1, int c2 = 0, int c3 = 0, CacheHint hint = CacheHint::kNormal) const {
    if (!sh.shared) tma_load_nd<kCtaGroup, kDims>(desc, bar, smem, c0, c1, c2, c3, hint);
    else if (sh.issues_slice(i)) tma_load_mc_nd<kCtaGroup, kDims>(desc, bar, smem, sh.mask, c0, c1, c2, c3, hint);
  }
  template <int kDims>
  FUSEGEMM_DEVICE void load_whole(const Share& sh, int kb, const CUtensorMap* desc, uint64_t* bar, void* smem,
                                  int c0, int c1, int c2 = 0, int c3 = 0, CacheHint hint = CacheHint::kNormal) const {
    if (!sh.shared) tma_load_nd<kCtaGroup, kDims>(desc, bar, smem, c0, c1, c2, c3, hint);
    else if (sh.issues_whole(kb)) tma_load_mc_nd<kCtaGroup, kDims>(desc, bar, smem, sh.mask, c0, c1, c2, c3, hint);
  }

  // ---- MMA issuer (leader CTA, whole warp; one elected lane issues and commits) -------------
  // issue(d_tmem, stage, accumulate) issues the stage's UTCCPs and MMAs (accumulate = false
  // only for the first k-block of a tile, bug #14).
  template <class Sched, class KBlocks, class Issue>
  FUSEGEMM_DEVICE void mma_loop(const Sched& sched, const KBlocks& k_blocks, Issue&& issue) {
    auto ts = tile_stream();
    PipeState<kStages> ps;
    PipeState<kAccStages> as;
    for (;;) {
      const auto tile = sched.tile(ts.next());
      if (!tile.valid()) break;
      mbar_wait(&aux->tmem_empty[as.index], as.phase ^ 1u);
      tcgen05_fence_after();
      const uint32_t d_tmem = tmem_base + uint32_t(as.index * kAccStride);
      const int nk = tile_k_blocks(k_blocks, tile);
      for (int kb = 0; kb < nk; ++kb) {
        mbar_wait(&aux->full[ps.index], ps.phase);
        tcgen05_fence_after();
        if (elect_one()) {  // the lane that issues is the lane that commits (bug #7)
          issue(d_tmem, ps.index, kb > 0);
          commit_stage(&aux->empty[ps.index]);
          if (kb == nk - 1) commit_acc(&aux->tmem_full[as.index]);
        }
        __syncwarp();
        ps.advance();
      }
      if (nk == 0) {  // nothing to multiply: hand over at once (epilogue writes zeros)
        if (elect_one()) commit_acc(&aux->tmem_full[as.index]);
        __syncwarp();
      }
      as.advance();
    }
    // Accumulator producer tail (KRN:783-803): all epilogue arrivals, remote ones included.
    for (int a = 0; a < kAccStages; ++a) { mbar_wait(&aux->tmem_empty[as.index], as.phase ^ 1u); as.advance(); }
  }

  // Stage release: to every CTA whose producer may have written this MMA unit's smem (P100:739-757
  // consumer_release: umma_arrive_multicast[_2x1SM] with the kRowCol mask); a lone CTA commits
  // plainly.
  FUSEGEMM_DEVICE void commit_stage(uint64_t* bar) const {
    if constexpr (kCtaGroup == 1) {
      if (geom.size() == 1) umma_commit<1>(smem_u32(bar));
      else umma_commit_multicast<1>(smem_u32(bar), mask_commit);
    } else {
      umma_commit_multicast<2>(smem_u32(bar), mask_commit);
    }
  }
  // Accumulator full: this CTA, or both CTAs of the pair (P100:258-268).
  FUSEGEMM_DEVICE void commit_acc(uint64_t* bar) const {
    if constexpr (kCtaGroup == 1) umma_commit<1>(smem_u32(bar));
    else umma_commit_multicast<2>(smem_u32(bar), geom.pair_mask());
  }

  // ---- accumulator consumer (epilogue warps) -----------------------------------------------------
  // body(tile, acc_col) must call release_accumulator() once, after its last tcgen05.ld's wait.
  // A phantom tile (past the problem edge, run for the cluster's barrier protocol) is released
  // at once and never reaches the body.
  template <class Sched, class Body>
  FUSEGEMM_DEVICE void epilogue_loop(const Sched& sched, Body&& body) {
    auto ts = tile_stream();
    PipeState<kAccStages> as;
    for (;;) {
      const auto tile = sched.tile(ts.next());
      if (!tile.valid()) break;
      mbar_wait(&aux->tmem_full[as.index], as.phase);
      tcgen05_fence_after();
      cur_acc = as.index;
      if (tile.in_range) body(tile, uint32_t(as.index * kAccStride));
      else release_accumulator();
      as.advance();
    }
  }

  // ld -> wait::ld -> fence::before_thread_sync -> arrive (bug #13); a follower's 128 threads
  // arrive on the leader's barrier (P100:272-276).
  FUSEGEMM_DEVICE void release_accumulator() const {
    tcgen05_fence_before();
    if (kCtaGroup == 1 || is_leader) mbar_arrive(&aux->tmem_empty[cur_acc]);
    else mbar_arrive_remote(&aux->tmem_empty[cur_acc], rank & ~1u);
  }

  template <class Params>
  FUSEGEMM_DEVICE void claim_tiles(const Params& p, int num_tiles) {
    if constexpr (kDynamic) {
      if (rank == uint32_t(geom.base) && lane == 0) {
        run_tile_claimer(&aux->ring, static_cast<unsigned int*>(p.sched_counter), unit, num_units,
                         num_tiles, rank, geom.size());
      }
    }
  }

  // Every role is done: the last tcgen05.ld waited, the last MMA completed (its tmem_full
  // commit was consumed), all remote arrivals landed (producer tails + the barrier below).
  FUSEGEMM_DEVICE void teardown() {
    __syncwarp();
    tcgen05_fence_before();
    sync_cluster_or_cta();
    if (warp == kWarpTmem) {
      tcgen05_fence_after();
      tmem_dealloc<kCtaGroup>(tmem_base, kTmemCols);
    }
  }
};

}  // namespace fusegemm::sm100
