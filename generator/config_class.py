"""Configuration classes: what decides which paths a kernel's launch takes, apart from its
epilogue's math (tile, cluster, CTAs per tile, scheduler, operand majors, scaling recipe,
weights). The first-run gate (fusegemm/verify.py) verifies and records kernels fusegemm has not
executed per class; fusegemm/selftest.py holds each class's cases.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ..base.dtypes import short
from . import registry


# The operand modes a class records (ConfigClass.operands), in slug order, and their words.
_OPERAND_WORDS = {"a_gather": "gathered A", "a_gather_store": "gathered A stored", "b_gather": "gathered B",
                  "d_scatter": "scattered outputs", "d_m_major": "M-major D"}


@dataclass(frozen=True)
class ConfigClass:
    """What decides which paths a kernel's launch takes, apart from the epilogue's math: the
    unit the first-run gate verifies and records.

    Attributes
    ----------
    family, arch : str
        The kernel family (a spec's ``kernel``) and the arch.
    kind : str
        The family's kernel class (``grouped``, ``kgrouped``, ``scaled``, ``batched``;
        ``registry.kernel_class``).
    tile, cluster : (int, int)
        The MMA tile (M, N) and the cluster (M, N).
    ctas : int
        CTAs per MMA tile: 2 for the sm_100a kernels' 256-row tiles (``cta_group::2``; the
        arch's registry policy).
    scheduler : str
        ``static``, ``dynamic`` or ``streamk`` (sm_90a BF16 grouped: the last wave split along K).
    majors : (str, str)
        A's and B's memory order (``k``, ``m`` / ``n``).
    recipe : (str, str, int)
        A/B element format, scale format and elements per scale (``("bfloat16", "none", 0)`` for
        unscaled operands; ``sf_vec_size`` 128 with float32 scales is the blockwise recipe).
    weights : str
        ``dense`` or ``discrete`` (per-expert pointers).
    operands : tuple of str
        The operand modes that change the loads or the stores: ``a_gather`` (A's rows through an
        index), ``a_gather_store`` (those rows stored as well, the op's ``a_rows``), ``b_gather``
        (the K-grouped X's token rows through an index) and ``d_scatter``
        (C and D rows stored through an index), ``d_m_major`` (the K-grouped kernel's D_e^T,
        ``cd_major`` m: stored column by column); empty for whole rows.
    """

    family: str
    arch: str
    kind: str
    tile: tuple[int, int]
    cluster: tuple[int, int]
    ctas: int
    scheduler: str
    majors: tuple[str, str]
    recipe: tuple[str, str, int]
    weights: str
    operands: tuple[str, ...] = ()

    @property
    def slug(self) -> str:
        """A file-name-safe label: ``t256x256.c2x1.cta2.static.kk.bf16.dense`` (a block-scaled
        recipe reads ``e4m3-ue8m0x32``)."""
        ab, sf, vec = self.recipe
        fmt = short(ab) if sf == "none" else f"{short(ab)}-{short(sf)}x{vec}"
        return (f"t{self.tile[0]}x{self.tile[1]}.c{self.cluster[0]}x{self.cluster[1]}.cta{self.ctas}."
                f"{self.scheduler}.{''.join(self.majors)}.{fmt}.{self.weights}"
                + "".join(f".{o.replace('_', '-')}" for o in self.operands))

    def describe(self) -> str:
        """For people: ``tile 256x256, cluster 2x1, 2 CTAs per tile, static scheduler, ...``."""
        ab, sf, vec = self.recipe
        fmt = ab if sf == "none" else f"{ab} with {sf} scales per {vec}"
        return (f"tile {self.tile[0]}x{self.tile[1]}, cluster {self.cluster[0]}x{self.cluster[1]}, "
                f"{self.ctas} CTA{'s' if self.ctas > 1 else ''} per tile, {self.scheduler} scheduler, "
                f"{self.majors[0]}-major A, {self.majors[1]}-major B, {fmt}, {self.weights} weights"
                + "".join(f", {_OPERAND_WORDS[o]}" for o in self.operands))

    def axes(self) -> dict[str, Any]:
        """The variant axes that pin this class (``fusegemm.Op(spec, **cls.axes())``)."""
        ab, sf, vec = self.recipe
        out: dict[str, Any] = {"tile_m": self.tile[0], "tile_n": self.tile[1], "cluster_m": self.cluster[0],
                               "cluster_n": self.cluster[1], "scheduler": self.scheduler,
                               "a_major": self.majors[0], "b_major": self.majors[1], "ab_dtype": ab,
                               "weight_mode": self.weights}
        if sf != "none":
            out.update(sf_dtype=sf, sf_vec_size=vec)
        out.update({o: True for o in self.operands if o != "d_m_major"})
        if "d_m_major" in self.operands:
            out["cd_major"] = "m"
        return out

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "ConfigClass":
        return cls(**{**d, "tile": tuple(d["tile"]), "cluster": tuple(d["cluster"]),
                      "majors": tuple(d["majors"]), "recipe": tuple(d["recipe"]),
                      "operands": tuple(d.get("operands", ()))})


def config_class(variant: Any, ctas: int | None = None) -> ConfigClass:
    """The configuration class of ``variant`` (``ctas``: its kernel's ``ctas_per_tile``, which
    the gate passes; else the arch's policy says)."""
    return ConfigClass(
        family=variant.kernel, arch=variant.arch, kind=registry.kernel_class(variant.kernel),
        tile=(variant.tile_m, variant.tile_n), cluster=(variant.cluster_m, variant.cluster_n),
        ctas=ctas or registry.policy(variant.arch).ctas_per_tile(variant.tile_m),
        scheduler=variant.scheduler, majors=(variant.a_major, variant.b_major),
        recipe=(variant.ab_dtype, variant.sf_dtype, variant.sf_vec_size), weights=variant.weight_mode,
        operands=tuple(o for o in _OPERAND_WORDS if _mode(variant, o)))


def _mode(variant: Any, operand: str) -> bool:
    """Whether ``variant`` has operand mode ``operand`` (``d_m_major``: a K-grouped M-major D; the
    batched class's M-major C is its seed's layout, not a mode of its own)."""
    if operand == "d_m_major":
        return variant.cd_major == "m" and registry.kernel_class(variant.kernel) == "kgrouped"
    return bool(getattr(variant, operand, False))
