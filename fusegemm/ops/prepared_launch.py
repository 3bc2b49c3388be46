"""The one engine's launches (:class:`fusegemm.Op`): what a validated call proved, kept per call
pattern (:class:`~fusegemm.ops.prepared.Prepared`), and the launch of a pattern at a set of
addresses; the per-class launch plans (tensor maps, scalars, grid).

A call pattern's first full validation ends in ``PreparedLaunch._prepare``: the parsed operands
with their addresses cleared, the position of every address the launch reads, the launch
geometry. Every launch, the first included, builds its parameters from that record and the
call's addresses (``_values_at``), so the path a repeat call takes is the one every call takes.
"""
from __future__ import annotations

import copy
import dataclasses
from typing import Any, Mapping

from .. import arguments as args
from ..base.dtypes import DTYPES
from ..base.errors import UnsupportedError
from ..generator.params import GROUPED_PARAMS
from ..runtime import config as _config
from ..runtime import load as _load
from ..runtime import tensors as _tensors
from ..runtime.tensors import TensorView, view
from . import device as _device
from . import tail as _tail
from .arg_checks import row_pitch_aligned
from .grouped_operands import shape_of
from .kgrouped_operands import KCall
from .loaded_kernel import LoadedKernel
from .outputs import RESET_BITS, extent
from .prepared import Prepared, addresses
from .scaled_operands import scaled_maps, sf_atom_group_words


