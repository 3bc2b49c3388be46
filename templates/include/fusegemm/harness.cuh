// The epilogue harness: a generated rule run on given accumulators, exactly as the GEMM kernels
// run it, so that epilogue code destined for sm_100a executes (and is checked) on the H200.
//
// Two modes, each the code path of the kernels:
//   * Block (every rule): one warp per 32-row x 32-column block, lane = row, the accumulators
//     loaded from global memory into the registers a tcgen05.ld would fill; then
//     fusegemm/epilogue_block.cuh's BlockEngine, as the sm_100a kernels and the sm_90a engine path.
//   * Fragment (element-wise rules): one warpgroup per 64 x kTileN tile, the accumulators loaded
//     into the WGMMA fragment layout; then the sm_90a kernel's own fragment epilogue.
// HarnessParams is the kernels' parameter struct plus the accumulator buffer.
#pragma once

#include "fusegemm/epilogue_block.cuh"
#include "fusegemm/sm90/grouped_gemm.cuh"

namespace fusegemm::harness {

// The contract fields a harness has no use for (it loads no tiles and takes no clusters).
#define CONTRACT_NONE_OF_THE_REST                                                             \
  static constexpr int kMinClusterM = 1, kMinClusterN = 1, kMaxClusterCtas = 1, kCtasPerTile = 1; \
  static constexpr int kTileK = 0, kMAligned = fusegemm::kMAligned;                             \
  static constexpr int kBoxAInner = 0, kBoxAOuter = 0, kBoxBInner = 0, kBoxBOuter = 0;         \
  static constexpr int kSwizzleA = 0, kSwizzleB = 0, kTmaDtypeA = 0, kTmaDtypeB = 0;           \
  static constexpr int kTmapSlotStride = 0, kTmemCols = 0, kSfBoxK = 0, kSfBoxNB = 0;

// Expert owning global row `row` (padded_offsets, cumulative ends).
FUSEGEMM_DEVICE int expert_of_row(const int* offsets, int num_experts, int row) {
  int lo = 0, hi = num_experts - 1;
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    if (__ldg(offsets + mid) > row) hi = mid; else lo = mid + 1;
  }
  return lo;
}

// kScatter: C and D rows stored at d_index (the sm_100a kernels' scattered outputs).
template <class Rule, class ElementC, class ElementD, bool kDiscreteColSfd, bool kScatter = false>
struct BlockHarness {
  using Engine = epi::BlockEngine<Rule, ElementC, ElementD, false, false, kDiscreteColSfd, kScatter>;
  static constexpr int kWarps = 4;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kStageBytes = Engine::kScratchBytes > 16 ? Engine::kScratchBytes : 16;
  static constexpr int kSmemBytes = kWarps * kStageBytes;
  // Contract (fusegemm/base/contract.py): a 32-row x (32 * kWarps)-column grid, no TMA.
  static constexpr int kTileM = 32, kTileN = 32 * kWarps;
  CONTRACT_NONE_OF_THE_REST

  // grid: (ceil(width / (32 * kWarps)), valid_m / 32). acc: (valid_m, N_acc) FP32, ld_acc.
  template <class P>
  static __device__ void run(const P& p) {
    extern __shared__ __align__(16) uint8_t smem[];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int width = Rule::kPairedAcc ? p.n / 2 : p.n;
    const int j0 = (blockIdx.x * kWarps + warp) * 32;
    const int row0 = blockIdx.y * 32;
    const int* offsets = static_cast<const int*>(p.offsets);
    if (j0 >= width || row0 >= __ldg(offsets + p.num_experts - 1)) return;  // warp-uniform
    const int expert = expert_of_row(offsets, p.num_experts, row0);
    Rule rule;
    rule.begin_tile(p, expert);
    const float* acc_row = static_cast<const float*>(p.acc) + int64_t(row0 + lane) * p.ld_acc;
    float acc[Engine::kAccVals];
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      const int j = j0 + i < width ? j0 + i : j0;  // past N: any column (the engine ignores it)
      if constexpr (Rule::kPairedAcc) {
        acc[i] = acc_row[epi::paired_col(j, 0)];
        acc[i + (Rule::kPairedAcc ? 32 : 0)] = acc_row[epi::paired_col(j, 1)];
      } else {
        acc[i] = acc_row[j];
      }
    }
    const uint32_t stage = smem_u32(smem + warp * kStageBytes);
    typename Engine::Partials part;
    part.reset();
    Engine::run(rule, p, expert, row0, 32, j0, width, acc, stage, lane, part);
    Engine::flush_tile(part, p, expert, row0, 32, lane);
    Engine::flush_end(part, p, lane);
  }
};

// The sm_90a fragment epilogue of element-wise rules, one warpgroup (64 rows) per CTA.
template <class Config>
struct FragmentHarness {
  using Kernel = sm90::GroupedGemmKernel<Config>;
  using Rule = typename Config::Rule;
  static_assert(Rule::kElementwise, "the fragment path serves element-wise rules");
  static constexpr int kThreads = 128;
  static constexpr int kTileN = Config::kTileN;
  static constexpr int kSmemBytes = Kernel::Epi::kBytes;
  // Contract (fusegemm/base/contract.py): a 64-row x kTileN grid, no TMA.
  static constexpr int kTileM = 64;
  CONTRACT_NONE_OF_THE_REST

  // grid: (ceil(N / kTileN), valid_m / 64).
  template <class P>
  static __device__ void run(const P& p) {
    extern __shared__ __align__(16) uint8_t smem[];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int m_block = blockIdx.y, n_block = blockIdx.x;
    const int* offsets = static_cast<const int*>(p.offsets);
    if (m_block * 64 >= __ldg(offsets + p.num_experts - 1)) return;
    const int expert = expert_of_row(offsets, p.num_experts, m_block * 64);
    // Fragment of warp `warp`: rows 16 * warp + lane / 4 (+ 8), columns 8j + 2 (lane % 4) (+ 1).
    float acc[Kernel::kAccum];
    const int r = m_block * 64 + 16 * warp + lane / 4;
    const float* a0 = static_cast<const float*>(p.acc) + int64_t(r) * p.ld_acc;
    const float* a1 = a0 + 8 * p.ld_acc;
#pragma unroll
    for (int j = 0; j < kTileN / 8; ++j) {
      const int col = n_block * kTileN + 8 * j + 2 * (lane % 4);
      const bool in = col < p.n;  // N % 8 == 0: both columns of a pair are in or out together
      acc[4 * j + 0] = in ? a0[col] : 0.0f;
      acc[4 * j + 1] = in ? a0[col + 1] : 0.0f;
      acc[4 * j + 2] = in ? a1[col] : 0.0f;
      acc[4 * j + 3] = in ? a1[col + 1] : 0.0f;
    }
    // The kernel's epilogue with this CTA's one warpgroup as consumer warpgroup 0 of an M-64 tile.
    typename Kernel::Epi::Partials part;
    part.reset();
    Kernel::Epi::run(p, smem, expert, m_block * 64, n_block * kTileN, 0, warp, lane, acc, part);
  }
};

}  // namespace fusegemm::harness
