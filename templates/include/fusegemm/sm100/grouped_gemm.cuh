// sm_100a BF16 grouped GEMM (seed 001): tcgen05.mma kind::f16, FP32 accumulator in TMEM.
//
// Persistent warp-specialised kernel, 256 threads, 1 CTA per SM (role layout after CUTLASS
// KRN:144/418 and DeepGEMM impls/sm100_bf16_gemm.cuh, adapted):
//   warp 0      TMA producer: A (rows, K) and B (N, K, L) k-blocks into an smem ring
//   warp 1      MMA issuer: one elected lane issues tcgen05.mma + tcgen05.commit
//               (2-CTA tiles: only the even "leader" CTA of the pair issues)
//   warp 2      TMEM allocator (alloc at start, dealloc at the end)
//   warp 3      tile claimer (dynamic scheduling only)
//   warps 4..7  epilogue (one warpgroup: warp w reads TMEM lanes 32*(w%4)..)
// TILE_M 256 runs as a CTA pair with cta_group::2 (instruction M = 256): each CTA loads its 128
// A rows and half of B's rows, owns 128x TILE_N accumulators in its own TMEM and stores its
// rows. TILE_M 64 uses the M=64 instruction (accumulator rows in TMEM lanes (r%16)+32(r/16)).
// In a cluster larger than one MMA unit (CTA or pair), A k-blocks are multicast along cluster N
// and B k-blocks along cluster M (same expert only) and the cluster walks blocks of neighbouring
// tiles; fusegemm/cluster.cuh has the protocol.
// N-major B (Config::kBMajorMN, b_major n: the (L, N, K) view of (L, K, N) weights): a CTA's B
// stage holds kRowsB / 64 swizzle atoms of 64 N-elements (128 B) by kBlockK K rows, atoms one
// after another, each loaded as kMcSlices K slices; descriptors as umma.cuh "MN-major" (the
// block-scaled kernel's FP8 layout with 2-byte elements: LBO = 64 K rows x 128 B between atoms,
// SBO = 1 KB, K advance 16 rows x 128 B per instruction) and the instruction's b_major bit.
// K-grouped problems (Config::kKGrouped: the weight gradient dW_e = dY_e^T X_e over each expert's
// token rows, specs/grouped_gemm_wgrad.yaml; the sm_90a kernel's problem): tiles are (expert, M
// block, N block) of the (L, M, N) output (BatchedClusterScheduler), a tile's K range is its
// expert's token rows (scheduler.cuh kgrouped_k_range: per-tile k-blocks in the frame's producer
// and MMA loops), and both operands are token-major, so both are MN-major: A (dY, tokens x M) in
// 64-element M atoms like the N-major B above, with the instruction's a_major bit; their maps
// are 2-D (M or N, tokens). 1-CTA tiles of 128 rows, clusters 1x1 (the registry's limits). An
// expert without tokens gets no MMA and its tiles store alpha * 0 (the frame's k == 0 path).
// Gathered A (Config::kGatherA, a_gather: problem row r reads row a_index[r] of a token-major A;
// the sm_90a kernel's mode): 1-CTA tiles or a 2-CTA tile's pair (no larger clusters), A's map one
// row per box; each producer lane loads four of the CTA's rows per k-block with one TMA gather4
// (lane l rows 4l..4l+3, their indices read once per tile; a pair's in the 2-CTA form, completing
// on the leader's barrier), which lands them swizzled as a box would, so descriptors and byte
// counts are the plain kernel's. K-grouped gathered operands (a_gather: dY's token rows through a_index,
// b_gather: X's through b_index; the sm_90a kernel's modes): a k-block's 64 token rows are the K
// rows of the operand's MN-major atoms, so lane l loads rows 4 (l % 16) .. + 3 of atoms l / 16,
// l / 16 + 2, .. with one gather4 each (the map's boxes one token row of 64 columns), where the
// plain kernel's boxes would put them. Not yet run on a Blackwell GPU: the first-run gate runs a
// gathered configuration class's cases, operands through an index, before its first launch.
// Barrier and fence protocol: fusegemm/sm100/pipeline.cuh header, sm100-protocol.md §1/§4.
#pragma once

