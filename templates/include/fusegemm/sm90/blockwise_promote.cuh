// sm_90a blockwise-scaled FP8 GEMM (the DeepSeek-V3 recipe, issue 31): e4m3 / e5m2 A and B with
// FP32 scales, A one per row and 128 K (1x128), B one per 128 N x 128 K block (128x128), carrying
// the spec's epilogue rule, grouped over padded_offsets or batched. Scheduler, TMA loads of A / B,
// epilogue and host contract are the MXFP8 kernel's (blockscaled_promote.cuh); the mainloop is
// what the recipe changes.
//
// Mainloop: per 128-K stage, four chained k32 FP8 WGMMAs write a temporary FP32 set, which is
// promoted once into the real accumulators,
//     acc[r][c] += tmp[r][c] * (sfa[r] * sfb),
// one FFMA per accumulator element per 128 K (MXFP8: an FMUL and an FFMA per 32 K), since a
// stage's B scale is one number for the whole 128-column pass. The temporary set never
// accumulates more than 128 products in the FP8 WGMMA's limited-precision accumulator. While one
// consumer warpgroup promotes, the other's WGMMAs keep the tensor cores busy. Ping-pong tiles
// (TILE_M 64, below) and FUSEGEMM_SM90_BW_TWO_TEMPS keep two temporary sets instead (mainloop2).
//
// Roles (384 threads):
//   warpgroups 0-1 : consumers, 64 rows each of the 128-row tile (ping-pong: each its own 64-row
//                    tiles, in turn): WGMMA, promotion, epilogue
//   warpgroup 2    : warp 0, one elected thread: tile schedule and TMA loads (A, B, SFA);
//                    warps 1-3 exit (the scales need no conversion: they are FP32 already)
//                    Gathered A (Config::kGatherA, M-grouped): all four warps copy A's rows
//                    a_index[r] of a token-major (T, K) FP8 matrix and their 1x128 scales (T-
//                    contiguous, (T, ceil(K/128))) with cp.async, 32 rows each, as the BF16
//                    kernel's copying warps do (fusegemm/gather.cuh); lane 0 of warp 0 also
//                    loads B and walks the tile ring. Each lane publishes a stage one stage late
//                    (GatherPublisher), so the consumers' k-loop is the ungathered one.
// Pipeline: kStages stages of A (kTileM x 128 B), B (kHalves x 128 rows x 128 B) and SFA (kTileM
// rows' FP32 scales of the stage's 128-K block). full[s]: TMA bytes; empty[s]: one arrival per
// thread of the warpgroups reading the stage (ping-pong: one) once its WGMMAs have completed and
// its scales are read. The B scale, one float per pass and stage, is read by the consumers from
// global memory one stage ahead (a 16-byte TMA box of it faulted on the H200 with an illegal
// instruction; a plain load needs no map).
//
// K-grouped (Config::kKGrouped: the weight gradient dW_e = dY_e^T X_e, DeepSeek-V3's wgrad recipe):
// tiles are (expert, M block, N block) of the (L, M, N) output and a tile's K range is its
// expert's token columns [offsets[e-1], offsets[e]) of A = dY^T (M, T) and B = X^T (N, T), both
// K-major (token-contiguous) FP8 with 1x128 scales along the tokens: SFA (M, T/128) and SFB
// (N, T/128), each M- (N-) contiguous. B's scales are per column, not per 128 x 128 block, so a
// stage also loads its 128-token block of SFB (one float per column of the tile) and the
// promotion is acc[r][c] += tmp[r][c] * (sfa[r] * sfb[c]): an FMUL and an FFMA per element per
// 128 K. An expert without tokens stores alpha * 0.
//
// What bounds the K-grouped promotion (H200, 2026-12-04, timing builds on the dsv3 and mixtral
// weight-gradient shapes, same run): not the FFMAs but the column scales' trip from shared memory
// to registers. A thread's fragment holds 32 columns of a 128-column half, so each warp loads
// 32 x 128 B of scales per half and stage (every lane its own 32 floats): 512 shared-memory
// wavefronts a stage beside the WGMMAs' operand reads. Loading half of them (wrong values, timing
// only) ran 1.09-1.13x, a quarter 1.20-1.24x, a row-only promotion 1.30-1.34x. Not kept, all
// bit-identical to this kernel: the same scales thread-major in a second area, written by a
// producer warp, read with LDS.128 (0.94-0.97x: the bytes per lane are the same); tile N 128
// with two temporary sets, a k-block's promotion under the next one's WGMMAs (0.91-0.96x of
// tile N 256: 1.01-1.05x of tile N 128 without them). Fewer scale loads need fewer distinct
// columns per thread, which the WGMMA fragment fixes, or a coarser scale for one operand
// (a recipe change). bench/results/wgrad_fp8_promotion_h200_ab.json has the figures.
// The epilogue matters where an expert's K is short: at dsv3 with 32 experts (512 tokens, four
// k-blocks a tile) the kernel without an epilogue ran about 1.2x (at 8 experts 1.0x; H100,
// 2026-12-06, bench/wgrad.py --also, bench/results/wgrad_h100_defer_noepi.json). Not kept: the
// BF16 kernel's deferred D (a pass's packed D stored under the next pass's first k-blocks), which
// fits the registers beside one 128-column half only: tile N 128 with it ran 0.92-1.0x tile N 128
// without, itself 0.90-0.95x tile N 256 (bit-equal; eight rounds, wgrad_h100_defer_8rounds.json).
// Of the 1.2x, the global stores alone seemed about 1.12x (FUSEGEMM_BENCH_NO_STORE, eight rounds,
// wgrad_h100_nostore_8rounds.json: 1.13x at dsv3-32, 1.03-1.07x at dsv3-8, against a null build's
// 0.97-1.03x), which a twelve-round run (below) did not repeat.
// Tried and removed (bit-equal, 36 GPU tests): D through TMA stores, each warp staging 16 x 64-byte
// chunks in two swizzled 1 KB buffers and its lane 0 sending each with one cp.async.bulk.tensor
// through a D map from the host. Against the warps' stores it ran 1.04-1.11x in one eight-round run,
// 0.88-0.99x (0.90-1.00x of a null build's speed) in the next, and 0.91-0.96x (the null build 0.98x)
// in a twelve-round one, where the stores removed altogether ran only 0.95-1.02x; the dsv3-32
// fp8_block step took 8.01 ms with it, 7.97 ms without (H100, 2026-12-06,
// bench/results/wgrad_h100_tma_d*.json, moe_mlp_h100_tma_d*.json; one buffer per warp, four, and a
// bf16 D staged by stmatrix no better). What costs is the bytes, not their issue: the step's profile
// (moe_mlp_h100_fp8_block_profile.json) has both weight gradients 0.57 ms slower at 32 experts than
// at 8 for the same FLOPs (D 2.8 GB against 0.7 GB), and at dsv3-32 a tile reads 192 KB of operands
// from L2 for its four k-blocks beside its 64 KB of D (5.5 GB and 1.9 GB per call in about 1.6 ms),
// a third of which B multicast over a 2-CTA cluster along M would save.
//
// Host contract (fusegemm/ops/scaled_operands.py blockwise_maps encodes the maps):
//   tma_a, tma_b  as the MXFP8 kernel's
//   tma_sfa  float32 (M rows, ceil(K/128)) M-contiguous, row pitch a multiple of 4 floats
//            (batched: (M, ceil(K/128), L)); box (kTileM, 1[, 1])
//   sfb      float32 (L, ceil(N/128), ceil(K/128)) dense; discrete: sfb_ptrs[e] -> (ceil(N/128),
//            ceil(K/128)) per expert
//   K-grouped: tma_a / tma_b over dY^T (T, M) / X^T (T, N) bytes, tma_sfa (M, T/128) box (128, 1),
//            tma_sfb (N, T/128) box (B box rows, 1); offsets, row_ends; m_rows = M, k = T
#pragma once

