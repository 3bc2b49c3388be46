"""Variant -> the translation unit of its epilogue harness (templates/harness.cu.j2).

The harness runs a spec's generated rule on given FP32 accumulators with the kernels' own
epilogue code (fusegemm/harness.cuh): ``block`` mode through the engine every sm_100a kernel
uses, ``fragment`` mode through the sm_90a kernel's fragment path (element-wise rules only). A
``d_scatter`` variant's block harness stores C and D rows through ``d_index`` as those kernels do.
It is compiled for the arch the variant's arch's registry policy names (``harness_arch``: sm_90a
for both archs), so the H200 executes the epilogue code of both. The host side is
fusegemm/harness_run.py.
"""
from __future__ import annotations

import dataclasses
import hashlib

from ..base.archs import ARCHS
from ..base.contract import FIELDS as CONTRACT_FIELDS
from ..base.errors import UnsupportedError
from .emit import rule_model
from .params import HARNESS_PARAMS
from .registry import lookup, policy
from .render import Source, _env
from .variants import Variant

MODES = ("block", "fragment")


def render_harness(v: Variant, mode: str) -> Source:
    """The harness of ``v``'s epilogue in ``mode``; UnsupportedError for a fragment harness of a
    rule that is not element-wise."""
    if mode not in MODES:
        raise UnsupportedError(f"mode: got {mode!r}; allowed: {', '.join(MODES)}")
    harness_arch = policy(v.arch).harness_arch
    v = dataclasses.replace(v, arch=harness_arch)
    resolved = v.spec.epilogue.resolve(v.choices)
    rule = rule_model(resolved)
    if mode == "fragment" and dict(rule.traits)["kElementwise"] != "true":
        raise UnsupportedError(f"mode: fragment runs element-wise rules only; {v.spec.name}'s rule pairs, "
                               f"quantizes or reduces: use block")
    if mode == "fragment" and v.d_scatter:
        raise UnsupportedError("d_scatter: the fragment harness stores rows in place; the block harness runs "
                               "the engine's scattered stores (the sm_100a kernels')", axis="d_scatter")
    impl = lookup(v.kernel, harness_arch)
    readable = f"{v.spec.name}.harness.{mode}.{v.name_for(v.spec.choice_map).split('.', 1)[-1]}"
    text = _env().get_template("harness.cu.j2").render(
        spec=v.spec, mode=mode, readable=readable, params=HARNESS_PARAMS.cpp(), rule=rule,
        tile_n=v.tile_n, discrete_col_sfd=v.discrete_col_sfd, scatter=mode == "block" and v.d_scatter,
        symbol="FUSEGEMM_KERNEL_SYMBOL", contract=CONTRACT_FIELDS)
    digest = hashlib.sha256(text.encode()).hexdigest()
    symbol = f"fg_harness_{ARCHS[harness_arch].short}_{digest[:12]}"
    return Source(variant=v, impl=impl, name=f"{readable}.{digest[:12]}", symbol=symbol,
                  text=text.replace("FUSEGEMM_KERNEL_SYMBOL", symbol), digest=digest)
