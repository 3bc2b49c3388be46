"""Seed 001: BF16 MoE grouped GEMM, ``grouped_gemm(...)`` and ``GroupedGemm``.

For rows of expert e (``[padded_offsets[e-1], padded_offsets[e])``):
``G = alpha[e] * A_e @ B_e^T`` (FP32 accumulation); with bias ``C = G + prob * bias[:, e]``,
``D = C``; without bias ``C = G``, ``D = prob * G``. Rows at or past
``valid_m = padded_offsets[-1]`` are never written. One call dispatches the device's arch: the
kernel, its defaults and its implemented tiles come from ``specs/grouped_gemm.yaml`` and the
registry (generator/registry.py); its launch facts from the kernel's exported contract.
"""
from __future__ import annotations

import functools
import sys
from dataclasses import dataclass
from typing import Any

from .. import reference as _reference
from ..base.docstrings import shares_parameters
from ..base.errors import ArgumentError, UnsupportedError
from ..runtime import config
from ..runtime.interop import dlpack_io
from ..runtime.tensors import resolve_stream, view
from ..tupledict import TupleDict
from . import arg_checks as checks
from . import device as _device
from .device import alloc
from .grouped_operands import ALIGNMENT, check_output, parse_call
from .param_docs import GPU, outputs
from .prepared import OpCache, flat_signature, pattern, signature

SPEC = "grouped_gemm"
# The seed's argument names of the spec's inputs and outputs (the engine's messages), and its
# bias alignment, stricter than the engine's (ALIGNMENT: checked on every call).
_INPUT_NAMES = {"alpha": "alpha_tensor", "prob": "prob_tensor", "bias": "bias_tensor"}
_OUTPUT_NAMES = {"d": "d_tensor", "c": "c_tensor"}
_INPUT_ALIGN = {"bias": ALIGNMENT["bias_tensor"]}


@functools.lru_cache(maxsize=1)
def _spec():
    from ..generator.spec import find_spec
    return find_spec(SPEC)


def _dtypes(axis: str) -> tuple[str, ...]:
    """The dtypes the spec declares for ``axis`` (none excluded)."""
    return tuple(d for d in _spec().choice_map[axis] if d != "none")


@dataclass(frozen=True)
class Features:
    """What selects a kernel variant (never data pointers or run-time sizes)."""

    c_dtype: str
    d_dtype: str
    bias_dtype: str | None
    discrete: bool
    generate_c: bool
    dynamic: bool


