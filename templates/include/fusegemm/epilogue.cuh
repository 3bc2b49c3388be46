// Epilogue building blocks shared by the sm_90a and sm_100a grouped kernels.
//
// The seam every epilogue goes through (and that the epilogue expression language will
// generate later) is one per-element rule:
//
//     FP32 accumulator value + (row, column, expert) contexts  ->  output values
//
// Contexts are loaded once per tile (expert scalars: alpha), once per row (prob) and once
// per column (bias), so the rule itself is a handful of FMAs on registers. Everything
// here is arch-neutral: the mainloop only decides which (row, col) pairs of the tile a
// thread holds (WGMMA fragment on sm_90a, TMEM lanes on sm_100a) and calls
//
//     Rule rule; rule.begin_tile(params, expert);        // per tile
//     float p = rule.row(params, row);                   // per row the thread owns
//     float2 b = rule.col2(params, col);                 // per column pair (col even)
//     typename Rule::Out o = rule.apply(acc, p, b.x);    // per element -> o.c, o.d
//
// and then hands the converted values to a store helper (WarpStagedStore below: a warp
// stages 16 rows x 128 bytes in padded smem and writes full 128-byte row segments with
// 16-byte vector stores). Rows never need masks (tiles never cross valid_m); columns past
// N are masked per 16-byte vector, so N must be a multiple of 8 (16-byte rows for every
// output dtype).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "fusegemm/common.cuh"

namespace fusegemm {
namespace epi {

// ---------------------------------------------------------------------------------------
// Element conversion
// ---------------------------------------------------------------------------------------
template <class T>
struct Cvt;

template <>
struct Cvt<cutlass::bfloat16_t> {
  static constexpr int kBytes = 2;
  FUSEGEMM_DEVICE static uint32_t pack2(float a, float b) {
    __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<uint32_t*>(&v);
  }
  FUSEGEMM_DEVICE static float2 unpack2(uint32_t raw) {
    __nv_bfloat162 v = *reinterpret_cast<__nv_bfloat162*>(&raw);
    return __bfloat1622float2(v);
  }
};

template <>
struct Cvt<cutlass::half_t> {
  static constexpr int kBytes = 2;
  FUSEGEMM_DEVICE static uint32_t pack2(float a, float b) {
    __half2 v = __floats2half2_rn(a, b);
    return *reinterpret_cast<uint32_t*>(&v);
  }
  FUSEGEMM_DEVICE static float2 unpack2(uint32_t raw) {
    __half2 v = *reinterpret_cast<__half2*>(&raw);
    return __half22float2(v);
  }
};

template <>
struct Cvt<float> {
  static constexpr int kBytes = 4;
};

// Two adjacent elements at `p` (p 2-element aligned) as floats, read-only path.
template <class T>
FUSEGEMM_DEVICE float2 load2(const T* p) {
  if constexpr (Cvt<T>::kBytes == 4) {
    return __ldg(reinterpret_cast<const float2*>(p));
  } else {
    return Cvt<T>::unpack2(__ldg(reinterpret_cast<const unsigned int*>(p)));
  }
}

// Store two adjacent converted values into shared memory at byte address `addr`.
template <class T>
FUSEGEMM_DEVICE void st_shared2(uint32_t addr, float a, float b) {
  if constexpr (Cvt<T>::kBytes == 4) {
    asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(addr), "f"(a), "f"(b) : "memory");
  } else {
    asm volatile("st.shared.b32 [%0], %1;" ::"r"(addr), "r"(Cvt<T>::pack2(a, b)) : "memory");
  }
}

// ---------------------------------------------------------------------------------------
// Seed 001 rule (BF16 grouped GEMM):  G = alpha[e] * acc
//   bias:     C = G + prob[m] * bias[n, e],  D = C
//   no bias:  C = G,                         D = prob[m] * G
// prob == nullptr means 1. Bias is (N, L) with (n, e) at bias[e * N + n].
// ---------------------------------------------------------------------------------------
template <class Config>
struct GroupedGemmRule {
  using ElementBias = typename Config::ElementBias;
  static constexpr bool kHasBias = Config::kHasBias;

