"""Malformed ``epilogue:`` sections (schema 2, generator/epilogue.py): every mistake is a SpecError
whose EXACT message is ``file:line: key: message``, raised while loading, so no C++ is produced.

Each case edits one of two small valid specs (BASE: unpaired, optional bias, FP8-quantized D and
an amax; PAIRED: a gate/up element input and a paired D) and checks the message with equality.
``fusegemm validate`` then runs on the same file with the C++ emitter spied on: it must exit 1
with that message and never reach the emitter or the Jinja renderer.
"""
from __future__ import annotations

import ast
import re
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from fusegemm.base.errors import SpecError
from fusegemm.cli import main
from fusegemm.generator.spec import load_spec, parse_spec

BASE = textwrap.dedent("""\
    schema: 2
    name: demo
    kernel: grouped_gemm
    problem: grouped
    summary: test spec
    epilogue:
      inputs:
        alpha: {per: expert}
        prob: {per: row, default: 1.0}
        bias: {per: column, dtype: bias_dtype}
        norm_const: {per: scalar}
      compute:
        - g = alpha * acc
        - d = where(present(bias), g + prob * bias, g * prob)
      outputs:
        d: {dtype: d_dtype, quantize: {norm_const: norm_const}}
      reductions:
        - {name: amax, kind: amax, of: d, scope: expert, when: {d_dtype: [bfloat16]}}
    choices:
      arch: [sm_100a, sm_90a]
      d_dtype: [bfloat16, float8_e4m3fn]
      bias_dtype: [none, bfloat16]
      tile_m: [128]
      tile_n: [256]
      cluster_m: [1]
      cluster_n: [1]
    defaults:
      d_dtype: bfloat16
      bias_dtype: none
    """)

PAIRED = textwrap.dedent("""\
    schema: 2
    name: demo
    kernel: grouped_gemm
    problem: grouped
    summary: test spec
    epilogue:
      inputs:
        alpha: {per: expert}
        prob: {per: row}
        c: {per: element, dtype: c_dtype, paired: true}
        norm_const: {per: scalar}
      pairing: {block: 32, roles: [gate, up]}
      compute:
        - r = alpha * acc * prob
        - g = c.gate * r
        - u = c.up * r
      outputs:
        d: {dtype: d_dtype, paired: {gate: g, up: u}, quantize: {col: d_col, norm_const: norm_const}}
    choices:
      arch: [sm_100a, sm_90a]
      c_dtype: [bfloat16, float8_e4m3fn]
      d_dtype: [bfloat16, float8_e4m3fn]
      tile_m: [128]
      tile_n: [256]
      cluster_m: [1]
      cluster_n: [1]
    defaults:
      c_dtype: bfloat16
      d_dtype: bfloat16
    """)

# A K-grouped (weight-gradient) spec: the loader's extra refusals for a problem without token rows.
WGRAD = textwrap.dedent("""\
    schema: 2
    name: demo
    kernel: grouped_gemm_wgrad
    problem: kgrouped
    summary: test spec
    epilogue:
      inputs:
        alpha: {per: expert}
      compute:
        - g = alpha * acc
      outputs:
        d: {dtype: d_dtype, value: g}
    choices:
      arch: [sm_90a]
      d_dtype: [bfloat16, float8_e4m3fn]
      tile_m: [128]
      tile_n: [256]
      cluster_m: [1]
      cluster_n: [1]
    defaults:
      d_dtype: bfloat16
    """)

G = "- g = alpha * acc"                                           # BASE line 13
D = "- d = where(present(bias), g + prob * bias, g * prob)"       # BASE line 14
Q = "quantize: {norm_const: norm_const}"                          # BASE line 16
RED = "when: {d_dtype: [bfloat16]}}"                              # BASE line 18
PAIRED_D = "quantize: {col: d_col, norm_const: norm_const}}"        # PAIRED line 18, its paired d


def edit(old: str, new: str, base: str = BASE) -> str:
    assert base.count(old) == 1, f"edit target {old!r} not found exactly once"
    return base.replace(old, new)


def case(id: str, text: str, message: str, injection: bool = False):
    return pytest.param(text, message, id=("injection: " if injection else "") + id)


_FUNCS = ("abs, clamp, erf, exp, fma, gelu, gelu_tanh, isnan, log, max, min, pow, present, rcp, relu, sigmoid, "
          "silu, sqrt, square, tanh, where")
_CHARS = "allowed: ASCII names, numbers, + - * / < <= > >= == != ( ) , ."
_NAME_RULE = "allowed: a lower-case ASCII identifier that is not acc, where, present, a function or an axis"

