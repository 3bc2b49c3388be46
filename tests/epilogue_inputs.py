"""Every input a ``fusegemm.Op``'s epilogue declares, seeded, in the layout the op reads: shared
by the unit tests of the op's host path (tests/unit/test_op.py) and the GPU tests that call an op
directly (tests/gpu)."""
from __future__ import annotations

import torch


def epilogue_inputs(op, m: int, n: int, l: int, g: torch.Generator, width: int | None = None,
                    device: str = "cuda", element=torch.randn) -> dict:
    """Every input ``op``'s epilogue declares, on ``device`` from generator ``g``: scalars as the
    Python number 0.5, per-expert (L,), per-row (M,), column (N, L) with N contiguous, element
    (M, width) or (M, 2 width) when paired (``width``: element columns, default N), drawn by
    ``element`` (``torch.randn`` or ``torch.rand``)."""
    w = n if width is None else width
    inputs = {}
    for i in op.epilogue.inputs:
        dt = getattr(torch, i.dtype)
        if i.per == "scalar":
            inputs[i.name] = 0.5
        elif i.per == "expert":
            inputs[i.name] = torch.rand(l, generator=g, device=device)
        elif i.per == "row":
            inputs[i.name] = torch.rand(m, generator=g, device=device).to(dt)
        elif i.per == "column":
            inputs[i.name] = torch.rand(l, n, generator=g, device=device).to(dt).t()
        else:
            inputs[i.name] = element(m, 2 * w if i.paired else w, generator=g, device=device).to(dt)
    return inputs
