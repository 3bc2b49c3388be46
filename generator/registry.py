"""What is implemented, written down once: one row per (kernel class, arch), one policy per arch.

A spec declares an op's surface (every combination of choices the seed API allows) and names
its kernel family (``kernel:``). Each family is one of four kernel classes, which fix the
operands a call passes (fusegemm/ops/engine.py):

============  ==============================================  ======================================
class         kernel                                          families
============  ==============================================  ======================================
``grouped``   BF16, M-grouped (one A row range per expert)    ``grouped_gemm``
``kgrouped``  BF16, K-grouped (weight gradients)              ``grouped_gemm_wgrad``
``scaled``    block-scaled, M-grouped                         ``grouped_gemm_srelu``, ``_quant``,
                                                              ``_dswiglu``
``batched``   block-scaled, batched                           ``gemm_amax``
``kscaled``   blockwise FP8, K-grouped (weight gradients)     ``grouped_gemm_wgrad_fp8``
============  ==============================================  ======================================

Families of one class differ only in their specs' epilogues, so a row
(:class:`~.implementation.Implementation`) says which kernel implements a class on an arch and
how much of it: template, header and C++ kernel, the epilogue rule it instantiates, the axes
that reach its own source, its limits and the values it runs as others. A variant's source axes
are the row's plus those its spec's epilogue reads (``Implementation.axes_for``): the
block-scaled sReLU's ``tanh_clamp_scale``, dSwiGLU's ``prob_dtype``, or no ``c_dtype`` for quant,
which has no C output. ``lookup(family, arch)`` returns the class row bound to the family, so
its messages name the family.

Beside each arch's rows, its :class:`~.implementation.ArchPolicy`: the tiles and clusters each
class prefers there, whether the roofline model chooses a call's configuration, how many CTAs
share a tile, and the arch the epilogue harness runs on.

The renderer, the ops, ``fusegemm build`` / ``list`` / ``show`` and ``selftest`` read these
tables and nothing else; the host contract of each kernel is exported by the kernel itself
(``fusegemm/base/contract.py``). Adding an arch is a row in ``fusegemm/base/archs.py``, rows and
a policy here, and its headers.
"""
from __future__ import annotations

import dataclasses
from functools import lru_cache
from typing import Any

from ..base.archs import ARCHS, arch as arch_entry
from ..base.errors import UnsupportedError
from .axes import LAUNCH_AXES, NEUTRAL
from .implementation import (CLASS_PROBLEMS, IMPLEMENTED, NONE, SPEC_RULE, ArchPolicy, Implementation, Limit,
                             RunsAs)

__all__ = ["IMPLEMENTED", "NONE", "SPEC_RULE", "ArchPolicy", "Implementation", "Limit", "RunsAs", "ROWS",
           "POLICIES", "lookup", "policy", "kernel_class", "kernel_classes", "problem_of", "executed", "status",
           "families", "resolve"]

# The class of each kernel family (the names the seeds gave their ops; a spec's ``kernel:``).
# The first family of a class is the one a spec that names the class gets (kernel_classes).
_CLASS_OF = {
    "grouped_gemm": "grouped",
    "grouped_gemm_wgrad": "kgrouped",
    "gemm_amax": "batched",
    "grouped_gemm_srelu": "scaled",
    "grouped_gemm_quant": "scaled",
    "grouped_gemm_dswiglu": "scaled",
    "grouped_gemm_wgrad_fp8": "kscaled",
}


def _row(kernel_class: str, arch: str, template: str, header: str, kernel: str,
         source_axes: tuple[str, ...], *, rule: str | None = None, limits: tuple[Limit, ...] = (),
         executed: bool = True, runs_as: tuple[RunsAs, ...] = ()) -> Implementation:
    """A row whose header and C++ kernel live in ``arch``'s header folder (its namespace)."""
    folder = ARCHS[arch].headers
    return Implementation(kernel_class, arch, template, f"fusegemm/{folder}/{header}",
                          f"fusegemm::{folder}::{kernel}", rule, source_axes, tuple(limits), executed, runs_as)


def _policy(arch: str, *, defaults: dict[str, dict[str, Any]], heuristic: bool, pair_tile_m: int | None,
            harness_arch: str) -> ArchPolicy:
    return ArchPolicy(arch, tuple((k, tuple(sorted(d.items()))) for k, d in defaults.items()), heuristic,
                      pair_tile_m, harness_arch)


