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

// 1: the block engine (epilogue_block.cuh) applies the rule to every column of a block and masks
// what lies past the row end or the warp's rows, as the sm_90a fragment path does (rules whose
// element inputs it holds in registers: 16-bit ones, or none); 0: a branch region per column
// (`if (in) apply`), which keeps the scheduler from interleaving the columns' dependency chains.
// Same bits either way. H200, blockwise recipe, same run (bench/results/
// blockscaled_h200_engine_switches_2.json, 5 rounds, with FUSEGEMM_ENGINE_AMAX_TREE): dSwiGLU
// 1.00-1.10x the speed of the branching engine at dsv3-fc2, dsv3-fc1 and mixtral-fc1, quant
// 1.00-1.03x, sReLU with FP8 D 0.98-1.03x (alone, the first run: dSwiGLU 1.01-1.08x); 0 is the
// baseline, an A/B switch through FUSEGEMM_NVRTC_EXTRA.
#ifndef FUSEGEMM_ENGINE_BRANCHLESS
#define FUSEGEMM_ENGINE_BRANCHLESS 1
#endif

namespace fusegemm {
namespace epi {

// ---------------------------------------------------------------------------------------
// Math the generated rules call (generator/functions.py gives each one's numpy twin).
// ---------------------------------------------------------------------------------------
FUSEGEMM_DEVICE float relu(float x) { return x > 0.0f ? x : (x != x ? x : 0.0f); }
FUSEGEMM_DEVICE float fmin_nan(float a, float b) { return (a < b || a != a) ? a : b; }
FUSEGEMM_DEVICE float fmax_nan(float a, float b) { return (a > b || a != a) ? a : b; }
// n / d rounded to nearest for d in [1, 2] and n in [0, 1] (subnormal n only with d = 1) or NaN:
// a reciprocal estimate, one Newton step, the quotient and one remainder correction. That is the
// inline fast path of __fdiv_rn; what it leaves out is the operand range check and the call to
// the slow path, which made every division a branch region the compiler would not schedule
// across (H200, dSwiGLU epilogue at the dsv3 shape: the rule's apply() cost 0.55 ms of a 1.29 ms
// GEMM). In this range no intermediate under- or overflows, so the result is the correctly
// rounded quotient; with d = 1 every step is exact (the quotient is n).
FUSEGEMM_DEVICE float div_unit_range(float n, float d) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(d));
  r = __fmaf_rn(r, __fmaf_rn(-d, r, 1.0f), r);
  const float q = __fmul_rn(n, r);
  return __fmaf_rn(__fmaf_rn(-d, q, n), r, q);
}
// Overflow-free logistic: for x < 0 it is e^x / (1 + e^x), so a very negative x gives the tiny
// true value instead of 1 / (1 + Inf) = 0 (silu(-90) would otherwise be -0, 45M ulps away).
// Written without a branch: x >= 0 gives 1 / (1 + e^-x), x < 0 and NaN give e^x / (1 + e^x); both
// read e = e^-|x| (a warp whose lanes hold mixed signs, every epilogue's usual case, would
// otherwise run both expf paths), and 1 + e lies in [1, 2].
FUSEGEMM_DEVICE float sigmoid(float x) {
  const float e = expf(-fabsf(x));  // NaN stays NaN
  return div_unit_range(x >= 0.0f ? 1.0f : e, __fadd_rn(1.0f, e));
}
// The polynomial argument u is spelled in FP32 exactly as fusegemm/interpret.py spells it; then
// 0.5 x (1 + tanh u) = x * sigmoid(2u), which avoids the cancellation of 1 + tanh(u) for x < -1.
FUSEGEMM_DEVICE float gelu_tanh_arg(float x) {
  const float x3 = __fmul_rn(__fmul_rn(x, x), x);
  return __fmul_rn(0x1.988454p-1f /* sqrt(2/pi) */, __fadd_rn(x, __fmul_rn(0x1.6e4e26p-5f /* 0.044715 */, x3)));
}
FUSEGEMM_DEVICE float gelu_tanh(float x) { return __fmul_rn(x, sigmoid(__fmul_rn(2.0f, gelu_tanh_arg(x)))); }
// Exact GELU in torch's FP32 order, (x * 0.5) * (1 + erf(x * 1/sqrt(2))), each step rounded once,
// so that it is the same formula a user would compare with; fusegemm/interpret.py spells the same
// steps. 1 + erf cancels for x below about -3: there erff's 2 ulp dominate (generator/functions.py).
FUSEGEMM_DEVICE float gelu(float x) {
  return __fmul_rn(__fmul_rn(x, 0.5f), __fadd_rn(1.0f, erff(__fmul_rn(x, 0x1.6a09e6p-1f /* 1/sqrt(2) */))));
}

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
    float2 v;
    bf16x2_to_f32(raw, v.x, v.y);
    return v;
  }
  FUSEGEMM_DEVICE static float load(const void* p, int64_t i) {
    return bf16_bits_to_f32(__ldg(static_cast<const unsigned short*>(p) + i));
  }
  FUSEGEMM_DEVICE static float from_bits(uint32_t b) { return bf16_bits_to_f32(b); }
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

