"""Shared by the GPU tests that call ``fusegemm.Op`` directly (tests/gpu/test_op_gpu.py,
test_frag_quant_gpu.py, ...): a byte-for-byte comparison of two calls' outputs (their inputs:
tests/epilogue_inputs.py), and free memory poisoned with NaN for outputs allocated uninitialised."""
from __future__ import annotations

import torch


def poison_free_blocks(shapes_dtypes) -> set:
    """Free blocks of the caching allocator full of 0xFF bytes (NaN in every float format), one
    per (shape, dtype): the next allocations of those sizes reuse them (larger ones are split
    for smaller allocations). Returns their addresses."""
    junk = [torch.empty(shape, dtype=dtype, device="cuda") for shape, dtype in shapes_dtypes]
    for t in junk:
        t.view(torch.uint8).fill_(255)
    ptrs = {t.data_ptr() for t in junk}
    torch.cuda.synchronize()
    del junk
    return ptrs


def same_outputs(got, want, what: str, dprob_atol: float = 1e-5, dbias_atol: float | None = None) -> None:
    """Every output of ``want`` equal in ``got`` byte for byte; dprob, a sum of atomic float adds
    whose order varies, within rtol 1e-5 and ``dprob_atol``, and dbias (column sums by atomics)
    likewise within ``dbias_atol`` where given (None: byte for byte)."""
    for k, v in want.items():
        if k == "dprob" or (k == "dbias" and dbias_atol is not None):
            atol = dprob_atol if k == "dprob" else dbias_atol
            torch.testing.assert_close(got[k], v, rtol=1e-5, atol=atol, msg=f"{what}: {k}")
        else:
            assert torch.equal(got[k].view(torch.uint8), v.view(torch.uint8)), f"{what}: {k} differs"