# vector_f32: packed FP32 epilogue arithmetic. The sm_100a kernels have it (FADD2 / FMUL2 /
# FFMA2 on pairs of accumulator columns, fusegemm/sm100/packed_f32.cuh: the source axis
# _VECTOR_F32 below); Hopper has no packed FP32 instructions, so the sm_90a kernels run the
# option with their scalar FP32 math, which gives the same bits (each packed lane is the scalar
# operation, correctly rounded): the variant is the vector_f32=false one, one kernel for both.
_VECTOR_F32 = ("vector_f32",)
_SM90_SCALAR_F32 = (RunsAs("vector_f32", True, False, "sm_90a has no packed FP32 instructions: scalar FP32 "
                           "math, the same results"),)

# The blockwise recipe with E8M0 (power-of-two) scales, DeepSeek-V3.1's UE8M0: each byte is a
# power of two that FP32 holds exactly, so the kernel with FP32 scales runs it; each call converts
# the scale tensors on the device first (fusegemm/ops/scaled_layouts.py). One kernel for both.
_SM90_BLOCKWISE_E8M0 = (RunsAs("sf_dtype", "float8_e8m0fnu", "float32", "every E8M0 scale is a power of two that "
                               "FP32 holds exactly: the FP32-scale kernel, the scales converted on the device "
                               "per call", when=(("sf_vec_size", 128),)),)

# Axes each template reads itself (tests/unit/test_registry.py renders every spec with each axis
# changed and checks that exactly these, and those its epilogue reads, change the source). The
# BF16 template stores C and D as the variant's c_dtype / d_dtype where the rule has no such
# output; bias_dtype and generate_c reach it through the rules that read them (grouped_gemm's).
_GROUPED_BF16 = ("ab_dtype", "c_dtype", "d_dtype", "weight_mode", "b_major", "a_gather", "d_scatter", "scheduler",
                 "tile_m", "tile_n")
_KGROUPED = ("ab_dtype", "c_dtype", "d_dtype", "tile_m", "tile_n")
_KGROUPED_BF16 = _KGROUPED + ("a_gather", "b_gather")   # token rows read through an index (both archs)
# The block-scaled template takes its C and D types from the rule: c_dtype and d_dtype reach it
# where the family's epilogue reads them (gemm_amax's C, sReLU's and dSwiGLU's; quant has no C).
_BLOCKSCALED = ("ab_dtype", "sf_dtype", "sf_vec_size", "a_major", "b_major", "cd_major",
                "scheduler", "weight_mode", "tile_m", "tile_n", "discrete_col_sfd", "a_gather")

# The tile and cluster the BF16 kernels prefer where a policy lists them: tile 128x256, no cluster.
_BF16_DEFAULTS = {"tile_m": 128, "tile_n": 256, "cluster_m": 1, "cluster_n": 1}

# Gathered operands are the BF16 kernels' modes: gathered A (a_index) of the M-grouped and K-grouped
# classes, gathered X (b_gather) of the K-grouped class (sm_100a: through TMA gather4, not yet run);
# and gathered FP8 A of the block-scaled grouped class (sm_90a: the blockwise recipe's kernel; sm_100a:
# MXFP8, below). The others read whole rows.
_NO_GATHER = Limit("a_gather", (False,), "gathered A (a_index) is the BF16 grouped and K-grouped families' "
                                         "operand mode, and the block-scaled grouped family's (FP8)")
_NO_GATHER_B = Limit("b_gather", (False,), "gathered B (b_index) is the BF16 K-grouped family's operand mode "
                                           "(token rows of X)")
# Scattered outputs (d_scatter: problem row r's C and D rows stored at row d_index[r]) are the
# BF16 M-grouped kernels' output mode (sm_90a: the fragment path's per-warp row stores; sm_100a:
# the epilogue engine's row stores).
_NO_SCATTER = Limit("d_scatter", (False,), "scattered outputs (d_index) are the BF16 grouped family's "
                                           "output mode")

# The stream-K remainder (scheduler "streamk": the last wave's tiles split along K over every CTA,
# fusegemm/stream_k.cuh) is the sm_90a BF16 M-grouped kernel's; the other kernels walk whole tiles.
_NO_STREAM_K = Limit("scheduler", ("static", "dynamic"), "the stream-K remainder (scheduler streamk) is the sm_90a "
                                                         "BF16 grouped kernel's")


def _no_clusters(because: str, when: tuple = ()) -> tuple[Limit, Limit]:
    """cluster_m and cluster_n 1 (where ``when`` holds), both for ``because``."""
    return (Limit("cluster_m", (1,), because, when=when), Limit("cluster_n", (1,), because, when=when))


