// Epilogue building blocks shared by every kernel (sm_90a, sm_100a and the epilogue harness).
//
// The per-element math of an epilogue is the rule generated from the spec (generator/emit.py,
// templates/rule.cu.j2): a struct with begin_tile(p, expert), row(p, row), elem(p, row, col) and
// apply(acc0, acc1, row_inputs, element_inputs) -> Out. This header holds what every rule and
// engine uses: the NaN-propagating math helpers the rules call, loads that convert any input
// dtype to FP32, conversions to every output dtype, and the warp-staged row store. The engine
// that quantizes, reduces and stores a rule's outputs is fusegemm/epilogue_block.cuh.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp4.h>
#include <cuda_fp8.h>

#include "fusegemm/common.cuh"

namespace fusegemm {
namespace epi {

// ---------------------------------------------------------------------------------------
// Math the generated rules call (generator/functions.py gives each one's numpy twin).
// ---------------------------------------------------------------------------------------
FUSEGEMM_DEVICE float relu(float x) { return x > 0.0f ? x : (x != x ? x : 0.0f); }
FUSEGEMM_DEVICE float fmin_nan(float a, float b) { return (a < b || a != a) ? a : b; }
FUSEGEMM_DEVICE float fmax_nan(float a, float b) { return (a > b || a != a) ? a : b; }
// Overflow-free logistic: for x < 0 it is e^x / (1 + e^x), so a very negative x gives the tiny
// true value instead of 1 / (1 + Inf) = 0 (silu(-90) would otherwise be -0, 45M ulps away).
FUSEGEMM_DEVICE float sigmoid(float x) {
  if (x >= 0.0f) return __frcp_rn(__fadd_rn(1.0f, expf(-x)));
  const float e = expf(x);  // NaN lands here and stays NaN
  return __fdiv_rn(e, __fadd_rn(1.0f, e));
}
// The polynomial argument u is spelled in FP32 exactly as fusegemm/interpret.py spells it; then
// 0.5 x (1 + tanh u) = x * sigmoid(2u), which avoids the cancellation of 1 + tanh(u) for x < -1.
FUSEGEMM_DEVICE float gelu_tanh_arg(float x) {
  const float x3 = __fmul_rn(__fmul_rn(x, x), x);
  return __fmul_rn(0x1.988454p-1f /* sqrt(2/pi) */, __fadd_rn(x, __fmul_rn(0x1.6e4e26p-5f /* 0.044715 */, x3)));
}
FUSEGEMM_DEVICE float gelu_tanh(float x) { return __fmul_rn(x, sigmoid(__fmul_rn(2.0f, gelu_tanh_arg(x)))); }

// 32-column gate/up interleave: element column j of a role lives at this column of the
// paired tensor (role 0: even 32-column blocks, role 1: odd ones).
FUSEGEMM_DEVICE int paired_col(int j, int role) { return ((j >> 5) << 6) + (j & 31) + 32 * role; }

// ---------------------------------------------------------------------------------------
// Element conversion
// ---------------------------------------------------------------------------------------
template <class T>
struct Cvt;

template <>
struct Cvt<fusegemm::bfloat16_t> {
  static constexpr int kBytes = 2;
  FUSEGEMM_DEVICE static uint32_t pack2(float a, float b) {
    __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<uint32_t*>(&v);
  }
  FUSEGEMM_DEVICE static float2 unpack2(uint32_t raw) {
    __nv_bfloat162 v = *reinterpret_cast<__nv_bfloat162*>(&raw);
    return __bfloat1622float2(v);
  }
  FUSEGEMM_DEVICE static float load(const void* p, int64_t i) {
    return __uint_as_float(uint32_t(__ldg(static_cast<const unsigned short*>(p) + i)) << 16);
  }
  FUSEGEMM_DEVICE static float from_bits(uint32_t b) { return __uint_as_float(b << 16); }
};

template <>
struct Cvt<fusegemm::half_t> {
  static constexpr int kBytes = 2;
  FUSEGEMM_DEVICE static uint32_t pack2(float a, float b) {
    __half2 v = __floats2half2_rn(a, b);
    return *reinterpret_cast<uint32_t*>(&v);
  }
  FUSEGEMM_DEVICE static float2 unpack2(uint32_t raw) {
    __half2 v = *reinterpret_cast<__half2*>(&raw);
    return __half22float2(v);
  }
  FUSEGEMM_DEVICE static float load(const void* p, int64_t i) {
    return __half2float(__ushort_as_half(__ldg(static_cast<const unsigned short*>(p) + i)));
  }
  FUSEGEMM_DEVICE static float from_bits(uint32_t b) { return __half2float(__ushort_as_half(static_cast<unsigned short>(b))); }
};

template <>
struct Cvt<float> {
  static constexpr int kBytes = 4;
  FUSEGEMM_DEVICE static float load(const void* p, int64_t i) { return __ldg(static_cast<const float*>(p) + i); }
};

template <>
struct Cvt<fusegemm::float_e4m3_t> {
  static constexpr int kBytes = 1;
  FUSEGEMM_DEVICE static float load(const void* p, int64_t i) {
    __nv_fp8_storage_t raw = __ldg(static_cast<const unsigned char*>(p) + i);
    return __half2float(__half(__nv_cvt_fp8_to_halfraw(raw, __NV_E4M3)));
  }
};

template <>
struct Cvt<fusegemm::float_e5m2_t> {
  static constexpr int kBytes = 1;
  FUSEGEMM_DEVICE static float load(const void* p, int64_t i) {
    __nv_fp8_storage_t raw = __ldg(static_cast<const unsigned char*>(p) + i);
    return __half2float(__half(__nv_cvt_fp8_to_halfraw(raw, __NV_E5M2)));
  }
};

// Element i of an input of type T as FP32 (the rules' input loads).
template <class T>
FUSEGEMM_DEVICE float ldf(const void* p, int64_t i) { return Cvt<T>::load(p, i); }

// 32 consecutive elements of one row of a loaded input (an element input such as dSwiGLU's
// C). The block engine runs lane = row, so loading element by element makes every load
// instruction touch 32 rows; for 16-bit T the row's block is loaded at once into 16 registers
// with 16-byte loads (4 instructions instead of 32). get(i), i a compile-time constant (the
// engine's loop is unrolled), then reads a register. 8- and 32-bit inputs keep the element
// loads (8 or 32 more live registers spill the 128-register sm_90a block-scaled kernels).
template <class T, bool kVector = Cvt<T>::kBytes == 2>
struct Row32 {
  const T* src_;
  FUSEGEMM_DEVICE void load(const T* src, int) { src_ = src; }
  FUSEGEMM_DEVICE float get(int i) const { return Cvt<T>::load(src_, i); }
};

template <class T>
struct Row32<T, true> {
  uint32_t w[16];

