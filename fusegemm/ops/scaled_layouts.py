"""Operand layouts of the block-scaled seeds: which are invalid for an op (ArgumentError), which
are valid and run through a K-major copy made on the device, and which are valid but not run here
(UnsupportedError naming what is missing); and the discrete weights a class is built for (seed
002's ``num_experts=``, ``b_shape=``).

A and B are K-major in every seed; MN-major FP8 operands are valid too where a seed says so
(seed 004: A M-major and B N-major; seed 000: dense B N-major; seed 002: discrete B
``b_major="n"``). Whether a layout is valid for an op is its spec's answer (the ``a_major`` /
``b_major`` choices and constraints, so packed FP4 stays K-major). The kernels read K-major FP8
(sm_90a's FP8 WGMMA reads K-major shared memory only; the sm_100a kernels could read MN-major but
fusegemm's host path encodes K-major tensor maps only), so an op built for an MN-major dense
operand (``host_copies``) builds the K-major kernel and each call first copies that operand into
a K-major buffer on the launch stream (``k_major_operands``: a tiled byte transpose,
templates/include/fusegemm/transpose.cuh, one read and one write of the operand;
bench/blockscaled.py's ``dswiglu_bw_nmajor`` times it). Discrete N-major weights (seed 002's
``b_major="n"`` with ``b_ptrs``: each expert's dense (N, K) matrix N-major) are copied the same
way, through the pointer table, into one K-major (L, N, K) buffer that a new pointer table on the
device points into; that buffer lives until the call returns (the launch stream orders its reuse).
"""
from __future__ import annotations

import contextlib
import struct
from typing import Any, Mapping

from .. import arguments as args
from ..base.errors import ArgumentError, UnsupportedError
from ..runtime.tensors import TensorView, resolve_stream, view
from . import arg_checks as checks
from .prepared import is_dry
from .scaled_operands import FP4_DTYPES, is_mn_major
from .small_kernels import SmallKernels

# The MN-major value of each layout axis and the argument it describes.
MN = {"a_major": ("m", "a_tensor"), "b_major": ("n", "b_tensor")}


def _mn_major(v: TensorView, a: TensorView, batched: bool) -> bool:
    """Whether A or B (``v``) is MN-major: batched (rows, K[, L]); grouped dense B (N, K, L) or its
    canonical (L, N, K), told apart by A's K as the operand parse does (fusegemm/arguments.py)."""
    if batched:
        return v.ndim in (2, 3) and is_mn_major(v.strides, v.shape, 0, 1)
    if v.ndim != 3 or a.ndim not in (2, 3):
        return False
    kb = a.shape[1]
    canonical = args.b_is_canonical(v.shape, v.strides, kb, v.shape[2] if v.shape[1] == kb else v.shape[0])
    if canonical is None:
        return False
    return is_mn_major(v.strides, v.shape, 1 if canonical else 0, 2 if canonical else 1)


def layout_axes(spec: str, axes: dict[str, Any], a_tensor: Any, b_tensor: Any, *, batched: bool) -> dict[str, str]:
    """``a_major`` / ``b_major`` of the MN-major operands of a call whose other axes are ``axes``
    (K-major operands, and layouts that are neither, are left to the operand parse, which names
    the stride). An MN-major layout the spec does not declare is an ArgumentError with its reason."""
    from ..generator.spec import check_choice, find_spec
    a = view(a_tensor, "a_tensor")
    found: dict[str, str] = {}
    operands = ((("a_major", a_tensor),) if batched else ()) + (("b_major", b_tensor),)
    for axis, x in operands:
        if x is None:
            continue                     # discrete weights: b_major is the caller's argument
        mn, arg = MN[axis]
        v = view(x, arg)
        if not _mn_major(v, a, batched):
            continue
        s = find_spec(spec)              # (only here: a wrapper's K-major call reads no spec)
        offered = s.choice_map.get(axis, ("k",))
        why = (f"{spec} offers {axis} {list(offered)} only" if mn not in offered else
               check_choice({**dict(s.defaults), **axes, **found, axis: mn}, s.constraints))
        if why:
            raise ArgumentError(f"{arg}.stride", tuple(v.strides), f"K-major (stride 1 along K) on every arch: {why}",
                                f"pass a K-major {arg}")
        found[axis] = mn
    return found


