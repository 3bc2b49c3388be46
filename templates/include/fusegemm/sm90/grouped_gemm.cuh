// Persistent, warp-specialized BF16 grouped GEMM for sm_90a (seed 001).
//
//   warpgroups 0 and 1 : WGMMA consumers, FP32 accumulators (64 x TILE_N) in registers, then
//                        the epilogue. TILE_M 128, cooperative: both on every tile, 64 rows
//                        each. TILE_M 64, ping-pong: each on whole tiles of its own, taking the
//                        ring's tiles in turn, so one's epilogue overlaps the other's mainloop
//                        (CUTLASS's two sm_90 schedules).
//   last warpgroup     : producer; one elected thread schedules tiles and issues the TMA
//                        loads of A and B
//
// Pipeline: kStages smem stages of (TILE_M x 64) A + (TILE_N x 64) B, SWIZZLE_128B,
// guarded by full (1 arrival + TMA bytes) and empty (one arrival per consumer warp that reads
// the stage) mbarriers; ping-pong mainloops alternate strictly (kOrderBarrier, below). Tiles
// flow from the producer to the consumers through a small ring in smem (kTileRing slots, own
// full/empty barriers), so static and dynamic scheduling differ only in how the producer picks
// the next linear tile; the consumers never touch the scheduler.
// The producer runs ahead across tiles, so the next tile's loads overlap this epilogue.
//
// K-grouped problems (Config::kKGrouped: a weight gradient dW_e = dY_e^T X_e, the reduction
// over each expert's tokens): tiles are (expert, M block, N block) of the (L, M, N) output, the
// K range of a tile is its expert's token rows [offsets[e-1], offsets[e]), and both operands are
// token-major (MN-major: dY is tokens x M, X tokens x N), loaded as 64-element chunks of 64
// token rows like an N-major B. An expert without tokens gets zeros (alpha * 0).
//
// Gathered A (Config::kGatherA, M-grouped, no clusters): row r of the problem is row a_index[r]
// of A (tokens x K, token-major: an MoE layer's x before the permutation). kGatherWarps warps of
// the producer warpgroup copy A with cp.async into the SW128 stage (fusegemm/gather.cuh: why not
// TMA, the layout, the completion protocol), each warp a 32-row share of the tile whose indices
// its lanes hold; an index outside A's rows (padding: -1) reads zeros, so no index value can
// fault. The stage's full barrier counts the leading lane's arrival (with B's TMA bytes) and one
// arrival per copying lane. B, the ring and the scheduling stay with the leading lane. The
// K-grouped kernels gather dY's and/or X's token rows the same way (kGatherA / kGatherB).
//
// Clusters (M-grouped, static scheduling; fusegemm/cluster.cuh has the protocol, shared with the
// sm_100a kernels): a Config with kClusterMulticast (the variant's cluster has more than one CTA)
// builds the cluster kernel, whose shape is a launch attribute (p.cluster_m x p.cluster_n CTAs,
// one cubin for every legal multi-CTA shape); without it, the kernel has no cluster machinery
// (a 1x1 launch: on the H200, clusters ran no faster). A cluster walks blocks of neighbouring
// cluster_m x cluster_n tiles; B k-blocks are multicast along cluster M when the block's M tiles
// belong to one expert, A k-blocks along cluster N. A K-major operand box of a stage is loaded
// as kSlices slices of its rows, an N-major B as its 64-column chunks; member j of a share group
// of g CTAs issues the slices (chunks) i with i % g == j, so every CTA loads a part of every
// stage it shares. A stage's empty barrier counts one release per consumer warpgroup reading
// the stage (two cooperative, one ping-pong) in every CTA of this CTA's cluster row and column
// (the CTAs its multicasts reach), each of which releases the stage on all of them.
//
// Stream-K remainder (Config::kStreamK, the "streamk" scheduler; M-grouped, no clusters): the
// producer walks whole tiles for the whole waves and then this CTA's pieces of the last wave's
// tiles (fusegemm/stream_k.cuh), each a ring entry with its k-block range; a consumer that ran a
// tile's later k-blocks stores its accumulators for the tile's head piece, which adds them before
// its epilogue. Not run on a GPU yet (generator/registry.py UNEXECUTED_MODES).
//
// Epilogue (fusegemm/sm90/epilogue.cuh): each consumer warp owns 16 complete rows of the tile in
// its WGMMA fragment, so element-wise rules stage 128-byte column chunks in the warp's own padded
// smem buffer and write full cache lines (epi::WarpStagedStore), synchronising with __syncwarp
// only; other rules run the arch-neutral engine. A cooperative tile's plain D is stored during
// the next tile's first k-blocks instead (FUSEGEMM_SM90_DEFER_STORE, below).
#pragma once

#include "fusegemm/cluster.cuh"
#include "fusegemm/common.cuh"
#include "fusegemm/epilogue_block.cuh"
#include "fusegemm/gather.cuh"
#include "fusegemm/sm90/epilogue.cuh"
#include "fusegemm/scheduler.cuh"
#include "fusegemm/stream_k.cuh"
#include "fusegemm/tma.cuh"
#include "fusegemm/sm90/wgmma.cuh"

// Consumer stagger: warpgroup 1 starts after warpgroup 0 has consumed this many k-blocks
// of its first tile (0 = lockstep). Both warpgroups then keep the offset, so one
// warpgroup's epilogue overlaps the other's WGMMAs instead of idling the tensor cores.
// At most kStages (the producer can run that far ahead of the slower warpgroup).
// H200: staggers of 1 and 2 k-blocks measured within run-to-run noise (+-3%), so off.
// Epilogue input prefetch: each consumer warp asks L2 for the element inputs its epilogue will
// read (dSwiGLU's C) this many k-blocks before the tile's mainloop ends (at its start when the
// mainloop is shorter; 0 = off). H200, dSwiGLU at the dsv3 shape (112 k-blocks), one run:
// 1.248 ms without, 1.212 / 1.173 / 1.132 / 1.113 ms at 8 / 4 / 16 / 32 k-blocks ahead (plain
// GEMM of the shape: 0.854 ms in that run).
#ifndef FUSEGEMM_SM90_EPI_PREFETCH
#define FUSEGEMM_SM90_EPI_PREFETCH 32
#endif

#ifndef FUSEGEMM_SM90_STAGGER
#define FUSEGEMM_SM90_STAGGER 0
#endif

// TILE_M 64 as two ping-pong consumer warpgroups (1), or one consumer warpgroup (0: the
// baseline, an A/B switch through FUSEGEMM_NVRTC_EXTRA). H200, same run
// (bench/results/pingpong_h200.json): ping-pong 64 x 256 ran 0.97-1.57x the speed of the
// one-warpgroup 64 x 256 (below 1 on one row of 30); against the cooperative 128 x 256, dSwiGLU
// (the heaviest epilogue) 1.09-1.17x, the plain and K-grouped GEMMs 0.83-1.06x (the default
// stays 128).
#ifndef FUSEGEMM_SM90_PINGPONG
#define FUSEGEMM_SM90_PINGPONG 1
#endif

// TILE_M 128 as ping-pong too (1): each consumer warpgroup takes a whole 128-row tile, two m64
// WGMMAs per k-step into two accumulator halves, and runs the epilogue on one half, then the
// other, while the other warpgroup's mainloop runs (CUTLASS's ping-pong with a 128 x 128 tile).
// Why: the 64 x 256 ping-pong tile reads 320 operand rows from L2 per 64 x 256 outputs; a
// 128 x 128 tile reads 256 per 128 x 128, 20% fewer bytes per FLOP, with the same 128
// accumulators per thread. Nsight Compute had the 64 x 256 dSwiGLU at 80-83% of L2 throughput
// (bench/results/ncu_h200_dswiglu_mixtral_frag_elem_at.json), and it runs at 495-560 TFLOP/s on
// the MoE layers' shapes where the plain GEMM's cooperative 128 x 256 runs 650-700
// (bench/results/pingpong_h200_layer_shapes.json). M-grouped tiles without stream-K (the
// K-grouped kernel's A chunks and the stream-K fix-up are laid out per 64-row warpgroup).
// 0: TILE_M 128 is cooperative (the default); an A/B switch through FUSEGEMM_NVRTC_EXTRA
// (bench/pingpong.py --configs c128x128,pp128x128). TILE_N 128 only: two halves of 128 columns are
// 256 accumulators a thread (spilled). Measured on an H100, 2026-12-06 (bench/pingpong.py, same run,
// bench/results/pingpong_h100_pp128.json; outputs bit-equal to the cooperative tile's): dSwiGLU on
// the layers' routed shapes 2.317 ms (mixtral) and 2.430 ms (dsv3-32) against 2.435 / 2.418 for the
// cooperative 128 x 128 and 1.969 / 1.958 for the 64 x 256 ping-pong the layer runs: the two m64
// WGMMAs a k-step re-read B from shared memory (20% more shared-memory bytes per FLOP than one
// m64n256), and fewer L2 bytes bought nothing. So 0 stays; the tests keep the path correct
// (tests/gpu/test_grouped_gemm_gpu.py, test_epilogue_gpu.py).
#ifndef FUSEGEMM_SM90_PINGPONG_128
#define FUSEGEMM_SM90_PINGPONG_128 0
#endif

// Gathered operands (cp.async, fusegemm/gather.cuh): who makes the copies visible to WGMMA's
// async proxy. L >= 1: the producer lanes, L stages late (wait for the copies of the stage L
// before the newest, fence.proxy.async, arrive on its full barrier), so the consumers' k-loop is
// the ungathered one and L + 1 stages of copies are in flight per lane (at most kStages - 2).
// 0: each copy arrives by cp.async.mbarrier.arrive.noinc and the consumers fence after every
// full wait (a fence between WGMMA batches). A/B switch for bench/gathered.py.
#ifndef FUSEGEMM_SM90_GATHER_LAG
#define FUSEGEMM_SM90_GATHER_LAG 1
#endif

