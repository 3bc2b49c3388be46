"""Tests of fusegemm.arguments on numpy inputs: exact messages and the fields of good inputs."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from fusegemm import arguments as A
from fusegemm.base.errors import ArgumentError

BF16 = ml_dtypes.bfloat16


def message(fn, *args, **kwargs) -> str:
    """The ArgumentError message ``fn(*args, **kwargs)`` raises (fails if it raises nothing)."""
    with pytest.raises(ArgumentError) as info:
        fn(*args, **kwargs)
    return str(info.value)


def test_contract_constants():
    assert A.M_ALIGNED == 256 and A.MAX_EXPERTS == 1024


# ---------------------------------------------------------------- tensor


def test_tensor_describes_numpy_arrays():
    x = np.zeros((4, 6), np.float32).T  # (6, 4) with element strides (1, 6)
    v = A.tensor(x, "x", ndims=(2,), dtypes=("float32",))
    assert v.shape == (6, 4) and v.strides == (1, 6) and v.dtype == "float32"
    assert v.device == ("cpu", -1) and v.obj is x and v.ndim == 2
    assert A.tensor(np.zeros(3, BF16), "x", ndims=(1,), dtypes=("bfloat16",)).dtype == "bfloat16"


def test_tensor_errors():
    assert message(A.tensor, None, "x", ndims=(1,), dtypes=("float32",)) == (
        "x: got None; allowed: a tensor. x is required")
    assert message(A.tensor, np.zeros((2, 2), np.float32), "x", ndims=(1, 3), dtypes=("float32",)) == (
        "x.shape: got (2, 2); allowed: 1-D or 3-D tensor")
    assert message(A.tensor, np.zeros(2, np.float64), "x", ndims=(1,), dtypes=("float32", "bfloat16")) == (
        "x.dtype: got float64; allowed: float32, bfloat16")
    assert message(A.tensor, [1.0, 2.0], "x", ndims=(1,), dtypes=("float32",)) == (
        "x: got list; allowed: a torch tensor, or an object with __cuda_array_interface__ or __dlpack__")
    err = pytest.raises(ArgumentError, A.tensor, np.zeros(2, np.int8), "x", ndims=(1,), dtypes=("int32",)).value
    assert isinstance(err, ValueError) and (err.name, err.received, err.allowed) == ("x.dtype", "int8", "int32")


# ---------------------------------------------------------------- choice


def test_choice():
    assert A.choice("n", "cd_major", ("n",)) == "n"
    assert A.choice(None, "epilogue_op", (None, "relu")) is None
    assert message(A.choice, "m", "cd_major", ("n",)) == "cd_major: got 'm'; allowed: 'n'"
    assert message(A.choice, 128, "m_aligned", (256,)) == "m_aligned: got 128; allowed: 256"
    assert message(A.choice, "gelu", "epilogue_op", [None, "relu"]) == (
        "epilogue_op: got 'gelu'; allowed: None, 'relu'")


# ---------------------------------------------------------------- vector


@pytest.mark.parametrize("shape", [(3,), (3, 1), (3, 1, 1)])
def test_vector_accepts_the_three_shapes(shape):
    v = A.vector(np.ones(shape, np.float32), "alpha_tensor", 3)
    assert v.shape == shape and v.dtype == "float32"


def test_vector_errors():
    ones = np.ones(3, np.float32)
    assert message(A.vector, ones[:2], "alpha_tensor", 3) == (
        "alpha_tensor.shape: got (2,); allowed: (3,) or (3, 1, 1)")
    assert message(A.vector, ones[:2], "alpha_tensor", 3, what="(one scale per expert)") == (
        "alpha_tensor.shape: got (2,); allowed: (3,) or (3, 1, 1) (one scale per expert)")
    assert message(A.vector, np.ones((3, 2), np.float32), "prob_tensor", 3) == (
        "prob_tensor.shape: got (3, 2); allowed: (3,) or (3, 1, 1)")
    assert message(A.vector, np.ones((3, 1, 2), np.float32), "prob_tensor", 3) == (
        "prob_tensor.shape: got (3, 1, 2); allowed: (3,) or (3, 1, 1)")
    assert message(A.vector, np.ones((1, 3), np.float32), "prob_tensor", 3) == (
        "prob_tensor.shape: got (1, 3); allowed: (3,) or (3, 1, 1)")
    assert message(A.vector, np.ones((), np.float32), "x", 1) == (
        "x.shape: got (); allowed: 1-D or 2-D or 3-D tensor")
    assert message(A.vector, np.ones((3, 1, 1, 1), np.float32), "x", 3) == (
        "x.shape: got (3, 1, 1, 1); allowed: 1-D or 2-D or 3-D tensor")
    assert message(A.vector, ones.astype(np.float64), "alpha_tensor", 3) == (
        "alpha_tensor.dtype: got float64; allowed: float32")
    assert A.vector(ones.astype(BF16), "prob_tensor", 3, dtypes=("float32", "bfloat16")).dtype == "bfloat16"
    assert message(A.vector, None, "beta_tensor", 3) == "beta_tensor: got None; allowed: a tensor. beta_tensor is required"


# ---------------------------------------------------------------- rows


def test_rows_fields():
    a = np.zeros((512, 64), BF16)
    r = A.rows(a[:, :, None], ("bfloat16",))
    assert (r.m, r.k_stored, r.canonical, r.a.shape) == (512, 64, False, (512, 64, 1))
    r = A.rows(a, ("bfloat16",))
    assert (r.m, r.k_stored, r.canonical, r.a.shape) == (512, 64, True, (512, 64))
    assert A.rows(np.zeros((0, 32), np.uint8), ("uint8",)).m == 0  # every expert empty


def test_rows_errors():
    bf16 = ("bfloat16",)
    assert message(A.rows, np.zeros((512, 64, 2), BF16), bf16) == (
        "a_tensor.shape: got (512, 64, 2); allowed: (M, K, 1) or (M, K)")
    assert message(A.rows, np.zeros((300, 64), BF16), bf16) == (
        "a_tensor.shape[0]: got 300; allowed: a multiple of 256 (padded rows)")
    assert message(A.rows, np.zeros((384, 64, 1), BF16), bf16) == (  # 128-aligned is not enough
        "a_tensor.shape[0]: got 384; allowed: a multiple of 256 (padded rows)")
    assert message(A.rows, np.zeros((768, 64, 1), np.float32), bf16) == (
        "a_tensor.dtype: got float32; allowed: bfloat16")
    assert message(A.rows, np.zeros(512, BF16), bf16) == "a_tensor.shape: got (512,); allowed: 2-D or 3-D tensor"
    assert message(A.rows, None, bf16) == "a_tensor: got None; allowed: a tensor. a_tensor is required"


# ---------------------------------------------------------------- offsets and their values


def test_offsets_fields_and_dtypes():
    off, l = A.offsets(np.array([256, 256, 768], np.int32))
    assert l == 3 and off.shape == (3,) and off.dtype == "int32"
    assert A.offsets(np.zeros(A.MAX_EXPERTS, np.int32))[1] == 1024
    assert message(A.offsets, np.array([256], np.int64)) == "padded_offsets.dtype: got int64; allowed: int32"
    assert A.offsets(np.array([256], np.int64), dtypes=("int32", "int64"))[0].dtype == "int64"


def test_offsets_errors():
    assert message(A.offsets, np.zeros(0, np.int32)) == (
        "padded_offsets.shape: got (0,); allowed: (L,) with 1 <= L <= 1024")
    assert message(A.offsets, np.zeros(1025, np.int32)) == (
        "padded_offsets.shape: got (1025,); allowed: (L,) with 1 <= L <= 1024")
    assert message(A.offsets, np.zeros((2, 2), np.int32)) == "padded_offsets.shape: got (2, 2); allowed: 1-D tensor"
    assert message(A.offsets, None) == "padded_offsets: got None; allowed: a tensor. padded_offsets is required"


def test_offsets_values():
    assert A.offsets_values([256, 256, 768], 768) is None
    assert A.offsets_values([0, 0], 0) is None  # every expert empty
    assert message(A.offsets_values, [100, 256], 512) == (
        "padded_offsets[0]: got 100; allowed: nondecreasing multiples of 256 (previous end 0)")
    assert message(A.offsets_values, [512, 256, 512], 512) == (
        "padded_offsets[1]: got 256; allowed: nondecreasing multiples of 256 (previous end 512)")
    assert message(A.offsets_values, [-256], 512) == (
        "padded_offsets[0]: got -256; allowed: nondecreasing multiples of 256 (previous end 0)")
    assert message(A.offsets_values, [256, 1024], 768) == "padded_offsets[-1]: got 1024; allowed: <= 768 (rows of a_tensor)"


# ---------------------------------------------------------------- dense B


def test_dense_b_both_layouts():
    lnk = np.zeros((3, 16, 8), BF16)  # canonical (L, N, K), contiguous
    b = A.dense_b(lnk, 8, 3, ("bfloat16",))
    assert (b.n, b.canonical, b.strides, b.b.shape) == (16, True, (8, 1, 128), (3, 16, 8))
    nkl = np.transpose(lnk, (1, 2, 0))  # the kernel-facing (N, K, L) view
    b = A.dense_b(nkl, 8, 3, ("bfloat16",))
    assert (b.n, b.canonical, b.strides, b.b.shape) == (16, False, (8, 1, 128), (16, 8, 3))


def test_dense_b_n_equals_k_equals_l_is_decided_by_strides():
    lnk = np.zeros((4, 4, 4), BF16)  # strides (16, 4, 1): only the canonical reading has K unit-stride
    b = A.dense_b(lnk, 4, 4, ("bfloat16",))
    assert b.canonical and b.strides == (4, 1, 16)
    nkl = np.transpose(lnk, (1, 2, 0))  # strides (4, 1, 16): K unit-stride, L outermost
    b = A.dense_b(nkl, 4, 4, ("bfloat16",))
    assert not b.canonical and b.strides == (4, 1, 16)


def test_dense_b_errors():
    bf16 = ("bfloat16",)
    assert message(A.dense_b, np.zeros((16, 6, 3), BF16), 8, 3, bf16) == (
        "b_tensor.shape: got (16, 6, 3); allowed: (N, 8, 3) (kernel-facing) or (3, N, 8) (canonical), "
        "with K from a_tensor and L from padded_offsets")
    assert message(A.dense_b, np.zeros((16, 8, 2), BF16), 8, 3, bf16) == (  # K fits, L does not
        "b_tensor.shape: got (16, 8, 2); allowed: (N, 8, 3) (kernel-facing) or (3, N, 8) (canonical), "
        "with K from a_tensor and L from padded_offsets")
    assert message(A.dense_b, np.zeros((2, 16, 8), BF16), 8, 3, bf16) == (
        "b_tensor.shape: got (2, 16, 8); allowed: (N, 8, 3) (kernel-facing) or (3, N, 8) (canonical), "
        "with K from a_tensor and L from padded_offsets")
    assert message(A.dense_b, np.zeros((16, 8), BF16), 8, 1, bf16) == "b_tensor.shape: got (16, 8); allowed: 3-D tensor"
    assert message(A.dense_b, np.zeros((3, 16, 8), np.float16), 8, 3, bf16) == (
        "b_tensor.dtype: got float16; allowed: bfloat16")
    assert message(A.dense_b, None, 8, 3, bf16) == "b_tensor: got None; allowed: a tensor. b_tensor is required"


# ---------------------------------------------------------------- bias and outputs


def test_bias():
    v = A.bias(np.zeros((3, 32), BF16).T, 32, 3, ("bfloat16", "float32"))  # (N, L) with strides (1, N)
    assert v.shape == (32, 3) and v.strides == (1, 32)
    assert message(A.bias, np.zeros((3, 32), np.float32), 32, 3, ("float32",)) == (
        "bias_tensor.shape: got (3, 32); allowed: (32, 3) = (N, L)")
    assert message(A.bias, np.zeros(32, np.float32), 32, 1, ("float32",)) == (
        "bias_tensor.shape: got (32,); allowed: 2-D tensor")
    assert message(A.bias, np.zeros((32, 3), np.int32), 32, 3, ("bfloat16", "float32")) == (
        "bias_tensor.dtype: got int32; allowed: bfloat16, float32")


def test_output():
    assert A.output(np.zeros((256, 8), np.float32), "d_tensor", 256, 8, ("float32",)).shape == (256, 8)
    assert A.output(np.zeros((256, 8, 1), np.float32), "d_tensor", 256, 8, ("float32",)).shape == (256, 8, 1)
    assert message(A.output, np.zeros((256, 8, 2), np.float32), "d_tensor", 256, 8, ("float32",)) == (
        "d_tensor.shape: got (256, 8, 2); allowed: (256, 8, 1) = (M, N) or (M, N, 1)")
    assert message(A.output, np.zeros((256, 9), np.float32), "c_tensor", 256, 8, ("float32",)) == (
        "c_tensor.shape: got (256, 9); allowed: (256, 8) = (M, N) or (M, N, 1)")
    assert message(A.output, np.zeros((256, 8), np.float32), "c_tensor", 256, 16, ("float32",),
                   what="(M, 2N) or (M, 2N, 1)") == (
        "c_tensor.shape: got (256, 8); allowed: (256, 16) = (M, 2N) or (M, 2N, 1)")
    assert message(A.output, np.zeros((256, 8), np.float16), "d_tensor", 256, 8, ("bfloat16", "float32")) == (
        "d_tensor.dtype: got float16; allowed: bfloat16, float32")
    assert message(A.output, np.zeros(256, np.float32), "d_tensor", 256, 8, ("float32",)) == (
        "d_tensor.shape: got (256,); allowed: 2-D or 3-D tensor")
