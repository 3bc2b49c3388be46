"""Variant -> CUDA C++ translation unit, via Jinja (StrictUndefined, byte-for-byte deterministic).

Templates instantiate; kernel logic lives in headers under templates/include/fusegemm/. Which
template, header and kernel class a variant renders is the registry's answer
(generator/registry.py). Only validated values reach the template: dtypes through the dtype
table's C++ column, integers, booleans, identifiers from the registry, the parameter struct
(generator/params.py) and the contract export list (fusegemm/base/contract.py).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import lru_cache

import jinja2

from ..base.archs import ARCHS
from ..base.contract import FIELDS as CONTRACT_FIELDS
from ..base.dtypes import dtype
from .emit import rule_model
from .params import params_for
from .registry import SPEC_RULE, Implementation, check_rule, resolve
from .variants import Variant

_HASH_PLACEHOLDER = "FUSEGEMM_KERNEL_SYMBOL"


@dataclass(frozen=True)
class Source:
    """A rendered translation unit and its identity."""

    variant: Variant
    impl: Implementation   # the registry row it instantiates
    name: str              # readable name + "." + hash12 (cache folder, logs)
    symbol: str            # extern "C" kernel symbol
    text: str
    digest: str            # sha256 of the text rendered with a placeholder symbol

    @property
    def template(self) -> str:
        return self.impl.template


@lru_cache(maxsize=1)
def _env() -> jinja2.Environment:
    from ..base.package import package_data_dir
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(package_data_dir("templates"))),
        undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
        trim_blocks=True, lstrip_blocks=True, autoescape=False)
    env.filters["cpp_type"] = _cpp_type
    env.filters["scale_type"] = _scale_type
    env.filters["cpp_bool"] = lambda v: "true" if v else "false"
    return env


def _cpp_type(name: str, none_as: str = "float") -> str:
    if name == "none":
        return none_as
    cpp = dtype(name).cpp
    if cpp is None:
        raise ValueError(f"dtype {name!r} has no C++ element type")
    return cpp


def _scale_type(name: str) -> str:
    cpp = dtype(name).scale_cpp if name != "none" else None
    if cpp is None:
        raise ValueError(f"sf_dtype: got {name!r}; allowed: a block-scale factor type (float8_e8m0fnu, "
                         f"float8_e4m3fn, float32)")
    return cpp


def kernel_name(v: Variant, impl: Implementation) -> str:
    """People's name of the kernel: the axes that reach its source (the kernel's and its rule's),
    tile and arch."""
    return v.name_for(impl.axes_for(v.spec.epilogue.axes_read()))


def rule_of(v: Variant, impl: Implementation):
    """The model of the epilogue rule ``impl`` instantiates for ``v`` (None: no rule); with its
    packed two-column form when ``v`` asks for ``vector_f32`` and the kernel has packed FP32
    (the row lists the axis)."""
    if impl.rule == SPEC_RULE:
        packed = v.vector_f32 and "vector_f32" in impl.source_axes
        resolved = v.spec.epilogue.resolve(v.choices)
        check_rule(v.choices, resolved, v.kernel)
        return rule_model(resolved, packed=packed)
    return None


def _render(v: Variant, impl: Implementation, symbol: str, readable: str) -> str:
    return _env().get_template(impl.template).render(
        v=v, spec=v.spec, impl=impl, symbol=symbol, readable=readable,
        params=params_for(v.kernel).cpp(), contract=CONTRACT_FIELDS, rule=rule_of(v, impl))


def render(v: Variant) -> Source:
    """Render ``v`` with the kernel the registry assigns it.

    The symbol embeds the hash of the source rendered without it, so variants whose kernels are
    identical render identical text (same digest, same cache entry): no axis outside the row's
    ``source_axes`` reaches the source (the cluster shape only where the row lists it). Raises
    UnsupportedError when no kernel implements ``v`` (with the reason).
    """
    impl = resolve(v.kernel, v.arch, v.choices)
    readable = kernel_name(v, impl)
    probe = _render(v, impl, _HASH_PLACEHOLDER, readable)
    digest = hashlib.sha256(probe.encode()).hexdigest()
    symbol = f"fg_{v.spec.name}_{ARCHS[v.arch].short}_{digest[:12]}"
    text = probe.replace(_HASH_PLACEHOLDER, symbol)
    return Source(variant=v, impl=impl, name=f"{readable}.{digest[:12]}", symbol=symbol, text=text,
                  digest=digest)
