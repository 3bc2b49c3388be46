// Staging carrier for kernel families whose fused kernels have not landed yet.
//
// It exercises the pieces every fused kernel shares -- the grouped tile scheduler over
// padded_offsets, a TMA tile load completing on an mbarrier with expect-tx, the flat
// __grid_constant__ parameter struct -- so the spec -> render -> NVRTC -> cache pipeline builds
// real device code for every spec on both archs. It computes a byte checksum of the A tiles of
// its schedule (a self-test of scheduler + TMA, not the op): the ops refuse to launch it.
#pragma once

#include <cute/arch/copy_sm90_tma.hpp>
#include <cutlass/arch/barrier.h>

#include "fusegemm/common.cuh"
#include "fusegemm/scheduler.cuh"
#include "fusegemm/tma.cuh"

namespace fusegemm::staging {

template <int TILE_M, int TILE_N>
struct ChecksumKernel {
  static constexpr int kThreads = 128;
  static constexpr int kBoxBytesK = 128;          // one 128-byte K slab per TMA load
  static constexpr int kSmemBytes = TILE_M * kBoxBytesK + 128;

  // Host contract (fusegemm/base/contract.py): A as uint8 (rows, K bytes), box (128, TILE_M),
  // no swizzle; no B, no clusters, no tensor-map workspace, no TMEM.
  static constexpr int kTileM = TILE_M, kTileN = TILE_N, kTileK = kBoxBytesK;
  static constexpr int kMinClusterM = 1, kMinClusterN = 1, kMaxClusterCtas = 1, kCtasPerTile = 1;
  static constexpr int kMAligned = fusegemm::kMAligned;
  static constexpr int kBoxAInner = kBoxBytesK, kBoxAOuter = TILE_M, kBoxBInner = 0, kBoxBOuter = 0;
  static constexpr int kSwizzleA = 0, kSwizzleB = 0;
  static constexpr int kTmaDtypeA = TmaDtype<uint8_t>::value, kTmaDtypeB = 0;
  static constexpr int kTmapSlotStride = 0, kTmemCols = 0;

  // tma_a views A as uint8 (rows, K bytes) with box (kBoxBytesK, TILE_M).
  template <class Params>
  static __device__ void run(const Params& p) {
    extern __shared__ __align__(128) unsigned char smem[];
    auto* tile = smem;
    auto* bar = reinterpret_cast<uint64_t*>(smem + TILE_M * kBoxBytesK);
    using Barrier = cutlass::arch::ClusterTransactionBarrier;

    if (threadIdx.x == 0) {
      Barrier::init(bar, 1);
      cutlass::arch::fence_barrier_init();
    }
    __syncthreads();

    GroupedScheduler<TILE_M, TILE_N> sched(static_cast<const int*>(p.offsets), p.num_experts, p.n);
    const int k_bytes = p.k;  // the carrier treats K as a byte count
    uint32_t phase = 0;
    unsigned long long sum = 0;
    for (StaticWalk walk(blockIdx.x, gridDim.x);;) {
      GroupedTile t = sched.tile(walk.claim());
      if (!t.valid()) break;
      if (t.n_block != 0) continue;  // one pass over each A row block
      for (int k0 = 0; k0 < k_bytes; k0 += kBoxBytesK) {
        if (threadIdx.x == 0) {
          Barrier::arrive_and_expect_tx(bar, TILE_M * kBoxBytesK);
          cute::SM90_TMA_LOAD_2D::copy(&p.tma_a, bar, 0ull, tile, k0, t.m_block * TILE_M);
        }
        Barrier::wait(bar, phase);
        phase ^= 1;
        for (int i = threadIdx.x; i < TILE_M * kBoxBytesK; i += kThreads) sum += tile[i];
        __syncthreads();  // the slab is overwritten by the next load
      }
    }
    if (p.amax != nullptr && sum != 0) {
      atomicAdd(static_cast<unsigned long long*>(p.amax), sum);
    }
  }
};

}  // namespace fusegemm::staging
