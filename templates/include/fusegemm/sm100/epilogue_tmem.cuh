// sm_100a accumulator drain: TMEM -> registers -> warp-staged row stores.
//
// The accumulator of a 128-row CTA tile lives in TMEM lane r = tile row r (TRA:520-527); with
// tcgen05.ld.32x32b each thread of epilogue warp w receives consecutive FP32 columns of row
// 32*(w%4) + lane. The per-element math is the arch-neutral rule of fusegemm/epilogue.cuh; the
// global writes go through its WarpStagedStore (full 16-byte vectors of contiguous row
// segments), fed here with one 16-byte st.shared per 16 bytes of a thread's row.
#pragma once

#include <cuda_fp4.h>
#include <cuda_fp8.h>

#include "fusegemm/epilogue.cuh"
#include "fusegemm/sm100/tmem.cuh"

namespace fusegemm::sm100 {

constexpr int kEpiChunkCols = 32;  // columns per tcgen05.ld (32x32b.x32)

// Staging bytes one epilogue warp needs for outputs of type T (32 rows).
template <class T>
constexpr int staging_bytes() {
  return epi::WarpStagedStore<T, 32>::kBytes;
}

// Convert 32 values of one row to T and deposit them at `col0` (element offset inside the
// 128-byte staged segment) of row `lane`: 16-byte shared stores, conflict-free for 2-byte T.
template <class T>
FUSEGEMM_DEVICE void stage_row32(uint32_t buf, int lane, int col0, const float (&v)[32]) {
  using S = epi::WarpStagedStore<T, 32>;
  uint32_t row = buf + lane * S::kPitch + col0 * S::kElem;
  if constexpr (S::kElem == 4) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};"
                   ::"r"(row + 16 * i), "f"(v[4 * i]), "f"(v[4 * i + 1]), "f"(v[4 * i + 2]),
                     "f"(v[4 * i + 3]) : "memory");
    }
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};"
                   ::"r"(row + 16 * i), "r"(epi::Cvt<T>::pack2(v[8 * i], v[8 * i + 1])),
                     "r"(epi::Cvt<T>::pack2(v[8 * i + 2], v[8 * i + 3])),
                     "r"(epi::Cvt<T>::pack2(v[8 * i + 4], v[8 * i + 5])),
                     "r"(epi::Cvt<T>::pack2(v[8 * i + 6], v[8 * i + 7])) : "memory");
    }
  }
}

// Write one 32-row x 32-column block of one output. `gbase` = element (row 0 of the warp,
// col 0 of the chunk); rows of the warp >= `rows_valid` and columns >= `cols_valid` are not
// written (cols_valid must keep 16-byte granularity: N % 8 == 0, the epilogue.cuh contract).
template <class T>
FUSEGEMM_DEVICE void store_block32(uint32_t buf, T* gbase, int64_t ld, int cols_valid,
                                   int rows_valid, int lane, const float (&v)[32]) {
  using S = epi::WarpStagedStore<T, 32>;
  static_assert(S::kCols >= kEpiChunkCols, "a chunk fits one staged segment");
  stage_row32<T>(buf, lane, 0, v);
  __syncwarp();
  if (rows_valid >= 32) {
    S::flush(buf, gbase, ld, cols_valid < kEpiChunkCols ? cols_valid : kEpiChunkCols, lane);
  } else {
    // M=64 tiles: only the first `rows_valid` rows of the warp are real (16 per warp).
#pragma unroll
    for (int i = 0; i < S::kVecPerLane; ++i) {
      int vi = lane + 32 * i;
      int r = vi / S::kVecPerRow, seg = vi % S::kVecPerRow, col = seg * (16 / S::kElem);
      if (r < rows_valid && col < cols_valid && col < kEpiChunkCols) {
        uint4 val;
        asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(val.x), "=r"(val.y), "=r"(val.z), "=r"(val.w)
                     : "r"(buf + r * S::kPitch + seg * 16) : "memory");
        *reinterpret_cast<uint4*>(gbase + r * ld + col) = val;
      }
    }
  }
  __syncwarp();  // the buffer is reused by the next block
}

