// The blockwise FP8 recipe's quantizations on the device (fusegemm/quantize.py), one memory pass
// each: torch's operations (fusegemm/formats/torch_blockwise.py) took a float32 copy, a min/max
// pass, a division pass and a cast pass per operand, and on the H200 made the recipe's training
// step 0.22-0.61x torch's BF16 step; with these kernels it runs at 1.04-1.65x
// (bench/results/moe_mlp_h200_fp8_block.json, bench/quantize.py).
//
// One CTA quantizes a 128 x 128 tile of a (rows, cols) source (batch: blockIdx.z), staged once
// in shared memory, into any of:
//   q  (rows, cols) FP8, with either one scale per row and 128 columns (the recipe's 1x128, A's
//      format) or one per whole tile (`blocks`: the weights' 128x128);
//   qt (cols, rows) FP8, the transpose, rows contiguous, with one scale per column and 128 rows
//      (the FP8 weight gradient's operands: tokens contiguous, scaled along the tokens) or the
//      tile's scale (`blocks`: the weights' transposed copy for the data gradients).
// Each value is torch_blockwise's bit for bit: s = max(amax, 1e-4) / elem_max in FP32 (NaN kept;
// `pow2` rounds it up to a power of two by its bits), q = cvt.rn.satfinite(fl32(x / s)) (|x / s|
// <= elem_max up to one rounding, so saturation never bites; torch's cast agrees). The source is
// bfloat16 or float16, or FP8 e4m3 with 1x128 row scales, dequantized and rounded to bfloat16
// (the recipe's h, requantized along the tokens for the weight gradient as torch's route did).
//
// The kernels are bound by issue slots as much as by DRAM (H100, Nsight Compute, 2026-12-05:
// 73-82% of the issue slots busy at 73-81% of DRAM bandwidth; the H200 has the same SMs and 1.4x
// the bandwidth), so the passes spend few instructions per value: maxima over 16-bit |x| pairs
// (max.u16x2, two values an instruction, no conversion), the element format a template argument
// (one branch per tile, no predicated pair of conversions per value), the column pass two
// columns a lane (one 4-byte load per row, one shuffle step per pair of column maxima), loads at
// constant offsets from one address per lane, and a three-instruction division (common.cuh
// div_by_scale). About 14 instructions per value where there were 21 (both quantizations of an
// activation) and 12 where there were 20 (the weights with their transposed copy). H100, same
// run, against the previous kernels in a second process (bench/quantize.py, three rounds,
// bench/results/quantize_h100_packed.json): activations 1.06-1.08x, weights 1.07-1.08x, the same
// bytes (tests/gpu/test_quantize_gpu.py).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "fusegemm/common.cuh"

