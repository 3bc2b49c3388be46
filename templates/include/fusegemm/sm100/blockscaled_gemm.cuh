// sm_100a block-scaled GEMM (MXFP8 / NVFP4 / MXFP4) with the spec's epilogue rule (seeds 000, 002,
// 003, 004: dSwiGLU, sReLU, quant, GEMM + amax), grouped over padded_offsets (kBatched = false) or
// batched dense (kBatched = true, L = num_experts).
//
// Kinds (sm100-protocol.md §2-3; CUTLASS UMMA:990/1358, BSC):
//   e4m3 / e5m2, vec 32, UE8M0       kind::mxf8f6f4          tile K 128 (128 B), 4 x K32
//   e2m1 packed, vec 32, UE8M0       kind::mxf4.block32      tile K 256 (128 B), 4 x K64
//   e2m1 packed, vec 16, UE4M3/UE8M0 kind::mxf4nvf4.block16  tile K 256 (128 B), 4 x K64
// Scale factors (32x4x4 atoms, 512 B = 128 MN x 4 k) ride the A/B barrier (counted in
// expect_tx, BSC:288-293), are copied to TMEM by the MMA thread with UTCCP 32x128b.warpx4 just
// before the k-tile's MMAs (BSC:1059-1063; tensor-pipe order makes a wait unnecessary) into a
// single TMEM buffer after the accumulators, laid out [k-atom][mn-atom][4 columns]: MMA row r
// reads lane r%32, column base + r/32, byte sf_id (TRA:815).
// TILE_M 64 issues M = 128 (block-scaled 1-CTA M is 128 only): the 64 rows land in the half of a
// 128-row smem stage that matches their half of the 128-row SF atom, so SF lanes line up; the
// other half of the accumulator is ignored (DeepGEMM pads the same way).
//
// MN-major A / B (FP8 only, Config::kAMajorMN / kBMajorMN; seed 004 a_major m, b_major n): the
// stage of an MN-major operand holds, per swizzle atom, S MN-bytes (S = 128, or 64 when a CTA
// holds 64 columns of B) by kBlockK K rows (loaded as four K slices), atoms one after another;
// descriptors, K advance and the instruction descriptor's a_major/b_major bits as umma.cuh
// "MN-major" (CUTLASS make_umma_desc<Major::MN> on the layout its sm100 collectives build with
// tile_to_mma_shape(..., Step<_2,_1,_3>): K first inside an MN atom).
// TILE_M 64 loads the whole 128-row M atom that holds its rows (tx = 16 KB for A), so the
// accumulator rows sit in the same half as the K-major path puts them.
//
// K-grouped (Config::kKGrouped: the weight gradient dW_e = dY_e^T X_e, MXFP8): tiles are (expert,
// M block, N block) of the (L, M, N) output (the batched tile walk over L experts of M rows), and
// a tile's k-blocks are its expert's token columns [offsets[e-1], offsets[e]) of A = dY^T (M, T)
// and B = X^T (N, T), both K-major (token-contiguous) with E8M0 scales per 32 tokens in the usual
// atoms (SFA over (M, T/32), SFB over (N, T/32)): the k-block's token offset moves the A / B
// boxes and the SF atoms' K coordinate (offsets are multiples of 256: whole atoms). 1-CTA tiles of
// 128 rows, clusters 1x1; an expert without tokens stores the rule of a zero accumulator.
//
// Gathered A (Config::kGatherA, a_gather: problem row r reads token row a_index[r] of a token-major
// FP8 A and its MX scales; MXFP8, and the blockwise recipe's E8M0 scales run as MX): 1-CTA tiles
// without clusters. Each producer lane loads four of the tile's rows per k-block with one TMA
// gather4 (the BF16 kernel's loads: they land swizzled as A's boxes would, their bytes counted as
// the boxes') and copies those rows' scale words, one 4-byte cp.async per row (a token's four
// scales of a 128-K block are one word of its atom: fusegemm/gather.cuh GatherSfRows), into the
// stage's SFA atom; it publishes the stage one stage later (GatherPublisher: its copies landed,
// fence.proxy.async for UTCCP's async-proxy reads, an arrival on the stage's full barrier, whose
// count the copying lanes raise). A 2-CTA tile's peer would have to publish on its leader's
// barrier (a cluster-scope arrival and wait): not written, so the registry keeps gathered tiles
// at 64 and 128 rows (CUTLASS's block-scaled TMA + cp.async mainloop,
// sm100_blockscaled_mma_mixed_tma_cpasync_warpspecialized.hpp, is 1-SM without clusters too).
// Not yet run on a Blackwell GPU: the first-run gate runs the gathered configuration class's
// cases (rows and scales through an index) before its first launch.
// Cluster multicast (fusegemm/cluster.cuh): A and SFA k-blocks are multicast along cluster
// N, B and SFB along cluster M; the tile walk hands a cluster pm x cn neighbouring tiles.
//
// Host contract (tensor maps, runtime/tensormap.py; MN-major maps are not encoded by any public
// op yet, this is their contract). Every A/B box is a quarter slice (kMcSlices) of what a CTA
// holds per stage, so that each CTA of a multicast group loads part of every stage (cluster.cuh):
//   tma_a   uint8 view of A, K-major: grouped 2-D (K bytes, rows); batched 3-D (K bytes, M, L);
//           box (128, kBoxRowsA = rows / 4), SWIZZLE_128B. (packed FP4: K bytes = K / 2)
//           M-major (kAMajorMN): grouped 2-D (rows, K); batched 3-D (M, K, L) (element (m, k, l)
//           at (l * K + k) * lda + m); box (kBoxRowsA = 128 M, kBoxKA = 32 K), SWIZZLE_128B.
//   tma_b   uint8 view of B: dense 3-D (K bytes, N, L); discrete 2-D template; box (128, kBoxRowsB =
//           rows / 4), SW128.
//           N-major (kBMajorMN): dense 3-D (N, K, L); discrete 2-D (N, K); box (kBoxRowsB, kBoxKB = 32)
//           with kBoxRowsB = kBSwizzle N (128, or 64 for 2-CTA tiles of N 128: SWIZZLE_64B); a CTA
//           loads kRowsB / kBoxRowsB of them side by side per K slice.
//   c_out   N-major: (row, col, l) at (l * M + row) * ldc + col (grouped: l = 0); M-major
//           (kCMajorM): at (l * N + col) * ldc + row; packed FP4 C: element index / 2 bytes.
//   tma_sfa/tma_sfb  uint32 view of the SF atoms, 4-D {128, ceil(sfk/4), ceil(mn/128), L}
//           (grouped A: L = 1), box {128, kSfKAtoms, 1 | kTileN/128, 1}, no swizzle.
#pragma once

