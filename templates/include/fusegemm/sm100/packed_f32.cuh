// Packed FP32 arithmetic for the vector_f32 epilogue (sm_100a): the operations a generated rule's
// apply2() (templates/rule.cu.j2, generator/emit.py) spells on a pair of accumulator columns.
//
// Blackwell executes two FP32 lanes per instruction: FADD2 / FMUL2 / FFMA2 (PTX add / mul / fma
// .rn.f32x2, CUDA's __fadd2_rn / __fmul2_rn / __ffma2_rn on float2). Each lane of a packed
// instruction is the same IEEE-754 operation, correctly rounded to nearest even, as the scalar
// intrinsic the unpacked rule uses on that column (__fadd_rn, __fmul_rn, __fmaf_rn: add, mul,
// fma .rn.f32, one rounding each, subnormals kept since neither side uses .ftz, never contracted
// by the compiler), so a packed rule gives the unpacked rule's bits, lane by lane. Subtraction is
// the packed add of the negated operand: scalar sub.rn.f32 is itself FADD a, -b (IEEE defines
// a - b as a + (-b)), and ptxas spells both the same way. Everything without a packed
// instruction (division, the math library, comparisons, selects) runs per lane through map() and
// select() with the scalar rule's own expression. Hopper has no packed FP32: its kernels never
// include this header (the registry records that sm_90a runs vector_f32 with scalar math).
#pragma once

#include "fusegemm/common.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 1000
#error "fusegemm/sm100/packed_f32.cuh: packed FP32 (FADD2/FMUL2/FFMA2) needs sm_100 or newer"
#endif

namespace fusegemm::f32x2 {

// Both lanes from one value (a per-expert, per-row or constant operand of both columns).
FUSEGEMM_DEVICE float2 splat(float x) { return make_float2(x, x); }
// Lane 0 from column i, lane 1 from column i + 1 (a per-column or per-element operand).
FUSEGEMM_DEVICE float2 pair(float x0, float x1) { return make_float2(x0, x1); }

FUSEGEMM_DEVICE float2 add(float2 a, float2 b) { return __fadd2_rn(a, b); }
FUSEGEMM_DEVICE float2 mul(float2 a, float2 b) { return __fmul2_rn(a, b); }
FUSEGEMM_DEVICE float2 fma(float2 a, float2 b, float2 c) { return __ffma2_rn(a, b, c); }
FUSEGEMM_DEVICE float2 neg(float2 a) { return make_float2(-a.x, -a.y); }   // sign flips: exact
FUSEGEMM_DEVICE float2 sub(float2 a, float2 b) { return __fadd2_rn(a, neg(b)); }
FUSEGEMM_DEVICE float2 square(float2 a) { return __fmul2_rn(a, a); }

// A scalar operation on each lane: f(a.x, b.x, ...) and f(a.y, b.y, ...).
template <class F, class... A>
FUSEGEMM_DEVICE float2 map(F f, A... a) { return make_float2(f(a.x...), f(a.y...)); }

// where(): each lane picks by its own condition.
FUSEGEMM_DEVICE float2 select(bool c0, bool c1, float2 a, float2 b) {
  return make_float2(c0 ? a.x : b.x, c1 ? a.y : b.y);
}

}  // namespace fusegemm::f32x2
