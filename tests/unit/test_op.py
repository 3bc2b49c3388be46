"""fusegemm.Op, the one engine, on the CPU: every spec family maps to a kernel class, operands are
parsed per class, the epilogue's inputs reach the parameter struct only through the slots the
resolved epilogue assigns them (a user's spec may order them as it likes), outputs through their
buffer fields; the reference serves every grouped class; the torch face registers any spec.
The launches themselves run in tests/gpu/test_op_gpu.py."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import fusegemm  # noqa: E402
from fusegemm.base.errors import ArgumentError, UnsupportedError  # noqa: E402
from fusegemm.generator import registry  # noqa: E402
from fusegemm.generator.spec import list_specs, load_spec  # noqa: E402
from fusegemm.ops.engine import Op, kernel_class  # noqa: E402
from fusegemm.problems import make_grouped_problem  # noqa: E402
from epilogue_inputs import epilogue_inputs  # noqa: E402  (tests/epilogue_inputs.py)

from test_scaled_errors import _cpu  # noqa: E402

SPECS = Path(__file__).resolve().parents[2] / "specs"

DATA = Path(__file__).resolve().parents[1] / "data"
USER_BF16 = (DATA / "user_gelu_bias.yaml").read_text()      # inputs declared out of the ABI's slot order


class _Maps:
    def __init__(self):
        self.calls = []

    def tiled(self, address, dtype, shape, strides, box, swizzle=128, *rest):
        self.calls.append(dict(address=address, shape=shape))
        return b"\0" * 128


class _Launcher:
    """Stands in for LoadedKernel: records the values a launch packs."""

    def __init__(self):
        from fusegemm.base.contract import KernelContract
        self.contract = KernelContract(
            threads=384, smem_bytes=1, min_cluster_m=1, min_cluster_n=1, max_cluster_ctas=2, ctas_per_tile=1,
            tile_m=128, tile_n=256, tile_k=64, m_aligned=256, box_a_inner=64, box_a_outer=128, box_b_inner=64,
            box_b_outer=128, swizzle_a=128, swizzle_b=128, tma_dtype_a=0, tma_dtype_b=0, tmap_slot_stride=0,
            tmem_cols=0, sf_box_k=1, sf_box_nb=1)
        self.tmaps, self.tile, self.cluster, self.sms, self.tma_dtype = _Maps(), (128, 256), (1, 1), 132, "bfloat16"
        self.launched = None

    def grid(self, s):
        self.shape = s
        return 3

    def maps(self, s, a_ptr, b_ptr):
        return {"tma_a": b"a", "tma_b": b"b"}

    def scalars(self, s):
        return {"m_rows": s.m, "n": s.n, "k": s.k, "num_experts": s.l, "cluster_m": 1, "cluster_n": 1}

    def workspace(self, *a):
        return {}

    def launch(self, values, grid, stream):
        self.launched = (dict(values), grid)


@pytest.fixture
def no_device(monkeypatch):
    monkeypatch.setattr("fusegemm.runtime.tensors.resolve_stream", lambda s, d: 0)
    monkeypatch.setattr("fusegemm.runtime.load.thread_context", lambda d: None)


def _launch(op, call, values, out):
    op._launcher = _Launcher()
    return op._launch_values(call, out, values), op._launcher.grid(None)


def test_every_family_has_a_kernel_class():
    """The class is the registry's: every arch's row of the family is a row of that class, with
    the class's template, and the family solves the class's problem."""
    want = {"grouped": ("grouped_gemm.cu.j2", "grouped"), "kgrouped": ("grouped_gemm.cu.j2", "kgrouped"),
            "scaled": ("blockscaled_gemm.cu.j2", "grouped"), "batched": ("blockscaled_gemm.cu.j2", "batched"),
            "kscaled": ("blockscaled_gemm.cu.j2", "kgrouped")}
    seen = set()
    for family in registry.families():
        kind = kernel_class(family)
        # (the FP8 weight gradient has no sm_100a row)
        rows = [r for arch in ("sm_100a", "sm_90a") if (r := registry.lookup(family, arch)) is not None]
        assert {r.kernel_class for r in rows} == {kind} and {r.template for r in rows} == {rows[0].template}, family
        assert (rows[0].template, registry.problem_of(family)) == want[kind], family
        seen.add(kind)
    assert seen == set(want)
    for path in list_specs():
        spec = load_spec(path)
        assert Op.planned(spec).kind == kernel_class(spec.kernel), spec.name


def test_user_bf16_spec_routes_inputs_through_its_slots(tmp_path, no_device):
    path = tmp_path / "user_gelu_bias.yaml"
    path.write_text(USER_BF16)
    op = fusegemm.Op(str(path), arch="sm_90a")
    slots = {i.name: i.slot for i in op.spec.epilogue.inputs}
    assert slots == {"row_scale": "prob", "bias": "bias", "alpha": "alpha"}
    l, m, n, k = 2, 512, 256, 64
    a = torch.zeros((m, k), dtype=torch.bfloat16)
    b = torch.zeros((l, n, k), dtype=torch.bfloat16)
    off = torch.tensor([256, 512], dtype=torch.int32)
    ins = {"row_scale": torch.ones(m), "bias": torch.zeros((n, l), dtype=torch.bfloat16).t().contiguous().t(),
           "alpha": torch.ones(l)}
    call = op._parse((a, off, b), {})
    deferred = []
    values, _ = op._inputs(ins, call, deferred)
    assert values == {"prob": ins["row_scale"].data_ptr(), "bias": ins["bias"].data_ptr(),
                      "alpha": ins["alpha"].data_ptr()}
    assert [d[0] for d in deferred] == ["inputs['row_scale']", "inputs['bias']", "inputs['alpha']"]
    values, grid = _launch(op, call, values, {"d": 1000})
    assert grid == 3
    assert (values["prob"], values["d_out"], values["ldd"], values["offsets"]) == (
        ins["row_scale"].data_ptr(), 1000, n, off.data_ptr())
    assert "row_scale" not in values


def test_operands_are_named_by_the_kernel_class():
    a = torch.zeros((256, 64), dtype=torch.bfloat16)
    with pytest.raises(ArgumentError, match=r"^operands: got 1 positional, keywords \[\]; allowed: the grouped "
                                            r"operands of grouped_gemm: a_tensor, padded_offsets, b_tensor, b_ptrs, n"):
        Op("grouped_gemm", arch="sm_90a")(a)
    with pytest.raises(ArgumentError, match=r"the kgrouped operands of grouped_gemm_wgrad: dy_tensor, x_tensor, "
                                            r"padded_offsets"):
        Op("grouped_gemm_wgrad", arch="sm_90a")(a, a, a, a)


def test_inputs_the_spec_does_not_declare_are_refused():
    op = Op("grouped_gemm", arch="sm_90a")
    a = torch.zeros((256, 64), dtype=torch.bfloat16)
    b = torch.zeros((1, 128, 64), dtype=torch.bfloat16)
    off = torch.tensor([256], dtype=torch.int32)
    with pytest.raises(ArgumentError, match=r"^inputs\['gamma'\]: got given; allowed: the epilogue's inputs: alpha, prob$"):
        op(a, off, b, inputs={"alpha": torch.ones(1), "gamma": torch.ones(1)})


def test_the_named_faces_keep_their_families():
    with pytest.raises(UnsupportedError, match="EpilogueGemm runs 'grouped_gemm'.*fusegemm.Op runs every family"):
        fusegemm.EpilogueGemm("grouped_gemm_srelu", arch="sm_90a")
    assert Op("grouped_gemm_srelu", arch="sm_90a").kind == "scaled"


USER_SCALED = (DATA / "user_srelu2_mx.yaml").read_text()


def test_user_mxfp8_spec_runs_on_the_block_scaled_class(tmp_path, no_device):
    """The new user's sReLU^2 spec with MXFP8 inputs (which EpilogueGemm refused): maps, slots and
    buffers of a block-scaled launch, and its interpreter reference against an independent
    formula."""
    path = tmp_path / "user_srelu2_mx.yaml"
    path.write_text(USER_SCALED)
    op = fusegemm.Op(str(path), arch="sm_90a")
    assert op.kind == "scaled" and {i.name: i.slot for i in op.spec.epilogue.inputs} == {
        "prob": "prob", "alpha": "alpha", "norm_const": "norm_const"}
    pb = make_grouped_problem("grouped_gemm_srelu", num_experts=3, tokens=[256, 0, 300], n=256, k=256, seed=1)
    kw = {k: _cpu(v) for k, v in pb.kwargs(sf_vec_size=32).items()}
    operands = (kw["a_tensor"], kw["sfa_tensor"], kw["padded_offsets"], kw["b_tensor"], kw["sfb_tensor"])
    ins = {"prob": kw["prob_tensor"], "alpha": kw["alpha_tensor"], "norm_const": torch.full((1,), 0.5)}
    call = op._parse(operands, {})
    values, _ = op._inputs(ins, call, [])
    bufs = op.epilogue.buffers(call.n, call.m, call.l)
    assert list(bufs) == ["d", "sfd_row", "amax"]
    ptrs = {name: 1000 * (i + 1) for i, name in enumerate(bufs)}
    values, _ = _launch(op, call, values, ptrs)
    assert (values["d_out"], values["sfd_row"], values["amax"]) == (1000, 2000, 3000)
    assert values["norm_const"] == ins["norm_const"].data_ptr() and values["rcp_max"] == 1.0 / 448.0
    assert len(op._launcher.tmaps.calls) == 4   # A, B, SFA, SFB

    ref = op.reference(*operands, inputs=ins)
    # Independent of the interpreter: the formula in float64 over the FP32 accumulator (the
    # dequantization is the references' own, tested in test_reference.py), then D dequantized
    # from its bytes and SFD_row with the format helpers.
    from fusegemm.formats import dequantize_blockwise, unpack_sf
    from fusegemm.reference._operands import parse_grouped
    g = parse_grouped(a_tensor=pb.a_tensor, b_tensor=pb.b_tensor, b_list=None, padded_offsets=pb.padded_offsets,
                      m_aligned=256, acc="float64", sfa_tensor=pb.sfa_tensor, sfb_tensor=pb.sfb_tensor, sf_vec_size=32)
    acc = g.accumulate()
    rows = np.searchsorted(g.offsets, np.arange(g.valid_m), side="right")     # expert of each row
    r = np.maximum(acc * pb.alpha_tensor.astype(np.float32)[rows, None], 0).astype(np.float64)
    want = r ** 4 * pb.prob_tensor.reshape(-1)[: g.valid_m, None].astype(np.float64)
    amax = [np.abs(want[s:e]).max() if e > s else -np.inf for s, e in g.ranges]
    np.testing.assert_allclose(ref["amax"].reshape(-1), np.float32(amax), rtol=1e-5)
    import ml_dtypes
    d = dequantize_blockwise(ref["d"][: g.valid_m].view(np.uint8).view(ml_dtypes.float8_e4m3fn),
                             unpack_sf(ref["sfd_row"], call.m, call.n // 32)[: g.valid_m, :, 0], sf_vec_size=32)
    scale = np.abs(want).max(axis=1, keepdims=True) + 1e-30
    # D * SFD = norm_const * x (sfd-semantics.md section 1); e4m3 keeps 3 mantissa bits, rounded
    # to nearest: within 2^-4 of each block's largest value.
    assert np.max(np.abs(d - 0.5 * want) / (0.5 * scale)) < 2 ** -4


# ---------------------------------------------------------------- the torch face of any spec
@pytest.fixture
def fake_sm90(monkeypatch):
    monkeypatch.setattr("fusegemm.ops.device.device_arch", lambda d: "sm_90a")


def test_register_any_spec_gives_a_functional_schema_per_kernel_class(tmp_path):
    import fusegemm.torch_library as fg
    path = tmp_path / "user_gelu_bias.yaml"
    path.write_text(USER_BF16)
    cases = {
        "t_user_bf16": (str(path), {}, "a_tensor, Tensor padded_offsets, Tensor? b_tensor=None, Tensor? b_ptrs=None, "
                                       "int? n=None, Tensor? a_index=None, Tensor? d_index=None, int? d_rows=None, "
                                       "Tensor? row_ends=None, Tensor? row_scale=None, "
                                       "Tensor? bias=None, Tensor? alpha=None"),
        "t_wgrad": ("grouped_gemm_wgrad", {"d_dtype": "float32"},
                    "dy_tensor, Tensor x_tensor, Tensor padded_offsets, Tensor? dy_index=None, Tensor? x_index=None, "
                    "Tensor? row_ends=None, Tensor? alpha=None"),
        "t_quant": ("grouped_gemm_quant", {"d_dtype": "float8_e4m3fn"},
                    "a_tensor, Tensor sfa_tensor, Tensor padded_offsets, Tensor? b_tensor=None, Tensor? sfb_tensor=None, "
                    "Tensor? b_ptrs=None, Tensor? sfb_ptrs=None, int? n=None, Tensor? a_index=None, "
                    "Tensor? alpha=None, Tensor? prob=None, Tensor? row_scale=None, Tensor? bias=None, "
                    "Tensor? norm_const=None"),
        "t_amax": ("gemm_amax", {}, "a_tensor, Tensor b_tensor, Tensor sfa_tensor, Tensor sfb_tensor"),
    }
    outs = {"t_user_bf16": ("d",), "t_wgrad": ("d",), "t_quant": ("d", "sfd_row", "d_col", "sfd_col"),
            "t_amax": ("c", "amax")}
    for name, (spec, axes, params) in cases.items():
        face = fg.register(spec, name=name, **axes)
        schema = str(face.op.default._schema)
        assert schema.startswith(f"fusegemm::{name}(Tensor {params})"), schema
        assert not any(a.alias_info is not None for a in face.op.default._schema.arguments)
        assert face.outputs == outs[name]
        assert fg.register(spec, name=name, **axes) is face          # the same registration again


def test_register_again_reads_no_spec(tmp_path, monkeypatch):
    """A repeated call returns its face without loading the YAML (fusegemm.moe registers its
    recipe steps on every use); the same relative path from another directory is another file."""
    import fusegemm.generator.spec as spec_mod
    import fusegemm.torch_library as fg
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "user_gelu_bias.yaml").write_text(USER_BF16)
    monkeypatch.chdir(tmp_path / "a")
    face = fg.register("user_gelu_bias.yaml", name="t_again_a")
    loads = []
    real = spec_mod.find_spec
    monkeypatch.setattr(spec_mod, "find_spec", lambda x: loads.append(x) or real(x))
    assert fg.register("user_gelu_bias.yaml", name="t_again_a") is face
    assert fg.register("grouped_gemm_wgrad", name="t_again_w") is fg.register("grouped_gemm_wgrad", name="t_again_w")
    assert loads == ["grouped_gemm_wgrad"]                      # the second wgrad call read nothing
    monkeypatch.chdir(tmp_path / "b")
    with pytest.raises(ArgumentError, match=r"^name: got 't_again_a'; allowed: a name not yet registered"):
        fg.register("user_gelu_bias.yaml", name="t_again_a")               # b/user_gelu_bias.yaml: read, and refused
    assert loads[-1] == "user_gelu_bias.yaml"


def test_register_refuses_taken_names():
    import fusegemm.torch_library as fg
    with pytest.raises(ArgumentError, match=r"^name: got 'grouped_gemm'; allowed: a name no fusegemm op has"):
        fg.register("grouped_gemm")
    fg.register("grouped_gemm_wgrad", name="t_taken")
    with pytest.raises(ArgumentError, match=r"^name: got 't_taken'; allowed: a name not yet registered"):
        fg.register("grouped_gemm_wgrad", name="t_taken", d_dtype="float32")
    with pytest.raises(ArgumentError, match=r"^name: got 'Bad-Name'"):
        fg.register("grouped_gemm_wgrad", name="Bad-Name")


def test_registered_ops_trace_on_fake_tensors(fake_sm90):
    """The fake implementation is the same Op under dry_run: outputs of every class have the
    shapes, dtypes and layouts the real op allocates (traced without a GPU)."""
    import fusegemm.torch_library as fg
    from torch._subclasses.fake_tensor import FakeTensorMode
    swiglu = fg.register("grouped_gemm_swiglu", name="t_swiglu_fp8")
    wgrad = fg.register("grouped_gemm_wgrad", name="t_wgrad32", d_dtype="float32")
    srelu = fg.register("grouped_gemm_srelu", name="t_srelu_fp8", d_dtype="float8_e4m3fn")
    with FakeTensorMode():
        cuda = dict(device="cuda")
        a = torch.empty((768, 256), dtype=torch.bfloat16, **cuda)
        off = torch.empty((3,), dtype=torch.int32, **cuda)
        b = torch.empty((3, 1024, 256), dtype=torch.bfloat16, **cuda)
        out = swiglu(a, off, b, inputs={"alpha": torch.empty((3,), **cuda), "prob": torch.empty((768,), **cuda),
                                        "norm_const": 0.01})
        got = {k: (tuple(v.shape), v.dtype) for k, v in out.items()}
        assert got == {"d": ((768, 512), torch.uint8), "sfd_row": ((1, 6, 4, 32, 4, 4), torch.uint8)}
        dy = torch.empty((512, 256), dtype=torch.bfloat16, **cuda)
        x = torch.empty((512, 384), dtype=torch.bfloat16, **cuda)
        out = wgrad(dy, x, torch.empty((2,), dtype=torch.int32, **cuda))
        assert {k: (tuple(v.shape), v.dtype) for k, v in out.items()} == {"d": ((2, 256, 384), torch.float32)}
        a8 = torch.empty((768, 256), dtype=torch.float8_e4m3fn, **cuda)
        b8 = torch.empty((3, 256, 256), dtype=torch.float8_e4m3fn, **cuda)
        sfa = torch.empty((6 * 2 * 512,), dtype=torch.uint8, **cuda)
        sfb = torch.empty((3 * 2 * 2 * 512,), dtype=torch.uint8, **cuda)
        out = srelu(a8, sfa, off, b8, sfb, inputs={"alpha": torch.empty((3,), **cuda),
                                                   "prob": torch.empty((768,), **cuda), "norm_const": 1.0})
        assert {k: tuple(v.shape) for k, v in out.items()} == {
            "c": (768, 256), "d": (768, 256), "sfd_row": (1, 6, 2, 32, 4, 4), "d_col": (768, 256),
            "sfd_col": (1, 2, 6, 32, 4, 4)}


def test_jax_spec_op_plans_outputs_of_every_class():
    """jax_ffi.spec_op's output shapes come from the same epilogue buffers (planned without a GPU)."""
    from fusegemm.ops.engine import positional_operands
    plan = Op.planned("grouped_gemm_wgrad", d_dtype="float32")
    assert plan.dims_of({"dy_tensor": (512, 256), "x_tensor": (512, 384), "padded_offsets": (2,)}) == (384, 512, 2)
    plan = Op.planned("gemm_amax")
    assert plan.dims_of({"a_tensor": (3, 200, 320), "b_tensor": (3, 264, 320)}) == (264, 600, 1)
    assert {kind: positional_operands(kind) for kind in ("grouped", "kgrouped", "scaled", "batched")} == {
        "grouped": ("a_tensor", "padded_offsets", "b_tensor"),
        "kgrouped": ("dy_tensor", "x_tensor", "padded_offsets"),
        "scaled": ("a_tensor", "sfa_tensor", "padded_offsets", "b_tensor", "sfb_tensor"),
        "batched": ("a_tensor", "b_tensor", "sfa_tensor", "sfb_tensor")}


