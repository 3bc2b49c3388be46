"""fusegemm.Op, the one engine, on the GPU: a user's spec of each kernel class (BF16 grouped with a
column bias and a row scale; MXFP8 block-scaled with SFD quantization and amax; K-grouped) runs
through ``fusegemm.Op``, through its torch op (``fusegemm.torch_library.register``) under
``torch.compile(fullgraph=True)``, and through ``jax.jit`` (``fusegemm.jax_ffi.spec_op``); each
is checked against the numpy interpreter (``Op.reference``) and an independent formula, and the
three faces give the same bytes. ``execute`` writes the same bytes into caller outputs.

Exact-value problems (``values="integer"``: every product and partial sum is exact in FP32) make
the block-scaled comparisons bit-exact; the BF16 ones use random normal data and tolerances.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import fusegemm  # noqa: E402
from fusegemm.problems import make_grouped_problem  # noqa: E402
from jax_gpu import jax_on_gpu  # noqa: E402
from epilogue_inputs import epilogue_inputs  # noqa: E402  (tests/epilogue_inputs.py)
from op_helpers import same_outputs  # noqa: E402  (tests/gpu/op_helpers.py)

pytestmark = pytest.mark.gpu

DATA = Path(__file__).resolve().parents[1] / "data"
BF16_SPEC = (DATA / "user_gelu_bias.yaml").read_text()
MX_SPEC = (DATA / "user_srelu2_mx.yaml").read_text()

WGRAD_SPEC = """\
schema: 2
name: user_wgrad_scaled
kernel: grouped_gemm_wgrad
problem: kgrouped
summary: Weight gradient scaled per expert and by a global loss scale, stored in FP32 and BF16.
epilogue:
  inputs:
    alpha: {per: expert}
    loss_scale: {per: scalar}
  compute:
    - g = alpha * acc * loss_scale
  outputs:
    d: {dtype: d_dtype, value: g}
choices:
  ab_dtype: [bfloat16]
  d_dtype: [float32, bfloat16]
  tile_m: [64, 128]
  tile_n: [128, 256]
  cluster_m: [1]
  cluster_n: [1]
defaults: {d_dtype: float32, tile_m: 128, tile_n: 256, cluster_m: 1, cluster_n: 1}
prebuild: [{}]
"""


@pytest.fixture(scope="module")
def specs(tmp_path_factory):
    root = tmp_path_factory.mktemp("specs")
    out = {}
    for name, text in (("user_gelu_bias", BF16_SPEC), ("user_srelu2_mx", MX_SPEC), ("user_wgrad_scaled", WGRAD_SPEC)):
        path = root / f"{name}.yaml"
        path.write_text(text)
        out[name] = str(path)
    return out


def _same(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.tobytes() == b.tobytes()


def _faces(spec_path, name, operands, inputs, axes, jax_args=None):
    """(Op, its outputs, the torch op's under torch.compile(fullgraph=True), jax.jit's) as numpy.
    ``jax_args``: (operands, inputs) as host numpy arrays, in JAX's row-major layouts."""
    import fusegemm.torch_library as fg
    op = fusegemm.Op(spec_path, **axes)
    eager = {k: v.cpu().numpy() for k, v in op(*operands, inputs=inputs).items()}
    face = fg.register(spec_path, name=name, **axes)
    compiled = torch.compile(lambda *xs: face(*xs, inputs=inputs), fullgraph=True)
    traced = {k: v.cpu().numpy() for k, v in compiled(*operands).items()}
    try:
        jax = jax_on_gpu()
    except pytest.skip.Exception:
        return op, eager, traced, None
    import jax.numpy as jnp

    from fusegemm.jax_ffi import spec_op
    f = spec_op(spec_path, **axes)
    jops = [jnp.asarray(x) for x in jax_args[0]]
    jins = {k: (v if isinstance(v, (int, float)) else jnp.asarray(v)) for k, v in jax_args[1].items()}
    jaxed = {k: np.asarray(v) for k, v in jax.jit(lambda *xs: f(*xs, inputs=jins))(*jops).items()}
    return op, eager, traced, jaxed


