"""Epilogue statements: ``name = expr`` parsed into a small AST (no Python ``eval``, no C++ text).

Grammar (ASCII only; anything else is an error naming the column)::

    statement := NAME "=" expr
    expr      := sum [("<" | "<=" | ">" | ">=" | "==" | "!=") sum]
    sum       := term (("+" | "-") term)*
    term      := unary (("*" | "/") unary)*
    unary     := "-" unary | primary
    primary   := NUMBER | NAME ["." NAME] | NAME "(" expr ("," expr)* ")" | "(" expr ")"

Numbers are rounded to FP32 when parsed and must be finite there. Names and roles are resolved
and typed by generator/epilogue.py; this module knows the shapes of statements, where each node
came from in the text (its span, for messages), and the values of their constant parts:
:func:`check_constants` refuses a constant subexpression that is Inf or NaN in FP32, a division
by a constant zero and clamp() with constant bounds lo > hi. Sizes are bounded (statement
length, nesting depth) so a spec cannot make the parser or the emitter run away.
"""
from __future__ import annotations

import math
import operator
import re
import struct
from dataclasses import dataclass, field, replace
from typing import Union

from .functions import FUNCTIONS, SPECIAL

MAX_STATEMENT_CHARS = 400
MAX_DEPTH = 24
FLT_MAX = 3.4028234663852886e38

_TOKEN = re.compile(r"(?P<num>\d+\.\d*(?:[eE][-+]?\d+)?|\d+(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?)"
                    r"|(?P<id>[A-Za-z_][A-Za-z0-9_]*)"
                    r"|(?P<op><=|>=|==|!=|[-+*/(),=<>.])")
_SPACE = re.compile(r"[ \t]*")
COMPARISONS = ("<", "<=", ">", ">=", "==", "!=")


# Every node also records its source span, text[start:end] (parentheses around it included),
# which messages quote; spans are not part of a node's value (compare=False).
@dataclass(frozen=True)
class Num:
    value: float          # already an FP32 value
    col: int = 0
    start: int = field(default=0, compare=False, repr=False)
    end: int = field(default=0, compare=False, repr=False)


@dataclass(frozen=True)
class Ref:
    name: str
    role: str | None      # "gate"/"up" of a paired value, else None
    col: int = 0
    start: int = field(default=0, compare=False, repr=False)
    end: int = field(default=0, compare=False, repr=False)


@dataclass(frozen=True)
class Call:
    fn: str
    args: tuple["Expr", ...]
    col: int = 0
    start: int = field(default=0, compare=False, repr=False)
    end: int = field(default=0, compare=False, repr=False)


@dataclass(frozen=True)
class BinOp:
    op: str               # + - * / or a comparison
    lhs: "Expr"
    rhs: "Expr"
    col: int = 0
    start: int = field(default=0, compare=False, repr=False)
    end: int = field(default=0, compare=False, repr=False)


@dataclass(frozen=True)
class Neg:
    arg: "Expr"
    col: int = 0
    start: int = field(default=0, compare=False, repr=False)
    end: int = field(default=0, compare=False, repr=False)


Expr = Union[Num, Ref, Call, BinOp, Neg]


@dataclass(frozen=True)
class Statement:
    target: str
    expr: Expr
    text: str


class ExprError(ValueError):
    """A statement does not parse; the message says where (column) and what is allowed."""


def fp32(value: float) -> float:
    """``value`` rounded to FP32 (as a Python float)."""
    return struct.unpack("<f", struct.pack("<f", value))[0]


def _tokenize(text: str) -> list[tuple[str, str, int]]:
    out, pos = [], 0
    while True:
        pos = _SPACE.match(text, pos).end()
        if pos >= len(text):
            break
        m = _TOKEN.match(text, pos)
        if not m:
            raise ExprError(f"unexpected character {text[pos]!r} at column {pos + 1} of {text!r}; "
                            f"allowed: ASCII names, numbers, + - * / < <= > >= == != ( ) , .")
        kind = m.lastgroup or "op"
        out.append((kind, m.group(kind), m.start()))
        pos = m.end()
    out.append(("end", "", len(text)))
    return out


