// TMA (bulk tensor copy) and mbarrier helpers, shared by the sm_90a and sm_100a kernels.
//
// Plain PTX available on both targets (PTX ISA 8.0+, sm_90 and later); nothing here is
// Hopper- or Blackwell-specific, so both mainloops use the same spelling of every barrier
// and copy. Addresses of shared memory are 32-bit shared-window offsets (`smem_u32`).
//
// Interface (namespace fusegemm):
//   smem_u32(p)                          generic pointer -> shared-window address
//   elect_one()                          true in exactly one lane of a converged warp
//   mbar_init(bar, count)                init an mbarrier (count = arrivals per phase)
//   mbar_fence_init()                    make inits visible to the async proxy / cluster
//   mbar_arrive(bar)                     one arrival (release, CTA scope)
//   mbar_arrive_cluster(bar, cta)        one arrival on CTA `cta`'s barrier at the same offset
//                                        (release at cluster scope: publishes this thread's writes)
//   mbar_arrive_remote(bar, cta)         the same with CTA-scope release, for arrivals that publish
//                                        nothing (a consumer's stage release)
//   mbar_arrive_expect_tx(bar, bytes)    arrival + expect `bytes` of TMA transactions
//   mbar_wait(bar, parity)               spin until the phase with `parity` has completed
//   mbar_try_wait(bar, parity) -> bool   one probe
//   tma_load_2d / tma_load_3d            global -> shared tile, completes on `bar` (tx bytes)
//   tma_load_2d_multicast                same, delivered to every CTA in `cta_mask`
//   tma_store_2d / tma_store_commit / tma_store_wait<N> / tma_store_drain   shared -> global
//   fence_async_shared()                 order generic smem writes before async-proxy reads
//   prefetch_tmap(desc)                  warm the descriptor cache
//   named_barrier_sync(id, threads)      bar.sync on a hardware barrier other than 0
//   named_barrier_arrive(id, threads)    bar.arrive: count this warp in, without waiting
//   DeviceTmap: per-CTA tensor-map slots rewritten on the device (discrete weights)
//
// Phase convention (CUTLASS's): a consumer waits on `full` with the phase bit of its pass;
// a producer waits on `empty` with the inverted bit, so its first pass over a fresh barrier
// does not block.
#pragma once

#include "fusegemm/common.cuh"

namespace fusegemm {

// CUtensorMapDataType of the map that loads elements of T: the host encodes the map, so each
// kernel exports it (kTmaDtypeA/B, fusegemm/base/contract.py) and the host compares it with its
// dtype table's `tma` column (fusegemm/base/dtypes.py); FP8/FP4 and scale bytes travel as UINT8.
template <class T> struct TmaDtype;
template <> struct TmaDtype<uint8_t> { static constexpr int value = 0; };                // UINT8
template <> struct TmaDtype<fusegemm::half_t> { static constexpr int value = 6; };        // FLOAT16
template <> struct TmaDtype<float> { static constexpr int value = 7; };                  // FLOAT32
template <> struct TmaDtype<fusegemm::bfloat16_t> { static constexpr int value = 9; };    // BFLOAT16

// L2 cache hints for TMA loads (the 64-bit policies CUTLASS's CacheHintSm90 names).
enum class CacheHint : uint64_t {
  kNormal = 0x1000000000000000ull,
  kEvictFirst = 0x12F0000000000000ull,
  kEvictLast = 0x14F0000000000000ull,
};

FUSEGEMM_DEVICE uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

FUSEGEMM_DEVICE bool elect_one() {
  uint32_t pred = 0;
  asm volatile(
      "{\n .reg .b32 r;\n .reg .pred p;\n"
      " elect.sync r|p, 0xffffffff;\n"
      " selp.b32 %0, 1, 0, p;\n}\n"
      : "=r"(pred));
  return pred != 0;
}

// ---------------------------------------------------------------------------------------
// mbarrier
// ---------------------------------------------------------------------------------------
FUSEGEMM_DEVICE void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count));
}

