"""The block-scaled seed ops on the GPU against fusegemm.reference (seeds 000, 002, 003).

Inputs come from fusegemm.problems (seeded). ``exact=True`` problems hold integer FP8 values and
power-of-two scales, so every FP32 accumulation is exact in any order: C, D, the quantized bytes
and the SFD bytes must then match the reference bit for bit. Other problems are compared with
stated tolerances (relative to the largest reference magnitude).
"""
from __future__ import annotations

import numpy as np
import pytest

import fusegemm
from fusegemm import reference
from fusegemm.output_compare import compare_outputs, device_args
from fusegemm.problems import make_grouped_problem

pytestmark = pytest.mark.gpu

FP8 = ("float8_e4m3fn", "float8_e5m2")


def compare(ref, out, *, exact, rtol=1e-5, name=""):
    """fusegemm.output_compare's rules: quantized bytes always exact; other outputs exact or within
    ``rtol`` of the largest magnitude plus one bf16/fp16 ulp of the element."""
    err, problem = compare_outputs(ref, out, exact=exact, rtol=rtol)
    assert problem is None, (name, problem, err)


def integer_problem(op, **kw):
    """A problem whose FP8 values are small integers and scales 1 or 2 (every sum exact)."""
    return make_grouped_problem(op, values="integer", **kw)


def run(op, pb, **overrides):
    kw = pb.kwargs(sf_vec_size=32, **overrides)
    ref = getattr(reference, op)(**kw)
    dev, keep = device_args(kw)
    out = getattr(fusegemm, op)(**dev)
    return ref, out


@pytest.mark.parametrize("ab", FP8)
@pytest.mark.parametrize("d_dtype", ["bfloat16", "float8_e4m3fn"])
def test_srelu_exact(ab, d_dtype):
    pb = integer_problem("grouped_gemm_srelu", num_experts=4, tokens=[300, 0, 513, 200], n=384, k=320,
                         ab_dtype=ab, d_dtype=d_dtype, c_dtype="bfloat16", seed=1)
    ref, out = run("grouped_gemm_srelu", pb)
    compare(ref, out, exact=True, name=f"srelu {ab} {d_dtype}")


@pytest.mark.parametrize("d_dtype", ["bfloat16", "float8_e4m3fn"])
def test_quant_exact(d_dtype):
    pb = integer_problem("grouped_gemm_quant", num_experts=3, tokens=[256, 700, 100], n=256, k=256,
                         d_dtype=d_dtype, seed=2)
    ref, out = run("grouped_gemm_quant", pb)
    compare(ref, out, exact=True, name=f"quant {d_dtype}")


@pytest.mark.parametrize("d_dtype", FP8)
def test_dswiglu_exact(d_dtype):
    pb = integer_problem("grouped_gemm_dswiglu", num_experts=3, tokens=[256, 300, 0], n=256, k=256,
                         d_dtype=d_dtype, seed=3)
    ref, out = run("grouped_gemm_dswiglu", pb)
    compare(ref, out, exact=False, rtol=1e-5, name=f"dswiglu {d_dtype}")


def test_dswiglu_bfloat16_prob():
    """Seed 000 takes a bfloat16 prob: the kernel reads it as bf16 (prob_dtype variant)."""
    import dataclasses
    import ml_dtypes
    pb = integer_problem("grouped_gemm_dswiglu", num_experts=2, tokens=[256, 300], n=128, k=256,
                         d_dtype="float8_e4m3fn", seed=19)
    pb = dataclasses.replace(pb, prob_tensor=np.asarray(pb.prob_tensor).astype(ml_dtypes.bfloat16))
    ref, out = run("grouped_gemm_dswiglu", pb)
    compare(ref, out, exact=False, rtol=1e-5, name="dswiglu bf16 prob")


def test_srelu_realistic_values():
    pb = make_grouped_problem("grouped_gemm_srelu", num_experts=8, tokens=4000, n=1024, k=2048,
                              values="realistic", skew="skewed", d_dtype="bfloat16", seed=4)
    ref, out = run("grouped_gemm_srelu", pb)
    # K = 2048 FP32 sums in different orders: 1e-4 of the largest magnitude (NVIDIA's tests: atol
    # 0.1, rtol 0.01), plus one ulp of bf16 C / D.
    compare(ref, out, exact=False, rtol=1e-4, name="srelu realistic")


def test_srelu_discrete_weights_exact():
    pb = integer_problem("grouped_gemm_srelu", num_experts=3, tokens=[256, 100, 0], n=256, k=256,
                         d_dtype="float8_e4m3fn", discrete=True, seed=5)
    ref, out = run("grouped_gemm_srelu", pb, discrete_col_sfd=True)
    compare(ref, out, exact=True, name="srelu discrete")