class _Parser:
    def __init__(self, text: str) -> None:
        self.text, self.toks, self.i, self.depth = text, _tokenize(text), 0, 0

    def peek(self) -> tuple[str, str, int]:
        return self.toks[self.i]

    def take(self, value: str | None = None) -> tuple[str, str, int]:
        tok = self.toks[self.i]
        if value is not None and tok[1] != value:
            raise ExprError(f"expected {value!r} at column {tok[2] + 1} of {self.text!r}, "
                            f"got {tok[1] or 'end of text'!r}")
        self.i += 1
        return tok

    def _span(self, node: Expr, start: int) -> Expr:
        """``node`` spanning from ``start`` to the end of the last token taken."""
        _, value, col = self.toks[self.i - 1]
        return replace(node, start=start, end=col + len(value))

    def _enter(self, col: int) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise ExprError(f"expression nested deeper than {MAX_DEPTH} levels at column {col + 1} "
                            f"of {self.text!r}; split it into several statements")

    def expr(self) -> Expr:
        node = self.sum()
        if self.peek()[1] in COMPARISONS:
            op, col = self.take()[1:]
            node = self._span(BinOp(op, node, self.sum(), col), node.start)
            if self.peek()[1] in COMPARISONS:
                raise ExprError(f"chained comparison at column {self.peek()[2] + 1} of {self.text!r}; "
                                f"compare two values at a time")
        return node

    def sum(self) -> Expr:
        node = self.term()
        while self.peek()[1] in ("+", "-"):
            op, col = self.take()[1:]
            node = self._span(BinOp(op, node, self.term(), col), node.start)
        return node

    def term(self) -> Expr:
        node = self.unary()
        while self.peek()[1] in ("*", "/"):
            op, col = self.take()[1:]
            node = self._span(BinOp(op, node, self.unary(), col), node.start)
        return node

    def unary(self) -> Expr:
        if self.peek()[1] == "-":
            col = self.take()[2]
            self._enter(col)
            node = self._span(Neg(self.unary(), col), col)
            self.depth -= 1
            return node
        return self.primary()

    def primary(self) -> Expr:
        kind, value, col = self.take()
        if kind == "num":
            v = float(value)
            if not abs(v) <= FLT_MAX:
                raise ExprError(f"number {value} at column {col + 1} of {self.text!r} is not a finite "
                                f"FP32 value; allowed: |x| <= {FLT_MAX:.7g}")
            if v != 0.0 and fp32(v) == 0.0:
                raise ExprError(f"number {value} at column {col + 1} of {self.text!r} underflows to 0 in "
                                f"FP32; allowed: 0 or |x| >= 1.4e-45")
            return self._span(Num(fp32(v), col), col)
        if kind == "id":
            if self.peek()[1] == "(":
                return self.call(value, col)
            role = None
            if self.peek()[1] == ".":
                self.take()
                rkind, role, rcol = self.take()
                if rkind != "id":
                    raise ExprError(f"expected a role name after '.' at column {rcol + 1} of {self.text!r}")
            return self._span(Ref(value, role, col), col)
        if value == "(":
            self._enter(col)
            node = self.expr()
            self.take(")")
            self.depth -= 1
            return self._span(node, col)
        raise ExprError(f"unexpected {value or 'end of text'!r} at column {col + 1} of {self.text!r}")

    def call(self, fn: str, col: int) -> Expr:
        if fn not in FUNCTIONS and fn not in SPECIAL:
            raise ExprError(f"unknown function {fn!r} at column {col + 1} of {self.text!r}; allowed: "
                            f"{', '.join(sorted(set(FUNCTIONS) | SPECIAL))}")
        self._enter(col)
        self.take("(")
        args = [self.expr()]
        while self.peek()[1] == ",":
            self.take()
            args.append(self.expr())
        self.take(")")
        self.depth -= 1
        arity = 3 if fn == "where" else 1 if fn == "present" else FUNCTIONS[fn].arity
        if len(args) != arity:
            raise ExprError(f"{fn}() takes {arity} argument(s), got {len(args)} at column {col + 1} "
                            f"of {self.text!r}")
        if fn == "present" and not (isinstance(args[0], Ref) and args[0].role is None):
            raise ExprError(f"present() takes the name of an input or constant, at column {col + 1} "
                            f"of {self.text!r}")
        return self._span(Call(fn, tuple(args), col), col)


def parse_statement(text: object) -> Statement:
    """Parse ``target = expr`` (names are checked by the epilogue type checker)."""
    if text is None:
        raise ExprError("empty statement; allowed: a string like 'd = prob * c' (in YAML, '- #...' is a "
                        "comment, not a statement)")
    if not isinstance(text, str):
        raise ExprError(f"a statement must be a string like 'd = prob * c', got {text!r}"[:200])
    if len(text) > MAX_STATEMENT_CHARS:
        raise ExprError(f"statement of {len(text)} characters; allowed: at most {MAX_STATEMENT_CHARS} "
                        f"(split it into several statements)")
    toks = _tokenize(text)
    if len(toks) < 3 or toks[0][0] != "id" or toks[1][1] != "=":
        raise ExprError(f"a statement must read 'name = expression', got {text!r}")
    target = toks[0][1]
    if target in FUNCTIONS or target in SPECIAL:
        raise ExprError(f"cannot assign to function name {target!r} in {text!r}")
    parser = _Parser(text)
    parser.i = 2
    expr = parser.expr()
    if parser.peek()[0] != "end":
        kind, value, col = parser.peek()
        raise ExprError(f"unexpected {value!r} at column {col + 1} of {text!r}")
    return Statement(target, expr, text.strip())


