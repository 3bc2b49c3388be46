"""Epilogue statements parse into an AST; anything else is rejected with a clear message."""
from __future__ import annotations

import pytest

from fusegemm.generator.expr import BinOp, Call, ExprError, Neg, Num, Var, names_used, parse_statement

NAMES = frozenset({"acc", "alpha", "prob", "bias", "s"})


def test_precedence_and_calls():
    st = parse_statement("d = prob * square(s * min(tanh(relu(alpha * acc + bias) / s), 1))", NAMES)
    assert st.target == "d"
    assert isinstance(st.expr, BinOp) and st.expr.op == "*"
    assert st.expr.lhs == Var("prob")
    inner = st.expr.rhs
    assert isinstance(inner, Call) and inner.fn == "square"
    assert names_used(st.expr) == {"prob", "s", "alpha", "acc", "bias"}


def test_unary_minus_and_numbers():
    st = parse_statement("x = -acc * 2.5e-1 + .5", NAMES)
    assert st.expr == BinOp("+", BinOp("*", Neg(Var("acc")), Num(0.25)), Num(0.5))


@pytest.mark.parametrize("text,message", [
    ("d = acc; system(1)", "unexpected character ';'"),
    ("d = __asm__(acc)", "unknown function '__asm__'"),
    ("d = acc #", "unexpected character '#'"),
    ("d = relu(acc, acc)", "relu() takes 1 argument(s), got 2"),
    ("d = max(acc)", "max() takes at least 2 argument(s), got 1"),
    ("d = (acc", "expected ')'"),
    ("acc * 2", "a statement must read 'name = expression'"),
    ("relu = acc", "cannot assign to function name 'relu'"),
    ("d = unknown", "unknown name 'unknown'"),
    ("d = acc acc", "unexpected 'acc' at column 9"),
])
def test_rejections(text, message):
    with pytest.raises(ExprError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_statement(text, NAMES)