// Gathered operands with the lag: a producer lane that finds the next stage still in use
// publishes its lagging stages before it waits (1: M-grouped kernels), or only after (0). H200,
// 2026-12-04 (both builds in one run, five interleaved rounds, dsv3-8 / qwen3 / mixtral):
// gathered fc1 0.987x / 0.948x / 1.001x of pre-permuted rows against 0.918x / 0.920x / 0.937x
// without; the K-grouped weight gradient ran 3-8% slower with it (0.871x / 0.814x / 0.773x
// against 0.931x / 0.838x / 0.842x), so it publishes after the wait.
// (Also measured on 2026-12-04, the weight gradient with gathered X: publishing a tile's lagging
// stages when its k-loop ends instead of after the next tile's K range and index loads, 0.83x /
// 0.82x / 0.93x of pre-permuted rows against 0.84x / 0.85x / 0.93x (qwen3 / mixtral / dsv3-8, five
// rounds), and again lags 0 and 2 (0.86x / 0.85x / 0.92x and 0.78x / 0.79x / 0.90x): not kept.
// Nsight Compute, qwen3 and mixtral: the copying warps wait on their own copies' completion more
// than on free stages; L2 hit rates 87% / 92% (pre-permuted rows: 83% / 92%). H100, 2026-12-06: the
// next tile's K range and first token rows fetched during the tile before (the static walk's next
// tile is known), 0.97-1.03x of this: not kept; README, "Three more tries at the K-grouped gathered
// operand".)
#ifndef FUSEGEMM_SM90_GATHER_EARLY
#define FUSEGEMM_SM90_GATHER_EARLY 1
#endif

// Gathered operands: how many of the producer warpgroup's warps copy rows (1: the first warp
// alone; 4: every warp takes a share of each stage, M-grouped 32 rows each, K-grouped 16 token
// rows of every 64-column chunk). A stage of a 128 x 256 K-grouped tile is 384 rows of copies: one warp
// issues them more slowly than the tensor cores consume a stage. Static scheduling only (the
// dynamic claim is broadcast within the first warp). A/B switch for bench/gathered.py.
#ifndef FUSEGEMM_SM90_GATHER_WARPS
#define FUSEGEMM_SM90_GATHER_WARPS 4
#endif

// Gathered A in 64-row tiles (ping-pong): 1 has every copying warp take 16 rows of a stage (four
// warps, each lane holding its rows' offsets for the tile), 0 two warps of 32 rows (the shares
// the 128-row tiles take; an A/B switch). A ping-pong k-step issues half a cooperative one's MMAs,
// so with 32-row shares each copying warp must issue its copies twice as fast. H100, 2026-12-06
// (bench/moe_layer.py --profile, one process per build, bench/results/moe_layer_h100_stored_consumer_rows*.json):
// the layer's gathered dSwiGLU (64 x 256, dy gathered and stored) 2.47 against 2.52 ms at dsv3 with
// 32 experts and 2.29 against 2.63 ms at mixtral; the same kernel on permuted rows takes 1.56-1.60
// and 1.98: the gathered ping-pong tile stays slow for another reason.
#ifndef FUSEGEMM_SM90_GATHER_ROWS_16
#define FUSEGEMM_SM90_GATHER_ROWS_16 1
#endif

// Stored gathered A (kStoreA): the a_rows stores' L2 policy, 1 evict-first (as the gather kernel's
// stores: the rows are read back long after), 0 normal (A/B switch). H100, 2026-12-06, the layer's fc1
// at dsv3 with 32 experts: 0.932x against 0.934x of the kernel on permuted rows, no measurable change.
#ifndef FUSEGEMM_SM90_STORE_A_EVICT_FIRST
#define FUSEGEMM_SM90_STORE_A_EVICT_FIRST 1
#endif

// Deferred D (1): the cooperative tile's D (element-wise rules with a 16-bit D, no C, no column
// input; WgmmaEpilogue::kDeferD) is stored while the next tile's first k-blocks run on the
// tensor cores, and the epilogue's inputs are loaded before the last k-block. 0 stores D between
// the tiles (the measured baseline, an A/B switch through FUSEGEMM_NVRTC_EXTRA). H200, the plain
// GEMM on bench/grouped_gemm.py's eight rows, two runs of bench/ceiling.py --also: the dsv3 and
// qwen3 rows 0.7-5.2% faster, mixtral-fc1 -2.0 to +0.3%; the K-grouped weight gradients on
// bench/wgrad.py's ten rows (--also): -0.1 to +7.7%.
#ifndef FUSEGEMM_SM90_DEFER_STORE
#define FUSEGEMM_SM90_DEFER_STORE 1
#endif

// Measurement only: 0 runs every M tile with row ends (no compacted walk) and unrolls the
// producer's k-loop as before the walk existed, the A/B baseline of the compacted walk.
#ifndef FUSEGEMM_SM90_COMPACT_ROW_ENDS
#define FUSEGEMM_SM90_COMPACT_ROW_ENDS 1
#endif

// Measurement only, the cluster kernel: 2 multicasts shared operands and releases each stage to
// every CTA its multicasts reach (the protocol of fusegemm/cluster.cuh); 1 loads every operand
// per CTA but keeps those releases (the coupling without the multicast); 0 loads per CTA and
// releases its own stages only (a cluster launch with no coupling). Separates what a cluster
// costs in the barrier protocol from what its multicast saves. H100, 2026-12-06 (bench/pingpong.py
// --also, three rounds, bench/results/pingpong_h100_cluster_coupling.json), ping-pong 64 x 256 at
// mixtral's routed shape: dSwiGLU (N-major B) 1x1 2.070 ms, 2x1 coupled without multicast 2.254,
// with it 3.190; the plain GEMM (K-major B) 1.580 / 1.832 / 1.832. The coupling costs, and the
// N-major chunks' multicast costs more: the layer runs 1x1 (README, "Ping-pong 64x256 with ...").
#ifndef FUSEGEMM_SM90_BENCH_CLUSTER_COUPLING
#define FUSEGEMM_SM90_BENCH_CLUSTER_COUPLING 2
#endif
// The cluster kernel's N-major B (an A/B switch): 0 shares it by whole 64-column
// chunks (member j of the share group issues chunks j, j + 2; the layout measured above); 1 by
// K halves, as the sm_100a kernels and CUTLASS slice an MN-major operand: member j issues rows
// 32 j .. 32 j + 31 of every chunk (4 KB boxes), so each CTA reads whole 512-byte row segments of
// w2, as the 1x1 kernel does, where the chunk split hands each CTA alternate 128-byte pieces of
// every segment. The tensor map's K box follows (kBoxBOuter, read by the host). H100, 2026-12-06
// (bench/results/pingpong_h100_cluster_ksplit.json, bit-equal): 1 ran the 2x1 ping-pong dSwiGLU
// 1.40x slower than 0 (mixtral 4.274 against 3.054 ms; 1x1 1.939), so 0 stays.
#ifndef FUSEGEMM_SM90_CLUSTER_BMN_SPLIT_K
#define FUSEGEMM_SM90_CLUSTER_BMN_SPLIT_K 0
#endif


namespace fusegemm {
namespace sm90 {

// Config::kClusterMulticast, false where the generated Config does not declare it.
template <class C>
constexpr auto multicast_of(int) -> decltype(C::kClusterMulticast, bool()) { return C::kClusterMulticast; }
template <class C>
constexpr bool multicast_of(long) { return false; }
// Config::kGatherA / kGatherB, false where the generated Config does not declare them.
template <class C>
constexpr auto gather_of(int) -> decltype(C::kGatherA, bool()) { return C::kGatherA; }
template <class C>
constexpr bool gather_of(long) { return false; }
template <class C>
constexpr auto gather_b_of(int) -> decltype(C::kGatherB, bool()) { return C::kGatherB; }
template <class C>
constexpr bool gather_b_of(long) { return false; }
// Config::kScatterD, false where the generated Config does not declare it.
template <class C>
constexpr auto scatter_of(int) -> decltype(C::kScatterD, bool()) { return C::kScatterD; }
template <class C>
constexpr bool scatter_of(long) { return false; }
// Config::kStoreA, false where the generated Config does not declare it.
template <class C>
constexpr auto store_a_of(int) -> decltype(C::kStoreA, bool()) { return C::kStoreA; }
template <class C>
constexpr bool store_a_of(long) { return false; }
// Config::kStreamK, false where the generated Config does not declare it.
template <class C>
constexpr auto stream_k_of(int) -> decltype(C::kStreamK, bool()) { return C::kStreamK; }
template <class C>
constexpr bool stream_k_of(long) { return false; }

template <class Config>
struct GroupedGemmKernel {
  using ElementA = typename Config::ElementA;
  using ElementB = typename Config::ElementB;
  using ElementC = typename Config::ElementC;
  using ElementD = typename Config::ElementD;
  using Rule = typename Config::Rule;  // the epilogue rule (generator/registry.py row)
  static_assert(fusegemm::is_same_v<ElementA, fusegemm::bfloat16_t> && fusegemm::is_same_v<ElementB, fusegemm::bfloat16_t>,
                "sm_90a grouped kernel: BF16 A and B");
  // B: K-major (N rows of 64 K-elements per stage) or MN-major (kBMn: an N-major weight, loaded
  // as kTileN / 64 chunks of 64 K-rows x 64 N-elements; the WGMMA reads it transposed).
  static constexpr bool kBMn = Config::kBMajorMN;
  static constexpr bool kKGrouped = Config::kKGrouped;
  static constexpr bool kAMn = kKGrouped;   // A: tokens x M, M contiguous
  static_assert(!kKGrouped || (kBMn && !Config::kDiscreteB && !Config::kDynamicSched),
                "K-grouped: token-major B (b_major n), dense, static scheduling");

