"""YAML spec -> validated, frozen :class:`Spec`.

Every mistake is reported as ``file:line: key: message; allowed: ...``. Unknown keys are errors,
YAML is loaded safely, and the epilogue statements are parsed (generator/expr.py).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..base.archs import ARCH_NAMES
from ..base.errors import SpecError
from .axes import ARITHMETIC_AXES, AXES, NEUTRAL
from .epilogue import EPILOGUE_AXES, Epilogue, parse_epilogue
from .registry import Implementation, families, kernel_classes, lookup, problem_of
from .yamlload import Node, load_yaml, plain, read_text

# 2: the epilogue language (generator/epilogue.py): typed inputs by kind, pairing, outputs with
# quantization, reductions with ABI slots.
SCHEMA_VERSION = 2
_IDENT = re.compile(r"^[a-z][a-z0-9_]*$")

# grouped: rows of all experts concatenated (M-grouped, seeds 000-003); batched: L dense
# problems (seed 004); kgrouped: one reduction range of token rows per expert (weight gradients).
PROBLEMS = ("grouped", "batched", "kgrouped")


@dataclass(frozen=True)
class Constraint:
    when: tuple[tuple[str, tuple[Any, ...]], ...]
    then: tuple[tuple[str, tuple[Any, ...]], ...]
    because: str
    line: int

    def applies(self, choice: dict[str, Any]) -> bool:
        return all(choice.get(a) in vals for a, vals in self.when)

    def violated_by(self, choice: dict[str, Any]) -> str | None:
        if not self.applies(choice):
            return None
        for axis, vals in self.then:
            if choice.get(axis) not in vals:
                return f"{axis}={choice.get(axis)!r} but {self.because} (allowed: {list(vals)})"
        return None


@dataclass(frozen=True)
class Spec:
    """A validated fusion spec: the support surface of one op."""

    name: str
    path: str
    kernel: str
    problem: str
    seed: str
    summary: str
    epilogue: Epilogue
    choices: tuple[tuple[str, tuple[Any, ...]], ...]
    constraints: tuple[Constraint, ...]
    defaults: tuple[tuple[str, Any], ...]
    prebuild: tuple[tuple[tuple[str, Any], ...], ...]

    @property
    def choice_map(self) -> dict[str, tuple[Any, ...]]:
        return dict(self.choices)


MAX_MESSAGE = 600


class _Ctx:
    """Error helper bound to one file."""

    def __init__(self, path: str) -> None:
        self.path = path

    def fail(self, node: Node | None, key: str, msg: str) -> SpecError:
        if len(msg) > MAX_MESSAGE:   # a message quotes the offending value: keep it readable
            msg = f"{msg[:MAX_MESSAGE]}... ({len(msg)} characters)"
        return SpecError(msg, path=self.path, line=node.line if node else None, key=key)

    def mapping(self, node: Node, key: str, required: set[str], optional: set[str]) -> dict[str, Node]:
        if not isinstance(node.value, dict):
            raise self.fail(node, key, f"expected a mapping, got {_kind(node.value)}")
        d: dict[str, Node] = node.value
        allowed = required | optional
        for k, v in d.items():
            if k not in allowed:
                raise self.fail(v, f"{key}.{k}" if key else k,
                                f"unknown key; allowed: {', '.join(sorted(allowed))}")
        for k in sorted(required):
            if k not in d:
                raise self.fail(node, f"{key}.{k}" if key else k, "required key is missing")
        return d

    def typed(self, node: Node, key: str, types: tuple[type, ...], what: str) -> Any:
        v = node.value
        if not isinstance(v, types) or (bool not in types and isinstance(v, bool)):
            raise self.fail(node, key, f"expected {what}, got {_kind(v)} {plain(v)!r}")
        return v

    def seq(self, node: Node, key: str) -> list[Node]:
        if not isinstance(node.value, list):
            raise self.fail(node, key, f"expected a list, got {_kind(node.value)}")
        return node.value


def _kind(v: Any) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean",
            int: "an integer", float: "a number", type(None): "nothing"}.get(type(v), type(v).__name__)


def load_spec(path: str | Path) -> Spec:
    """Load and validate one YAML spec file; SpecError with file and line when it is invalid.

    Parameters
    ----------
    path : str or path
        The YAML file (``specs/NAME.yaml`` or a user's).
    """
    p = Path(path)
    text = read_text(p)
    key = (text, str(p))
    spec = _PARSED.get(key)
    if spec is None:
        spec = parse_spec(text, str(p), expected_name=p.stem)
        if len(_PARSED) >= 128:
            _PARSED.pop(next(iter(_PARSED)))
        _PARSED[key] = spec
    return spec


# Parsed specs by (file text, path): validating a spec resolves every variant of its epilogue
# (milliseconds), and the ops look their spec up per call; a changed file is parsed anew.
_PARSED: dict[tuple[str, str], Spec] = {}


def parse_spec(text: str, path: str, expected_name: str | None = None) -> Spec:
    ctx = _Ctx(path)
    root = load_yaml(text, path)
    top = ctx.mapping(root, "", {"schema", "name", "kernel", "summary", "epilogue", "choices", "defaults"},
                      {"seed", "problem", "constraints", "prebuild"})
    schema = ctx.typed(top["schema"], "schema", (int,), "an integer")
    if schema != SCHEMA_VERSION:
        raise ctx.fail(top["schema"], "schema", f"unsupported schema version {schema}; allowed: {SCHEMA_VERSION}")
    name = ctx.typed(top["name"], "name", (str,), "a string")
    if not _IDENT.match(name):
        raise ctx.fail(top["name"], "name", f"{name!r} is not a lower-case identifier ([a-z][a-z0-9_]*)")
    if expected_name is not None and name != expected_name:
        raise ctx.fail(top["name"], "name", f"{name!r} must match the file name {expected_name!r}")
    # A spec names its kernel's class (grouped, kgrouped, scaled, batched) or one of the families
    # the seeds named (grouped_gemm_srelu for the block-scaled grouped class): a class stands for
    # its family (registry.kernel_classes).
    classes = kernel_classes()
    kernel = _enum(ctx, top["kernel"], "kernel", (*classes, *families()))
    kernel = classes.get(kernel, kernel)
    # The problem follows from the kernel family (registry.problem_of); a spec may state it, and
    # then it must be the family's.
    problem = _enum(ctx, top["problem"], "problem", PROBLEMS) if "problem" in top else problem_of(kernel)
    if problem != problem_of(kernel):
        raise ctx.fail(top["problem"], "problem", f"got {problem!r}; allowed: {problem_of(kernel)!r} (the problem "
                                                  f"kernel family {kernel} solves)")
    summary = ctx.typed(top["summary"], "summary", (str,), "a string")
    seed = ctx.typed(top["seed"], "seed", (str,), "a string") if "seed" in top else ""

    choices = _choices(ctx, top["choices"])
    epilogue = parse_epilogue(ctx, top["epilogue"], choices, problem)
    read = epilogue.axes_read()
    for axis in EPILOGUE_AXES:
        if len(choices.get(axis, ())) > 1 and axis not in read and axis not in ARITHMETIC_AXES:
            raise ctx.fail(top["choices"].value[axis], f"choices.{axis}",
                           f"offers {len(choices[axis])} values but the epilogue never reads {axis}, so the "
                           f"choice would change nothing; allowed: use it in the epilogue (an input or output "
                           f"dtype, a when: condition, a statement) or offer one value")
    constraints = tuple(_constraint(ctx, n, choices, i)
                        for i, n in enumerate(ctx.seq(top["constraints"], "constraints"))) \
        if "constraints" in top else ()
    defaults = _defaults(ctx, top["defaults"], choices, constraints)
    prebuild = _prebuild(ctx, top.get("prebuild"), choices, constraints, defaults)
    _every_arch_builds(ctx, top["choices"], kernel, choices)   # last: the spec is well-formed, is it built?
    return Spec(name=name, path=path, kernel=kernel, problem=problem, seed=seed, summary=summary,
                epilogue=epilogue, choices=tuple(choices.items()), constraints=constraints,
                defaults=tuple(defaults.items()),
                prebuild=prebuild)


def _enum(ctx: _Ctx, node: Node, key: str, allowed: tuple[str, ...]) -> str:
    v = node.value
    if v not in allowed:
        raise ctx.fail(node, key, f"got {plain(v)!r}; allowed: {', '.join(allowed)}")
    return v


def _axis_value(ctx: _Ctx, node: Node, key: str, axis: str) -> Any:
    v = plain(node)
    if v is None:
        v = "none"
    why = AXES[axis].check(v)
    if why is not None:
        raise ctx.fail(node, key, f"got {v!r}; allowed: {why}")
    return v


def _choices(ctx: _Ctx, node: Node) -> dict[str, tuple[Any, ...]]:
    d = ctx.mapping(node, "choices", set(), set(AXES))
    out: dict[str, tuple[Any, ...]] = {}
    for axis in AXES:  # canonical axis order, whatever the file's order
        if axis not in d:
            if axis == "arch":  # a spec declares the op, not where it runs: every arch by default
                out[axis] = ARCH_NAMES
            continue
        items = ctx.seq(d[axis], f"choices.{axis}")
        if not items:
            raise ctx.fail(d[axis], f"choices.{axis}", "empty list; give at least one value")
        vals = tuple(_axis_value(ctx, it, f"choices.{axis}", axis) for it in items)
        if len(set(map(repr, vals))) != len(vals):
            raise ctx.fail(d[axis], f"choices.{axis}", f"duplicate values in {list(vals)}")
        out[axis] = vals
    missing = [a for a in REQUIRED_AXES if a not in out]
    if missing:
        raise ctx.fail(node, "choices", f"missing {', '.join(missing)}: every spec lists the tiles and clusters "
                                        "it allows (a set both archs build: tile_m: [128], tile_n: [256], "
                                        "cluster_m: [1], cluster_n: [1]); `fusegemm show SPEC` then says what each "
                                        "arch's kernel implements")
    return out


def _blocking_limit(row: Implementation | None, choices: dict[str, tuple[Any, ...]]):
    """(limit, declared values) of the first unconditional registry limit of ``row`` that none
    of the declared values of its axis meets (after ``runs_as``), or None."""
    for lim in (row.limits if row is not None else ()):
        if lim.when:          # a conditional limit rules out combinations, not a whole axis
            continue
        declared = choices.get(lim.axis, (NEUTRAL[lim.axis],) if lim.axis in NEUTRAL else ())
        if declared and not any(row.canonical({lim.axis: v})[lim.axis] in lim.values for v in declared):
            return lim, declared
    return None


def _every_arch_builds(ctx: _Ctx, node: Node, kernel: str, choices: dict[str, tuple[Any, ...]]) -> None:
    """Every arch the spec lists builds some of it. An axis none of whose declared values an
    arch's kernel implements (generator/registry.py's limits) would leave that arch with nothing
    to build, found only by `fusegemm build` ("nothing to build"): it is refused here, at the
    axis's line, with the values implemented and the archs that do build the spec."""
    blocked = {arch: _blocking_limit(lookup(kernel, arch), choices) for arch in choices["arch"]}
    for arch, found in blocked.items():
        if found is None:
            continue
        lim, declared = found
        implemented = ", ".join(map(str, lim.values))
        others = [a for a, f in blocked.items() if f is None]
        fix = f"a value among {implemented}" + (f", or choices.arch: [{', '.join(others)}]" if others else "")
        what = f"{lim.axis} is not offered, so it is {declared[0]!r}" if lim.axis not in node.value else \
            f"got {', '.join(map(str, declared))}"
        raise ctx.fail(node.value.get(lim.axis, node), f"choices.{lim.axis}",
                       f"{what}, which the {arch} kernel of {kernel} does not implement (it implements "
                       f"{implemented}: {lim.because}), so nothing of this spec builds on {arch}; allowed: {fix}")