# ---------------------------------------------------------------- the seed 001 class's slots
def test_grouped_gemm_class_writes_the_seed_inputs_through_the_spec_slots(tmp_path, monkeypatch):
    """GroupedGemm's alpha/prob/bias reach the fields the spec's epilogue assigns them: a spec
    that declared another row input before prob moves prob to the second row slot; one without
    prob is refused before any pointer is written."""
    from fusegemm.generator.spec import load_spec as load
    import fusegemm.generator.spec as spec_mod
    from fusegemm import presets
    from fusegemm.ops import scaled_seeds
    text = (SPECS / "grouped_gemm.yaml").read_text()
    moved = text.replace("    prob: {per: row, default: 1.0}", "    gate: {per: row, default: 1.0}\n"
                         "    prob: {per: row, default: 1.0}").replace("- g = alpha * acc", "- g = alpha * acc * gate")
    (tmp_path / "grouped_gemm.yaml").write_text(moved)
    real_find = spec_mod.find_spec
    monkeypatch.setattr(spec_mod, "find_spec", lambda name: load(tmp_path / "grouped_gemm.yaml")
                        if name == "grouped_gemm" else real_find(name))
    monkeypatch.setattr(scaled_seeds, "_OPS", type(scaled_seeds._OPS)())    # ops of the edited spec only
    monkeypatch.setattr("fusegemm.ops.loaded_kernel.LoadedKernel.build", classmethod(lambda cls, v, d: _Launcher()))
    monkeypatch.setattr("fusegemm.ops.tail.prepare", lambda device: True)
    a = torch.zeros((512, 64), dtype=torch.bfloat16)
    b = torch.zeros((2, 256, 64), dtype=torch.bfloat16)
    off = torch.tensor([256, 512], dtype=torch.int32)
    alpha, prob = torch.ones(2), torch.ones(512)
    monkeypatch.setattr("fusegemm.ops.arg_checks.require_cuda", lambda v, n: 0)
    op = presets.GroupedGemm(a, None, None, off, alpha, b, arch="sm_90a").compile()
    engine = op.op
    assert {i.name: i.slot for i in engine.spec.epilogue.inputs} == {"alpha": "alpha", "gate": "prob",
                                                                     "prob": "row_scale", "bias": "bias"}
    call = engine._parse((a, off, b), {})
    values, _ = engine._inputs({"alpha": alpha, "prob": prob, "bias": None}, call, [])
    assert values == {"alpha": alpha.data_ptr(), "row_scale": prob.data_ptr()}
    values = engine._launch_values(call, {"d": 8}, values)
    assert (values["alpha"], values["row_scale"], values["d_out"]) == (alpha.data_ptr(), prob.data_ptr(), 8)
    assert "prob" not in values      # gate: absent, its default (a null pointer) applies
    (tmp_path / "grouped_gemm.yaml").write_text(text.replace("prob:", "gate:").replace("prob *", "gate *")
                                                .replace("prob)", "gate)").replace("+ prob", "+ gate"))
    monkeypatch.setattr(scaled_seeds, "_OPS", type(scaled_seeds._OPS)())
    with pytest.raises(UnsupportedError, match="the seed's prob_tensor has no epilogue input 'prob'"):
        presets.GroupedGemm(a, None, None, off, alpha, b, arch="sm_90a").compile()


