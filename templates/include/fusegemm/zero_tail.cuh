// Zeroes the rows of an op's row-major outputs at or past the last padded offset, on the device.
//
// A grouped kernel stores every row below valid_m = min(padded_offsets[L-1], m_rows) and no row
// at or past it; the ops promise zeros there. Filling whole buffers before the launch cost up to
// 22% of a GEMM's time on the H200 (fusegemm/ops/tail.py), and the host cannot size the tail
// without reading the offsets back (a sync, and impossible while a CUDA graph captures); so this
// kernel reads the last offset itself and zeroes only the tail, for up to kMaxBuffers buffers in
// one launch. Rows of every buffer are contiguous (the ops allocate them): buffer i's tail is the
// byte range [valid_m * row_bytes[i], m_rows * row_bytes[i]); with row ends, each expert's rows
// past its row end as well.
#pragma once

#include "fusegemm/common.cuh"

namespace fusegemm {

struct ZeroTailParams {
  static constexpr int kMaxBuffers = 4;
  unsigned char* base[kMaxBuffers];   // unused entries: row_bytes 0
  long long row_bytes[kMaxBuffers];   // multiples of 16 (the ops' 16-byte row alignment)
  const int* offsets;                 // padded_offsets (L,)
  int num_experts;
  int m_rows;
  const int* row_ends;                // optional (L,): also zero each expert's rows past its row end
};
static_assert(sizeof(ZeroTailParams) == 88, "fusegemm/ops/tail.py packs these 88 bytes");

// Grid-stride 16-byte stores over each buffer's tail (blockIdx.y: the buffer).
FUSEGEMM_DEVICE void zero_tail(const ZeroTailParams& p) {
  const int b = blockIdx.y;
  const long long row_bytes = p.row_bytes[b];
  if (row_bytes == 0) return;
  int valid = p.num_experts > 0 ? __ldg(p.offsets + p.num_experts - 1) : 0;
  valid = min(max(valid, 0), p.m_rows);   // offsets are unchecked: never outside the buffer
  const long long begin = valid * row_bytes, end = static_cast<long long>(p.m_rows) * row_bytes;
  const long long stride = 16ll * gridDim.x * blockDim.x;
  const long long first = 16ll * (blockIdx.x * blockDim.x + threadIdx.x);
  for (long long i = begin + first; i < end; i += stride) {
    *reinterpret_cast<uint4*>(p.base[b] + i) = make_uint4(0u, 0u, 0u, 0u);
  }
  const int experts = p.num_experts;
  if (p.row_ends == nullptr || experts <= 0) return;
  // Row ends (fusegemm/scheduler.cuh): rows [row_ends[e], offsets[e]) of each expert, which a
  // kernel that skips tiles past the row end may leave unwritten; the launch that follows
  // overwrites the ones its tiles do store. Block x serves expert x % L, as chunk x / L of the
  // chunks = grid / L blocks that share it (a grid smaller than L: every grid-th expert, whole):
  // no thread walks every expert (a walk over 128 experts per thread cost as much as the tail).
  const int chunks = max(int(gridDim.x) / experts, 1);
  const int chunk = int(blockIdx.x) / experts;
  if (chunk >= chunks) return;
  const long long step = 16ll * chunks * blockDim.x;
  const long long own = 16ll * (chunk * blockDim.x + threadIdx.x);
  for (int e = int(blockIdx.x) % experts; e < experts; e += gridDim.x) {
    const int lo = expert_first_row(p.offsets, e);
    const int hi = min(__ldg(p.offsets + e), valid);
    const int from = min(max(__ldg(p.row_ends + e), max(lo, 0)), hi);
    for (long long i = from * row_bytes + own; i < hi * row_bytes; i += step) {
      *reinterpret_cast<uint4*>(p.base[b] + i) = make_uint4(0u, 0u, 0u, 0u);
    }
  }
}

// Scattered outputs (d_scatter): problem row r's C and D rows go to row index[r] of (d_rows, N)
// buffers, and the rows no stored problem row names must read zero. Filling whole buffers before
// the launch cost 0.16 ms of a 1.65 ms GEMM at the dsv3 layer's fc2 (470 MB; H100,
// bench/gathered.py), where the routing names every row; so one kernel marks the named rows in a
// bitmask (zeroed by the host first) and a second zeroes the others' rows, reading the mask alone
// for a named row. A row counts as named only where the GEMM surely stores its source: below
// valid_m and, with row ends, below its expert's row end (a kernel may skip the tiles past it);
// rows zeroed here that a tile stores after all are overwritten by the launch that follows.
struct ZeroUnnamedParams {
  static constexpr int kMaxBuffers = ZeroTailParams::kMaxBuffers;
  unsigned char* base[kMaxBuffers];   // d_rows rows each; unused entries: row_bytes 0
  long long row_bytes[kMaxBuffers];   // multiples of 16
  const int* index;                   // d_index (m_rows,): the output row of each problem row
  const int* offsets;                 // padded_offsets (L,)
  const int* row_ends;                // optional (L,)
  unsigned* named;                    // ceil(d_rows / 32) words, zero on entry to the mark kernel
  int num_experts;
  int m_rows;
  int d_rows;
  int pad_;
};
static_assert(sizeof(ZeroUnnamedParams) == 112, "fusegemm/ops/tail.py packs these 112 bytes");

// The expert whose rows hold row r: the first e with offsets[e] > r (offsets unchecked: any e in
// [0, L) for offsets that do not rise; a row wrongly left unnamed is only zeroed once more).
FUSEGEMM_DEVICE int expert_of_row(const int* offsets, int experts, int r) {
  int lo = 0, hi = experts - 1;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (__ldg(offsets + mid) > r) hi = mid; else lo = mid + 1;
  }
  return lo;
}

