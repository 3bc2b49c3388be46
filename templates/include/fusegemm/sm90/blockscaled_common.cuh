// What the sm_90a block-scaled kernel (blockscaled_promote.cuh) keeps apart from its mainloop:
// the operand checks, the tile schedule (grouped over padded_offsets or batched), the
// tile ring the producer publishes tiles through, the B / SFB tensor maps of discrete weights,
// and the host contract fields that do not depend on the mainloop.
#pragma once

#include "fusegemm/common.cuh"
#include "fusegemm/scheduler.cuh"
#include "fusegemm/tma.cuh"

// The epilogue path of both block-scaled kernels (fusegemm/sm90/epilogue.cuh): 1 runs the rules
// the BF16 kernel runs on the WGMMA fragment (element-wise; paired or reducing without SFD
// quantization; 16/32-bit outputs, N-major C) there too; 0 sends every rule through the
// arch-neutral engine, where two of each warpgroup's four warps work, lane = row (the measured
// baseline, an A/B switch through FUSEGEMM_NVRTC_EXTRA). Quantized and narrow outputs and M-major
// C take the engine either way.
#ifndef FUSEGEMM_SM90_BS_FRAGMENT
#define FUSEGEMM_SM90_BS_FRAGMENT 1
#endif

namespace fusegemm {
namespace sm90 {

// WgmmaEpilogue's kForceEngine for a block-scaled Config (FUSEGEMM_SM90_BS_FRAGMENT above).
template <class Config>
inline constexpr bool kScaledForceEngine = !FUSEGEMM_SM90_BS_FRAGMENT || Config::kCMajorM;

// The Config facts the kernel requires (the registry's sm_90a limits state the same).
template <class Config>
struct ScaledConfigChecks {
  using ElementAB = typename Config::ElementA;
  static constexpr bool kE4M3 = fusegemm::is_same_v<ElementAB, fusegemm::float_e4m3_t>;
  static_assert(fusegemm::is_same_v<ElementAB, typename Config::ElementB>, "A and B share one format");
  static_assert(kE4M3 || fusegemm::is_same_v<ElementAB, fusegemm::float_e5m2_t>,
                "sm_90a block-scaled kernel: MXFP8 (e4m3 / e5m2) A and B");
  static_assert(fusegemm::is_same_v<typename Config::ElementSF, fusegemm::float_ue8m0_t> && Config::kSfVec == 32,
                "MXFP8: E8M0 scales per 32 K");
  static_assert(!Config::kAMajorMN && !Config::kBMajorMN, "K-major A and B (the registry's sm_90a limits)");
  static_assert(!Config::kCMajorM || !Config::Rule::kHasD, "M-major output: C only (seed 004)");
  static_assert(Config::kTileM == 128, "sm_90a block-scaled kernel: TILE_M 128 (two consumer warpgroups)");
  static_assert(Config::kTileN == 128 || Config::kTileN == 256, "sm_90a block-scaled kernel: TILE_N 128 or 256");
  static_assert(!Config::kKGrouped, "K-grouped block-scaled GEMMs: the blockwise recipe's kernel only");
};

// Host contract fields (fusegemm/base/contract.py) that do not depend on the mainloop: no
// clusters, 256-row expert padding, uint8 maps, [B x 8][SFB x 8] tensor-map slots per CTA for
// discrete weights, no TMEM.
template <bool kDiscreteB>
struct ScaledHostContract {
  static constexpr int kMinClusterM = 1, kMinClusterN = 1, kMaxClusterCtas = 1, kCtasPerTile = 1;
  static constexpr int kMAligned = fusegemm::kMAligned;
  static constexpr int kTmaDtypeA = TmaDtype<uint8_t>::value, kTmaDtypeB = TmaDtype<uint8_t>::value;
  static constexpr int kTmapSlotsPerMap = 8;
  static constexpr int kTmapSlotStride = kDiscreteB ? 2 * kTmapSlotsPerMap : 0;
  static constexpr int kTmemCols = 0;
};

// The tile order: grouped over padded_offsets, or batched (seed 004: L batches of m_rows rows).
template <int kTileM, int kTileN, bool kBatched>
struct ScaledSchedule {
  using Grouped = GroupedScheduler<kTileM, kTileN, FUSEGEMM_RASTER_GROUP>;
  using Batched = BatchedScheduler<kTileM, kTileN, FUSEGEMM_RASTER_GROUP>;
  using Sched = fusegemm::conditional_t<kBatched, Batched, Grouped>;

  template <class Params>
  static __device__ Sched make(const Params& p) {
    if constexpr (kBatched) {
      return Batched(p.m_rows, p.n, p.num_experts);
    } else {
      return Grouped(reinterpret_cast<const int*>(p.offsets), p.num_experts, p.n, p.m_rows);
    }
  }
};

// Tiles flow from the producer to every other role through a ring of kSlots int4 entries
// (expert, m_block, n_block, linear; linear < 0 ends the walk) with full / empty barriers.
template <int kSlots>
struct TileRing {
  uint64_t* full;
  uint64_t* empty;   // one arrival per reading warp
  int4* slots;

