"""The closed vocabulary of variant axes: every choice a spec can make, with allowed values.

A spec's ``choices`` narrows these; its ``constraints`` relate them. Values reach C++ only
through the dtype table (``fusegemm/base/dtypes.py``: dtype -> C++ type) or as validated
integers/booleans. ``LAUNCH_AXES`` are launch attributes: they reach the source only where a
registry row lists them (the sm_90a BF16 kernel, whose multi-CTA clusters build their own cubin).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..base.archs import ARCH_NAMES

FLT_MIN, FLT_MAX = 1.1754943508222875e-38, 3.4028234663852886e38

AB_DTYPES = ("bfloat16", "float8_e4m3fn", "float8_e5m2", "float4_e2m1fn_x2")
OUT_DTYPES = ("float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "float4_e2m1fn_x2")


@dataclass(frozen=True)
class Axis:
    name: str
    allowed: tuple[Any, ...] | None  # None: open numeric axis checked by `check`
    doc: str
    kind: str = "enum"               # enum | bool | int | positive_float_or_none

    @property
    def constant(self) -> bool:
        """A numeric compile-time constant an epilogue statement may name (tanh_clamp_scale)."""
        return self.kind == "positive_float_or_none"

    def check(self, value: Any) -> str | None:
        """None if ``value`` is allowed, else a description of what is allowed."""
        if self.kind == "bool":
            return None if isinstance(value, bool) else "true or false"
        if self.kind == "positive_float_or_none":
            if value == "none" or value is None:
                return None
            # A compile-time FP32 constant: finite and normal in FP32 (1e999 and .inf are not
            # finite; 1e-320 would be 0 in the kernel).
            ok = (isinstance(value, (int, float)) and not isinstance(value, bool)
                  and FLT_MIN <= value <= FLT_MAX)
            return None if ok else f"none or a positive finite FP32 number ({FLT_MIN:.8g} to {FLT_MAX:.8g})"
        if self.kind == "int" and (isinstance(value, bool) or not isinstance(value, int)):
            return "one of " + ", ".join(map(str, self.allowed or ()))
        if self.allowed is not None and value not in self.allowed:
            return "one of " + ", ".join(map(str, self.allowed))
        return None


AXES: dict[str, Axis] = {a.name: a for a in (
    Axis("arch", ARCH_NAMES, "target architecture"),
    Axis("ab_dtype", AB_DTYPES, "A and B element type (float4_e2m1fn_x2 = packed FP4)"),
    Axis("sf_dtype", ("none", "float8_e8m0fnu", "float8_e4m3fn", "float32"),
         "block-scale factor type (float32: the blockwise recipe)"),
    Axis("sf_vec_size", (0, 16, 32, 128), "K elements per scale factor (0 = not block-scaled; 128 = blockwise: "
         "A 1x128, B 128x128)", "int"),
    Axis("c_dtype", ("none",) + OUT_DTYPES, "C output (or input, dSwiGLU) type"),
    Axis("d_dtype", ("none",) + OUT_DTYPES, "D output type"),
    Axis("bias_dtype", ("none", "bfloat16", "float16", "float32"), "bias type (none = no bias)"),
    Axis("prob_dtype", ("float32", "bfloat16"), "per-row gate (prob) input type"),
    Axis("weight_mode", ("dense", "discrete"), "B as one (N, K, L) tensor or per-expert pointers"),
    Axis("a_major", ("k", "m"), "A contiguous dimension"),
    Axis("b_major", ("k", "n"), "B contiguous dimension"),
    Axis("a_gather", None, "gathered A: problem row r reads row a_index[r] of A (K-grouped: dY's token rows)",
         "bool"),
    Axis("a_gather_store", None, "gathered A stored as well: the rows the kernel gathered, in problem order, an "
         "output a_rows (M, K)", "bool"),
    Axis("b_gather", None, "K-grouped, gathered X: token row t reads row b_index[t] of X", "bool"),
    Axis("d_scatter", None, "scattered outputs: problem row r's C and D rows are written to row d_index[r] of "
         "(d_rows, N) outputs", "bool"),
    Axis("cd_major", ("n", "m"), "C/D contiguous dimension"),
    Axis("scheduler", ("static", "dynamic", "streamk"), "persistent tile scheduling (streamk: the last wave's "
         "tiles split along K over every CTA)"),
    Axis("generate_c", None, "materialise C", "bool"),
    Axis("generate_dbias", None, "the bias gradient (a per-expert column sum)", "bool"),
    Axis("discrete_col_sfd", None, "column scale factors grouped by expert tile", "bool"),
    Axis("sfd_vec_size", (32, 128), "output quantization blocks (a quantize: block's vec): 32 = MX (E8M0 per 32 "
         "columns), 128 = the blockwise recipe's 1x128 (FP32 per 128 columns)", "int"),
    Axis("sfd_pow2", None, "1x128 output scales rounded up to powers of two (UE8M0, a quantize: block's pow2)",
         "bool"),
    Axis("vector_f32", None, "packed f32 epilogue arithmetic", "bool"),
    Axis("tanh_clamp_scale", None, "sReLU soft clamp s (compile-time)", "positive_float_or_none"),
    Axis("tile_m", (64, 128, 256), "CTA-pair tile M (256 = 2-CTA on sm_100a)", "int"),
    Axis("tile_n", (128, 256), "tile N (128 or 256 accumulator columns: UMMA / WGMMA N)", "int"),
    Axis("cluster_m", (1, 2, 4), "cluster shape M", "int"),
    Axis("cluster_n", (1, 2, 4), "cluster shape N", "int"),
)}

# The value of an axis a spec does not choose (no bias, K-major, not block-scaled, ...).
NEUTRAL: dict[str, Any] = {
    "ab_dtype": "bfloat16", "sf_dtype": "none", "sf_vec_size": 0, "c_dtype": "none",
    "d_dtype": "none", "bias_dtype": "none", "prob_dtype": "float32", "weight_mode": "dense", "a_major": "k",
    "b_major": "k", "a_gather": False, "a_gather_store": False, "b_gather": False, "d_scatter": False,
    "cd_major": "n", "scheduler": "static",
    "generate_c": False,
    "generate_dbias": False, "discrete_col_sfd": False, "sfd_vec_size": 32, "sfd_pow2": False, "vector_f32": False,
    "tanh_clamp_scale": "none",
}

# Axes that choose how a kernel evaluates any epilogue, not what it computes (vector_f32: packed
# FP32 arithmetic, the same bits): a spec may offer them without its epilogue naming them; the
# registry rows say which arch's kernel they reach (generator/registry.py).
ARITHMETIC_AXES = ("vector_f32",)

# Axes that are launch attributes: one cubin serves every legal value, except where a registry
# row lists them among its source axes (generator/registry.py).
LAUNCH_AXES = ("cluster_m", "cluster_n")