def walk(expr: Expr):
    """Every node of ``expr``, depth first."""
    yield expr
    if isinstance(expr, Neg):
        yield from walk(expr.arg)
    elif isinstance(expr, BinOp):
        yield from walk(expr.lhs)
        yield from walk(expr.rhs)
    elif isinstance(expr, Call):
        for a in expr.args:
            yield from walk(a)


# --------------------------------------------------------------------------------------------
# Constant subexpressions: each is evaluated in FP32 when the spec loads; one that is not finite,
# or a division by a constant zero, or clamp() with constant bounds lo > hi, is an error
# --------------------------------------------------------------------------------------------
_FP32_OVERFLOW = 2.0 ** 128 - 2.0 ** 103     # the least magnitude that rounds to Inf in FP32
_ARITH = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}


def _round32(value: float) -> float:
    """``value`` rounded to FP32, to +-Inf past the largest finite FP32 (fp32() refuses those)."""
    if math.isnan(value) or abs(value) >= _FP32_OVERFLOW:
        return value if math.isnan(value) else math.copysign(math.inf, value)
    return fp32(value)


def _short(value: float) -> str:
    """The shortest decimal that reads back as the FP32 ``value``."""
    for digits in range(1, 10):
        text = f"{value:.{digits}g}"
        if fp32(float(text)) == value:
            return text
    return repr(value)  # pragma: no cover - 9 significant digits always read back


def check_constants(st: Statement) -> None:
    """Raise ExprError for the first (innermost, leftmost) subexpression of ``st`` that does the
    same thing to every element and is not a number: a constant subexpression (numbers only)
    whose FP32 value is Inf or NaN, a division by a constant zero, or clamp() with constant
    bounds lo > hi.

    Constants are evaluated as the interpreter does (``+ - * /`` rounded once to FP32: Python's
    float64 result of two FP32 operands rounds to the correctly rounded FP32 one; functions by
    their numpy definitions), so the error names what the kernel would compute."""
    _constant(st.expr, st.text)


def _constant(e: Expr, text: str) -> float | bool | None:
    """The FP32 value (or condition) of ``e`` if it is made of numbers only, else None."""
    if isinstance(e, Num):
        return e.value
    if isinstance(e, Neg):
        v = _constant(e.arg, text)
        return None if v is None else -v
    if isinstance(e, BinOp):
        a, b = _constant(e.lhs, text), _constant(e.rhs, text)
        if e.op == "/" and b == 0.0:
            raise ExprError(f"{_src(e, text)} divides by a constant zero (every element would be +-Inf "
                            f"or NaN); allowed: a divisor that is not a constant zero")
        if a is None or b is None:
            return None
        if e.op in COMPARISONS:
            return {"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b, "==": a == b, "!=": a != b}[e.op]
        v = _round32(_ARITH[e.op](a, b))
        return _finite(e, v, text, "")
    if isinstance(e, Call):
        if e.fn == "present":
            return None
        args = [_constant(a, text) for a in e.args]
        if e.fn == "clamp" and args[1] is not None and args[2] is not None and args[1] > args[2]:
            raise ExprError(f"{_src(e, text)} has constant bounds lo = {_short(args[1])} > hi = "
                            f"{_short(args[2])} (every element would be {_short(args[2])}); allowed: lo <= hi")
        if e.fn == "where":
            return None if None in args else (args[1] if args[0] else args[2])
        if None in args:
            return None
        v = FUNCTIONS[e.fn].numpy(*args)
        if v.dtype == bool:
            return bool(v)
        return _finite(e, float(v), text, _domain(e.fn, args))
    return None    # a name


def _src(e: Expr, text: str) -> str:
    return f"{text[e.start:e.end]!r} at column {e.start + 1} of {text!r}"


def _finite(e: Expr, v: float, text: str, why: str) -> float:
    if math.isfinite(v):
        return v
    value = "NaN" if math.isnan(v) else ("+Inf" if v > 0 else "-Inf")
    why = why or f"beyond the largest FP32 value, {FLT_MAX:.8g}"
    raise ExprError(f"{_src(e, text)} is {value} for every element ({why}); allowed: constant "
                    f"subexpressions whose FP32 value is finite")


def _domain(fn: str, args: list) -> str:
    """Why a function of finite constants is not finite ("" when it overflowed)."""
    if fn == "sqrt" and args[0] < 0:
        return "the square root of a negative number"
    if fn == "log":
        return "the log of 0" if args[0] == 0 else "the log of a negative number" if args[0] < 0 else ""
    if fn == "rcp" and args[0] == 0:
        return "1 / 0"
    if fn == "pow":
        x, y = args
        if x == 0 and y < 0:
            return "0 to a negative power"
        if x < 0 and y != math.floor(y):
            return "a negative number to a non-integer power"
    return ""