class GroupedGemm:
    """Compiled grouped GEMM for one configuration: ``check_support() -> compile() -> execute()``.

    Parameters
    ----------
    sample_a : (M, K) or (M, K, 1) bfloat16
        Representative A. The op is built for the dtypes, layouts and device of the samples;
        sizes may differ in ``execute``.
    sample_c : (M, N) or (M, N, 1) tensor, optional
        Representative C output (with ``generate_c``); its dtype sets ``c_dtype``.
    sample_d : (M, N) or (M, N, 1) tensor, optional
        Representative D output; its dtype sets ``d_dtype``.
    sample_padded_offsets : (L,) int32
        Representative ``padded_offsets``.
    sample_alpha : (L,) float32
        Representative per-expert scales.
    sample_b : (L, N, K) or its (N, K, L) view, bfloat16, optional
        Representative dense weights. Discrete weights pass none and give ``num_experts``,
        ``b_shape=(N, K)`` and ``b_dtype`` instead.
    sample_bias : (N, L), optional
        Representative bias: its presence and dtype are fixed when the op is built.
    sample_prob : (M, 1, 1) or (M,) float32, optional
        Representative per-row gate.
    num_experts : int, optional
        L of discrete weights (no ``sample_b``).
    b_shape : (int, int), optional
        (N, K) of each expert's weights (discrete weights).
    b_dtype : dtype, optional
        Dtype of discrete weights; bfloat16 (the default).
    b_major : "k"
        Weights are K-major.
    c_dtype : dtype, optional
        Output dtypes (bfloat16, float16, float32); default the samples', else bfloat16.
    d_dtype : dtype, optional
        Output dtypes (bfloat16, float16, float32); default the samples', else bfloat16.
    acc_dtype : float32 only.
    m_aligned : 256
        Row padding of every expert (fixed by the kernels).
    vector_f32 : bool
        Packed FP32 epilogue arithmetic on sm_100a (FADD2/FMUL2/FFMA2 on pairs of accumulator
        columns, bit-identical to False); sm_90a runs its scalar kernel.
    generate_c : bool
        Write C (``c_tensor`` in ``execute``).
    use_dynamic_sched : bool
        Claim tiles from an atomic counter instead of the static persistent walk.
    mma_tiler_mn : tile and cluster; default: the spec's, or what the arch's
        kernel prefers (``fusegemm show grouped_gemm`` lists both).
    cluster_shape_mn : tile and cluster; default: the spec's, or what the arch's
        kernel prefers (``fusegemm show grouped_gemm`` lists both).
    arch : an arch of ``fusegemm.base.archs``; default: the device's.
    """

    def __init__(self, sample_a: Any, sample_c: Any = None, sample_d: Any = None,
                 sample_padded_offsets: Any = None, sample_alpha: Any = None, sample_b: Any = None,
                 sample_bias: Any = None, sample_prob: Any = None, *, num_experts: int | None = None,
                 b_shape: tuple[int, int] | None = None, b_dtype: Any = None, b_major: str = "k",
                 acc_dtype: Any = "float32", c_dtype: Any = None, d_dtype: Any = None,
                 generate_c: bool = False, use_dynamic_sched: bool = False,
                 mma_tiler_mn: Any = None, cluster_shape_mn: Any = None, m_aligned: int = 256,
                 vector_f32: bool = False, arch: str | None = None) -> None:
        from ..arguments import M_ALIGNED
        from ..generator.variants import default_choice
        checks.dtype_arg(acc_dtype, "acc_dtype", ("float32",))
        if m_aligned != M_ALIGNED:
            raise ArgumentError("m_aligned", m_aligned, str(M_ALIGNED))
        gen_c = checks.bool_arg(generate_c, "generate_c")
        dynamic = checks.bool_arg(use_dynamic_sched, "use_dynamic_sched")
        self.vector_f32 = checks.bool_arg(vector_f32, "vector_f32")
        out_c, out_d = _dtypes("c_dtype"), _dtypes("d_dtype")
        tile = None if mma_tiler_mn is None else checks.pair_arg(mma_tiler_mn, "mma_tiler_mn")
        cluster = None if cluster_shape_mn is None else checks.pair_arg(cluster_shape_mn, "cluster_shape_mn")
        discrete = sample_b is None
        n = None
        if discrete:
            if num_experts is None or b_shape is None:
                raise ArgumentError("sample_b", None, "a dense (N, K, L) sample, or num_experts= and "
                                    "b_shape=(N, K) for discrete weights")
            n, kb = checks.pair_arg(b_shape, "b_shape")
            k = view(sample_a, "sample_a").shape[1] if sample_a is not None else None
            if kb != k:
                raise ArgumentError("b_shape", b_shape, f"(N, {k}): K must equal sample_a's K")
        call = parse_call(sample_a, sample_padded_offsets, sample_alpha, sample_b, None, sample_bias,
                          sample_prob, ab_dtypes=_dtypes("ab_dtype"), bias_dtypes=_dtypes("bias_dtype"),
                          n=n, b_dtype=b_dtype, b_major=b_major,
                          discrete_experts=num_experts if discrete else None)
        c_name = _out_dtype(sample_c, c_dtype, "c_dtype", out_c)
        d_name = _out_dtype(sample_d, d_dtype, "d_dtype", out_d)
        if sample_d is not None:
            check_output(sample_d, "sample_d", call, d_name)
        if sample_c is not None and gen_c:
            check_output(sample_c, "sample_c", call, c_name)
        self.features = Features(c_dtype=c_name, d_dtype=d_name,
                                 bias_dtype=call.bias.dtype if call.bias is not None else None,
                                 discrete=discrete, generate_c=gen_c, dynamic=dynamic)
        self.device = call.a.device[1]
        self._n = call.n   # discrete weights: N is not visible on the device pointers
        self.arch = arch or _device.device_arch(self.device)
        defaults = default_choice(_spec(), self.arch)
        self.tile = tile or (defaults["tile_m"], defaults["tile_n"])
        self.cluster = cluster or (defaults["cluster_m"], defaults["cluster_n"])
        self._op: Any = None   # the engine's Op of this configuration (compile())
        self._fast: dict[Any, Any] = {}   # this face's call pattern -> the engine's memo entry

    # ---------------------------------------------------------------------------------
    def _choice(self) -> dict[str, Any]:
        """The variant axes this op's configuration sets."""
        f = self.features
        return dict(c_dtype=f.c_dtype, d_dtype=f.d_dtype, bias_dtype=f.bias_dtype or "none",
                    weight_mode="discrete" if f.discrete else "dense",
                    scheduler="dynamic" if f.dynamic else "static", generate_c=f.generate_c,
                    tile_m=self.tile[0], tile_n=self.tile[1], cluster_m=self.cluster[0],
                    cluster_n=self.cluster[1], vector_f32=self.vector_f32)

    def _variant(self):
        from ..generator.variants import make_variant
        return make_variant(_spec(), arch=self.arch, **self._choice())

    def support_problem(self) -> str | None:
        """Why this configuration cannot run, or None: outside what the arch's kernel implements
        (the registry row's status and limits, checked first: they say the most), or outside the
        spec's declared surface."""
        from ..generator import registry
        from ..generator.variants import default_choice
        try:
            registry.resolve(SPEC, self.arch, {**default_choice(_spec(), self.arch), **self._choice()})
            self._variant()
        except UnsupportedError as exc:
            # Name the API argument that set the axis (a tile is one argument, two axes).
            arg = {"tile_m": ("mma_tiler_mn", self.tile), "tile_n": ("mma_tiler_mn", self.tile),
                   "cluster_m": ("cluster_shape_mn", self.cluster),
                   "cluster_n": ("cluster_shape_mn", self.cluster)}.get(exc.axis or "")
            return f"{arg[0]}={arg[1]}: {exc}" if arg else str(exc)
        return None

    def check_support(self) -> bool:
        """True when this configuration runs here; otherwise raises UnsupportedError saying why."""
        why = self.support_problem()
        if why is not None:
            raise UnsupportedError(why)
        return True

    def compile(self) -> "GroupedGemm":
        """Build (or fetch from the kernel cache) and load the kernel on the sample's device.

        On an arch the project has not executed kernels on (``fusegemm.base.archs``), the first
        compile of the family in a process runs its selftest cases on the device first
        (``fusegemm/verify.py``) and refuses to continue if they fail.
        """
        if self._op is not None:
            return self
        self.check_support()
        # The seed's alpha/prob/bias are the spec epilogue's inputs of those names (the engine
        # routes each through the slot the spec gives it): a spec that renamed or dropped one is
        # refused here, before any launch.
        names = {i.name for i in _spec().epilogue.inputs}
        missing = [name for name in ("alpha", "prob", "bias") if name not in names]
        if missing:
            raise UnsupportedError(f"spec {SPEC}: the seed's {missing[0]}_tensor has no epilogue input "
                                   f"{missing[0]!r} (inputs: {', '.join(sorted(names))})")
        from .engine import Op
        self._op = Op(_spec(), arch=self.arch, device=self.device, **self._choice()).compile(tail=False)
        return self

    @property
    def _launcher(self) -> Any:
        """The loaded kernel (its contract, grid and cluster), or None before compile()."""
        return self._op._launcher if self._op is not None else None

    # ---------------------------------------------------------------------------------
    @shares_parameters(_reference.grouped_gemm, extra={**GPU, **outputs({
        "c_tensor": "(M, N) or (M, N, 1), optional", "d_tensor": "(M, N) or (M, N, 1)"})})
    def execute(self, a_tensor: Any, c_tensor: Any = None, d_tensor: Any = None,
                padded_offsets: Any = None, alpha_tensor: Any = None, b_tensor: Any = None,
                bias_tensor: Any = None, prob_tensor: Any = None, *, b_ptrs: Any = None,
                current_stream: Any = None, validate_offsets: bool | None = None) -> None:
        """Run on the given tensors (same dtypes/features as the samples; sizes may differ).

        Runs on the engine (:class:`fusegemm.Op`): the seed's checks and the engine's run once
        per call pattern (the arguments' dtype, shape, strides and device); a repeat call with
        the same layouts re-checks only what its addresses decide (alignment, no overlap) and
        launches prepared parameters.
        """
        # The engine's argument order (operands, b_ptrs / n, inputs, outputs): a pattern seen before
        # launches from the engine's memo entry without the engine's argument plumbing.
        flat = self._flat(a_tensor, padded_offsets, b_tensor, b_ptrs, alpha_tensor, prob_tensor, bias_tensor, d_tensor,
                          c_tensor)
        key = flat_signature(flat)
        e = self._fast.get(key) if key is not None else None
        if e is not None and self._op._execute_memo(e, flat, current_stream, validate_offsets):
            return
        self._execute_full(flat, key, current_stream, validate_offsets)

    def _flat(self, a: Any, off: Any, b: Any, b_ptrs: Any, alpha: Any, prob: Any, bias: Any, d: Any, c: Any) -> tuple:
        """An execute() call's arguments in the engine's order (``ops/prepared.py`` ``pattern``)."""
        flat = (a, off, b, b_ptrs, self._n if b_ptrs is not None else None, alpha, prob, bias, d)
        return flat + (c,) if self.features.generate_c else flat

    def _execute_full(self, flat: tuple, key: Any, current_stream: Any, validate_offsets: bool | None) -> None:
        """Every check (the seed's, then the engine's), a launch, and the engine's memo entry of
        the pattern kept under ``key``."""
        a, off, b, b_ptrs, n, alpha, prob, bias, d = flat[:9]
        c = flat[9] if len(flat) > 9 else None
        args = (a, off, alpha, b, b_ptrs, bias, prob, d, c)
        op, check = self._op, (lambda: self._validate(args))
        if op is None:   # the arguments first: a bad call compiles nothing
            check()
            op, check = self.compile()._op, None
        operands, kw = (a, off, b), {"b_ptrs": b_ptrs, "n": n}
        inputs, outputs = {"alpha": alpha, "prob": prob, "bias": bias}, {"d": d, "c": c} if len(flat) > 9 else {"d": d}
        op.execute(*operands, **kw, inputs=inputs, outputs=outputs, current_stream=current_stream,
                   validate_offsets=validate_offsets, check=check, align=_INPUT_ALIGN,
                   input_names=_INPUT_NAMES, output_names=_OUTPUT_NAMES)
        if key is not None:
            e = op._memo.get(pattern(operands, kw, inputs, outputs)[0])
            if e is not None:
                if len(self._fast) >= 64:
                    self._fast.clear()
                self._fast[key] = e

    def _validate(self, args: tuple) -> None:
        """The seed's checks of an execute() call (its messages, its 16-byte bias), run by the
        engine whenever the call's pattern is not memoised."""
        a_tensor, padded_offsets, alpha_tensor, b_tensor, b_ptrs, bias_tensor, prob_tensor, \
            d_tensor, c_tensor = args
        f = self.features
        call = parse_call(a_tensor, padded_offsets, alpha_tensor, b_tensor, b_ptrs, bias_tensor,
                          prob_tensor, ab_dtypes=_dtypes("ab_dtype"), bias_dtypes=_dtypes("bias_dtype"),
                          n=self._n if b_ptrs is not None else None)
        if (call.b_ptrs is not None) != f.discrete:
            raise ArgumentError("b_tensor/b_ptrs", "b_ptrs" if call.b_ptrs is not None else "b_tensor",
                                "b_ptrs (this op was built for discrete weights)" if f.discrete
                                else "b_tensor (this op was built for dense weights)")
        got_bias = call.bias.dtype if call.bias is not None else None
        if got_bias != f.bias_dtype:
            raise ArgumentError("bias_tensor", got_bias or None, f.bias_dtype or "None",
                                "bias presence and dtype are fixed when the op is built")
        check_output(d_tensor, "d_tensor", call, f.d_dtype)
        if f.generate_c:
            check_output(c_tensor, "c_tensor", call, f.c_dtype)
        if call.a.device[1] != self.device:
            raise ArgumentError("a_tensor.device", f"cuda:{call.a.device[1]}",
                                f"cuda:{self.device} (the device this op was compiled for)")