CASES = [
    # ---- statements: functions, names, definitions ------------------------------------------
    case("unknown function", edit(G, "- g = mish(acc)"),
         f"demo.yaml:13: epilogue.compute[0]: unknown function 'mish' at column 5 of 'g = mish(acc)'; "
         f"allowed: {_FUNCS}"),
    case("wrong arity", edit(G, "- g = max(acc)"),
         "demo.yaml:13: epilogue.compute[0]: max() takes 2 argument(s), got 1 at column 5 of 'g = max(acc)'"),
    case("wrong arity of where", edit(G, "- g = where(acc > 0, acc)"),
         "demo.yaml:13: epilogue.compute[0]: where() takes 3 argument(s), got 2 at column 5 of "
         "'g = where(acc > 0, acc)'"),
    case("unknown name", edit(G, "- g = gamma * acc"),
         "demo.yaml:13: epilogue.compute[0]: unknown name 'gamma' at column 5 of 'g = gamma * acc'; "
         "allowed: acc, alpha, bias, norm_const, prob"),
    case("name used before its definition", edit(G, "- g = alpha * t\n    - t = acc"),
         "demo.yaml:13: epilogue.compute[0]: 't' at column 13 of 'g = alpha * t' is used before it is "
         "defined (by epilogue.compute[1]); statements run in order"),
    case("statement reads its own target", edit(G, "- g = g * acc"),
         "demo.yaml:13: epilogue.compute[0]: 'g' at column 5 of 'g = g * acc' is used before it is "
         "defined (by this statement); statements run in order"),
    case("redefinition of a value", edit(D, D + "\n    - g = acc"),
         "demo.yaml:15: epilogue.compute[2]: 'g' is already defined (by epilogue.compute[0]); each "
         "statement defines a new name"),
    case("redefinition of an input", edit(G, "- alpha = acc"),
         "demo.yaml:13: epilogue.compute[0]: 'alpha' is already defined (as an input, "
         "epilogue.inputs.alpha); each statement defines a new name"),
    case("redefinition of acc", edit(G, "- acc = acc * 2"),
         "demo.yaml:13: epilogue.compute[0]: 'acc' is already defined (as the accumulator); each "
         "statement defines a new name"),
    case("assigning to a function name", edit(G, "- relu = acc"),
         "demo.yaml:13: epilogue.compute[0]: cannot assign to function name 'relu' in 'relu = acc'"),
    case("assigning to where", edit(G, "- where = acc"),
         "demo.yaml:13: epilogue.compute[0]: cannot assign to function name 'where' in 'where = acc'"),
    case("invalid target name", edit(G, "- G = acc"),
         "demo.yaml:13: epilogue.compute[0]: 'G' is not a valid name; allowed: lower-case ASCII identifiers"),
    case("not an assignment", edit(G, "- acc * 2"),
         "demo.yaml:13: epilogue.compute[0]: a statement must read 'name = expression', got 'acc * 2'"),
    case("statement is a mapping", edit(G, "- g: acc"),
         "demo.yaml:13: epilogue.compute[0]: a statement must be a string like 'd = prob * c', got "
         "{'g': 'acc'}"),
    # ---- types: numbers and conditions ------------------------------------------------------
    case("statement value is a condition", edit(G, "- g = acc > 0"),
         "demo.yaml:13: epilogue.compute[0]: g is a condition; a statement's value must be a number "
         "(use where(condition, a, b)) in 'g = acc > 0'"),
    case("isnan as a value", edit(G, "- g = isnan(acc)"),
         "demo.yaml:13: epilogue.compute[0]: g is a condition; a statement's value must be a number "
         "(use where(condition, a, b)) in 'g = isnan(acc)'"),
    case("where on a number", edit(G, "- g = where(acc, 1, 0)"),
         "demo.yaml:13: epilogue.compute[0]: argument 1 of where() is a number (at column 11 of "
         "'g = where(acc, 1, 0)'); allowed: a condition (a comparison, isnan() or present())"),
    case("condition where a number is needed", edit(G, "- g = abs(acc > 0)"),
         "demo.yaml:13: epilogue.compute[0]: argument 1 of abs() is a condition (at column 13 of "
         "'g = abs(acc > 0)'); allowed: a number"),
    case("condition as an operand", edit(G, "- g = (acc > 0) + 1"),
         "demo.yaml:13: epilogue.compute[0]: the left operand of '+' is a condition (at column 10 of "
         "'g = (acc > 0) + 1'); allowed: a number"),
    case("chained comparison", edit(G, "- g = where(0 < acc < 1, acc, 0)"),
         "demo.yaml:13: epilogue.compute[0]: chained comparison at column 19 of "
         "'g = where(0 < acc < 1, acc, 0)'; compare two values at a time"),
    # ---- present() ----------------------------------------------------------------------------
    case("present of a required input", edit(G, "- g = where(present(alpha), acc, 0)"),
         "demo.yaml:13: epilogue.compute[0]: present(alpha) at column 11 of "
         "'g = where(present(alpha), acc, 0)': alpha is always present (its dtype is not an axis that "
         "can be none)"),
    case("present of an input with a default", edit(G, "- g = where(present(prob), acc, 0)"),
         "demo.yaml:13: epilogue.compute[0]: present(prob) at column 11 of "
         "'g = where(present(prob), acc, 0)': prob is always present (its dtype is not an axis that can "
         "be none; a null pointer means its default 1.0 at run time, which present() does not see)"),
    case("present of a computed value", edit(D, "- d = where(present(g), g, 0)"),
         "demo.yaml:14: epilogue.compute[1]: present(g) at column 11 of 'd = where(present(g), g, 0)': "
         "g is not an input or a constant"),
    case("present of acc", edit(G, "- g = where(present(acc), acc, 0)"),
         "demo.yaml:13: epilogue.compute[0]: present(acc) at column 11 of "
         "'g = where(present(acc), acc, 0)': acc is not an input or a constant"),
    case("present of a non-name", edit(G, "- g = where(present(acc * 2), acc, 0)"),
         "demo.yaml:13: epilogue.compute[0]: present() takes the name of an input or constant, at column "
         "11 of 'g = where(present(acc * 2), acc, 0)'"),
    case("absent input read outside present()", edit(D, "- d = g + prob * bias"),
         "demo.yaml:14: epilogue.compute[1]: 'd = g + prob * bias' reads bias, which is absent when "
         "bias_dtype is none; guard it with where(present(bias), ..., ...)"),
    case("absent input read in the other branch",
         edit(D, "- d = where(present(bias), g + prob * bias, g * bias)"),
         "demo.yaml:14: epilogue.compute[1]: 'd = where(present(bias), g + prob * bias, g * bias)' reads "
         "bias, which is absent when bias_dtype is none; guard it with where(present(bias), ..., ...)"),
    # ---- roles and pairing --------------------------------------------------------------------
    case("role on an unpaired value", edit(G, "- g = alpha * acc * prob.gate"),
         "demo.yaml:13: epilogue.compute[0]: prob.gate at column 19 of 'g = alpha * acc * prob.gate': "
         "prob is not paired, so it has no roles; write prob"),
    case("role on an unpaired accumulator", edit("alpha * acc * prob", "alpha * acc.gate * prob", PAIRED),
         "demo.yaml:14: epilogue.compute[0]: acc.gate at column 13 of 'r = alpha * acc.gate * prob': "
         "acc is not paired, so it has no roles; write acc"),
    case("paired value without a role", edit("c.gate * r", "c * r", PAIRED),
         "demo.yaml:15: epilogue.compute[1]: c at column 5 of 'g = c * r' is paired: write c.gate or c.up"),
    case("paired accumulator without a role",
         edit("roles: [gate, up]}", "roles: [gate, up], acc: true}", PAIRED),
         "demo.yaml:14: epilogue.compute[0]: acc at column 13 of 'r = alpha * acc * prob' is paired: "
         "write acc.gate or acc.up"),
    case("unknown role", edit("c.gate * r", "c.down * r", PAIRED),
         "demo.yaml:15: epilogue.compute[1]: unknown role 'down' of c at column 5 of 'g = c.down * r'; "
         "allowed: gate, up"),
    case("pairing with 3 roles", edit("roles: [gate, up]", "roles: [gate, up, down]", PAIRED),
         "demo.yaml:12: epilogue.pairing.roles: got ['gate', 'up', 'down']; allowed: two distinct "
         "lower-case names, e.g. [gate, up]"),
    case("pairing with one role twice", edit("roles: [gate, up]", "roles: [gate, gate]", PAIRED),
         "demo.yaml:12: epilogue.pairing.roles: got ['gate', 'gate']; allowed: two distinct lower-case "
         "names, e.g. [gate, up]"),
    case("pairing block 16", edit("block: 32", "block: 16", PAIRED),
         "demo.yaml:12: epilogue.pairing.block: got 16; allowed: 32 (the seed's 32-column gate/up "
         "interleave)"),
    case("paired input without pairing", edit("  pairing: {block: 32, roles: [gate, up]}\n", "", PAIRED),
         "demo.yaml:10: epilogue.inputs.c.paired: a paired input needs an epilogue pairing: section, "
         "e.g. pairing: {block: 32, roles: [gate, up]}"),
    case("paired row input", edit("prob: {per: row}", "prob: {per: row, paired: true}", PAIRED),
         "demo.yaml:9: epilogue.inputs.prob.paired: a row input cannot be paired; allowed: element inputs "
         "(with an epilogue pairing: section)"),
    # ---- inputs -------------------------------------------------------------------------------
    case("column input with a default",
         edit("bias: {per: column, dtype: bias_dtype}", "bias: {per: column, dtype: bias_dtype, default: 0.0}"),
         "demo.yaml:10: epilogue.inputs.bias.default: a column input cannot have a default; allowed on "
         "scalar, expert and row inputs"),
    case("element input with a default",
         edit("paired: true}", "paired: true, default: 0}", PAIRED),
         "demo.yaml:10: epilogue.inputs.c.default: an element input cannot have a default; allowed on "
         "scalar, expert and row inputs"),
    case("default not finite", edit("default: 1.0", "default: .inf"),
         "demo.yaml:9: epilogue.inputs.prob.default: got inf; allowed: a finite number that FP32 "
         "represents (0 or 1.4e-45 <= |x| <= 3.4e38)"),
    case("scalar input not float32", edit("norm_const: {per: scalar}", "norm_const: {per: scalar, dtype: bfloat16}"),
         "demo.yaml:11: epilogue.inputs.norm_const.dtype: got 'bfloat16'; allowed: float32 (scalar and "
         "expert inputs)"),
    case("input dtype axis not in choices", edit("dtype: bias_dtype}", "dtype: c_dtype}"),
         "demo.yaml:10: epilogue.inputs.bias.dtype: axis 'c_dtype' is not in this spec's choices"),
    case("input dtype axis offering a non-input dtype", edit("dtype: bias_dtype}", "dtype: d_dtype}"),
         "demo.yaml:10: epilogue.inputs.bias.dtype: axis 'd_dtype' offers ['float8_e4m3fn'], which a "
         "column input cannot be; allowed: float32, bfloat16, float16 (or none: absent)"),
    case("input dtype unknown", edit("dtype: bias_dtype}", "dtype: int8}"),
         "demo.yaml:10: epilogue.inputs.bias.dtype: got 'int8'; allowed: float32, bfloat16, float16 or a "
         "dtype axis in choices"),
    case("schema 1 per value", edit("alpha: {per: expert}", "alpha: {per: n_expert}"),
         "demo.yaml:8: epilogue.inputs.alpha.per: got 'n_expert'; allowed: scalar, expert, row, column, element"),
    case("too many expert inputs",
         edit("alpha: {per: expert}", "alpha: {per: expert}\n    beta: {per: expert}\n    gamma: {per: expert}\n"
              "    delta: {per: expert}"),
         "demo.yaml:11: epilogue.inputs.delta: too many expert inputs; the kernel ABI has 3 expert slot(s) "
         "(alpha, beta, expert_in2), already taken by alpha, beta, gamma"),
    case("too many scalar inputs", edit("norm_const: {per: scalar}", "norm_const: {per: scalar}\n    eps: {per: scalar}\n"
                                        "    tau: {per: scalar}"),
         "demo.yaml:13: epilogue.inputs.tau: too many scalar inputs; the kernel ABI has 2 scalar slot(s) "
         "(norm_const, scalar_in1), already taken by norm_const, eps"),
    case("input named acc", edit("alpha: {per: expert}", "acc: {per: expert}"),
         f"demo.yaml:8: epilogue.inputs.acc: 'acc' is not a valid input name (acc is the accumulator); "
         f"{_NAME_RULE}"),
    case("input named like a function", edit("alpha: {per: expert}", "relu: {per: expert}"),
         f"demo.yaml:8: epilogue.inputs.relu: 'relu' is not a valid input name (relu is a function); "
         f"{_NAME_RULE}"),
    case("input named where", edit("alpha: {per: expert}", "where: {per: expert}"),
         f"demo.yaml:8: epilogue.inputs.where: 'where' is not a valid input name (where is a special form); "
         f"{_NAME_RULE}"),
    case("input named like an axis", edit("alpha: {per: expert}", "tile_m: {per: expert}"),
         f"demo.yaml:8: epilogue.inputs.tile_m: 'tile_m' is not a valid input name (tile_m is a variant "
         f"axis); {_NAME_RULE}"),
    case("upper-case input name", edit("alpha: {per: expert}", "Alpha: {per: expert}"),
         f"demo.yaml:8: epilogue.inputs.Alpha: 'Alpha' is not a valid input name (not a lower-case ASCII "
         f"identifier); {_NAME_RULE}"),
    case("unicode input name", edit("alpha: {per: expert}", "α: {per: expert}"),
         f"demo.yaml:8: epilogue.inputs.α: 'α' is not a valid input name (not a lower-case ASCII "
         f"identifier); {_NAME_RULE}"),
    case("input name with a leading underscore", edit("alpha: {per: expert}", "_alpha: {per: expert}"),
         f"demo.yaml:8: epilogue.inputs._alpha: '_alpha' is not a valid input name (not a lower-case ASCII "
         f"identifier); {_NAME_RULE}"),
    # ---- outputs and quantization -------------------------------------------------------------
    case("output named like another buffer", edit("    d: {dtype: d_dtype,", "    amax: {dtype: d_dtype, value: d,"),
         "demo.yaml:16: epilogue.outputs.amax: 'amax' names a buffer the epilogue may also write (d_col, "
         "sfd_row, sfd_col, amax, dprob, dbias); give the output another name"),
    case("output named acc", edit("    d: {dtype: d_dtype,", "    acc: {dtype: d_dtype, value: d,"),
         f"demo.yaml:16: epilogue.outputs.acc: 'acc' is not a valid output name (acc is the accumulator); "
         f"{_NAME_RULE}"),
    case("output slot not in the ABI", edit("    d: {dtype: d_dtype,", "    y: {dtype: d_dtype, value: d, slot: e,"),
         "demo.yaml:16: epilogue.outputs.y.slot: got 'e'; allowed: c, d (the kernel ABI's output tensors)"),
    case("output named d in slot c", edit("    d: {dtype: d_dtype,", "    d: {dtype: d_dtype, slot: c,"),
         "demo.yaml:16: epilogue.outputs.d.slot: got 'c'; an output named d is slot d"),
    case("two outputs in one slot", edit("    d: {dtype: d_dtype,", "    y: {dtype: bfloat16, value: g, slot: d}\n"
                                                              "    d: {dtype: d_dtype,"),
         "demo.yaml:17: epilogue.outputs.d: slot d is taken by output 'y'; allowed: one output per slot"),
    case("three outputs", edit("    d: {dtype: d_dtype,", "    y: {dtype: bfloat16, value: g}\n    z: {dtype: bfloat16, "
                                                         "value: g}\n    d: {dtype: d_dtype,"),
         "demo.yaml:17: epilogue.outputs.z: too many outputs; the kernel ABI has 2 (c, d), already taken by d, y"),
    case("output never computed", edit("    d: {dtype: d_dtype,", "    c: {dtype: d_dtype}\n    d: {dtype: d_dtype,"),
         "demo.yaml:16: epilogue.outputs.c: output 'c' is never computed; computed: d, g (or give value:)"),
    case("value naming an unknown value", edit("d: {dtype: d_dtype,", "d: {dtype: d_dtype, value: h,"),
         "demo.yaml:16: epilogue.outputs.d.value: 'h' is not computed; computed: d, g"),
    case("value naming an input", edit("d: {dtype: d_dtype,", "d: {dtype: d_dtype, value: alpha,"),
         "demo.yaml:16: epilogue.outputs.d.value: 'alpha' is not computed; computed: d, g"),
    case("paired output without pairing", edit("d: {dtype: d_dtype,", "d: {dtype: d_dtype, paired: {gate: g, up: d},"),
         "demo.yaml:16: epilogue.outputs.d.paired: a paired output needs a pairing: section"),
    case("paired output c in a batched problem",
         edit("    d: {dtype: d_dtype, paired: {gate: g, up: u},",
              "    c: {dtype: bfloat16, paired: {gate: g, up: u}}\n    d: {dtype: d_dtype, paired: {gate: g, up: u},",
              edit("problem: grouped", "problem: batched", edit("kernel: grouped_gemm", "kernel: gemm_amax", PAIRED))),
         "demo.yaml:18: epilogue.outputs.c.paired: a paired c is an N-major grouped output; got problem "
         "'batched', cd_major ['n']; allowed: problem grouped with cd_major [n]"),
    case("paired output missing a role", edit("paired: {gate: g, up: u}", "paired: {gate: g}", PAIRED),
         "demo.yaml:18: epilogue.outputs.d.paired.up: required key is missing"),
    case("output with value and paired", edit("d: {dtype: d_dtype, paired:", "d: {dtype: d_dtype, value: g, paired:", PAIRED),
         "demo.yaml:18: epilogue.outputs.d.value: give value or paired, not both"),
    case("quantize of an output never FP8/FP4",
         edit("d_dtype: [bfloat16, float8_e4m3fn]", "d_dtype: [bfloat16, float32]"),
         "demo.yaml:16: epilogue.outputs.d.quantize: output 'd' is never FP8/FP4 (bfloat16, float32); "
         "quantization applies to float8_e4m3fn, float8_e5m2, float4_e2m1fn_x2"),
    case("quantize norm_const not a scalar input", edit(Q, "quantize: {norm_const: alpha}"),
         "demo.yaml:16: epilogue.outputs.d.quantize.norm_const: got 'alpha'; allowed: a scalar input "
         "(norm_const)"),
    case("quantize col not d_col", edit(Q, "quantize: {col: c_col, norm_const: norm_const}"),
         "demo.yaml:16: epilogue.outputs.d.quantize.col: got 'c_col'; allowed: d_col (the column-quantized "
         "copy of d, the ABI's one)"),
    case("quantize col on output c",
         edit("    d: {dtype: d_dtype, " + Q + "}",
              "    c: {dtype: d_dtype, value: d, quantize: {col: d_col, norm_const: norm_const}}\n"
              "    d: {dtype: d_dtype}"),
         "demo.yaml:16: epilogue.outputs.c.quantize.col: output 'c' (slot c) has no column-quantized copy; only the "
         "output in slot d "
         "has one (d_col, the ABI's one)"),
    case("quantize with nothing to do", edit(Q, "quantize: {row: false, norm_const: norm_const}"),
         "demo.yaml:16: epilogue.outputs.d.quantize: quantizes nothing; set row: true or col: d_col"),
    case("unknown convention", edit(Q, "quantize: {norm_const: norm_const, convention: gelu}"),
         "demo.yaml:16: epilogue.outputs.d.quantize.convention: got 'gelu'; allowed: quant, srelu, dswiglu"),
    case("quantize vec not 32 or 128", edit(Q, "quantize: {norm_const: norm_const, vec: 64}"),
         "demo.yaml:16: epilogue.outputs.d.quantize.vec: got 64; allowed: 32, 128 or the axis sfd_vec_size"),
    case("quantize vec axis not chosen", edit(Q, "quantize: {norm_const: norm_const, vec: sfd_vec_size}"),
         "demo.yaml:16: epilogue.outputs.d.quantize.vec: axis 'sfd_vec_size' is not in this spec's choices"),
    case("quantize pow2 axis not chosen", edit(Q, "quantize: {norm_const: norm_const, vec: 128, pow2: sfd_pow2}"),
         "demo.yaml:16: epilogue.outputs.d.quantize.pow2: axis 'sfd_pow2' is not in this spec's choices"),
    case("quantize pow2 not a bool", edit(Q, "quantize: {norm_const: norm_const, vec: 128, pow2: maybe}"),
         "demo.yaml:16: epilogue.outputs.d.quantize.pow2: got 'maybe'; allowed: true, false or the axis sfd_pow2"),
    case("quantize pow2 on MX blocks", edit(Q, "quantize: {norm_const: norm_const, pow2: true}"),
         "demo.yaml:16: epilogue.outputs.d.quantize.pow2: power-of-two scales are the 1x128 blocks' (vec: 128); "
         "MX blocks' E8M0 scales are powers of two already"),
    case("quantize vec 128 with a column copy", edit(Q, "quantize: {norm_const: norm_const, vec: 128, col: d_col}"),
         "demo.yaml:16: epilogue.outputs.d.quantize.vec: 1x128 blocks (FP32 scales, the blockwise recipe) quantize "
         "rows only: drop col: d_col (32-row column blocks need vec 32)"),
    # ---- reductions ---------------------------------------------------------------------------
    case("unknown reduction name", edit("{name: amax, kind: amax", "{name: maxabs, kind: amax"),
         "demo.yaml:18: epilogue.reductions[0].name: got 'maxabs'; allowed: amax, dprob, dbias (the kernel ABI's "
         "reduction buffers)"),
    case("reduction name/kind mismatch", edit("{name: amax, kind: amax", "{name: amax, kind: sum"),
         "demo.yaml:18: epilogue.reductions[0].kind: got 'sum'; allowed for amax: amax"),
    case("sum with scope expert", edit("{name: amax, kind: amax", "{name: dprob, kind: sum"),
         "demo.yaml:18: epilogue.reductions[0].scope: got 'expert'; allowed for dprob: row"),
    case("amax with scope row", edit("scope: expert", "scope: row"),
         "demo.yaml:18: epilogue.reductions[0].scope: got 'row'; allowed for amax: expert, global"),
    case("dbias with scope row", edit("{name: amax, kind: amax, of: d, scope: expert", "{name: dbias, kind: sum, of: d, scope: row"),
         "demo.yaml:18: epilogue.reductions[0].scope: got 'row'; allowed for dbias: column"),
    case("column sum on a batched problem",
         edit("{name: amax, kind: amax, of: d, scope: expert", "{name: dbias, kind: sum, of: d, scope: column",
              edit("problem: grouped", "problem: batched", edit("kernel: grouped_gemm", "kernel: gemm_amax"))),
         "demo.yaml:18: epilogue.reductions[0].scope: got 'column' on a batched problem; allowed: a grouped "
         "problem (a column sum runs over each expert's rows)"),
    case("amax slot out of range", edit("scope: expert,", "scope: expert, slot: 4,"),
         "demo.yaml:18: epilogue.reductions[0].slot: got 4; allowed: 0 to 3"),
    case("reduction of an unknown value", edit("of: d,", "of: h,"),
         "demo.yaml:18: epilogue.reductions[0].of: 'h' is not computed; computed: d, g"),
    # A paired output is one tensor of two values per element column: only a column sum (one sum
    # per stored column) reduces it; a name that is both a value and a paired output is ambiguous.
    case("amax of a paired output", edit(PAIRED_D, PAIRED_D + "\n  reductions:\n    - {name: amax, kind: amax, of: d, "
                                                           "scope: expert}", PAIRED),
         "demo.yaml:20: epilogue.reductions[0].of: 'd' is a paired output (gate/up blocks, twice the element width); "
         "got scope 'expert'; allowed: a column sum (name dbias, scope column), or a computed value: g, r, u"),
    case("row sum of a paired output", edit(PAIRED_D, PAIRED_D + "\n  reductions:\n    - {name: dprob, kind: sum, of: d, "
                                                              "scope: row}", PAIRED),
         "demo.yaml:20: epilogue.reductions[0].of: 'd' is a paired output (gate/up blocks, twice the element width); "
         "got scope 'row'; allowed: a column sum (name dbias, scope column), or a computed value: g, r, u"),
    case("column sum of a name both computed and a paired output",
         edit(PAIRED_D, PAIRED_D + "\n  reductions:\n    - {name: dbias, kind: sum, of: d, scope: column}",
              edit("    - u = c.up * r", "    - u = c.up * r\n    - d = g + u", PAIRED)),
         "demo.yaml:21: epilogue.reductions[0].of: 'd' names both a computed value and the paired output d; rename "
         "one (the reduction could mean either)"),
    case("column sum of an unknown value in a paired spec",
         edit(PAIRED_D, PAIRED_D + "\n  reductions:\n    - {name: dbias, kind: sum, of: h, scope: column}", PAIRED),
         "demo.yaml:20: epilogue.reductions[0].of: 'h' is not computed; computed: g, r, u (or, for a column sum, a "
         "paired output: d)"),
    case("two reductions writing one slot",
         edit(RED, RED + "\n    - {name: amax, kind: amax, of: g, scope: expert}"),
         "demo.yaml:19: epilogue.reductions[1]: writes amax slot 0, like epilogue.reductions[0]; give it "
         "another slot: or when: conditions that never hold together (one axis, disjoint values)"),
    case("three amax reductions live together",
         edit(RED, RED + "\n    - {name: amax, kind: amax, of: g, scope: expert, slot: 1}"
                         "\n    - {name: amax, kind: amax, of: g, scope: expert, slot: 2}"),
         "demo.yaml:20: epilogue.reductions[2]: 3 amax reductions are live together (when d_dtype=bfloat16); "
         "allowed: at most 2 per variant (the kernel keeps 2 amax partials)"),
    case("amax scopes mixed in one variant",
         edit(RED, RED + "\n    - {name: amax, kind: amax, of: g, scope: global, slot: 1}"),
         "demo.yaml:19: epilogue.reductions[1].scope: mixes amax scopes ['expert', 'global'] (when "
         "d_dtype=bfloat16); allowed: one scope per variant (all expert or all global)"),
    case("when naming an axis not in choices", edit(RED, "when: {c_dtype: [bfloat16]}}"),
         "demo.yaml:18: epilogue.reductions[0].when.c_dtype: unknown key; allowed: arch, bias_dtype, "
         "cluster_m, cluster_n, d_dtype, tile_m, tile_n"),
    case("when naming a value not offered", edit(RED, "when: {d_dtype: [float16]}}"),
         "demo.yaml:18: epilogue.reductions[0].when.d_dtype: 'float16' is not among this spec's choices; "
         "allowed: bfloat16, float8_e4m3fn"),
    case("when naming a bool axis not in choices", edit(RED, "when: generate_c}"),
         "demo.yaml:18: epilogue.reductions[0].when: got 'generate_c'; allowed: a true/false axis in "
         "choices, or a mapping axis -> values"),
    # ---- sizes and numbers --------------------------------------------------------------------
    case("number beyond FP32", edit(G, "- g = alpha * acc * 1e39"),
         "demo.yaml:13: epilogue.compute[0]: number 1e39 at column 19 of 'g = alpha * acc * 1e39' is not a "
         "finite FP32 value; allowed: |x| <= 3.402823e+38"),
    case("number beyond float64", edit(G, "- g = alpha * acc * 1e999"),
         "demo.yaml:13: epilogue.compute[0]: number 1e999 at column 19 of 'g = alpha * acc * 1e999' is not "
         "a finite FP32 value; allowed: |x| <= 3.402823e+38"),
    case("statement too long", edit(G, G + " + acc" * 65),
         "demo.yaml:13: epilogue.compute[0]: statement of 405 characters; allowed: at most 400 (split it "
         "into several statements)"),
    case("nesting too deep", edit(G, "- g = " + "(" * 25 + "acc" + ")" * 25),
         "demo.yaml:13: epilogue.compute[0]: expression nested deeper than 24 levels at column 29 of "
         f"'g = {'(' * 25}acc{')' * 25}'; split it into several statements"),
    case("negation nested too deep", edit(G, "- g = " + "-" * 25 + "acc"),
         "demo.yaml:13: epilogue.compute[0]: expression nested deeper than 24 levels at column 29 of "
         f"'g = {'-' * 25}acc'; split it into several statements"),
    case("more than 64 statements", edit(D, D + "".join(f"\n    - x{i} = acc" for i in range(63))),
         "demo.yaml:12: epilogue.compute: 65 statements; allowed: at most 64"),
    case("schema 1 quantization key", edit("  reductions:", "  quantization: {}\n  reductions:"),
         "demo.yaml:17: epilogue.quantization: unknown key; allowed: compute, inputs, outputs, pairing, "
         "reductions"),
    # ---- empty sections, output dtypes, unread inputs ---------------------------------------
    case("empty compute", edit(G + "\n    - d = where(present(bias), g + prob * bias, g * prob)", "[]").replace(
        "compute:\n    []", "compute: []"),
         "demo.yaml:12: epilogue.compute: empty; give at least one statement"),
    case("empty outputs", edit("outputs:\n    d: {dtype: d_dtype, " + Q + "}", "outputs: {}"),
         "demo.yaml:15: epilogue.outputs: empty; declare at least one output (c or d)"),
    case("output dtype axis not in choices", edit("d: {dtype: d_dtype,", "d: {dtype: c_dtype,"),
         "demo.yaml:16: epilogue.outputs.d.dtype: axis 'c_dtype' is not in this spec's choices"),
    case("output dtype axis offering a non-output dtype", edit("d: {dtype: d_dtype,", "d: {dtype: bias_dtype,"),
         "demo.yaml:16: epilogue.outputs.d.dtype: axis 'bias_dtype' offers ['none'], which an output cannot be; "
         "allowed: float32, float16, bfloat16, float8_e4m3fn, float8_e5m2, float4_e2m1fn_x2"),
    case("output dtype unknown", edit("d: {dtype: d_dtype,", "d: {dtype: int8,"),
         "demo.yaml:16: epilogue.outputs.d.dtype: got 'int8'; allowed: float32, float16, bfloat16, float8_e4m3fn, "
         "float8_e5m2, float4_e2m1fn_x2 or a dtype axis in choices"),
    case("input never read", edit("alpha: {per: expert}", "alpha: {per: expert}\n    beta: {per: expert}"),
         "demo.yaml:9: epilogue.inputs.beta: 'beta' is declared but no variant reads it: no statement names it "
         "and no quantize: takes it as norm_const; allowed: read it in a statement an output or reduction uses, "
         "or remove it"),
    # ---- K-grouped problems: no token rows, no pairing, no SFD ----------------------------------
    case("K-grouped row input", edit("alpha: {per: expert}", "alpha: {per: expert}\n    prob: {per: row}",
                                     edit("- g = alpha * acc", "- g = alpha * acc * prob", WGRAD)),
         "demo.yaml:7: epilogue.inputs.prob.per: got 'row' (a K-grouped problem's output rows are per expert "
         "(L, M, N); it has no token rows); allowed: expert, column, element, scalar"),
    case("K-grouped row reduction",
         edit("value: g}", "value: g}\n  reductions:\n    - {name: dprob, kind: sum, of: g, scope: row}", WGRAD),
         "demo.yaml:13: epilogue.reductions: dprob: got scope 'row' (a K-grouped problem's output rows are per "
         "expert (L, M, N); it has no token rows); allowed: amax of scope expert or global"),
    case("K-grouped pairing", edit("  compute:", "  pairing: {block: 32, roles: [gate, up]}\n  compute:", WGRAD),
         "demo.yaml:9: epilogue.pairing: got a gate/up pairing; allowed: none (a K-grouped problem's outputs are "
         "unpaired weight gradients)"),
    case("K-grouped quantize",
         edit("alpha: {per: expert}", "alpha: {per: expert}\n    norm_const: {per: scalar}",
              edit("value: g}", "value: g, quantize: {norm_const: norm_const}}", WGRAD)),
         "demo.yaml:12: epilogue.outputs.d.quantize: got an SFD quantization; allowed: none on a K-grouped problem"),
    # ---- injection attempts: rejected by the tokenizer/parser/loader, nothing reaches C++ -----
    case("close a string and call system", edit(G, '- g = acc"); system("rm -rf /'),
         "demo.yaml:13: epilogue.compute[0]: unexpected character '\"' at column 8 of "
         f"'g = acc\"); system(\"rm -rf /'; {_CHARS}", injection=True),
    case("__import__", edit(G, "- g = __import__('os')"),
         "demo.yaml:13: epilogue.compute[0]: unexpected character \"'\" at column 16 of "
         f"\"g = __import__('os')\"; {_CHARS}", injection=True),
    case("__import__ as a call", edit(G, "- g = __import__(acc)"),
         "demo.yaml:13: epilogue.compute[0]: unknown function '__import__' at column 5 of "
         f"'g = __import__(acc)'; allowed: {_FUNCS}", injection=True),
    case("#include", edit(G, "- '#include <cstdio>'"),
         f"demo.yaml:13: epilogue.compute[0]: unexpected character '#' at column 1 of '#include <cstdio>'; "
         f"{_CHARS}", injection=True),
    case("#include read as a YAML comment", edit(G, "- #include <cstdio>"),
         "demo.yaml:13: epilogue.compute[0]: empty statement; allowed: a string like 'd = prob * c' (in "
         "YAML, '- #...' is a comment, not a statement)", injection=True),
    case("backslash-newline", edit(G, "- |\n      g = alpha * \\\n      acc"),
         "demo.yaml:13: epilogue.compute[0]: unexpected character '\\\\' at column 13 of "
         f"'g = alpha * \\\\\\nacc\\n'; {_CHARS}", injection=True),
    case("newline", edit(G, "- |\n      g = alpha *\n      acc"),
         "demo.yaml:13: epilogue.compute[0]: unexpected character '\\n' at column 12 of "
         f"'g = alpha *\\nacc\\n'; {_CHARS}", injection=True),
    case("second statement after ;", edit(G, "- g = acc; x = 1"),
         f"demo.yaml:13: epilogue.compute[0]: unexpected character ';' at column 8 of 'g = acc; x = 1'; "
         f"{_CHARS}", injection=True),
    case("C comment", edit(G, "- g = acc /* c */"),
         "demo.yaml:13: epilogue.compute[0]: unexpected '*' at column 10 of 'g = acc /* c */'", injection=True),
    case("YAML python tag", edit(G, "- !!python/object/apply:os.system ['true']"),
         "demo.yaml:13: invalid YAML: could not determine a constructor for the tag "
         "'tag:yaml.org,2002:python/object/apply:os.system'", injection=True),
    case("YAML python/object tag", edit(G, "- !!python/object:os.system {}"),
         "demo.yaml:13: invalid YAML: could not determine a constructor for the tag "
         "'tag:yaml.org,2002:python/object:os.system'", injection=True),
    case("input name", edit("alpha: {per: expert}", "'a); system(1': {per: expert}"),
         f"demo.yaml:8: epilogue.inputs.a); system(1: 'a); system(1' is not a valid input name (not a "
         f"lower-case ASCII identifier); {_NAME_RULE}", injection=True),
    case("role name", edit("roles: [gate, up]", "roles: [gate, 'up); x(']", PAIRED),
         "demo.yaml:12: epilogue.pairing.roles: got ['gate', 'up); x(']; allowed: two distinct lower-case "
         "names, e.g. [gate, up]", injection=True),
    case("dtype", edit("dtype: bias_dtype}", "dtype: 'float; x'}"),
         "demo.yaml:10: epilogue.inputs.bias.dtype: got 'float; x'; allowed: float32, bfloat16, float16 or a "
         "dtype axis in choices", injection=True),
    case("when value", edit(RED, "when: {d_dtype: ['bfloat16; x']}}"),
         "demo.yaml:18: epilogue.reductions[0].when.d_dtype: 'bfloat16; x' is not among this spec's "
         "choices; allowed: bfloat16, float8_e4m3fn", injection=True),
]
INJECTIONS = [c for c in CASES if c.id.startswith("injection: ")]