#include "fusegemm/gather.cuh"
#include "fusegemm/sm100/kernel_frame.cuh"

namespace fusegemm::sm100 {

// Operand format code: packed e2m1 uses the kind::mxf4/mxf4nvf4 code (1), not f8f6f4's 5.
template <class T> constexpr MxFmt mx_fmt() {
  return fusegemm::is_same_v<T, fusegemm::float_e5m2_t> ? MxFmt::E5M2
         : fusegemm::is_same_v<T, fusegemm::float_e2m1_t> ? MxFmt::E2M1_PACKED : MxFmt::E4M3;
}

template <class Config>
struct BlockScaledGemmKernel {
  using ElementAB = typename Config::ElementA;
  using ElementSF = typename Config::ElementSF;
  using ElementC = typename Config::ElementC;
  static_assert(fusegemm::is_same_v<ElementAB, typename Config::ElementB>, "A and B share one format");
  static constexpr bool kFp4 = fusegemm::is_same_v<ElementAB, fusegemm::float_e2m1_t>;
  static constexpr bool kFp8 = fusegemm::is_same_v<ElementAB, fusegemm::float_e4m3_t> ||
                               fusegemm::is_same_v<ElementAB, fusegemm::float_e5m2_t>;
  static constexpr bool kUe8m0 = fusegemm::is_same_v<ElementSF, fusegemm::float_ue8m0_t>;
  static constexpr int kSfVec = Config::kSfVec;
  static_assert(kFp4 || kFp8, "block-scaled A/B: e4m3, e5m2 or e2m1");
  static_assert(kUe8m0 || fusegemm::is_same_v<ElementSF, fusegemm::float_ue4m3_t>, "SF: ue8m0 or ue4m3");
  static_assert(kSfVec == 16 || kSfVec == 32, "sf_vec_size 16 or 32");
  static_assert(!kFp8 || (kSfVec == 32 && kUe8m0), "FP8 A/B: MXFP8 (vec 32, E8M0) only");
  static_assert(kUe8m0 || kSfVec == 16, "E4M3 scales need vec 16 (NVFP4)");
  static constexpr MmaKind kKind = kFp8 ? MmaKind::MXF8F6F4 : kSfVec == 32 ? MmaKind::MXF4 : MmaKind::MXF4NVF4;