# What both archs' K-grouped kernels (weight gradients, Config::kKGrouped) leave out.
_KGROUPED_LIMITS = (
    Limit("weight_mode", ("dense",), "both operands are activations (dense, token-major)"),
    Limit("scheduler", ("static",), "static persistent scheduling only"),
    *_no_clusters("K-grouped tiles have one K range per expert: clusters are 1x1"),
)


# ---- sm_100a: tcgen05 / UMMA / TMEM kernels, compiled and statically checked only ----
SM100_POLICY = _policy(
    "sm_100a",
    # (the FP8 weight gradient's kernel here reads MXFP8 scales: its default recipe on this arch)
    defaults={"kgrouped": _BF16_DEFAULTS,
              "kscaled": {**_BF16_DEFAULTS, "sf_dtype": "float8_e8m0fnu", "sf_vec_size": 32}},
    # No Blackwell GPU is available to time configurations: the roofline model chooses them.
    heuristic=True,
    pair_tile_m=256,        # 256-row tiles are CTA pairs (cta_group::2)
    # The harness runs the rule with the block engine these kernels use, on an H200.
    harness_arch="sm_90a")

# The blockwise recipe (FP32 scales, A 1x128, B 128x128; issue 31) has an sm_90a kernel
# (sm90/blockwise_promote.cuh). The sm_100a kernels read MX scale atoms (tcgen05 block-scaled MMA):
# they run the recipe's E8M0 scales (_SM100_BLOCKWISE_E8M0 below); FP32 block scales need a
# promoting mainloop there, which is not written yet.
_SM100_MX_SCALES = (
    Limit("sf_vec_size", (16, 32), "the sm_100a kernels take MX scales (per 16 or 32 K); the blockwise recipe "
                                   "(FP32 scales per 128 K) runs on sm_90a"),
    Limit("sf_dtype", ("float8_e8m0fnu", "float8_e4m3fn"), "the sm_100a kernels take MX scales (E8M0 or e4m3); "
                                                           "FP32 blockwise scales run on sm_90a"),
)

# 1x128 output scales (quantize.vec 128, FP32 per 128 columns: the blockwise recipe's output) are
# quantized on the sm_90a kernels' fragment path (BF16 grouped and blockwise), which holds a
# 256-column tile's rows at once; the block engine (sm_100a, and sm_90a rules it runs) quantizes
# 32-column blocks.
_SFD_MX_ONLY = Limit("sfd_vec_size", (32,), "1x128 output scales (FP32 per 128 columns) are quantized by the "
                                             "sm_90a kernels' fragment epilogue (the BF16 grouped and the blockwise "
                                             "kernel); this kernel writes MX scales (E8M0 per 32 columns)")
# The BF16 sm_90a kernel holds a 64 x tile-N fragment per warpgroup: a 128-column group of a paired
# accumulator's D is the whole 256-column tile.
_SM90_SFD_1X128_TILE = Limit("tile_n", (256,), "1x128 output scales: a 128-column group of a gate/up paired "
                                               "accumulator's D spans the 256-column tile",
                             when=(("sfd_vec_size", 128),))

# The blockwise recipe with E8M0 (power-of-two) scales on sm_100a: a power of two scales every
# element of its 128-element block alike, so each 1x128 / 128x128 scale repeated over its 32-K MX
# blocks (and B's 128 rows) gives the MXFP8 kernel (tcgen05 kind::mxf8f6f4) the recipe's products
# exactly; each call expands the scale tensors on the device first (fusegemm/ops/scaled_layouts.py
# mx_scale_operands). The grouped class only (gemm_amax does not offer the recipe's E8M0 scales).
_SM100_BLOCKWISE_E8M0 = (RunsAs("sf_vec_size", 128, 32, "power-of-two scales repeated over their 32-K MX blocks "
                                "(and B's 128 rows) are exactly the recipe's: the MXFP8 kernel, the scales "
                                "expanded on the device per call", when=(("sf_dtype", "float8_e8m0fnu"),)),)

# Gathered A on sm_100a (fusegemm/sm100/grouped_gemm.cuh): TMA gather4, four rows per producer
# lane into the CTA's own stage (each CTA of a 2-CTA tile its own rows): no cluster beyond the
# tile's CTAs, as the rows are not multicast.
_SM100_GATHER = (
    *(Limit("cluster_m", (ctas,), "gathered A loads rows per CTA, not multicast: no cluster beyond the tile's "
                                  f"CTAs ({ctas})", when=(("a_gather", True), ("tile_m", tile_m)))
      for tile_m, ctas in ((64, 1), (128, 1), (256, 2))),
    Limit("cluster_n", (1,), "gathered A loads rows per CTA, not multicast: no clusters", when=(("a_gather", True),)),
)

