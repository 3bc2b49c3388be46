"""The preset table (fusegemm/presets.py): each seed-style op generated from a row has cuDNN
frontend's parameter names, defaults and return order; every parameter reaches the engine or is
refused with its reason; every epilogue input and returned output is the spec's; the generated
wrapper checks every argument before the device (the launches: tests/gpu/test_presets_gpu.py)."""
from __future__ import annotations

import inspect

import pytest

torch = pytest.importorskip("torch")

import fusegemm  # noqa: E402
from fusegemm import compat, presets  # noqa: E402
from fusegemm.base.errors import ArgumentError  # noqa: E402
from fusegemm.generator.spec import find_spec  # noqa: E402

# cuDNN frontend's wrappers (python/cudnn/grouped_gemm/<op>/api.py): parameters in order, returns.
CUDNN = {
    "grouped_gemm_glu": (
        "a_tensor sfa_tensor padded_offsets alpha_tensor b_tensor sfb_tensor bias_tensor b_ptrs sfb_ptrs n b_dtype "
        "b_major norm_const_tensor prob_tensor acc_dtype c_dtype d_dtype cd_major mma_tiler_mn cluster_shape_mn "
        "sf_vec_size vector_f32 m_aligned discrete_col_sfd act_func linear_offset geglu_alpha glu_clamp_max "
        "glu_clamp_min use_dynamic_sched use_single_group_runtime_offsets current_stream generate_c",
        "c_tensor d_tensor d_col_tensor amax_tensor sfd_row_tensor sfd_col_tensor"),
    "grouped_gemm_dglu": (
        "a_tensor c_tensor sfa_tensor padded_offsets alpha_tensor beta_tensor prob_tensor dprob_tensor b_tensor "
        "sfb_tensor generate_dbias b_ptrs sfb_ptrs n b_dtype b_major norm_const_tensor acc_dtype d_dtype cd_major "
        "mma_tiler_mn cluster_shape_mn sf_vec_size vector_f32 m_aligned discrete_col_sfd act_func linear_offset "
        "geglu_alpha glu_clamp_max glu_clamp_min epilogue_op use_dynamic_sched use_single_group_runtime_offsets "
        "current_stream",
        "d_row_tensor d_col_tensor dprob_tensor dbias_tensor amax_tensor sfd_row_tensor sfd_col_tensor"),
    "grouped_gemm_dsrelu": (
        "a_tensor b_tensor c_tensor sfa_tensor sfb_tensor padded_offsets alpha_tensor prob_tensor dprob_tensor "
        "generate_dbias b_ptrs sfb_ptrs n b_dtype b_major norm_const_tensor acc_dtype d_dtype cd_major mma_tiler_mn "
        "cluster_shape_mn sf_vec_size vector_f32 m_aligned discrete_col_sfd use_dynamic_sched current_stream",
        "d_row_tensor d_col_tensor dprob_tensor dbias_tensor amax_tensor sfd_row_tensor sfd_col_tensor"),
}
# Parameters every row may read without naming them in a field (the engine's tile, cluster, stream,
# and the weights' dtype, checked against bfloat16).
GENERIC = {"mma_tiler_mn", "cluster_shape_mn", "current_stream", "b_dtype"}


# Every row, block-scaled backends (``Preset.scaled``) included: each spells cuDNN's face.
ROWS = [r for p in presets.PRESETS for r in (p, p.scaled) if r is not None]


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.spec)
def test_rows_spell_cudnn_and_reach_the_engine(row):
    params, returns = CUDNN[row.name]
    sig = inspect.signature(getattr(fusegemm, row.name))
    assert list(sig.parameters) == params.split()
    assert list(row.signature().parameters) == params.split()
    assert [name for name, _ in row.returns] == returns.split()
    used = ({p for _, p in row.operands} | {p for _, p in row.inputs} | {p for _, _, p in row.axes}
            | {p for p, _, _ in row.fixed} | {p for _, p in row.into} | GENERIC)
    if row.scaled is not None:     # it chooses the block-scaled backend
        used.add("sfa_tensor")
    assert set(sig.parameters) - used == set(), "a parameter that reaches nothing"
    assert used - GENERIC <= set(sig.parameters)
    spec = find_spec(row.spec)
    assert {i for i, _ in row.inputs} == {i.name for i in spec.epilogue.inputs}
    gated = {axis: True for axis in ("generate_dbias",) if axis in spec.choice_map}   # outputs an axis adds
    fp8_d = [{"d_dtype": "float8_e4m3fn"}] if "float8_e4m3fn" in spec.choice_map.get("d_dtype", ()) else []
    outs = {o.name for o in spec.epilogue.outputs}.union(*(fusegemm.Op.planned(spec, **gated, **v).epilogue.buffers(
        256, 256, 1) for v in [{}, *fp8_d]))      # SFD comes with an FP8 D
    for name, spec_out in row.returns:
        assert spec_out is None or spec_out in outs or spec_out in ("c", "amax"), (name, spec_out)
    assert getattr(compat, row.cudnn) is getattr(fusegemm, row.name)


