// The sm_90a epilogue over a WGMMA accumulator fragment, shared by the BF16 grouped kernel and
// the block-scaled kernel (both hold a 64 x kTileN FP32 fragment per consumer warpgroup).
//
// Warp `warp` owns tile rows [16*warp, 16*warp + 16) (warpgroup wg holds rows 64*wg..).
// Fragment: acc[4j + {0,1}] -> (row lane/4, cols 8j + 2(lane%4) + {0,1}), acc[4j + {2,3}] ->
// same columns, row lane/4 + 8.
//
// Element-wise rules (no pairing, quantization or reduction; 16/32-bit outputs) apply the rule on
// the fragment itself and stage converted rows per warp (the fast path of seed 001). Rules that
// pair gate/up blocks or reduce (row sums, amax) but do not quantize, with 16/32-bit outputs (the
// MoE layer's SwiGLU forward and dSwiGLU backward) also run on the fragment, block by block
// (frag_blocks below): a thread's gate and up values sit in its own registers, so every warp
// works and nothing is staged but the outputs; so does an 8-bit D quantized along rows only
// (FUSEGEMM_SM90_FRAG_QUANT: a row's 32 block columns are a quad's). Every other rule (column
// SFD, other narrow outputs) goes through the arch-neutral engine (fusegemm/epilogue_block.cuh):
// each warpgroup stages blocks of its 64 accumulator rows in shared memory and its warps run the
// engine on 32 rows each, lane = row, exactly as the sm_100a kernels and the epilogue harness do
// (FUSEGEMM_SM90_ENGINE_WARPS: four warps on two blocks, or two on one).
//
// H200, the MoE layer's dsv3 step (8 experts, H 7168, F 2048): through the engine the SwiGLU
// forward (with C) took 1.75 ms and dSwiGLU 1.13 ms; on the fragment 1.27 and 0.86 ms, against
// about 1.3 and 0.7 ms for the plain GEMMs of the same shapes (README, "Epilogues in YAML").
#pragma once

#include "fusegemm/common.cuh"
#include "fusegemm/epilogue_block.cuh"
#include "fusegemm/tma.cuh"

// The 1x128 output quantization's divisions by the old route (div.rn per value where a group's
// scale is not finite, div.rn for each group's scale): 1 is the A/B baseline for bench/blockscaled.py.
#ifndef FUSEGEMM_SM90_1X128_DIV_RN
#define FUSEGEMM_SM90_1X128_DIV_RN 0
#endif

// 0 sends paired and reducing rules back to the engine path: an A/B switch for same-run
// comparisons through FUSEGEMM_NVRTC_EXTRA (bench/epilogue_swiglu.py --engine-baseline).
#ifndef FUSEGEMM_SM90_FRAG_BLOCKS
#define FUSEGEMM_SM90_FRAG_BLOCKS 1
#endif
// 1: the fragment path's block loop runs rolled where that measured faster (kRollBlocks below),
// each block's accumulators selected at run time: one copy of the rule instead of one per block.
// 0: always fully unrolled. An A/B switch through FUSEGEMM_NVRTC_EXTRA.
#ifndef FUSEGEMM_SM90_FRAG_ROLL
#define FUSEGEMM_SM90_FRAG_ROLL 1
#endif
// Blocks per iteration of the fragment path's block loop in ping-pong's overlapped epilogue
// (unpaired accumulator, no 1x128 scales), which FUSEGEMM_SM90_FRAG_ROLL leaves unrolled: 0 keeps
// it unrolled (one copy of the rule per block: 192 KB of SASS for dSwiGLU at 64 x 256, 18% of
// Nsight Compute's samples waiting on instruction fetch); n (a divisor of the tile's blocks) runs
// n blocks per iteration of a rolled loop, their accumulators selected per n-block span at run
// time (at 8 blocks, n = 2: 3 x 32 selects per iteration, 384 per tile, against 896 rolled in full,
// which measured 1.00-1.04x slower). An A/B switch through FUSEGEMM_NVRTC_EXTRA. Same bytes;
// H100, 2026-12-05 (bench/pingpong.py dSwiGLU pp64x256, same run, bench/results/
// pingpong_h100_frag_span*.json): 2-block spans (4,080 SASS lines against 12,386) 0.89-1.07x the
// unrolled speed over eight shapes (faster at mixtral's routed layer shape alone, in both runs),
// 4-block spans 0.93-1.02x, 1-block 0.89-0.98x (two shapes). The instruction fetch stalls are
// not what the overlapped epilogue waits on: 0 stays. (1-block spans at 64 x 256 spill 8 bytes
// since BF16 C pairs unpack by shift and mask, common.cuh bf16x2_to_f32: the default, unrolled,
// does not.)
#ifndef FUSEGEMM_SM90_FRAG_ROLL_SPAN
#define FUSEGEMM_SM90_FRAG_ROLL_SPAN 0
#endif
// Rules with an 8-bit D quantized along rows only (SFD_row: the SwiGLU forward feeding the next
// GEMM): 1 quantizes it on the fragment (frag_blocks' quant_d: the four lanes that hold a row's 32
// columns of a block reduce its max with two shuffles; the engine's bits); 0 runs it on the engine
// (the measured baseline, an A/B switch through FUSEGEMM_NVRTC_EXTRA). D quantized along columns
// too (SFD_col: quant, dSwiGLU) stays on the engine: its fragment path (each column's 32-row max
// reduced by shuffles over a warp's 16 rows and through shared memory between the two warps of a
// block; same bytes as the engine on the H200) ran slower in every case, blockwise recipe, same
// run (bench/results/blockscaled_h200_frag_quant_col.json): quant 0.78-0.91x the engine's speed,
// dSwiGLU 0.76-0.90x (ops it did not touch: 0.94-1.07x, the noise). It was removed.
// 1: the fragment path's element inputs (dSwiGLU's C) of a whole in-range block are read at
// constant offsets from one address per input and row (Rule::elem_at_row / elem2_at); 0: each
// pair's 64-bit address computed by itself (Rule::elem2), about six instructions per load in the
// unrolled epilogue. Same loads, same bits.
#ifndef FUSEGEMM_SM90_FRAG_ELEM_AT
#define FUSEGEMM_SM90_FRAG_ELEM_AT 1
#endif

// 1: the fragment path masks every rule output past N (the baseline); 0: only those the block's
// quantization reads (apply_quad, kMaskOuts).
#ifndef FUSEGEMM_SM90_FRAG_MASK_ALL
#define FUSEGEMM_SM90_FRAG_MASK_ALL 0
#endif

// 1: ping-pong's unrolled fragment blocks load the next block's element inputs during the block
// before (kLoadAhead); 0: each block loads its own as it starts (the baseline, an A/B switch).
// Written 2026-12-05 after Nsight Compute (H200) found the ping-pong dSwiGLU's epilogue waiting
// on its C loads for 35% of its samples. H100, 2026-12-05, bench/pingpong.py --also (pp64x256,
// routed, two runs of 5 and 7 rounds): mixtral layer 1.01x / 0.99x, dsv3-32 layer 1.04x /
// 1.06x, qwen3 1.02x / 1.02x; the graphed layer (bench/moe_layer.py, processes in turn, two pairs)
// mixtral 14.56 / 14.62 against 14.43 / 14.92 ms, dsv3-32 14.77 / 14.92 against 15.02 / 15.19 ms.
// tests/gpu/test_epilogue_gpu.py::test_dswiglu_bf16_ping_pong_inputs checks both settings.
#ifndef FUSEGEMM_SM90_FRAG_LOAD_AHEAD
#define FUSEGEMM_SM90_FRAG_LOAD_AHEAD 1
#endif

#ifndef FUSEGEMM_SM90_FRAG_QUANT
#define FUSEGEMM_SM90_FRAG_QUANT 1
#endif
// Benchmark only: 1 skips the epilogue at run time (nothing is stored unless a tile's first
// accumulator is exactly -1; the output is not a result): the mainloop's own speed, the ceiling
// any epilogue work can reach (bench/ceiling.py; the BF16 and
// blockwise kernels read it). A data-dependent skip, not a removed call:
// without the call NVRTC reshapes the mainloop (7 HGMMA sites instead of 28), and the ceiling
// would time another loop.
#ifndef FUSEGEMM_SM90_BENCH_NO_EPILOGUE
#define FUSEGEMM_SM90_BENCH_NO_EPILOGUE 0
#endif
// Warps of each warpgroup that run the engine path (lane = row, 32 rows each): 4 stages two
// blocks of the fragment at once and gives each pair of warps one of them, where the block has
// 32 unpaired columns (a paired block's stage is twice the size); 2 stages one block at a time
// and leaves two warps idle (the measured baseline, an A/B switch through FUSEGEMM_NVRTC_EXTRA).
// Paired blocks staged two at a time as well (twice the stage memory, taken from the pipeline)
// ran blockwise dSwiGLU at 0.96-1.03x, the noise (bench/results/blockscaled_h200_prefetch.json,
// "ep2"): not kept.
#ifndef FUSEGEMM_SM90_ENGINE_WARPS
#define FUSEGEMM_SM90_ENGINE_WARPS 4
#endif
// The K-grouped weight gradient's M-major D (cd_major m), deferred and 16-bit, on the cooperative
// 128-row tile: 1 stages each 64-column chunk of the whole tile in shared memory (named barrier
// kDTileBarrier around it, the two warpgroups' eight warps) and writes each output row's 128 M
// values as 256 contiguous bytes (epi::TileTransposedStore); 0 has each warp write its 16 rows of
// every column as a 32-byte piece (epi::WarpTransposedStore, the measured baseline; an A/B switch
// through FUSEGEMM_NVRTC_EXTRA). The M-major store had cost 6-15% of the N-major one's speed
// (H100, 2026-12-06, bench/gathered.py --wgrad-swapped, wgrad_swapped_dt_store_vs_n_major).
#ifndef FUSEGEMM_SM90_DT_TILE_STORE
#define FUSEGEMM_SM90_DT_TILE_STORE 1
#endif
// How the engine path stages accumulators where the engine is branch-free
// (FUSEGEMM_ENGINE_BRANCHLESS and a rule it applies to): 1 writes each fragment pair as one 8-byte
// store and the engine reads its row four values at a time (16-byte loads; rows padded to a
// multiple of four floats, 36 per 32-column block: 3 KB more shared memory per 128-row tile); 0
// stores and reads single floats (rows of 33: the lane-per-row reads hit distinct banks). With
// the branching engine its reads would be split up again, and the 8-byte stores alone spilled
// the blockwise sReLU with FP8 D (8 bytes): there it changes nothing. H200, over the branch-free
// engine with the max tree (bench/results/blockscaled_h200_engine_switches_2.json, 5 rounds):
// quant 1.01-1.06x, dSwiGLU 0.98-1.04x, sReLU with FP8 D 0.99-1.02x; 0 is the baseline, an A/B
// switch through FUSEGEMM_NVRTC_EXTRA.
#ifndef FUSEGEMM_SM90_ENGINE_VEC_STAGE
#define FUSEGEMM_SM90_ENGINE_VEC_STAGE 1
#endif

