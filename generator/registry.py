"""What is implemented, written down once: one row per (kernel family, arch).

A spec declares an op's surface (every combination of choices the seed API allows); this table
says which kernel implements it on each arch, and how much of it:

* ``template`` and ``header`` / ``kernel``: the translation unit the renderer instantiates and the
  kernel class (in the arch's header folder) it instantiates;
* ``rule``: the epilogue rule the kernel instantiates: ``spec`` (generated from the spec's
  epilogue, generator/emit.py) or ``None`` (the kernel has none);
* ``source_axes``: the variant axes that reach the generated source. The launch axes,
  ``cluster_m`` / ``cluster_n``, do only where the row lists them: the sm_90a BF16 kernel
  builds its multi-CTA clusters' kernel (sliced, multicast loads) apart from the 1x1 one, so
  1x1 launches keep the kernel without cluster machinery; elsewhere one cubin serves every
  legal cluster. Naming any other axis on the command line is an error, since it would not
  change the kernel;
* ``limits`` and ``defaults``: where the kernel implements less of an axis than the spec
  declares, and the defaults it prefers on this arch;
* ``runs_as``: values of an axis the kernel runs as another value, with the same results (the
  sm_90a kernels run ``vector_f32`` with scalar FP32 math: Hopper has no packed FP32). A variant
  of such a value is the other value's variant on this arch (generator/variants.py), so it builds
  no second kernel;
* ``status`` (derived, not declared): ``implemented`` where a row exists, ``none`` where no
  row does.

The renderer, the ops, ``fusegemm build`` / ``list`` / ``show`` and ``selftest`` read this
table and nothing else; the host contract of each kernel is exported by the kernel itself
(``fusegemm/base/contract.py``). Adding an arch is a row in ``fusegemm/base/archs.py``, rows
here and its headers.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from ..base.archs import ARCHS, arch as arch_entry
from ..base.errors import UnsupportedError
from .axes import AXES, LAUNCH_AXES, NEUTRAL

IMPLEMENTED, NONE = "implemented", "none"
SPEC_RULE = "spec"   # Implementation.rule: the rule generated from the spec's epilogue


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
    """``axis=value`` runs as ``axis=runs_as`` on this row's kernel, with the same results, and why."""

    axis: str
    value: Any
    runs_as: Any
    because: str

    def __post_init__(self) -> None:
        if self.axis not in AXES:
            raise ValueError(f"RunsAs.axis: got {self.axis!r}; allowed: {', '.join(AXES)}")