  static constexpr int kFault = fault_injection<Config>();
  static constexpr int kTileM = Config::kTileM, kTileN = Config::kTileN;
  static constexpr int kCtaGroup = kTileM == 256 ? 2 : 1;
  static constexpr int kMmaM = kTileM == 64 ? 128 : kTileM;  // M=64 padded to the legal 128
  static constexpr int kRowsD = kTileM / kCtaGroup;         // accumulator rows a CTA owns
  static constexpr int kRowsA = kMmaM / kCtaGroup;          // A rows per smem stage
  static constexpr int kRowsB = kTileN / kCtaGroup;
  static constexpr int kElemsPerByte = kFp4 ? 2 : 1;
  static constexpr int kBlockKBytes = 128;                  // one SW128 atom row
  static constexpr int kBlockK = kBlockKBytes * kElemsPerByte;  // elements per k-block
  static constexpr int kUmmaK = kUmmaKBytes * kElemsPerByte;    // 32 (fp8) / 64 (fp4)
  static constexpr int kMmasPerBlock = kBlockK / kUmmaK;        // 4
  static constexpr int kSfPerMma = kUmmaK / kSfVec;             // 1, 2 or 4 scale bytes
  static constexpr int kSfKAtoms = kBlockK / (4 * kSfVec);      // 1, 2 or 4 atoms per k-block
  static constexpr int kSfbMnAtoms = kTileN / 128;              // every CTA holds SFB of all N
  static constexpr int kSfaBytes = kSfKAtoms * 512, kSfbBytes = kSfbMnAtoms * kSfKAtoms * 512;
  static constexpr int kStageBytesA = kRowsA * kBlockKBytes;
  static constexpr int kStageBytesB = kRowsB * kBlockKBytes;
  // MN-major operands (FP8 only): swizzle atoms of kASwizzle / kBSwizzle MN-bytes (umma.cuh).
  static constexpr bool kAMn = Config::kAMajorMN, kBMn = Config::kBMajorMN;
  static constexpr int kASwizzle = mn_major_swizzle(kRowsA), kBSwizzle = mn_major_swizzle(kRowsB);
  static constexpr int kBMnAtoms = kRowsB / kBSwizzle;
  // A bytes TMA delivers per CTA: K-major TILE_M 64 loads its 64 rows, M-major the whole M atom.
  static constexpr int kTxBytesA = kAMn ? kStageBytesA : kRowsD * kBlockKBytes;
  // Gathered A (header): SFA arrives by the producer lanes' cp.async, not by TMA.
  static constexpr bool kGatherA = Config::kGatherA;
  static constexpr int kGatherLanes = kGatherA ? kRowsD / 4 : 0;   // four rows per lane and gather4
  static constexpr int kTxPerCta = kTxBytesA + kStageBytesB + (kGatherA ? 0 : kSfaBytes) + kSfbBytes;
  static constexpr int kSfaCols = kSfKAtoms * 4, kSfbCols = kSfbMnAtoms * kSfKAtoms * 4;
  static constexpr int kAccStages = 2 * kTileN + kSfaCols + kSfbCols <= kTmemColumns ? 2 : 1;
  static constexpr int kSfaCol = kAccStages * kTileN, kSfbCol = kSfaCol + kSfaCols;
  static constexpr int kTmemCols = tmem_alloc_columns(kSfbCol + kSfbCols);
  // SF boxes (host contract): kSfKAtoms atoms along K; SFB kSfbMnAtoms along N, SFA one.
  static constexpr int kSfBoxK = kSfKAtoms, kSfBoxNB = kSfbMnAtoms;
  static constexpr bool kCMajorM = Config::kCMajorM;
  static constexpr bool kKGrouped = Config::kKGrouped;
  static_assert(!kKGrouped || (kFp8 && kTileM == 128 && !Config::kBatched && !Config::kDiscreteB &&
                               !Config::kDynamicSched && !kAMn && !kBMn && !kCMajorM),
                "K-grouped (weight gradients): MXFP8, K-major dY^T and X^T, 1-CTA 128-row tiles, static "
                "scheduling, row-major D");
  static_assert(!kGatherA || (kFp8 && kCtaGroup == 1 && kSfKAtoms == 1 && !kAMn && !Config::kBatched && !kKGrouped),
                "gathered A: FP8 token rows (one scale word per row and k-block), K-major, M-grouped, 1-CTA tiles");
  static_assert(kFp8 || (!kAMn && !kBMn),
                "packed FP4 A/B must be K-major (kind::mxf4/mxf4nvf4, sm1xx_common.inl:660)");
  static_assert(!kAMn || kRowsA == 128, "M-major A: one 128-element swizzle atom per CTA");
  static_assert(!kBMn || kRowsB % kBSwizzle == 0, "N-major B: whole swizzle atoms per CTA");
  static_assert(!kCMajorM || out_bits<ElementC>() >= 8, "packed FP4 C must be N-major");
  // Which C/D dtypes go with which A/B is each seed's surface (its spec's constraints), not
  // this kernel's: any pairing compiles.
  // The epilogue rule generated from the spec (GEMM + amax, sReLU, quant, dSwiGLU, a GLU forward),
  // run by the arch-neutral engine: C, D (paired or not), D_col, SFD, amax and dprob, on a paired
  // accumulator or not.
  using Rule = typename Config::Rule;
  using ElementD = typename Config::ElementD;
  using Engine = epi::BlockEngine<Rule, ElementC, ElementD, Config::kBatched, kCMajorM, Config::kDiscreteColSfd>;
  // Accumulator columns per engine call: a gate/up pair of 32-column blocks when the rule pairs
  // the accumulator (GLU forward), else one block.
  static constexpr int kAccPerBlock = Rule::kPairedAcc ? 2 * kEpiChunkCols : kEpiChunkCols;
  static_assert(!kCMajorM || !Rule::kHasD, "M-major output: C only (seed 004)");
  static constexpr int kStagingBytes = Engine::kScratchBytes > 128 ? Engine::kScratchBytes : 128;