namespace fusegemm {

struct QuantizeParams {
  const unsigned char* src;      // element (b, r, c) at src + (b * src_batch + r * src_ld + c) elements
  const float* src_scales;       // FP8 source: (r, c) scaled by src_scales[r + (c / 128) * src_scales_ld]
  unsigned char* q;              // optional: (b, r, c) at q[b * q_batch + r * q_ld + c]
  float* s;                      // q's scales: [b * s_batch + r + (c / 128) * s_ld] (blocks: + (r / 128) * s_ld + c / 128)
  unsigned char* qt;             // optional: (b, c, r) at qt[b * qt_batch + c * qt_ld + r]
  float* st;                     // qt's scales: [b * st_batch + c + (r / 128) * st_ld] (blocks: + (c / 128) * st_ld + r / 128)
  long long src_ld, src_batch, src_scales_ld;
  long long q_ld, q_batch, s_ld, s_batch;
  long long qt_ld, qt_batch, st_ld, st_batch;
  int rows, cols;                // rows and cols multiples of 16 (the 16-byte stores of qt, 4-byte ones of q)
  int blocks;                    // 1: one scale per 128 x 128 tile; 0: per row (q) and per column (qt)
  int flags;                     // kQuantizePow2 | kQuantizeE5M2
};
static_assert(sizeof(QuantizeParams) == 152, "fusegemm/quantize.py packs these 152 bytes");

constexpr int kQuantizeTile = 128;
constexpr int kQuantizeThreads = 256;   // 8 warps: 16 rows each in the row passes
// Rows each warp loads before it stages them where the tile is staged through registers (the
// FP8 source, and 2-byte ones under FUSEGEMM_QUANTIZE_STAGE_ASYNC=0): 1, 2, 4, 8 or 16. Each
// row's load waits for the previous one's work otherwise; 4 measured 2-15% faster than 1 on the
// H200 (bench/quantize.py, 2026-12-04), 8 the same as 4.
#ifndef FUSEGEMM_QUANTIZE_ROW_BATCH
#define FUSEGEMM_QUANTIZE_ROW_BATCH 4
#endif
constexpr int kQuantizeRowBatch = FUSEGEMM_QUANTIZE_ROW_BATCH;
static_assert(kQuantizeRowBatch >= 1 && 16 % kQuantizeRowBatch == 0, "a warp's 16 rows in whole batches");
constexpr int kQuantizePow2 = 1, kQuantizeE5M2 = 2;
// 128x128 blocks with the transposed copy (the weights' qt): the tile has one scale, so qt is q
// transposed byte for byte. 1 makes qt's bytes from q's by byte permutes in registers and
// writes them through shared memory as whole 128-byte rows (quantize_block_transposed); 0 runs
// the column pass, which converts and divides every value a second time (the default). Same
// bytes; A/B through FUSEGEMM_NVRTC_EXTRA. H100, 2026-12-05 (bench/quantize.py, five rounds):
// with the previous passes 1 ran w1 / w2 at 0.93x / 1.02x the column pass's speed (bench/results/
// quantize_h100_block_transpose_smem.json; storing each lane's 16-byte pieces straight to qt, 32
// rows of qt per instruction, ran 0.73x / 0.80x: quantize_h100_block_transpose_direct.json, and
// was removed); with the packed passes 1.00x / 1.00x (three rounds, quantize_h100_packed.json):
// the column pass is bandwidth-bound on the H100, its second conversion hidden under the stores.
#ifndef FUSEGEMM_QUANTIZE_BLOCK_TRANSPOSE
#define FUSEGEMM_QUANTIZE_BLOCK_TRANSPOSE 0
#endif
static_assert(FUSEGEMM_QUANTIZE_BLOCK_TRANSPOSE == 0 || FUSEGEMM_QUANTIZE_BLOCK_TRANSPOSE == 1,
              "FUSEGEMM_QUANTIZE_BLOCK_TRANSPOSE: 0 (the column pass) or 1 (q's bytes permuted)");

// The tile stays in its 2-byte source type (FP8 sources: bfloat16, as the recipe rounded h).
// Element (r, c) sits at column c ^ 8 (r / 16 % 8) of row r: the column pass's 8 lanes of a
// column read rows 16 j + i, j = 0..7, which the XOR spreads over 8 bank pairs (conflict-free
// with 4 columns per instruction); the row passes' 8-byte chunks only move within their row.
FUSEGEMM_DEVICE int quantize_swizzle(int r, int c) { return r * kQuantizeTile + (c ^ (((r >> 4) & 7) << 3)); }

// The staged tile's 2-byte values two to a register: |x| as 16-bit unsigned pairs, whose order
// is the values' order (bfloat16 and float16 alike, NaN above +Inf: the max is NaN if one is, as
// torch's aminmax keeps NaN), maximised pairwise by one max.u16x2 per two values; the max turned
// into the FP32 bits of its value; the pair as floats.
FUSEGEMM_DEVICE uint32_t max_u16x2(uint32_t a, uint32_t b) {
  uint32_t r;
  asm("max.u16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}
FUSEGEMM_DEVICE uint32_t abs_bits2(uint32_t u) { return u & 0x7FFF7FFFu; }
FUSEGEMM_DEVICE uint32_t max_halves(uint32_t m) { return max(m >> 16, m & 0xFFFFu); }
template <class S> struct Packed;
template <> struct Packed<__nv_bfloat16> {
  static FUSEGEMM_DEVICE uint32_t f32_bits(uint32_t h) { return __float_as_uint(bf16_bits_to_f32(h)); }
  static FUSEGEMM_DEVICE void unpack(uint32_t u, float& lo, float& hi) { bf16x2_to_f32(u, lo, hi); }
};
template <> struct Packed<__half> {
  static FUSEGEMM_DEVICE uint32_t f32_bits(uint32_t h) {
    return __float_as_uint(__half2float(__ushort_as_half(static_cast<unsigned short>(h))));
  }
  static FUSEGEMM_DEVICE void unpack(uint32_t u, float& lo, float& hi) {
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&u));
    lo = f.x;
    hi = f.y;
  }
};

// s = fl(max(amax, 1e-4) / elem_max), correctly rounded (div_by_elem_max); an Inf amax gives Inf,
// a NaN one NaN.
template <bool kE5M2>
FUSEGEMM_DEVICE float quantize_scale(uint32_t amax_bits, int flags) {
  const float amax = __uint_as_float(amax_bits);
  if (amax_bits > 0x7F800000u) return amax;   // NaN: every value of the block becomes NaN
  float s = div_by_elem_max(fmaxf(amax, 1e-4f), kE5M2 ? 57344.0f : 448.0f, kE5M2 ? 1.0f / 57344.0f : 1.0f / 448.0f);
  if (flags & kQuantizePow2) {
    const uint32_t b = __float_as_uint(s);
    if ((b & 0x7F800000u) != 0x7F800000u && (b & 0x007FFFFFu) != 0) {
      s = __uint_as_float((b & 0x7F800000u) + 0x00800000u);
    }
  }
  return s;
}

// A scale (stored as it is) and what divides by it (common.cuh's ScaleDivisor: no branch per value).
struct QuantizeScale {
  float s;
  ScaleDivisor q;
  FUSEGEMM_DEVICE QuantizeScale() = default;
  FUSEGEMM_DEVICE explicit QuantizeScale(float scale) : s(scale), q(scale) {}
  FUSEGEMM_DEVICE float div(float x) const { return q.div(x); }
  // Lane `from`'s divisor (the stored scale stays the owner's).
  FUSEGEMM_DEVICE QuantizeScale from_lane(int from) const {
    QuantizeScale o;
    o.s = s;
    o.q.d = __shfl_sync(0xFFFFFFFFu, q.d, from);
    o.q.r = __shfl_sync(0xFFFFFFFFu, q.r, from);
    return o;
  }
};

// Two values divided by s -> two FP8 bytes (a in the low byte), the format a template argument
// (the kernels branch on the flags once per tile, not per value).
template <bool kE5M2>
FUSEGEMM_DEVICE uint32_t quantize_pair(float a, float b, const QuantizeScale& q) {
  return __nv_cvt_float2_to_fp8x2(make_float2(q.div(a), q.div(b)), __NV_SATFINITE, kE5M2 ? __NV_E5M2 : __NV_E4M3);
}

// A packed pair of 2-byte values (two consecutive columns of a row) -> four FP8 bytes of a
// lane's 4 x 4 block: its two values' codes, a in the low byte.
template <class S, bool kE5M2>
FUSEGEMM_DEVICE uint32_t quantize_packed_pair(uint32_t u, const QuantizeScale& q) {
  float lo, hi;
  Packed<S>::unpack(u, lo, hi);
  return quantize_pair<kE5M2>(lo, hi, q);
}
// Four values as two packed pairs (v.x: the first two) -> four FP8 bytes, the first value lowest.
template <class S, bool kE5M2>
FUSEGEMM_DEVICE uint32_t quantize_packed_quad(uint2 v, const QuantizeScale& q) {
  return (quantize_packed_pair<S, kE5M2>(v.x, q) & 0xFFFFu) | (quantize_packed_pair<S, kE5M2>(v.y, q) << 16);
}

// A 2-byte source (bfloat16, float16) is staged as it is, by cp.async (FUSEGEMM_QUANTIZE_STAGE_ASYNC,
// default 1): the whole 32 KB tile in flight at once without registers (the weights 1.09-1.10x
// the register loads on the H200, the activations equal). 0: through registers, the A/B baseline.
#ifndef FUSEGEMM_QUANTIZE_STAGE_ASYNC
#define FUSEGEMM_QUANTIZE_STAGE_ASYNC 1
#endif
template <class T> struct QuantizeSource {
  using Stage = T;
  static constexpr bool kAsync = FUSEGEMM_QUANTIZE_STAGE_ASYNC != 0;
  // Four values (c .. c + 3) of row r: one 8-byte load.
  static FUSEGEMM_DEVICE void load4(const QuantizeParams& p, const unsigned char* src, int r, int c, Stage (&v)[4]) {
    const uint2 u = __ldg(reinterpret_cast<const uint2*>(src) + (r * p.src_ld + c) / 4);
    *reinterpret_cast<uint2*>(v) = u;
  }
};
template <> struct QuantizeSource<__nv_fp8_e4m3> {
  using Stage = __nv_bfloat16;
  static constexpr bool kAsync = false;   // dequantized on the way: through registers
  static FUSEGEMM_DEVICE void load4(const QuantizeParams& p, const unsigned char* src, int r, int c, Stage (&v)[4]) {
    const uint32_t u = __ldg(reinterpret_cast<const uint32_t*>(src + r * p.src_ld + c));
    const float s = __ldg(p.src_scales + r + (c / kQuantizeTile) * p.src_scales_ld);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      __nv_fp8_e4m3 e;
      e.__x = static_cast<__nv_fp8_storage_t>((u >> (8 * i)) & 0xFFu);
      v[i] = __float2bfloat16_rn(__fmul_rn(static_cast<float>(e), s));   // exact product, rounded once
    }
  }
};

