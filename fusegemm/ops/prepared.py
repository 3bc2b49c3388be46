"""Launch preparation shared by the ops: the kernel's contract checked against the request, the
persistent grid, argument signatures for the host fast path, and the wrappers' compiled-op cache.
"""
from __future__ import annotations

import contextlib
import sys
import threading
from typing import Any, Callable, Hashable

from ..arguments import M_ALIGNED
from ..base.contract import KernelContract
from ..base.dtypes import DTYPES
from ..base.errors import ContractError
from ..runtime.tensormap import MAP_DTYPES


def tma_dtype_name(code: int) -> str:
    """The table dtype a kernel's exported CUtensorMapDataType code loads (bf16 -> "bfloat16";
    FP8/FP4 bytes -> "uint8")."""
    from cuda.bindings import driver
    for name in MAP_DTYPES:
        member = getattr(driver.CUtensorMapDataType, f"CU_TENSOR_MAP_DATA_TYPE_{DTYPES[name].tma}")
        if int(member) == code:
            return name
    raise ContractError(f"kernel contract tma_dtype: got {code}; allowed: the CUtensorMapDataType of "
                        f"one of {', '.join(MAP_DTYPES)}")


def check_contract(c: KernelContract, *, kernel: str, tile: tuple[int, int], ab_dtype: str,
                   cluster: tuple[int, int], discrete: bool) -> None:
    """Raise ContractError where the kernel's exported contract and what the host will launch
    disagree: the tile, the 256-row padding, the element type of A/B maps, the cluster, the
    tensor-map workspace (discrete weights)."""
    host_tma = DTYPES[ab_dtype].tma
    want = {
        "tile_m": (c.tile_m, tile[0]), "tile_n": (c.tile_n, tile[1]),
        "m_aligned": (c.m_aligned, M_ALIGNED),
        "tma_dtype_a": (tma_dtype_name(c.tma_dtype_a), "uint8" if host_tma == "UINT8" else ab_dtype),
        "tma_dtype_b": (tma_dtype_name(c.tma_dtype_b), "uint8" if host_tma == "UINT8" else ab_dtype),
    }
    for field, (got, host) in want.items():
        if got != host:
            raise ContractError(f"{kernel}: contract {field} is {got!r}; the host launches {host!r}")
    cm, cn = cluster
    if cm % c.min_cluster_m or cn % c.min_cluster_n or cm * cn > c.max_cluster_ctas:
        raise ContractError(f"{kernel}: cluster {cm}x{cn} is outside the kernel's contract (a multiple "
                            f"of {c.min_cluster_m}x{c.min_cluster_n}, at most {c.max_cluster_ctas} CTAs)")
    if discrete and c.tmap_slot_stride < 1:
        raise ContractError(f"{kernel}: discrete weights need tensor-map slots; the kernel exports "
                            f"tmap_slot_stride {c.tmap_slot_stride}")


def persistent_grid(m_rows: int, n: int, tile: tuple[int, int], ctas_per_tile: int,
                    cluster: tuple[int, int], sms: int) -> int:
    """CTAs of a persistent launch: one per SM at most, whole clusters, no more than the work.

    The scheduling unit is the launch cluster (fusegemm/cluster.cuh): it walks blocks of
    (cluster_m / ctas_per_tile) x cluster_n neighbouring tiles, one tile per MMA unit, so a
    launch needs ceil(m_tiles / units_m) * ceil(n_tiles / cluster_n) clusters to cover the
    problem in one round. ``m_rows`` is A's allocation (valid_m lives on the device, <= it).
    Counting tiles instead of clusters (the old rule) gave 2-CTA tiles and multi-CTA clusters
    half the CTAs they could use when tiles are fewer than SMs.
    """
    cm, cn = cluster
    cs = cm * cn
    units_m = max(1, cm // ctas_per_tile)
    m_tiles = m_rows // tile[0]
    n_tiles = -(-n // tile[1])
    blocks = -(-m_tiles // units_m) * -(-n_tiles // cn)
    return cs * max(1, min(blocks, sms // cs))


_dry = threading.local()


@contextlib.contextmanager
def dry_run():
    """Validate and allocate outputs, launch nothing (this thread, inside the block).

    The torch custom ops' fake implementations run the eager wrappers under it on fake
    tensors, so one code path decides every output's shape, dtype and strides.
    """
    prev = getattr(_dry, "on", False)
    _dry.on = True
    try:
        yield
    finally:
        _dry.on = prev


def is_dry() -> bool:
    return getattr(_dry, "on", False)


def signature(args: tuple) -> tuple | None:
    """(dtype, shape, strides, device) of every argument, or None unless all are torch tensors
    (or None): the key under which a full validation is memoised. About 0.3 us per tensor:
    it runs on every call of the host fast path."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    tensor = torch.Tensor
    out = []
    for x in args:
        if x is None:
            out.append(None)
        elif isinstance(x, tensor):
            out.append((x.dtype, x.shape, x.stride(), x.get_device()))
        else:
            return None
    return tuple(out)


class OpCache:
    """Compiled ops by a key of labelled fields (dtypes, layout, features, tiles, device...).

    Keys never contain data pointers or shapes the kernel takes at run time, so one compiled
    op serves every call with the same configuration. Per-call buffers live in the call.
    """

    def __init__(self, capacity: int = 256) -> None:
        self.capacity = capacity
        self._ops: dict[Hashable, Any] = {}
        # Re-entrant: making an op may make another one in the same thread (the first-run
        # verification of fusegemm/verify.py runs selftest cases through the public wrappers
        # while the first op is being compiled); a plain Lock deadlocks there.
        self._lock = threading.RLock()
        # The wrappers' host fast path: (argument signature, options) -> what their full path
        # resolved (op, launch entry, output shapes). Lives and dies with the ops it names.
        self.fast: dict[Hashable, Any] = {}

    def get_or_create(self, key: Hashable, make: Callable[[], Any]) -> Any:
        op = self._ops.get(key)
        if op is not None:
            return op
        with self._lock:
            op = self._ops.get(key)
            if op is None:
                op = make()
                if len(self._ops) >= self.capacity:
                    self._ops.pop(next(iter(self._ops)))
                self._ops[key] = op
        return op

    def __len__(self) -> int:
        return len(self._ops)

    def clear(self) -> None:
        with self._lock:
            self._ops.clear()
            self.fast.clear()