  // One warp's walk: false at the end marker.
  struct Reader {
    int slot = 0;
    uint32_t phase = 0;
    FUSEGEMM_DEVICE bool next(const TileRing& r, int lane, int4& t) {
      mbar_wait(&r.full[slot], phase);
      t = r.slots[slot];
      __syncwarp();
      if (lane == 0) mbar_arrive(&r.empty[slot]);
      if (++slot == kSlots) { slot = 0; phase ^= 1; }
      return t.w >= 0;
    }
  };

  // The producer thread's side.
  struct Writer {
    int slot = 0;
    uint32_t phase = 0;
    FUSEGEMM_DEVICE void publish(const TileRing& r, const GroupedTile& t) {
      mbar_wait(&r.empty[slot], phase ^ 1);
      r.slots[slot] = make_int4(t.expert, t.m_block, t.n_block, t.linear);
      mbar_arrive(&r.full[slot]);
      if (++slot == kSlots) { slot = 0; phase ^= 1; }
    }
  };
};

// The B and SFB maps a load uses: the host's dense maps, or per-expert copies rewritten on the
// device for discrete weights (kSlots slots per map in tmap_workspace, kSlotsPerMap reserved).
template <bool kDiscrete, int kSlots, int kSlotsPerMap>
struct WeightMaps {
  DeviceTmap<kSlots> b_maps, sfb_maps;
  const CUtensorMap* b = nullptr;
  const CUtensorMap* sfb = nullptr;
  int expert = -1;

  // Single thread. staging: two 128-byte aligned shared-memory map copies.
  template <class Params>
  FUSEGEMM_DEVICE void init(const Params& p, CUtensorMap* staging, int slot_stride) {
    prefetch_tmap(&p.tma_a);
    prefetch_tmap(&p.tma_b);
    prefetch_tmap(&p.tma_sfa);
    prefetch_tmap(&p.tma_sfb);
    b = &p.tma_b;
    sfb = &p.tma_sfb;
    if constexpr (kDiscrete) {
      CUtensorMap* ws = reinterpret_cast<CUtensorMap*>(p.tmap_workspace) + blockIdx.x * slot_stride;
      b_maps.init(&p.tma_b, ws, staging);
      sfb_maps.init(&p.tma_sfb, ws + kSlotsPerMap, staging + 1);
    }
  }

  // One stage's loads, completing on `bar`: A rows m0.. (batch l) at `a`, B rows n0.. (expert or
  // batch lb) at `b_dst`, and the SFA / SFB atoms of 128-K block k_atom at `sfa` / `sfb_dst`.
  // kx: the stage's first K byte.
  template <bool kBatched, class Params>
  FUSEGEMM_DEVICE void load_stage(const Params& p, uint64_t* bar, uint8_t* a, uint8_t* b_dst, uint8_t* sfa,
                                  uint8_t* sfb_dst, int kx, int k_atom, int m0, int n0, int l, int lb) const {
    if constexpr (kBatched) {
      tma_load_3d(&p.tma_a, bar, a, kx, m0, l);
    } else {
      tma_load_2d(&p.tma_a, bar, a, kx, m0);
    }
    if constexpr (kDiscrete) {
      tma_load_2d(b, bar, b_dst, kx, n0);
    } else {
      tma_load_3d(b, bar, b_dst, kx, n0, lb);
    }
    tma_load_4d(&p.tma_sfa, bar, sfa, 0, k_atom, m0 / 128, l);
    tma_load_4d(sfb, bar, sfb_dst, 0, k_atom, n0 / 128, lb);
  }

  // Call only after the stage's empty wait (DeviceTmap: a slot is rewritten kSlots loads later).
  template <class Params>
  FUSEGEMM_DEVICE void select(const Params& p, int e) {
    if constexpr (kDiscrete) {
      if (e != expert) {
        b = b_maps.update(reinterpret_cast<const void*>(reinterpret_cast<const uint64_t*>(p.b_ptrs)[e]));
        sfb = sfb_maps.update(reinterpret_cast<const void*>(reinterpret_cast<const uint64_t*>(p.sfb_ptrs)[e]));
        expert = e;
      }
    }
  }
};

// The next tile of this CTA's persistent walk: claimed from the per-call counter (dynamic
// scheduling) or the static stride.
template <bool kDynamic, class Params, class Sched>
FUSEGEMM_DEVICE GroupedTile claim_tile(const Params& p, StaticWalk& walk, const Sched& sched) {
  const int linear = kDynamic ? dynamic_claim(reinterpret_cast<unsigned int*>(p.sched_counter)) : walk.claim();
  return sched.tile(linear);
}

// 2^(byte - 127) (0x00: 2^-127, an FP32 subnormal; 0xFF: NaN); 0 for a 32-K block past K, so SF
// padding bytes never meet the zero-filled data.
FUSEGEMM_DEVICE uint32_t e8m0_bits(uint32_t byte, bool real) {
  const uint32_t bits = byte == 0 ? 0x00400000u : byte == 0xFFu ? 0x7FC00000u : byte << 23;
  return real ? bits : 0u;
}

}  // namespace sm90
}  // namespace fusegemm