# Gathered A of the block-scaled grouped kernel (fusegemm/sm100/blockscaled_gemm.cuh): each
# producer lane's gather4 of four FP8 token rows and a 4-byte cp.async of each row's scale word,
# published on the CTA's own full barrier.
_SM100_SCALED_GATHER = (
    Limit("ab_dtype", ("float8_e4m3fn", "float8_e5m2"), "gathered A on sm_100a: FP8 token rows (a row's scales of "
          "a 128-K block are one word); packed FP4 rows are loaded whole", when=(("a_gather", True),)),
    Limit("tile_m", (64, 128), "gathered A: each CTA's producer lanes copy their rows' scales and publish them on "
          "its own full barrier; a 2-CTA tile's peer would publish on its leader's (a cluster-scope arrival, not "
          "written)", when=(("a_gather", True),)),
    Limit("a_major", ("k",), "gathered A reads K-major token rows", when=(("a_gather", True),)),
    *_SM100_GATHER,   # (its clusters: none for the 1-CTA tiles above)
)

# Gathered A stored as well (a_gather_store: output a_rows, the gathered rows in problem order):
# the sm_90a kernel's copying producer warps store their shares of each A stage of a tile's first
# N block through tma_a with a TMA store (fusegemm/sm90/grouped_gemm.cuh kStoreA), so that a weight
# gradient reads the rows without a permutation kernel. The sm_100a kernel's gather4 stages are not
# stored yet.
_SM100_NO_GATHER_STORE = Limit("a_gather_store", (False,), "storing the gathered A rows (a_rows) is the sm_90a "
                                                           "kernel's; sm_100a gathers A without storing it")

_SM100_ROWS = (
    _row("grouped", "sm_100a", "grouped_gemm.cu.j2", "grouped_gemm.cuh",
         "GroupedGemmKernel", _GROUPED_BF16 + _VECTOR_F32,
         rule=SPEC_RULE,
         limits=(*_SM100_GATHER, _NO_GATHER_B, _SFD_MX_ONLY, _NO_STREAM_K, _SM100_NO_GATHER_STORE)),
    # The tcgen05 kernel with per-tile K ranges (Config::kKGrouped): no Blackwell GPU has run it
    # (executed=False: its first launch runs the family's selftest cases on the device,
    # fusegemm/verify.py).
    _row("kgrouped", "sm_100a", "grouped_gemm.cu.j2", "grouped_gemm.cuh",
         "GroupedGemmKernel", tuple(a for a in _KGROUPED_BF16 if a != "tile_m") + ("cd_major",) + _VECTOR_F32,
         rule=SPEC_RULE,
         limits=(Limit("tile_m", (128,), "1-CTA tiles of 128 rows (two 64-row M-major A atoms)"),
                 *_KGROUPED_LIMITS, _NO_SCATTER, _SFD_MX_ONLY),
         executed=False),
    # MXFP8 weight gradients (Config::kKGrouped of the block-scaled kernel): dY^T and X^T
    # token-contiguous with E8M0 scales per 32 tokens; the blockwise recipe's FP32 scales are sm_90a's.
    _row("kscaled", "sm_100a", "blockscaled_gemm.cu.j2", "blockscaled_gemm.cuh",
         "BlockScaledGemmKernel", ("ab_dtype", "sf_dtype", "sf_vec_size", "a_major", "b_major", "cd_major",
                                   "discrete_col_sfd", "tile_n") + _VECTOR_F32, rule=SPEC_RULE,
         limits=(*_SM100_MX_SCALES, Limit("tile_m", (128,), "1-CTA tiles of 128 rows"), *_KGROUPED_LIMITS,
                 Limit("a_major", ("k",), "dY^T is token-contiguous (K-major)"),
                 Limit("b_major", ("k",), "X^T is token-contiguous (K-major)"), _NO_GATHER, _NO_GATHER_B,
                 _NO_SCATTER, _SFD_MX_ONLY),
         runs_as=(RunsAs("sf_vec_size", 128, 32, "power-of-two 1x128 scales repeated over their four 32-token MX "
                         "blocks are exactly the recipe's: the MXFP8 kernel, both scale tensors expanded on the "
                         "device per call", when=(("sf_dtype", "float8_e8m0fnu"),)),),
         executed=False),
    *(_row(kind, "sm_100a", "blockscaled_gemm.cu.j2", "blockscaled_gemm.cuh",
           "BlockScaledGemmKernel", _BLOCKSCALED + _VECTOR_F32, rule=SPEC_RULE,
           limits=(*_SM100_MX_SCALES, *(_SM100_SCALED_GATHER if kind == "scaled" else (_NO_GATHER,)), _NO_GATHER_B,
                   _NO_SCATTER, _SFD_MX_ONLY, _NO_STREAM_K),
           runs_as=_SM100_BLOCKWISE_E8M0 if kind == "scaled" else ())
      for kind in ("scaled", "batched")),
)


