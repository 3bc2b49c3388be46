// Stream-K remainder (scheduler "streamk"): the tiles of the last, partial wave of a persistent
// launch share their k-blocks among every CTA instead of idling the CTAs that get no tile.
//
// A launch of T tiles on G CTAs runs floor(T / G) whole waves as the static walk does (CTA c:
// tiles c, c + G, ...; the data-parallel tiles). The R = T mod G tiles after them hold
// I = R x KB k-blocks (KB per tile), which CTA c takes as the contiguous range
// [c I / G', (c + 1) I / G') of the remainder's k-blocks in tile order (G' <= G, below), so a
// CTA's remainder is at most: the tail of one tile (its first piece), whole tiles, and the head of
// another (its last piece). The wall time of the remainder falls from one tile to I / G' k-blocks
// (CUTLASS's stream-K, Osama et al., PPoPP'23; here only over the partial wave, so the whole waves
// keep the static walk's L2 bands and nothing to fix up).
//
// Pieces and their fix-up (deterministic: every tile's sum is taken in one fixed order):
//   - a whole tile runs its epilogue;
//   - a piece that does not start at k-block 0 (a CTA's first piece) writes its FP32 accumulators
//     to the CTA's slot of the partials workspace and raises the CTA's flag (release);
//   - a tile's head piece (k-block 0, not to the end: always a CTA's last piece) waits for the
//     flags of the CTAs that hold the tile's other pieces (acquire), adds their partials in CTA
//     order, and runs the epilogue.
// So a CTA writes at most one partial (slot = its index) and every flag is waited on by one CTA.
// A head piece waits only on first pieces of higher CTAs, which wait on nothing: with every CTA
// of the persistent grid resident (one per SM), no wait can close a cycle.
//
// G' = min(G, I / min_k_blocks) (the launch's sk_min_k_blocks): a piece shorter than a few
// k-blocks costs more in its partial's round trip through L2 than it saves. Stream-K runs only
// when every share, ceil(I / G') k-blocks, is shorter than a tile (else the split remainder would
// take no less time than the data-parallel one) and the last wave is at most half full (R <= G / 2:
// H200, kernel time, 128 x 256 tiles: qwen3-fc1's last wave of 108 tiles on 132 SMs split ran
// 0.91x the static walk, dsv3-fc1-2k's 124 0.82x, one expert of 512 rows at K 8192, 8 tiles,
// 1.86x), so T < G / 2 (a problem of few tiles: pure stream-K) splits every tile over the CTAs
// when K allows.
//
// The plan and the walk are constexpr: tests/unit/test_stream_k.py tabulates them at compile
// time and checks them against an independent model.
#pragma once

#include "fusegemm/common.cuh"
#include "fusegemm/tma.cuh"   // global_ns (the wait watchdog)

namespace fusegemm {

// One unit of a CTA's walk: k-blocks [kb_begin, kb_end) of linear tile `linear` (-1: the walk
// is over). A head piece waits on the partials of CTAs wait_first .. wait_last (else 0, -1).
struct StreamKUnit {
  int linear;
  int kb_begin;
  int kb_end;
  int wait_first;
  int wait_last;
  constexpr bool partial() const { return kb_begin > 0; }
  constexpr bool head() const { return wait_first <= wait_last; }
};

// 32-bit throughout (a 64-bit division is a subroutine call, whose saved registers spilled the
// producer): I = q G' + r, so c I / G' = c q + c r / G' with c r < G'^2 (G' < 2^15).
struct StreamKPlan {
  int grid = 0;            // CTAs of the launch
  int k_blocks = 0;        // per tile
  int dp_tiles = 0;        // the whole waves' tiles, walked statically
  int sk_ctas = 0;         // CTAs sharing the remainder (0: no stream-K)
  int sk_q = 0, sk_r = 0;  // the remainder's k-blocks I = sk_q * sk_ctas + sk_r

  static constexpr StreamKPlan make(int tiles, int grid, int k_blocks, int min_k_blocks) {
    StreamKPlan p;
    p.grid = grid;
    p.k_blocks = k_blocks;
    p.dp_tiles = tiles;
    const int rem = grid > 0 ? tiles % grid : 0;
    // (a last wave at least half full: splitting it saved less than its partials cost, below)
    if (min_k_blocks <= 0 || rem == 0 || 2 * rem > grid || k_blocks <= 1 || grid >= 32768) return p;
    const long long iters = static_cast<long long>(rem) * k_blocks;
    if (iters > 0x7fffffffll) return p;   // (a remainder of more than 2^31 k-blocks runs whole tiles)
    const long long by_size = iters / min_k_blocks;
    const int ctas = static_cast<int>(by_size < grid ? (by_size > 0 ? by_size : 1) : grid);
    if ((iters + ctas - 1) / ctas >= k_blocks) return p;   // (a share as long as a tile: no shorter)
    p.dp_tiles = tiles - rem;
    p.sk_ctas = ctas;
    p.sk_q = static_cast<int>(iters / ctas);
    p.sk_r = static_cast<int>(iters % ctas);
    return p;
  }
  // First remainder k-block of CTA c (c <= sk_ctas: the end of c - 1's range, floor(c I / G')).
  constexpr int begin(int c) const { return c * sk_q + c * sk_r / sk_ctas; }
};

// CTA `cta`'s units in order: its data-parallel tiles, then its pieces of the remainder.
struct StreamKWalk {
  StreamKPlan plan;
  int cta;
  int next_dp;
  int i = 0, end = 0;   // the CTA's remainder range, consumed from i