  // src: the block's first element; n_valid: elements of the block inside the row (the rest
  // are never read: zero here). An unaligned source (a strided tensor's odd pitch) or a
  // partial block is loaded element by element.
  FUSEGEMM_DEVICE void load(const T* src, int n_valid) {
    if (n_valid >= 32 && (reinterpret_cast<unsigned long long>(src) & 15ull) == 0) {
      const uint4* s = reinterpret_cast<const uint4*>(src);
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const uint4 v = __ldg(s + q);
        w[4 * q] = v.x;
        w[4 * q + 1] = v.y;
        w[4 * q + 2] = v.z;
        w[4 * q + 3] = v.w;
      }
      return;
    }
    const unsigned short* h = reinterpret_cast<const unsigned short*>(src);
#pragma unroll
    for (int q = 0; q < 16; ++q) {
      const uint32_t lo = 2 * q < n_valid ? __ldg(h + 2 * q) : 0u;
      const uint32_t hi = 2 * q + 1 < n_valid ? __ldg(h + 2 * q + 1) : 0u;
      w[q] = lo | (hi << 16);
    }
  }

  FUSEGEMM_DEVICE float get(int i) const { return Cvt<T>::from_bits((w[i >> 1] >> (16 * (i & 1))) & 0xffffu); }
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

// ---- narrow outputs (FP8, packed FP4) ---------------------------------------------------
template <class T> constexpr int out_bits() {
  return fusegemm::is_same_v<T, fusegemm::float_e2m1_t> ? 4
         : (fusegemm::is_same_v<T, fusegemm::float_e4m3_t> || fusegemm::is_same_v<T, fusegemm::float_e5m2_t>) ? 8
         : int(sizeof(T)) * 8;
}
template <class T> constexpr bool is_narrow() { return out_bits<T>() < 16; }

// Two values -> two FP8 bytes (a in the low byte) / one FP4 byte (a in the low nibble), round to
// nearest even, saturating to the finite range (cvt.rn.satfinite); FP8 NaN stays NaN.
template <class T> FUSEGEMM_DEVICE uint32_t cvt_narrow2(float a, float b) {
  if constexpr (fusegemm::is_same_v<T, fusegemm::float_e2m1_t>) {
    return __nv_cvt_float2_to_fp4x2(make_float2(a, b), __NV_E2M1, cudaRoundNearest);
  } else {
    return __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE,
                                    fusegemm::is_same_v<T, fusegemm::float_e5m2_t> ? __NV_E5M2 : __NV_E4M3);
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
