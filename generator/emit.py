"""Resolved epilogue -> the model of its generated C++ rule (rendered by templates/rule.cu.j2).

The rule is the only per-spec C++ a kernel instantiates. Everything in it comes from this
module's own code and from validated AST nodes: names map to fixed member spellings
(``in_<name>``, ``v_<name>``), numbers become exact FP32 hexadecimal literals, operators and
functions become the intrinsics of generator/functions.py. No text of the spec reaches C++.

The engine that calls the rule (fusegemm/epilogue.cuh) reads its traits: which outputs it
writes, whether the accumulator or D is paired, how D is quantized, which reductions it feeds.

``rule_model(r, packed=True)`` (the ``vector_f32`` axis, on kernels whose registry row lists it)
adds the same statements over ``float2``: two adjacent columns at once, ``+ - *`` and ``fma``
(``square``) as packed FP32 instructions, everything else lane by lane with the scalar spelling
(``fusegemm::f32x2``, templates/include/fusegemm/sm100/packed_f32.cuh). Each lane computes the
scalar rule's operations in its order, each one correctly rounded, so the bits are the same.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

from ..base.dtypes import dtype as dtype_entry
from .epilogue import Resolved
from .expr import BinOp, Call, Expr, Neg, Num, Ref, walk
from .functions import FUNCTIONS

_ARITH = {"+": "__fadd_rn", "-": "__fsub_rn", "*": "__fmul_rn", "/": "__fdiv_rn"}
CONVENTION_CODE = {"quant": 0, "srelu": 1, "dswiglu": 2}


@dataclass(frozen=True)
class Load:
    """One input read: the C++ field it fills, the ABI slot, the element type, the default."""

    field: str
    slot: str
    cpp_type: str
    default: str | None        # C++ literal used when the pointer is null
    role: int                  # 0: unpaired, 1: gate (first role), 2: up (second role)


@dataclass(frozen=True)
class RuleModel:
    """What templates/rule.cu.j2 renders (and ``fusegemm validate`` prints)."""

    traits: tuple[tuple[str, str], ...]     # (constant, C++ value)
    expert_loads: tuple[Load, ...]          # once per tile (per expert)
    scalar_loads: tuple[Load, ...]          # once per tile
    column_loads: tuple[Load, ...]          # per element: column inputs (expert's row of (N, L))
    element_loads: tuple[Load, ...]         # per element: loaded tensors
    row_loads: tuple[Load, ...]             # once per row
    statements: tuple[tuple[str, str], ...]  # (C++ name, C++ expression)
    out_fields: tuple[tuple[str, str], ...]  # (Out field, C++ name of its value)
    norm_const: str | None                   # the member scaling D's SFD quantization
    c_type: str = "float"                    # C++ element type of output c ("float": no c)
    d_type: str = "float"                    # C++ element type of output d ("float": no d)
    packed: tuple[tuple[str, str], ...] = ()  # vector_f32: the statements over float2 (apply2)

    def has(self, output: str) -> bool:
        """Whether the rule writes output ``output`` ("c" or "d")."""
        return dict(self.traits)[f"kHas{output.upper()}"] == "true"


def hex_float(value: float) -> str:
    """An exact C++ FP32 literal of ``value`` rounded to FP32 (hexadecimal: no decimal
    rounding on either side), e.g. ``0x1.8000000000000p+0f``."""
    return struct.unpack("<f", struct.pack("<f", value))[0].hex() + "f"


def rule_model(r: Resolved, packed: bool = False) -> RuleModel:
    """The rule of one variant's epilogue (with ``packed``: also its two-column form)."""
    roles = r.pairing.roles if r.pairing is not None else ()
    names: dict[tuple[str, str | None], str] = {}
    expert, scalar, column, element, row = [], [], [], [], []
    for inp in r.inputs:
        cpp = dtype_entry(inp.dtype).cpp
        default = hex_float(inp.default) if inp.default is not None else None
        paired = (inp.per == "element" and inp.paired) or (inp.per == "column" and r.paired_acc)
        if inp.per == "expert":
            expert.append(Load(f"in_{inp.name}", inp.slot, cpp, default, 0))
            names[(inp.name, None)] = f"in_{inp.name}"
        elif inp.per == "scalar":
            scalar.append(Load(f"in_{inp.name}", inp.slot, cpp, default, 0))
            names[(inp.name, None)] = f"in_{inp.name}"
        elif inp.per == "row":
            row.append(Load(inp.name, inp.slot, cpp, default, 0))
            names[(inp.name, None)] = f"ri.{inp.name}"
        else:
            target = column if inp.per == "column" else element
            if paired:
                for k, role in enumerate(roles):
                    target.append(Load(f"{inp.name}_{role}", inp.slot, cpp, None, k + 1))
                    names[(inp.name, role)] = f"ei.{inp.name}_{role}"
            else:
                target.append(Load(inp.name, inp.slot, cpp, None, 0))
                names[(inp.name, None)] = f"ei.{inp.name}"
    # Per column (different in the two lanes of a packed rule): column and element inputs.
    per_column = {key for key, cpp in names.items() if cpp.startswith("ei.")}
    if r.paired_acc:
        names[("acc", roles[0])], names[("acc", roles[1])] = "acc0", "acc1"
    else:
        names[("acc", None)] = "acc0"
    for c, value in r.constants.items():
        names[(c, None)] = hex_float(value)
    packed_statements = _packed(r, names, per_column) if packed else ()
    statements = []
    for st in r.statements:
        statements.append((f"v_{st.target}", _expr(st.expr, names)))
        names[(st.target, None)] = f"v_{st.target}"
    out_fields: list[tuple[str, str]] = []
    c, d = r.in_slot("c"), r.in_slot("d")
    if c is not None:
        if c.paired:
            out_fields += [("c0", f"v_{c.paired[0]}"), ("c1", f"v_{c.paired[1]}")]
        else:
            out_fields.append(("c", f"v_{c.value}"))
    if d is not None:
        if d.paired:
            out_fields += [("d0", f"v_{d.paired[0]}"), ("d1", f"v_{d.paired[1]}")]
        else:
            out_fields.append(("d", f"v_{d.value}"))
    amax = [x for x in r.reductions if x.kind == "amax"]
    for k, red in enumerate(amax):
        out_fields.append((f"amax{k}", f"v_{red.of}"))
    rowsum = [x for x in r.reductions if x.scope == "row"]
    if rowsum:
        out_fields.append(("rowsum", f"v_{rowsum[0].of}"))
    colsum = [x for x in r.reductions if x.scope == "column"]
    if colsum and colsum[0].paired:     # a paired output's: both roles' values, per element column
        out_fields += [("colsum0", f"v_{colsum[0].paired[0]}"), ("colsum1", f"v_{colsum[0].paired[1]}")]
    elif colsum:
        out_fields.append(("colsum", f"v_{colsum[0].of}"))
    q = d.quantize if d is not None else None
    traits = [
        ("kPairedAcc", _b(r.paired_acc)),
        ("kHasC", _b(c is not None)),
        ("kHasD", _b(d is not None)),
        ("kPairedC", _b(c is not None and c.paired is not None)),
        ("kPairedD", _b(d is not None and d.paired is not None)),
        ("kQuantRowD", _b(q is not None and q.row)),
        ("kQuantColD", _b(q is not None and q.col is not None)),
        ("kSfdConvention", str(CONVENTION_CODE[q.convention] if q is not None else 0)),
        ("kSfdVec", str(r.sfd_vec)),
        ("kSfdPow2", _b(r.sfd_pow2)),
        ("kAmaxCount", str(len(amax))),
        ("kAmaxSlots", str(max((x.slot for x in amax), default=-1) + 1)),
        ("kAmaxGlobal", _b(any(x.scope == "global" for x in amax))),
        ("kRowSum", _b(bool(rowsum))),
        ("kColSum", _b(bool(colsum))),
        ("kPairedColSum", _b(bool(colsum) and colsum[0].paired is not None)),
        ("kElementwise", _b(r.elementwise)),
    ]
    for k, red in enumerate(amax):
        traits.append((f"kAmaxSlot{k}", str(red.slot)))
    types = {o.slot: dtype_entry(o.dtype).cpp for o in r.outputs}
    return RuleModel(tuple(traits), tuple(expert), tuple(scalar), tuple(column), tuple(element),
                     tuple(row), tuple(statements), tuple(out_fields),
                     f"in_{q.norm_const}" if q is not None else None,
                     types.get("c", "float"), types.get("d", "float"), packed_statements)


