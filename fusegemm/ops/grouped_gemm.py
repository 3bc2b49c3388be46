"""Seed 001: BF16 MoE grouped GEMM, ``grouped_gemm(...)`` and ``GroupedGemm``.

For rows of expert e (``[padded_offsets[e-1], padded_offsets[e])``):
``G = alpha[e] * A_e @ B_e^T`` (FP32 accumulation); with bias ``C = G + prob * bias[:, e]``,
``D = C``; without bias ``C = G``, ``D = prob * G``. Rows at or past
``valid_m = padded_offsets[-1]`` are never written. One call dispatches the sm_90a kernel on
Hopper and the sm_100a kernel on Blackwell.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from ..generator.params import GROUPED_PARAMS
from ..runtime import config
from ..runtime.errors import ArgumentError, UnsupportedError
from ..runtime.tensormap import TensorMapCache
from ..runtime.tensors import resolve_stream
from ..tupledict import TupleDict
from . import _common as cm
from ._common import (_ALIGN_16, _ALIGN_SMALL, M_ALIGNED, OUT_DTYPES, Layout, _signature,
                      check_offsets_values, check_output, parse_call)

TILE_K = 64
# Per-arch defaults and what each kernel implements (check_support explains the rest).
DEFAULT_TILE = {"sm_90a": (128, 256), "sm_100a": (256, 256)}
DEFAULT_CLUSTER = {"sm_90a": (1, 1), "sm_100a": (2, 1)}
SM90_TILES = {(128, 128), (128, 256)}
# tmap_workspace contract: the kernels rotate through kStages <= 8 slots of 128 bytes per CTA.
TMAP_SLOTS_PER_CTA = 8
_PACKER = cm.StructPacker(GROUPED_PARAMS)


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
    sample_a, sample_c, sample_d, sample_padded_offsets, sample_alpha, sample_b, sample_bias, sample_prob
        Representative tensors (dtypes and layouts are taken from them). Dense mode passes
        ``sample_b``; discrete mode passes ``num_experts``, ``b_shape=(N, K)`` and ``b_dtype``.
    acc_dtype : float32 only.
    generate_c : bool
        Write C (``c_tensor`` in ``execute``).
    use_dynamic_sched : bool
        Claim tiles from an atomic counter instead of the static persistent walk.
    mma_tiler_mn, cluster_shape_mn : tile and cluster (defaults per arch).
    arch : "sm_90a" or "sm_100a"; default: the device's.
    """

    def __init__(self, sample_a: Any, sample_c: Any = None, sample_d: Any = None,
                 sample_padded_offsets: Any = None, sample_alpha: Any = None, sample_b: Any = None,
                 sample_bias: Any = None, sample_prob: Any = None, *, num_experts: int | None = None,
                 b_shape: tuple[int, int] | None = None, b_dtype: Any = None, b_major: str = "k",
                 acc_dtype: Any = "float32", c_dtype: Any = None, d_dtype: Any = None,
                 generate_c: bool = False, use_dynamic_sched: bool = False,
                 mma_tiler_mn: Any = None, cluster_shape_mn: Any = None, m_aligned: int = 256,
                 arch: str | None = None) -> None:
        cm.dtype_arg(acc_dtype, "acc_dtype", ("float32",))
        if m_aligned != M_ALIGNED:
            raise ArgumentError("m_aligned", m_aligned, str(M_ALIGNED))
        gen_c = cm.bool_arg(generate_c, "generate_c")
        dynamic = cm.bool_arg(use_dynamic_sched, "use_dynamic_sched")
        for name, value in (("c_dtype", c_dtype), ("d_dtype", d_dtype)):
            if value is not None:
                cm.dtype_arg(value, name, OUT_DTYPES)
        tile = cm.tile_arg(mma_tiler_mn, "mma_tiler_mn", (0, 0))
        cluster = cm.tile_arg(cluster_shape_mn, "cluster_shape_mn", (0, 0))
        discrete = sample_b is None
        n = None
        if discrete:
            if num_experts is None or b_shape is None:
                raise ArgumentError("sample_b", None, "a dense (N, K, L) sample, or num_experts= and "
                                    "b_shape=(N, K) for discrete weights")
            try:
                n, kb = (int(x) for x in b_shape)
            except (TypeError, ValueError):
                raise ArgumentError("b_shape", repr(b_shape), "a pair (N, K)") from None
            k = cm.tensor_arg(sample_a, "sample_a", ndims=(2, 3), dtypes=("bfloat16",)).shape[1]
            if kb != k:
                raise ArgumentError("b_shape", b_shape, f"(N, {k}): K must equal sample_a's K")
        call = parse_call(sample_a, sample_padded_offsets, sample_alpha, sample_b, None,
                          sample_bias, sample_prob, n=n, b_dtype=b_dtype, b_major=b_major,
                          discrete_experts=num_experts if discrete else None)
        c_name = cm.dtype_arg(c_dtype if sample_c is None else cm.view(sample_c, "sample_c").dtype,
                              "c_dtype", OUT_DTYPES) if (sample_c is not None or c_dtype is not None) \
            else "bfloat16"
        d_name = cm.dtype_arg(d_dtype if sample_d is None else cm.view(sample_d, "sample_d").dtype,
                              "d_dtype", OUT_DTYPES) if (sample_d is not None or d_dtype is not None) \
            else "bfloat16"
        if sample_d is not None:
            check_output(sample_d, "sample_d", call, d_name)
        if sample_c is not None and generate_c:
            check_output(sample_c, "sample_c", call, c_name)
        self.features = Features(c_dtype=c_name, d_dtype=d_name,
                                 bias_dtype=call.bias.dtype if call.bias is not None else None,
                                 discrete=discrete, generate_c=gen_c, dynamic=dynamic)
        self.device = call.a.device[1]
        self._n = call.n   # discrete weights: N is not visible on the device pointers
        self.arch = arch or cm.device_arch(self.device)
        self.tile = tile if mma_tiler_mn is not None else DEFAULT_TILE.get(self.arch, (0, 0))
        self.cluster = (cluster if cluster_shape_mn is not None
                        else DEFAULT_CLUSTER.get(self.arch, (1, 1)))
        self._kernel = None
        self._built = None
        self._tmaps = TensorMapCache()
        self._launch_cfgs: dict[int, Any] = {}
        self._layouts: dict[tuple, Layout] = {}
        self._prepared: dict[tuple, tuple] = {}
        self._local = threading.local()

    # ---------------------------------------------------------------------------------
    def support_problem(self) -> str | None:
        """Why this configuration cannot run, or None."""
        if self.arch not in DEFAULT_TILE:
            return f"arch {self.arch!r} is not supported; fusegemm targets sm_90a and sm_100a"
        if self.arch == "sm_90a":
            if self.tile not in SM90_TILES:
                return (f"mma_tiler_mn={self.tile} is not implemented on sm_90a; allowed: "
                        f"{sorted(SM90_TILES)} (two 64-row consumer warpgroups per tile)")
            if self.cluster != (1, 1):
                return (f"cluster_shape_mn={self.cluster} is not implemented on sm_90a; allowed: "
                        f"(1, 1) (no TMA multicast yet)")
        try:
            self._variant()
        except UnsupportedError as exc:
            return str(exc)
        return None

    def check_support(self) -> bool:
        """True when this configuration runs here; otherwise raises UnsupportedError saying why."""
        why = self.support_problem()
        if why is not None:
            raise UnsupportedError(why)
        return True

    def _variant(self):
        from ..generator.variants import make_variant
        f = self.features
        return make_variant("grouped_gemm", arch=self.arch, c_dtype=f.c_dtype, d_dtype=f.d_dtype,
                            bias_dtype=f.bias_dtype or "none",
                            weight_mode="discrete" if f.discrete else "dense",
                            scheduler="dynamic" if f.dynamic else "static",
                            generate_c=f.generate_c, tile_m=self.tile[0], tile_n=self.tile[1],
                            cluster_m=self.cluster[0], cluster_n=self.cluster[1])

    def compile(self) -> "GroupedGemm":
        """Build (or fetch from the kernel cache) and load the kernel on the sample's device."""
        if self._kernel is not None:
            return self
        self.check_support()
        from ..runtime.cache import get_or_build
        from ..runtime.load import default_modules
        built = get_or_build(self._variant())
        if built.staging:
            raise UnsupportedError(f"{built.name}: the {self.arch} kernel of this op has not landed")
        self._kernel = default_modules().get(built.cubin, built.kernel_name, key=built.key,
                                             smem_bytes=built.launch.smem_bytes, device=self.device)
        self._built = built
        self._sms = cm.num_sms(self.device)
        # TMA box rows per CTA: the kernel exports them where they differ from the tile
        # (sm_100a 2-CTA tiles load half the rows per CTA); 0/absent means the tile.
        self._box_a = getattr(built.launch, "box_rows_a", 0) or self.tile[0]
        self._box_b = getattr(built.launch, "box_rows_b", 0) or self.tile[1]
        # The cluster is a launch attribute (one cubin serves every legal shape); the cubin
        # states the smallest it needs (2x1 for a 2-CTA pair), which the spec constraints on
        # the variant already guarantee this op's cluster is a multiple of.
        cm_, cn_ = self.cluster
        if cm_ % built.launch.cluster_m or cn_ % built.launch.cluster_n:
            raise UnsupportedError(f"cluster_shape_mn={self.cluster}: the {self.arch} kernel needs a "
                                   f"multiple of ({built.launch.cluster_m}, {built.launch.cluster_n})")
        self._cluster_ctas = cm_ * cn_
        return self

    # ---------------------------------------------------------------------------------
    def execute(self, a_tensor: Any, c_tensor: Any = None, d_tensor: Any = None,
                padded_offsets: Any = None, alpha_tensor: Any = None, b_tensor: Any = None,
                bias_tensor: Any = None, prob_tensor: Any = None, *, b_ptrs: Any = None,
                current_stream: Any = None, validate_offsets: bool | None = None) -> None:
        """Run on the given tensors (same dtypes/features as the samples; sizes may differ).

        Host fast path: the layout derived from a full validation is memoised by the
        arguments' (dtype, shape, strides, device) signature, so a repeat call with the same
        layouts reads only those attributes and the addresses (alignment is re-checked).
        """
        gen_c = self.features.generate_c
        args = (a_tensor, padded_offsets, alpha_tensor, b_tensor, b_ptrs, bias_tensor,
                prob_tensor, d_tensor, c_tensor if gen_c else None)
        sig = _signature(args)
        lay = self._layouts.get(sig) if sig is not None else None
        if lay is None:
            lay = self._validate(args)
            if sig is not None:
                if len(self._layouts) >= 64:
                    self._layouts.clear()
                self._layouts[sig] = lay
        if sig is not None:
            ptrs = tuple([0 if x is None else x.data_ptr() for x in args])
        else:
            ptrs = tuple([0 if x is None else cm.view(x, "").ptr for x in args])
        for i, name in _ALIGN_16:
            if ptrs[i] & 15:
                cm.aligned(cm.view(args[i], name), name)
        for i, name, nb in _ALIGN_SMALL:
            if ptrs[i] % nb:
                cm.aligned(cm.view(args[i], name), name, nb)
        self._run(lay, ptrs, padded_offsets, current_stream, validate_offsets)

    def _validate(self, args: tuple) -> "Layout":
        a_tensor, padded_offsets, alpha_tensor, b_tensor, b_ptrs, bias_tensor, prob_tensor, \
            d_tensor, c_tensor = args
        f = self.features
        call = parse_call(a_tensor, padded_offsets, alpha_tensor, b_tensor, b_ptrs, bias_tensor,
                          prob_tensor, n=self._n if b_ptrs is not None else None)
        if (call.b_ptrs is not None) != f.discrete:
            raise ArgumentError("b_tensor/b_ptrs", "b_ptrs" if call.b_ptrs is not None else "b_tensor",
                                "b_ptrs (this op was built for discrete weights)" if f.discrete
                                else "b_tensor (this op was built for dense weights)")
        got_bias = call.bias.dtype if call.bias is not None else None
        if got_bias != f.bias_dtype:
            raise ArgumentError("bias_tensor", got_bias or None, f.bias_dtype or "None",
                                "bias presence and dtype are fixed when the op is built")
        d = check_output(d_tensor, "d_tensor", call, f.d_dtype)
        c = check_output(c_tensor, "c_tensor", call, f.c_dtype) if f.generate_c else None
        if call.a.device[1] != self.device:
            raise ArgumentError("a_tensor.device", f"cuda:{call.a.device[1]}",
                                f"cuda:{self.device} (the device this op was compiled for)")
        return Layout.of(call, c, d)

    def _run(self, lay: "Layout", ptrs: tuple, offsets_obj: Any, current_stream: Any,
             validate_offsets: bool | None) -> None:
        from ..runtime.launch import LaunchConfig, ParamBuffer, launch
        if self._kernel is None:
            self.compile()
        stream = resolve_stream(current_stream, self.device)
        if validate_offsets or (validate_offsets is None and config.validate_offsets()):
            check_offsets_values(offsets_obj, lay.m, stream)
        tm, tn = self.tile
        max_tiles = (lay.m // tm) * (-(-lay.n // tn))
        if max_tiles == 0:
            return
        # Persistent grid: one CTA per SM at most, a whole number of clusters.
        cs = self._cluster_ctas
        grid = max(cs, min(self._sms, max_tiles) // cs * cs)
        scratch = self.features.dynamic or lay.discrete
        # Without per-call scratch the argument bytes depend only on (layout, addresses):
        # a repeat call reuses its packed buffer (host fast path; bounded, content-keyed).
        memo_key = None if scratch else (lay, ptrs)
        hit = self._prepared.get(memo_key) if memo_key is not None else None
        if hit is not None:
            launch(self._kernel, hit[1], hit[0], stream)
            return
        tiled = self._tmaps.tiled
        a_ptr, off_ptr, alpha_ptr, b_ptr, bptrs_ptr, bias_ptr, prob_ptr, d_ptr, c_ptr = ptrs
        box_a, box_b = self._box_a, self._box_b
        a_map = tiled(a_ptr, "bfloat16", (lay.k, lay.m), (lay.a_ld * 2,), (TILE_K, box_a))
        if lay.discrete:
            # Template of the device-side per-expert maps: any valid aligned address will do
            # (the kernel swaps in each expert's base before use); A's base is one.
            b_map = tiled(a_ptr, "bfloat16", (lay.k, lay.n), (lay.k * 2,), (TILE_K, box_b))
        else:
            b_map = tiled(b_ptr, "bfloat16", (lay.k, lay.n, lay.l), (lay.b_sn * 2, lay.b_sl * 2),
                          (TILE_K, box_b, 1))
        values: dict[str, Any] = {
            "tma_a": a_map, "tma_b": b_map, "offsets": off_ptr, "alpha": alpha_ptr,
            "prob": prob_ptr, "bias": bias_ptr, "b_ptrs": bptrs_ptr, "d_out": d_ptr,
            "ldd": lay.ldd, "c_out": c_ptr, "ldc": lay.ldc, "m_rows": lay.m, "n": lay.n,
            "k": lay.k, "num_experts": lay.l,
            "cluster_m": self.cluster[0], "cluster_n": self.cluster[1],
        }
        if scratch:
            values.update(self._workspace(grid, stream, current_stream is not None))
        cfg = self._launch_cfgs.get(grid)
        if cfg is None:
            info = self._built.launch
            cfg = self._launch_cfgs[grid] = LaunchConfig(
                grid=(grid, 1, 1), block=(info.threads, 1, 1),
                cluster=(self._cluster_ctas, 1, 1), smem_bytes=self._kernel.smem_bytes)
        if memo_key is not None:
            buf = ParamBuffer(_PACKER.size)
            if len(self._prepared) >= 32:
                self._prepared.clear()
            self._prepared[memo_key] = (buf, cfg)
        else:
            # One argument buffer per thread (cuLaunchKernel copies it before returning).
            buf = getattr(self._local, "buf", None)
            if buf is None:
                buf = self._local.buf = ParamBuffer(_PACKER.size)
        buf.fill(_PACKER.pack(values))
        launch(self._kernel, cfg, buf, stream)

    def _workspace(self, grid: int, stream: int, foreign_stream: bool) -> dict[str, Any]:
        """Per-call scratch: a zeroed tile counter and per-CTA tensor-map slots. Allocated from
        torch's stream-ordered allocator for this call, so graph replays and concurrent calls
        never share it."""
        from ..runtime.load import check, driver
        slots = grid * TMAP_SLOTS_PER_CTA if self.features.discrete else 0
        ws = cm.alloc((128 + 128 * slots,), "uint8", self.device)
        if foreign_stream:
            _record(ws, stream)
        out: dict[str, Any] = {}
        if self.features.dynamic:
            check(driver().cuMemsetD32Async(ws.data_ptr(), 0, 1, stream), "cuMemsetD32Async")
            out["sched_counter"] = ws.data_ptr()
        if slots:
            out["tmap_workspace"] = ws.data_ptr() + 128
        return out


def _record(t: Any, stream: int) -> None:
    """Tell torch's allocator the workspace is used on a stream it does not own."""
    import torch
    if stream != torch.cuda.current_stream(t.device).cuda_stream:
        t.record_stream(torch.cuda.ExternalStream(stream, device=t.device))


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
    (M, N) for a 2-D A; rows at or past ``padded_offsets[-1]`` are left unwritten."""
    if cd_major != "n":
        raise ArgumentError("cd_major", repr(cd_major), "'n'")
    if vector_f32:
        raise ArgumentError("vector_f32", vector_f32, "False", "packed FP32 math is not offered")
    if m_aligned != M_ALIGNED:
        raise ArgumentError("m_aligned", m_aligned, str(M_ALIGNED))
    cm.dtype_arg(acc_dtype, "acc_dtype", ("float32",))
    c_name = cm.dtype_arg(c_dtype, "c_dtype", OUT_DTYPES)
    d_name = cm.dtype_arg(d_dtype, "d_dtype", OUT_DTYPES)
    gen_c = cm.bool_arg(generate_c, "generate_c")
    dyn = cm.bool_arg(use_dynamic_sched, "use_dynamic_sched")
    tile = None if mma_tiler_mn is None else cm.tile_arg(mma_tiler_mn, "mma_tiler_mn", (0, 0))
    cluster = None if cluster_shape_mn is None else cm.tile_arg(cluster_shape_mn,
                                                               "cluster_shape_mn", (0, 0))
    call = parse_call(a_tensor, padded_offsets, alpha_tensor, b_tensor, b_ptrs, bias_tensor,
                      prob_tensor, n=n, b_dtype=b_dtype, b_major=b_major)
    device = call.a.device[1]
    shape = (call.m, call.n) if call.canonical else (call.m, call.n, 1)
    d = cm.alloc(shape, d_name, device)
    c = cm.alloc(shape, c_name, device) if gen_c else None
    key = ("grouped_gemm", device, c_name, d_name, call.bias.dtype if call.bias else None,
           call.b_ptrs is not None, gen_c, dyn, tile, cluster)

    def make() -> GroupedGemm:
        op = GroupedGemm(a_tensor, c, d, padded_offsets, alpha_tensor, b_tensor, bias_tensor,
                         prob_tensor, num_experts=call.l if b_ptrs is not None else None,
                         b_shape=(call.n, call.k) if b_ptrs is not None else None,
                         c_dtype=c_name, d_dtype=d_name, generate_c=gen_c,
                         use_dynamic_sched=dyn, mma_tiler_mn=tile, cluster_shape_mn=cluster)
        return op.compile()

    op = _ops().get_or_create(key, make)
    cv = cm.view(c, "c_tensor") if c is not None else None
    dv = cm.view(d, "d_tensor")
    ptrs = (call.a.ptr, call.offsets.ptr, call.alpha.ptr, call.b.ptr if call.b else 0,
            call.b_ptrs.ptr if call.b_ptrs else 0, call.bias.ptr if call.bias else 0,
            call.prob.ptr if call.prob else 0, dv.ptr, cv.ptr if cv else 0)
    op._run(Layout.of(call, cv, dv), ptrs, padded_offsets, current_stream, validate_offsets)
    return TupleDict(d_tensor=d, c_tensor=c)


_OPS: cm.OpCache | None = None


def _ops() -> cm.OpCache:
    global _OPS
    if _OPS is None:
        _OPS = cm.OpCache()
    return _OPS