def _args(l=1, m=256, n=128, k=64):
    a = torch.zeros((m, k), dtype=torch.bfloat16)
    b = torch.zeros((l, n, k), dtype=torch.bfloat16)
    return a, b, torch.tensor([m], dtype=torch.int32), torch.ones(l), torch.ones(m)


def test_fixed_parameters_are_refused_with_their_reason():
    a, b, off, alpha, prob = _args()
    with pytest.raises(ArgumentError, match=r"^act_func: got 'geglu'; allowed: 'swiglu'\. this op is SwiGLU's spec"):
        fusegemm.grouped_gemm_glu(a, None, off, alpha, b, prob_tensor=prob, act_func="geglu")
    # sfa_tensor chooses the block-scaled backend, which takes FP8 operands; sfb alone is refused.
    with pytest.raises(ArgumentError, match=r"^a_tensor\.dtype: got bfloat16; allowed: float8_e4m3fn"):
        fusegemm.grouped_gemm_glu(a, torch.zeros(4, dtype=torch.uint8), off, alpha, b, prob_tensor=prob)
    with pytest.raises(ArgumentError, match=r"^sfb_tensor: got .*; allowed: None\. BF16 operands have no scales; "
                                            r"block-scaled operands pass sfa_tensor too"):
        fusegemm.grouped_gemm_glu(a, None, off, alpha, b, torch.zeros(4, dtype=torch.uint8), prob_tensor=prob)
    # dGLU and dsReLU with sfa_tensor run their block-scaled backends (specs grouped_gemm_dglu_mx,
    # grouped_gemm_dsrelu_mx), which take FP8 A.
    with pytest.raises(ArgumentError, match=r"^a_tensor\.dtype: got bfloat16; allowed: float8_e4m3fn"):
        fusegemm.grouped_gemm_dglu(a, torch.zeros((256, 256), dtype=torch.bfloat16), torch.zeros(4, dtype=torch.uint8),
                                   off, alpha, alpha, prob, torch.zeros(256), b_tensor=b)
    with pytest.raises(ArgumentError, match=r"^sfb_tensor: got .*; allowed: None\. BF16 operands have no scales"):
        fusegemm.grouped_gemm_dglu(a, torch.zeros((256, 256), dtype=torch.bfloat16), None, off, alpha, alpha, prob,
                                   torch.zeros(256), b_tensor=b, sfb_tensor=torch.zeros(4, dtype=torch.uint8))
    with pytest.raises(ArgumentError, match=r"^a_tensor\.dtype: got bfloat16; allowed: float8_e4m3fn"):
        fusegemm.grouped_gemm_dsrelu(a, b, torch.zeros((256, 128), dtype=torch.bfloat16),
                                     torch.zeros(4, dtype=torch.uint8), padded_offsets=off, alpha_tensor=alpha,
                                     prob_tensor=prob)
    # dGLU's and dsReLU's bias gradients are offered: the calls reach the device check.
    with pytest.raises(ArgumentError, match=r"^a_tensor\.device: got cpu"):
        fusegemm.grouped_gemm_dglu(a, torch.zeros((256, 256), dtype=torch.bfloat16), None, off, alpha, alpha, prob,
                                   torch.zeros(256), b_tensor=b, generate_dbias=True)
    with pytest.raises(ArgumentError, match=r"^a_tensor\.device: got cpu"):
        fusegemm.grouped_gemm_dsrelu(a, b, torch.zeros((256, 128), dtype=torch.bfloat16), padded_offsets=off,
                                     alpha_tensor=alpha, prob_tensor=prob, generate_dbias=True)
    with pytest.raises(ArgumentError, match=r"^b_dtype: got .*float16.*; allowed: None or bfloat16"):
        fusegemm.grouped_gemm_glu(a, None, off, alpha, b, prob_tensor=prob, b_dtype=torch.float16)
    with pytest.raises(TypeError, match=r"^grouped_gemm_dglu\(\): missing a required argument: 'c_tensor'"):
        fusegemm.grouped_gemm_dglu(a)


def test_dtype_parameters_take_any_spelling_and_every_check_runs_before_the_device():
    a, b, off, alpha, prob = _args()
    for acc in ("float32", torch.float32, None):
        with pytest.raises(ArgumentError, match=r"^a_tensor\.device: got cpu; allowed: a CUDA device"):
            fusegemm.grouped_gemm_glu(a, None, off, alpha, b, prob_tensor=prob, acc_dtype=acc, d_dtype=torch.float32)
    with pytest.raises(ArgumentError, match=r"^prob_tensor: got None; allowed: a row input \(float32\)"):
        fusegemm.grouped_gemm_glu(a, None, off, alpha, b)
    with pytest.raises(ArgumentError, match=r"^a_tensor\.device: got cpu"):
        fusegemm.grouped_gemm_dglu(a, torch.zeros((256, 256), dtype=torch.bfloat16), None, off, alpha, alpha, prob,
                                   torch.zeros(256), b_tensor=b)                  # C is (M, 2N)