#include "fusegemm/sm100/kernel_frame.cuh"

namespace fusegemm::sm100 {

template <class Config>
struct GroupedGemmKernel {
  using ElementA = typename Config::ElementA;
  using ElementB = typename Config::ElementB;
  using ElementC = typename Config::ElementC;
  using ElementD = typename Config::ElementD;
  static_assert(fusegemm::is_same_v<ElementA, ElementB>, "A and B share one 16-bit format");
  static_assert(fusegemm::is_same_v<ElementA, fusegemm::bfloat16_t> || fusegemm::is_same_v<ElementA, fusegemm::half_t>,
                "kind::f16 kernel: A/B are bf16 or fp16");

  static constexpr int kFault = fault_injection<Config>();
  static constexpr int kTileM = Config::kTileM;
  static constexpr int kTileN = Config::kTileN;
  static constexpr int kCtaGroup = kTileM == 256 ? 2 : 1;
  static constexpr int kBlockK = 64;                       // 128 B of K per row: one SW128 atom
  static constexpr int kUmmaK = 16;                        // 256 bits of bf16
  static constexpr int kRowsA = kTileM / kCtaGroup;        // A rows (and D rows) per CTA
  static constexpr int kRowsB = kTileN / kCtaGroup;        // B rows per CTA (N split over the pair)
  static constexpr int kStageBytesA = kRowsA * kBlockK * 2;
  static constexpr int kStageBytesB = kRowsB * kBlockK * 2;
  static constexpr bool kKGrouped = Config::kKGrouped;
  static constexpr bool kAMn = kKGrouped;                  // dY: tokens x M, M contiguous
  static constexpr bool kBMn = Config::kBMajorMN;
  static constexpr bool kGatherA = Config::kGatherA;
  static constexpr bool kGatherB = Config::kGatherB;       // (K-grouped) X's token rows through b_index
  static constexpr bool kGathers = kGatherA || kGatherB;
  // (2-CTA tiles: each CTA of the pair gathers its own 128 rows, their bytes completing on the
  // leader's barrier as the pair's box loads do; a cluster of more than the pair is refused: the
  // registry's limits, gathered rows are not multicast.)
  static_assert(!kGatherB || kKGrouped, "gathered B: K-grouped problems (B is token rows only there)");
  static constexpr int kGatherLanes = kRowsA / 4;          // gathered M-grouped A: lanes with a gather4 each
  static_assert(!kKGrouped || (kBMn && kTileM == 128 && !Config::kDiscreteB && !Config::kDynamicSched),
                "K-grouped: token-major B (b_major n), 1-CTA tiles of 128 rows, dense, static scheduling");
  static constexpr int kBSwizzle = 128;                    // N-major atom: 64 bf16 columns
  static constexpr int kBMnAtomCols = kBSwizzle / 2;
  static constexpr int kBMnAtoms = kRowsB / kBMnAtomCols;  // 1 (2-CTA tile N 128), 2 or 4
  static constexpr int kSliceK = kBlockK / kMcSlices;      // N-major: K rows per slice
  static_assert(!kBMn || kRowsB % kBMnAtomCols == 0, "N-major B: whole 64-column atoms per CTA");
  static constexpr int kAMnAtoms = kRowsA / kBMnAtomCols;  // M-major A: 64-row atoms (K-grouped)
  // Byte offset of atom j's K slice i in an MN-major stage (atoms one after another).
  static constexpr int mn_offset(int j, int i) { return j * kBSwizzle * kBlockK + i * kSliceK * kBSwizzle; }
  static constexpr int kAccStages = 2 * kTileN <= kTmemColumns ? 2 : 1;
  static constexpr int kAccCols = kAccStages * kTileN;
  static constexpr int kTmemCols = tmem_alloc_columns(kAccCols);
  static constexpr int kSfBoxK = 0, kSfBoxNB = 0;  // no scale factors
  using Rule = typename Config::Rule;  // the epilogue rule generated from the spec
  // Scattered outputs (Config::kScatterD, M-grouped element-wise rules): C and D rows stored at
  // d_index (the engine's row stores, fusegemm/epilogue_block.cuh store_vals_rows).
  static constexpr bool kScatterD = Config::kScatterD;
  static_assert(!kScatterD || !Config::kKGrouped, "scattered outputs: M-grouped problems (the registry's limits)");
  // M-major D (Config::kDMajorM, K-grouped): D_e^T, stored column by column from the engine's rows.
  static constexpr bool kDMajorM = d_major_m_of<Config>(0);
  static_assert(!kDMajorM || kKGrouped, "an M-major D: K-grouped problems (the registry's limits)");
  using Engine = epi::BlockEngine<Rule, ElementC, ElementD, false, false, false, kScatterD, kDMajorM>;
  // Accumulator columns per engine block: 32, or a gate block and an up block when paired.
  static constexpr int kAccPerBlock = Rule::kPairedAcc ? 64 : 32;
  static_assert(kTileN % kAccPerBlock == 0, "tile N holds whole gate/up block pairs");
  static_assert(!Rule::kQuantColD || kTileM != 64, "column SFD needs 32 rows per epilogue warp (tile M >= 128)");
  static constexpr int kStagingBytes = Engine::kScratchBytes > 128 ? Engine::kScratchBytes : 128;

