// Persistent, warp-specialized BF16 grouped GEMM for sm_90a (seed 001).
//
//   warpgroups 0 .. kConsumerWGs-1 : WGMMA consumers, 64 rows of the tile each, FP32
//                                    accumulators in registers, then the epilogue
//   last warpgroup                 : producer; one elected thread schedules tiles and
//                                    issues the TMA loads of A and B
//
// Pipeline: kStages smem stages of (TILE_M x 64) A + (TILE_N x 64) B, SWIZZLE_128B,
// guarded by full (1 arrival + TMA bytes) and empty (one arrival per consumer warp)
// mbarriers. Tiles flow from the producer to the consumers through a small ring in smem
// (kTileRing slots, own full/empty barriers), so static and dynamic scheduling differ only
// in how the producer picks the next linear tile; the consumers never touch the scheduler.
// The producer runs ahead across tiles, so the next tile's loads overlap this epilogue.
//
// K-grouped problems (Config::kKGrouped: a weight gradient dW_e = dY_e^T X_e, the reduction
// over each expert's tokens): tiles are (expert, M block, N block) of the (L, M, N) output, the
// K range of a tile is its expert's token rows [offsets[e-1], offsets[e]), and both operands are
// token-major (MN-major: dY is tokens x M, X tokens x N), loaded as 64-element chunks of 64
// token rows like an N-major B. An expert without tokens gets zeros (alpha * 0).
//
// Epilogue (fusegemm/sm90/epilogue.cuh): each consumer warp owns 16 complete rows of the tile in
// its WGMMA fragment, so element-wise rules stage 128-byte column chunks in the warp's own padded
// smem buffer and write full cache lines (epi::WarpStagedStore), synchronising with __syncwarp
// only; other rules run the arch-neutral engine.
#pragma once

#include "fusegemm/common.cuh"
#include "fusegemm/epilogue_block.cuh"
#include "fusegemm/sm90/epilogue.cuh"
#include "fusegemm/scheduler.cuh"
#include "fusegemm/tma.cuh"
#include "fusegemm/sm90/wgmma.cuh"

// Consumer stagger: warpgroup 1 starts after warpgroup 0 has consumed this many k-blocks
// of its first tile (0 = lockstep). Both warpgroups then keep the offset, so one
// warpgroup's epilogue overlaps the other's WGMMAs instead of idling the tensor cores.
// At most kStages (the producer can run that far ahead of the slower warpgroup).
// H200: staggers of 1 and 2 k-blocks measured within run-to-run noise (+-3%), so off.
// Epilogue input prefetch: each consumer warp asks L2 for the element inputs its epilogue will
// read (dSwiGLU's C) this many k-blocks before the tile's mainloop ends (at its start when the
// mainloop is shorter; 0 = off). H200, dSwiGLU at the dsv3 shape (112 k-blocks), one run:
// 1.248 ms without, 1.212 / 1.173 / 1.132 / 1.113 ms at 8 / 4 / 16 / 32 k-blocks ahead (plain
// GEMM of the shape: 0.854 ms in that run).
#ifndef FUSEGEMM_SM90_EPI_PREFETCH
#define FUSEGEMM_SM90_EPI_PREFETCH 32
#endif

#ifndef FUSEGEMM_SM90_STAGGER
#define FUSEGEMM_SM90_STAGGER 0
#endif

namespace fusegemm {
namespace sm90 {

template <class Config>
struct GroupedGemmKernel {
  using ElementA = typename Config::ElementA;
  using ElementB = typename Config::ElementB;
  using ElementC = typename Config::ElementC;
  using ElementD = typename Config::ElementD;
  using Rule = typename Config::Rule;  // the epilogue rule (generator/registry.py row)
  static_assert(fusegemm::is_same_v<ElementA, fusegemm::bfloat16_t> && fusegemm::is_same_v<ElementB, fusegemm::bfloat16_t>,
                "sm_90a grouped kernel: BF16 A and B");
  // B: K-major (N rows of 64 K-elements per stage) or MN-major (kBMn: an N-major weight, loaded
  // as kTileN / 64 chunks of 64 K-rows x 64 N-elements; the WGMMA reads it transposed).
  static constexpr bool kBMn = Config::kBMajorMN;
  static constexpr bool kKGrouped = Config::kKGrouped;
  static constexpr bool kAMn = kKGrouped;   // A: tokens x M, M contiguous
  static_assert(!kKGrouped || (kBMn && !Config::kDiscreteB && !Config::kDynamicSched),
                "K-grouped: token-major B (b_major n), dense, static scheduling");

