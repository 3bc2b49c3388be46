"""Spec mistakes are reported as file:line: key: message; allowed: ... (exact messages)."""
from __future__ import annotations

import contextlib
import os
import re
import signal
import textwrap
from pathlib import Path

import pytest

from fusegemm.generator.spec import load_spec, parse_spec
from fusegemm.base.errors import SpecError

# Schema 2 (the epilogue language, generator/epilogue.py): the same demo spec as in schema 1 still
# reads the same (an expert input, one statement, output d), so the line numbers below hold.
GOOD = textwrap.dedent("""\
    schema: 2
    name: demo
    kernel: grouped_gemm
    problem: grouped
    summary: test spec
    epilogue:
      inputs:
        alpha: {per: expert, dtype: float32}
      compute:
        - d = alpha * acc
      outputs:
        d: {dtype: d_dtype}
    choices:
      arch: [sm_100a, sm_90a]
      d_dtype: [bfloat16, float32]
      tile_m: [128, 256]
      tile_n: [256]
      cluster_m: [1, 2]
      cluster_n: [1]
    constraints:
      - if: {tile_m: 256}
        then: {cluster_m: [2]}
        because: "TILE_M 256 is 2-CTA"
    defaults:
      d_dtype: bfloat16
      tile_m: 128
      cluster_m: 1
    """)


def _err(text: str) -> str:
    with pytest.raises(SpecError) as info:
        parse_spec(text, "demo.yaml", expected_name="demo")
    return str(info.value)


def test_good_spec_loads():
    s = parse_spec(GOOD, "demo.yaml", expected_name="demo")
    assert s.name == "demo" and dict(s.choices)["tile_m"] == (128, 256)
    ep = s.epilogue
    assert [st.target for st in ep.statements] == ["d"]
    assert [(i.name, i.per, i.dtype, i.slot) for i in ep.inputs] == [("alpha", "expert", "float32", "alpha")]
    assert [(o.name, o.dtype, o.value) for o in ep.outputs] == [("d", "d_dtype", "d")]


