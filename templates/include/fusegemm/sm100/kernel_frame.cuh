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
enum : int { kFaultNone = 0, kFaultSkipMma = 1, kFaultSpill = 2, kFaultWrongFormat = 3 };
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
  return cute::is_same_v<T, cutlass::half_t> ? F16Fmt::F16 : F16Fmt::BF16;
}
constexpr uint32_t kIdescShapeMask = (0x3Fu << 17) | (0x1Fu << 24);

// ---- the frame --------------------------------------------------------------------------------
// kStageA/B/SF: bytes one CTA receives per k-block; kAccStride: TMEM columns per accumulator
// stage; kEpiSmem: epilogue staging bytes; kTmapsPerCta: device-rewritten tensor maps
// (discrete weights: B, plus SFB for block-scaled), each with kStages slots per CTA;
// kTxPerCta: bytes TMA delivers per CTA and stage (< stage bytes when A is half-loaded).
template <int kCtaGroup_, bool kDynamic, int kStageA, int kStageB, int kStageSF, int kAccStages_,
          int kAccStride, int kTmemCols_, int kEpiSmem, int kTmapsPerCta,
          int kTxPerCta = kStageA + kStageB + kStageSF>
struct KernelFrame {
  static constexpr int kCtaGroup = kCtaGroup_;
  static constexpr int kAccStages = kAccStages_;
  static constexpr int kTmemCols = kTmemCols_;
  static constexpr int kThreads = kNumWarps * 32;
  static constexpr int kStageBytes = kStageA + kStageB + kStageSF;
  static constexpr uint32_t kTxBytes = uint32_t(kTxPerCta) * kCtaGroup;  // leader expects the pair
  static constexpr int kAuxBytes = 512;
  static constexpr int kFixedBytes = 1024 /* base alignment */ + kEpiSmem + 128 * kTmapsPerCta + kAuxBytes;
  static constexpr int kStagesFit = (kSmemLimit - kFixedBytes) / kStageBytes;
  static constexpr int kStages = kStagesFit < kMaxStages ? kStagesFit : kMaxStages;
  // Device-rewritten maps (tma.cuh DeviceTmap): kStages slots per map, rotated; the host
  // reserves 8 slots of 128 B per map per CTA, CTA c at slot c * kTmapSlotStride
  // (ops/grouped_gemm.py TMAP_SLOTS_PER_CTA; block-scaled discrete: [B x 8][SFB x 8]).
  static constexpr int kTmapSlots = kStages;
  static constexpr int kTmapSlotsPerMap = 8;
  static constexpr int kTmapSlotStride = kTmapSlotsPerMap * (kTmapsPerCta > 0 ? kTmapsPerCta : 1);
  // Shared-memory plan (offsets from a 1024-aligned base). Every A/B stage starts 1024-aligned:
  // the SW128 descriptors carry base_offset 0 (bug #5).
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

  // Arrivals per phase (sm100-protocol.md §1 table, §4).
  static constexpr uint32_t kFullCount = 1, kEmptyCount = 1, kTmemFullCount = 1;
  static constexpr uint32_t kTmemEmptyCount = 32 * kNumEpiWarps * kCtaGroup;
  // Ring consumers: TMA + MMA + epilogue warps of the leader, TMA + epilogue warps of a follower.
  static constexpr uint32_t kRingEmptyCount = (2 + kNumEpiWarps) + (kCtaGroup - 1) * (1 + kNumEpiWarps);

  uint8_t* base;
  Aux* aux;
  uint8_t* staging;
  CUtensorMap* tmap_staging;
  int warp, lane;
  uint32_t rank;
  bool is_leader;
  int cta_half;
  int unit, num_units;
  uint32_t tmem_base;
  int cur_acc = 0;

  FUSEGEMM_DEVICE uint8_t* smem_a(int s) const { return base + kOffA + s * kStageA; }
  FUSEGEMM_DEVICE uint8_t* smem_b(int s) const { return base + kOffB + s * kStageB; }
  FUSEGEMM_DEVICE uint8_t* smem_sf(int s) const { return base + kOffSF + s * kStageSF; }

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
    is_leader = kCtaGroup == 1 || (rank & 1u) == 0;
    cta_half = kCtaGroup == 2 ? int(rank & 1u) : 0;
    const uint32_t ncta = cluster_num_ctas();
    unit = int((cluster_linear_id() * ncta + rank) / kCtaGroup);
    num_units = int(cluster_count() * ncta / kCtaGroup);