  static constexpr int kTileM = Config::kTileM;
  static constexpr int kTileN = Config::kTileN;
  static constexpr int kTileK = 64;  // 128 bytes of BF16: one SWIZZLE_128B row
  static_assert(kTileM == 64 || kTileM == 128, "sm_90a kernel: TILE_M must be 64 or 128");
  static_assert(kTileN == 128 || kTileN == 256, "sm_90a kernel: TILE_N must be 128 or 256");
  // Clusters (above): M-grouped problems with static scheduling. A share group is at most
  // kMcSlices CTAs (ClusterGeom::legal), so every member loads at least one slice per stage.
  // The cluster kernel loads a K-major operand box of a stage as kSlices slices (the multicast
  // granularity): the largest share group, 2 (clusters up to 2x2). An N-major B is shared by
  // whole chunks (8 KB boxes, as without clusters: K slices of 2 KB cost the MoE layer's N-major
  // GEMMs a few percent in one H200 run).
  static constexpr bool kClusters = multicast_of<Config>(0);
  static_assert(!kClusters || (!kKGrouped && !Config::kDynamicSched),
                "clusters: M-grouped problems, static scheduling (the registry's limits)");
  static constexpr int kSlices = kClusters ? 2 : 1;
  // FUSEGEMM_SM90_BENCH_CLUSTER_COUPLING (measurement only): whether shared operands are
  // multicast, and whether stages are released to the peers (else each CTA releases its own).
  static constexpr bool kMulticasts = FUSEGEMM_SM90_BENCH_CLUSTER_COUPLING == 2;
  static constexpr bool kPeerReleases = FUSEGEMM_SM90_BENCH_CLUSTER_COUPLING >= 1;
  static_assert(kMcSlices % kSlices == 0, "slices of a box");
  // Gathered A (above); K-grouped: gathered token rows of dY (kGatherA) and/or X (kGatherB).
  static constexpr bool kGatherA = gather_of<Config>(0);
  // Gathered A stored as well (Config::kStoreA, the op's a_rows output): in a tile's first N block
  // each copying warp stores its share of every A stage it gathered, once the stage is published,
  // through tma_a (encoded over a_rows; a gathered A never loads through it), so that a weight
  // gradient reads the rows in problem order without a permutation kernel of its own. (Stored by
  // a consumer instead, the store's wait before the stage's release held the warpgroup's WGMMAs:
  // the layer's fc1 at 32 experts ran 0.85x of the kernel on permuted rows, H100, 2026-12-06.)
  static constexpr bool kStoreA = store_a_of<Config>(0);
  // (The stored rows' L2 policy: FUSEGEMM_SM90_STORE_A_EVICT_FIRST 1 evict-first, as the gather
  // kernel's stores, since a weight gradient reads them back long after; 0 the normal policy.)
  static constexpr CacheHint kStoreHint = FUSEGEMM_SM90_STORE_A_EVICT_FIRST ? CacheHint::kEvictFirst : CacheHint::kNormal;
  static constexpr bool kGatherB = gather_b_of<Config>(0);
  static_assert(!kGatherA || !kClusters, "gathered A: no clusters (the registry's limits)");
  static_assert(!kGatherB || kKGrouped, "gathered B: K-grouped problems (B is token rows only there)");
  static constexpr bool kGathers = kGatherA || kGatherB;
  // Warps copying gathered rows (FUSEGEMM_SM90_GATHER_WARPS): M-grouped at most one per 32 rows
  // of the tile; one under dynamic scheduling.
  // (FUSEGEMM_SM90_GATHER_ROWS_16: 16-row shares in 64-row tiles.)
  static constexpr int kMinShareRows = FUSEGEMM_SM90_GATHER_ROWS_16 && Config::kTileM == 64 ? 16 : 32;
  static constexpr int kGatherWarps =
      !kGathers || Config::kDynamicSched ? 1
      : kKGrouped ? FUSEGEMM_SM90_GATHER_WARPS
      : (FUSEGEMM_SM90_GATHER_WARPS < Config::kTileM / kMinShareRows ? FUSEGEMM_SM90_GATHER_WARPS
                                                                      : Config::kTileM / kMinShareRows);
  static_assert(kGatherWarps >= 1 && kGatherWarps <= 4, "the producer warpgroup's warps");
  // M-grouped: each copying warp's share of a tile's rows, whose source offsets a lane holds for
  // the whole tile when the share is 32 or 16 rows (fusegemm/gather.cuh GatherRows); K-grouped: each
  // warp's share of a k-block's 64 token rows (of every chunk).
  static constexpr int kShareRows = Config::kTileM / kGatherWarps;
  static constexpr bool kHoldsRows = kShareRows == 32 || kShareRows == 16;
  static_assert(kKGrouped || kShareRows % kMinShareRows == 0, "whole shares");
  static constexpr int kKShare = 64 / kGatherWarps;
  static_assert(!kKGrouped || kKShare * kGatherWarps == 64, "K-grouped: equal shares of a k-block's 64 rows");
  // K-grouped: a gathered operand's rows are fetched a k-block ahead, except with both operands
  // gathered (two operands' fetched rows outgrow the producer's registers: local memory).
  static constexpr bool kPrefetchRows = !(kGatherA && kGatherB);

  // Ping-pong (TILE_M 64, above; FUSEGEMM_SM90_PINGPONG 0 builds the measured baseline instead:
  // one consumer warpgroup).
  static constexpr bool kPingPong128 =
      FUSEGEMM_SM90_PINGPONG && FUSEGEMM_SM90_PINGPONG_128 && kTileM == 128 && kTileN == 128 && !kKGrouped &&
      !stream_k_of<Config>(0);
  static constexpr bool kPingPong = FUSEGEMM_SM90_PINGPONG && (kTileM == 64 || kPingPong128);
  static constexpr int kConsumerWGs = kPingPong ? 2 : kTileM / 64;
  static constexpr int kStageWGs = kPingPong ? 1 : kConsumerWGs;  // warpgroups reading a stage
  static constexpr int kConsumerWarps = 4 * kConsumerWGs;
  static constexpr int kThreads = 128 * (kConsumerWGs + 1);
  // 64-row halves of a consumer warpgroup's share of a tile: one m64 WGMMA each per k-step.
  static constexpr int kHalves = kPingPong128 ? 2 : 1;
  static constexpr int kAccum = kTileN / 2;  // FP32 accumulators per consumer thread and half

  // Shared memory plan (offsets from the 1024-aligned dynamic smem base).
  static constexpr int kABytes = kTileM * kTileK * 2;
  static constexpr int kBBytes = kTileN * kTileK * 2;
  static constexpr int kStageBytes = kABytes + kBBytes;
  // What a stage's TMA loads bring (gathered operands arrive through cp.async instead), and
  // the full barrier's arrivals: the leading producer lane, plus every lane's cp.async arrival.
  static constexpr int kTxBytes = kStageBytes - (kGatherA ? kABytes : 0) - (kGatherB ? kBBytes : 0);
  static constexpr int kFullArrivals = kGathers ? 1 + 32 * kGatherWarps : 1;
  static_assert(FUSEGEMM_SM90_GATHER_LAG >= 0, "a lag of stages");
  // The epilogue (fusegemm/sm90/epilogue.cuh): fragment path for element-wise rules, else the
  // arch-neutral engine.
  using Engine = epi::BlockEngine<Rule, ElementC, ElementD>;
  // Deferred D stores (FUSEGEMM_SM90_DEFER_STORE): cooperative tiles, whose epilogue otherwise
  // idles the tensor cores (ping-pong's overlaps the other warpgroup's mainloop already).
  static constexpr bool kDefer = FUSEGEMM_SM90_DEFER_STORE && !kPingPong;
  // Scattered outputs (Config::kScatterD, M-grouped): C and D rows stored at d_index.
  static constexpr bool kScatterD = scatter_of<Config>(0);
  static_assert(!kScatterD || !kKGrouped, "scattered outputs: M-grouped problems (the registry's limits)");
  // M-major D (Config::kDMajorM, K-grouped): D_e^T, for a weight stored transposed to the
  // problem's (M, N) (the gradient of X^T dY's swapped roles: X gathered as A, on the M side).
  static constexpr bool kDMajorM = d_major_m_of<Config>(0);
  static_assert(!kDMajorM || kKGrouped, "an M-major D: K-grouped problems (the registry's limits)");
  // (kAheadOk: the load-ahead's registers are there except beside the stream-K walk and, with
  // kPingPong128, beside the other half's accumulators: dSwiGLU spilled 8 bytes with it.)
  using Epi = WgmmaEpilogue<64 * kConsumerWGs, kTileN, Rule, ElementC, ElementD, Engine, false, false, kDefer, kPingPong,
                            FUSEGEMM_SM90_ENGINE_WARPS, kScatterD, !stream_k_of<Config>(0) && !kPingPong128, kDMajorM>;
  static constexpr int kEpiBytes = Epi::kBytes;
  // Stream-K (above): a ring entry also carries its piece's k-block range and the CTAs whose
  // partials a head piece adds (a second int4 per slot). The one producer thread keeps its walk
  // in shared memory after the ring: in its 40 registers, the walk's state spilled (24 bytes of
  // local memory), and 56 (the gathering producers', which walk in registers, a copy per lane)
  // leave the consumers 224, with which the SwiGLU and dSwiGLU epilogues spilled.
  static constexpr bool kStreamK = stream_k_of<Config>(0);
  static_assert(!kStoreA || (kGatherA && !kKGrouped && !kStreamK && !kClusters),
                "stored gathered A: M-grouped, gathered, whole tiles, no clusters (the registry's limits)");
  static_assert(!kStreamK || (!kKGrouped && !kClusters && !Config::kDynamicSched),
                "stream-K: M-grouped problems, no clusters, its own static walk (the registry's limits)");
  static constexpr bool kSmemWalk = kStreamK && !kGathers;
  static_assert(sizeof(StreamKWalk) <= 48, "the walk's shared-memory slot");
  static constexpr int kTileRing = 4;
  static constexpr int kRingBytes = kStreamK ? 32 * kTileRing + 48 : 16 * kTileRing;
  static constexpr int kMiscBytes = 128 /*tensor-map staging*/ + kRingBytes;
  // sm_90 opt-in maximum per block (227 KB), less 1 KB that ptxas reports as static smem
  // for the 1 KB-aligned extern declaration.
  static constexpr int kSmemLimit = 232448 - 1024;
  static constexpr int kMaxStages =
      (kSmemLimit - kEpiBytes - kMiscBytes - 8 * 2 * (8 + kTileRing)) / kStageBytes;
  static constexpr int kStages = kMaxStages > 8 ? 8 : kMaxStages;
  // (Three stages, and two ring slots, are also what a lagging gathered stage needs: produce().)
  static_assert(kStages >= 3, "not enough shared memory for a 3-stage pipeline");
  // The lag (FUSEGEMM_SM90_GATHER_LAG): stage j is published once stage j + kLag is issued. The
  // consumers free stage i after waiting on i + 1's, so the producer's empty wait for stage j
  // needs j - kStages + 1 published: kLag <= kStages - 2. The lagging stages may be the last of
  // up to kLag tiles (tiles of one k-block), whose ring entries the consumers must have read
  // before the lead's ring wait for the next tile passes: kLag <= kTileRing - 1.
  static constexpr int kLag = !kGathers ? 0
                              : FUSEGEMM_SM90_GATHER_LAG < kStages - 2 ? FUSEGEMM_SM90_GATHER_LAG : kStages - 2;
  static constexpr bool kGatherLag = kLag > 0;
  static_assert(!kStoreA || (kHoldsRows && kLag == 1 && kStages >= 3),
                "stored gathered A: held rows, published one stage late, three stages or more");
  static constexpr bool kEarly = kGatherLag && !kKGrouped && FUSEGEMM_SM90_GATHER_EARLY;
  static_assert(kLag < kTileRing, "lagging stages of more tiles than ring slots");

