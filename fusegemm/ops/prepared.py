"""Launch preparation shared by the ops: the kernel's contract checked against the request, the
persistent grid, argument signatures for the host fast path, and the wrappers' compiled-op cache.
"""
from __future__ import annotations

import contextlib
import sys
import threading
from typing import Any, Callable, Hashable, Mapping

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


def pattern(operands: tuple, kw: Mapping[str, Any], inputs: Mapping[str, Any],
            outputs: Mapping[str, Any] | None) -> tuple[Any, tuple]:
    """(key, flat) of an op call: ``flat`` every argument in call order (positional operands,
    keyword operands, inputs, outputs); ``key`` how they were passed and each one's (dtype, shape,
    strides, device), or a Python number's value. The key is None unless every argument is a
    plain torch tensor (or an ``nn.Parameter``: a module's weights), None or a number: only those
    calls take :class:`fusegemm.Op`'s memo.
    (About 0.2 us per argument: it runs on every call.)"""
    flat = (*operands, *kw.values(), *inputs.values(), *(outputs.values() if outputs is not None else ()))
    sig = flat_signature(flat)
    if sig is None:
        return None, flat
    return (len(operands), tuple(kw), tuple(inputs), None if outputs is None else tuple(outputs), sig), flat


def flat_signature(flat: tuple) -> tuple | None:
    """Each argument's (dtype, shape, strides, device), a number's (type, value), None for None;
    None unless every argument is one of those (a plain torch tensor or an ``nn.Parameter``, which
    adds no behaviour; no other subclass)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    tensor, param = torch.Tensor, torch.nn.Parameter
    try:
        return tuple([(x.dtype, x.shape, x.stride(), x.get_device()) if type(x) is tensor or type(x) is param else
                      None if x is None else _plain(x) for x in flat])
    except _NotPlain:
        return None


class _NotPlain(Exception):
    pass


def _plain(x: Any) -> Any:
    """The key entry of a number: its (type, value) (flat_signature keys None itself)."""
    if type(x) is int or type(x) is float:
        return (type(x), x)
    raise _NotPlain


def addresses(flat: tuple) -> tuple[int, ...]:
    """Each argument's address (0 for None and numbers) for a call :func:`pattern` keyed."""
    torch = sys.modules["torch"]
    tensor, param = torch.Tensor, torch.nn.Parameter
    return tuple([x.data_ptr() if type(x) is tensor or type(x) is param else 0 for x in flat])


class Prepared:
    """What one call pattern's full validation proved, in terms of argument positions (the
    ``flat`` order of :func:`pattern`; outputs that ``Op.__call__`` allocates follow them):

    * ``call`` -- the parsed operands with their addresses cleared (sizes, strides, dtypes);
    * ``rebase`` -- (attribute of ``call``, position) for every tensor of ``call``;
    * ``slots`` -- (parameter field, position) of each epilogue input passed as a tensor;
    * ``consts`` -- the parameter fields that no address changes (a number input's device copy,
      the C input's row pitch);
    * ``outs`` -- (output name, position); ``alloc`` -- what ``__call__`` allocates per call;
    * ``masks`` -- (position, alignment - 1) of every address the kernel needs aligned;
    * ``resets`` -- (fill bits, position, words) of the reductions ``execute`` resets;
    * ``offsets`` / ``row_ends`` -- the positions of padded_offsets and of the row ends (None
      where the call has none);
    * ``spans_out`` / ``spans_in`` -- (position, last byte's offset) of the caller's outputs and of
      what they may not overlap (``execute``);
    * the launch geometry (``grid``, ``empty``, ``scratch``, ``go``) and ``bufs``: packed
      parameters (or, with per-call scratch, the values) by the call's address tuple.

    Nothing here holds a caller's tensor, and nothing is mutated after creation but ``bufs``
    (a bounded dict whose values are complete before they are inserted).
    """

    __slots__ = ("call", "rebase", "slots", "consts", "outs", "alloc", "masks", "resets", "offsets", "row_ends",
                 "grid", "empty", "scratch", "discrete", "go", "bufs", "keep", "spans_out", "spans_in")

    def __init__(self, **fields: Any) -> None:
        for k in self.__slots__:
            setattr(self, k, fields.pop(k, None))
        if fields:
            raise TypeError(f"Prepared: unknown fields {sorted(fields)}")
        self.bufs = {}

    def aligned(self, ptrs: tuple[int, ...]) -> bool:
        for i, mask in self.masks:
            if ptrs[i] & mask:
                return False
        return True

    def disjoint(self, ptrs: tuple[int, ...]) -> bool:
        """No output overlaps another output or an input at these addresses (``execute``)."""
        outs = [(ptrs[i], ptrs[i] + span) for i, span in self.spans_out if span >= 0]
        ins = [(ptrs[i], ptrs[i] + span) for i, span in self.spans_in if span >= 0]
        for j, (lo, hi) in enumerate(outs):
            for wlo, whi in outs[j + 1:] + ins:
                if lo <= whi and wlo <= hi:
                    return False
        return True

    def remember(self, ptrs: tuple[int, ...], launchable: Any) -> None:
        if len(self.bufs) >= 32:
            self.bufs.clear()
        self.bufs[ptrs] = launchable


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
