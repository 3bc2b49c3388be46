// The epilogue engine: one warp turns a block of 32 rows x 32 columns of accumulators into every
// output, SFD scale, reduction and store of a generated rule (fusegemm/epilogue.cuh, rule.cu.j2).
//
// Ownership: lane l holds row row0 + l and, for that row, the accumulator columns of 32
// consecutive element columns j0 .. j0+31 (64 values when the rule pairs the accumulator: the
// gate block, then the up block). That is the sm_100a TMEM layout (tcgen05.ld 32x32b), the
// layout the sm_90a kernel stages its WGMMA fragments into for rules that quantize, pair or
// reduce, and the layout the epilogue harness loads from global memory: all three run this
// code, so what the harness checks on the H200 is what runs on Blackwell.
//
// Per block, in order: the rule's row inputs and element inputs, apply(); C; D (row SFD: one
// scale per lane's 32 values; column SFD: one scale per column over the warp's 32 rows);
// amax (NaN-propagating max of |x|, one atomic per warp); row sums (one atomic per row); column
// sums (one atomic per column and warp; a paired output's: one per stored column, both roles).
// Bit-level SFD rules: notes/sfd-semantics.md and fusegemm/reference/_epilogue.py, which the
// functions below follow step by step (round-up E8M0, exact power-of-two reciprocal with the
// rcp.approx.ftz flushes, FLT_MAX clamp, fl(x * scale), cvt.rn.satfinite).
#pragma once

#include "fusegemm/epilogue.cuh"

namespace fusegemm {
namespace epi {

constexpr int kBlockCols = 32;     // columns per block (one SFD_row block)
constexpr float kFltMax = 3.402823466e+38f;

// ---- SFD ------------------------------------------------------------------------------
// E8M0 byte of s rounded up (cvt.rp[.satfinite].ue8m0x2.f32): ceil(log2 s) + 127, 0x00 for
// s <= 2^-127 (zero included), 0xFF for NaN, and for s > 2^127: 0xFE with satfinite, else 0xFF.
FUSEGEMM_DEVICE uint32_t e8m0_up(float s, bool satfinite) {
  const uint32_t bits = __float_as_uint(s) & 0x7FFFFFFFu;
  if (bits > 0x7F800000u) return 0xFFu;
  const uint32_t e = bits >> 23, m = bits & 0x7FFFFFu;
  if (e == 0xFFu) return satfinite ? 0xFEu : 0xFFu;
  if (e == 0) return m > (1u << 22) ? 1u : 0u;
  const uint32_t b = e + (m != 0 ? 1u : 0u);
  return b > 254u ? (satfinite ? 0xFEu : 0xFFu) : b;
}

// rcp.approx.ftz of the decoded byte: 0x00 decodes to 2^-127 (subnormal, flushed: +Inf), 0xFF
// is NaN, 0xFE is 2^127 (its reciprocal 2^-127 is subnormal: flushed to 0), else 2^(127 - b).
FUSEGEMM_DEVICE float sfd_rcp(uint32_t b) {
  if (b == 0) return __uint_as_float(0x7F800000u);
  if (b == 0xFFu) return __uint_as_float(0x7FFFFFFFu);
  if (b == 0xFEu) return 0.0f;
  return __uint_as_float((254u - b) << 23);
}

struct Sfd {
  uint32_t stored;   // the byte written to SFD
  float scale;       // what the block's values are multiplied by before conversion
};

// One block's scale from a = max|x| (conventions: 0 quant, 1 srelu, 2 dswiglu; kCol: the
// column path, which srelu and dswiglu associate and clamp differently).
template <int kConv, bool kCol>
FUSEGEMM_DEVICE Sfd sfd_block(float a, float nc, float rl) {
  constexpr bool kAlt = kCol && kConv != 0;
  const float s = kAlt ? __fmul_rn(a, __fmul_rn(rl, nc)) : __fmul_rn(__fmul_rn(a, rl), nc);
  const float r = sfd_rcp(e8m0_up(s, kConv != 0));
  const float scale = kAlt ? __fmul_rn(nc, fmin_nan(r, kFltMax)) : fmin_nan(__fmul_rn(nc, r), kFltMax);
  return Sfd{e8m0_up(s, kConv == 2), scale};
}

// Byte offset of logical scale (mn, k) in the 32x4x4 atom layout of an (MN, K) scale tensor
// with kt = ceil(K / 4) atoms along K (formats/scales.py pack_sf).
FUSEGEMM_DEVICE int64_t sf_atom_offset(int mn, int k, int kt) {
  return (int64_t(mn >> 7) * kt + (k >> 2)) * 512 + (mn & 31) * 16 + ((mn >> 5) & 3) * 4 + (k & 3);
}

// NaN-propagating max of |x| over a warp's lanes (|x| bits order as unsigned ints, NaN above Inf).
FUSEGEMM_DEVICE float warp_amax(float x) {
  return __uint_as_float(__reduce_max_sync(0xFFFFFFFFu, __float_as_uint(fabsf(x))));
}

// max|v[i]| of a lane's 32 values, NaN if one is NaN (the SFD block scale's argument).
// FUSEGEMM_ENGINE_AMAX_TREE=1: a tree of max.NaN (FMNMX.NAN, |x| folded into the operands),
// depth 5 and 31 instructions, where the chain of fmax_nan is 32 deep at three instructions
// each. The maximum of non-negative values does not depend on the order; a NaN comes out as
// the canonical NaN instead of the first NaN's payload, and every use of the result (E8M0 byte
// 0xFF, scale NaN, values NaN) is the same for any NaN. H200, alone (bench/results/
// blockscaled_h200_engine_switches.json: dsv3-fc2, dsv3-fc1): quant 1.02-1.09x the chain's speed,
// sReLU with FP8 D 1.00-1.08x, dSwiGLU 0.98-1.01x; with the branch-free engine as
// FUSEGEMM_ENGINE_BRANCHLESS records. 0 is the baseline, an A/B switch through FUSEGEMM_NVRTC_EXTRA.
#ifndef FUSEGEMM_ENGINE_AMAX_TREE
#define FUSEGEMM_ENGINE_AMAX_TREE 1
#endif
FUSEGEMM_DEVICE float max_nan_abs(float a, float b) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(fabsf(a)), "f"(fabsf(b)));
  return r;
}
FUSEGEMM_DEVICE float row_amax32(const float (&v)[32]) {
#if FUSEGEMM_ENGINE_AMAX_TREE
  float m[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) m[i] = max_nan_abs(v[i], v[i + 16]);
#pragma unroll
  for (int i = 0; i < 8; ++i) m[i] = max_nan_abs(m[i], m[i + 8]);   // (strides written out: a
#pragma unroll                                                        // halving loop stayed rolled
  for (int i = 0; i < 4; ++i) m[i] = max_nan_abs(m[i], m[i + 4]);   // and put m[] in local memory)
  return max_nan_abs(max_nan_abs(m[0], m[2]), max_nan_abs(m[1], m[3]));
#else
  float a = 0.0f;
#pragma unroll
  for (int i = 0; i < 32; ++i) a = fmax_nan(a, fabsf(v[i]));
  return a;
#endif
}