// ---- narrow outputs (FP8, packed FP4) and M-major outputs: direct stores, no staging --------
template <class T> constexpr int out_bits() {
  return cute::is_same_v<T, cutlass::float_e2m1_t> ? 4
         : (cute::is_same_v<T, cutlass::float_e4m3_t> || cute::is_same_v<T, cutlass::float_e5m2_t>) ? 8
         : int(sizeof(T)) * 8;
}
template <class T> constexpr bool is_narrow() { return out_bits<T>() < 16; }

// Two values -> two FP8 bytes (a in the low byte) / one FP4 byte (a in the low nibble), round to
// nearest, saturating to the finite range (cuda_fp8.h / cuda_fp4.h; CUTLASS's default too).
template <class T> FUSEGEMM_DEVICE uint32_t cvt_narrow2(float a, float b) {
  if constexpr (cute::is_same_v<T, cutlass::float_e2m1_t>) {
    return __nv_cvt_float2_to_fp4x2(make_float2(a, b), __NV_E2M1, cudaRoundNearest);
  } else {
    return __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE,
                                    cute::is_same_v<T, cutlass::float_e5m2_t> ? __NV_E5M2 : __NV_E4M3);
  }
}

// One thread's 32 values of a row, N-major, at byte address `dst` (element col0 of the row).
template <class T>
FUSEGEMM_DEVICE void store_row32_narrow(uint8_t* dst, int cols_valid, const float (&v)[32]) {
  constexpr int kBits = out_bits<T>(), kWords = kBits;  // 32 values x kBits / 32
  uint32_t w[kWords];
#pragma unroll
  for (int i = 0; i < kWords; ++i) {
    if constexpr (kBits == 8) {
      w[i] = cvt_narrow2<T>(v[4 * i], v[4 * i + 1]) | (cvt_narrow2<T>(v[4 * i + 2], v[4 * i + 3]) << 16);
    } else {
      w[i] = 0;
#pragma unroll
      for (int j = 0; j < 4; ++j) w[i] |= cvt_narrow2<T>(v[8 * i + 2 * j], v[8 * i + 2 * j + 1]) << (8 * j);
    }
  }
  if (cols_valid >= 32 && (reinterpret_cast<uintptr_t>(dst) & 15) == 0) {
#pragma unroll
    for (int i = 0; i < kWords / 4; ++i) {
      *reinterpret_cast<uint4*>(dst + 16 * i) = make_uint4(w[4 * i], w[4 * i + 1], w[4 * i + 2], w[4 * i + 3]);
    }
  } else {
    const int bytes = (min(cols_valid, 32) * kBits + 7) / 8;
#pragma unroll
    for (int j = 0; j < 4 * kWords; ++j) {
      if (j < bytes) dst[j] = uint8_t(w[j / 4] >> (8 * (j % 4)));
    }
  }
}

// M-major output: element (r, c) at base[c * ld + r]. Lane = row, so each column is one
// coalesced warp store of 32 consecutive elements.
template <class T>
FUSEGEMM_DEVICE void store_col32(T* base_row0, int64_t ld, int cols_valid, bool row_valid, const float (&v)[32]) {
  if (!row_valid) return;
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    if (j < cols_valid) {
      if constexpr (is_narrow<T>()) {
        reinterpret_cast<uint8_t*>(base_row0)[j * ld] = uint8_t(cvt_narrow2<T>(v[j], 0.0f));
      } else {
        base_row0[j * ld] = T(v[j]);
      }
    }
  }
}

FUSEGEMM_DEVICE void tmem_load_chunk(uint32_t taddr, bool zero, float (&acc)[32]) {
  uint32_t raw[32];
  tmem_ld_32x32b_x32(taddr, raw);
  tmem_wait_ld();
#pragma unroll
  for (int i = 0; i < 32; ++i) acc[i] = zero ? 0.0f : __uint_as_float(raw[i]);
}

}  // namespace fusegemm::sm100