def host_copies(kind: str, choices: Mapping[str, Any]) -> dict[str, str]:
    """``{axis: operand}`` of the MN-major operands a block-scaled variant (``choices``) reads
    through a K-major copy (module docstring): MN-major FP8 A (batched), dense B, and discrete B
    (its pointer table, ``b_ptrs``)."""
    if kind not in ("scaled", "batched") or choices.get("ab_dtype") in FP4_DTYPES:
        return {}
    found = {}
    for axis, (mn, arg) in MN.items():
        if choices.get(axis) != mn or (axis == "a_major" and kind != "batched"):
            continue
        found[axis] = "b_ptrs" if axis == "b_major" and choices.get("weight_mode") == "discrete" else arg
    return found


def kernel_choices(kind: str, choices: Mapping[str, Any]) -> dict[str, Any]:
    """The choices of the kernel that runs a variant: its host-copied axes K-major."""
    return {**choices, **{axis: "k" for axis in host_copies(kind, choices)}}


# The K-major copy kernel (templates/include/fusegemm/transpose.cuh): 64 x 64 byte tiles.
_TRANSPOSE = SmallKernels("fusegemm/transpose.cuh", "the K-major copy kernel", "torch copies MN-major operands")
_TRANSPOSE_PARAMS = struct.Struct("<QQQqqiiii")   # TransposeParams, 56 bytes