// The tile (rows and columns past the source's zero-filled) into shared memory; every thread
// returns after the block's barrier.
template <class T>
FUSEGEMM_DEVICE void stage_tile(const QuantizeParams& p, const unsigned char* src, int r0, int c0,
                                typename QuantizeSource<T>::Stage* tile) {
  using Src = QuantizeSource<T>;
  using Stage = typename Src::Stage;
  if constexpr (Src::kAsync) {
    // 2048 chunks of 16 bytes (8 elements: cols % 16 == 0 puts a chunk all in or all out, and
    // the swizzle moves whole chunks); 16 consecutive threads copy a row's 256 bytes.
#pragma unroll
    for (int i = 0; i < kQuantizeTile * kQuantizeTile / 8 / kQuantizeThreads; ++i) {
      const int id = threadIdx.x + i * kQuantizeThreads, rl = id / 16, cl = 8 * (id % 16);
      const int r = r0 + rl, c = c0 + cl;
      const bool in = r < p.rows && c < p.cols;
      cp_async_16_zfill(static_cast<uint32_t>(__cvta_generic_to_shared(tile + quantize_swizzle(rl, cl))),
                        in ? src + (r * p.src_ld + c) * static_cast<long long>(sizeof(T)) : src, in);
    }
    cp_async_commit();
    cp_async_wait_all();
  } else {
    // Each warp its 16 rows, 4 columns a lane, kQuantizeRowBatch rows' loads before their stores.
    // (Loading all 16 rows first, 90-110 registers and two CTAs per SM, ran 1.4x slower on the
    // H200 than one row at a time at six CTAs per SM: bench/quantize.py.)
    const int warp = threadIdx.x / 32, c = c0 + 4 * (threadIdx.x % 32);
#pragma unroll(kQuantizeRowBatch == 1 ? 4 : 1)
    for (int i0 = 0; i0 < 16; i0 += kQuantizeRowBatch) {
      Stage v[kQuantizeRowBatch][4];
#pragma unroll
      for (int j = 0; j < kQuantizeRowBatch; ++j) {
        const int r = r0 + warp * 16 + i0 + j;
        if (r < p.rows && c < p.cols) {
          Src::load4(p, src, r, c, v[j]);
        } else {
#pragma unroll
          for (int k = 0; k < 4; ++k) v[j][k] = Stage(0.0f);
        }
      }
#pragma unroll
      for (int j = 0; j < kQuantizeRowBatch; ++j) {
        *reinterpret_cast<uint2*>(tile + quantize_swizzle(warp * 16 + i0 + j, c - c0)) = *reinterpret_cast<const uint2*>(v[j]);
      }
    }
  }
  __syncthreads();
}