#include "fusegemm/common.cuh"
#include "fusegemm/epilogue_block.cuh"
#include "fusegemm/gather.cuh"
#include "fusegemm/scheduler.cuh"
#include "fusegemm/tma.cuh"
#include "fusegemm/sm90/blockscaled_common.cuh"
#include "fusegemm/sm90/epilogue.cuh"
#include "fusegemm/sm90/epilogue_wg.cuh"
#include "fusegemm/sm90/wgmma.cuh"

// Epilogue input prefetch: each consumer warp asks L2 for the element inputs its epilogue will
// read (dSwiGLU's C) this many k-blocks before a pass's mainloop ends (at its start when the
// mainloop is shorter; 0 = off). An A/B switch through FUSEGEMM_NVRTC_EXTRA; the BF16 kernel's
// FUSEGEMM_SM90_EPI_PREFETCH is the same idea over 64-K blocks. H200, same run, 3 rounds
// (bench/results/blockscaled_h200_prefetch.json): dSwiGLU at tile N 256 1.01-1.07x the speed of
// the build without (faster on all eight rows), at tile N 128 0.98-1.03x; 16 blocks ahead no
// better than 8. Ops without element inputs issue nothing (0.93-1.07x there: the run's noise).
// (Also measured and not kept: warpgroup 1 starting 3 blocks after warpgroup 0, so that their
// epilogues would not coincide, the offset bounded by the pipeline; builds that run the two
// halves as passes, dSwiGLU and tile N 128: 0.94-1.02x of lockstep's speed,
// bench/results/blockscaled_h200_stagger.json.)
#ifndef FUSEGEMM_SM90_BW_EPI_PREFETCH
#define FUSEGEMM_SM90_BW_EPI_PREFETCH 8
#endif

// 1: cooperative tiles that run 128-column passes (rules that do not share A between halves:
// dSwiGLU, tile N 128) hold two temporary sets, as the ping-pong mainloop does: k-block kb's
// WGMMAs run while kb - 1 is promoted, so a warpgroup no longer relies on the other's WGMMAs to
// cover its promotions (64 more registers beside the pass's 128). 0: one set, each k-block's
// promotion after its WGMMAs (the measured baseline). An A/B switch through FUSEGEMM_NVRTC_EXTRA;
// H200, 2026-12-05, same run (bench/results/blockscaled_h200_pingpong.json, dsv3-fc2): the same
// bytes, not faster (dSwiGLU 0.50x / 0.52x BF16 against 0.52x / 0.54x at tile N 256 / 128).
#ifndef FUSEGEMM_SM90_BW_TWO_TEMPS
#define FUSEGEMM_SM90_BW_TWO_TEMPS 0
#endif

// Measurement only (kShareA below): 1 lets every rule's 256-column tile share each stage's A
// between its two halves, dSwiGLU (144 bytes spilled) included; 0 runs paired-output and
// row-summing rules as two 128-column passes over K (the default). At dsv3-fc2 dSwiGLU's mainloop
// alone runs 1.12-1.16x BF16 against the shared-A GEMM's 1.42-1.49x (H100,
// bench/results/blockscaled_h100_williams_noepi.json), but with the switch the whole op ran 0.56-0.90x.
#ifndef FUSEGEMM_SM90_BW_SHARE_A_ALL
#define FUSEGEMM_SM90_BW_SHARE_A_ALL 0
#endif

namespace fusegemm {
namespace sm90 {

// The Config facts the blockwise kernel requires (the registry's sm_90a limits state the same).
template <class Config>
struct BlockwiseConfigChecks {
  using ElementAB = typename Config::ElementA;
  static_assert(fusegemm::is_same_v<ElementAB, typename Config::ElementB>, "A and B share one format");
  static_assert(fusegemm::is_same_v<ElementAB, fusegemm::float_e4m3_t> ||
                    fusegemm::is_same_v<ElementAB, fusegemm::float_e5m2_t>,
                "blockwise recipe: FP8 (e4m3 / e5m2) A and B");
  static_assert(fusegemm::is_same_v<typename Config::ElementSF, float> && Config::kSfVec == 128,
                "blockwise recipe: FP32 scales per 128 K");
  static_assert(!Config::kAMajorMN && !Config::kBMajorMN, "K-major A and B (the registry's sm_90a limits)");
  static_assert(!Config::kCMajorM || !Config::Rule::kHasD, "M-major output: C only (seed 004)");
  static_assert(Config::kTileM == 128 || Config::kTileM == 64,
                "sm_90a blockwise kernel: TILE_M 128 (cooperative) or 64 (ping-pong)");
  static_assert(Config::kTileM == 128 || (Config::kTileN == 128 && !Config::kGatherA && !Config::kBatched &&
                                          !Config::kKGrouped),
                "ping-pong (TILE_M 64): M-grouped tiles of 128 columns, A by TMA (the registry's limits)");
  static_assert(!Config::kGatherA || (!Config::kBatched && !Config::kKGrouped && !Config::kDynamicSched),
                "gathered A: M-grouped problems, static scheduling (the registry's limits)");
  static_assert(Config::kTileN == 128 || Config::kTileN == 256, "sm_90a blockwise kernel: TILE_N 128 or 256");
  static_assert(!Config::kKGrouped || (!Config::kBatched && !Config::kDiscreteB && !Config::kDynamicSched &&
                                       !Config::kCMajorM),
                "K-grouped (weight gradients): dense token-major operands, static scheduling, row-major D");
};

template <class Config>
struct BlockwisePromoteKernel : ScaledHostContract<Config::kDiscreteB> {
  using Checks = BlockwiseConfigChecks<Config>;
  static_assert(sizeof(Checks) > 0, "sm_90a blockwise configuration checks");
  using ElementAB = typename Config::ElementA;
  using ElementC = typename Config::ElementC;
  using ElementD = typename Config::ElementD;
  using Rule = typename Config::Rule;  // generated from the spec's epilogue