# ---- sm_90a: WGMMA kernels, executed on an H200 ----
SM90_POLICY = _policy(
    "sm_90a",
    # The block-scaled kernel's one tile M, without a cluster; its tile N is the spec's.
    defaults={"grouped": _BF16_DEFAULTS, "kgrouped": _BF16_DEFAULTS,
              **dict.fromkeys(("scaled", "batched"), {"tile_m": 128, "cluster_m": 1, "cluster_n": 1})},
    # The H200 times configurations (fusegemm tune); untuned calls keep the measured defaults.
    heuristic=False,
    pair_tile_m=None,
    harness_arch="sm_90a")

# Clusters (TMA multicast of B along cluster M, A along N; fusegemm/cluster.cuh) of the
# M-grouped BF16 kernel: up to 2x2 (its multi-CTA build exports 4 CTAs), static scheduling only
# (a cluster walks its blocks in lockstep; the dynamic claim is per CTA). On the H200 they ran
# no faster than 1x1 on the MoE shapes (bench/results/grouped_gemm_clusters_h200.json), so 1x1
# stays the default and its kernel has no cluster machinery (the cluster reaches the source).
_SM90_CLUSTERS = (
    Limit("cluster_m", (1, 2), "clusters up to 2x2 on sm_90a"),
    Limit("cluster_n", (1, 2), "clusters up to 2x2 on sm_90a"),
    *_no_clusters("the dynamic scheduler claims tiles per CTA; clusters walk statically",
                  when=(("scheduler", "dynamic"),)),
)

# Stream-K (fusegemm/stream_k.cuh): each CTA walks its own pieces of the last wave; a cluster's
# CTAs walk blocks of tiles in lockstep.
_SM90_STREAM_K = _no_clusters("stream-K splits a tile's k-blocks between CTAs: no clusters",
                              when=(("scheduler", "streamk"),))

# Gathered A (fusegemm/sm90/grouped_gemm.cuh): the producer warp loads A row by row; the cluster
# kernel's sliced multicast loads have no such path.
_SM90_GATHER = _no_clusters("gathered A loads rows per CTA: no clusters", when=(("a_gather", True),))

# Gathered A stored as well (a_gather_store, the op's a_rows): each copying warp stores its share
# of the stages it gathered; the static walk only.
_SM90_GATHER_STORE = Limit("scheduler", ("static",), "storing the gathered A rows (a_gather_store): each of the "
                           "copying warps stores the share it holds for the tile, in the static walk (the dynamic "
                           "claim has one copying warp; stream-K pieces hold part of a tile)",
                           when=(("a_gather_store", True),))

# The two consumer warpgroups of the BF16 kernel (fusegemm/sm90/grouped_gemm.cuh) and of the
# blockwise kernel (sm90/blockwise_promote.cuh): both on one 128-row tile (cooperative), or each on
# 64-row tiles of its own, in turn (ping-pong: one's epilogue overlaps the other's mainloop). 256
# would need 2-CTA instructions (sm_100a).
_SM90_TILE_M = Limit("tile_m", (64, 128), "two WGMMA consumer warpgroups: 128 cooperative (64 rows each), "
                                          "64 ping-pong (a 64-row tile each, in turn)")