  static constexpr int kOffA = 0;
  static constexpr int kOffB = kOffA + kStages * kABytes;
  static constexpr int kOffEpi = kOffB + kStages * kBBytes;
  static constexpr int kOffTmap = kOffEpi + kEpiBytes;            // 128-aligned (below)
  static constexpr int kOffRing = kOffTmap + 128;
  static constexpr int kOffBars = kOffRing + kRingBytes;
  static constexpr int kNumBars = 2 * kStages + 2 * kTileRing;
  static constexpr int kSmemBytes = kOffBars + 8 * kNumBars;
  static_assert(kABytes % 1024 == 0 && kBBytes % 1024 == 0, "SW128 stages need 1 KB alignment");
  static_assert(kOffTmap % 128 == 0, "tensor-map staging must be 128-byte aligned");
  static_assert(kSmemBytes <= kSmemLimit, "shared memory plan exceeds 227 KB");

  // Register split (setmaxnreg): producer warps give registers to the consumers.
  // A cluster-capable producer holds the cluster geometry and the block walk besides the tile
  // state: 40 registers spilled it (one value per tile).
  static constexpr int kProducerRegs = kClusters || kGathers ? 56 : 40;   // (a gathering lane holds its row indices)
  static constexpr int kConsumerRegs = kConsumerWGs == 2 ? (kClusters || kGathers ? 224 : 232) : 240;
  static_assert(kProducerRegs * 128 + kConsumerRegs * 128 * kConsumerWGs <= 65536,
                "register split exceeds the register file");

  // Slots per CTA in tmap_workspace (discrete weights): a slot is rewritten only after the
  // pipeline has drained every load issued kStages loads ago (see DeviceTmap). The host
  // reserves kTmapSlotStride (exported) slots of 128 bytes per CTA.
  static constexpr int kTmapSlots = kStages;
  static constexpr int kTmapSlotsPerCta = 8;
  static_assert(kTmapSlots <= kTmapSlotsPerCta, "more stages than reserved tensor-map slots");

  // Host contract (fusegemm/base/contract.py): A (K, rows) and B (K, N, L) maps with boxes of
  // (kTileK, kTileM) and (kTileK, kTileN), SWIZZLE_128B, in the elements' own TMA type; discrete
  // weights get kTmapSlotsPerCta slots of 128 B per CTA in tmap_workspace.
  // The largest cluster (2x2) matches the registry's sm_90a limits (tests/unit/test_contract.py).
  static constexpr int kMinClusterM = 1, kMinClusterN = 1, kMaxClusterCtas = kClusters ? kSlices * kSlices : 1;
  static constexpr int kCtasPerTile = 1;
  static constexpr int kMAligned = fusegemm::kMAligned;
  // MN-major B: maps of (N, K, L) (discrete: (N, K)) with boxes of 64 N x 64 K.
  // K-grouped: A maps of (M, tokens) with boxes of 64 M x 64 tokens, kTileM / 64 per stage.
  // Slices: K-major boxes split along their rows (M or N), whole 8-row SW128 atoms (1 KB), so a
  // slice lands where the unsliced box would have put it; an N-major B is shared by chunks.
  static constexpr int kSliceRowsA = kTileM / kSlices, kSliceRowsB = kTileN / kSlices;
  static_assert(kSliceRowsA % 8 == 0 && kSliceRowsB % 8 == 0, "slices are whole 8-row SW128 atoms");
  // (Gathered A: a map of one-row boxes, encoded and never read; kStoreA: a_rows' map, whose box is
  // a copying warp's share of a stage, the store's.)
  static constexpr int kBoxAInner = kAMn ? 64 : kTileK,
                       kBoxAOuter = kStoreA ? kShareRows : kGatherA ? 1 : kAMn ? kTileK : kSliceRowsA;
  static constexpr int kAChunks = kAMn ? kTileM / 64 : 1;  // A loads per stage
  // (FUSEGEMM_SM90_CLUSTER_BMN_SPLIT_K: an N-major B of the cluster kernel in K halves.)
  static constexpr bool kBMnSplitK = kBMn && kClusters && FUSEGEMM_SM90_CLUSTER_BMN_SPLIT_K;
  static constexpr int kBoxBInner = kBMn ? 64 : kTileK,
                       kBoxBOuter = kGatherB ? 1 : kBMnSplitK ? kTileK / kSlices : kBMn ? kTileK : kSliceRowsB;
  static constexpr int kBChunks = kBMn ? kTileN / 64 : 1;  // B loads per stage
  static constexpr int kSwizzleA = 128, kSwizzleB = 128;
  static constexpr int kTmaDtypeA = TmaDtype<ElementA>::value, kTmaDtypeB = TmaDtype<ElementB>::value;
  static constexpr int kTmapSlotStride = Config::kDiscreteB ? kTmapSlotsPerCta : 0;
  static constexpr int kTmemCols = 0, kSfBoxK = 0, kSfBoxNB = 0;

  // K-grouped: (expert, M block, N block) tiles of the (L, M, N) output, M = p.m_rows. Clusters:
  // blocks of cluster tiles (a 1x1 cluster walks exactly GroupedScheduler's tile order).
  using Geom = ClusterGeom<1>;
  using Sched = fusegemm::conditional_t<
      kKGrouped, BatchedScheduler<kTileM, kTileN, FUSEGEMM_RASTER_GROUP>,
      fusegemm::conditional_t<kClusters, GroupedClusterScheduler<kTileM, kTileN, 1, FUSEGEMM_RASTER_GROUP>,
                              GroupedScheduler<kTileM, kTileN, FUSEGEMM_RASTER_GROUP>>>;

  template <class Params>
  static __device__ Sched make_sched(const Params& p, const Geom& geom) {
    if constexpr (kKGrouped) {
      return Sched(p.m_rows, p.n, p.num_experts);
    } else if constexpr (kClusters) {
      return Sched(reinterpret_cast<const int*>(p.offsets), p.num_experts, p.n, p.m_rows, geom);
    } else {
      return Sched(reinterpret_cast<const int*>(p.offsets), p.num_experts, p.n, p.m_rows);
    }
  }

  // This CTA's place in its cluster (a 1x1 geometry without clusters) and the scheduling unit:
  // the cluster block walk's unit is the sub-cluster (ClusterGeom), one per launch cluster.
  template <class Params>
  static __device__ Geom make_geom(const Params& p) {
    if constexpr (kClusters) {
      const int rank = int(cluster_cta_rank()), ncta = int(cluster_num_ctas());
      const Geom g = Geom::make(p.cluster_m, p.cluster_n, rank, ncta);
      // A share group larger than the slices of a box would leave a member a stage without a
      // load of its own (the empty-barrier argument of cluster.cuh needs one): such a launch
      // (the host's limits refuse it) runs every CTA as its own sub-cluster, nothing shared.
      if (g.pm() > kSlices || g.cn > kSlices) return Geom::make(0, 0, rank, ncta);
      return g;
    } else {
      return Geom::make(1, 1, 0, 1);
    }
  }
  static __device__ StaticWalk make_walk(const Geom& geom) {
    if constexpr (kClusters) {
      const uint32_t ncta = cluster_num_ctas();
      return StaticWalk(int((cluster_linear_id() * ncta + cluster_cta_rank()) / uint32_t(geom.size())),
                        int(cluster_count() * ncta / uint32_t(geom.size())));
    } else {
      return StaticWalk(blockIdx.x, gridDim.x);
    }
  }
  // A tile the epilogue stores: every grouped tile, and a cluster block's tiles inside the
  // problem (a block at the problem's edge also holds phantom tiles, which load zeros and feed
  // the barrier protocol, and store nothing).
  template <class Tile>
  static __device__ bool stores(const Tile& t) {
    if constexpr (kClusters) return t.in_range; else return true;
  }

