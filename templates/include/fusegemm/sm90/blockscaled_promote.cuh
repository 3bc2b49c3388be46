// sm_90a block-scaled GEMM, design (a): FP8 WGMMA + FP32 scale promotion (MXFP8: e4m3 / e5m2 A and B, E8M0 scales per 32 K) carrying the
// spec's epilogue rule: grouped over padded_offsets (seeds 000, 002, 003) or batched dense
// (kBatched, seed 004). The epilogue, scheduler, TMA loads and host contract are the ones the
// sm_100a kernels use; only the MMA and accumulator path is Hopper's.
//
// Mainloop (issue 10, design (a)): one FP8 WGMMA per 32-K block writes a temporary FP32
// accumulator set, which is then promoted into the real accumulators with that block's scales,
//     acc[r][c] += tmp[r][c] * (sfa[r] * sfb[c]),
// while the next block's WGMMA runs into the other temporary set. DeepGEMM promotes once per 128 K
// with one B scale per tile; MX scales change per 32 K and per column, so promotion costs one FMUL
// and one FFMA per accumulator element per 32 K -- it, not the tensor cores, bounds this kernel.
// The promoted accumulators never pass through FP8's limited-precision WGMMA accumulation for
// more than 32 products.
//
// Roles (384 threads):
//   warpgroups 0-1 : consumers, 64 rows each of the 128-row tile: WGMMA, promotion, epilogue
//   warpgroup 2    : warp 0, one elected thread: tile schedule and TMA loads (A, B, SFA, SFB);
//                    warps 1-3, each owning every third stage: turn a fill's scale bytes into
//                    FP32 tables in the order the consumers' fragment columns read them (two LDS
//                    per row pair, eight LDS.128 per 32 columns), and zero the scales of 32-K
//                    blocks past K so that SF padding bytes (NaN in a 0xFF-filled buffer) never
//                    meet the zero-filled data.
// Pipeline: kStages stages of A (128 x 128 B), B (128 x 128 B), SFA + SFB (one 512-byte atom
// each) and their tables. full[s]: TMA bytes; sf_ready[s]: the stage's converter warp (after the
// previous fill's release and full);
// empty[s]: one arrival per consumer thread once the stage's last WGMMA and promotion are done.
// A tile of kTileN 256 runs as two 128-column passes: acc plus two temporary sets of a 64 x 128
// fragment are 192 registers per thread, 64 x 256 would not fit.
//
// Host contract (fusegemm/base/contract.py; fusegemm/ops/blockscaled.py encodes the maps):
//   tma_a   uint8 (K bytes, rows) grouped or (K bytes, M, L) batched; box (128, 128), SWIZZLE_128B
//   tma_b   uint8 (K bytes, N, L) dense or (K bytes, N) discrete template; box (128, 128), SW128
//   tma_sfa / tma_sfb  uint32 view of the SF atoms {128, ceil(sfk/4), ceil(mn/128), L}
//           (grouped SFA: L = 1; discrete SFB: a per-expert template with L = 1), box {128, 1, 1, 1}
//   discrete weights: kTmapSlotStride slots of 128 B per CTA in tmap_workspace ([B x 8][SFB x 8])
#pragma once

#include "fusegemm/common.cuh"
#include "fusegemm/epilogue_block.cuh"
#include "fusegemm/scheduler.cuh"
#include "fusegemm/tma.cuh"
#include "fusegemm/sm90/blockscaled_common.cuh"
#include "fusegemm/sm90/epilogue.cuh"
#include "fusegemm/sm90/wgmma.cuh"

#ifndef FUSEGEMM_SM90_BS_TEMP_SETS
#define FUSEGEMM_SM90_BS_TEMP_SETS 1
#endif

namespace fusegemm {
namespace sm90 {

template <class Config>
struct BlockScaledPromoteKernel : ScaledHostContract<Config::kDiscreteB> {
  using Checks = ScaledConfigChecks<Config>;
  // Naming the struct does not instantiate it: sizeof does, so its static_asserts hold here too.
  static_assert(sizeof(Checks) > 0, "sm_90a block-scaled configuration checks");
  static_assert(!Config::kGatherA, "gathered A: the blockwise kernel's (the registry's limits)");
  using ElementAB = typename Config::ElementA;
  using ElementC = typename Config::ElementC;
  using ElementD = typename Config::ElementD;
  using Rule = typename Config::Rule;  // generated from the spec's epilogue