  static constexpr int kTileM = Config::kTileM;
  static constexpr int kTileN = Config::kTileN;
  static constexpr int kTileK = 64;  // 128 bytes of BF16: one SWIZZLE_128B row
  static_assert(kTileM == 64 || kTileM == 128, "sm_90a kernel: TILE_M must be 64 or 128");
  static_assert(kTileN == 128 || kTileN == 256, "sm_90a kernel: TILE_N must be 128 or 256");
  // No clusters on sm_90a yet (no B multicast): the kernel exports a largest cluster of one CTA
  // (kMaxClusterCtas), which the registry's sm_90a limits match (tests/unit/test_contract.py).

  static constexpr int kConsumerWGs = kTileM / 64;
  static constexpr int kConsumerWarps = 4 * kConsumerWGs;
  static constexpr int kThreads = 128 * (kConsumerWGs + 1);
  static constexpr int kAccum = kTileN / 2;  // FP32 accumulators per consumer thread

  // Shared memory plan (offsets from the 1024-aligned dynamic smem base).
  static constexpr int kABytes = kTileM * kTileK * 2;
  static constexpr int kBBytes = kTileN * kTileK * 2;
  static constexpr int kStageBytes = kABytes + kBBytes;
  // The epilogue (fusegemm/sm90/epilogue.cuh): fragment path for element-wise rules, else the
  // arch-neutral engine.
  using Engine = epi::BlockEngine<Rule, ElementC, ElementD>;
  using Epi = WgmmaEpilogue<kTileM, kTileN, Rule, ElementC, ElementD, Engine>;
  static constexpr int kEpiBytes = Epi::kBytes;
  static constexpr int kTileRing = 4;
  static constexpr int kMiscBytes = 128 /*tensor-map staging*/ + 16 * kTileRing;
  // sm_90 opt-in maximum per block (227 KB), less 1 KB that ptxas reports as static smem
  // for the 1 KB-aligned extern declaration.
  static constexpr int kSmemLimit = 232448 - 1024;
  static constexpr int kMaxStages =
      (kSmemLimit - kEpiBytes - kMiscBytes - 8 * 2 * (8 + kTileRing)) / kStageBytes;
  static constexpr int kStages = kMaxStages > 8 ? 8 : kMaxStages;
  static_assert(kStages >= 3, "not enough shared memory for a 3-stage pipeline");

  static constexpr int kOffA = 0;
  static constexpr int kOffB = kOffA + kStages * kABytes;
  static constexpr int kOffEpi = kOffB + kStages * kBBytes;
  static constexpr int kOffTmap = kOffEpi + kEpiBytes;            // 128-aligned (below)
  static constexpr int kOffRing = kOffTmap + 128;
  static constexpr int kOffBars = kOffRing + 16 * kTileRing;
  static constexpr int kNumBars = 2 * kStages + 2 * kTileRing;
  static constexpr int kSmemBytes = kOffBars + 8 * kNumBars;
  static_assert(kABytes % 1024 == 0 && kBBytes % 1024 == 0, "SW128 stages need 1 KB alignment");
  static_assert(kOffTmap % 128 == 0, "tensor-map staging must be 128-byte aligned");
  static_assert(kSmemBytes <= kSmemLimit, "shared memory plan exceeds 227 KB");

  // Register split (setmaxnreg): producer warps give registers to the consumers.
  static constexpr int kProducerRegs = 40;
  static constexpr int kConsumerRegs = kConsumerWGs == 2 ? 232 : 240;
  static_assert(kProducerRegs * 128 + kConsumerRegs * 128 * kConsumerWGs <= 65536,
                "register split exceeds the register file");