// 1: SFD_col (quant, dSwiGLU, sReLU with FP8 D) reduces each column's max and hands out the
// column scales through a warp's shared-memory buffer (col_amax_smem, scale_cols_smem) instead of
// 32 warp reductions (REDUX) and 32 shuffles per block. The buffer: the sm_90a engine path's
// staged rows of the warp, free once the rule has read them; elsewhere (sm_100a, the harness) the
// caller's staging buffer, BlockEngine::kScratchBytes. 0: the reductions and shuffles. Same
// bytes. Not the default: on the H200 (bench/results/blockscaled_h200_engine_switches*.json) it
// ran quant 1.03-1.11x faster alone and 0.99-1.05x over the branch-free engine, but dSwiGLU
// 0.84-0.91x alone and 0.97-1.03x over it. An A/B switch through FUSEGEMM_NVRTC_EXTRA.
#ifndef FUSEGEMM_ENGINE_COL_SMEM
#define FUSEGEMM_ENGINE_COL_SMEM 0
#endif
// `buf` holds 32 rows of kColPitch floats. col_amax_smem: max|x| of column `lane` over the warp's
// 32 rows (lane = row): each lane writes its row, then reads its column (33-float rows: both
// directions conflict-free), four maxima chains of max.NaN. 64 shared-memory accesses and 32
// FMNMX where the warp reductions take 32 REDUX, 32 |x| and 64 moves and selects; the maximum of
// non-negative values does not depend on the order, and a NaN gives the SFD byte and scale any
// NaN gives.
constexpr int kColPitch = 33;
FUSEGEMM_DEVICE float col_amax_smem(const float (&v)[32], uint32_t buf, int lane) {
  __syncwarp();   // earlier readers of the buffer are done
  const uint32_t row = buf + 4u * kColPitch * lane;
#pragma unroll
  for (int i = 0; i < 32; ++i) asm volatile("st.shared.f32 [%0], %1;" ::"r"(row + 4 * i), "f"(v[i]) : "memory");
  __syncwarp();
  float m[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
  for (int r = 0; r < 32; ++r) {
    float x;
    asm volatile("ld.shared.f32 %0, [%1];" : "=f"(x) : "r"(buf + 4u * (kColPitch * r + lane)) : "memory");
    m[r & 3] = max_nan_abs(m[r & 3], x);
  }
  return max_nan_abs(max_nan_abs(m[0], m[1]), max_nan_abs(m[2], m[3]));
}
// y[i] = v[i] * the scale of column i, each lane holding its column's `scale`: the 32 scales go
// through `buf` (one store each, read back by every lane as eight broadcast 16-byte loads) where
// the warp would shuffle each one to every lane.
FUSEGEMM_DEVICE void scale_cols_smem(const float (&v)[32], float scale, uint32_t buf, int lane, float (&y)[32]) {
  __syncwarp();   // the column reads are done
  asm volatile("st.shared.f32 [%0], %1;" ::"r"(buf + 4u * lane), "f"(scale) : "memory");
  __syncwarp();
#pragma unroll
  for (int q = 0; q < 8; ++q) {
    float s0, s1, s2, s3;
    asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(s0), "=f"(s1), "=f"(s2), "=f"(s3) : "r"(buf + 16u * q) : "memory");
    y[4 * q] = __fmul_rn(v[4 * q], s0);
    y[4 * q + 1] = __fmul_rn(v[4 * q + 1], s1);
    y[4 * q + 2] = __fmul_rn(v[4 * q + 2], s2);
    y[4 * q + 3] = __fmul_rn(v[4 * q + 3], s3);
  }
}