// A column pair's raw bits: raw2_load at element k of an aligned pair's address, raw2_unpack
// converting them (ldf2's aligned load is the two together; the fragment path's loads a block
// ahead hold the bits, one register per 16-bit pair, two per FP32 pair, until the block's rule
// runs). 8-bit inputs have no aligned pairs.
template <class T>
struct Raw2 {
  using type = fusegemm::conditional_t<Cvt<T>::kBytes == 4, float2, uint32_t>;
};
template <class T>
using Raw2T = typename Raw2<T>::type;
template <class T>
FUSEGEMM_DEVICE Raw2T<T> raw2_load(const char* at, int k) {
  static_assert(Cvt<T>::kBytes == 2 || Cvt<T>::kBytes == 4, "pairs of 16- or 32-bit inputs");
  return __ldg(reinterpret_cast<const Raw2T<T>*>(at + k * Cvt<T>::kBytes));
}
// The same bits element by element, for a pair not known to be aligned or whole: element k
// when valid > 0, k + 1 when valid > 1, zero bits for the others.
template <class T>
FUSEGEMM_DEVICE Raw2T<T> raw2_load_elems(const char* at, int k, int valid) {
  static_assert(Cvt<T>::kBytes == 2 || Cvt<T>::kBytes == 4, "pairs of 16- or 32-bit inputs");
  if constexpr (Cvt<T>::kBytes == 4) {
    const float* f = reinterpret_cast<const float*>(at) + k;
    return make_float2(valid > 0 ? __ldg(f) : 0.0f, valid > 1 ? __ldg(f + 1) : 0.0f);
  } else {
    const unsigned short* h = reinterpret_cast<const unsigned short*>(at) + k;
    const uint32_t lo = valid > 0 ? uint32_t(__ldg(h)) : 0u, hi = valid > 1 ? uint32_t(__ldg(h + 1)) : 0u;
    return lo | (hi << 16);
  }
}
template <class T>
FUSEGEMM_DEVICE void raw2_unpack(Raw2T<T> r, float& a, float& b) {
  if constexpr (Cvt<T>::kBytes == 4) {
    a = r.x;
    b = r.y;
  } else {
    const float2 v = Cvt<T>::unpack2(r);
    a = v.x;
    b = v.y;
  }
}

// Elements i and i + 1 of an input of type T as FP32 (the rules' elem2(): a fragment thread's two
// adjacent columns). One 4- or 8-byte load where the pair is aligned (every even column of a
// contiguous input), else two element loads (a strided input's odd pitch, 8-bit inputs).
// kAligned: the caller checked pairs_aligned() (no per-load branch: a branch region around each
// load and its conversion kept the compiler from issuing a block's loads together, one full
// latency each; H200, dSwiGLU epilogue at the dsv3 shape: 0.42 ms of a 1.27 ms GEMM).
template <class T, bool kAligned = false>
FUSEGEMM_DEVICE void ldf2(const void* p, int64_t i, float& a, float& b) {
  constexpr int kBytes = Cvt<T>::kBytes;
  const char* at = static_cast<const char*>(p) + i * kBytes;
  if constexpr (kBytes == 2 || kBytes == 4) {
    if (kAligned || (reinterpret_cast<unsigned long long>(at) & (2 * kBytes - 1)) == 0) {
      raw2_unpack<T>(raw2_load<T>(at, 0), a, b);
      return;
    }
  }
  a = Cvt<T>::load(p, i);
  b = Cvt<T>::load(p, i + 1);
}