  static constexpr bool kBatched = Config::kBatched, kDiscreteB = Config::kDiscreteB;
  static constexpr bool kKGrouped = Config::kKGrouped;
  static constexpr bool kGatherA = Config::kGatherA;
  static constexpr int kGatherWarps = 4;   // gathered A: every producer warp copies 32 of the 128 rows
  static constexpr int kTileM = Config::kTileM;
  static constexpr int kTileN = Config::kTileN;
  static constexpr int kMmaN = 128;                 // columns per WGMMA: one B scale per half and stage
  using Engine = epi::BlockEngine<Rule, ElementC, ElementD, kBatched, Config::kCMajorM, Config::kDiscreteColSfd>;
  // FUSEGEMM_SM90_BW_EPI_WG: rules on the engine path run on an epilogue warpgroup
  // (fusegemm/sm90/epilogue_wg.cuh), 128-column passes (the consumers hold one pass's fragment).
  // Ping-pong (TILE_M 64): each consumer warpgroup runs whole 64 x 128 tiles of its own, the
  // two in turn (mainloops ordered by named barriers, as the BF16 kernel's ping-pong), so that
  // one's epilogue runs while the other's WGMMAs keep the tensor cores busy. Its mainloop holds
  // two temporary sets: a k-block's promotion runs while the next one's WGMMAs do (the tensor
  // cores would otherwise wait for every promotion, the other warpgroup being in its epilogue).
  static constexpr bool kPingPong = Config::kTileM == 64;
  static constexpr bool kEpiWG =
      FUSEGEMM_SM90_BW_EPI_WG != 0 && !kKGrouped && !kPingPong &&
      EpiPath<Rule, ElementC, ElementD, Config::kCMajorM, kBatched, kScaledForceEngine<Config>>::kEngine;
  // A 256-column tile runs its two 128-column halves on each stage's one A (48 KB of loads per 4M
  // FMAs, not 64 KB as two passes), holding both halves' accumulators: 192 floats per thread. Rules
  // whose epilogue needs more registers than the second half leaves (gate/up-paired outputs, row
  // sums: dSwiGLU spills 144 bytes) run the halves as two passes over K instead.
  // A paired C with a D quantized along rows (the SwiGLU forward with C and an FP8 D: 1x128 scales,
  // which need the whole tile in one epilogue, kOneEpi below, or MX scales per 32 columns) shares A
  // without spilling. For the MX form that was measured on an H100 (2026-12-06, seventeenth session,
  // bench/blockscaled.py --also sa=-DFUSEGEMM_SM90_BW_SHARE_A_ALL=1, four rounds, bit-equal,
  // bench/results/blockscaled_h100_share_a.json): 1.05-1.20x the two passes' speed on the four
  // shapes; before, only the 1x128 form shared A.
  // With a 16-bit D, so do the SwiGLU forward with C and dsReLU (its dprob a row sum): measured on
  // an H100 (2026-12-06, eighteenth session, SHARE_A_ALL builds, bit-equal, 0 spills) at 1.06-1.19x
  // and 1.01-1.14x their two passes' speed on the four shapes (three rounds, both distributions;
  // eight rounds at dsv3-fc2 / mixtral-fc1: 1.16 / 1.09x and 1.10 / 1.05x; bench/results/
  // blockscaled_h100_share_a_rules*.json). dGLU with a bf16 D measured 0.95-1.10x: it keeps its
  // passes, as do paired outputs and column sums (dbias) generally.
  // FUSEGEMM_SM90_BW_SHARE_A_ALL (above) makes every rule share A, to time what the second pass
  // costs the others (dSwiGLU keeps it: its spills are the epilogue's, on every tile).
  static constexpr bool kShareA =
      !kEpiWG && kTileN == 256 &&
      (FUSEGEMM_SM90_BW_SHARE_A_ALL ||
       (!Rule::kPairedD && ((!Rule::kRowSum && (!Rule::kPairedC || Rule::kQuantRowD)) ||
                            (!Rule::kColSum && epi::out_bits<ElementD>() == 16))));
  static constexpr int kHalves = kShareA ? kTileN / kMmaN : 1;   // halves per stage
  static constexpr int kPasses = kTileN / (kHalves * kMmaN);
  static constexpr int kTileK = 128;                // K elements (= bytes) per stage: one scale block
  static constexpr int kSubK = 32;                  // K per FP8 WGMMA
  static constexpr int kSubBlocks = kTileK / kSubK;
  static constexpr int kScaleBlock = 128;           // N rows per B scale, K per A and B scale

  static constexpr int kConsumerWGs = kPingPong ? 2 : kTileM / 64;
  static constexpr int kConsumerWarps = 4 * kConsumerWGs;
  static constexpr int kStageWGs = kPingPong ? 1 : kConsumerWGs;   // warpgroups reading a stage
  static_assert(!kPingPong || kPasses == 1, "ping-pong skips the other warpgroup's tile as one pass's k-blocks");
  // Temporary accumulator sets: two for ping-pong, and (FUSEGEMM_SM90_BW_TWO_TEMPS) for cooperative
  // 128-column passes; not for the K-grouped promotion (it reads its stage's column scales,
  // released after), the epilogue warpgroup's consumers (160 registers) or column sums (the BF16
  // dGLU's bias gradient spilled 32 bytes).
  static constexpr int kTemps =
      kPingPong || (FUSEGEMM_SM90_BW_TWO_TEMPS && kHalves == 1 && !kKGrouped && !kEpiWG && !Rule::kColSum) ? 2 : 1;
  // Ping-pong order: warpgroup wg starts a mainloop once the other has issued its previous
  // tile's last WGMMAs (named barrier kOrderBarrier + wg; ids 1 and 2 are the engine's).
  static constexpr uint32_t kOrderBarrier = 4;
  static constexpr int kEpiWGs = kEpiWG ? 1 : 0;
  static constexpr int kThreads = 128 * (kConsumerWGs + 1 + kEpiWGs);
  static constexpr int kAccum = kMmaN / 2;

  // Two engine warps per warpgroup for rules with C and D where the tile's second half stays live
  // through the first half's epilogue (kShareA): the four-warp engine spilled 8 bytes there
  // (sReLU with FP8 D; quant's D alone did not).
  static constexpr int kEngineWarps = kShareA && Rule::kHasC && Rule::kHasD ? 2 : FUSEGEMM_SM90_ENGINE_WARPS;
  // 1x128 output scales (the rule's kSfdVec 128): a 128-column group of a paired accumulator's
  // D spans both halves, so a tile that holds both runs one epilogue over its 256 columns.
  static constexpr bool kOneEpi = kShareA && Rule::kSfdVec == 128 && Rule::kQuantRowD;
  // Ping-pong: the epilogue sees a 128-row tile whose rows 64 wg.. are warpgroup wg's (each
  // passes its own tile's first row less 64 wg), as in the BF16 kernel.
  using Epi = WgmmaEpilogue<64 * kConsumerWGs, kOneEpi ? kHalves * kMmaN : kMmaN, Rule, ElementC, ElementD, Engine,
                            kBatched, kScaledForceEngine<Config>, false, kPingPong, kEngineWarps>;
  using EpiWG = EpilogueWarpgroup<kMmaN, Rule, Engine, kBatched>;
  static_assert(!kEpiWG || (kTileM == 128 && kHalves == 1), "the epilogue warpgroup takes 128 x 128 passes");