@dataclass(frozen=True)
class Implementation:
    """One registry row: how ``family`` is built on ``arch``."""

    family: str
    arch: str
    template: str
    header: str
    kernel: str
    rule: str | None
    source_axes: tuple[str, ...]
    limits: tuple[Limit, ...] = ()
    defaults: tuple[tuple[str, Any], ...] = ()
    # False: the kernel has not run on hardware in the project's own tests, though its arch
    # has (a family just added): its first launch is gated by fusegemm/verify.py as on an
    # unexecuted arch. Set to True once tests/gpu has passed on that arch.
    executed: bool = True
    runs_as: tuple[RunsAs, ...] = ()

    def __post_init__(self) -> None:
        arch_entry(self.arch)  # a row for an unknown arch is a programming error: fail at import
        bad = [a for a in self.source_axes if a not in AXES or a == "arch"]
        bad += [r.axis for r in self.runs_as if r.axis in self.source_axes]   # it would reach the source
        launch = [a for a in self.source_axes if a in LAUNCH_AXES]
        if bad or launch not in ([], list(LAUNCH_AXES)):
            raise ValueError(f"Implementation.source_axes: got {bad or launch}; allowed: variant axes, "
                             f"and the launch axes only both together ({', '.join(LAUNCH_AXES)})")

    @property
    def operands(self) -> str:
        """The kernel class's operands, which fix how an op is called (fusegemm/ops/engine.py):
        ``grouped`` (BF16, M-grouped), ``kgrouped`` (BF16, K-grouped: weight gradients),
        ``scaled`` (block-scaled, M-grouped) or ``batched`` (block-scaled, batched)."""
        problem = problem_of(self.family)
        if self.template.startswith("blockscaled"):
            return "batched" if problem == "batched" else "scaled"
        return "kgrouped" if problem == "kgrouped" else "grouped"

    @property
    def status(self) -> str:
        """``implemented``: a row is the kernel that implements its family on its arch."""
        return IMPLEMENTED

    def problem(self, choice: dict[str, Any]) -> str | None:
        """Why this implementation does not cover ``choice`` (axis -> value), or None."""
        for lim in self.limits:
            if lim.axis not in choice and lim.axis not in NEUTRAL:
                continue   # not chosen and no neutral value: nothing to check (tile_n of a partial choice)
            value = choice.get(lim.axis, NEUTRAL.get(lim.axis))  # an axis the spec does not choose
            if value not in lim.values and lim.applies(choice):
                return (f"{lim.axis}={value!r} is not implemented for {self.family} on {self.arch}"
                        f"{lim.condition()}; implemented: {', '.join(map(str, lim.values))} ({lim.because})")
        return None

    def canonical(self, choice: dict[str, Any]) -> dict[str, Any]:
        """``choice`` with each value this kernel runs as another (``runs_as``) replaced by that
        value: the variant this kernel builds for it."""
        out = dict(choice)
        for r in self.runs_as:
            if out.get(r.axis, NEUTRAL.get(r.axis)) == r.value:
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
        runs_as = {r.axis: r for r in self.runs_as}
        for axis in axes:
            if axis in runs_as:
                r = runs_as[axis]
                raise UnsupportedError(
                    axis=axis, message=f"{axis}: does not reach the {self.arch} kernel of {self.family}, which runs "
                    f"{axis}={r.value!r} as {axis}={r.runs_as!r} ({r.because}): one kernel for both; allowed: "
                    f"leave {axis} out on {self.arch} (the API accepts {axis}={r.value!r} and runs that kernel)")
            if axis not in source_axes and axis not in LAUNCH_AXES and axis not in limited:
                reach = ", ".join(dict.fromkeys(source_axes + LAUNCH_AXES))
                raise UnsupportedError(
                    axis=axis, message=f"{axis}: does not reach the {self.arch} kernel of {self.family} (its "
                    f"generated source does not depend on it); axes that reach it: {reach}")


def _row(family: str, arch: str, template: str, header: str, kernel: str,
         source_axes: tuple[str, ...], *, rule: str | None = None, limits: tuple[Limit, ...] = (),
         defaults: dict[str, Any] | None = None, executed: bool = True,
         runs_as: tuple[RunsAs, ...] = ()) -> Implementation:
    """A row whose header and kernel class live in ``arch``'s header folder (its namespace)."""
    folder = ARCHS[arch].headers
    return Implementation(family, arch, template, f"fusegemm/{folder}/{header}",
                          f"fusegemm::{folder}::{kernel}", rule, source_axes, tuple(limits),
                          tuple(sorted((defaults or {}).items())), executed, runs_as)


# vector_f32: packed FP32 epilogue arithmetic. The sm_100a kernels have it (FADD2 / FMUL2 /
# FFMA2 on pairs of accumulator columns, fusegemm/sm100/packed_f32.cuh: the source axis
# _VECTOR_F32 below); Hopper has no packed FP32 instructions, so the sm_90a kernels run the
# option with their scalar FP32 math, which gives the same bits (each packed lane is the scalar
# operation, correctly rounded): the variant is the vector_f32=false one, one kernel for both.
_VECTOR_F32 = ("vector_f32",)
_SM90_SCALAR_F32 = (RunsAs("vector_f32", True, False, "sm_90a has no packed FP32 instructions: scalar FP32 "
                           "math, the same results"),)