  // Slots per CTA in tmap_workspace (discrete weights): a slot is rewritten only after the
  // pipeline has drained every load issued kStages loads ago (see DeviceTmap). The host
  // reserves kTmapSlotStride (exported) slots of 128 bytes per CTA.
  static constexpr int kTmapSlots = kStages;
  static constexpr int kTmapSlotsPerCta = 8;
  static_assert(kTmapSlots <= kTmapSlotsPerCta, "more stages than reserved tensor-map slots");

  // Host contract (fusegemm/base/contract.py): A (K, rows) and B (K, N, L) maps with boxes of
  // (kTileK, kTileM) and (kTileK, kTileN), SWIZZLE_128B, in the elements' own TMA type; discrete
  // weights get kTmapSlotsPerCta slots of 128 B per CTA in tmap_workspace.
  static constexpr int kMinClusterM = 1, kMinClusterN = 1, kMaxClusterCtas = 1, kCtasPerTile = 1;
  static constexpr int kMAligned = fusegemm::kMAligned;
  // MN-major B: maps of (N, K, L) (discrete: (N, K)) with boxes of 64 N x 64 K.
  // K-grouped: A maps of (M, tokens) with boxes of 64 M x 64 tokens, kTileM / 64 per stage.
  static constexpr int kBoxAInner = kAMn ? 64 : kTileK, kBoxAOuter = kAMn ? kTileK : kTileM;
  static constexpr int kAChunks = kAMn ? kTileM / 64 : 1;  // A loads per stage
  static constexpr int kBoxBInner = kBMn ? 64 : kTileK, kBoxBOuter = kBMn ? kTileK : kTileN;
  static constexpr int kBChunks = kBMn ? kTileN / 64 : 1;  // B loads per stage
  static constexpr int kSwizzleA = 128, kSwizzleB = 128;
  static constexpr int kTmaDtypeA = TmaDtype<ElementA>::value, kTmaDtypeB = TmaDtype<ElementB>::value;
  static constexpr int kTmapSlotStride = Config::kDiscreteB ? kTmapSlotsPerCta : 0;
  static constexpr int kTmemCols = 0, kSfBoxK = 0, kSfBoxNB = 0;

  // K-grouped: (expert, M block, N block) tiles of the (L, M, N) output, M = p.m_rows.
  using Sched = fusegemm::conditional_t<kKGrouped, BatchedScheduler<kTileM, kTileN, FUSEGEMM_RASTER_GROUP>,
                                        GroupedScheduler<kTileM, kTileN, FUSEGEMM_RASTER_GROUP>>;

  template <class Params>
  static __device__ Sched make_sched(const Params& p) {
    if constexpr (kKGrouped) {
      return Sched(p.m_rows, p.n, p.num_experts);
    } else {
      return Sched(reinterpret_cast<const int*>(p.offsets), p.num_experts, p.n, p.m_rows);
    }
  }

  // First token row and k-block count of a tile: the whole K, or (K-grouped) the expert's token
  // rows, clamped to the p.k rows the operands were allocated with (offsets live on the device
  // and are unchecked: wrong ones give wrong results, never an out-of-bounds load).
  template <class Params>
  static __device__ int2 k_range(const Params& p, int expert) {
    if constexpr (kKGrouped) {
      const int* off = reinterpret_cast<const int*>(p.offsets);
      const int begin = min(expert == 0 ? 0 : __ldg(off + expert - 1), p.k);
      const int end = min(__ldg(off + expert), p.k);
      return make_int2(begin, end > begin ? (end - begin) / kTileK : 0);
    } else {
      return make_int2(0, (p.k + kTileK - 1) / kTileK);
    }
  }

  // First output row of a ring tile (expert, M block, N block, linear): the problem's row
  // (M-grouped), or the row of expert e's block in the (L * M, N) output (K-grouped).
  template <class Params>
  static __device__ int tile_row0(const Params& p, const int4& t) {
    return (kKGrouped ? t.x * p.m_rows : 0) + t.y * kTileM;
  }