def _b(v: bool) -> str:
    return "true" if v else "false"


def _expr(e: Expr, names: dict[tuple[str, str | None], str]) -> str:
    if isinstance(e, Num):
        return hex_float(e.value)
    if isinstance(e, Ref):
        return names[(e.name, e.role)]
    if isinstance(e, Neg):
        return f"(-{_expr(e.arg, names)})"
    if isinstance(e, BinOp):
        lhs, rhs = _expr(e.lhs, names), _expr(e.rhs, names)
        if e.op in _ARITH:
            return f"{_ARITH[e.op]}({lhs}, {rhs})"
        return f"({lhs} {e.op} {rhs})"
    if isinstance(e, Call):
        args = [_expr(a, names) for a in e.args]
        if e.fn == "where":
            return f"({args[0]} ? {args[1]} : {args[2]})"
        return FUNCTIONS[e.fn].cpp.format(*args)
    raise TypeError(f"unexpected node {type(e).__name__}")  # pragma: no cover - folded before


# ---- vector_f32: the statements over two columns (apply2) ---------------------------------
_F2 = "fusegemm::f32x2::"
_PACKED_ARITH = {"+": "add", "-": "sub", "*": "mul"}   # "/" has no packed instruction: per lane
_PACKED_CALLS = {"fma": "fma", "square": "square"}     # FFMA2, FMUL2 of the scalar __fmaf_rn / __fmul_rn