# sm_90a clusters (TMA multicast of B along cluster M, A along N; fusegemm/cluster.cuh) of the
# M-grouped BF16 kernel: up to 2x2 (its multi-CTA build exports 4 CTAs), static scheduling only
# (a cluster walks its blocks in lockstep; the dynamic claim is per CTA). On the H200 they ran
# no faster than 1x1 on the MoE shapes (bench/results/grouped_gemm_clusters_h200.json), so 1x1
# stays the default and its kernel has no cluster machinery (the cluster reaches the source).
_SM90_CLUSTERS = (
    Limit("cluster_m", (1, 2), "clusters up to 2x2 on sm_90a"),
    Limit("cluster_n", (1, 2), "clusters up to 2x2 on sm_90a"),
    Limit("cluster_m", (1,), "the dynamic scheduler claims tiles per CTA; clusters walk statically",
          when=(("scheduler", "dynamic"),)),
    Limit("cluster_n", (1,), "the dynamic scheduler claims tiles per CTA; clusters walk statically",
          when=(("scheduler", "dynamic"),)),
)

# The sm_90a BF16 kernel's two consumer warpgroups (fusegemm/sm90/grouped_gemm.cuh): both on one
# 128-row tile (cooperative), or each on 64-row tiles of its own, in turn (ping-pong: one's
# epilogue overlaps the other's mainloop). 256 would need 2-CTA instructions (sm_100a).
_SM90_TILE_M = Limit("tile_m", (64, 128), "two WGMMA consumer warpgroups: 128 cooperative (64 rows each), "
                                          "64 ping-pong (a 64-row tile each, in turn)")

# What both archs' K-grouped kernels (weight gradients, Config::kKGrouped) leave out.
_KGROUPED_LIMITS = (
    Limit("weight_mode", ("dense",), "both operands are activations (dense, token-major)"),
    Limit("scheduler", ("static",), "static persistent scheduling only"),
    Limit("cluster_m", (1,), "K-grouped tiles have one K range per expert: clusters are 1x1"),
    Limit("cluster_n", (1,), "K-grouped tiles have one K range per expert: clusters are 1x1"),
)

# Axes each template reads (tests/unit/test_registry.py renders every row with each axis
# changed and checks that exactly these change the source).
_GROUPED_BF16 = ("ab_dtype", "c_dtype", "d_dtype", "bias_dtype", "weight_mode", "b_major",
                 "scheduler", "generate_c", "tile_m", "tile_n")
_BLOCKSCALED = ("ab_dtype", "sf_dtype", "sf_vec_size", "c_dtype", "a_major", "b_major", "cd_major",
                "scheduler", "weight_mode", "tile_m", "tile_n")
_BLOCKSCALED_NO_C = tuple(a for a in _BLOCKSCALED if a != "c_dtype")
# The fused families add what their rules read (quant has no C output: c_dtype does not reach).
_FUSED_AXES = {
    "grouped_gemm_srelu": _BLOCKSCALED + ("d_dtype", "bias_dtype", "discrete_col_sfd", "tanh_clamp_scale"),
    "grouped_gemm_quant": _BLOCKSCALED_NO_C + ("d_dtype", "bias_dtype", "discrete_col_sfd"),
    "grouped_gemm_dswiglu": _BLOCKSCALED + ("d_dtype", "discrete_col_sfd", "prob_dtype"),
}
_SM90_BLOCKSCALED_LIMITS = (
    Limit("ab_dtype", ("float8_e4m3fn", "float8_e5m2"),
          "MXFP8 only: FP4 A/B need sm_100a (Hopper has no FP4 tensor cores, and MXFP8 itself, "
          "promoted into FP32 per 32 K, runs at a third to a half of BF16 speed on the H200)"),
    Limit("a_major", ("k",), "FP8 WGMMA reads K-major A only"),
    Limit("b_major", ("k",), "FP8 WGMMA reads K-major B only"),
    Limit("tile_m", (128,), "two 64-row WGMMA consumer warpgroups"),
    Limit("cluster_m", (1,), "the block-scaled sm_90a kernel has no TMA multicast: clusters are 1x1"),
    Limit("cluster_n", (1,), "the block-scaled sm_90a kernel has no TMA multicast: clusters are 1x1"),
)