  using Frame = KernelFrame<kCtaGroup, Config::kDynamicSched, kStageBytesA, kStageBytesB, 0,
                            kAccStages, kTileN, kTmemCols, kStagingBytes * kNumEpiWarps,
                            Config::kDiscreteB ? 1 : 0, kStageBytesA + kStageBytesB, kFault>;
  using Scheduler = fusegemm::conditional_t<kKGrouped, BatchedClusterScheduler<kTileM, kTileN, kCtaGroup>,
                                            GroupedClusterScheduler<kTileM, kTileN, kCtaGroup>>;
  static constexpr int kStages = Frame::kStages;
  static constexpr int kThreads = Frame::kThreads;
  static constexpr int kSmemBytes = Frame::kSmemBytes;
  static constexpr int kTmapSlots = Frame::kTmapSlots;
  // Host contract for the tensor maps (runtime/tensormap.py): SWIZZLE_128B, K innermost, boxes
  // of (kBoxK, kBoxRows*): a CTA's rows are loaded as kMcSlices slices so that every CTA of a
  // multicast group loads a part of every stage (cluster.cuh); the host reads the box rows from
  // the cubin's launch facts.
  static constexpr int kSliceRowsA = kRowsA / kMcSlices, kSliceRowsB = kRowsB / kMcSlices;
  static constexpr int kBoxK = kBlockK, kBoxRowsA = kSliceRowsA, kBoxRowsB = kSliceRowsB;
  // Host contract (fusegemm/base/contract.py): the boxes above, SWIZZLE_128B, in the elements'
  // own TMA type; the smallest cluster is the CTA pair of a 2-CTA tile; discrete weights get
  // Frame::kTmapSlotStride slots of 128 B per CTA in tmap_workspace.
  static constexpr int kTileK = kBlockK;
  static constexpr int kMinClusterM = kCtaGroup, kMinClusterN = 1, kCtasPerTile = kCtaGroup;
  static constexpr int kMaxClusterCtas = fusegemm::kMaxClusterCtas;
  static constexpr int kMAligned = fusegemm::kMAligned;
  // N-major B (and K-grouped A): boxes of (64 N (M), kSliceK K), per atom and slice.
  // Gathered A: one row per box (the map's rows are A's tokens; gather4 takes four at a time).
  static constexpr int kBoxAInner = kAMn ? kBMnAtomCols : kBoxK,
                       kBoxAOuter = kGatherA ? 1 : kAMn ? kSliceK : kBoxRowsA;
  static constexpr int kBoxBInner = kBMn ? kBMnAtomCols : kBoxK,
                       kBoxBOuter = kGatherB ? 1 : kBMn ? kSliceK : kBoxRowsB;
  static constexpr int kSwizzleA = 128, kSwizzleB = 128;
  static constexpr int kTmaDtypeA = TmaDtype<ElementA>::value, kTmaDtypeB = TmaDtype<ElementB>::value;
  static constexpr int kTmapSlotStride = Config::kDiscreteB ? Frame::kTmapSlotStride : 0;
  static_assert(kSliceRowsA % 8 == 0 && kSliceRowsB % 8 == 0 && (kSliceK * kBSwizzle) % 1024 == 0,
                "bug #5: slices are whole 8-row SW128 atoms (1024-B aligned destinations)");