  static constexpr bool kBatched = Config::kBatched, kDiscreteB = Config::kDiscreteB;
  static constexpr int kTileM = Config::kTileM;
  static constexpr int kTileN = Config::kTileN;
  static constexpr int kMmaN = 128;                 // columns per pass
  static constexpr int kPasses = kTileN / kMmaN;
  static constexpr int kTileK = 128;                // K elements (= bytes) per stage: one SW128 row
  static constexpr int kSubK = 32;                  // one WGMMA and one scale per 32 K
  static constexpr int kSubBlocks = kTileK / kSubK;
  static_assert(kSubBlocks == 4, "the mainloop alternates two temporary sets over an even count");

  static constexpr int kConsumerWGs = kTileM / 64;
  static constexpr int kConsumerWarps = 4 * kConsumerWGs;
  static constexpr int kThreads = 128 * (kConsumerWGs + 1);
  static constexpr int kAccum = kMmaN / 2;
  static constexpr int kConverters = 3;  // warps 1-3 of the producer warpgroup
  // Temporary accumulator sets (FUSEGEMM_SM90_BS_TEMP_SETS): 2 overlaps a warpgroup's promotion
  // with its own next WGMMA; 1 relies on the other warpgroup's WGMMAs for the overlap.
  static constexpr int kTempSets = FUSEGEMM_SM90_BS_TEMP_SETS;
  static_assert(kTempSets == 1 || kTempSets == 2, "one or two temporary accumulator sets");

  using Engine = epi::BlockEngine<Rule, ElementC, ElementD, kBatched, Config::kCMajorM, Config::kDiscreteColSfd>;
  using Epi = WgmmaEpilogue<kTileM, kMmaN, Rule, ElementC, ElementD, Engine, kBatched,
                            kScaledForceEngine<Config>>;

  // Shared memory plan (offsets from the 1024-aligned dynamic smem base).
  static constexpr int kABytes = kTileM * kTileK;
  static constexpr int kBBytes = kMmaN * kTileK;
  static constexpr int kSfAtomBytes = 512;           // 128 MN x 4 scales
  static constexpr int kSfRawBytes = 2 * kSfAtomBytes;
  // Tables per stage: SFA [kk][128 rows]; SFB [kk][q = col%8/2][j = col/8][col%2] with the q rows
  // padded to 36 floats so that the four q's LDS.128 hit distinct banks.
  static constexpr int kSfbQPitch = 36;
  static constexpr int kSfaTab = kSubBlocks * 128;
  static constexpr int kSfbKkPitch = 4 * kSfbQPitch;
  static constexpr int kSfbTab = kSubBlocks * kSfbKkPitch;
  static constexpr int kTabBytes = 4 * (kSfaTab + kSfbTab);
  static constexpr int kStageBytes = kABytes + kBBytes + kSfRawBytes + kTabBytes;
  static constexpr int kEpiBytes = Epi::kBytes;
  static constexpr int kTileRing = 4;
  static constexpr int kSmemLimit = 232448 - 1024;
  static constexpr int kFixedBytes = kEpiBytes + 127 + 2 * 128 + 16 * kTileRing + 8 * (3 * 8 + 2 * kTileRing);
  static constexpr int kMaxStages = (kSmemLimit - kFixedBytes) / kStageBytes;
  static constexpr int kStages = kMaxStages > 8 ? 8 : kMaxStages;
  static_assert(kStages >= 3, "not enough shared memory for a 3-stage pipeline");

  static constexpr int kOffA = 0;
  static constexpr int kOffB = kOffA + kStages * kABytes;
  static constexpr int kOffSf = kOffB + kStages * kBBytes;
  static constexpr int kOffTab = kOffSf + kStages * kSfRawBytes;
  static constexpr int kOffEpi = kOffTab + kStages * kTabBytes;
  static constexpr int kOffTmap = (kOffEpi + kEpiBytes + 127) / 128 * 128;  // B and SFB staging
  static constexpr int kOffRing = kOffTmap + 2 * 128;
  static constexpr int kOffBars = kOffRing + 16 * kTileRing;
  static constexpr int kNumBars = 3 * kStages + 2 * kTileRing;
  static constexpr int kSmemBytes = kOffBars + 8 * kNumBars;
  static_assert(kABytes % 1024 == 0 && kBBytes % 1024 == 0, "SW128 stages need 1 KB alignment");
  static_assert(kOffSf % 128 == 0 && kOffTab % 16 == 0 && kOffEpi % 16 == 0, "TMA / vector alignment");
  static_assert(kSmemBytes <= kSmemLimit, "shared memory plan exceeds 227 KB");