FUSEGEMM_DEVICE void mark_named(const ZeroUnnamedParams& p) {
  if (p.num_experts <= 0) return;
  const int valid = min(max(__ldg(p.offsets + p.num_experts - 1), 0), p.m_rows);
  for (int r = blockIdx.x * blockDim.x + threadIdx.x; r < valid; r += gridDim.x * blockDim.x) {
    if (p.row_ends != nullptr && r >= __ldg(p.row_ends + expert_of_row(p.offsets, p.num_experts, r))) continue;
    const int to = __ldg(p.index + r);
    if (static_cast<unsigned>(to) < static_cast<unsigned>(p.d_rows)) atomicOr(p.named + (to >> 5), 1u << (to & 31));
  }
}

// A warp per output row (grid-stride over rows, blockIdx.y: the buffer): the mask's word, and
// for an unnamed row the row's 16-byte pieces.
FUSEGEMM_DEVICE void zero_unnamed(const ZeroUnnamedParams& p) {
  const int b = blockIdx.y;
  const long long row_bytes = p.row_bytes[b];
  if (row_bytes == 0) return;
  const int lane = threadIdx.x % 32, warps = blockDim.x / 32;
  for (int row = blockIdx.x * warps + threadIdx.x / 32; row < p.d_rows; row += gridDim.x * warps) {
    if ((p.named[row >> 5] >> (row & 31)) & 1u) continue;   // warp-uniform
    unsigned char* at = p.base[b] + row * row_bytes;
    for (long long i = 16ll * lane; i < row_bytes; i += 16 * 32) {
      *reinterpret_cast<uint4*>(at + i) = make_uint4(0u, 0u, 0u, 0u);
    }
  }
}

}  // namespace fusegemm

extern "C" __global__ void __launch_bounds__(256) fusegemm_mark_named(const __grid_constant__ fusegemm::ZeroUnnamedParams p) {
  fusegemm::mark_named(p);
}

extern "C" __global__ void __launch_bounds__(256) fusegemm_zero_unnamed(const __grid_constant__ fusegemm::ZeroUnnamedParams p) {
  fusegemm::zero_unnamed(p);
}

extern "C" __global__ void __launch_bounds__(256) fusegemm_zero_tail(const __grid_constant__ fusegemm::ZeroTailParams p) {
  fusegemm::zero_tail(p);
}