// The row passes' lane: warp w's 16 rows wr = 16 w .. wr + 15 share r / 16 = w, so their swizzle
// is one XOR, and row wr + i's four values from column cl (one 8-byte load) sit i rows past row
// wr's: constant offsets from one address.
template <class Stage>
FUSEGEMM_DEVICE const uint2* row_quads(const Stage* tile, int wr, int cl) {
  return reinterpret_cast<const uint2*>(tile + quantize_swizzle(wr, cl));
}
constexpr int kQuadsPerRow = kQuantizeTile / 4;

// The max |x| bits (16-bit) of a lane's four values of a row.
FUSEGEMM_DEVICE uint32_t quad_max(uint2 u) { return max_u16x2(abs_bits2(u.x), abs_bits2(u.y)); }

// 1x128 rows (q): every row's max first (lane i keeps row i's), then lane i < 16 computes row i's
// scale (one division per row for the warp, not one per lane) and stores it, then the rows are
// quantized with their scales from lanes 0..15, q's stores walking down from the warp's first row.
template <class S, bool kE5M2>
FUSEGEMM_DEVICE void quantize_rows(const QuantizeParams& p, const S* tile, int b, int r0, int c0, int warp, int lane) {
  const int wr = warp * 16, cl = 4 * lane, rows_here = min(16, p.rows - r0 - wr);
  const bool col_in = c0 + cl < p.cols;   // (cols % 16 == 0: a lane's four columns all in or all out)
  const uint2* v = row_quads(tile, wr, cl);
  uint32_t mine = 0;
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const uint32_t m = __reduce_max_sync(0xFFFFFFFFu, max_halves(quad_max(v[i * kQuadsPerRow])));
    if (lane == i) mine = m;
  }
  const QuantizeScale own(quantize_scale<kE5M2>(Packed<S>::f32_bits(mine), p.flags));
  if (lane < rows_here) p.s[b * p.s_batch + r0 + wr + lane + (c0 / kQuantizeTile) * p.s_ld] = own.s;
  unsigned char* q = p.q + b * p.q_batch + (r0 + wr) * p.q_ld + c0 + cl;