  constexpr StreamKWalk(const StreamKPlan& p, int cta_) : plan(p), cta(cta_), next_dp(cta_) {
    if (cta_ < p.sk_ctas) {
      i = p.begin(cta_);
      end = p.begin(cta_ + 1);
    }
  }

  constexpr StreamKUnit next() {
    const int kb = plan.k_blocks;
    if (next_dp < plan.dp_tiles) {
      const StreamKUnit u{next_dp, 0, kb, 0, -1};
      next_dp += plan.grid;
      return u;
    }
    if (i >= end) return StreamKUnit{-1, 0, 0, 0, -1};
    const int s = i / kb;
    const int b = i - s * kb;
    const int e = end - i < kb - b ? b + (end - i) : kb;
    StreamKUnit u{plan.dp_tiles + s, b, e, 0, -1};
    if (b == 0 && e < kb) {
      // The head, this CTA's last piece: the tile's other pieces are the first pieces of the
      // next CTAs (every share holds at least one k-block), up to the one holding its last.
      u.wait_first = cta + 1;
      u.wait_last = cta + 1;
      while (u.wait_last + 1 < plan.sk_ctas && plan.begin(u.wait_last + 1) < (s + 1) * kb) ++u.wait_last;
    }
    i += e - b;
    return u;
  }
};

// A unit's fix-up as one word, what the consumers keep through the mainloop (their registers are
// full there): -1 a partial, 0 a whole tile, else a head's 1 + first + (last << 16) (CTAs below
// 2^15: StreamKPlan::make splits no grid of 2^15 CTAs or more).
constexpr int fixup_word(int kb_begin, int wait_first, int wait_last) {
  return kb_begin > 0 ? -1 : wait_first <= wait_last ? 1 + wait_first + (wait_last << 16) : 0;
}
constexpr int fixup_first(int word) { return (word - 1) & 0xffff; }
constexpr int fixup_last(int word) { return (word - 1) >> 16; }

// ---------------------------------------------------------------------------------------------
// Fix-up through global memory. A slot holds a tile's accumulators as the consumer threads hold
// them: float4 j of thread t at (j * kThreads + t), so a warp's stores and loads are 512
// contiguous bytes and no layout is assumed (the same threads read what the same threads wrote).
// The flag protocol is CUTLASS's generic barrier: every thread's stores, a barrier among the
// tile's threads, then one thread's release; one thread's acquire, then the barrier, then the
// loads (at L2: .cg, as no L1 holds the slot's new bytes).
// ---------------------------------------------------------------------------------------------
FUSEGEMM_DEVICE void flag_release(int* flag) {
  asm volatile("st.release.gpu.global.b32 [%0], %1;" ::"l"(flag), "r"(1) : "memory");
}
FUSEGEMM_DEVICE int flag_acquire(const int* flag) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(flag) : "memory");
  return v;
}

template <int kThreads, int kAccum>
struct StreamKFixup {
  static_assert(kAccum % 4 == 0, "accumulators in float4s");
  static constexpr int kSlotFloats = kThreads * kAccum;

  // This thread's accumulators into slot `cta`; the barrier and the release follow (the caller's
  // named barrier over the tile's kThreads threads).
  static FUSEGEMM_DEVICE void store(float* partials, int cta, int t, const float (&acc)[kAccum]) {
    float4* slot = reinterpret_cast<float4*>(partials + static_cast<long long>(cta) * kSlotFloats);
#pragma unroll
    for (int j = 0; j < kAccum / 4; ++j) {
      __stcg(slot + j * kThreads + t, make_float4(acc[4 * j], acc[4 * j + 1], acc[4 * j + 2], acc[4 * j + 3]));
    }
  }

  // One thread waits for the flags of CTAs first .. last (spinning with a backoff; the
  // FUSEGEMM_WAIT_TIMEOUT_NS watchdog traps a wait that never ends, as the mbarrier waits').
  static FUSEGEMM_DEVICE void wait(const int* flags, int first, int last) {
    for (int c = first; c <= last; ++c) {
#ifdef FUSEGEMM_WAIT_TIMEOUT_NS
      const uint64_t t0 = global_ns();
#endif
      while (flag_acquire(flags + c) == 0) {
        __nanosleep(64);
#ifdef FUSEGEMM_WAIT_TIMEOUT_NS
        if (global_ns() - t0 > uint64_t(FUSEGEMM_WAIT_TIMEOUT_NS)) {
          printf("fusegemm: stream-K wait timed out: block %d waits on CTA %d\n", int(blockIdx.x), c);
          __trap();
        }
#endif
      }
    }
  }

  // Add the partials of CTAs first .. last, in that order, to this thread's accumulators.
  static FUSEGEMM_DEVICE void add(const float* partials, int first, int last, int t, float (&acc)[kAccum]) {
#pragma unroll 1
    for (int c = first; c <= last; ++c) {
      const float4* slot = reinterpret_cast<const float4*>(partials + static_cast<long long>(c) * kSlotFloats);
#pragma unroll
      for (int j = 0; j < kAccum / 4; ++j) {
        const float4 v = __ldcg(slot + j * kThreads + t);
        acc[4 * j] += v.x;
        acc[4 * j + 1] += v.y;
        acc[4 * j + 2] += v.z;
        acc[4 * j + 3] += v.w;
      }
    }
  }
};

}  // namespace fusegemm