  // Row ends (fusegemm/scheduler.cuh): M-grouped tiles with dense weights and without clusters
  // walk the compacted tile space, the blocks that hold a token (a cluster block's tiles load and
  // multicast together: they all run; K-grouped tiles shorten their k range instead, k_range).
  // Discrete weights run every tile: their producer's tensor-map state leaves no registers for
  // the cursor (8 bytes spilled).
  static constexpr bool kCompacts = FUSEGEMM_SM90_COMPACT_ROW_ENDS && !kKGrouped && !kClusters && !Config::kDiscreteB;
  using Compacted = CompactedScheduler<kTileM, kTileN, FUSEGEMM_RASTER_GROUP>;

  // The compacted space's M blocks, or -1 without row ends (the full tile space): every lane of
  // a producer warp calls it.
  template <class Params>
  static __device__ int compacted_blocks(const Params& p, const Geom& geom) {
    if constexpr (kCompacts) {
      if (p.row_ends == nullptr) return -1;
      return Compacted::count(make_sched(p, geom), reinterpret_cast<const int*>(p.row_ends));
    } else {
      return -1;
    }
  }

  // First token row and k-block count of a tile: the whole K, or (K-grouped) the expert's token
  // rows (fusegemm/scheduler.cuh kgrouped_k_range).
  template <class Params>
  static __device__ int2 k_range(const Params& p, int expert) {
    if constexpr (kKGrouped) {
      return kgrouped_k_range<kTileK>(reinterpret_cast<const int*>(p.offsets), reinterpret_cast<const int*>(p.row_ends),
                                      expert, p.k);
    } else {
      return make_int2(0, (p.k + kTileK - 1) / kTileK);
    }
  }

  // First output row of a ring tile (expert, M block, N block, linear): the problem's row
  // (M-grouped), or the row of expert e's block in the (L * M, N) output (K-grouped).
  template <class Params>
  static __device__ int tile_row0(const Params& p, const int4& t) {
    return (kKGrouped ? t.x * p.m_rows : 0) + t.y * kTileM;
  }

  static constexpr int kStagger = kConsumerWGs == 2 && !kPingPong ? FUSEGEMM_SM90_STAGGER : 0;
  static_assert(kStagger >= 0 && kStagger <= kStages, "stagger must be within the pipeline");
  static constexpr uint32_t kStaggerBarrier = 3;  // named barrier id (0 is __syncthreads)
  // Ping-pong order: warpgroup wg starts a mainloop only after the other has issued its previous
  // tile's (named barrier kOrderBarrier + wg, which the other arrives on after its mainloop). The
  // mainloops then alternate strictly, which the stage barriers' parity needs: a warpgroup skips
  // the other's tile without waiting on its stages, so without the order it could wait on a
  // stage two phases ahead of the barrier and take the phase before for its own.
  static constexpr uint32_t kOrderBarrier = 4;  // ids 4 and 5 (1 + wg: the engine epilogue)
  // Stream-K fix-up: the threads of a tile (both warpgroups cooperative, one ping-pong) meet on
  // named barrier kStreamKBarrier (ping-pong: + wg) around a partial's release and acquire.
  static constexpr uint32_t kStreamKBarrier = 6;   // ids 6 and 7
  static constexpr int kTileThreads = kPingPong ? 128 : 128 * kConsumerWGs;
  using Fixup = StreamKFixup<kTileThreads, kAccum>;

  template <class Params>
  static __device__ void run(const Params& p) {
    extern __shared__ __align__(1024) uint8_t smem[];
    const int tid = threadIdx.x;
    const int wg = tid / 128;

    uint64_t* full = reinterpret_cast<uint64_t*>(smem + kOffBars);
    uint64_t* empty = full + kStages;
    uint64_t* tile_full = empty + kStages;
    uint64_t* tile_empty = tile_full + kTileRing;
    int4* ring = reinterpret_cast<int4*>(smem + kOffRing);

    const Geom geom = make_geom(p);
    const bool clustered = kClusters && geom.size() > 1;
    if (tid == 0) {
      // SW128 tiles and descriptors assume a 1 KB aligned base; a silent misalignment
      // would produce wrong results, so stop loudly instead.
      if (smem_u32(smem) % 1024 != 0) __trap();
      for (int s = 0; s < kStages; ++s) {
        mbar_init(&full[s], kFullArrivals);
        mbar_init(&empty[s], kReleasesPerCta * (kPeerReleases ? geom.empty_count() : 1u));
      }
      for (int s = 0; s < kTileRing; ++s) {
        mbar_init(&tile_full[s], 1);
        mbar_init(&tile_empty[s], kConsumerWarps);
      }
      mbar_fence_init();
    }
    // Peers multicast into this CTA and arrive on its barriers: their inits must be visible
    // cluster-wide first.
    if (clustered) cluster_sync_all(); else __syncthreads();

    if (wg == kConsumerWGs) {
      cutlass::arch::warpgroup_reg_dealloc<kProducerRegs>();
      // (gathered operands: the copying warps, every lane loads gathered rows; else one thread)
      if (tid % 128 < 32 * (kGathers ? kGatherWarps : 1)) {
        const int blocks = compacted_blocks(p, geom);   // (the warp's lanes together)
        if (kGathers || elect_one()) produce(p, smem, geom, full, empty, tile_full, tile_empty, ring, blocks);
      }
    } else {
      cutlass::arch::warpgroup_reg_alloc<kConsumerRegs>();
      consume(p, smem, geom, wg, full, empty, tile_full, tile_empty, ring);
    }
    // No CTA leaves while a peer may still multicast into it or release stages on it.
    if (clustered) {
      __syncwarp();
      cluster_sync_all();
    }
  }

