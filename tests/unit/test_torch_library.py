"""torch custom ops (fusegemm/torch_library.py) on CPU: registration, schema, and the fake
implementation's shapes/dtypes/strides (the real op runs in tests/gpu/test_torch_ops_gpu.py)."""
from __future__ import annotations

import numpy as np
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


# ---------------------------------------------------------------- block-scaled custom ops

def _fake_cuda(kw, mode):
    """The problem's arrays as fake CUDA tensors (same shapes, strides and dtypes)."""
    from fusegemm.output_compare import to_device
    out = {}
    for k, v in kw.items():
        t = to_device(v, "cpu")
        out[k] = (torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cuda")
                  if isinstance(t, torch.Tensor) else t)
    return out


SCALED_CASES = [
    ("grouped_gemm_srelu", dict(d_dtype="float8_e4m3fn"), "kernel"),
    ("grouped_gemm_srelu", dict(d_dtype="bfloat16", c_dtype="float32"), "canonical"),
    ("grouped_gemm_quant", dict(d_dtype="float8_e5m2"), "kernel"),
    ("grouped_gemm_quant", dict(d_dtype="bfloat16"), "canonical"),
    ("grouped_gemm_dswiglu", dict(d_dtype="float8_e4m3fn"), "kernel"),
    ("gemm_amax", dict(), "kernel"),
]


@pytest.mark.parametrize("op,opts,layout", SCALED_CASES)
def test_block_scaled_fakes_have_the_references_shapes(monkeypatch, op, opts, layout):
    """The fake implementation runs the eager wrapper without launching (dry_run) on fake CUDA
    tensors: every output's shape and dtype must equal the numpy reference's (an independent
    statement of the seed's layout); absent outputs are empty tensors."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from fusegemm import reference
    from fusegemm.problems import make_batched_problem, make_grouped_problem
    monkeypatch.setattr("fusegemm.ops.device.device_arch", lambda d: "sm_90a")   # no GPU here
    if op == "gemm_amax":
        kw = make_batched_problem(m=200, n=264, k=256, batch=2, values="integer", seed=3).kwargs()
    else:
        kw = make_grouped_problem(op, num_experts=3, tokens=[256, 0, 300], n=256, k=256, values="integer",
                                  layout=layout, seed=3, **opts).kwargs(sf_vec_size=32)
    ref = getattr(reference, op)(**kw)
    names = {"grouped_gemm_srelu": fg.SRELU_OUT, "grouped_gemm_quant": fg.QUANT_OUT,
             "grouped_gemm_dswiglu": fg.DSWIGLU_OUT, "gemm_amax": fg.AMAX_OUT}[op]
    dt = {k: getattr(torch, v) for k, v in kw.items() if k in ("c_dtype", "d_dtype")}
    with FakeTensorMode():
        f = _fake_cuda(kw, None)
        if op == "grouped_gemm_srelu":
            out = fg.grouped_gemm_srelu(f["a_tensor"], f["b_tensor"], f["sfa_tensor"], f["sfb_tensor"],
                                        f["padded_offsets"], f["alpha_tensor"], norm_const=f["norm_const_tensor"],
                                        prob=f["prob_tensor"], sf_vec_size=32, **dt)
        elif op == "grouped_gemm_quant":
            out = fg.grouped_gemm_quant(f["a_tensor"], f["sfa_tensor"], f["padded_offsets"], f["alpha_tensor"],
                                        f["b_tensor"], f["sfb_tensor"], norm_const=f["norm_const_tensor"],
                                        prob=f["prob_tensor"], sf_vec_size=32, **dt)
        elif op == "grouped_gemm_dswiglu":
            out = fg.grouped_gemm_dswiglu(f["a_tensor"], f["b_tensor"], f["c_tensor"], f["sfa_tensor"],
                                          f["sfb_tensor"], f["padded_offsets"], f["alpha_tensor"], f["beta_tensor"],
                                          f["prob_tensor"], norm_const=f["norm_const_tensor"], sf_vec_size=32, **dt)
        else:
            out = fg.gemm_amax(f["a_tensor"], f["b_tensor"], f["sfa_tensor"], f["sfb_tensor"], c_dtype=torch.float32)
    assert len(out) == len(names)
    for name, t in zip(names, out):
        r = ref[name]
        if r is None:
            assert t.shape == (0,) and t.dtype == torch.uint8, name
            continue
        r = np.asarray(r)
        assert tuple(t.shape) == r.shape, (name, tuple(t.shape), r.shape)
        assert str(t.dtype).removeprefix("torch.") == r.dtype.name, (name, t.dtype, r.dtype)
        assert t.device.type == "cuda"


def test_block_scaled_ops_are_functional():
    for name in ("grouped_gemm_srelu", "grouped_gemm_quant", "grouped_gemm_dswiglu", "gemm_amax"):
        schema = getattr(torch.ops.fusegemm, name).default._schema
        assert not any(arg.alias_info is not None for arg in schema.arguments), name


def _swiglu_operands():
    """(a, padded_offsets, b, inputs) of a SwiGLU spec call on CUDA tensors (fake ones inside a
    FakeTensorMode): 768 rows, K 256, three experts, N 1024 paired columns."""
    a = torch.empty((768, 256), dtype=torch.bfloat16, device="cuda")
    off = torch.empty((3,), dtype=torch.int32, device="cuda")
    b = torch.empty((3, 1024, 256), dtype=torch.bfloat16, device="cuda")
    return a, off, b, {"alpha": torch.empty((3,), device="cuda"), "prob": torch.empty((768,), device="cuda")}


@pytest.mark.parametrize("d_dtype,want", [
    ("bfloat16", {"d": ((768, 512), torch.bfloat16)}),
    ("float8_e4m3fn", {"d": ((768, 512), torch.uint8), "sfd_row": ((1, 6, 4, 32, 4, 4), torch.uint8)}),
])
def test_spec_op_fake_outputs(monkeypatch, d_dtype, want):
    """torch.ops.fusegemm.epilogue_gemm on the SwiGLU spec (N = 1024 paired columns -> D of 512;
    FP8 D as raw bytes with its SFD_row atoms, as EpilogueGemm returns them), traced on fake
    CUDA tensors without a GPU."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    monkeypatch.setattr("fusegemm.ops.device.device_arch", lambda d: "sm_90a")
    with FakeTensorMode():
        a, off, b, inputs = _swiglu_operands()
        if d_dtype != "bfloat16":
            inputs["norm_const"] = 0.01
        out = fg.epilogue_gemm("grouped_gemm_swiglu", a, off, b, inputs=inputs, d_dtype=d_dtype)
    assert {k: (tuple(v.shape), v.dtype) for k, v in out.items()} == want