  // One temporary set: 224 consumer registers suffice and the converter and producer get 56 (at
  // 40 they spill); two sets need every register the consumers can have (and still spill).
  static constexpr int kProducerRegs = kTempSets == 2 ? 40 : 56;
  static constexpr int kConsumerRegs = kTempSets == 2 ? 232 : 224;
  static_assert(kProducerRegs * 128 + kConsumerRegs * 128 * kConsumerWGs <= 65536,
                "register split exceeds the register file");


  // Host contract (the rest: ScaledHostContract, a dependent base: named here).
  using Contract = ScaledHostContract<Config::kDiscreteB>;
  using Contract::kTmapSlotsPerMap;
  using Contract::kTmapSlotStride;
  // Discrete weights: B and SFB maps rewritten per expert (DeviceTmap), one slot per stage.
  static constexpr int kTmapSlots = kStages;
  static_assert(kTmapSlots <= kTmapSlotsPerMap, "more stages than reserved tensor-map slots");
  static constexpr int kBoxAInner = kTileK, kBoxAOuter = kTileM, kBoxBInner = kTileK, kBoxBOuter = kMmaN;
  static constexpr int kSwizzleA = 128, kSwizzleB = 128;
  static constexpr int kSfBoxK = 1, kSfBoxNB = 1;
  static constexpr uint32_t kTxBytes = kABytes + kBBytes + kSfRawBytes;

  using Schedule = ScaledSchedule<kTileM, kTileN, kBatched>;
  using Ring = TileRing<kTileRing>;
  using Maps = WeightMaps<kDiscreteB, kTmapSlots, kTmapSlotsPerMap>;

  struct Bars {
    uint64_t* full;
    uint64_t* sf_ready;
    uint64_t* empty;
    Ring ring;
    const uint8_t* tabs;  // the stages' scale tables
  };

  template <class Params>
  static __device__ void run(const Params& p) {
    extern __shared__ __align__(1024) uint8_t smem[];
    const int tid = threadIdx.x;
    const int wg = tid / 128;
    uint64_t* bars = reinterpret_cast<uint64_t*>(smem + kOffBars);
    const Bars b{bars, bars + kStages, bars + 2 * kStages,
                 Ring{bars + 3 * kStages, bars + 3 * kStages + kTileRing, reinterpret_cast<int4*>(smem + kOffRing)},
                 smem + kOffTab};
    if (tid == 0) {
      if (smem_u32(smem) % 1024 != 0) __trap();  // SW128 descriptors assume a 1 KB aligned base
      for (int s = 0; s < kStages; ++s) {
        mbar_init(&b.full[s], 1);
        // Every lane arrives on the barriers that order table stores and loads: each lane's own
        // release covers its own accesses (lane 0 after __syncwarp covers them only through
        // __syncwarp's ordering, which racecheck does not model).
        mbar_init(&b.sf_ready[s], 32);
        mbar_init(&b.empty[s], 32 * kConsumerWarps);
      }
      for (int s = 0; s < kTileRing; ++s) {
        mbar_init(&b.ring.full[s], 1);
        mbar_init(&b.ring.empty[s], kConsumerWarps + kConverters);  // consumer and converter warps
      }
      mbar_fence_init();
    }
    __syncthreads();

    if (wg == kConsumerWGs) {
      cutlass::arch::warpgroup_reg_dealloc<kProducerRegs>();
      const int warp = (tid % 128) / 32;
      if (warp == 0 && elect_one()) produce(p, smem, b);
      if (warp >= 1) convert(p, smem, b, warp - 1, tid % 32);
    } else {
      cutlass::arch::warpgroup_reg_alloc<kConsumerRegs>();
      consume(p, smem, b, wg);
    }
  }

  FUSEGEMM_DEVICE static int k_blocks(int k) { return (k + kTileK - 1) / kTileK; }

