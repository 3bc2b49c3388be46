// The sm_90a block-scaled kernel the registry names (BlockScaledGemmKernel): FP8 WGMMA per 32 K
// with FP32 scale promotion (blockscaled_promote.cuh). Issue 10 built and measured a second
// design on the H200 (dequantize FP8 to BF16 in shared memory, then BF16 WGMMA); it was slower on
// every shape (README "Block-scaled ops") and reachable only through a macro, so it was removed
// (blockscaled_dequant.cuh at 4e141dc in git history).
#pragma once

#include "fusegemm/sm90/blockscaled_promote.cuh"

namespace fusegemm {
namespace sm90 {

template <class Config>
using BlockScaledGemmKernel = BlockScaledPromoteKernel<Config>;

}  // namespace sm90
}  // namespace fusegemm