def _out_dtype(sample: Any, given: Any, name: str, allowed: tuple[str, ...]) -> str:
    """An output dtype from its sample tensor, else the dtype argument, else bfloat16."""
    if sample is not None:
        return checks.dtype_arg(view(sample, f"sample_{name[0]}").dtype, name, allowed)
    return checks.dtype_arg(given, name, allowed) if given is not None else "bfloat16"


@dlpack_io
@shares_parameters(_reference.grouped_gemm, extra=GPU)
def grouped_gemm(a_tensor: Any, padded_offsets: Any, alpha_tensor: Any, b_tensor: Any = None,
                 bias_tensor: Any = None, b_ptrs: Any = None, n: int | None = None,
                 b_dtype: Any = None, b_major: str = "k", prob_tensor: Any = None,
                 acc_dtype: Any = "float32", c_dtype: Any = "bfloat16", d_dtype: Any = "bfloat16",
                 cd_major: str = "n", mma_tiler_mn: Any = None, cluster_shape_mn: Any = None,
                 vector_f32: bool = False, m_aligned: int = 256, generate_c: bool = False,
                 use_dynamic_sched: bool = False, current_stream: Any = None, *,
                 validate_offsets: bool | None = None) -> TupleDict:
    """Grouped BF16 GEMM (seed 001 wrapper). Returns ``TupleDict(d_tensor, c_tensor)``;
    ``c_tensor`` is None unless ``generate_c``. Outputs are (M, N, 1) for a (M, K, 1) A and
    (M, N) for a 2-D A; rows at or past ``padded_offsets[-1]`` are left unwritten.

    Host fast path: a call whose inputs have the (dtype, shape, strides, device) signature and
    options of an earlier call skips the argument parsing that call did (base alignment is
    re-checked) and allocates its outputs from the memoised shapes.

    Configuration: without ``mma_tiler_mn``, ``cluster_shape_mn`` and ``use_dynamic_sched``, the
    configuration ``fusegemm tune`` recorded for the call's shape bucket (:mod:`fusegemm.tune`);
    else, with ``FUSEGEMM_AUTOTUNE=1``, the bucket is tuned on this first call and its winner
    recorded; else on sm_100a the roofline model's choice (:mod:`fusegemm.heuristic`), else the
    spec's default.
    """
    inputs = (a_tensor, padded_offsets, alpha_tensor, b_tensor, b_ptrs, bias_tensor, prob_tensor)
    sig = signature(inputs)
    key = None
    if sig is not None:
        key = (sig, n, b_dtype, b_major, acc_dtype, c_dtype, d_dtype, cd_major, mma_tiler_mn,
               cluster_shape_mn, vector_f32, m_aligned, generate_c, use_dynamic_sched)
        try:
            fast = _ops().fast.get(key)
        except TypeError:   # an unhashable option (a list tile): the full path
            fast = key = None
        if fast is not None:
            op, shape, d_dtype_t, c_dtype_t, device, entry = fast
            empty = sys.modules["torch"].empty    # a signature means torch is loaded
            d = empty(shape, dtype=d_dtype_t, device=device)
            c = empty(shape, dtype=c_dtype_t, device=device) if c_dtype_t is not None else None
            # The engine's memo entry of this call: its outputs' layouts are the memoised ones.
            flat = op._flat(a_tensor, padded_offsets, b_tensor, b_ptrs, alpha_tensor, prob_tensor, bias_tensor, d, c)
            if not op._op._execute_memo(entry, flat, current_stream, validate_offsets):
                op.execute(a_tensor, c, d, padded_offsets, alpha_tensor, b_tensor, bias_tensor, prob_tensor,
                           b_ptrs=b_ptrs, current_stream=current_stream, validate_offsets=validate_offsets)
            return TupleDict.of(d_tensor=d, c_tensor=c)
    return _grouped_gemm_checked(inputs, key, n, b_dtype, b_major, acc_dtype, c_dtype, d_dtype, cd_major,
                                 mma_tiler_mn, cluster_shape_mn, vector_f32, m_aligned, generate_c,
                                 use_dynamic_sched, current_stream, validate_offsets)


