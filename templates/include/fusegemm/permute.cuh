// The token permutations of an MoE layer (fusegemm/routing.py), one memory pass each.
//
//   fusegemm_gather_rows : dst row r = src row index[r], zeros where index[r] is outside
//                          [0, src_rows) (the routing's padding rows read token -1).
//   fusegemm_spread_rows : the same rows in token order: src row t read once and stored to its k
//                          rows row_of[t, 0..k-1], then the rows whose index is outside
//                          [0, src_rows) zeroed (index and row_of: the routing's inverse pair).
//   fusegemm_sum_rows_*  : dst row t = the sum of src rows index[t * k + j], j = 0 .. k-1, in that
//                          order, in FP32, rounded once to the element type (the combine: each
//                          token's k expert rows; deterministic, no atomics).
//   fusegemm_route_rows  : the routing's rows from its (T, k) expert choices, one CTA: each
//                          expert's padded end row, the row of every choice (in token order
//                          within an expert: a stable counting sort) and the token of every row
//                          (-1 for padding). torch's route took about 20 small kernels, and the
//                          host's time to launch them stood at the head of every eager step.
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
static_assert(sizeof(PermuteParams) == 64, "fusegemm/permute.py packs these 64 bytes");

constexpr int kPermuteThreads = 256;

FUSEGEMM_DEVICE uint4 load_row_vec(const PermuteParams& p, long long row, int v) {
  if (row < 0 || row >= p.src_rows) return make_uint4(0u, 0u, 0u, 0u);
  return __ldg(reinterpret_cast<const uint4*>(p.src + row * p.src_ld) + v);
}

// FUSEGEMM_PERMUTE_GATHER_PIPELINE (A/B switch, default 0): the gather keeps more of its loads in
// flight. Written when a layer profile gave the gather 2.1 TB/s at dsv3 (it looked latency-bound:
// each row waits for its index, then for one 16-byte load per thread before the store). 1: the
// block's next index is read before this row's loads, and a thread's kGatherVecs vectors of a row
// are all loaded before any is stored. Timed alone on the H200 (2026-12-05, below) the default
// gather already moves 4.0-5.1 TB/s at dsv3 and qwen3, and this switch is not faster there.
#ifndef FUSEGEMM_PERMUTE_GATHER_PIPELINE
#define FUSEGEMM_PERMUTE_GATHER_PIPELINE 0
#endif
// FUSEGEMM_PERMUTE_STREAM_STORES (A/B switch, default 1): the gather stores its rows as streaming
// (st.global.cs, evict-first). The rows (k copies of every token: 470 MB at dsv3) pass through L2
// once and are read back by the next GEMM long after; evicting them first leaves L2 to the source
// rows, each read k times (x: 59 MB at dsv3, just above the H200's 50 MB L2). H200, 2026-12-05,
// same run, five rounds (bench/results/permute_h200_switches.json): the gather 1.18x / 1.02x /
// 1.02x / 1.10x as fast as with plain stores on dsv3-8 / dsv3-32 / mixtral / qwen3 (the pipeline
// switch above: 1.16x / 0.98x / 0.98x / 0.94x, so it stays off); the combine unchanged.
#ifndef FUSEGEMM_PERMUTE_STREAM_STORES
#define FUSEGEMM_PERMUTE_STREAM_STORES 1
#endif
constexpr int kGatherVecs = 4;

FUSEGEMM_DEVICE void store_row_vec(uint4* out, int v, const uint4& u) {
#if FUSEGEMM_PERMUTE_STREAM_STORES
  __stcs(out + v, u);   // (the compiler's own store: it keeps the loads before it, as the plain one)
#else
  out[v] = u;
#endif
}