# ---------------------------------------------------------------- the host fast path
class _AddressMaps:
    """Tensor maps that differ with every input (address, shape, strides, box)."""

    def tiled(self, address, dtype, shape, strides, box, swizzle=128, *rest):
        import hashlib
        import struct
        rest = hashlib.sha512(repr((dtype, shape, strides, box, swizzle)).encode()).digest()
        return struct.pack("<Q", address) + rest + bytes(56)   # the address as a map's first word


class _Packed(_Launcher):
    """A loaded kernel whose prepared launch records the packed parameter bytes."""

    dynamic = stream_k = False
    kernel = None
    itemsize = 2

    def __init__(self):
        super().__init__()
        self.tmaps = _AddressMaps()

    def needs_scratch(self, discrete):
        from fusegemm.ops.loaded_kernel import LoadedKernel
        return LoadedKernel.needs_scratch(self, discrete)

    def config(self, grid):
        return None

    def maps(self, s, a_ptr, b_ptr):
        from fusegemm.ops.loaded_kernel import LoadedKernel
        return LoadedKernel.maps(self, s, a_ptr, b_ptr)


class _Driver:
    def cuMemsetD32Async(self, *a):
        return (0,)


def _case(kind, seed):
    """(op, operands, inputs) of one kernel class: every input the epilogue declares, a number for
    scalar ones (their device copy is part of the memo)."""
    g = torch.Generator().manual_seed(seed)
    if kind == "grouped":
        op = Op("grouped_gemm_dswiglu_bf16", arch="sm_90a")
        m, n, k, l = 512, 128, 64, 2
        operands = (torch.randn(m, k, generator=g).bfloat16(), torch.tensor([256, 512], dtype=torch.int32),
                    torch.randn(l, n, k, generator=g).bfloat16())
    elif kind == "kgrouped":
        op = Op("grouped_gemm_wgrad", arch="sm_90a")
        m, n, l = 512, 64, 2
        operands = (torch.randn(m, 128, generator=g).bfloat16(), torch.randn(m, n, generator=g).bfloat16(),
                    torch.tensor([256, 512], dtype=torch.int32))
    elif kind == "scaled":
        op = Op("grouped_gemm_srelu", arch="sm_90a", d_dtype="float8_e4m3fn")
        pb = make_grouped_problem("grouped_gemm_srelu", num_experts=3, tokens=[256, 0, 300], n=256, k=256,
                                  d_dtype="float8_e4m3fn", seed=seed)
        kw = {k: _cpu(v) for k, v in pb.kwargs(sf_vec_size=32).items()}
        operands = tuple(kw[x] for x in ("a_tensor", "sfa_tensor", "padded_offsets", "b_tensor", "sfb_tensor"))
        m, n, l = kw["a_tensor"].shape[0], 256, 3
    else:
        from fusegemm.problems import make_batched_problem
        op = Op("gemm_amax", arch="sm_90a", tile_n=128)
        kw = {k: _cpu(v) for k, v in make_batched_problem(m=200, n=264, k=320, batch=3, seed=seed).kwargs().items()}
        operands = tuple(kw[x] for x in ("a_tensor", "b_tensor", "sfa_tensor", "sfb_tensor"))
        m, n, l = 200, 264, 3
    return op, operands, epilogue_inputs(op, m, n, l, g, device="cpu", element=torch.rand)