CASES = [
    # (kind, edit, exact expected message)
    ("yaml syntax", lambda t: t.replace("  d_dtype: [bfloat16, float32]", "  d_dtype: [bfloat16, float32"),
     "demo.yaml:16: invalid YAML: expected ',' or ']', but got ':'"),
    ("unknown top-level key", lambda t: t + "colour: blue\n",
     "demo.yaml:28: colour: unknown key; allowed: choices, constraints, defaults, epilogue, kernel, "
     "name, prebuild, problem, schema, seed, summary"),
    ("missing required key", lambda t: t.replace("summary: test spec\n", ""),
     "demo.yaml:1: summary: required key is missing"),
    ("a problem the kernel does not solve", lambda t: t.replace("problem: grouped\n", "problem: batched\n"),
     "demo.yaml:4: problem: got 'batched'; allowed: 'grouped' (the problem kernel family grouped_gemm solves)"),
    ("wrong type", lambda t: t.replace("schema: 2", "schema: one"),
     "demo.yaml:1: schema: expected an integer, got a string 'one'"),
    ("unknown kernel family", lambda t: t.replace("kernel: grouped_gemm", "kernel: grouped_gemm_relu"),
     "demo.yaml:3: kernel: got 'grouped_gemm_relu'; allowed: grouped, kgrouped, batched, scaled, kscaled, "
     "grouped_gemm, grouped_gemm_wgrad, gemm_amax, grouped_gemm_srelu, grouped_gemm_quant, grouped_gemm_dswiglu, "
     "grouped_gemm_wgrad_fp8"),
    ("name/file mismatch", lambda t: t.replace("name: demo", "name: other"),
     "demo.yaml:2: name: 'other' must match the file name 'demo'"),
    ("unknown axis", lambda t: t.replace("  tile_n: [256]", "  tile_k: [64]"),
     "demo.yaml:17: choices.tile_k: unknown key; allowed: a_gather, a_gather_store, a_major, ab_dtype, arch, b_gather, b_major, bias_dtype, "
     "c_dtype, cd_major, cluster_m, cluster_n, d_dtype, d_scatter, discrete_col_sfd, generate_c, generate_dbias, "
     "prob_dtype, scheduler, sf_dtype, sf_vec_size, sfd_pow2, sfd_vec_size, tanh_clamp_scale, tile_m, tile_n, vector_f32, "
     "weight_mode"),
    ("bad axis value", lambda t: t.replace("tile_m: [128, 256]", "tile_m: [96, 256]"),
     "demo.yaml:16: choices.tile_m: got 96; allowed: one of 64, 128, 256"),
    ("default outside choices", lambda t: t.replace("  d_dtype: bfloat16", "  d_dtype: float16"),
     "demo.yaml:25: defaults.d_dtype: 'float16' is not among this spec's choices; allowed: bfloat16, float32"),
    ("constraint on unknown axis", lambda t: t.replace("then: {cluster_m: [2]}", "then: {cluster_k: [2]}"),
     "demo.yaml:22: constraints[0].then.cluster_k: unknown key; allowed: a_gather, a_gather_store, a_major, ab_dtype, arch, b_gather, b_major, "
     "bias_dtype, c_dtype, cd_major, cluster_m, cluster_n, d_dtype, d_scatter, discrete_col_sfd, generate_c, generate_dbias, "
     "prob_dtype, scheduler, sf_dtype, sf_vec_size, sfd_pow2, sfd_vec_size, tanh_clamp_scale, tile_m, tile_n, vector_f32, "
     "weight_mode"),
    ("defaults violate a constraint", lambda t: t.replace("  tile_m: 128\n  cluster_m: 1", "  tile_m: 256\n  cluster_m: 1"),
     "demo.yaml:24: defaults: the defaults violate a constraint for sm_100a: cluster_m=1 but "
     "TILE_M 256 is 2-CTA (allowed: [2])"),
    ("epilogue unknown name", lambda t: t.replace("d = alpha * acc", "d = gamma * acc"),
     "demo.yaml:10: epilogue.compute[0]: unknown name 'gamma' at column 5 of 'd = gamma * acc'; "
     "allowed: acc, alpha"),
    ("epilogue unknown function", lambda t: t.replace("d = alpha * acc", "d = mish(acc)"),
     "demo.yaml:10: epilogue.compute[0]: unknown function 'mish' at column 5 of 'd = mish(acc)'; "
     "allowed: abs, clamp, erf, exp, fma, gelu, gelu_tanh, isnan, log, max, min, pow, present, rcp, relu, sigmoid, "
     "silu, sqrt, square, tanh, where"),
    ("duplicate key", lambda t: t.replace("problem: grouped\n", "problem: grouped\nproblem: batched\n"),
     "demo.yaml:5: duplicate key 'problem' (first at line 4)"),
    ("empty choice list", lambda t: t.replace("tile_n: [256]", "tile_n: []"),
     "demo.yaml:17: choices.tile_n: empty list; give at least one value"),
    # schema 2: outputs are the kernel ABI's c and d, so the never-computed output is c (e: next case)
    ("output never computed", lambda t: t.replace("    d: {dtype: d_dtype}", "    c: {dtype: d_dtype}"),
     "demo.yaml:12: epilogue.outputs.c: output 'c' is never computed; computed: d (or give value:)"),
    ("output named like another buffer", lambda t: t.replace("    d: {dtype: d_dtype}", "    dprob: {dtype: d_dtype, value: d}"),
     "demo.yaml:12: epilogue.outputs.dprob: 'dprob' names a buffer the epilogue may also write (d_col, sfd_row, "
     "sfd_col, amax, dprob, dbias); give the output another name"),
    ("unsupported schema version", lambda t: t.replace("schema: 2", "schema: 1"),
     "demo.yaml:1: schema: unsupported schema version 1; allowed: 2"),
]


@pytest.mark.parametrize("kind,edit,expected", CASES, ids=[c[0] for c in CASES])
def test_spec_mistake_messages(kind, edit, expected):
    text = edit(GOOD)
    assert text != GOOD, f"the edit for {kind!r} did not apply"
    assert _err(text) == expected


def test_every_message_has_a_line_number():
    for kind, edit, _ in CASES:
        assert re.match(r"^demo\.yaml:\d+: ", _err(edit(GOOD))), kind