  // Shared memory plan (offsets from the 1024-aligned dynamic smem base).
  static constexpr int kABytes = kTileM * kTileK;
  static constexpr int kBBytes = kHalves * kMmaN * kTileK;
  static constexpr int kSfaBytes = kTileM * 4;
  static constexpr int kSfbBytes = kKGrouped ? kHalves * kMmaN * 4 : 0;   // K-grouped: a scale per B row
  static constexpr int kSfStageBytes = kSfaBytes + kSfbBytes;
  static constexpr int kTileRing = 4;
  static constexpr int kSmemLimit = 232448 - 1024;
  static constexpr int kEpiBytes = kEpiWG ? EpiWG::kBytes : Epi::kBytes;
  static constexpr int kFixedBytes =
      kEpiBytes + 127 + 2 * 128 + 16 * kTileRing + 8 * (2 * 8 + 2 * kTileRing + 2 * kEpiWGs);
  static constexpr int kMaxStages = (kSmemLimit - kFixedBytes) / (kABytes + kBBytes + kSfStageBytes);
  static constexpr int kStages = kMaxStages > 8 ? 8 : kMaxStages;
  static_assert(kStages >= 3, "not enough shared memory for a 3-stage pipeline");

  static constexpr int kOffA = 0;
  static constexpr int kOffB = kOffA + kStages * kABytes;
  static constexpr int kOffSf = kOffB + kStages * kBBytes;
  static constexpr int kOffEpi = kOffSf + kStages * kSfStageBytes;
  static constexpr int kOffTmap = (kOffEpi + kEpiBytes + 127) / 128 * 128;  // B map staging (one of two slots)
  static constexpr int kOffRing = kOffTmap + 2 * 128;
  static constexpr int kOffBars = kOffRing + 16 * kTileRing;
  static constexpr int kNumBars = 2 * kStages + 2 * kTileRing + 2 * kEpiWGs;   // + acc_full, acc_empty
  static constexpr int kSmemBytes = kOffBars + 8 * kNumBars;
  static_assert(kABytes % 1024 == 0 && kBBytes % 1024 == 0, "SW128 stages need 1 KB alignment");
  static_assert(kOffSf % 128 == 0 && kSfStageBytes % 128 == 0 && kOffEpi % 16 == 0, "TMA / vector alignment");
  static_assert(kSmemBytes <= kSmemLimit, "shared memory plan exceeds 227 KB");

  // Consumers hold two accumulator halves and one temporary set (192 floats) while the first
  // half's epilogue runs; the producer (tile walk, per-expert B maps) fits in 40. With an
  // epilogue warpgroup the consumers hold one pass (128 floats) and hand it over: the engine gets
  // what they leave.
  static constexpr int kProducerRegs = kGatherA ? 56 : 40;   // (a copying lane holds its rows' offsets)
  // (gathered A: the producer's 56 come from the consumers')
  static constexpr int kConsumerRegs = kEpiWG ? (kGatherA ? 152 : 160) : kGatherA ? 224 : 232;
  static constexpr int kEpiRegs = kEpiWG ? 65536 / 128 - kProducerRegs - kConsumerWGs * kConsumerRegs : 0;
  static_assert(kProducerRegs * 128 + kConsumerRegs * 128 * kConsumerWGs + kEpiRegs * 128 * kEpiWGs <= 65536,
                "register split exceeds the register file");
  static_assert(!kEpiWG || (kEpiRegs >= 128 && kEpiRegs % 8 == 0), "the epilogue warpgroup's registers");

  // Host contract (the rest: ScaledHostContract, a dependent base: named here).
  using Contract = ScaledHostContract<Config::kDiscreteB>;
  using Contract::kTmapSlotsPerMap;
  using Contract::kTmapSlotStride;
  static constexpr int kTmapSlots = kStages;
  static_assert(kTmapSlots <= kTmapSlotsPerMap, "more stages than reserved tensor-map slots");
  static constexpr int kBoxAInner = kTileK, kBoxAOuter = kTileM, kBoxBInner = kTileK, kBoxBOuter = kHalves * kMmaN;
  static constexpr int kSwizzleA = 128, kSwizzleB = 128;
  // Scale maps: one 128-K block per SFA box (kBoxAOuter rows); no SFB map (sf_box_nb 0).
  static constexpr int kSfBoxK = 1, kSfBoxNB = 0;
  // What a stage's TMA loads bring (gathered A and its scales arrive through cp.async), and the
  // full barrier's arrivals: the loading lane, plus every copying lane's publication.
  static constexpr uint32_t kTxBytes = kGatherA ? kBBytes : kABytes + kBBytes + kSfStageBytes;
  static constexpr int kFullArrivals = kGatherA ? 1 + 32 * kGatherWarps : 1;
  using Publisher = GatherPublisher<kStages, 1>;

  // K-grouped tiles walk the (L, M, N) output as batches of M rows (the batched tile order).
  using Schedule = ScaledSchedule<kTileM, kTileN, kBatched || kKGrouped>;
  using Ring = TileRing<kTileRing>;

  struct Bars {
    uint64_t* full;
    uint64_t* empty;
    Ring ring;
    uint64_t* acc_full;    // kEpiWG: a pass's accumulators staged (one arrival per consumer thread)
    uint64_t* acc_empty;   // kEpiWG: ... and read (one arrival per epilogue thread)
  };