def _packed(r: Resolved, names: dict[tuple[str, str | None], str],
            per_column: set[tuple[str, str | None]]) -> tuple[tuple[str, str], ...]:
    """``(C++ name, float2 expression)`` of each statement: lane x is column i, lane y column
    i + 1. ``names``: the scalar spellings before any statement (inputs, acc, constants);
    ``per_column``: those read from each column's ElemIn (``ei.`` in apply, e0/e1 in apply2)."""
    # Per name: its spelling in lane x, in lane y, and as a float2. Values of the whole row or
    # tile (expert, scalar and row inputs, constants) are the same in both lanes; acc and the
    # statements' values are float2 (apply2's parameters and locals).
    lanes: dict[tuple[str, str | None], tuple[str, str, str]] = {}
    for key, cpp in names.items():
        if cpp in ("acc0", "acc1"):
            lanes[key] = (f"{cpp}.x", f"{cpp}.y", cpp)
        elif key in per_column:
            field = cpp[len("ei."):]
            lanes[key] = (f"e0.{field}", f"e1.{field}", f"{_F2}pair(e0.{field}, e1.{field})")
        else:
            lanes[key] = (cpp, cpp, f"{_F2}splat({cpp})")
    out = []
    for st in r.statements:
        name = f"v_{st.target}"
        out.append((name, _expr2(st.expr, lanes)))
        uniform = _uniform(st.expr, lanes)   # both lanes hold one value: read lane x
        lanes[(st.target, None)] = (f"{name}.x", f"{name}.x" if uniform else f"{name}.y", name)
    return tuple(out)


def _uniform(e: Expr, lanes: dict[tuple[str, str | None], tuple[str, str, str]]) -> bool:
    """Whether ``e`` is the same in both lanes: it reads only constants and values of the whole
    row or tile (expert, scalar and row inputs, statements of those)."""
    return all(lanes[(n.name, n.role)][0] == lanes[(n.name, n.role)][1] for n in walk(e) if isinstance(n, Ref))


def _lane(lanes: dict[tuple[str, str | None], tuple[str, str, str]], k: int) -> dict[tuple[str, str | None], str]:
    return {key: spell[k] for key, spell in lanes.items()}


def _expr2(e: Expr, lanes: dict[tuple[str, str | None], tuple[str, str, str]]) -> str:
    """A float2 expression computing ``e`` in both lanes, each with the scalar rule's operations."""
    if _uniform(e, lanes):   # computed once, on values of the whole row or tile
        return f"{_F2}splat({_expr(e, _lane(lanes, 0))})"
    if isinstance(e, Ref):
        return lanes[(e.name, e.role)][2]
    if isinstance(e, Neg):
        return f"{_F2}neg({_expr2(e.arg, lanes)})"
    if isinstance(e, BinOp) and e.op in _PACKED_ARITH:
        return f"{_F2}{_PACKED_ARITH[e.op]}({_expr2(e.lhs, lanes)}, {_expr2(e.rhs, lanes)})"
    if isinstance(e, BinOp) and e.op == "/":
        return f"{_F2}map([](float x0, float x1) {{ return {_ARITH['/']}(x0, x1); }}, " \
               f"{_expr2(e.lhs, lanes)}, {_expr2(e.rhs, lanes)})"
    if isinstance(e, Call) and e.fn == "where":
        # The condition per lane (comparisons have no float2 form), the branches packed.
        cond = [_expr(e.args[0], _lane(lanes, k)) for k in (0, 1)]
        return f"{_F2}select({cond[0]}, {cond[1]}, {_expr2(e.args[1], lanes)}, {_expr2(e.args[2], lanes)})"
    if isinstance(e, Call) and e.fn in _PACKED_CALLS:
        return f"{_F2}{_PACKED_CALLS[e.fn]}({', '.join(_expr2(a, lanes) for a in e.args)})"
    if isinstance(e, Call):
        params = [f"x{i}" for i in range(len(e.args))]
        body = FUNCTIONS[e.fn].cpp.format(*params)
        sig = ", ".join(f"float {p}" for p in params)
        return f"{_F2}map([]({sig}) {{ return {body}; }}, {', '.join(_expr2(a, lanes) for a in e.args)})"
    raise TypeError(f"unexpected node {type(e).__name__} in a value")  # pragma: no cover - conditions: where()
