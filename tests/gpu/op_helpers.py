"""Shared by the GPU tests that call ``fusegemm.Op`` directly (tests/gpu/test_op_gpu.py,
test_frag_quant_gpu.py): every epilogue input of an op, seeded, and a byte-for-byte comparison of
two calls' outputs."""
from __future__ import annotations

import torch


def epilogue_inputs(op, m: int, n: int, l: int, g: torch.Generator, width: int | None = None) -> dict:
    """Every input ``op``'s epilogue declares, on the GPU from generator ``g``: scalars as the
    Python number 0.5, per-expert (L,), per-row (M,), column (N, L) with N contiguous, element
    (M, width) or (M, 2 width) when paired (``width``: element columns, default N)."""
    w = n if width is None else width
    inputs = {}
    for i in op.epilogue.inputs:
        dt = getattr(torch, i.dtype)
        if i.per == "scalar":
            inputs[i.name] = 0.5
        elif i.per == "expert":
            inputs[i.name] = torch.rand(l, generator=g, device="cuda")
        elif i.per == "row":
            inputs[i.name] = torch.rand(m, generator=g, device="cuda").to(dt)
        elif i.per == "column":
            inputs[i.name] = torch.rand(l, n, generator=g, device="cuda").to(dt).t()
        else:
            inputs[i.name] = torch.randn(m, 2 * w if i.paired else w, generator=g, device="cuda").to(dt)
    return inputs


def same_outputs(got, want, what: str, dprob_atol: float = 1e-5) -> None:
    """Every output of ``want`` equal in ``got`` byte for byte; dprob, a sum of atomic float adds
    whose order varies, within rtol 1e-5 and ``dprob_atol``."""
    for k, v in want.items():
        if k == "dprob":
            torch.testing.assert_close(got[k], v, rtol=1e-5, atol=dprob_atol, msg=f"{what}: {k}")
        else:
            assert torch.equal(got[k].view(torch.uint8), v.view(torch.uint8)), f"{what}: {k} differs"