#pragma unroll 4
  for (int i = 0; i < 16; ++i) {
    const uint32_t w = quantize_packed_quad<S, kE5M2>(v[i * kQuadsPerRow], own.from_lane(i));
    if (i < rows_here && col_in) *reinterpret_cast<uint32_t*>(q + i * p.q_ld) = w;
  }
}

// 128x128 (blocks): the tile's max, every warp's through shared memory, and its one scale.
template <class S, bool kE5M2>
FUSEGEMM_DEVICE float block_scale(const QuantizeParams& p, const S* tile, uint32_t* warp_max, int warp, int lane) {
  const uint2* v = row_quads(tile, warp * 16, 4 * lane);
  uint32_t m = 0;
#pragma unroll
  for (int i = 0; i < 16; ++i) m = max_u16x2(m, quad_max(v[i * kQuadsPerRow]));
  m = __reduce_max_sync(0xFFFFFFFFu, max_halves(m));
  if (lane == 0) warp_max[warp] = m;
  __syncthreads();
  m = 0;
#pragma unroll
  for (int w = 0; w < kQuantizeThreads / 32; ++w) m = max(m, warp_max[w]);
  return quantize_scale<kE5M2>(Packed<S>::f32_bits(m), p.flags);
}

// 128x128 with the transposed copy (FUSEGEMM_QUANTIZE_BLOCK_TRANSPOSE): one scale for the tile,
// so qt's bytes are q's transposed. The lane's 16 x 4 block of q (rows wr.., columns cl..) is
// kept and turned into its 4 columns' 16 bytes each by byte permutes, written through the tile's
// memory (free once every warp has read it) as qt's 128 x 128 bytes (row = source column; each
// row's 16-byte chunk ch at ch ^ (row / 4 % 8), so that a store's eight lanes (rows 4 l + k) hit
// eight distinct chunks), then stored by 8 threads a row: 128 contiguous bytes of qt per 8 lanes.
template <class S, bool kE5M2>
FUSEGEMM_DEVICE void quantize_block_transposed(const QuantizeParams& p, S* tile, const QuantizeScale& bs, int b,
                                               int r0, int c0, int warp, int lane) {
  const int wr = warp * 16, cl = 4 * lane, rows_here = min(16, p.rows - r0 - wr);
  const bool col_in = c0 + cl < p.cols;
  const uint2* v = row_quads(tile, wr, cl);
  unsigned char* q = p.q == nullptr ? nullptr : p.q + b * p.q_batch + (r0 + wr) * p.q_ld + c0 + cl;
  uint32_t w[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    w[i] = quantize_packed_quad<S, kE5M2>(v[i * kQuadsPerRow], bs);
    if (q != nullptr && i < rows_here && col_in) *reinterpret_cast<uint32_t*>(q + i * p.q_ld) = w[i];
  }
  uint4 col[4];   // column cl + k's bytes of rows wr .. wr + 15, the lowest row first
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    uint32_t c[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t lo = __byte_perm(w[4 * j], w[4 * j + 1], k | ((k + 4) << 4));
      const uint32_t hi = __byte_perm(w[4 * j + 2], w[4 * j + 3], k | ((k + 4) << 4));
      c[j] = __byte_perm(lo, hi, 0x5410);
    }
    col[k] = make_uint4(c[0], c[1], c[2], c[3]);
  }
  unsigned char* tb = reinterpret_cast<unsigned char*>(tile);
  __syncthreads();
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int row = cl + k;
    *reinterpret_cast<uint4*>(tb + row * kQuantizeTile + 16 * (warp ^ ((row >> 2) & 7))) = col[k];
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < kQuantizeTile * kQuantizeTile / 16 / kQuantizeThreads; ++i) {
    const int id = threadIdx.x + i * kQuantizeThreads, row = id / 8, ch = id % 8;
    const uint4 u = *reinterpret_cast<const uint4*>(tb + row * kQuantizeTile + 16 * (ch ^ ((row >> 2) & 7)));
    if (c0 + row < p.cols && r0 + 16 * ch < p.rows) {
      *reinterpret_cast<uint4*>(p.qt + b * p.qt_batch + static_cast<long long>(c0 + row) * p.qt_ld + r0 + 16 * ch) = u;
    }
  }
}