# Axes every spec must choose: the kernel templates have no neutral tile or cluster.
REQUIRED_AXES = ("tile_m", "tile_n", "cluster_m", "cluster_n")


def _in_choices(ctx: _Ctx, node: Node, key: str, axis: str, choices: dict[str, tuple[Any, ...]]) -> Any:
    if axis not in choices:
        raise ctx.fail(node, key, f"unknown axis {axis!r}; this spec's axes: {', '.join(choices)}")
    v = _axis_value(ctx, node, key, axis)
    if v not in choices[axis]:
        raise ctx.fail(node, key, f"{v!r} is not among this spec's choices; allowed: "
                                  f"{', '.join(map(str, choices[axis]))}")
    return v


def _constraint(ctx: _Ctx, node: Node, choices: dict[str, tuple[Any, ...]], i: int) -> Constraint:
    key = f"constraints[{i}]"
    d = ctx.mapping(node, key, {"if", "then", "because"}, set())
    parts = []
    for part in ("if", "then"):
        m = ctx.mapping(d[part], f"{key}.{part}", set(), set(choices) | set(AXES))
        if not m:
            raise ctx.fail(d[part], f"{key}.{part}", "empty; name at least one axis")
        entries = []
        for axis, vnode in m.items():
            items = vnode.value if isinstance(vnode.value, list) else [vnode]
            vals = tuple(_in_choices(ctx, it, f"{key}.{part}.{axis}", axis, choices) for it in items)
            entries.append((axis, vals))
        parts.append(tuple(entries))
    because = ctx.typed(d["because"], f"{key}.because", (str,), "a string")
    return Constraint(parts[0], parts[1], because, node.line)