// Sum of x over a warp's lanes, every lane getting it (a butterfly of correctly rounded adds).
FUSEGEMM_DEVICE float warp_sum(float x) {
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) x = __fadd_rn(x, __shfl_xor_sync(0xFFFFFFFFu, x, d));
  return x;
}

// ---- stores -----------------------------------------------------------------------------
// Staging bytes one warp needs for 32 rows of a 16/32-bit output.
template <class T>
constexpr int staging_bytes() {
  if constexpr (is_narrow<T>()) {
    return 0;
  } else {
    return WarpStagedStore<T, 32>::kBytes;
  }
}

// Deposit 16 words (32 packed 2-byte values) at `col0` of row `lane` of the staging buffer:
// 16-byte shared stores, conflict-free.
template <class T>
FUSEGEMM_DEVICE void stage_words16(uint32_t buf, int lane, int col0, const uint32_t (&w)[16]) {
  using S = WarpStagedStore<T, 32>;
  const uint32_t row = S::at(buf, lane, col0);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};"
                 ::"r"(row + 16 * i), "r"(w[4 * i]), "r"(w[4 * i + 1]), "r"(w[4 * i + 2]), "r"(w[4 * i + 3])
                 : "memory");
  }
}

// Convert 32 values of one row to T and deposit them at `col0` (element offset inside the
// 128-byte staged segment) of row `lane`: 16-byte shared stores, conflict-free for 2-byte T.
template <class T>
FUSEGEMM_DEVICE void stage_row32(uint32_t buf, int lane, int col0, const float (&v)[32]) {
  using S = WarpStagedStore<T, 32>;
  if constexpr (S::kElem == 4) {
    const uint32_t row = S::at(buf, lane, col0);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};"
                   ::"r"(row + 16 * i), "f"(v[4 * i]), "f"(v[4 * i + 1]), "f"(v[4 * i + 2]),
                     "f"(v[4 * i + 3]) : "memory");
    }
  } else {
    uint32_t w[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) w[i] = Cvt<T>::pack2(v[2 * i], v[2 * i + 1]);
    stage_words16<T>(buf, lane, col0, w);
  }
}

// Write the warp's staged 32-row x 32-column block (full 16-byte row segments) to `gbase` =
// element (row 0 of the warp, col 0 of the block); rows >= `rows_valid` and columns >=
// `cols_valid` are not written (cols_valid keeps 16-byte granularity: N % 8 == 0).
template <class T>
FUSEGEMM_DEVICE void flush_block32(uint32_t buf, T* gbase, int64_t ld, int cols_valid, int rows_valid, int lane) {
  using S = WarpStagedStore<T, 32>;
  static_assert(S::kCols >= kBlockCols, "a block fits one staged segment");
  __syncwarp();
  if (rows_valid >= 32) {
    S::flush(buf, gbase, ld, cols_valid < kBlockCols ? cols_valid : kBlockCols, lane);
  } else {
#pragma unroll
    for (int i = 0; i < S::kVecPerLane; ++i) {
      int vi = lane + 32 * i;
      int r = vi / S::kVecPerRow, seg = vi % S::kVecPerRow, col = seg * (16 / S::kElem);
      if (r < rows_valid && col < cols_valid && col < kBlockCols) {
        uint4 val;
        asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(val.x), "=r"(val.y), "=r"(val.z), "=r"(val.w)
                     : "r"(buf + r * S::kPitch + seg * 16) : "memory");
        st_global_v4(gbase + r * ld + col, val);
      }
    }
  }
  __syncwarp();  // the buffer is reused by the next block
}

// One 32-row x 32-column block of a 16/32-bit output through the warp's staging buffer.
template <class T>
FUSEGEMM_DEVICE void store_block32(uint32_t buf, T* gbase, int64_t ld, int cols_valid,
                                   int rows_valid, int lane, const float (&v)[32]) {
  stage_row32<T>(buf, lane, 0, v);
  flush_block32<T>(buf, gbase, ld, cols_valid, rows_valid, lane);
}

// 32 values of a lane's row for an output of type T, as run_with collects them. A 16-bit output
// that is stored as computed (no SFD scaling) keeps them packed in pairs as they are produced:
// 16 registers instead of 32, which keeps the sm_90a engine path (next to a 128-register WGMMA
// fragment) free of spills when a rule writes two or three such blocks.
template <class T, bool kPack = false>
struct RowVals {
  float v[32];
  FUSEGEMM_DEVICE void set(int i, float x) { v[i] = x; }
};
template <class T>
struct RowVals<T, true> {
  uint32_t w[16];
  float pending;
  FUSEGEMM_DEVICE void set(int i, float x) {   // i is a compile-time constant (unrolled callers)
    if (i & 1) w[i >> 1] = Cvt<T>::pack2(pending, x); else pending = x;
  }
};

