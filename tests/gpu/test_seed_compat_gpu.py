"""The seed-compatibility surface on the GPU (tests/unit/test_seed_compat.py checks it on the CPU):
``vector_f32=True``, ``torch.float4_e2m1fn_x2`` outputs and seed 002's discrete class mode, each as
two spellings of one call compared byte for byte. On sm_90a ``vector_f32`` runs the scalar kernel
(the check is that the option goes through end to end); on sm_100a it compares the packed-FP32
epilogue with the scalar one, which must give the same bits.
"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from fusegemm import compat  # noqa: E402
from fusegemm.problems import make_grouped_problem  # noqa: E402

pytestmark = pytest.mark.gpu

_BYTES = ("float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu")


def _t(x):
    """A numpy argument as a CUDA tensor in the same memory order (FP8 / bf16 through their bytes)."""
    if not isinstance(x, np.ndarray):
        return x
    name = x.dtype.name
    if name in _BYTES:
        t = torch.from_numpy(np.array(x.view(np.uint8))).view(getattr(torch, name))
    elif name == "bfloat16":
        t = torch.from_numpy(np.array(x.view(np.uint16))).view(torch.bfloat16)
    else:
        t = torch.from_numpy(np.array(x))
    return t.cuda()


def _dev(kw):
    """(device arguments, tensors the pointer tables point into)."""
    out, keep = {}, []
    for name, value in kw.items():
        if name in ("b_list", "sfb_list"):
            tensors = [_t(v) for v in value]
            keep += tensors
            out["b_ptrs" if name == "b_list" else "sfb_ptrs"] = torch.tensor([t.data_ptr() for t in tensors],
                                                                              dtype=torch.int64, device="cuda")
        else:
            out[name] = _t(value)
    return out, keep


def _bytes(t):
    return t.contiguous().view(-1).view(torch.uint8)


def _same(a, b):
    torch.cuda.synchronize()
    keys = list(a.keys())
    assert keys == list(b.keys())
    for k in keys:
        x, y = a[k], b[k]
        assert (x is None) == (y is None), k
        if x is not None:
            assert tuple(x.shape) == tuple(y.shape), (k, x.shape, y.shape)
            assert torch.equal(_bytes(x), _bytes(y)), f"{k}: the bytes differ"


@pytest.mark.parametrize("family,d_dtype", [("grouped_gemm_srelu", "bfloat16"), ("grouped_gemm_srelu", "float8_e4m3fn"),
                                            ("grouped_gemm_quant", "bfloat16"), ("grouped_gemm_dswiglu", "float8_e4m3fn")])
def test_vector_f32_gives_the_same_bytes(family, d_dtype):
    pb = make_grouped_problem(family, num_experts=3, tokens=[256, 300, 0], n=256, k=256, d_dtype=d_dtype, seed=11)
    dev, keep = _dev(pb.kwargs(sf_vec_size=32))
    wrapper = getattr(compat, f"{family}_wrapper_sm100")
    _same(wrapper(**dev), wrapper(**dev, vector_f32=True))
    del keep


def test_bf16_vector_f32_gives_the_same_bytes():
    pb = make_grouped_problem("grouped_gemm", num_experts=3, tokens=[256, 300, 0], n=256, k=256, bias=True, seed=12)
    dev, keep = _dev(pb.kwargs())
    _same(compat.grouped_gemm_wrapper_sm100(**dev, generate_c=True),
          compat.grouped_gemm_wrapper_sm100(**dev, generate_c=True, vector_f32=True))
    del keep


def test_discrete_class_matches_the_discrete_wrapper():
    pb = make_grouped_problem("grouped_gemm_srelu", num_experts=3, tokens=[256, 300, 0], n=256, k=256,
                              d_dtype="float8_e4m3fn", discrete=True, seed=13)
    dev, keep = _dev(pb.kwargs(sf_vec_size=32, discrete_col_sfd=True))
    want = compat.grouped_gemm_srelu_wrapper_sm100(**dev)
    op = compat.GroupedGemmSreluSm100(sample_a=dev["a_tensor"], sample_sfa=dev["sfa_tensor"],
                                      sample_padded_offsets=dev["padded_offsets"], sample_d=want["d_tensor"],
                                      num_experts=3, b_shape=(256, 256), b_dtype=dev["a_tensor"].dtype,
                                      sf_vec_size=32, discrete_col_sfd=True)
    assert op.check_support()
    got = {k: (torch.zeros_like(v) if v is not None else None) for k, v in want.items()}
    op.execute(a_tensor=dev["a_tensor"], sfa_tensor=dev["sfa_tensor"], padded_offsets=dev["padded_offsets"],
               alpha_tensor=dev["alpha_tensor"], prob_tensor=dev["prob_tensor"],
               norm_const_tensor=dev["norm_const_tensor"], b_ptrs=dev["b_ptrs"], sfb_ptrs=dev["sfb_ptrs"],
               **{k: v for k, v in got.items() if v is not None})
    _same(want, got)
    del keep


def test_float4_d_spellings_and_class_outputs():
    """FP8 A/B with a packed FP4 D: the torch.float4_e2m1fn_x2 dtype argument, and a class writing
    into float4_e2m1fn_x2 output tensors, give the wrapper's bytes."""
    pb = make_grouped_problem("grouped_gemm_quant", num_experts=3, tokens=[256, 300, 0], n=256, k=256,
                              d_dtype="float4_e2m1fn_x2", seed=14)
    dev, keep = _dev(pb.kwargs(sf_vec_size=32))
    want = compat.grouped_gemm_quant_wrapper_sm100(**dev)
    _same(want, compat.grouped_gemm_quant_wrapper_sm100(**dict(dev, d_dtype=torch.float4_e2m1fn_x2)))
    d4 = torch.zeros_like(want["d_tensor"]).view(torch.float4_e2m1fn_x2)   # (torch fills no float4 tensor)
    op = compat.GroupedGemmQuantSm100(sample_a=dev["a_tensor"], sample_b=dev["b_tensor"], sample_d=d4,
                                      sample_sfa=dev["sfa_tensor"], sample_sfb=dev["sfb_tensor"], sf_vec_size=32)
    got = {"d_tensor": d4, "d_col_tensor": torch.zeros_like(want["d_col_tensor"]).view(torch.float4_e2m1fn_x2),
           "sfd_row_tensor": torch.zeros_like(want["sfd_row_tensor"]),
           "sfd_col_tensor": torch.zeros_like(want["sfd_col_tensor"])}
    op.execute(a_tensor=dev["a_tensor"], b_tensor=dev["b_tensor"], sfa_tensor=dev["sfa_tensor"],
               sfb_tensor=dev["sfb_tensor"], padded_offsets=dev["padded_offsets"], alpha_tensor=dev["alpha_tensor"],
               prob_tensor=dev["prob_tensor"], norm_const_tensor=dev["norm_const_tensor"], **got)
    _same({k: want[k] for k in got}, {k: v.view(torch.uint8) for k, v in got.items() if k.startswith("d")}
          | {k: got[k] for k in got if k.startswith("sfd")})
    del keep