class PreparedLaunch:
    """The launch half of :class:`fusegemm.Op` (it provides ``kind``, ``epilogue``, ``variant``,
    ``d_major_m``, ``device``, ``rcp_max``, ``_launcher``, ``_memo``, ``_rows``, ``_dims()``,
    ``_buffers()`` and ``_operand_names()``)."""

    def _execute_memo(self, e: Prepared, flat: tuple, current_stream: Any, validate_offsets: bool | None) -> bool:
        """``execute`` of a memoised pattern ``e`` on the arguments ``flat`` (``pattern``'s order):
        known addresses passed every check before; new ones need alignment and no overlap. False
        (nothing done) where they fail: the full path names what is wrong."""
        ptrs = addresses(flat)
        ready = e.bufs.get(ptrs)
        if ready is not None or (e.aligned(ptrs) and e.disjoint(ptrs)):
            self._run(e, ptrs, flat[e.offsets] if e.offsets is not None else None, current_stream, reset=True,
                      validate_offsets=validate_offsets, ready=ready)
            return True
        return False

    def _prepare(self, key: Any, flat: tuple, operands: tuple, kw: Mapping[str, Any], given: Mapping[str, Any],
                 call: Any, values: dict[str, Any], keep: list, deferred: list, out: Mapping[str, Any],
                 rows_written: bool | None, outputs: Mapping[str, Any] | None = None,
                 align: Mapping[str, int] | None = None) -> tuple[Prepared, tuple]:
        """What this validated call proved, by argument position (:class:`Prepared`), and its
        address tuple. Kept under ``key`` (the host fast path) when every tensor the launch reads
        starts at its argument's ``data_ptr()``; a one-off otherwise."""
        from ..runtime.launch import prepare
        _load.thread_context(self.device)   # (the tensor maps below are encoded in this thread's context)
        params = self._operand_names()
        pos = {name: i for i, name in enumerate(params[:len(operands)])}
        pos.update({name: len(operands) + i for i, name in enumerate(kw)})
        base = len(operands) + len(kw)
        pos.update({f"input:{name}": base + i for i, name in enumerate(given)})
        base += len(given)
        if outputs is not None:
            pos.update({f"output:{name}": base + i for i, name in enumerate(outputs)})
        else:   # __call__: its own allocations follow the arguments
            pos.update({f"output:{name}": len(flat) + i for i, name in enumerate(out)})
        # Every tensor argument at its data_ptr() (the fast path's addresses), then the tensors the
        # launch reads at their views' addresses (the same where the pattern is memoised).
        ptrs = list(addresses(flat)) if key is not None else [0] * len(flat)
        ptrs += [0] * (0 if outputs is not None else len(out))
        views: list[tuple[int, Any]] = []
        attr_operand = {attr: name for name, attr, _ in DEVICE_OPERANDS[self.kind]}
        attr_operand["a"] = LEAD[self.kind][0]
        rebase = []
        template = copy.copy(call)
        for attr, v in vars(call).items():
            if isinstance(v, TensorView):
                i = pos[attr_operand[attr]]   # every tensor of a parsed call is an operand's
                rebase.append((attr, i))
                views.append((i, v))
                setattr(template, attr, TensorView(0, v.shape, v.strides, v.dtype, v.device, None))
        aligns = {LEAD[self.kind][0]: LEAD[self.kind][1], **{nm: al for nm, _, al in DEVICE_OPERANDS[self.kind]}}
        masks = [(pos[nm], al - 1) for nm, al in aligns.items() if nm in pos]
        slots, consts = [], {}
        for inp in self.epilogue.inputs:
            x = given.get(inp.name)
            if x is None:
                continue
            if isinstance(x, (int, float)):   # a number's device copy: part of the key, kept here
                consts[inp.slot] = values[inp.slot]
            else:
                i = pos[f"input:{inp.name}"]
                slots.append((inp.slot, i))
                views.append((i, _Ptr(values[inp.slot])))
                least = 2 if DTYPES[inp.dtype].itemsize == 2 else 4   # as _inputs checks
                masks.append((i, max(least, (align or {}).get(inp.name, 0)) - 1))
        if "ld_c_in" in values:
            consts["ld_c_in"] = values["ld_c_in"]
        for o in self.epilogue.outputs:   # the caller's row pitch (execute, grouped class: pitched)
            if outputs is not None and self.kind == "grouped" and o.name in out:
                consts[f"ld{o.slot}"] = out[o.name].strides[0]
        outs = [(name, pos[f"output:{name}"]) for name in out]
        views += [(pos[f"output:{name}"], v) for name, v in out.items()]
        for i, v in views:
            ptrs[i] = v.ptr
        ptrs = tuple(ptrs)
        masks += [(i, (16 if name in self._rows else 4) - 1) for name, i in outs if outputs is not None]
        resets = [(RESET_BITS[name], i, out[name].numel()) for name, i in outs if name in RESET_BITS]
        spans_out, spans_in = (), ()
        if outputs is not None:   # what _check_overlap compared, by position
            spans_out = tuple((pos[f"output:{name}"], extent(v)) for name, v in out.items())
            given_views = zip([i for i in self.epilogue.inputs if given.get(i.name) is not None], deferred)
            spans_in = tuple((pos[attr_operand[attr]], extent(v)) for attr, v in vars(call).items()
                             if isinstance(v, TensorView) and attr not in ("b_ptrs", "sfb_ptrs"))
            spans_in += tuple((pos[f"input:{i.name}"], extent(v)) for i, (_, v, _) in given_views
                              if not isinstance(given[i.name], (int, float)))
        ln = self._launcher
        planned = _PLANS[self.kind](self, _rebased(template, rebase, ptrs), ln, {name: ptrs[i] for name, i in outs})
        grid = planned[0] if planned is not None else 0
        scratch = planned is not None and ln.needs_scratch(planned[1].discrete)
        alloc = None
        if outputs is None:
            import torch
            dev = torch.device(device_str(call.a, self.device))   # (parsed once, not per call)
            alloc = [(name, shape, getattr(torch, store), dev,
                      None if rows_written and name in self._rows else fill)
                     for name, (shape, store, fill) in self._buffers(call).items()]
        e = Prepared(call=template, rebase=tuple(rebase), slots=tuple(slots), consts=consts, outs=tuple(outs),
                     alloc=alloc, masks=tuple(masks), resets=tuple(resets),
                     offsets=pos["padded_offsets"] if call.offsets is not None else None,
                     row_ends=dict(rebase).get("row_ends"),
                     grid=grid, empty=planned is None, scratch=scratch,
                     discrete=planned is not None and planned[1].discrete,
                     go=None if planned is None or scratch else prepare(ln.kernel, ln.config(grid)),
                     keep=[k for k in keep if not any(k is x for x in flat)], spans_out=spans_out, spans_in=spans_in)
        # Memoise only when each tensor read starts at its argument's address, so that another
        # call of the pattern can be re-addressed from its arguments alone.
        if key is not None and all(v.ptr == (flat[i].data_ptr() if i < len(flat) else v.ptr) for i, v in views):
            if len(self._memo) >= 64:
                self._memo.clear()
            self._memo[key] = e
        return e, ptrs

    def _values_at(self, e: Prepared, ptrs: tuple) -> dict[str, Any]:
        """The parameter struct of pattern ``e`` at the addresses ``ptrs``: every address field
        from ``ptrs`` (the tensor maps re-encoded through the kernel's map cache)."""
        ln = self._launcher
        call = _rebased(e.call, e.rebase, ptrs)
        out = {name: ptrs[i] for name, i in e.outs}
        _, _, values = _PLANS[self.kind](self, call, ln, out)
        values.update(self.epilogue.buffer_params({k: v for k, v in out.items() if k != A_ROWS}, call.n))
        if self.kind == "batched" and self.variant.cd_major == "m":
            values["ldc"] = call.m   # C is (L, N, M): rows of M elements
        if self.d_major_m:
            values["ldd"] = call.m_out   # K-grouped D_e^T, (L * N, M): rows of M elements
        values.update(e.consts)
        for slot, i in e.slots:
            values[slot] = ptrs[i]
        values.update({"offsets": ptrs[e.offsets] if e.offsets is not None else 0, "rcp_max": self.rcp_max})
        return values

    def _launch_values(self, call: Any, out: Mapping[str, int], inputs: Mapping[str, int] | None = None
                      ) -> dict[str, Any]:
        """The parameter struct a launch of parsed operands ``call`` packs, with the outputs at
        addresses ``out`` and the epilogue's input fields ``inputs`` (``_inputs``' values); tests
        read it."""
        attrs = [attr for attr, v in vars(call).items() if isinstance(v, TensorView)]
        e = Prepared(call=call, rebase=tuple((a, i) for i, a in enumerate(attrs)), slots=(), consts=dict(inputs or {}),
                     outs=tuple((name, len(attrs) + i) for i, name in enumerate(out)),
                     offsets=attrs.index("offsets") if "offsets" in attrs else None)
        return self._values_at(e, tuple(getattr(call, a).ptr for a in attrs) + tuple(out.values()))

    def _run(self, e: Prepared, ptrs: tuple, offsets_obj: Any, current_stream: Any,
             zero: Mapping[str, Any] | None = None, reset: bool = False,
             validate_offsets: bool | None = None, ready: Any = None) -> None:
        """Launch pattern ``e`` at ``ptrs`` on ``current_stream``: reductions reset first
        (``reset``: execute's caller buffers), rows past the last offset of ``zero``'s row
        outputs zeroed (the grouped class's own allocations)."""
        _load.thread_context(self.device)
        stream = _tensors.resolve_stream(current_stream, self.device)
        if offsets_obj is not None and (validate_offsets if validate_offsets is not None else _config.validate_offsets()):
            # Opt-in (FUSEGEMM_VALIDATE_OFFSETS): a host copy of the offsets, never during capture.
            host = _device.offsets_on_host(offsets_obj, stream)
            if host is not None:
                c = e.call
                args.offsets_values(host, c.t if self.k_grouped else c.m, _OFFSET_ROWS.get(self.kind, "a_tensor"))
        if reset:
            for bits, i, words in e.resets:
                _load.memset32(ptrs[i], bits, words, stream)
        if zero and self.variant.d_scatter:
            # Scattered outputs: the rows no index names are zero (those rows alone, or where the
            # small kernels cannot serve the buffers, the whole buffers first).
            bufs = [zero[k] for k in self._rows if k in zero and zero[k].numel()]
            c, at = e.call, dict(e.rebase)
            if not _tail.zero_unnamed(bufs, ptrs[at["d_index"]], c.d_rows, ptrs[e.offsets], c.l, c.m, stream,
                                      self.device, ptrs[e.row_ends] if e.row_ends is not None else 0):
                for t in bufs:
                    _load.memset32(t.data_ptr(), 0, t.numel() * t.element_size() // 4, stream)
            zero = None
        if e.empty:
            return   # no row tile (an empty A): nothing to map or launch; outputs hold their fills
        if zero:
            # (with row ends, the rows past them too: the kernel may skip their tiles)
            _tail.zero_tail([zero[k] for k in self._rows if k in zero], ptrs[e.offsets], e.call.l, e.call.m, stream,
                            self.device, ptrs[e.row_ends] if e.row_ends is not None else 0)
        if ready is None:
            ready = e.bufs.get(ptrs)
        if ready is None:
            ready = self._values_at(e, ptrs)
            if not e.scratch:
                from ..runtime.launch import ParamBuffer
                buf = ParamBuffer(GROUPED_PARAMS.size)
                buf.fill(GROUPED_PARAMS.pack(ready))
                ready = buf
            e.remember(ptrs, ready)
        ln = self._launcher
        if e.scratch:   # per-call scratch (tile counter, tensor-map slots, stream-K): packed per call
            ln.launch({**ready, **ln.workspace(e.grid, e.discrete, stream, current_stream is not None)}, e.grid, stream)
        else:
            e.go(ready, stream)


def pitched(x: Any, name: str, shape: tuple[int, ...], store: str) -> Any:
    """A grouped-class C / D the caller gave with a row pitch: its (rows, columns) view with the
    caller's strides, or None (then the dense check says what is allowed)."""
    if x is None or type(x) is TensorView:
        return None
    v = view(x, name)
    dims = v.shape[:2] if v.ndim == 3 and v.shape[2] == 1 else v.shape
    if v.dtype != store or tuple(dims) != tuple(shape) or len(shape) != 2 or v.strides[1] != 1:
        return None
    if v.strides[0] < shape[1]:
        return None
    # Rows are stored with 16-byte vector stores: a pitch that breaks that is named as such.
    row_pitch_aligned(v.strides[0], v.itemsize, f"{name}.stride[0]")
    return TensorView(v.ptr, tuple(shape), (v.strides[0], 1), v.dtype, v.device, v.obj)


class _Ptr:
    """An address standing in for a view in :meth:`Op._prepare`'s bookkeeping."""

    __slots__ = ("ptr",)

    def __init__(self, ptr: int) -> None:
        self.ptr = ptr


def _rebased(template: Any, rebase: tuple, ptrs: tuple) -> Any:
    """A copy of a parsed call whose tensors start at ``ptrs`` (sizes, strides, dtypes kept)."""
    call = copy.copy(template)
    for attr, i in rebase:
        v = getattr(template, attr)
        setattr(call, attr, TensorView(ptrs[i], v.shape, v.strides, v.dtype, v.device, None))
    return call


def device_str(a: Any, device: int) -> str:
    kind, index = a.device
    return f"cuda:{device}" if kind == "cuda" else (kind if index < 0 else f"{kind}:{index}")


# A stored gathered A's output (a_gather_store): the rows in problem order, written through tma_a.
A_ROWS = "a_rows"

# The first operand's name and base alignment, and the other operands checked for device and
# alignment: (argument name, attribute of the call, bytes).
LEAD = {"grouped": ("a_tensor", 16), "kgrouped": ("dy_tensor", 16), "scaled": ("a_tensor", 16),
        "batched": ("a_tensor", 16), "kscaled": ("a_tensor", 16)}
# What padded_offsets count, for their host check's message.
_OFFSET_ROWS = {"kgrouped": "dy_tensor", "kscaled": "a_tensor (token columns)"}
DEVICE_OPERANDS = {
    "grouped": (("padded_offsets", "offsets", 4), ("b_tensor", "b", 16), ("b_ptrs", "b_ptrs", 8),
                ("a_index", "a_index", 4), ("d_index", "d_index", 4), ("row_ends", "row_ends", 4)),
    "kgrouped": (("x_tensor", "b", 16), ("padded_offsets", "offsets", 4), ("dy_index", "a_index", 4),
                 ("x_index", "b_index", 4), ("row_ends", "row_ends", 4)),
    "scaled": (("padded_offsets", "offsets", 4), ("b_tensor", "b", 16), ("b_ptrs", "b_ptrs", 8),
               ("sfb_ptrs", "sfb_ptrs", 8), ("sfa_tensor", "sfa", 16), ("sfb_tensor", "sfb", 16),
               ("a_index", "a_index", 4)),
    "batched": (("b_tensor", "b", 16), ("sfa_tensor", "sfa", 16), ("sfb_tensor", "sfb", 16)),
    "kscaled": (("b_tensor", "b", 16), ("sfa_tensor", "sfa", 16), ("sfb_tensor", "sfb", 16),
                ("padded_offsets", "offsets", 4), ("row_ends", "row_ends", 4)),
}


def _plan_grouped(op: Any, call: Any, ln: LoadedKernel, out: Mapping[str, int]) -> Any:
    s = shape_of(call)
    if s.m < op.variant.tile_m:
        # No row tile: M is a multiple of 256, so M = 0 and the row outputs have no rows to zero.
        return None
    # A gathered A loads through cp.async, never tma_a; stored (a_rows), tma_a is the map of the
    # a_rows output's dense (M, K) rows, into which the kernel stores each A stage.
    a_map = (dataclasses.replace(s, a_ld=s.k, a_rows=s.m), out[A_ROWS]) if A_ROWS in out else (s, call.a.ptr)
    maps = ln.maps(*a_map, call.b.ptr if call.b is not None else 0)
    return ln.grid(s), s, {**maps, **ln.scalars(s),
                           "b_ptrs": call.b_ptrs.ptr if call.b_ptrs is not None else 0,
                           "a_index": call.a_index.ptr if call.a_index is not None else 0,
                           "d_index": call.d_index.ptr if call.d_index is not None else 0,
                           "d_rows": max(call.d_rows, 0),
                           "row_ends": call.row_ends.ptr if call.row_ends is not None else 0,
                           **_gather_source("a", call.a if call.a_index is not None else None, "a_tensor",
                                            op.variant.arch)}


def _kgrouped_launch(call: Any, ln: LoadedKernel, a_ld: int, b_ld: int) -> tuple[Any, Any, dict[str, Any]]:
    """What both K-grouped classes' launches share: the grid over the (L * M, N) output's tiles,
    the problem's shape and its scalar fields (k: the token rows, T)."""
    from .loaded_kernel import GroupedShape
    from .prepared import persistent_grid
    m, n, t, c = call.m_out, call.n, call.t, ln.contract
    s = GroupedShape(m=call.l * m, n=n, k=t, l=call.l, a_ld=a_ld, b_sn=b_ld, b_sl=0, discrete=False)
    grid = persistent_grid(call.l * m, n, ln.tile, c.ctas_per_tile, ln.cluster, ln.sms)
    return grid, s, {"row_ends": call.row_ends.ptr if call.row_ends is not None else 0, "m_rows": m, "n": n, "k": t,
                     "num_experts": call.l, "cluster_m": 1, "cluster_n": 1, "b_ptrs": 0}


def _plan_kgrouped(op: Any, call: KCall, ln: LoadedKernel, out: Mapping[str, int]) -> Any:
    c, tiled, item = ln.contract, ln.tmaps.tiled, DTYPES["bfloat16"].itemsize
    m, n, t = call.m_out, call.n, call.t
    # No tokens at all (an expert-parallel rank that received none): every tile has an empty K
    # range and loads nothing, but a tensor map needs a real extent and address; an output
    # buffer (at least M x N elements) stands in for both operands.
    a_ptr, b_ptr, a_ld, b_ld = call.a.ptr, call.b.ptr, call.a.strides[0], call.b.strides[0]
    a_rows, b_rows = call.a.shape[0], call.b.shape[0]   # (a gathered operand: its own rows)
    if t == 0:
        a_ptr = b_ptr = next(iter(out.values()))
        a_ld, b_ld, a_rows, b_rows = m, n, 1, 1
    grid, s, scalars = _kgrouped_launch(call, ln, a_ld, b_ld)
    values = {"tma_a": tiled(a_ptr, ln.tma_dtype, (m, a_rows), (a_ld * item,), (c.box_a_inner, c.box_a_outer),
                             c.swizzle_a),
              "tma_b": tiled(b_ptr, ln.tma_dtype, (n, b_rows), (b_ld * item,), (c.box_b_inner, c.box_b_outer),
                             c.swizzle_b),
              "a_index": call.a_index.ptr if call.a_index is not None else 0,
              "b_index": call.b_index.ptr if call.b_index is not None else 0, **scalars,
              **_gather_source("a", call.a if call.a_index is not None and t else None, "dy_tensor",
                               op.variant.arch),
              **_gather_source("b", call.b if call.b_index is not None and t else None, "x_tensor",
                               op.variant.arch)}
    return grid, s, values


def _gather_source(operand: str, v: TensorView | None, name: str, arch: str) -> dict[str, int]:
    """The fields a gathered operand's cp.async loads read (fusegemm/gather.cuh): the token-major
    matrix's address, row stride and rows; zeros where ``v`` is None (not gathered). The sm_90a
    loads hold each row's offset in 16-byte units in 32 bits: a larger operand is refused."""
    if v is None:
        return {f"{operand}_gather_ptr": 0, f"{operand}_gather_ld": 0, f"{operand}_gather_rows": 0}
    rows, pitch = v.shape[0], v.strides[0] * DTYPES[v.dtype].itemsize
    if arch == "sm_90a" and (rows - 1) * (pitch // 16) + 7 >= 1 << 32:
        raise UnsupportedError(f"{name}: {rows} rows of {pitch} bytes; sm_90a gathered loads address at most "
                               f"2**32 16-byte chunks (64 GiB) of the gathered operand: split its rows over calls")
    return {f"{operand}_gather_ptr": v.ptr, f"{operand}_gather_ld": v.strides[0], f"{operand}_gather_rows": rows}


def _plan_scaled(op: Any, call: Any, ln: LoadedKernel, out: Mapping[str, int]) -> Any:
    from .loaded_kernel import GroupedShape
    tile_m = op.variant.tile_m
    # Batched: the grid covers L * ceil(M / TILE_M) row blocks; m_rows is M of one batch.
    rows = call.l * -(-call.m // tile_m) * tile_m if call.batched else call.m
    s = GroupedShape(m=rows, n=call.n, k=call.k, l=call.l, a_ld=call.a.strides[0], b_sn=call.b_strides[0],
                     b_sl=call.b_strides[1], discrete=call.discrete)
    if rows < tile_m:
        return None
    gathered = call.a_index is not None
    values = {**scaled_maps(ln, call), **ln.scalars(s), "m_rows": call.m,
              "b_ptrs": call.b_ptrs.ptr if call.b_ptrs is not None else 0,
              "sfb_ptrs": call.sfb_ptrs.ptr if call.sfb_ptrs is not None else 0,
              # Gathered A: A's token rows and their scales (the sm_90a blockwise kernel's copying
              # warps: 1x128 scales K-block by K-block, sfa_ld floats apart; the sm_100a kernel's
              # lanes: MX atoms of A's rows, a 128-row atom group every ceil(sfk / 4) * 128 words).
              "a_index": call.a_index.ptr if gathered else 0,
              **_gather_source("a", call.a if gathered else None, "a_tensor", op.variant.arch),
              "sfa_gather_ptr": call.sfa.ptr if gathered else 0,
              "sfa_gather_ld": (call.sfa_ld if call.blockwise else sf_atom_group_words(call.sfk)) if gathered else 0}
    return ln.grid(s), s, values


def _plan_kscaled(op: Any, call: Any, ln: LoadedKernel, out: Mapping[str, int]) -> Any:
    """FP8 weight gradients (K-grouped: sm90/blockwise_promote.cuh, sm100/blockscaled_gemm.cuh): A =
    dY^T (M, T) and B = X^T (N, T) bytes; blockwise 1x128 scales (M, T/128) and (N, T/128) as maps
    with boxes of the operand box's rows by one 128-token block, or MXFP8 scale atoms as the
    M-grouped class maps them."""
    from .scaled_operands import blockwise_rows_map, sf_atom_map
    c, tiled = ln.contract, ln.tmaps.tiled
    m, n, t = call.m_out, call.n, call.t
    a_ptr, b_ptr, sfa_ptr, sfb_ptr = call.a.ptr, call.b.ptr, call.sfa.ptr, call.sfb.ptr
    a_ld, b_ld, cols, sfk, sfa_ld, sfb_ld = call.a.strides[0], call.b.strides[0], t, call.sfk, call.sfa_ld, call.sfb_ld
    if t == 0:
        # No tokens (an expert-parallel rank that received none): every tile's K range is empty
        # and nothing is loaded, but a map needs a real extent and address: an output buffer (at
        # least M x N elements) stands in for every operand.
        a_ptr = b_ptr = sfa_ptr = sfb_ptr = next(iter(out.values()))
        a_ld, b_ld, cols, sfk, sfa_ld, sfb_ld = 16, 16, 16, 1, -(-m // 4) * 4, -(-n // 4) * 4
    grid, s, scalars = _kgrouped_launch(call, ln, a_ld, b_ld)
    if call.blockwise:
        sf_maps = {"tma_sfa": blockwise_rows_map(tiled, sfa_ptr, m, sfk, sfa_ld, c.box_a_outer),
                   "tma_sfb": blockwise_rows_map(tiled, sfb_ptr, n, sfk, sfb_ld, c.box_b_outer)}
    else:   # MXFP8 atoms, as the M-grouped class maps them
        sf_maps = {"tma_sfa": sf_atom_map(tiled, sfa_ptr, m, sfk, 1, (128, c.sf_box_k, 1, 1)),
                   "tma_sfb": sf_atom_map(tiled, sfb_ptr, n, sfk, 1, (128, c.sf_box_k, c.sf_box_nb, 1))}
    values = {"tma_a": tiled(a_ptr, "uint8", (cols, m), (a_ld,), (c.box_a_inner, c.box_a_outer), c.swizzle_a),
              "tma_b": tiled(b_ptr, "uint8", (cols, n), (b_ld,), (c.box_b_inner, c.box_b_outer), c.swizzle_b),
              **sf_maps, **scalars, "sfb_ptrs": 0, "sfb": 0}
    return grid, s, values


_PLANS = {"grouped": _plan_grouped, "kgrouped": _plan_kgrouped, "scaled": _plan_scaled, "batched": _plan_scaled,
          "kscaled": _plan_kscaled}