# The block-scaled kernel (FP8 WGMMA with FP32 promotion per 32 K for MXFP8, per 128 K for the
# blockwise recipe) implements one value of a_major and b_major, so they cannot change its source;
# tile_m 128 everywhere but the blockwise recipe's M-grouped kernel (_SM90_BLOCKWISE_PINGPONG).
_SM90_BLOCKSCALED_LIMITS = (
    Limit("ab_dtype", ("float8_e4m3fn", "float8_e5m2"),
          "MXFP8 only: FP4 A/B need sm_100a (Hopper has no FP4 tensor cores, and MXFP8 itself, "
          "promoted into FP32 per 32 K, runs at a third to a half of BF16 speed on the H200)"),
    Limit("a_major", ("k",), "FP8 WGMMA reads K-major A only"),
    Limit("b_major", ("k",), "FP8 WGMMA reads K-major B only"),
    *_no_clusters("the block-scaled sm_90a kernel has no TMA multicast: clusters are 1x1"),
)
_SM90_TILE_M_128 = Limit("tile_m", (128,), "two 64-row WGMMA consumer warpgroups")
_SM90_BLOCKSCALED = tuple(a for a in _BLOCKSCALED if a not in ("a_major", "b_major"))
# Ping-pong on the blockwise kernel (fusegemm/sm90/blockwise_promote.cuh, tile_m 64): each consumer
# warpgroup runs whole 64 x 128 tiles of its own, the two in turn, so that one's epilogue overlaps
# the other's mainloop; its mainloop's two temporary accumulator sets leave no registers for a
# 256-column tile, and the gathering producers copy 128-row tiles.
_SM90_BLOCKWISE_PINGPONG = (
    _SM90_TILE_M,
    Limit("tile_m", (128,), "MXFP8 (promoted per 32 K): two 64-row WGMMA consumer warpgroups on one tile; "
                            "ping-pong tiles (tile_m 64) are the blockwise recipe's", when=(("sf_vec_size", 32),)),
    Limit("tile_n", (128,), "ping-pong (tile_m 64): a warpgroup's two temporary accumulator sets leave no "
                            "registers for 256 columns", when=(("tile_m", 64),)),
    Limit("a_gather", (False,), "ping-pong (tile_m 64): the gathering producer warps copy 128-row tiles",
          when=(("tile_m", 64),)),
)
# Gathered A on the blockwise kernel (fusegemm/sm90/blockwise_promote.cuh): the producer
# warpgroup's four warps copy A's token rows and their 1x128 scales with cp.async, as the BF16
# kernel's do; the MXFP8 kernel loads A by TMA only.
_SM90_BLOCKWISE_GATHER = (
    Limit("a_gather", (False,), "gathered A is the blockwise recipe's (sf_vec_size 128) on sm_90a: the MXFP8 "
                                "kernel loads A by TMA only (sm_100a gathers MXFP8)", when=(("sf_vec_size", 32),)),
    Limit("scheduler", ("static",), "gathered A: the copying warps walk the static tile order",
          when=(("a_gather", True),)),
)

_SM90_ROWS = (
    _row("grouped", "sm_90a", "grouped_gemm.cu.j2", "grouped_gemm.cuh",
         "GroupedGemmKernel", _GROUPED_BF16 + ("a_gather_store",) + LAUNCH_AXES, rule=SPEC_RULE,
         limits=(_SM90_TILE_M, *_SM90_CLUSTERS, *_SM90_STREAM_K, *_SM90_GATHER, _NO_GATHER_B, _SM90_SFD_1X128_TILE,
                 _SM90_GATHER_STORE),
         runs_as=_SM90_SCALAR_F32),
    # K-grouped weight gradients on the BF16 kernel (Config::kKGrouped): token-major operands,
    # one K range per expert.
    _row("kgrouped", "sm_90a", "grouped_gemm.cu.j2", "grouped_gemm.cuh",
         "GroupedGemmKernel", _KGROUPED_BF16 + ("cd_major",), rule=SPEC_RULE,
         limits=(_SM90_TILE_M, *_KGROUPED_LIMITS, _NO_SCATTER, _SFD_MX_ONLY), runs_as=_SM90_SCALAR_F32),
    # FP8 weight gradients with the blockwise recipe (Config::kKGrouped of the blockwise kernel):
    # dY^T and X^T token-contiguous, both scaled 1x128 along the tokens (sm_100a's row takes MXFP8
    # scales per 32 tokens: its MMA reads MX scale atoms). Run on the H200 (2026-12-03):
    # tests/gpu/test_wgrad_fp8_gpu.py (exact problems bit for bit, realistic ones within their
    # bounds; its first-run verification passed before), bench/wgrad.py, and the fp8_block MoE
    # step's weight gradients.
    _row("kscaled", "sm_90a", "blockscaled_gemm.cu.j2", "blockscaled_gemm.cuh",
         "BlockScaledGemmKernel", ("ab_dtype", "cd_major", "discrete_col_sfd", "tile_n"), rule=SPEC_RULE,
         limits=(*_SM90_BLOCKSCALED_LIMITS, _SM90_TILE_M_128, *_KGROUPED_LIMITS, _NO_GATHER, _NO_GATHER_B, _NO_SCATTER,
                 _SFD_MX_ONLY,
                 Limit("sf_vec_size", (128,), "the blockwise recipe (FP32 scales per 128 tokens): Hopper has no "
                                              "block-scaled MMA; MXFP8 weight gradients run on sm_100a"),
                 Limit("sf_dtype", ("float32",), "FP32 scales (the blockwise recipe); MXFP8's E8M0 scales per 32 "
                                                 "tokens run on sm_100a")),
         runs_as=_SM90_BLOCKWISE_E8M0),
    *(_row(kind, "sm_90a", "blockscaled_gemm.cu.j2", "blockscaled_gemm.cuh",
           "BlockScaledGemmKernel", _SM90_BLOCKSCALED, rule=SPEC_RULE,
           limits=(*_SM90_BLOCKSCALED_LIMITS,
                   *(_SM90_BLOCKWISE_GATHER + _SM90_BLOCKWISE_PINGPONG if kind == "scaled"
                     else (_NO_GATHER, _SM90_TILE_M_128)),
                   _NO_GATHER_B, _NO_SCATTER, _NO_STREAM_K,
                   Limit("sf_vec_size", (128,), "1x128 output scales are the blockwise recipe's (A and B scaled "
                                                "per 128 K); MXFP8 inputs give MX output scales (sfd_vec_size 32)",
                         when=(("sfd_vec_size", 128),))),
           runs_as=_SM90_SCALAR_F32 + _SM90_BLOCKWISE_E8M0)
      for kind in ("scaled", "batched")),
)


