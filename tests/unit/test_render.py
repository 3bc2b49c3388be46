"""Rendering: golden sources, determinism, strictness, naming."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fusegemm.generator.render import render
from fusegemm.generator.variants import make_variant

GOLDEN = Path(__file__).parent / "golden"

GOLDEN_CASES = {
    "grouped_gemm.sm90a.cu": ("grouped_gemm", "sm_90a", {}),
    "grouped_gemm.bias.sm100a.cu": ("grouped_gemm", "sm_100a",
                                    {"bias_dtype": "float32", "generate_c": True, "c_dtype": "float32"}),
    "gemm_amax.sm100a.cu": ("gemm_amax", "sm_100a", {}),
    "grouped_gemm_dswiglu.sm100a.cu": ("grouped_gemm_dswiglu", "sm_100a", {"discrete_col_sfd": True}),
    "grouped_gemm_srelu.sm90a.cu": ("grouped_gemm_srelu", "sm_90a", {}),
    # Specs whose source axes come from their epilogue on a kernel class's row they share with
    # others (generator/registry.py): quant reads no c_dtype, glu_mx (``kernel: scaled``) no
    # tanh_clamp_scale, swiglu no bias_dtype.
    "grouped_gemm_quant.sm100a.cu": ("grouped_gemm_quant", "sm_100a", {}),
    "grouped_gemm_glu_mx.sm90a.cu": ("grouped_gemm_glu_mx", "sm_90a", {"generate_c": True}),
    "grouped_gemm_swiglu.sm90a.cu": ("grouped_gemm_swiglu", "sm_90a", {}),
}


@pytest.mark.parametrize("fname", sorted(GOLDEN_CASES))
def test_golden_sources(fname, update_golden):
    spec, arch, choices = GOLDEN_CASES[fname]
    text = render(make_variant(spec, arch=arch, **choices)).text
    path = GOLDEN / fname
    if update_golden:
        path.write_text(text)
    assert path.is_file(), f"missing golden {path}; run pytest --update-golden"
    assert text == path.read_text(), "rendered source changed: inspect and run pytest --update-golden"


def test_render_is_deterministic_across_processes():
    v = make_variant("grouped_gemm", arch="sm_100a", scheduler="dynamic")
    here = render(v)
    code = ("from fusegemm.generator.render import render;"
            "from fusegemm.generator.variants import make_variant;"
            "import sys; s = render(make_variant('grouped_gemm', arch='sm_100a', scheduler='dynamic'));"
            "sys.stdout.write(s.digest + '\\n' + s.text)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    digest, text = out.split("\n", 1)
    assert digest == here.digest and text == here.text
    assert render(v) == here


def test_name_is_readable_plus_hash():
    s = render(make_variant("grouped_gemm", arch="sm_90a", weight_mode="discrete"))
    assert s.name == ("grouped_gemm.cbf16.dbf16.nobias.discrete.bk.static.noc.t128x256.sm90a."
                      + s.digest[:12])
    assert s.symbol == "fg_grouped_gemm_sm90a_" + s.digest[:12]
    assert f"void __launch_bounds__(Kernel::kThreads, 1)\n{s.symbol}(" in s.text


def test_different_variants_different_hashes():
    a = render(make_variant("grouped_gemm", arch="sm_90a"))
    b = render(make_variant("grouped_gemm", arch="sm_90a", d_dtype="float32"))
    assert a.digest != b.digest and a.symbol != b.symbol


def test_strict_undefined():
    """The project's environment (not one built here) refuses an undefined name, so a template
    typo fails the render instead of emitting an empty string into C++."""
    import jinja2
    from fusegemm.generator import render as r
    v = make_variant("grouped_gemm", arch="sm_90a")
    with pytest.raises(jinja2.UndefinedError, match="no_such_field"):
        r._env().from_string("{{ v.no_such_field }}").render(v=v)
    with pytest.raises(jinja2.UndefinedError, match="'undeclared' is undefined"):
        r._env().from_string("x = {{ undeclared }};").render()


LITERAL_DTYPES_SPEC = """\
schema: 2
name: literal_dtypes
kernel: grouped_gemm
problem: grouped
summary: outputs with dtypes named outright (no c_dtype/d_dtype axis)
epilogue:
  inputs:
    alpha: {per: expert}
  compute:
    - a = alpha * acc
  outputs:
    c: {dtype: float32, value: a}
    d: {dtype: float16, value: a}
  reductions:
    - {name: amax, kind: amax, of: a, scope: expert}
choices:
  ab_dtype: [bfloat16]
  tile_m: [128]
  tile_n: [128]
  cluster_m: [1]
  cluster_n: [1]
defaults: {}
"""


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_a_spec_output_dtype_is_the_kernels_element_type(arch, session_cache):
    """The kernel stores C and D in the dtypes the spec's outputs declare, also when the spec names
    them outright instead of through the c_dtype/d_dtype axes (whose defaults differ: the kernel
    once stored FP32 D into the bfloat16 buffer the op allocated, overrunning it); it compiles
    without spills on both archs."""
    from fusegemm import pipeline
    from fusegemm.generator.spec import parse_spec
    spec = parse_spec(LITERAL_DTYPES_SPEC, "literal_dtypes.yaml", expected_name="literal_dtypes")
    v = make_variant(spec, arch=arch)
    assert (v.c_dtype, v.d_dtype) != ("float32", "float16")   # the axes' defaults are other dtypes
    text = render(v).text
    assert "using ElementC = float;" in text and "using ElementD = fusegemm::half_t;" in text
    assert pipeline.get_kernel(v, session_cache).resources.local_bytes == 0


def test_every_prebuilt_kernel_stores_its_outputs_declared_dtypes():
    """Every seed spec's prebuilt variant: the rendered element types of C and D are the cpp types
    of the outputs its resolved epilogue declares (the op allocates those). Every packaged spec
    on every arch it declares that the registry implements has a prebuilt variant checked, and
    each checked variant stores at least one output."""
    import re

    from fusegemm.base.dtypes import dtype as dtype_entry
    from fusegemm.generator import registry
    from fusegemm.generator.spec import list_specs, load_spec
    from fusegemm.generator.variants import prebuild_variants
    checked, expected = set(), set()
    for name in list_specs():
        spec = load_spec(name)
        expected |= {(spec.name, a) for a in spec.choice_map["arch"] if registry.lookup(spec.kernel, a) is not None}
        for v in prebuild_variants(spec):
            resolved = v.spec.epilogue.resolve(v.choices)
            text = render(v).text
            stored = [o for o in resolved.outputs if o.name in ("c", "d")]
            assert stored, v
            for o in stored:
                m = re.search(rf"using Element{o.name.upper()} = ([\w:]+);", text)
                assert m and m.group(1) == dtype_entry(o.dtype).cpp, (v, o.name, o.dtype)
            checked.add((spec.name, v.arch))
    assert sorted(expected - checked) == []