  static constexpr int kStagger = kConsumerWGs == 2 ? FUSEGEMM_SM90_STAGGER : 0;
  static_assert(kStagger >= 0 && kStagger <= kStages, "stagger must be within the pipeline");
  static constexpr uint32_t kStaggerBarrier = 3;  // named barrier id (0 is __syncthreads)

  template <class Params>
  static __device__ void run(const Params& p) {
    extern __shared__ __align__(1024) uint8_t smem[];
    const int tid = threadIdx.x;
    const int wg = tid / 128;

    uint64_t* full = reinterpret_cast<uint64_t*>(smem + kOffBars);
    uint64_t* empty = full + kStages;
    uint64_t* tile_full = empty + kStages;
    uint64_t* tile_empty = tile_full + kTileRing;
    int4* ring = reinterpret_cast<int4*>(smem + kOffRing);

    if (tid == 0) {
      // SW128 tiles and descriptors assume a 1 KB aligned base; a silent misalignment
      // would produce wrong results, so stop loudly instead.
      if (smem_u32(smem) % 1024 != 0) __trap();
      for (int s = 0; s < kStages; ++s) {
        mbar_init(&full[s], 1);
        mbar_init(&empty[s], kConsumerWarps);
      }
      for (int s = 0; s < kTileRing; ++s) {
        mbar_init(&tile_full[s], 1);
        mbar_init(&tile_empty[s], kConsumerWarps);
      }
      mbar_fence_init();
    }
    __syncthreads();

    if (wg == kConsumerWGs) {
      cutlass::arch::warpgroup_reg_dealloc<kProducerRegs>();
      if (tid % 128 < 32 && elect_one()) {
        produce(p, smem, full, empty, tile_full, tile_empty, ring);
      }
    } else {
      cutlass::arch::warpgroup_reg_alloc<kConsumerRegs>();
      consume(p, smem, wg, full, empty, tile_full, tile_empty, ring);
    }
  }