@pytest.fixture
def cpp_spy(monkeypatch):
    """Records every call into the C++ rule emitter and the Jinja renderer."""
    from fusegemm.generator import emit, render
    calls: list[str] = []
    real_rule, real_env = emit.rule_model, render._env

    def rule_model(*a, **k):
        calls.append("rule_model")
        return real_rule(*a, **k)

    def env():
        calls.append("render._env")
        return real_env()
    monkeypatch.setattr(emit, "rule_model", rule_model)
    monkeypatch.setattr(render, "rule_model", rule_model)
    monkeypatch.setattr(render, "_env", env)
    return calls


def _error(text: str) -> str:
    with pytest.raises(SpecError) as info:
        parse_spec(text, "demo.yaml", expected_name="demo")
    return str(info.value)


def _validate(tmp_path: Path, text: str):
    path = tmp_path / "demo.yaml"
    path.write_text(text)
    return path, CliRunner().invoke(main, ["validate", str(path)])


def _raise_sites(path: Path) -> dict[int, range]:
    """First line -> lines of every ``raise`` in ``path`` not marked ``pragma: no cover``."""
    lines = path.read_text().splitlines()
    return {n.lineno: range(n.lineno, n.end_lineno + 1) for n in ast.walk(ast.parse("\n".join(lines)))
            if isinstance(n, ast.Raise) and "pragma: no cover" not in lines[n.lineno - 1]}