  // ------------------------------------------------------------------------------------
  // Producer: one thread.
  // ------------------------------------------------------------------------------------
  template <class Params>
  static __device__ void produce(const Params& p, uint8_t* smem, const Bars& b) {
    const auto sched = Schedule::make(p);
    const int num_k_blocks = k_blocks(p.k);
    Maps maps;
    maps.init(p, reinterpret_cast<CUtensorMap*>(smem + kOffTmap), kTmapSlotStride);

    StaticWalk walk(blockIdx.x, gridDim.x);
    typename Ring::Writer ring;
    int stage = 0;
    uint32_t phase = 0;
    while (true) {
      const GroupedTile t = claim_tile<Config::kDynamicSched>(p, walk, sched);
      ring.publish(b.ring, t);
      if (!t.valid()) break;

      const int m0 = t.m_block * kTileM;
      const int l = kBatched ? t.expert : 0;           // batch coordinate of A / SFA
      const int lb = kDiscreteB ? 0 : t.expert;        // expert / batch coordinate of B / SFB
      for (int pass = 0; pass < kPasses; ++pass) {
        const int n0 = t.n_block * kTileN + pass * kMmaN;
        if (n0 >= p.n) break;
        for (int kb = 0; kb < num_k_blocks; ++kb) {
          mbar_wait(&b.empty[stage], phase ^ 1);
          maps.select(p, t.expert);  // after the empty wait (DeviceTmap: kTmapSlots stages apart)
          uint64_t* bar = &b.full[stage];
          mbar_arrive_expect_tx(bar, kTxBytes);
          uint8_t* sf = smem + kOffSf + stage * kSfRawBytes;
          // A stage is 128 K: SF atom kb.
          maps.template load_stage<kBatched>(p, bar, smem + kOffA + stage * kABytes, smem + kOffB + stage * kBBytes,
                                             sf, sf + kSfAtomBytes, kb * kTileK, kb, m0, n0, l, lb);
          if (++stage == kStages) { stage = 0; phase ^= 1; }
        }
      }
    }
  }

  // ------------------------------------------------------------------------------------
  // Scale converters: kConverters warps; warp c owns the stages s with s % kConverters == c, so
  // that one fill's conversion latency is hidden behind the others'. Per fill: 4 x 128 SFA and
  // 4 x 128 SFB bytes -> FP32 tables, 32 arrivals on sf_ready once the warp's stores are done.
  // A warp owns stages, not fills: it then waits on every phase of its stages' barriers in order,
  // and a parity wait is exact only for a waiter that is never more than one phase behind.
  // (Owning every kConverters-th *fill* instead let a warp skip phases of a stage: its parity waits
  // on empty and full could then both pass a phase early -- a race racecheck reports.)
  // ------------------------------------------------------------------------------------
  template <class Params>
  static __device__ void convert(const Params& p, uint8_t* smem, const Bars& b, int which, int lane) {
    const int num_k_blocks = k_blocks(p.k);
    const int sfk = (p.k + kSubK - 1) / kSubK;  // real 32-K blocks; later ones are padding
    typename Ring::Reader ring;
    int stage = 0;
    uint32_t phase = 0;
    int4 t;
    while (ring.next(b.ring, lane, t)) {
      for (int pass = 0; pass < kPasses; ++pass) {
        if (t.z * kTileN + pass * kMmaN >= p.n) break;
        for (int kb = 0; kb < num_k_blocks; ++kb) {
          if (stage % kConverters == which) {
            // The consumers' release of this stage's previous fill (so that the table stores
            // follow their loads), then this fill's bytes.
            mbar_wait(&b.empty[stage], phase ^ 1);
            mbar_wait(&b.full[stage], phase);
            convert_stage(smem + kOffSf + stage * kSfRawBytes,
                          reinterpret_cast<float*>(smem + kOffTab + stage * kTabBytes), kb * kSubBlocks, sfk, lane);
            mbar_arrive(&b.sf_ready[stage]);
          }
          if (++stage == kStages) { stage = 0; phase ^= 1; }
        }
      }
    }
  }

