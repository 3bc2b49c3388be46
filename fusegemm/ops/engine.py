"""One engine for every spec: ``fusegemm.Op(spec, ...)``.

A spec names a kernel family (``kernel:``) and an epilogue. The registry says which kernel class
builds the family on each arch, and the class fixes the operands a call passes:

==============  ====================================================  ===============================
kernel class    families                                              operands
==============  ====================================================  ===============================
``grouped``     BF16 grouped GEMM (``grouped_gemm`` and user specs)   a, padded_offsets, b | b_ptrs, n
``kgrouped``    K-grouped weight gradients (``grouped_gemm_wgrad``)   dy, x, padded_offsets
``scaled``      block-scaled grouped (sReLU, quant, dSwiGLU)          a, sfa, padded_offsets, b, sfb
                                                                      | b_ptrs, sfb_ptrs, n
``batched``     block-scaled batched (``gemm_amax``)                  a, b, sfa, sfb
``kscaled``     FP8 weight gradients, blockwise recipe               a (dY^T), sfa, b (X^T), sfb,
                (``grouped_gemm_wgrad_fp8``)                          padded_offsets
==============  ====================================================  ===============================

Everything else is the spec's: the epilogue's inputs are passed by their spec names and reach the
parameter struct only through the slots the resolved epilogue assigns them; every output the
epilogue declares comes back by its spec name (``__call__``) or is written into the caller's
tensors (``execute``). The same op serves ``check_support() -> compile() -> __call__/execute``
and the numpy interpreter's ``reference``:

    op = fusegemm.Op("grouped_gemm_swiglu", d_dtype="bfloat16")
    out = op(a, padded_offsets, b, inputs={"alpha": alpha, "prob": prob})
    out["d"]

Host fast path: a call whose arguments are plain torch tensors (or None, or numbers) is validated in
full once per *call pattern* -- how each argument is passed, and its dtype, shape, strides and
device (numbers: their value). Later calls of the pattern check only what addresses decide
(alignment; for ``execute`` at new addresses, that no output overlaps another or an input) and
launch the parameters prepared for those addresses (``ops/prepared.py`` ``Prepared``,
``ops/prepared_launch.py``).
"""
from __future__ import annotations

import dataclasses
import inspect
import sys
from pathlib import Path
from typing import Any, Callable, Mapping

from .. import arguments as args
from ..base.dtypes import DTYPES
from ..base.errors import ArgumentError, UnsupportedError
from ..runtime.tensors import view
from ..tupledict import TupleDict
from . import arg_checks as checks
from . import device as _device
from . import tail as _tail
from .device import alloc, alloc_buffers
from .grouped_operands import parse_call
from .kgrouped_operands import KCall, parse_kgrouped
from .kscaled_operands import KSCall, parse_kscaled
from .loaded_kernel import LoadedKernel
from .outputs import check_no_overlap, native_output
from .prepared import Prepared, addresses, is_dry, pattern
from .prepared_launch import A_ROWS, DEVICE_OPERANDS, LEAD, PreparedLaunch, device_str, pitched
from .scaled_layouts import E8M0_NAMES, host_copies, host_operands, kernel_choices
from .scaled_operands import SF_AXIS, ab_axis, parse_batched, parse_scaled

# SFD: 1 / the largest value of the quantized output (e5m2: the seed page's 1/57344, or NVIDIA's
# kernels' 1/128 with e5m2_rcp_max="nvidia").
RCP_MAX = {"float8_e4m3fn": 1.0 / 448.0, "float4_e2m1fn_x2": 1.0 / 6.0}
E5M2_RCP_MAX = {"page": 1.0 / 57344.0, "nvidia": 1.0 / 128.0}


def kernel_class(family: str) -> str:
    """``grouped``, ``kgrouped``, ``scaled``, ``batched`` or ``kscaled``: the operands ``family``'s
    kernel reads (``registry.kernel_class``; the faces ask here)."""
    from ..generator import registry
    return registry.kernel_class(family)