  struct Out {
    float c, d;
  };

  float alpha;
  const ElementBias* bias_e;  // bias column of this tile's expert (nullptr without bias)
  int n;

  template <class Params>
  FUSEGEMM_DEVICE void begin_tile(const Params& p, int expert) {
    alpha = __ldg(reinterpret_cast<const float*>(p.alpha) + expert);
    n = p.n;
    if constexpr (kHasBias) {
      bias_e = reinterpret_cast<const ElementBias*>(p.bias) + static_cast<int64_t>(expert) * p.n;
    } else {
      bias_e = nullptr;
    }
  }

  template <class Params>
  FUSEGEMM_DEVICE float row(const Params& p, int row) const {
    const float* prob = reinterpret_cast<const float*>(p.prob);
    return prob != nullptr ? __ldg(prob + row) : 1.0f;
  }

  // Bias for columns (col, col + 1), col even; zero past N (those columns are never
  // stored, and reading them would run into the next expert's bias or off the end).
  template <class Params>
  FUSEGEMM_DEVICE float2 col2(const Params&, int col) const {
    if constexpr (kHasBias) {
      if (col < n) return load2(bias_e + col);
    }
    return make_float2(0.0f, 0.0f);
  }

  FUSEGEMM_DEVICE Out apply(float acc, float prob, float bias) const {
    float g = alpha * acc;
    Out o;
    if constexpr (kHasBias) {
      o.c = fmaf(prob, bias, g);
      o.d = o.c;
    } else {
      o.c = g;
      o.d = prob * g;
    }
    return o;
  }
};

// ---------------------------------------------------------------------------------------
// Warp-staged row store: one warp writes kRows x 128 bytes of one output.
//
// put():   each lane deposits pairs of adjacent values at (row, col) of the chunk
//          (col in elements, 0 <= col < kCols). Any fragment layout works.
// flush(): after __syncwarp(), every lane copies 16-byte vectors: a row segment is 128
//          contiguous bytes = one cache line, so each warp store instruction writes four
//          full lines. Columns >= cols_valid are skipped (per 16-byte vector).
//
// The row pitch is padded by 8 elements: with 2-byte elements (4-byte pair stores) the 8
// rows a quad-major fragment touches start 4 banks apart; with 4-byte elements (8-byte
// pair stores, served per half-warp) 4 rows start 8 banks apart. Either way conflict-free.
// ---------------------------------------------------------------------------------------
template <class T, int kRows = 16>
struct WarpStagedStore {
  static constexpr int kElem = Cvt<T>::kBytes;
  static constexpr int kCols = 128 / kElem;            // elements per staged row segment
  static constexpr int kPitch = 128 + 8 * kElem;        // bytes
  static constexpr int kBytes = kRows * kPitch;
  static constexpr int kVecPerRow = 128 / 16;
  static constexpr int kVecPerLane = kRows * kVecPerRow / 32;
  static_assert(kRows * kVecPerRow % 32 == 0, "rows must fill whole warp passes");

  FUSEGEMM_DEVICE static void put(uint32_t buf, int row, int col, float a, float b) {
    st_shared2<T>(buf + row * kPitch + col * kElem, a, b);
  }

  // gbase: element (row 0, col 0) of the chunk in global memory; ld: row stride in elements.
  FUSEGEMM_DEVICE static void flush(uint32_t buf, T* gbase, int64_t ld, int cols_valid,
                                    int lane) {
#pragma unroll
    for (int i = 0; i < kVecPerLane; ++i) {
      int v = lane + 32 * i;
      int row = v / kVecPerRow;
      int seg = v % kVecPerRow;
      int col = seg * (16 / kElem);
      uint4 val;
      asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                   : "=r"(val.x), "=r"(val.y), "=r"(val.z), "=r"(val.w)
                   : "r"(buf + row * kPitch + seg * 16)
                   : "memory");
      if (col < cols_valid) {
        *reinterpret_cast<uint4*>(gbase + row * ld + col) = val;
      }
    }
  }
};

}  // namespace epi
}  // namespace fusegemm
