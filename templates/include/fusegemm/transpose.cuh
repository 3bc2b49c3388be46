// K-major copies of the block-scaled ops' MN-major FP8 operands (fusegemm/ops/scaled_layouts.py):
// the kernels read K-major A and B only, so an op built for seed 004's M-major A / N-major B or
// seed 000's N-major dense B copies the operand on the launch stream first. One byte per element.
//
// src: batch b's element (r, c) at src[b * src_batch + c * src_ld + r] (rows r contiguous: the
// MN-major operand), or at src_ptrs[b][c * src_ld + r] where a pointer table is given (discrete
// weights: each expert's matrix apart); dst: at dst[(b * rows + r) * cols + c] (dense, K-major). 64 x 64 tiles
// through shared memory, so that both the loads (along r) and the stores (along c) are coalesced:
// blockIdx.x row tiles, y column tiles, z batches. Whole tiles of an aligned source load words
// and store 16-byte vectors (cols is a multiple of 16: the kernels' K rows); the rest goes byte
// by byte, bounds-checked.
#pragma once

#include "fusegemm/common.cuh"

namespace fusegemm {

struct TransposeParams {
  const unsigned char* src;
  unsigned char* dst;
  const unsigned long long* src_ptrs;   // optional (batches,): each batch's src (src unused)
  long long src_ld;      // bytes between consecutive c of src
  long long src_batch;   // bytes between batches of src
  int rows;
  int cols;
  int aligned;           // src_ld and src_batch are multiples of 4 bytes (each src is checked here)
  int pad;
};
static_assert(sizeof(TransposeParams) == 56, "fusegemm/ops/scaled_layouts.py packs these 56 bytes");

constexpr int kTransposeTile = 64;
constexpr int kTransposePitch = 68;   // bytes per staged column c: word-aligned, banks spread

FUSEGEMM_DEVICE void transpose_u8(const TransposeParams& p) {
  __shared__ __align__(16) unsigned char tile[kTransposeTile * kTransposePitch];   // [c][r]
  const int t = threadIdx.x;
  const int r0 = blockIdx.x * kTransposeTile, c0 = blockIdx.y * kTransposeTile;
  const unsigned char* src = p.src_ptrs != nullptr ? reinterpret_cast<const unsigned char*>(__ldg(p.src_ptrs + blockIdx.z))
                                                   : p.src + blockIdx.z * p.src_batch;
  unsigned char* dst = p.dst + static_cast<long long>(blockIdx.z) * p.rows * p.cols;
  const bool whole = p.aligned && (reinterpret_cast<uintptr_t>(src) & 3) == 0 && r0 + kTransposeTile <= p.rows &&
                     c0 + kTransposeTile <= p.cols;
  if (whole) {
    // 64 columns of 16 words: thread t loads word t % 16 of columns t / 16 + 16 i.
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int c = t / 16 + 16 * i, w = t % 16;
      const uint32_t v = __ldg(reinterpret_cast<const uint32_t*>(src + (c0 + c) * p.src_ld + r0 + 4 * w));
      *reinterpret_cast<uint32_t*>(tile + c * kTransposePitch + 4 * w) = v;
    }
  } else {
    for (int i = t; i < kTransposeTile * kTransposeTile; i += blockDim.x) {
      const int c = i / kTransposeTile, r = i % kTransposeTile;
      tile[c * kTransposePitch + r] =
          r0 + r < p.rows && c0 + c < p.cols ? src[(c0 + c) * p.src_ld + r0 + r] : static_cast<unsigned char>(0);
    }
  }
  __syncthreads();
  // Row r of the tile, 16 columns per thread: t / 4 the row, t % 4 the 16-byte chunk.
  const int r = t / 4, q = t % 4;
  if (r0 + r >= p.rows) return;
  unsigned char* out = dst + static_cast<long long>(r0 + r) * p.cols + c0 + 16 * q;
  if (c0 + 16 * q + 16 <= p.cols) {
    uint32_t w[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      w[j] = 0;
#pragma unroll
      for (int b = 0; b < 4; ++b) w[j] |= uint32_t(tile[(16 * q + 4 * j + b) * kTransposePitch + r]) << (8 * b);
    }
    *reinterpret_cast<uint4*>(out) = make_uint4(w[0], w[1], w[2], w[3]);
  } else {
    for (int j = 0; j < 16 && c0 + 16 * q + j < p.cols; ++j) out[j] = tile[(16 * q + j) * kTransposePitch + r];
  }
}

}  // namespace fusegemm

extern "C" __global__ void __launch_bounds__(256) fusegemm_transpose_u8(const __grid_constant__ fusegemm::TransposeParams p) {
  fusegemm::transpose_u8(p);
}