    if (warp == kWarpTma && lane == 0) {
      prefetch_tmap(&p.tma_a);
      prefetch_tmap(&p.tma_b);
      if constexpr (kStageSF > 0) { prefetch_tmap(&p.tma_sfa); prefetch_tmap(&p.tma_sfb); }
    }
    // cta_group::2 allocation needs the peer CTA running: cluster barrier first (KRN:614).
    if constexpr (kCtaGroup == 2) cluster_sync_all();
    if (warp == kWarpMma && lane == 0) {
      for (int s = 0; s < kStages; ++s) { mbar_init(&aux->full[s], kFullCount); mbar_init(&aux->empty[s], kEmptyCount); }
      for (int a = 0; a < kAccStages; ++a) {
        mbar_init(&aux->tmem_full[a], kTmemFullCount);
        mbar_init(&aux->tmem_empty[a], kTmemEmptyCount);
      }
      for (int i = 0; i < kSchedStages; ++i) { mbar_init(&aux->ring.full[i], 1); mbar_init(&aux->ring.empty[i], kRingEmptyCount); }
      mbar_fence_init();
    }
    if (warp == kWarpTmem) {  // Allocator1Sm/2Sm: one full warp, same warp id in both CTAs
      tmem_alloc<kCtaGroup>(smem_u32(&aux->tmem_base), kTmemCols);
      tmem_relinquish<kCtaGroup>();
    }
    tcgen05_fence_before();
    if constexpr (kCtaGroup == 2) cluster_sync_all(); else __syncthreads();
    tcgen05_fence_after();
    tmem_base = aux->tmem_base;
  }

  // ---- TMA producer (whole warp; lane 0 issues) -------------------------------------------------
  // load(tile, k_block, full_barrier, stage) issues this CTA's TMA loads of one stage; it runs
  // on lane 0 only, right after the stage's `empty` wait (tma.cuh DeviceTmap reuse rule).
  template <class Params, class Sched, class Load>
  FUSEGEMM_DEVICE void producer(const Params& p, const Sched& sched, int k_blocks, Load&& load) {
    TileStream<kDynamic, kCtaGroup> ts(&aux->ring, unit, num_units);
    PipeState<kStages> ps;
    for (;;) {
      const auto tile = sched.tile(ts.next(is_leader));
      if (!tile.valid()) break;
      for (int kb = 0; kb < k_blocks; ++kb) {
        mbar_wait(&aux->empty[ps.index], ps.phase ^ 1u);
        if (lane == 0) {
          if (is_leader) mbar_arrive_expect_tx(&aux->full[ps.index], kTxBytes);
          load(tile, kb, &aux->full[ps.index], ps.index);
        }
        __syncwarp();
        ps.advance();
      }
    }
    // Producer tail (P90 producer_tail): every commit arrival on our empty barriers has landed
    // before the CTA may exit.
    for (int s = 0; s < kStages; ++s) { mbar_wait(&aux->empty[ps.index], ps.phase ^ 1u); ps.advance(); }
  }

  // ---- MMA issuer (leader CTA, whole warp; one elected lane issues and commits) -------------
  // issue(d_tmem, stage, accumulate) issues the stage's UTCCPs and MMAs (accumulate = false
  // only for the first k-block of a tile, bug #14).
  template <class Sched, class Issue>
  FUSEGEMM_DEVICE void mma_loop(const Sched& sched, int k_blocks, Issue&& issue) {
    TileStream<kDynamic, kCtaGroup> ts(&aux->ring, unit, num_units);
    PipeState<kStages> ps;
    PipeState<kAccStages> as;
    for (;;) {
      const auto tile = sched.tile(ts.next(true));
      if (!tile.valid()) break;
      mbar_wait(&aux->tmem_empty[as.index], as.phase ^ 1u);
      tcgen05_fence_after();
      const uint32_t d_tmem = tmem_base + uint32_t(as.index * kAccStride);
      for (int kb = 0; kb < k_blocks; ++kb) {
        mbar_wait(&aux->full[ps.index], ps.phase);
        tcgen05_fence_after();
        if (elect_one()) {  // the lane that issues is the lane that commits (bug #7)
          issue(d_tmem, ps.index, kb > 0);
          commit(&aux->empty[ps.index]);
          if (kb == k_blocks - 1) commit(&aux->tmem_full[as.index]);
        }
        __syncwarp();
        ps.advance();
      }
      if (k_blocks == 0) {  // nothing to multiply: hand over at once (epilogue writes zeros)
        if (elect_one()) commit(&aux->tmem_full[as.index]);
        __syncwarp();
      }
      as.advance();
    }
    // Accumulator producer tail (KRN:783-803): all epilogue arrivals, remote ones included.
    for (int a = 0; a < kAccStages; ++a) { mbar_wait(&aux->tmem_empty[as.index], as.phase ^ 1u); as.advance(); }
  }

  // tcgen05.commit: 1 CTA plain; a pair multicasts to both CTAs' barriers (P100:739-757).
  FUSEGEMM_DEVICE void commit(uint64_t* bar) const {
    if constexpr (kCtaGroup == 1) umma_commit<1>(smem_u32(bar));
    else umma_commit_multicast<2>(smem_u32(bar), uint16_t(3u << rank));
  }

  // ---- accumulator consumer (epilogue warps) -----------------------------------------------------
  // body(tile, acc_col) must call release_accumulator() once, after its last tcgen05.ld's wait.
  template <class Sched, class Body>
  FUSEGEMM_DEVICE void epilogue_loop(const Sched& sched, Body&& body) {
    TileStream<kDynamic, kCtaGroup> ts(&aux->ring, unit, num_units);
    PipeState<kAccStages> as;
    for (;;) {
      const auto tile = sched.tile(ts.next(is_leader));
      if (!tile.valid()) break;
      mbar_wait(&aux->tmem_full[as.index], as.phase);
      tcgen05_fence_after();
      cur_acc = as.index;
      body(tile, uint32_t(as.index * kAccStride));
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
      if (is_leader && lane == 0) {
        run_tile_claimer<kCtaGroup>(&aux->ring, static_cast<unsigned int*>(p.sched_counter), unit,
                                    num_units, num_tiles);
      }
    }
  }

  // Every role is done: the last tcgen05.ld waited, the last MMA completed (its tmem_full
  // commit was consumed), all remote arrivals landed (producer tails + the barrier below).
  FUSEGEMM_DEVICE void teardown() {
    __syncwarp();
    tcgen05_fence_before();
    if constexpr (kCtaGroup == 2) cluster_sync_all(); else __syncthreads();
    if (warp == kWarpTmem) {
      tcgen05_fence_after();
      tmem_dealloc<kCtaGroup>(tmem_base, kTmemCols);
    }
  }
};

}  // namespace fusegemm::sm100