def _reached(exc: BaseException, path: Path, sites: dict[int, range]) -> set[int]:
    """The raise sites of ``path`` the error came through (the error itself and what it was
    raised from or during: an ExprError becomes the SpecError of its statement)."""
    out = set()
    while exc is not None:
        tb = exc.__traceback__
        while tb is not None:
            if Path(tb.tb_frame.f_code.co_filename).resolve() == path:
                out |= {first for first, span in sites.items() if tb.tb_lineno in span}
            tb = tb.tb_next
        exc = exc.__cause__ or exc.__context__
    return out


def _unreachable() -> dict[str, str]:
    """Refusals of the loader no spec text can reach, by a fragment of their message, each with
    the reason, which is checked here so the exemption lapses when it stops being true."""
    from fusegemm.generator import axes, epilogue
    # Optional names: inputs whose dtype is an axis that can be none (row, column and element
    # inputs: scalar and expert inputs are float32), one name per such axis at most, and the
    # constant axes.
    slots = sum(len(epilogue.SLOTS[p]) for p in ("row", "column", "element"))
    none_able = sum(1 for a in axes.AXES.values()
                    if a.allowed and "none" in a.allowed and set(a.allowed) & set(epilogue.ELEMENT_DTYPES))
    most = min(slots, none_able) + sum(1 for a in axes.AXES.values() if a.constant)
    assert most <= epilogue.MAX_OPTIONAL, "more optional names fit the ABI now: write the case"
    return {"optional inputs/constants; allowed: at most": f"at most {most} optional names fit the ABI"}


