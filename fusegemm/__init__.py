"""fusegemm: generated fused GEMM kernels for Mixture-of-Experts training.

Declarative YAML specs (``specs/``) are rendered into CuTe/CUTLASS CUDA C++ (``templates/``),
JIT-compiled with NVRTC into a content-addressed cubin cache (``runtime/``) and launched from
Python with validated arguments (``fusegemm.ops``).

Importing this package touches neither CUDA nor the disk: the first call that needs them does.
"""
from __future__ import annotations

from pathlib import Path as _Path

from .base import hooks as _hooks
from .base.package import __version__

# In a wheel, hatchling maps generator/, runtime/, templates/ and specs/ inside this package.
# In a source checkout (editable install, or tests run from the repo) they sit beside it at
# the repo top level, where the design card wants them visible; extending __path__ makes
# `fusegemm.generator` resolve there. Only the checkout layout triggers this.
_here = _Path(__file__).resolve().parent
if not (_here / "generator").is_dir() and (_here.parent / "generator" / "__init__.py").is_file():
    __path__.append(str(_here.parent))  # type: ignore[name-defined]  # noqa: F821


# The package root wires the calls the ops make upward (fusegemm/base/hooks.py): it runs before
# any fusegemm module, so the first-run gate and the first-call tuner are in place before any
# launch. The imports stay inside the functions: `import fusegemm` touches neither the runtime
# nor the ops.
def _first_launch(variant: object, device: int, ctas: int | None = None) -> None:
    from .verify import ensure_verified
    ensure_verified(variant, device, ctas)


def _first_call_tune(*args: object, **kwargs: object) -> object:
    from .tune import first_call
    return first_call(*args, **kwargs)


_hooks.FIRST_LAUNCH.install(_first_launch)
_hooks.FIRST_CALL_TUNE.install(_first_call_tune)


_EXPORTS = {
    "Op": ("fusegemm.ops.engine", "Op"),
    "EpilogueGemm": ("fusegemm.ops.epilogue_gemm", "EpilogueGemm"),
    "KGroupedGemm": ("fusegemm.ops.kgrouped", "KGroupedGemm"),
    "BlockScaledGemm": ("fusegemm.ops.blockscaled", "BlockScaledGemm"),
    **{name: ("fusegemm.presets", name) for name in (
        "grouped_gemm", "GroupedGemm", "grouped_gemm_srelu", "grouped_gemm_quant", "grouped_gemm_dswiglu", "gemm_amax",
        "GroupedGemmSrelu",
        "GroupedGemmQuant", "GroupedGemmDswiglu", "GemmAmax", "grouped_gemm_glu", "grouped_gemm_dglu",
        "grouped_gemm_dsrelu")},
    "TupleDict": ("fusegemm.tupledict", "TupleDict"),
    "add_bundle": ("fusegemm.pipeline", "add_bundle"),
    "load_spec": ("fusegemm.generator.spec", "load_spec"),
    **{name: ("fusegemm.base.errors", name) for name in (
        "FusegemmError", "ArgumentError", "UnsupportedError", "SpecError", "CompileError",
        "ToolchainError", "CacheError", "ConfigError", "ContractError", "UnverifiedError")},
}
__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str):
    # Lazy public API: `import fusegemm` stays cheap and touches neither CUDA nor the disk.
    if name in _EXPORTS:
        import importlib
        module, attr = _EXPORTS[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value   # resolved once: later lookups skip this hook (host fast path)
        return value
    raise AttributeError(f"module 'fusegemm' has no attribute {name!r}")

