"""A grouped BF16 GEMM whose epilogue is any spec's: ``EpilogueGemm(spec, ...)``.

For a spec of kernel family ``grouped_gemm`` (specs/grouped_gemm.yaml, a user spec such as
specs/grouped_gemm_swiglu.yaml, or one loaded from any path), the op runs the family's kernel with
the rule generated from the spec's epilogue, takes the epilogue's inputs by their spec names and
returns every output the epilogue declares. ``reference(...)`` computes the same outputs with
the numpy interpreter (fusegemm/interpret.py): a user-authored epilogue gets a reference for
free.

    op = EpilogueGemm("grouped_gemm_swiglu", d_dtype="float8_e4m3fn")
    out = op(a, padded_offsets, b, inputs={"alpha": alpha, "prob": prob, "norm_const": 0.01})
    out["d"], out["sfd_row"]
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from .. import arguments as args
from ..base.dtypes import DTYPES
from ..base.errors import ArgumentError, UnsupportedError
from ..tupledict import TupleDict
from . import checks
from . import device as _device
from .device import alloc, alloc_outputs
from .grouped_operands import parse_call, shape_of
from .launcher import GroupedLauncher
from .prepared import is_dry
from .tail import prepare as prepare_tail, zero_tail

FAMILY = "grouped_gemm"
# SFD: 1 / the largest value of the quantized output (e5m2: the seed page's 1/57344, or NVIDIA's
# kernels' 1/128 with e5m2_rcp_max="nvidia").
RCP_MAX = {"float8_e4m3fn": 1.0 / 448.0, "float4_e2m1fn_x2": 1.0 / 6.0}
E5M2_RCP_MAX = {"page": 1.0 / 57344.0, "nvidia": 1.0 / 128.0}


class SpecGemm:
    """What every spec-driven op shares: the spec, its variant on an arch, the resolved epilogue
    and the epilogue's inputs by spec name. Subclasses set ``FAMILIES`` and run the kernel."""

    FAMILIES: tuple[str, ...] = ()
    WHAT = ""

    def __init__(self, spec: Any, *, arch: str | None = None, device: int = 0,
                 e5m2_rcp_max: str = "page", **axes: Any) -> None:
        from ..generator.spec import Spec, find_spec
        from ..generator.variants import make_variant
        self.spec = spec if isinstance(spec, Spec) else find_spec(str(spec) if isinstance(spec, Path) else spec)
        if self.spec.kernel not in self.FAMILIES:
            raise UnsupportedError(f"spec {self.spec.name}: kernel family {self.spec.kernel!r}; "
                                   f"{type(self).__name__} runs {', '.join(map(repr, self.FAMILIES))} ({self.WHAT})")
        args.choice(e5m2_rcp_max, "e5m2_rcp_max", tuple(E5M2_RCP_MAX))
        self.device = device
        self.arch = arch or _device.device_arch(device)
        self.variant = make_variant(self.spec, arch=self.arch, **axes)
        self.epilogue = self.spec.epilogue.resolve(self.variant.choices)
        self._e5m2 = e5m2_rcp_max
        self._launcher: GroupedLauncher | None = None

    # ---------------------------------------------------------------------------------
    def check_support(self) -> bool:
        """True when the arch's kernel implements this variant; UnsupportedError says why not."""
        from ..generator import registry
        registry.resolve(self.spec.kernel, self.arch, self.variant.choices)
        return True

    def compile(self) -> "SpecGemm":
        """Compile (or fetch from the cache) and load the kernel; returns self."""
        if self._launcher is None and not is_dry():   # a fake implementation's trace needs no kernel
            self.check_support()
            self._launcher = GroupedLauncher.build(self.variant, self.device)
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

    def _inputs(self, given: Mapping[str, Any], call: Any, w: int, deferred: list | None = None,
                names: Mapping[str, str] | None = None) -> tuple[dict[str, int], list[Any]]:
        """Validate the epilogue's inputs; their ABI slot values (and what must stay alive).

        ``deferred``: collect ``(name, view, alignment)`` there instead of checking devices and
        addresses now (callers that check every device last, after all shapes and dtypes).
        ``names``: the caller's argument name of each input in messages (a seed wrapper's
        ``alpha_tensor``); default ``inputs['alpha']``."""
        r = self.epilogue
        known = {i.name for i in r.inputs}
        extra = sorted(set(given) - {i.name for i in self.spec.epilogue.inputs})
        if extra:
            raise ArgumentError(f"inputs[{extra[0]!r}]", "given", f"the epilogue's inputs: {', '.join(sorted(known))}")
        values: dict[str, int] = {}
        keep: list[Any] = []
        for inp in r.inputs:
            x = given.get(inp.name)
            name = (names or {}).get(inp.name, f"inputs[{inp.name!r}]")
            if x is None:
                if inp.default is None:
                    raise ArgumentError(name, None, f"a {inp.per} input ({inp.dtype}): the epilogue reads it")
                continue
            if inp.per == "scalar":
                if isinstance(x, (int, float)) and not isinstance(x, bool):
                    x = alloc((1,), "float32", self.device).fill_(float(x))
                v = args.vector(x, name, 1)
            elif inp.per == "expert":
                v = args.vector(x, name, call.l, what="(one value per expert)")
            elif inp.per == "row":
                v = args.vector(x, name, call.m, dtypes=(inp.dtype,), what="(one value per row)")
            elif inp.per == "column":
                v = args.bias(x, call.n, call.l, (inp.dtype,))
                if v.strides[0] != 1 or (call.l > 1 and v.strides[1] != call.n):
                    raise ArgumentError(f"{name}.stride", v.strides, f"(1, {call.n}): (N, L) with N contiguous")
            else:
                width = 2 * w if inp.paired else w
                v = args.output(x, name, call.m, width, (inp.dtype,), what=f"(M, {width}) or (M, {width}, 1)")
                if v.strides[1] != 1 and call.m:   # an empty C's strides are arbitrary and unused
                    raise ArgumentError(f"{name}.stride", v.strides, "row-major (stride 1 along columns)")
                values["ld_c_in"] = v.strides[0]
            if inp.per in ("row", "expert"):
                checks.unit_stride(v, name)
            align = 2 if DTYPES[inp.dtype].itemsize == 2 else 4
            if deferred is None:
                checks.same_device([(name, v)], call.a.device)
                checks.aligned(v, name, align)
            else:
                deferred.append((name, v, align))
            values[inp.slot] = v.ptr
            keep.append(x)
        return values, keep