def _np(t):
    """A CPU torch tensor as numpy, bfloat16 as ml_dtypes'."""
    import ml_dtypes
    if t.dtype == torch.bfloat16:
        return t.contiguous().view(torch.uint16).numpy().view(ml_dtypes.bfloat16)
    return t.contiguous().numpy()


def test_bf16_user_spec_with_column_bias_and_row_scale(specs):
    g = torch.Generator().manual_seed(7)
    tokens, n, k = [256, 0, 512], 384, 256
    l, m = len(tokens), sum(tokens)
    a = torch.randn(m, k, generator=g).to(torch.bfloat16)
    b = torch.randn(l, n, k, generator=g).to(torch.bfloat16) * 0.1
    off = torch.tensor(np.cumsum(tokens), dtype=torch.int32)
    alpha = torch.tensor([0.5, 2.0, 1.25])
    bias_ln = torch.randn(l, n, generator=g).to(torch.bfloat16)
    row_scale = torch.rand(m, generator=g) + 0.5
    cuda = [x.cuda() for x in (a, off, b)]
    inputs = {"row_scale": row_scale.cuda(), "bias": bias_ln.cuda().t(), "alpha": alpha.cuda()}
    op, eager, traced, jaxed = _faces(specs["user_gelu_bias"], "t_gpu_gelu_bias", cuda, inputs, {},
                                      jax_args=([_np(a), _np(off), _np(b)],
                                                {"row_scale": _np(row_scale), "bias": _np(bias_ln),
                                                 "alpha": _np(alpha)}))
    assert _same(eager["d"], traced["d"])
    if jaxed is not None:
        # JAX takes the bias as (L, N) rows (the (N, L) N-contiguous view of the same memory).
        assert _same(eager["d"], jaxed["d"])
    ref = op.reference(a, off, b, inputs={"row_scale": row_scale, "bias": bias_ln.t(), "alpha": alpha})["d"]
    np.testing.assert_allclose(eager["d"], ref, rtol=2e-5, atol=2e-5)
    # Independent: torch float64 over the bf16 operands, GELU-tanh spelled out.
    want = torch.zeros(m, n, dtype=torch.float64)
    start = 0
    for e, end in enumerate(off.tolist()):
        x = a[start:end].double() @ b[e].double().t() * float(alpha[e]) + bias_ln[e].double()
        gl = 0.5 * x * (1 + torch.tanh(0.7978845608028654 * (x + 0.044715 * x ** 3)))
        want[start:end] = gl * row_scale[start:end, None].double()
        start = end
    np.testing.assert_allclose(eager["d"], want.numpy(), rtol=1e-4, atol=1e-4)


def _mx_problem():
    pb = make_grouped_problem("grouped_gemm_srelu", num_experts=3, tokens=[256, 0, 300], n=256, k=256, seed=11,
                              values="integer", layout="canonical")
    return pb, pb.kwargs(sf_vec_size=32)


def _torch_of(x):
    import ml_dtypes
    if x.dtype == ml_dtypes.float8_e4m3fn:
        return torch.from_numpy(np.array(x.view(np.uint8))).view(torch.float8_e4m3fn)
    if x.dtype == ml_dtypes.float8_e8m0fnu:
        return torch.from_numpy(np.array(x.view(np.uint8)))
    return torch.from_numpy(np.array(x))


