// Element-type tags and the few type traits the kernels use, without CuTe's or CUTLASS's
// numeric headers.
//
// Why not <cute/tensor.hpp> / <cutlass/numeric_types.h>: the kernels use those headers only to
// name element types (as template tags: never as values) and for is_same / conditional /
// integer_sequence. Parsing them was most of a cold compile (NVRTC front end, measured on the
// 2-core CPU machine: cute/tensor.hpp 1.67 s, cutlass/numeric_types.h 0.66 s, each of
// cute/util/type_traits.hpp and cute/numeric/integer_sequence.hpp 0.6-0.8 s through libcu++;
// the whole sm_90a grouped GEMM compiled in 2.4 s, 1.7 s of it front end).
// The tags carry storage of the element's width, so sizeof and pointer arithmetic on
// ElementC* / ElementD* stay those of the real element (2 bytes for bf16, 1 for FP8...).
#pragma once

#include <cuda/std/cstdint>

namespace fusegemm {

// Tags, not numbers: constructing one from a value does not compile (a float would otherwise
// convert to the storage integer); conversions go through epilogue.cuh's Cvt<T>.
#define FUSEGEMM_ELEMENT_TAG(name, storage_t)      \
  struct name {                                    \
    storage_t storage;                             \
    name() = default;                              \
    template <class U> name(U) = delete;           \
  }
FUSEGEMM_ELEMENT_TAG(bfloat16_t, uint16_t);
FUSEGEMM_ELEMENT_TAG(half_t, uint16_t);
FUSEGEMM_ELEMENT_TAG(float_e4m3_t, uint8_t);
FUSEGEMM_ELEMENT_TAG(float_e5m2_t, uint8_t);
FUSEGEMM_ELEMENT_TAG(float_ue8m0_t, uint8_t);
FUSEGEMM_ELEMENT_TAG(float_ue4m3_t, uint8_t);
FUSEGEMM_ELEMENT_TAG(float_e2m1_t, uint8_t);  // two values per byte (packed FP4)
#undef FUSEGEMM_ELEMENT_TAG

template <class A, class B> inline constexpr bool is_same_v = false;
template <class A> inline constexpr bool is_same_v<A, A> = true;

template <bool kCond, class T, class F> struct conditional { using type = T; };
template <class T, class F> struct conditional<false, T, F> { using type = F; };
template <bool kCond, class T, class F> using conditional_t = typename conditional<kCond, T, F>::type;

template <class T, T... I> struct integer_sequence {};
// 0 .. N-1 by doubling: log2(N) instantiations deep (accumulator fragments reach N = 128).
template <class S1, class S2> struct concat_sequence;
template <class T, T... I, T... J>
struct concat_sequence<integer_sequence<T, I...>, integer_sequence<T, J...>> {
  using type = integer_sequence<T, I..., (sizeof...(I) + J)...>;
};
template <class T, int N> struct make_sequence {
  using type = typename concat_sequence<typename make_sequence<T, N / 2>::type,
                                        typename make_sequence<T, N - N / 2>::type>::type;
};
template <class T> struct make_sequence<T, 0> { using type = integer_sequence<T>; };
template <class T> struct make_sequence<T, 1> { using type = integer_sequence<T, 0>; };
template <class T, int N> using make_integer_sequence = typename make_sequence<T, N>::type;

}  // namespace fusegemm