  template <class Params>
  static __device__ void run(const Params& p) {
    extern __shared__ __align__(1024) uint8_t smem[];
    const int tid = threadIdx.x;
    const int wg = tid / 128;
    uint64_t* bars = reinterpret_cast<uint64_t*>(smem + kOffBars);
    const Bars b{bars, bars + kStages,
                 Ring{bars + 2 * kStages, bars + 2 * kStages + kTileRing, reinterpret_cast<int4*>(smem + kOffRing)},
                 bars + 2 * kStages + 2 * kTileRing, bars + 2 * kStages + 2 * kTileRing + 1};
    if (tid == 0) {
      if (smem_u32(smem) % 1024 != 0) __trap();  // SW128 descriptors assume a 1 KB aligned base
      for (int s = 0; s < kStages; ++s) {
        mbar_init(&b.full[s], kFullArrivals);
        // Every lane of the warpgroups reading the stage arrives: each lane's release covers its
        // own scale loads.
        mbar_init(&b.empty[s], 128 * kStageWGs);
      }
      for (int s = 0; s < kTileRing; ++s) {
        mbar_init(&b.ring.full[s], 1);
        mbar_init(&b.ring.empty[s], kConsumerWarps + 4 * kEpiWGs);
      }
      if constexpr (kEpiWG) {
        mbar_init(b.acc_full, 32 * kConsumerWarps);
        mbar_init(b.acc_empty, 128);
      }
      mbar_fence_init();
    }
    __syncthreads();

    if (wg == kConsumerWGs) {
      cutlass::arch::warpgroup_reg_dealloc<kProducerRegs>();
      if constexpr (kGatherA) {
        produce_gathered(p, smem, b, (tid % 128) / 32, tid % 32);
      } else if ((tid % 128) / 32 == 0 && elect_one()) {
        produce(p, smem, b);
      }
    } else if (kEpiWG && wg > kConsumerWGs) {
      if constexpr (kEpiWG) {
        cutlass::arch::warpgroup_reg_alloc<kEpiRegs>();
        epilogue(p, smem, b, (tid % 128) / 32, tid % 32);
      }
    } else {
      cutlass::arch::warpgroup_reg_alloc<kConsumerRegs>();
      consume(p, smem, b, wg);
    }
  }

  FUSEGEMM_DEVICE static int k_blocks(int k) { return (k + kTileK - 1) / kTileK; }

  // A tile's first K element and k-blocks: the whole K, or (K-grouped) expert e's token columns
  // (fusegemm/scheduler.cuh kgrouped_k_range; row_ends skip the k-blocks past its tokens).
  template <class Params>
  FUSEGEMM_DEVICE static int2 k_range(const Params& p, int e, int num_k_blocks) {
    if constexpr (kKGrouped) {
      return kgrouped_k_range<kTileK>(reinterpret_cast<const int*>(p.offsets), reinterpret_cast<const int*>(p.row_ends),
                                      e, p.k);
    } else {
      return make_int2(0, num_k_blocks);
    }
  }

  // ------------------------------------------------------------------------------------
  // Producer: one thread.
  // ------------------------------------------------------------------------------------
  template <class Params>
  static __device__ void produce(const Params& p, uint8_t* smem, const Bars& b) {
    const auto sched = Schedule::make(p);
    const int num_k_blocks = k_blocks(p.k);
    prefetch_tmap(&p.tma_a);
    prefetch_tmap(&p.tma_b);
    prefetch_tmap(&p.tma_sfa);
    if constexpr (kKGrouped) prefetch_tmap(&p.tma_sfb);
    const CUtensorMap* map_b = &p.tma_b;
    DeviceTmap<kTmapSlots> b_maps;
    if constexpr (kDiscreteB) {
      CUtensorMap* ws = reinterpret_cast<CUtensorMap*>(p.tmap_workspace) + blockIdx.x * kTmapSlotStride;
      b_maps.init(&p.tma_b, ws, reinterpret_cast<CUtensorMap*>(smem + kOffTmap));
    }
    int expert = -1;

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
      const int lb = kDiscreteB ? 0 : t.expert;        // expert / batch of B and SFB
      const int2 kr = k_range(p, t.expert, num_k_blocks);
      for (int pass = 0; pass < kPasses; ++pass) {
        const int n0 = t.n_block * kTileN + pass * kHalves * kMmaN;
        if (n0 >= p.n) break;
        for (int kb = 0; kb < kr.y; ++kb) {
          mbar_wait(&b.empty[stage], phase ^ 1);
          if constexpr (kDiscreteB) {
            // After the empty wait: a DeviceTmap slot is rewritten kTmapSlots (= kStages) loads later.
            if (t.expert != expert) {
              expert = t.expert;
              map_b = b_maps.update(reinterpret_cast<const void*>(reinterpret_cast<const uint64_t*>(p.b_ptrs)[expert]));
            }
          }
          uint64_t* bar = &b.full[stage];
          mbar_arrive_expect_tx(bar, kTxBytes);
          uint8_t* sf = smem + kOffSf + stage * kSfStageBytes;
          const int kx = kr.x + kb * kTileK;
          if constexpr (kKGrouped) {
            // A = dY^T rows m0.. (shared by the experts; the expert picks the token columns), B =
            // X^T rows n0.., and both scales' 128-token block (kr.x is a multiple of 256).
            tma_load_2d(&p.tma_a, bar, smem + kOffA + stage * kABytes, kx, m0);
            tma_load_2d(&p.tma_sfa, bar, sf, m0, kx / kTileK);
            tma_load_2d(&p.tma_b, bar, smem + kOffB + stage * kBBytes, kx, n0);
            tma_load_2d(&p.tma_sfb, bar, sf + kSfaBytes, n0, kx / kTileK);
          } else {
            if constexpr (kBatched) {
              tma_load_3d(&p.tma_a, bar, smem + kOffA + stage * kABytes, kx, m0, l);
              tma_load_3d(&p.tma_sfa, bar, sf, m0, kb, l);
            } else {
              tma_load_2d(&p.tma_a, bar, smem + kOffA + stage * kABytes, kx, m0);
              tma_load_2d(&p.tma_sfa, bar, sf, m0, kb);
            }
            if constexpr (kDiscreteB) {
              tma_load_2d(map_b, bar, smem + kOffB + stage * kBBytes, kx, n0);
            } else {
              tma_load_3d(map_b, bar, smem + kOffB + stage * kBBytes, kx, n0, lb);
            }
          }
          if (++stage == kStages) { stage = 0; phase ^= 1; }
        }
      }
    }
  }

