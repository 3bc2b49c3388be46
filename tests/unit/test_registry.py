"""The registry of what is implemented (generator/registry.py): every row's declared facts are
true of the templates it renders, every seed spec's defaults and prebuild list land on a row,
and adding an arch touches only the arch table, the registry and the headers."""
from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from fusegemm.base.archs import ARCHS
from fusegemm.base.errors import UnsupportedError
from fusegemm.generator import registry
from fusegemm.generator.axes import AXES, LAUNCH_AXES
from fusegemm.generator.render import render
from fusegemm.generator.spec import find_spec, list_specs
from fusegemm.generator.variants import default_choice, make_variant

SPECS = [p.stem for p in list_specs()]
# The seed spec of each family (named after it; user-style specs such as grouped_gemm_swiglu
# share a family but read fewer of its axes).
SPEC_OF = {find_spec(s).kernel: s for s in SPECS if find_spec(s).kernel == s}


def _alternatives(axis: str, value):
    """Values of ``axis`` other than ``value`` that any template can render."""
    a = AXES[axis]
    if a.kind == "bool":
        return [not value]
    if a.kind == "positive_float_or_none":
        return [1.5] if value == "none" else ["none"]
    return [x for x in a.allowed if x != value and x != "none"] or [x for x in a.allowed if x != value]


@pytest.mark.parametrize("row", registry.ROWS, ids=lambda r: f"{r.family}.{r.arch}")
def test_source_axes_are_exactly_the_axes_that_change_the_source(row):
    """Render the row's default variant with each axis changed (bypassing the spec, so axes
    with one declared value are tested too): the source changes iff the row declares the axis.
    A wrong declaration would let `--variant` accept an axis that changes nothing, or refuse
    one that does."""
    base = make_variant(SPEC_OF[row.family], arch=row.arch)
    ref = render(base).digest
    changes = {}
    for axis in AXES:
        if axis == "arch":
            continue
        digests = set()
        for alt in _alternatives(axis, getattr(base, axis)):
            try:
                digests.add(render(dataclasses.replace(base, **{axis: alt})).digest)
            except (ValueError, UnsupportedError):
                continue   # e.g. an sf_dtype with no scale type, or a value outside the row's limits
        changes[axis] = any(d != ref for d in digests)
    assert {a for a, changed in changes.items() if changed} == set(row.source_axes)
    # The cluster reaches only the sm_90a BF16 kernel's source (its 1x1 build has no cluster
    # machinery); every other kernel serves every legal cluster with one cubin.
    sees_cluster = (row.family, row.arch) == ("grouped_gemm", "sm_90a")
    assert all(changes[a] == sees_cluster for a in LAUNCH_AXES)


@pytest.mark.parametrize("spec", SPECS)
def test_defaults_and_prebuild_land_on_a_row(spec):
    s = find_spec(spec)
    for arch in s.choice_map["arch"]:
        row = registry.lookup(s.kernel, arch)
        assert row is not None, (spec, arch)
        assert row.problem(default_choice(s, arch)) is None, (spec, arch)
        for entry in s.prebuild:
            e = dict(entry)
            if e.pop("arch", arch) == arch:
                v = make_variant(s, arch=arch, **e)
                assert row.problem(v.choices) is None, (spec, arch, e)


def test_resolve_says_why():
    choice = default_choice(find_spec("grouped_gemm"), "sm_90a")
    assert registry.resolve("grouped_gemm", "sm_90a", choice).status == registry.IMPLEMENTED
    with pytest.raises(UnsupportedError, match=r"^tile_m=256 is not implemented for grouped_gemm on "
                                               r"sm_90a; implemented: 64, 128 \(") as info:
        registry.resolve("grouped_gemm", "sm_90a", {**choice, "tile_m": 256})
    assert info.value.axis == "tile_m"
    # The sm_90a block-scaled kernel implements MXFP8 only: FP4 A/B is refused naming the axis.
    srelu = default_choice(find_spec("grouped_gemm_srelu"), "sm_90a")
    assert registry.resolve("grouped_gemm_srelu", "sm_90a", srelu).status == registry.IMPLEMENTED
    with pytest.raises(UnsupportedError, match=r"^ab_dtype='float4_e2m1fn_x2' is not implemented for "
                                               r"grouped_gemm_srelu on sm_90a; implemented: "
                                               r"float8_e4m3fn, float8_e5m2 \(MXFP8 only") as info:
        registry.resolve("grouped_gemm_srelu", "sm_90a", {"ab_dtype": "float4_e2m1fn_x2"})
    assert info.value.axis == "ab_dtype"
    with pytest.raises(UnsupportedError, match=r"^arch: got 'sm_80'; allowed: sm_100a, sm_90a$"):
        registry.resolve("grouped_gemm", "sm_80", choice)
    assert registry.status("grouped_gemm", "sm_80") == registry.NONE


