"""Number formats of the block-scaled MoE GEMMs: element casts, block scaling, SF layouts, views.

Pure numpy + ml_dtypes; torch tensors are accepted where cheap and torch is never imported here.

* :mod:`.numpy_dtypes` — dtype names in any spelling, host numpy views of torch tensors.
* :mod:`.elements` — FP32/BF16 to and from e4m3fn, e5m2, e2m1, E8M0 (nearest-even and the SFD's
  round-up), saturation, FP4 packing (even element in the low nibble).
* :mod:`.blockscale` — MXFP8 / NVFP4 / MXFP4 quantization along K.
* :mod:`.blockwise` — the blockwise FP8 recipe: FP32 scales, 1x128 (activations) and 128x128 (weights);
  :mod:`.torch_blockwise` the same on torch tensors on their device (and the E8M0 scales as MX ones).
* :mod:`.scales` — the 32x4x4 scale-factor atom layout and the ``discrete_col_sfd`` order.
* :mod:`.views` — canonical row-major tensors and the kernel-facing views of the seed pages.
"""
from __future__ import annotations

from .blockscale import BlockFormat, block_format, dequantize_blockwise, quantize_blockwise
from .blockwise import (blockwise_sfa_layout, dequantize_1x128, dequantize_128x128, e8m0_bytes, e8m0_to_float32,
                        quantize_1x128, quantize_128x128)
from .numpy_dtypes import ElementFormat, FORMATS, dtype_name, resolve_dtype, to_numpy
from .elements import pack_fp4, to_float32, to_format, unpack_fp4
from .scales import (
    as_sf_physical,
    pack_sf,
    pack_sf_discrete_col,
    sf_from_kernel_view,
    sf_physical_shape,
    sf_to_kernel_view,
    sf_view_shape,
    unpack_sf,
    unpack_sf_discrete_col,
)
from .views import (
    a_from_kernel,
    a_to_kernel,
    b_from_kernel,
    b_to_kernel,
    cd_from_kernel,
    cd_to_kernel,
    prob_from_kernel,
    prob_to_kernel,
)

__all__ = [
    "BlockFormat",
    "ElementFormat",
    "FORMATS",
    "a_from_kernel",
    "a_to_kernel",
    "as_sf_physical",
    "b_from_kernel",
    "b_to_kernel",
    "block_format",
    "blockwise_sfa_layout",
    "cd_from_kernel",
    "cd_to_kernel",
    "dequantize_1x128",
    "dequantize_128x128",
    "dequantize_blockwise",
    "dtype_name",
    "e8m0_bytes",
    "e8m0_to_float32",
    "pack_fp4",
    "pack_sf",
    "pack_sf_discrete_col",
    "prob_from_kernel",
    "prob_to_kernel",
    "quantize_1x128",
    "quantize_128x128",
    "quantize_blockwise",
    "resolve_dtype",
    "sf_from_kernel_view",
    "sf_physical_shape",
    "sf_to_kernel_view",
    "sf_view_shape",
    "to_float32",
    "to_format",
    "to_numpy",
    "unpack_fp4",
    "unpack_sf",
    "unpack_sf_discrete_col",
]