  // ------------------------------------------------------------------------------------
  // Producer: one thread (gathered operands: the copying warps, lane 0 of the first leading; the
  // others copy gathered rows only).
  // ------------------------------------------------------------------------------------
  template <class Params>
  static __device__ void produce(const Params& p, uint8_t* smem, const Geom& geom, uint64_t* full,
                                 uint64_t* empty, uint64_t* tile_full, uint64_t* tile_empty,
                                 int4* ring, int blocks) {
    const int lane = threadIdx.x % 32;
    const int gwarp = (threadIdx.x % 128) / 32;   // gathered operands: this warp's share
    const bool lead = !kGathers || (gwarp == 0 && lane == 0);
    if (lead) {
      prefetch_tmap(&p.tma_a);
      prefetch_tmap(&p.tma_b);
    }
    // With row ends (blocks >= 0), M-grouped tiles walk the compacted tile space (a cursor that
    // each claim moves); its scheduler serves the full tile space too, without them.
    auto sched = [&] {
      if constexpr (kCompacts) {
        return Compacted(make_sched(p, geom), blocks >= 0 ? reinterpret_cast<const int*>(p.row_ends) : nullptr, blocks);
      } else {
        return make_sched(p, geom);
      }
    }();
    // Gathered operands' sources (fusegemm/gather.cuh): M-grouped A is K elements wide; K-grouped
    // dY's rows are M (m_rows) wide, X's N.
    const GatherSource src_a{static_cast<const unsigned char*>(p.a_gather_ptr), p.a_gather_ld * 2ll, p.a_gather_rows,
                             kKGrouped ? p.m_rows : p.k};
    const GatherSource src_b{static_cast<const unsigned char*>(p.b_gather_ptr), p.b_gather_ld * 2ll, p.b_gather_rows,
                             p.n};
    // A is shared along cluster N (same M tile), B along cluster M when the block's M tiles
    // belong to one expert (ClusterTile::share_b).
    const Share share_a{geom.a_group() > 1 && kMulticasts, geom.a_group(), geom.a_member(), geom.a_mask()};
    // Every M-grouped tile's k-blocks, hoisted out of the tile loop (K-grouped tiles take theirs
    // from k_range per tile); the M-grouped SASS is the one measured before K-grouping existed.
    const int k_blocks_all = kKGrouped ? 0 : k_range(p, 0).y;

    DeviceTmap<kTmapSlots> dtm;
    const CUtensorMap* tmap_b = &p.tma_b;
    int tmap_expert = -1;
    if constexpr (Config::kDiscreteB) {
      if (lead) dtm.init(&p.tma_b,
               reinterpret_cast<CUtensorMap*>(p.tmap_workspace) + blockIdx.x * kTmapSlotsPerCta,
               reinterpret_cast<CUtensorMap*>(smem + kOffTmap));
    }

    StaticWalk walk = make_walk(geom);
    // Stream-K: this CTA's units over the tile space the scheduler walks (the compacted one with
    // row ends), every lane the same sequence; one producer thread's walk lives in shared memory
    // (kSmemWalk), read and written back per unit.
    StreamKWalk sk_walk(StreamKPlan::make(kStreamK ? sched.num_tiles() : 0, gridDim.x, k_blocks_all,
                                          kStreamK ? p.sk_min_k_blocks : 0),
                        blockIdx.x);
    int4* sk_ring = ring + kTileRing;
    StreamKWalk* sk_walk_smem = reinterpret_cast<StreamKWalk*>(sk_ring + kTileRing);
    if constexpr (kSmemWalk) *sk_walk_smem = sk_walk;
    int stage = 0, slot = 0;
    uint32_t phase = 0, ring_phase = 0;
    // kGatherLag: this lane's committed stages not yet published, the oldest first, each published
    // kLag stages after it is issued (fusegemm/gather.cuh GatherPublisher, the blockwise kernel's
    // too); publish() publishes them all now.
    GatherPublisher<kStages, (kLag > 0 ? kLag : 1)> pub;
    // kStoreA: the one stage not yet published (lag 1), its k-block and the share's first row when
    // it is to be stored (-1: not). Lane 0 commits one bulk group per published stage (empty where
    // nothing is stored), so the groups run in stage order: when stage s is refilled, the stages
    // published after it are the kStages - 2 before the pending one, and waiting until at most
    // that many groups read shared memory is waiting for s's store alone (a wait for every store
    // before each refill held the copying warps on the store of the stage just published).
    int st_stage = -1, st_kb = 0, st_row0 = -1;
    auto store_published = [&]() {   // after the pending stage's publication: its share to a_rows
      if constexpr (kStoreA) {
        if (st_stage >= 0) {
          if (st_row0 >= 0) __syncwarp();   // (every lane's copies landed and fenced: published)
          if (lane == 0) {
            if (st_row0 >= 0) {
              tma_store_2d(&p.tma_a, smem + kOffA + st_stage * kABytes + gwarp * kShareRows * 128, st_kb * kTileK,
                           st_row0, kStoreHint);
            }
            tma_store_commit();
          }
        }
        st_stage = -1;
      }
    };
    auto publish = [&](bool all) {
      if constexpr (kGatherLag) {
        if (all) {
          pub.flush(full);
          store_published();
        }
      }
    };
    while (true) {
      int linear;
      StreamKUnit unit{0, 0, k_blocks_all, 0, -1};
      const int ring_slot = slot;
      if constexpr (kSmemWalk) {
        // (the one producer thread, so the lead: the piece goes to its ring slot now and is read
        // back below, so that its fields are not live in registers through the tile lookup)
        mbar_wait(&tile_empty[slot], ring_phase ^ 1);
        StreamKWalk w = *sk_walk_smem;
        unit = w.next();
        *sk_walk_smem = w;
        sk_ring[slot] = make_int4(unit.kb_begin, unit.kb_end, unit.wait_first, unit.wait_last);
        linear = unit.linear;
      } else if constexpr (kStreamK) {
        unit = sk_walk.next();
        linear = unit.linear;
      } else if constexpr (Config::kDynamicSched) {
        linear = lead ? dynamic_claim(reinterpret_cast<unsigned int*>(p.sched_counter)) : 0;
        if constexpr (kGathers) linear = __shfl_sync(0xffffffffu, linear, 0);   // one claim per warp
      } else {
        linear = walk.claim();   // (every lane walks the same sequence)
      }
      const auto t = [&] {   // (the stream-K walk yields tiles of the space or -1)
        if constexpr (kStreamK) return sched.template tile<false>(linear); else return sched.tile(linear);
      }();

      // Only the lead writes ring entries, so only it waits for a free slot. (The copying warps
      // used to wait as well, by parity: a warp that reached its first wait after the consumers
      // had read the first tile found the slot a phase on, and waited for a phase that needs its
      // own copies. H200, 2026-12-04: the K-grouped gathered weight gradient hung in 13 of the 14
      // processes that launched it in bursts; cuda-gdb showed two copying warps at their first
      // ring wait and the consumers at the first tile's first stage, 65 of its 129 arrivals in.)
      // A tile the epilogue does not store (a phantom of a cluster block) travels as expert -1.
      if (lead) {
        if constexpr (!kSmemWalk) mbar_wait(&tile_empty[slot], ring_phase ^ 1);
        ring[slot] = make_int4(stores(t) ? t.expert : -1, t.m_block, t.n_block, t.linear);
        if constexpr (kStreamK && !kSmemWalk) {
          sk_ring[slot] = make_int4(unit.kb_begin, unit.kb_end, unit.wait_first, unit.wait_last);
        }
        mbar_arrive(&tile_full[slot]);
      }
      if (++slot == kTileRing) { slot = 0; ring_phase ^= 1; }
      if (!t.valid()) {
        publish(true);
        break;
      }

      const int m0 = t.m_block * kTileM;
      const int n0 = t.n_block * kTileN;
      // Gathered A: this warp's 32 (or 16) rows of the tile, as offsets into A held for the whole tile
      // (rows past m_rows read zeros); a larger share (one copying warp: dynamic scheduling) is
      // read per k-block.
      GatherRows<(kHoldsRows ? kShareRows : 32) / 4> a_rows;
      if constexpr (kGatherA && !kKGrouped && kHoldsRows) {
        const int row0 = m0 + gwarp * kShareRows;
        a_rows.load(src_a, reinterpret_cast<const int*>(p.a_index), row0, p.m_rows - row0, lane);
      }
      int k0 = 0, num_k_blocks = k_blocks_all;
      // This unit's k-blocks, kb_first .. kb_first + num_k_blocks - 1: the tile's, or (stream-K) its piece's.
      int kb_first = 0;
      if constexpr (kStreamK) {
        const int2 kr = kSmemWalk ? make_int2(sk_ring[ring_slot].x, sk_ring[ring_slot].y)
                                  : make_int2(unit.kb_begin, unit.kb_end);
        kb_first = kr.x;
        num_k_blocks = kr.y - kr.x;
      }
      // K-grouped gathered operands: this warp's token rows of the next k-block, fetched a k-block
      // ahead (load_kgrouped_operand, kPrefetchRows).
      GatherRows<kKShare / 4> ka_rows, kb_rows;
      if constexpr (kKGrouped) {
        const int2 kr = k_range(p, t.expert);
        k0 = kr.x;
        num_k_blocks = kr.y;
        if (kPrefetchRows && num_k_blocks > 0) {
          const int row0 = k0 + gwarp * kKShare;
          if constexpr (kGatherA) ka_rows.fetch(reinterpret_cast<const int*>(p.a_index), row0, kKShare, lane);
          if constexpr (kGatherB) kb_rows.fetch(reinterpret_cast<const int*>(p.b_index), row0, kKShare, lane);
        }
      }
      // Not unrolled (as CUTLASS's producers): each k-block waits on a barrier anyway, and the
      // compacted walk's cursor (row ends) leaves no registers for an unrolled copy (it spilled).
#if FUSEGEMM_SM90_COMPACT_ROW_ENDS
#pragma unroll 1
#endif
      for (int kb = kb_first; kb < kb_first + num_k_blocks; ++kb) {
        // A full pipeline (the stage not yet free): publish the lagging stages now rather than
        // after the wait, so that the consumers do not wait for copies that have landed (kEarly).
        if constexpr (kEarly) {
          if (pub.pending > 0 && !mbar_test_wait(&empty[stage], phase ^ 1)) publish(true);
        }
        mbar_wait(&empty[stage], phase ^ 1);
        if constexpr (kStoreA) {   // this stage's store (if any) has read it (above)
          if (lane == 0) tma_store_wait<kStages - 2>();
          __syncwarp();
        }
        if constexpr (Config::kDiscreteB) {
          // Rewrite only here, after the empty wait (see kTmapSlots).
          if (lead && kb == kb_first && t.expert != tmap_expert) {
            const uint64_t* ptrs = reinterpret_cast<const uint64_t*>(p.b_ptrs);
            tmap_b = dtm.update(reinterpret_cast<const void*>(ptrs[t.expert]));
            tmap_expert = t.expert;
          }
        }
        // (Gathered rows: other lanes' copies may be published before this; the phase cannot
        // complete without this arrival, one of the kFullArrivals.)
        if (lead) mbar_arrive_expect_tx(&full[stage], kTxBytes);
        if constexpr (kKGrouped) {
          uint8_t* sa = smem + kOffA + stage * kABytes;
          uint8_t* sb = smem + kOffB + stage * kBBytes;
          const int t0 = k0 + kb * kTileK;   // the k-block's first token row
          const bool more = kb + 1 < num_k_blocks;
          load_kgrouped_operand<kGatherA, kAChunks>(&p.tma_a, &full[stage], sa, m0, t0, p.a_index, src_a, ka_rows, more,
                                                    lane, lead, gwarp);
          load_kgrouped_operand<kGatherB, kBChunks>(&p.tma_b, &full[stage], sb, n0, t0, p.b_index, src_b, kb_rows, more,
                                                    lane, lead, gwarp);
        } else if constexpr (kClusters) {
          load_stage_sliced(p, smem, geom, stage, &full[stage], tmap_b, t, kb, share_a);
        } else {
          if constexpr (kGatherA) {
            uint8_t* sa = smem + kOffA + stage * kABytes + gwarp * kShareRows * 128;
            if constexpr (kHoldsRows) {
              gather_copy_sw128<1, 0>(sa, src_a, a_rows, kb * kTileK, lane);
            } else {
#pragma unroll 1
              for (int g = 0; g < kShareRows / 16; ++g) {   // (16 rows at a time: fewer registers)
                const int row0 = m0 + gwarp * kShareRows + 16 * g;
                GatherRows<4> rows;
                rows.load(src_a, reinterpret_cast<const int*>(p.a_index), row0, p.m_rows - row0, lane);
                gather_copy_sw128<1, 0>(sa + g * 16 * 128, src_a, rows, kb * kTileK, lane);
              }
            }
          } else {
            tma_load_2d(&p.tma_a, &full[stage], smem + kOffA + stage * kABytes, kb * kTileK, m0);
          }
          if (lead) load_b(&full[stage], smem + kOffB + stage * kBBytes, tmap_b, n0, kb, t.expert);
        }
        if constexpr (kGatherLag) {
          pub.issued(stage, full);   // (lag 1: publishes the stage before, if any)
          if constexpr (kStoreA) {
            store_published();
            st_stage = stage;
            st_kb = kb;
            st_row0 = t.n_block == 0 ? m0 + gwarp * kShareRows : -1;
          }
        } else if constexpr (kGathers) {
          cp_async_arrive_noinc(&full[stage]);   // every lane: its copies landed
        }
        if (++stage == kStages) { stage = 0; phase ^= 1; }
      }
      // A tile without k-blocks (a K-grouped expert without tokens) publishes now: the next
      // tile's ring wait may need the tiles that the lagging stages belong to.
      if (num_k_blocks == 0) publish(true);
    }
    if constexpr (kStoreA) {
      if (lane == 0) tma_store_drain();   // a_rows written before the kernel ends
    }
  }