template <class T>
constexpr bool packable() {
  if constexpr (is_narrow<T>()) {
    return false;   // FP8/FP4 have no Cvt<T>::kBytes to ask
  } else {
    return Cvt<T>::kBytes == 2;
  }
}

// One lane's 32 values of a row of a narrow output (FP8 / packed FP4), N-major, at byte address
// `dst` (element col0 of the row): 16-byte stores when the whole block is in range.
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
      st_global_v4(dst + 16 * i, make_uint4(w[4 * i], w[4 * i + 1], w[4 * i + 2], w[4 * i + 3]));
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
      } else if constexpr (Cvt<T>::kBytes == 4) {
        reinterpret_cast<float*>(base_row0)[j * ld] = v[j];
      } else {
        reinterpret_cast<uint16_t*>(base_row0)[j * ld] = static_cast<uint16_t>(Cvt<T>::pack2(v[j], 0.0f));
      }
    }
  }
}

// One 32-row x 32-column block of an N-major output of type T (wide: staged; narrow: direct).
template <class T>
FUSEGEMM_DEVICE void store_nmajor(uint32_t stage, void* base, int64_t ld, int64_t row0, int row, bool row_valid,
                                  int col0, int cols_valid, int rows_valid, int lane, const float (&v)[32]) {
  if constexpr (is_narrow<T>()) {
    if (row_valid) {
      uint8_t* dst = static_cast<uint8_t*>(base) + ((int64_t(row) * ld + col0) * out_bits<T>()) / 8;
      store_row32_narrow<T>(dst, cols_valid, v);
    }
  } else {
    store_block32<T>(stage, static_cast<T*>(base) + row0 * ld + col0, ld, cols_valid, rows_valid, lane, v);
  }
}

// One block of an N-major output from run_with's values (packed or not).
template <class T, bool kPack>
FUSEGEMM_DEVICE void store_vals(uint32_t stage, void* base, int64_t ld, int64_t row0, int row, bool row_ok,
                                int col0, int cols_valid, int rows_valid, int lane, const RowVals<T, kPack>& x) {
  if constexpr (kPack) {
    stage_words16<T>(stage, lane, 0, x.w);
    flush_block32<T>(stage, static_cast<T*>(base) + row0 * ld + col0, ld, cols_valid, rows_valid, lane);
  } else {
    store_nmajor<T>(stage, base, ld, row0, row, row_ok, col0, cols_valid, rows_valid, lane, x.v);
  }
}

// One block of a 16/32-bit N-major output, scattered (d_scatter): lane l's row goes to output row
// out_row of lane l (< 0: not stored). Staged as store_vals; each 16-byte vector then goes to its
// row's place (WarpStagedStore::flush_rows, the rows' indices by shuffle from their lanes).
template <class T, bool kPack>
FUSEGEMM_DEVICE void store_vals_rows(uint32_t stage, void* base, int64_t ld, int out_row, int col0, int cols_valid,
                                     int lane, const RowVals<T, kPack>& x) {
  static_assert(!is_narrow<T>(), "scattered outputs are 16/32-bit (element-wise rules)");
  using S = WarpStagedStore<T, 32>;
  constexpr int kRowStep = 32 / S::kVecPerRow;
  if constexpr (kPack) {
    stage_words16<T>(stage, lane, 0, x.w);
  } else {
    stage_row32<T>(stage, lane, 0, x.v);
  }
  int rows[S::kVecPerLane];
#pragma unroll
  for (int i = 0; i < S::kVecPerLane; ++i) {
    rows[i] = __shfl_sync(0xFFFFFFFFu, out_row, lane / S::kVecPerRow + kRowStep * i);
  }
  __syncwarp();
  S::flush_rows(stage, static_cast<T*>(base) + col0, ld, rows, cols_valid < kBlockCols ? cols_valid : kBlockCols, lane);
  __syncwarp();   // the buffer is reused by the next block
}

// ---- the engine -------------------------------------------------------------------------
// Whether a rule has apply2(): a vector_f32 rule (rule.cu.j2 renders kPackedF32 and apply2 only
// for the kernels whose registry row lists vector_f32, i.e. sm_100a).
template <class R, class = void>
struct PackedF32 {
  static constexpr bool value = false;
};
template <class R>
struct PackedF32<R, decltype(void(R::kPackedF32))> {
  static constexpr bool value = R::kPackedF32;
};
template <class R>
FUSEGEMM_DEVICE constexpr bool packed_f32() { return PackedF32<R>::value; }

// Rule: the generated rule. ElementC/ElementD: output types (unused ones are ignored).
// kBatched: rows are per batch (gemm_amax): output row = batch * m_rows + row. kCMajorM: C is
// M-major. kDiscreteColSfd: SFD_col grouped by expert tile (formats/scales.py). kScatter:
// scattered outputs (d_scatter, element-wise rules): problem row r's C and D rows are stored at
// row p.d_index[r] of the outputs (an index outside [0, p.d_rows) stores nothing). kDMajorM: the
// K-grouped D is M-major (cd_major m: expert e's D_e^T, output row e * N + n holding column n's
// M values; element-wise rules storing D alone): lane = row, so each column's store is the warp's
// 32 consecutive rows, contiguous.
template <class Rule, class ElementC, class ElementD, bool kBatched = false, bool kCMajorM = false,
          bool kDiscreteColSfd = false, bool kScatter = false, bool kDMajorM = false>