// 128x128 rows (q) with the tile's scale.
template <class S, bool kE5M2>
FUSEGEMM_DEVICE void quantize_block_rows(const QuantizeParams& p, const S* tile, const QuantizeScale& bs, int b, int r0,
                                         int c0, int warp, int lane) {
  const int wr = warp * 16, cl = 4 * lane, rows_here = min(16, p.rows - r0 - wr);
  const bool col_in = c0 + cl < p.cols;
  const uint2* v = row_quads(tile, wr, cl);
  unsigned char* q = p.q + b * p.q_batch + (r0 + wr) * p.q_ld + c0 + cl;
#pragma unroll 4
  for (int i = 0; i < 16; ++i) {
    const uint32_t w = quantize_packed_quad<S, kE5M2>(v[i * kQuadsPerRow], bs);
    if (i < rows_here && col_in) *reinterpret_cast<uint32_t*>(q + i * p.q_ld) = w;
  }
}

// Four FP8 bytes of one column from a lane's column pair: rows 4k .. 4k + 3, the low (kHi false)
// or high halves of u[4k ..].
template <class S, bool kE5M2, bool kHi>
FUSEGEMM_DEVICE uint32_t column_quad(const uint32_t (&u)[16], int k, const QuantizeScale& s) {
  float f[4];
#pragma unroll
  for (int t = 0; t < 4; ++t) {
    float lo, hi;
    Packed<S>::unpack(u[4 * k + t], lo, hi);
    f[t] = kHi ? hi : lo;
  }
  return (quantize_pair<kE5M2>(f[0], f[1], s) & 0xFFFFu) | (quantize_pair<kE5M2>(f[2], f[3], s) << 16);
}

