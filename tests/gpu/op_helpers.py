"""Shared by the GPU tests that call ``fusegemm.Op`` directly (tests/gpu/test_op_gpu.py,
test_frag_quant_gpu.py, ...): a byte-for-byte comparison of two calls' outputs (their inputs:
tests/epilogue_inputs.py)."""
from __future__ import annotations

import torch


def same_outputs(got, want, what: str, dprob_atol: float = 1e-5) -> None:
    """Every output of ``want`` equal in ``got`` byte for byte; dprob, a sum of atomic float adds
    whose order varies, within rtol 1e-5 and ``dprob_atol``."""
    for k, v in want.items():
        if k == "dprob":
            torch.testing.assert_close(got[k], v, rtol=1e-5, atol=dprob_atol, msg=f"{what}: {k}")
        else:
            assert torch.equal(got[k].view(torch.uint8), v.view(torch.uint8)), f"{what}: {k} differs"