// Rows in a grid-stride loop over blocks, the row's vectors over the block's threads.
FUSEGEMM_DEVICE void gather_rows(const PermuteParams& p) {
#if FUSEGEMM_PERMUTE_GATHER_PIPELINE
  const int step = int(blockDim.x);
  long long r = blockIdx.x;
  long long s = r < p.rows ? __ldg(p.index + r) : -1;
  for (; r < p.rows; r += gridDim.x) {
    const long long next = r + gridDim.x;
    const long long s_next = next < p.rows ? __ldg(p.index + next) : -1;   // in flight with the row
    uint4* out = reinterpret_cast<uint4*>(p.dst + r * p.dst_ld);
    if (s < 0 || s >= p.src_rows) {   // a padding row (the block's one index: a uniform branch)
      for (int v = threadIdx.x; v < p.vecs; v += step) store_row_vec(out, v, make_uint4(0u, 0u, 0u, 0u));
    } else {
      // Plain loads, not __ldg: ptxas moves a read-only load past a store, and placed each
      // vector's store right after its load (two loads in flight, not four); a load that may
      // alias the stores stays before them. Whole groups of kGatherVecs need no predicate; the
      // row's last group (fewer) one per vector, shared by its load and its store.
      const uint4* src = reinterpret_cast<const uint4*>(p.src + s * p.src_ld);
      int v0 = threadIdx.x;
      for (; v0 + (kGatherVecs - 1) * step < p.vecs; v0 += kGatherVecs * step) {
        uint4 u[kGatherVecs];
#pragma unroll
        for (int q = 0; q < kGatherVecs; ++q) u[q] = src[v0 + q * step];
#pragma unroll
        for (int q = 0; q < kGatherVecs; ++q) store_row_vec(out, v0 + q * step, u[q]);
      }
      uint4 u[kGatherVecs - 1];
#pragma unroll
      for (int q = 0; q < kGatherVecs - 1; ++q) {
        if (v0 + q * step < p.vecs) u[q] = src[v0 + q * step];
      }
#pragma unroll
      for (int q = 0; q < kGatherVecs - 1; ++q) {
        if (v0 + q * step < p.vecs) store_row_vec(out, v0 + q * step, u[q]);
      }
    }
    s = s_next;
  }
#else
  for (long long r = blockIdx.x; r < p.rows; r += gridDim.x) {
    const long long s = __ldg(p.index + r);
    uint4* out = reinterpret_cast<uint4*>(p.dst + r * p.dst_ld);
    for (int v = threadIdx.x; v < p.vecs; v += blockDim.x) store_row_vec(out, v, load_row_vec(p, s, v));
  }
#endif
}

// The gather in token order (fusegemm_spread_rows). gather_rows walks the rows in expert order
// and reads a token's row once for every row that names it: k reads of each token, far apart in
// the walk (its rows sit in k experts' ranges). At dsv3 (x: 4096 x 7168 BF16, 59 MB, above the
// H200's 50 MB L2; top-k 8) each of those reads came from DRAM: 940 MB moved for 529 MB of rows
// (0.24 ms a call in the graphed layer's profile, bench/results/moe_layer_h200_graph_gaps.json;
// 4.0 TB/s as bench/permute.py counts the bytes). Here each token's row is read once, its vectors
// held in registers, and stored to its k rows; a second kind of work item then zeroes the rows no
// token names (kSpreadScan rows an item, one index load each). Same bytes in every row.
struct SpreadParams {
  PermuteParams p;            // index: the token of each of the p.rows rows; src_rows: tokens
  const long long* row_of;    // (src_rows, k): the rows of each token (outside [0, rows): none)
};
static_assert(sizeof(SpreadParams) == 72, "fusegemm/permute.py packs these 72 bytes");

constexpr int kSpreadScan = 32;

