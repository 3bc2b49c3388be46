// WGMMA pieces for the sm_90a mainloops: shared-memory matrix descriptors, the m64nNk16 BF16 -> FP32
// instruction and the m64n128k32 FP8 -> FP32 one over an accumulator array.
#pragma once

#include <cute/arch/mma_sm90_gmma.hpp>
#include <cutlass/arch/reg_reconfig.h>

#include "fusegemm/common.cuh"

namespace fusegemm {
namespace sm90 {

// K-major operand tile stored by TMA with SWIZZLE_128B: rows of 64 BF16 (128 bytes),
// swizzle atoms of 8 rows x 128 bytes = 1024 bytes stacked along M/N.
//   bits [0,14)  start address >> 4
//   bits [16,30) leading byte offset >> 4 (ignored for swizzled K-major; 1 as CuTe sets it)
//   bits [32,46) stride byte offset >> 4  (1024 bytes between 8-row groups)
//   bits [62,64) layout: 1 = SWIZZLE_128B
// Stepping K by 16 elements inside the 128-byte atom adds 32 bytes (2 in the low field):
// the hardware applies the swizzle to the computed address, as CUTLASS/DeepGEMM rely on.
FUSEGEMM_DEVICE uint64_t sw128_kmajor_desc(uint32_t smem_addr) {
  return static_cast<uint64_t>((smem_addr >> 4) & 0x3FFF) | (1ull << 16) |
         (static_cast<uint64_t>(1024 >> 4) << 32) | (1ull << 62);
}

// MN-major operand tile (B of an N-major weight): chunks of 64 N-elements (128 bytes) x 64 K-rows,
// one SWIZZLE_128B TMA box each (8 KB), stacked along N. CuTe's canonical MN-major SW128 layout
// in 16-byte units is ((8, n), (8, k)) : ((1, LBO), (8, SBO)):
//   bits [16,30) leading byte offset >> 4: between 64-element chunks along N (8192 bytes)
//   bits [32,46) stride byte offset >> 4:  between 8-row groups along K (1024 bytes)
// One k16 instruction reads two 8-row groups; the next one starts 16 rows (2048 bytes) further,
// a whole number of swizzle atoms, so the step is added to the start address.
constexpr int kMnChunkBytes = 64 * 128;
FUSEGEMM_DEVICE uint64_t sw128_mnmajor_desc(uint32_t smem_addr) {
  return static_cast<uint64_t>((smem_addr >> 4) & 0x3FFF) |
         (static_cast<uint64_t>(kMnChunkBytes >> 4) << 16) |
         (static_cast<uint64_t>(1024 >> 4) << 32) | (1ull << 62);
}

// m64nNk16 BF16 WGMMA, A K-major; B K-major or (kBMn) MN-major (the instruction's tnspB bit).
// kAMn / kBMn: the operand is MN-major in shared memory (the WGMMA reads it transposed): an
// N-major weight as B, or a K-grouped problem's A (a weight gradient's dY, tokens x M).
template <int N, bool kBMn, bool kAMn = false>
struct BF16Gmma;

template <bool kBMn, bool kAMn>
struct BF16Gmma<256, kBMn, kAMn> {
  using Op = cute::SM90::GMMA::MMA_64x256x16_F32BF16BF16_SS<
      kAMn ? cute::SM90::GMMA::Major::MN : cute::SM90::GMMA::Major::K,
      kBMn ? cute::SM90::GMMA::Major::MN : cute::SM90::GMMA::Major::K>;
};
template <bool kBMn, bool kAMn>
struct BF16Gmma<128, kBMn, kAMn> {
  using Op = cute::SM90::GMMA::MMA_64x128x16_F32BF16BF16_SS<
      kAMn ? cute::SM90::GMMA::Major::MN : cute::SM90::GMMA::Major::K,
      kBMn ? cute::SM90::GMMA::Major::MN : cute::SM90::GMMA::Major::K>;
};

template <int N, bool kBMn, bool kAMn, int... I>
FUSEGEMM_DEVICE void gmma_impl(uint64_t da, uint64_t db, float* acc, int scale_d,
                               fusegemm::integer_sequence<int, I...>) {
  BF16Gmma<N, kBMn, kAMn>::Op::fma(da, db, acc[I]..., static_cast<cute::SM90::GMMA::ScaleOut>(scale_d));
}

template <int N, bool kBMn = false, bool kAMn = false>
FUSEGEMM_DEVICE void gmma_64xN(uint64_t da, uint64_t db, float (&acc)[N / 2], int scale_d) {
  gmma_impl<N, kBMn, kAMn>(da, db, acc, scale_d, fusegemm::make_integer_sequence<int, N / 2>{});
}

// m64n128k32 FP8 -> FP32 (e4m3 or e5m2 A and B, both K-major from shared memory), the block-scaled
// mainloops' instruction; scale_d 0 starts a new set (acc = A B), 1 accumulates (acc += A B).
template <class T>
struct Fp8Gmma {
  using Op = fusegemm::conditional_t<fusegemm::is_same_v<T, fusegemm::float_e4m3_t>,
                                 cute::SM90::GMMA::MMA_64x128x32_F32E4M3E4M3_SS_TN<>,
                                 cute::SM90::GMMA::MMA_64x128x32_F32E5M2E5M2_SS_TN<>>;
  template <int... I>
  FUSEGEMM_DEVICE static void fma(uint64_t da, uint64_t db, float* acc, int scale_d,
                                  fusegemm::integer_sequence<int, I...>) {
    Op::fma(da, db, acc[I]..., static_cast<cute::SM90::GMMA::ScaleOut>(scale_d));
  }
};

template <int kN>
FUSEGEMM_DEVICE void fence_acc(float (&acc)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) cute::warpgroup_fence_operand(acc[i]);
}

}  // namespace sm90
}  // namespace fusegemm