  // Gathered A (kGatherA): every producer lane. Warp w copies rows 32 w .. 32 w + 31 of each
  // stage's A (their source offsets held for the tile, fusegemm/gather.cuh GatherRows) and lane l
  // the 1x128 scale of row 32 w + l; lane 0 of warp 0 (the lead) walks the tile ring and loads
  // B. Every lane walks the same static tile order.
  template <class Params>
  static __device__ void produce_gathered(const Params& p, uint8_t* smem, const Bars& b, int gwarp, int lane) {
    const bool lead = gwarp == 0 && lane == 0;
    const auto sched = Schedule::make(p);
    const int num_k_blocks = k_blocks(p.k);
    if (lead) prefetch_tmap(&p.tma_b);
    const CUtensorMap* map_b = &p.tma_b;
    DeviceTmap<kTmapSlots> b_maps;
    if constexpr (kDiscreteB) {
      if (lead) {
        CUtensorMap* ws = reinterpret_cast<CUtensorMap*>(p.tmap_workspace) + blockIdx.x * kTmapSlotStride;
        b_maps.init(&p.tma_b, ws, reinterpret_cast<CUtensorMap*>(smem + kOffTmap));
      }
    }
    int expert = -1;
    // FP8 rows as 2-byte units (gather_copy_sw128 copies 16-byte pieces of 2-byte elements): a
    // 128-byte K block is 64 units.
    const GatherSource src{static_cast<const unsigned char*>(p.a_gather_ptr), p.a_gather_ld, p.a_gather_rows,
                           p.k / 2};
    const int* index = reinterpret_cast<const int*>(p.a_index);
    const float* sfa_src = reinterpret_cast<const float*>(p.sfa_gather_ptr);

    StaticWalk walk(blockIdx.x, gridDim.x);
    typename Ring::Writer ring;
    Publisher pub;
    int stage = 0;
    uint32_t phase = 0;
    while (true) {
      const GroupedTile t = claim_tile<false>(p, walk, sched);
      if (lead) ring.publish(b.ring, t);
      if (!t.valid()) break;

      const int row0 = t.m_block * kTileM + gwarp * 32;
      GatherRows<8> rows;
      rows.load(src, index, row0, p.m_rows - row0, lane);
      // This lane's scale row: the token of problem row row0 + lane (outside the source: zeros).
      const int token = row0 + lane < p.m_rows ? __ldg(index + row0 + lane) : -1;
      const bool token_ok = static_cast<unsigned>(token) < static_cast<unsigned>(p.a_gather_rows);
      const int lb = kDiscreteB ? 0 : t.expert;
      // The consumers' passes (kPasses: a tile's column halves over K in turn), stage for stage.
      for (int pass = 0; pass < kPasses; ++pass) {
        const int n0 = t.n_block * kTileN + pass * kHalves * kMmaN;
        if (n0 >= p.n) break;
        for (int kb = 0; kb < num_k_blocks; ++kb) {
          mbar_wait(&b.empty[stage], phase ^ 1);
          uint64_t* bar = &b.full[stage];
          if (lead) {
            if constexpr (kDiscreteB) {
              // After the empty wait: a DeviceTmap slot is rewritten kTmapSlots (= kStages) loads later.
              if (t.expert != expert) {
                expert = t.expert;
                const uint64_t* ptrs = reinterpret_cast<const uint64_t*>(p.b_ptrs);
                map_b = b_maps.update(reinterpret_cast<const void*>(ptrs[expert]));
              }
            }
            mbar_arrive_expect_tx(bar, kTxBytes);
            if constexpr (kDiscreteB) {
              tma_load_2d(map_b, bar, smem + kOffB + stage * kBBytes, kb * kTileK, n0);
            } else {
              tma_load_3d(map_b, bar, smem + kOffB + stage * kBBytes, kb * kTileK, n0, lb);
            }
          }
          uint8_t* sa = smem + kOffA + stage * kABytes + gwarp * 32 * 128;
          gather_copy_sw128<1, 0>(sa, src, rows, kb * (kTileK / 2), lane);
          cp_async_4_zfill(smem_u32(smem + kOffSf + stage * kSfStageBytes) + 4 * (gwarp * 32 + lane),
                           sfa_src + static_cast<int64_t>(kb) * p.sfa_gather_ld + (token_ok ? token : 0), token_ok);
          pub.issued(stage, b.full);
          if (++stage == kStages) { stage = 0; phase ^= 1; }
        }
      }
    }
    pub.flush(b.full);
  }

  // ------------------------------------------------------------------------------------
  // Consumers.
  // ------------------------------------------------------------------------------------
  FUSEGEMM_DEVICE static uint64_t stage_desc(uint64_t d0, int stage, int bytes) {
    return d0 + static_cast<uint64_t>((stage * bytes) >> 4);  // address field in 16-byte units
  }

  // A tile's K loop. Per stage and 128-column half h: four chained WGMMAs into t, then
  // acc[h] += t * (sfa[row] * sfb_h[kb]). Both halves read the stage's one A tile (a 128 x 256
  // tile loads 48 KB per 4M FMAs, where two 128 x 128 passes would load 64 KB). sfb[h]: half h's
  // row of B scales (one per 128-K block), read a stage ahead so that the loads' latency hides
  // behind a stage of WGMMAs. halves: the halves inside N (the last tile's second may not be):
  // the others' scales stay 0 and are never read.
  // on_block(kb): called before each block's full wait (blocks before kb have completed).
  template <class OnBlock>
  FUSEGEMM_DEVICE static void mainloop(const Bars& b, const uint8_t* smem, uint64_t da0, uint64_t db0,
                                       int num_k_blocks, int row0, const float* const (&sfb)[kHalves], int halves,
                                       int& stage, uint32_t& phase, float (&acc)[kHalves][kAccum],
                                       float (&t)[kAccum], const OnBlock& on_block) {
    float sb_next[kHalves];
#pragma unroll
    for (int h = 0; h < kHalves; ++h) {
      sb_next[h] = !kKGrouped && num_k_blocks > 0 && h < halves ? __ldg(sfb[h]) : 0.0f;
    }
    const int lane = threadIdx.x % 32;
    for (int kb = 0; kb < num_k_blocks; ++kb) {
      float sb[kHalves];
#pragma unroll
      for (int h = 0; h < kHalves; ++h) {
        sb[h] = sb_next[h];
        if (!kKGrouped && kb + 1 < num_k_blocks && h < halves) sb_next[h] = __ldg(sfb[h] + kb + 1);
      }
      on_block(kb);
      mbar_wait(&b.full[stage], phase);
      const uint64_t da = stage_desc(da0, stage, kABytes), db = stage_desc(db0, stage, kBBytes);
      const float* sfa = reinterpret_cast<const float*>(smem + kOffSf + stage * kSfStageBytes);
      const float a0 = sfa[row0], a1 = sfa[row0 + 8];
#pragma unroll
      for (int h = 0; h < kHalves; ++h) {
        // A half past N runs on TMA's zero rows with scale 0 (only the last tile of an N % 256
        // problem has one): no branch that would make acc[h] a local-memory array.
        fence_acc(t);
        cute::warpgroup_arrive();
#pragma unroll
        for (int kk = 0; kk < kSubBlocks; ++kk) {
          // 32 K of FP8 = 32 bytes = 2 in the descriptors' 16-byte address field; half h's B rows
          // start h * 128 rows of 128 bytes further (1024 in 16-byte units).
          Fp8Gmma<ElementAB>::fma(da + 2 * kk, db + h * (kMmaN * kTileK / 16) + 2 * kk, t, kk > 0 ? 1 : 0,
                                       fusegemm::make_integer_sequence<int, kAccum>{});
        }
        cute::warpgroup_commit_batch();
        const float s0 = a0 * sb[h], s1 = a1 * sb[h];
        cute::warpgroup_wait<0>();
        fence_acc(t);
        // The stage is released once its WGMMAs are done and its scales read: K-grouped reads its
        // B scales (one per column) from the stage during the promotion, so only after it.
        if (!kKGrouped && h == kHalves - 1) mbar_arrive(&b.empty[stage]);
        // K-grouped: the thread's columns 8 i + 2 (lane % 4) + {0, 1} of half h.
        const float* sfbs = reinterpret_cast<const float*>(smem + kOffSf + stage * kSfStageBytes + kSfaBytes) +
                            h * kMmaN + 2 * (lane % 4);
#pragma unroll
        for (int j = 0; j < kAccum; j += 4) {
          // Fragment: elements j, j + 1 are row row0; j + 2, j + 3 are row row0 + 8 (columns
          // 2 j + 2 (lane % 4) + {0, 1}).
          float2 c0 = make_float2(s0, s0), c1 = make_float2(s1, s1);
          if constexpr (kKGrouped) {
            const float2 sb_col = *reinterpret_cast<const float2*>(sfbs + 2 * j);
            c0 = make_float2(a0 * sb_col.x, a0 * sb_col.y);
            c1 = make_float2(a1 * sb_col.x, a1 * sb_col.y);
          }
          acc[h][j + 0] = fmaf(t[j + 0], c0.x, acc[h][j + 0]);
          acc[h][j + 1] = fmaf(t[j + 1], c0.y, acc[h][j + 1]);
          acc[h][j + 2] = fmaf(t[j + 2], c1.x, acc[h][j + 2]);
          acc[h][j + 3] = fmaf(t[j + 3], c1.y, acc[h][j + 3]);
        }
        if (kKGrouped && h == kHalves - 1) mbar_arrive(&b.empty[stage]);
      }
      if (++stage == kStages) { stage = 0; phase ^= 1; }
    }
  }

