"""JAX and CuPy arrays through the public wrappers (runtime/interop.py) on the GPU.

JAX arrays in give JAX arrays out (every dtype JAX holds: bfloat16, FP8, E8M0); CuPy arrays
mixed with torch operands are imported with the stream handshake. Inputs are produced by
asynchronous work right before each call (a JAX computation, a CuPy kernel on a side stream),
so a missing handshake shows up as wrong results. Outputs are compared with the numpy
references (fusegemm.output_compare rules).
"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import fusegemm  # noqa: E402
from fusegemm import reference  # noqa: E402
from fusegemm.output_compare import compare_outputs  # noqa: E402
from fusegemm.problems import make_batched_problem, make_grouped_problem  # noqa: E402
from jax_gpu import jax_on_gpu  # noqa: E402

pytestmark = pytest.mark.gpu


def _problem(op):
    """Canonical (row-major, contiguous) layouts: the only ones a JAX array can have."""
    if op == "gemm_amax":
        pb = make_batched_problem(m=200, n=256, k=256, batch=1, values="integer", seed=31, layout="canonical")
        return pb.kwargs()
    pb = make_grouped_problem(op, num_experts=3, tokens=[256, 0, 300], n=256, k=256, seed=31,
                              values="integer", layout="canonical",
                              **({} if op == "grouped_gemm" else {"d_dtype": "float8_e4m3fn"}))
    return pb.kwargs() if op == "grouped_gemm" else pb.kwargs(sf_vec_size=32)


@pytest.mark.parametrize("op", ["grouped_gemm", "grouped_gemm_srelu", "grouped_gemm_quant", "gemm_amax"])
def test_jax_arrays_in_jax_arrays_out(op):
    jax = jax_on_gpu()
    import jax.numpy as jnp
    kw = _problem(op)
    ref = getattr(reference, op)(**kw)
    # Each array comes out of an asynchronous JAX computation dispatched just before the call.
    jargs = {k: (jnp.copy(jnp.asarray(v)) if isinstance(v, np.ndarray) else v) for k, v in kw.items()}
    out = getattr(fusegemm, op)(**jargs)
    kinds = {k: type(v).__module__.split(".")[0] for k, v in out.items() if v is not None}
    assert set(kinds.values()) <= {"jax", "jaxlib"}, kinds
    err, problem = compare_outputs(ref, {k: (None if v is None else np.asarray(v)) for k, v in out.items()},
                                   exact=op != "grouped_gemm", rtol=1e-5)
    assert problem is None, (op, problem, err)
    assert all(isinstance(v, jax.Array) for v in out.values() if v is not None)


def test_jax_inputs_on_a_named_stream_and_dropped_right_after_the_call():
    """current_stream names a torch side stream: the handshake orders JAX's producers before it,
    the outputs after it; the inputs are dropped at once (fusegemm keeps them until the kernel
    has run) and their memory is reused by new JAX work."""
    jax_on_gpu()
    import jax.numpy as jnp
    kw = _problem("grouped_gemm")
    ref = reference.grouped_gemm(**kw)
    side = torch.cuda.Stream()
    out = fusegemm.grouped_gemm(**{k: (jnp.copy(jnp.asarray(v)) if isinstance(v, np.ndarray) else v)
                                   for k, v in kw.items()}, current_stream=side)
    churn = [jnp.ones((1 << 20,), jnp.float32) * i for i in range(16)]   # reuse freed JAX memory
    err, problem = compare_outputs(ref, {k: (None if v is None else np.asarray(v)) for k, v in out.items()},
                                   exact=False, rtol=1e-5)
    assert problem is None, (problem, err)
    del churn


def _cupy():
    cupy = pytest.importorskip("cupy")
    try:
        cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:   # noqa: BLE001
        pytest.skip(f"CuPy sees no GPU: {exc}")
    return cupy


def test_cupy_arguments_produced_on_a_side_stream():
    """alpha, padded_offsets and prob come from CuPy kernels queued on a busy CuPy stream right
    before the call: the import must wait for them (outputs stay torch: a_tensor is torch)."""
    cupy = _cupy()
    from fusegemm.output_compare import device_args
    kw = _problem("grouped_gemm")
    ref = reference.grouped_gemm(**kw)
    dev, keep = device_args(kw)
    s = cupy.cuda.Stream(non_blocking=True)
    with s:
        busy = cupy.ones((4096, 4096), cupy.float32)
        for _ in range(4):
            busy = busy @ busy * 1e-4               # keep the stream busy for a while
        for name in ("alpha_tensor", "padded_offsets", "prob_tensor"):
            host = np.asarray(kw[name])
            dev[name] = cupy.asarray(host) * 0 + cupy.asarray(host) + (busy[0, 0] * 0).astype(host.dtype)
        out = fusegemm.grouped_gemm(**dev)
    assert isinstance(out["d_tensor"], torch.Tensor)
    err, problem = compare_outputs(ref, out, exact=False, rtol=1e-5)
    assert problem is None, (problem, err)


def test_outputs_go_to_cupy_where_cupy_has_the_dtype():
    """The hand-over to CuPy (what a call whose a_tensor is a CuPy array returns): float32 C and
    amax of a real gemm_amax become CuPy arrays over the same memory, ordered after the kernel;
    an FP8 output, which CuPy 14 cannot hold, stays a torch tensor."""
    cupy = _cupy()
    from fusegemm.output_compare import device_args
    from fusegemm.runtime import interop
    kw = make_batched_problem(m=200, n=256, k=256, batch=2, values="integer", seed=31).kwargs()
    ref = reference.gemm_amax(**kw)
    dev, keep = device_args(kw)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        out = fusegemm.gemm_amax(**dev)
        fp8 = out["c_tensor"].to(torch.float8_e4m3fn)
        handed = interop._export(type(out)(c_tensor=out["c_tensor"], amax_tensor=out["amax_tensor"], fp8=fp8),
                                 "cupy", side)
    assert isinstance(handed["c_tensor"], cupy.ndarray) and isinstance(handed["amax_tensor"], cupy.ndarray)
    assert isinstance(handed["fp8"], torch.Tensor)
    assert handed["c_tensor"].data.ptr == out["c_tensor"].data_ptr()          # zero copy
    err, problem = compare_outputs(ref, {k: cupy.asnumpy(handed[k]) for k in ("c_tensor", "amax_tensor")},
                                   exact=True)
    assert problem is None, (problem, err)


def test_jax_jit_through_the_ffi_target():
    """fusegemm.jax_ffi.grouped_gemm inside jax.jit: XLA calls fusegemm's ctypes FFI handler on
    its stream; D (and C with bias) match the reference for two data sets through one compiled
    function; a refused argument surfaces as a JAX error carrying fusegemm's message."""
    jax = jax_on_gpu()
    import jax.numpy as jnp

    import fusegemm.jax_ffi as fj
    pb = make_grouped_problem("grouped_gemm", num_experts=3, tokens=[256, 0, 300], n=256, k=256, seed=33,
                              values="integer", layout="canonical", bias=True)
    f = jax.jit(lambda a, o, al, b, p, bias: fj.grouped_gemm(a, o, al, b, prob=p, bias=bias, generate_c=True,
                                                             c_dtype=jnp.float32))
    for scale in (1.0, 2.0):
        kw = pb.kwargs(generate_c=True, c_dtype="float32")
        kw["alpha_tensor"] = kw["alpha_tensor"] * scale
        ref = reference.grouped_gemm(**kw)
        bias_ln = np.ascontiguousarray(np.asarray(kw["bias_tensor"]).T)     # (L, N): the seed's (N, L) memory
        d, c = f(*(jnp.asarray(kw[k]) for k in ("a_tensor", "padded_offsets", "alpha_tensor", "b_tensor",
                                                 "prob_tensor")), jnp.asarray(bias_ln))
        err, problem = compare_outputs(ref, {"d_tensor": np.asarray(d), "c_tensor": np.asarray(c)},
                                       exact=False, rtol=1e-5)
        assert problem is None, (scale, problem, err)
    bad = jnp.zeros((256, 256), jnp.float16)
    with pytest.raises(Exception, match=r"fusegemm: a_tensor\.dtype: got float16"):
        g = jax.jit(lambda a, o, al, b: fj.grouped_gemm(a, o, al, b))
        jax.block_until_ready(g(bad, jnp.asarray([256], jnp.int32), jnp.ones(1), jnp.zeros((1, 128, 256), jnp.bfloat16)))