namespace fusegemm {
namespace sm90 {

// A warp's 16 x 32 block of an 8-bit output (FP8 D quantized on the fragment): 32-byte rows at a
// 48-byte pitch (the u16 stores of one fragment group hit 8 distinct banks; rows stay 16-byte
// aligned for the flush's vector loads).
struct QuantRowStore {
  static constexpr int kPitch = 48;
  static constexpr int kBytes = 16 * kPitch;

  // Two adjacent converted values (cvt_narrow2's low 16 bits) at (row, col), col even.
  FUSEGEMM_DEVICE static void put(uint32_t buf, int row, int col, uint32_t pair) {
    asm volatile("st.shared.u16 [%0], %1;" ::"r"(buf + row * kPitch + col), "h"(uint16_t(pair)) : "memory");
  }

  // Rows 0-15 to gbase (byte of row 0, column 0; row pitch ld bytes): lane = 16 bytes of a row;
  // 16-byte stores where the vector is whole and aligned, else bytes up to cols_valid.
  FUSEGEMM_DEVICE static void flush(uint32_t buf, uint8_t* gbase, int64_t ld, int cols_valid, int lane) {
    const int row = lane / 2, col = (lane % 2) * 16;
    if (col >= cols_valid) return;
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "r"(buf + row * kPitch + col)
                 : "memory");
    uint8_t* dst = gbase + row * ld + col;
    if (cols_valid - col >= 16 && (reinterpret_cast<uintptr_t>(dst) & 15) == 0) {
      epi::st_global_v4(dst, v);
    } else {
      const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        if (j < cols_valid - col) dst[j] = uint8_t(w[j / 4] >> (8 * (j % 4)));
      }
    }
  }
};

// Which of the three paths below a rule's epilogue takes (a kernel that hands the engine path's
// accumulators to an epilogue warpgroup asks before it lays out its shared memory).
template <class Rule, class ElementC, class ElementD, bool kCMajor, bool kBatched, bool kForceEngine>
struct EpiPath {
  static constexpr bool kFragment = Rule::kElementwise && !kForceEngine && !kBatched;
  // An 8-bit D quantized along rows only (FUSEGEMM_SM90_FRAG_QUANT): the fragment path below
  // quantizes it.
  static constexpr bool kFragQuantOk = FUSEGEMM_SM90_FRAG_QUANT && Rule::kHasD && Rule::kQuantRowD &&
                                       !Rule::kQuantColD && epi::out_bits<ElementD>() == 8;
  // Paired or reducing rules without SFD quantization (or with kFragQuantOk's), 16/32-bit outputs
  // otherwise, N-major C.
  static constexpr bool kFragBlocks =
      FUSEGEMM_SM90_FRAG_BLOCKS && !kFragment && !kForceEngine && !kBatched && !kCMajor &&
      (kFragQuantOk || (!Rule::kQuantRowD && !Rule::kQuantColD && !(Rule::kHasD && epi::is_narrow<ElementD>()))) &&
      !Rule::kColSum &&   // column sums: the engine's lane = row layout sums a column across the warp
      !(Rule::kHasC && epi::is_narrow<ElementC>());
  static constexpr bool kEngine = !kFragment && !kFragBlocks;
};

// How the engine path stages a 32- or 64-column accumulator block, lane = row: floats per staged
// row (+1 makes the lane-per-row reads hit distinct banks; +4 keeps rows 16-byte aligned for
// FUSEGEMM_SM90_ENGINE_VEC_STAGE: a quarter warp's 16-byte reads, rows 144 bytes apart, then cover
// the 32 banks once), the fragment's pair stores and the engine's reads of one row.
template <class Engine>
struct EngineStage {
  static constexpr bool kVec = FUSEGEMM_SM90_ENGINE_VEC_STAGE != 0 && Engine::kBranchless;
  static constexpr int kAccPerBlock = Engine::kAccVals;
  static constexpr int kPitch = kAccPerBlock + (kVec ? 4 : 1);

  // Fragment values (a, b) of one row at columns col, col + 1 (col even).
  FUSEGEMM_DEVICE static void put2(float* at, float a, float b) {
    if constexpr (kVec) {   // col even, the pitch a multiple of 4: 8-byte aligned
      *reinterpret_cast<float2*>(at) = make_float2(a, b);
    } else {
      at[0] = a;
      at[1] = b;
    }
  }

  // The engine's reader of a staged row (src: its first value): value i, a constant in the
  // unrolled engine.
  FUSEGEMM_DEVICE static auto reader(const float* src) {
    return [src](int i) {
      if constexpr (kVec) {
        const float4 q = reinterpret_cast<const float4*>(src)[i >> 2];   // i's 16-byte group
        return (i & 3) == 0 ? q.x : (i & 3) == 1 ? q.y : (i & 3) == 2 ? q.z : q.w;
      } else {
        return src[i];
      }
    };
  }
};

// kTileM / kTileN: rows and columns of the fragment the consumers hold (64 rows per warpgroup).
// Engine: the epi::BlockEngine instantiation (its batching, C layout and SFD_col layout).
// kBatched: rows are per batch (p.m_rows each); a warp's rows past the batch end are not stored.
// kForceEngine: run every rule through the engine (kernels whose outputs the fragment path does
// not stage, e.g. FP8/FP4 C).
// kDefer: the kernel defers D's stores into its next tile's mainloop where it can (kDeferD below).
// kOverlapped: the epilogue runs while the other warpgroup's mainloop does (ping-pong).
// kEngineWarps: warps per warpgroup that run the engine path (FUSEGEMM_SM90_ENGINE_WARPS below).
// kScatter: scattered outputs (d_scatter): problem row r's C and D rows are stored at row
// p.d_index[r] of the outputs (an index outside [0, p.d_rows) stores nothing), element-wise rules
// only (the fragment path: a row's staged 16-byte vectors go to one global row, so redirecting a
// row costs one index load per lane and tile).
// kAheadOk: the kernel leaves the registers for FUSEGEMM_SM90_FRAG_LOAD_AHEAD (kLoadAhead below;
// the stream-K kernel's fix-up state does not: it spilled 8 bytes).
// kDMajorM: D is M-major (the K-grouped weight gradient's cd_major m: expert e's D_e^T, row n of
// the output at (e * N + n) * ldd holding the tile's M values; fusegemm/epilogue.cuh
// WarpTransposedStore), for element-wise rules with D alone (no C, no column or element input).
template <int kTileM, int kTileN, class Rule, class ElementC, class ElementD, class Engine,
          bool kBatched = false, bool kForceEngine = false, bool kDefer = false, bool kOverlapped = false,
          int kEngineWarps = FUSEGEMM_SM90_ENGINE_WARPS, bool kScatter = false, bool kAheadOk = true,
          bool kDMajorM = false>
