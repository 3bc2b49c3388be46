"""The registry of what is implemented (generator/registry.py): one row per (kernel class, arch)
and one policy per arch; every row's declared facts are true of the templates it renders for
every spec of its class, every family resolves to its class's row, every seed spec's defaults
and prebuild list land on a row, and adding an arch touches only the arch table, the registry
and the headers."""
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
FAMILY_CLASS = {"grouped_gemm": "grouped", "grouped_gemm_wgrad": "kgrouped", "gemm_amax": "batched",
                "grouped_gemm_srelu": "scaled", "grouped_gemm_quant": "scaled", "grouped_gemm_dswiglu": "scaled",
                "grouped_gemm_wgrad_fp8": "kscaled"}


def _alternatives(axis: str, value):
    """Values of ``axis`` other than ``value`` that any template can render."""
    a = AXES[axis]
    if a.kind == "bool":
        return [not value]
    if a.kind == "positive_float_or_none":
        return [1.5] if value == "none" else ["none"]
    return [x for x in a.allowed if x != value and x != "none"] or [x for x in a.allowed if x != value]


@pytest.mark.parametrize("spec,arch", [(s, a) for s in SPECS for a in find_spec(s).choice_map["arch"]])
def test_source_axes_are_exactly_the_axes_that_change_the_source(spec, arch):
    """Render every spec's default variant on each arch with each axis changed (bypassing the
    spec, so axes with one declared value are tested too): the source changes iff the axis is
    its class row's or one the spec's epilogue reads (``axes_for``). A wrong declaration would
    let `--variant` accept an axis that changes nothing, or refuse one that does."""
    s = find_spec(spec)
    row = registry.lookup(s.kernel, arch)
    base = make_variant(s, arch=arch)
    ref = render(base).digest
    changes, limited = {}, set()
    for axis in AXES:
        if axis == "arch":
            continue
        digests, refusals = set(), 0
        alts = _alternatives(axis, getattr(base, axis))
        for alt in alts:
            try:
                digests.add(render(dataclasses.replace(base, **{axis: alt})).digest)
            except UnsupportedError:
                refusals += 1   # a value outside the row's limits (with this variant's other axes)
            except ValueError:
                continue   # e.g. an sf_dtype with no scale type
        changes[axis] = any(d != ref for d in digests)
        if refusals == len(alts):
            limited.add(axis)   # e.g. sfd_vec_size 128: sm_100a refuses it, sm_90a with sf_vec_size 128 only
    expected = set(row.axes_for(s.epilogue.axes_read()))
    assert {a for a, changed in changes.items() if changed} == expected - limited
    # The cluster reaches only the sm_90a BF16 kernel's source (its 1x1 build has no cluster
    # machinery); every other kernel serves every legal cluster with one cubin.
    sees_cluster = (row.kernel_class, row.arch) == ("grouped", "sm_90a")
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
        registry.Implementation("grouped", "sm_80", "t", "h", "k", None, ())
    with pytest.raises(ValueError, match=r"^Implementation.kernel_class: got 'x'; allowed: grouped, kgrouped, "
                                         r"scaled, batched, kscaled$"):
        registry.Implementation("x", "sm_90a", "t", "h", "k", None, ())
    with pytest.raises(ValueError, match=r"source_axes: got \['cluster_m'\]"):
        registry.Implementation("grouped", "sm_90a", "t", "h", "k", None, ("cluster_m",))
    # status is not declared: a row is an implementation, its absence is status none
    assert registry.Implementation("grouped", "sm_90a", "t", "h", "k", None, ()).status == registry.IMPLEMENTED
    with pytest.raises(ValueError, match=r"^ArchPolicy.defaults: got \['x', 'tile'\]"):
        registry.ArchPolicy("sm_90a", (("x", ()), ("grouped", (("tile", 1),))), False, None, "sm_90a")


def test_one_row_per_kernel_class_and_arch():
    """The table holds a row per (kernel class, arch), unbound to any family; the families of a
    class share it (their specs' epilogues are what differs)."""
    assert len(registry.ROWS) == 10
    assert {(r.kernel_class, r.arch) for r in registry.ROWS} == {
        (k, a) for k in ("grouped", "kgrouped", "scaled", "batched", "kscaled") for a in ("sm_100a", "sm_90a")}
    assert all(r.family == "" for r in registry.ROWS)