ROWS: tuple[Implementation, ...] = _SM100_ROWS + _SM90_ROWS
POLICIES: dict[str, ArchPolicy] = {p.arch: p for p in (SM100_POLICY, SM90_POLICY)}
_BY_CLASS: dict[tuple[str, str], Implementation] = {(r.kernel_class, r.arch): r for r in ROWS}


@lru_cache(maxsize=None)
def _bound(row: Implementation, family: str) -> Implementation:
    return dataclasses.replace(row, family=family)


def lookup(family: str, arch: str) -> Implementation | None:
    """The row of ``family``'s kernel class on ``arch``, bound to ``family``, or None (status
    ``none``, or no such family)."""
    row = _BY_CLASS.get((_CLASS_OF.get(family, ""), arch))
    return None if row is None else _bound(row, family)


def policy(arch: str) -> ArchPolicy:
    """``arch``'s policy; UnsupportedError naming the archs that have one."""
    try:
        return POLICIES[arch]
    except KeyError:
        raise UnsupportedError(f"arch: got {arch!r}; allowed: {', '.join(POLICIES)}", axis="arch") from None


def kernel_class(family: str) -> str:
    """``grouped``, ``kgrouped``, ``scaled`` or ``batched``: the class of ``family``'s kernel,
    which fixes the operands a call passes (fusegemm/ops/engine.py)."""
    try:
        return _CLASS_OF[family]
    except KeyError:
        raise UnsupportedError(f"kernel family {family!r} has no kernel; families: "
                               f"{', '.join(families())}") from None


def kernel_classes() -> dict[str, str]:
    """Kernel class -> the family a spec gets when it names the class (``kernel: scaled``): the
    first family of each class (``grouped_gemm``, ``grouped_gemm_wgrad``, ``gemm_amax``,
    ``grouped_gemm_srelu``, the family names the seeds gave them). A spec that names the class
    builds exactly what one naming that family builds."""
    out: dict[str, str] = {}
    for family in families():
        out.setdefault(_CLASS_OF[family], family)
    return out


def problem_of(family: str) -> str:
    """``grouped``, ``batched`` or ``kgrouped``: the problem ``family``'s kernels solve."""
    return CLASS_PROBLEMS[kernel_class(family)]


def executed(family: str, arch: str) -> bool:
    """Whether ``family``'s kernel has run on ``arch`` hardware in the project's own tests (the
    arch has, and the row is not marked otherwise)."""
    row = lookup(family, arch)
    return arch_entry(arch).executed and (row is None or row.executed)


# Modes (operand modes, schedulers) an executed row's kernel has but no GPU has run yet: a variant
# that selects one passes the first-run gate before its first launch, as an unexecuted arch's
# kernels do (its configuration class's cases in the watchdog child, fusegemm/verify.py; a failure
# names the reason below; FUSEGEMM_TRUST_UNVERIFIED=1 skips it), until tests/gpu has run it and the
# entry goes. (Gathered operands on sm_90a stood here, then refused outright, from their writing
# until tests/gpu/test_gather_gpu.py passed on the H200 on 2026-12-03; on sm_100a, whose rows are
# not executed, the gate verifies them: a gathered variant is a configuration class of its own,
# whose cases read A, dY or X through an index, fusegemm/selftest.py. The sm_90a stream-K scheduler
# stood here from its writing until tests/gpu/test_stream_k_gpu.py passed on the H200 on
# 2026-12-05. The blockwise kernel's ping-pong tiles, tile_m 64, stood here from their writing until
# tests/gpu/test_blockwise_pingpong_gpu.py passed on the H200, 26 cases, on 2026-12-05. The K-grouped
# kernel's M-major D, cd_major m, stood here from its writing on 2026-12-05 until
# tests/gpu/test_wgrad_gpu.py's M-major cases passed on an H100 (sm_90a) on 2026-12-06.)
UNEXECUTED_MODES: dict[tuple[str, str], tuple[tuple[str, Any, str], ...]] = {}