// The address of element i of an input at `base` (the fragment path's per-row addresses, from
// which ldf / ldf2 then read at constant element offsets).
template <class T>
FUSEGEMM_DEVICE const char* elem_ptr(const void* base, int64_t i) {
  return static_cast<const char*>(base) + i * Cvt<T>::kBytes;
}

// L2 prefetch of the line holding element i of an input at `base` (no register, no wait).
template <class T>
FUSEGEMM_DEVICE void prefetch_l2(const void* base, int64_t i) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(static_cast<const char*>(base) + i * Cvt<T>::kBytes));
}

// Whether ldf2 may take every even-column pair of an input at `base` with row pitch `ld`
// (elements) as one aligned load.
template <class T>
FUSEGEMM_DEVICE bool pairs_aligned(const void* base, int64_t ld) {
  constexpr int kBytes = Cvt<T>::kBytes;
  if constexpr (kBytes == 2 || kBytes == 4) {
    return (reinterpret_cast<unsigned long long>(base) & (2 * kBytes - 1)) == 0 && (ld & 1) == 0;
  } else {
    return false;
  }
}

// 32 consecutive elements of one row of a loaded input (an element input such as dSwiGLU's
// C). The block engine runs lane = row, so loading element by element makes every load
// instruction touch 32 rows; for 16-bit T the row's block is loaded at once into 16 registers
// with 16-byte loads (4 instructions instead of 32). get(i), i a compile-time constant (the
// engine's loop is unrolled), then reads a register. 8- and 32-bit inputs keep the element
// loads (8 or 32 more live registers spill the 128-register sm_90a block-scaled kernels).
template <class T, bool kVector = Cvt<T>::kBytes == 2>
struct Row32 {
  static constexpr bool kInRegisters = false;
  const T* src_;
  FUSEGEMM_DEVICE void load(const T* src, int) { src_ = src; }
  FUSEGEMM_DEVICE float get(int i) const { return Cvt<T>::load(src_, i); }
};