struct WgmmaEpilogue {
  static constexpr int kConsumerWGs = kTileM / 64;
  static constexpr int kConsumerWarps = 4 * kConsumerWGs;
  static constexpr int kAccum = kTileN / 2;  // FP32 accumulators per consumer thread
  using Path = EpiPath<Rule, ElementC, ElementD, Engine::kCMajor, kBatched, kForceEngine>;
  static constexpr bool kFragment = Path::kFragment;
  static_assert(!kScatter || kFragment, "scattered outputs: element-wise rules on the fragment path (the "
                                       "registry's check_rule)");
  static constexpr bool kFragQuantOk = Path::kFragQuantOk;
  static constexpr bool kFragBlocks = Path::kFragBlocks;
  static constexpr bool kFragQuant = kFragBlocks && kFragQuantOk;
  // 1x128 output scales (quantize.vec 128, the blockwise recipe's): a row's scale covers 128
  // columns, four blocks, so the fragment path finds each group's max first (group_scales) and
  // then quantizes block by block. Rows only, unpaired D, whole groups in the tile; the engine
  // (epilogue_block.cuh) quantizes 32-column blocks only.
  static constexpr bool k1x128 = Rule::kSfdVec == 128 && Rule::kQuantRowD;   // (a 16-bit D: nothing to scale)
  static_assert(Rule::kSfdVec == 32 || Rule::kSfdVec == 128, "SFD_row blocks of 32 or 128 columns");
  static_assert(!k1x128 || kFragQuant, "1x128 output scales are quantized on the fragment: an 8-bit D quantized "
                                       "along rows only (FUSEGEMM_SM90_FRAG_QUANT 1)");
  using BlkC = epi::FragBlockStore<fusegemm::conditional_t<kFragBlocks && Rule::kHasC, ElementC, float>>;
  using BlkD = fusegemm::conditional_t<kFragQuant, QuantRowStore,
      epi::FragBlockStore<fusegemm::conditional_t<kFragBlocks && Rule::kHasD && !kFragQuant, ElementD, float>>>;
  static constexpr int kBlkCBufs = Rule::kHasC ? (Rule::kPairedC ? 2 : 1) : 0;
  static constexpr int kBlkDBufs = Rule::kHasD ? (Rule::kPairedD ? 2 : 1) : 0;
  // kFragQuant: [C][D by rows] per warp.
  static constexpr int kDBufOff = kBlkCBufs * BlkC::kBytes;
  static constexpr int kBlkWarpBytes = kDBufOff + kBlkDBufs * BlkD::kBytes;
  // 32-element-column blocks of a tile (64 accumulator columns each when the accumulator pairs).
  static constexpr int kElemBlocks = Rule::kPairedAcc ? kTileN / 64 : kTileN / 32;
  static_assert(!k1x128 || (!Rule::kPairedD && kElemBlocks % 4 == 0),
                "1x128 output scales: an unpaired D and whole 128-column groups per epilogue call (a paired "
                "accumulator needs the 256-column tile)");
  using StoreC = epi::WarpStagedStore<fusegemm::conditional_t<kFragment, ElementC, float>>;
  using StoreD = epi::WarpStagedStore<fusegemm::conditional_t<kFragment, ElementD, float>>;
  using StoreT = epi::WarpTransposedStore<fusegemm::conditional_t<kFragment, ElementD, float>>;   // kDMajorM
  static_assert(!kDMajorM || (kFragment && Rule::kHasD && !Rule::kHasC && !kScatter && !kBatched &&
                              __is_empty(typename Rule::ElemIn) && StoreT::kCols == StoreD::kCols &&
                              StoreT::kBytes <= StoreD::kBytes),
                "an M-major D: element-wise rules storing D alone, no column or element input (the registry's "
                "check_rule), in the row store's chunks and buffer");
  static constexpr int kEpiWarpBytes = StoreC::kBytes > StoreD::kBytes ? StoreC::kBytes : StoreD::kBytes;
  // The engine path stages [64 rows][kAccPitch] FP32 accumulators per warpgroup plus the engine's
  // buffers for its two active warps.
  static constexpr int kAccPerBlock = Rule::kPairedAcc ? 64 : 32;
  using Stage = EngineStage<Engine>;
  static constexpr int kAccPitch = Stage::kPitch;
  // Blocks staged and run at once per warpgroup (kEngineWarps): warps 2 and 3 take the second.
  static constexpr int kEngineBlocks =
      kEngineWarps == 4 && !Rule::kPairedAcc && (kTileN / kAccPerBlock) % 2 == 0 ? 2 : 1;
  static constexpr int kWgAccBytes = kEngineBlocks * 64 * kAccPitch * 4;
  static constexpr int kWgEpiBytes = kWgAccBytes + 2 * kEngineBlocks * Engine::kStageBytes;
  static_assert(kTileN % kAccPerBlock == 0, "tile N holds whole gate/up block pairs");
  // Shared memory the epilogue needs (the kernel places it; the harness passes its own).
  static constexpr int kBytes = kFragment     ? kConsumerWarps * kEpiWarpBytes
                               : kFragBlocks ? kConsumerWarps * kBlkWarpBytes
                                             : kConsumerWGs * kWgEpiBytes;
  using Partials = typename Engine::Partials;

  // The rule on fragment group j of a warp's rows: columns col, col + 1 (col = n0 + 8 j +
  // 2 (lane % 4)) of row `row` (lane / 4 of the warp's 16) into o[0], o[1] and of row + 8 into
  // o[2], o[3]. Columns past N are never stored; their inputs are not read (they would run into
  // the next expert's column inputs or off the end).
  template <class Params>
  FUSEGEMM_DEVICE static void apply_group(const Params& p, const Rule& rule, int row, int col,
                                          const typename Rule::RowIn& r0in, const typename Rule::RowIn& r1in,
                                          const float (&acc)[kAccum], int j, typename Rule::Out (&o)[4]) {
    const bool in0 = col < p.n, in1 = col + 1 < p.n;
    const auto e0 = in0 ? rule.elem(p, row, col) : typename Rule::ElemIn{};
    const auto e1 = in1 ? rule.elem(p, row, col + 1) : typename Rule::ElemIn{};
    const auto e2 = in0 ? rule.elem(p, row + 8, col) : typename Rule::ElemIn{};
    const auto e3 = in1 ? rule.elem(p, row + 8, col + 1) : typename Rule::ElemIn{};
    o[0] = rule.apply(acc[4 * j + 0], 0.0f, r0in, e0);
    o[1] = rule.apply(acc[4 * j + 1], 0.0f, r0in, e1);
    o[2] = rule.apply(acc[4 * j + 2], 0.0f, r1in, e2);
    o[3] = rule.apply(acc[4 * j + 3], 0.0f, r1in, e3);
  }

  // Deferred D (kDeferD: element-wise rules with a 16-bit D, no C and no column or element
  // input). compute() applies the rule to the fragment and keeps D packed in registers
  // (kTileN / 4 per thread); the kernel then stores chunk c (16 rows x 128 bytes per warp,
  // staged as WarpStagedStore does) after issuing k-block c of its next tile, so the staging and
  // the global stores run while the tensor cores work instead of between the tiles, and drain()
  // stores the last tile's at its end. Rules with column or element inputs (a bias) keep the
  // staged path: loading a whole tile's inputs at once spilled (the staged path loads them chunk
  // by chunk).
  static constexpr bool kDeferD = kDefer && kFragment && Rule::kHasD && !Rule::kHasC && epi::Cvt<
      fusegemm::conditional_t<kFragment, ElementD, float>>::kBytes == 2 && __is_empty(typename Rule::ElemIn);
  static constexpr int kChunks = kTileN / StoreD::kCols;    // chunks of a warp's 16 rows
  // FUSEGEMM_SM90_DT_TILE_STORE: the deferred M-major D of the cooperative 128-row tile staged by
  // its eight warps together (epi::TileTransposedStore, in their eight buffers taken together),
  // between two syncs of named barrier kDTileBarrier (the stores come at the same k-blocks of both
  // warpgroups' mainloops, which wait on the same stages).
  static constexpr bool kTileT = FUSEGEMM_SM90_DT_TILE_STORE && kDMajorM && kDeferD && kConsumerWarps == 8 &&
                                 !kOverlapped;
  static constexpr uint32_t kDTileBarrier = 8;   // (1-2: the engine path, 3-7: the kernel's)
  static_assert(!kTileT || (StoreD::kCols == 64 && kConsumerWarps * kEpiWarpBytes >= 128 * 64 * 2),
                "the tile's transposed chunk: 64 columns of 128 rows in the warps' buffers");
  static constexpr int kPairsPerChunk = 2 * (StoreD::kCols / 8);
  // kScatter: the output rows of the staged rows a lane stores (WarpStagedStore::flush_rows: rows
  // lane / 8 + 4 i of the warp's 16), -1 where nothing is stored.
  struct Dst {
    int row[kScatter ? StoreD::kVecPerLane : 1];
  };
  static_assert(!kScatter || (StoreD::kVecPerLane == 4 && StoreC::kVecPerLane == 4 &&
                              StoreD::kVecPerRow == 8 && StoreC::kVecPerRow == 8),
                "scattered rows: a lane stores the same four rows of C and D");
  struct Deferred {
    uint32_t v[kTileN / 4];  // chunk c: v[c * kPairsPerChunk ...], rows lane/4 and lane/4 + 8
    int row0 = -1, n0 = 0;   // row0 < 0: nothing pending (kDMajorM: the warp's first row in its expert)
    int t_row = 0;           // kDMajorM: the output row of the expert's column 0 (expert * N)
    Dst dst;                 // kScatter
  };

  // The tile's expert and row inputs (alpha, prob, ...) of warp `warp`'s rows: the fragment path
  // loads them first (run()); with deferred D the kernel loads them before its last k-block, so
  // that their latency is not paid after the mainloop.
  struct Pre {
    Rule rule;
    typename Rule::RowIn r0in, r1in;
    Dst dst;   // kScatter
    int expert = 0;   // kDMajorM
  };
  template <class Params>
  static __device__ Pre preload(const Params& p, int expert, int m0, int warp, int lane) {
    Pre pre;
    pre.rule.begin_tile(p, expert);
    if constexpr (kDMajorM) pre.expert = expert;
    const int row0 = m0 + 16 * warp;
    pre.r0in = pre.rule.row(p, row0 + lane / 4);
    pre.r1in = pre.rule.row(p, row0 + lane / 4 + 8);
    if constexpr (kScatter) pre.dst = scatter_rows(p, row0, lane);
    return pre;
  }

  // The output rows of the four staged rows lane stores (rows row0 + lane / 8 + 4 i of the
  // problem); an index outside [0, d_rows) (the routing's -1 padding) becomes -1: not stored.
  template <class Params>
  static __device__ Dst scatter_rows(const Params& p, int row0, int lane) {
    Dst dst;
    const int* index = reinterpret_cast<const int*>(p.d_index);
#pragma unroll
    for (int i = 0; i < StoreD::kVecPerLane; ++i) {
      const int r = row0 + lane / 8 + 4 * i;
      const int to = r < p.m_rows ? __ldg(index + r) : -1;
      dst.row[i] = static_cast<unsigned>(to) < static_cast<unsigned>(p.d_rows) ? to : -1;
    }
    return dst;
  }

  template <class Params>
  static __device__ void compute(const Params& p, const Pre& pre, int m0, int n0, int warp, int lane,
                                 const float (&acc)[kAccum], Deferred& d) {
    static_assert(kDeferD, "compute(): deferred D only");
    const Rule& rule = pre.rule;
    const int row0 = m0 + 16 * warp;
    const auto& r0in = pre.r0in;
    const auto& r1in = pre.r1in;
    const int r0 = lane / 4, cq = (lane % 4) * 2;
#pragma unroll
    for (int j = 0; j < kTileN / 8; ++j) {
      typename Rule::Out o[4];
      apply_group(p, rule, row0 + r0, n0 + j * 8 + cq, r0in, r1in, acc, j, o);
      d.v[2 * j] = epi::Cvt<ElementD>::pack2(o[0].d, o[1].d);
      d.v[2 * j + 1] = epi::Cvt<ElementD>::pack2(o[2].d, o[3].d);
    }
    if constexpr (kDMajorM) {
      d.row0 = row0 - pre.expert * p.m_rows;
      d.t_row = pre.expert * p.n;
    } else {
      d.row0 = row0;
    }
    d.n0 = n0;
    if constexpr (kScatter) d.dst = pre.dst;
  }

