"""Gathered A on the sm_90a blockwise FP8 kernel (``a_gather`` with ``sf_vec_size`` 128: problem row r
reads row ``a_index[r]`` of a token-major FP8 A and of its 1x128 scales, copied by the producer
warpgroup's cp.async; fusegemm/sm90/blockwise_promote.cuh) on the H200: every output bit-equal to
the same kernel run on the rows and scales gathered beforehand (zeros for padding indices, for
indices past A's rows and for negative ones), on ragged and empty experts, with FP8 and BF16 D,
paired gate/up epilogues and discrete weights. dSwiGLU's and dsReLU's dprob is an atomic FP32 sum
over column tiles (its order varies between runs): within 1e-5 of its largest magnitude."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from fusegemm.formats import blockwise_sfa_layout, quantize_1x128, quantize_128x128  # noqa: E402
from fusegemm.ops.engine import Op  # noqa: E402

pytestmark = pytest.mark.gpu

BW = {"sf_dtype": "float32", "sf_vec_size": 128}
CASES = [
    ("grouped_gemm_quant", {}),
    ("grouped_gemm_quant", {"d_dtype": "float8_e4m3fn"}),
    ("grouped_gemm_srelu", {"weight_mode": "discrete"}),
    ("grouped_gemm_dswiglu", {}),
    ("grouped_gemm_glu_mx", {"d_dtype": "bfloat16"}),
    # bf16 D rules whose 256-column tile shares A between its halves since 2026-12-06 (kShareA)
    ("grouped_gemm_glu_mx", {"d_dtype": "bfloat16", "generate_c": True}),
    ("grouped_gemm_dsrelu_mx", {}),
]


def _fp8(x):
    return torch.from_numpy(np.ascontiguousarray(x).view(np.uint8)).view(torch.float8_e4m3fn)


def _problem(seed, tokens=600, k=640, n=384, rows=(300, 0, 513, 1)):
    rng = np.random.default_rng(seed)
    aq, sa = quantize_1x128(rng.standard_normal((tokens, k)) * 3, "float8_e4m3fn")
    padded = [-(-r // 256) * 256 for r in rows]
    m = sum(padded) + 256                                   # rows past the last offset too
    idx = np.full(m, -1, dtype=np.int32)
    start = 0
    for r, p in zip(rows, padded):
        idx[start:start + r] = rng.integers(0, tokens, r)
        start += p
    idx[1], idx[2] = tokens + 5, -7                          # outside A: zeros, never a fault
    l = len(rows)
    bq, sb = quantize_128x128(rng.standard_normal((l, n, k)) * k ** -0.5, "float8_e4m3fn")
    valid = (idx >= 0) & (idx < tokens)
    rows_q = np.where(valid[:, None], aq[np.clip(idx, 0, tokens - 1)], aq.dtype.type(0))
    rows_s = np.where(valid[:, None], sa[np.clip(idx, 0, tokens - 1)], np.float32(0))
    dev = lambda t: t.cuda()   # noqa: E731
    return {"x": dev(_fp8(aq)), "sx": blockwise_sfa_layout(torch.from_numpy(sa).cuda()),
            "rows": dev(_fp8(rows_q)), "srows": blockwise_sfa_layout(torch.from_numpy(rows_s).cuda()),
            "idx": torch.from_numpy(idx).cuda(), "b": dev(_fp8(bq)), "sb": torch.from_numpy(sb).cuda(),
            "off": torch.tensor(padded, device="cuda").cumsum(0).to(torch.int32), "m": m, "n": n, "l": l}


def _inputs(spec, p, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    ins = {"alpha": torch.rand(p["l"], generator=g, device="cuda") + 0.5,
           "prob": torch.rand(p["m"], generator=g, device="cuda"), "norm_const": torch.full((1,), 0.5, device="cuda")}
    if spec == "grouped_gemm_dswiglu":
        ins["beta"] = torch.rand(p["l"], generator=g, device="cuda") + 0.5
        ins["c"] = torch.randn(p["m"], 2 * p["n"], generator=g, device="cuda").bfloat16()
    if spec == "grouped_gemm_dsrelu_mx":   # the forward's (M, N) pre-activation
        ins["c"] = torch.randn(p["m"], p["n"], generator=g, device="cuda").bfloat16()
    return ins


def _weights(p, axes):
    if axes.get("weight_mode") == "discrete":
        bs, sbs = list(p["b"].unbind(0)), [s.contiguous() for s in p["sb"].unbind(0)]
        return {"b_ptrs": torch.tensor([t.data_ptr() for t in bs], device="cuda"),
                "sfb_ptrs": torch.tensor([t.data_ptr() for t in sbs], device="cuda"), "n": p["n"]}, bs + sbs
    return {"b_tensor": p["b"], "sfb_tensor": p["sb"]}, []


@pytest.mark.parametrize("spec,axes", CASES)
def test_gathered_a_equals_pre_gathered_rows(spec, axes):
    p = _problem(seed=len(spec) + len(axes))
    ins = _inputs(spec, p, seed=7)
    w, keep = _weights(p, axes)
    ins = {k: v for k, v in ins.items() if k in {i.name for i in Op(spec, **BW, **axes).spec.epilogue.inputs}}
    gathered = Op(spec, a_gather=True, **BW, **axes)(p["x"], p["sx"], p["off"], a_index=p["idx"], inputs=ins, **w)
    plain = Op(spec, **BW, **axes)(p["rows"], p["srows"], p["off"], inputs=ins, **w)
    torch.cuda.synchronize()
    del keep
    assert set(gathered.keys()) == set(plain.keys())
    for name in plain.keys():
        got, want = gathered[name], plain[name]
        if got is None:
            assert want is None, name
        elif name == "dprob":
            scale = max(want.abs().max().item(), 1e-30)
            assert (got - want).abs().max().item() <= 1e-5 * scale, name
        else:
            assert torch.equal(got.view(torch.uint8) if got.dtype.itemsize == 1 else got,
                               want.view(torch.uint8) if want.dtype.itemsize == 1 else want), name


def test_an_index_with_an_op_built_without_gather_is_refused():
    from fusegemm.base.errors import ArgumentError
    p = _problem(seed=3)
    op = Op("grouped_gemm_quant", **BW)
    with pytest.raises(ArgumentError, match="a_index"):
        op(p["rows"], p["srows"], p["off"], p["b"], p["sb"], a_index=p["idx"], inputs={"alpha": torch.ones(
            p["l"], device="cuda")})