  // One K-grouped operand's k-block (token rows t0 .. t0 + 63) in chunks of 64 M (N) columns:
  // whole 64-row boxes (the leading lane), or gathered (kGather: row t of the k-block reads token
  // row index[t]; copying warp w takes token rows kKShare w .. + kKShare - 1 of every chunk, from
  // `rows` as fetched a k-block before, and fetches the next k-block's when there is one (`more`);
  // an index outside the operand's rows reads zeros).
  template <bool kGather, int kChunks>
  static __device__ void load_kgrouped_operand(const CUtensorMap* tmap, uint64_t* bar, uint8_t* dst, int c0, int t0,
                                               const void* index_ptr, const GatherSource& src,
                                               GatherRows<kKShare / 4>& rows, bool more, int lane, bool lead,
                                               int gwarp) {
    if constexpr (kGather) {
      const int* index = reinterpret_cast<const int*>(index_ptr);
      if constexpr (kPrefetchRows) {
        rows.resolve(src, lane);
        if (more) rows.fetch(index, t0 + kTileK + gwarp * kKShare, kKShare, lane);
      } else {
        rows.load(src, index, t0 + gwarp * kKShare, kKShare, lane);
      }
      gather_copy_sw128<kChunks, kMnChunkBytes>(dst + gwarp * kKShare * 128, src, rows, c0, lane);
    } else if (lead) {
#pragma unroll
      for (int c = 0; c < kChunks; ++c) tma_load_2d(tmap, bar, dst + c * kMnChunkBytes, c0 + 64 * c, t0);
    }
  }

  // B's k-block kb of N block n0 (no clusters): K-major one box, N-major its 64-column chunks.
  static __device__ void load_b(uint64_t* bar, uint8_t* sb, const CUtensorMap* tmap_b, int n0, int kb, int expert) {
    if constexpr (kBMn) {
#pragma unroll
      for (int c = 0; c < kBChunks; ++c) {
        if constexpr (Config::kDiscreteB) {
          tma_load_2d(tmap_b, bar, sb + c * kMnChunkBytes, n0 + 64 * c, kb * kTileK);
        } else {
          tma_load_3d(tmap_b, bar, sb + c * kMnChunkBytes, n0 + 64 * c, kb * kTileK, expert);
        }
      }
    } else if constexpr (Config::kDiscreteB) {
      tma_load_2d(tmap_b, bar, sb, kb * kTileK, n0);
    } else {
      tma_load_3d(tmap_b, bar, sb, kb * kTileK, n0, expert);
    }
  }

  // One stage of a cluster-capable kernel, slice by slice (fusegemm/cluster.cuh): a private
  // operand (no share group, or B of a block that spans two experts) is loaded whole by this CTA;
  // a shared one only in the slices this CTA issues, multicast to its share group. Every slice
  // lands at the same offset in every destination, whose full barrier counts its bytes.
  template <class Params, class Tile>
  static __device__ void load_stage_sliced(const Params& p, uint8_t* smem, const Geom& geom, int stage,
                                           uint64_t* bar, const CUtensorMap* tmap_b, const Tile& t, int kb,
                                           const Share& share_a) {
    const Share share_b{t.share_b && geom.b_group() > 1 && kMulticasts, geom.b_group(), geom.b_member(),
                        geom.b_mask()};
    const int m0 = t.m_block * kTileM, n0 = t.n_block * kTileN, k0 = kb * kTileK;
    uint8_t* sa = smem + kOffA + stage * kABytes;
    uint8_t* sb = smem + kOffB + stage * kBBytes;
#pragma unroll
    for (int i = 0; i < kSlices; ++i) {
      uint8_t* dst = sa + i * kSliceRowsA * 128;
      if (!share_a.shared) {
        tma_load_2d(&p.tma_a, bar, dst, k0, m0 + i * kSliceRowsA);
      } else if (share_a.issues_slice(i)) {
        tma_load_2d_multicast(&p.tma_a, bar, dst, k0, m0 + i * kSliceRowsA, share_a.mask);
      }
    }
    // K-major: slice i is rows n0 + i * kSliceRowsB of 64 K; N-major: chunk i (64 N x 64 K), or
    // (kBMnSplitK) part i is K half i % kSlices of chunk i / kSlices, so that member j's parts are
    // half j of every chunk.
    constexpr int kBParts = kBMnSplitK ? kBChunks * kSlices : kBMn ? kBChunks : kSlices;
    static_assert(kBParts >= kSlices, "every member of a B share group loads a part of each stage");
    constexpr int kHalfK = kTileK / kSlices;
#pragma unroll
    for (int i = 0; i < kBParts; ++i) {
      if (share_b.shared && !share_b.issues_slice(i)) continue;
      const int chunk = kBMnSplitK ? i / kSlices : i, half = kBMnSplitK ? i % kSlices : 0;
      uint8_t* dst = kBMn ? sb + chunk * kMnChunkBytes + half * kHalfK * 128 : sb + i * kSliceRowsB * 128;
      const int c0 = kBMn ? n0 + 64 * chunk : k0, c1 = kBMn ? k0 + half * kHalfK : n0 + i * kSliceRowsB;
      if constexpr (Config::kDiscreteB) {
        if (share_b.shared) tma_load_2d_multicast(tmap_b, bar, dst, c0, c1, share_b.mask);
        else tma_load_2d(tmap_b, bar, dst, c0, c1);
      } else {
        if (share_b.shared) tma_load_3d_multicast(tmap_b, bar, dst, c0, c1, t.expert, share_b.mask);
        else tma_load_3d(tmap_b, bar, dst, c0, c1, t.expert);
      }
    }
  }

  // Release a stage once the WGMMAs have read it (lane 0 of a consumer warp calls this). The
  // cluster kernel releases it to every CTA whose multicasts may write it (this CTA's cluster
  // row and column, itself included), once per warpgroup (CUTLASS's PipelineTmaAsync: a WGMMA
  // is a warpgroup operation, so one warp's wait proves the whole group has read the stage):
  // warp j of the group arrives on the j-th CTA of the release mask, so the (at most 3)
  // arrivals of a 2x2 cluster go out in parallel. Other kernels release per consumer warp.
  static constexpr int kReleasesPerCta = kClusters ? kStageWGs : 4 * kStageWGs;
  static __device__ void release_stage(uint64_t* empty_s, uint16_t mask, uint32_t me, int warp_in_group) {
    if constexpr (kClusters && !kPeerReleases) {
      if (warp_in_group == 0) mbar_arrive(empty_s);   // (its own stage only: the A/B build above)
    } else if constexpr (kClusters) {
      uint32_t m = mask;
      for (int j = 0; j < warp_in_group && m != 0; ++j) m &= m - 1;   // drop the first warp_in_group CTAs
      if (m != 0) {
        const uint32_t r = uint32_t(__ffs(int(m)) - 1);
        if (r == me) mbar_arrive(empty_s); else mbar_arrive_remote(empty_s, r);
      }
    } else {
      mbar_arrive(empty_s);
    }
  }

