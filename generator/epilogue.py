"""The epilogue language: a spec's ``epilogue:`` section, type-checked into an :class:`Epilogue`.

A spec states its epilogue as per-element FP32 statements over named values::

    epilogue:
      inputs:                                   # what the kernel reads besides the accumulator
        alpha: {per: expert}                    # one float32 per expert
        prob: {per: row, default: 1.0}          # per row; a null pointer means 1.0
        bias: {per: column, dtype: bias_dtype}  # per column of each expert; absent when bias_dtype is none
        c: {per: element, dtype: c_dtype, paired: true}   # a loaded tensor (32-column gate/up blocks)
        norm_const: {per: scalar}               # one float32 for the call
      pairing: {block: 32, roles: [gate, up], acc: false}  # GLU: 32-column blocks alternate roles
      compute:
        - g = alpha * acc
        - c = where(present(bias), g + prob * bias, g)
      outputs:
        c: {dtype: c_dtype, when: generate_c}
        d: {dtype: d_dtype, value: c, quantize: {col: d_col, norm_const: norm_const, convention: quant}}
      reductions:
        - {name: amax, kind: amax, of: d, scope: expert, when: {d_dtype: [bfloat16, float16]}}

Names: ``acc`` (the FP32 accumulator; ``acc.gate``/``acc.up`` when ``pairing.acc``), the inputs
(``x.gate``/``x.up`` for paired ones, and for column inputs of a paired accumulator), the
constant axes the spec's choices offer (``tanh_clamp_scale``), and earlier statements' targets.
``present(x)`` is a compile-time condition (an input whose dtype axis is ``none``, a constant
axis that is ``none``); ``where(present(x), a, b)`` keeps only the branch that applies, so an
absent input may be named only under its ``present()``. Values are FP32; comparisons and
``isnan()`` give conditions, usable only as ``where``'s first argument. Functions:
generator/functions.py.

Inputs, outputs and reductions map onto the fixed kernel ABI (generator/params.py): per kind a
fixed number of slots, filled in declaration order; outputs are named ``c`` and ``d`` (``d``
may have a column-quantized copy, ``d_col``); reductions are named ``amax``, ``dprob`` and
``dbias``. A reduction's ``of:`` names a computed value; a column sum (dbias) may instead name a
paired output, and then sums its columns as stored (gate and up blocks interleaved, twice the
element width).
Every mistake is a SpecError at the file and line of the offending key, before any C++ exists.
:meth:`Epilogue.resolve` fixes a variant's dtypes and presence and returns what the C++ emitter
(generator/emit.py) and the numpy interpreter (fusegemm/interpret.py) consume.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from .axes import AXES
from .expr import (BinOp, Call, Expr, ExprError, Neg, Num, Ref, Statement, check_constants, fp32, parse_statement,
                   walk)
from .functions import BOOL_FUNCTIONS, FUNCTIONS
from .yamlload import plain

PER = ("scalar", "expert", "row", "column", "element")
# Axes only an epilogue reads: a spec that offers several values of one must use it, or the
# choice would change nothing (generator/spec.py refuses it).
EPILOGUE_AXES = ("c_dtype", "d_dtype", "bias_dtype", "prob_dtype", "generate_c", "generate_dbias", "tanh_clamp_scale",
                 "discrete_col_sfd",
                 "vector_f32")
# ABI slots per input kind, filled in declaration order (generator/params.py fields).
SLOTS: dict[str, tuple[str, ...]] = {
    "scalar": ("norm_const", "scalar_in1"), "expert": ("alpha", "beta", "expert_in2"),
    "row": ("prob", "row_scale", "row_in2", "row_in3"), "column": ("bias", "col_in1"), "element": ("c_in",),
}
OUTPUT_SLOTS = ("c", "d")
# The kernel ABI field (generator/params.py) of every buffer an epilogue writes (Resolved.buffers).
BUFFER_FIELDS = {"c": "c_out", "d": "d_out", "d_col": "d_col_out", "sfd_row": "sfd_row",
                 "sfd_col": "sfd_col", "amax": "amax", "dprob": "dprob", "dbias": "dbias"}
REDUCTION_SLOTS = {"amax": "amax", "dprob": "sum", "dbias": "sum"}
# The scopes each reduction buffer takes: dprob sums each row, dbias each expert's column.
REDUCTION_SCOPES = {"amax": ("expert", "global"), "dprob": ("row",), "dbias": ("column",)}
INPUT_DTYPES = ("float32", "bfloat16", "float16")
ELEMENT_DTYPES = INPUT_DTYPES + ("float8_e4m3fn", "float8_e5m2")   # loaded tensors may be FP8 (unscaled)
OUTPUT_DTYPES = ("float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "float4_e2m1fn_x2")
QUANTIZED = ("float8_e4m3fn", "float8_e5m2", "float4_e2m1fn_x2")
CONVENTIONS = ("quant", "srelu", "dswiglu")   # SFD operation orders (fusegemm.reference._epilogue)
QUANTIZE_VECS = (32, 128)   # columns per SFD_row block: MX (E8M0) or the blockwise recipe's 1x128 (FP32)
MAX_STATEMENTS = 64
MAX_OPTIONAL = 6                                # optional-by-axis names: 2**6 presence combinations
RESERVED = frozenset({"acc", "where", "present"})


class Fail:
    """Error factory bound to the spec file (generator/spec.py's _Ctx satisfies it)."""

    fail: Callable[..., Exception]


@dataclass(frozen=True)
class Condition:
    """All of ``(axis, allowed values)`` hold (the constraint ``if`` syntax); empty: always."""

    terms: tuple[tuple[str, tuple[Any, ...]], ...] = ()

    def holds(self, choice: dict[str, Any]) -> bool:
        return all(choice.get(a) in vals for a, vals in self.terms)


@dataclass(frozen=True)
class Input:
    name: str
    per: str
    dtype: str               # a dtype name or a dtype axis (absent when the axis is "none")
    default: float | None    # run-time optional: the value when the pointer is null
    paired: bool             # element inputs: 32-column gate/up blocks, width 2x the element space
    slot: str                # the ABI field it is read from


@dataclass(frozen=True)
class Pairing:
    block: int
    roles: tuple[str, str]
    acc: bool                # the accumulator itself is paired (GLU forward): outputs are half as wide


@dataclass(frozen=True)
class Quantize:
    row: bool                # SFD_row: 32-column blocks along each row
    col: str | None          # the column-quantized copy's name (d_col): 32-row blocks
    convention: str          # SFD operation order (CONVENTIONS)
    norm_const: str          # the scalar input scaling the output
    # Columns per row block: 32 (MX: an E8M0 scale each) or 128 (the blockwise recipe's 1x128: an
    # FP32 scale each, rows only), or the axis that chooses (sfd_vec_size; resolve() fixes it).
    vec: int | str = 32
    # 1x128 scales rounded up to powers of two (UE8M0), or the axis that chooses (sfd_pow2).
    pow2: bool | str = False


@dataclass(frozen=True)
class Output:
    name: str                          # the spec's name (the ops return the tensor by it)
    dtype: str                         # dtype name or dtype axis
    value: str | None                  # the computed value it stores (unpaired)
    paired: tuple[str, str] | None     # (gate value, up value): written to alternate 32-col blocks
    when: Condition
    quantize: Quantize | None          # applies when the dtype is FP8/FP4
    slot: str = ""                     # ABI slot: c or d (OUTPUT_SLOTS)


@dataclass(frozen=True)
class Reduction:
    name: str          # ABI slot: amax | dprob | dbias
    kind: str          # amax | sum
    of: str            # a computed value, or (a column sum) a paired output
    scope: str         # expert | global | row | column
    slot: int          # index inside (L, S, 1) for several amax per expert
    when: Condition
    # When ``of`` names a paired output: its (first role, second role) values. The column sum then
    # covers the output's interleaved columns, 2x the element width (fusegemm::epi::paired_col).
    paired: tuple[str, str] | None = None

    @property
    def values(self) -> tuple[str, ...]:
        """The computed values it reads."""
        return self.paired if self.paired is not None else (self.of,)


@dataclass(frozen=True)
class Epilogue:
    """A type-checked epilogue (the spec's declaration, for every variant)."""

    inputs: tuple[Input, ...]
    pairing: Pairing | None
    statements: tuple[Statement, ...]
    outputs: tuple[Output, ...]
    reductions: tuple[Reduction, ...]
    constants: tuple[str, ...]          # constant axes the statements may name

    def axes_read(self) -> set[str]:
        """The variant axes this epilogue depends on: dtype axes of inputs and outputs, axes in
        when: conditions, constant axes its statements name, discrete_col_sfd when it
        column-quantizes."""
        out = {i.dtype for i in self.inputs if i.dtype in AXES} | {o.dtype for o in self.outputs if o.dtype in AXES}
        for cond in [o.when for o in self.outputs] + [r.when for r in self.reductions]:
            out |= {a for a, _ in cond.terms}
        out |= {n.name for st in self.statements for n in walk(st.expr)
                if isinstance(n, Ref) and n.name in self.constants}
        if any(o.quantize is not None and o.quantize.col for o in self.outputs):
            out.add("discrete_col_sfd")
        out |= {v for o in self.outputs if o.quantize is not None
                for v in (o.quantize.vec, o.quantize.pow2) if isinstance(v, str)}
        return out

    def resolve(self, choice: dict[str, Any]) -> "Resolved":
        """The epilogue of one variant: dtypes fixed, absent inputs and outputs dropped,
        ``present()`` folded, statements nothing reads dropped."""
        absent = {i.name for i in self.inputs if _absent_dtype(i.dtype, choice)}
        absent |= {c for c in self.constants if choice.get(c) in (None, "none")}
        inputs = tuple(_ResolvedInput(i, _dtype(i.dtype, choice)) for i in self.inputs if i.name not in absent)
        consts = {c: float(choice[c]) for c in self.constants if c not in absent}
        folded = tuple(Statement(s.target, fold(s.expr, absent), s.text) for s in self.statements)
        outputs = []
        for o in self.outputs:
            if not o.when.holds(choice):
                continue
            dt = _dtype(o.dtype, choice)
            q = _chosen(o.quantize, choice) if (o.quantize is not None and dt in QUANTIZED) else None
            outputs.append(ResolvedOutput(o.name, dt, o.value, o.paired, q, o.slot))
        reds = tuple(r for r in self.reductions if r.when.holds(choice))
        needed = {v for o in outputs for v in ((o.value,) if o.value else o.paired)}
        needed |= {v for r in reds for v in r.values}
        live = []
        for s in reversed(folded):          # keep what an output or reduction reads, transitively
            if s.target in needed:
                live.append(s)
                needed |= {n.name for n in walk(s.expr) if isinstance(n, Ref)}
        live.reverse()
        used = {n.name for st in live for n in walk(st.expr) if isinstance(n, Ref)}
        used |= {o.quantize.norm_const for o in outputs if o.quantize is not None}
        # The SFD_row block the variant chooses (kSfdVec), also where its output is not quantized
        # (a bf16 D): the axis reaches the source of every variant that reads it.
        first = next((_chosen(o.quantize, choice) for o in self.outputs if o.quantize is not None), None)
        return Resolved(inputs=tuple(i for i in inputs if i.name in used),
                        constants={c: v for c, v in consts.items() if c in used}, pairing=self.pairing,
                        statements=tuple(live), outputs=tuple(outputs), reductions=reds,
                        sfd_vec=first.vec if first else 32, sfd_pow2=bool(first and first.pow2))


def _chosen(q: Quantize, choice: dict[str, Any]) -> Quantize:
    """``q`` with the axes it names (vec: sfd_vec_size, pow2: sfd_pow2) fixed by ``choice``."""
    return replace(q, vec=int(choice[q.vec]) if isinstance(q.vec, str) else q.vec,
                   pow2=bool(choice[q.pow2]) if isinstance(q.pow2, str) else q.pow2)


@dataclass(frozen=True)
class _ResolvedInput:
    decl: Input
    dtype: str

    @property
    def name(self) -> str:
        return self.decl.name

    def __getattr__(self, item: str) -> Any:   # per, default, paired, slot
        return getattr(self.decl, item)


@dataclass(frozen=True)
class ResolvedOutput:
    name: str
    dtype: str
    value: str | None
    paired: tuple[str, str] | None
    quantize: Quantize | None
    slot: str = ""                     # ABI slot: c or d


@dataclass(frozen=True)
class Resolved:
    """One variant's epilogue, as the emitter and the interpreter consume it."""

    inputs: tuple[_ResolvedInput, ...]
    constants: dict[str, float]
    pairing: Pairing | None
    statements: tuple[Statement, ...]
    outputs: tuple[ResolvedOutput, ...]
    reductions: tuple[Reduction, ...]
    sfd_vec: int = 32                  # the SFD_row block a quantized output would use (32 or 128)
    sfd_pow2: bool = False             # ... and whether its 1x128 scales are powers of two
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def input(self, name: str) -> _ResolvedInput | None:
        return next((i for i in self.inputs if i.name == name), None)

    def output(self, name: str) -> ResolvedOutput | None:
        return next((o for o in self.outputs if o.name == name), None)

    def in_slot(self, slot: str) -> ResolvedOutput | None:
        """The output the kernel writes through ABI slot ``slot`` (c or d), if any."""
        return next((o for o in self.outputs if o.slot == slot), None)

    @property
    def paired_acc(self) -> bool:
        return self.pairing is not None and self.pairing.acc

    @property
    def paired_any(self) -> bool:
        """Whether anything is read or written in gate/up 32-column blocks (the accumulator, an
        element input or an output): then the element width must be whole blocks."""
        return (self.paired_acc or any(i.per == "element" and i.paired for i in self.inputs)
                or any(o.paired is not None for o in self.outputs))

    @property
    def elementwise(self) -> bool:
        """Whether every output value is a function of its own accumulator value and inputs: no
        gate/up pairing, quantization or reduction, and outputs of 16 bits or more (the sm_90a
        kernels' fragment path, ``Rule::kElementwise``)."""
        from ..base.dtypes import dtype as dtype_entry
        return (not self.paired_acc and not self.reductions
                and all(o.paired is None and o.quantize is None and dtype_entry(o.dtype).bits >= 16
                        for o in self.outputs))

    def width(self, n_acc: int) -> int:
        """Element columns of a GEMM with ``n_acc`` accumulator columns."""
        return n_acc // 2 if self.paired_acc else n_acc

    def columns(self, n_acc: int) -> dict[str, int]:
        """Columns of each output (c, d) of a GEMM with ``n_acc`` accumulator columns: the
        element width, twice that for a paired output."""
        w = self.width(n_acc)
        return {o.name: 2 * w if o.paired else w for o in self.outputs}

    def buffer_params(self, ptrs: dict[str, int], n_acc: int) -> dict[str, int]:
        """Kernel ABI values of the output buffers: each buffer's pointer under its field
        (BUFFER_FIELDS) and the row pitches ``ldc`` / ``ldd`` (0 where there is no output)."""
        cols = self.columns(n_acc)
        slots = {o.name: o.slot for o in self.outputs}
        out = {BUFFER_FIELDS[slots.get(name, name)]: ptr for name, ptr in ptrs.items()}
        for slot in OUTPUT_SLOTS:
            o = self.in_slot(slot)
            out[f"ld{slot}"] = cols[o.name] if o is not None else 0
        return out

    def row_buffers(self) -> tuple[str, ...]:
        """The buffers of :meth:`buffers` with one row per problem row, (m_rows, columns)
        row-major: the outputs and their column-quantized copies (a kernel stores each of their
        rows below valid_m whole; the ops zero the rest, fusegemm/ops/tail.py)."""
        names = [o.name for o in self.outputs]
        names += [o.quantize.col for o in self.outputs if o.quantize is not None and o.quantize.col]
        return tuple(names)

    def buffers(self, n_acc: int, m_rows: int, experts: int, out_rows: int | None = None
                ) -> dict[str, tuple[tuple[int, ...], str, float]]:
        """(shape, storage dtype, initial value) of every buffer the epilogue writes, by name:
        the outputs by their spec names (c, d, ...), d_col, sfd_row, sfd_col, amax, dprob, dbias
        ((L, W) float32, (L, 2W) for a paired output's column sums). FP8/FP4 outputs are raw bytes
        (uint8; packed FP4: two per byte); SF buffers are the physical atom layout of
        formats/scales.py (1, ceil(mn/128), ceil(k/4), 32, 4, 4), or for 1x128 scales (quantize.vec
        128) float32 (ceil(cols/128), pitch), pitch the rows rounded up to 4; amax starts at -inf.
        ``out_rows``: rows of the outputs where they are not the problem's (scattered outputs,
        ``d_scatter``: ``d_rows``)."""
        from ..base.dtypes import dtype as dtype_entry

        def ceil(a: int, b: int) -> int:
            return -(-a // b)

        out: dict[str, tuple[tuple[int, ...], str, float]] = {}
        rows = m_rows if out_rows is None else out_rows
        for o in self.outputs:
            cols = self.columns(n_acc)[o.name]
            bits = dtype_entry(o.dtype).bits
            shape, store = ((rows, cols * bits // 8), "uint8") if bits < 16 else ((rows, cols), o.dtype)
            out[o.name] = (shape, store, 0.0)
            if o.quantize is not None:
                if o.quantize.row and o.quantize.vec == 128:
                    # 1x128 FP32 scales, M-contiguous: sfd_row[j, m] = scale of row m, columns
                    # 128j.., at a pitch of whole 16 bytes (the blockwise recipe's SFA layout).
                    out["sfd_row"] = ((ceil(cols, 128), ceil(m_rows, 4) * 4), "float32", 0.0)
                elif o.quantize.row:
                    out["sfd_row"] = ((1, ceil(m_rows, 128), ceil(ceil(cols, 32), 4), 32, 4, 4), "uint8", 0.0)
                if o.quantize.col:
                    out[o.quantize.col] = (shape, store, 0.0)
                    out["sfd_col"] = ((1, ceil(cols, 128), ceil(ceil(m_rows, 32), 4), 32, 4, 4), "uint8", 0.0)
        amax = [x for x in self.reductions if x.kind == "amax"]
        if amax:
            glob = any(x.scope == "global" for x in amax)
            out["amax"] = ((1,) if glob else (experts, max(x.slot for x in amax) + 1), "float32", float("-inf"))
        if any(x.scope == "row" for x in self.reductions):
            out["dprob"] = ((m_rows,), "float32", 0.0)
        colsum = next((x for x in self.reductions if x.scope == "column"), None)
        if colsum is not None:   # a paired output's sums are as wide as the output
            out["dbias"] = ((experts, self.width(n_acc) * (2 if colsum.paired else 1)), "float32", 0.0)
        return out


# --------------------------------------------------------------------------------------------
# present() folding
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BoolConst:
    value: bool
    col: int = 0


def fold(e: Expr, absent: set[str]) -> Expr:
    """Replace ``present(x)`` by its compile-time value and ``where`` on it by the branch."""
    if isinstance(e, Call):
        if e.fn == "present":
            return BoolConst(e.args[0].name not in absent, e.col)  # type: ignore[union-attr]
        args = tuple(fold(a, absent) for a in e.args)
        if e.fn == "where" and isinstance(args[0], BoolConst):
            return args[1] if args[0].value else args[2]
        return Call(e.fn, args, e.col)
    if isinstance(e, BinOp):
        return BinOp(e.op, fold(e.lhs, absent), fold(e.rhs, absent), e.col)
    if isinstance(e, Neg):
        return Neg(fold(e.arg, absent), e.col)
    return e


def _absent_dtype(dtype: str, choice: dict[str, Any]) -> bool:
    return dtype in AXES and choice.get(dtype, "none") == "none"


def _dtype(dtype: str, choice: dict[str, Any]) -> str:
    return choice[dtype] if dtype in AXES else dtype


# --------------------------------------------------------------------------------------------
# The spec section -> Epilogue (every error names file, line and key)
# --------------------------------------------------------------------------------------------
def parse_epilogue(ctx: Any, node: Any, choices: dict[str, tuple[Any, ...]], problem: str) -> Epilogue:
    """Build and type-check the ``epilogue:`` section of a spec (``ctx``: spec.py's _Ctx)."""
    d = ctx.mapping(node, "epilogue", {"compute", "outputs"}, {"inputs", "pairing", "reductions"})
    pairing = _pairing(ctx, d["pairing"]) if "pairing" in d else None
    inputs = _inputs(ctx, d.get("inputs"), choices, pairing)
    constants = tuple(a for a in choices if AXES[a].constant)
    statements = _statements(ctx, d["compute"], inputs, constants, pairing)
    computed = {s.target for s in statements}
    outputs = _outputs(ctx, d["outputs"], choices, computed, inputs, pairing, problem)
    reductions = _reductions(ctx, d.get("reductions"), choices, computed, problem, outputs)
    ep = Epilogue(inputs, pairing, statements, outputs, reductions, constants)
    _check_presence(ctx, node, ep, choices)
    _check_inputs_read(ctx, d.get("inputs"), ep, choices)
    if problem == "kgrouped":
        _check_kgrouped(ctx, d, ep)
    return ep


def _check_kgrouped(ctx: Any, d: Any, ep: Epilogue) -> None:
    """A K-grouped problem (weight gradients) reduces over each expert's token rows: its output
    rows are an (M, N) block per expert, so nothing per token row exists, and the kernel has no
    SFD quantization or gate/up pairing (outputs are BF16/FP32 weight gradients)."""
    why = "a K-grouped problem's output rows are per expert (L, M, N); it has no token rows"
    for inp in ep.inputs:
        if inp.per == "row":
            raise ctx.fail(d["inputs"], f"epilogue.inputs.{inp.name}.per", f"got 'row' ({why}); allowed: expert, "
                                                                             f"column, element, scalar")
    for r in ep.reductions:
        if r.scope == "row":
            raise ctx.fail(d["reductions"], "epilogue.reductions", f"{r.name}: got scope 'row' ({why}); allowed: "
                                                                    f"amax of scope expert or global")
    if ep.pairing is not None:
        raise ctx.fail(d["pairing"], "epilogue.pairing", "got a gate/up pairing; allowed: none (a K-grouped "
                                                         "problem's outputs are unpaired weight gradients)")
    for o in ep.outputs:
        if o.quantize is not None:
            raise ctx.fail(d["outputs"], f"epilogue.outputs.{o.name}.quantize", "got an SFD quantization; "
                                                                                "allowed: none on a K-grouped problem")


def _pairing(ctx: Any, node: Any) -> Pairing:
    m = ctx.mapping(node, "epilogue.pairing", {"roles"}, {"block", "acc"})
    block = ctx.typed(m["block"], "epilogue.pairing.block", (int,), "an integer") if "block" in m else 32
    if block != 32:
        raise ctx.fail(m["block"], "epilogue.pairing.block", f"got {block}; allowed: 32 (the seed's "
                                                            f"32-column gate/up interleave)")
    roles = ctx.seq(m["roles"], "epilogue.pairing.roles")
    names = tuple(ctx.typed(r, "epilogue.pairing.roles", (str,), "a role name") for r in roles)
    if len(names) != 2 or len(set(names)) != 2 or not all(_ident(n) for n in names):
        raise ctx.fail(m["roles"], "epilogue.pairing.roles", f"got {list(names)}; allowed: two distinct "
                                                              f"lower-case names, e.g. [gate, up]")
    acc = ctx.typed(m["acc"], "epilogue.pairing.acc", (bool,), "true or false") if "acc" in m else False
    return Pairing(block, names, acc)  # type: ignore[arg-type]


def _ident(name: str) -> bool:
    return name.isascii() and name.isidentifier() and name.islower() and not name.startswith("_")


def _bad_input_name(name: str) -> str | None:
    """Why ``name`` cannot name an input or an output (None: it can)."""
    if not _ident(name):
        return "not a lower-case ASCII identifier"
    if name == "acc":
        return "acc is the accumulator"
    if name in RESERVED:
        return f"{name} is a special form"
    if name in FUNCTIONS:
        return f"{name} is a function"
    if name in AXES:
        return f"{name} is a variant axis"
    return None


def _a(word: str) -> str:
    return "an" if word[:1] in "aeiou" else "a"


def _inputs(ctx, node, choices, pairing) -> tuple[Input, ...]:
    if node is None:
        return ()
    out: list[Input] = []
    taken: dict[str, list[str]] = {k: [] for k in SLOTS}
    items = ctx.mapping(node, "epilogue.inputs", set(), set(node.value) if isinstance(node.value, dict) else set())
    for name, inode in items.items():
        key = f"epilogue.inputs.{name}"
        why = _bad_input_name(name)
        if why is not None:
            raise ctx.fail(inode, key, f"{name!r} is not a valid input name ({why}); allowed: a lower-case "
                                       f"ASCII identifier that is not acc, where, present, a function or an "
                                       f"axis")
        m = ctx.mapping(inode, key, {"per"}, {"dtype", "default", "paired"})
        per = m["per"].value
        if per not in PER:
            raise ctx.fail(m["per"], f"{key}.per", f"got {per!r}; allowed: {', '.join(PER)}")
        dtype = _input_dtype(ctx, m.get("dtype"), f"{key}.dtype", per, choices)
        default = None
        if "default" in m:
            if per in ("column", "element"):
                raise ctx.fail(m["default"], f"{key}.default", f"{_a(per)} {per} input cannot have a default; "
                                                               f"allowed on scalar, expert and row inputs")
            v = m["default"].value
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not abs(float(v)) <= 3.4028234663852886e38 \
                    or (v != 0 and fp32(float(v)) == 0.0):
                raise ctx.fail(m["default"], f"{key}.default", f"got {v!r}; allowed: a finite number that "
                                                               "FP32 represents (0 or 1.4e-45 <= |x| <= 3.4e38)")
            default = float(v)
        paired = ctx.typed(m["paired"], f"{key}.paired", (bool,), "true or false") if "paired" in m else False
        if paired and per != "element":
            raise ctx.fail(m["paired"], f"{key}.paired", f"{_a(per)} {per} input cannot be paired; allowed: "
                                                         f"element inputs (with an epilogue pairing: section)")
        if paired and pairing is None:
            raise ctx.fail(m["paired"], f"{key}.paired", "a paired input needs an epilogue pairing: section, "
                                                         "e.g. pairing: {block: 32, roles: [gate, up]}")
        slots = SLOTS[per]
        if len(taken[per]) == len(slots):
            raise ctx.fail(inode, key, f"too many {per} inputs; the kernel ABI has {len(slots)} {per} "
                                       f"slot(s) ({', '.join(slots)}), already taken by "
                                       f"{', '.join(taken[per])}")
        slot = slots[len(taken[per])]
        taken[per].append(name)
        out.append(Input(name, per, dtype, default, paired, slot))
    return tuple(out)


def _input_dtype(ctx, node, key: str, per: str, choices) -> str:
    if node is None:
        return "float32"
    v = node.value
    if per in ("scalar", "expert") and v != "float32":
        raise ctx.fail(node, key, f"got {v!r}; allowed: float32 (scalar and expert inputs)")
    allowed = ELEMENT_DTYPES if per == "element" else INPUT_DTYPES
    if v in allowed:
        return v
    if isinstance(v, str) and v in AXES and v.endswith("_dtype"):
        if v not in choices:
            raise ctx.fail(node, key, f"axis {v!r} is not in this spec's choices")
        bad = [x for x in choices[v] if x != "none" and x not in allowed]
        if bad:
            raise ctx.fail(node, key, f"axis {v!r} offers {bad}, which a {per} input cannot be; allowed: "
                                      f"{', '.join(allowed)} (or none: absent)")
        return v
    raise ctx.fail(node, key, f"got {v!r}; allowed: {', '.join(allowed)} or a dtype axis in choices")


def _statements(ctx, node, inputs, constants, pairing) -> tuple[Statement, ...]:
    items = ctx.seq(node, "epilogue.compute")
    if not items:
        raise ctx.fail(node, "epilogue.compute", "empty; give at least one statement")
    if len(items) > MAX_STATEMENTS:
        raise ctx.fail(node, "epilogue.compute", f"{len(items)} statements; allowed: at most {MAX_STATEMENTS}")
    by_name = {i.name: i for i in inputs}
    known: dict[str, str] = {"acc": "acc", **{i.name: "input" for i in inputs}, **{c: "constant" for c in constants}}
    # For messages only: what defines each name, and which statement defines a name later.
    defined_by = {"acc": "as the accumulator", **{i.name: f"as an input, epilogue.inputs.{i.name}" for i in inputs},
                  **{c: f"as a constant axis, choices.{c}" for c in constants}}
    later = {}
    for j, n in enumerate(items):
        target = n.value.split("=", 1)[0].strip() if isinstance(n.value, str) and "=" in n.value else None
        if target is not None and target not in later:
            later[target] = j
    out = []
    for i, snode in enumerate(items):
        key = f"epilogue.compute[{i}]"
        try:
            st = parse_statement(plain(snode.value))
            if st.target in known:
                raise ExprError(f"{st.target!r} is already defined ({defined_by[st.target]}); "
                                f"each statement defines a new name")
            if not _ident(st.target):
                raise ExprError(f"{st.target!r} is not a valid name; allowed: lower-case ASCII identifiers")
            for n in walk(st.expr):      # the first unknown name: defined later (or by itself)?
                if isinstance(n, Ref) and n.name not in known:
                    if later.get(n.name, -1) >= i:
                        by = "this statement" if later[n.name] == i else f"epilogue.compute[{later[n.name]}]"
                        raise ExprError(f"{n.name!r} at column {n.col + 1} of {st.text!r} is used before it is "
                                        f"defined (by {by}); statements run in order")
                    break
            kind = _type(st.expr, known, by_name, pairing, st.text)
            if kind != "float":
                raise ExprError(f"{st.target} is a condition; a statement's value must be a number "
                                f"(use where(condition, a, b)) in {st.text!r}")
            check_constants(st)
        except ExprError as exc:
            raise ctx.fail(snode, key, str(exc)) from None
        known[st.target] = "value"
        defined_by[st.target] = f"by {key}"
        out.append(st)
    return tuple(out)


def _type(e: Expr, known: dict[str, str], inputs: dict[str, Input], pairing, text: str) -> str:
    """``float`` or ``bool``; raises ExprError for an unknown name, a misused role or type."""
    if isinstance(e, Num):
        return "float"
    if isinstance(e, Ref):
        if e.name not in known:
            raise ExprError(f"unknown name {e.name!r} at column {e.col + 1} of {text!r}; allowed: "
                            f"{', '.join(sorted(known))}")
        paired = _is_paired(e.name, inputs, pairing)
        if e.role is not None and not paired:
            raise ExprError(f"{e.name}.{e.role} at column {e.col + 1} of {text!r}: {e.name} is not paired, "
                            f"so it has no roles; write {e.name}")
        if paired and e.role is None:
            raise ExprError(f"{e.name} at column {e.col + 1} of {text!r} is paired: write {e.name}."
                            f"{pairing.roles[0]} or {e.name}.{pairing.roles[1]}")
        if paired and e.role not in pairing.roles:
            raise ExprError(f"unknown role {e.role!r} of {e.name} at column {e.col + 1} of {text!r}; "
                            f"allowed: {', '.join(pairing.roles)}")
        return "float"
    if isinstance(e, Neg):
        _want(e.arg, "float", known, inputs, pairing, text, "the operand of unary '-'")
        return "float"
    if isinstance(e, BinOp):
        _want(e.lhs, "float", known, inputs, pairing, text, f"the left operand of {e.op!r}")
        _want(e.rhs, "float", known, inputs, pairing, text, f"the right operand of {e.op!r}")
        return "bool" if e.op in ("<", "<=", ">", ">=", "==", "!=") else "float"
    if isinstance(e, Call):
        if e.fn == "present":
            name = e.args[0].name  # type: ignore[union-attr]
            if known.get(name) not in ("input", "constant"):
                raise ExprError(f"present({name}) at column {e.col + 1} of {text!r}: {name} is not an "
                                f"input or a constant")
            i = inputs.get(name)
            if i is not None and not (i.dtype in AXES):
                why = (f"; a null pointer means its default {i.default!r} at run time, which present() does "
                       f"not see" if i.default is not None else "")
                raise ExprError(f"present({name}) at column {e.col + 1} of {text!r}: {name} is always "
                                f"present (its dtype is not an axis that can be none{why})")
            return "bool"
        if e.fn == "where":
            _want(e.args[0], "bool", known, inputs, pairing, text, "argument 1 of where()")
            _want(e.args[1], "float", known, inputs, pairing, text, "argument 2 of where()")
            _want(e.args[2], "float", known, inputs, pairing, text, "argument 3 of where()")
            return "float"
        for k, a in enumerate(e.args):
            _want(a, "float", known, inputs, pairing, text, f"argument {k + 1} of {e.fn}()")
        return "bool" if e.fn in BOOL_FUNCTIONS else "float"
    raise ExprError(f"unexpected node in {text!r}")  # pragma: no cover - the parser builds no other


def _want(e: Expr, kind: str, known, inputs, pairing, text: str, where: str) -> None:
    got = _type(e, known, inputs, pairing, text)
    if got != kind:
        what = "a condition (a comparison, isnan() or present())" if kind == "bool" else "a number"
        raise ExprError(f"{where} is {'a condition' if got == 'bool' else 'a number'} (at column "
                        f"{getattr(e, 'col', 0) + 1} of {text!r}); allowed: {what}")


def _is_paired(name: str, inputs: dict[str, Input], pairing: Pairing | None) -> bool:
    if pairing is None:
        return False
    if name == "acc":
        return pairing.acc
    i = inputs.get(name)
    return i is not None and (i.paired or (i.per == "column" and pairing.acc))


def _condition(ctx, node, key: str, choices) -> Condition:
    if node is None:
        return Condition()
    if isinstance(node.value, str):   # shorthand: a bool axis that must be true
        axis = node.value
        if axis not in choices or AXES[axis].kind != "bool":
            raise ctx.fail(node, key, f"got {axis!r}; allowed: a true/false axis in choices, or a mapping "
                                      f"axis -> values")
        return Condition(((axis, (True,)),))
    m = ctx.mapping(node, key, set(), set(choices))
    terms = []
    for axis, vnode in m.items():
        items = vnode.value if isinstance(vnode.value, list) else [vnode]
        vals = []
        for it in items:
            v = it.value if not isinstance(it.value, type(None)) else "none"
            if v not in choices[axis]:
                raise ctx.fail(it, f"{key}.{axis}", f"{v!r} is not among this spec's choices; allowed: "
                                                    f"{', '.join(map(str, choices[axis]))}")
            vals.append(v)
        terms.append((axis, tuple(vals)))
    return Condition(tuple(terms))


def _outputs(ctx, node, choices, computed: set[str], inputs, pairing, problem: str) -> tuple[Output, ...]:
    names = set(node.value) if isinstance(node.value, dict) else set()
    m = ctx.mapping(node, "epilogue.outputs", set(), names)
    if not m:
        raise ctx.fail(node, "epilogue.outputs", "empty; declare at least one output (c or d)")
    scalars = {i.name for i in inputs if i.per == "scalar"}
    slots = _output_slots(ctx, m)
    out = []
    for name, onode in m.items():
        key = f"epilogue.outputs.{name}"
        slot = slots[name]
        o = ctx.mapping(onode, key, {"dtype"}, {"value", "paired", "when", "quantize", "slot"})
        dtype = _output_dtype(ctx, o["dtype"], f"{key}.dtype", choices)
        value = paired = None
        if "paired" in o:
            if pairing is None:
                raise ctx.fail(o["paired"], f"{key}.paired", "a paired output needs a pairing: section")
            if slot == "c" and (problem != "grouped" or any(v != "n" for v in choices.get("cd_major", ("n",)))):
                # the engine writes a paired C as N-major grouped rows only (BlockEngine's static_assert)
                raise ctx.fail(o["paired"], f"{key}.paired", f"a paired c is an N-major grouped output; got problem "
                                                             f"{problem!r}, cd_major {list(choices.get('cd_major', ('n',)))}; "
                                                             f"allowed: problem grouped with cd_major [n]")
            pm = ctx.mapping(o["paired"], f"{key}.paired", set(pairing.roles), set())
            paired = tuple(_computed(ctx, pm[r], f"{key}.paired.{r}", computed) for r in pairing.roles)
            if "value" in o:
                raise ctx.fail(o["value"], f"{key}.value", "give value or paired, not both")
        else:
            value = _computed(ctx, o["value"], f"{key}.value", computed) if "value" in o else name
            if value not in computed:
                raise ctx.fail(onode, key, f"output {name!r} is never computed; computed: "
                                           f"{', '.join(sorted(computed))} (or give value:)")
        when = _condition(ctx, o.get("when"), f"{key}.when", choices)
        quantize = _quantize(ctx, o["quantize"], f"{key}.quantize", name, slot, scalars, dtype, choices) \
            if "quantize" in o else None
        out.append(Output(name, dtype, value, paired, when, quantize, slot))  # type: ignore[arg-type]
    return tuple(out)


# Buffers an epilogue writes besides its outputs (Resolved.buffers): no output may take their names.
OTHER_BUFFERS = ("d_col", "sfd_row", "sfd_col", "amax", "dprob", "dbias")


def _output_slots(ctx, m) -> dict[str, str]:
    """Each output's ABI slot: an output named c or d is that slot; another name takes its
    ``slot:`` or else the first free slot of d, c (in declaration order). Names are identifiers
    (not reserved words, functions, axes) that no other buffer of the epilogue uses."""
    taken: dict[str, str] = {}
    wanted: dict[str, str | None] = {}
    for name, onode in m.items():
        key = f"epilogue.outputs.{name}"
        why = _bad_input_name(name) if isinstance(name, str) else "not a string"
        if why is not None:
            raise ctx.fail(onode, key, f"{name!r} is not a valid output name ({why}); allowed: a lower-case "
                                       f"ASCII identifier that is not acc, where, present, a function or an axis")
        if name in OTHER_BUFFERS:
            raise ctx.fail(onode, key, f"{name!r} names a buffer the epilogue may also write "
                                       f"({', '.join(OTHER_BUFFERS)}); give the output another name")
        slot_node = onode.value.get("slot") if isinstance(onode.value, dict) else None
        slot = None
        if slot_node is not None:
            slot = slot_node.value
            if slot not in OUTPUT_SLOTS:
                raise ctx.fail(slot_node, f"{key}.slot", f"got {slot!r}; allowed: {', '.join(OUTPUT_SLOTS)} (the "
                                                         f"kernel ABI's output tensors)")
            if name in OUTPUT_SLOTS and slot != name:
                raise ctx.fail(slot_node, f"{key}.slot", f"got {slot!r}; an output named {name} is slot {name}")
        wanted[name] = slot if slot is not None else (name if name in OUTPUT_SLOTS else None)
    for name, slot in wanted.items():
        if slot is not None:
            if slot in taken:
                raise ctx.fail(m[name], f"epilogue.outputs.{name}", f"slot {slot} is taken by output "
                                                                    f"{taken[slot]!r}; allowed: one output per slot")
            taken[slot] = name
    out = {}
    for name, slot in wanted.items():
        if slot is None:
            free = [s for s in ("d", "c") if s not in taken]
            if not free:
                raise ctx.fail(m[name], f"epilogue.outputs.{name}", f"too many outputs; the kernel ABI has "
                                                                    f"{len(OUTPUT_SLOTS)} (c, d), already taken by "
                                                                    f"{', '.join(taken.values())}")
            slot = free[0]
            taken[slot] = name
        out[name] = slot
    return out


def _computed(ctx, node, key: str, computed: set[str], also: str = "") -> str:
    """The computed value ``node`` names (``also``: what else the key may name, in the message)."""
    v = node.value
    if v not in computed:
        raise ctx.fail(node, key, f"{v!r} is not computed; computed: {', '.join(sorted(computed))}{also}")
    return v


def _output_dtype(ctx, node, key: str, choices) -> str:
    v = node.value
    if v in OUTPUT_DTYPES:
        return v
    if isinstance(v, str) and v in AXES and v.endswith("_dtype"):
        if v not in choices:
            raise ctx.fail(node, key, f"axis {v!r} is not in this spec's choices")
        bad = [x for x in choices[v] if x not in OUTPUT_DTYPES]
        if bad:
            raise ctx.fail(node, key, f"axis {v!r} offers {bad}, which an output cannot be; allowed: "
                                      f"{', '.join(OUTPUT_DTYPES)}")
        return v
    raise ctx.fail(node, key, f"got {v!r}; allowed: {', '.join(OUTPUT_DTYPES)} or a dtype axis in choices")


def _quantize(ctx, node, key: str, output: str, slot: str, scalars: set[str], dtype: str, choices) -> Quantize:
    q = ctx.mapping(node, key, {"norm_const"}, {"row", "col", "convention", "vec", "pow2"})
    possible = [dtype] if dtype not in AXES else list(choices[dtype])
    if not any(d in QUANTIZED for d in possible):
        raise ctx.fail(node, key, f"output {output!r} is never FP8/FP4 ({', '.join(map(str, possible))}); "
                                  f"quantization applies to {', '.join(QUANTIZED)}")
    nc = q["norm_const"].value
    if nc not in scalars:
        raise ctx.fail(q["norm_const"], f"{key}.norm_const", f"got {nc!r}; allowed: a scalar input "
                                                             f"({', '.join(sorted(scalars)) or 'none declared'})")
    row = ctx.typed(q["row"], f"{key}.row", (bool,), "true or false") if "row" in q else True
    col = None
    if "col" in q:
        col = q["col"].value
        if slot != "d":
            raise ctx.fail(q["col"], f"{key}.col", f"output {output!r} (slot {slot}) has no column-quantized copy; "
                                                   f"only the output in slot d has one (d_col, the ABI's one)")
        if col != "d_col":
            raise ctx.fail(q["col"], f"{key}.col", f"got {col!r}; allowed: d_col (the column-quantized "
                                                   f"copy of d, the ABI's one)")
    if not row and col is None:
        raise ctx.fail(node, key, "quantizes nothing; set row: true or col: d_col")
    conv = q["convention"].value if "convention" in q else "quant"
    if conv not in CONVENTIONS:
        raise ctx.fail(q["convention"], f"{key}.convention", f"got {conv!r}; allowed: {', '.join(CONVENTIONS)}")
    vec = _quantize_vec(ctx, q["vec"], f"{key}.vec", choices) if "vec" in q else 32
    by_128 = 128 in ((vec,) if isinstance(vec, int) else choices[vec])   # (some variant's blocks are 1x128)
    if by_128 and (col is not None or not row):
        raise ctx.fail(q["vec"], f"{key}.vec", "1x128 blocks (FP32 scales, the blockwise recipe) quantize rows "
                                               "only: drop col: d_col (32-row column blocks need vec 32)")
    pow2 = _quantize_pow2(ctx, q["pow2"], f"{key}.pow2", choices, by_128) if "pow2" in q else False
    return Quantize(row, col, conv, nc, vec, pow2)


def _quantize_pow2(ctx, node, key: str, choices, by_128: bool) -> bool | str:
    """``quantize.pow2``: true, false or the axis sfd_pow2; 1x128 scales only (``by_128``: the
    output's vec can be 128)."""
    v = node.value
    if v == "sfd_pow2":
        if v not in choices:
            raise ctx.fail(node, key, f"axis {v!r} is not in this spec's choices")
    elif not isinstance(v, bool):
        raise ctx.fail(node, key, f"got {v!r}; allowed: true, false or the axis sfd_pow2")
    if v is not False and not by_128:
        raise ctx.fail(node, key, "power-of-two scales are the 1x128 blocks' (vec: 128); MX blocks' E8M0 "
                                  "scales are powers of two already")
    return v


def _quantize_vec(ctx, node, key: str, choices) -> int | str:
    """``quantize.vec``: 32 or 128, or an axis in the choices offering only those (sfd_vec_size)."""
    v, allowed = node.value, QUANTIZE_VECS
    if isinstance(v, int) and not isinstance(v, bool) and v in allowed:
        return v
    if v == "sfd_vec_size":     # (the axis itself offers 32 and 128 only: generator/axes.py)
        if v not in choices:
            raise ctx.fail(node, key, f"axis {v!r} is not in this spec's choices")
        return v
    raise ctx.fail(node, key, f"got {v!r}; allowed: {', '.join(map(str, allowed))} or the axis sfd_vec_size")


def _reductions(ctx, node, choices, computed: set[str], problem: str,
                outputs: tuple[Output, ...]) -> tuple[Reduction, ...]:
    if node is None:
        return ()
    out = []
    rnodes = ctx.seq(node, "epilogue.reductions")
    for i, rnode in enumerate(rnodes):
        key = f"epilogue.reductions[{i}]"
        m = ctx.mapping(rnode, key, {"name", "kind", "of", "scope"}, {"slot", "when"})
        name, kind, scope = m["name"].value, m["kind"].value, m["scope"].value
        if name not in REDUCTION_SLOTS:
            raise ctx.fail(m["name"], f"{key}.name", f"got {name!r}; allowed: {', '.join(REDUCTION_SLOTS)} "
                                                     f"(the kernel ABI's reduction buffers)")
        if kind != REDUCTION_SLOTS[name]:
            raise ctx.fail(m["kind"], f"{key}.kind", f"got {kind!r}; allowed for {name}: {REDUCTION_SLOTS[name]}")
        scopes = REDUCTION_SCOPES[name]
        if scope not in scopes:
            raise ctx.fail(m["scope"], f"{key}.scope", f"got {scope!r}; allowed for {name}: {', '.join(scopes)}")
        if scope == "column" and problem != "grouped":
            raise ctx.fail(m["scope"], f"{key}.scope", f"got 'column' on a {problem} problem; allowed: a grouped "
                                                       f"problem (a column sum runs over each expert's rows)")
        of, paired = _reduced(ctx, m["of"], f"{key}.of", scope, computed, outputs)
        slot = ctx.typed(m["slot"], f"{key}.slot", (int,), "an integer") if "slot" in m else 0
        if not 0 <= slot < 4:
            raise ctx.fail(m["slot"], f"{key}.slot", f"got {slot}; allowed: 0 to 3")
        out.append(Reduction(name, kind, of, scope, slot, _condition(ctx, m.get("when"), f"{key}.when", choices),
                             paired))
    slots = [(r.name, r.slot) for r in out]
    for j, r in enumerate(out):
        if slots.count((r.name, r.slot)) > 1 and not _exclusive(out, r):
            # point at the later of the first two that clash (the same reductions are rejected)
            i = next(i for i in range(len(out)) if i != j and slots[i] == slots[j]
                     and not _exclusive([out[i], r], r))
            first, second = min(i, j), max(i, j)
            raise ctx.fail(rnodes[second], f"epilogue.reductions[{second}]",
                           f"writes {r.name} slot {r.slot}, like epilogue.reductions[{first}]; give it "
                           f"another slot: or when: conditions that never hold together (one axis, "
                           f"disjoint values)")
    _check_amax_engine(ctx, rnodes, out, choices)
    return tuple(out)


def _reduced(ctx, node, key: str, scope: str, computed: set[str],
             outputs: tuple[Output, ...]) -> tuple[str, tuple[str, str] | None]:
    """What a reduction's ``of:`` names: a computed value (paired None), or, for a column sum, a
    paired output (its role values: the sum covers the output's interleaved columns). A paired
    output is one tensor of two values per element column, which only a column sum keeps apart
    (one sum per stored column); a row sum or an amax of it would have to say how to merge them."""
    v = node.value
    pair = next((o for o in outputs if o.name == v and o.paired is not None), None)
    if pair is None:
        names = [o.name for o in outputs if o.paired is not None]
        also = f" (or, for a column sum, a paired output: {', '.join(names)})" if names else ""
        return _computed(ctx, node, key, computed, also), None
    if v in computed:
        raise ctx.fail(node, key, f"{v!r} names both a computed value and the paired output {v}; rename one "
                                  f"(the reduction could mean either)")
    if scope != "column":
        raise ctx.fail(node, key, f"{v!r} is a paired output (gate/up blocks, twice the element width); got scope "
                                  f"{scope!r}; allowed: a column sum (name dbias, scope column), or a computed "
                                  f"value: {', '.join(sorted(computed))}")
    return v, pair.paired


# The block engine (epilogue_block.cuh) keeps two amax partials per thread and one scope.
MAX_AMAX = 2


def _check_amax_engine(ctx, rnodes, reds, choices) -> None:
    """Refuse amax sets the kernel's engine cannot carry in some variant: more than MAX_AMAX
    at once, or expert and global scopes together."""
    amax = [(i, r) for i, r in enumerate(reds) if r.kind == "amax"]
    axes = sorted({a for _, r in amax for a, _ in r.when.terms})
    for combo in itertools.product(*(choices.get(a, (None,)) for a in axes)):
        choice = dict(zip(axes, combo))
        live = [(i, r) for i, r in amax if r.when.holds(choice)]
        where = f" (when {', '.join(f'{a}={v}' for a, v in choice.items())})" if choice else ""
        if len(live) > MAX_AMAX:
            i = live[MAX_AMAX][0]
            raise ctx.fail(rnodes[i], f"epilogue.reductions[{i}]",
                           f"{len(live)} amax reductions are live together{where}; allowed: at most "
                           f"{MAX_AMAX} per variant (the kernel keeps {MAX_AMAX} amax partials)")
        if len({r.scope for _, r in live}) > 1:
            i = live[-1][0]
            raise ctx.fail(rnodes[i], f"epilogue.reductions[{i}].scope",
                           f"mixes amax scopes {sorted({r.scope for _, r in live})}{where}; allowed: one "
                           f"scope per variant (all expert or all global)")


def _exclusive(reds, r) -> bool:
    """Reductions sharing a slot must have when-conditions that never hold together (same axis,
    disjoint values)."""
    for other in reds:
        if other is r or (other.name, other.slot) != (r.name, r.slot):
            continue
        ok = any(a1 == a2 and not set(v1) & set(v2) for a1, v1 in r.when.terms for a2, v2 in other.when.terms)
        if not ok:
            return False
    return True


def _check_presence(ctx, node, ep: Epilogue, choices) -> None:
    """Under every combination of absent optional inputs and constants, no statement that an
    output or reduction reads names an absent input outside its present() branch."""
    optional = [i.dtype for i in ep.inputs if i.dtype in AXES and "none" in choices.get(i.dtype, ())]
    optional += [c for c in ep.constants if "none" in choices.get(c, ()) or None in choices.get(c, ())]
    optional = sorted(set(optional))
    if len(optional) > MAX_OPTIONAL:
        raise ctx.fail(node, "epilogue", f"{len(optional)} optional inputs/constants; allowed: at most "
                                         f"{MAX_OPTIONAL}")
    base = {a: next((v for v in vals if v != "none"), vals[0]) for a, vals in choices.items()}
    for combo in itertools.product((False, True), repeat=len(optional)):
        choice = dict(base)
        for axis, off in zip(optional, combo):
            if off:
                choice[axis] = "none"
        r = ep.resolve({**choice, **{o: True for o in choices if AXES[o].kind == "bool"}})
        absent = {i.name for i in ep.inputs if _absent_dtype(i.dtype, choice)}
        absent |= {c for c in ep.constants if choice.get(c) in (None, "none")}
        for s in r.statements:
            for n in walk(s.expr):
                if isinstance(n, Ref) and n.name in absent:
                    off = ", ".join(a for a, o in zip(optional, combo) if o)
                    i = next(k for k, st in enumerate(ep.statements) if st.target == s.target)
                    snode = node.value["compute"].value[i]
                    raise ctx.fail(snode, f"epilogue.compute[{i}]",
                                   f"{s.text!r} reads {n.name}, which is absent when {off} is none; guard it "
                                   f"with where(present({n.name}), ..., ...)")


def _check_inputs_read(ctx, node, ep: Epilogue, choices) -> None:
    """Every declared input is read by some variant: a statement that an output or reduction
    uses names it (outside a present() test, which reads no data), or an output's quantize:
    takes it as norm_const. An input no variant reads would be a tensor the caller passes and
    the kernel ignores (STYLE 16). Variants differ here only in the axes the epilogue reads
    (Epilogue.axes_read), so those are enumerated; spec constraints are not applied, so a
    constraint that rules out the only reading variant goes unnoticed (never a false error)."""
    if not ep.inputs:
        return
    axes = sorted(a for a in ep.axes_read() if a in choices)
    unread = {i.name for i in ep.inputs}
    for combo in itertools.product(*(choices[a] for a in axes)):
        unread -= {i.name for i in ep.resolve(dict(zip(axes, combo))).inputs}
        if not unread:
            return
    inp = next(i for i in ep.inputs if i.name in unread)
    named = any(isinstance(n, Ref) and n.name == inp.name for st in ep.statements for n in walk(st.expr))
    if inp.dtype in AXES and all(v == "none" for v in choices.get(inp.dtype, ("none",))):
        why = f"it is absent in every variant ({inp.dtype} offers only none)"
    elif named:
        why = ("every place that names it is dropped in every variant (a statement no output or reduction "
               "uses, a where(present(...)) branch no variant takes, or present() itself, which reads no data)")
    else:
        why = "no statement names it and no quantize: takes it as norm_const"
    raise ctx.fail(node.value[inp.name], f"epilogue.inputs.{inp.name}",
                   f"{inp.name!r} is declared but no variant reads it: {why}; allowed: read it in a "
                   f"statement an output or reduction uses, or remove it")