  using Frame = KernelFrame<kCtaGroup, Config::kDynamicSched, kStageBytesA, kStageBytesB,
                            kSfaBytes + kSfbBytes, kAccStages, kTileN, kTmemCols,
                            kStagingBytes * kNumEpiWarps, Config::kDiscreteB ? 2 : 0, kTxPerCta, kFault,
                            kGatherLanes>;
  static constexpr int kStages = Frame::kStages, kThreads = Frame::kThreads;
  static constexpr int kSmemBytes = Frame::kSmemBytes, kTmapSlots = Frame::kTmapSlots;
  // Boxes (see the host contract above). Every operand box of a stage is loaded as kMcSlices
  // slices (cluster.cuh): K-major along rows, (kBoxKBytes, kRows / 4); MN-major along K,
  // (swizzle atom, kBlockK / 4 K rows), per MN atom.
  static constexpr int kBoxKBytes = kBlockKBytes;
  static constexpr int kSliceRowsA = kRowsD / kMcSlices, kSliceRowsB = kRowsB / kMcSlices;
  static constexpr int kSliceK = kBlockK / kMcSlices;  // MN-major K rows per slice
  static constexpr int kBoxRowsA = kAMn ? kASwizzle : kSliceRowsA, kBoxRowsB = kBMn ? kBSwizzle : kSliceRowsB;
  static constexpr int kBoxKA = kAMn ? kSliceK : kBlockK, kBoxKB = kBMn ? kSliceK : kBlockK;
  static_assert(kSliceRowsA % 8 == 0 && kSliceRowsB % 8 == 0 && (kSliceK * kBSwizzle) % 1024 == 0,
                "bug #5: slices start 1024-B aligned (whole 8-row swizzle atoms)");
  // Host contract (fusegemm/base/contract.py): A and B maps are uint8 views; a K-major box is
  // (kBoxKBytes, rows), an MN-major one (swizzle atom of MN bytes, K rows); discrete weights get
  // Frame::kTmapSlotStride slots of 128 B per CTA ([B x 8][SFB x 8]).
  static constexpr int kTileK = kBlockK;
  static constexpr int kMinClusterM = kCtaGroup, kMinClusterN = 1, kCtasPerTile = kCtaGroup;
  static constexpr int kMaxClusterCtas = fusegemm::kMaxClusterCtas;
  static constexpr int kMAligned = fusegemm::kMAligned;
  // (gathered A: one token row per box, gather4 taking four)
  static constexpr int kBoxAInner = kAMn ? kBoxRowsA : kBoxKBytes,
                       kBoxAOuter = kGatherA ? 1 : kAMn ? kBoxKA : kBoxRowsA;
  static constexpr int kBoxBInner = kBMn ? kBoxRowsB : kBoxKBytes, kBoxBOuter = kBMn ? kBoxKB : kBoxRowsB;
  static constexpr int kSwizzleA = kAMn ? kASwizzle : 128, kSwizzleB = kBMn ? kBSwizzle : 128;
  static constexpr int kTmaDtypeA = TmaDtype<uint8_t>::value, kTmaDtypeB = TmaDtype<uint8_t>::value;
  static constexpr int kTmapSlotStride = Config::kDiscreteB ? Frame::kTmapSlotStride : 0;