@pytest.mark.parametrize("kind", ["grouped", "scaled", "kgrouped", "batched"])
def test_a_memoised_call_pattern_launches_what_a_full_validation_would(kind, monkeypatch, no_device):
    """Op's host fast path: a second call of a validated pattern (new tensors, same layouts) is not
    parsed again, and packs the very bytes a fresh op's full validation packs for those tensors
    (every address re-read: operands, tensor maps, inputs, outputs); execute at known addresses
    takes the memo too; operands passed another way are validated in full."""
    launches, parsed = [], []
    monkeypatch.setattr("fusegemm.runtime.launch.prepare",
                        lambda kernel, cfg: lambda buf, stream: launches.append(bytes(buf._data)))
    monkeypatch.setattr(Op, "_check_devices", lambda self, call, more: 0)
    monkeypatch.setattr("fusegemm.ops.tail.zero_tail", lambda *a: None)
    monkeypatch.setattr("fusegemm.runtime.load.driver", lambda: _Driver())
    monkeypatch.setattr("fusegemm.runtime.load.check", lambda *a: None)
    monkeypatch.setattr("fusegemm.ops.engine.alloc", lambda shape, dtype, device: torch.empty(shape))
    parse = Op._parse
    monkeypatch.setattr(Op, "_parse", lambda self, *a: parsed.append(1) or parse(self, *a))
    op, operands1, inputs1 = _case(kind, 1)
    _, operands2, inputs2 = _case(kind, 2)
    op._launcher = _Packed()
    op(*operands1, inputs=inputs1)
    out = op(*operands2, inputs=inputs2)
    assert (len(parsed), len(launches), len(op._memo)) == (1, 2, 1)
    # Independently of the engine's code: every tensor of the second call is in its launch (a
    # pointer field or a map's address) and none of the first call's is.
    first, second = _addresses(operands1, inputs1), _addresses(operands2, inputs2, out)
    assert second <= _words(launches[1]) and not first & _words(launches[1])

    fresh = _case(kind, 2)[0]
    fresh._launcher = _Packed()
    dims = fresh._dims(fresh._parse(operands2, {}))
    outputs = {k: out[k].reshape(shape) for k, (shape, _, _) in fresh.epilogue.buffers(*dims).items()}
    fresh.execute(*operands2, inputs=inputs2, outputs=outputs)
    # (A number input's device copy is each op's own: its field is compared as present only.)
    numbers = [i.slot for i in op.epilogue.inputs if isinstance(inputs2.get(i.name), float)]
    assert _without(launches[2], numbers) == _without(launches[1], numbers)
    fresh.execute(*operands2, inputs=inputs2, outputs=outputs)
    assert (len(parsed), launches[3]) == (3, launches[2])     # the execute pattern: memoised too
    moved = {k: v.clone() for k, v in outputs.items()}         # and re-addressed
    fresh.execute(*operands2, inputs=inputs2, outputs=moved)
    assert len(parsed) == 3 and _addresses((), {}, moved) <= _words(launches[4])
    if kind == "grouped":   # D over the C input at new addresses: validated in full, refused by name
        with pytest.raises(ArgumentError, match=r"^outputs\['d'\]: got memory shared with an input"):
            fresh.execute(*operands2, inputs=inputs2, outputs={**moved, "d": inputs2["c"]})
        assert len(parsed) == 4
    from fusegemm.ops.engine import positional_operands
    op(**dict(zip(positional_operands(op.kind), operands1)), inputs=inputs1)   # by keyword: another pattern
    assert (len(op._memo), len(launches)) == (2, 6)