@pytest.mark.parametrize("family", sorted(FAMILY_CLASS))
def test_every_family_resolves_to_its_class_row(family):
    """``lookup`` and ``resolve`` return the class row bound to the family: the same kernel, with
    the family's name in its messages."""
    assert registry.kernel_class(family) == FAMILY_CLASS[family]
    for arch in ARCHS:
        row = registry.lookup(family, arch)
        table = next((r for r in registry.ROWS if (r.kernel_class, r.arch) == (FAMILY_CLASS[family], arch)), None)
        if table is None:   # a class without a kernel on this arch (kscaled on sm_100a): status none
            assert row is None and registry.status(family, arch) == registry.NONE
            continue
        assert row == dataclasses.replace(table, family=family)
        choice = default_choice(find_spec(family), arch)
        assert registry.resolve(family, arch, choice) == row
        assert registry.status(family, arch) == registry.IMPLEMENTED


def test_families_and_classes():
    assert registry.families() == tuple(FAMILY_CLASS)   # table order: the seeds' families
    assert registry.problem_of("gemm_amax") == "batched" and registry.problem_of("grouped_gemm_wgrad") == "kgrouped"
    assert registry.problem_of("grouped_gemm_quant") == "grouped"
    assert registry.lookup("nope", "sm_90a") is None and registry.status("nope", "sm_90a") == registry.NONE
    with pytest.raises(UnsupportedError, match=r"^kernel family 'nope' has no kernel; families: grouped_gemm, "
                                               r"grouped_gemm_wgrad, gemm_amax, grouped_gemm_srelu, "):
        registry.kernel_class("nope")
    # An unbound row's messages name its class.
    row = next(r for r in registry.ROWS if (r.kernel_class, r.arch) == ("scaled", "sm_90a"))
    assert row.problem({"ab_dtype": "float8_e4m3fn", "tile_m": 256}).startswith(
        "tile_m=256 is not implemented for the scaled kernel class on sm_90a; implemented: 64, 128 (")


def test_arch_policies():
    """What each arch decides: the tiles and clusters each class prefers, whether the roofline
    model picks configurations, 2-CTA tiles, the harness's arch."""
    assert set(registry.POLICIES) == set(ARCHS)
    sm100, sm90 = registry.policy("sm_100a"), registry.policy("sm_90a")
    bf16 = (("cluster_m", 1), ("cluster_n", 1), ("tile_m", 128), ("tile_n", 256))
    scaled = (("cluster_m", 1), ("cluster_n", 1), ("tile_m", 128))
    assert [sm100.defaults_for(k) for k in ("grouped", "kgrouped", "scaled", "batched")] == [(), bf16, (), ()]
    assert [sm90.defaults_for(k) for k in ("grouped", "kgrouped", "scaled", "batched")] == [bf16, bf16, scaled, scaled]
    assert (sm100.heuristic, sm90.heuristic) == (True, False)
    assert [sm100.ctas_per_tile(m) for m in (64, 128, 256)] == [1, 1, 2]
    assert [sm90.ctas_per_tile(m) for m in (64, 128, 256)] == [1, 1, 1]
    assert (sm100.harness_arch, sm90.harness_arch) == ("sm_90a", "sm_90a")
    with pytest.raises(UnsupportedError, match=r"^arch: got 'sm_80'; allowed: sm_100a, sm_90a$"):
        registry.policy("sm_80")


def test_the_policy_is_what_decides(monkeypatch):
    """Defaults, CTAs per tile and the harness's arch are read from the policy: changing it
    changes them."""
    from fusegemm.generator.config_class import config_class
    from fusegemm.generator.harness import render_harness
    v = make_variant("grouped_gemm", arch="sm_100a", tile_m=256)
    assert config_class(v).ctas == 2 and render_harness(v, "block").symbol.startswith("fg_harness_sm90a_")
    sm90 = registry.policy("sm_90a")
    assert default_choice(find_spec("grouped_gemm"), "sm_90a")["tile_n"] == 256
    monkeypatch.setitem(registry.POLICIES, "sm_100a", dataclasses.replace(
        registry.policy("sm_100a"), pair_tile_m=None, harness_arch="sm_100a"))
    monkeypatch.setitem(registry.POLICIES, "sm_90a", dataclasses.replace(sm90, defaults=(
        ("grouped", (("tile_n", 128),)),)))
    assert config_class(v).ctas == 1 and render_harness(v, "block").symbol.startswith("fg_harness_sm100a_")
    assert default_choice(find_spec("grouped_gemm"), "sm_90a")["tile_n"] == 128


