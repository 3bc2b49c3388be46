"""``fusegemm selftest``: run every op family on the GPU that is present, against the numpy
references, and report a pass/fail table.

The families and their status come from the registry (generator/registry.py): a family with
no kernel on the device's arch, or with a kernel but no selftest cases (no public op to run them
through yet), is listed as ``not available`` with the reason; it is not a failure. No GPU, or a
GPU fusegemm has no kernels for, is reported and is not a failure either (exit 0). The same cases
are the first-run verification of a family on an arch the project has not executed on
(fusegemm/verify.py).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from . import presets  # noqa: F401  (generates the seed wrappers; _run_scaled calls them by family name)
from .base.archs import arch_of_capability, supported_capabilities
from .base.errors import UnsupportedError
from .generator import registry

# dtype -> relative tolerance: one unit in the last place of the output. The reference is
# rounded to the output dtype too, so a kernel whose FP32 sum (accumulated in another order)
# lands across a rounding boundary differs by one ulp (at most 2**-7 relative for bf16). The
# absolute term bounds the FP32 accumulation-order difference: 2**-16 * sum |alpha a b|.
REL = {"bfloat16": 2.0**-7, "float16": 2.0**-10, "float32": 2.0**-22}


class CaseNotAvailable(Exception):
    """A case the arch's kernel does not implement (a tile its registry row limits): listed as
    ``not available`` with the reason, not run, not a failure."""


@dataclass(frozen=True)
class Row:
    family: str
    case: str
    status: str          # pass | FAIL | not available
    max_error: float | None = None
    seconds: float = 0.0
    detail: str = ""


def detect_arch() -> tuple[str | None, str]:
    """(arch, description) of CUDA device 0, or (None, why nothing can run)."""
    try:
        from cuda.bindings import driver
    except ImportError:
        return None, "cuda-bindings is not installed"
    try:
        err, = driver.cuInit(0)
    except Exception as exc:  # cuda-bindings raises when libcuda.so is absent (no driver)
        return None, f"no CUDA driver: {exc}"
    if int(err) != 0:
        return None, f"no usable CUDA driver ({err.name})"
    err, count = driver.cuDeviceGetCount()
    if int(err) != 0 or count == 0:
        return None, "no CUDA GPU present"
    _, dev = driver.cuDeviceGet(0)
    attr = driver.CUdevice_attribute
    _, major = driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev)
    _, minor = driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)
    _, raw = driver.cuDeviceGetName(64, dev)
    name = raw.split(b"\0", 1)[0].decode()
    arch = arch_of_capability(major, minor)
    if arch is None:
        return None, (f"{name} (compute capability {major}.{minor}) is not supported: fusegemm "
                      f"kernels target {supported_capabilities()}")
    return arch.name, f"{name} (compute capability {major}.{minor}, {arch.name})"


def _ordinal(device: str) -> int:
    """The CUDA ordinal of a case's device string ("cuda:1" -> 1; 0 otherwise)."""
    return int(device.split(":")[1]) if device.startswith("cuda:") else 0


