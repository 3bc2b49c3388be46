// sm_90a block-scaled GEMM, design (b): MXFP8 tiles dequantized to BF16 in shared memory, BF16
// WGMMA on them (issue 10). Carries the spec's epilogue rule, grouped over padded_offsets or
// batched dense (kBatched), with the scheduler, epilogue and host contract the other kernels use.
//
// Why this design: FP8 WGMMA with per-32-K FP32 promotion (design (a), blockscaled_promote.cuh)
// costs an FMUL and an FFMA per accumulator element per 32 K on the consumers' own issue slots
// and measured ~400 TFLOP/s without the epilogue on dsv3-fc1 (H200). Dequantization costs work per
// *operand* element instead -- (128 + N) x K per tile against 128 x N x K / 16 promotions -- and
// runs on warps of its own while the consumers issue BF16 WGMMAs exactly as the BF16 kernel does.
//
// Roles (512 threads):
//   warpgroups 0-1 : consumers, 64 rows each of the 128 x kTileN tile (in passes of 128 columns):
//                    BF16 WGMMA, epilogue
//   warpgroup 2    : warp 0, one elected thread: tile schedule and TMA loads of the FP8 stages
//   warpgroups 2-3 : the other seven warps dequantize: each FP8 stage of 64 K (A 128 x 64 B,
//                    B 128 x 64 B, the SF atoms of its 128 K) becomes one BF16 stage in the
//                    consumers' SWIZZLE_128B K-major layout, x * 2^(e - 127) per 32-K block
//                    (cvt.rn.f16x2.e4m3x2 / e5m2x2 -> f32 -> scale -> bf16: exact, NaN kept).
//                    Scales of 32-K blocks past K are zeroed, so SF padding bytes (NaN when the
//                    buffer is 0xFF-filled) never meet the zero-filled data.
// Pipelines: kRaw FP8 stages (raw_full: TMA bytes; raw_empty: the seven dequant warps) and kBf
// BF16 stages (bf_full: the seven dequant warps, after fence.proxy.async so WGMMA's async proxy
// sees their st.shared; bf_empty: one arrival per consumer warp).
//
// Host contract (fusegemm/ops/blockscaled.py encodes the maps from the exported boxes):
//   tma_a   uint8 (K bytes, rows) grouped or (K bytes, M, L) batched; box (64, 128), no swizzle
//   tma_b   uint8 (K bytes, N, L) dense or (K bytes, N) discrete template; box (64, 128)
//   tma_sfa / tma_sfb  uint32 view of the SF atoms {128, ceil(sfk/4), ceil(mn/128), L}
//           (grouped SFA: L = 1; discrete SFB: per-expert template, L = 1), boxes {128, 1, 1, 1}
//           (both)
//   discrete weights: kTmapSlotStride slots of 128 B per CTA in tmap_workspace ([B x 8][SFB x 8])
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "fusegemm/common.cuh"
#include "fusegemm/epilogue_block.cuh"
#include "fusegemm/scheduler.cuh"
#include "fusegemm/tma.cuh"
#include "fusegemm/sm90/blockscaled_common.cuh"
#include "fusegemm/sm90/epilogue.cuh"
#include "fusegemm/sm90/wgmma.cuh"

namespace fusegemm {
namespace sm90 {

// Four FP8 bytes -> four floats (exact: e4m3 and e5m2 are subsets of f16).
template <bool kE4M3>
FUSEGEMM_DEVICE void fp8x4_to_float(uint32_t w, float (&f)[4]) {
  uint32_t lo, hi;
  const uint16_t w0 = static_cast<uint16_t>(w), w1 = static_cast<uint16_t>(w >> 16);
  if constexpr (kE4M3) {
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(lo) : "h"(w0));
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(hi) : "h"(w1));
  } else {
    asm("cvt.rn.f16x2.e5m2x2 %0, %1;" : "=r"(lo) : "h"(w0));
    asm("cvt.rn.f16x2.e5m2x2 %0, %1;" : "=r"(hi) : "h"(w1));
  }
  const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&lo));
  const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&hi));
  f[0] = a.x; f[1] = a.y; f[2] = b.x; f[3] = b.y;
}

