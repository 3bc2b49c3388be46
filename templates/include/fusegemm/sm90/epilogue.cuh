// The sm_90a epilogue over a WGMMA accumulator fragment, shared by the BF16 grouped kernel and
// the block-scaled kernel (both hold a 64 x kTileN FP32 fragment per consumer warpgroup).
//
// Warp `warp` owns tile rows [16*warp, 16*warp + 16) (warpgroup wg holds rows 64*wg..).
// Fragment: acc[4j + {0,1}] -> (row lane/4, cols 8j + 2(lane%4) + {0,1}), acc[4j + {2,3}] ->
// same columns, row lane/4 + 8.
//
// Element-wise rules (no pairing, quantization or reduction; 16/32-bit outputs) apply the rule on
// the fragment itself and stage converted rows per warp (the fast path of seed 001). Every other
// rule goes through the arch-neutral engine (fusegemm/epilogue_block.cuh): each warpgroup stages
// a block of its 64 accumulator rows in shared memory and two of its warps run the engine on 32
// rows each, lane = row, exactly as the sm_100a kernels and the epilogue harness do.
#pragma once

#include "fusegemm/common.cuh"
#include "fusegemm/epilogue_block.cuh"
#include "fusegemm/tma.cuh"

namespace fusegemm {
namespace sm90 {

// kTileM / kTileN: rows and columns of the fragment the consumers hold (64 rows per warpgroup).
// Engine: the epi::BlockEngine instantiation (its batching, C layout and SFD_col layout).
// kBatched: rows are per batch (p.m_rows each); a warp's rows past the batch end are not stored.
// kForceEngine: run every rule through the engine (kernels whose outputs the fragment path does
// not stage, e.g. FP8/FP4 C).
template <int kTileM, int kTileN, class Rule, class ElementC, class ElementD, class Engine,
          bool kBatched = false, bool kForceEngine = false>
struct WgmmaEpilogue {
  static constexpr int kConsumerWGs = kTileM / 64;
  static constexpr int kConsumerWarps = 4 * kConsumerWGs;
  static constexpr int kAccum = kTileN / 2;  // FP32 accumulators per consumer thread
  static constexpr bool kFragment = Rule::kElementwise && !kForceEngine && !kBatched;
  using StoreC = epi::WarpStagedStore<fusegemm::conditional_t<kFragment, ElementC, float>>;
  using StoreD = epi::WarpStagedStore<fusegemm::conditional_t<kFragment, ElementD, float>>;
  static constexpr int kEpiWarpBytes = StoreC::kBytes > StoreD::kBytes ? StoreC::kBytes : StoreD::kBytes;
  // The engine path stages [64 rows][kAccPitch] FP32 accumulators per warpgroup plus the engine's
  // buffers for its two active warps.
  static constexpr int kAccPerBlock = Rule::kPairedAcc ? 64 : 32;
  static constexpr int kAccPitch = kAccPerBlock + 1;  // floats: lane-per-row reads hit distinct banks
  static constexpr int kWgAccBytes = 64 * kAccPitch * 4;
  static constexpr int kWgEpiBytes = kWgAccBytes + 2 * Engine::kStageBytes;
  static_assert(kTileN % kAccPerBlock == 0, "tile N holds whole gate/up block pairs");
  // Shared memory the epilogue needs (the kernel places it; the harness passes its own).
  static constexpr int kBytes = kFragment ? kConsumerWarps * kEpiWarpBytes : kConsumerWGs * kWgEpiBytes;
  using Partials = typename Engine::Partials;

  template <class Out, class Store, bool kIsC, class Params>
  static __device__ void store_output(const Params& p, const Rule& rule, uint32_t buf,
                                      Out* out, int64_t ld, int row0, int n0,
                                      const typename Rule::RowIn& r0in, const typename Rule::RowIn& r1in,
                                      int lane, const float (&acc)[kAccum]) {
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
        const int col = chunk_col + jj * 8 + cq;
        // Columns past N are never stored; their inputs are not read (they would run into the
        // next expert's column inputs or off the end).
        const bool in0 = col < p.n, in1 = col + 1 < p.n;
        const auto e0 = in0 ? rule.elem(p, row0 + r0, col) : typename Rule::ElemIn{};
        const auto e1 = in1 ? rule.elem(p, row0 + r0, col + 1) : typename Rule::ElemIn{};
        const auto e2 = in0 ? rule.elem(p, row0 + r0 + 8, col) : typename Rule::ElemIn{};
        const auto e3 = in1 ? rule.elem(p, row0 + r0 + 8, col + 1) : typename Rule::ElemIn{};
        const auto o00 = rule.apply(acc[4 * j + 0], 0.0f, r0in, e0);
        const auto o01 = rule.apply(acc[4 * j + 1], 0.0f, r0in, e1);
        const auto o10 = rule.apply(acc[4 * j + 2], 0.0f, r1in, e2);
        const auto o11 = rule.apply(acc[4 * j + 3], 0.0f, r1in, e3);
        if constexpr (kIsC) {
          Store::put(buf, r0, jj * 8 + cq, o00.c, o01.c);
          Store::put(buf, r0 + 8, jj * 8 + cq, o10.c, o11.c);
        } else {
          Store::put(buf, r0, jj * 8 + cq, o00.d, o01.d);
          Store::put(buf, r0 + 8, jj * 8 + cq, o10.d, o11.d);
        }
      }
      __syncwarp();
      Store::flush(buf, out + static_cast<int64_t>(row0) * ld + chunk_col, ld,
                   p.n - chunk_col, lane);
    }
  }