  // ------------------------------------------------------------------------------------
  // Consumers: one warpgroup per 64 rows.
  // ------------------------------------------------------------------------------------
  template <class Params>
  static __device__ void consume(const Params& p, uint8_t* smem, const Geom& geom, int wg, uint64_t* full,
                                 uint64_t* empty, uint64_t* tile_full, uint64_t* tile_empty,
                                 int4* ring) {
    const int lane = threadIdx.x % 32;
    const int warp = threadIdx.x / 32;  // 0 .. kConsumerWarps-1
    // Every M-grouped tile's k-blocks, hoisted out of the tile loop (K-grouped tiles take theirs
    // from k_range per tile); the M-grouped SASS is the one measured before K-grouping existed.
    const int k_blocks_all = kKGrouped ? 0 : k_range(p, 0).y;
    // A: this warpgroup's 64 rows; K-major rows of 128 bytes, or (K-grouped) its own MN-major
    // chunk of 64 token rows x 64 M (8 KB, the same bytes).
    const uint32_t a_base = smem_u32(smem + kOffA) + (kPingPong ? 0 : wg * 64 * 128);
    const uint32_t b_base = smem_u32(smem + kOffB);
    const uint64_t da0 = kAMn ? sw128_mnmajor_desc(a_base) : sw128_kmajor_desc(a_base);
    const uint64_t db0 = kBMn ? sw128_mnmajor_desc(b_base) : sw128_kmajor_desc(b_base);
    // K step of one k16 instruction in the descriptor's 16-byte units: 32 bytes along a K-major
    // row, 16 rows of 128 bytes in an MN-major chunk.
    constexpr int kDescStepK = kBMn ? (16 * 128) >> 4 : 2;
    constexpr int kDescStepKA = kAMn ? (16 * 128) >> 4 : 2;
    // The CTAs this one releases stages to (itself included; a 1x1 geometry: itself only).
    const uint32_t me = kClusters ? cluster_cta_rank() : 0u;
    const uint16_t commit_mask = kClusters ? geom.commit_mask() : uint16_t(1);

    int stage = 0, slot = 0;
    uint32_t phase = 0, ring_phase = 0;
    // Ping-pong: the epilogue places warpgroup wg's fragment at rows 64 wg.. of the tile, so
    // each warpgroup's whole 64-row tile is passed as starting 64 wg rows earlier.
    const int row_shift = kPingPong ? 64 * wg : 0;
    bool turn = wg == 0;  // ping-pong: the next ring tile is this warpgroup's
    bool first_turn = wg == 0;  // warpgroup 0's first mainloop waits for nobody
    float acc[kAccum];
    float acc1[kHalves == 2 ? kAccum : 1];   // kPingPong128: the tile's second 64 rows
    auto fence_accs = [&] {   // every accumulator this warpgroup's WGMMAs write
      fence_acc(acc);
      if constexpr (kHalves == 2) fence_acc(acc1);
    };
    typename Epi::Partials part;
    part.reset();
    typename Epi::Deferred pending;   // the previous tile's D (kDeferD)
    const uint32_t epi_buf = Epi::warp_buf(smem + kOffEpi, warp);

    // Stagger handshake: warpgroup 0 arrives exactly once (after kStagger k-blocks of its
    // first tile, at the end of that tile if it is shorter, or on exit if it gets none);
    // warpgroup 1 waits once before its first tile.
    bool stagger_pending = kStagger > 0 && wg == 0;
    if constexpr (kStagger > 0) {
      if (wg == 1) named_barrier_sync(kStaggerBarrier, 256);
    }
    auto stagger_release = [&]() {
      if constexpr (kStagger > 0) {
        if (stagger_pending) {
          named_barrier_arrive(kStaggerBarrier, 256);
          stagger_pending = false;
        }
      }
    };

    while (true) {
      mbar_wait(&tile_full[slot], ring_phase);
      const int4 t = ring[slot];
      // Stream-K: (first k-block, end, CTAs whose partials a head piece adds: first, last), kept
      // through the mainloop as one word (fusegemm/stream_k.cuh fixup_word).
      int num_k_blocks, sk_fix = 0;
      if constexpr (kStreamK) {
        const int4 sk = ring[kTileRing + slot];
        num_k_blocks = sk.y - sk.x;
        sk_fix = fixup_word(sk.x, sk.z, sk.w);
      }
      __syncwarp();
      if (lane == 0) mbar_arrive(&tile_empty[slot]);
      if (++slot == kTileRing) { slot = 0; ring_phase ^= 1; }
      if (t.w < 0) break;

      if constexpr (!kStreamK) num_k_blocks = kKGrouped ? k_range(p, t.x).y : k_blocks_all;
      // A stream-K piece after the tile's head stores its partial instead of the tile.
      const bool partial = kStreamK && sk_fix < 0;
      const bool stores_tile = (!kClusters || t.x >= 0) && !partial;   // (a cluster block's phantoms: expert -1)
      if constexpr (kPingPong) {
        const bool own = turn;
        turn = !turn;
        if (!own) {   // the other warpgroup's tile: skip its stages
          const int s = stage + num_k_blocks;
          phase ^= uint32_t(s / kStages) & 1u;
          stage = s % kStages;
          continue;
        }
        if (!first_turn) named_barrier_sync(kOrderBarrier + wg, 256);   // its mainloop came first
        first_turn = false;
      }
      int prev_stage = 0;
      const int prefetch_kb = FUSEGEMM_SM90_EPI_PREFETCH > 0 ? max(num_k_blocks - FUSEGEMM_SM90_EPI_PREFETCH, 0) : -1;
      // One k-block: wait for its stage, issue its WGMMAs, release the stage before it.
      auto k_step = [&](int kb) {
        if (kb == prefetch_kb && stores_tile) {
#pragma unroll
          for (int h = 0; h < kHalves; ++h) Epi::prefetch(p, tile_row0(p, t) + 64 * h - row_shift, t.z * kTileN, warp, lane);
        }
        mbar_wait(&full[stage], phase);
        if constexpr (kGathers && !kGatherLag) fence_async_shared();   // cp.async's writes, read by WGMMA
        fence_accs();
        cute::warpgroup_arrive();
        // Descriptor address field is in 16-byte units: stage offsets and the 32-byte K
        // step are added to the low word directly.
        const uint64_t da = da0 + static_cast<uint64_t>((stage * kABytes) >> 4);
        const uint64_t db = db0 + static_cast<uint64_t>((stage * kBBytes) >> 4);
#pragma unroll
        for (int k = 0; k < kTileK / 16; ++k) {
          gmma_64xN<kTileN, kBMn, kAMn>(da + kDescStepKA * k, db + kDescStepK * k, acc, (kb > 0 || k > 0) ? 1 : 0);
          if constexpr (kHalves == 2) {   // rows 64.. of the stage's A: 64 K-major rows of 128 bytes on
            gmma_64xN<kTileN, kBMn, kAMn>(da + ((64 * 128) >> 4) + kDescStepKA * k, db + kDescStepK * k, acc1,
                                          (kb > 0 || k > 0) ? 1 : 0);
          }
        }
        cute::warpgroup_commit_batch();
        fence_accs();
        // Keep one batch in flight; the one before it has finished reading its stage.
        cute::warpgroup_wait<1>();
        if (kb > 0 && lane == 0) release_stage(&empty[prev_stage], commit_mask, me, warp % 4);
        prev_stage = stage;
        if (++stage == kStages) { stage = 0; phase ^= 1; }
        if (kb + 1 == kStagger) stagger_release();
      };
      int kb = 0;
      typename Epi::Pre pre;   // kDeferD: this tile's epilogue inputs
      if constexpr (Epi::kDeferD) {
        // The previous tile's D, chunk c after k-block c's WGMMAs are issued (fully unrolled:
        // each chunk's registers are free once it is stored, not live through the mainloop).
        // Only this head is unrolled. A rolled head that the last tile leaves through (the drain
        // merged into it) ran 7-20% slower on the H200: ptxas serialized the WGMMAs (C7518,
        // runtime/compile.py). The chunks spread over 2 or 1 head k-blocks instead: 0.94-1.03x;
        // again on 2026-12-01 (bench/ceiling.py and wgrad.py --also, 11 rounds, 18 rows): 2 head
        // k-blocks 0.95-1.01x, 1 head k-block 0.88-1.00x, though their NVRTC time is 25-40% less
        // (16 and 12 WGMMA sites instead of 24; bench/results/*_h200_head.json).
#pragma unroll
        for (int c = 0; c < Epi::kChunks; ++c) {
          if (kb + 1 < num_k_blocks) k_step(kb++);
          Epi::store_chunk_at(c, p, epi_buf, pending, lane);
        }
        pending.row0 = -1;
#pragma unroll 1
        for (; kb + 1 < num_k_blocks; ++kb) k_step(kb);
        // The epilogue's loads go out before the last k-block: its WGMMAs hide their latency,
        // and their registers are live through one k-block, not the mainloop.
        if (stores_tile) pre = Epi::preload(p, t.x, tile_row0(p, t), warp, lane);
        // At most one k-block is left. An `if`, not the staged kernels' loop: NVVM unrolled that
        // loop here too (7 copies of a k-block, one ever run), half of these kernels' WGMMA
        // sites and NVRTC time.
        if (kb < num_k_blocks) k_step(kb++);
      } else {
        // Rolled: unrolling it (NVVM's 4x) doubled the staged kernels' NVRTC time and bought
        // nothing measurable on the H200 (bench/epilogue_swiglu.py, same-run A/B: the
        // unrolled loop 0.97-1.03x of the rolled one, median 1.00).
#pragma unroll 1
        for (; kb < num_k_blocks; ++kb) k_step(kb);
      }
      stagger_release();
      if constexpr (kPingPong) named_barrier_arrive(kOrderBarrier + (wg ^ 1), 256);
      cute::warpgroup_wait<0>();
      fence_accs();
      if (num_k_blocks > 0 && lane == 0) release_stage(&empty[prev_stage], commit_mask, me, warp % 4);
      if constexpr (kStreamK) {
        if (sk_fix != 0) stream_k_fixup(p, partial, fixup_first(sk_fix), fixup_last(sk_fix), wg, acc);
        if (partial) continue;
      }
      if constexpr (kKGrouped) {   // (M-grouped tiles always have k-blocks: K >= 8)
        if (num_k_blocks == 0) {   // an expert without tokens: its gradient is zero
#pragma unroll
          for (int i = 0; i < kAccum; ++i) acc[i] = 0.0f;
        }
      }

      if (stores_tile && (!FUSEGEMM_SM90_BENCH_NO_EPILOGUE || acc[0] == -1.0f)) {
        if constexpr (Epi::kDeferD) {
          Epi::compute(p, pre, tile_row0(p, t), t.z * kTileN, warp, lane, acc, pending);
        } else {
          Epi::run(p, smem + kOffEpi, t.x, tile_row0(p, t) - row_shift, t.z * kTileN, wg, warp, lane, acc, part);
          // kPingPong128: the second half as if it were the tile of rows 64.. (the epilogue places
          // a warpgroup's fragment at m0 + 64 wg; its staging buffers are this warpgroup's, free
          // again when a run returns).
          if constexpr (kHalves == 2) {
            Epi::run(p, smem + kOffEpi, t.x, tile_row0(p, t) + 64 - row_shift, t.z * kTileN, wg, warp, lane, acc1,
                     part);
          }
        }
      }
    }
    stagger_release();
    if constexpr (Epi::kDeferD) Epi::drain(p, epi_buf, pending, lane);
    Epi::finish(part, p, warp, lane);
  }

  // Stream-K fix-up (fusegemm/stream_k.cuh) of a piece's accumulators: a partial goes to this
  // CTA's slot and raises its flag; a head piece waits for CTAs first .. last and adds theirs.
  template <class Params>
  static __device__ void stream_k_fixup(const Params& p, bool partial, int first, int last, int wg,
                                        float (&acc)[kAccum]) {
    const uint32_t bar = kStreamKBarrier + (kPingPong ? uint32_t(wg) : 0u);
    const int t = kPingPong ? int(threadIdx.x % 128) : int(threadIdx.x);
    float* partials = static_cast<float*>(p.sk_partials);
    int* flags = static_cast<int*>(p.sk_flags);
    if (partial) {
      Fixup::store(partials, blockIdx.x, t, acc);
      named_barrier_sync(bar, kTileThreads);
      if (t == 0) flag_release(flags + blockIdx.x);
    } else {
      if (t == 0) Fixup::wait(flags, first, last);
      named_barrier_sync(bar, kTileThreads);
      Fixup::add(partials, first, last, t, acc);
    }
  }

};

}  // namespace sm90
}  // namespace fusegemm