  // raw: SFA atom then SFB atom (byte (mn % 32) * 16 + (mn / 32) * 4 + k); g0: the fill's first
  // 32-K block. Lane's word i of an atom holds MN = lane + 32 i, all four k.
  FUSEGEMM_DEVICE static void convert_stage(const uint8_t* raw, float* ta, int g0, int sfk, int lane) {
    const uint4 wa = *reinterpret_cast<const uint4*>(raw + lane * 16);
    const uint4 wb = *reinterpret_cast<const uint4*>(raw + kSfAtomBytes + lane * 16);
    uint32_t* ua = reinterpret_cast<uint32_t*>(ta);
    uint32_t* ub = ua + kSfaTab;
    const uint32_t words_a[4] = {wa.x, wa.y, wa.z, wa.w}, words_b[4] = {wb.x, wb.y, wb.z, wb.w};
#pragma unroll
    for (int kk = 0; kk < kSubBlocks; ++kk) {
      const bool real = g0 + kk < sfk;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int mn = lane + 32 * i;
        const int bcol = (mn % 8) / 2 * kSfbQPitch + 2 * (mn / 8) + mn % 2;
        ua[kk * 128 + mn] = e8m0_bits((words_a[i] >> (8 * kk)) & 0xFFu, real);
        ub[kk * kSfbKkPitch + bcol] = e8m0_bits((words_b[i] >> (8 * kk)) & 0xFFu, real);
      }
    }
  }

  // ------------------------------------------------------------------------------------
  // Consumers.
  // ------------------------------------------------------------------------------------
  FUSEGEMM_DEVICE static void issue(uint64_t da, uint64_t db, int kk, float (&t)[kAccum]) {
    fence_acc(t);
    cute::warpgroup_arrive();
    // 32 K of FP8 = 32 bytes = 2 in the descriptors' 16-byte address field.
    Fp8Gmma<ElementAB>::fma(da + 2 * kk, db + 2 * kk, t, 0, fusegemm::make_integer_sequence<int, kAccum>{});
    cute::warpgroup_commit_batch();
    fence_acc(t);
  }

  // acc += t * sfa[row] * sfb[col] for 32-K block kk of the stage whose tables start at tab.
  FUSEGEMM_DEVICE static void promote(float (&acc)[kAccum], float (&t)[kAccum], const float* tab, int kk,
                                      int row0, int q) {
    fence_acc(t);
    const float sa0 = tab[kk * 128 + row0], sa1 = tab[kk * 128 + row0 + 8];
    const float4* sb = reinterpret_cast<const float4*>(tab + kSfaTab + kk * kSfbKkPitch + q * kSfbQPitch);
#pragma unroll
    for (int i = 0; i < kAccum / 8; ++i) {
      const float4 s = sb[i];  // columns of fragment blocks j = 2i (x, y) and 2i + 1 (z, w)
      const int j = 8 * i;
      acc[j + 0] = fmaf(t[j + 0], sa0 * s.x, acc[j + 0]);
      acc[j + 1] = fmaf(t[j + 1], sa0 * s.y, acc[j + 1]);
      acc[j + 2] = fmaf(t[j + 2], sa1 * s.x, acc[j + 2]);
      acc[j + 3] = fmaf(t[j + 3], sa1 * s.y, acc[j + 3]);
      acc[j + 4] = fmaf(t[j + 4], sa0 * s.z, acc[j + 4]);
      acc[j + 5] = fmaf(t[j + 5], sa0 * s.w, acc[j + 5]);
      acc[j + 6] = fmaf(t[j + 6], sa1 * s.z, acc[j + 6]);
      acc[j + 7] = fmaf(t[j + 7], sa1 * s.w, acc[j + 7]);
    }
  }

  FUSEGEMM_DEVICE static uint64_t stage_desc(uint64_t d0, int stage, int bytes) {
    return d0 + static_cast<uint64_t>((stage * bytes) >> 4);  // address field in 16-byte units
  }
  FUSEGEMM_DEVICE static const float* stage_tab(const Bars& b, int stage) {
    return reinterpret_cast<const float*>(b.tabs + stage * kTabBytes);
  }

