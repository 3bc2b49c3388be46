"""The types of the registry's tables (generator/registry.py): a row (:class:`Implementation`)
says how a kernel class is built on an arch and how much of its surface it implements
(:class:`Limit`, :class:`RunsAs`); an :class:`ArchPolicy` says what is decided per arch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from ..base.archs import arch as arch_entry
from ..base.errors import UnsupportedError
from .axes import AXES, LAUNCH_AXES, NEUTRAL

IMPLEMENTED, NONE = "implemented", "none"
SPEC_RULE = "spec"   # Implementation.rule: the rule generated from the spec's epilogue

# The kernel classes and the problem each solves (its scheduler and output rows): a spec's
# ``problem`` must be its kernel's (generator/spec.py), since the epilogue checks that depend on
# the problem (generator/epilogue.py) are what keep a rule within what the kernel defines.
CLASS_PROBLEMS = {"grouped": "grouped", "kgrouped": "kgrouped", "scaled": "grouped", "batched": "batched",
                  "kscaled": "kgrouped"}


@dataclass(frozen=True)
class Limit:
    """An axis the kernel implements only partly: the values it implements, and why; with
    ``when`` ((axis, value) pairs), only for choices that take all of those values."""

    axis: str
    values: tuple[Any, ...]
    because: str
    when: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        for axis in (self.axis, *(a for a, _ in self.when)):
            if axis not in AXES:
                raise ValueError(f"Limit.axis: got {axis!r}; allowed: {', '.join(AXES)}")

    def applies(self, choice: dict[str, Any]) -> bool:
        """Whether the limit holds for ``choice`` (its ``when`` values are all chosen)."""
        return all(choice.get(a, NEUTRAL.get(a)) == v for a, v in self.when)

    def condition(self) -> str:
        """`` with scheduler=dynamic`` (how ``fusegemm show`` and errors name ``when``), or ''."""
        return "".join(f" with {a}={v}" for a, v in self.when)


@dataclass(frozen=True)
class RunsAs:
    """``axis=value`` runs as ``axis=runs_as`` on this row's kernel, with the same results, and why;
    only for choices that also take every ``when`` value (a conditional one may name an axis that
    otherwise reaches the kernel's source: its other values keep their kernels)."""

    axis: str
    value: Any
    runs_as: Any
    because: str
    when: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        for axis in (self.axis, *(a for a, _ in self.when)):
            if axis not in AXES:
                raise ValueError(f"RunsAs.axis: got {axis!r}; allowed: {', '.join(AXES)}")

    def condition(self) -> str:
        """`` with sf_vec_size=128`` (how ``fusegemm show`` names ``when``), or ''."""
        return "".join(f" with {a}={v}" for a, v in self.when)

    def applies(self, choice: dict[str, Any]) -> bool:
        """Whether ``choice`` takes ``value`` and every ``when`` value."""
        return (choice.get(self.axis, NEUTRAL.get(self.axis)) == self.value and
                all(choice.get(a, NEUTRAL.get(a)) == v for a, v in self.when))


@dataclass(frozen=True)
class Implementation:
    """One registry row: how the kernel class ``kernel_class`` is built on ``arch``.

    Attributes
    ----------
    kernel_class, arch : str
        ``grouped``, ``kgrouped``, ``scaled`` or ``batched`` (``CLASS_PROBLEMS``), and the arch.
    template, header, kernel : str
        The translation unit the renderer instantiates, and the header and C++ kernel template
        (in the arch's header folder) it instantiates.
    rule : str or None
        The epilogue rule the kernel instantiates: ``spec`` (generated from the spec's epilogue,
        generator/emit.py) or None (the kernel has none).
    source_axes : tuple of str
        The variant axes that reach the kernel's own source; a variant's are these plus, where
        the row instantiates the spec's rule, those its epilogue reads (:meth:`axes_for`). The
        launch axes, ``cluster_m`` / ``cluster_n``, reach it only where the row lists them (the
        sm_90a BF16 kernel builds its multi-CTA clusters' kernel apart from the 1x1 one);
        elsewhere one cubin serves every legal cluster.
    limits : tuple of Limit
        Where the kernel implements less of an axis than a spec may declare.
    executed : bool
        False: the kernel has not run on hardware in the project's own tests, though its arch
        has (a class just added): its first launch is gated by fusegemm/verify.py as on an
        unexecuted arch. Set to True once tests/gpu has passed on that arch.
    runs_as : tuple of RunsAs
        Values of an axis the kernel runs as another value, with the same results (sm_90a runs
        ``vector_f32`` with scalar FP32 math): such a variant is the other value's
        (generator/variants.py), so it builds no second kernel.
    family : str
        Empty in the table; ``registry.lookup`` binds the row to the family asked for, whose
        name its messages then carry (``tile_m=256 is not implemented for grouped_gemm_srelu on
        sm_90a``).

    ``status`` is derived, not declared: ``implemented`` where a row exists, ``none`` where no
    row does.
    """

    kernel_class: str
    arch: str
    template: str
    header: str
    kernel: str
    rule: str | None
    source_axes: tuple[str, ...]
    limits: tuple[Limit, ...] = ()
    executed: bool = True
    runs_as: tuple[RunsAs, ...] = ()
    family: str = ""

    def __post_init__(self) -> None:
        arch_entry(self.arch)  # a row for an unknown arch is a programming error: fail at import
        if self.kernel_class not in CLASS_PROBLEMS:
            raise ValueError(f"Implementation.kernel_class: got {self.kernel_class!r}; allowed: "
                             f"{', '.join(CLASS_PROBLEMS)}")
        bad = [a for a in self.source_axes if a not in AXES or a == "arch"]
        # an unconditional one would reach the source; a conditional one maps a value the source takes
        bad += [r.axis for r in self.runs_as if r.axis in self.source_axes and not r.when]
        launch = [a for a in self.source_axes if a in LAUNCH_AXES]
        if bad or launch not in ([], list(LAUNCH_AXES)):
            raise ValueError(f"Implementation.source_axes: got {bad or launch}; allowed: variant axes, "
                             f"and the launch axes only both together ({', '.join(LAUNCH_AXES)})")

    @property
    def status(self) -> str:
        """``implemented``: a row is the kernel that implements its class on its arch."""
        return IMPLEMENTED

    @property
    def _subject(self) -> str:
        """What messages name: the bound family, else the class."""
        return self.family or f"the {self.kernel_class} kernel class"

    def problem(self, choice: dict[str, Any]) -> str | None:
        """Why this implementation does not cover ``choice`` (axis -> value), or None."""
        for lim in self.limits:
            if lim.axis not in choice and lim.axis not in NEUTRAL:
                continue   # not chosen and no neutral value: nothing to check (tile_n of a partial choice)
            value = choice.get(lim.axis, NEUTRAL.get(lim.axis))  # an axis the spec does not choose
            if value not in lim.values and lim.applies(choice):
                return (f"{lim.axis}={value!r} is not implemented for {self._subject} on {self.arch}"
                        f"{lim.condition()}; implemented: {', '.join(map(str, lim.values))} ({lim.because})")
        return None

    def canonical(self, choice: dict[str, Any]) -> dict[str, Any]:
        """``choice`` with each value this kernel runs as another (``runs_as``) replaced by that
        value: the variant this kernel builds for it."""
        out = dict(choice)
        for r in self.runs_as:
            if r.applies(out):
                out[r.axis] = r.runs_as
        return out

    def axes_for(self, epilogue_axes: Iterable[str] = ()) -> tuple[str, ...]:
        """The axes that reach this row's source for a spec whose epilogue reads ``epilogue_axes``
        (``Epilogue.axes_read``): the kernel's, then, where the row instantiates the spec's rule,
        those the rule reads (a ``when: generate_c`` output, a dtype axis of an input)."""
        extra = sorted(set(epilogue_axes) - set(self.source_axes)) if self.rule == SPEC_RULE else []
        return self.source_axes + tuple(a for a in extra if a != "arch")

    def reaching(self, axes: Iterable[str], epilogue_axes: Iterable[str] = ()) -> None:
        """Raise naming the first of ``axes`` that would not change this kernel of a spec whose
        epilogue reads ``epilogue_axes``. An axis the row limits is checked by its limit instead
        (which says what is implemented and why)."""
        source_axes = self.axes_for(epilogue_axes)
        limited = {lim.axis for lim in self.limits}
        runs_as = {r.axis: r for r in self.runs_as if not r.when}   # (a conditional one's axis reaches the source)
        for axis in axes:
            if axis in runs_as:
                r = runs_as[axis]
                raise UnsupportedError(
                    axis=axis, message=f"{axis}: does not reach the {self.arch} kernel of {self._subject}, which "
                    f"runs {axis}={r.value!r} as {axis}={r.runs_as!r} ({r.because}): one kernel for both; allowed: "
                    f"leave {axis} out on {self.arch} (the API accepts {axis}={r.value!r} and runs that kernel)")
            if axis not in source_axes and axis not in LAUNCH_AXES and axis not in limited:
                reach = ", ".join(dict.fromkeys(source_axes + LAUNCH_AXES))
                raise UnsupportedError(
                    axis=axis, message=f"{axis}: does not reach the {self.arch} kernel of {self._subject} (its "
                    f"generated source does not depend on it); axes that reach it: {reach}")


@dataclass(frozen=True)
class ArchPolicy:
    """What fusegemm decides per arch rather than per kernel class.

    Attributes
    ----------
    arch : str
        The arch (``fusegemm/base/archs.py``).
    defaults : tuple of (str, tuple of (str, value))
        Per kernel class, the tile and cluster its kernel prefers on this arch, where the spec
        offers that value (``generator/variants.py`` ``default_choice``); a class not listed
        keeps the spec's defaults.
    heuristic : bool
        Whether the roofline model (``fusegemm/heuristic.py``) chooses the configuration of a
        call that names none and has no tuning record: where the arch cannot be timed here.
    pair_tile_m : int or None
        The tile M whose MMA tile two CTAs share (``cta_group::2``); None: one CTA per tile.
    harness_arch : str
        The arch the epilogue harness of this arch's rules is compiled for
        (``generator/harness.py``): one the project executes, so its epilogue code runs.
    """

    arch: str
    defaults: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...]
    heuristic: bool
    pair_tile_m: int | None
    harness_arch: str

    def __post_init__(self) -> None:
        arch_entry(self.arch)
        arch_entry(self.harness_arch)
        bad = [k for k, _ in self.defaults if k not in CLASS_PROBLEMS]
        bad += [a for _, d in self.defaults for a, _ in d if a not in AXES]
        if bad:
            raise ValueError(f"ArchPolicy.defaults: got {bad}; allowed: kernel classes ({', '.join(CLASS_PROBLEMS)}) "
                             f"mapping variant axes to values")

    def defaults_for(self, kernel_class: str) -> tuple[tuple[str, Any], ...]:
        """(axis, value) pairs ``kernel_class``'s kernel prefers on this arch, sorted by axis."""
        return dict(self.defaults).get(kernel_class, ())

    def ctas_per_tile(self, tile_m: int) -> int:
        """CTAs per MMA tile of this arch's kernels at ``tile_m`` (what their contracts export as
        ``ctas_per_tile``)."""
        return 2 if tile_m == self.pair_tile_m else 1