ADD_AN_ARCH = r"""
import dataclasses
import fusegemm.base.archs as archs
# 1. the arch table
archs.ARCHS["sm_120a"] = archs.Arch("sm_120a", (12, 0), "sm90", "a hypothetical third arch", executed=False)
archs.ARCH_NAMES = tuple(archs.ARCHS)
# 2. its registry rows and policy (here: the sm90 headers stand in for 3., its own headers)
import fusegemm.generator.registry as registry
row = dataclasses.replace(next(r for r in registry.ROWS if (r.kernel_class, r.arch) == ("grouped", "sm_90a")),
                          arch="sm_120a")
registry.ROWS += (row,)
registry._BY_CLASS[("grouped", "sm_120a")] = row
registry.POLICIES["sm_120a"] = dataclasses.replace(registry.policy("sm_90a"), arch="sm_120a")
# Nothing else: specs, variants, rendering, config, the CLI's --arch and the build read the tables.
from fusegemm.generator.variants import make_variant
from fusegemm.generator.render import render
from fusegemm.runtime import config
from fusegemm import build
v = make_variant("grouped_gemm", arch="sm_120a")
src = render(v)
assert src.symbol.startswith("fg_grouped_gemm_sm120a_"), src.symbol
assert (v.tile_m, v.cluster_m) == (128, 1)   # the policy's defaults
with config.override(FUSEGEMM_ARCHS="sm_120a"):
    assert config.default_archs() == ("sm_120a",)
vs, skipped = build.select(["grouped_gemm", "gemm_amax"], ("sm_120a",))
assert len(vs) == 5 and [(s.spec, s.status) for s in skipped] == [("gemm_amax", "none")], (vs, skipped)
print("ok")
"""


def test_adding_an_arch_touches_three_places():
    """The README's developer section lists the places to touch for a new arch: the arch table,
    the registry rows and policy, the headers. This builds a hypothetical arch from the first two (the
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
                                         "batched": "gemm_amax", "scaled": "grouped_gemm_srelu",
                                         "kscaled": "grouped_gemm_wgrad_fp8"}
    spec = find_spec("grouped_gemm_dsrelu_mx")
    assert "kernel: scaled" in open(spec.path).read() and spec.kernel == "grouped_gemm_srelu"
    other = tmp_path / "grouped_gemm_dsrelu_mx.yaml"
    other.write_text(open(spec.path).read().replace("kernel: scaled", "kernel: grouped_gemm_srelu"))
    for arch in ("sm_90a", "sm_100a"):
        a, b = (render(make_variant(s, arch=arch)).text for s in (spec, load_spec(other)))
        assert a == b


@pytest.mark.parametrize("spec", ["grouped_gemm_srelu", "grouped_gemm_quant", "grouped_gemm_dswiglu"])
def test_families_of_a_class_build_one_kernel(spec, tmp_path):
    """A family is a name for its class's kernel: the seed spec of each block-scaled family,
    loaded as each other family of the class (or the class), renders the same source but for the
    family named in its header comment (and the symbol, which hashes the text), and accepts and
    refuses the same axes."""
    from fusegemm.generator.spec import load_spec
    s = find_spec(spec)
    text = open(s.path).read()
    assert f"kernel: {spec}\n" in text
    for other in ("grouped_gemm_srelu", "grouped_gemm_quant", "grouped_gemm_dswiglu", "scaled"):
        path = tmp_path / other / f"{spec}.yaml"
        path.parent.mkdir()
        path.write_text(text.replace(f"kernel: {spec}\n", f"kernel: {other}\n"))
        t = load_spec(str(path))
        for arch in ("sm_100a", "sm_90a"):
            srcs = [render(make_variant(x, arch=arch)) for x in (s, t)]
            a, b = (src.text.replace(src.symbol, "SYMBOL").replace(f"kernel family {x.kernel},", "kernel family F,")
                    for src, x in zip(srcs, (s, t)))
            assert a == b, (spec, other, arch)
            rows = [registry.lookup(x.kernel, arch) for x in (s, t)]
            assert rows[0].axes_for(s.epilogue.axes_read()) == rows[1].axes_for(t.epilogue.axes_read())