  // ---- static protocol checks (sm100-protocol.md §8) ----
  static constexpr uint32_t kIdesc = idesc_block_scaled(
      kMmaM, kTileN, mx_fmt<ElementAB>(), kFault == kFaultWrongFormat ? MxFmt::E2M1_UNPACKED : mx_fmt<ElementAB>(),
      kUe8m0 ? ScaleFmt::UE8M0 : ScaleFmt::UE4M3, 0, 0, kAMn, kBMn);
  // Golden K-major values (sm100-protocol.md §2) plus the major bits a_major [15], b_major [16].
  static constexpr uint32_t kGolden = (kFp8 ? 0x08c00000u : kUe8m0 ? 0x08c00480u : 0x08400480u) |
                                      (uint32_t(kAMn) << 15) | (uint32_t(kBMn) << 16);
  // Shared-memory descriptors: hi words, LBOs and K advance per instruction (bug #4, #6).
  static constexpr bool kSwapMn = kFault == kFaultMnDescSwap;
  static constexpr uint32_t mn_hi(int swz, int atoms) {
    return mn_major_hi(swz, kSwapMn ? mn_major_lbo(swz, kBlockK, atoms) : mn_major_sbo(swz));
  }
  static constexpr uint32_t mn_lbo(int swz, int atoms) {
    return kSwapMn ? mn_major_sbo(swz) : mn_major_lbo(swz, kBlockK, atoms);
  }
  static constexpr uint32_t kDescHiA = kAMn ? mn_hi(kASwizzle, kRowsA / kASwizzle) : kSw128KMajorHi;
  static constexpr uint32_t kDescHiB = kBMn ? mn_hi(kBSwizzle, kBMnAtoms) : kSw128KMajorHi;
  static constexpr uint32_t kLboA = kAMn ? mn_lbo(kASwizzle, kRowsA / kASwizzle) : kSw128KMajorLbo;
  static constexpr uint32_t kLboB = kBMn ? mn_lbo(kBSwizzle, kBMnAtoms) : kSw128KMajorLbo;
  static constexpr uint32_t kKStepA = kAMn ? mn_major_kstep(kASwizzle, kUmmaK) : kDescKStep;
  static constexpr uint32_t kKStepB = kBMn ? mn_major_kstep(kBSwizzle, kUmmaK) : kDescKStep;
  static_assert(legal_block_scaled_shape<kCtaGroup, kMmaM, kTileN, kFp8>(), "bug #9: illegal block-scaled shape");
  static_assert(kTileM == 64 || kTileM == 128 || kTileM == 256, "TILE_M in {64, 128, 256}");
  static_assert(kTileN == 128 || kTileN == 256, "TILE_N in {128, 256}");
  // The cluster shape is a launch attribute: the code depends only on the CTA pair
  // (kCtaGroup), so one cubin serves every legal cluster. The spec constraints and the
  // launcher keep cluster M even for 2-CTA tiles and each dimension <= 4 (KRN:319).
  static_assert(fusegemm::is_same_v<ElementAB, fusegemm::float_e5m2_t> ||
                    (kIdesc & ~kIdescShapeMask) == (kGolden & ~kIdescShapeMask),
                "bug #3: instruction descriptor differs from the golden block-scaled descriptor");
  static_assert((kIdesc & ((3u << 29) | (3u << 4))) == 0, "sf_id fields start at 0");
  static_assert(kUmmaK * 8 / kElemsPerByte / 128 == int(kDescKStep), "bug #6: K advance +2 per k-block");
  static_assert(kSfPerMma * kMmasPerBlock == 4 * kSfKAtoms, "scale bytes per k-block");
  static_assert(kSfbCol + kSfbCols <= kTmemCols && kTmemCols <= kTmemColumns, "bug #10: TMEM overflow");
  static_assert(Frame::kTxBytes == uint32_t(kTxPerCta * kCtaGroup), "bug #1: expect_tx");
  static_assert(!kAMn || kFault == kFaultMnDescSwap ||
                    (kDescHiA == 0x40004040u && kLboA == 0u && kKStepA == 256u),
                "bug #4/#6: M-major A descriptor (CUTLASS make_umma_desc<Major::MN>, SW128)");
  static_assert(!kBMn || kFault == kFaultMnDescSwap ||
                    (kBSwizzle == 128 ? (kDescHiB == 0x40004040u && kLboB == (kBMnAtoms > 1 ? 16384u : 0u) &&
                                         kKStepB == 256u)
                                      : (kDescHiB == 0x80004020u && kLboB == 0u && kKStepB == 128u)),
                "bug #4/#6: N-major B descriptor (CUTLASS make_umma_desc<Major::MN>, SW128 / SW64)");

