"""Epilogue statements parse into an AST; anything else is rejected with a clear message.

Schema 2: the parser (generator/expr.py) only knows the shapes of statements; names, roles and
types are checked by the epilogue type checker (generator/epilogue.py), so name mistakes are
exercised through it here (``_check``) and, with their file:line, in test_epilogue_errors.py.
"""
from __future__ import annotations

import re

import pytest

from fusegemm.base.errors import SpecError
from fusegemm.generator.epilogue import Input, _statements
from fusegemm.generator.expr import (BinOp, Call, ExprError, Neg, Num, Ref, fp32, parse_statement,
                                     walk)
from fusegemm.generator.spec import _Ctx
from fusegemm.generator.yamlload import Node

# The schema 1 test's names: acc, and alpha/prob/bias/s as inputs.
INPUTS = (Input("alpha", "expert", "float32", None, False, "alpha"),
          Input("prob", "row", "float32", None, False, "prob"),
          Input("bias", "column", "float32", None, False, "bias"),
          Input("s", "expert", "float32", None, False, "beta"))


def _names(expr) -> set[str]:
    return {n.name for n in walk(expr) if isinstance(n, Ref)}


def _shape(e):
    """The AST without column numbers."""
    if isinstance(e, Num):
        return ("num", e.value)
    if isinstance(e, Ref):
        return ("ref", e.name, e.role)
    if isinstance(e, Neg):
        return ("neg", _shape(e.arg))
    if isinstance(e, BinOp):
        return (e.op, _shape(e.lhs), _shape(e.rhs))
    return ("call", e.fn, tuple(_shape(a) for a in e.args))


def _check(text: str):
    """Parse and type-check one statement (as the epilogue section would)."""
    return _statements(_Ctx("t.yaml"), Node([Node(text, 1)], 1), INPUTS, (), None)[0]


def test_precedence_and_calls():
    st = parse_statement("d = prob * square(s * min(tanh(relu(alpha * acc + bias) / s), 1))")
    assert st.target == "d"
    assert isinstance(st.expr, BinOp) and st.expr.op == "*"
    assert st.expr.lhs == Ref("prob", None, 4)
    inner = st.expr.rhs
    assert isinstance(inner, Call) and inner.fn == "square"
    assert _names(st.expr) == {"prob", "s", "alpha", "acc", "bias"}
    assert _check(st.text).expr == st.expr     # every name is known to the type checker


def test_unary_minus_and_numbers():
    st = parse_statement("x = -acc * 2.5e-1 + .5")
    assert _shape(st.expr) == ("+", ("*", ("neg", ("ref", "acc", None)), ("num", 0.25)), ("num", 0.5))


def test_numbers_are_rounded_to_fp32_and_columns_kept():
    st = parse_statement("x = acc * 0.1")
    assert st.expr.rhs == Num(fp32(0.1), 10) and st.expr.rhs.value != 0.1
    assert st.expr.col == 8                     # the operator's column (0-based)


def test_roles_comparisons_and_special_forms():
    st = parse_statement("h = where(isnan(c.gate), 0, where(present(bias), c.up + bias, c.up))")
    assert _shape(st.expr)[:2] == ("call", "where")
    assert ("ref", "c", "gate") in {_shape(n) for n in walk(st.expr)}
    cmp = parse_statement("m = where(acc >= 0, acc, -acc)").expr.args[0]
    assert isinstance(cmp, BinOp) and cmp.op == ">="


@pytest.mark.parametrize("text,message", [
    ("d = acc; system(1)", "unexpected character ';'"),
    ("d = __asm__(acc)", "unknown function '__asm__'"),
    ("d = acc #", "unexpected character '#'"),
    ("d = relu(acc, acc)", "relu() takes 1 argument(s), got 2"),
    # schema 2: functions have a fixed arity (max is binary)
    ("d = max(acc)", "max() takes 2 argument(s), got 1"),
    ("d = (acc", "expected ')'"),
    ("acc * 2", "a statement must read 'name = expression'"),
    ("relu = acc", "cannot assign to function name 'relu'"),
    ("d = acc acc", "unexpected 'acc' at column 9"),
    ("d = where(acc > 0, acc)", "where() takes 3 argument(s), got 2"),
    ("d = where(present(acc * 2), acc, 0)", "present() takes the name of an input or constant"),
    ("d = where(0 < acc < 1, acc, 0)", "chained comparison at column 19"),
    ("d = acc * 1e39", "number 1e39 at column 11 of 'd = acc * 1e39' is not a finite FP32 value"),
    ("d = acc * 1e999", "number 1e999 at column 11"),
    ("d = c.", "expected a role name after '.' at column 7"),
    ("d = α * acc", "unexpected character 'α' at column 5"),
    ("d = acc" + " + acc" * 70, "statement of 427 characters; allowed: at most 400"),
    ("d = " + "(" * 25 + "acc" + ")" * 25, "expression nested deeper than 24 levels at column 29"),
])
def test_rejections(text, message):
    with pytest.raises(ExprError, match=re.escape(message)):
        parse_statement(text)


def test_rejects_non_strings():
    with pytest.raises(ExprError, match=re.escape("a statement must be a string like 'd = prob * c', got 3")):
        parse_statement(3)
    with pytest.raises(ExprError, match=re.escape("empty statement; allowed: a string like 'd = prob * c'")):
        parse_statement(None)


@pytest.mark.parametrize("text,message", [
    # schema 2: names are resolved by the type checker, which names what is allowed
    ("d = unknown", "unknown name 'unknown' at column 5 of 'd = unknown'; allowed: acc, alpha, bias, prob, s"),
    ("d = prob.gate", "prob.gate at column 5 of 'd = prob.gate': prob is not paired"),
    ("d = acc > 0", "d is a condition; a statement's value must be a number"),
    ("d = abs(acc > 0)", "argument 1 of abs() is a condition (at column 13 of 'd = abs(acc > 0)'); "
                         "allowed: a number"),
    ("d = where(acc, 1, 0)", "argument 1 of where() is a number (at column 11 of 'd = where(acc, 1, 0)'); "
                             "allowed: a condition"),
    ("alpha = acc", "'alpha' is already defined (as an input, epilogue.inputs.alpha)"),
    ("d = d * acc", "'d' at column 5 of 'd = d * acc' is used before it is defined (by this statement)"),
])
def test_type_checker_rejections(text, message):
    with pytest.raises(SpecError, match="^" + re.escape(f"t.yaml:1: epilogue.compute[0]: {message}")):
        _check(text)
