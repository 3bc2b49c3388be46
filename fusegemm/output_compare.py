"""Comparing a GPU op's outputs with fusegemm.reference: the rules `fusegemm selftest`, the
first-run verification and tests/gpu share. (An op's argument checks, before a launch, are
fusegemm/ops/arg_checks.py.)

* ``device_args`` turns a reference call's arguments (numpy, ml_dtypes FP8/E8M0/bf16 included,
  strided views kept as views) into CUDA torch tensors; per-expert ``b_list`` / ``sfb_list`` become
  the ``b_ptrs`` / ``sfb_ptrs`` pointer tables the GPU ops take.
* ``compare_outputs`` compares two TupleDicts output by output. Quantized bytes (FP8 / FP4 data,
  SF bytes) must match exactly; with ``exact`` every output must (problems whose FP32 sums are
  exact in any order); otherwise FP32 outputs within ``rtol`` of the largest reference magnitude,
  bf16/fp16 outputs within that plus one ulp of the element (2^-7 / 2^-10 relative). NaN must
  sit where the reference has NaN.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

_BYTE_TYPES = ("float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu")
_RAW = {1: np.uint8, 2: np.uint16}
ULP = {"bfloat16": 2.0 ** -7, "float16": 2.0 ** -10}


def to_device(x: Any, device: str = "cuda") -> Any:
    """A numpy array as a torch tensor on ``device`` with the same dtype, shape and strides."""
    import torch
    if not isinstance(x, np.ndarray):
        return x
    x = np.array(x, order="K")   # a writable copy in the same memory order (views stay views of it)
    name = x.dtype.name
    if name in _BYTE_TYPES or name == "bfloat16":
        t = torch.from_numpy(x.view(_RAW[x.dtype.itemsize])).view(getattr(torch, name))
    else:
        t = torch.from_numpy(x)
    return t.to(device)


def device_args(kwargs: Mapping[str, Any], device: str = "cuda") -> tuple[dict[str, Any], list[Any]]:
    """(GPU call arguments, tensors to keep alive while the pointer tables are in use)."""
    import torch
    out: dict[str, Any] = {}
    keep: list[Any] = []
    for name, value in kwargs.items():
        if name in ("b_list", "sfb_list"):
            tensors = [to_device(v, device) for v in value]
            keep.extend(tensors)
            out["b_ptrs" if name == "b_list" else "sfb_ptrs"] = torch.tensor(
                [t.data_ptr() for t in tensors], dtype=torch.int64, device=device)
        else:
            out[name] = to_device(value, device)
    return out, keep


def _host(x: Any) -> np.ndarray | None:
    """Outputs as comparable numpy: byte formats as uint8, bf16 as float32."""
    if x is None:
        return None
    if hasattr(x, "detach"):
        import torch
        t = x.detach().cpu()
        if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e8m0fnu):
            return t.view(torch.uint8).numpy()
        return (t.float() if t.dtype == torch.bfloat16 else t).numpy()
    arr = np.asarray(x)
    if arr.dtype.name in _BYTE_TYPES:
        return arr.view(np.uint8)
    return arr.astype(np.float32) if arr.dtype.name == "bfloat16" else arr


def _dtype_name(x: Any) -> str:
    return str(getattr(x, "dtype", "")).removeprefix("torch.")


def compare_outputs(ref: Mapping[str, Any], out: Mapping[str, Any], *, exact: bool,
                    rtol: float = 1e-4, fp8_steps: int = 0) -> tuple[float, str | None]:
    """(largest error relative to the reference's magnitude, first mismatch or None).

    Byte outputs (FP8 elements, scale factors, packed FP4) must match exactly, except that with
    ``fp8_steps`` an FP8 element may be that many codes from the reference's, on the same side of
    zero (a kernel whose FP32 value is within its functions' ulp bounds of the reference's can
    round to the neighbouring code where the value lies that close to a rounding midpoint).
    Scale factors never: one code is a factor of two."""
    if list(ref.keys()) != list(out.keys()):
        return float("inf"), f"outputs {list(out.keys())}; reference {list(ref.keys())}"
    worst = 0.0
    for key in ref.keys():
        r, o = _host(ref[key]), _host(out[key])
        if r is None or o is None:
            if (r is None) != (o is None):
                return float("inf"), f"{key}: {'missing' if o is None else 'unexpected'}"
            continue
        if r.shape != o.shape:
            return float("inf"), f"{key}: shape {o.shape}; reference {r.shape}"
        if r.dtype == np.uint8:
            differ = r != o
            if fp8_steps and _dtype_name(ref[key]) in ("float8_e4m3fn", "float8_e5m2"):
                near = (np.abs(r.astype(np.int16) - o.astype(np.int16)) <= fp8_steps) & (((r ^ o) & 0x80) == 0)
                differ &= ~near
            bad = np.argwhere(differ)
            if bad.size:
                at = tuple(bad[0])
                return float("inf"), f"{key}: {len(bad)} bytes differ, first at {at}: {o[at]} vs {r[at]}"
            continue
        r64, o64 = r.astype(np.float64), o.astype(np.float64)
        if not np.array_equal(np.isnan(r64), np.isnan(o64)):
            return float("inf"), f"{key}: NaN positions differ"
        fin = np.isfinite(r64)
        if not np.array_equal(o64[~fin & ~np.isnan(r64)], r64[~fin & ~np.isnan(r64)]):
            return float("inf"), f"{key}: infinities differ"
        scale = max(float(np.abs(r64[fin]).max(initial=0.0)), 1e-30)
        err = np.abs(r64[fin] - o64[fin])
        worst = max(worst, float(err.max(initial=0.0)) / scale)
        if exact:
            bad = np.argwhere(err > 0)
        else:
            bound = rtol * scale + ULP.get(np.asarray(ref[key]).dtype.name, 0.0) * np.abs(r64[fin])
            bad = np.argwhere(err > bound)
        if bad.size:
            return worst, f"{key}: {len(bad)} elements outside the tolerance"
    return worst, None