  // Scale-factor placement per MMA k of a k-block: TMEM column offsets of SFA / SFB and the
  // byte (sf_id) inside the 4-byte column, for the [k-atom][mn-atom][4 col] layout above.
  static constexpr int sfa_col_of(int k) { return (k * kSfPerMma) / 4 * 4; }
  static constexpr int sfb_col_of(int k) { return (k * kSfPerMma) / 4 * kSfbMnAtoms * 4; }
  static constexpr uint32_t sf_byte_of(int k) { return uint32_t(k * kSfPerMma) % 4; }
  // The per-kind tables of sm100-protocol.md §3 "TMEM SF layout" (bug #11).
  static_assert(kKind != MmaKind::MXF8F6F4 ||
                    (sfa_col_of(3) == 0 && sfb_col_of(3) == 0 && sf_byte_of(0) == 0 && sf_byte_of(3) == 3),
                "MXF8: byte = k, one column group");
  static_assert(kKind != MmaKind::MXF4 ||
                    (sfa_col_of(0) == 0 && sf_byte_of(0) == 0 && sfa_col_of(1) == 0 && sf_byte_of(1) == 2 &&
                     sfa_col_of(2) == 4 && sf_byte_of(2) == 0 && sfa_col_of(3) == 4 && sf_byte_of(3) == 2),
                "MXF4 vec32: (col, byte) = (0,0) (0,2) (4,0) (4,2)");
  static_assert(kKind != MmaKind::MXF4NVF4 ||
                    (sf_byte_of(1) == 0 && sf_byte_of(3) == 0 && sfa_col_of(1) == 4 && sfa_col_of(3) == 12 &&
                     (kTileN != 256 || sfb_col_of(1) == 8)),
                "NVF4 vec16: byte 0; column +4 (SFA) / +8 (SFB, N = 256)");
  static_assert(kSfaCols == sfa_col_of(kMmasPerBlock - 1) + 4 &&
                    kSfbCols == sfb_col_of(kMmasPerBlock - 1) + 4 * kSfbMnAtoms,
                "SF columns per operand = (MN/32) * tileK / (4 vec)");

  // A K-grouped tile's first token column and k-blocks (fusegemm/scheduler.cuh kgrouped_k_range).
  template <class Params>
  static __device__ int2 k_range(const Params& p, const ClusterTile& t) {
    return kgrouped_k_range<kBlockK>(static_cast<const int*>(p.offsets), static_cast<const int*>(p.row_ends),
                                     t.expert, p.k);
  }

  template <class Params>
  static __device__ void run(const Params& p) {
    Frame f;
    f.setup(p);
    if constexpr (kKGrouped) {
      // One K range per expert: the frame's loops take each tile's k-blocks from its expert.
      run_with(p, f, BatchedClusterScheduler<kTileM, kTileN, kCtaGroup>(p.m_rows, p.n, p.num_experts, f.geom),
               [&p](const ClusterTile& t) { return k_range(p, t).y; });
      return;
    }
    const int k_bytes = (p.k + kElemsPerByte - 1) / kElemsPerByte;
    const int k_blocks = (k_bytes + kBlockKBytes - 1) / kBlockKBytes;
    if constexpr (Config::kBatched) {
      run_with(p, f, BatchedClusterScheduler<kTileM, kTileN, kCtaGroup>(p.m_rows, p.n, p.num_experts, f.geom),
               k_blocks);
    } else {
      run_with(p, f, GroupedClusterScheduler<kTileM, kTileN, kCtaGroup>(static_cast<const int*>(p.offsets),
                                                                        p.num_experts, p.n, p.m_rows, f.geom),
               k_blocks);
    }
  }

  // k_blocks: every tile's k-blocks, or (K-grouped) a callable giving a tile's (tile_k_blocks).
  template <class Params, class Sched, class KBlocks>
  static __device__ void run_with(const Params& p, Frame& f, const Sched& sched, const KBlocks& k_blocks) {
    if (f.warp == kWarpTma) {
      producer(p, f, sched, k_blocks);
    } else if (f.warp == kWarpMma) {
      if (f.is_leader) {
        f.mma_loop(sched, k_blocks, [&](uint32_t d_tmem, int s, bool accumulate) { issue(f, d_tmem, s, accumulate); });
      }
    } else if (f.warp == kWarpSched) {
      f.claim_tiles(p, sched.num_tiles());
    } else if (f.warp >= kFirstEpiWarp) {
      epilogue(p, f, sched, k_blocks);
    }
    f.teardown();
  }

