// The sm_90a block-scaled kernel the registry names (BlockScaledGemmKernel): one of the two
// mainloop designs of issue 10, both built and measured on the H200 (README "Block-scaled ops on
// Hopper"):
//   FUSEGEMM_SM90_BS_MAINLOOP 1 (default): FP8 WGMMA per 32 K with FP32 scale promotion
//                                          (blockscaled_promote.cuh), the faster of the two
//   FUSEGEMM_SM90_BS_MAINLOOP 0: dequantize FP8 to BF16 in shared memory, BF16 WGMMA
//                                (blockscaled_dequant.cuh)
// A macro rather than an axis: both compute the same outputs, so the choice is a measured
// implementation fact, not something a spec declares; FUSEGEMM_NVRTC_EXTRA selects the other one
// for comparisons (the cache key includes the NVRTC options).
#pragma once

#ifndef FUSEGEMM_SM90_BS_MAINLOOP
#define FUSEGEMM_SM90_BS_MAINLOOP 1
#endif

#include "fusegemm/sm90/blockscaled_dequant.cuh"
#include "fusegemm/sm90/blockscaled_promote.cuh"

namespace fusegemm {
namespace sm90 {

template <class Config>
using BlockScaledGemmKernel = fusegemm::conditional_t<FUSEGEMM_SM90_BS_MAINLOOP == 1, BlockScaledPromoteKernel<Config>,
                                                  BlockScaledDequantKernel<Config>>;

}  // namespace sm90
}  // namespace fusegemm