  // ------------------------------------------------------------------------------------
  // Producer: one thread.
  // ------------------------------------------------------------------------------------
  template <class Params>
  static __device__ void produce(const Params& p, uint8_t* smem, uint64_t* full,
                                 uint64_t* empty, uint64_t* tile_full, uint64_t* tile_empty,
                                 int4* ring) {
    prefetch_tmap(&p.tma_a);
    prefetch_tmap(&p.tma_b);
    const Sched sched = make_sched(p);
    // Every M-grouped tile's k-blocks, hoisted out of the tile loop (K-grouped tiles take theirs
    // from k_range per tile); the M-grouped SASS is the one measured before K-grouping existed.
    const int k_blocks_all = kKGrouped ? 0 : k_range(p, 0).y;

    DeviceTmap<kTmapSlots> dtm;
    const CUtensorMap* tmap_b = &p.tma_b;
    int tmap_expert = -1;
    if constexpr (Config::kDiscreteB) {
      dtm.init(&p.tma_b,
               reinterpret_cast<CUtensorMap*>(p.tmap_workspace) + blockIdx.x * kTmapSlotsPerCta,
               reinterpret_cast<CUtensorMap*>(smem + kOffTmap));
    }

    StaticWalk walk(blockIdx.x, gridDim.x);
    int stage = 0, slot = 0;
    uint32_t phase = 0, ring_phase = 0;
    while (true) {
      const int linear = Config::kDynamicSched
                             ? dynamic_claim(reinterpret_cast<unsigned int*>(p.sched_counter))
                             : walk.claim();
      const GroupedTile t = sched.tile(linear);

      mbar_wait(&tile_empty[slot], ring_phase ^ 1);
      ring[slot] = make_int4(t.expert, t.m_block, t.n_block, t.linear);
      mbar_arrive(&tile_full[slot]);
      if (++slot == kTileRing) { slot = 0; ring_phase ^= 1; }
      if (!t.valid()) break;

      const int m0 = t.m_block * kTileM;
      const int n0 = t.n_block * kTileN;
      int k0 = 0, num_k_blocks = k_blocks_all;
      if constexpr (kKGrouped) {
        const int2 kr = k_range(p, t.expert);
        k0 = kr.x;
        num_k_blocks = kr.y;
      }
      for (int kb = 0; kb < num_k_blocks; ++kb) {
        mbar_wait(&empty[stage], phase ^ 1);
        if constexpr (Config::kDiscreteB) {
          // Rewrite only here, after the empty wait (see kTmapSlots).
          if (kb == 0 && t.expert != tmap_expert) {
            const uint64_t* ptrs = reinterpret_cast<const uint64_t*>(p.b_ptrs);
            tmap_b = dtm.update(reinterpret_cast<const void*>(ptrs[t.expert]));
            tmap_expert = t.expert;
          }
        }
        mbar_arrive_expect_tx(&full[stage], kStageBytes);
        if constexpr (kKGrouped) {
          uint8_t* sa = smem + kOffA + stage * kABytes;
          uint8_t* sb = smem + kOffB + stage * kBBytes;
#pragma unroll
          for (int c = 0; c < kAChunks; ++c) {
            tma_load_2d(&p.tma_a, &full[stage], sa + c * kMnChunkBytes, m0 + 64 * c, k0 + kb * kTileK);
          }
#pragma unroll
          for (int c = 0; c < kBChunks; ++c) {
            tma_load_2d(&p.tma_b, &full[stage], sb + c * kMnChunkBytes, n0 + 64 * c, k0 + kb * kTileK);
          }
        } else {
          tma_load_2d(&p.tma_a, &full[stage], smem + kOffA + stage * kABytes, kb * kTileK, m0);
          uint8_t* sb = smem + kOffB + stage * kBBytes;
          if constexpr (kBMn) {
#pragma unroll
            for (int c = 0; c < kBChunks; ++c) {
              if constexpr (Config::kDiscreteB) {
                tma_load_2d(tmap_b, &full[stage], sb + c * kMnChunkBytes, n0 + 64 * c, kb * kTileK);
              } else {
                tma_load_3d(tmap_b, &full[stage], sb + c * kMnChunkBytes, n0 + 64 * c, kb * kTileK, t.expert);
              }
            }
          } else if constexpr (Config::kDiscreteB) {
            tma_load_2d(tmap_b, &full[stage], sb, kb * kTileK, n0);
          } else {
            tma_load_3d(tmap_b, &full[stage], sb, kb * kTileK, n0, t.expert);
          }
        }
        if (++stage == kStages) { stage = 0; phase ^= 1; }
      }
    }
  }