  // Chunk c of the pending D (buf: the warp's staging buffer).
  template <int c, class Params>
  static __device__ void store_chunk(const Params& p, uint32_t buf, const Deferred& d, int lane) {
    const int chunk_col = d.n0 + c * StoreD::kCols;
    if (d.row0 < 0 || chunk_col >= p.n) return;   // warp-uniform
    if constexpr (kTileT) {
      using TT = epi::TileTransposedStore<ElementD>;
      const int warp = (d.row0 >> 4) & 7;   // d.row0: the tile's first row in its expert + 16 warp
      const uint32_t tile_buf = buf - warp * kEpiWarpBytes;   // warp 0's: the eight buffers together
      // Lane 8 i + j addresses column j of fragment matrix i (the warp path's matrices below, at
      // the warp's rows 16 warp.. of the tile).
      const int i = lane / 8;
      const uint32_t at = TT::at(tile_buf, 16 * warp + 8 * (i % 2), 8 * (i / 2) + lane % 8);
      named_barrier_sync(kDTileBarrier, 256);   // every warp has flushed the previous chunk
#pragma unroll
      for (int jj = 0; jj < TT::kCols / 8; jj += 2) {
        const uint32_t* v = d.v + c * kPairsPerChunk + 2 * jj;
        TT::put_trans4(at + jj * 8 * TT::kColBytes, v[0], v[1], v[2], v[3]);
      }
      named_barrier_sync(kDTileBarrier, 256);   // the tile's chunk is staged
      TT::flush(tile_buf, reinterpret_cast<ElementD*>(p.d_out) + static_cast<int64_t>(d.t_row + chunk_col) * p.ldd +
                              (d.row0 - 16 * warp), p.ldd, p.n - chunk_col, warp, lane);
      return;
    } else if constexpr (kDMajorM) {
      // Lane 8 i + j addresses column j of fragment matrix i: rows 8 (i % 2).., columns
      // 8 (jj + i / 2).. of the chunk, whose pairs are d.v[.. + 2 (jj + i / 2) + i % 2].
      const int i = lane / 8;
      const uint32_t at = StoreT::at(buf, 8 * (i % 2), 8 * (i / 2) + lane % 8);   // + constant offsets below
      __syncwarp();   // the previous flush has finished reading the buffer
#pragma unroll
      for (int jj = 0; jj < StoreT::kCols / 8; jj += 2) {
        const uint32_t* v = d.v + c * kPairsPerChunk + 2 * jj;
        StoreT::put_trans4(at + jj * 8 * StoreT::kColBytes, v[0], v[1], v[2], v[3]);
      }
      __syncwarp();
      StoreT::flush(buf, reinterpret_cast<ElementD*>(p.d_out) + static_cast<int64_t>(d.t_row + chunk_col) * p.ldd +
                             d.row0, p.ldd, p.n - chunk_col, lane);
      return;
    }
    const uint32_t at = StoreD::at(buf, lane / 4, (lane % 4) * 2);   // + constant offsets below
    __syncwarp();   // the previous flush has finished reading the buffer
#pragma unroll
    for (int jj = 0; jj < StoreD::kCols / 8; ++jj) {
      StoreD::put_packed(at + jj * 8 * StoreD::kElem, d.v[c * kPairsPerChunk + 2 * jj]);
      StoreD::put_packed(at + 8 * StoreD::kPitch + jj * 8 * StoreD::kElem, d.v[c * kPairsPerChunk + 2 * jj + 1]);
    }
    __syncwarp();
    if constexpr (kScatter) {
      StoreD::flush_rows(buf, reinterpret_cast<ElementD*>(p.d_out) + chunk_col, p.ldd, d.dst.row, p.n - chunk_col,
                         lane);
    } else {
      StoreD::flush(buf, reinterpret_cast<ElementD*>(p.d_out) + static_cast<int64_t>(d.row0) * p.ldd + chunk_col,
                    p.ldd, p.n - chunk_col, lane);
    }
  }

  // store_chunk<i>() for a run-time i (folded where the caller's loop is unrolled).
  template <int c = 0, class Params>
  static __device__ void store_chunk_at(int i, const Params& p, uint32_t buf, const Deferred& d, int lane) {
    if constexpr (c < kChunks) {
      if (i == c) store_chunk<c>(p, buf, d, lane);
      else store_chunk_at<c + 1>(i, p, buf, d, lane);
    }
  }

  // Every chunk of the pending D (the kernel's last tile); nothing is pending after.
  template <int c = 0, class Params>
  static __device__ void drain(const Params& p, uint32_t buf, Deferred& d, int lane) {
    if constexpr (c < kChunks) {
      store_chunk<c>(p, buf, d, lane);
      drain<c + 1>(p, buf, d, lane);
    } else {
      d.row0 = -1;
    }
  }

  // One output of the warp's 16 rows, chunk by chunk: Store stages it (StoreC / StoreD row by
  // row from out's row 0; StoreT, kDMajorM's D, column by column from out = the warp's first row
  // of column 0 in the M-major output) and flushes it.
  template <class Out, class Store, bool kIsC, class Params>
  static __device__ void store_output(const Params& p, const Rule& rule, uint32_t buf,
                                      Out* out, int64_t ld, int row0, int n0,
                                      const typename Rule::RowIn& r0in, const typename Rule::RowIn& r1in,
                                      int lane, const float (&acc)[kAccum], const Dst& dst) {
    constexpr int kCols = Store::kCols;
    const int r0 = lane / 4;
    const int cq = (lane % 4) * 2;
#pragma unroll
    for (int c = 0; c < kTileN / kCols; ++c) {
      const int chunk_col = n0 + c * kCols;
      if (chunk_col >= p.n) break;  // warp-uniform: the rest of the tile is past N
      __syncwarp();                 // previous flush has finished reading the buffer
#pragma unroll
      for (int jj = 0; jj < kCols / 8; ++jj) {
        const int j = c * (kCols / 8) + jj;
        typename Rule::Out o[4];
        apply_group(p, rule, row0 + r0, chunk_col + jj * 8 + cq, r0in, r1in, acc, j, o);
        const auto &o00 = o[0], &o01 = o[1], &o10 = o[2], &o11 = o[3];
        if constexpr (kIsC) {
          Store::put(buf, r0, jj * 8 + cq, o00.c, o01.c);
          Store::put(buf, r0 + 8, jj * 8 + cq, o10.c, o11.c);
        } else {
          Store::put(buf, r0, jj * 8 + cq, o00.d, o01.d);
          Store::put(buf, r0 + 8, jj * 8 + cq, o10.d, o11.d);
        }
      }
      __syncwarp();
      if constexpr (kScatter) {
        Store::flush_rows(buf, out + chunk_col, ld, dst.row, p.n - chunk_col, lane);
      } else if constexpr (fusegemm::is_same_v<Store, StoreT>) {
        // kDMajorM's D: out is the warp's first row of column 0 in the M-major output (run())
        Store::flush(buf, out + static_cast<int64_t>(chunk_col) * ld, ld, p.n - chunk_col, lane);
      } else {
        Store::flush(buf, out + static_cast<int64_t>(row0) * ld + chunk_col, ld, p.n - chunk_col, lane);
      }
    }
  }

  // The fragment of tile rows m0.. (of the problem, or of batch `expert` when kBatched) and
  // columns n0.. . part: the warp's running reductions (the engine path flushes per tile; the
  // kernel calls finish() once at its end).
  template <class Params>
  static __device__ void run(const Params& p, uint8_t* epi_smem, int expert, int m0, int n0, int wg,
                             int warp, int lane, const float (&acc)[kAccum], Partials& part) {
    if constexpr (kFragment) {
      const Pre pre = preload(p, expert, m0, warp, lane);
      const int row0 = m0 + 16 * warp;  // warp = 4*wg + warp-in-group
      const uint32_t buf = warp_buf(epi_smem, warp);
      if constexpr (Rule::kHasC) {
        if (p.c_out != nullptr) {
          store_output<ElementC, StoreC, true>(p, pre.rule, buf, reinterpret_cast<ElementC*>(p.c_out),
                                               p.ldc, row0, n0, pre.r0in, pre.r1in, lane, acc, pre.dst);
        }
      }
      if constexpr (kDMajorM) {   // D_e^T: column n of the tile at output row expert * N + n
        ElementD* out = reinterpret_cast<ElementD*>(p.d_out) + static_cast<int64_t>(expert) * p.n * p.ldd +
                        (row0 - expert * p.m_rows);
        store_output<ElementD, StoreT, false>(p, pre.rule, buf, out, p.ldd, row0, n0, pre.r0in, pre.r1in, lane, acc,
                                              pre.dst);
      } else if constexpr (Rule::kHasD) {
        store_output<ElementD, StoreD, false>(p, pre.rule, buf, reinterpret_cast<ElementD*>(p.d_out),
                                              p.ldd, row0, n0, pre.r0in, pre.r1in, lane, acc, pre.dst);
      }
    } else {
      Rule rule;
      rule.begin_tile(p, expert);
      if constexpr (kFragBlocks) {
        frag_blocks(p, epi_smem, rule, expert, m0, n0, warp, lane, acc, part);
      } else {
        engine(p, epi_smem, rule, expert, m0, n0, wg, warp % 4, lane, acc, part);
      }
    }
  }

  // Warp `warp`'s staging buffer in the fragment path's shared memory (epi_smem: the kernel's
  // epilogue region).
  static __device__ uint32_t warp_buf(const uint8_t* epi_smem, int warp) {
    return smem_u32(epi_smem) + warp * kEpiWarpBytes;
  }

  // End of the kernel: the global reductions of the engine's two active warps per warpgroup.
  template <class Params>
  static __device__ void finish(Partials& part, const Params& p, int warp, int lane) {
    if constexpr (kFragBlocks) {
      Engine::flush_end(part, p, lane);
    } else if constexpr (!kFragment) {
      if (warp % 4 < 2 * kEngineBlocks) Engine::flush_end(part, p, lane);
    }
  }

