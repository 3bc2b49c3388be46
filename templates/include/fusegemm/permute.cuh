// The token permutations of an MoE layer (fusegemm/routing.py), one memory pass each.
//
//   fusegemm_gather_rows : dst row r = src row index[r], zeros where index[r] is outside
//                          [0, src_rows) (the routing's padding rows read token -1).
//   fusegemm_sum_rows_*  : dst row t = the sum of src rows index[t * k + j], j = 0 .. k-1, in that
//                          order, in FP32, rounded once to the element type (the combine: each
//                          token's k expert rows; deterministic, no atomics).
//
// torch's route to the same results wrote every intermediate: a copy of X with a zero row
// appended, then index_select (gather); index_select into (T, k, H), then a sum over k (combine,
// 2 x T k H elements through memory more than this kernel's). An index outside the source reads
// zeros, so no index value can fault.
#pragma once

#include "fusegemm/common.cuh"

namespace fusegemm {

struct PermuteParams {
  const unsigned char* src;   // rows of `vecs` 16-byte vectors, src_ld bytes apart
  unsigned char* dst;         // rows of `vecs` vectors, dst_ld bytes apart
  const long long* index;     // gather: (rows,); sum: (rows, k)
  long long rows;             // destination rows
  long long src_rows;         // source rows: an index outside [0, src_rows) reads zeros
  long long src_ld;           // bytes
  long long dst_ld;           // bytes
  int vecs;                   // 16-byte vectors per row
  int k;                      // sum: source rows per destination row
};
static_assert(sizeof(PermuteParams) == 64, "fusegemm/ops/permute.py packs these 64 bytes");

constexpr int kPermuteThreads = 256;

FUSEGEMM_DEVICE uint4 load_row_vec(const PermuteParams& p, long long row, int v) {
  if (row < 0 || row >= p.src_rows) return make_uint4(0u, 0u, 0u, 0u);
  return __ldg(reinterpret_cast<const uint4*>(p.src + row * p.src_ld) + v);
}

// Rows in a grid-stride loop over blocks, the row's vectors over the block's threads.
FUSEGEMM_DEVICE void gather_rows(const PermuteParams& p) {
  for (long long r = blockIdx.x; r < p.rows; r += gridDim.x) {
    const long long s = __ldg(p.index + r);
    uint4* out = reinterpret_cast<uint4*>(p.dst + r * p.dst_ld);
    for (int v = threadIdx.x; v < p.vecs; v += blockDim.x) out[v] = load_row_vec(p, s, v);
  }
}

// FP32 lanes of a 16-byte vector of T, and back.
template <class T> struct Lanes;
template <> struct Lanes<float> {
  static constexpr int kN = 4;
  static FUSEGEMM_DEVICE void add(float* acc, const uint4& u) {
    acc[0] += __uint_as_float(u.x); acc[1] += __uint_as_float(u.y);
    acc[2] += __uint_as_float(u.z); acc[3] += __uint_as_float(u.w);
  }
  static FUSEGEMM_DEVICE uint4 pack(const float* acc) {
    return make_uint4(__float_as_uint(acc[0]), __float_as_uint(acc[1]), __float_as_uint(acc[2]), __float_as_uint(acc[3]));
  }
};
template <> struct Lanes<bfloat16_t> {
  static constexpr int kN = 8;
  static FUSEGEMM_DEVICE void add(float* acc, const uint4& u) {
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      acc[2 * i] += __uint_as_float(w[i] << 16);              // bf16 -> f32 is a shift
      acc[2 * i + 1] += __uint_as_float(w[i] & 0xffff0000u);
    }
  }
  static FUSEGEMM_DEVICE uint32_t round2(float lo, float hi) {
    uint32_t r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
  }
  static FUSEGEMM_DEVICE uint4 pack(const float* acc) {
    return make_uint4(round2(acc[0], acc[1]), round2(acc[2], acc[3]), round2(acc[4], acc[5]), round2(acc[6], acc[7]));
  }
};
template <> struct Lanes<half_t> {
  static constexpr int kN = 8;
  static FUSEGEMM_DEVICE void add(float* acc, const uint4& u) {
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float lo, hi;
      asm("{\n\t.reg .f16 l, h;\n\tmov.b32 {l, h}, %2;\n\tcvt.f32.f16 %0, l;\n\tcvt.f32.f16 %1, h;\n\t}"
          : "=f"(lo), "=f"(hi) : "r"(w[i]));
      acc[2 * i] += lo;
      acc[2 * i + 1] += hi;
    }
  }
  static FUSEGEMM_DEVICE uint32_t round2(float lo, float hi) {
    uint32_t r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
  }
  static FUSEGEMM_DEVICE uint4 pack(const float* acc) {
    return make_uint4(round2(acc[0], acc[1]), round2(acc[2], acc[3]), round2(acc[4], acc[5]), round2(acc[6], acc[7]));
  }
};

template <class T>
FUSEGEMM_DEVICE void sum_rows(const PermuteParams& p) {
  using L = Lanes<T>;
  for (long long r = blockIdx.x; r < p.rows; r += gridDim.x) {
    const long long* idx = p.index + r * p.k;
    uint4* out = reinterpret_cast<uint4*>(p.dst + r * p.dst_ld);
    for (int v = threadIdx.x; v < p.vecs; v += blockDim.x) {
      float acc[L::kN];
#pragma unroll
      for (int i = 0; i < L::kN; ++i) acc[i] = 0.0f;
      int j = 0;
      // Four source rows in flight per step: the loads are independent, only the adds are ordered.
      for (; j + 4 <= p.k; j += 4) {
        uint4 u[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) u[q] = load_row_vec(p, __ldg(idx + j + q), v);
#pragma unroll
        for (int q = 0; q < 4; ++q) L::add(acc, u[q]);
      }
      for (; j < p.k; ++j) L::add(acc, load_row_vec(p, __ldg(idx + j), v));
      out[v] = L::pack(acc);
    }
  }
}

}  // namespace fusegemm

extern "C" __global__ void __launch_bounds__(fusegemm::kPermuteThreads)
fusegemm_gather_rows(const __grid_constant__ fusegemm::PermuteParams p) {
  fusegemm::gather_rows(p);
}
extern "C" __global__ void __launch_bounds__(fusegemm::kPermuteThreads)
fusegemm_sum_rows_float32(const __grid_constant__ fusegemm::PermuteParams p) {
  fusegemm::sum_rows<float>(p);
}
extern "C" __global__ void __launch_bounds__(fusegemm::kPermuteThreads)
fusegemm_sum_rows_bfloat16(const __grid_constant__ fusegemm::PermuteParams p) {
  fusegemm::sum_rows<fusegemm::bfloat16_t>(p);
}
extern "C" __global__ void __launch_bounds__(fusegemm::kPermuteThreads)
fusegemm_sum_rows_float16(const __grid_constant__ fusegemm::PermuteParams p) {
  fusegemm::sum_rows<fusegemm::half_t>(p);
}
