// sm_90a epilogue warpgroup (FUSEGEMM_SM90_BW_EPI_WG, the blockwise kernel): the consumer
// warpgroups hand each pass's accumulators to a warpgroup of their own through shared memory and
// go on to the next tile's mainloop, while that warpgroup runs the block engine on them, lane =
// row, warp w on rows 32 w .. 32 w + 31 of the 128-row tile: what the sm_100a kernels' epilogue
// warps do from TMEM, so the epilogue overlaps the tensor cores' work instead of following it.
//
// Why (H200, blockwise dSwiGLU at dsv3-fc1, bench/results/blockscaled_h200_no_epilogue.json): the
// mainloop alone took 1.12 ms and the whole kernel 2.05 ms; the engine's 0.9 ms ran on four warps
// (two per consumer warpgroup, a paired block each) while the tensor cores waited. The handoff's
// four warps do the same work per warp; the consumers' cost is the staging stores they already
// made, then the next tile's WGMMAs.
//
// Measured (H200, two runs, bench/results/blockscaled_h200_engine_switches*.json; not the
// default): quant 1.07-1.11x the speed of the consumers' own epilogue at dsv3-fc2 and dsv3-fc1 but
// 0.97x at mixtral-fc1, sReLU with FP8 D 0.92-1.02x, dSwiGLU 0.78-1.05x (0.78 and 0.88 at
// dsv3-fc2's 256-column tiles). Likely why the overlap does not pay (not profiled): one warp per
// scheduler runs the engine beside the consumers' WGMMAs and promotion, and the buffer (one pass,
// 66 KB) costs a pipeline stage. (Those runs split the registers 168 / 136 / 40; with the vector
// staging, default since, 136 spilled 16 bytes, so the split is 160 / 152 / 40, untimed.) Kept as
// an A/B switch.
//
// Layout: the pass's kTileN accumulator columns as blocks of kAccPerBlock columns (64 when the
// accumulator pairs gate and up blocks, else 32), each [128 rows][EngineStage::kPitch] floats,
// the staging of the consumers' own engine path for 128 rows instead of 64; then each epilogue
// warp's engine buffer (Engine::kStageBytes). One buffer: the consumers write a pass's
// accumulators once the epilogue warps have read the previous one (an mbarrier pair, acc_full:
// one arrival per consumer thread, acc_empty: one per epilogue thread).
#pragma once

#include "fusegemm/common.cuh"
#include "fusegemm/epilogue_block.cuh"
#include "fusegemm/tma.cuh"
#include "fusegemm/sm90/epilogue.cuh"

// 1: the blockwise kernel runs engine-path rules (SFD_col quantization, FP8 C) on an epilogue
// warpgroup (512 threads; tiles of 256 columns run as two passes); 0: the consumers run them
// after each pass's mainloop (the measured baseline). An A/B switch through FUSEGEMM_NVRTC_EXTRA
// until the H200 has timed it.
#ifndef FUSEGEMM_SM90_BW_EPI_WG
#define FUSEGEMM_SM90_BW_EPI_WG 0
#endif

namespace fusegemm {
namespace sm90 {

// kTileN: accumulator columns per pass. kBatched: rows are per batch (p.m_rows each).
template <int kTileN, class Rule, class Engine, bool kBatched>
struct EpilogueWarpgroup {
  using Stage = EngineStage<Engine>;
  static constexpr int kRows = 128;
  static constexpr int kWarps = 4;
  static constexpr int kAccPerBlock = Stage::kAccPerBlock;
  static constexpr int kBlocks = kTileN / kAccPerBlock;
  static constexpr int kPitch = Stage::kPitch;
  static constexpr int kBlockFloats = kRows * kPitch;
  static constexpr int kScratchOff = (kBlocks * kBlockFloats * 4 + 15) / 16 * 16;
  static constexpr int kBytes = kScratchOff + kWarps * Engine::kStageBytes;
  static_assert(kTileN % kAccPerBlock == 0, "a pass holds whole (gate/up) blocks");
  static_assert(!Engine::kColSmem || kPitch >= epi::kColPitch, "the column buffer fits a warp's rows");
  using Partials = typename Engine::Partials;