def _without(raw, fields):
    """Packed parameters with ``fields`` (8-byte pointers) checked non-null and cleared."""
    from fusegemm.generator.params import GROUPED_PARAMS
    raw = bytearray(raw)
    for f in fields:
        at = GROUPED_PARAMS.offsets()[f]
        assert any(raw[at:at + 8])
        raw[at:at + 8] = bytes(8)
    return bytes(raw)


def _addresses(operands, inputs, outputs=None):
    tensors = [*operands, *inputs.values(), *(outputs.values() if outputs is not None else ())]
    return {t.data_ptr() for t in tensors if isinstance(t, torch.Tensor) and t.numel()}


def _words(raw):
    import struct
    return set(struct.unpack(f"<{len(raw) // 8}Q", raw[:len(raw) // 8 * 8]))


# ---------------------------------------------------------------- every input slot of the ABI
USER_WIDE = DATA / "user_wide_inputs.yaml"


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_a_spec_with_every_input_slot_compiles_spill_free(arch, session_cache):
    """Four row, two column (bfloat16 and float32), three expert and two scalar inputs: each its
    own ABI slot, each column input its own base in the rule, NVRTC-compiled for both archs."""
    from fusegemm import build as b
    from fusegemm.generator.render import render
    from fusegemm.generator.variants import make_variant
    v = make_variant(load_spec(USER_WIDE), arch=arch)
    text = render(v).text
    assert "col_base_bias =" in text and "col_base_col_in1 =" in text
    (r,) = b.build([v], cache=session_cache)
    assert r.ok, r.error[:3000]
    assert r.spill_bytes == 0 and r.registers > 0, r


def test_a_spec_with_every_input_slot_routes_each_input_to_its_slot(no_device):
    op = fusegemm.Op(str(USER_WIDE), arch="sm_90a")
    slots = {i.name: i.slot for i in op.spec.epilogue.inputs}
    assert slots == {"alpha": "alpha", "gamma": "beta", "beta": "expert_in2", "gate": "prob", "scale": "row_scale",
                     "mask": "row_in2", "shift": "row_in3", "bias": "bias", "bias2": "col_in1", "eps": "norm_const",
                     "tau": "scalar_in1"}
    l, m, n, k = 2, 512, 256, 64
    a, b = torch.zeros((m, k), dtype=torch.bfloat16), torch.zeros((l, n, k), dtype=torch.bfloat16)
    off = torch.tensor([256, 512], dtype=torch.int32)
    ins = {name: torch.ones(l) for name in ("alpha", "gamma", "beta")}
    ins.update({name: torch.ones(m) for name in ("gate", "scale", "mask", "shift")})
    ins.update(bias=torch.zeros((l, n), dtype=torch.bfloat16).t(), bias2=torch.zeros((l, n)).t(),
               eps=torch.ones(1), tau=torch.ones(1))
    call = op._parse((a, off, b), {})
    values, _ = op._inputs(ins, call, [])
    assert values == {slots[name]: t.data_ptr() for name, t in ins.items()}
    packed, _ = _launch(op, call, values, {"d": 1000})
    assert all(packed[slots[name]] == t.data_ptr() for name, t in ins.items())


def test_a_spec_with_every_input_slot_interprets_to_its_formula():
    """The interpreter reads each input by its name (independent formula in float64)."""
    op = fusegemm.Op(str(USER_WIDE), arch="sm_90a")
    rng = np.random.default_rng(3)
    l, m, n, k = 2, 512, 128, 64
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((l, n, k)).astype(np.float32)
    off = np.array([256, 512], np.int32)
    ins = {name: rng.random(l).astype(np.float32) for name in ("alpha", "gamma", "beta")}
    ins.update({name: rng.random(m).astype(np.float32) for name in ("gate", "scale", "mask", "shift")})
    ins.update(bias=rng.random((n, l)).astype(np.float32), bias2=rng.random((n, l)).astype(np.float32),
               eps=0.25, tau=0.5)
    import ml_dtypes
    ref = op.reference(a.astype(ml_dtypes.bfloat16), off, b.astype(ml_dtypes.bfloat16), inputs={
        **ins, "bias": ins["bias"].astype(ml_dtypes.bfloat16)})
    a64 = a.astype(ml_dtypes.bfloat16).astype(np.float64)
    b64 = b.astype(ml_dtypes.bfloat16).astype(np.float64)
    e = np.repeat([0, 1], 256)
    acc = np.einsum("mk,mnk->mn", a64, b64[e]).astype(np.float32).astype(np.float64)
    bias = ins["bias"].astype(ml_dtypes.bfloat16).astype(np.float64)
    g = (ins["alpha"][e, None] * acc + bias[:, e].T) * ins["gate"][:, None] + ins["bias2"][:, e].T * ins["scale"][:, None]
    h = g * ins["mask"][:, None] + ins["shift"][:, None] * ins["gamma"][e, None] + ins["beta"][e, None] * 0.25 + 0.5
    np.testing.assert_allclose(ref["d"], h, rtol=2e-5, atol=2e-5)


# ---------------------------------------------------------------- outputs named by the spec
USER_NAMED = DATA / "user_named_outputs.yaml"


def test_outputs_named_by_the_spec_take_their_slots(no_device):
    """h takes slot d and pre slot c: the rule writes both through those slots, the buffers and
    the parameter struct use the spec's names and the slots' fields, the interpreter answers
    by name."""
    from fusegemm.generator.emit import rule_model
    op = fusegemm.Op(str(USER_NAMED), arch="sm_90a")
    assert [(o.name, o.slot) for o in op.epilogue.outputs] == [("h", "d"), ("pre", "c")]
    traits = dict(rule_model(op.epilogue).traits)
    assert (traits["kHasC"], traits["kHasD"]) == ("true", "true")
    l, m, n, k = 2, 512, 256, 64
    bufs = op.epilogue.buffers(n, m, l)
    assert {k_: v[:2] for k_, v in bufs.items()} == {"h": ((m, n), "bfloat16"), "pre": ((m, n), "float32")}
    a, b = torch.zeros((m, k), dtype=torch.bfloat16), torch.zeros((l, n, k), dtype=torch.bfloat16)
    off = torch.tensor([256, 512], dtype=torch.int32)
    call = op._parse((a, off, b), {})
    values, _ = _launch(op, call, {}, {"h": 1000, "pre": 2000})
    assert (values["d_out"], values["c_out"], values["ldd"], values["ldc"]) == (1000, 2000, n, n)

    rng = np.random.default_rng(4)
    import ml_dtypes
    a = rng.standard_normal((m, k)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((l, n, k)).astype(ml_dtypes.bfloat16)
    alpha = np.array([0.5, 2.0], np.float32)
    ref = op.reference(a, off.numpy(), b, inputs={"alpha": alpha})
    e = np.repeat([0, 1], 256)
    acc = np.einsum("mk,mnk->mn", a.astype(np.float64), b.astype(np.float64)[e]).astype(np.float32)
    pre = alpha[e, None] * acc
    np.testing.assert_array_equal(ref["pre"], pre)
    h = 0.5 * pre.astype(np.float64) * (1 + np.tanh(np.sqrt(2 / np.pi) * (pre + 0.044715 * pre.astype(np.float64) ** 3)))
    np.testing.assert_allclose(ref["h"].astype(np.float32), h, rtol=1e-2, atol=1e-2)
    assert set(ref.keys()) >= {"h", "pre"} and ref["d"] is None


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_outputs_named_by_the_spec_compile_spill_free(arch, session_cache):
    from fusegemm import build as b
    from fusegemm.generator.variants import make_variant
    (r,) = b.build([make_variant(load_spec(USER_NAMED), arch=arch)], cache=session_cache)
    assert r.ok, r.error[:3000]
    assert r.spill_bytes == 0 and r.registers > 0, r


# ---------------------------------------------------------------- a per-column reduction (dbias)
USER_DBIAS = DATA / "user_dbias.yaml"


def test_a_column_sum_is_an_expert_by_column_buffer(no_device):
    """dbias (L, W) float32, zero-filled, through the ABI's dbias field; the interpreter sums each
    expert's rows of the value (independent formula in float64)."""
    import ml_dtypes
    op = fusegemm.Op(str(USER_DBIAS), arch="sm_90a")
    l, m, n, k = 3, 768, 128, 64
    assert op.epilogue.buffers(n, m, l)["dbias"] == ((l, n), "float32", 0.0)
    a, b = torch.zeros((m, k), dtype=torch.bfloat16), torch.zeros((l, n, k), dtype=torch.bfloat16)
    off = torch.tensor([256, 256, 768], dtype=torch.int32)
    call = op._parse((a, off, b), {})
    values, _ = _launch(op, call, {}, {"d": 1000, "dbias": 2000})
    assert (values["d_out"], values["dbias"]) == (1000, 2000)

    rng = np.random.default_rng(7)
    a = rng.standard_normal((m, k)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((l, n, k)).astype(ml_dtypes.bfloat16)
    alpha = rng.random(l).astype(np.float32)
    prob = rng.random(m).astype(np.float32)
    c = rng.standard_normal((m, n)).astype(ml_dtypes.bfloat16)
    ref = op.reference(a, off.numpy(), b, inputs={"alpha": alpha, "prob": prob, "c": c})
    e = np.repeat([0, 2], [256, 512])
    acc = np.einsum("mk,mnk->mn", a.astype(np.float64), b.astype(np.float64)[e]).astype(np.float32)
    d = 2 * np.maximum(c.astype(np.float64), 0) * (alpha[e, None] * acc) * prob[:, None]
    want = np.zeros((l, n))
    want[0], want[2] = d[:256].sum(axis=0), d[256:].sum(axis=0)    # expert 1 has no rows
    np.testing.assert_allclose(ref["dbias"], want, rtol=1e-5, atol=1e-4 * np.abs(d).sum(axis=0).max())


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_a_column_sum_compiles_spill_free(arch, session_cache):
    """The engine's butterfly column sums and their atomics, both archs (sm_90a: the rule goes
    through the engine, not the fragment blocks)."""
    from fusegemm import build as b
    from fusegemm.generator.render import render
    from fusegemm.generator.variants import make_variant
    v = make_variant(load_spec(USER_DBIAS), arch=arch)
    assert "static constexpr bool kColSum = true;" in render(v).text
    (r,) = b.build([v], cache=session_cache)
    assert r.ok, r.error[:3000]
    assert r.spill_bytes == 0 and r.registers > 0, r
