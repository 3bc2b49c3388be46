"""Epilogue statements: ``name = expr`` parsed into a small AST (no Python ``eval``, no C++ text).

Grammar (ASCII only; anything else is an error naming the column)::

    statement := NAME "=" expr
    expr      := sum [("<" | "<=" | ">" | ">=" | "==" | "!=") sum]
    sum       := term (("+" | "-") term)*
    term      := unary (("*" | "/") unary)*
    unary     := "-" unary | primary
    primary   := NUMBER | NAME ["." NAME] | NAME "(" expr ("," expr)* ")" | "(" expr ")"

Numbers are rounded to FP32 when parsed and must be finite there. Names and roles are resolved
and typed by generator/epilogue.py; this module only knows the shapes of statements. Sizes are
bounded (statement length, nesting depth) so a spec cannot make the parser or the emitter
run away.
"""
from __future__ import annotations

import re
import struct
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Num:
    value: float          # already an FP32 value
    col: int = 0


@dataclass(frozen=True)
class Ref:
    name: str
    role: str | None      # "gate"/"up" of a paired value, else None
    col: int = 0


@dataclass(frozen=True)
class Call:
    fn: str
    args: tuple["Expr", ...]
    col: int = 0


@dataclass(frozen=True)
class BinOp:
    op: str               # + - * / or a comparison
    lhs: "Expr"
    rhs: "Expr"
    col: int = 0


@dataclass(frozen=True)
class Neg:
    arg: "Expr"
    col: int = 0


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

    def _enter(self, col: int) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise ExprError(f"expression nested deeper than {MAX_DEPTH} levels at column {col + 1} "
                            f"of {self.text!r}; split it into several statements")

    def expr(self) -> Expr:
        node = self.sum()
        if self.peek()[1] in COMPARISONS:
            op, col = self.take()[1:]
            node = BinOp(op, node, self.sum(), col)
            if self.peek()[1] in COMPARISONS:
                raise ExprError(f"chained comparison at column {self.peek()[2] + 1} of {self.text!r}; "
                                f"compare two values at a time")
        return node

    def sum(self) -> Expr:
        node = self.term()
        while self.peek()[1] in ("+", "-"):
            op, col = self.take()[1:]
            node = BinOp(op, node, self.term(), col)
        return node

    def term(self) -> Expr:
        node = self.unary()
        while self.peek()[1] in ("*", "/"):
            op, col = self.take()[1:]
            node = BinOp(op, node, self.unary(), col)
        return node

    def unary(self) -> Expr:
        if self.peek()[1] == "-":
            col = self.take()[2]
            self._enter(col)
            node = Neg(self.unary(), col)
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
            return Num(fp32(v), col)
        if kind == "id":
            if self.peek()[1] == "(":
                return self.call(value, col)
            role = None
            if self.peek()[1] == ".":
                self.take()
                rkind, role, rcol = self.take()
                if rkind != "id":
                    raise ExprError(f"expected a role name after '.' at column {rcol + 1} of {self.text!r}")
            return Ref(value, role, col)
        if value == "(":
            self._enter(col)
            node = self.expr()
            self.take(")")
            self.depth -= 1
            return node
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
        return Call(fn, tuple(args), col)


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