template <class T>
struct Row32<T, true> {
  static constexpr bool kInRegisters = true;
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

// Benchmark only: 1 drops the epilogues' vector stores at run time (a store happens only where its
// 16 bytes hold one unlikely pattern; the output is not a result), so that every instruction that
// forms and stages them still runs: the stores' own cost, beside FUSEGEMM_SM90_BENCH_NO_EPILOGUE's
// (no epilogue at all). The engine's build with FP8 D and both SFDs spills 24 bytes under the data
// test (tests/unit/test_store_policy.py), so its figure understates its stores. H100, 2026-12-06
// (bench/results/blockscaled_h100_williams_stores.json, pingpong_h100_store_policy.json): the
// blockwise ops 0.95-1.06x faster without their stores (dSwiGLU with FP8 D 1.05-1.15x), where the
// whole epilogue costs 1.13-1.18x (the GEMM) to 2.3-2.4x (dSwiGLU) at dsv3-fc2
// (blockscaled_h100_williams_noepi.json); the layer's BF16 GEMMs 0.91-1.04x. So the epilogues' time
// is not their stores. Stores marked evict-first in L2 (st.global.cs, an A/B switch measured the same
// day and removed) ran 0.96-1.07x on the blockwise ops and 0.94-1.02x on the layer's GEMMs: L2
// pollution by the outputs is not it either.
#ifndef FUSEGEMM_BENCH_NO_STORE
#define FUSEGEMM_BENCH_NO_STORE 0
#endif

// One 16-byte global store (addr 16-byte aligned). Written out because NVRTC, not seeing the
// alignment of a computed column offset, split `*reinterpret_cast<uint4*>(p) = v` into four
// 4-byte stores in the engine's and the fragment blocks' flushes (4x the store requests).
FUSEGEMM_DEVICE void st_global_v4(const void* addr, const uint4& v) {
#if FUSEGEMM_BENCH_NO_STORE
  if ((v.x ^ v.y ^ v.z ^ v.w) != 0x5a17c3e9u) return;
#endif
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(addr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}

// One 16-byte shared-memory load (addr 16-byte aligned): WarpStagedStore's flushes read their
// vectors with it (the same SASS as the asm written out in place; FragBlockStore's flush keeps its
// own, whose rewrite reordered the sm_90a SwiGLU kernel's instructions).
FUSEGEMM_DEVICE uint4 ld_shared_v4(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr)
               : "memory");
  return v;
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
    st_shared2<T>(at(buf, row, col), a, b);
  }
  // Shared address of (row, col) in the buffer. A caller storing several elements of a row adds
  // their constant offsets to one such address (put_packed), which ptxas folds into the store
  // instructions. Computing each address from (row, col) instead lets NVVM turn the column's
  // add into an OR (its low bits are known disjoint), which ptxas cannot fold: the sm_90a
  // deferred stores then re-derived 8 addresses per chunk or held 8 registers for them.
  FUSEGEMM_DEVICE static uint32_t at(uint32_t buf, int row, int col) { return buf + row * kPitch + col * kElem; }
  // A pair already converted (Cvt<T>::pack2; 16-bit T) at address `addr` (at() plus offsets).
  FUSEGEMM_DEVICE static void put_packed(uint32_t addr, uint32_t pair) {
    static_assert(kElem == 2, "packed pairs are two 16-bit values");
    asm volatile("st.shared.b32 [%0], %1;" ::"r"(addr), "r"(pair) : "memory");
  }

  // gbase: element (row 0, col 0) of the chunk in global memory; ld: row stride in elements.
  FUSEGEMM_DEVICE static void flush(uint32_t buf, T* gbase, int64_t ld, int cols_valid,
                                    int lane) {
    // A lane's vectors share one column and sit kRowStep rows apart (a warp pass covers whole
    // rows): one shared and one global address per lane, then constant steps (see at()), and
    // one column test. The sm_90a deferred D stores run this between k-blocks, where its length
    // shows: with the address math and a branch per vector, the K-grouped weight gradient at 8
    // k-blocks per tile (bench/wgrad.py dsv3-32-fc1-w) ran 3-6% slower on the H200.
    constexpr int kRowStep = 32 / kVecPerRow;
    static_assert(32 % kVecPerRow == 0, "a warp pass covers whole rows");
    const int row = lane / kVecPerRow, seg = lane % kVecPerRow;
    const int col = seg * (16 / kElem);
    if (col >= cols_valid) return;   // the lane's column is past N: none of its vectors is stored
    const uint32_t src = buf + row * kPitch + seg * 16;
    T* dst = gbase + row * ld + col;
    const int64_t step = kRowStep * ld;
#pragma unroll
    for (int i = 0; i < kVecPerLane; ++i) {
      st_global_v4(dst, ld_shared_v4(src + i * kRowStep * kPitch));
      dst += step;
    }
  }

  // Scattered rows: as flush(), staged row lane / kVecPerRow + kRowStep i to row rows[i] of
  // gbase (element (0, 0) of the chunk's column range; rows[i] < 0: not stored).
  FUSEGEMM_DEVICE static void flush_rows(uint32_t buf, T* gbase, int64_t ld, const int (&rows)[kVecPerLane],
                                         int cols_valid, int lane) {
    constexpr int kRowStep = 32 / kVecPerRow;
    const int row = lane / kVecPerRow, seg = lane % kVecPerRow;
    const int col = seg * (16 / kElem);
    if (col >= cols_valid) return;
    const uint32_t src = buf + row * kPitch + seg * 16;
#pragma unroll
    for (int i = 0; i < kVecPerLane; ++i) {
      const uint4 val = ld_shared_v4(src + i * kRowStep * kPitch);
      if (rows[i] >= 0) st_global_v4(gbase + static_cast<int64_t>(rows[i]) * ld + col, val);
    }
  }
};

// Four 8 x 8 matrices of packed 16-bit pairs (a WGMMA fragment's), transposed into shared memory:
// lane 8 i + j gives the address of column j of matrix i (the transposed stores below).
FUSEGEMM_DEVICE void stmatrix_trans_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(r0),
               "r"(r1), "r"(r2), "r"(r3)
               : "memory");
}

