"""Device facts the ops need, read once per device: arch, SM count; per-call allocations."""
from __future__ import annotations

import functools
from typing import Any, Mapping

from ..base.archs import arch_of_capability, supported_capabilities
from ..base.errors import UnsupportedError
from ..runtime.tensors import is_capturing, require_torch


@functools.lru_cache(maxsize=16)
def device_arch(device: int) -> str:
    """The arch (fusegemm/base/archs.py) whose kernels run on ``device``; UnsupportedError
    naming the capability otherwise."""
    from ..runtime.load import device_attribute, ensure_context
    try:
        ensure_context(device)
        cc = (device_attribute(device, "COMPUTE_CAPABILITY_MAJOR"),
              device_attribute(device, "COMPUTE_CAPABILITY_MINOR"))
    except Exception as exc:   # no driver library (a CPU machine), no device, a bad ordinal
        raise UnsupportedError(
            f"no CUDA device {device} to take the arch from ({type(exc).__name__}: {str(exc)[:200]}); "
            f"pass arch='sm_90a' or arch='sm_100a' to build kernels or take references without a GPU") from exc
    arch = arch_of_capability(*cc)
    if arch is None:
        raise UnsupportedError(f"device {device} has compute capability {cc[0]}.{cc[1]}; fusegemm "
                               f"kernels need {supported_capabilities()}")
    return arch.name


@functools.lru_cache(maxsize=16)
def num_sms(device: int) -> int:
    from ..runtime.load import device_attribute
    return device_attribute(device, "MULTIPROCESSOR_COUNT")


def _torch() -> Any:
    return require_torch("fusegemm allocates the wrappers' outputs and per-call scratch (dynamic "
                         "scheduling, discrete weights) with torch's stream-ordered allocator")


def alloc(shape: tuple[int, ...], dtype: str, device: int) -> Any:
    """A new torch tensor (outputs and per-call workspaces use torch's caching allocator,
    which is stream-ordered and CUDA-graph aware)."""
    torch = _torch()
    return torch.empty(shape, dtype=getattr(torch, dtype), device=f"cuda:{device}")


def alloc_outputs(resolved: Any, n_acc: int, m_rows: int, experts: int, device: Any, *,
                  rows_written: bool = False, out_rows: int | None = None) -> dict[str, Any]:
    """The buffers a resolved epilogue writes (``Resolved.buffers``), as torch tensors on
    ``device`` filled with their initial values (amax -inf, the rest 0). ``rows_written``: the
    row buffers (``Resolved.row_buffers``: C, D, D_col) are left uninitialised, for a kernel
    that stores every one of their rows (K-grouped) or a caller that zeroes the rest
    (fusegemm/ops/tail.py): filling them first cost up to 22% of a GEMM's time on the H200.
    ``out_rows``: the row buffers' rows where they are not the problem's (scattered outputs)."""
    return alloc_buffers(resolved.buffers(n_acc, m_rows, experts, out_rows), resolved.row_buffers(), device,
                         rows_written=rows_written)


def alloc_buffers(buffers: Mapping[str, tuple], rows: tuple[str, ...], device: Any, *,
                  rows_written: bool = False) -> dict[str, Any]:
    """Torch tensors on ``device`` for ``buffers`` (name: (shape, storage dtype, fill)), filled
    with their fill values, except the row buffers named in ``rows`` when ``rows_written``
    (left uninitialised: :func:`alloc_outputs`)."""
    torch = _torch()
    empty = rows if rows_written else ()
    return {name: (torch.empty(shape, dtype=getattr(torch, store), device=device) if name in empty
                   else torch.full(shape, fill, dtype=getattr(torch, store), device=device))
            for name, (shape, store, fill) in buffers.items()}


def record_stream(t: Any, stream: int) -> None:
    """Tell torch's allocator a tensor is used on a stream it does not own."""
    import torch
    if stream != torch.cuda.current_stream(t.device).cuda_stream:
        t.record_stream(torch.cuda.ExternalStream(stream, device=t.device))


def offsets_on_host(offsets: Any, stream: int) -> list[int] | None:
    """padded_offsets values copied to the host, or None while ``stream`` captures a CUDA graph
    (a copy there would break the capture)."""
    if is_capturing(stream):
        return None
    return _torch().as_tensor(offsets).to("cpu").tolist()