  FUSEGEMM_DEVICE static typename Rule::Out mask_out(const typename Rule::Out& o, bool in) {
    return in ? o : typename Rule::Out{};
  }

  // Reductions of one fragment value into the thread's partials (row sums: rs, of its row).
  FUSEGEMM_DEVICE static void reduce(const typename Rule::Out& o, bool in, float& rs, Partials& part) {
    if constexpr (Rule::kRowSum) rs = in ? __fadd_rn(rs, o.rowsum) : rs;
    if constexpr (Rule::kAmaxCount > 0) part.amax[0] = epi::fmax_nan(part.amax[0], in ? fabsf(o.amax0) : 0.0f);
    if constexpr (Rule::kAmaxCount > 1) part.amax[1] = epi::fmax_nan(part.amax[1], in ? fabsf(o.amax1) : 0.0f);
  }

  // A fragment pair's C / D values into the block buffers (role-1 values into the second buffer
  // of a paired output). row: 0..15 of the warp, col: 0..31 of the block.
  FUSEGEMM_DEVICE static void put_outputs(uint32_t buf, int row, int col, const typename Rule::Out& a,
                                          const typename Rule::Out& b) {
    if constexpr (Rule::kHasC && Rule::kPairedC) {
      BlkC::put(buf, row, col, a.c0, b.c0);
      BlkC::put(buf + BlkC::kBytes, row, col, a.c1, b.c1);
    } else if constexpr (Rule::kHasC) {
      BlkC::put(buf, row, col, a.c, b.c);
    }
    const uint32_t dbuf = buf + kDBufOff;
    if constexpr (kFragQuant) {
      // D waits for its row scales (frag_blocks' quant_d)
    } else if constexpr (Rule::kHasD && Rule::kPairedD) {
      BlkD::put(dbuf, row, col, a.d0, b.d0);
      BlkD::put(dbuf + BlkD::kBytes, row, col, a.d1, b.d1);
    } else if constexpr (Rule::kHasD) {
      BlkD::put(dbuf, row, col, a.d, b.d);
    }
  }

  // One output's staged block to global memory: element columns e0.. of `width` (a paired
  // output: its two 32-column role blocks at 2*e0 and 2*e0 + 32 of 2*width).
  template <class Blk, bool kPairedOut, class Out>
  FUSEGEMM_DEVICE static void flush_output(uint32_t buf, Out* out, int64_t ld, int row0, int e0, int width, int lane) {
    Out* base = out + static_cast<int64_t>(row0) * ld;
    if constexpr (kPairedOut) {
      Blk::flush(buf, base + 2 * e0, ld, 2 * width - 2 * e0, lane);
      Blk::flush(buf + Blk::kBytes, base + 2 * e0 + 32, ld, 2 * width - 2 * e0 - 32, lane);
    } else {
      Blk::flush(buf, base + e0, ld, width - e0, lane);
    }
  }

  // L2 prefetch of the element inputs the epilogue will read for this warp's 16 rows of the tile
  // (rows m0 + 16 warp ..; the kernel calls it a few k-blocks before the tile's mainloop ends, so
  // that the epilogue's block loads find them in L2): the warp's 16 rows x kElemBlocks (row,
  // block) pairs shared by its lanes. The block paths (fragment blocks and the engine, which
  // reads the same rows and blocks, lane = row) prefetch; rules without element inputs, and the
  // element-wise fragment path (which loads its inputs group by group), issue nothing.
  template <class Params>
  static __device__ void prefetch(const Params& p, int m0, int n0, int warp, int lane) {
    if constexpr (!kFragment && !kBatched) {
      const Rule rule{};
      const int width = elem_width(p), e_base = elem_col(n0);
#pragma unroll
      for (int i = lane; i < 16 * kElemBlocks; i += 32) {
        const int e0 = e_base + 32 * (i / 16);
        if (e0 < width) rule.prefetch_elems(p, m0 + 16 * warp + i % 16, e0);
      }
    }
  }

  // Element columns of the problem, and the first element column of a tile at accumulator
  // column n0 (half of them when the accumulator pairs gate and up blocks).
  template <class Params>
  FUSEGEMM_DEVICE static int elem_width(const Params& p) { return Rule::kPairedAcc ? p.n / 2 : p.n; }
  FUSEGEMM_DEVICE static int elem_col(int n0) { return Rule::kPairedAcc ? n0 / 2 : n0; }

  // Accumulators of one fragment-path block per thread: 4 groups of 4 (and their 4 up partner
  // groups when the accumulator pairs), contiguous in acc[] from kBlockAcc * b.
  static constexpr int kBlockAcc = Rule::kPairedAcc ? 32 : 16;
  // The block loop runs rolled for rules with an unpaired accumulator (8 blocks of 16 rule
  // applications at TILE_N 256) in cooperative tiles. H200, dSwiGLU BF16 at the MoE layers'
  // shapes (bench/pingpong.py --also, same run, two runs: bench/results/pingpong_h200_roll*):
  // cooperative 128x256 rolled 0.85-0.92x the unrolled time, its cold compile 3.5 -> 0.7 s;
  // ping-pong's overlapped epilogue 1.00-1.04x (the selects compete with the other warpgroup's
  // mainloop), and SwiGLU's paired accumulator (4 blocks) 0.95-1.03x: those stay unrolled.
  static constexpr bool kRollBlocks = FUSEGEMM_SM90_FRAG_ROLL && !kOverlapped && !Rule::kPairedAcc;
  // Blocks per iteration of the block loop (FUSEGEMM_SM90_FRAG_ROLL_SPAN): 1 rolled, kElemBlocks
  // unrolled, a divisor between them for the overlapped epilogue when the switch asks for it.
  static constexpr int kSpanAsked = FUSEGEMM_SM90_FRAG_ROLL_SPAN;
  static constexpr bool kSpanRolled = kOverlapped && !Rule::kPairedAcc && !k1x128 && kSpanAsked > 0 &&
                                      kSpanAsked < kElemBlocks && kElemBlocks % (kSpanAsked > 0 ? kSpanAsked : 1) == 0;
  static constexpr int kBlockSpan = kRollBlocks ? 1 : kSpanRolled ? kSpanAsked : kElemBlocks;
  static constexpr int kSpans = kElemBlocks / kBlockSpan;

  // Block b's accumulators into a[]. acc[] is indexed only by constants (a run-time index would
  // put it in local memory): every block's values are selected on b, kBlockAcc selects per
  // block after the first. The rolled block loop pays these instead of one copy of the rule per
  // block: dSwiGLU at 8 blocks of 16 rule applications compiled to 208 KB of SASS unrolled.
  // block_acc<n>: span j's n blocks at once (blocks n j .. n j + n - 1, contiguous as well), with
  // kBlockAcc n selects per span after the first: the selects of a loop of n-block iterations.
  template <int n = 1>
  FUSEGEMM_DEVICE static void block_acc(const float (&acc)[kAccum], int j, float (&a)[n * kBlockAcc]) {
    static_assert(kElemBlocks % n == 0, "whole spans of blocks");
    constexpr int kW = n * kBlockAcc;
#pragma unroll
    for (int i = 0; i < kW; ++i) a[i] = acc[i];
#pragma unroll
    for (int jj = 1; jj < kElemBlocks / n; ++jj) {
#pragma unroll
      for (int i = 0; i < kW; ++i) a[i] = j == jj ? acc[kW * jj + i] : a[i];
    }
  }

  // Role r's D value of an output (d, or d0 / d1 of a paired D).
  template <int r>
  FUSEGEMM_DEVICE static float d_of(const typename Rule::Out& o) {
    if constexpr (Rule::kPairedD) {
      if constexpr (r == 0) return o.d0; else return o.d1;
    } else {
      return o.d;
    }
  }

  // k1x128: what divides by a group's scales (rows r0, r0 + 8 of a warp). div0 / div1 give
  // fl(t / s), correctly rounded, with the reciprocal computed once per group and no branch per
  // value (common.cuh's ScaleDivisor: a group whose scale an Inf or NaN made Inf or NaN
  // included). FUSEGEMM_SM90_1X128_DIV_RN=1: the A/B baseline, div.rn for such groups, chosen
  // per value.
  struct Group1x128 {
    ScaleDivisor q0, q1;
#if FUSEGEMM_SM90_1X128_DIV_RN
    float s0 = 1.0f, s1 = 1.0f;
    bool fast = true;
    FUSEGEMM_DEVICE void set(float a, float b) {
      s0 = a;
      s1 = b;
      fast = isfinite(a) && isfinite(b);
      q0.r = scale_reciprocal(a);
      q1.r = scale_reciprocal(b);
    }
    FUSEGEMM_DEVICE float div0(float t) const { return fast ? div_by_scale(t, s0, q0.r) : __fdiv_rn(t, s0); }
    FUSEGEMM_DEVICE float div1(float t) const { return fast ? div_by_scale(t, s1, q1.r) : __fdiv_rn(t, s1); }
#else
    FUSEGEMM_DEVICE void set(float a, float b) {
      q0 = ScaleDivisor(a);
      q1 = ScaleDivisor(b);
    }
    FUSEGEMM_DEVICE float div0(float t) const { return q0.div(t); }
    FUSEGEMM_DEVICE float div1(float t) const { return q1.div(t); }
#endif
  };