def test_every_refusal_of_the_loader_has_a_case():
    """Each ``raise`` of generator/epilogue.py is reached by a case above (its message checked
    exactly by test_malformed_epilogue), or is one no spec can reach (a ``pragma: no cover``
    on its line, or listed by _unreachable with its reason). A refusal added without a case,
    or a case that stops reaching its refusal, fails here."""
    from fusegemm.generator import epilogue
    path = Path(epilogue.__file__).resolve()
    sites = _raise_sites(path)
    reached: set[int] = set()
    for c in CASES:
        text, _ = c.values
        try:
            parse_spec(text, "demo.yaml", expected_name="demo")
        except SpecError as exc:
            reached |= _reached(exc, path, sites)
    source = path.read_text().splitlines()
    exempt = set()
    for fragment in _unreachable():
        hits = [first for first, span in sites.items() if any(fragment in source[i - 1] for i in span)]
        assert len(hits) == 1, f"{fragment!r} names {len(hits)} raises of {path.name}; expected one"
        exempt |= set(hits)
    missing = sorted(set(sites) - reached - exempt)
    assert [f"{path.name}:{line}: {source[line - 1].strip()}" for line in missing] == []
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("base", [BASE, PAIRED], ids=["base", "paired"])
def test_bases_are_valid_and_reach_the_emitter(tmp_path, cpp_spy, base):
    """The control: the unedited specs load, and validate does render their rule (the spy sees it)."""
    s = parse_spec(base, "demo.yaml", expected_name="demo")
    assert s.epilogue.statements
    path, r = _validate(tmp_path, base)
    assert r.exit_code == 0, r.output
    assert "struct Rule {" in r.output and "rule_model" in cpp_spy and "render._env" in cpp_spy