  // ---- static protocol checks (sm100-protocol.md §8) ----
  static constexpr uint32_t kIdesc =
      idesc_f16(kTileM, kTileN, kFault == kFaultWrongFormat ? F16Fmt::F16 : f16_fmt<ElementA>(),
                f16_fmt<ElementB>(), kAMn, kBMn);
  // Shared-memory descriptors: hi word, LBO and K advance per instruction (bug #4, #6). An
  // MN-major operand (N-major B, M-major A) has one layout: 64-element atoms of 64 K rows.
  static constexpr uint32_t kMnDescHi = mn_major_hi(kBSwizzle, mn_major_sbo(kBSwizzle));
  static constexpr uint32_t kMnKStep = mn_major_kstep(kBSwizzle, kUmmaK);
  static constexpr uint32_t kDescHiB = kBMn ? kMnDescHi : kSw128KMajorHi;
  static constexpr uint32_t kLboB = kBMn ? mn_major_lbo(kBSwizzle, kBlockK, kBMnAtoms) : kSw128KMajorLbo;
  static constexpr uint32_t kKStepB = kBMn ? kMnKStep : kDescKStep;
  static constexpr uint32_t kDescHiA = kAMn ? kMnDescHi : kSw128KMajorHi;
  static constexpr uint32_t kLboA = kAMn ? mn_major_lbo(kBSwizzle, kBlockK, kAMnAtoms) : kSw128KMajorLbo;
  static constexpr uint32_t kKStepA = kAMn ? kMnKStep : kDescKStep;
  static_assert(legal_f16_shape<kCtaGroup, kTileM, kTileN>(), "bug #9: illegal kind::f16 shape");
  static_assert(kTileM == 64 || kTileM == 128 || kTileM == 256, "TILE_M in {64, 128, 256}");
  static_assert(kTileN == 128 || kTileN == 256, "TILE_N in {128, 256}");
  // The cluster shape is a launch attribute (Params::cluster_m/cluster_n, cluster.cuh): one
  // cubin serves every legal cluster. The spec constraints and the launcher keep cluster M even
  // for 2-CTA tiles (the kernel exports its minimum, 2x1).
  // bug #3: every field but M/N equals the golden bf16 descriptor 0x08400490 (F32 acc, BF16 A/B,
  // K-major, dense) plus the a_major bit [15] of M-major A and the b_major bit [16] of N-major B;
  // M/N fields as the instruction shape.
  static_assert(!fusegemm::is_same_v<ElementA, fusegemm::bfloat16_t> ||
                    (kIdesc & ~kIdescShapeMask) ==
                        ((0x08400490u | (uint32_t(kAMn) << 15) | (uint32_t(kBMn) << 16)) & ~kIdescShapeMask),
                "bug #3: instruction descriptor differs from the golden bf16 descriptor");
  static_assert((kIdesc & kIdescShapeMask) == ((uint32_t(kTileN >> 3) << 17) | (uint32_t(kTileM >> 4) << 24)),
                "bug #3: instruction shape fields");
  static_assert(kUmmaK * 16 / 128 == int(kDescKStep), "bug #6: K advance +2 per k-block");
  static_assert(kBlockK * 2 == 128, "bug #4: K-major SW128 descriptor assumes 128-B rows");
  // CUTLASS make_umma_desc<Major::MN> on tile_to_shape(Layout_MN_SW128_Atom<bfloat16_t>,
  // (kRowsB, 64), Step<_2,_1>): hi 0x40004040, LBO 8192 (0 for one atom), next K=16 slice 2048 B
  // on (tests/unit/test_sm100_multicast.py recomputes them from the CuTe headers).
  static_assert(!kBMn || (kDescHiB == 0x40004040u && kLboB == (kBMnAtoms > 1 ? 8192u : 0u) && kKStepB == 128u),
                "bug #4/#6: N-major B descriptor (CUTLASS make_umma_desc<Major::MN>, SW128, bf16)");
  // The same golden values for M-major A (128 rows: two atoms, LBO 8192).
  static_assert(!kAMn || (kDescHiA == 0x40004040u && kLboA == 8192u && kKStepA == 128u),
                "bug #4/#6: M-major A descriptor (CUTLASS make_umma_desc<Major::MN>, SW128, bf16)");
  static_assert(kAccCols <= kTmemCols && kTmemCols <= kTmemColumns, "bug #10: TMEM overflow");
  static_assert(Frame::kTxBytes == (kStageBytesA + kStageBytesB) * kCtaGroup,
                "bug #1: expect_tx = boxes of both CTAs");