def _tuned(call: Any, device: int, c_name: str | None, d_name: str,
           b_major: str, stream: Any = None) -> tuple[Any, bool, Any]:
    """(tile, dynamic, cluster) for a call that names no configuration: what ``fusegemm tune``
    recorded for its bucket; else, with ``FUSEGEMM_AUTOTUNE=1``, what tuning the bucket now
    finds (:func:`fusegemm.tune.first_call`, reached through the hook the package root installs:
    tuning times this op); else, on sm_100a (which cannot be timed here), the roofline model's
    choice (fusegemm/heuristic.py); else (None, False, None): the spec's default. Runs on the
    wrapper's first call of an argument signature only."""
    from .. import tuning_records
    from ..base.hooks import FIRST_CALL_TUNE
    from .prepared import is_dry
    # A record written later (a tuning run in this process) must reach the calls memoised on
    # the fast path: they re-resolve their configuration.
    tuning_records.on_change(SPEC, lambda: _ops().fast.clear())
    arch, name = _device_identity(device)
    bucket = tuning_records.Bucket.of(experts=call.l, m_rows=call.m, n=call.n, k=call.k, d_dtype=d_name,
                                      c_dtype=c_name, bias=call.bias.dtype if call.bias is not None else None,
                                      discrete=call.b_ptrs is not None, b_major=b_major)
    hit = tuning_records.lookup(SPEC, arch, name, bucket)
    if hit is None and config.autotune() and not is_dry():
        hit = FIRST_CALL_TUNE(SPEC, arch, device, name, bucket, experts=call.l, m_rows=call.m, n=call.n,
                              k=call.k, d_dtype=d_name, stream=resolve_stream(stream, device))
    if hit is not None:
        return hit.tile, hit.dynamic, None
    if arch == "sm_100a" and call.bias is None:     # (bias needs tile N 256: the default's)
        from .. import heuristic
        # Every expert's rows are a multiple of 256 and every tile M divides 256, so the tile
        # count depends on the rows' sum only: the allocation's rows, with no device read.
        c = heuristic.choose([call.m] + [0] * (call.l - 1), call.n, call.k)
        if c != heuristic.DEFAULT:
            return c.tile, False, c.cluster
    return None, False, None


