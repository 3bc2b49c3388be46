"""A compiled grouped-GEMM kernel ready to launch: what every grouped op shares below its
argument checks.

``LoadedKernel.build(variant, device, ...)`` compiles (or fetches) the registry's kernel of a
variant, checks the kernel's exported contract against the launch, runs the first-run gate of
an unexecuted arch and loads the module. Per call it encodes the A/B tensor maps from the
contract's boxes, sizes the persistent grid, allocates the per-call scratch the contract asks
for and launches one packed parameter struct.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from ..base.dtypes import DTYPES
from ..generator.params import GROUPED_PARAMS
from ..runtime import config
from ..runtime.tensormap import TensorMapCache
from .device import alloc, num_sms, record_stream
from .prepared import check_contract, persistent_grid, tma_dtype_name


@dataclass(frozen=True)
class GroupedShape:
    """Everything the maps, grid and scalars need from validated arguments but addresses."""

    m: int          # rows of A (>= valid_m)
    n: int          # GEMM N (accumulator columns)
    k: int
    l: int          # experts
    a_ld: int       # A row stride (elements)
    b_sn: int       # dense B: row pitch (N stride when K-major, K stride when N-major) and
    b_sl: int       # expert stride (elements)
    discrete: bool
    b_mn: bool = False   # N-major B (b_major "n"): maps of (N, K[, L])
    a_rows: int = -1     # rows of A's map: its tokens for gathered A (a_index); -1: m


class LoadedKernel:
    """One loaded kernel of a grouped variant and its launch machinery (thread-safe launches)."""

    def __init__(self, variant: Any, built: Any, kernel: Any, device: int) -> None:
        self.variant, self.built, self.kernel, self.device = variant, built, kernel, device
        self.contract = built.contract
        self.tile = (variant.tile_m, variant.tile_n)
        self.cluster = (variant.cluster_m, variant.cluster_n)
        self.dynamic = variant.scheduler == "dynamic"
        # Stream-K (fusegemm/stream_k.cuh): a grid of every SM the split can feed, per-CTA
        # partial tiles and zeroed flags per call.
        self.stream_k = variant.scheduler == "streamk"
        self.sms = num_sms(device)
        ctas = self.cluster[0] * self.cluster[1]
        if ctas > 1:
            # A persistent grid is one wave: at most the clusters the device runs at once.
            from ..runtime.launch import max_active_clusters
            self.sms = min(self.sms, ctas * max_active_clusters(kernel, built.contract.threads, ctas))
        self.tma_dtype = tma_dtype_name(self.contract.tma_dtype_a)
        self.itemsize = DTYPES[variant.ab_dtype].itemsize
        self.tmaps = TensorMapCache()
        self._cfgs: dict[int, Any] = {}
        self._local = threading.local()

    @classmethod
    def build(cls, variant: Any, device: int) -> "LoadedKernel":
        """Compile or fetch, check the contract, pass the first-run gate, load."""
        from ..base.hooks import FIRST_LAUNCH
        from ..pipeline import get_kernel
        from ..runtime.load import default_modules
        built = get_kernel(variant)
        c = built.contract
        check_contract(c, kernel=built.name, tile=(variant.tile_m, variant.tile_n), ab_dtype=variant.ab_dtype,
                       cluster=(variant.cluster_m, variant.cluster_n),
                       discrete=variant.weight_mode == "discrete")
        # The first-run gate (fusegemm/verify.py, installed from above: it runs the verification
        # cases, which call these ops) refuses a kernel fusegemm has not executed until its
        # configuration class passed.
        FIRST_LAUNCH(variant, device, c.ctas_per_tile)
        kernel = default_modules().get(built.cubin, built.kernel_name, key=built.key, smem_bytes=c.smem_bytes,
                                       device=device, max_cluster_ctas=c.max_cluster_ctas)
        return cls(variant, built, kernel, device)

    def grid(self, s: GroupedShape) -> int:
        grid = persistent_grid(s.m, s.n, self.tile, self.contract.ctas_per_tile, self.cluster, self.sms)
        if self.stream_k:
            # Up to one CTA per min_k_blocks of the allocation's k-blocks (the contract's tile_k
            # each; a problem of few tiles splits each over several CTAs); the kernel plans the
            # split from the device's offsets.
            k_blocks = -(-s.k // self.contract.tile_k) * (s.m // self.tile[0]) * -(-s.n // self.tile[1])
            grid = min(self.sms, max(grid, k_blocks // config.stream_k_min_k_blocks()))
        return grid

    def maps(self, s: GroupedShape, a_ptr: int, b_ptr: int) -> dict[str, bytes]:
        """The A and B tensor maps (boxes, swizzles and element type from the contract)."""
        c, tiled, item, dt = self.contract, self.tmaps.tiled, self.itemsize, self.tma_dtype
        box_a, box_b = (c.box_a_inner, c.box_a_outer), (c.box_b_inner, c.box_b_outer)
        a_map = tiled(a_ptr, dt, (s.k, s.a_rows if s.a_rows >= 0 else s.m), (s.a_ld * item,), box_a, c.swizzle_a)
        inner, outer = (s.n, s.k) if s.b_mn else (s.k, s.n)   # B's contiguous extent first
        if s.discrete:
            # Template of the device-side per-expert maps: any valid aligned address will do
            # (the kernel swaps in each expert's base before use); A's base is one.
            b_map = tiled(a_ptr, dt, (inner, outer), (inner * item,), box_b, c.swizzle_b)
        else:
            b_map = tiled(b_ptr, dt, (inner, outer, s.l), (s.b_sn * item, s.b_sl * item), box_b + (1,), c.swizzle_b)
        return {"tma_a": a_map, "tma_b": b_map}

    def scalars(self, s: GroupedShape) -> dict[str, int]:
        return {"m_rows": s.m, "n": s.n, "k": s.k, "num_experts": s.l,
                "cluster_m": self.cluster[0], "cluster_n": self.cluster[1],
                "sk_min_k_blocks": config.stream_k_min_k_blocks() if self.stream_k else 0}

    def needs_scratch(self, discrete: bool) -> bool:
        """Whether a launch takes per-call scratch (:meth:`workspace`)."""
        return self.dynamic or self.stream_k or discrete

    def workspace(self, grid: int, discrete: bool, stream: int, foreign_stream: bool) -> dict[str, int]:
        """Per-call scratch: a zeroed tile counter (dynamic scheduling), the per-CTA tensor-map
        slots the contract asks for (discrete weights), and stream-K's zeroed per-CTA flags and
        per-CTA FP32 partial tiles (a tile's accumulators: TILE_M x TILE_N floats, each written
        before it is read). Allocated from torch's stream-ordered allocator for this call, so
        graph replays and concurrent calls never share it."""
        if not self.needs_scratch(discrete):
            return {}
        from ..runtime.load import memset32
        slots = grid * self.contract.tmap_slot_stride if discrete else 0
        flags = -(-4 * grid // 128) * 128 if self.stream_k else 0
        partials = grid * self.tile[0] * self.tile[1] * 4 if self.stream_k else 0
        ws = alloc((128 + 128 * slots + flags + partials,), "uint8", self.device)
        if foreign_stream:
            record_stream(ws, stream)
        base = ws.data_ptr()
        out: dict[str, int] = {}
        if self.dynamic:
            memset32(base, 0, 1, stream)
            out["sched_counter"] = base
        if slots:
            out["tmap_workspace"] = base + 128
        if self.stream_k:
            out["sk_flags"] = base + 128 + 128 * slots
            out["sk_partials"] = out["sk_flags"] + flags
            memset32(out["sk_flags"], 0, grid, stream)
        self._local.ws = ws   # alive until the next call of this thread (the allocator is stream-ordered)
        return out

    def config(self, grid: int) -> Any:
        from ..runtime.launch import LaunchConfig
        cfg = self._cfgs.get(grid)
        if cfg is None:
            cfg = self._cfgs[grid] = LaunchConfig(
                grid=(grid, 1, 1), block=(self.contract.threads, 1, 1),
                cluster=(self.cluster[0] * self.cluster[1], 1, 1), smem_bytes=self.kernel.smem_bytes)
        return cfg

    def launch(self, values: dict[str, Any], grid: int, stream: int) -> None:
        """Pack ``values`` into this thread's argument buffer and launch (cuLaunchKernel copies
        the bytes before returning)."""
        from ..runtime.launch import ParamBuffer, launch
        buf = getattr(self._local, "buf", None)
        if buf is None:
            buf = self._local.buf = ParamBuffer(GROUPED_PARAMS.size)
        buf.fill(GROUPED_PARAMS.pack(values))
        launch(self.kernel, self.config(grid), buf, stream)
