// sm_100a accumulator drain: TMEM -> registers, then the arch-neutral epilogue engine.
//
// The accumulator of a 128-row CTA tile lives in TMEM lane r = tile row r (TRA:520-527); with
// tcgen05.ld.32x32b each thread of epilogue warp w receives 32 consecutive FP32 columns of row
// 32*(w%4) + lane: exactly the block layout of fusegemm/epilogue_block.cuh, which then applies
// the generated rule, quantizes, reduces and stores (the same code the epilogue harness runs on
// the H200). A vector_f32 rule (sm_100a only) evaluates column pairs with packed FP32
// arithmetic (fusegemm/sm100/packed_f32.cuh), bit-identical to the scalar rule.
#pragma once

#include "fusegemm/epilogue_block.cuh"
#include "fusegemm/sm100/packed_f32.cuh"  // a vector_f32 rule's apply2()
#include "fusegemm/sm100/tmem.cuh"

namespace fusegemm::sm100 {

using epi::is_narrow;
using epi::out_bits;
using epi::staging_bytes;
using epi::store_block32;
using epi::store_col32;
using epi::store_row32_narrow;

constexpr int kEpiChunkCols = 32;  // columns per tcgen05.ld (32x32b.x32)

// 32 consecutive FP32 accumulator columns of this thread's TMEM lane into acc[0..31].
FUSEGEMM_DEVICE void tmem_load_chunk(uint32_t taddr, bool zero, float* acc) {
  uint32_t raw[32];
  tmem_ld_32x32b_x32(taddr, raw);
  tmem_wait_ld();
#pragma unroll
  for (int i = 0; i < 32; ++i) acc[i] = zero ? 0.0f : __uint_as_float(raw[i]);
}

}  // namespace fusegemm::sm100
