"""Block-scaled operands from normal values, quantized with fusegemm.formats (MXFP8, or the
blockwise recipe: A 1x128, B 128x128), for the CPU tests of spec-authored block-scaled backends
(tests/unit/test_dsrelu_mx.py, test_dglu_mx.py)."""
from __future__ import annotations

import numpy as np
import torch

from fusegemm.formats import (blockwise_sfa_layout, dequantize_128x128, dequantize_1x128, dequantize_blockwise,
                              pack_sf, quantize_128x128, quantize_1x128, quantize_blockwise)
from fusegemm.output_compare import to_device


def operands(recipe: str, sizes, n: int, k: int, rng: np.random.Generator) -> tuple:
    """(A, SFA, offsets, B, SFB) as CPU tensors, and A and B dequantized (float32). Draws from
    ``rng`` first (the callers' inputs come after)."""
    m, l = sum(sizes), len(sizes)
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((l, n, k)).astype(np.float32) * np.float32(k ** -0.5)
    if recipe == "mx":
        aq, sa = quantize_blockwise(x, ab_dtype="float8_e4m3fn", sf_vec_size=32)
        bq, sb = quantize_blockwise(w, ab_dtype="float8_e4m3fn", sf_vec_size=32)
        a64, b64 = (dequantize_blockwise(q, s, sf_vec_size=32) for q, s in ((aq, sa), (bq, sb)))
        sfa, sfb = to_device(pack_sf(sa), "cpu"), to_device(pack_sf(sb, batch_first=True), "cpu")
    else:
        aq, sa = quantize_1x128(x, "float8_e4m3fn")
        bq, sb = quantize_128x128(w, "float8_e4m3fn")
        a64, b64 = dequantize_1x128(aq, sa), dequantize_128x128(bq, sb)
        sfa, sfb = blockwise_sfa_layout(torch.from_numpy(sa)), torch.from_numpy(sb)
    ops = (to_device(aq, "cpu"), sfa, torch.tensor(np.cumsum(sizes), dtype=torch.int32), to_device(bq, "cpu"), sfb)
    return ops, a64, b64