  template <class Params>
  static __device__ Scheduler make_sched(const Params& p, const Frame& f) {
    if constexpr (kKGrouped) return Scheduler(p.m_rows, p.n, p.num_experts, f.geom);
    else return Scheduler(static_cast<const int*>(p.offsets), p.num_experts, p.n, p.m_rows, f.geom);
  }

  template <class Params>
  static __device__ void run(const Params& p) {
    if constexpr (kKGrouped) {
      // One K range per expert: the frame's loops take each tile's k-blocks from its expert.
      run_with(p, [&p](const ClusterTile& t) {
        return kgrouped_k_range<kBlockK>(static_cast<const int*>(p.offsets), static_cast<const int*>(p.row_ends), t.expert, p.k).y;
      });
    } else {
      run_with(p, (p.k + kBlockK - 1) / kBlockK);
    }
  }

  // k_blocks: every tile's k-blocks, or (K-grouped) a callable giving a tile's.
  template <class Params, class KBlocks>
  static __device__ void run_with(const Params& p, const KBlocks& k_blocks) {
    Frame f;
    f.setup(p);
    const Scheduler sched = make_sched(p, f);

    if (f.warp == kWarpTma) {
      // Discrete weights: per-expert B maps rewritten on the device (tma.cuh DeviceTmap).
      DeviceTmap<Frame::kTmapSlots> dtm;
      const CUtensorMap* tmap_b = &p.tma_b;
      int map_expert = -1;
      if (Config::kDiscreteB && f.lane == 0) {
        dtm.init(&p.tma_b, static_cast<CUtensorMap*>(p.tmap_workspace) + cta_linear_id() * Frame::kTmapSlotStride,
                 f.tmap_staging);
      }
      // Gathered A: this lane's four rows of the tile (rows of A; -1 past the problem's rows,
      // which the map reads as zeros, as any row outside A).
      int g[4] = {-1, -1, -1, -1};
      f.template producer<kGathers>(p, sched, k_blocks, [&](const ClusterTile& t, int kb, uint64_t* bar, int s) {
        // K-grouped: the k-block's token rows start at the expert's first (both maps 2-D).
        const int k0 = (kKGrouped ? kgrouped_k_range<kBlockK>(static_cast<const int*>(p.offsets),
                                                               static_cast<const int*>(p.row_ends), t.expert, p.k).x
                                  : 0) + kb * kBlockK;
        const int m_row = t.m_block * kTileM + f.cta_half * kRowsA;
        const int n_row = t.n_block * kTileN + f.cta_half * kRowsB;
        if constexpr (kKGrouped && kGathers) {   // (every lane: the frame's warp loads)
          // (the plain loads' cache hints: A's boxes evict first, B's last)
          if constexpr (kGatherA) {
            gather_mn<kAMnAtoms>(&p.tma_a, p.a_index, bar, f.smem_a(s), m_row, k0, f.lane, CacheHint::kEvictFirst);
          }
          if constexpr (kGatherB) {
            gather_mn<kBMnAtoms>(&p.tma_b, p.b_index, bar, f.smem_b(s), n_row, k0, f.lane, CacheHint::kEvictLast);
          }
          if (f.lane != 0) return;   // the operand that is not gathered: lane 0's
        } else if constexpr (kGatherA) {   // (every lane: the frame's warp loads)
          if (f.lane < kGatherLanes) {
            // (this CTA's rows: m_row includes the pair half)
            if (kb == 0) gather4_tokens(static_cast<const int*>(p.a_index), m_row + 4 * f.lane, p.m_rows, g);
            tma_gather4_nd<kCtaGroup>(&p.tma_a, bar, f.smem_a(s) + f.lane * 4 * kBlockK * 2, k0, g[0], g[1], g[2],
                                      g[3]);
          }
          if (f.lane != 0) return;   // B (and a discrete map's rewrite): lane 0's
        }
        if constexpr (Config::kDiscreteB) {
          if (t.expert != map_expert) {
            tmap_b = dtm.update(reinterpret_cast<const void*>(
                __ldg(static_cast<const unsigned long long*>(p.b_ptrs) + t.expert)));
            map_expert = t.expert;
          }
        }
        // A is shared along cluster N, B along cluster M (cluster.cuh), slice by slice (not
        // unrolled: the producer's hoisted slice addresses would raise the kernel's registers).
        const Share sa = f.share_a(), sb = f.share_b(t.share_b);
#pragma unroll 1
        for (int i = 0; i < (kGatherA ? 0 : kMcSlices); ++i) {
          if constexpr (kAMn) {   // per 64-row atom of the CTA's M rows, K slice i (as N-major B)
#pragma unroll
            for (int j = 0; j < kAMnAtoms; ++j) {
              f.template load_slice<2>(sa, i, &p.tma_a, bar, f.smem_a(s) + mn_offset(j, i),
                                       m_row + j * kBMnAtomCols, k0 + i * kSliceK, 0, 0, CacheHint::kEvictFirst);
            }
          } else {
            f.template load_slice<2>(sa, i, &p.tma_a, bar, f.smem_a(s) + i * kSliceRowsA * kBlockK * 2,
                                     k0, m_row + i * kSliceRowsA, 0, 0, CacheHint::kEvictFirst);
          }
        }
        constexpr int kDimsB = (Config::kDiscreteB || kKGrouped) ? 2 : 3;
#pragma unroll 1
        for (int i = 0; i < (kGatherB ? 0 : kMcSlices); ++i) {
          if constexpr (kBMn) {
            // Dense B: 3-D map (N, K, L); discrete: the expert's 2-D (N, K) map. Per 64-column
            // atom of the CTA's columns, K slice i.
#pragma unroll
            for (int j = 0; j < kBMnAtoms; ++j) {
              f.template load_slice<kDimsB>(sb, i, tmap_b, bar, f.smem_b(s) + mn_offset(j, i),
                                            n_row + j * kBMnAtomCols, k0 + i * kSliceK, t.expert, 0,
                                            CacheHint::kEvictLast);
            }
          } else {
            // Dense B: 3-D map (K, N, L); discrete: the expert's 2-D (K, N) map.
            f.template load_slice<kDimsB>(sb, i, tmap_b, bar, f.smem_b(s) + i * kSliceRowsB * kBlockK * 2,
                                          k0, n_row + i * kSliceRowsB, t.expert, 0, CacheHint::kEvictLast);
          }
        }
      });
    } else if (f.warp == kWarpMma) {
      if (f.is_leader) {
        f.mma_loop(sched, k_blocks, [&](uint32_t d_tmem, int s, bool accumulate) {
          const uint64_t da = make_smem_desc(smem_u32(f.smem_a(s)), kDescHiA, kLboA);
          const uint64_t db = make_smem_desc(smem_u32(f.smem_b(s)), kDescHiB, kLboB);
#pragma unroll
          for (int k = 0; k < kBlockK / kUmmaK; ++k) {
            if constexpr (kFault != kFaultSkipMma) {
              mma_f16<kCtaGroup>(d_tmem, da + k * kKStepA, db + k * kKStepB, kIdesc, accumulate || k > 0);
            }
          }
        });
      }
    } else if (f.warp == kWarpSched) {
      f.claim_tiles(p, sched.num_tiles());
    } else if (f.warp >= kFirstEpiWarp) {
      epilogue(p, f, sched, k_blocks);
    }
    f.teardown();
  }

