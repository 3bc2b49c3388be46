"""Variants: points of a spec's declared surface. ``surface(spec, arch)`` enumerates them.

A :class:`Variant` fixes every axis (dtypes, layouts, tiles, cluster, arch, options). Axes a spec
does not offer take neutral values, so every kernel family sees the same attribute set. Which
kernel builds a variant, if any, is the registry's answer (generator/registry.py).
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Iterator

from ..base.dtypes import short
from ..base.errors import UnsupportedError
from .axes import AXES, NEUTRAL
from .registry import lookup, policy, refusal
from .spec import Spec, check_choice, find_spec



@dataclass(frozen=True)
class Variant:
    """One compilable point: a spec plus a value for every axis."""

    spec: Spec
    arch: str
    ab_dtype: str
    sf_dtype: str
    sf_vec_size: int
    c_dtype: str
    d_dtype: str
    bias_dtype: str
    prob_dtype: str
    weight_mode: str
    a_major: str
    b_major: str
    a_gather: bool
    a_gather_store: bool
    b_gather: bool
    d_scatter: bool
    cd_major: str
    scheduler: str
    generate_c: bool
    generate_dbias: bool
    discrete_col_sfd: bool
    sfd_vec_size: int
    sfd_pow2: bool
    vector_f32: bool
    tanh_clamp_scale: Any
    tile_m: int
    tile_n: int
    cluster_m: int
    cluster_n: int

    def __post_init__(self) -> None:
        for axis in AXES:
            why = AXES[axis].check(getattr(self, axis))
            if why is not None:
                raise UnsupportedError(f"{axis}: got {getattr(self, axis)!r}; allowed: {why}")

    @property
    def kernel(self) -> str:
        return self.spec.kernel

    @property
    def choices(self) -> dict[str, Any]:
        return {a: getattr(self, a) for a in AXES}

    @property
    def readable(self) -> str:
        """People's name of the variant: spec, every axis the spec varies, tile, arch."""
        return self.name_for(AXES)

    def name_for(self, axes) -> str:
        """Spec name, then the values of those of ``axes`` the spec varies, tile and arch.

        The cluster shape is a launch attribute: variants that differ only in cluster share a
        kernel (and a name), except where the row's source sees whether the cluster has more
        than one CTA (``cluster_m`` in ``axes``: sm_90a), whose multi-CTA kernels add ``mc``.
        """
        parts = [self.spec.name]
        offered = self.spec.choice_map
        for axis, fmt in _NAME_PARTS:
            if axis in axes and axis in offered and len(offered[axis]) > 1:
                part = fmt(getattr(self, axis))
                if part:
                    parts.append(part)
        if "cluster_m" in axes and self.cluster_m * self.cluster_n > 1:
            parts.append("mc")
        parts.append(f"t{self.tile_m}x{self.tile_n}")
        parts.append(self.arch.replace("_", ""))
        return ".".join(parts)

    @property
    def cluster(self) -> tuple[int, int]:
        return self.cluster_m, self.cluster_n


def _dt(prefix: str):
    return lambda v: f"{prefix}{short(v)}" if v != "none" else ""


_NAME_PARTS = (
    ("ab_dtype", short),
    ("sf_dtype", lambda v: f"sf{short(v)}" if v != "none" else ""),
    ("sf_vec_size", lambda v: f"v{v}" if v else ""),
    ("c_dtype", _dt("c")),
    ("d_dtype", _dt("d")),
    ("bias_dtype", lambda v: f"bias{short(v)}" if v != "none" else "nobias"),
    ("prob_dtype", lambda v: f"prob{short(v)}" if v != "float32" else ""),
    ("weight_mode", lambda v: v),
    ("a_major", lambda v: f"a{v}"),
    ("b_major", lambda v: f"b{v}"),
    ("a_gather", lambda v: "gather" if v else ""),
    ("a_gather_store", lambda v: "gstore" if v else ""),
    ("b_gather", lambda v: "bgather" if v else ""),
    ("d_scatter", lambda v: "scatter" if v else ""),
    ("cd_major", lambda v: f"cd{v}"),
    ("scheduler", lambda v: {"dynamic": "dyn", "streamk": "sk"}.get(v, "static")),
    ("generate_c", lambda v: "genc" if v else "noc"),
    ("generate_dbias", lambda v: "dbias" if v else ""),
    ("discrete_col_sfd", lambda v: "dcolsfd" if v else ""),
    ("sfd_vec_size", lambda v: "sfd1x128" if v == 128 else ""),
    ("sfd_pow2", lambda v: "pow2" if v else ""),
    ("vector_f32", lambda v: "vf32" if v else ""),
    ("tanh_clamp_scale", lambda v: f"tanh{v:g}" if v != "none" else ""),
)