def unexecuted_mode(family: str, arch: str, choice: dict[str, Any]) -> str | None:
    """Why ``choice`` of ``family`` on ``arch`` selects an operand mode no GPU has run (None:
    nothing of the kind)."""
    for axis, value, why in UNEXECUTED_MODES.get((_CLASS_OF.get(family, family), arch), ()):
        if choice.get(axis, NEUTRAL.get(axis)) == value:
            return f"{axis}={value!r} on {arch}: {why}"
    return None


def check_rule(choice: dict[str, Any], resolved: Any, family: str) -> None:
    """What a variant of ``family`` asks of its epilogue rule (``choice``: its axes; ``resolved``:
    the spec's epilogue resolved for it, ``generator.epilogue.Resolved``); UnsupportedError naming
    the axis otherwise. Scattered outputs are stored row by row (sm_90a: from the fragment path;
    sm_100a: the engine's staged rows), for element-wise rules only (a paired, quantizing or
    reducing rule's stores go through blocks and scale factors laid out by problem row). A
    K-grouped M-major D (``cd_major`` m) is D stored column by column (sm_90a: from the fragment;
    sm_100a: the engine's rows): an element-wise rule whose one output is D, with no column or
    element input."""
    if choice.get("d_scatter") and not resolved.elementwise:
        raise UnsupportedError("d_scatter: got True; allowed for element-wise epilogues only (no gate/up pairing, "
                               "quantization or reduction; 16/32-bit outputs): their rows are stored whole, where "
                               "the kernel can redirect each one", axis="d_scatter")
    if choice.get("cd_major") == "m" and problem_of(family) == "kgrouped":
        outputs = [o.name for o in resolved.outputs]
        laid_out = [i.name for i in resolved.inputs if i.per in ("column", "element")]
        if not resolved.elementwise or outputs != ["d"] or laid_out:
            raise UnsupportedError(f"cd_major: got 'm' for an epilogue with outputs {outputs}"
                                   + (f" and column/element inputs {laid_out}" if laid_out else "")
                                   + ("" if resolved.elementwise else ", not element-wise")
                                   + "; allowed: an element-wise epilogue whose one output is d, with expert or "
                                     "scalar inputs only (the K-grouped kernels store an M-major D column by "
                                     "column; cd_major n stores any epilogue)", axis="cd_major")


def status(family: str, arch: str) -> str:
    """``implemented`` or ``none``."""
    row = lookup(family, arch)
    return row.status if row is not None else NONE


def families() -> tuple[str, ...]:
    """Every family whose kernel class has at least one row, in table order."""
    classes = {r.kernel_class for r in ROWS}
    return tuple(f for f, c in _CLASS_OF.items() if c in classes)


def resolve(family: str, arch: str, choice: dict[str, Any]) -> Implementation:
    """The row that builds ``choice`` of ``family`` on ``arch``; UnsupportedError saying why not."""
    if arch not in ARCHS:
        raise UnsupportedError(f"arch: got {arch!r}; allowed: {', '.join(ARCHS)}", axis="arch")
    row = lookup(family, arch)
    if row is None:
        raise UnsupportedError(f"{family} has no kernel for {arch} (status: none)")
    lim = refusal(row, choice)
    if lim is not None:
        raise UnsupportedError(row.problem(choice), axis=lim.axis)
    return row


def refusal(row: Implementation, choice: dict[str, Any], axes: tuple[str, ...] | None = None) -> Limit | None:
    """The first of ``row``'s limits (on ``axes``, default every axis) that refuses ``choice``, or None."""
    for lim in row.limits:
        if (axes is not None and lim.axis not in axes) or (lim.axis not in choice and lim.axis not in NEUTRAL):
            continue   # (as Implementation.problem: an axis not chosen, without a neutral value)
        if choice.get(lim.axis, NEUTRAL.get(lim.axis)) not in lim.values and lim.applies(choice):
            return lim
    return None