@pytest.mark.parametrize("layout", ["kernel", "canonical"])
def test_single_expert_and_layouts(layout):
    pb = integer_problem("grouped_gemm_quant", num_experts=1, tokens=[512], n=512, k=384,
                         d_dtype="bfloat16", layout=layout, seed=6)
    ref, out = run("grouped_gemm_quant", pb)
    compare(ref, out, exact=True, name=f"quant L=1 {layout}")


def test_many_experts_mostly_empty():
    tokens = [0] * 300
    for e, t in ((3, 100), (150, 256), (299, 40)):
        tokens[e] = t
    pb = integer_problem("grouped_gemm_srelu", num_experts=300, tokens=tokens, n=128, k=128,
                         d_dtype="float8_e4m3fn", seed=7)
    ref, out = run("grouped_gemm_srelu", pb)
    compare(ref, out, exact=True, name="srelu L=300")


@pytest.mark.parametrize("n", [32, 64, 8 * 37])
def test_narrow_and_ragged_n(n):
    pb = integer_problem("grouped_gemm_srelu", num_experts=2, tokens=[256, 200], n=n, k=256,
                         d_dtype="bfloat16", seed=8)
    ref, out = run("grouped_gemm_srelu", pb)
    compare(ref, out, exact=True, name=f"srelu N={n}")


def test_srelu_bias():
    pb = integer_problem("grouped_gemm_srelu", num_experts=3, tokens=[256, 300, 50], n=256, k=256,
                         d_dtype="float8_e4m3fn", bias=True, seed=9)
    ref, out = run("grouped_gemm_srelu", pb)
    compare(ref, out, exact=True, name="srelu bias")


def test_quant_bias_row_scale_no_prob_e5m2_nvidia():
    pb = integer_problem("grouped_gemm_quant", num_experts=2, tokens=[256, 256], n=256, k=256,
                         ab_dtype="float8_e5m2", d_dtype="float8_e5m2", bias=True, seed=10)
    kw = dict(row_scale_tensor=np.full(pb.valid_m, 2.0, np.float32), e5m2_rcp_max="nvidia")
    ref, out = run("grouped_gemm_quant", pb, prob_tensor=None, **kw)
    compare(ref, out, exact=True, name="quant e5m2 nvidia")


def test_srelu_tanh_clamp():
    # tanh.approx differs from the reference's correctly rounded tanh by up to 7.7e-6 absolute
    # (seed 002): bf16 D within one ulp plus 2 s^2 * 7.7e-6 of the largest value.
    pb = make_grouped_problem("grouped_gemm_srelu", num_experts=2, tokens=[256, 300], n=256, k=256,
                              values="realistic", d_dtype="bfloat16", seed=11)
    ref, out = run("grouped_gemm_srelu", pb, tanh_clamp_scale=4.0)
    compare(ref, out, exact=False, rtol=2 * 16 * 7.7e-6, name="srelu tanh clamp")


def test_nan_and_inf_inputs_propagate():
    import dataclasses
    pb = integer_problem("grouped_gemm_srelu", num_experts=2, tokens=[256, 256], n=128, k=128,
                         d_dtype="bfloat16", seed=12)
    a = np.array(pb.a_tensor)
    a[3, 5, 0] = np.nan
    a[300, 7, 0] = np.inf
    pb = dataclasses.replace(pb, a_tensor=a)
    ref, out = run("grouped_gemm_srelu", pb)
    compare(ref, out, exact=True, name="srelu NaN/Inf")


CLASS_OF = {"grouped_gemm_srelu": "GroupedGemmSrelu", "grouped_gemm_quant": "GroupedGemmQuant",
            "grouped_gemm_dswiglu": "GroupedGemmDswiglu"}


@pytest.mark.parametrize("op,d_dtype", [("grouped_gemm_srelu", "float8_e4m3fn"), ("grouped_gemm_quant", "bfloat16"),
                                        ("grouped_gemm_dswiglu", "float8_e4m3fn")])