_VARIANT_AXES = tuple(f.name for f in fields(Variant) if f.name != "spec")


def _build(spec: Spec, choice: dict[str, Any]) -> Variant:
    full = {**NEUTRAL, **choice}
    row = lookup(spec.kernel, full["arch"])
    if row is not None:
        # A value the arch's kernel runs as another (registry ``runs_as``: sm_90a runs vector_f32
        # with scalar math) is that value's variant: one kernel, one name, one cache entry.
        full = row.canonical(full)
    return Variant(spec=spec, **{a: full[a] for a in _VARIANT_AXES})


def default_choice(spec: Spec, arch: str) -> dict[str, Any]:
    """The default of every axis on ``arch``: the spec's (the op's defaults), then those the
    arch's kernel prefers (the arch's registry policy for the kernel class, where the spec
    offers that value)."""
    choice = {**dict(spec.defaults), "arch": arch}
    row = lookup(spec.kernel, arch)
    offered = spec.choice_map
    for axis, value in (policy(arch).defaults_for(row.kernel_class) if row is not None else ()):
        if axis in offered and value in offered[axis]:
            choice[axis] = value
    return choice


def make_variant(spec: Spec | str, *, arch: str, **choices: Any) -> Variant:
    """The variant of ``spec`` for ``arch``: :func:`default_choice` overridden by ``choices``.

    A variant is a point of the *declared* surface; which kernel builds it (and whether one
    does) is the registry's answer (``generator/registry.py``). Raises
    :class:`UnsupportedError` naming the axis, the value and what is allowed, or the
    constraint that rules the combination out.
    """
    if isinstance(spec, str):
        spec = find_spec(spec)
    offered = spec.choice_map
    if arch not in offered["arch"]:
        raise UnsupportedError(f"arch: got {arch!r}; spec {spec.name} allows: {', '.join(offered['arch'])}")
    choice = default_choice(spec, arch)
    for axis, value in choices.items():
        if axis not in AXES:
            raise UnsupportedError(f"{axis}: not a variant axis; allowed: {', '.join(AXES)}")
        if value is None:
            value = NEUTRAL.get(axis, value)
        if axis not in offered:
            if value != NEUTRAL.get(axis):
                raise UnsupportedError(f"{axis}: got {value!r}; spec {spec.name} does not offer this "
                                       f"axis (only {NEUTRAL.get(axis)!r})", axis=axis)
            continue
        why = AXES[axis].check(value)
        open_axis = AXES[axis].kind == "positive_float_or_none"
        if why is not None or (not open_axis and value not in offered[axis]):
            allowed = why or ", ".join(map(str, offered[axis]))
            raise UnsupportedError(f"{axis}: got {value!r}; spec {spec.name} allows: {allowed}", axis=axis)
        choice[axis] = value
    _launch_defaults_within_limits(spec, choice, set(choices))
    why = check_choice(choice, spec.constraints)
    if why:
        raise UnsupportedError(f"spec {spec.name} ({arch}): {why}")
    return _build(spec, choice)


# The launch configuration's axes (tile, cluster, scheduler) whose defaults yield to a mode the
# caller chose (below).
_YIELDING_AXES = ("tile_m", "tile_n", "cluster_m", "cluster_n", "scheduler")


