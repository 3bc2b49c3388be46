"""The host<->device contract every kernel exports: one description, two renderings.

Each generated translation unit defines ``extern "C" __device__ const int <symbol>_contract[N]``
from the kernel's own constants (templates/contract.cu.j2 renders it from :data:`FIELDS`); the
runtime reads the array back out of the cubin (runtime/cubin_info.py) into a :class:`KernelContract`.
So the host never restates what a kernel decided: block size, shared memory, the smallest and
largest cluster, CTAs per tile, the K step, every TMA box, swizzle and element type, the
tensor-map workspace stride, TMEM columns. A field the kernel does not use is 0.

Adding a field: append it here and define the constant in every kernel class (a kernel that
lacks it fails to compile, naming the constant). The array length is checked when read, so a
cubin built against another field list is refused, never misread.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields


def _f(constant: str, doc: str):
    return field(metadata={"cpp": constant, "doc": doc})


@dataclass(frozen=True)
class KernelContract:
    """What a compiled kernel needs from its launcher, as the kernel states it.

    Each field's metadata names the kernel constant that defines it (``Kernel::<cpp>``).
    """

    threads: int = _f("kThreads", "threads per CTA")
    smem_bytes: int = _f("kSmemBytes", "dynamic shared memory per CTA")
    min_cluster_m: int = _f("kMinClusterM", "smallest launch cluster along M (a 2-CTA tile needs its pair)")
    min_cluster_n: int = _f("kMinClusterN", "smallest launch cluster along N")
    max_cluster_ctas: int = _f("kMaxClusterCtas", "largest launch cluster the protocol handles (1: none)")
    ctas_per_tile: int = _f("kCtasPerTile", "CTAs sharing one output tile (2: sm_100a cta_group::2)")
    tile_m: int = _f("kTileM", "output tile rows")
    tile_n: int = _f("kTileN", "output tile columns")
    tile_k: int = _f("kTileK", "K elements per pipeline stage")
    m_aligned: int = _f("kMAligned", "rows every padded_offsets value is a multiple of")
    box_a_inner: int = _f("kBoxAInner", "TMA box of A: innermost extent, in tma_dtype_a elements")
    box_a_outer: int = _f("kBoxAOuter", "TMA box of A: rows per load")
    box_b_inner: int = _f("kBoxBInner", "TMA box of B: innermost extent")
    box_b_outer: int = _f("kBoxBOuter", "TMA box of B: rows per load")
    swizzle_a: int = _f("kSwizzleA", "shared-memory swizzle span of A's boxes, bytes")
    swizzle_b: int = _f("kSwizzleB", "shared-memory swizzle span of B's boxes, bytes")
    tma_dtype_a: int = _f("kTmaDtypeA", "CUtensorMapDataType of A's map")
    tma_dtype_b: int = _f("kTmaDtypeB", "CUtensorMapDataType of B's map")
    tmap_slot_stride: int = _f("kTmapSlotStride", "128-byte tensor-map slots per CTA in tmap_workspace (0: none)")
    tmem_cols: int = _f("kTmemCols", "TMEM columns allocated per CTA (0: no TMEM)")
    sf_box_k: int = _f("kSfBoxK", "scale-factor maps: 512-byte SF atoms along K per box (0: no scales)")
    sf_box_nb: int = _f("kSfBoxNB", "SFB map: SF atoms along N per box (SFA: always 1)")


# (field, kernel constant) in export order.
FIELDS: tuple[tuple[str, str], ...] = tuple((f.name, f.metadata["cpp"]) for f in fields(KernelContract))

SYMBOL_SUFFIX = "_contract"


def from_ints(values: tuple[int, ...]) -> KernelContract:
    """The contract from the exported array (length already checked by the reader)."""
    return KernelContract(*values)