def _sm90_axes(axes: tuple[str, ...]) -> tuple[str, ...]:
    """The sm_90a block-scaled kernel implements one value of these axes, so they cannot change
    its source."""
    return tuple(a for a in axes if a not in ("a_major", "b_major", "tile_m"))


_SM90_BLOCKSCALED_DEFAULTS = {"tile_m": 128, "cluster_m": 1, "cluster_n": 1}
# The blockwise recipe (FP32 scales, A 1x128, B 128x128; issue 31) has an sm_90a kernel
# (sm90/blockwise_promote.cuh). The sm_100a kernels read MX scale atoms (tcgen05 block-scaled MMA);
# FP32 block scales need a promoting mainloop there, which is not written yet.
_SM100_MX_SCALES = (
    Limit("sf_vec_size", (16, 32), "the sm_100a kernels take MX scales (per 16 or 32 K); the blockwise recipe "
                                   "(FP32 scales per 128 K) runs on sm_90a"),
    Limit("sf_dtype", ("float8_e8m0fnu", "float8_e4m3fn"), "the sm_100a kernels take MX scales (E8M0 or e4m3); "
                                                           "FP32 blockwise scales run on sm_90a"),
)
_FUSED = ("grouped_gemm_srelu", "grouped_gemm_quant", "grouped_gemm_dswiglu")


ROWS: tuple[Implementation, ...] = (
    _row("grouped_gemm", "sm_100a", "grouped_gemm.cu.j2", "grouped_gemm.cuh",
         "GroupedGemmKernel", _GROUPED_BF16 + _VECTOR_F32, rule=SPEC_RULE),
    _row("grouped_gemm", "sm_90a", "grouped_gemm.cu.j2", "grouped_gemm.cuh",
         "GroupedGemmKernel", _GROUPED_BF16 + LAUNCH_AXES, rule=SPEC_RULE,
         limits=(_SM90_TILE_M, *_SM90_CLUSTERS),
         defaults={"tile_m": 128, "tile_n": 256, "cluster_m": 1, "cluster_n": 1}, runs_as=_SM90_SCALAR_F32),
    # K-grouped weight gradients on the BF16 grouped kernel (Config::kKGrouped): token-major
    # operands, one K range per expert.
    _row("grouped_gemm_wgrad", "sm_90a", "grouped_gemm.cu.j2", "grouped_gemm.cuh",
         "GroupedGemmKernel", ("ab_dtype", "c_dtype", "d_dtype", "tile_m", "tile_n"),
         rule=SPEC_RULE,
         limits=(_SM90_TILE_M, *_KGROUPED_LIMITS),
         defaults={"tile_m": 128, "tile_n": 256, "cluster_m": 1, "cluster_n": 1}, runs_as=_SM90_SCALAR_F32),
    # sm_100a: the tcgen05 kernel with per-tile K ranges (Config::kKGrouped), compiled and
    # statically checked only: no Blackwell GPU has run it (executed=False: its first launch
    # runs the family's selftest cases on the device, fusegemm/verify.py).
    _row("grouped_gemm_wgrad", "sm_100a", "grouped_gemm.cu.j2", "grouped_gemm.cuh",
         "GroupedGemmKernel", ("ab_dtype", "c_dtype", "d_dtype", "tile_n") + _VECTOR_F32,
         rule=SPEC_RULE,
         limits=(Limit("tile_m", (128,), "1-CTA tiles of 128 rows (two 64-row M-major A atoms)"),
                 *_KGROUPED_LIMITS),
         defaults={"tile_m": 128, "tile_n": 256, "cluster_m": 1, "cluster_n": 1}, executed=False),
    _row("gemm_amax", "sm_100a", "blockscaled_gemm.cu.j2", "blockscaled_gemm.cuh",
         "BlockScaledGemmKernel", _BLOCKSCALED + ("discrete_col_sfd",) + _VECTOR_F32, rule=SPEC_RULE,
         limits=_SM100_MX_SCALES),
    *(_row(family, "sm_100a", "blockscaled_gemm.cu.j2", "blockscaled_gemm.cuh",
           "BlockScaledGemmKernel", _FUSED_AXES[family] + _VECTOR_F32, rule=SPEC_RULE, limits=_SM100_MX_SCALES)
      for family in _FUSED),
    # sm_90a: the WGMMA block-scaled kernels (FP8 WGMMA with FP32 promotion per 32 K for MXFP8, per
    # 128 K for the blockwise recipe).
    *(_row(family, "sm_90a", "blockscaled_gemm.cu.j2", "blockscaled_gemm.cuh",
           "BlockScaledGemmKernel", _sm90_axes(_FUSED_AXES.get(family, _BLOCKSCALED + ("discrete_col_sfd",))),
           rule=SPEC_RULE, limits=_SM90_BLOCKSCALED_LIMITS, defaults=_SM90_BLOCKSCALED_DEFAULTS,
           runs_as=_SM90_SCALAR_F32)
      for family in ("gemm_amax",) + _FUSED),
)