@functools.lru_cache(maxsize=16)
def _device_identity(device: int) -> tuple[str, str]:
    from ..runtime.load import device_name
    return _device.device_arch(device), device_name(device)


def _grouped_gemm_checked(inputs: tuple, key: tuple | None, n, b_dtype, b_major, acc_dtype, c_dtype,
                          d_dtype, cd_major, mma_tiler_mn, cluster_shape_mn, vector_f32, m_aligned,
                          generate_c, use_dynamic_sched, current_stream, validate_offsets) -> TupleDict:
    """The wrapper with every argument checked; memoises what the fast path needs under ``key``."""
    from ..arguments import M_ALIGNED
    a_tensor, padded_offsets, alpha_tensor, b_tensor, b_ptrs, bias_tensor, prob_tensor = inputs
    if cd_major != "n":
        raise ArgumentError("cd_major", repr(cd_major), "'n'")
    packed = checks.bool_arg(vector_f32, "vector_f32")   # sm_100a: packed FP32 epilogue, same bits
    if m_aligned != M_ALIGNED:
        raise ArgumentError("m_aligned", m_aligned, str(M_ALIGNED))
    checks.dtype_arg(acc_dtype, "acc_dtype", ("float32",))
    c_name = checks.dtype_arg(c_dtype, "c_dtype", _dtypes("c_dtype"))
    d_name = checks.dtype_arg(d_dtype, "d_dtype", _dtypes("d_dtype"))
    gen_c = checks.bool_arg(generate_c, "generate_c")
    dyn = checks.bool_arg(use_dynamic_sched, "use_dynamic_sched")
    tile = None if mma_tiler_mn is None else checks.pair_arg(mma_tiler_mn, "mma_tiler_mn")
    cluster = None if cluster_shape_mn is None else checks.pair_arg(cluster_shape_mn, "cluster_shape_mn")
    call = parse_call(a_tensor, padded_offsets, alpha_tensor, b_tensor, b_ptrs, bias_tensor,
                      prob_tensor, ab_dtypes=_dtypes("ab_dtype"), bias_dtypes=_dtypes("bias_dtype"),
                      n=n, b_dtype=b_dtype, b_major=b_major)
    device = call.a.device[1]
    shape = (call.m, call.n) if call.canonical else (call.m, call.n, 1)
    d = alloc(shape, d_name, device)
    c = alloc(shape, c_name, device) if gen_c else None
    if tile is None and cluster is None and not dyn:     # every argument checked: now the device
        tile, dyn, cluster = _tuned(call, device, c_name if gen_c else None, d_name, b_major, current_stream)
    # Discrete weights: the op holds N (pointers carry no shape), so each N is an op of its own
    # (the same kernel); a call of another N reused the first N's op and was refused.
    op_key = (SPEC, device, c_name, d_name, call.bias.dtype if call.bias else None,
              call.n if call.b_ptrs is not None else None, gen_c, dyn, tile, cluster, packed)

    def make() -> GroupedGemm:
        op = GroupedGemm(a_tensor, c, d, padded_offsets, alpha_tensor, b_tensor, bias_tensor,
                         prob_tensor, num_experts=call.l if b_ptrs is not None else None,
                         b_shape=(call.n, call.k) if b_ptrs is not None else None,
                         c_dtype=c_name, d_dtype=d_name, generate_c=gen_c,
                         use_dynamic_sched=dyn, mma_tiler_mn=tile, cluster_shape_mn=cluster,
                         vector_f32=packed)
        return op.compile()

    op = _ops().get_or_create(op_key, make)
    op.execute(a_tensor, c, d, padded_offsets, alpha_tensor, b_tensor, bias_tensor, prob_tensor, b_ptrs=b_ptrs,
               current_stream=current_stream, validate_offsets=validate_offsets)
    entry = op._fast.get(flat_signature(op._flat(a_tensor, padded_offsets, b_tensor, b_ptrs, alpha_tensor, prob_tensor,
                                                 bias_tensor, d, c)))
    if key is not None and entry is not None:
        fast = _ops().fast
        if len(fast) >= 256:
            fast.clear()
        fast[key] = (op, shape, d.dtype, c.dtype if c is not None else None, d.device, entry)
    return TupleDict(d_tensor=d, c_tensor=c)


_OPS: OpCache | None = None


def _ops() -> OpCache:
    global _OPS
    if _OPS is None:
        _OPS = OpCache()
    return _OPS