  template <class Params, class Sched, class KBlocks>
  static __device__ void producer(const Params& p, Frame& f, const Sched& sched, const KBlocks& k_blocks) {
    DeviceTmap<Frame::kTmapSlots> dtm_b, dtm_sfb;  // discrete weights: B and SFB per expert
    const CUtensorMap* tmap_b = &p.tma_b;
    const CUtensorMap* tmap_sfb = &p.tma_sfb;
    int map_expert = -1;
    if (Config::kDiscreteB && f.lane == 0) {
      CUtensorMap* ws = static_cast<CUtensorMap*>(p.tmap_workspace) + cta_linear_id() * Frame::kTmapSlotStride;
      dtm_b.init(&p.tma_b, ws, f.tmap_staging);
      dtm_sfb.init(&p.tma_sfb, ws + Frame::kTmapSlotsPerMap, f.tmap_staging + 1);
    }
    // Gathered A: this lane's four rows of the tile (tokens; -1 past the problem's rows, read as
    // zeros as any row outside A), their scale words, and the stages not yet published.
    int g[4] = {-1, -1, -1, -1};
    GatherSfRows sf_rows{};
    GatherPublisher<kStages, 1> pub;
    const auto publish_rest = [&] {
      if constexpr (kGatherA) {
        if (f.lane < kGatherLanes) pub.flush(f.aux->full);
      }
    };
    f.template producer<kGatherA>(p, sched, k_blocks, [&](const ClusterTile& t, int kb, uint64_t* bar, int s) {
      if constexpr (Config::kDiscreteB) {
        if (t.expert != map_expert) {
          tmap_b = dtm_b.update(reinterpret_cast<const void*>(__ldg(static_cast<const unsigned long long*>(p.b_ptrs) + t.expert)));
          tmap_sfb = dtm_sfb.update(reinterpret_cast<const void*>(__ldg(static_cast<const unsigned long long*>(p.sfb_ptrs) + t.expert)));
          map_expert = t.expert;
        }
      }
      const int l = Config::kBatched ? t.expert : 0;            // batch coordinate of A / SFA
      // expert / batch coordinate of B / SFB (K-grouped: X^T is every expert's, 2-D)
      const int lb = Config::kDiscreteB || kKGrouped ? 0 : t.expert;
      const int m_row = t.m_block * kTileM + f.cta_half * kRowsD;  // first A row this CTA loads
      const int n_row = t.n_block * kTileN + f.cta_half * kRowsB;
      // K-grouped: the expert's first token column (a multiple of 256, so of a k-block and an atom).
      const int kb0 = kKGrouped ? k_range(p, t).x / kBlockK : 0;
      const int kx = (kb0 + kb) * kBlockKBytes;  // K offset in bytes (= elements for FP8)
      // A (and SFA) shared along cluster N, B (and SFB) along cluster M (cluster.cuh); A and B
      // slice by slice, the scale-factor boxes whole.
      const Share sh_a = f.share_a(), sh_b = f.share_b(t.share_b);
      constexpr int kDimsA = Config::kBatched ? 3 : 2, kDimsB = Config::kDiscreteB || kKGrouped ? 2 : 3;
      if constexpr (kGatherA) {   // (every lane: the frame's warp loads)
        if (f.lane < kGatherLanes) {
          if (kb == 0) {
            gather4_tokens(static_cast<const int*>(p.a_index), m_row + 4 * f.lane, p.m_rows, g);
            sf_rows.resolve(g, p.a_gather_rows, static_cast<uint32_t>(p.sfa_gather_ld));
          }
          // Rows 4 lane .. of the tile, in the stage half (TILE_M 64) and SF atom rows they own.
          const int r0 = (kTileM == 64 ? (m_row % 128) / 64 * 64 : 0) + 4 * f.lane;
          tma_gather4(&p.tma_a, bar, f.smem_a(s) + r0 * kBlockKBytes, kx, g[0], g[1], g[2], g[3],
                      CacheHint::kEvictFirst);
          sf_rows.copy(smem_u32(f.smem_sf(s)), static_cast<const uint32_t*>(p.sfa_gather_ptr), kb, r0);
          pub.issued(s, bar - s);
        }
        if (f.lane != 0) return;   // B, SFB (and a discrete map's rewrite): lane 0's
      }
#pragma unroll 1
      for (int i = 0; i < (kGatherA ? 0 : kMcSlices); ++i) {
        if constexpr (kAMn) {
          // M-major: the 128-row M atom holding this CTA's rows (TILE_M 64: its aligned 128
          // rows), sliced along K.
          f.template load_slice<kDimsA>(sh_a, i, &p.tma_a, bar, f.smem_a(s) + i * kSliceK * kASwizzle,
                                        m_row / 128 * 128, kx + i * kSliceK, l, 0, CacheHint::kEvictFirst);
        } else {
          // TILE_M 64: rows go to the half of the 128-row stage matching their half of the SF atom.
          uint8_t* sa = f.smem_a(s) + (kTileM == 64 ? (m_row % 128) / 64 * (64 * kBlockKBytes) : 0);
          f.template load_slice<kDimsA>(sh_a, i, &p.tma_a, bar, sa + i * kSliceRowsA * kBlockKBytes, kx,
                                        m_row + i * kSliceRowsA, l, 0, CacheHint::kEvictFirst);
        }
      }
#pragma unroll 1
      for (int i = 0; i < kMcSlices; ++i) {
        if constexpr (kBMn) {
#pragma unroll
          for (int j = 0; j < kBMnAtoms; ++j) {  // per swizzle atom of the CTA's columns
            f.template load_slice<kDimsB>(sh_b, i, tmap_b, bar,
                                          f.smem_b(s) + j * kBSwizzle * kBlockKBytes + i * kSliceK * kBSwizzle,
                                          n_row + j * kBSwizzle, kx + i * kSliceK, lb, 0, CacheHint::kEvictLast);
          }
        } else {
          f.template load_slice<kDimsB>(sh_b, i, tmap_b, bar, f.smem_b(s) + i * kSliceRowsB * kBlockKBytes, kx,
                                        n_row + i * kSliceRowsB, lb, 0, CacheHint::kEvictLast);
        }
      }
      uint8_t* sf = f.smem_sf(s);
      if constexpr (!kGatherA) {
        f.template load_whole<4>(sh_a, kb, &p.tma_sfa, bar, sf, 0, (kb0 + kb) * kSfKAtoms, m_row / 128, l);
      }
      f.template load_whole<4>(sh_b, kb, tmap_sfb, bar, sf + kSfaBytes, 0, (kb0 + kb) * kSfKAtoms,
                               t.n_block * kSfbMnAtoms, lb);
    }, publish_rest);
  }