def test_yaml_is_loaded_safely(tmp_path: Path):
    p = tmp_path / "demo.yaml"
    p.write_text(GOOD.replace("summary: test spec", "summary: !!python/object/apply:os.system ['true']"))
    with pytest.raises(SpecError, match=r"^.*demo\.yaml:5: invalid YAML: .*python/object/apply"):
        load_spec(p)


def test_code_injection_in_epilogue_is_rejected():
    msg = _err(GOOD.replace("d = alpha * acc", 'd = acc; asm("trap")'))
    assert msg == ("demo.yaml:10: epilogue.compute[0]: unexpected character ';' at column 8 of "
                   "'d = acc; asm(\"trap\")'; allowed: ASCII names, numbers, + - * / < <= > >= == != ( ) , .")


def test_seed_specs_load():
    from fusegemm.generator.spec import list_specs
    names = sorted(load_spec(p).name for p in list_specs())
    assert names == ["gemm_amax", "grouped_gemm", "grouped_gemm_dglu", "grouped_gemm_dglu_mx", "grouped_gemm_dsrelu",
                     "grouped_gemm_dsrelu_mx",
                     "grouped_gemm_dswiglu", "grouped_gemm_dswiglu_bf16", "grouped_gemm_glu",
                     "grouped_gemm_glu_mx", "grouped_gemm_quant", "grouped_gemm_srelu",
                     "grouped_gemm_swiglu", "grouped_gemm_wgrad", "grouped_gemm_wgrad_fp8"]


def test_public_load_spec():
    import fusegemm
    from fusegemm.generator.spec import spec_dir
    assert fusegemm.load_spec(spec_dir() / "grouped_gemm.yaml").epilogue.statements[0].text == "g = alpha * acc"


# ---------------------------------------------------------------- hostile files (issue 13)


def test_a_file_that_is_not_utf8_is_a_spec_error(tmp_path: Path):
    p = tmp_path / "demo.yaml"
    p.write_bytes(GOOD.encode().replace(b"test spec", b"test \xff spec"))
    with pytest.raises(SpecError, match=r"demo\.yaml:5: not UTF-8 text: byte 0xff at offset \d+"):
        load_spec(p)


def test_deep_nesting_is_a_spec_error():
    deep = GOOD.replace("summary: test spec", "summary: " + "[" * 700 + "]" * 700)
    assert _err(deep) == "demo.yaml:5: nested more than 64 levels deep; allowed: at most 64"