  // kFragQuant: each role's 16 x 32 D block of the warp quantized along its rows into the role's
  // staging buffer and its SFD_row bytes written; every step after a block's max is the engine's
  // d_block, value by value (epilogue_block.cuh: sfd_block, fl(x * scale), cvt.rn.satfinite), so
  // the bytes are the engine's. A row's 32 values sit in the 4 lanes of a quad (8 each:
  // dq[role][q][0..1] row r0, [2..3] row r0 + 8); two shuffles give each lane the row's max |x|.
  // NaN wins any max, as in the engine (whose SFD is then 0xFF whatever the NaN's bits).
  template <class Params>
  FUSEGEMM_DEVICE static void quant_d(const Params& p, const Rule& rule, uint32_t buf,
                                      const float (&dq)[kFragQuant ? kBlkDBufs : 1][4][4], int row0, int r0,
                                      int cq, int e0, int width, int lane, const Group1x128& g) {
    constexpr int kConv = Rule::kSfdConvention;
    const float nc = rule.sfd_norm_const();
    if constexpr (k1x128) {
      // 1x128: fl(nc * x) / s with the group's scale of each row (group_scales).
      const uint32_t rb = buf + kDBufOff;
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        QuantRowStore::put(rb, r0, 8 * q + cq, epi::cvt_narrow2<ElementD>(
            g.div0(__fmul_rn(nc, dq[0][q][0])), g.div0(__fmul_rn(nc, dq[0][q][1]))));
        QuantRowStore::put(rb, r0 + 8, 8 * q + cq, epi::cvt_narrow2<ElementD>(
            g.div1(__fmul_rn(nc, dq[0][q][2])), g.div1(__fmul_rn(nc, dq[0][q][3]))));
      }
      return;
    }
    const float rl = p.rcp_max;
    const int dw = Rule::kPairedD ? 2 * width : width;
    const int kt = ((dw + 31) / 32 + 3) / 4;
#pragma unroll
    for (int role = 0; role < kBlkDBufs; ++role) {
      float a0 = 0.0f, a1 = 0.0f;
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        a0 = epi::fmax_nan(epi::fmax_nan(a0, fabsf(dq[role][q][0])), fabsf(dq[role][q][1]));
        a1 = epi::fmax_nan(epi::fmax_nan(a1, fabsf(dq[role][q][2])), fabsf(dq[role][q][3]));
      }
#pragma unroll
      for (int d = 1; d <= 2; d <<= 1) {
        a0 = epi::fmax_nan(a0, __shfl_xor_sync(0xFFFFFFFFu, a0, d));
        a1 = epi::fmax_nan(a1, __shfl_xor_sync(0xFFFFFFFFu, a1, d));
      }
      const epi::Sfd s0 = epi::sfd_block<kConv, false>(a0, nc, rl);
      const epi::Sfd s1 = epi::sfd_block<kConv, false>(a1, nc, rl);
      const uint32_t rb = buf + kDBufOff + role * QuantRowStore::kBytes;
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        QuantRowStore::put(rb, r0, 8 * q + cq, epi::cvt_narrow2<ElementD>(__fmul_rn(dq[role][q][0], s0.scale),
                                                                          __fmul_rn(dq[role][q][1], s0.scale)));
        QuantRowStore::put(rb, r0 + 8, 8 * q + cq, epi::cvt_narrow2<ElementD>(__fmul_rn(dq[role][q][2], s1.scale),
                                                                              __fmul_rn(dq[role][q][3], s1.scale)));
      }
      const int dc0 = Rule::kPairedD ? 2 * e0 + 32 * role : e0;
      if (lane % 4 == 0 && dc0 < dw && p.sfd_row != nullptr) {
        uint8_t* sfd = static_cast<uint8_t*>(p.sfd_row);
        sfd[epi::sf_atom_offset(row0 + r0, dc0 / 32, kt)] = uint8_t(s0.stored);
        sfd[epi::sf_atom_offset(row0 + r0 + 8, dc0 / 32, kt)] = uint8_t(s1.stored);
      }
    }
  }

  // Element inputs at constant offsets from one address per row and block (FUSEGEMM_SM90_FRAG_ELEM_AT),
  // except in the overlapped epilogue rolled block by block (FRAG_ROLL_SPAN=1): with its run-time
  // accumulator selection the two row addresses spilled (8 bytes of local memory).
  static constexpr bool kElemAt = FUSEGEMM_SM90_FRAG_ELEM_AT && !(kSpanRolled && kBlockSpan == 1);

  // A block's element inputs into x: every load in flight at once (one latency per block; the
  // shared-memory stores after them are compiler barriers that would serialise them). A whole
  // block of aligned inputs (the usual case, a warp-uniform test) is loaded without a branch; a
  // partial block or an unaligned input element by element (kElemAt) or pair by pair, with its
  // tests. kElemAt, H100, 2026-12-05: the ping-pong dSwiGLU at 64 x 256 from 12,386 to 8,258 SASS
  // lines (the partial-block path had been 500 lines of address arithmetic after every hot block).
  template <class Params>
  FUSEGEMM_DEVICE static void load_inputs(const Params& p, const Rule& rule, bool pairs, int row0, int r0, int cq,
                                          int e0, int width, typename Rule::ElemIn (&x)[4][4]) {
    if constexpr (kElemAt) {
      // e0 is a multiple of 32 (a tile starts at a multiple of its width, at least 64 element
      // columns, and blocks are 32 wide) and cq <= 6, so columns e0 + cq + 8q + 1 <= e0 + 31
      // stay in e0's block, as elem_at and elem2_at require.
      const auto at0 = rule.elem_at_row(p, row0 + r0, e0 + cq);
      const auto at1 = rule.elem_at_row(p, row0 + r0 + 8, e0 + cq);
      if (pairs && e0 + 32 <= width) {
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          rule.template elem2_at<true>(at0, 8 * q, x[q][0], x[q][1]);
          rule.template elem2_at<true>(at1, 8 * q, x[q][2], x[q][3]);
        }
      } else {
        // A partial block, or inputs that cannot be read by pairs: element by element, each
        // load predicated on its column, from the same addresses (a few instructions per load:
        // this path is emitted once per block of the unrolled loop, between the hot ones).
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int e = e0 + 8 * q + cq;
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            x[q][i] = x[q][2 + i] = typename Rule::ElemIn{};
            if (e + i < width) {
              x[q][i] = rule.elem_at(at0, 8 * q + i);
              x[q][2 + i] = rule.elem_at(at1, 8 * q + i);
            }
          }
        }
      }
      return;
    }
    if (pairs && e0 + 32 <= width) {
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int e = e0 + 8 * q + cq;
        rule.template elem2<true>(p, row0 + r0, e, x[q][0], x[q][1]);
        rule.template elem2<true>(p, row0 + r0 + 8, e, x[q][2], x[q][3]);
      }
    } else {
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int e = e0 + 8 * q + cq;
        x[q][0] = x[q][1] = x[q][2] = x[q][3] = typename Rule::ElemIn{};
        if (e + 1 < width) {
          rule.template elem2<false>(p, row0 + r0, e, x[q][0], x[q][1]);
          rule.template elem2<false>(p, row0 + r0 + 8, e, x[q][2], x[q][3]);
        } else if (e < width) {
          x[q][0] = rule.elem(p, row0 + r0, e);
          x[q][2] = rule.elem(p, row0 + r0 + 8, e);
        }
      }
    }
  }

  // FUSEGEMM_SM90_FRAG_LOAD_AHEAD: in the unrolled block loop (ping-pong's overlapped epilogue),
  // a whole aligned block's element inputs are loaded while the block before it runs, as raw
  // bits (one register per 16-bit pair: 16 for dSwiGLU's C), and converted group by group as the
  // rule runs; the first block, partial blocks and unaligned inputs load as they start, into the
  // same raw form (converted as floats at once, the two forms' join spilled 8 bytes at 64 x 256).
  // At most 16 registers of a block's raw bits (8 pairs x 2 rows): dSwiGLU's 16-bit C; an FP32 C
  // (32 registers) spilled 32 bytes at 64 x 256 and keeps loading as each block starts, as do an
  // 8-bit D quantized on the fragment (the block-scaled GLU's spilled 8-16 bytes) and the
  // stream-K kernel (kAheadOk).
  static constexpr bool kLoadAhead = FUSEGEMM_SM90_FRAG_LOAD_AHEAD && kAheadOk && !kFragQuant && kElemAt &&
                                     Rule::kRawPairs && !k1x128 &&
                                     kBlockSpan == kElemBlocks && kElemBlocks > 1 &&
                                     sizeof(typename Rule::ElemIn) > 1 && sizeof(typename Rule::ElemRaw) * 8 <= 64;
  // A block's raw inputs now: aligned pairs of a whole block by one load each, else each pair's
  // columns below N element by element (zero bits past N, which convert to 0, as load_inputs').
  template <class Params>
  FUSEGEMM_DEVICE static void load_raw(const Params& p, const Rule& rule, bool pairs, int row0, int r0, int cq,
                                       int e0, int width, typename Rule::ElemRaw (&r)[4][2]) {
    const auto at0 = rule.elem_at_row(p, row0 + r0, e0 + cq);
    const auto at1 = rule.elem_at_row(p, row0 + r0 + 8, e0 + cq);
    if (pairs && e0 + 32 <= width) {
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        rule.template elem2_raw_at<true>(at0, 8 * q, r[q][0]);
        rule.template elem2_raw_at<true>(at1, 8 * q, r[q][1]);
      }
    } else {
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int valid = width - (e0 + 8 * q + cq);
        rule.template elem2_raw_elems_at<true>(at0, 8 * q, valid, r[q][0]);
        rule.template elem2_raw_elems_at<true>(at1, 8 * q, valid, r[q][1]);
      }
    }
  }

  // kSfdPow2: the smallest power of two >= s (UE8M0 scales; s is normal, at least 1e-4 / 57344,
  // so the exponent only grows; Inf and NaN stay). Dividing by it is exact: one rounding, to FP8.
  FUSEGEMM_DEVICE static float pow2_up(float s) {
    const uint32_t b = __float_as_uint(s);
    if ((b & 0x7F800000u) == 0x7F800000u || (b & 0x007FFFFFu) == 0) return s;
    return __uint_as_float((b & 0x7F800000u) + 0x00800000u);
  }

  // The rule on group q of a fragment-path block (a: block_acc's values, x: its inputs): o[0], o[1]
  // row r0's columns e, e + 1 (e = e0 + 8 q + cq), o[2], o[3] row r0 + 8's. Applied
  // unconditionally (no branch regions in the block): past N the accumulator holds the zeros TMA
  // filled in and the inputs are zero; what comes out there is masked to zero and never stored.
  FUSEGEMM_DEVICE static void apply_quad(const Rule& rule, const float (&a)[kBlockAcc], int q, int e0, int cq,
                                         int width, const typename Rule::RowIn& ri0,
                                         const typename Rule::RowIn& ri1, const typename Rule::ElemIn (&x)[4][4],
                                         typename Rule::Out (&o)[4]) {
    constexpr bool kPA = Rule::kPairedAcc;
    const int e = e0 + 8 * q + cq;
    const bool in0 = e < width, in1 = e + 1 < width;
    const float u0 = kPA ? a[16 + 4 * q] : 0.0f, u1 = kPA ? a[16 + 4 * q + 1] : 0.0f;
    const float u2 = kPA ? a[16 + 4 * q + 2] : 0.0f, u3 = kPA ? a[16 + 4 * q + 3] : 0.0f;
    o[0] = rule.apply(a[4 * q], u0, ri0, x[q][0]);
    o[1] = rule.apply(a[4 * q + 1], u1, ri0, x[q][1]);
    o[2] = rule.apply(a[4 * q + 2], u2, ri1, x[q][2]);
    o[3] = rule.apply(a[4 * q + 3], u3, ri1, x[q][3]);
    if constexpr (kMaskOuts) {
      o[0] = mask_out(o[0], in0);
      o[1] = mask_out(o[1], in1);
      o[2] = mask_out(o[2], in0);
      o[3] = mask_out(o[3], in1);
    }
    (void)in0; (void)in1;
  }
  // Which fragment-path outputs are masked past N: those the block's quantization reads (its row
  // maxima, kFragQuant and k1x128's group scales). Stored values past N never leave the staging
  // buffers (FragBlockStore::flush skips the vectors at or past N, N keeping 16-byte granularity)
  // and reduce() masks the reductions' inputs itself, so masking them too cost two selects per
  // element of dSwiGLU (FUSEGEMM_SM90_FRAG_MASK_ALL=1 masks every output, as before: same bits).
  static constexpr bool kMaskOuts = FUSEGEMM_SM90_FRAG_MASK_ALL || kFragQuant || k1x128;

  // kKeepD: the group's D values stay in registers from group_scales to the block loop (kept[block
  // of the group][group q][value]), which then neither loads the inputs nor applies the rule again:
  // rules whose rule outputs are D alone (no C, no reductions), in unrolled block loops (the
  // index must be a constant). Others apply the rule twice.
  static constexpr bool kKeepD = k1x128 && !Rule::kHasC && Rule::kAmaxCount == 0 && !Rule::kRowSum &&
                                 kBlockSpan == kElemBlocks;
  using Kept = float[kKeepD ? 4 : 1][4][4];

  // k1x128: the scales of the 128-column group starting at block b, for rows r0 and r0 + 8 of
  // the warp: the rule is applied to the group's four blocks for D alone (outputs, reductions and
  // stores wait for the block loop; kKeepD keeps the values), each row's max |D| over its quad's
  // lanes, then s = fl(max(fl(|nc| * max), 1e-4) / elem_max), with kSfdPow2 rounded up to a power
  // of two (fusegemm/interpret.py quantize_1x128_rows; fl(|nc| * max|x|) is max |fl(nc * x)|,
  // rounding being monotonic). A NaN wins the max, as in the interpreter. Lanes 0, 4, ... write
  // the FP32 scales, M-contiguous: sfd_row[j * pitch + row] for group j, pitch the rows rounded
  // up to 4 (16 bytes).
  template <class Params>
  FUSEGEMM_DEVICE static void group_scales(const Params& p, const Rule& rule, const float (&acc)[kAccum], int b,
                                           int e_base, int width, int row0, int r0, int cq, int lane, bool pairs,
                                           const typename Rule::RowIn& ri0, const typename Rule::RowIn& ri1,
                                           Group1x128& grp, Kept& kept) {
    constexpr float kQMax = fusegemm::is_same_v<ElementD, fusegemm::float_e5m2_t> ? 57344.0f : 448.0f;
    float m0 = 0.0f, m1 = 0.0f;
#pragma unroll(kRollBlocks ? 1 : 4)
    for (int g = b; g < b + 4; ++g) {
      const int e0 = e_base + 32 * g;
      if (e0 >= width) break;   // warp-uniform
      typename Rule::ElemIn x[4][4];
      load_inputs(p, rule, pairs, row0, r0, cq, e0, width, x);
      float a[kBlockAcc];
      block_acc(acc, g, a);
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        typename Rule::Out o[4];
        apply_quad(rule, a, q, e0, cq, width, ri0, ri1, x, o);
        const float d[4] = {d_of<0>(o[0]), d_of<0>(o[1]), d_of<0>(o[2]), d_of<0>(o[3])};
        m0 = epi::fmax_nan(epi::fmax_nan(m0, fabsf(d[0])), fabsf(d[1]));
        m1 = epi::fmax_nan(epi::fmax_nan(m1, fabsf(d[2])), fabsf(d[3]));
        if constexpr (kKeepD) {
#pragma unroll
          for (int i = 0; i < 4; ++i) kept[g - b][q][i] = d[i];
        }
      }
    }