def _padded(tokens: list[int]) -> list[int]:
    """Each expert's rows, its tokens padded to the 256-row alignment."""
    return [int(-(-t // 256) * 256) for t in tokens]


def _valid_rows(tokens: list[int], sizes: list[int]) -> np.ndarray:
    """(rows,) bool: each expert's first ``tokens`` rows of its ``sizes`` (the rest is padding)."""
    mask = np.zeros(sum(sizes), bool)
    start = 0
    for tok, size in zip(tokens, sizes):
        mask[start:start + tok] = True
        start += size
    return mask


def _gathered(rng: np.random.Generator, source: np.ndarray, valid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A gathered operand's index and the rows it reads: each valid row reads a random row of the
    token-major ``source`` (rows read twice, as top-k routing does), the first valid row an index
    past the source and the padding rows -1 (both read zeros). Returns (int32 index, gathered rows)."""
    from .reference._operands import rows_through
    index = np.where(valid, rng.integers(0, source.shape[0], valid.shape[0]), -1).astype(np.int32)
    if valid.any():
        index[np.argmax(valid)] = source.shape[0] + 3
    return index, rows_through(source, index)


def _scatter_index(rng: np.random.Generator, valid: np.ndarray) -> tuple[np.ndarray, int]:
    """A scattered output's index and rows: the valid rows sent to distinct rows of (d_rows, N)
    outputs in random order (d_rows: the valid rows plus 24 rows no index names), the padding -1
    and the first valid row past d_rows (both store nothing). Returns (int32 index, d_rows)."""
    tokens = int(valid.sum())
    d_rows = tokens + 24
    index = np.full(valid.shape[0], -1, np.int32)
    index[valid] = rng.permutation(d_rows)[:tokens]
    if valid.any():
        index[np.argmax(valid)] = d_rows + 5
    return index, d_rows


def _placed(rows: np.ndarray, index: np.ndarray, d_rows: int) -> np.ndarray:
    """``rows`` at their ``index`` rows of zero (d_rows, ...) outputs (entries outside: dropped)."""
    out = np.zeros((d_rows,) + rows.shape[1:], rows.dtype)
    ok = (index >= 0) & (index < d_rows)
    out[index[ok]] = rows[ok]
    return out


def _compare(got: Any, ref: np.ndarray, scale: np.ndarray, dtype: str) -> tuple[float, bool]:
    g = got.float().cpu().numpy().reshape(ref.shape).astype(np.float64)
    r = ref.astype(np.float64)
    err = np.abs(g - r)
    tol = REL[dtype] * np.abs(r) + 2.0**-16 * scale + 1e-30
    return (float(err.max()) if err.size else 0.0), bool(np.all(err <= tol) and np.isfinite(g).all())


def _grouped_gemm_cases() -> list[tuple[str, dict[str, Any]]]:
    return [
        ("dense, ragged + empty experts", dict(tokens=[300, 0, 1000, 17, 0, 512], n=256, k=200)),
        ("dense, dynamic scheduler", dict(tokens=[256, 700], n=384, k=128, use_dynamic_sched=True)),
        ("dense, L=1, fp32 D", dict(tokens=[1024], n=512, k=256, d_dtype="float32")),
        ("bias + generate_c, fp32 C", dict(tokens=[200, 300, 0], n=256, k=192, bias=True,
                                          generate_c=True, c_dtype="float32")),
        ("discrete weights", dict(tokens=[128, 0, 640], n=256, k=256, discrete=True)),
        ("many experts (L=64)", dict(tokens=[64] * 64, n=128, k=64, d_dtype="float16")),
        # The MoE layer's data gradients read (L, K, N) weights in place: the grouped kernel with
        # N-major B (b_major n, through the spec-driven op: the seed wrapper is K-major only).
        ("N-major weights (b_major n)", dict(tokens=[300, 0, 512], n=192, k=136, b_major="n")),
        ("N-major weights, tile 128x256 (1-CTA on sm_100a)",
         dict(tokens=[256, 512], n=320, k=64, b_major="n", axes={"tile_m": 128, "cluster_m": 1})),
    ]


def _spec_cases(family: str) -> list[tuple[str, dict[str, Any]]]:
    """One case per packaged spec of ``family`` (an M-grouped kernel, BF16 or block-scaled) that is
    not the seed's own (a seed spec is named after its kernel family; the seeds have cases of their own):
    the spec-authored epilogues (SwiGLU, GLU, dGLU, dsReLU, block-scaled GLU, ...), in their
    variant with float outputs where the spec offers them, run through fusegemm.Op and checked
    against the numpy interpreter."""
    from .generator.spec import list_specs, load_spec
    from .ops.engine import kernel_class
    cases = []
    for path in list_specs():
        spec = load_spec(path)
        if spec.kernel == family and kernel_class(family) in ("grouped", "scaled") and spec.name != family:
            cases.append((f"spec {spec.name}: against its interpreter", dict(spec=spec.name, tokens=[256, 0, 300],
                                                                            n=256, k=64)))
    return cases


def _run_spec(case: dict[str, Any], device: str = "cuda:0") -> tuple[float, bool, str]:
    """A spec's variant (float outputs where offered; ``case["axes"]`` pinned: a configuration
    class's) on integer-valued operands, against ``Op.reference``: BF16, or FP8 (the variant's
    element format) with power-of-two scales, MX (E8M0 per 32) or the blockwise recipe (FP32 per
    128), so that every FP32 sum is exact and the kernel and the interpreter differ only by the
    functions' ulp bounds and the outputs' rounding. Dense or discrete weights, K- or N-major B,
    gathered A (a_index into a token-major source, _gathered), scattered outputs (d_index,
    _scatter_index: the reference's rows placed by it), as the variant says; ``case["row_ends"]``:
    the tokens' row ends passed (A's padding rows zero, as an MoE layer's; the token rows
    compared)."""
    import ml_dtypes
    import torch

    from . import output_compare
    from .generator.spec import find_spec
    from .ops.engine import Op
    spec = find_spec(case["spec"])
    op = _with_outputs(Op, spec, _ordinal(device), case.get("axes", {}))
    v = op.variant
    if op.kind == "scaled" and v.ab_dtype not in ("float8_e4m3fn", "float8_e5m2"):
        raise CaseNotAvailable(f"{v.ab_dtype} operands: run through the seed's cases")
    rng = np.random.default_rng(7)
    sizes = _padded(case["tokens"])
    m, n, k, l = sum(sizes), case["n"], case["k"], len(sizes)
    bf16 = ml_dtypes.bfloat16
    ab = getattr(ml_dtypes, v.ab_dtype)
    a = rng.integers(-2, 3, (m, k)).astype(ab)
    b = rng.integers(-2, 3, (l, n, k)).astype(ab)
    off = np.cumsum(sizes).astype(np.int32)
    sfa = sfb = None
    if op.kind == "scaled":   # power-of-two scales in the kernels' physical layouts
        if v.sf_vec_size == 128:
            from .formats import blockwise_sfa_layout
            sfa = blockwise_sfa_layout(np.exp2(rng.integers(-1, 2, (m, -(-k // 128)))).astype(np.float32))
            sfb = np.exp2(rng.integers(-1, 2, (l, -(-n // 128), -(-k // 128)))).astype(np.float32)
        else:
            from .formats import pack_sf
            e8m0 = ml_dtypes.float8_e8m0fnu
            sfa = pack_sf(np.exp2(rng.integers(-1, 2, (m, k // 32))).astype(np.float32).astype(e8m0))
            sfb = pack_sf(np.exp2(rng.integers(-1, 2, (l, n, k // 32))).astype(np.float32).astype(e8m0),
                          batch_first=True)
    kw: dict[str, Any] = {}
    source = None
    valid_rows = _valid_rows(case["tokens"], sizes)
    sfa_source = None
    if v.a_gather:   # A's rows read through a_index; the reference gets them gathered
        source = rng.integers(-2, 3, (m // 2 + 5, k)).astype(ab)
        a_index, a = _gathered(rng, source, valid_rows)
        kw["a_index"] = output_compare.to_device(a_index, device)
        if op.kind == "scaled":   # and the scales of those rows: 1x128 (blockwise), or MX atoms of the source's
            from .reference._operands import rows_through
            if v.sf_vec_size == 128:
                from .formats import blockwise_sfa_layout
                raw = np.exp2(rng.integers(-1, 2, (source.shape[0], -(-k // 128)))).astype(np.float32)
                sfa, sfa_source = blockwise_sfa_layout(rows_through(raw, a_index)), blockwise_sfa_layout(raw)
            else:   # (rows outside the source: zero bytes, as the kernel's zero-filled copies)
                from .formats import pack_sf
                raw = np.exp2(rng.integers(-1, 2, (source.shape[0], k // 32))).astype(np.float32).astype(
                    ml_dtypes.float8_e8m0fnu)
                sfa = pack_sf(rows_through(raw.view(np.uint8), a_index).view(ml_dtypes.float8_e8m0fnu))
                sfa_source = pack_sf(raw)
    if case.get("row_ends"):   # the padding's tiles may be skipped: their rows are not compared
        a[~valid_rows] = 0
        ends = np.cumsum(sizes) - np.asarray(sizes) + np.asarray(case["tokens"])
        kw["row_ends"] = output_compare.to_device(ends.astype(np.int32), device)
    d_index = None
    if v.d_scatter:   # C and D rows stored through d_index into (d_rows, N) outputs
        d_index, d_rows = _scatter_index(rng, valid_rows)
        kw.update(d_index=output_compare.to_device(d_index, device), d_rows=d_rows)
    host_ops = [a, sfa, off, b, sfb] if op.kind == "scaled" else [a, off, b]
    dev_ops: list[Any] = [output_compare.to_device(x, device) for x in host_ops]
    if source is not None:
        dev_ops[0] = output_compare.to_device(source, device)
    if sfa_source is not None:
        dev_ops[1] = output_compare.to_device(sfa_source, device)
    keep: list[Any] = []
    if v.weight_mode == "discrete":   # per-expert buffers behind device pointer tables: (N, K), or (K, N) N-major
        lists = {"b_list": [np.ascontiguousarray(b[e].T if v.b_major == "n" else b[e]) for e in range(l)]}
        if op.kind == "scaled":
            lists["sfb_list"] = [np.ascontiguousarray(sfb[e]) for e in range(l)]
        lists_dev, keep = output_compare.device_args(lists, device)
        kw.update(lists_dev, n=n)
        dev_ops = dev_ops[:3 if op.kind == "scaled" else 2]
    elif v.b_major == "n":            # (L, K, N) storage read as its (L, N, K) view
        at = 3 if op.kind == "scaled" else 2
        dev_ops[at] = output_compare.to_device(np.ascontiguousarray(b.transpose(0, 2, 1)), device).transpose(1, 2)
    w = op.widths(n)[0]
    host: dict[str, Any] = {}
    dev: dict[str, Any] = {}
    for inp in op.epilogue.inputs:
        dt = bf16 if inp.dtype == "bfloat16" else np.dtype(inp.dtype)
        if inp.per == "scalar":
            host[inp.name] = np.ones(1, np.float32)
        elif inp.per in ("expert", "row"):
            host[inp.name] = rng.uniform(0.5, 1.5, l if inp.per == "expert" else m).astype(dt)
        elif inp.per == "column":
            rows = rng.integers(-2, 3, (l, n)).astype(dt)            # (L, N): the (N, L) view below
            host[inp.name] = rows.T
            dev[inp.name] = output_compare.to_device(rows, device).t()
            continue
        else:
            host[inp.name] = (0.5 * rng.standard_normal((m, 2 * w if inp.paired else w))).astype(dt)
        dev[inp.name] = output_compare.to_device(host[inp.name], device)
    out = op(*dev_ops, **kw, inputs=dev)
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)
    del keep
    ref = op.reference(*host_ops, inputs=host)
    valid = int(off[-1])
    rows = set(op.epilogue.row_buffers())
    got = {}
    want = {}
    for name, t in out.items():
        g = t.float() if t.dtype in (torch.bfloat16, torch.float16) else t
        g, r = g.cpu().numpy(), np.asarray(ref[name])
        if d_index is not None and name in rows:   # every row output of an element-wise rule is placed
            got[name], want[name] = g, _placed(r[:d_index.shape[0]], d_index, kw["d_rows"])
        elif case.get("row_ends") and name in rows:
            got[name], want[name] = g[:valid][valid_rows[:valid]], r[:valid][valid_rows[:valid]]
        else:
            got[name], want[name] = (g[:valid], r[:valid]) if name in rows else (g, r)
    # Functions are within their ulp bounds of the interpreter's: an FP8 output may round to the
    # neighbouring code (compare_outputs' fp8_steps).
    err, problem = output_compare.compare_outputs(want, got, exact=False, rtol=2.0**-6, fp8_steps=1)
    return err, problem is None, problem or f"{len(got)} outputs match the interpreter"


# Output formats a spec case prefers, most precise first (the spec's constraints may allow only
# some with the case's operands: FP8 dSwiGLU writes an FP8 D).
_OUTPUTS = ("float32", "bfloat16", "float16", "float8_e4m3fn")


def _with_outputs(op_class: Any, spec: Any, device: int, pin: dict[str, Any]) -> Any:
    """``op_class(spec, **pin)`` on ``device`` with the most precise C and D the spec's constraints
    and the arch's kernel allow; CaseNotAvailable with the last reason when none is."""
    ds = [d for d in _OUTPUTS if d in spec.choice_map.get("d_dtype", ())] or [None]
    cs = [c for c in _OUTPUTS if c in spec.choice_map.get("c_dtype", ())] or [None]
    why = "no output format"
    for d in ds:
        for c in cs:
            outs = {k: x for k, x in (("d_dtype", d), ("c_dtype", c)) if x is not None}
            try:
                op = op_class(spec, device=device, **{**outs, **pin})
                op.check_support()
                return op
            except UnsupportedError as exc:
                why = str(exc)
    raise CaseNotAvailable(why)


def _magnitude(pb: Any) -> np.ndarray:
    """Per-element bound of the accumulation: |alpha_e| |A_e| |B_e|^T + |prob bias_e|."""
    f = np.float64
    a = np.abs(np.asarray(pb.a_tensor, dtype=f).reshape(pb.a_tensor.shape[0], pb.k))
    prob = np.abs(np.asarray(pb.prob_tensor, dtype=f).reshape(-1))
    off = np.concatenate([[0], np.asarray(pb.padded_offsets, dtype=np.int64)])
    out = np.zeros((a.shape[0], pb.n))
    for e in range(pb.num_experts):
        if pb.b_list is not None:
            b = pb.b_list[e]
        else:  # canonical B is (L, N, K); the kernel-facing view is (N, K, L)
            b = pb.b_tensor[e] if pb.layout == "canonical" else pb.b_tensor[:, :, e]
        rows = slice(off[e], off[e + 1])
        out[rows] = abs(float(pb.alpha_tensor[e])) * (a[rows] @ np.abs(np.asarray(b, dtype=f)).T)
        if pb.bias_tensor is not None:
            out[rows] += prob[rows, None] * np.abs(np.asarray(pb.bias_tensor, dtype=f)[:, e])[None, :]
    return out


def _n_major_call(dev: dict[str, Any], b_lnk: np.ndarray, d_dtype: str, device: str,
                  axes: dict[str, Any]) -> dict[str, Any]:
    """The grouped GEMM on N-major weights: (L, K, N) storage of ``b_lnk`` (L, N, K), passed as
    its (L, N, K) view with ``b_major="n"`` to the spec-driven op of spec grouped_gemm (the same
    kernel family and epilogue: D = prob * alpha * A @ B^T)."""
    from . import output_compare
    from .ops import epilogue_gemm
    w = output_compare.to_device(np.ascontiguousarray(b_lnk.transpose(0, 2, 1)), device)   # (L, K, N)
    index = _ordinal(device)
    op = epilogue_gemm.EpilogueGemm("grouped_gemm", device=index, b_major="n", d_dtype=d_dtype, **axes)
    res = op(dev["a_tensor"], dev["padded_offsets"], w.transpose(1, 2),
             inputs={"alpha": dev["alpha_tensor"], "prob": dev["prob_tensor"]})
    return {"d_tensor": res["d"], "c_tensor": None}


def _run_grouped_gemm(case: dict[str, Any], device: str = "cuda:0") -> tuple[float, bool, str]:
    import torch

    from . import output_compare, problems, reference
    from . import presets as op
    opts = dict(case)
    call_opts = {k: opts.pop(k) for k in ("use_dynamic_sched", "generate_c", "c_dtype", "d_dtype",
                                         "mma_tiler_mn") if k in opts}
    tokens = opts.pop("tokens")
    b_major = opts.pop("b_major", "k")
    axes = opts.pop("axes", {})       # variant choices of the N-major (spec-driven) call
    pb = problems.make_grouped_problem("grouped_gemm", num_experts=len(tokens), tokens=tokens,
                                       seed=7, values="realistic", layout="canonical", **opts)
    kwargs = pb.kwargs(**call_opts)
    ref = reference.grouped_gemm(**kwargs)
    dev, keep = output_compare.device_args(kwargs, device)   # b_list -> b_ptrs (the GPU op takes pointers)
    if "bias_tensor" in dev:   # the seed's bias is (N, L) with N contiguous
        dev["bias_tensor"] = output_compare.to_device(np.ascontiguousarray(kwargs["bias_tensor"].T), device).t()
    if b_major == "n":
        out = _n_major_call(dev, np.asarray(kwargs["b_tensor"]), call_opts.get("d_dtype", "bfloat16"), device,
                            axes)
    else:
        out = op.grouped_gemm(**dev)
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)
    del keep
    scale = _magnitude(pb)
    worst, ok = 0.0, True
    valid = pb.valid_m
    for key, dtype in (("d_tensor", call_opts.get("d_dtype", "bfloat16")),
                       ("c_tensor", call_opts.get("c_dtype", "bfloat16"))):
        if ref[key] is None:
            continue
        r = np.asarray(ref[key], dtype=np.float64)[:valid]
        e, good = _compare(out[key][:valid], r, scale[:valid], dtype)
        worst, ok = max(worst, e), ok and good
    return worst, ok, f"valid_m={valid}"


# Block-scaled families: MXFP8 problems with integer values (every FP32 sum exact, so outputs and
# quantized bytes must match the reference exactly; dSwiGLU's sigmoid is compared within 1e-5).
_SCALED_CASES: dict[str, list[tuple[str, dict[str, Any]]]] = {
    "grouped_gemm_srelu": [
        ("e4m3, ragged + empty experts, bf16 D + amax", dict(tokens=[300, 0, 512], n=256, k=320)),
        ("e5m2, FP8 D + SFD row/col (discrete col)", dict(tokens=[256, 100], n=256, k=256, ab_dtype="float8_e5m2",
                                                           d_dtype="float8_e4m3fn", call=dict(discrete_col_sfd=True))),
        ("discrete weights, bias", dict(tokens=[256, 0, 200], n=256, k=256, discrete=True, bias=True)),
    ],
    "grouped_gemm_quant": [
        ("FP8 D + SFD, L=1", dict(tokens=[512], n=384, k=256, d_dtype="float8_e4m3fn")),
        ("bf16 D + amax, ragged", dict(tokens=[256, 300, 0, 40], n=256, k=192, d_dtype="bfloat16")),
    ],
    "grouped_gemm_dswiglu": [
        ("FP8 D + SFD + dprob", dict(tokens=[256, 300], n=256, k=256, d_dtype="float8_e4m3fn")),
    ],
    "gemm_amax": [
        ("fp32 C, 3 batches, M tail", dict(m=200, n=264, k=320, batch=3)),
        ("bf16 C, M-major", dict(m=256, n=128, k=128, batch=2, c_dtype="bfloat16", call=dict(c_major="m"))),
    ],
}


def _run_scaled(family: str, case: dict[str, Any], device: str = "cuda:0") -> tuple[float, bool, str]:
    import torch

    from . import output_compare, problems, reference
    from .ops import scaled_seeds    # the public wrappers (fusegemm.<family>), by family name
    opts = dict(case)
    call = opts.pop("call", {})
    if family == "gemm_amax":
        pb = problems.make_batched_problem(values="integer", seed=7, **opts)
        kwargs = pb.kwargs(**call)
    else:
        tokens = opts.pop("tokens")
        pb = problems.make_grouped_problem(family, num_experts=len(tokens), tokens=tokens, seed=7,
                                           values="integer", **opts)
        kwargs = pb.kwargs(**call)     # the problem's scale format (E8M0 per 32 for FP8 by default)
    ref = getattr(reference, family)(**kwargs)
    dev, keep = output_compare.device_args(kwargs, device)
    out = getattr(scaled_seeds, family)(**dev)
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)
    del keep
    # dSwiGLU's sigmoid is within its ulp bound of the reference's, not exact: an FP8 D value that
    # close to a rounding midpoint rounds to the neighbouring code (seen by the GPU fuzzing).
    dswiglu = family == "grouped_gemm_dswiglu"
    err, problem = output_compare.compare_outputs(ref, out, exact=not dswiglu, rtol=1e-5, fp8_steps=int(dswiglu))
    return err, problem is None, problem or "outputs match the reference"


def _wgrad_cases() -> list[tuple[str, dict[str, Any]]]:
    return [
        ("ragged + empty experts, M tiles of 128", dict(tokens=[256, 0, 768, 256], m=256, n=192)),
        ("fp32 D, tile 128x128, an N tail", dict(tokens=[512, 256], m=128, n=200, d_dtype="float32",
                                                  axes={"tile_n": 128})),
        ("no tokens in the last experts, alpha", dict(tokens=[1024, 0, 0], m=384, n=256, alpha=True)),
        ("tile 64x128 (sm_90a: ping-pong warpgroups)", dict(tokens=[300, 512], m=192, n=136, d_dtype="float32",
                                                            axes={"tile_m": 64, "tile_n": 128})),
        ("M-major D (D_e^T), ragged + empty experts, an N tail", dict(tokens=[256, 0, 768, 300], m=256, n=328,
                                                                      axes={"cd_major": "m"})),
    ]


def _run_wgrad(case: dict[str, Any], device: str = "cuda:0") -> tuple[float, bool, str]:
    """dW_e = alpha_e dY_e^T X_e with seeded BF16 operands (token rows padded to 256 with zeros,
    as the MoE layer's are), against the op's float64 reference; the bound is the FP32
    accumulation's, as for the grouped GEMM. Gathered operands (the axes' a_gather / b_gather):
    dY's or X's token rows read through dy_index / x_index from a token-major source (_gathered)."""
    import torch

    from .ops.kgrouped import KGroupedGemm
    rng = np.random.default_rng(7)
    sizes = _padded(case["tokens"])
    t = sum(sizes)
    m, n = case["m"], case["n"]
    dy = np.zeros((t, m), np.float32)
    x = np.zeros((t, n), np.float32)
    start = 0
    for tok, size in zip(case["tokens"], sizes):
        dy[start:start + tok] = rng.standard_normal((tok, m))
        x[start:start + tok] = rng.standard_normal((tok, n))
        start += size
    axes = case.get("axes", {})
    valid = _valid_rows(case["tokens"], sizes)
    sources: dict[str, np.ndarray] = {}
    indices: dict[str, Any] = {}
    if axes.get("a_gather"):
        sources["dy"] = rng.standard_normal((t // 2 + 5, m)).astype(np.float32)
        idx, dy = _gathered(rng, sources["dy"], valid)
        indices["dy_index"] = torch.from_numpy(idx)
    if axes.get("b_gather"):
        sources["x"] = rng.standard_normal((t // 2 + 5, n)).astype(np.float32)
        idx, x = _gathered(rng, sources["x"], valid)
        indices["x_index"] = torch.from_numpy(idx)
    dy_t = torch.from_numpy(dy).to(torch.bfloat16)
    x_t = torch.from_numpy(x).to(torch.bfloat16)
    # What the op reads: the token-major sources of gathered operands, else the rows themselves.
    dy_in = torch.from_numpy(sources["dy"]).to(torch.bfloat16) if "dy" in sources else dy_t
    x_in = torch.from_numpy(sources["x"]).to(torch.bfloat16) if "x" in sources else x_t
    off = torch.tensor(np.cumsum(sizes), dtype=torch.int32)
    inputs = {"alpha": torch.from_numpy(rng.uniform(0.5, 1.5, len(sizes)).astype(np.float32))} if case.get("alpha") else {}
    index = _ordinal(device)
    op = KGroupedGemm("grouped_gemm_wgrad", device=index, d_dtype=case.get("d_dtype", "bfloat16"), **axes)
    try:
        op.check_support()
    except UnsupportedError as exc:   # a tile this arch's kernel does not implement
        raise CaseNotAvailable(str(exc)) from None
    dev = {k: v.to(device) for k, v in inputs.items()}
    out = op(dy_in.to(device), x_in.to(device), off.to(device), inputs=dev,
             **{k: v.to(device) for k, v in indices.items()})
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)
    ref = np.asarray(op.reference(dy_t, x_t, off, inputs=inputs).out_values["d"], dtype=np.float64)
    a64, b64 = np.abs(dy_t.double().numpy()), np.abs(x_t.double().numpy())
    scale = np.zeros_like(ref)
    start = 0
    for e, size in enumerate(sizes):
        alpha = float(inputs["alpha"][e]) if inputs else 1.0
        scale[e * m:(e + 1) * m] = alpha * (a64[start:start + size].T @ b64[start:start + size])
        start += size
    if op.d_major_m:   # (the reference's D is each expert's transpose already)
        from .ops.engine import _blocks_transposed
        scale = _blocks_transposed(scale, len(sizes))
    err, ok = _compare(out["d"], ref, scale, case.get("d_dtype", "bfloat16"))
    return err, ok, f"L={len(sizes)}, T={t}"


def wgrad_fp8_problem(tokens: list[int], m: int, n: int, seed: int, ab: str = "float8_e4m3fn",
                      vec: int = 128) -> tuple[Any, ...]:
    """An exact FP8 weight-gradient problem (the kscaled class): A = dY^T (M, T) and B = X^T (N, T)
    with integers in [-2, 2] in each expert's token columns (padded to 256 with zeros) and
    power-of-two scales per row and ``vec`` tokens (128: FP32 in the blockwise layout; 32: E8M0
    bytes in MX atoms), so every product and sum is exact in any order; host torch tensors (a,
    sfa, b, sfb, padded_offsets, alpha)."""
    import ml_dtypes
    import torch

    from .formats.blockwise import blockwise_sfa_layout
    from .formats.torch_mx import pack_sf
    rng = np.random.default_rng(seed)
    sizes = _padded(tokens)
    t = sum(sizes)
    a = np.zeros((m, t), np.float32)
    b = np.zeros((n, t), np.float32)
    start = 0
    for tok, size in zip(tokens, sizes):
        a[:, start:start + tok] = rng.integers(-2, 3, (m, tok))
        b[:, start:start + tok] = rng.integers(-2, 3, (n, tok))
        start += size
    ea, eb = rng.integers(-2, 3, (m, t // vec)), rng.integers(-2, 3, (n, t // vec))

    def scales(e: np.ndarray) -> Any:
        if vec == 128:
            return blockwise_sfa_layout(torch.from_numpy(np.exp2(e).astype(np.float32)))
        return pack_sf(torch.from_numpy((e + 127).astype(np.uint8)).view(torch.float8_e8m0fnu))

    def fp8(x: np.ndarray) -> Any:
        return torch.from_numpy(x.astype(getattr(ml_dtypes, ab)).view(np.uint8)).view(getattr(torch, ab))
    alpha = torch.from_numpy(np.exp2(rng.integers(-1, 2, len(sizes))).astype(np.float32))
    return (fp8(a), scales(ea), fp8(b), scales(eb), torch.tensor(np.cumsum(sizes), dtype=torch.int32), alpha)


def _wgrad_fp8_cases() -> list[tuple[str, dict[str, Any]]]:
    mx = {"sf_dtype": "float8_e8m0fnu", "sf_vec_size": 32}
    return [
        ("ragged + empty experts, an N tail", dict(tokens=[256, 0, 700, 100], m=256, n=192)),
        ("e5m2, fp32 D, tile 128x128", dict(tokens=[512, 300], m=128, n=200,
                                            axes={"ab_dtype": "float8_e5m2", "d_dtype": "float32", "tile_n": 128})),
        ("no tokens in the last experts", dict(tokens=[1024, 0, 0], m=384, n=256)),
        ("MXFP8, ragged + empty experts", dict(tokens=[256, 0, 700, 100], m=256, n=192, axes=mx)),
        ("MXFP8, e5m2, tile 128x128", dict(tokens=[512, 300], m=128, n=200,
                                           axes={**mx, "ab_dtype": "float8_e5m2", "tile_n": 128})),
    ]


def _run_wgrad_fp8(case: dict[str, Any], device: str = "cuda:0") -> tuple[float, bool, str]:
    """The FP8 weight gradient (blockwise recipe) on an exact problem (wgrad_fp8_problem): D bit for
    bit the op's reference."""
    import torch

    from . import output_compare
    from .formats.blockwise import blockwise_sfa_layout
    from .ops.engine import Op
    axes = dict(case.get("axes", {}))
    vec = axes.get("sf_vec_size", 128)
    a, sfa, b, sfb, off, alpha = wgrad_fp8_problem(case["tokens"], case["m"], case["n"], 11,
                                                   axes.get("ab_dtype", "float8_e4m3fn"), vec)
    op = Op("grouped_gemm_wgrad_fp8", device=_ordinal(device), **axes)
    try:
        op.check_support()
    except UnsupportedError as exc:
        raise CaseNotAvailable(str(exc)) from None
    def on(sf: Any) -> Any:   # (the blockwise layout's pitch made again on the device)
        return blockwise_sfa_layout(sf.to(device)) if vec == 128 else sf.to(device)
    out = op(a.to(device), on(sfa), b.to(device), on(sfb), off.to(device), inputs={"alpha": alpha.to(device)})
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)
    ref = op.reference(a, sfa, b, sfb, off, inputs={"alpha": alpha})
    l, m, n = off.shape[0], case["m"], case["n"]
    err, problem = output_compare.compare_outputs({"d": np.asarray(ref["d"])}, {"d": out["d"].reshape(l * m, n)},
                                                  exact=True)
    return err, problem is None, problem or f"L={l}, T={a.shape[1]}: D exact"


RUNNERS: dict[str, Callable[[], list[tuple[str, dict[str, Any]]]]] = {
    "grouped_gemm": lambda: _grouped_gemm_cases() + _spec_cases("grouped_gemm"),
    "grouped_gemm_wgrad": _wgrad_cases,
    "grouped_gemm_wgrad_fp8": _wgrad_fp8_cases,
    **{fam: (lambda fam=fam: _SCALED_CASES[fam] + _spec_cases(fam)) for fam in _SCALED_CASES},
}
CASE_RUNNERS: dict[str, Callable[..., tuple[float, bool, str]]] = {
    "grouped_gemm": lambda case, device="cuda:0": (_run_spec if "spec" in case else _run_grouped_gemm)(case, device),
    "grouped_gemm_wgrad": _run_wgrad,
    "grouped_gemm_wgrad_fp8": _run_wgrad_fp8,
    **{fam: (lambda case, device="cuda:0", fam=fam: _run_spec(case, device) if "spec" in case
             else _run_scaled(fam, case, device)) for fam in _SCALED_CASES},
}


def run(arch: str, families: tuple[str, ...] | None = None, device: int = 0) -> list[Row]:
    """Every case of every family (default: every registry family) on ``arch`` / ``device``;
    exceptions become FAIL rows."""
    rows: list[Row] = []
    for fam in families or registry.families():
        row = registry.lookup(fam, arch)
        if row is None:
            rows.append(Row(fam, "-", "not available", detail=f"{fam} on {arch}: no kernel for this arch"))
            continue
        if fam not in RUNNERS:
            rows.append(Row(fam, "-", "not available",
                            detail=f"the {fam} kernel compiles for {arch} but has no public op yet"))
            continue
        rows.extend(run_family(fam, device))
    return rows


def run_family(family: str, device: int = 0) -> list[Row]:
    """The selftest cases of ``family`` on ``device`` (the family must have a runner)."""
    rows: list[Row] = []
    for label, case in RUNNERS[family]():
        t0 = time.perf_counter()
        try:
            err, ok, detail = CASE_RUNNERS[family](case, f"cuda:{device}")
            rows.append(Row(family, label, "pass" if ok else "FAIL", err, time.perf_counter() - t0, detail))
        except CaseNotAvailable as exc:
            rows.append(Row(family, label, "not available", detail=str(exc)[:300]))
        except Exception as exc:  # a crash is a failed case, reported with its message
            rows.append(Row(family, label, "FAIL", None, time.perf_counter() - t0,
                            f"{type(exc).__name__}: {exc}"[:300]))
    return rows


# ---------------------------------------------------------------- configuration classes
# fusegemm/verify.py verifies kernels per configuration class (verify.ConfigClass): these are the
# cases of one class, its tile, cluster, CTAs, scheduler, majors, recipe and weights pinned.

def class_cases(cls: Any) -> list[tuple[str, dict[str, Any]]]:
    """Cases that run configuration class ``cls``'s kernel: ragged and empty experts, N and K
    tails, and a problem large enough that every CTA of the cluster gets tiles (each case dict
    also names its runner: ``run``)."""
    from .generator.spec import find_spec
    spec = find_spec(cls.family)
    pin = {k: v for k, v in cls.axes().items() if k in spec.choice_map}
    (tm, tn), (cm, cn) = cls.tile, cls.cluster
    units = max(1, cm // cls.ctas)          # MMA tiles side by side along M in one cluster
    if cls.kind == "kscaled":
        return [("ragged + empty experts, an N tail", dict(run="wgrad_fp8", tokens=[256, 0, 700, 100], m=2 * tm,
                                                            n=tn + 72, axes=pin)),
                ("two experts, every column tile", dict(run="wgrad_fp8", tokens=[512, 512], m=tm, n=2 * tn,
                                                        axes=pin))]
    if cls.kind == "kgrouped":
        return [("ragged + empty experts, an N tail", dict(run="wgrad", tokens=[256, 0, 768, 300], m=2 * tm,
                                                            n=tn + 72, axes=pin)),
                ("two experts, every column tile", dict(run="wgrad", tokens=[512, 512], m=tm, n=2 * tn, axes=pin))]
    ab, sf, vec = cls.recipe
    if cls.kind == "batched":
        fmt = dict(ab_dtype=ab, sf_dtype=sf, sf_vec_size=vec, a_major=cls.majors[0])
        call = dict(mma_tiler_mn=cls.tile, cluster_shape_mn=cls.cluster)
        return [("3 batches, M and N tails", dict(run="seed", m=tm * units + 72, n=tn * cn + 8, k=320, batch=3,
                                                  call=call, **fmt)),
                ("1 batch, every CTA busy", dict(run="seed", m=2 * tm * units, n=2 * tn * cn, k=256, batch=1,
                                                 call=call, **fmt))]
    tail = dict(tokens=[300, 0, 700, 17], n=tn * cn + (64 if cls.kind == "grouped" else 128), k=200 if
                cls.kind == "grouped" else 320)
    busy = dict(tokens=[max(1024, 4 * tm * units)], n=2 * tn * cn, k=256)
    if cls.kind == "scaled" and ab not in ("float8_e4m3fn", "float8_e5m2"):   # packed FP4: the seed's problems
        call = dict(mma_tiler_mn=cls.tile, cluster_shape_mn=cls.cluster,
                    use_dynamic_sched=cls.scheduler == "dynamic")
        fmt = dict(ab_dtype=ab, sf_dtype=sf, sf_vec_size=vec, discrete=cls.weights == "discrete")
        return [(f"{what}, {ab}", dict(run="seed", **shape, **fmt, call=call))
                for what, shape in (("ragged + empty experts, tails", {**tail, "k": 256}), ("every CTA busy", busy))]
    cases = [("ragged + empty experts, N and K tails", dict(run="spec", spec=cls.family, axes=pin, **tail)),
             ("every CTA of the cluster busy", dict(run="spec", spec=cls.family, axes=pin, **busy))]
    if cls.kind == "scaled" and tm == 64:
        # Ping-pong (the sm_90a blockwise kernel's tile_m 64): several tiles per CTA, so that both
        # consumer warpgroups run tiles in turn (each skipping the other's stages), an odd number of
        # k-blocks (the two temporary sets' last promotion).
        cases.append(("ping-pong: several tiles per warpgroup", dict(run="spec", spec=cls.family, axes=pin,
                                                                      tokens=[4096, 0, 3000, 1024], n=4 * tn,
                                                                      k=640)))
    if cls.scheduler == "streamk":
        # The split engaged (fusegemm/stream_k.cuh, FUSEGEMM_STREAMK_MIN_K_BLOCKS 4): tiles fewer than
        # the SMs, each split over several CTAs (heads adding two or more partials); and whole waves
        # before a split last wave (80 or 76 M blocks: 160 or 152 tiles, a last wave at most half
        # full on 114 to 150 SMs, the split's condition; K 1040: 17 k-blocks), the compacted walk with
        # row ends included.
        waves = [6400, 0, 3100] if tm == 128 else [3200, 0, 1600]
        cases += [("stream-K: few tiles, each split over CTAs", dict(run="spec", spec=cls.family, axes=pin,
                                                                    tokens=[300, 0, 700, 17], n=tn + 64, k=1000)),
                  ("stream-K: whole waves, then a split last wave",
                   dict(run="spec", spec=cls.family, axes=pin, tokens=waves, n=2 * tn, k=1040, row_ends=True))]
    return cases


def run_class_case(cls: Any, case: dict[str, Any], device: str = "cuda:0") -> tuple[float, bool, str]:
    """One case of :func:`class_cases`."""
    opts = {k: v for k, v in case.items() if k != "run"}
    if case["run"] == "wgrad":
        return _run_wgrad(opts, device)
    if case["run"] == "wgrad_fp8":
        return _run_wgrad_fp8(opts, device)
    if case["run"] == "seed":
        return _run_scaled(cls.family, opts, device)
    return _run_spec(opts, device)


def run_class(cls: Any, device: int = 0, built: Callable[[], None] = lambda: None) -> list[Row]:
    """The verification cases of configuration class ``cls`` on ``device`` (what fusegemm/verify.py's
    watchdog child runs): a first pass with every kernel launch suppressed builds and loads the
    cases' kernels, ``built()`` says so (the watchdog then starts the clock), then the cases run
    and are compared with the references."""
    from .ops.engine import Op
    cases = class_cases(cls)
    where = f"cuda:{device}"
    launch = Op._run
    Op._run = lambda *args, **kwargs: None   # this process only runs the cases (the watchdog's child)
    try:
        for _, case in cases:
            try:
                run_class_case(cls, case, where)
            except Exception:   # outputs of launches that never happened; the real pass reports
                pass
    finally:
        Op._run = launch
    built()
    rows: list[Row] = []
    for label, case in cases:
        t0 = time.perf_counter()
        name = f"{cls.slug}: {label}"
        try:
            err, ok, detail = run_class_case(cls, case, where)
            rows.append(Row(cls.family, name, "pass" if ok else "FAIL", err, time.perf_counter() - t0, detail))
        except CaseNotAvailable as exc:
            rows.append(Row(cls.family, name, "not available", detail=str(exc)[:300]))
        except Exception as exc:  # a crash is a failed case, reported with its message
            rows.append(Row(cls.family, name, "FAIL", None, time.perf_counter() - t0,
                            f"{type(exc).__name__}: {exc}"[:300]))
    return rows


def all_classes(arch: str, families: tuple[str, ...] | None = None) -> list[Any]:
    """Every configuration class ``arch``'s kernels implement, per family (default: every family
    with a runner): the spec's tile, cluster, scheduler, majors, recipe and weight choices that the
    spec's constraints and the registry row admit (fusegemm selftest --all-configs)."""
    import itertools

    from .generator.config_class import config_class
    from .generator.spec import find_spec
    from .generator.variants import make_variant
    from .ops.scaled_layouts import check_layouts
    dims = ("tile_m", "tile_n", "cluster_m", "cluster_n", "scheduler", "a_major", "b_major", "ab_dtype",
            "sf_dtype", "sf_vec_size", "weight_mode", "a_gather", "b_gather", "d_scatter")
    out: list[Any] = []
    for fam in families or registry.families():
        row = registry.lookup(fam, arch)
        if row is None or fam not in RUNNERS:
            continue
        spec = find_spec(fam)
        offered = [(d, spec.choice_map[d]) for d in dims if d in spec.choice_map]
        seen = set()
        for values in itertools.product(*(vals for _, vals in offered)):
            choice = dict(zip((d for d, _ in offered), values))
            try:
                variant = make_variant(spec, arch=arch, **choice)
                registry.resolve(fam, arch, variant.choices)
                if row.kernel_class in ("scaled", "batched"):
                    check_layouts(_Shim(spec, arch, variant))
            except UnsupportedError:
                continue
            cls = config_class(variant)
            if cls not in seen:
                seen.add(cls)
                out.append(cls)
    return out


@dataclass(frozen=True)
class _Shim:
    """What ``check_layouts`` reads of an op."""

    spec: Any
    arch: str
    variant: Any