_BY_KEY: dict[tuple[str, str], Implementation] = {(r.family, r.arch): r for r in ROWS}


def lookup(family: str, arch: str) -> Implementation | None:
    """The row of (``family``, ``arch``), or None (status ``none``)."""
    return _BY_KEY.get((family, arch))


# The problem each kernel family solves (its kernel's scheduler and output rows): a spec's
# ``problem`` must be its kernel's (generator/spec.py), since the epilogue checks that depend on
# the problem (generator/epilogue.py) are what keep a rule within what the kernel defines.
_PROBLEMS = {"gemm_amax": "batched", "grouped_gemm_wgrad": "kgrouped"}


def kernel_classes() -> dict[str, str]:
    """Kernel class -> the family a spec gets when it names the class (``kernel: scaled``): the
    first row of each class (``grouped_gemm``, ``grouped_gemm_wgrad``, ``gemm_amax``,
    ``grouped_gemm_srelu``, the family names the seeds gave them). A spec that names the class
    builds exactly what one naming that family builds."""
    out: dict[str, str] = {}
    for r in ROWS:
        out.setdefault(r.operands, r.family)
    return out


def problem_of(family: str) -> str:
    """``grouped``, ``batched`` or ``kgrouped``: the problem ``family``'s kernels solve."""
    return _PROBLEMS.get(family, "grouped")


def executed(family: str, arch: str) -> bool:
    """Whether ``family``'s kernel has run on ``arch`` hardware in the project's own tests (the
    arch has, and the row is not marked otherwise)."""
    row = lookup(family, arch)
    return arch_entry(arch).executed and (row is None or row.executed)


def status(family: str, arch: str) -> str:
    """``implemented`` or ``none``."""
    row = lookup(family, arch)
    return row.status if row is not None else NONE


def families() -> tuple[str, ...]:
    """Every family with at least one row, in table order."""
    return tuple(dict.fromkeys(r.family for r in ROWS))


def resolve(family: str, arch: str, choice: dict[str, Any]) -> Implementation:
    """The row that builds ``choice`` of ``family`` on ``arch``; UnsupportedError saying why not."""
    if arch not in ARCHS:
        raise UnsupportedError(f"arch: got {arch!r}; allowed: {', '.join(ARCHS)}", axis="arch")
    row = lookup(family, arch)
    if row is None:
        raise UnsupportedError(f"{family} has no kernel for {arch} (status: none)")
    for lim in row.limits:
        if choice.get(lim.axis, NEUTRAL.get(lim.axis)) not in lim.values and lim.applies(choice):
            raise UnsupportedError(row.problem(choice), axis=lim.axis)
    return row
