// fusegemm common definitions shared by every generated kernel (sm_90a and sm_100a).
#pragma once

#include "fusegemm/types.cuh"  // element tags and traits (not cute/tensor.hpp: see there)

// NVRTC cannot parse cuda.h, so the tensor-map type is declared here, with CUDA 13's
// alignment (cuda.h: alignas(128)). The bytes are produced on the host by
// cuTensorMapEncodeTiled (runtime/tensormap.py) and passed inside the __grid_constant__
// parameter struct.
#ifndef FUSEGEMM_CUTENSORMAP_DECLARED
#define FUSEGEMM_CUTENSORMAP_DECLARED
struct alignas(128) CUtensorMap {
  unsigned long long opaque[16];
};
#endif
static_assert(sizeof(CUtensorMap) == 128, "CUtensorMap must be 128 bytes");

#define FUSEGEMM_DEVICE __device__ __forceinline__

namespace fusegemm {

template <class T>
FUSEGEMM_DEVICE T ceil_div(T a, T b) { return (a + b - 1) / b; }

// bfloat16 bits to FP32: a bfloat16 is the upper half of an FP32, so the conversion is a shift
// (the low half of a 32-bit pair, or a lone value's 16 bits) or a mask (the high half), exact.
// One definition for every kernel that reads bfloat16 pairs (the epilogues' inputs, the
// quantization and permutation kernels): the intrinsic __bfloat1622float2 compiled its high
// half to a PRMT and a shift, one instruction more per pair.
FUSEGEMM_DEVICE float bf16_bits_to_f32(uint32_t h) { return __uint_as_float(h << 16); }
FUSEGEMM_DEVICE void bf16x2_to_f32(uint32_t u, float& lo, float& hi) {
  lo = __uint_as_float(u << 16);
  hi = __uint_as_float(u & 0xFFFF0000u);
}

// Config::kDMajorM (an M-major D: the K-grouped weight gradient's cd_major m, both archs), false
// where the generated Config does not declare it.
template <class C>
constexpr auto d_major_m_of(int) -> decltype(C::kDMajorM, bool()) { return C::kDMajorM; }
template <class C>
constexpr bool d_major_m_of(long) { return false; }

// Every padded_offsets value is a multiple of this (seed contract: m_aligned == 256).
constexpr int kMAligned = 256;

// The first row of expert e's padded range [offsets[e-1], offsets[e]) (offsets: padded_offsets,
// cumulative ends, on the device).
FUSEGEMM_DEVICE int expert_first_row(const int* offsets, int e) { return e == 0 ? 0 : __ldg(offsets + e - 1); }

// fl(t / s), correctly rounded, for a quantization scale s (finite, normal: at least
// 1e-4 / 57344) and t / s within an element format's range, with r = scale_reciprocal(s) computed
// once per scale: the quotient and one FMA correction (Markstein's theorem), as div.rn.f32's fast
// path does, without its range check and slow-path call, which made every division a branch
// region the compiler would not schedule across. A subnormal t gives a quotient below 1e-30,
// which every FP8 format rounds to zero either way. The residual is formed negated, s q - t, and
// subtracted (FFMA's operand negation, no instruction): round-to-nearest is symmetric, so that is
// the textbook step t - s q bit for bit, except that an exact zero residual (+0 either way) now
// keeps the sign of q, so -0 / s gives -0 as div.rn, numpy and torch do, with no copysign
// (one instruction of four per value in the quantization kernels). Callers send an Inf or NaN
// scale to div.rn or through ScaleDivisor.
FUSEGEMM_DEVICE float scale_reciprocal(float s) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(s));
  return __fmaf_rn(__fmaf_rn(-s, r, 1.0f), r, r);
}
FUSEGEMM_DEVICE float div_by_scale(float t, float s, float r) {
  const float q = __fmul_rn(t, r);
  return __fmaf_rn(-__fmaf_rn(s, q, -t), r, q);
}

// What fl(t / s) divides by for a quantization scale s that an Inf or NaN in its group made Inf
// or NaN: div(t) = div_by_scale(t, d, r) is t / s exactly in every case, with no branch per value
// (div.rn's range check and slow-path call per value, or a select between two paths, cost the
// quantization kernels and the 1x128 epilogue issue slots). s finite: d = s, r = 1 / s. s = Inf:
// d = r = 0, so the steps give t * 0 + t * 0 (+-0 for finite t, NaN for an infinite one: t / Inf).
// s = NaN: r = NaN, so NaN (every FP8 format has one NaN code per sign; cvt gives it either way).
struct ScaleDivisor {
  float d = 1.0f, r = 1.0f;
  ScaleDivisor() = default;
  FUSEGEMM_DEVICE explicit ScaleDivisor(float s)
      : d(isfinite(s) ? s : 0.0f), r(isfinite(s) ? scale_reciprocal(s) : (isnan(s) ? s : 0.0f)) {}
  FUSEGEMM_DEVICE float div(float t) const { return div_by_scale(t, d, r); }
};

// fl(x / m) for an FP8 element maximum m (448 or 57344) with its correctly rounded reciprocal rm
// (a constant), and x >= 1e-4 (a clamped amax), +Inf or NaN: a scale's division, correctly
// rounded by div_by_scale; +Inf gives +Inf, NaN gives NaN.
FUSEGEMM_DEVICE float div_by_elem_max(float x, float m, float rm) {
  return x == __int_as_float(0x7F800000) ? x : div_by_scale(x, m, rm);
}

// 16 bytes global -> shared; zero-filled when !valid (src is then never read).
FUSEGEMM_DEVICE void cp_async_16_zfill(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0)
               : "memory");
}

// 4 bytes global -> shared (through L1: cp.async takes .cg for 16 bytes only); zero-filled when !valid.
FUSEGEMM_DEVICE void cp_async_4_zfill(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 4 : 0)
               : "memory");
}

// Commit this thread's cp.async operations issued since the last commit as one group; wait
// until every group but the kNewest newest (or every group) has landed.
FUSEGEMM_DEVICE void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int kNewest>
FUSEGEMM_DEVICE void cp_async_wait_all_but() { asm volatile("cp.async.wait_group %0;\n" ::"n"(kNewest) : "memory"); }
FUSEGEMM_DEVICE void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

}  // namespace fusegemm