#pragma unroll
    for (int d = 1; d <= 2; d <<= 1) {
      m0 = epi::fmax_nan(m0, __shfl_xor_sync(0xFFFFFFFFu, m0, d));
      m1 = epi::fmax_nan(m1, __shfl_xor_sync(0xFFFFFFFFu, m1, d));
    }
    const float anc = fabsf(rule.sfd_norm_const());
#if FUSEGEMM_SM90_1X128_DIV_RN
    float gs0 = __fdiv_rn(epi::fmax_nan(__fmul_rn(anc, m0), 1e-4f), kQMax);
    float gs1 = __fdiv_rn(epi::fmax_nan(__fmul_rn(anc, m1), 1e-4f), kQMax);
#else
    float gs0 = div_by_elem_max(epi::fmax_nan(__fmul_rn(anc, m0), 1e-4f), kQMax, 1.0f / kQMax);
    float gs1 = div_by_elem_max(epi::fmax_nan(__fmul_rn(anc, m1), 1e-4f), kQMax, 1.0f / kQMax);
#endif
    if constexpr (Rule::kSfdPow2) {
      gs0 = pow2_up(gs0);
      gs1 = pow2_up(gs1);
    }
    grp.set(gs0, gs1);
    const int e0 = e_base + 32 * b;
    if (lane % 4 == 0 && p.sfd_row != nullptr) {
      float* sfd = static_cast<float*>(p.sfd_row) + int64_t(e0 / 128) * ((p.m_rows + 3) & ~3);
      sfd[row0 + r0] = gs0;
      sfd[row0 + r0 + 8] = gs1;
    }
  }

  // The fragment path of paired and reducing rules: per block of 32 element columns (64
  // accumulator columns when the accumulator is paired: gate block, then up block), every
  // thread applies the rule to its values (rows lane/4 and lane/4 + 8 of the warp's 16, two
  // adjacent columns per 8-column group; a gate value's up partner is 32 columns on, 4 groups
  // later in the same thread), stages each output's 16 x 32 block and the warp flushes it.
  // Row sums: per thread, then over the 4 threads of a row, one atomic per row per tile.
  template <class Params>
  static __device__ void frag_blocks(const Params& p, uint8_t* epi_smem, const Rule& rule, int expert, int m0,
                                     int n0, int warp, int lane, const float (&acc)[kAccum], Partials& part) {
    const int width = elem_width(p), e_base = elem_col(n0);
    const int row0 = m0 + 16 * warp;
    const int r0 = lane / 4, cq = (lane % 4) * 2;
    const auto ri0 = rule.row(p, row0 + r0);
    const auto ri1 = rule.row(p, row0 + r0 + 8);
    const uint32_t buf = smem_u32(epi_smem) + warp * kBlkWarpBytes;
    const bool pairs = rule.pairs_aligned(p);
    float rs0 = 0.0f, rs1 = 0.0f;
    Group1x128 grp;   // k1x128: the current group's scales of rows r0, r0 + 8
    Kept kept = {};   // kKeepD: its D values
    // Spans of kBlockSpan blocks (one block rolled, the whole tile unrolled): a loop over the
    // spans, each span's blocks unrolled with constant indices into its selected accumulators.
    // (Where a block starts past N, warp-uniformly, so does the rest of the tile.)
    float span[kBlockSpan * kBlockAcc];
    bool past = false;
    typename Rule::ElemRaw ahead[4][2];   // kLoadAhead: the next block's raw inputs (group q, row r0 / r0 + 8)
    bool ahead_ok = false;
    (void)ahead; (void)ahead_ok;
#pragma unroll 1
    for (int j = 0; j < kSpans; ++j) {
      if (kBlockSpan == 1 && e_base + 32 * j >= width) break;
#pragma unroll
      for (int s = 0; s < kBlockSpan; ++s) {
        const int b = kBlockSpan * j + s;
        const int e0 = e_base + 32 * b;
        if (kBlockSpan > 1 && e0 >= width) {
          past = true;
          break;
        }
        __syncwarp();            // the previous block's flush has read the buffers
        if constexpr (k1x128) {
          if (b % 4 == 0) group_scales(p, rule, acc, b, e_base, width, row0, r0, cq, lane, pairs, ri0, ri1, grp, kept);
        }
        // (Loaded with kLoadAhead during the block before, else as the block starts. Loading a
        // block ahead as converted floats did not pay, H200, 2026-12-04, bench/pingpong.py dSwiGLU on
        // four layer shapes, same run: before the previous block's stores 0.95-1.02x, into a second
        // register set 0.83-0.99x (spills at TILE_M 64); kLoadAhead holds the raw bits instead.)
        typename Rule::ElemIn x[4][4];
        // kLoadAhead: the block's inputs as raw bits (converted group by group below, so that a
        // block holds 16 registers of them rather than 32 floats), fetched during the block before
        // or now.
        typename Rule::ElemRaw cur[4][2];
        (void)cur;
        if constexpr (kLoadAhead) {
          if (s > 0 && ahead_ok) {
#pragma unroll
            for (int q = 0; q < 4; ++q) cur[q][0] = ahead[q][0], cur[q][1] = ahead[q][1];
          } else {
            load_raw(p, rule, pairs, row0, r0, cq, e0, width, cur);
          }
          // The next block's inputs, in flight through this block's rule and stores.
          ahead_ok = s + 1 < kBlockSpan && pairs && e0 + 64 <= width;
          if (ahead_ok) load_raw(p, rule, true, row0, r0, cq, e0 + 32, e0 + 64, ahead);   // (a whole block)
        } else if constexpr (!kKeepD) {
          load_inputs(p, rule, pairs, row0, r0, cq, e0, width, x);
        }
        // kFragQuant: the block's D values (role, group, i: as o00, o01, o10, o11) until their
        // scales are known.
        float dq[kFragQuant ? kBlkDBufs : 1][4][4];
        // The block's accumulators: a[4q + i] (gate values of group q), a[16 + 4q + i] (their up
        // partners, 4 groups on, when the accumulator pairs).
        if (s == 0) block_acc<kBlockSpan>(acc, j, span);
        float a[kBlockAcc];
#pragma unroll
        for (int i = 0; i < kBlockAcc; ++i) a[i] = span[kBlockAcc * s + i];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int e = e0 + 8 * q + cq;
          const bool in0 = e < width, in1 = e + 1 < width;
          if constexpr (kLoadAhead) {
            rule.template elem2_unpack<true>(cur[q][0], x[q][0], x[q][1]);
            rule.template elem2_unpack<true>(cur[q][1], x[q][2], x[q][3]);
          }
          typename Rule::Out o[4];
          apply_quad(rule, a, q, e0, cq, width, ri0, ri1, x, o);
          const typename Rule::Out &o00 = o[0], &o01 = o[1], &o10 = o[2], &o11 = o[3];
          reduce(o00, in0, rs0, part);
          reduce(o01, in1, rs0, part);
          reduce(o10, in0, rs1, part);
          reduce(o11, in1, rs1, part);
          put_outputs(buf, r0, 8 * q + cq, o00, o01);
          put_outputs(buf, r0 + 8, 8 * q + cq, o10, o11);
          if constexpr (kKeepD) {
#pragma unroll
            for (int i = 0; i < 4; ++i) dq[0][q][i] = kept[b % 4][q][i];   // (the rule above is then dead code)
          } else if constexpr (kFragQuant) {
            // Masked values are 0, as the engine's (mask_out).
            dq[0][q][0] = d_of<0>(o00); dq[0][q][1] = d_of<0>(o01);
            dq[0][q][2] = d_of<0>(o10); dq[0][q][3] = d_of<0>(o11);
            if constexpr (Rule::kPairedD) {
              dq[1][q][0] = d_of<1>(o00); dq[1][q][1] = d_of<1>(o01);
              dq[1][q][2] = d_of<1>(o10); dq[1][q][3] = d_of<1>(o11);
            }
          }
        }
        if constexpr (kFragQuant) quant_d(p, rule, buf, dq, row0, r0, cq, e0, width, lane, grp);
        __syncwarp();
        if constexpr (Rule::kHasC) {
          if (p.c_out != nullptr) {
            flush_output<BlkC, Rule::kPairedC>(buf, reinterpret_cast<ElementC*>(p.c_out), p.ldc, row0, e0, width, lane);
          }
        }
        if constexpr (kFragQuant) {
          const int dw = Rule::kPairedD ? 2 * width : width;
#pragma unroll
          for (int role = 0; role < kBlkDBufs; ++role) {
            const int dc0 = Rule::kPairedD ? 2 * e0 + 32 * role : e0;
            if (dc0 < dw) {
              QuantRowStore::flush(buf + kDBufOff + role * QuantRowStore::kBytes,
                                   static_cast<uint8_t*>(p.d_out) + int64_t(row0) * p.ldd + dc0, p.ldd, dw - dc0, lane);
            }
          }
        } else if constexpr (Rule::kHasD) {
          flush_output<BlkD, Rule::kPairedD>(buf + kDBufOff, reinterpret_cast<ElementD*>(p.d_out),
                                             p.ldd, row0, e0, width, lane);
        }
      }
      if (past) break;
    }
    if constexpr (Rule::kRowSum) {
      rs0 += __shfl_xor_sync(0xFFFFFFFFu, rs0, 1);
      rs0 += __shfl_xor_sync(0xFFFFFFFFu, rs0, 2);
      rs1 += __shfl_xor_sync(0xFFFFFFFFu, rs1, 1);
      rs1 += __shfl_xor_sync(0xFFFFFFFFu, rs1, 2);
      if (lane % 4 == 0 && p.dprob != nullptr) {
        atomicAdd(static_cast<float*>(p.dprob) + row0 + r0, rs0);
        atomicAdd(static_cast<float*>(p.dprob) + row0 + r0 + 8, rs1);
      }
    }
    if constexpr (Rule::kAmaxCount > 0 && !Rule::kAmaxGlobal) Engine::flush_amax(part, p, expert, lane);
  }

  // The engine path: per block of kAccPerBlock accumulator columns, the warpgroup's four warps
  // write their fragments into [64 rows][kAccPitch] floats, then warps 0 and 1 run the engine on
  // rows 0-31 and 32-63 (lane = row). With kEngineBlocks 2, blocks c and c + 1 are staged
  // together and warps 2 and 3 run c + 1's rows. Named barrier 1 + wg orders the two phases.
  // (Each warp's element-input loads issued before the staging and the barrier, so that their
  // latency would overlap those, ran blockwise dSwiGLU at 0.87-0.95x this order's speed:
  // bench/results/blockscaled_h200_early_loads.json, "el0" is this order.)
  template <class Params>
  static __device__ void engine(const Params& p, uint8_t* epi_smem, Rule& rule, int expert, int m0, int n0,
                                int wg, int wl, int lane, const float (&acc)[kAccum], Partials& part) {
    constexpr int kBlockFloats = 64 * kAccPitch;
    uint8_t* region = epi_smem + wg * kWgEpiBytes;
    float* stage = reinterpret_cast<float*>(region);
    const int sub = kEngineBlocks == 2 ? wl >> 1 : 0;   // the staged block this warp runs
    const bool runs = wl < 2 * kEngineBlocks;
    const uint32_t engine_buf = smem_u32(region + kWgAccBytes) + (wl % (2 * kEngineBlocks)) * Engine::kStageBytes;
    const int width = elem_width(p);
    const int row_wg0 = m0 + 64 * wg;
    const int row_w = row_wg0 + 32 * (wl & 1);  // first row of this warp's engine block
    int rows_valid = 32;
    if constexpr (kBatched) rows_valid = min(32, max(p.m_rows - row_w, 0));
    const int fr = 16 * wl + lane / 4;    // fragment rows fr and fr + 8 (of the warpgroup's 64)
    const int cq = (lane % 4) * 2;
#pragma unroll 1
    for (int c = 0; c < kTileN / kAccPerBlock; c += kEngineBlocks) {
      const int j0 = (n0 + c * kAccPerBlock) / (Rule::kPairedAcc ? 2 : 1);
      if (j0 >= width) break;  // warpgroup-uniform: past N
      // Fragment -> stage. The fragment index must be a compile-time constant (a run-time
      // index would put acc[] in local memory), so every block's stores are emitted and
      // predicated on c.
#pragma unroll
      for (int cc = 0; cc < kTileN / kAccPerBlock; ++cc) {
        if (cc >= c && cc < c + kEngineBlocks) {
          float* blk = stage + (cc - c) * kBlockFloats;
#pragma unroll
          for (int g = 0; g < kAccPerBlock / 8; ++g) {
            const int j = cc * (kAccPerBlock / 8) + g;
            float* r0 = blk + fr * kAccPitch + 8 * g + cq;
            Stage::put2(r0, acc[4 * j], acc[4 * j + 1]);
            Stage::put2(r0 + 8 * kAccPitch, acc[4 * j + 2], acc[4 * j + 3]);
          }
        }
      }
      named_barrier_sync(1 + wg, 128);
      const int jw = j0 + sub * kAccPerBlock;   // this warp's block's first element column
      if (runs && rows_valid > 0 && jw < width) {
        const float* src = stage + sub * kBlockFloats + (32 * (wl & 1) + lane) * kAccPitch;  // this lane's row
        // FUSEGEMM_ENGINE_COL_SMEM: SFD_col goes through the warp's own 32 staged rows, free once
        // the rule has read them (the engine's staging buffer here holds 16-bit outputs only).
        static_assert(!Engine::kColSmem || kAccPitch >= epi::kColPitch, "the column buffer fits the warp's rows");
        const uint32_t col_buf = Engine::kColSmem ? smem_u32(src - lane * kAccPitch) : 0u;
        Engine::run_with(rule, p, expert, row_w, rows_valid, jw, width, Stage::reader(src), engine_buf, lane, part,
                         col_buf);
      }
      named_barrier_sync(1 + wg, 128);
    }
    if constexpr (kEngineBlocks == 2 && Rule::kRowSum) {
      // One atomic per row and tile, as with two warps: warps 2 and 3 hand their rows' partial
      // sums (the odd blocks') to warps 0 and 1 through the free stage, so that the order of
      // the additions, and dprob's bits, do not depend on which warp reaches its atomic first.
      if (wl >= 2) {
        stage[32 * (wl & 1) + lane] = part.rowsum;
        part.rowsum = 0.0f;
      }
      named_barrier_sync(1 + wg, 128);
      if (wl < 2) part.rowsum = __fadd_rn(part.rowsum, stage[32 * (wl & 1) + lane]);
      named_barrier_sync(1 + wg, 128);   // read before the next tile's staging writes there
      if (wl >= 2) {
        if constexpr (Rule::kAmaxCount > 0 && !Rule::kAmaxGlobal) {
          if (rows_valid > 0) Engine::flush_amax(part, p, expert, lane);
        }
        return;
      }
    }
    if (runs && rows_valid > 0) Engine::flush_tile(part, p, expert, row_w, rows_valid, lane);
  }
};

}  // namespace sm90
}  // namespace fusegemm