def test_mxfp8_user_spec_with_sfd_and_amax(specs):
    pb, kw = _mx_problem()
    host = [_torch_of(kw[nm]) for nm in ("a_tensor", "sfa_tensor", "padded_offsets", "b_tensor", "sfb_tensor")]
    inputs = {"prob": _torch_of(kw["prob_tensor"]).reshape(-1).cuda(), "alpha": _torch_of(kw["alpha_tensor"]).cuda(),
              "norm_const": torch.full((1,), 0.5, device="cuda")}
    jax_ops = [np.asarray(kw[nm]) for nm in ("a_tensor", "sfa_tensor", "padded_offsets", "b_tensor", "sfb_tensor")]
    jax_ins = {"prob": np.asarray(kw["prob_tensor"]).reshape(-1), "alpha": np.asarray(kw["alpha_tensor"]),
               "norm_const": np.full((1,), 0.5, np.float32)}
    op, eager, traced, jaxed = _faces(specs["user_srelu2_mx"], "t_gpu_srelu2_mx", [x.cuda() for x in host],
                                      inputs, {}, jax_args=(jax_ops, jax_ins))
    for name in ("d", "sfd_row", "amax"):
        assert _same(eager[name], traced[name]), name
        if jaxed is not None:
            assert _same(eager[name], jaxed[name].reshape(eager[name].shape)), name
    ref = op.reference(*host, inputs={k: v.cpu() for k, v in inputs.items()})
    valid = int(np.asarray(kw["padded_offsets"])[-1])
    assert _same(eager["d"][:valid], ref["d"][:valid]) and _same(eager["amax"], ref["amax"])
    # Independent: the per-expert amax of prob * relu(alpha * acc)^4 from the float64 product.
    from fusegemm.formats import dequantize_blockwise, unpack_sf
    rows, k = kw["a_tensor"].shape
    a = dequantize_blockwise(kw["a_tensor"], unpack_sf(kw["sfa_tensor"], rows, k // 32)[:, :, 0], sf_vec_size=32)
    off = np.asarray(kw["padded_offsets"], dtype=np.int64)
    start, amax = 0, []
    for e, end in enumerate(off):
        if end == start:
            amax.append(-np.inf)
            continue
        be = kw["b_tensor"][e]
        bq = dequantize_blockwise(be, unpack_sf(kw["sfb_tensor"], be.shape[0], be.shape[1] // 32, l=off.size)[:, :, e],
                                  sf_vec_size=32)
        acc = (a[start:end].astype(np.float64) @ bq.astype(np.float64).T).astype(np.float32)
        r = np.maximum(acc * np.asarray(kw["alpha_tensor"])[e], 0).astype(np.float64)
        amax.append(np.abs(r ** 4 * np.asarray(kw["prob_tensor"]).reshape(-1)[start:end, None]).max())
        start = int(end)
    np.testing.assert_allclose(eager["amax"].reshape(-1), np.float32(amax), rtol=1e-6)

    # execute() into caller outputs: the same bytes (amax reset on the stream first).
    outs = {k: torch.empty_like(torch.from_numpy(v)).cuda() for k, v in eager.items()}
    outs["amax"].fill_(123.0)
    op.execute(*[x.cuda() for x in host], inputs=inputs, outputs=outs)
    torch.cuda.synchronize()
    for name in ("d", "sfd_row", "amax"):
        got = outs[name].cpu().numpy()
        assert _same(got[:valid] if name == "d" else got, eager[name][:valid] if name == "d" else eager[name]), name


def test_kgrouped_user_spec(specs):
    g = torch.Generator().manual_seed(3)
    tokens, m, n = [512, 0, 256], 256, 384
    t, l = sum(tokens), len(tokens)
    dy = torch.randn(t, m, generator=g).to(torch.bfloat16)
    x = torch.randn(t, n, generator=g).to(torch.bfloat16)
    off = torch.tensor(np.cumsum(tokens), dtype=torch.int32)
    alpha = torch.tensor([1.0, 3.0, 0.25])
    inputs = {"alpha": alpha.cuda(), "loss_scale": 0.125}
    op, eager, traced, jaxed = _faces(specs["user_wgrad_scaled"], "t_gpu_wgrad_scaled",
                                      [v.cuda() for v in (dy, x, off)], inputs, {},
                                      jax_args=([_np(dy), _np(x), _np(off)], {"alpha": _np(alpha), "loss_scale": 0.125}))
    assert eager["d"].shape == (l, m, n)
    assert _same(eager["d"], traced["d"])
    if jaxed is not None:
        assert _same(eager["d"], jaxed["d"])
    ref = op.reference(dy, x, off, inputs={"alpha": alpha, "loss_scale": 0.125})["d"].reshape(l, m, n)
    np.testing.assert_allclose(eager["d"], ref, rtol=1e-5, atol=1e-5)
    start = 0
    for e, end in enumerate(off.tolist()):
        want = (dy[start:end].double().t() @ x[start:end].double()) * float(alpha[e]) * 0.125
        np.testing.assert_allclose(eager["d"][e], want.numpy(), rtol=1e-4, atol=1e-3)
        start = end


def test_registered_op_passes_opcheck(specs):
    import fusegemm.torch_library as fg
    face = fg.register(specs["user_wgrad_scaled"], name="t_gpu_opcheck")
    g = torch.Generator(device="cuda").manual_seed(1)
    dy = torch.randn(512, 128, generator=g, device="cuda").to(torch.bfloat16)
    x = torch.randn(512, 256, generator=g, device="cuda").to(torch.bfloat16)
    off = torch.tensor([256, 512], dtype=torch.int32, device="cuda")
    res = torch.library.opcheck(face.op.default, (dy, x, off), {"alpha": torch.ones(2, device="cuda"),
                                                                "loss_scale": torch.ones(1, device="cuda")})
    assert all(v == "SUCCESS" for v in res.values()), res


# ---------------------------------------------------------------- the host fast path on the device
def _memo_case(spec, seed):
    """(axes, operands, inputs) on the GPU for one spec of each kernel class; number inputs as
    Python floats (their device copy is memoised with the pattern)."""
    from fusegemm.output_compare import device_args
    from fusegemm.problems import make_batched_problem
    g = torch.Generator(device="cuda").manual_seed(seed)
    dev = "cuda"
    if spec == "grouped_gemm_dswiglu_bf16":
        axes, m, n, l = {}, 512, 128, 2
        operands = (torch.randn(m, 64, generator=g, device=dev).bfloat16(),
                    torch.tensor([256, 512], dtype=torch.int32, device=dev),
                    torch.randn(l, n, 64, generator=g, device=dev).bfloat16())
    elif spec == "grouped_gemm_wgrad":
        axes, m, n, l = {}, 512, 64, 2
        operands = (torch.randn(m, 128, generator=g, device=dev).bfloat16(),
                    torch.randn(m, n, generator=g, device=dev).bfloat16(),
                    torch.tensor([256, 512], dtype=torch.int32, device=dev))
    elif spec == "grouped_gemm_srelu":
        axes, n, l = {"d_dtype": "float8_e4m3fn"}, 256, 3
        pb = make_grouped_problem(spec, num_experts=3, tokens=[256, 0, 300], n=n, k=256, values="integer",
                                  d_dtype="float8_e4m3fn", seed=seed)
        kw, _ = device_args(pb.kwargs(sf_vec_size=32))
        operands = tuple(kw[x] for x in ("a_tensor", "sfa_tensor", "padded_offsets", "b_tensor", "sfb_tensor"))
        m = kw["a_tensor"].shape[0]
    else:
        axes, m, n, l = {}, 200, 264, 3
        kw, _ = device_args(make_batched_problem(m=m, n=n, k=320, batch=l, values="integer", seed=seed).kwargs())
        operands = tuple(kw[x] for x in ("a_tensor", "b_tensor", "sfa_tensor", "sfb_tensor"))
    return axes, operands, epilogue_inputs(fusegemm.Op(spec, **axes), m, n, l, g)


@pytest.mark.parametrize("spec", ["grouped_gemm_dswiglu_bf16", "grouped_gemm_srelu", "grouped_gemm_wgrad",
                                  "gemm_amax"])
def test_memoised_calls_give_the_bytes_of_a_fresh_op(spec):
    """Op's host fast path on the device, one spec per kernel class: a second call of a pattern
    (other tensors, other addresses), 8 threads calling one op on their own streams, and execute
    into moved outputs give the bytes a fresh op's full validation gives."""
    import threading
    cases = [_memo_case(spec, seed) for seed in range(9)]
    axes = cases[0][0]
    want = [fusegemm.Op(spec, **axes)(*ops, inputs=ins) for _, ops, ins in cases]
    op = fusegemm.Op(spec, **axes)
    op(*cases[0][1], inputs=cases[0][2])
    same_outputs(op(*cases[1][1], inputs=cases[1][2]), want[1], "second call")
    assert len(op._memo) == 1
    got, errors = [None] * 8, []
    streams = [torch.cuda.Stream() for _ in range(8)]
    torch.cuda.synchronize()

    def run(i):
        try:
            with torch.cuda.stream(streams[i]):
                for _ in range(6):
                    got[i] = op(*cases[i + 1][1], inputs=cases[i + 1][2])
            streams[i].synchronize()
        except BaseException as exc:   # noqa: BLE001 -- handed to the main thread
            errors.append(exc)

    workers = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert not errors, errors[0]
    for i in range(8):
        same_outputs(got[i], want[i + 1], f"thread {i}")
    moved = {k: torch.full_like(v, 3) for k, v in want[2].items()}
    if spec == "grouped_gemm_wgrad":
        moved = {k: v.view(-1, v.shape[-1]) for k, v in moved.items()}
    for _ in range(2):
        op.execute(*cases[2][1], inputs=cases[2][2], outputs=moved)
        moved = {k: v.clone() for k, v in moved.items()}
    torch.cuda.synchronize()
    if spec == "grouped_gemm_wgrad":
        moved = {k: v.view(want[2][k].shape) for k, v in moved.items()}
    # (Every row is below the last offset in these cases: execute writes all that __call__ returns.)
    same_outputs({k: moved[k] for k in want[2].keys()}, want[2], "execute, moved outputs")


def test_every_input_slot_on_the_device():
    """A spec reading every input slot of the ABI (four row, two column of two dtypes, three
    expert, two scalar inputs) on ragged experts: the kernel's D against the interpreter's."""
    op = fusegemm.Op(str(DATA / "user_wide_inputs.yaml"))
    g = torch.Generator(device="cuda").manual_seed(5)
    l, n, k = 3, 256, 192
    off = torch.tensor([256, 256, 768], dtype=torch.int32, device="cuda")
    m = 768
    a = torch.randn(m, k, generator=g, device="cuda").bfloat16()
    b = (torch.randn(l, n, k, generator=g, device="cuda") * k ** -0.5).bfloat16()
    ins = {name: torch.rand(l, generator=g, device="cuda") for name in ("alpha", "gamma", "beta")}
    ins.update({name: torch.rand(m, generator=g, device="cuda") for name in ("gate", "scale", "mask", "shift")})
    ins.update(bias=torch.rand(l, n, generator=g, device="cuda").bfloat16().t(),
               bias2=torch.rand(l, n, generator=g, device="cuda").t(), eps=0.25, tau=0.5)
    got = op(a, off, b, inputs=ins)["d"].cpu().numpy()
    want = op.reference(a, off, b, inputs=ins)["d"]
    scale = np.abs(want).max()
    assert np.max(np.abs(got - want)) <= 1e-4 * scale, np.max(np.abs(got - want)) / scale


def test_outputs_named_by_the_spec_on_the_device():
    """h (slot d, bf16) and pre (slot c, fp32) come back by their names, from __call__ and into
    caller buffers from execute, against the interpreter."""
    op = fusegemm.Op(str(DATA / "user_named_outputs.yaml"))
    g = torch.Generator(device="cuda").manual_seed(6)
    off = torch.tensor([256, 256, 768], dtype=torch.int32, device="cuda")
    a = torch.randn(768, 128, generator=g, device="cuda").bfloat16()
    b = (torch.randn(3, 256, 128, generator=g, device="cuda") * 128 ** -0.5).bfloat16()
    ins = {"alpha": torch.rand(3, generator=g, device="cuda")}
    out = op(a, off, b, inputs=ins)
    assert set(out.keys()) == {"h", "pre"}
    want = op.reference(a, off, b, inputs=ins)
    for name, tol in (("pre", 1e-5), ("h", 1e-2)):
        got = out[name].float().cpu().numpy()
        ref = np.asarray(want[name], dtype=np.float32)
        assert np.max(np.abs(got - ref)) <= tol * max(1.0, np.abs(ref).max()), name
    into = {"h": torch.empty_like(out["h"]), "pre": torch.empty_like(out["pre"])}
    op.execute(a, off, b, inputs=ins, outputs=into)
    assert torch.equal(into["h"], out["h"]) and torch.equal(into["pre"], out["pre"])


def _ragged_sums_problem(seed, n, k=192):
    """(generator, offsets, A, B, (L, N, M)) of the column-sum tests: four experts of 256, 0, 512
    and 256 rows (an empty one), N columns (a tail of the tile)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    l, m = 4, 1024
    off = torch.tensor([256, 256, 768, 1024], dtype=torch.int32, device="cuda")
    a = torch.randn(m, k, generator=g, device="cuda").bfloat16()
    b = (torch.randn(l, n, k, generator=g, device="cuda") * k ** -0.5).bfloat16()
    return g, off, a, b, (l, n, m)


def _check_column_sums(op, out, want, summed, operands, ins):
    """dbias against the interpreter's: sums of FP32 values in another order, within 1e-5 of each
    column's absolute sum (``summed``: the values summed, per row); the empty expert's are 0;
    ``execute`` into a dbias holding garbage resets it first."""
    vals = np.abs(np.asarray(summed, dtype=np.float64))
    bound = np.stack([vals[s:t].sum(axis=0) for s, t in ((0, 256), (256, 256), (256, 768), (768, 1024))])
    got = out["dbias"].cpu().numpy()
    assert np.all(np.abs(got - want["dbias"]) <= 1e-5 * bound + 1e-30), np.max(np.abs(got - want["dbias"]) - 1e-5 * bound)
    assert np.all(got[1] == 0)      # the empty expert
    into = {k: torch.full_like(v, 7.0) for k, v in out.items()}     # every output, garbage first
    op.execute(*operands, inputs=ins, outputs=into)
    assert np.all(np.abs(into["dbias"].cpu().numpy() - want["dbias"]) <= 1e-5 * bound + 1e-30)


@pytest.mark.parametrize("axes", [{}, {"tile_m": 128, "cluster_m": 1, "d_dtype": "float32"}, {"tile_m": 64, "cluster_m": 1}])
def test_a_column_sum_on_the_device(axes):
    """dsReLU with dbias (the column sums of dC over each expert's rows, scope: column), ragged
    experts with an empty one and an N tail: D and dbias against the interpreter; execute
    resets dbias itself (its buffer holds garbage before the call)."""
    op = fusegemm.Op(str(DATA / "user_dbias.yaml"), **axes)
    g, off, a, b, (l, n, m) = _ragged_sums_problem(8, 136)
    ins = {"alpha": torch.rand(l, generator=g, device="cuda"), "prob": torch.rand(m, generator=g, device="cuda"),
           "c": torch.randn(m, n, generator=g, device="cuda").bfloat16()}
    out = op(a, off, b, inputs=ins)
    want = op.reference(a, off, b, inputs=ins)
    d_ref = np.asarray(want["d"], dtype=np.float32)
    assert np.max(np.abs(out["d"].float().cpu().numpy() - d_ref)) <= 1e-2 * np.abs(d_ref).max()
    _check_column_sums(op, out, want, want.values["d"], (a, off, b), ins)


@pytest.mark.parametrize("axes", [{}, {"tile_m": 64, "cluster_m": 1}, {"tile_n": 128, "d_dtype": "float32"}])
def test_a_paired_column_sum_on_the_device(axes):
    """dGLU with dbias: a column sum of the paired output D, (L, 2N): each stored column (gate and
    up blocks interleaved) summed over each expert's rows, ragged experts with an empty one and an
    N tail; against the interpreter, and execute resets dbias itself."""
    op = fusegemm.Op("grouped_gemm_dglu", generate_dbias=True, **axes)
    g, off, a, b, (l, n, m) = _ragged_sums_problem(9, 160)
    ins = {"alpha": torch.rand(l, generator=g, device="cuda") + 0.5, "beta": torch.rand(l, generator=g, device="cuda"),
           "prob": torch.rand(m, generator=g, device="cuda"),
           "c": torch.randn(m, 2 * n, generator=g, device="cuda").bfloat16()}
    out = op(a, off, b, inputs=ins)
    want = op.reference(a, off, b, inputs=ins)
    assert out["dbias"].shape == (l, 2 * n) and np.asarray(want["dbias"]).shape == (l, 2 * n)
    _check_column_sums(op, out, want, want.out_values["d"], (a, off, b), ins)