  // Consumer thread: its WGMMA fragment into the blocks. fr: its first fragment row of the tile
  // (64 wg + 16 (warp % 4) + lane / 4; the second is fr + 8); acc[4 j + {0, 1}] are columns
  // 8 j + 2 (lane % 4) + {0, 1} of row fr, acc[4 j + {2, 3}] the same of row fr + 8.
  FUSEGEMM_DEVICE static void put(uint8_t* smem, int fr, int lane, const float (&acc)[kTileN / 2]) {
    float* base = reinterpret_cast<float*>(smem) + fr * kPitch + (lane % 4) * 2;
#pragma unroll
    for (int j = 0; j < kTileN / 8; ++j) {
      float* r0 = base + (j * 8 / kAccPerBlock) * kBlockFloats + (j * 8) % kAccPerBlock;
      Stage::put2(r0, acc[4 * j], acc[4 * j + 1]);
      Stage::put2(r0 + 8 * kPitch, acc[4 * j + 2], acc[4 * j + 3]);
    }
  }

  // The first staged accumulator (FUSEGEMM_SM90_BENCH_NO_EPILOGUE's data-dependent skip).
  FUSEGEMM_DEVICE static float first(const uint8_t* smem) { return *reinterpret_cast<const float*>(smem); }

  // First problem row of epilogue warp ew's 32, and how many of them are rows (batched: a batch
  // ends inside a tile).
  template <class Params>
  FUSEGEMM_DEVICE static int rows_valid(const Params& p, int row_w) {
    if constexpr (kBatched) return min(32, max(p.m_rows - row_w, 0));
    return 32;
  }

  // Epilogue warp ew: the engine on its 32 rows of every block of the pass at tile row m0,
  // accumulator column n0. Every read of the staged accumulators is done when it returns.
  template <class Params>
  FUSEGEMM_DEVICE static void run(const Params& p, uint8_t* smem, const Rule& rule, int expert, int m0, int n0,
                                  int ew, int lane, Partials& part) {
    const int width = Rule::kPairedAcc ? p.n / 2 : p.n;
    const int row_w = m0 + 32 * ew;
    const int valid = rows_valid(p, row_w);
    const uint32_t engine_buf = smem_u32(smem + kScratchOff) + ew * Engine::kStageBytes;
    const float* rows = reinterpret_cast<const float*>(smem) + (32 * ew + lane) * kPitch;   // this lane's row
#pragma unroll 1
    for (int c = 0; c < kBlocks; ++c) {
      const int jw = (n0 + c * kAccPerBlock) / (Rule::kPairedAcc ? 2 : 1);   // the block's first element column
      if (jw >= width || valid <= 0) break;   // warp-uniform
      const float* src = rows + c * kBlockFloats;
      // FUSEGEMM_ENGINE_COL_SMEM: SFD_col through the warp's own 32 staged rows of this block,
      // free once the rule has read them.
      const uint32_t col_buf = Engine::kColSmem ? smem_u32(src - lane * kPitch) : 0u;
      Engine::run_with(rule, p, expert, row_w, valid, jw, width, Stage::reader(src), engine_buf, lane, part, col_buf);
    }
  }

  // After a pass's run() (and the buffer's release): its row sums and per-expert amax.
  template <class Params>
  FUSEGEMM_DEVICE static void flush(Partials& part, const Params& p, int expert, int m0, int ew, int lane) {
    const int row_w = m0 + 32 * ew;
    const int valid = rows_valid(p, row_w);
    if (valid > 0) Engine::flush_tile(part, p, expert, row_w, valid, lane);
  }
};

}  // namespace sm90
}  // namespace fusegemm