def test_class_api_writes_what_the_wrapper_returns(op, d_dtype):
    """check_support -> compile -> execute into caller outputs (pre-filled with garbage: amax
    and dprob must be reset) gives the wrapper's bytes, twice."""
    import torch
    pb = integer_problem(op, num_experts=3, tokens=[256, 0, 300], n=256, k=256, d_dtype=d_dtype, seed=17)
    kw = pb.kwargs(sf_vec_size=32)
    dev, keep = device_args(kw)
    want = getattr(fusegemm, op)(**dev)
    outs = {k: (torch.full_like(v.view(torch.uint8) if v.dtype.itemsize == 1 else v, 7).view(v.dtype)
                if v is not None else None) for k, v in want.items()}
    samples = {"sample_a": dev["a_tensor"], "sample_b": dev["b_tensor"], "sample_sfa": dev["sfa_tensor"],
               "sample_sfb": dev["sfb_tensor"]}
    if op == "grouped_gemm_srelu":
        samples.update(sample_c=want["c_tensor"], sample_d=want["d_tensor"])
    elif op == "grouped_gemm_quant":
        samples.update(sample_d=want["d_tensor"])
    else:
        samples.update(sample_c=dev["c_tensor"], sample_d_row=want["d_row_tensor"])
    cls = getattr(fusegemm, CLASS_OF[op])(**samples, sf_vec_size=32)
    assert cls.check_support()
    cls.compile()
    args = {k: v for k, v in dev.items() if k not in ("c_dtype", "d_dtype", "sf_vec_size")}
    for _ in range(2):
        cls.execute(**args, **{k: v for k, v in outs.items() if v is not None})
        for key, w in want.items():
            if w is None:
                continue
            got = outs[key]
            assert torch.equal(got.view(torch.uint8) if got.dtype.itemsize == 1 else got,
                               w.view(torch.uint8) if w.dtype.itemsize == 1 else w), (op, key)


def batched_integer_problem(**kw):
    """A seed 004 problem with integer FP8 values (every FP32 sum exact)."""
    from fusegemm.problems import make_batched_problem
    return make_batched_problem(values="integer", **kw)


@pytest.mark.parametrize("c_major,c_dtype", [("n", "float32"), ("m", "float32"), ("n", "bfloat16"),
                                             ("m", "float16")])
def test_gemm_amax_exact(c_major, c_dtype):
    pb = batched_integer_problem(m=200, n=264, k=320, batch=3, c_dtype=c_dtype, seed=14)
    kw = pb.kwargs(c_major=c_major)
    ref = reference.gemm_amax(**kw)
    dev, keep = device_args(kw)
    out = fusegemm.gemm_amax(**dev)
    compare(ref, out, exact=True, name=f"gemm_amax {c_major} {c_dtype}")
    assert tuple(out["c_tensor"].stride()) == tuple(s // np.asarray(ref["c_tensor"]).itemsize
                                                   for s in np.asarray(ref["c_tensor"]).strides)


@pytest.mark.parametrize("c_major", ["n", "m"])
def test_gemm_amax_class_writes_what_the_wrapper_returns(c_major):
    import torch
    pb = batched_integer_problem(m=200, n=264, k=320, batch=2, seed=18)
    dev, keep = device_args(pb.kwargs())
    want = fusegemm.gemm_amax(**dev, c_major=c_major)
    c = torch.full_like(want["c_tensor"], 7.0)          # same strides: the op's memory order
    amax = torch.full((1, 1, 1), 7.0, device="cuda")
    op = fusegemm.GemmAmax(dev["a_tensor"], dev["b_tensor"], dev["sfa_tensor"], dev["sfb_tensor"], c, amax)
    assert op.check_support()
    op.compile()
    for _ in range(2):   # amax is reset each time, not accumulated across calls
        op.execute(dev["a_tensor"], dev["b_tensor"], dev["sfa_tensor"], dev["sfb_tensor"], c, amax)
        assert torch.equal(c, want["c_tensor"]) and torch.equal(amax, want["amax_tensor"])


def test_gemm_amax_single_batch_2d_e5m2():
    pb = batched_integer_problem(m=128, n=128, k=128, batch=1, ab_dtype="float8_e5m2", seed=15,
                                 layout="canonical")
    kw = pb.kwargs()
    ref = reference.gemm_amax(**kw)
    dev, keep = device_args(kw)
    compare(ref, fusegemm.gemm_amax(**dev), exact=True, name="gemm_amax 2-D e5m2")


def _sanitize_main() -> None:
    """One small launch per op, for compute-sanitizer (memcheck, racecheck, synccheck)."""
    for op, d_dtype in (("grouped_gemm_srelu", "float8_e4m3fn"), ("grouped_gemm_quant", "bfloat16"),
                        ("grouped_gemm_dswiglu", "float8_e4m3fn")):
        pb = integer_problem(op, num_experts=2, tokens=[256, 100], n=128, k=192, d_dtype=d_dtype, seed=13)
        ref, out = run(op, pb)
        compare(ref, out, exact=op != "grouped_gemm_dswiglu", rtol=1e-5, name=f"sanitize {op}")
        print(f"sanitize {op}: ok")
    pb = batched_integer_problem(m=130, n=128, k=128, batch=2, seed=16)
    kw = pb.kwargs()
    dev, keep = device_args(kw)
    compare(reference.gemm_amax(**kw), fusegemm.gemm_amax(**dev), exact=True, name="sanitize gemm_amax")
    print("sanitize gemm_amax: ok")


if __name__ == "__main__":
    _sanitize_main()
