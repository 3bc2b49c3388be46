// The sm_90a block-scaled kernel the registry names (BlockScaledGemmKernel): per scaling recipe,
//   MXFP8 (E8M0 scales per 32 K): FP8 WGMMA per 32 K with FP32 scale promotion
//     (blockscaled_promote.cuh);
//   blockwise (FP32 scales, 1x128 for A and 128x128 for B): FP8 WGMMA per 128 K, promoted once
//     per stage (blockwise_promote.cuh).
// Issue 10 built and measured a third design on the H200 (dequantize FP8 to BF16 in shared
// memory, then BF16 WGMMA); it was slower on every shape (README "Block-scaled ops") and was
// removed (blockscaled_dequant.cuh at 4e141dc in git history).
#pragma once

#include "fusegemm/sm90/blockscaled_promote.cuh"
#include "fusegemm/sm90/blockwise_promote.cuh"

namespace fusegemm {
namespace sm90 {

// Naming a class template specialisation here does not instantiate it: only the chosen one is.
template <class Config>
using BlockScaledGemmKernel = fusegemm::conditional_t<Config::kSfVec == 128, BlockwisePromoteKernel<Config>,
                                                      BlockScaledPromoteKernel<Config>>;

}  // namespace sm90
}  // namespace fusegemm