  // ------------------------------------------------------------------------------------
  // Consumers: one warpgroup per 64 rows.
  // ------------------------------------------------------------------------------------
  template <class Params>
  static __device__ void consume(const Params& p, uint8_t* smem, int wg, uint64_t* full,
                                 uint64_t* empty, uint64_t* tile_full, uint64_t* tile_empty,
                                 int4* ring) {
    const int lane = threadIdx.x % 32;
    const int warp = threadIdx.x / 32;  // 0 .. kConsumerWarps-1
    // Every M-grouped tile's k-blocks, hoisted out of the tile loop (K-grouped tiles take theirs
    // from k_range per tile); the M-grouped SASS is the one measured before K-grouping existed.
    const int k_blocks_all = kKGrouped ? 0 : k_range(p, 0).y;
    // A: this warpgroup's 64 rows; K-major rows of 128 bytes, or (K-grouped) its own MN-major
    // chunk of 64 token rows x 64 M (8 KB, the same bytes).
    const uint32_t a_base = smem_u32(smem + kOffA) + wg * 64 * 128;
    const uint32_t b_base = smem_u32(smem + kOffB);
    const uint64_t da0 = kAMn ? sw128_mnmajor_desc(a_base) : sw128_kmajor_desc(a_base);
    const uint64_t db0 = kBMn ? sw128_mnmajor_desc(b_base) : sw128_kmajor_desc(b_base);
    // K step of one k16 instruction in the descriptor's 16-byte units: 32 bytes along a K-major
    // row, 16 rows of 128 bytes in an MN-major chunk.
    constexpr int kDescStepK = kBMn ? (16 * 128) >> 4 : 2;
    constexpr int kDescStepKA = kAMn ? (16 * 128) >> 4 : 2;

    int stage = 0, slot = 0;
    uint32_t phase = 0, ring_phase = 0;
    float acc[kAccum];
    typename Epi::Partials part;
    part.reset();

    // Stagger handshake: warpgroup 0 arrives exactly once (after kStagger k-blocks of its
    // first tile, at the end of that tile if it is shorter, or on exit if it gets none);
    // warpgroup 1 waits once before its first tile.
    bool stagger_pending = kStagger > 0 && wg == 0;
    if constexpr (kStagger > 0) {
      if (wg == 1) named_barrier_sync(kStaggerBarrier, 256);
    }
    auto stagger_release = [&]() {
      if constexpr (kStagger > 0) {
        if (stagger_pending) {
          asm volatile("bar.arrive %0, %1;" ::"r"(kStaggerBarrier), "r"(256) : "memory");
          stagger_pending = false;
        }
      }
    };

    while (true) {
      mbar_wait(&tile_full[slot], ring_phase);
      const int4 t = ring[slot];
      __syncwarp();
      if (lane == 0) mbar_arrive(&tile_empty[slot]);
      if (++slot == kTileRing) { slot = 0; ring_phase ^= 1; }
      if (t.w < 0) break;

      const int num_k_blocks = kKGrouped ? k_range(p, t.x).y : k_blocks_all;
      int prev_stage = 0;
      const int prefetch_kb = FUSEGEMM_SM90_EPI_PREFETCH > 0 ? max(num_k_blocks - FUSEGEMM_SM90_EPI_PREFETCH, 0) : -1;
      for (int kb = 0; kb < num_k_blocks; ++kb) {
        if (kb == prefetch_kb) Epi::prefetch(p, tile_row0(p, t), t.z * kTileN, warp, lane);
        mbar_wait(&full[stage], phase);
        fence_acc(acc);
        cute::warpgroup_arrive();
        // Descriptor address field is in 16-byte units: stage offsets and the 32-byte K
        // step are added to the low word directly.
        const uint64_t da = da0 + static_cast<uint64_t>((stage * kABytes) >> 4);
        const uint64_t db = db0 + static_cast<uint64_t>((stage * kBBytes) >> 4);
#pragma unroll
        for (int k = 0; k < kTileK / 16; ++k) {
          gmma_64xN<kTileN, kBMn, kAMn>(da + kDescStepKA * k, db + kDescStepK * k, acc, (kb > 0 || k > 0) ? 1 : 0);
        }
        cute::warpgroup_commit_batch();
        fence_acc(acc);
        // Keep one batch in flight; the one before it has finished reading its stage.
        cute::warpgroup_wait<1>();
        if (kb > 0 && lane == 0) mbar_arrive(&empty[prev_stage]);
        prev_stage = stage;
        if (++stage == kStages) { stage = 0; phase ^= 1; }
        if (kb + 1 == kStagger) stagger_release();
      }
      stagger_release();
      cute::warpgroup_wait<0>();
      fence_acc(acc);
      if (num_k_blocks > 0 && lane == 0) mbar_arrive(&empty[prev_stage]);
      if constexpr (kKGrouped) {   // (M-grouped tiles always have k-blocks: K >= 8)
        if (num_k_blocks == 0) {   // an expert without tokens: its gradient is zero
#pragma unroll
          for (int i = 0; i < kAccum; ++i) acc[i] = 0.0f;
        }
      }

      Epi::run(p, smem + kOffEpi, t.x, tile_row0(p, t), t.z * kTileN, wg, warp, lane, acc, part);
    }
    stagger_release();
    Epi::finish(part, p, warp, lane);
  }

};

}  // namespace sm90
}  // namespace fusegemm