// Inits are generic-proxy writes; TMA completes transactions through the async proxy and
// peers in a cluster may arrive remotely, hence the cluster-scope release fence.
FUSEGEMM_DEVICE void mbar_fence_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

FUSEGEMM_DEVICE void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
}

FUSEGEMM_DEVICE void mbar_arrive_cluster(uint64_t* bar, uint32_t cta) {
  asm volatile(
      "{\n .reg .b32 remote;\n"
      " mapa.shared::cluster.u32 remote, %0, %1;\n"
      " mbarrier.arrive.release.cluster.shared::cluster.b64 _, [remote];\n}\n"
      ::"r"(smem_u32(bar)), "r"(cta) : "memory");
}

// Arrive on CTA `cta`'s barrier at the same offset with the default .release.cta semantics, as
// CUTLASS ClusterBarrier::arrive(cta_id) (BAR:466) and umma_arrive_2x1SM_sm0, for arrivals that
// publish nothing: the sm_100a follower's tmem_empty arrivals (tcgen05.wait::ld +
// tcgen05.fence::before_thread_sync carry the ordering that matters) and the sm_90a consumers'
// stage releases (their WGMMAs have completed their smem reads). The .release.cluster of
// mbar_arrive_cluster costs a MEMBAR.ALL.GPU per arrival, which waits for the warp's outstanding
// global stores (H200, BF16 grouped GEMM in 2x1 clusters, one release per consumer warp and
// k-block: 2.21 ms against 1.23 ms without clusters).
FUSEGEMM_DEVICE void mbar_arrive_remote(uint64_t* bar, uint32_t cta) {
  asm volatile(
      "{\n .reg .b32 remote;\n"
      " mapa.shared::cluster.u32 remote, %0, %1;\n"
      " mbarrier.arrive.shared::cluster.b64 _, [remote];\n}\n"
      ::"r"(smem_u32(bar)), "r"(cta) : "memory");
}

FUSEGEMM_DEVICE void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
               ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}

// Whether the phase of `parity` has completed: try_wait may first suspend the thread a while
// (until the phase completes or a system time limit), test_wait answers at once.
#define FUSEGEMM_MBAR_POLL(OP)                                                                 \
  uint32_t done;                                                                               \
  asm volatile("{\n .reg .pred p;\n mbarrier." OP ".parity.shared::cta.b64 p, [%1], %2;\n"      \
               " selp.b32 %0, 1, 0, p;\n}\n"                                                     \
               : "=r"(done) : "r"(smem_u32(bar)), "r"(parity) : "memory");                       \
  return done != 0;
FUSEGEMM_DEVICE bool mbar_try_wait(uint64_t* bar, uint32_t parity) { FUSEGEMM_MBAR_POLL("try_wait") }
FUSEGEMM_DEVICE bool mbar_test_wait(uint64_t* bar, uint32_t parity) { FUSEGEMM_MBAR_POLL("test_wait") }
#undef FUSEGEMM_MBAR_POLL

// Diagnosis of a hung kernel (FUSEGEMM_WAIT_TIMEOUT_NS, off unless defined; the host's
// FUSEGEMM_WAIT_TIMEOUT seconds define it): a wait that has not completed after this many
// nanoseconds prints the block, thread, barrier (its shared-memory offset) and parity, then traps,
// so the launch fails instead of hanging the stream.
#ifdef FUSEGEMM_WAIT_TIMEOUT_NS
FUSEGEMM_DEVICE uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Between the probes of a wait that began at t0 (global_ns()).
FUSEGEMM_DEVICE void wait_watchdog(uint64_t t0, uint64_t* bar, uint32_t parity) {
  if (global_ns() - t0 > uint64_t(FUSEGEMM_WAIT_TIMEOUT_NS)) {
    printf("fusegemm: mbarrier wait timed out: block %d thread %d barrier smem+%u parity %u\n", int(blockIdx.x),
           int(threadIdx.x), smem_u32(bar), parity);
    __trap();
  }
}
#endif