// ---------------------------------------------------------------------------------------
// Warp-staged transposed store (an M-major output: row n of the output holds column n of the
// problem, its M values contiguous; the K-grouped weight gradient's cd_major m). One warp's 16
// fragment rows x kCols columns (the row store's chunk above) are staged column by column (staged
// column n: the 16 values of fragment column n, 16 * kElem bytes) and written as 16-byte vectors
// along M: each column is one 32-byte (2-byte T) or 64-byte (4-byte T) segment of output row n,
// whole sectors. A staged column's 16-byte vectors are XOR-swizzled by its index, so that the
// fragment's writes (stmatrix.trans, 8 columns of 8 rows at a time, or 16/32-bit element stores)
// and the flush's 16-byte reads (a quarter warp reads 128 contiguous bytes) spread over the 32
// banks.
// ---------------------------------------------------------------------------------------
template <class T>
struct WarpTransposedStore {
  static constexpr int kElem = Cvt<T>::kBytes;
  static constexpr int kCols = 128 / kElem;            // the row store's chunk columns
  static constexpr int kColBytes = 16 * kElem;          // one staged column: the warp's 16 rows
  static constexpr int kVecs = kColBytes / 16;          // 16-byte vectors per staged column
  static constexpr int kPerVec = 16 / kElem;            // elements per vector
  static constexpr int kBytes = kCols * kColBytes;
  static constexpr int kColStep = 32 / kVecs;           // columns a warp pass of the flush covers
  static constexpr int kVecPerLane = kCols / kColStep;
  static_assert(kElem == 2 || kElem == 4, "16- and 32-bit outputs");

  // The physical vector of vector v of staged column n (constant along n in steps of 8).
  FUSEGEMM_DEVICE static int swizzle(int n, int v) { return v ^ ((n / (8 / kVecs)) % kVecs); }
  // Shared address of fragment element (row m, column n).
  FUSEGEMM_DEVICE static uint32_t at(uint32_t buf, int m, int n) {
    return buf + n * kColBytes + swizzle(n, m / kPerVec) * 16 + (m % kPerVec) * kElem;
  }
  FUSEGEMM_DEVICE static void put1(uint32_t addr, float x) {
    if constexpr (kElem == 4) {
      asm volatile("st.shared.f32 [%0], %1;" ::"r"(addr), "f"(x) : "memory");
    } else {
      const unsigned short h = static_cast<unsigned short>(Cvt<T>::pack2(x, 0.0f) & 0xFFFFu);
      asm volatile("st.shared.b16 [%0], %1;" ::"r"(addr), "h"(h) : "memory");
    }
  }
  // A fragment pair: (row, col) and (row, col + 1), which are two staged columns.
  FUSEGEMM_DEVICE static void put(uint32_t buf, int row, int col, float a, float b) {
    put1(at(buf, row, col), a);
    put1(at(buf, row, col + 1), b);
  }
  // Four 8 x 8 fragment matrices of packed 16-bit pairs, transposed into their staged columns:
  // lane 8 i + j gives the address of column j of matrix i (stmatrix.trans).
  FUSEGEMM_DEVICE static void put_trans4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
    static_assert(kElem == 2, "stmatrix stores 16-bit elements");
    stmatrix_trans_x4(addr, r0, r1, r2, r3);
  }

  // gbase: output element (m 0, n 0) of the chunk, output row n at gbase + n * ld; staged columns
  // >= cols_valid are not stored (each is a whole output row segment).
  FUSEGEMM_DEVICE static void flush(uint32_t buf, T* gbase, int64_t ld, int cols_valid, int lane) {
    const int n = lane / kVecs, v = lane % kVecs;
    const uint32_t src = buf + n * kColBytes + swizzle(n, v) * 16;
    T* dst = gbase + n * ld + v * kPerVec;
    const int64_t step = kColStep * ld;
#pragma unroll
    for (int i = 0; i < kVecPerLane; ++i) {
      if (n + i * kColStep < cols_valid) st_global_v4(dst, ld_shared_v4(src + i * kColStep * kColBytes));
      dst += step;
    }
  }
};