def _launch_defaults_within_limits(spec: Spec, choice: dict[str, Any], chosen: set[str]) -> None:
    """Move a launch axis the caller left at its default to the nearest value the arch's kernel
    implements with the caller's other choices, where one of its limits refuses the default there
    (sm_100a's default 2-CTA tile of 256 rows in a cluster of 2, with gathered block-scaled A:
    tile M 128, cluster 1x1). An axis the caller chose stays, and is refused with the limit's
    reason (as every choice, when no such move gives a point the kernel and the spec accept)."""
    row = lookup(spec.kernel, choice["arch"])
    if row is None:
        return
    axes = tuple(a for a in _YIELDING_AXES if a in spec.choice_map)
    trial = dict(choice)
    for _ in axes:
        bad = refusal(row, trial, axes)
        if bad is None:
            break
        options = [v for v in spec.choice_map[bad.axis] if v in bad.values]
        if bad.axis in chosen or not options:
            return
        now = trial[bad.axis]
        # (the nearest number, the smaller of two; a scheduler: the first the kernel implements)
        trial[bad.axis] = min(options, key=lambda v: abs(v - now) if isinstance(now, int) else 0)
    if trial != choice and refusal(row, trial, axes) is None and not check_choice(trial, spec.constraints):
        choice.update(trial)


def surface(spec: Spec, arch: str, *, as_variants: bool = False) -> Iterator[Any]:
    """Every point of ``spec``'s declared surface on ``arch``, constraints applied: full choice
    dicts (every axis, cheap to count and filter), or :class:`Variant` objects."""
    offered = spec.choice_map
    if arch not in offered["arch"]:
        return
    axes = [a for a in offered if a != "arch"]
    # Depth first, in the product's order: each constraint is checked as soon as every axis it
    # reads is chosen, so a violated one prunes all the points below it instead of each being
    # built and refused (the sReLU spec's raw product is several times its surface: `fusegemm
    # list` took 20 s on it).
    pos = {a: i for i, a in enumerate(axes)}
    ready: list[list[Any]] = [[] for _ in range(len(axes) + 1)]
    for c in spec.constraints:
        read = {a for a, _ in c.when} | {a for a, _ in c.then}
        ready[max([pos[a] + 1 if a in pos else (0 if a == "arch" else len(axes)) for a in read], default=0)].append(c)
    choice: dict[str, Any] = {"arch": arch}
    if any(c.violated_by(choice) for c in ready[0]):
        return

    def walk(depth: int) -> Iterator[Any]:
        if depth == len(axes):
            point = {a: choice[a] for a in axes}
            point["arch"] = arch
            yield _build(spec, point) if as_variants else {**NEUTRAL, **point}
            return
        axis, checks = axes[depth], ready[depth + 1]
        for value in offered[axis]:
            choice[axis] = value
            if not any(c.violated_by(choice) for c in checks):
                yield from walk(depth + 1)
        del choice[axis]

    yield from walk(0)


def prebuild_variants(spec: Spec, archs: tuple[str, ...] | None = None) -> list[Variant]:
    """The variants ``fusegemm build`` compiles by default (the spec's ``prebuild`` list)."""
    out: list[Variant] = []
    for arch in archs or spec.choice_map["arch"]:
        if arch not in spec.choice_map["arch"]:
            continue
        for entry in spec.prebuild:
            e = dict(entry)
            if e.pop("arch", arch) != arch:
                continue
            v = make_variant(spec, arch=arch, **e)
            if v not in out:
                out.append(v)
    return out


def parse_variant_options(items: tuple[str, ...]) -> dict[str, Any]:
    """CLI ``--variant axis=value`` pairs -> typed choices (validated later by make_variant)."""
    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise UnsupportedError(f"--variant: got {item!r}; allowed: axis=value, axes: {', '.join(AXES)}")
        axis, raw = (s.strip() for s in item.split("=", 1))
        if axis not in AXES:
            raise UnsupportedError(f"--variant: unknown axis {axis!r}; allowed: {', '.join(AXES)}")
        if axis in out:
            raise UnsupportedError(f"--variant {axis}: given twice ({out[axis]!r} and {raw!r}); "
                                   f"allowed: one value per axis")
        kind = AXES[axis].kind
        value: Any = raw
        if kind == "bool":
            if raw.lower() not in ("true", "false", "1", "0"):
                raise UnsupportedError(f"--variant {axis}: got {raw!r}; allowed: true, false")
            value = raw.lower() in ("true", "1")
        elif kind == "int":
            try:
                value = int(raw)
            except ValueError:
                raise UnsupportedError(f"--variant {axis}: got {raw!r}; allowed: an integer") from None
        elif kind == "positive_float_or_none" and raw != "none":
            try:
                value = float(raw)
            except ValueError:
                raise UnsupportedError(f"--variant {axis}: got {raw!r}; allowed: none or a number") from None
        out[axis] = value
    return out