// try_wait suspends in hardware for a bounded time, so this loop does not hammer smem.
FUSEGEMM_DEVICE void mbar_wait(uint64_t* bar, uint32_t parity) {
#ifdef FUSEGEMM_WAIT_TIMEOUT_NS
  const uint64_t t0 = global_ns();
  while (!mbar_try_wait(bar, parity)) wait_watchdog(t0, bar, parity);
#else
  uint32_t addr = smem_u32(bar);
  asm volatile(
      "{\n .reg .pred p;\n"
      "WAIT_%=:\n"
      " mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      " @!p bra WAIT_%=;\n}\n"
      ::"r"(addr), "r"(parity) : "memory");
#endif
}

// ---------------------------------------------------------------------------------------
// TMA loads (global -> shared), completion counted in bytes on an mbarrier.
// Coordinates are in elements, innermost first, exactly as the tensor map's dimensions.
// Out-of-bounds box elements are filled (zero for our maps) and still count as bytes.
// ---------------------------------------------------------------------------------------
FUSEGEMM_DEVICE void tma_load_2d(const CUtensorMap* desc, uint64_t* bar, void* smem, int c0,
                                 int c1, CacheHint hint = CacheHint::kNormal) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%3, %4}], [%2], %5;"
      ::"r"(smem_u32(smem)), "l"(desc), "r"(smem_u32(bar)), "r"(c0), "r"(c1),
        "l"(static_cast<uint64_t>(hint))
      : "memory");
}

FUSEGEMM_DEVICE void tma_load_3d(const CUtensorMap* desc, uint64_t* bar, void* smem, int c0,
                                 int c1, int c2, CacheHint hint = CacheHint::kNormal) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%3, %4, %5}], [%2], %6;"
      ::"r"(smem_u32(smem)), "l"(desc), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "r"(c2),
        "l"(static_cast<uint64_t>(hint))
      : "memory");
}

FUSEGEMM_DEVICE void tma_load_4d(const CUtensorMap* desc, uint64_t* bar, void* smem, int c0,
                                 int c1, int c2, int c3, CacheHint hint = CacheHint::kNormal) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%3, %4, %5, %6}], [%2], %7;"
      ::"r"(smem_u32(smem)), "l"(desc), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "r"(c2), "r"(c3),
        "l"(static_cast<uint64_t>(hint))
      : "memory");
}

// Multicast: the same box lands at the same smem offset in every CTA of `cta_mask`, and
// each destination CTA's barrier (same offset) receives the transaction bytes.
FUSEGEMM_DEVICE void tma_load_2d_multicast(const CUtensorMap* desc, uint64_t* bar, void* smem,
                                           int c0, int c1, uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {%3, %4}], [%2], %5;"
      ::"r"(smem_u32(smem)), "l"(desc), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "h"(cta_mask)
      : "memory");
}

FUSEGEMM_DEVICE void tma_load_3d_multicast(const CUtensorMap* desc, uint64_t* bar, void* smem,
                                           int c0, int c1, int c2, uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {%3, %4, %5}], [%2], %6;"
      ::"r"(smem_u32(smem)), "l"(desc), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "r"(c2),
        "h"(cta_mask)
      : "memory");
}

// ---------------------------------------------------------------------------------------
// TMA stores (shared -> global), tracked by bulk async-groups of the issuing thread.
// ---------------------------------------------------------------------------------------
FUSEGEMM_DEVICE void tma_store_2d(const CUtensorMap* desc, const void* smem, int c0, int c1) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];"
               ::"l"(desc), "r"(smem_u32(smem)), "r"(c0), "r"(c1) : "memory");
}

// The same with an L2 policy (CacheHint): kEvictFirst for rows read back long after.
FUSEGEMM_DEVICE void tma_store_2d(const CUtensorMap* desc, const void* smem, int c0, int c1, CacheHint hint) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group.L2::cache_hint [%0, {%2, %3}], [%1], %4;"
               ::"l"(desc), "r"(smem_u32(smem)), "r"(c0), "r"(c1), "l"(static_cast<uint64_t>(hint)) : "memory");
}