  // One temporary set: WGMMA, wait, promote. The other consumer warpgroup's WGMMAs keep the
  // tensor cores busy while this one promotes.
  FUSEGEMM_DEVICE static void mainloop_one_set(const Bars& b, uint64_t da0, uint64_t db0, int num_k_blocks,
                                               int row0, int q, int lane, int& stage, uint32_t& phase,
                                               float (&acc)[kAccum], float (&t0)[kAccum]) {
    for (int kb = 0; kb < num_k_blocks; ++kb) {
      mbar_wait(&b.sf_ready[stage], phase);
      const uint64_t da = stage_desc(da0, stage, kABytes), db = stage_desc(db0, stage, kBBytes);
      const float* tab = stage_tab(b, stage);
#pragma unroll
      for (int kk = 0; kk < kSubBlocks; ++kk) {
        issue(da, db, kk, t0);
        cute::warpgroup_wait<0>();
        promote(acc, t0, tab, kk, row0, q);
      }
      mbar_arrive(&b.empty[stage]);  // every lane: its table loads precede the converter's stores
      if (++stage == kStages) { stage = 0; phase ^= 1; }
    }
  }

  // Two temporary sets: block kk + 1's WGMMA runs while block kk is promoted.
  FUSEGEMM_DEVICE static void mainloop_two_sets(const Bars& b, uint64_t da0, uint64_t db0, int num_k_blocks,
                                                int row0, int q, int lane, int& stage, uint32_t& phase,
                                                float (&acc)[kAccum], float (&t0)[kAccum], float (&t1)[kAccum]) {
    const float* prev_tab = nullptr;
    int prev_stage = 0;
    for (int kb = 0; kb < num_k_blocks; ++kb) {
      mbar_wait(&b.sf_ready[stage], phase);
      const uint64_t da = stage_desc(da0, stage, kABytes), db = stage_desc(db0, stage, kBBytes);
      const float* tab = stage_tab(b, stage);
      issue(da, db, 0, t0);
      if (kb > 0) {
        // The previous stage's last block: promote it, then hand its stage back.
        cute::warpgroup_wait<1>();
        promote(acc, t1, prev_tab, kSubBlocks - 1, row0, q);
        mbar_arrive(&b.empty[prev_stage]);
      }
      issue(da, db, 1, t1);
      cute::warpgroup_wait<1>();
      promote(acc, t0, tab, 0, row0, q);
      issue(da, db, 2, t0);
      cute::warpgroup_wait<1>();
      promote(acc, t1, tab, 1, row0, q);
      issue(da, db, 3, t1);
      cute::warpgroup_wait<1>();
      promote(acc, t0, tab, 2, row0, q);
      prev_tab = tab;
      prev_stage = stage;
      if (++stage == kStages) { stage = 0; phase ^= 1; }
    }
    if (num_k_blocks > 0) {
      cute::warpgroup_wait<0>();
      promote(acc, t1, prev_tab, kSubBlocks - 1, row0, q);
      mbar_arrive(&b.empty[prev_stage]);
    }
  }

  template <class Params>
  static __device__ void consume(const Params& p, uint8_t* smem, const Bars& b, int wg) {
    const int lane = threadIdx.x % 32;
    const int warp = threadIdx.x / 32;  // 0 .. kConsumerWarps-1
    const int num_k_blocks = k_blocks(p.k);
    const uint64_t da0 = sw128_kmajor_desc(smem_u32(smem + kOffA) + wg * 64 * kTileK);
    const uint64_t db0 = sw128_kmajor_desc(smem_u32(smem + kOffB));
    const int row0 = 64 * wg + 16 * (warp % 4) + lane / 4;  // fragment rows row0, row0 + 8 of the tile
    const int q = lane % 4;

    typename Ring::Reader ring;
    int stage = 0;
    uint32_t phase = 0;
    float acc[kAccum], t0[kAccum];
    float t1[kTempSets == 2 ? kAccum : 1];
    typename Epi::Partials part;
    part.reset();
    int4 t;
    while (ring.next(b.ring, lane, t)) {
      for (int pass = 0; pass < kPasses; ++pass) {
        const int n0 = t.z * kTileN + pass * kMmaN;
        if (n0 >= p.n) break;
#pragma unroll
        for (int i = 0; i < kAccum; ++i) acc[i] = 0.0f;
        if constexpr (kTempSets == 2) {
          mainloop_two_sets(b, da0, db0, num_k_blocks, row0, q, lane, stage, phase, acc, t0, t1);
        } else {
          mainloop_one_set(b, da0, db0, num_k_blocks, row0, q, lane, stage, phase, acc, t0);
        }
        Epi::run(p, smem + kOffEpi, t.x, t.y * kTileM, n0, wg, warp, lane, acc, part);
      }
    }
    Epi::finish(part, p, warp, lane);
  }
};

}  // namespace sm90
}  // namespace fusegemm