  // One k-block on the elected MMA lane: UTCCP the scale atoms, then the 4 MMAs.
  static __device__ void issue(const Frame& f, uint32_t d_tmem, int s, bool accumulate) {
    const uint32_t sf_addr = smem_u32(f.smem_sf(s));
#pragma unroll
    for (int ka = 0; ka < kSfKAtoms; ++ka) {
      utccp_sf_atom<kCtaGroup>(make_smem_desc(sf_addr + ka * 512, kSfUtccpHi, 0),
                               f.tmem_base + kSfaCol + ka * 4);
#pragma unroll
      for (int j = 0; j < kSfbMnAtoms; ++j) {
        utccp_sf_atom<kCtaGroup>(make_smem_desc(sf_addr + kSfaBytes + (j * kSfKAtoms + ka) * 512, kSfUtccpHi, 0),
                                 f.tmem_base + kSfbCol + (ka * kSfbMnAtoms + j) * 4);
      }
    }
    const uint64_t da = make_smem_desc(smem_u32(f.smem_a(s)), kDescHiA, kLboA);
    const uint64_t db = make_smem_desc(smem_u32(f.smem_b(s)), kDescHiB, kLboB);
#pragma unroll
    for (int k = 0; k < kMmasPerBlock; ++k) {
      if constexpr (kFault != kFaultSkipMma) {
        mma_block_scaled<kCtaGroup, kKind>(d_tmem, da + k * kKStepA, db + k * kKStepB,
                                           idesc_with_sf_id(kIdesc, sf_byte_of(k), sf_byte_of(k)),
                                           accumulate || k > 0, f.tmem_base + kSfaCol + sfa_col_of(k),
                                           f.tmem_base + kSfbCol + sfb_col_of(k));
      }
    }
  }

  template <class Params, class Sched, class KBlocks>
  static __device__ void epilogue(const Params& p, Frame& f, const Sched& sched, const KBlocks& k_blocks) {
    const int ew = f.warp - kFirstEpiWarp;  // TMEM lanes 32*ew..
    const uint32_t buf = smem_u32(f.staging) + ew * kStagingBytes;
    Rule rule;
    typename Engine::Partials part;
    part.reset();
    // Element columns: the accumulator's, or half of them when the rule pairs gate/up blocks.
    const int width = Rule::kPairedAcc ? p.n / 2 : p.n;
    f.epilogue_loop(sched, [&](const ClusterTile& t, uint32_t acc_col) {
      // first row this CTA stores (K-grouped: expert e's (M, N) block is rows e M.. of (L M, N))
      const int m0 = (kKGrouped ? t.expert * p.m_rows : 0) + t.m_block * kTileM + f.cta_half * kRowsD;
      const bool no_k = tile_k_blocks(k_blocks, t) == 0;   // an expert without tokens: a zero accumulator
      const int half = kTileM == 64 ? (m0 % 128) / 64 : 0;
      const int local = ew * 32 - half * 64;                      // first tile row of this warp
      int rows_valid = (local >= 0 && local < kRowsD) ? 32 : 0;
      if constexpr (Config::kBatched) rows_valid = min(rows_valid, max(p.m_rows - (m0 + local), 0));
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
        const int j0 = (t.n_block * kTileN + c * kAccPerBlock) / (Rule::kPairedAcc ? 2 : 1);
        if (j0 >= width || rows_valid <= 0) continue;  // warp-uniform
        if constexpr (kFault == kFaultSpill) spill_through_local(*reinterpret_cast<float(*)[32]>(acc), f.lane);
        Engine::run(rule, p, t.expert, m0 + local, rows_valid, j0, width, acc, buf, f.lane, part);
      }
      if (rows_valid > 0) Engine::flush_tile(part, p, t.expert, m0 + local, rows_valid, f.lane);
    });
    Engine::flush_end(part, p, f.lane);  // seed 004: one global amax atomic per warp
  }
};

}  // namespace fusegemm::sm100