  // The fragment of tile rows m0.. (of the problem, or of batch `expert` when kBatched) and
  // columns n0.. . part: the warp's running reductions (the engine path flushes per tile; the
  // kernel calls finish() once at its end).
  template <class Params>
  static __device__ void run(const Params& p, uint8_t* epi_smem, int expert, int m0, int n0, int wg,
                             int warp, int lane, const float (&acc)[kAccum], Partials& part) {
    Rule rule;
    rule.begin_tile(p, expert);
    if constexpr (kFragment) {
      const int row0 = m0 + 16 * warp;  // warp = 4*wg + warp-in-group
      const auto r0in = rule.row(p, row0 + lane / 4);
      const auto r1in = rule.row(p, row0 + lane / 4 + 8);
      const uint32_t buf = smem_u32(epi_smem) + warp * kEpiWarpBytes;
      if constexpr (Rule::kHasC) {
        if (p.c_out != nullptr) {
          store_output<ElementC, StoreC, true>(p, rule, buf, reinterpret_cast<ElementC*>(p.c_out),
                                               p.ldc, row0, n0, r0in, r1in, lane, acc);
        }
      }
      if constexpr (Rule::kHasD) {
        store_output<ElementD, StoreD, false>(p, rule, buf, reinterpret_cast<ElementD*>(p.d_out),
                                              p.ldd, row0, n0, r0in, r1in, lane, acc);
      }
    } else {
      engine(p, epi_smem, rule, expert, m0, n0, wg, warp % 4, lane, acc, part);
    }
  }

  // End of the kernel: the global reductions of the engine's two active warps per warpgroup.
  template <class Params>
  static __device__ void finish(Partials& part, const Params& p, int warp, int lane) {
    if constexpr (!kFragment) {
      if (warp % 4 < 2) Engine::flush_end(part, p, lane);
    }
  }

  // The engine path: per block of kAccPerBlock accumulator columns, the warpgroup's four warps
  // write their fragments into [64 rows][kAccPitch] floats, then warps 0 and 1 run the engine on
  // rows 0-31 and 32-63 (lane = row). Named barrier 1 + wg orders the two phases.
  template <class Params>
  static __device__ void engine(const Params& p, uint8_t* epi_smem, Rule& rule, int expert, int m0, int n0,
                                int wg, int wl, int lane, const float (&acc)[kAccum], Partials& part) {
    uint8_t* region = epi_smem + wg * kWgEpiBytes;
    float* stage = reinterpret_cast<float*>(region);
    const uint32_t engine_buf = smem_u32(region + kWgAccBytes) + (wl & 1) * Engine::kStageBytes;
    const int width = Rule::kPairedAcc ? p.n / 2 : p.n;
    const int row_wg0 = m0 + 64 * wg;
    const int row_w = row_wg0 + 32 * (wl & 1);  // first row of this warp's engine block
    int rows_valid = 32;
    if constexpr (kBatched) rows_valid = min(32, max(p.m_rows - row_w, 0));
    const int fr = 16 * wl + lane / 4;    // fragment rows fr and fr + 8 (of the warpgroup's 64)
    const int cq = (lane % 4) * 2;
#pragma unroll 1
    for (int c = 0; c < kTileN / kAccPerBlock; ++c) {
      const int j0 = (n0 + c * kAccPerBlock) / (Rule::kPairedAcc ? 2 : 1);
      if (j0 >= width) break;  // warpgroup-uniform: past N
      // Fragment -> stage. The fragment index must be a compile-time constant (a run-time
      // index would put acc[] in local memory), so every block's stores are emitted and
      // predicated on c.
#pragma unroll
      for (int cc = 0; cc < kTileN / kAccPerBlock; ++cc) {
        if (cc == c) {
#pragma unroll
          for (int g = 0; g < kAccPerBlock / 8; ++g) {
            const int j = cc * (kAccPerBlock / 8) + g;
            float* r0 = stage + fr * kAccPitch + 8 * g + cq;
            float* r1 = r0 + 8 * kAccPitch;
            r0[0] = acc[4 * j];
            r0[1] = acc[4 * j + 1];
            r1[0] = acc[4 * j + 2];
            r1[1] = acc[4 * j + 3];
          }
        }
      }
      named_barrier_sync(1 + wg, 128);
      if (wl < 2 && rows_valid > 0) {
        const float* src = stage + (32 * wl + lane) * kAccPitch;  // this lane's row
        Engine::run_with(rule, p, expert, row_w, rows_valid, j0, width, [&](int i) { return src[i]; },
                         engine_buf, lane, part);
      }
      named_barrier_sync(1 + wg, 128);
    }
    if (wl < 2 && rows_valid > 0) Engine::flush_tile(part, p, expert, row_w, rows_valid, lane);
  }
};

}  // namespace sm90
}  // namespace fusegemm