  // The K loop with two temporary sets (kTemps 2: ping-pong, FUSEGEMM_SM90_BW_TWO_TEMPS; one
  // 128-column half): k-block kb's WGMMAs write t[kb % 2]; while they run, k-block kb - 1's set is
  // promoted, acc += t * (sfa[row] * sfb[kb - 1]), and its stage released. A k-block's scales are
  // read when its WGMMAs are issued (SFA from its stage, B's from global memory a block ahead).
  // on_issued(): after the last k-block's WGMMAs are issued (the other warpgroup may start its
  // mainloop then). on_block(kb): before k-block kb's full wait.
  struct Issued {
    float s0, s1;   // the block's combined scales of fragment rows row0 and row0 + 8
    int stage;
  };
  template <class OnBlock, class OnIssued>
  FUSEGEMM_DEVICE static void mainloop2(const Bars& b, const uint8_t* smem, uint64_t da0, uint64_t db0,
                                        int num_k_blocks, int row0, const float* sfb, int& stage, uint32_t& phase,
                                        float (&acc)[kAccum], float (&t0)[kAccum], float (&t1)[kAccum],
                                        const OnBlock& on_block, const OnIssued& on_issued) {
    if (num_k_blocks == 0) {
      on_issued();
      return;
    }
    float sb_next = __ldg(sfb);
    auto issue = [&](int kb, float (&t)[kAccum]) {
      const float sb = sb_next;
      if (kb + 1 < num_k_blocks) sb_next = __ldg(sfb + kb + 1);
      on_block(kb);
      mbar_wait(&b.full[stage], phase);
      const uint64_t da = stage_desc(da0, stage, kABytes), db = stage_desc(db0, stage, kBBytes);
      fence_acc(t);
      cute::warpgroup_arrive();
#pragma unroll
      for (int kk = 0; kk < kSubBlocks; ++kk) {
        Fp8Gmma<ElementAB>::fma(da + 2 * kk, db + 2 * kk, t, kk > 0 ? 1 : 0,
                                fusegemm::make_integer_sequence<int, kAccum>{});
      }
      cute::warpgroup_commit_batch();
      const float* sfa = reinterpret_cast<const float*>(smem + kOffSf + stage * kSfStageBytes);
      const Issued is{sfa[row0] * sb, sfa[row0 + 8] * sb, stage};
      if (++stage == kStages) { stage = 0; phase ^= 1; }
      return is;
    };
    // After the WGMMAs that wrote t have completed.
    auto retire = [&](float (&t)[kAccum], const Issued& is) {
      fence_acc(t);
      mbar_arrive(&b.empty[is.stage]);
#pragma unroll
      for (int j = 0; j < kAccum; j += 4) {
        acc[j + 0] = fmaf(t[j + 0], is.s0, acc[j + 0]);
        acc[j + 1] = fmaf(t[j + 1], is.s0, acc[j + 1]);
        acc[j + 2] = fmaf(t[j + 2], is.s1, acc[j + 2]);
        acc[j + 3] = fmaf(t[j + 3], is.s1, acc[j + 3]);
      }
    };
    // One step: past the last block, retire the one in flight (false); else issue the next block
    // into `into` and retire `from`, the block before it, while its WGMMAs run. The sets alternate.
    // on_issued() right after the last block's issue (its full wait done): the other warpgroup's
    // mainloop then starts under this one's last two blocks of tensor work.
    int kb = 1;
    auto step = [&](float (&into)[kAccum], Issued& next, float (&from)[kAccum], const Issued& prev) {
      if (kb == num_k_blocks) {
        cute::warpgroup_wait<0>();
        retire(from, prev);
        return false;
      }
      next = issue(kb++, into);
      if (kb == num_k_blocks) on_issued();
      cute::warpgroup_wait<1>();
      retire(from, prev);
      return true;
    };
    Issued even = issue(0, t0), odd{};
    if (num_k_blocks == 1) on_issued();
#pragma unroll 1
    while (step(t1, odd, t0, even) && step(t0, even, t1, odd)) {
    }
  }

  // The B scales of expert (or batch) e's 128 rows from n0: dense p.sfb, or discrete sfb_ptrs[e].
  template <class Params>
  FUSEGEMM_DEVICE static const float* sfb_row(const Params& p, int e, int n0, int num_k_blocks) {
    const int n_blocks = (p.n + kScaleBlock - 1) / kScaleBlock;
    if constexpr (kDiscreteB) {
      const float* base = reinterpret_cast<const float* const*>(p.sfb_ptrs)[e];
      return base + (n0 / kScaleBlock) * num_k_blocks;
    } else {
      return reinterpret_cast<const float*>(p.sfb) + (static_cast<int64_t>(e) * n_blocks + n0 / kScaleBlock) * num_k_blocks;
    }
  }

