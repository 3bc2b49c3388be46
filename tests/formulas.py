"""Float64 formulas the GPU tests hold kernels to, independent of the numpy interpreter: shared by
tests/gpu/test_glu_mx_gpu.py and tests/gpu/test_sfd_1x128_gpu.py."""
from __future__ import annotations

import numpy as np


def swiglu64(a64, b64, sizes, ins):
    """prob * up * silu(gate) with G = alpha[e] * A_e @ B_e^T (+ bias) read in 32-column gate/up
    blocks, in float64: the formula, not the interpreter."""
    n_acc = b64.shape[1]
    j = np.arange(n_acc // 2)
    gate_col, up_col = (j // 32) * 64 + j % 32, (j // 32) * 64 + 32 + j % 32
    out, start = [], 0
    for e, rows in enumerate(sizes):
        g = a64[start:start + rows] @ b64[e].T * float(ins["alpha"][e])
        if "bias" in ins:
            g = g + ins["bias"][:, e].double().numpy()[None, :]
        gate, up = g[:, gate_col], g[:, up_col]
        out.append(up * gate / (1 + np.exp(-gate)))
        start += rows
    return np.concatenate(out) * ins["prob"].double().numpy()[:, None]