def _transpose(device: int, stream: int, dst: Any, src: int, src_ptrs: int, ld: int, lb: int, rows: int, cols: int,
               batch: int) -> bool:
    """Launch the copy kernel into ``dst`` (dense (batch, rows, cols) bytes); False where it
    cannot be compiled (nothing launched)."""
    aligned = int(ld % 4 == 0 and lb % 4 == 0)    # (the kernel checks each source address itself)
    grid = (-(-rows // 64), -(-cols // 64), batch)
    raw = _TRANSPOSE_PARAMS.pack(src, dst.data_ptr(), src_ptrs, ld, lb, rows, cols, aligned, 0)
    return _TRANSPOSE.launch(device, "fusegemm_transpose_u8", grid, (256, 1, 1), raw, stream)


def _k_major_copy(t: Any, dims: int, stream: int | None, device: int) -> Any:
    """A K-major copy of MN-major torch tensor ``t``: (rows, K) row-major, or (rows, K, L) with K,
    then rows, then L contiguous (batched operands and kernel-facing dense B; ``dims`` 3);
    canonical B (L, N, K) (``dims`` 0) row-major as it is shaped. On the GPU the transpose kernel
    on ``stream``; torch's copy where it cannot run (CPU tensors, fake tensors under tracing, no
    NVRTC, K not a multiple of 16 bytes, which the operand parse then refuses)."""
    import torch
    if t.dim() == 2:
        (rows, cols), (ld, lb), batch = t.shape, (t.stride(1), 0), 1
    elif dims == 3:
        (rows, cols, batch), (ld, lb) = t.shape, (t.stride(1), t.stride(2))
    else:
        (batch, rows, cols), (ld, lb) = t.shape, (t.stride(2), t.stride(0))
    fast = (stream is not None and t.is_cuda and not is_dry() and t.element_size() == 1 and cols % 16 == 0
            and rows * cols * batch > 0)
    if fast:
        dst = torch.empty((batch, rows, cols), dtype=t.dtype, device=t.device)
        if _transpose(device, stream, dst, t.data_ptr(), 0, ld, lb, rows, cols, batch):
            if t.dim() == 2:
                return dst[0]
            return dst.permute(1, 2, 0) if dims == 3 else dst
    if t.dim() == 3 and dims == 3:
        return t.permute(2, 0, 1).contiguous().permute(1, 2, 0)
    return t.contiguous()


def k_major_operands(op: Any, operands: tuple, kw: dict[str, Any],
                     current_stream: Any) -> tuple[tuple, dict, list]:
    """``operands`` / ``kw`` with each of ``op.host_copies``' operands that is MN-major replaced by
    a K-major copy made on the launch stream (operands in any other layout are left for the
    operand parse to judge; nothing is copied for a K-major operand), and what the caller keeps
    alive until its launch is issued (discrete weights' buffer, which only pointers name)."""
    vals = _operand_values(op, operands, kw)
    a = vals.get("a_tensor")
    if a is None:
        return operands, kw, []
    av = view(a, "a_tensor")
    kb = av.shape[1] if av.ndim >= 2 else 0
    batched = op.kind == "batched"
    ov = view(vals["padded_offsets"], "padded_offsets") if vals.get("padded_offsets") is not None else None
    l = ov.shape[0] if ov is not None and ov.ndim == 1 else 0
    copies: dict[str, Any] = {}
    keep: list = []
    for axis, arg in op.host_copies.items():
        x = vals.get(arg)
        if x is None:
            continue
        if arg == "b_ptrs":
            _discrete_copy(op, x, vals.get("n"), kb, l, current_stream, copies, keep)
            continue
        v = view(x, arg)
        if v.dtype in FP4_DTYPES or v.ndim not in (2, 3):
            continue
        canonical = False                # (rows, K[, L]): batched A / B, kernel-facing dense B
        if not batched:
            canonical = args.b_is_canonical(v.shape, v.strides, kb, l) if v.ndim == 3 and l else None
            if canonical is None:
                continue                 # neither reading fits: the operand parse names the shape
        if not is_mn_major(v.strides, v.shape, 1 if canonical else 0, 2 if canonical else 1):
            continue
        torch, t = _as_torch(x, arg, f"pass a K-major {arg}")
        stream = resolve_stream(current_stream, op.device) if t.is_cuda else None
        with _on_launch_stream(torch, t, stream):
            copies[arg] = _k_major_copy(t, 0 if canonical else 3, stream, op.device)
    return (*_replaced(op, operands, kw, copies), keep)


def _discrete_copy(op: Any, ptrs: Any, n: Any, kb: int, l: int, current_stream: Any, copies: dict,
                   keep: list) -> None:
    """Discrete N-major weights: every expert's (N, K) matrix (N contiguous, dense) copied K-major
    into one (L, N, K) buffer through the pointer table, and ``copies["b_ptrs"]`` a new table on
    the device pointing into it (no host sync). A table the operand parse would refuse (not an
    (L,) int64 CUDA tensor, no int ``n``) is left for it to name."""
    pv = view(ptrs, "b_ptrs")
    if (not pv.is_cuda or pv.ndim != 1 or pv.shape[0] != l or pv.dtype not in ("int64", "uint64")
            or pv.strides[0] != 1 or l == 0 or kb % 16
            or isinstance(n, bool) or not isinstance(n, int) or n < 8 or n % 8 or is_dry()):
        return
    torch, t = _as_torch(ptrs, "b_ptrs", "pass K-major weights (b_major='k')")
    stream = resolve_stream(current_stream, op.device)
    with _on_launch_stream(torch, t, stream):
        dst = torch.empty((l, n, kb), dtype=torch.uint8, device=t.device)
        if not _transpose(op.device, stream, dst, 0, t.data_ptr(), n, 0, n, kb, l):
            raise UnsupportedError("b_ptrs: discrete N-major weights are copied K-major on the device by a kernel "
                                   "that NVRTC could not build here; pass K-major weights (b_major='k')")
        copies["b_ptrs"] = torch.arange(l, dtype=torch.int64, device=t.device) * (n * kb) + dst.data_ptr()
    keep.append(dst)


E8M0_NAMES = ("float8_e8m0fnu", "uint8")   # E8M0 scale bytes as a tensor's dtype


def e8m0_scale_operands(op: Any, operands: tuple, kw: dict[str, Any], current_stream: Any) -> tuple[tuple, dict]:
    """``operands`` / ``kw`` of a blockwise op (``op.e8m0_scales``: FP32-scale kernel) with E8M0
    scale tensors (DeepSeek-V3.1's UE8M0: ``float8_e8m0fnu`` or ``uint8`` bytes, SFA ``(M, ceil(K /
    128))`` in any layout, SFB ``(L, ceil(N/128), ceil(K/128))``) replaced by the float32 tensors
    they encode, exactly, in the kernel's layouts, converted on the launch stream; FP32 scales and
    anything the operand parse should name are left as they are."""
    from ..formats.blockwise import blockwise_sfa_layout, e8m0_to_float32
    vals = _operand_values(op, operands, kw)
    done: dict[str, Any] = {}
    for arg in ("sfa_tensor", "sfb_tensor"):
        x = vals.get(arg)
        if x is None or str(getattr(x, "dtype", "")).endswith("float32"):
            continue                     # (the usual case, decided without a view)
        v = view(x, arg)
        if v.dtype not in E8M0_NAMES or v.ndim not in (2, 3):
            continue
        torch, t = _as_torch(x, arg, "pass float32 scales")
        with _on_launch_stream(torch, t, resolve_stream(current_stream, op.device) if t.is_cuda else None):
            f = e8m0_to_float32(t)
            # (the K-grouped class's SFB is per row too: the layout of SFA)
            rows = f.dim() == 2 and (arg == "sfa_tensor" or op.kind == "kscaled")
            done[arg] = blockwise_sfa_layout(f) if rows else f.contiguous()
    return _replaced(op, operands, kw, done)


def mx_scale_operands(op: Any, operands: tuple, kw: dict[str, Any], current_stream: Any) -> tuple[tuple, dict]:
    """``operands`` / ``kw`` of a blockwise op with E8M0 scales on a kernel that runs them as MX
    scales (``op.blockwise_mx``: sm_100a), the scale tensors expanded into MX scale atoms on the
    launch stream (``fusegemm.formats.torch_blockwise.mx_scales_of_blockwise``, exact). Each scale tensor
    is checked first: E8M0 bytes of the recipe's shapes, dense weights."""
    from ..formats.torch_blockwise import mx_scales_of_blockwise
    vals = _operand_values(op, operands, kw)
    if op.kind == "kscaled":
        return _replaced(op, operands, kw, _mx_wgrad_scales(op, vals, current_stream))
    if vals.get("sfb_tensor") is None or vals.get("b_tensor") is None:
        raise ArgumentError("sfb_tensor", None, "dense weights' E8M0 scales (L, ceil(N/128), ceil(K/128)): the "
                            f"{op.arch} kernel runs the recipe's E8M0 scales as MX scales, expanded per call, "
                            "which a pointer table (b_ptrs / sfb_ptrs) hides")
    a, b = view(vals["a_tensor"], "a_tensor"), view(vals["b_tensor"], "b_tensor")
    if a.ndim != 2 or b.ndim != 3:
        raise ArgumentError("a_tensor / b_tensor", f"{a.ndim} and {b.ndim} dimensions", "(M, K) and (L, N, K)")
    (m, k), (l, n) = a.shape, b.shape[:2]
    kb = -(-k // 128)
    for arg, want in (("sfa_tensor", (m, kb)), ("sfb_tensor", (l, -(-n // 128), kb))):
        _e8m0_scales(vals, arg, want, f"{want} (the blockwise recipe's scales for A {tuple(a.shape)} and B "
                                      f"{tuple(b.shape)})")
    why = f"{op.arch} has no other path for the recipe's E8M0 scales"
    torch, sfa = _as_torch(vals["sfa_tensor"], "sfa_tensor", why)
    _, sfb = _as_torch(vals["sfb_tensor"], "sfb_tensor", why)
    with _on_launch_stream(torch, sfa, resolve_stream(current_stream, op.device) if sfa.is_cuda else None):
        done = dict(zip(("sfa_tensor", "sfb_tensor"), mx_scales_of_blockwise(sfa, sfb, n=n, k=k)))
    return _replaced(op, operands, kw, done)


def _e8m0_scales(vals: Mapping[str, Any], arg: str, want: tuple[int, ...], what: str) -> None:
    """Scale operand ``arg`` is E8M0 bytes of shape ``want`` (``what``: that shape, explained)."""
    v = view(vals[arg], arg)
    if v.dtype not in E8M0_NAMES:
        raise ArgumentError(f"{arg}.dtype", v.dtype, f"E8M0 bytes ({' or '.join(E8M0_NAMES)}): the op was built "
                            "with sf_dtype float8_e8m0fnu (fusegemm.formats.e8m0_bytes converts power-of-two "
                            "float32 scales)")
    if tuple(v.shape) != want:
        raise ArgumentError(f"{arg}.shape", tuple(v.shape), what)


def _mx_wgrad_scales(op: Any, vals: Mapping[str, Any], current_stream: Any) -> dict[str, Any]:
    """The FP8 weight gradient's E8M0 1x128 scales (sfa (M, T/128) of A = dY^T (M, T), sfb (N, T/128)
    of B = X^T (N, T)) expanded into MX atoms over (M, T/32) and (N, T/32) on the launch stream
    (``torch_blockwise.mx_scales_of_1x128``, exact)."""
    from ..formats.torch_blockwise import mx_scales_of_1x128
    done: dict[str, Any] = {}
    for arg, of in (("sfa_tensor", "a_tensor"), ("sfb_tensor", "b_tensor")):
        x = view(vals[of], of)
        if x.ndim != 2:
            raise ArgumentError(f"{of}.shape", tuple(x.shape), "2-D (rows, T), tokens contiguous")
        want = (x.shape[0], -(-x.shape[1] // 128))
        _e8m0_scales(vals, arg, want, f"{want}: one scale per row of {of} and 128 tokens")
        torch, t = _as_torch(vals[arg], arg, f"{op.arch} has no other path for the recipe's E8M0 scales")
        with _on_launch_stream(torch, t, resolve_stream(current_stream, op.device) if t.is_cuda else None):
            done[arg] = mx_scales_of_1x128(t, x.shape[1])
    return done


def host_operands(op: Any, operands: tuple, kw: dict[str, Any], current_stream: Any) -> tuple[tuple, dict, list]:
    """What an op's call passes to the kernel's operand parse: MN-major operands copied K-major
    (``k_major_operands``), E8M0 blockwise scales converted to float32 (``e8m0_scale_operands``) or
    expanded into MX atoms (``mx_scale_operands``); and what the caller keeps alive until its
    launch is issued."""
    keep: list = []
    if op.host_copies:
        operands, kw, keep = k_major_operands(op, operands, kw, current_stream)
    if op.e8m0_scales:
        operands, kw = e8m0_scale_operands(op, operands, kw, current_stream)
    if op.blockwise_mx:
        operands, kw = mx_scale_operands(op, operands, kw, current_stream)
    return operands, kw, keep


def _on_launch_stream(torch: Any, t: Any, stream: int | None) -> Any:
    """A context in which torch's work on ``t`` runs on the launch stream ``stream`` (resolved;
    None off the GPU), its allocations in that stream's pool, so that the allocator reuses them
    only after the launch there."""
    if stream is None or not t.is_cuda or is_dry():
        return contextlib.nullcontext()
    if stream == torch.cuda.current_stream(t.device).cuda_stream:
        return contextlib.nullcontext()
    return torch.cuda.stream(torch.cuda.ExternalStream(stream, device=t.device))


def _operand_values(op: Any, operands: tuple, kw: dict[str, Any]) -> dict[str, Any]:
    """A call's operands by name (positional ones named by the op's class)."""
    vals = dict(zip(op._operand_names(), operands))
    vals.update(kw)
    return vals


def _replaced(op: Any, operands: tuple, kw: dict[str, Any], done: Mapping[str, Any]) -> tuple[tuple, dict]:
    """``operands`` / ``kw`` with the operands named in ``done`` replaced (the same objects when
    ``done`` is empty)."""
    if not done:
        return operands, kw
    names = op._operand_names()
    return tuple(done.get(n, x) for n, x in zip(names, operands)), {k: done.get(k, x) for k, x in kw.items()}


def _as_torch(x: Any, arg: str, remedy: str) -> tuple[Any, Any]:
    """(torch, ``x`` as a torch tensor: itself, or through DLPack)."""
    torch = _torch_for(x, arg, remedy)
    return torch, (x if isinstance(x, torch.Tensor) else torch.from_dlpack(x))


def _torch_for(x: Any, arg: str, remedy: str) -> Any:
    try:
        import torch
    except ImportError:
        raise UnsupportedError(f"{arg}: the op prepares it with torch before the launch (a K-major copy or a scale "
                               f"conversion), and torch is not installed; {remedy}") from None
    return torch


def check_layouts(op: Any) -> None:
    """UnsupportedError when ``op``'s variant has an MN-major operand (valid for the op: its spec
    declared it) that no copy serves (``host_copies``: discrete N-major weights) and its arch's
    kernel does not implement (the registry's limit, naming the arch and why) or that fusegemm
    cannot launch (no MN-major tensor maps on the host)."""
    from ..generator import registry
    v = op.variant
    row = registry.lookup(op.spec.kernel, op.arch)
    if row is None:
        return                           # no kernel at all: check_support says so
    copied = getattr(op, "host_copies", {})
    for axis, (mn, arg) in MN.items():
        if getattr(v, axis) != mn or axis in copied:
            continue
        if v.weight_mode == "discrete" and axis == "b_major":
            arg = "b_major"              # discrete weights: the argument that chose it
        lim = next((lim for lim in row.limits if lim.axis == axis and mn not in lim.values and lim.applies(v.choices)), None)
        if lim is not None:
            raise UnsupportedError(f"{arg}: MN-major {v.ab_dtype} ({axis}={mn!r}) is valid for {op.spec.name} but "
                                   f"not implemented on {op.arch}: {lim.because}; allowed on {op.arch}: "
                                   f"{axis}={lim.values[0]!r} (K-major)", axis=axis)
        raise UnsupportedError(f"{arg}: MN-major {v.ab_dtype} ({axis}={mn!r}) is valid for {op.spec.name} and the "
                               f"{op.arch} kernel reads it, but fusegemm's host launch path encodes K-major tensor "
                               f"maps only; allowed: K-major ({axis}='k')", axis=axis)


class DiscreteWeights:
    """What a class built for discrete weights fixed: N and the expert count (seed 002's
    ``num_experts=``, ``b_shape=(N, K)``; each call passes ``b_ptrs`` / ``sfb_ptrs``)."""

    def __init__(self, n: int, experts: int) -> None:
        self.n, self.experts = n, experts

    def n_for(self, n: Any, padded_offsets: Any) -> int:
        """N of an ``execute`` call (``n`` None or the op's), its expert count checked."""
        if n is not None and n != self.n:
            raise ArgumentError("n", repr(n), f"None or {self.n} (b_shape[0] of this op)")
        if padded_offsets is not None:
            got = tuple(view(padded_offsets, "padded_offsets").shape)
            if got[:1] != (self.experts,):
                raise ArgumentError("padded_offsets.shape", got, f"({self.experts},): num_experts of this op")
        return self.n


def discrete_weights(sample_a: Any, sample_b: Any, sample_sfb: Any, sample_padded_offsets: Any,
                     num_experts: Any, b_shape: Any) -> DiscreteWeights | None:
    """None for dense weights (``sample_b``); for discrete ones (``num_experts``, ``b_shape``), N
    and L checked against the samples. ``b_shape`` is ``(N, K)`` with K in elements or, for packed
    FP4, the bytes of a row (a ``float4_e2m1fn_x2`` / uint8 tensor's ``(N, K // 2)``)."""
    if sample_b is not None:
        for name, value in (("num_experts", num_experts), ("b_shape", b_shape)):
            if value is not None:
                raise ArgumentError(name, repr(value), "None with sample_b (dense weights); discrete weights "
                                    "pass num_experts= and b_shape=(N, K) instead of sample_b")
        return None
    if num_experts is None or b_shape is None:
        missing = "num_experts" if num_experts is None else "b_shape"
        raise ArgumentError(missing, None, "an int (L)" if missing == "num_experts" else "(N, K)",
                            "without sample_b (dense weights), discrete weights need num_experts= and b_shape=(N, K)")
    if isinstance(num_experts, bool) or not isinstance(num_experts, int) or not 1 <= num_experts <= args.MAX_EXPERTS:
        raise ArgumentError("num_experts", repr(num_experts), f"an int from 1 to {args.MAX_EXPERTS}")
    n, k = checks.pair_arg(b_shape, "b_shape")
    if n < 8 or n % 8:
        raise ArgumentError("b_shape[0] (N)", n, "a multiple of 8, at least 8 (16-byte output rows)")
    if sample_sfb is not None:
        raise ArgumentError("sample_sfb", "a tensor", "None with discrete weights (sfb_ptrs at execute hold "
                            "each expert's scales)")
    a = view(sample_a, "sample_a")
    if a.ndim in (2, 3):
        kb = a.shape[1]
        ks = (2 * kb, kb) if a.dtype in FP4_DTYPES else (kb,)
        if k not in ks:
            allowed = f"(N, {ks[0]})" + (f" or (N, {ks[1]}) (packed FP4 bytes)" if len(ks) > 1 else "")
            raise ArgumentError("b_shape", repr(tuple(b_shape)), f"{allowed}: K of sample_a")
    if sample_padded_offsets is not None:
        got = tuple(view(sample_padded_offsets, "sample_padded_offsets").shape)
        if got[:1] != (num_experts,):
            raise ArgumentError("sample_padded_offsets.shape", got, f"({num_experts},): num_experts")
    return DiscreteWeights(n, num_experts)
