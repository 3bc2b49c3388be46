"""YAML spec -> validated, frozen :class:`Spec`.

Every mistake is reported as ``file:line: key: message; allowed: ...``. Unknown keys are errors,
YAML is loaded safely, and the epilogue statements are parsed (generator/expr.py).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..base.archs import ARCH_NAMES
from ..base.errors import SpecError
from .axes import AXES, OUT_DTYPES
from .expr import ExprError, Statement, parse_statement
from .registry import families
from .yamlload import Node, load_yaml, plain

SCHEMA_VERSION = 1
_IDENT = re.compile(r"^[a-z][a-z0-9_]*$")

PROBLEMS = ("grouped", "batched")
INPUT_PER = ("scalar", "expert", "row", "n_expert", "row_2n")
BUILTIN_NAMES = frozenset({"acc"})  # the FP32 accumulator element


@dataclass(frozen=True)
class EpilogueInput:
    name: str
    per: str
    dtype: str          # a dtype name or an axis name (e.g. "bias_dtype")
    required: bool


@dataclass(frozen=True)
class EpilogueOutput:
    name: str
    dtype: str          # dtype or axis name
    doc: str


@dataclass(frozen=True)
class Quantization:
    outputs: tuple[str, ...]
    when_d_dtype: tuple[str, ...]
    row: bool
    col: bool
    block: int
    scale_dtype: str
    norm_const: str


@dataclass(frozen=True)
class Reduction:
    name: str
    kind: str
    of: tuple[str, ...]
    scope: str
    when_d_dtype: tuple[str, ...]


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
    inputs: tuple[EpilogueInput, ...]
    compute: tuple[Statement, ...]
    outputs: tuple[EpilogueOutput, ...]
    quantization: Quantization | None
    reductions: tuple[Reduction, ...]
    choices: tuple[tuple[str, tuple[Any, ...]], ...]
    constraints: tuple[Constraint, ...]
    defaults: tuple[tuple[str, Any], ...]
    prebuild: tuple[tuple[tuple[str, Any], ...], ...]

    @property
    def choice_map(self) -> dict[str, tuple[Any, ...]]:
        return dict(self.choices)


class _Ctx:
    """Error helper bound to one file."""

    def __init__(self, path: str) -> None:
        self.path = path

    def fail(self, node: Node | None, key: str, msg: str) -> SpecError:
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
    """Load and validate one YAML spec file."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise SpecError(f"cannot read spec: {exc.strerror}", path=str(p)) from None
    return parse_spec(text, str(p), expected_name=p.stem)


