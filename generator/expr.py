"""Epilogue expressions in specs: ``name = expr`` statements, parsed into a small AST.

This is the seam of the epilogue expression language: specs already state their epilogue as
parsed statements (validated here: only declared names, known functions, numbers and
arithmetic), so a spec can never inject C++ text. The arch-neutral C++ emitter and the numpy
interpreter arrive with the expression-language issue and consume this AST.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Union

# name -> arity (None: variadic >= 2)
FUNCTIONS: dict[str, int | None] = {
    "relu": 1, "square": 1, "tanh": 1, "sigmoid": 1, "exp": 1, "abs": 1,
    "min": None, "max": None, "silu": 1,
}

_TOKEN = re.compile(r"\s*(?:(?P<num>\d+\.\d*(?:[eE][-+]?\d+)?|\d+(?:[eE][-+]?\d+)?|\.\d+)|"
                    r"(?P<id>[A-Za-z_][A-Za-z0-9_]*)|(?P<op>[-+*/(),=]))")


@dataclass(frozen=True)
class Num:
    value: float


@dataclass(frozen=True)
class Var:
    name: str


@dataclass(frozen=True)
class Call:
    fn: str
    args: tuple["Expr", ...]


@dataclass(frozen=True)
class BinOp:
    op: str
    lhs: "Expr"
    rhs: "Expr"


@dataclass(frozen=True)
class Neg:
    arg: "Expr"


Expr = Union[Num, Var, Call, BinOp, Neg]


@dataclass(frozen=True)
class Statement:
    target: str
    expr: Expr
    text: str


class ExprError(ValueError):
    """A statement does not parse or uses an unknown name; the message says where."""


def _tokenize(text: str) -> list[tuple[str, str, int]]:
    out, pos = [], 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise ExprError(f"unexpected character {text[pos:].strip()[0]!r} at column {pos + 1} "
                            f"of {text!r}; allowed: names, numbers, + - * / ( ) ,")
        kind = m.lastgroup or "op"
        out.append((kind, m.group(kind), m.start(kind)))
        pos = m.end()
    out.append(("end", "", len(text)))
    return out


class _Parser:
    def __init__(self, text: str, names: frozenset[str]) -> None:
        self.text, self.names, self.toks, self.i = text, names, _tokenize(text), 0

    def peek(self) -> tuple[str, str, int]:
        return self.toks[self.i]

    def take(self, value: str | None = None) -> tuple[str, str, int]:
        tok = self.toks[self.i]
        if value is not None and tok[1] != value:
            raise ExprError(f"expected {value!r} at column {tok[2] + 1} of {self.text!r}, "
                            f"got {tok[1] or 'end of text'!r}")
        self.i += 1
        return tok

    def expr(self) -> Expr:
        node = self.term()
        while self.peek()[1] in ("+", "-"):
            op = self.take()[1]
            node = BinOp(op, node, self.term())
        return node

    def term(self) -> Expr:
        node = self.unary()
        while self.peek()[1] in ("*", "/"):
            op = self.take()[1]
            node = BinOp(op, node, self.unary())
        return node

    def unary(self) -> Expr:
        if self.peek()[1] == "-":
            self.take()
            return Neg(self.unary())
        return self.primary()

    def primary(self) -> Expr:
        kind, value, col = self.take()
        if kind == "num":
            return Num(float(value))
        if kind == "id":
            if self.peek()[1] == "(":
                return self.call(value, col)
            if value not in self.names:
                raise ExprError(f"unknown name {value!r} at column {col + 1} of {self.text!r}; "
                                f"allowed: {', '.join(sorted(self.names))}")
            return Var(value)
        if value == "(":
            node = self.expr()
            self.take(")")
            return node
        raise ExprError(f"unexpected {value or 'end of text'!r} at column {col + 1} of {self.text!r}")

    def call(self, fn: str, col: int) -> Expr:
        if fn not in FUNCTIONS:
            raise ExprError(f"unknown function {fn!r} at column {col + 1} of {self.text!r}; "
                            f"allowed: {', '.join(sorted(FUNCTIONS))}")
        self.take("(")
        args = [self.expr()]
        while self.peek()[1] == ",":
            self.take()
            args.append(self.expr())
        self.take(")")
        arity = FUNCTIONS[fn]
        if (arity is None and len(args) < 2) or (arity is not None and len(args) != arity):
            want = "at least 2" if arity is None else str(arity)
            raise ExprError(f"{fn}() takes {want} argument(s), got {len(args)} in {self.text!r}")
        return Call(fn, tuple(args))


def parse_statement(text: str, names: frozenset[str]) -> Statement:
    """Parse ``target = expr``; every name in ``expr`` must be in ``names``."""
    if not isinstance(text, str):
        raise ExprError(f"a statement must be a string like 'd = prob * c', got {text!r}")
    toks = _tokenize(text)
    if len(toks) < 3 or toks[0][0] != "id" or toks[1][1] != "=":
        raise ExprError(f"a statement must read 'name = expression', got {text!r}")
    target = toks[0][1]
    if target in FUNCTIONS:
        raise ExprError(f"cannot assign to function name {target!r} in {text!r}")
    parser = _Parser(text, names)
    parser.i = 2
    expr = parser.expr()
    if parser.peek()[0] != "end":
        kind, value, col = parser.peek()
        raise ExprError(f"unexpected {value!r} at column {col + 1} of {text!r}")
    return Statement(target, expr, text.strip())


def names_used(expr: Expr) -> set[str]:
    if isinstance(expr, Var):
        return {expr.name}
    if isinstance(expr, Num):
        return set()
    if isinstance(expr, Neg):
        return names_used(expr.arg)
    if isinstance(expr, BinOp):
        return names_used(expr.lhs) | names_used(expr.rhs)
    return set().union(*(names_used(a) for a in expr.args))