struct BlockEngine {
  static_assert(!kScatter || (Rule::kElementwise && !kBatched && !kCMajorM),
                "scattered outputs: element-wise rules, grouped N-major outputs (registry.check_rule)");
  static_assert(!kDMajorM || (Rule::kElementwise && Rule::kHasD && !Rule::kHasC && !kBatched && !kScatter &&
                              !Rule::kPairedD),
                "an M-major D: element-wise rules storing D alone, K-grouped (registry.check_rule)");
  static constexpr bool kPaired = Rule::kPairedAcc;
  static constexpr bool kCMajor = kCMajorM;
  static constexpr int kAccVals = kPaired ? 64 : 32;
  static constexpr int kStageC = Rule::kHasC && !kCMajorM ? staging_bytes<ElementC>() : 0;
  static constexpr int kStageD = Rule::kHasD && !kDMajorM ? staging_bytes<ElementD>() : 0;
  // Staging bytes one warp needs (0 when every output is narrow or M-major).
  static constexpr int kStageBytes = kStageC > kStageD ? kStageC : kStageD;
  static constexpr bool kQuant = Rule::kQuantRowD || Rule::kQuantColD;
  // FUSEGEMM_ENGINE_COL_SMEM: SFD_col through a warp's buffer (run_with's col_buf; run() passes
  // `stage`, which C's stores are done with before D's blocks, so a caller sizes its per-warp
  // staging by kScratchBytes).
  static constexpr bool kColSmem = FUSEGEMM_ENGINE_COL_SMEM != 0 && Rule::kQuantColD;
  static constexpr int kColBytes = kColSmem ? 32 * kColPitch * 4 : 0;
  static constexpr int kScratchBytes = kStageBytes > kColBytes ? kStageBytes : kColBytes;
  // FUSEGEMM_ENGINE_BRANCHLESS, for rules whose element inputs sit in registers (run_with), and
  // without column sums (the BF16 dGLU with its bias gradient spilled 8 bytes branch-free).
  static constexpr bool kBranchless = FUSEGEMM_ENGINE_BRANCHLESS != 0 && Rule::ElemBlock::kInRegisters &&
                                      !packed_f32<Rule>() && !Rule::kColSum;
  // 16-bit outputs stored as computed collect packed pairs (RowVals); M-major C stays FP32.
  static constexpr bool kPackC = Rule::kHasC && !kCMajorM && packable<ElementC>();
  static constexpr bool kPackD = Rule::kHasD && !kQuant && !kDMajorM && packable<ElementD>();
  static_assert(!kQuant || is_narrow<ElementD>(), "SFD quantization needs an FP8/FP4 D");
  static_assert(!kQuant || !kBatched, "SFD outputs are grouped (seed 000-003) outputs");
  static_assert(!Rule::kHasD || !is_narrow<ElementD>() || kQuant || !Rule::kPairedD,
                "a paired FP8 D is SFD-quantized");

  // Column count of D (its 32-column blocks; paired D is twice the element space).
  FUSEGEMM_DEVICE static int d_width(int width) { return Rule::kPairedD ? 2 * width : width; }

  // Per-lane partial reductions a caller keeps across blocks and flushes: per tile (per-expert
  // amax, row sums: the rows and the expert are the tile's) or once at the end (global amax).
  struct Partials {
    float amax[Rule::kAmaxCount > 0 ? Rule::kAmaxCount : 1];
    float rowsum;
    FUSEGEMM_DEVICE void reset() {
#pragma unroll
      for (int k = 0; k < (Rule::kAmaxCount > 0 ? Rule::kAmaxCount : 1); ++k) amax[k] = 0.0f;
      rowsum = 0.0f;
    }
  };

  // One block. expert: the tile's expert (batch when kBatched). row0: the warp's first row (rows
  // of the problem; batched: of the batch). rows_valid: real rows of the warp (32, or fewer for
  // M=64 tiles and batch edges). j0: first element column (a multiple of 32). width: element
  // columns. part: this lane's running reductions.
  template <class P>
  FUSEGEMM_DEVICE static void run(const Rule& rule, const P& p, int expert, int row0, int rows_valid,
                                  int j0, int width, const float (&acc)[kAccVals], uint32_t stage, int lane,
                                  Partials& part) {
    run_with(rule, p, expert, row0, rows_valid, j0, width, [&](int i) { return acc[i]; }, stage, lane, part,
             stage);
  }