class Op(PreparedLaunch):
    """A spec compiled for one variant on one device: the one engine under every face.

    Parameters
    ----------
    spec : Spec, spec name or path to a YAML file
        Any spec: a packaged one (``"grouped_gemm_srelu"``) or a user's file.
    arch : str, optional
        Default: the device's (``device``).
    device : int
        CUDA device ordinal (default 0).
    e5m2_rcp_max : {"page", "nvidia"}
        SFD convention of an e5m2 output.
    **axes
        Variant choices (``d_dtype="float8_e4m3fn"``, ``weight_mode="discrete"``, tiles...);
        the rest take the spec's and the arch's defaults.
    """

    FAMILIES: tuple[str, ...] = ()   # a subclass that serves some families only (the named faces)
    WHAT = ""

    def __init__(self, spec: Any, *, arch: str | None = None, device: int = 0,
                 e5m2_rcp_max: str = "page", **axes: Any) -> None:
        from ..generator.spec import Spec, find_spec
        from ..generator.variants import make_variant
        self.spec = spec if isinstance(spec, Spec) else find_spec(str(spec) if isinstance(spec, Path) else spec)
        if self.FAMILIES and self.spec.kernel not in self.FAMILIES:
            raise UnsupportedError(f"spec {self.spec.name}: kernel family {self.spec.kernel!r}; "
                                   f"{type(self).__name__} runs {', '.join(map(repr, self.FAMILIES))} ({self.WHAT}); "
                                   f"fusegemm.Op runs every family")
        args.choice(e5m2_rcp_max, "e5m2_rcp_max", tuple(E5M2_RCP_MAX))
        self.device = device
        self.arch = arch or _device.device_arch(device)
        self.kind = kernel_class(self.spec.kernel)
        # K-grouped classes (weight gradients): the output is an (M, N) block per expert, (L, M, N).
        self.k_grouped = self.kind in ("kgrouped", "kscaled")
        self.variant = make_variant(self.spec, arch=self.arch, **axes)
        # An M-major D (specs/grouped_gemm_wgrad.yaml's cd_major m): each expert's D_e^T, (L, N, M).
        self.d_major_m = self.kind == "kgrouped" and self.variant.cd_major == "m"
        # MN-major operands the kernel reads through a K-major copy (scaled_layouts.py): the
        # kernel is built from the K-major variant, each call copies them first.
        self.host_copies = host_copies(self.kind, self.variant.choices)
        self.kernel_variant = self.variant
        if self.host_copies:
            kc = kernel_choices(self.kind, self.variant.choices)
            kc.pop("arch", None)
            self.kernel_variant = make_variant(self.spec, arch=self.arch, **kc)
        # The blockwise recipe's FP32-scale kernel also takes E8M0 scale tensors (converted per
        # call, exactly: scaled_layouts.py; the registry runs sf_dtype e8m0 at 128 as float32).
        self.e8m0_scales = (self.kind in ("scaled", "kscaled") and self.variant.sf_vec_size == 128
                            and self.variant.sf_dtype == "float32")
        # The recipe's E8M0 scales on a kernel that runs them as MX scales (sm_100a's registry
        # runs sf_vec_size 128 as 32): each call expands them into MX scale atoms first.
        self.blockwise_mx = (self.kind in ("scaled", "kscaled") and self.variant.sf_vec_size == 32 and
                             self._requested("sf_vec_size", axes) == 128)
        # Whether a call's operands pass through scaled_layouts.host_operands first (any of the three).
        self._host_prep = bool(self.host_copies or self.e8m0_scales or self.blockwise_mx)
        self.epilogue = self.spec.epilogue.resolve(self.variant.choices)
        self._rows = self.epilogue.row_buffers()
        # A gathered A stored as well (a_gather_store): the rows the kernel gathered, in problem
        # order, one more row output (zeroed past the last offset and the row ends as C and D).
        self.a_rows_out = self.variant.a_gather_store
        if self.a_rows_out:
            self._rows += (A_ROWS,)
        # Row-tiled classes (grouped BF16 and block-scaled grouped share the scheduler and the
        # epilogue's stores): their row outputs are allocated uninitialised, the kernel stores
        # every row below the last offset and the tail kernel zeroes the rest (ops/tail.py).
        # Filling the block-scaled outputs whole first cost the fp8_block MoE step 0.22 ms (3%)
        # on the H200.
        self.tail_zeroed = self.kind in ("grouped", "scaled")
        # The output quantized with 1x128 FP32 scales (quantize.vec 128), if any: its rows size
        # the sfd_row view (_shaped).
        self._sfd_1x128 = next((o.name for o in self.epilogue.outputs
                                if o.quantize is not None and o.quantize.vec == 128), None)
        self._e5m2 = e5m2_rcp_max
        self._launcher: LoadedKernel | None = None
        # The host fast path: call pattern (ops/prepared.py ``pattern``) -> what its first full
        # validation proved (``Prepared``); a later call of the pattern checks its addresses only.
        self._memo: dict[Any, Prepared] = {}

    def _requested(self, axis: str, axes: Mapping[str, Any]) -> Any:
        """``axis``'s value as asked for (before the registry's ``runs_as``)."""
        if axis in axes:
            return axes[axis]
        from ..generator.variants import default_choice
        return default_choice(self.spec, self.arch).get(axis)

    # ---------------------------------------------------------------------------------
    @classmethod
    def planned(cls, spec: Any, **kw: Any) -> "Op":
        """The op on the first arch whose kernel builds this variant, for what does not depend on
        the arch (its epilogue's outputs): the faces size their outputs with it on any machine."""
        from ..base.archs import ARCHS
        last: Exception | None = None
        for arch in ARCHS:
            try:
                op = cls(spec, arch=arch, **kw)
                op.check_support()
                return op
            except UnsupportedError as exc:
                last = exc
        raise UnsupportedError(f"no arch builds this variant: {last}")

    def dims_of(self, shapes: Mapping[str, tuple[int, ...]]) -> tuple[int, int, int]:
        """(accumulator columns, output rows, experts) from the operands' shapes alone (row-major
        buffers: B (L, N, K), batched A (L, M, K) or (M, K))."""
        if self.kind == "kgrouped":
            l, m, n = shapes["padded_offsets"][0], shapes["dy_tensor"][1], shapes["x_tensor"][1]
            return (m, l * n, l) if self.d_major_m else (n, l * m, l)   # (an M-major D: (L * N, M) rows)
        if self.kind == "kscaled":
            l = shapes["padded_offsets"][0]
            return shapes["b_tensor"][0], l * shapes["a_tensor"][0], l
        if self.kind == "batched":
            a = shapes["a_tensor"]
            return shapes["b_tensor"][-2], (a[0] * a[1] if len(a) == 3 else a[0]), 1
        return shapes["b_tensor"][1], shapes["a_tensor"][0], shapes["padded_offsets"][0]

    def check_support(self) -> bool:
        """True when the arch's kernel implements this variant; UnsupportedError says why not."""
        from ..generator import registry
        registry.resolve(self.spec.kernel, self.arch, self.kernel_variant.choices)
        registry.check_rule(self.kernel_variant.choices, self.epilogue, self.spec.kernel)
        return True

    def compile(self, tail: bool = True) -> "Op":
        """Compile (or fetch from the cache) and load the kernel; returns self. A fake
        implementation's trace compiles nothing.

        Parameters
        ----------
        tail : bool
            Also load the tail-zeroing kernel that the grouped class's calls launch (and, with
            scattered outputs, the unnamed rows' kernels), so that a first call inside a
            CUDA-graph capture loads no module (False: a face that only executes into caller
            outputs, which launches none).
        """
        if self._launcher is None and not is_dry():
            self.check_support()
            self._launcher = LoadedKernel.build(self.kernel_variant, self.device)
            if self.tail_zeroed and tail:
                _tail.prepare(self.device, scattered=self.variant.d_scatter)
        return self

    @property
    def rcp_max(self) -> float:
        """SFD's 1 / max of the quantized output (0 when nothing is quantized)."""
        q = [o for o in self.epilogue.outputs if o.quantize is not None]
        if not q:
            return 0.0
        dt = q[0].dtype
        return E5M2_RCP_MAX[self._e5m2] if dt == "float8_e5m2" else RCP_MAX[dt]

    def widths(self, n: int) -> tuple[int, dict[str, int]]:
        """(element columns, columns of each output) for a GEMM of N = ``n``."""
        r = self.epilogue
        if r.paired_acc and n % 64:
            raise ArgumentError("b_tensor N", n, "a multiple of 64 (the accumulator holds 32-column gate/up "
                                                  "block pairs)")
        if r.paired_any and n % 32:
            # A partial block's role-1 columns would lie past the row of a paired input or output.
            raise ArgumentError("b_tensor N", n, "a multiple of 32 (the epilogue reads or writes 32-column "
                                                  "gate/up blocks)")
        return r.width(n), r.columns(n)

    # ---------------------------------------------------------------------------------
    def __call__(self, *operands: Any, inputs: Mapping[str, Any] | None = None, current_stream: Any = None,
                 input_names: Mapping[str, str] | None = None, validate_offsets: bool | None = None,
                 align: Mapping[str, int] | None = None, tail: bool = True, **operand_kw: Any) -> TupleDict:
        """Run and return every output the epilogue declares, by spec name (c, d, d_col, sfd_row,
        sfd_col, amax, dprob and the spec's own: the present ones; FP8/FP4 outputs as raw bytes,
        SF buffers physical (1x128 FP32 scales, ``sfd_vec_size=128``: the (M, ceil(N/128)) view
        with unit stride along M, the next blockwise GEMM's sfa_tensor), amax starting at -inf,
        dprob at 0).

        Parameters
        ----------
        *operands
            The kernel class's operands (module docstring): ``(a_tensor, padded_offsets,
            b_tensor)`` for BF16 grouped specs, ``(a_tensor, sfa_tensor, padded_offsets,
            b_tensor, sfb_tensor)`` block-scaled grouped, ``(a_tensor, b_tensor, sfa_tensor,
            sfb_tensor)`` batched, ``(dy_tensor, x_tensor, padded_offsets)`` K-grouped, ``(a_tensor,
            sfa_tensor, b_tensor, sfb_tensor, padded_offsets)`` FP8 K-grouped (A = dY^T (M, T), B = X^T
            (N, T), tokens contiguous, scales (M, T/128) and (N, T/128): ``quantize_wgrad``); by
            position or keyword, with ``b_ptrs`` / ``sfb_ptrs`` / ``n`` for discrete weights, and
            ``a_index`` for a BF16 grouped op built with ``a_gather=True`` (gathered A: int32
            (M,), problem row r reads row ``a_index[r]`` of a token-major ``a_tensor`` (T, K);
            an index outside [0, T) reads zeros; sm_90a; built with ``a_gather_store=True`` as
            well, the result also holds ``a_rows`` (M, K): the rows gathered, in problem order,
            for a later GEMM on the same rows, such as a weight gradient, without a permutation
            kernel; rows past the last offset and past the row ends are zero) or a block-scaled grouped op built with
            ``a_gather=True`` (the same for FP8 A, and row r's scales are those of A's row
            ``a_index[r]``: the blockwise recipe's ``sfa_tensor`` (T, ceil(K/128)), T-contiguous,
            on sm_90a; MXFP8 scale atoms of A's T rows, or the recipe's E8M0 (T, ceil(K/128)), on
            sm_100a),
            ``dy_index`` / ``x_index`` for a
            K-grouped op built with ``a_gather`` / ``b_gather`` (int32 (T,): token row t of dY / X
            is that row of ``dy_tensor`` / ``x_tensor``), ``d_index`` and ``d_rows`` for a BF16
            grouped op built with ``d_scatter=True`` (scattered outputs: int32 (M,), problem row r's
            C and D rows are written to row ``d_index[r]`` of (``d_rows``, N) outputs; an index
            outside [0, d_rows), the routing's -1 padding included, writes nothing; each output row
            named once at most, else which of its rows lands is unspecified; the rows no index
            names come back zero, or unwritten with ``tail=False``; sm_90a, element-wise
            epilogues). BF16 grouped and K-grouped ops also take
            ``row_ends`` (int32 (L,), optional): where each expert's tokens end inside its padded
            range (the rest is padding, zero rows). The sm_90a kernels with dense weights and no
            cluster skip the M tiles that start at or past it (their output rows come back zero;
            other kernels compute them from the zero rows) and the K-grouped k-blocks after it
            (the rows after the row end in the last k-block are read: padding must be zero).
        inputs : dict, optional
            The epilogue's inputs by spec name (``fusegemm show SPEC`` lists them): tensors, or
            Python numbers for scalar inputs.
        current_stream : stream, optional
            Where to launch (raw handle, torch.cuda.Stream, ...); default torch's current stream.
        input_names : dict, optional
            The caller's argument name of each input, for error messages (a preset's names).
        validate_offsets, align
            As :meth:`execute`.
        tail : bool
            Zero the grouped class's rows at or past the last offset (False: leave them unwritten,
            as seed 001's wrapper does; one launch less); scattered outputs: the rows no index
            names.
        """
        given = inputs or {}
        _copied: list = []     # (alive until the launch is issued)
        if self._host_prep:   # copies, converted scales: the call on those
            operands, operand_kw, _copied = host_operands(self, operands, operand_kw, current_stream)
        key, flat = (None, ()) if is_dry() else pattern(operands, operand_kw, given, None)
        e = self._memo.get(key) if key is not None else None
        if e is not None:   # a call pattern validated before: allocate, check addresses, launch
            done = self._call_memo(e, flat, current_stream, validate_offsets, tail)
            if done is not None:
                return done
        call = self._parse(operands, operand_kw)
        deferred: list = []
        values, keep = self._inputs(given, call, deferred, input_names, align)
        device = self._check_devices(call, deferred)
        rows_written = (self.tail_zeroed or self.k_grouped) and not is_dry()
        out = alloc_buffers(self._buffers(call), self._rows, device_str(call.a, device), rows_written=rows_written)
        if not is_dry():   # a fake implementation's trace: outputs allocated, nothing launched
            self.compile(tail=tail)
            e, ptrs = self._prepare(key, flat, operands, operand_kw, given, call, values, keep, deferred,
                                    {k: view(t, k) for k, t in out.items()}, rows_written, align=align)
            # The row-tiled classes (tail_zeroed) store rows below the last offset only: zero the
            # rest first. The K-grouped kernels store every row of every expert's block.
            self._run(e, ptrs, call.offsets.obj if call.offsets is not None else None, current_stream,
                      zero=out if self.tail_zeroed and tail else None, validate_offsets=validate_offsets)
        return self._shaped(call, out)

    def _call_memo(self, e: Any, flat: tuple, current_stream: Any, validate_offsets: bool | None = None,
                   tail: bool = True, shaped: bool = True) -> Any:
        """``__call__`` of a memoised pattern ``e`` on the arguments ``flat`` (``pattern``'s order):
        outputs allocated as the pattern's were, addresses checked, launched (``shaped`` False: the
        outputs as allocated, a dict). None (nothing done) where an address fails its alignment:
        the full path names what is wrong."""
        torch = sys.modules["torch"]   # a memoised pattern is one of torch tensors
        out = {name: (torch.empty(shape, dtype=dt, device=dev) if fill is None else
                      torch.full(shape, fill, dtype=dt, device=dev)) for name, shape, dt, dev, fill in e.alloc}
        ptrs = addresses(flat) + tuple([t.data_ptr() for t in out.values()])
        ready = e.bufs.get(ptrs)        # these addresses launched before (the allocator reuses them)
        if ready is None and not e.aligned(ptrs):
            return None
        self._run(e, ptrs, flat[e.offsets] if e.offsets is not None else None, current_stream,
                  zero=out if self.tail_zeroed and tail else None, validate_offsets=validate_offsets,
                  ready=ready)
        return self._shaped(e.call, out) if shaped else out

    def _shaped(self, call: Any, out: dict[str, Any]) -> TupleDict:
        if self.k_grouped:   # D_e blocks as (L, M, N); an M-major D's D_e^T as (L, N, M)
            outs = {o.name for o in self.epilogue.outputs}
            dims = (call.l, call.n, call.m_out) if self.d_major_m else (call.l, call.m_out, call.n)
            out = {k: (v.view(*dims) if k in outs else v) for k, v in out.items()}
        if self._sfd_1x128 is not None:
            # 1x128 FP32 scales (ceil(N/128), pitch) as the (M, ceil(N/128)) M-contiguous view the
            # blockwise recipe's next GEMM takes as sfa_tensor (formats.blockwise_sfa_layout's).
            m = out[self._sfd_1x128].shape[0]
            out = {**out, "sfd_row": out["sfd_row"][:, :m].t()}
        return TupleDict.of(**out)

    def execute(self, *operands: Any, outputs: Mapping[str, Any], inputs: Mapping[str, Any] | None = None,
                current_stream: Any = None, input_names: Mapping[str, str] | None = None,
                output_names: Mapping[str, str] | None = None, validate_offsets: bool | None = None,
                check: Callable[[], None] | None = None, align: Mapping[str, int] | None = None,
                **operand_kw: Any) -> None:
        """Run once into the caller's ``outputs`` (by spec name; every buffer the epilogue writes
        is required). Each is checked against the layout the kernel writes (shape, dtype, dense
        strides, device, no overlap with another output or an input); amax is reset to -inf and
        dprob to 0 on the launch stream. Rows at or past the last offset are left as they are
        (scattered outputs: the rows no index names).

        Parameters
        ----------
        *operands
            As :meth:`__call__`.
        outputs : dict
            The output buffers by spec name: C/D ``(M, N[, 1])`` (FP8 as their dtype or bytes), SF
            buffers physical or as the kernel-facing view, amax and dprob as the seeds shape them.
        inputs : dict, optional
            The epilogue's inputs by spec name.
        current_stream : stream, optional
            Where to launch; default torch's current stream.
        input_names, output_names : dict, optional
            The caller's argument name of each input and output, for error messages.
        validate_offsets : bool, optional
            Copy padded_offsets to the host and check them first (never during a CUDA-graph
            capture); default ``FUSEGEMM_VALIDATE_OFFSETS``.
        check : callable, optional
            A face's own validation (its messages, its stricter rules), run before the engine's
            whenever the call pattern is not memoised.
        align : dict, optional
            Alignments (bytes) stricter than the engine's for inputs, by spec name, checked on
            every call (a face's rules: seed 001's 16-byte bias).

        The grouped class writes C and D rows at the caller's row pitch (row-major, 16-byte
        pitch); the other classes write dense outputs.
        """
        names = output_names or {}
        given = inputs or {}
        _copied: list = []     # (alive until the launch is issued)
        if self._host_prep:
            operands, operand_kw, _copied = host_operands(self, operands, operand_kw, current_stream)
        key, flat = (None, ()) if is_dry() else pattern(operands, operand_kw, given, outputs)
        e = self._memo.get(key) if key is not None else None
        if e is not None and self._execute_memo(e, flat, current_stream, validate_offsets):
            return
        if check is not None:
            check()
        call = self._parse(operands, operand_kw)
        deferred: list = []
        values, keep = self._inputs(given, call, deferred, input_names, align)
        out = self.check_outputs(call, outputs, names)
        _check_overlap(out, names, call, [v for _, v, _ in deferred])
        self._check_devices(call, deferred + self._aligns(out, names))
        if is_dry():
            return
        self.compile()
        e, ptrs = self._prepare(key, flat, operands, operand_kw, given, call, values, keep, deferred, out, None,
                                outputs=outputs, align=align)
        self._run(e, ptrs, call.offsets.obj if call.offsets is not None else None, current_stream, reset=True,
                  validate_offsets=validate_offsets)

    def check_outputs(self, call: Any, outputs: Mapping[str, Any], names: Mapping[str, str],
                      required: bool = True) -> dict[str, Any]:
        """Each buffer the epilogue writes for ``call``, checked against the layout the kernel
        writes (shape, dtype, strides; ``required`` False: only those given), by spec name."""
        out: dict[str, Any] = {}
        rows = self._rows if self.kind == "grouped" else ()
        for name, (shape, store, _) in self._buffers(call).items():
            x, nm = outputs.get(name), names.get(name, f"outputs[{name!r}]")
            if x is not None or required:
                # (a_rows, a stored gathered A: dense rows, the load box's map)
                out[name] = (name in rows and name != A_ROWS and pitched(x, nm, shape, store)) or native_output(
                    x, nm, shape, store, m_major_view=name == "sfd_row" and self._sfd_1x128 is not None)
        return out

    def _aligns(self, out: Mapping[str, Any], names: Mapping[str, str]) -> list[tuple[str, Any, int]]:
        # C / D rows are written with 16-byte vector stores; scales and reductions by word.
        return [(names.get(k, f"outputs[{k!r}]"), v, 16 if k in self._rows else 4) for k, v in out.items()]

    # ---------------------------------------------------------------- operands, by kernel class
    def _parse(self, operands: tuple, kw: dict[str, Any]) -> Any:
        """The kernel class's operands, validated (shapes, strides, dtypes; devices: later)."""
        try:
            bound = _SIGNATURES[self.kind].bind(self, *operands, **kw)
        except TypeError as exc:
            params = [p.name for p in class_operands(self.kind)]
            raise ArgumentError("operands", f"{len(operands)} positional, keywords {sorted(kw)}",
                                f"the {self.kind} operands of {self.spec.name}: {', '.join(params)}",
                                str(exc)) from None
        return _PARSERS[self.kind](*bound.args, **bound.kwargs)

    def _operand_names(self) -> list[str]:
        """This class's operands in order (the parser's parameters after ``op``)."""
        return [p.name for p in class_operands(self.kind)]

    def _dims(self, call: Any) -> tuple[int, int, int]:
        """(accumulator columns, output rows, experts) of the buffers the epilogue writes."""
        if self.d_major_m:   # D_e^T: (L * N, M)
            return call.m_out, call.l * call.n, call.l
        if self.k_grouped:
            return call.n, call.l * call.m_out, call.l
        if self.kind == "batched":
            return call.n, call.l * call.m, 1
        return call.n, call.m, call.l

    def _out_rows(self, call: Any) -> int | None:
        """Rows of the row outputs where they are not the problem's: scattered outputs' ``d_rows``."""
        return call.d_rows if self.variant.d_scatter else None

    def _buffers(self, call: Any) -> dict[str, tuple[tuple[int, ...], str, float]]:
        """(shape, storage dtype, initial value) of every buffer the kernel writes for ``call``: the
        epilogue's, and the operand modes' (:meth:`_extra_buffers`)."""
        return {**self.epilogue.buffers(*self._dims(call), self._out_rows(call)), **self._extra_buffers(call)}

    def _extra_buffers(self, call: Any) -> dict[str, tuple[tuple[int, ...], str, float]]:
        """The outputs of operand modes, not of the epilogue: a stored gathered A's ``a_rows``
        (M, K), the rows in problem order (an index outside A: zeros)."""
        if not self.a_rows_out:
            return {}
        return {A_ROWS: ((call.m, call.k), "bfloat16", 0.0)}

    def _inputs(self, given: Mapping[str, Any], call: Any, deferred: list, names: Mapping[str, str] | None = None,
                align: Mapping[str, int] | None = None) -> tuple[dict[str, int], list[Any]]:
        """Validate the epilogue's inputs; their ABI slot values (and what must stay alive).

        Devices and addresses are collected into ``deferred`` as ``(name, view, alignment)``,
        checked with the operands' after every shape and dtype. ``names``: the caller's argument
        name of each input in messages (a preset's ``alpha_tensor``); default ``inputs['alpha']``.
        ``align``: alignments (bytes) stricter than the dtype's, by spec name."""
        r = self.epilogue
        w = self.widths(call.n)[0] if not self.k_grouped else call.n
        m = call.m
        self._known_inputs(given, names or {})
        values: dict[str, int] = {}
        keep: list[Any] = []
        for inp in r.inputs:
            x = given.get(inp.name)
            name = (names or {}).get(inp.name, f"inputs[{inp.name!r}]")
            if x is None:
                if inp.default is None:
                    article = "an" if inp.per[0] in "aeiou" else "a"
                    raise ArgumentError(name, None, f"{article} {inp.per} input ({inp.dtype}): the epilogue reads it")
                continue
            if inp.per == "scalar":
                if isinstance(x, (int, float)) and not isinstance(x, bool):
                    x = alloc((1,), "float32", self.device).fill_(float(x))
                v = args.vector(x, name, 1)
            elif inp.per == "expert":
                v = args.vector(x, name, call.l, what="(one value per expert)")
            elif inp.per == "row":
                v = args.vector(x, name, m, dtypes=(inp.dtype,), what="(one value per row)")
            elif inp.per == "column":
                v = args.bias(x, call.n, call.l, (inp.dtype,))
                if v.strides[0] != 1 or (call.l > 1 and v.strides[1] != call.n):
                    raise ArgumentError(f"{name}.stride", v.strides, f"(1, {call.n}): (N, L) with N contiguous")
            else:
                width = 2 * w if inp.paired else w
                v = args.output(x, name, m, width, (inp.dtype,), what=f"(M, {width}) or (M, {width}, 1)")
                if v.strides[1] != 1 and m:   # an empty C's strides are arbitrary and unused
                    raise ArgumentError(f"{name}.stride", v.strides, "row-major (stride 1 along columns)")
                values["ld_c_in"] = v.strides[0]
            if inp.per in ("row", "expert"):
                checks.unit_stride(v, name)
            deferred.append((name, v, max(2 if DTYPES[inp.dtype].itemsize == 2 else 4, (align or {}).get(inp.name, 0))))
            values[inp.slot] = v.ptr
            keep.append(x)
        return values, keep

    def _known_inputs(self, given: Mapping[str, Any], names: Mapping[str, str]) -> None:
        """Every name in ``given`` is an input the spec's epilogue declares, and none is one this
        variant built without (its dtype axis ``none``: silently dropping it would be wrong)."""
        extra = sorted(set(given) - {i.name for i in self.spec.epilogue.inputs})
        if extra:
            known = ", ".join(sorted(i.name for i in self.epilogue.inputs))
            raise ArgumentError(f"inputs[{extra[0]!r}]", "given", f"the epilogue's inputs: {known}")
        for i in self.spec.epilogue.inputs:
            x = given.get(i.name)
            if x is not None and self.variant.choices.get(i.dtype) == "none":
                name = names.get(i.name, f"inputs[{i.name!r}]")
                got = repr(x) if isinstance(x, (int, float)) else view(x, name).dtype
                raise ArgumentError(name, got, "None", f"this op was built with {i.dtype}=none (an input's presence "
                                    "and dtype are fixed when the op is built)")

    def _check_devices(self, call: Any, more: list[tuple[str, Any, int]]) -> int:
        """Every operand and ``more`` on a_tensor's CUDA device at an aligned address (after all
        shape and dtype checks); the device ordinal, which must be this op's."""
        if is_dry():
            return self.device
        named = [(nm, getattr(call, attr, None), align) for nm, attr, align in DEVICE_OPERANDS[self.kind]]
        first, lead = LEAD[self.kind]
        device = checks.require_cuda(call.a, first)
        checks.same_device([(nm, v) for nm, v, _ in named + list(more) if v is not None], call.a.device)
        checks.aligned(call.a, first, lead)
        for nm, v, align in named + list(more):
            if v is not None:
                checks.aligned(v, nm, align)
        if device != self.device:
            raise ArgumentError(f"{first}.device", f"cuda:{device}", f"cuda:{self.device} (the device this op "
                                "was built for)")
        return device

    # ---------------------------------------------------------------- reference
    def reference(self, *operands: Any, inputs: Mapping[str, Any] | None = None, **operand_kw: Any) -> Any:
        """The same call computed on the host by the numpy interpreter (fusegemm/interpret.py) from
        the correctly rounded FP32 accumulator (float64 products of the dequantized operands,
        rounded once). Returns the outputs by spec name as numpy arrays (K-grouped: (L * M, N)
        rows; with ``cd_major`` m, D's and its FP32 values' blocks transposed, (L * N, M)).

        Parameters
        ----------
        *operands
            As :meth:`__call__` (numpy or torch, on any device; dense weights), by position or
            keyword; ``a_index`` for an op built with ``a_gather=True`` (A's rows, and the
            blockwise recipe's scales, read through it as the kernel reads them; without it,
            ``a_tensor`` holds the problem's rows already gathered).
        inputs : dict, optional
            The epilogue's inputs by spec name (arrays, tensors or Python numbers).
        """
        from ..formats.numpy_dtypes import to_numpy
        from ..interpret import interpret
        self._known_inputs(inputs or {}, {})
        host = {k: (v if isinstance(v, (int, float)) else to_numpy(v)) for k, v in (inputs or {}).items()}
        names = positional_operands(self.kind)
        kw = dict(operand_kw)
        index = kw.pop("a_index", None) if self.kind in ("grouped", "scaled") else None
        if index is not None and not self.variant.a_gather:
            _index_matches(self, "a_index", index, "a_gather", "an int32 (M,) row index")
        bound = dict(zip(names, _bind(names, operands, kw)))
        if index is not None:
            mx = self.kind == "scaled" and self.variant.sf_vec_size in (16, 32) and not self.blockwise_mx
            bound = _gathered_rows(bound, index, self.variant.sf_vec_size if mx else None)
        acc, offsets, m_rows = _ACCUMULATE[self.kind](self, bound)
        out = interpret(self.epilogue, acc, offsets=offsets, m_rows=m_rows, inputs=host,
                        rcp_max=self.rcp_max or None, discrete_col_sfd=self.variant.discrete_col_sfd)
        if self.d_major_m:   # (check_rule: D is the one output)
            out = dataclasses.replace(out, d=_blocks_transposed(out.d, offsets.size),
                                      out_values={k: _blocks_transposed(v, offsets.size)
                                                  for k, v in out.out_values.items()})
        return out