FUSEGEMM_DEVICE void spread_rows(const SpreadParams& q) {
  const PermuteParams& p = q.p;
  const long long scans = (p.rows + kSpreadScan - 1) / kSpreadScan;
  const int step = int(blockDim.x);
  for (long long it = blockIdx.x; it < p.src_rows + scans; it += gridDim.x) {
    if (it < p.src_rows) {   // token `it`: one read of its row, k stores
      const uint4* src = reinterpret_cast<const uint4*>(p.src + it * p.src_ld);
      const long long* rows = q.row_of + it * p.k;
      for (int v0 = threadIdx.x; v0 < p.vecs; v0 += kGatherVecs * step) {
        uint4 u[kGatherVecs];
#pragma unroll
        for (int i = 0; i < kGatherVecs; ++i) {
          if (v0 + i * step < p.vecs) u[i] = __ldg(src + v0 + i * step);
        }
        for (int j = 0; j < p.k; ++j) {
          const long long r = __ldg(rows + j);   // (the block's k indices: L1 after the first pass)
          if (r < 0 || r >= p.rows) continue;    // uniform
          uint4* out = reinterpret_cast<uint4*>(p.dst + r * p.dst_ld);
#pragma unroll
          for (int i = 0; i < kGatherVecs; ++i) {
            if (v0 + i * step < p.vecs) store_row_vec(out, v0 + i * step, u[i]);
          }
        }
      }
    } else {                 // kSpreadScan rows: zero those no token's row lands in
      const long long r0 = (it - p.src_rows) * kSpreadScan;
      const long long r1 = min(r0 + kSpreadScan, p.rows);
      for (long long r = r0; r < r1; ++r) {
        const long long s = __ldg(p.index + r);
        if (s >= 0 && s < p.src_rows) continue;   // uniform: a token's row
        uint4* out = reinterpret_cast<uint4*>(p.dst + r * p.dst_ld);
        for (int v = threadIdx.x; v < p.vecs; v += step) store_row_vec(out, v, make_uint4(0u, 0u, 0u, 0u));
      }
    }
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
// Two 16-bit values of a 32-bit word to FP32 and back (round to nearest even).
template <class T> struct Pair16;
template <> struct Pair16<bfloat16_t> {
  static FUSEGEMM_DEVICE void unpack(uint32_t w, float& lo, float& hi) { bf16x2_to_f32(w, lo, hi); }
  static FUSEGEMM_DEVICE uint32_t pack(float lo, float hi) {
    uint32_t r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
  }
};
template <> struct Pair16<half_t> {
  static FUSEGEMM_DEVICE void unpack(uint32_t w, float& lo, float& hi) {
    asm("{\n\t.reg .f16 l, h;\n\tmov.b32 {l, h}, %2;\n\tcvt.f32.f16 %0, l;\n\tcvt.f32.f16 %1, h;\n\t}"
        : "=f"(lo), "=f"(hi) : "r"(w));
  }
  static FUSEGEMM_DEVICE uint32_t pack(float lo, float hi) {
    uint32_t r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
  }
};
template <class T> struct Lanes {   // bfloat16_t, half_t
  static constexpr int kN = 8;
  static FUSEGEMM_DEVICE void add(float* acc, const uint4& u) {
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float lo, hi;
      Pair16<T>::unpack(w[i], lo, hi);
      acc[2 * i] += lo;
      acc[2 * i + 1] += hi;
    }
  }
  static FUSEGEMM_DEVICE uint4 pack(const float* acc) {
    return make_uint4(Pair16<T>::pack(acc[0], acc[1]), Pair16<T>::pack(acc[2], acc[3]),
                      Pair16<T>::pack(acc[4], acc[5]), Pair16<T>::pack(acc[6], acc[7]));
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

// ------------------------------------------------------------------------------------------
// Routing rows. Warp w of the CTA owns the w-th contiguous segment of the n = T * k choices (in
// token order); pass 1 counts each warp's choices per expert, a prefix over the warps gives every
// (warp, expert) its first rank, pass 2 ranks each choice within its warp's segment. Segments in
// token order and ranks in segment order make the sort stable without atomics.
struct RouteParams {
  const long long* experts;   // (n,) the choices, token-major: choice j of token t at t * k + j
  int* offsets;               // (E,) each expert's padded end row
  long long* row_of;          // (n,) the row of each choice
  long long* token_of_row;    // (rows,) the token of each row, -1 for padding
  long long n;                // T * k, below 2^31
  long long rows;             // R, the bound padded_rows(T, E, k)
  int num_experts;            // E <= kRouteMaxExperts
  int k;
  int* row_ends;              // (E,) where each expert's rows end before its padding
};
static_assert(sizeof(RouteParams) == 64, "fusegemm/permute.py packs these 64 bytes");

constexpr int kRouteWarps = 32;
constexpr int kRouteMaxExperts = 256;

FUSEGEMM_DEVICE int route_expert(const RouteParams& p, long long i) {
  const long long e = __ldg(p.experts + i);
  return (e >= 0 && e < p.num_experts) ? int(e) : -1;   // (top-k's choices are always in range)
}

FUSEGEMM_DEVICE void route_rows(const RouteParams& p) {
  __shared__ int count[kRouteWarps][kRouteMaxExperts];   // pass 1: counts; then first ranks
  __shared__ int start[kRouteMaxExperts];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int E = p.num_experts;
  for (int i = threadIdx.x; i < kRouteWarps * kRouteMaxExperts; i += blockDim.x) (&count[0][0])[i] = 0;
  for (long long r = threadIdx.x; r < p.rows; r += blockDim.x) p.token_of_row[r] = -1;
  __syncthreads();
  const long long seg = (p.n + kRouteWarps - 1) / kRouteWarps;
  const long long lo = warp * seg, hi = min(p.n, lo + seg);
  for (long long base = lo; base < hi; base += 32) {      // pass 1
    const long long i = base + lane;
    const int e = i < hi ? route_expert(p, i) : -1;
    const unsigned peers = __match_any_sync(0xffffffffu, e);
    if (e >= 0 && lane == __ffs(peers) - 1) count[warp][e] += __popc(peers);
    __syncwarp();
  }
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x) {     // prefix over the warps
    int run = 0;
    for (int w = 0; w < kRouteWarps; ++w) {
      const int c = count[w][e];
      count[w][e] = run;
      run += c;
    }
    start[e] = run;   // the expert's count, until the scan below
  }
  __syncthreads();
  if (threadIdx.x == 0) {                                  // padded ends (E <= 256: serial)
    int end = 0;
    for (int e = 0; e < E; ++e) {
      const int padded = (start[e] + kMAligned - 1) / kMAligned * kMAligned;
      p.row_ends[e] = end + start[e];
      start[e] = end;
      end += padded;
      p.offsets[e] = end;
    }
  }
  __syncthreads();
  for (long long base = lo; base < hi; base += 32) {      // pass 2
    const long long i = base + lane;
    const int e = i < hi ? route_expert(p, i) : -1;
    const unsigned peers = __match_any_sync(0xffffffffu, e);
    if (e >= 0) {
      const long long row = start[e] + count[warp][e] + __popc(peers & ((1u << lane) - 1u));
      p.row_of[i] = row;
      if (row < p.rows) p.token_of_row[row] = int(i) / p.k;   // (n < 2^31: a 32-bit divide, no local memory)
    } else if (i < hi) {
      p.row_of[i] = p.rows;   // an expert outside [0, E): no row (never from top-k)
    }
    __syncwarp();
    if (e >= 0 && lane == __ffs(peers) - 1) count[warp][e] += __popc(peers);
    __syncwarp();
  }
}

}  // namespace fusegemm

extern "C" __global__ void __launch_bounds__(fusegemm::kRouteWarps * 32)
fusegemm_route_rows(const __grid_constant__ fusegemm::RouteParams p) {
  fusegemm::route_rows(p);
}
extern "C" __global__ void __launch_bounds__(fusegemm::kPermuteThreads)
fusegemm_gather_rows(const __grid_constant__ fusegemm::PermuteParams p) {
  fusegemm::gather_rows(p);
}
extern "C" __global__ void __launch_bounds__(fusegemm::kPermuteThreads)
fusegemm_spread_rows(const __grid_constant__ fusegemm::SpreadParams p) {
  fusegemm::spread_rows(p);
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