  // A gathered MN-major operand's k-block (K-grouped): the 64 token rows from k0 are the K rows of
  // kAtoms atoms of 64 columns (from c0); row t of each reads token row index[k0 + t] (a row outside
  // the map, the routing's -1 padding included, reads zeros). Lane l: rows 4 (l % 16) .. + 3 of
  // atoms l / 16, l / 16 + 2, .., one gather4 each, at the rows a box would fill.
  template <int kAtoms>
  static __device__ void gather_mn(const CUtensorMap* map, const void* index_ptr, uint64_t* bar, uint8_t* stage,
                                   int c0, int k0, int lane, CacheHint hint) {
    static_assert(kAtoms % 2 == 0, "two atoms per gather4 row group (16 groups of 4 rows, 32 lanes)");
    const int g = lane % 16;
    const int* index = static_cast<const int*>(index_ptr) + k0 + 4 * g;
    const int r0 = __ldg(index), r1 = __ldg(index + 1), r2 = __ldg(index + 2), r3 = __ldg(index + 3);
#pragma unroll
    for (int j = lane / 16; j < kAtoms; j += 2) {
      tma_gather4(map, bar, stage + mn_offset(j, 0) + 4 * g * kBSwizzle, c0 + j * kBMnAtomCols, r0, r1, r2, r3, hint);
    }
  }