def _blocks_transposed(x: Any, l: int) -> Any:
    """(L * M, N) rows, expert e's block at rows [e M, (e + 1) M), as each block's transpose
    stacked: (L * N, M)."""
    m = x.shape[0] // l
    return x.reshape(l, m, -1).transpose(0, 2, 1).reshape(-1, m)


def _gathered_rows(o: dict[str, Any], index: Any, mx_vec: int | None = None) -> dict[str, Any]:
    """``o`` with A (and a block-scaled op's SFA) replaced by the rows ``index`` reads: row r is row
    ``index[r]`` of the token-major operand, zeros (a zero scale byte) where the index is outside it.
    ``mx_vec``: SFA is MX scale atoms (per ``mx_vec`` K) of A's rows, gathered row by row and packed
    again for the problem's rows; else a row per token (the blockwise recipe's)."""
    from ..formats.blockwise import e8m0_to_float32
    from ..formats.numpy_dtypes import array_dtype_name, to_numpy
    from ..formats.scales import pack_sf, unpack_sf
    from ..reference._operands import rows_through
    idx = to_numpy(index)
    out = dict(o)
    for name in ("a_tensor", "sfa_tensor"):
        if o.get(name) is None:
            continue
        x = to_numpy(o[name])
        if name == "sfa_tensor" and mx_vec:
            t, k = to_numpy(o["a_tensor"]).shape   # (FP8: K bytes = K)
            logical = unpack_sf(x, t, -(-k // mx_vec))[:, :, 0]
            out[name] = pack_sf(rows_through(logical, idx))
            continue
        if name == "sfa_tensor" and array_dtype_name(x) in E8M0_NAMES:
            x = e8m0_to_float32(x)
        out[name] = rows_through(x, idx)
    return out


def _acc_grouped(op: Op, o: dict[str, Any]) -> tuple[Any, Any, int]:
    """(FP32 accumulator of every row below the last offset, offsets, rows of A)."""
    import numpy as np

    from ..formats.blockwise import e8m0_to_float32
    from ..formats.numpy_dtypes import array_dtype_name, to_numpy
    from ..reference._operands import parse_grouped
    if op.kind == "scaled" and (op.e8m0_scales or op.blockwise_mx):   # E8M0 blockwise scales: their values
        for k in ("sfa_tensor", "sfb_tensor"):
            x = to_numpy(o[k]) if o.get(k) is not None else None
            if x is not None and array_dtype_name(x) in E8M0_NAMES:
                o = {**o, k: e8m0_to_float32(x)}
    # (the MX kernel's expanded scales are these values: the blockwise products)
    vec = 128 if op.blockwise_mx else op.variant.sf_vec_size
    g = parse_grouped(a_tensor=o["a_tensor"], b_tensor=o["b_tensor"], b_list=None,
                      padded_offsets=o["padded_offsets"], m_aligned=args.M_ALIGNED, acc="float64",
                      sfa_tensor=o.get("sfa_tensor"), sfb_tensor=o.get("sfb_tensor"),
                      sf_vec_size=vec if op.kind == "scaled" else None)
    return g.accumulate(), g.offsets.astype(np.int64), g.m


def _acc_kgrouped(op: Op, o: dict[str, Any]) -> tuple[Any, Any, int]:
    """Each expert's dY_e^T X_e stacked as (L * M, N), expert e owning rows [e M, (e + 1) M)."""
    import numpy as np

    from ..formats.numpy_dtypes import to_numpy
    dy, x = (to_numpy(o[k]).astype(np.float64) for k in ("dy_tensor", "x_tensor"))
    return _per_expert_products(dy, x, o["padded_offsets"], "dy_tensor")


def _per_expert_products(dy: Any, x: Any, padded_offsets: Any, rows_of: str) -> tuple[Any, Any, int]:
    """The K-grouped classes' accumulator: token-major float64 ``dy`` (T, M) and ``x`` (T, N), each
    expert's dY_e^T X_e over its token rows rounded once to float32, stacked as (L * M, N) (expert e
    owning rows [e M, (e + 1) M)); with the interpreter's offsets and rows."""
    import numpy as np

    from ..formats.numpy_dtypes import to_numpy
    off = to_numpy(padded_offsets).astype(np.int64)
    args.offsets_values([int(v) for v in off], dy.shape[0], rows_of)
    l, m, n = off.size, dy.shape[1], x.shape[1]
    acc = np.zeros((l * m, n), dtype=np.float32)
    start = 0
    for e, end in enumerate(off):
        acc[e * m:(e + 1) * m] = (dy[start:end].T @ x[start:end]).astype(np.float32)
        start = int(end)
    return acc, np.arange(1, l + 1, dtype=np.int64) * m, l * m


def _acc_batched(op: Op, o: dict[str, Any]) -> tuple[Any, Any, int]:
    raise UnsupportedError("Op.reference: batched specs have the seed's reference, fusegemm.reference.gemm_amax")


def _acc_kscaled(op: Op, o: dict[str, Any]) -> tuple[Any, Any, int]:
    """Each expert's dequant(A)[:, T_e] @ dequant(B)[:, T_e]^T (A = dY^T, B = X^T, scaled per row
    and 128 tokens, or per 32 in MX atoms) stacked as (L * M, N)."""
    import numpy as np

    from ..formats.blockwise import dequantize_1x128, e8m0_to_float32
    from ..formats.elements import to_float32
    from ..formats.numpy_dtypes import array_dtype_name, to_numpy
    from ..formats.scales import unpack_sf

    def dequant(x: Any, sf: Any) -> Any:
        if op.variant.sf_vec_size == 128 or op.blockwise_mx:   # (E8M0 blockwise scales: their values)
            sf = to_numpy(sf)
            return dequantize_1x128(x, e8m0_to_float32(sf) if array_dtype_name(sf) in E8M0_NAMES else sf
                                    ).astype(np.float64)
        v = to_float32(to_numpy(x)).astype(np.float64)
        s = e8m0_to_float32(unpack_sf(sf, v.shape[0], -(-v.shape[1] // 32))[..., 0].view(np.uint8))
        return v * np.repeat(s.astype(np.float64), 32, axis=1)[:, :v.shape[1]]
    a = dequant(o["a_tensor"], o["sfa_tensor"])     # dY^T (M, T)
    b = dequant(o["b_tensor"], o["sfb_tensor"])     # X^T (N, T)
    return _per_expert_products(a.T, b.T, o["padded_offsets"], "a_tensor (token columns)")


_ACCUMULATE = {"grouped": _acc_grouped, "scaled": _acc_grouped, "kgrouped": _acc_kgrouped,
               "batched": _acc_batched, "kscaled": _acc_kscaled}


def _check_overlap(out: Mapping[str, Any], names: Mapping[str, str], call: Any, inputs: list) -> None:
    """No output overlaps another output, an operand or an input (names as the caller's)."""
    check_no_overlap([(names.get(k, f"outputs[{k!r}]"), v) for k, v in out.items()],
                     [call.a, getattr(call, "b", None), getattr(call, "sfa", None), getattr(call, "sfb", None),
                      call.offsets] + list(inputs))


def _bind(names: tuple[str, ...], operands: tuple, kw: Mapping[str, Any]) -> list[Any]:
    """``names``' values from positional ``operands`` then keywords (None where absent)."""
    vals = list(operands) + [None] * (len(names) - len(operands))
    if len(operands) > len(names):
        raise ArgumentError("operands", len(operands), f"at most {len(names)}: {', '.join(names)}")
    for i, nm in enumerate(names):
        if nm in kw:
            vals[i] = kw[nm]
    unknown = sorted(set(kw) - set(names))
    if unknown:
        raise ArgumentError(unknown[0], "given", ", ".join(names))
    return vals


# ---------------------------------------------------------------- operands of each kernel class
def _index_matches(op: Op, name: str, index: Any, axis: str, what: str) -> None:
    """A gathered operand's index is given exactly when the op was built with its ``axis``."""
    if (index is not None) != getattr(op.variant, axis):
        raise ArgumentError(name, "given" if index is not None else "None",
                            f"{what} for an op built with {axis}=True, else None")


def _parse_grouped(op: Op, a_tensor: Any, padded_offsets: Any, b_tensor: Any = None, *, b_ptrs: Any = None,
                   n: int | None = None, a_index: Any = None, d_index: Any = None, d_rows: int | None = None,
                   row_ends: Any = None) -> Any:
    b_major = op.variant.b_major
    _index_matches(op, "a_index", a_index, "a_gather", "an int32 (M,) row index")
    _index_matches(op, "d_index", d_index, "d_scatter", "an int32 (M,) output row index")
    call = parse_call(a_tensor, padded_offsets, None, b_tensor, b_ptrs, None, None,
                      ab_dtypes=("bfloat16",), bias_dtypes=(), n=n, alpha_required=False,
                      b_major=b_major, b_majors=(b_major,), devices=False, a_index=a_index)
    if (call.b_ptrs is not None) != (op.variant.weight_mode == "discrete"):
        raise ArgumentError("b_tensor/b_ptrs", "b_ptrs" if call.b_ptrs is not None else "b_tensor",
                            f"the {op.variant.weight_mode} weights this op was built for")
    if d_index is not None:
        call.d_index = checks.row_index(d_index, "d_index", "the problem's padded rows",
                                        equal=(call.m, "one output row per problem row: M"))
        if isinstance(d_rows, bool) or not isinstance(d_rows, int) or not 0 <= d_rows < 2 ** 31:
            raise ArgumentError("d_rows", repr(d_rows), "an int in [0, 2^31): rows of the scattered C and D "
                                                        "(d_index's entries outside [0, d_rows) store nothing)")
        call.d_rows = d_rows
    elif d_rows is not None:
        raise ArgumentError("d_rows", d_rows, "None (the outputs have the problem's M rows) for an op built "
                                              "without d_scatter=True")
    call.row_ends = checks.row_ends(row_ends, call.offsets.shape[0])
    return call


def _parse_kgrouped(op: Op, dy_tensor: Any, x_tensor: Any, padded_offsets: Any, *, dy_index: Any = None,
                    x_index: Any = None, row_ends: Any = None) -> KCall:
    _index_matches(op, "dy_index", dy_index, "a_gather", "an int32 (T,) token-row index")
    _index_matches(op, "x_index", x_index, "b_gather", "an int32 (T,) token-row index")
    call = parse_kgrouped(op.variant.tile_m, dy_tensor, x_tensor, padded_offsets, dy_index, x_index)
    call.row_ends = checks.row_ends(row_ends, call.l)
    return call


def _check_format(op: Op, call: Any) -> None:
    """Block-scaled operands are of the format this op was built for."""
    v = op.variant
    if ab_axis(call.ab) != v.ab_dtype:
        raise ArgumentError("a_tensor.dtype", call.ab, f"{v.ab_dtype} (the A/B format this op was built for)")
    if SF_AXIS[call.sf] != v.sf_dtype:
        raise ArgumentError("sfa_tensor.dtype", call.sf, f"{v.sf_dtype} scales (this op's sf_dtype)")
    if call.discrete != (getattr(v, "weight_mode", "dense") == "discrete"):
        raise ArgumentError("b_tensor/b_ptrs", "b_ptrs" if call.discrete else "b_tensor",
                            f"the {v.weight_mode} weights this op was built for")


def _parse_scaled(op: Op, a_tensor: Any, sfa_tensor: Any, padded_offsets: Any, b_tensor: Any = None,
                  sfb_tensor: Any = None, *, b_ptrs: Any = None, sfb_ptrs: Any = None, n: int | None = None,
                  a_index: Any = None) -> Any:
    _index_matches(op, "a_index", a_index, "a_gather", "an int32 (M,) row index")
    call = parse_scaled(a_tensor, sfa_tensor, padded_offsets, b_tensor, sfb_tensor, b_ptrs, sfb_ptrs, n,
                        op.variant.sf_vec_size, a_index)
    _check_format(op, call)
    return call


def _parse_batched(op: Op, a_tensor: Any, b_tensor: Any, sfa_tensor: Any, sfb_tensor: Any) -> Any:
    call = parse_batched(a_tensor, b_tensor, sfa_tensor, sfb_tensor, op.variant.sf_vec_size)
    _check_format(op, call)
    return call


def _parse_kscaled(op: Op, a_tensor: Any, sfa_tensor: Any, b_tensor: Any, sfb_tensor: Any, padded_offsets: Any,
                   *, row_ends: Any = None) -> KSCall:
    v = op.variant
    call = parse_kscaled(v.tile_m, a_tensor, sfa_tensor, b_tensor, sfb_tensor, padded_offsets, v.sf_vec_size)
    if call.ab != v.ab_dtype:
        raise ArgumentError("a_tensor.dtype", call.ab, f"{v.ab_dtype} (the A/B format this op was built for)")
    if call.sf != v.sf_dtype:
        raise ArgumentError("sfa_tensor.dtype", call.sfa.dtype, f"{v.sf_dtype} scales (this op's sf_dtype)")
    call.row_ends = checks.row_ends(row_ends, call.l)
    return call


_PARSERS = {"grouped": _parse_grouped, "kgrouped": _parse_kgrouped, "scaled": _parse_scaled,
            "batched": _parse_batched, "kscaled": _parse_kscaled}
# The one statement of each class's operands: its parser's parameters after ``op`` (positional
# ones are the operands every face passes; keyword-only ones are discrete weights' pointers).
_SIGNATURES = {kind: inspect.signature(parse) for kind, parse in _PARSERS.items()}


def class_operands(kind: str) -> tuple[inspect.Parameter, ...]:
    """The operands of kernel class ``kind``, in order (name, default, positional or keyword)."""
    return tuple(_SIGNATURES[kind].parameters.values())[1:]


def positional_operands(kind: str) -> tuple[str, ...]:
    """The names of ``kind``'s operands a face passes by position (no discrete-weight pointers)."""
    return tuple(p.name for p in class_operands(kind) if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD)
