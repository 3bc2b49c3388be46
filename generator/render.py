"""Variant -> CUDA C++ translation unit, via Jinja (StrictUndefined, byte-for-byte deterministic).

Templates instantiate; kernel logic lives in headers under templates/include/fusegemm/.
Only validated values reach the template: dtypes through the C++ type table, integers,
booleans, identifiers, and the parameter struct rendered from generator/params.py.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import lru_cache

import jinja2

from .axes import CPP_TYPES, SCALE_CPP_TYPES, SHORT
from .params import params_for
from .variants import Variant

# (kernel family, arch) -> template. Families whose fused epilogue has not landed render a
# carrier that the ops never launch: on sm_100a the grouped block-scaled mainloop with the plain
# GEMM+amax epilogue (the mainloop those ops will use, in every dtype / sf_vec / tile / layout
# combination their spec allows); elsewhere the staging unit (templates/staging.cu.j2: grouped
# scheduler + TMA tile loads), so the pipeline builds real device code for every spec.
TEMPLATES: dict[tuple[str, str], str] = {
    ("grouped_gemm", "sm_90a"): "grouped_gemm.cu.j2",
    ("grouped_gemm", "sm_100a"): "grouped_gemm.cu.j2",
    ("gemm_amax", "sm_100a"): "blockscaled_gemm.cu.j2",
    ("grouped_gemm_srelu", "sm_100a"): "blockscaled_gemm.cu.j2",
    ("grouped_gemm_quant", "sm_100a"): "blockscaled_gemm.cu.j2",
    ("grouped_gemm_dswiglu", "sm_100a"): "blockscaled_gemm.cu.j2",
}
STAGING_TEMPLATE = "staging.cu.j2"
# The (family, arch) pairs whose template implements the op itself.
OP_KERNELS = frozenset({("grouped_gemm", "sm_90a"), ("grouped_gemm", "sm_100a"),
                        ("gemm_amax", "sm_100a")})


def carrier_kind(family: str, arch: str) -> str | None:
    """None when ``family`` has its own kernel on ``arch``, else what the build compiles."""
    if (family, arch) in OP_KERNELS:
        return None
    return "staging unit" if TEMPLATES.get((family, arch), STAGING_TEMPLATE) == STAGING_TEMPLATE \
        else "block-scaled mainloop carrier"
_HASH_PLACEHOLDER = "FUSEGEMM_KERNEL_SYMBOL"


@dataclass(frozen=True)
class Source:
    """A rendered translation unit and its identity."""

    variant: Variant
    name: str          # readable name + "." + hash12 (cache folder, logs)
    symbol: str        # extern "C" kernel symbol
    text: str
    digest: str        # sha256 of the text rendered with a placeholder symbol
    template: str

    @property
    def staging(self) -> bool:
        """True for carriers (staging or mainloop): not the op's kernel, never launched as it."""
        return (self.variant.kernel, self.variant.arch) not in OP_KERNELS


@lru_cache(maxsize=1)
def _env() -> jinja2.Environment:
    from fusegemm import package_data_dir
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(package_data_dir("templates"))),
        undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
        trim_blocks=True, lstrip_blocks=True, autoescape=False)
    env.filters["cpp_type"] = _cpp_type
    env.filters["scale_type"] = _scale_type
    env.filters["cpp_bool"] = lambda v: "true" if v else "false"
    return env


def _cpp_type(dtype: str, none_as: str = "float") -> str:
    if dtype == "none":
        return none_as
    return CPP_TYPES[dtype]


def _scale_type(dtype: str) -> str:
    return SCALE_CPP_TYPES.get(dtype, "cutlass::float_ue8m0_t")


def _render(v: Variant, template: str, symbol: str, readable: str) -> str:
    return _env().get_template(template).render(
        v=v, spec=v.spec, symbol=symbol, arch_dir="sm100" if v.arch == "sm_100a" else "sm90",
        params=params_for(v.kernel).cpp(), readable=readable,
        carrier=(v.kernel, v.arch) not in OP_KERNELS)


def render(v: Variant) -> Source:
    """Render ``v``. The symbol embeds the hash of the source rendered without it.

    Variants whose kernels are identical render identical text (same digest, same cache
    entry): the cluster shape never reaches the source, and a staging unit depends only on the
    family, tile and arch.
    """
    template = TEMPLATES.get((v.kernel, v.arch), STAGING_TEMPLATE)
    readable = v.readable
    arch = v.arch.replace("_", "")
    if template == STAGING_TEMPLATE:
        readable = f"{v.spec.name}.staging.t{v.tile_m}x{v.tile_n}.{arch}"
    elif (v.kernel, v.arch) not in OP_KERNELS:  # mainloop carrier: name the axes it depends on
        readable = (f"{v.spec.name}.carrier.{SHORT[v.ab_dtype]}.sf{SHORT[v.sf_dtype]}."
                    f"v{v.sf_vec_size}.b{v.b_major}.{v.weight_mode}.t{v.tile_m}x{v.tile_n}.{arch}")
    probe = _render(v, template, _HASH_PLACEHOLDER, readable)
    digest = hashlib.sha256(probe.encode()).hexdigest()
    symbol = f"fg_{v.spec.name}_{v.arch.replace('_', '')}_{digest[:12]}"
    text = _render(v, template, symbol, readable)
    return Source(variant=v, name=f"{readable}.{digest[:12]}", symbol=symbol, text=text,
                  digest=digest, template=template)
