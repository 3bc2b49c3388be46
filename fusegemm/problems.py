"""Seeded problem makers: inputs for the references and (later) the GPU ops, as keyword arguments.

``make_grouped_problem`` builds a grouped MoE problem for one of the four grouped ops,
``make_batched_problem`` a batched dense problem for ``gemm_amax``. Both return a frozen dataclass
of read-only numpy arrays named like the seed wrappers' parameters; ``problem.kwargs()`` gives the
dict to call an op with (``reference.grouped_gemm_quant(**problem.kwargs())``).

Values
------
``values="nvidia"`` follows NVIDIA's tests: A, B ~ U(-2, 2) rounded to the element format, scales
drawn from {1, 2}, alpha, prob and beta small integers in {1, 2}, bias integers in [-2, 2],
norm_const 0.01, C ~ U(-2, 2). ``values="integer"``: the same with A and B rounded to integers
in [-2, 2], so every FP32 accumulation is exact in any order (kernel outputs then match the
references bit for bit, quantized bytes included). ``values="realistic"``: A ~ N(0, 1) with a log-normal per-row
magnitude, B ~ N(0, 1/K), both block-quantized with amax-derived scales
(:func:`fusegemm.formats.quantize_blockwise`), alpha, beta ~ U(0.5, 2), prob ~ U(0, 1),
bias ~ N(0, 0.1), C ~ N(0, 1), norm_const 1.

Experts
-------
``tokens`` is a total (split by ``skew``: ``"balanced"`` evenly, ``"skewed"`` Zipf-like,
``"with_empty"`` a quarter of the experts, at least one, get none) or a per-expert list. Each
expert's rows are padded up to a multiple of 256; padding rows hold zeros
(``pad_rows="zero"``) or values like the real rows (``"random"``).
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any, Mapping, Sequence

import ml_dtypes
import numpy as np

from . import reference
from .arguments import M_ALIGNED, MAX_EXPERTS
from .formats.blockscale import block_format, quantize_blockwise
from .formats.numpy_dtypes import FP8_NAMES, resolve_dtype
from .formats.elements import to_format
from .formats.scales import pack_sf, sf_to_kernel_view
from .formats.views import a_to_kernel, b_to_kernel, cd_to_kernel, prob_to_kernel

__all__ = ["GroupedProblem", "BatchedProblem", "make_grouped_problem", "make_batched_problem", "split_tokens"]

OPS = ("grouped_gemm", "grouped_gemm_srelu", "grouped_gemm_quant", "grouped_gemm_dswiglu")
SKEWS = ("balanced", "skewed", "with_empty")
VALUES = ("nvidia", "realistic", "integer")
LAYOUTS = ("kernel", "canonical")
PAD_ROWS = ("zero", "random")
AB_DTYPES = ("float8_e4m3fn", "float8_e5m2", "float4_e2m1fn_x2", "uint8")
_META_FIELDS = ("op", "layout", "tokens", "n", "k", "ab_dtype", "sf_dtype", "options")


def _choice(value: Any, argument: str, allowed: Sequence[Any]) -> None:
    if value not in allowed:
        raise ValueError(f"{argument}={value!r} is not supported; allowed: {', '.join(map(repr, allowed))}")


def _positive_int(value: Any, argument: str, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"{argument}={value!r} must be an int >= {low}")
    return int(value)


def _frozen(x: Any) -> Any:
    """Make arrays (and arrays inside tuples) read-only so a shared problem cannot be altered."""
    if isinstance(x, np.ndarray):
        x.flags.writeable = False
    elif isinstance(x, tuple):
        for item in x:
            _frozen(item)
    return x


def split_tokens(total: int, num_experts: int, skew: str, rng: np.random.Generator) -> list[int]:
    """Split ``total`` tokens over experts: ``balanced``, ``skewed`` (Zipf 1.2) or ``with_empty``."""
    _choice(skew, "skew", SKEWS)
    if skew == "balanced":
        q, r = divmod(total, num_experts)
        return [q + 1] * r + [q] * (num_experts - r)
    if skew == "skewed":
        weights = rng.permutation(1.0 / np.arange(1, num_experts + 1) ** 1.2)
    else:
        if num_experts < 2:
            raise ValueError("skew='with_empty' needs num_experts >= 2 (one expert must get tokens)")
        weights = rng.uniform(0.5, 1.5, num_experts)
        empty = rng.choice(num_experts, max(1, num_experts // 4), replace=False)
        weights[empty] = 0.0
    share = total * weights / weights.sum()
    counts = np.floor(share).astype(np.int64)
    leftover = total - int(counts.sum())
    counts[np.argsort(-(share - counts), kind="stable")[:leftover]] += 1
    return counts.tolist()


@dataclass(frozen=True)
class GroupedProblem:
    """Inputs of one grouped op, named like the seed wrapper's parameters (read-only arrays).

    ``b_list``/``sfb_list`` replace ``b_tensor``/``sfb_tensor`` in discrete mode. ``tokens`` are
    the real tokens per expert before padding to 256.
    """

    op: str
    layout: str
    tokens: tuple[int, ...]
    n: int
    k: int
    ab_dtype: str
    sf_dtype: str | None
    sf_vec_size: int | None
    padded_offsets: np.ndarray
    a_tensor: np.ndarray
    alpha_tensor: np.ndarray
    prob_tensor: np.ndarray
    b_tensor: np.ndarray | None = None
    b_list: tuple[np.ndarray, ...] | None = None
    sfa_tensor: np.ndarray | None = None
    sfb_tensor: np.ndarray | None = None
    sfb_list: tuple[np.ndarray, ...] | None = None
    bias_tensor: np.ndarray | None = None
    beta_tensor: np.ndarray | None = None
    c_tensor: np.ndarray | None = None
    norm_const_tensor: np.ndarray | None = None
    c_dtype: str | None = None
    d_dtype: str | None = None
    options: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def num_experts(self) -> int:
        """L."""
        return len(self.tokens)

    @property
    def valid_m(self) -> int:
        """``padded_offsets[-1]`` (also the row count of A)."""
        return int(self.padded_offsets[-1])

    def kwargs(self, **overrides: Any) -> dict[str, Any]:
        """Keyword arguments for ``op`` (None entries left out), updated with ``overrides``."""
        accepted = inspect.signature(getattr(reference, self.op)).parameters
        out = {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.name in accepted and f.name not in _META_FIELDS and getattr(self, f.name) is not None
        }
        if self.b_list is not None:
            out["n"] = self.n  # discrete mode states N (the GPU op cannot read it from pointers)
        out.update(self.options)
        out.update(overrides)
        return out


@dataclass(frozen=True)
class BatchedProblem:
    """Inputs of ``gemm_amax``: A (M, K, L), B (N, K, L), their scales, and ``c_dtype``."""

    m: int
    n: int
    k: int
    batch: int
    ab_dtype: str
    sf_dtype: str
    sf_vec_size: int
    a_tensor: np.ndarray
    b_tensor: np.ndarray
    sfa_tensor: np.ndarray
    sfb_tensor: np.ndarray
    c_dtype: str

    def kwargs(self, **overrides: Any) -> dict[str, Any]:
        """Keyword arguments for ``gemm_amax``, updated with ``overrides``."""
        names = ("a_tensor", "b_tensor", "sfa_tensor", "sfb_tensor", "c_dtype", "sf_vec_size")
        return {**{name: getattr(self, name) for name in names}, **overrides}


def _format(ab_dtype: Any, sf_dtype: Any, sf_vec_size: int | None) -> tuple[str, str, int]:
    ab = resolve_dtype(ab_dtype, argument="ab_dtype", allowed=AB_DTYPES)
    ab = "float4_e2m1fn_x2" if ab == "uint8" else ab
    vec = sf_vec_size if sf_vec_size is not None else (32 if ab in FP8_NAMES else 16)
    if sf_dtype is None:
        sf_dtype = "float8_e4m3fn" if ab not in FP8_NAMES and vec == 16 else "float8_e8m0fnu"
    fmt = block_format(ab, sf_dtype, vec)
    return fmt.elem, fmt.sf, fmt.sf_vec_size


def _uniform(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """float32 U(-2, 2) without a float64 intermediate (the large problems are GBs)."""
    x = rng.random(shape, dtype=np.float32)
    x *= 4.0
    x -= 2.0
    return x


def _operand(rng: np.random.Generator, shape: tuple[int, ...], ab: str, sf: str, vec: int, values: str,
             live_rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Quantized data (..., rows, K or K/2) and logical scales (..., rows, sfk).

    Realistic values: activations (``live_rows`` given) N(0, 1) times a log-normal row
    magnitude, weights N(0, 1/K).
    """
    k = shape[-1]
    if values != "realistic":
        x = _uniform(rng, shape)
        if values == "integer":
            np.rint(x, out=x)
    else:
        x = rng.standard_normal(shape, dtype=np.float32)
        if live_rows is None:
            x /= np.float32(np.sqrt(k))
        else:
            x *= rng.lognormal(0.0, 1.0, shape[:-1] + (1,)).astype(np.float32)
    if live_rows is not None:
        x[~live_rows] = 0.0
    if values == "realistic":
        return quantize_blockwise(x, ab_dtype=ab, sf_dtype=sf, sf_vec_size=vec)
    sfk = -(-k // vec)
    choice = rng.integers(0, 2, shape[:-1] + (sfk,)).astype(np.float32) + 1.0  # {1, 2}
    return to_format(x, ab, saturate=True), to_format(choice, sf)


def _small_ints(rng: np.random.Generator, size: int, values: str, low: float, high: float) -> np.ndarray:
    if values != "realistic":
        return rng.integers(1, 3, size).astype(np.float32)
    return rng.uniform(low, high, size).astype(np.float32)


def make_grouped_problem(
    op: str,
    *,
    num_experts: int,
    tokens: int | Sequence[int],
    n: int,
    k: int,
    ab_dtype: Any = None,
    sf_dtype: Any = None,
    sf_vec_size: int | None = None,
    skew: str = "balanced",
    seed: int = 0,
    values: str = "nvidia",
    layout: str = "kernel",
    d_dtype: Any = None,
    c_dtype: Any = None,
    bias: bool = False,
    discrete: bool = False,
    pad_rows: str = "zero",
    norm_const: float | None = None,
    **options: Any,
) -> GroupedProblem:
    """Build a seeded grouped problem for ``op``.

    Parameters
    ----------
    op : {"grouped_gemm", "grouped_gemm_srelu", "grouped_gemm_quant", "grouped_gemm_dswiglu"}
    num_experts : int
        L, 1 to 1024.
    tokens : int or sequence of int
        Total tokens (split by ``skew``) or tokens per expert (then ``skew`` must stay default).
    n : int
        GEMM N and K (dSwiGLU: C and D have 2N columns; N a multiple of 32).
    k : int
        GEMM N and K (dSwiGLU: C and D have 2N columns; N a multiple of 32).
    ab_dtype : element dtype; ``bfloat16`` for ``grouped_gemm`` (its only one, the default),
        else ``float8_e4m3fn`` (default), ``float8_e5m2`` or ``float4_e2m1fn_x2``.
    sf_dtype : scale format; default E8M0/32 for FP8 and e4m3/16 (NVFP4) for FP4.
    sf_vec_size : scale format; default E8M0/32 for FP8 and e4m3/16 (NVFP4) for FP4.
    skew : {"balanced", "skewed", "with_empty"}
    seed : int
    values : {"nvidia", "realistic", "integer"}
    layout : {"kernel", "canonical"}
        Seed-page shapes (A (M, K, 1), B (N, K, L) view, SF 6-D views, prob (M, 1, 1)) or
        canonical ones (A (M, K), B (L, N, K), physical SF buffers, prob (M,)).
    d_dtype : output dtypes (``c_dtype`` is dSwiGLU's C input dtype); op defaults if None.
    c_dtype : output dtypes (``c_dtype`` is dSwiGLU's C input dtype); op defaults if None.
    bias : bool
        Add a ``bias_tensor`` (N, L) bfloat16 (not for dSwiGLU).
    discrete : bool
        Per-expert ``b_list``/``sfb_list`` instead of dense B (not for dSwiGLU).
    pad_rows : {"zero", "random"}
    norm_const : float, optional
        Default 0.01 (nvidia) or 1.0 (realistic).
    **options
        Extra keyword arguments stored and passed through ``kwargs()`` (e.g. ``generate_c``,
        ``tanh_clamp_scale``, ``discrete_col_sfd``).
    """
    _choice(op, "op", OPS)
    _choice(values, "values", VALUES)
    _choice(layout, "layout", LAYOUTS)
    _choice(pad_rows, "pad_rows", PAD_ROWS)
    num_experts = _positive_int(num_experts, "num_experts")
    if num_experts > MAX_EXPERTS:
        raise ValueError(f"num_experts={num_experts} exceeds the maximum {MAX_EXPERTS}")
    n, k = _positive_int(n, "n"), _positive_int(k, "k")
    if op == "grouped_gemm_dswiglu" and (n % 32 or bias or discrete):
        raise ValueError(f"grouped_gemm_dswiglu needs n % 32 == 0 and no bias/discrete; got n={n}, "
                         f"bias={bias}, discrete={discrete}")
    rng = np.random.default_rng(seed)
    counts = _expert_tokens(tokens, num_experts, skew, rng)
    offsets = np.cumsum([-(-t // M_ALIGNED) * M_ALIGNED for t in counts], dtype=np.int64).astype(np.int32)
    m = int(offsets[-1])
    live = np.ones(m, dtype=bool)
    if pad_rows == "zero":
        live[:] = False
        for start, t in zip(np.concatenate([[0], offsets[:-1]]), counts):
            live[start : start + t] = True
    out: dict[str, Any] = dict(op=op, layout=layout, tokens=tuple(counts), n=n, k=k, padded_offsets=offsets)
    if op == "grouped_gemm":
        if ab_dtype is not None:
            resolve_dtype(ab_dtype, argument="ab_dtype (grouped_gemm)", allowed=("bfloat16",))
        a, b = _bf16_operands(rng, m, (num_experts, n, k), values, live)
        sfa = sfb = None
        out.update(ab_dtype="bfloat16", sf_dtype=None, sf_vec_size=None)
    else:
        ab, sf, vec = _format(ab_dtype or "float8_e4m3fn", sf_dtype, sf_vec_size)
        a, sfa = _operand(rng, (m, k), ab, sf, vec, values, live)
        b, sfb = _operand(rng, (num_experts, n, k), ab, sf, vec, values)
        sfa, sfb = pack_sf(sfa), pack_sf(sfb, batch_first=True)
        out.update(ab_dtype=ab, sf_dtype=sf, sf_vec_size=vec)

    out["alpha_tensor"] = _small_ints(rng, num_experts, values, 0.5, 2.0)
    prob = _small_ints(rng, m, values, 0.0, 1.0)
    if bias:
        raw = rng.integers(-2, 3, (num_experts, n)) if values != "realistic" else rng.normal(0, 0.1, (num_experts, n))
        out["bias_tensor"] = raw.astype(np.float32).astype(ml_dtypes.bfloat16).T  # (N, L), strides (1, N)
    if op != "grouped_gemm":
        nc = norm_const if norm_const is not None else (0.01 if values != "realistic" else 1.0)
        out["norm_const_tensor"] = np.array([nc], dtype=np.float32)
    c = None
    if op == "grouped_gemm_dswiglu":
        out["beta_tensor"] = _small_ints(rng, num_experts, values, 0.5, 2.0)
        c_name = resolve_dtype(c_dtype or "bfloat16", argument="c_dtype",
                               allowed=("float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2"))
        raw_c = _uniform(rng, (m, 2 * n)) if values != "realistic" else rng.standard_normal((m, 2 * n), np.float32)
        c = to_format(raw_c, c_name, saturate=True)
        out["d_dtype"] = d_dtype or ("float8_e4m3fn" if out["ab_dtype"] in FP8_NAMES else "bfloat16")
    else:
        out["d_dtype"] = d_dtype or "bfloat16"
        if op in ("grouped_gemm", "grouped_gemm_srelu"):
            out["c_dtype"] = c_dtype or "bfloat16"
    out.update(_arrange(layout == "kernel", a, b, sfa, sfb, prob, c, discrete))
    out["options"] = MappingProxyType(dict(options))
    for name, value in out.items():
        if name != "options":
            _frozen(value)
    return GroupedProblem(**out)


def _expert_tokens(tokens: int | Sequence[int], num_experts: int, skew: str, rng: np.random.Generator) -> list[int]:
    if isinstance(tokens, (int, np.integer)) and not isinstance(tokens, bool):
        return split_tokens(_positive_int(tokens, "tokens", 0), num_experts, skew, rng)
    counts = [_positive_int(t, "tokens[i]", 0) for t in tokens]
    if len(counts) != num_experts or skew != "balanced":
        raise ValueError(
            f"tokens as a per-expert list needs len(tokens) == num_experts ({num_experts}) and "
            f"the default skew; got len={len(counts)}, skew={skew!r}"
        )
    return counts


def _bf16_operands(rng: np.random.Generator, m: int, b_shape: tuple[int, int, int], values: str,
                   live: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A (M, K) and B (L, N, K) in bfloat16; padding rows of A zero unless ``live``."""
    k = b_shape[2]
    b = np.empty(b_shape, dtype=ml_dtypes.bfloat16)
    for e in range(b_shape[0]):  # one expert at a time keeps the float32 copy small
        b[e] = _uniform(rng, b_shape[1:]) if values != "realistic" else (
            rng.standard_normal(b_shape[1:], np.float32) / np.float32(np.sqrt(k)))
    a = _uniform(rng, (m, k)) if values != "realistic" else rng.standard_normal((m, k), np.float32)
    a[~live] = 0.0
    if values == "integer":
        a, b = np.rint(a), np.rint(b.astype(np.float32))
    return a.astype(ml_dtypes.bfloat16), b.astype(ml_dtypes.bfloat16)


def _arrange(kernel: bool, a: np.ndarray, b: np.ndarray, sfa: np.ndarray | None, sfb: np.ndarray | None,
             prob: np.ndarray, c: np.ndarray | None, discrete: bool) -> dict[str, Any]:
    """Tensors in the kernel-facing (seed) or canonical layout, dense or per-expert B."""
    sf_form = sf_to_kernel_view if kernel else (lambda x: x)
    out: dict[str, Any] = {
        "a_tensor": a_to_kernel(a) if kernel else a,
        "prob_tensor": prob_to_kernel(prob) if kernel else prob,
    }
    if c is not None:
        out["c_tensor"] = cd_to_kernel(c) if kernel else c
    if sfa is not None:
        out["sfa_tensor"] = sf_form(sfa)
    if discrete:
        out["b_list"] = tuple(np.ascontiguousarray(b[e]) for e in range(b.shape[0]))
        if sfb is not None:
            out["sfb_list"] = tuple(sf_form(sfb[e : e + 1]) for e in range(b.shape[0]))
    else:
        out["b_tensor"] = b_to_kernel(b) if kernel else b
        if sfb is not None:
            out["sfb_tensor"] = sf_form(sfb)
    return out


def make_batched_problem(
    *,
    m: int,
    n: int,
    k: int,
    batch: int = 1,
    ab_dtype: Any = "float8_e4m3fn",
    sf_dtype: Any = None,
    sf_vec_size: int | None = None,
    c_dtype: Any = "float32",
    a_major: str = "k",
    seed: int = 0,
    values: str = "nvidia",
    layout: str = "kernel",
) -> BatchedProblem:
    """Build a seeded ``gemm_amax`` problem.

    Parameters
    ----------
    m : int
        Shapes; A is (M, K, L) and B (N, K, L) with L = ``batch``.
    n : int
        Shapes; A is (M, K, L) and B (N, K, L) with L = ``batch``.
    k : int
        Shapes; A is (M, K, L) and B (N, K, L) with L = ``batch``.
    batch : int
        Shapes; A is (M, K, L) and B (N, K, L) with L = ``batch``.
    ab_dtype
        As for :func:`make_grouped_problem` (defaults MXFP8 e4m3).
    sf_dtype
        As for :func:`make_grouped_problem` (defaults MXFP8 e4m3).
    sf_vec_size
        As for :func:`make_grouped_problem` (defaults MXFP8 e4m3).
    c_dtype : output dtype passed through ``kwargs()``.
    a_major : {"k", "m"}
        Memory order of A (and B): k-major, or m-major (FP8 only).
    seed
        As for :func:`make_grouped_problem`.
    values
        As for :func:`make_grouped_problem`.
    layout : {"kernel", "canonical"}
        Kernel-facing 3-D tensors with 6-D SF views, or (batch 1 only) 2-D A/B with physical SF.
    """
    _choice(values, "values", VALUES)
    _choice(layout, "layout", LAYOUTS)
    _choice(a_major, "a_major", ("k", "m"))
    m, n, k, batch = (_positive_int(v, name) for v, name in ((m, "m"), (n, "n"), (k, "k"), (batch, "batch")))
    ab, sf, vec = _format(ab_dtype, sf_dtype, sf_vec_size)
    if a_major == "m" and ab not in FP8_NAMES:
        raise ValueError(f"a_major='m' needs FP8 A/B; packed FP4 ({ab}) is k-major only")
    if layout == "canonical" and batch != 1:
        raise ValueError(f"layout='canonical' (2-D A/B) needs batch=1; got batch={batch}")
    rng = np.random.default_rng(seed)
    a, sfa = _operand(rng, (batch, m, k), ab, sf, vec, values, np.ones((batch, m), bool))
    b, sfb = _operand(rng, (batch, n, k), ab, sf, vec, values)
    sfa, sfb = pack_sf(sfa, batch_first=True), pack_sf(sfb, batch_first=True)

    def arrange(x: np.ndarray) -> np.ndarray:
        if layout == "canonical":
            return x[0]
        if a_major == "m":  # (rows, K, L) with strides (1, rows, rows*K)
            return np.transpose(np.ascontiguousarray(np.transpose(x, (0, 2, 1))), (2, 1, 0))
        return b_to_kernel(x)  # (rows, K, L) with strides (K, 1, rows*K)

    problem = BatchedProblem(
        m=m, n=n, k=k, batch=batch, ab_dtype=ab, sf_dtype=sf, sf_vec_size=vec,
        a_tensor=arrange(a), b_tensor=arrange(b),
        sfa_tensor=sfa if layout == "canonical" else sf_to_kernel_view(sfa),
        sfb_tensor=sfb if layout == "canonical" else sf_to_kernel_view(sfb),
        c_dtype=resolve_dtype(c_dtype, argument="c_dtype", allowed=(
            "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "float4_e2m1fn_x2", "uint8")),
    )
    for f in fields(problem):
        _frozen(getattr(problem, f.name))
    return problem