  template <class Params, class Sched, class KBlocks>
  static __device__ void epilogue(const Params& p, Frame& f, const Sched& sched, const KBlocks& k_blocks) {
    const int ew = f.warp - kFirstEpiWarp;  // == warp % 4: the TMEM lane quarter it may read
    constexpr bool kM64 = kTileM == 64;
    const int rows_valid = kM64 ? 16 : 32;
    const uint32_t buf = smem_u32(f.staging) + ew * kStagingBytes;
    Rule rule;
    typename Engine::Partials part;
    part.reset();
    // Element columns: the accumulator's, or half of them when the rule pairs gate/up blocks.
    const int width = Rule::kPairedAcc ? p.n / 2 : p.n;
    f.epilogue_loop(sched, [&](const ClusterTile& t, uint32_t acc_col) {
      // K-grouped: expert e's (M, N) block is rows e * M.. of D.
      const int warp_row0 = (kKGrouped ? t.expert * p.m_rows : 0) + t.m_block * kTileM + f.cta_half * kRowsA +
                            ew * rows_valid;
      const bool no_k = tile_k_blocks(k_blocks, t) == 0;   // nothing multiplied: zeros
      rule.begin_tile(p, t.expert);
#pragma unroll 1
      for (int c = 0; c < kTileN / kAccPerBlock; ++c) {
        float acc[Engine::kAccVals];
        tmem_load_chunk(tmem_addr(f.tmem_base, 32 * ew, acc_col + c * kAccPerBlock), no_k, acc);
        if constexpr (Rule::kPairedAcc) {  // the up block, 32 columns after the gate block
          tmem_load_chunk(tmem_addr(f.tmem_base, 32 * ew, acc_col + c * kAccPerBlock + kEpiChunkCols),
                          no_k, acc + 32);
        }
        if (c == kTileN / kAccPerBlock - 1) f.release_accumulator();  // after the last wait::ld
        if constexpr (kFault == kFaultSpill) spill_through_local(*reinterpret_cast<float(*)[32]>(acc), f.lane);
        const int j0 = (t.n_block * kTileN + c * kAccPerBlock) / (Rule::kPairedAcc ? 2 : 1);
        if (j0 >= width) continue;  // warp-uniform: past N
        Engine::run(rule, p, t.expert, warp_row0, rows_valid, j0, width, acc, buf, f.lane, part);
      }
      Engine::flush_tile(part, p, t.expert, warp_row0, rows_valid, f.lane);
    });
  }
};

}  // namespace fusegemm::sm100