def test_row_ends_reach_the_op_through_the_faces(monkeypatch):
    """``row_ends`` given to ``epilogue_gemm`` (its custom op) and to ``grouped_wgrad`` (the
    K-grouped op) reaches the engine's parser: traced on fake CUDA tensors, one of the wrong
    length is refused there, naming it; the right one traces."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from fusegemm.base.errors import ArgumentError
    monkeypatch.setattr("fusegemm.ops.device.device_arch", lambda d: "sm_90a")
    with FakeTensorMode():
        a, off, b, inputs = _swiglu_operands()
        good, bad = (torch.empty((n,), dtype=torch.int32, device="cuda") for n in (3, 2))
        fg.epilogue_gemm("grouped_gemm_swiglu", a, off, b, inputs=inputs, row_ends=good, d_dtype="bfloat16")
        with pytest.raises(ArgumentError, match=r"^row_ends.shape\[0\]: got 2; allowed: 3 \(one per expert"):
            fg.epilogue_gemm("grouped_gemm_swiglu", a, off, b, inputs=inputs, row_ends=bad, d_dtype="bfloat16")
        dy, x = (torch.empty((768, 256), dtype=torch.bfloat16, device="cuda") for _ in range(2))
        assert tuple(fg.grouped_wgrad(dy, x, off, "fusegemm", row_ends=good).shape) == (3, 256, 256)
        with pytest.raises(ArgumentError, match=r"^row_ends.shape\[0\]: got 2; allowed: 3 \(one per expert"):
            fg.grouped_wgrad(dy, x, off, "fusegemm", row_ends=bad)


def test_tail_reaches_the_engine_through_the_custom_op(monkeypatch):
    """``tail`` given to ``epilogue_gemm`` crosses its custom op's schema to the engine's call
    (traced on fake CUDA tensors; the engine's own tests show what it does with it): False where
    given, True by default."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    monkeypatch.setattr("fusegemm.ops.device.device_arch", lambda d: "sm_90a")
    seen, engine_op = [], fg._epilogue_op

    class Recording:   # the engine's op, its calls' tail noted
        def __init__(self, *args):
            self.op = engine_op(*args)

        def __getattr__(self, name):
            return getattr(self.op, name)

        def __call__(self, *a, **kw):
            seen.append(kw.get("tail"))
            return self.op(*a, **kw)
    monkeypatch.setattr(fg, "_epilogue_op", Recording)
    with FakeTensorMode():
        a, off, b, inputs = _swiglu_operands()
        fg.epilogue_gemm("grouped_gemm_swiglu", a, off, b, inputs=inputs, d_dtype="bfloat16", tail=False)
        fg.epilogue_gemm("grouped_gemm_swiglu", a, off, b, inputs=inputs, d_dtype="bfloat16")
    assert seen == [False, True], seen


def test_spec_op_names_its_inputs_one_to_one():
    with pytest.raises(ValueError, match="input_names: got 2 names for 1 tensors"):
        fg._epilogue_call("grouped_gemm_swiglu", "{}", torch.empty(1), None, None, None, None, "alpha,prob",
                          [torch.empty(1)], True)


def test_faces_call_the_engine_directly_only_where_the_dispatcher_adds_nothing():
    """epilogue_gemm and a registered spec's face skip their custom op (0.4 ms of host time a call)
    only for plain CUDA tensors outside torch.compile with no autograd to record (the GPU tests run
    that path); CPU, meta and fake tensors, and tensors that need a gradient with grad mode on, go
    through the op (its fake implementation, or its refusal)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from fusegemm.torch_library import _eager, _no_autograd
    plain, needs = torch.zeros(2), torch.zeros(2, requires_grad=True)
    assert _no_autograd((plain, None, 3.0)) and not _no_autograd((plain, needs))
    with torch.no_grad():
        assert _no_autograd((plain, needs))
    with FakeTensorMode():
        fake = torch.zeros(2)
    for lead in (plain, torch.zeros(2, device="meta"), fake):
        assert not _eager(lead, lead)