def parse_spec(text: str, path: str, expected_name: str | None = None) -> Spec:
    ctx = _Ctx(path)
    root = load_yaml(text, path)
    top = ctx.mapping(root, "", {"schema", "name", "kernel", "problem", "summary", "epilogue",
                                 "choices", "defaults"},
                      {"seed", "constraints", "prebuild"})
    schema = ctx.typed(top["schema"], "schema", (int,), "an integer")
    if schema != SCHEMA_VERSION:
        raise ctx.fail(top["schema"], "schema", f"unsupported schema version {schema}; allowed: {SCHEMA_VERSION}")
    name = ctx.typed(top["name"], "name", (str,), "a string")
    if not _IDENT.match(name):
        raise ctx.fail(top["name"], "name", f"{name!r} is not a lower-case identifier ([a-z][a-z0-9_]*)")
    if expected_name is not None and name != expected_name:
        raise ctx.fail(top["name"], "name", f"{name!r} must match the file name {expected_name!r}")
    kernel = _enum(ctx, top["kernel"], "kernel", families())
    problem = _enum(ctx, top["problem"], "problem", PROBLEMS)
    summary = ctx.typed(top["summary"], "summary", (str,), "a string")
    seed = ctx.typed(top["seed"], "seed", (str,), "a string") if "seed" in top else ""

    choices = _choices(ctx, top["choices"])
    inputs, compute, outputs, quant, reds = _epilogue(ctx, top["epilogue"], choices)
    constraints = tuple(_constraint(ctx, n, choices, i)
                        for i, n in enumerate(ctx.seq(top["constraints"], "constraints"))) \
        if "constraints" in top else ()
    defaults = _defaults(ctx, top["defaults"], choices, constraints)
    prebuild = _prebuild(ctx, top.get("prebuild"), choices, constraints, defaults)
    return Spec(name=name, path=path, kernel=kernel, problem=problem, seed=seed, summary=summary,
                inputs=inputs, compute=compute, outputs=outputs, quantization=quant,
                reductions=reds, choices=tuple(choices.items()), constraints=constraints,
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
    return out


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


def _dtype_ref(ctx: _Ctx, node: Node, key: str, choices) -> str:
    v = ctx.typed(node, key, (str,), "a dtype name or an axis name")
    if v in OUT_DTYPES:
        return v
    if v in AXES and v.endswith("_dtype"):
        if v not in choices:
            raise ctx.fail(node, key, f"axis {v!r} is not in this spec's choices")
        return v
    raise ctx.fail(node, key, f"got {v!r}; allowed: a dtype ({', '.join(OUT_DTYPES)}) "
                              f"or a dtype axis in choices")


def _epilogue(ctx: _Ctx, node: Node, choices):
    d = ctx.mapping(node, "epilogue", {"inputs", "compute", "outputs"}, {"quantization", "reductions"})
    inputs = []
    for name, inode in ctx.mapping(d["inputs"], "epilogue.inputs", set(), _any_keys(d["inputs"])).items():
        key = f"epilogue.inputs.{name}"
        if not _IDENT.match(name) or name in BUILTIN_NAMES:
            raise ctx.fail(inode, key, f"{name!r} is not a valid input name")
        m = ctx.mapping(inode, key, {"per", "dtype"}, {"required"})
        inputs.append(EpilogueInput(name, _enum(ctx, m["per"], f"{key}.per", INPUT_PER),
                                    _dtype_ref(ctx, m["dtype"], f"{key}.dtype", choices),
                                    ctx.typed(m["required"], f"{key}.required", (bool,), "true or false")
                                    if "required" in m else True))
    known = set(BUILTIN_NAMES) | {i.name for i in inputs} | {a for a in choices if AXES[a].constant}
    compute = []
    for i, snode in enumerate(ctx.seq(d["compute"], "epilogue.compute")):
        try:
            st = parse_statement(snode.value, frozenset(known))
        except ExprError as exc:
            raise ctx.fail(snode, f"epilogue.compute[{i}]", str(exc)) from None
        compute.append(st)
        known.add(st.target)
    outputs = []
    for name, onode in ctx.mapping(d["outputs"], "epilogue.outputs", set(), _any_keys(d["outputs"])).items():
        key = f"epilogue.outputs.{name}"
        m = ctx.mapping(onode, key, {"dtype"}, {"doc"})
        if name not in known:
            raise ctx.fail(onode, key, f"output {name!r} is never computed; computed: {', '.join(sorted(known))}")
        outputs.append(EpilogueOutput(name, _dtype_ref(ctx, m["dtype"], f"{key}.dtype", choices),
                                      ctx.typed(m["doc"], f"{key}.doc", (str,), "a string") if "doc" in m else ""))
    quant = _quant(ctx, d["quantization"], {o.name for o in outputs}) if "quantization" in d else None
    reds = tuple(_reduction(ctx, n, i, {o.name for o in outputs} | known)
                 for i, n in enumerate(ctx.seq(d["reductions"], "epilogue.reductions"))) \
        if "reductions" in d else ()
    return tuple(inputs), tuple(compute), tuple(outputs), quant, reds


def _any_keys(node: Node) -> set[str]:
    return set(node.value) if isinstance(node.value, dict) else set()


def _str_list(ctx: _Ctx, node: Node, key: str, check: Callable[[str], bool], allowed: str) -> tuple[str, ...]:
    out = []
    for it in ctx.seq(node, key):
        if not isinstance(it.value, str) or not check(it.value):
            raise ctx.fail(it, key, f"got {plain(it)!r}; allowed: {allowed}")
        out.append(it.value)
    return tuple(out)


def _quant(ctx: _Ctx, node: Node, outputs: set[str]) -> Quantization:
    key = "epilogue.quantization"
    m = ctx.mapping(node, key, {"outputs", "when_d_dtype", "block", "scale_dtype", "norm_const"},
                    {"row", "col"})
    block = ctx.typed(m["block"], f"{key}.block", (int,), "an integer")
    if block != 32:
        raise ctx.fail(m["block"], f"{key}.block", f"got {block}; allowed: 32 (SFD blocks are always 32 wide)")
    return Quantization(
        outputs=_str_list(ctx, m["outputs"], f"{key}.outputs", outputs.__contains__, ", ".join(sorted(outputs))),
        when_d_dtype=_str_list(ctx, m["when_d_dtype"], f"{key}.when_d_dtype", OUT_DTYPES.__contains__,
                               ", ".join(OUT_DTYPES)),
        row=ctx.typed(m["row"], f"{key}.row", (bool,), "true or false") if "row" in m else True,
        col=ctx.typed(m["col"], f"{key}.col", (bool,), "true or false") if "col" in m else False,
        block=block,
        scale_dtype=_enum(ctx, m["scale_dtype"], f"{key}.scale_dtype", ("float8_e8m0fnu",)),
        norm_const=ctx.typed(m["norm_const"], f"{key}.norm_const", (str,), "an input name"),
    )


def _reduction(ctx: _Ctx, node: Node, i: int, names: set[str]) -> Reduction:
    key = f"epilogue.reductions[{i}]"
    m = ctx.mapping(node, key, {"name", "kind", "of", "scope"}, {"when_d_dtype"})
    name = ctx.typed(m["name"], f"{key}.name", (str,), "a string")
    return Reduction(
        name=name,
        kind=_enum(ctx, m["kind"], f"{key}.kind", ("amax", "sum")),
        of=_str_list(ctx, m["of"], f"{key}.of", names.__contains__, ", ".join(sorted(names))),
        scope=_enum(ctx, m["scope"], f"{key}.scope", ("expert", "global", "row")),
        when_d_dtype=_str_list(ctx, m["when_d_dtype"], f"{key}.when_d_dtype", OUT_DTYPES.__contains__,
                               ", ".join(OUT_DTYPES)) if "when_d_dtype" in m else (),
    )


def spec_dir() -> Path:
    from ..base.package import package_data_dir
    return package_data_dir("specs")


def list_specs() -> list[Path]:
    return sorted(spec_dir().glob("*.yaml"))


def find_spec(name_or_path: str) -> Spec:
    """A spec by name (``grouped_gemm``) or by path to a YAML file."""
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or p.exists():
        return load_spec(p)
    cand = spec_dir() / f"{name_or_path}.yaml"
    if not cand.is_file():
        names = ", ".join(x.stem for x in list_specs())
        raise SpecError(f"no spec named {name_or_path!r}; available: {names}")
    return load_spec(cand)
