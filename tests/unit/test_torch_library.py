"""torch custom ops (fusegemm/torch_library.py) on CPU: registration, schema, and the fake
implementation's shapes/dtypes/strides (the real op runs in tests/gpu/test_torch_ops_gpu.py)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import fusegemm.torch_library as fg  # noqa: E402  (registers torch.ops.fusegemm.*)
from fusegemm.base.errors import ArgumentError  # noqa: E402


def _meta(l=4, m=1024, n=384, k=256, canonical=True):
    a = torch.empty((m, k) if canonical else (m, k, 1), dtype=torch.bfloat16, device="meta")
    b = torch.empty((l, n, k), dtype=torch.bfloat16, device="meta")
    if not canonical:
        b = b.permute(1, 2, 0)
    off = torch.empty((l,), dtype=torch.int32, device="meta")
    alpha = torch.empty((l,), device="meta")
    return a, off, alpha, b


def test_the_op_is_registered_with_a_functional_schema():
    op = torch.ops.fusegemm.grouped_gemm.default
    assert not any(arg.alias_info is not None for arg in op._schema.arguments), "no argument is mutated"
    assert [r.type.kind() for r in op._schema.returns] == ["TensorType", "TensorType"]


@pytest.mark.parametrize("canonical", [True, False])
@pytest.mark.parametrize("generate_c", [False, True])
def test_fake_shapes_match_the_eager_allocation(canonical, generate_c):
    a, off, alpha, b = _meta(canonical=canonical)
    d, c = fg.grouped_gemm(a, off, alpha, b, c_dtype=torch.float32, d_dtype=torch.float16,
                           generate_c=generate_c)
    want = (1024, 384) if canonical else (1024, 384, 1)
    assert d.shape == want and d.dtype == torch.float16 and d.is_contiguous()
    assert c.dtype == torch.float32 and c.shape == (want if generate_c else (0,))


def test_fake_discrete_weights_take_n():
    a, off, alpha, _ = _meta()
    ptrs = torch.empty((4,), dtype=torch.int64, device="meta")
    d, _ = fg.grouped_gemm(a, off, alpha, None, b_ptrs=ptrs, n=640)
    assert d.shape == (1024, 640)
    with pytest.raises(ValueError, match="n: got None"):
        fg.grouped_gemm(a, off, alpha, None, b_ptrs=ptrs)


def test_real_op_validates_like_the_wrapper():
    a = torch.zeros((256, 64), dtype=torch.bfloat16)
    b = torch.zeros((1, 128, 64), dtype=torch.bfloat16)
    off = torch.tensor([256], dtype=torch.int32)
    with pytest.raises(ArgumentError, match="a_tensor"):
        fg.grouped_gemm(a, off, torch.ones(1), b)       # CPU tensors: the seed's device error