// One column's 16 FP8 bytes (rows 0..15, the lowest first) from a lane's column pair.
template <class S, bool kE5M2, bool kHi>
FUSEGEMM_DEVICE uint4 column_bytes(const uint32_t (&u)[16], const QuantizeScale& s) {
  return make_uint4(column_quad<S, kE5M2, kHi>(u, 0, s), column_quad<S, kE5M2, kHi>(u, 1, s),
                    column_quad<S, kE5M2, kHi>(u, 2, s), column_quad<S, kE5M2, kHi>(u, 3, s));
}

// Column pass (qt): lane j = lane % 8 takes rows 16 j .. 16 j + 15 of a column pair (two adjacent
// columns: one 4-byte load per row), 4 pairs per warp and instruction, 32 pairs per CTA and
// round, two rounds. The lane's 16 rows share r / 16 = j: one XOR of swizzle, row 16 j + i's pair
// i rows past row 16 j's (the XOR spreads the 8 lanes of a pair over 8 bank groups: no
// conflicts). Each column's max over its 8 lanes is one shuffle and max.u16x2 per step for both
// columns of the pair; its scale (or the tile's: blocks); then one 16-byte store of qt per column.
template <class S, bool kE5M2>
FUSEGEMM_DEVICE void quantize_cols(const QuantizeParams& p, const S* tile, int b, int r0, int c0, int warp, int lane,
                                   bool blocks, float block_s) {
  const int j = lane % 8, rl0 = 16 * j, r = r0 + rl0;
#pragma unroll 1
  for (int round = 0; round < kQuantizeTile / 64; ++round) {
    const int cl = 2 * (round * 32 + warp * 4 + lane / 8), col = c0 + cl;
    const uint32_t* v = reinterpret_cast<const uint32_t*>(tile + quantize_swizzle(rl0, cl));
    uint32_t u[16];
    uint32_t m = 0;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      u[i] = v[i * (kQuantizeTile / 2)];
      m = max_u16x2(m, abs_bits2(u[i]));
    }
    float s0 = block_s, s1 = block_s;
    if (!blocks) {
      m = max_u16x2(m, __shfl_xor_sync(0xFFFFFFFFu, m, 1));
      m = max_u16x2(m, __shfl_xor_sync(0xFFFFFFFFu, m, 2));
      m = max_u16x2(m, __shfl_xor_sync(0xFFFFFFFFu, m, 4));
      s0 = quantize_scale<kE5M2>(Packed<S>::f32_bits(m & 0xFFFFu), p.flags);
      s1 = quantize_scale<kE5M2>(Packed<S>::f32_bits(m >> 16), p.flags);
    }
    if (col >= p.cols) continue;   // (cols % 16 == 0: the pair is all in or all out)
    if (!blocks && j == 0) {
      float* st = p.st + b * p.st_batch + col + (r0 / kQuantizeTile) * p.st_ld;
      st[0] = s0;
      st[1] = s1;
    }
    if (r >= p.rows) continue;     // (rows % 16 == 0: the lane's 16 rows all in or all out)
    const QuantizeScale q0(s0), q1(s1);
    unsigned char* qt = p.qt + b * p.qt_batch + static_cast<long long>(col) * p.qt_ld + r;
    *reinterpret_cast<uint4*>(qt) = column_bytes<S, kE5M2, false>(u, q0);
    *reinterpret_cast<uint4*>(qt + p.qt_ld) = column_bytes<S, kE5M2, true>(u, q1);
  }
}