def check_choice(choice: dict[str, Any], constraints: tuple[Constraint, ...]) -> str | None:
    for c in constraints:
        why = c.violated_by(choice)
        if why:
            return why
    return None


def _defaults(ctx: _Ctx, node: Node, choices, constraints) -> dict[str, Any]:
    """The op's default choice of every axis (the seed API's defaults).

    Defaults an arch's kernel prefers (sm_90a's tiles) are implementation facts: they live in
    the registry (generator/registry.py), not in the spec.
    """
    d = ctx.mapping(node, "defaults", set(), set(AXES) - {"arch"})
    out: dict[str, Any] = {}
    for axis in choices:
        if axis == "arch":
            continue
        if axis not in d:
            if len(choices[axis]) == 1:
                out[axis] = choices[axis][0]
                continue
            raise ctx.fail(node, f"defaults.{axis}", "missing; an axis with several choices "
                                                     f"needs a default among {list(choices[axis])}")
        out[axis] = _in_choices(ctx, d[axis], f"defaults.{axis}", axis, choices)
    for axis in d:
        if axis not in choices:
            raise ctx.fail(d[axis], f"defaults.{axis}", f"axis not in choices; allowed: {', '.join(choices)}")
    for arch in choices["arch"]:
        why = check_choice({**out, "arch": arch}, constraints)
        if why:
            raise ctx.fail(node, "defaults", f"the defaults violate a constraint for {arch}: {why}")
    return out