def test_yaml_aliases_are_refused_quickly():
    """A 'billion laughs' alias bomb used to run > 60 s and take 3 GB (the error message printed
    the expanded value); aliases are refused while parsing."""
    import time
    levels = ['&a0 ["xxxxxxxx", "xxxxxxxx", "xxxxxxxx", "xxxxxxxx", "xxxxxxxx", "xxxxxxxx"]']
    levels += [f"&a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 9)]
    bomb = GOOD.replace("name: demo", "name: [" + ", ".join(levels) + "]")
    t0 = time.perf_counter()
    assert _err(bomb) == "demo.yaml:2: YAML aliases (*name) are not allowed in a spec; write the value out"
    assert time.perf_counter() - t0 < 1.0
    plain_anchor = GOOD.replace("summary: test spec", "summary: &s test spec")   # an anchor alone is fine
    assert parse_spec(plain_anchor, "demo.yaml", expected_name="demo").summary == "test spec"


@pytest.mark.parametrize("value", [".inf", "1e999", "1e-320", "-1.0", "0"])
def test_compile_time_constants_must_be_normal_fp32(value):
    from fusegemm.generator.axes import AXES
    import yaml
    got = yaml.safe_load(value)
    assert AXES["tanh_clamp_scale"].check(got) == ("none or a positive finite FP32 number "
                                                   "(1.1754944e-38 to 3.4028235e+38)")
    assert AXES["tanh_clamp_scale"].check(2.5) is None and AXES["tanh_clamp_scale"].check("none") is None


def test_long_values_are_cut_in_messages():
    msg = _err(GOOD.replace("problem: grouped", "problem: " + "x" * 5000))
    assert len(msg) < 800 and msg.endswith("characters)")


def test_numbers_fp32_cannot_hold_are_refused():
    """1e-320 would silently become 0 in the kernel; .inf and 1.0e999 are not finite."""
    msg = _err(GOOD.replace("d = alpha * acc", "d = alpha * acc * 1e-320"))
    assert "underflows to 0 in FP32" in msg and msg.startswith("demo.yaml:10: ")
    for default in ("1.0e-320", ".inf", "1.0e999"):
        msg = _err(GOOD.replace("alpha: {per: expert, dtype: float32}",
                                f"alpha: {{per: expert, dtype: float32, default: {default}}}"))
        assert "allowed: a finite number that FP32 represents" in msg, msg


def test_a_declared_axis_no_value_of_which_an_arch_implements_is_refused():
    """Issue 32, probe 6: a spec whose every value of an axis is outside an arch's kernel (the
    registry's limits) builds nothing on that arch; it is refused at the axis's line, naming the
    values implemented and the archs that would build it, not left to `fusegemm build`'s
    "nothing to build"."""
    only_256 = GOOD.replace("tile_m: [128, 256]", "tile_m: [256]").replace("cluster_m: [1, 2]", "cluster_m: [2]") \
        .replace("  tile_m: 128\n  cluster_m: 1\n", "")
    assert _err(only_256) == (
        "demo.yaml:16: choices.tile_m: got 256, which the sm_90a kernel of grouped_gemm does not implement "
        "(it implements 64, 128: two WGMMA consumer warpgroups: 128 cooperative (64 rows each), 64 ping-pong "
        "(a 64-row tile each, in turn)), so nothing of this spec builds on sm_90a; allowed: a value among 64, 128, "
        "or choices.arch: [sm_100a]")
    s = parse_spec(only_256.replace("arch: [sm_100a, sm_90a]", "arch: [sm_100a]"), "demo.yaml", expected_name="demo")
    assert s.choice_map["tile_m"] == (256,)
    # an axis the spec does not offer takes its neutral value (K-major A): the sm_90a block-scaled
    # kernel implements that, so a spec need not name it
    parse_spec(GOOD, "demo.yaml", expected_name="demo")


@contextlib.contextmanager
def _within(seconds: int):
    """Fail, rather than hang the suite, when the block blocks (a FIFO's open waits for a writer)."""
    def stop(signum, frame):
        raise TimeoutError(f"blocked for {seconds} s")
    previous = signal.signal(signal.SIGALRM, stop)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="POSIX special files")
def test_a_spec_path_that_is_no_regular_file_is_refused(tmp_path):
    """Issue 32, probe 8: a FIFO hung `fusegemm validate`, /dev/zero ended in a MemoryError and a
    symlink loop read as "no spec named"; each is now a SpecError naming the path."""
    from fusegemm.generator.spec import find_spec
    from fusegemm.generator.yamlload import MAX_SPEC_BYTES
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    with _within(3), pytest.raises(SpecError) as info:
        find_spec(str(fifo))
    assert str(info.value) == f"{fifo}: not a regular file (a FIFO); allowed: a YAML file"
    with _within(3), pytest.raises(SpecError) as info:
        find_spec("/dev/zero")
    assert str(info.value) == "/dev/zero: not a regular file (a character device); allowed: a YAML file"
    with pytest.raises(SpecError) as info:
        find_spec(str(tmp_path))
    assert str(info.value) == f"{tmp_path}: not a regular file (a directory); allowed: a YAML file"
    big = tmp_path / "big.yaml"
    with open(big, "wb") as fh:
        fh.truncate(MAX_SPEC_BYTES + 1)      # sparse: no megabytes written
    with pytest.raises(SpecError) as info:
        find_spec(str(big))
    assert str(info.value) == (f"{big}: {MAX_SPEC_BYTES + 1} bytes; allowed: a YAML file of at most "
                               f"{MAX_SPEC_BYTES} bytes (1 MiB)")
    for name in ("loop.yaml", "loop"):      # with or without the suffix: a path, not a spec's name
        (tmp_path / name).symlink_to(tmp_path / f"{name}.2")
        (tmp_path / f"{name}.2").symlink_to(tmp_path / name)
        with pytest.raises(SpecError) as info:
            find_spec(str(tmp_path / name))
        assert str(info.value) == (f"{tmp_path / name}: a symbolic link loop (too many levels of symbolic "
                                   "links); allowed: a YAML file")