def test_rows_are_validated():
    with pytest.raises(ValueError, match=r"arch: got 'sm_80'"):
        registry.Implementation("x", "sm_80", "t", "h", "k", None, ())
    with pytest.raises(ValueError, match=r"source_axes: got \['cluster_m'\]"):
        registry.Implementation("x", "sm_90a", "t", "h", "k", None, ("cluster_m",))
    # status is not declared: a row is an implementation, its absence is status none
    assert registry.Implementation("x", "sm_90a", "t", "h", "k", None, ()).status == registry.IMPLEMENTED


ADD_AN_ARCH = r"""
import dataclasses
import fusegemm.base.archs as archs
# 1. the arch table
archs.ARCHS["sm_120a"] = archs.Arch("sm_120a", (12, 0), "sm90", "a hypothetical third arch", executed=False)
archs.ARCH_NAMES = tuple(archs.ARCHS)
# 2. its registry rows (here: the sm90 headers stand in for 3., its own headers)
import fusegemm.generator.registry as registry
row = dataclasses.replace(registry.lookup("grouped_gemm", "sm_90a"), arch="sm_120a")
registry.ROWS += (row,)
registry._BY_KEY[("grouped_gemm", "sm_120a")] = row
# Nothing else: specs, variants, rendering, config, the CLI's --arch and the build read the tables.
from fusegemm.generator.variants import make_variant
from fusegemm.generator.render import render
from fusegemm.runtime import config
from fusegemm import build
v = make_variant("grouped_gemm", arch="sm_120a")
src = render(v)
assert src.symbol.startswith("fg_grouped_gemm_sm120a_"), src.symbol
assert (v.tile_m, v.cluster_m) == (128, 1)   # the row's defaults
with config.override(FUSEGEMM_ARCHS="sm_120a"):
    assert config.default_archs() == ("sm_120a",)
vs, skipped = build.select(["grouped_gemm", "gemm_amax"], ("sm_120a",))
assert len(vs) == 5 and [(s.spec, s.status) for s in skipped] == [("gemm_amax", "none")], (vs, skipped)
print("ok")
"""


def test_adding_an_arch_touches_three_places():
    """The README's developer section lists the places to touch for a new arch: the arch table,
    the registry rows, the headers. This builds a hypothetical arch from the first two (the
    sm90 headers standing in for the third) and runs it through specs, variants, rendering,
    the configuration and the build selection."""
    out = subprocess.run([sys.executable, "-c", ADD_AN_ARCH], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_every_arch_has_a_header_folder():
    from fusegemm.base.package import package_data_dir
    for a in ARCHS.values():
        assert (package_data_dir("templates") / "include" / "fusegemm" / a.headers).is_dir(), a.name


@pytest.mark.parametrize("name", ["gemm_amax", "grouped_gemm_quant", "grouped_gemm_swiglu", "grouped_gemm_dswiglu_bf16",
                                  "grouped_gemm_wgrad"])
def test_the_pruned_surface_is_the_filtered_product(name):
    """variants.surface prunes a constraint's subtree as soon as the axes it reads are chosen: the
    same points in the same order as filtering the full product (the specs with small products)."""
    import itertools

    from fusegemm.generator.axes import NEUTRAL
    from fusegemm.generator.spec import check_choice, find_spec
    from fusegemm.generator.variants import surface
    spec = find_spec(name)
    offered = spec.choice_map
    axes = [a for a in offered if a != "arch"]
    for arch in offered["arch"]:
        want = [{**NEUTRAL, **dict(zip(axes, values), arch=arch)}
                for values in itertools.product(*(offered[a] for a in axes))
                if check_choice(dict(zip(axes, values), arch=arch), spec.constraints) is None]
        got = list(surface(spec, arch))
        assert got == want and [list(p) for p in got] == [list(p) for p in want]
        assert len(want) < len(list(itertools.product(*(offered[a] for a in axes)))) or not spec.constraints


def test_a_spec_names_its_kernel_class(tmp_path):
    """``kernel: scaled`` (a kernel class) stands for the family the seeds named for it: the spec
    loads as that family and renders the same source as one that names the family."""
    from fusegemm.generator.spec import load_spec
    assert registry.kernel_classes() == {"grouped": "grouped_gemm", "kgrouped": "grouped_gemm_wgrad",
                                         "batched": "gemm_amax", "scaled": "grouped_gemm_srelu"}
    spec = find_spec("grouped_gemm_dsrelu_mx")
    assert "kernel: scaled" in open(spec.path).read() and spec.kernel == "grouped_gemm_srelu"
    other = tmp_path / "grouped_gemm_dsrelu_mx.yaml"
    other.write_text(open(spec.path).read().replace("kernel: scaled", "kernel: grouped_gemm_srelu"))
    for arch in ("sm_90a", "sm_100a"):
        a, b = (render(make_variant(s, arch=arch)).text for s in (spec, load_spec(other)))
        assert a == b