@pytest.mark.parametrize("row", presets.PRESETS, ids=lambda r: r.name)
def test_every_preset_is_a_functional_torch_op_traced_on_fake_tensors(row, monkeypatch):
    """torch.ops.fusegemm.<preset>: the row's parameters (short names, no stream, no caller-owned
    output), its return order, and shapes from the same wrapper under dry_run."""
    import fusegemm.torch_library  # noqa: F401  (registers the ops)
    from torch._subclasses.fake_tensor import FakeTensorMode
    schema = getattr(torch.ops.fusegemm, row.name).default._schema
    assert not any(arg.alias_info is not None for arg in schema.arguments)
    assert len(schema.returns) == len(row.returns)
    names = [a.name for a in schema.arguments]
    assert "current_stream" not in names and not ({p.removesuffix("_tensor") for _, p in row.into} & set(names))
    monkeypatch.setattr("fusegemm.ops.device.device_arch", lambda d: "sm_90a")
    with FakeTensorMode():
        cuda = dict(device="cuda")
        m, k, n_acc, l = 768, 256, 512, 3
        a = torch.empty((m, k), dtype=torch.bfloat16, **cuda)
        b = torch.empty((l, n_acc, k), dtype=torch.bfloat16, **cuda)
        off = torch.empty((l,), dtype=torch.int32, **cuda)
        vec, rows = torch.empty((l,), **cuda), torch.empty((m,), **cuda)
        op = getattr(torch.ops.fusegemm, row.name)
        if row.name == "grouped_gemm_glu":
            out = op(a, None, off, vec, b, prob=rows)
            want = [(), (m, n_acc // 2)]
        elif row.name == "grouped_gemm_dglu":
            c = torch.empty((m, 2 * n_acc), dtype=torch.bfloat16, **cuda)
            out = op(a, c, None, off, vec, vec, rows, b=b)
            want = [(m, 2 * n_acc), (), (m,)]
        else:
            c = torch.empty((m, n_acc), dtype=torch.bfloat16, **cuda)
            out = op(a, b, c, padded_offsets=off, alpha=vec, prob=rows)
            want = [(m, n_acc), (), (m,)]
    got = [tuple(t.shape) if t.numel() or t.dim() != 1 else () for t in out]
    assert got[:len(want)] == want


def test_a_wrapper_resolves_each_argument_pattern_once(monkeypatch):
    """The generated wrappers' host fast path (ops/faces.py ``call``): a repeat of an argument
    pattern (dtypes, shapes, strides, devices, option values) skips the row's resolution and the
    op lookup; another dtype, option value or layout resolves again; numpy arrays never memoise;
    a stand-in for the op factory is honoured (it is part of the key)."""
    from fusegemm.ops import faces
    a, b, off, alpha, prob = _args()
    calls = []
    real = faces.resolve
    monkeypatch.setattr(faces, "resolve",
                        lambda row, bound, names=None: calls.append(row.name) or real(row, bound, names))
    faces._RESOLVED.clear()

    def run(**kw):
        with pytest.raises(ArgumentError, match=r"^a_tensor\.device: got cpu"):
            fusegemm.grouped_gemm_glu(a, None, off, alpha, kw.pop("b", b), prob_tensor=prob, **kw)
    run()
    run()
    assert len(calls) == 1
    run(d_dtype=torch.float32)           # another option value
    run(d_dtype="float32")               # spelled otherwise: a pattern of its own, same op
    run(b=torch.zeros((1, 128, 64), dtype=torch.bfloat16))             # same pattern, new tensor
    run(b=torch.zeros((1, 64, 128), dtype=torch.bfloat16).transpose(1, 2), b_major="n")   # another layout
    assert len(calls) == 4
    run(d_dtype="float16")               # another value of the same type
    run(d_dtype="float16")
    assert len(calls) == 5
    with pytest.raises(ArgumentError):   # a refused pattern is not memoised: refused again, with its reason
        fusegemm.grouped_gemm_glu(a, None, off, alpha, b, prob_tensor=prob, act_func="geglu")
    with pytest.raises(ArgumentError, match=r"^act_func"):
        fusegemm.grouped_gemm_glu(a, None, off, alpha, b, prob_tensor=prob, act_func="geglu")
    assert len(calls) == 7
    import ml_dtypes
    n = len(faces._RESOLVED)
    with pytest.raises(ArgumentError):
        fusegemm.grouped_gemm_glu(a.view(torch.int16).numpy().view(ml_dtypes.bfloat16), None, off, alpha, b,
                                  prob_tensor=prob)
    assert len(faces._RESOLVED) == n and len(calls) == 8
    from fusegemm.ops import scaled_seeds
    made = []
    real_op = scaled_seeds._op
    monkeypatch.setattr(scaled_seeds, "_op", lambda *args: made.append(args) or real_op(*args))
    run()
    assert len(made) == 1 and len(calls) == 9