  template <class Params>
  static __device__ void consume(const Params& p, uint8_t* smem, const Bars& b, int wg) {
    const int lane = threadIdx.x % 32;
    const int warp = threadIdx.x / 32;  // 0 .. kConsumerWarps-1
    const int num_k_blocks = k_blocks(p.k);
    // Cooperative: this warpgroup's 64 rows of the stage's A; ping-pong: the stage's whole A.
    const int wg_row = kPingPong ? 0 : 64 * wg;
    const uint64_t da0 = sw128_kmajor_desc(smem_u32(smem + kOffA) + wg_row * kTileK);
    const uint64_t db0 = sw128_kmajor_desc(smem_u32(smem + kOffB));
    const int row0 = wg_row + 16 * (warp % 4) + lane / 4;  // fragment rows row0, row0 + 8 of the stage's A
    // Ping-pong: the epilogue places warpgroup wg's fragment at rows 64 wg.. of a 128-row tile,
    // so each warpgroup's tile is passed as starting 64 wg rows earlier.
    const int row_shift = kPingPong ? 64 * wg : 0;

    typename Ring::Reader ring;
    int stage = 0;
    uint32_t phase = 0;
    float acc[kHalves][kAccum], t[kTemps][kAccum];
    typename Epi::Partials part;
    part.reset();
    uint32_t acc_phase = 0;   // kEpiWG: passes handed over, mod 2
    bool turn = wg == 0;        // ping-pong: the next ring tile is this warpgroup's
    bool first_turn = wg == 0;  // ... and warpgroup 0's first mainloop waits for nobody

    int4 tile;
    while (ring.next(b.ring, lane, tile)) {
      const int tile_k_blocks = k_range(p, tile.x, num_k_blocks).y;
      if constexpr (kPingPong) {
        const bool own = turn;
        turn = !turn;
        if (!own) {   // the other warpgroup's tile (one pass: kTileN is the pass): skip its stages
          const int s = stage + tile_k_blocks;
          phase ^= uint32_t(s / kStages) & 1u;
          stage = s % kStages;
          continue;
        }
        // Its mainloop came first. The order keeps the stage barriers' parity right: a
        // warpgroup skips the other's stages without waiting on them, so unordered it could wait
        // on a stage two phases ahead and take the phase before for its own.
        if (!first_turn) named_barrier_sync(kOrderBarrier + wg, 256);
        first_turn = false;
      }
      const int prefetch_kb =
          FUSEGEMM_SM90_BW_EPI_PREFETCH > 0 ? max(tile_k_blocks - FUSEGEMM_SM90_BW_EPI_PREFETCH, 0) : -1;
      for (int pass = 0; pass < kPasses; ++pass) {
        const int n0 = tile.z * kTileN + pass * kHalves * kMmaN;
        if (n0 >= p.n) break;
        const int left = (p.n - n0 + kMmaN - 1) / kMmaN;
        const int halves = left < kHalves ? left : kHalves;
        const float* sfb[kHalves];
#pragma unroll
        for (int h = 0; h < kHalves; ++h) {
          sfb[h] = kKGrouped ? nullptr : sfb_row(p, tile.x, n0 + h * kMmaN, num_k_blocks);
#pragma unroll
          for (int i = 0; i < kAccum; ++i) acc[h][i] = 0.0f;
        }
        // The tile's first output row: K-grouped, expert e's (M, N) block is rows e M.. of (L M, N).
        const int m0 = (kKGrouped ? tile.x * p.m_rows : 0) + tile.y * kTileM - row_shift;
        auto on_block = [&](int kb) {
          if (kb == prefetch_kb) {
            if constexpr (kOneEpi) {
              Epi::prefetch(p, m0, n0, warp, lane);
            } else {
#pragma unroll
              for (int h = 0; h < kHalves; ++h) {
                if (h < halves) Epi::prefetch(p, m0, n0 + h * kMmaN, warp, lane);
              }
            }
          }
        };
        if constexpr (kTemps == 2) {
          auto on_issued = [&]() {
            if constexpr (kPingPong) named_barrier_arrive(kOrderBarrier + (wg ^ 1), 256);
          };
          mainloop2(b, smem, da0, db0, tile_k_blocks, row0, sfb[0], stage, phase, acc[0], t[0], t[1], on_block,
                    on_issued);
        } else {
          mainloop(b, smem, da0, db0, tile_k_blocks, row0, sfb, halves, stage, phase, acc, t[0], on_block);
        }
        if constexpr (kEpiWG) {
          // Hand the pass to the epilogue warpgroup once it has read the previous one.
          mbar_wait(b.acc_empty, acc_phase ^ 1);
          EpiWG::put(smem + kOffEpi, row0, lane, acc[0]);
          mbar_arrive(b.acc_full);
          acc_phase ^= 1;
          continue;
        }
        if (FUSEGEMM_SM90_BENCH_NO_EPILOGUE && acc[0][0] != -1.0f) continue;
        if constexpr (kOneEpi) {
          // Both halves as one fragment (register renames, no copies after allocation).
          float all[kHalves * kAccum];
#pragma unroll
          for (int i = 0; i < kHalves * kAccum; ++i) all[i] = acc[i / kAccum][i % kAccum];
          Epi::run(p, smem + kOffEpi, tile.x, m0, n0, wg, warp, lane, all, part);
        } else {
          // One call site of the (not inlined) epilogue, on acc[0]: the next half moves into it.
          // Two call sites would pass acc[1] by reference and put it in local memory.
#pragma unroll 1
          for (int h = 0; h < halves; ++h) {
            Epi::run(p, smem + kOffEpi, tile.x, m0, n0 + h * kMmaN, wg, warp, lane, acc[0], part);
            if constexpr (kHalves == 2) {
#pragma unroll
              for (int i = 0; i < kAccum; ++i) acc[0][i] = acc[1][i];
            }
          }
        }
      }
    }
    if constexpr (!kEpiWG) Epi::finish(part, p, warp, lane);
  }

  // ------------------------------------------------------------------------------------
  // Epilogue warpgroup (kEpiWG): warp ew runs the engine on rows 32 ew.. of each pass the
  // consumers hand over, in the tile ring's order (the consumers' own).
  // ------------------------------------------------------------------------------------
  template <class Params>
  static __device__ void epilogue(const Params& p, uint8_t* smem, const Bars& b, int ew, int lane) {
    typename Ring::Reader ring;
    typename EpiWG::Partials part;
    part.reset();
    uint32_t acc_phase = 0;
    int4 tile;
    while (ring.next(b.ring, lane, tile)) {
      Rule rule;
      rule.begin_tile(p, tile.x);
      const int m0 = (kKGrouped ? tile.x * p.m_rows : 0) + tile.y * kTileM;
      for (int pass = 0; pass < kPasses; ++pass) {
        const int n0 = tile.z * kTileN + pass * kMmaN;
        if (n0 >= p.n) break;
        mbar_wait(b.acc_full, acc_phase);
        if (!FUSEGEMM_SM90_BENCH_NO_EPILOGUE || EpiWG::first(smem + kOffEpi) == -1.0f) {
          EpiWG::run(p, smem + kOffEpi, rule, tile.x, m0, n0, ew, lane, part);
        }
        mbar_arrive(b.acc_empty);
        acc_phase ^= 1;
        EpiWG::flush(part, p, tile.x, m0, ew, lane);
      }
    }
    Engine::flush_end(part, p, lane);
  }
};

}  // namespace sm90
}  // namespace fusegemm
