"""The launch configuration of a preset call that names none (a row with ``tune``: seed 001).

Without ``mma_tiler_mn``, ``cluster_shape_mn`` and ``use_dynamic_sched``, a call takes what
``fusegemm tune`` recorded for its shape bucket (:mod:`fusegemm.tuning_records`); else, with
``FUSEGEMM_AUTOTUNE=1``, the bucket is tuned on this first call and its winner recorded (the
first-call hook that the package root installs: tuning times the op); else, on an arch whose
policy says so (sm_100a, which cannot be timed here), the roofline model's choice
(:mod:`fusegemm.heuristic`); else the spec's default. It runs once per call pattern: the
faces memoise what a pattern resolved to (fusegemm/ops/faces.py), and a record written later
clears that memo.
"""
from __future__ import annotations

import functools
from typing import Any

from ..runtime import config
from ..runtime.tensors import resolve_stream
from . import device as _device
from .grouped_operands import parse_call


def tuned_axes(spec: str, bound: dict[str, Any], axes: dict[str, Any]) -> dict[str, Any]:
    """The tile, cluster and scheduler axes for seed-001-style arguments ``bound`` (a CUDA
    ``a_tensor``) whose other axes are ``axes``, or {} for the spec's default."""
    call = parse_call(bound["a_tensor"], bound["padded_offsets"], bound["alpha_tensor"], bound["b_tensor"],
                      bound["b_ptrs"], bound["bias_tensor"], bound["prob_tensor"], ab_dtypes=("bfloat16",),
                      bias_dtypes=(axes["bias_dtype"],), n=bound["n"], b_major=bound["b_major"])
    tile, scheduler, cluster = _tuned(call, call.a.device[1], axes["c_dtype"] if axes["generate_c"] else None,
                                      axes["d_dtype"], bound["b_major"], bound["current_stream"], spec)
    out: dict[str, Any] = {}
    if tile is not None:
        out.update(tile_m=tile[0], tile_n=tile[1], scheduler=scheduler)
    if cluster is not None:
        out.update(cluster_m=cluster[0], cluster_n=cluster[1])
    return out


def _tuned(call: Any, device: int, c_name: str | None, d_name: str, b_major: str, stream: Any = None,
           spec: str = "grouped_gemm") -> tuple[Any, str, Any]:
    """(tile, scheduler, cluster) for a parsed call: the recorded, first-call tuned or modelled
    configuration; (None, "static", None) for the spec's default."""
    from .. import tuning_records
    from ..base.hooks import FIRST_CALL_TUNE
    from ..generator import registry
    from .prepared import is_dry
    arch, name = _device_identity(device)
    bucket = tuning_records.Bucket.of(experts=call.l, m_rows=call.m, n=call.n, k=call.k, d_dtype=d_name,
                                      c_dtype=c_name, bias=call.bias.dtype if call.bias is not None else None,
                                      discrete=call.b_ptrs is not None, b_major=b_major)
    hit = tuning_records.lookup(spec, arch, name, bucket)
    if hit is None and config.autotune() and not is_dry():
        hit = FIRST_CALL_TUNE(spec, arch, device, name, bucket, experts=call.l, m_rows=call.m, n=call.n,
                              k=call.k, d_dtype=d_name, stream=resolve_stream(stream, device))
    if hit is not None:
        return hit.tile, hit.scheduler, None
    if registry.policy(arch).heuristic and call.bias is None:     # (bias needs tile N 256: the default's)
        from .. import heuristic
        # Every expert's rows are a multiple of 256 and every tile M divides 256, so the tile
        # count depends on the rows' sum only: the allocation's rows, with no device read.
        c = heuristic.choose([call.m] + [0] * (call.l - 1), call.n, call.k)
        if c != heuristic.DEFAULT:
            return c.tile, "static", c.cluster
    return None, "static", None


@functools.lru_cache(maxsize=16)
def _device_identity(device: int) -> tuple[str, str]:
    from ..runtime.load import device_name
    return _device.device_arch(device), device_name(device)