FUSEGEMM_DEVICE void tma_store_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }

// Wait until at most N committed store groups still *read* shared memory (the buffer may
// then be overwritten; global visibility is not implied).
template <int N>
FUSEGEMM_DEVICE void tma_store_wait() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory");
}

// Wait until every committed store group of this thread has completed (its writes performed).
FUSEGEMM_DEVICE void tma_store_drain() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }

// Generic-proxy smem writes (st.shared, stmatrix) that TMA or the tensor cores read next.
FUSEGEMM_DEVICE void fence_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

FUSEGEMM_DEVICE void prefetch_tmap(const CUtensorMap* desc) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(desc) : "memory");
}

FUSEGEMM_DEVICE void named_barrier_sync(uint32_t id, uint32_t threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

FUSEGEMM_DEVICE void named_barrier_arrive(uint32_t id, uint32_t threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// ---------------------------------------------------------------------------------------
// Device-side tensor-map update (discrete per-expert weights).
//
// The host encodes one template map (shape, strides, box, swizzle) with a placeholder
// address; on the device one thread swaps in the expert's base address. The map the TMA
// unit reads must live in global memory, so each CTA owns kSlots 128-byte slots in a
// per-call workspace and rotates through them. Protocol (DeepGEMM sm90 1d1d, CUTLASS
// copy_sm90_desc.hpp): replace the address in a shared-memory copy, store the 128 bytes
// to the global slot with generic stores, `fence.proxy.tensormap::generic.release`, then
// `fence.proxy.tensormap::generic.acquire` on the slot before the first TMA that uses it.
//
// Reuse safety is the caller's: a slot may be rewritten only once every TMA issued with
// its previous contents has completed. A producer that rewrites only right after waiting
// on the `empty` barrier of the load it is about to issue, with kSlots >= pipeline stages,
// satisfies this (all loads at least kStages back have been consumed, hence completed).
// ---------------------------------------------------------------------------------------
template <int kSlots>
struct DeviceTmap {
  CUtensorMap* slots;      // this CTA's kSlots global slots (128-byte aligned)
  CUtensorMap* staging;    // 128-byte aligned shared-memory copy of the template
  int next = 0;

  // Single thread. `tmpl` is the host-encoded template (e.g. a __grid_constant__ field).
  FUSEGEMM_DEVICE void init(const CUtensorMap* tmpl, CUtensorMap* workspace_for_cta,
                            CUtensorMap* smem_staging) {
    slots = workspace_for_cta;
    staging = smem_staging;
    const uint4* src = reinterpret_cast<const uint4*>(tmpl);
    uint4* dst = reinterpret_cast<uint4*>(staging);
#pragma unroll
    for (int i = 0; i < 8; ++i) dst[i] = src[i];
  }

  // Single thread. Returns the global map to pass to tma_load_* for `base`.
  FUSEGEMM_DEVICE const CUtensorMap* update(const void* base) {
    CUtensorMap* slot = slots + next;
    next = next + 1 == kSlots ? 0 : next + 1;
    asm volatile("tensormap.replace.tile.global_address.shared::cta.b1024.b64 [%0], %1;"
                 ::"r"(smem_u32(staging)), "l"(reinterpret_cast<uint64_t>(base)) : "memory");
    const uint4* src = reinterpret_cast<const uint4*>(staging);
    uint4* dst = reinterpret_cast<uint4*>(slot);
    // Not unrolled: the producer runs with few registers (setmaxnreg), and 8 hoisted
    // 16-byte loads would spill.
#pragma unroll 1
    for (int i = 0; i < 8; ++i) dst[i] = src[i];
    asm volatile("fence.proxy.tensormap::generic.release.gpu;" ::: "memory");
    asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;" ::"l"(slot) : "memory");
    return slot;
  }
};

}  // namespace fusegemm