// The staged tile's outputs, the element format a template argument (quantize_tile branches on
// the flags once per tile).
template <class Stage, bool kE5M2>
FUSEGEMM_DEVICE void quantize_staged(const QuantizeParams& p, Stage* tile, uint32_t* warp_max, int b, int r0, int c0) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (!p.blocks) {
    if (p.q != nullptr) quantize_rows<Stage, kE5M2>(p, tile, b, r0, c0, warp, lane);
    if (p.qt != nullptr) quantize_cols<Stage, kE5M2>(p, tile, b, r0, c0, warp, lane, false, 0.0f);
    return;
  }
  const float block_s = block_scale<Stage, kE5M2>(p, tile, warp_max, warp, lane);
  if (threadIdx.x == 0) {
    if (p.q != nullptr) p.s[b * p.s_batch + (r0 / kQuantizeTile) * p.s_ld + c0 / kQuantizeTile] = block_s;
    if (p.qt != nullptr) p.st[b * p.st_batch + (c0 / kQuantizeTile) * p.st_ld + r0 / kQuantizeTile] = block_s;
  }
  const QuantizeScale bs(block_s);
  if (FUSEGEMM_QUANTIZE_BLOCK_TRANSPOSE != 0 && p.qt != nullptr) {
    quantize_block_transposed<Stage, kE5M2>(p, tile, bs, b, r0, c0, warp, lane);
    return;
  }
  if (p.q != nullptr) quantize_block_rows<Stage, kE5M2>(p, tile, bs, b, r0, c0, warp, lane);
  if (p.qt != nullptr) quantize_cols<Stage, kE5M2>(p, tile, b, r0, c0, warp, lane, true, block_s);
}

// One CTA per tile, loaded and then quantized; the other CTAs of the SM keep DRAM busy meanwhile.
// (Persistent CTAs holding two tiles, the next one's cp.async in flight while this one is
// quantized, three CTAs per SM for the 64 KB, ran at 0.92-1.05x the previous kernels' speed on
// the activations and 0.95-0.96x on the weights, H100, 2026-12-05, where these run 1.06-1.08x:
// not kept.)
template <class T>
FUSEGEMM_DEVICE void quantize_tile(const QuantizeParams& p) {
  using Stage = typename QuantizeSource<T>::Stage;
  __shared__ __align__(16) Stage tile[kQuantizeTile * kQuantizeTile];
  __shared__ uint32_t warp_max[kQuantizeThreads / 32];
  const int r0 = blockIdx.y * kQuantizeTile, c0 = blockIdx.x * kQuantizeTile, b = blockIdx.z;
  stage_tile<T>(p, p.src + (b * p.src_batch) * static_cast<long long>(sizeof(T) == 1 ? 1 : 2), r0, c0, tile);
  if (p.flags & kQuantizeE5M2) {
    quantize_staged<Stage, true>(p, tile, warp_max, b, r0, c0);
  } else {
    quantize_staged<Stage, false>(p, tile, warp_max, b, r0, c0);
  }
}

}  // namespace fusegemm

// CTAs per SM the quantization kernels are compiled for (__launch_bounds__' second argument; 0:
// none, the compiler's register count). 6: 40 registers, as many CTAs as their shared memory
// allows, 0 spills; the packed passes take 48 registers unbounded (5 CTAs), which ran within
// the noise of 6 (0.91-1.05x, H100, bench/results/quantize_h100_packed.json). An A/B switch
// through FUSEGEMM_NVRTC_EXTRA.
#ifndef FUSEGEMM_QUANTIZE_MIN_CTAS
#define FUSEGEMM_QUANTIZE_MIN_CTAS 6
#endif
#if FUSEGEMM_QUANTIZE_MIN_CTAS > 0
#define FUSEGEMM_QUANTIZE_BOUNDS __launch_bounds__(fusegemm::kQuantizeThreads, FUSEGEMM_QUANTIZE_MIN_CTAS)
#else
#define FUSEGEMM_QUANTIZE_BOUNDS __launch_bounds__(fusegemm::kQuantizeThreads)
#endif

extern "C" __global__ void FUSEGEMM_QUANTIZE_BOUNDS
    fusegemm_quantize_bfloat16(const __grid_constant__ fusegemm::QuantizeParams p) {
  fusegemm::quantize_tile<__nv_bfloat16>(p);
}
extern "C" __global__ void FUSEGEMM_QUANTIZE_BOUNDS
    fusegemm_quantize_float16(const __grid_constant__ fusegemm::QuantizeParams p) {
  fusegemm::quantize_tile<__half>(p);
}
extern "C" __global__ void FUSEGEMM_QUANTIZE_BOUNDS
    fusegemm_quantize_float8_e4m3fn(const __grid_constant__ fusegemm::QuantizeParams p) {
  fusegemm::quantize_tile<__nv_fp8_e4m3>(p);
}