// ---------------------------------------------------------------------------------------
// Tile-staged transposed store (kDMajorM's deferred 16-bit D on the cooperative 128-row tile,
// FUSEGEMM_SM90_DT_TILE_STORE): the eight consumer warps stage their 16 rows of a 64-column
// chunk together, column by column, as [64 columns][128 rows] (256 bytes a column), and each warp
// then writes eight whole columns: 256 contiguous bytes of an output row per column, two rows a
// store instruction. WarpTransposedStore writes each column as eight 32-byte pieces from eight
// warps, sixteen output rows a store instruction. A column's 16-byte vectors are XOR-swizzled by
// the column's index mod 8, so stmatrix.trans's eight columns of a matrix and the flush's 512-byte
// reads spread over the banks. 16 KB: the consumer warps' eight staging buffers taken together.
// ---------------------------------------------------------------------------------------
template <class T>
struct TileTransposedStore {
  static constexpr int kElem = Cvt<T>::kBytes;
  static_assert(kElem == 2, "stmatrix stores 16-bit elements");
  static constexpr int kRows = 128;                     // the tile's M
  static constexpr int kCols = 64;                      // a chunk's columns (the row store's 128 bytes)
  static constexpr int kColBytes = kRows * kElem;       // one staged column: 256 bytes
  static constexpr int kBytes = kCols * kColBytes;      // 16 KB
  static constexpr int kWarps = 8;

  // Shared address of element (row m, column n): vector m / 8 of column n, swizzled.
  FUSEGEMM_DEVICE static uint32_t at(uint32_t buf, int m, int n) {
    return buf + n * kColBytes + (((m >> 3) ^ (n & 7)) << 4) + (m & 7) * kElem;
  }
  // Four 8 x 8 fragment matrices of packed 16-bit pairs, transposed into their staged columns
  // (lane 8 i + j: the address of column j of matrix i).
  FUSEGEMM_DEVICE static void put_trans4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
    stmatrix_trans_x4(addr, r0, r1, r2, r3);
  }
  // Warp `warp`'s eight columns 8 warp.. (those below cols_valid): column n to gbase + n * ld,
  // lanes 0-15 one column and 16-31 the next, 16 bytes each.
  FUSEGEMM_DEVICE static void flush(uint32_t buf, T* gbase, int64_t ld, int cols_valid, int warp, int lane) {
    const int v = lane & 15;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int n = 8 * warp + 2 * i + (lane >> 4);
      if (n < cols_valid) {
        st_global_v4(gbase + n * ld + v * (16 / kElem), ld_shared_v4(buf + n * kColBytes + ((v ^ (n & 7)) << 4)));
      }
    }
  }
};

// ---------------------------------------------------------------------------------------
// Fragment block store: one warp stages 16 rows x 32 columns of one output (a WGMMA fragment's
// block of the sm_90a frag_blocks path) and writes them as 16-byte vectors, 64 (2-byte T) or 128
// (4-byte T) contiguous bytes per row. The pitch keeps the fragment's pair stores conflict-free:
// 8 rows of 4 lanes start 20 banks apart (2-byte: 80-byte pitch) or, per half-warp of 8-byte
// stores, 8 banks apart (4-byte: 160-byte pitch).
// ---------------------------------------------------------------------------------------
template <class T>
struct FragBlockStore {
  static constexpr int kElem = Cvt<T>::kBytes;
  static constexpr int kRowBytes = 32 * kElem;
  static constexpr int kPitch = kRowBytes + (kElem == 2 ? 16 : 32);
  static constexpr int kBytes = 16 * kPitch;
  static constexpr int kVecPerRow = kRowBytes / 16;
  static constexpr int kVecPerLane = 16 * kVecPerRow / 32;
  static_assert(kElem == 2 || kElem == 4, "16- and 32-bit outputs");

  FUSEGEMM_DEVICE static void put(uint32_t buf, int row, int col, float a, float b) {
    st_shared2<T>(buf + row * kPitch + col * kElem, a, b);
  }

  // gbase: element (row 0, col 0) of the block; columns >= cols_valid are skipped (per 16-byte
  // vector: N keeps 16-byte granularity, as for every staged store).
  FUSEGEMM_DEVICE static void flush(uint32_t buf, T* gbase, int64_t ld, int cols_valid, int lane) {
#pragma unroll
    for (int i = 0; i < kVecPerLane; ++i) {
      const int v = lane + 32 * i;
      const int row = v / kVecPerRow, seg = v % kVecPerRow, col = seg * (16 / kElem);
      if (col < cols_valid) {
        uint4 val;
        asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(val.x), "=r"(val.y), "=r"(val.z), "=r"(val.w)
                     : "r"(buf + row * kPitch + seg * 16)
                     : "memory");
        st_global_v4(gbase + row * ld + col, val);
      }
    }
  }
};

}  // namespace epi
}  // namespace fusegemm
