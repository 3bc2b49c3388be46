"""Running the epilogue harness on a GPU: a spec's generated rule run on given FP32 accumulators
(its source is rendered by generator/harness.py; this module plans, compiles and launches it).

``run_harness(variant, mode, acc, offsets, inputs, ...)`` renders the harness of the variant's
epilogue (generator/harness.py), compiles it through the kernel cache, launches it and returns
every output the rule writes: C, D, D_col, SFD_row, SFD_col, amax, dprob. The outputs come back
in the layouts the interpreter (fusegemm/interpret.py) produces, so a test compares the two
directly. ``block`` mode is the engine every sm_100a kernel (and the sm_90a engine path) runs;
``fragment`` mode is the sm_90a kernel's element-wise path.

Torch is required (outputs are torch tensors on the accumulators' device).
"""
from __future__ import annotations

from typing import Any, Mapping

from .base.errors import ArgumentError
from .generator.harness import render_harness
from .generator.params import HARNESS_PARAMS
from .generator.variants import Variant


def plan_harness(v: Variant, mode: str) -> Any:
    """The harness of ``v``'s epilogue in ``mode``, rendered and keyed (a pipeline.Planned: what
    fusegemm.build.compile_all compiles ahead, in parallel)."""
    from .pipeline import Planned
    from .runtime.cache import key_fields, make_key
    src = render_harness(v, mode)
    fields = key_fields(src.text, src.variant.arch)
    return Planned(src, make_key(fields), tuple(fields))


def run_harness(v: Variant, mode: str, acc: Any, offsets: Any, inputs: Mapping[str, Any], *,
                m_rows: int, rcp_max: float = 0.0, device: int | None = None, d_index: Any = None,
                d_rows: int | None = None) -> dict[str, Any]:
    """Run ``v``'s epilogue rule on ``acc`` (float32 (valid_m, N_acc) CUDA tensor).

    Parameters
    ----------
    v : Variant
        The spec variant (its dtypes choose the rule's inputs and outputs).
    mode : {"block", "fragment"}
    acc : torch.Tensor
        float32 (valid_m, N_acc), row-major, on a CUDA device.
    offsets : torch.Tensor
        int32 (L,) padded_offsets on the same device.
    inputs : mapping
        The spec's inputs by name: expert (L,), row (m_rows,), column (N_acc, L) (N contiguous),
        element (m_rows, width), scalar: a float. An input with a default may be omitted.
    m_rows : int
        Rows of every output (>= valid_m, a multiple of 256).
    rcp_max : float
        SFD: 1 / the FP8/FP4 output's largest value.
    d_index, d_rows : torch.Tensor, int
        A ``d_scatter`` variant's (block mode): int32 (m_rows,) the output row of each problem
        row (outside [0, d_rows): none), and the rows of the C and D buffers.

    Returns
    -------
    dict
        Buffers by name (c, d, d_col, sfd_row, sfd_col, amax, dprob), torch tensors.
    """
    import torch

    from .ops.device import alloc_outputs
    from .pipeline import compile_planned, lookup
    from .runtime.launch import LaunchConfig, ParamBuffer, launch
    from .runtime.load import default_modules
    from .runtime.tensors import resolve_stream

    r = v.spec.epilogue.resolve(v.choices)
    dev = acc.device
    device = dev.index if device is None else device
    n_acc = acc.shape[1]
    w = r.width(n_acc)
    l = offsets.shape[0]
    valid_m = int(offsets[-1].item()) if l else 0
    if acc.shape[0] != valid_m or acc.dtype != torch.float32 or acc.stride(1) != 1:
        raise ArgumentError("acc", f"{tuple(acc.shape)} {acc.dtype}", f"float32 ({valid_m}, N) row-major")
    if n_acc % 8:   # the kernels' 16-byte row stores, as the ops require of N
        raise ArgumentError("acc.shape[1]", n_acc, "a multiple of 8 (16-byte output rows)")
    if v.d_scatter and (d_index is None or d_rows is None):
        raise ArgumentError("d_index/d_rows", f"{type(d_index).__name__}/{d_rows!r}",
                            "an int32 (m_rows,) tensor and an int for a d_scatter variant")
    if not v.d_scatter and (d_index is not None or d_rows is not None):
        raise ArgumentError("d_index/d_rows", f"{type(d_index).__name__}/{d_rows!r}",
                            "None/None for a variant without d_scatter")
    planned = plan_harness(v, mode)
    built = lookup(planned) or compile_planned(planned)
    kernel = default_modules().get(built.cubin, built.kernel_name, key=built.key,
                                   smem_bytes=built.contract.smem_bytes, device=device)

    bufs = alloc_outputs(r, n_acc, m_rows, l, dev, out_rows=d_rows)
    values: dict[str, Any] = {"offsets": offsets, "num_experts": l, "n": n_acc, "m_rows": m_rows,
                              "k": 0, "acc": acc, "ld_acc": acc.stride(0), "rcp_max": rcp_max}
    if d_index is not None:
        values.update(d_index=d_index.data_ptr(), d_rows=d_rows)
    keep = []
    for inp in r.inputs:
        x = inputs.get(inp.name)
        if x is None:
            if inp.default is None:
                raise ArgumentError(f"inputs[{inp.name!r}]", None, f"a {inp.per} input (required)")
            continue
        if inp.per == "scalar" and not hasattr(x, "data_ptr"):
            x = torch.tensor([float(x)], dtype=torch.float32, device=dev)
        keep.append(x)
        values[inp.slot] = x.data_ptr()
        if inp.per == "element":
            values["ld_c_in"] = x.stride(0)
    values.update(r.buffer_params({name: t.data_ptr() for name, t in bufs.items()}, n_acc))
    if mode == "block":
        grid = (max(1, -(-w // 128)), max(1, valid_m // 32), 1)
    else:
        grid = (max(1, -(-n_acc // v.tile_n)), max(1, valid_m // 64), 1)
    buf = ParamBuffer(HARNESS_PARAMS.size)
    buf.fill(HARNESS_PARAMS.pack(values))
    if valid_m:
        launch(kernel, LaunchConfig(grid=grid, block=(built.contract.threads, 1, 1),
                                    smem_bytes=built.contract.smem_bytes), buf,
               resolve_stream(None, device))
    torch.cuda.synchronize(dev)
    del keep
    return bufs