def _prebuild(ctx, node, choices, constraints, defaults) -> tuple:
    if node is None:
        return ((),)
    out = []
    for i, item in enumerate(ctx.seq(node, "prebuild")):
        d = ctx.mapping(item, f"prebuild[{i}]", set(), set(choices))
        entry = {a: _in_choices(ctx, v, f"prebuild[{i}].{a}", a, choices) for a, v in d.items()}
        for arch in (entry.get("arch"),) if "arch" in entry else choices["arch"]:
            why = check_choice({**defaults, **entry, "arch": arch}, constraints)
            if why:
                raise ctx.fail(item, f"prebuild[{i}]", f"violates a constraint for {arch}: {why}")
        out.append(tuple(sorted(entry.items())))
    return tuple(out)


def spec_dir() -> Path:
    from ..base.package import package_data_dir
    return package_data_dir("specs")


def list_specs() -> list[Path]:
    return sorted(spec_dir().glob("*.yaml"))


def find_spec(name_or_path: str) -> Spec:
    """A spec by name (``grouped_gemm``) or by path to a YAML file."""
    p = Path(name_or_path)
    # lexists: a symlink that leads nowhere (or in a loop) is still the path the user named,
    # and load_spec says what is wrong with it, not "no spec named".
    if p.suffix in (".yaml", ".yml") or os.path.lexists(p):
        return load_spec(p)
    cand = spec_dir() / f"{name_or_path}.yaml"
    if not cand.is_file():
        names = ", ".join(x.stem for x in list_specs())
        raise SpecError(f"no spec named {name_or_path!r}; available: {names}")
    return load_spec(cand)