FUSEGEMM_DEVICE uint32_t bf16x2_bits(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

template <class Config>
struct BlockScaledDequantKernel : ScaledHostContract<Config::kDiscreteB> {
  using Checks = ScaledConfigChecks<Config>;
  using ElementAB = typename Config::ElementA;
  using ElementC = typename Config::ElementC;
  using ElementD = typename Config::ElementD;
  using Rule = typename Config::Rule;  // generated from the spec's epilogue
  static constexpr bool kE4M3 = Checks::kE4M3;

  static constexpr bool kBatched = Config::kBatched, kDiscreteB = Config::kDiscreteB;
  static constexpr int kTileM = Config::kTileM;
  static constexpr int kTileN = Config::kTileN;
  static constexpr int kTileK = 64;                 // K per stage: one SW128 row of BF16
  // Columns per pass: a 64 x 256 WGMMA fragment (128 registers) cannot be compiled under the
  // 128-register launch bound of 512 threads, so a tile of 256 columns runs as two passes.
  static constexpr int kMmaN = 128;
  static constexpr int kPasses = kTileN / kMmaN;

  static constexpr int kConsumerWGs = kTileM / 64;
  static constexpr int kConsumerWarps = 4 * kConsumerWGs;
  static constexpr int kDequantWarps = 7;           // warps 1-3 of warpgroup 2 and all of 3
  static constexpr int kThreads = 128 * (kConsumerWGs + 2);
  static constexpr int kAccum = kMmaN / 2;

  using Engine = epi::BlockEngine<Rule, ElementC, ElementD, kBatched, Config::kCMajorM, Config::kDiscreteColSfd>;
  using Epi = WgmmaEpilogue<kTileM, kMmaN, Rule, ElementC, ElementD, Engine, kBatched, true>;

  // Shared memory plan.
  static constexpr int kSfAtomBytes = 512;          // 128 MN x 4 scales (128 K)
  static constexpr int kSfbAtoms = kMmaN / 128;
  static constexpr int kRawABytes = kTileM * kTileK;    // FP8, rows of 64 bytes
  static constexpr int kRawBBytes = kMmaN * kTileK;
  static constexpr int kRawSfBytes = kSfAtomBytes * (1 + kSfbAtoms);
  static constexpr int kRawBytes = kRawABytes + kRawBBytes + kRawSfBytes;
  static constexpr int kBfABytes = kTileM * kTileK * 2;  // BF16, SW128 rows of 128 bytes
  static constexpr int kBfBBytes = kMmaN * kTileK * 2;
  static constexpr int kBfBytes = kBfABytes + kBfBBytes;
  static constexpr int kEpiBytes = Epi::kBytes;
  static constexpr int kTileRing = 4;
  static constexpr int kSmemLimit = 232448 - 1024;
  // BF16 stages: the dequant warps fill one while the consumers read another, and a third lets a
  // stage's conversion overlap the MMA of the one before.
  static constexpr int kBf = 3;
  static constexpr int kFixedBytes = kBf * kBfBytes + kEpiBytes + 127 + 2 * 128 + 16 * kTileRing +
                                     8 * (2 * 8 + 2 * kBf + 2 * kTileRing);
  static constexpr int kMaxRaw = (kSmemLimit - kFixedBytes) / kRawBytes;
  static constexpr int kRaw = kMaxRaw > 8 ? 8 : kMaxRaw;
  static_assert(kRaw >= 2, "not enough shared memory for two FP8 stages");

  static constexpr int kOffBf = 0;                                  // 1024-aligned BF16 stages
  static constexpr int kOffRaw = kOffBf + kBf * kBfBytes;
  static constexpr int kOffEpi = kOffRaw + kRaw * kRawBytes;
  static constexpr int kOffTmap = (kOffEpi + kEpiBytes + 127) / 128 * 128;
  static constexpr int kOffRing = kOffTmap + 2 * 128;
  static constexpr int kOffBars = kOffRing + 16 * kTileRing;
  static constexpr int kNumBars = 2 * kRaw + 2 * kBf + 2 * kTileRing;
  static constexpr int kSmemBytes = kOffBars + 8 * kNumBars;
  static_assert(kBfABytes % 1024 == 0 && kBfBBytes % 1024 == 0, "SW128 stages need 1 KB alignment");
  static_assert(kRawBytes % 128 == 0 && kOffEpi % 16 == 0, "TMA destinations need 128-byte alignment");
  static_assert(kSmemBytes <= kSmemLimit, "shared memory plan exceeds 227 KB");

  // The consumers hold the 64-float fragment through the engine epilogue; the dequant warps keep
  // kBatch groups of loads in flight.
  static constexpr int kProducerRegs = 56;
  static constexpr int kConsumerRegs = 200;
  static_assert(kProducerRegs * 256 + kConsumerRegs * 128 * kConsumerWGs <= 65536,
                "register split exceeds the register file");


  // Host contract (the rest: ScaledHostContract, a dependent base: named here).
  using Contract = ScaledHostContract<Config::kDiscreteB>;
  using Contract::kTmapSlotsPerMap;
  using Contract::kTmapSlotStride;
  // Discrete weights: B and SFB maps rewritten per expert (DeviceTmap), one slot per stage.
  static constexpr int kTmapSlots = kRaw;
  static_assert(kTmapSlots <= kTmapSlotsPerMap, "more stages than reserved tensor-map slots");
  static constexpr int kBoxAInner = kTileK, kBoxAOuter = kTileM, kBoxBInner = kTileK, kBoxBOuter = kMmaN;
  static constexpr int kSwizzleA = 0, kSwizzleB = 0;
  static constexpr int kSfBoxK = 1, kSfBoxNB = kSfbAtoms;
  static constexpr uint32_t kTxBytes = kRawBytes;

  using Schedule = ScaledSchedule<kTileM, kTileN, kBatched>;
  using Ring = TileRing<kTileRing>;
  using Maps = WeightMaps<kDiscreteB, kTmapSlots, kTmapSlotsPerMap>;

  struct Bars {
    uint64_t* raw_full;
    uint64_t* raw_empty;
    uint64_t* bf_full;
    uint64_t* bf_empty;
    Ring ring;
  };

  struct Cursor {  // position in a ring of kStages stages
    int stage = 0;
    uint32_t phase = 0;
    template <int kStages>
    FUSEGEMM_DEVICE void advance() {
      if (++stage == kStages) { stage = 0; phase ^= 1; }
    }
  };

  FUSEGEMM_DEVICE static int k_blocks(int k) { return (k + kTileK - 1) / kTileK; }

  template <class Params>
  static __device__ void run(const Params& p) {
    extern __shared__ __align__(1024) uint8_t smem[];
    const int tid = threadIdx.x;
    const int wg = tid / 128, warp = tid / 32, lane = tid % 32;
    uint64_t* bars = reinterpret_cast<uint64_t*>(smem + kOffBars);
    const Bars b{bars, bars + kRaw, bars + 2 * kRaw, bars + 2 * kRaw + kBf,
                 Ring{bars + 2 * kRaw + 2 * kBf, bars + 2 * kRaw + 2 * kBf + kTileRing,
                      reinterpret_cast<int4*>(smem + kOffRing)}};
    if (tid == 0) {
      if (smem_u32(smem) % 1024 != 0) __trap();  // SW128 descriptors assume a 1 KB aligned base
      for (int s = 0; s < kRaw; ++s) {
        mbar_init(&b.raw_full[s], 1);
        mbar_init(&b.raw_empty[s], kDequantWarps);
      }
      for (int s = 0; s < kBf; ++s) {
        mbar_init(&b.bf_full[s], kDequantWarps);
        mbar_init(&b.bf_empty[s], kConsumerWarps);
      }
      for (int s = 0; s < kTileRing; ++s) {
        mbar_init(&b.ring.full[s], 1);
        mbar_init(&b.ring.empty[s], kConsumerWarps + kDequantWarps);
      }
      mbar_fence_init();
    }
    __syncthreads();

    if (wg >= kConsumerWGs) {
      cutlass::arch::warpgroup_reg_dealloc<kProducerRegs>();
      const int w = warp - 4 * kConsumerWGs;  // 0 .. 7 within the two producer-side warpgroups
      if (w == 0) {
        if (elect_one()) produce(p, smem, b);
      } else {
        dequantize(p, smem, b, w - 1, lane);
      }
    } else {
      cutlass::arch::warpgroup_reg_alloc<kConsumerRegs>();
      consume(p, smem, b, wg);
    }
  }

  // ------------------------------------------------------------------------------------
  // Producer: one thread. FP8 stages of 64 K: A, B and the SF atoms of the stage's 128 K.
  // ------------------------------------------------------------------------------------
  template <class Params>
  static __device__ void produce(const Params& p, uint8_t* smem, const Bars& b) {
    const auto sched = Schedule::make(p);
    const int num_k_blocks = k_blocks(p.k);
    Maps maps;
    maps.init(p, reinterpret_cast<CUtensorMap*>(smem + kOffTmap), kTmapSlotStride);

    StaticWalk walk(blockIdx.x, gridDim.x);
    Cursor raw;
    typename Ring::Writer ring;
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
          mbar_wait(&b.raw_empty[raw.stage], raw.phase ^ 1);
          maps.select(p, t.expert);  // after the empty wait (DeviceTmap: kTmapSlots stages apart)
          uint64_t* bar = &b.raw_full[raw.stage];
          mbar_arrive_expect_tx(bar, kTxBytes);
          uint8_t* base = smem + kOffRaw + raw.stage * kRawBytes;
          uint8_t* sf = base + kRawABytes + kRawBBytes;
          // A stage is 64 K: SF atom kb / 2 holds its scales (and the next stage's).
          maps.template load_stage<kBatched>(p, bar, base, base + kRawABytes, sf, sf + kSfAtomBytes, kb * kTileK,
                                             kb / 2, m0, n0, l, lb);
          raw.template advance<kRaw>();
        }
      }
    }
  }

  // ------------------------------------------------------------------------------------
  // Dequantization: warp d of kDequantWarps converts row groups d, d + 7, ... of each stage
  // (8 rows x 64 K per group: lane = row (lane / 4) x 16-byte chunk (lane % 4)).
  // ------------------------------------------------------------------------------------
  FUSEGEMM_DEVICE static float e8m0_scale(uint32_t byte, bool real) {
    return __uint_as_float(e8m0_bits(byte, real));
  }

  // 16 FP8 values of `row` (K chunk c of the stage) -> 16 BF16 in the row's two SW128 chunks
  // (chunk j of 8 elements at (j ^ row % 8) * 16 of the 128-byte row).
  FUSEGEMM_DEVICE static void store_group(uint8_t* dst, int g, int row, int c, const uint4& q, float scale) {
    const uint32_t words[4] = {q.x, q.y, q.z, q.w};
    uint32_t out[8];
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      float f[4];
      fp8x4_to_float<kE4M3>(words[w], f);
      out[2 * w] = bf16x2_bits(f[0] * scale, f[1] * scale);
      out[2 * w + 1] = bf16x2_bits(f[2] * scale, f[3] * scale);
    }
    uint8_t* rdst = dst + (g < kTileM / 8 ? 0 : kBfABytes) + row * 128;
    const int sw = row % 8;
    *reinterpret_cast<uint4*>(rdst + (((2 * c) ^ sw) * 16)) = make_uint4(out[0], out[1], out[2], out[3]);
    *reinterpret_cast<uint4*>(rdst + (((2 * c + 1) ^ sw) * 16)) = make_uint4(out[4], out[5], out[6], out[7]);
  }

  // Row (of A for the first kTileM / 8 groups, else of B) of lane row r8 in group g.
  FUSEGEMM_DEVICE static int group_row(int g, int r8) {
    return g < kTileM / 8 ? 8 * g + r8 : 8 * g + r8 - kTileM;
  }

  template <class Params>
  static __device__ void dequantize(const Params& p, uint8_t* smem, const Bars& b, int d, int lane) {
    constexpr int kGroups = (kTileM + kMmaN) / 8;
    constexpr int kPerWarp = (kGroups + kDequantWarps - 1) / kDequantWarps;
    constexpr int kBatch = 3;  // groups whose loads are in flight together (registers: 5 each)
    const int num_k_blocks = k_blocks(p.k);
    const int sfk = (p.k + 31) / 32;   // real 32-K blocks; later ones are padding
    const int r8 = lane / 4, c = lane % 4;
    typename Ring::Reader ring;
    Cursor raw, bf;
    int4 t;
    while (ring.next(b.ring, lane, t)) {
      for (int pass = 0; pass < kPasses; ++pass) {
        if (t.z * kTileN + pass * kMmaN >= p.n) break;
        for (int kb = 0; kb < num_k_blocks; ++kb) {
          mbar_wait(&b.raw_full[raw.stage], raw.phase);
          const uint8_t* src = smem + kOffRaw + raw.stage * kRawBytes;
          const uint8_t* sf = src + kRawABytes + kRawBBytes;
          // The lane's 16 K lie in 32-K block kk of the stage's SF atom (four per 128 K).
          const int kk = (kb % 2) * 2 + c / 2;
          const bool real = kb * 2 + c / 2 < sfk;
          // Loads of kBatch groups in flight, then their conversions and stores (the bf_empty wait
          // after the first batch's loads).
          uint8_t* dst = smem + kOffBf + bf.stage * kBfBytes;
#pragma unroll 1
          for (int i0 = 0; i0 < kPerWarp; i0 += kBatch) {
            uint4 q[kBatch];
            float scale[kBatch];
#pragma unroll
            for (int i = 0; i < kBatch; ++i) {
              const int g = d + (i0 + i) * kDequantWarps;
              if (i0 + i < kPerWarp && g < kGroups) {
                const int row = group_row(g, r8);
                q[i] = *reinterpret_cast<const uint4*>(src + (g < kTileM / 8 ? 0 : kRawABytes) + row * kTileK + c * 16);
                const uint8_t* atom = sf + (g < kTileM / 8 ? 0 : kSfAtomBytes);
                scale[i] = e8m0_scale(atom[(row % 32) * 16 + ((row / 32) % 4) * 4 + kk], real);
              }
            }
            if (i0 == 0) mbar_wait(&b.bf_empty[bf.stage], bf.phase ^ 1);
#pragma unroll
            for (int i = 0; i < kBatch; ++i) {
              const int g = d + (i0 + i) * kDequantWarps;
              if (i0 + i < kPerWarp && g < kGroups) store_group(dst, g, group_row(g, r8), c, q[i], scale[i]);
            }
          }
          fence_async_shared();  // st.shared -> the async proxy WGMMA reads through
          __syncwarp();
          if (lane == 0) {
            mbar_arrive(&b.bf_full[bf.stage]);
            mbar_arrive(&b.raw_empty[raw.stage]);
          }
          raw.template advance<kRaw>();
          bf.template advance<kBf>();
        }
      }
    }
  }

  // ------------------------------------------------------------------------------------
  // Consumers: the BF16 mainloop of the grouped kernel over the BF16 stages.
  // ------------------------------------------------------------------------------------
  template <class Params>
  static __device__ void consume(const Params& p, uint8_t* smem, const Bars& b, int wg) {
    const int lane = threadIdx.x % 32;
    const int warp = threadIdx.x / 32;
    const int num_k_blocks = k_blocks(p.k);
    const uint64_t da0 = sw128_kmajor_desc(smem_u32(smem + kOffBf) + wg * 64 * 128);
    const uint64_t db0 = sw128_kmajor_desc(smem_u32(smem + kOffBf + kBfABytes));
    typename Ring::Reader ring;
    Cursor bf;
    float acc[kAccum];
    typename Epi::Partials part;
    part.reset();
    int4 t;
    while (ring.next(b.ring, lane, t)) {
      for (int pass = 0; pass < kPasses; ++pass) {
        const int n0 = t.z * kTileN + pass * kMmaN;
        if (n0 >= p.n) break;
        int prev_stage = 0;
        for (int kb = 0; kb < num_k_blocks; ++kb) {
          mbar_wait(&b.bf_full[bf.stage], bf.phase);
          fence_acc(acc);
          cute::warpgroup_arrive();
          const uint64_t off = static_cast<uint64_t>((bf.stage * kBfBytes) >> 4);
#pragma unroll
          for (int k = 0; k < kTileK / 16; ++k) {
            gmma_64xN<kMmaN>(da0 + off + 2 * k, db0 + off + 2 * k, acc, (kb > 0 || k > 0) ? 1 : 0);
          }
          cute::warpgroup_commit_batch();
          fence_acc(acc);
          cute::warpgroup_wait<1>();  // the batch before this one has finished reading its stage
          if (kb > 0 && lane == 0) mbar_arrive(&b.bf_empty[prev_stage]);
          prev_stage = bf.stage;
          bf.template advance<kBf>();
        }
        cute::warpgroup_wait<0>();
        fence_acc(acc);
        if (num_k_blocks > 0 && lane == 0) mbar_arrive(&b.bf_empty[prev_stage]);
        if (num_k_blocks == 0) {
#pragma unroll
          for (int i = 0; i < kAccum; ++i) acc[i] = 0.0f;
        }
        Epi::run(p, smem + kOffEpi, t.x, t.y * kTileM, n0, wg, warp, lane, acc, part);
      }
    }
    Epi::finish(part, p, warp, lane);
  }
};

}  // namespace sm90
}  // namespace fusegemm