class EpilogueGemm(SpecGemm):
    """Compiled grouped BF16 GEMM with a spec's epilogue, for one variant.

    Parameters
    ----------
    spec : Spec, spec name or path to a YAML file
        A spec of kernel family ``grouped_gemm``.
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

    FAMILIES = (FAMILY,)
    WHAT = "BF16 A/B"

    def compile(self) -> "EpilogueGemm":
        """Compile (or fetch from the cache) and load the kernel, and the tail-zeroing kernel
        its calls launch (fusegemm/ops/tail.py: loaded here, so that a first call inside a
        CUDA-graph capture loads no module); returns self."""
        fresh = self._launcher is None
        super().compile()
        if fresh and self._launcher is not None:
            prepare_tail(self.device)
        return self

    # ---------------------------------------------------------------------------------
    def __call__(self, a_tensor: Any, padded_offsets: Any, b_tensor: Any = None, *, b_ptrs: Any = None,
                 n: int | None = None, inputs: Mapping[str, Any] | None = None,
                 current_stream: Any = None) -> TupleDict:
        """Run on ``a_tensor`` (M, K[, 1]) bf16, ``padded_offsets`` (L,) int32, dense ``b_tensor``
        ((N, K, L) or (L, N, K)) or discrete ``b_ptrs`` with ``n``, and the epilogue's ``inputs``
        by spec name. Returns the outputs the epilogue declares: c, d, d_col, sfd_row, sfd_col,
        amax, dprob (present ones only; amax starts at -inf, dprob at 0).

        Parameters
        ----------
        a_tensor : (M, K) or (M, K, 1) bfloat16
            Tokens grouped by expert, K-major, M a multiple of 256.
        padded_offsets : (L,) int32
            Each expert's end row: nondecreasing multiples of 256.
        b_tensor : (L, N, K) or its (N, K, L) view, bfloat16, optional
            Dense weights, K-major; with ``b_major="n"`` N-major: the view ``w.transpose(1, 2)`` of (L, K, N) weights.
        inputs : dict, optional
            The epilogue's inputs by spec name (``fusegemm show SPEC`` lists them): tensors, or Python numbers for scalar inputs.
        b_ptrs : (L,) int64 tensor, optional
            Discrete weights: device addresses of each expert's (N, K) weights; needs ``n``.
        n : int, optional
            N of discrete weights.
        current_stream : stream, optional
            Where to launch (raw handle, torch.cuda.Stream, ...); default torch's current stream.
        """
        from ..runtime.load import thread_context
        from ..runtime.tensors import resolve_stream
        self.compile()
        call = parse_call(a_tensor, padded_offsets, None, b_tensor, b_ptrs, None, None,
                          ab_dtypes=("bfloat16",), bias_dtypes=(), n=n, alpha_required=False,
                          b_major=self.variant.b_major, b_majors=(self.variant.b_major,))
        if (call.b_ptrs is not None) != (self.variant.weight_mode == "discrete"):
            raise ArgumentError("b_tensor/b_ptrs", "b_ptrs" if call.b_ptrs is not None else "b_tensor",
                                f"the {self.variant.weight_mode} weights this op was built for")
        dev = call.a.device[1]
        w = self.widths(call.n)[0]          # checks N against the pairing
        values, keep = self._inputs(inputs or {}, call, w)
        if is_dry():   # a fake implementation's trace: outputs allocated, no launch
            return TupleDict(**alloc_outputs(self.epilogue, call.n, call.m, call.l, f"cuda:{dev}"))
        # Row outputs uninitialised: the kernel stores every row below the last offset and
        # zero_tail (before the launch) the rest.
        out = alloc_outputs(self.epilogue, call.n, call.m, call.l, f"cuda:{dev}", rows_written=True)
        thread_context(self.device)
        ln = self._launcher
        s = shape_of(call)
        stream = resolve_stream(current_stream, self.device)
        if s.m < self.variant.tile_m:
            # No row tile: M is a multiple of 256 (parse_call), so M = 0 and the row outputs
            # have no rows to zero; nothing to map or launch.
            return TupleDict(**out)
        grid = ln.grid(s)
        values.update(ln.maps(s, call.a.ptr, call.b.ptr if call.b is not None else 0))
        values.update(ln.scalars(s))
        values.update({"offsets": call.offsets.ptr, "b_ptrs": call.b_ptrs.ptr if call.b_ptrs else 0,
                       "rcp_max": self.rcp_max})
        values.update(self.epilogue.buffer_params({name: t.data_ptr() for name, t in out.items()}, call.n))
        values.update(ln.workspace(grid, s.discrete, stream, current_stream is not None))
        zero_tail([out[name] for name in self.epilogue.row_buffers() if name in out], call.offsets.ptr,
                  call.l, call.m, stream, self.device)
        ln.launch(values, grid, stream)
        del keep
        return TupleDict(**out)

    # ---------------------------------------------------------------------------------
    def reference(self, a_tensor: Any, padded_offsets: Any, b_tensor: Any, *,
                  inputs: Mapping[str, Any] | None = None) -> Any:
        """The same call computed on the host by the numpy interpreter (dense B), from the
        FP32 accumulation of A and B (float64 products, rounded to FP32).

        Parameters
        ----------
        a_tensor : (M, K) or (M, K, 1) bfloat16 (numpy or torch, on any device)
            Tokens grouped by expert, K-major, M a multiple of 256.
        padded_offsets : (L,) int32
            Each expert's end row: nondecreasing multiples of 256.
        inputs : dict, optional
            The epilogue's inputs by spec name (``fusegemm show SPEC`` lists them): tensors, or Python numbers for scalar inputs.
        b_tensor : (L, N, K) or its (N, K, L) view, bfloat16
            Dense weights.
        """
        import numpy as np

        from ..formats.dtypes import to_numpy
        from ..interpret import interpret
        a = to_numpy(a_tensor).astype(np.float64)
        a = a.reshape(a.shape[0], -1)
        off = to_numpy(padded_offsets).astype(np.int64)
        b = to_numpy(b_tensor).astype(np.float64)
        db = args.dense_b(b_tensor, a.shape[1], off.size, ("bfloat16",))
        b_lnk = np.transpose(b, (2, 0, 1)) if not db.canonical else b
        acc = np.zeros((int(off[-1]), b_lnk.shape[1]), dtype=np.float32)
        start = 0
        for e, end in enumerate(off):
            acc[start:end] = (a[start:end] @ b_lnk[e].T).astype(np.float32)
            start = int(end)
        host = {k: (v if isinstance(v, (int, float)) else to_numpy(v)) for k, v in (inputs or {}).items()}
        return interpret(self.epilogue, acc, offsets=off, m_rows=a.shape[0], inputs=host,
                         rcp_max=self.rcp_max or None)