  // The same, reading accumulator value i (0 .. kAccVals-1) through acc_at(i): the sm_90a engine
  // path reads its shared-memory stage directly instead of holding a register copy next to the
  // WGMMA fragment. col_buf (kColSmem): the warp's kColBytes for SFD_col, which acc_at no longer
  // reads once the rule has run.
  template <class P, class AccAt>
  FUSEGEMM_DEVICE static void run_with(const Rule& rule, const P& p, int expert, int row0, int rows_valid,
                                       int j0, int width, const AccAt& acc_at, uint32_t stage, int lane,
                                       Partials& part, uint32_t col_buf) {
    const int row = row0 + lane;
    const bool row_ok = lane < rows_valid;
    const typename Rule::RowIn ri = rule.row(p, row_ok ? row : row0);
    typename Rule::ElemBlock eb;   // this row's element inputs for columns j0..j0+31
    rule.elem_block(p, row_ok ? row : row0, j0, width, eb);
    RowVals<ElementC, kPackC> vc0, vc1;
    RowVals<ElementD, kPackD> vd0, vd1;
    // Column sums (scope column): after the block, lane i holds column j0 + i's sum over the
    // warp's rows (colsum1: the second role's, when the sum is a paired output's). Each column's
    // values are summed across the warp as they are computed (a butterfly: every lane ends with
    // the sum), so no lane keeps 32 partials in registers.
    float colsum = 0.0f, colsum1 = 0.0f;
    // One column's results into the row vectors and the partial reductions, in column order.
    auto take = [&](int i, bool in, const typename Rule::Out& o) {
      if constexpr (Rule::kHasC && Rule::kPairedC) { vc0.set(i, in ? o.c0 : 0.0f); vc1.set(i, in ? o.c1 : 0.0f); }
      if constexpr (Rule::kHasC && !Rule::kPairedC) vc0.set(i, in ? o.c : 0.0f);
      if constexpr (Rule::kHasD && Rule::kPairedD) { vd0.set(i, in ? o.d0 : 0.0f); vd1.set(i, in ? o.d1 : 0.0f); }
      if constexpr (Rule::kHasD && !Rule::kPairedD) vd0.set(i, in ? o.d : 0.0f);
      if constexpr (Rule::kAmaxCount > 0) part.amax[0] = fmax_nan(part.amax[0], in ? fabsf(o.amax0) : 0.0f);
      if constexpr (Rule::kAmaxCount > 1) part.amax[1] = fmax_nan(part.amax[1], in ? fabsf(o.amax1) : 0.0f);
      if constexpr (Rule::kRowSum) part.rowsum = in ? __fadd_rn(part.rowsum, o.rowsum) : part.rowsum;
      if constexpr (Rule::kColSum && Rule::kPairedColSum) {
        const float v0 = warp_sum(in ? o.colsum0 : 0.0f), v1 = warp_sum(in ? o.colsum1 : 0.0f);
        if (lane == i) { colsum = v0; colsum1 = v1; }
      } else if constexpr (Rule::kColSum) {
        const float v = warp_sum(in ? o.colsum : 0.0f);
        if (lane == i) colsum = v;
      }
    };
    if constexpr (packed_f32<Rule>()) {
      // vector_f32 (sm_100a): columns i and i + 1 in one apply2(), packed FP32 arithmetic with
      // the scalar rule's bits (fusegemm/sm100/packed_f32.cuh). A pair whose second column is
      // past the row end takes the scalar apply() (it reads no input past the end).
#pragma unroll
      for (int i = 0; i < 32; i += 2) {
        const int j = j0 + i;
        const bool in0 = row_ok && j < width, in1 = row_ok && j + 1 < width;
        typename Rule::Out o0{}, o1{};
        if (in1) {
          rule.apply2(make_float2(acc_at(i), acc_at(i + 1)),
                      kPaired ? make_float2(acc_at(32 + i), acc_at(33 + i)) : make_float2(0.0f, 0.0f), ri,
                      rule.elem_at(p, eb, i, j), rule.elem_at(p, eb, i + 1, j + 1), o0, o1);
        } else if (in0) {
          o0 = rule.apply(acc_at(i), kPaired ? acc_at(32 + i) : 0.0f, ri, rule.elem_at(p, eb, i, j));
        }
        take(i, in0, o0);
        take(i + 1, in1, o1);
      }
    } else if constexpr (kBranchless) {
      // Every column applied, what lies outside masked by take(): no branch region per column.
      // Past the row end a column input reads the last column (jc) and an element input its
      // register, zero (Row32); the warp's rows past rows_valid read the staged values and row0's
      // inputs. apply() is pure, so the masked results cost time only on edge blocks. Rules
      // with 8- or 32-bit element inputs keep the branches: their per-column loads, hoisted out
      // of the unguarded loop, spilled (dSwiGLU with FP8 or FP32 C, sm_90a: 8 and 16 bytes).
      const int last = width - 1;   // >= j0: callers run blocks that start inside the row
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        const int j = j0 + i;
        const int jc = j < width ? j : last;
        take(i, row_ok && j < width,
             rule.apply(acc_at(i), kPaired ? acc_at(32 + i) : 0.0f, ri, rule.elem_at(p, eb, i, jc)));
      }
    } else {
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        const int j = j0 + i;
        const bool in = row_ok && j < width;
        typename Rule::Out o{};
        if (in) o = rule.apply(acc_at(i), kPaired ? acc_at(32 + i) : 0.0f, ri, rule.elem_at(p, eb, i, j));
        take(i, in, o);
      }
    }
    (void)vc1;
    (void)vd1;
    (void)colsum1;
    if constexpr (Rule::kColSum) {
      // One atomic per column and warp into the expert's row of dbias (zero-initialised by the
      // caller: the warps and tiles of an expert accumulate into it). The row is (W,), or (2W,)
      // for a paired output's sums: element column j's two roles at their columns of the
      // interleaved output, paired_col(j, 0) and paired_col(j, 1).
      static_assert(!kBatched, "column sums are grouped (per expert) reductions");
      if (rows_valid > 0 && j0 + lane < width && p.dbias != nullptr) {
        const int j = j0 + lane;
        if constexpr (Rule::kPairedColSum) {
          float* row = static_cast<float*>(p.dbias) + int64_t(expert) * (2 * width);
          atomicAdd(row + paired_col(j, 0), colsum);
          atomicAdd(row + paired_col(j, 1), colsum1);
        } else {
          atomicAdd(static_cast<float*>(p.dbias) + int64_t(expert) * width + j, colsum);
        }
      }
    }
    const int64_t orow0 = kBatched ? int64_t(expert) * p.m_rows + row0 : row0;
    // kScatter: the output row of this lane's row (the index read once per block; L1 serves the
    // tile's other blocks).
    int out_row = -1;
    if constexpr (kScatter) {
      const int to = row_ok && row < p.m_rows ? __ldg(static_cast<const int*>(p.d_index) + row) : -1;
      out_row = static_cast<unsigned>(to) < static_cast<unsigned>(p.d_rows) ? to : -1;
    }
    (void)out_row;
    if constexpr (Rule::kHasC) {
      if (p.c_out != nullptr) {
        if constexpr (kScatter) {
          store_vals_rows(stage, p.c_out, p.ldc, out_row, j0, width - j0, lane, vc0);
        } else if constexpr (Rule::kPairedC) {
          // Interleaved like a paired D: the first role's block at 2*j0, the second's 32 after it.
          static_assert(!kCMajorM && !kBatched, "a paired C is an N-major grouped output");
          const int cw = 2 * width;
          store_vals(stage, p.c_out, p.ldc, orow0, int(orow0) + lane, row_ok, 2 * j0, cw - 2 * j0,
                     rows_valid, lane, vc0);
          store_vals(stage, p.c_out, p.ldc, orow0, int(orow0) + lane, row_ok, 2 * j0 + 32,
                     cw - 2 * j0 - 32, rows_valid, lane, vc1);
        } else if constexpr (kCMajorM) {
          ElementC* base = static_cast<ElementC*>(p.c_out) +
                           (kBatched ? int64_t(expert) * p.n : 0) * p.ldc + row;
          store_col32<ElementC>(base + int64_t(j0) * p.ldc, p.ldc, width - j0, row_ok, vc0.v);
        } else {
          store_vals(stage, p.c_out, p.ldc, orow0, int(orow0) + lane, row_ok, j0, width - j0,
                     rows_valid, lane, vc0);
        }
      }
    }
    if constexpr (Rule::kHasD) {
      const int dw = d_width(width);
      if constexpr (kScatter) {
        if (dw - j0 > 0) store_vals_rows(stage, p.d_out, p.ldd, out_row, j0, dw - j0, lane, vd0);
      } else if constexpr (kDMajorM) {
        ElementD* base = static_cast<ElementD*>(p.d_out) + int64_t(expert) * p.n * p.ldd +
                         (row - expert * p.m_rows);
        store_col32<ElementD>(base + int64_t(j0) * p.ldd, p.ldd, dw - j0, row_ok, vd0.v);
      } else if constexpr (Rule::kPairedD) {
        d_block(rule, p, expert, row0, orow0, row_ok, rows_valid, 2 * j0, dw, vd0, stage, lane, col_buf);
        d_block(rule, p, expert, row0, orow0, row_ok, rows_valid, 2 * j0 + 32, dw, vd1, stage, lane, col_buf);
      } else {
        d_block(rule, p, expert, row0, orow0, row_ok, rows_valid, j0, dw, vd0, stage, lane, col_buf);
      }
    }
  }

  // End of a tile: the row sums (one atomic per row) and the per-expert amax (one atomic per
  // warp and reduction); both restart. Every lane of the warp calls it.
  template <class P>
  FUSEGEMM_DEVICE static void flush_tile(Partials& part, const P& p, int expert, int row0, int rows_valid, int lane) {
    if constexpr (Rule::kRowSum) {
      if (lane < rows_valid && p.dprob != nullptr) atomicAdd(static_cast<float*>(p.dprob) + row0 + lane, part.rowsum);
      part.rowsum = 0.0f;
    }
    if constexpr (Rule::kAmaxCount > 0 && !Rule::kAmaxGlobal) flush_amax(part, p, expert, lane);
  }

  // End of the kernel: the global amax (one atomic per warp).
  template <class P>
  FUSEGEMM_DEVICE static void flush_end(Partials& part, const P& p, int lane) {
    if constexpr (Rule::kAmaxCount > 0 && Rule::kAmaxGlobal) flush_amax(part, p, 0, lane);
  }

  template <class P>
  FUSEGEMM_DEVICE static void flush_amax(Partials& part, const P& p, int expert, int lane) {
    float* amax = static_cast<float*>(p.amax);
#pragma unroll
    for (int k = 0; k < Rule::kAmaxCount; ++k) {
      const float m = warp_amax(part.amax[k]);
      part.amax[k] = 0.0f;
      const int slot = k == 0 ? Rule::kAmaxSlot0 : amax_slot1<Rule>();
      const int64_t idx = Rule::kAmaxGlobal ? 0 : int64_t(expert) * Rule::kAmaxSlots + slot;
      // |x| bits as int: non-negative floats order as ints, NaN sits above +Inf, and the buffer
      // starts at -inf (a negative int).
      if (lane == 0 && amax != nullptr) atomicMax(reinterpret_cast<int*>(amax) + idx, __float_as_int(m));
    }
  }

  template <class R>
  FUSEGEMM_DEVICE static constexpr int amax_slot1() {
    if constexpr (R::kAmaxCount > 1) return R::kAmaxSlot1; else return 0;
  }

  // One 32-column block of D at D column dc0 (of dw): plain, or SFD-quantized by row and/or column.
  template <class P>
  FUSEGEMM_DEVICE static void d_block(const Rule& rule, const P& p, int expert, int row0, int64_t orow0, bool row_ok,
                                      int rows_valid, int dc0, int dw, const RowVals<ElementD, kPackD>& x, uint32_t stage,
                                      int lane, uint32_t col_buf) {
    const int row = row0 + lane;
    const int cols_valid = dw - dc0;
    if (cols_valid <= 0) return;
    if constexpr (!kQuant) {
      store_vals(stage, p.d_out, p.ldd, orow0, int(orow0) + lane, row_ok, dc0, cols_valid, rows_valid, lane, x);
    } else {
      static_assert(Rule::kSfdVec == 32, "the engine quantizes 32-column SFD blocks; 1x128 output scales are the "
                                         "sm_90a fragment path's (sm90/epilogue.cuh)");
      const float (&v)[32] = x.v;   // kPackD is false when D is quantized
      constexpr int kConv = Rule::kSfdConvention;
      const float nc = rule.sfd_norm_const();
      const float rl = p.rcp_max;
      if constexpr (Rule::kQuantRowD) {
        const Sfd sf = sfd_block<kConv, false>(row_amax32(v), nc, rl);
        float y[32];
#pragma unroll
        for (int i = 0; i < 32; ++i) y[i] = __fmul_rn(v[i], sf.scale);
        store_nmajor<ElementD>(stage, p.d_out, p.ldd, orow0, row, row_ok, dc0, cols_valid, rows_valid, lane, y);
        if (row_ok && p.sfd_row != nullptr) {
          const int kt = ((dw + 31) / 32 + 3) / 4;
          static_cast<uint8_t*>(p.sfd_row)[sf_atom_offset(row, dc0 / 32, kt)] = uint8_t(sf.stored);
        }
      }
      if constexpr (Rule::kQuantColD) {
        // Column c of the block: max over the warp's 32 rows (one 32-row SFD_col block).
        float mine = 0.0f;
        if constexpr (kColSmem) {
          mine = col_amax_smem(v, col_buf, lane);
        } else {
#pragma unroll
          for (int i = 0; i < 32; ++i) {
            const float a = warp_amax(v[i]);
            if (lane == i) mine = a;
          }
        }
        const Sfd sf = sfd_block<kConv, true>(mine, nc, rl);
        const int n = dc0 + lane;
        if (n < dw && p.sfd_col != nullptr) {
          static_cast<uint8_t*>(p.sfd_col)[col_sfd_offset(p, expert, n, row0, dw)] = uint8_t(sf.stored);
        }
        float y[32];
        if constexpr (kColSmem) {
          scale_cols_smem(v, sf.scale, col_buf, lane, y);
        } else {
#pragma unroll
          for (int i = 0; i < 32; ++i) y[i] = __fmul_rn(v[i], __shfl_sync(0xFFFFFFFFu, sf.scale, i));
        }
        if (p.d_col_out != nullptr) {
          store_nmajor<ElementD>(stage, p.d_col_out, p.ldd, orow0, row, row_ok, dc0, cols_valid, rows_valid,
                                 lane, y);
        }
      }
    }
  }

  // SFD_col byte of column n for the 32-row block starting at row0 (formats/scales.py pack_sf of
  // sf[n, m // 32]; discrete: the expert's atoms, contiguous, after those of earlier experts).
  template <class P>
  FUSEGEMM_DEVICE static int64_t col_sfd_offset(const P& p, int expert, int n, int row0, int dw) {
    if constexpr (kDiscreteColSfd) {
      const int* off = static_cast<const int*>(p.offsets);
      const int start = expert_first_row(off, expert);
      const int tiles = (__ldg(off + expert) - start) >> 7;
      const int64_t atom = int64_t(start >> 7) * ((dw + 127) >> 7) + int64_t(n >> 7) * tiles + ((row0 - start) >> 7);
      return atom * 512 + (n & 31) * 16 + ((n >> 5) & 3) * 4 + ((row0 >> 5) & 3);
    } else {
      const int rm = ((p.m_rows + 31) / 32 + 3) / 4;
      return sf_atom_offset(n, row0 >> 5, rm);
    }
  }
};

}  // namespace epi
}  // namespace fusegemm