@pytest.mark.parametrize("text,message", CASES)
def test_malformed_epilogue(tmp_path, cpp_spy, text, message):
    assert _error(text) == message
    assert re.match(r"^demo\.yaml:\d+: (epilogue[^:]*: |invalid YAML: )", message)
    # the CLI on the same file: exit 1 with the same message (path of the file), and no C++
    path, r = _validate(tmp_path, text)
    assert r.exit_code == 1
    assert r.output == f"Error: {tmp_path}/{message}\n"
    assert "struct Rule" not in r.output and cpp_spy == []


@pytest.mark.parametrize("text,message", INJECTIONS)
def test_injection_never_reaches_cpp(tmp_path, cpp_spy, text, message):
    """The spec does not load at all (no Spec object exists to render), and neither validate nor
    generate writes any C++."""
    path = tmp_path / "demo.yaml"
    path.write_text(text)
    with pytest.raises(SpecError):
        load_spec(path)
    out = tmp_path / "out"
    r = CliRunner().invoke(main, ["generate", str(path), "-o", str(out)])
    assert r.exit_code == 1 and f"Error: {tmp_path}/{message}" in r.output
    assert not out.exists() or not any(out.iterdir())
    assert cpp_spy == []


def test_paired_blocks_need_whole_blocks_of_n():
    """An epilogue that reads or writes 32-column gate/up blocks refuses an N that ends inside a
    block (a partial block's role-1 columns lie past the row of its paired C: an out-of-bounds
    read on the last row), before any launch; unpaired rules keep N % 8."""
    from fusegemm import EpilogueGemm
    from fusegemm.base.errors import ArgumentError
    dsw = EpilogueGemm("grouped_gemm_dswiglu_bf16", arch="sm_90a")    # paired C input, paired D
    with pytest.raises(ArgumentError, match=r"b_tensor N: got 40; allowed: a multiple of 32"):
        dsw.widths(40)
    assert dsw.widths(64)[0] == 64
    with pytest.raises(ArgumentError, match=r"b_tensor N: got 96; allowed: a multiple of 64"):
        EpilogueGemm("grouped_gemm_swiglu", arch="sm_90a").widths(96)   # paired accumulator
    assert EpilogueGemm("grouped_gemm", arch="sm_90a").widths(40)[0] == 40
