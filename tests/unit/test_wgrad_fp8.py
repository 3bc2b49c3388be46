"""FP8 weight gradients on the CPU (specs/grouped_gemm_wgrad_fp8.yaml, the kscaled kernel class: the
sm_90a blockwise kernel's K-grouped mode with 1x128 FP32 scales, the sm_100a block-scaled kernel's
with MXFP8 scales): the sm_90a kernels compile clean (sm_100a's static checks are in
test_sm100_static.py), each arch runs its recipe by default and refuses the other's with the
reason; the operands' checks name what is wrong; the launch struct's maps; quantize_wgrad against
quantize_1x128 of the transpose; the references against independent formulas.
tests/gpu/test_wgrad_fp8_gpu.py runs the sm_90a kernel."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import fusegemm  # noqa: E402
from fusegemm.base.errors import ArgumentError, UnsupportedError  # noqa: E402
from fusegemm.formats import blockwise as nb  # noqa: E402
from fusegemm.formats import torch_blockwise as tb  # noqa: E402
from fusegemm.generator import registry  # noqa: E402
from fusegemm.generator.render import render  # noqa: E402
from fusegemm.generator.variants import make_variant  # noqa: E402
from fusegemm.runtime import disasm  # noqa: E402
from fusegemm.runtime.compile import compile_source  # noqa: E402
from fusegemm.runtime.cubin_info import Cubin  # noqa: E402

SPEC = "grouped_gemm_wgrad_fp8"


def _operands(t=768, m=256, n=200, seed=0, dtype=torch.float8_e4m3fn):
    g = torch.Generator().manual_seed(seed)
    dy = torch.randn(t, m, generator=g).to(torch.bfloat16)
    x = torch.randn(t, n, generator=g).to(torch.bfloat16)
    a, sfa = tb.quantize_wgrad(dy, dtype)
    b, sfb = tb.quantize_wgrad(x, dtype)
    return dy, x, a, sfa, b, sfb


@pytest.mark.parametrize("axes", [{}, {"tile_n": 128, "ab_dtype": "float8_e5m2", "d_dtype": "float32"}],
                         ids=["default", "n128.e5m2.f32"])
def test_the_kernels_compile_clean(axes):
    v = make_variant(SPEC, arch="sm_90a", **axes)
    src = render(v)
    assert src.impl.kernel == "fusegemm::sm90::BlockScaledGemmKernel"
    assert "static constexpr bool kKGrouped = true;" in src.text
    cub = compile_source(src.text, arch="sm_90a", kernel=src.symbol)
    res = Cubin(cub.data).resources(src.symbol)
    assert res.local_bytes == 0, res
    hist = disasm.sass_histogram(cub.data)
    assert disasm.count_prefix(hist, "QGMMA") > 0 and disasm.count_prefix(hist, "HGMMA") == 0
    # Per-column B scales: an FMUL (sfa * sfb) and an FFMA per accumulator element and half.
    halves = v.tile_n // 128
    assert disasm.count_prefix(hist, "FMUL") >= 64 * halves and disasm.count_prefix(hist, "FFMA") >= 64 * halves


def test_each_arch_runs_its_recipe_and_refuses_the_other():
    """sm_90a: the blockwise recipe (FP32 scales per 128 tokens, promoted); sm_100a: MXFP8 (E8M0 per
    32 tokens, its MMA's scale atoms), its policy's default. Each refuses the other with the reason."""
    assert (fusegemm.Op(SPEC, arch="sm_90a").variant.sf_vec_size, fusegemm.Op(SPEC, arch="sm_100a").variant.sf_vec_size
            ) == (128, 32)
    for arch in ("sm_90a", "sm_100a"):
        assert fusegemm.Op(SPEC, arch=arch).check_support()
    with pytest.raises(UnsupportedError, match="MXFP8 weight gradients run on sm_100a"):
        fusegemm.Op(SPEC, arch="sm_90a", sf_dtype="float8_e8m0fnu", sf_vec_size=32).check_support()
    with pytest.raises(UnsupportedError, match="blockwise recipe .* runs on sm_90a"):
        fusegemm.Op(SPEC, arch="sm_100a", sf_dtype="float32", sf_vec_size=128).check_support()
    assert not registry.executed(SPEC, "sm_100a")


def test_quantize_wgrad_is_quantize_1x128_of_the_transpose():
    dy, _, a, sfa, _, _ = _operands(t=640, m=136)   # T not a multiple of 128 along the way: 640 = 5 blocks
    a2, s2 = tb.quantize_1x128(dy.t().contiguous())
    assert a.shape == (136, 640) and a.stride() == (640, 1)
    assert sfa.shape == (136, 5) and sfa.stride()[0] == 1 and sfa.stride()[1] % 4 == 0
    assert torch.equal(a.view(torch.uint8), a2.view(torch.uint8)) and torch.equal(sfa, s2)
    # numpy's helper rounds x / s once from float64: the same scales, the bytes within one step on ties
    qa, sa = nb.quantize_1x128(dy.t())
    np.testing.assert_array_equal(sfa.numpy(), sa)
    diff = np.abs(a.view(torch.uint8).numpy().astype(int) - qa.view(np.uint8).astype(int))
    assert diff.max() <= 1 and (diff > 0).mean() < 0.01


def test_the_reference_is_the_per_expert_product_of_the_dequantized_operands():
    _, _, a, sfa, b, sfb = _operands()
    off = torch.tensor([256, 256, 768], dtype=torch.int32)
    alpha = torch.tensor([1.0, 2.0, 0.5])
    op = fusegemm.Op(SPEC, arch="sm_90a", d_dtype="float32")
    d = np.asarray(op.reference(a, sfa, b, sfb, off, inputs={"alpha": alpha})["d"], np.float64)
    assert d.shape == (3 * 256, 200)
    # Independent: dequantize element by element (scale of column t // 128), then multiply.
    av = a.float().double().numpy() * sfa.double().numpy()[:, np.arange(768) // 128]
    bv = b.float().double().numpy() * sfb.double().numpy()[:, np.arange(768) // 128]
    want = [av[:, :256] @ bv[:, :256].T, np.zeros((256, 200)), 0.5 * av[:, 256:] @ bv[:, 256:].T]
    np.testing.assert_allclose(d, np.concatenate(want), rtol=2 ** -23, atol=1e-6 * np.abs(want[0]).max())


def test_the_mxfp8_reference_and_operands():
    """sm_100a's recipe: E8M0 scales per 32 tokens in MX atoms over (M, T/32) and (N, T/32); the
    reference dequantizes them (decoded here from the logical bytes) and multiplies per expert."""
    from fusegemm.formats.torch_mx import pack_sf, quantize_mx
    g = torch.Generator().manual_seed(2)
    dy, x = torch.randn(512, 128, generator=g), torch.randn(512, 136, generator=g)
    (a, sa), (b, sb) = quantize_mx(dy.t().contiguous()), quantize_mx(x.t().contiguous())   # (M, T), (M, T/32)
    off = torch.tensor([256, 512], dtype=torch.int32)
    op = fusegemm.Op(SPEC, arch="sm_100a", d_dtype="float32")
    call = op._parse((a, pack_sf(sa), b, pack_sf(sb), off), {})
    assert (call.vec, call.sfk, call.blockwise, call.sf) == (32, 16, False, "float8_e8m0fnu")
    d = np.asarray(op.reference(a, pack_sf(sa), b, pack_sf(sb), off, inputs={"alpha": torch.tensor([1.0, 0.5])})["d"])
    cols = np.arange(512) // 32
    av = a.float().double().numpy() * sa.float().double().numpy()[:, cols]
    bv = b.float().double().numpy() * sb.float().double().numpy()[:, cols]
    want = np.concatenate([av[:, :256] @ bv[:, :256].T, 0.5 * av[:, 256:] @ bv[:, 256:].T])
    np.testing.assert_allclose(d, want, rtol=2 ** -23, atol=1e-6 * np.abs(want).max())
    # FP32 blockwise scales handed to the MXFP8 op: named, with the layout it takes
    _, _, a8, sfa8, b8, sfb8 = _operands(t=512, m=128, n=136)
    with pytest.raises(ArgumentError, match="sfa_tensor"):
        op._parse((a8, sfa8, b8, sfb8, off), {})


def test_the_launch_struct_maps_token_columns():
    _, _, a, sfa, b, sfb = _operands(t=512, m=128, n=256)
    op = fusegemm.Op(SPEC, arch="sm_90a")
    call = op._parse((a, sfa, b, sfb, torch.tensor([512], dtype=torch.int32)), {})
    assert (call.t, call.m_out, call.n, call.l, call.sfk) == (512, 128, 256, 1, 4)
    assert op._dims(call) == (256, 128, 1)
    assert op.dims_of({"a_tensor": (128, 512), "b_tensor": (256, 512), "padded_offsets": (1,)}) == (256, 128, 1)


BAD = [
    # (what is changed, the argument named, a phrase of the message)
    ("a_tensor token-major (T, M), not transposed", "a_tensor", "token-contiguous"),
    ("b_tensor of another FP8 format", "b_tensor.dtype", "float8_e4m3fn"),
    ("T not a multiple of 256", "a_tensor.shape[1]", "multiple of 256"),
    ("M not a multiple of 128", "a_tensor.shape[0]", "multiple of 128"),
    ("sfb_tensor of A's shape", "sfb_tensor.shape", "B = X^T"),
    ("sfa_tensor row-major", "sfa_tensor.stride", "unit stride along M"),
    ("a_tensor bfloat16", "a_tensor.dtype", "float8"),
    ("an e5m2 A for an e4m3 op", "a_tensor.dtype", "this op was built for"),
]


@pytest.mark.parametrize("what,name,phrase", BAD, ids=[b[0] for b in BAD])
def test_bad_operands_name_the_argument(what, name, phrase):
    dy, x, a, sfa, b, sfb = _operands(t=512, m=256, n=128)
    off = torch.tensor([256, 512], dtype=torch.int32)
    ops = [a, sfa, b, sfb, off]
    if what.startswith("a_tensor token-major"):
        ops[0] = a.t()   # (T, M) data given as its (M, T) view: M contiguous
    elif what.startswith("b_tensor of another"):
        ops[2] = b.view(torch.uint8).view(torch.float8_e5m2)
    elif what.startswith("T not"):
        ops[0], ops[2] = a[:, :384].contiguous(), b[:, :384].contiguous()
    elif what.startswith("M not"):
        ops[0], ops[1] = a[:200].contiguous(), nb.blockwise_sfa_layout(sfa[:200].contiguous())
    elif what.startswith("sfb_tensor"):
        ops[3] = sfa
    elif what.startswith("sfa_tensor row-major"):
        ops[1] = sfa.contiguous()
    elif what.startswith("a_tensor bfloat16"):
        ops[0] = dy.t().contiguous()
    else:
        e5 = tb.quantize_wgrad(dy, torch.float8_e5m2)[0]
        ops[0], ops[2] = e5, tb.quantize_wgrad(x, torch.float8_e5m2)[0]
    op = fusegemm.Op(SPEC, arch="sm_90a")
    with pytest.raises(ArgumentError) as info:
        op._parse(tuple(ops), {})
    assert info.value.name.startswith(name) and phrase in str(info.value), str(info.value)


@pytest.mark.parametrize("arch,vec", [("sm_90a", 128), ("sm_100a", 32)])
def test_every_configuration_class_has_exact_verification_cases(arch, vec):
    """Every class an arch implements (tile N 128 / 256, e4m3 / e5m2, its recipe) has exact
    verification cases, pinned to the class, their problems built in the recipe's layout: what
    `fusegemm selftest` runs, and what the first launch of each class runs where the row is
    executed=False (fusegemm/verify.py; sm_100a's: no Blackwell GPU has run it; sm_90a's ran on
    the H200)."""
    from fusegemm.selftest import all_classes, class_cases, wgrad_fp8_problem
    classes = all_classes(arch, ("grouped_gemm_wgrad_fp8",))
    assert sorted((c.tile[1], c.recipe[0]) for c in classes) == [
        (128, "float8_e4m3fn"), (128, "float8_e5m2"), (256, "float8_e4m3fn"), (256, "float8_e5m2")]
    assert {c.recipe[2] for c in classes} == {vec}
    assert registry.executed(SPEC, arch) == (arch == "sm_90a")
    for cls in classes:
        cases = class_cases(cls)
        assert len(cases) == 2 and all(case["run"] == "wgrad_fp8" for _, case in cases)
        for _, case in cases:
            assert case["axes"]["tile_n"] == cls.tile[1] and case["axes"]["ab_dtype"] == cls.recipe[0]
            op = fusegemm.Op(SPEC, arch=arch, **case["axes"])
            op.check_support()
            a, sfa, b, sfb, off, _ = wgrad_fp8_problem(case["tokens"], case["m"], case["n"], 1,
                                                       case["axes"]["ab_dtype"], vec)
            op._parse((a, sfa, b, sfb, off), {})   # the case's operands are the op's


def test_the_verification_problem_is_exact():
    """selftest's problem (integers in [-2, 2], power-of-two scales): the reference is the exact
    integer arithmetic, so the kernel's D must equal it bit for bit in any summation order."""
    from fusegemm.selftest import wgrad_fp8_problem
    a, sfa, b, sfb, off, alpha = wgrad_fp8_problem([256, 0, 700, 100], 256, 192, 3)
    op = fusegemm.Op(SPEC, arch="sm_90a", d_dtype="float32")
    d = np.asarray(op.reference(a, sfa, b, sfb, off, inputs={"alpha": alpha})["d"])
    cols = np.arange(a.shape[1]) // 128
    av = a.float().double().numpy() * sfa.double().numpy()[:, cols]
    bv = b.float().double().numpy() * sfb.double().numpy()[:, cols]
    want, start = [], 0
    for e, end in enumerate(off.tolist()):
        want.append(float(alpha[e]) * (av[:, start:end] @ bv[:, start:end].T))
        start = end
    want = np.concatenate(want)
    assert np.array_equal(d.astype(np.float64), want) and np.array_equal(want.astype(np.float32), want)
    assert np.abs(av).max() <= 8 and set(np.unique(np.abs(a.float().numpy()))) <= {0.0, 1.0, 2.0}


def test_the_torch_op_traces_on_fake_tensors(monkeypatch):
    """Its torch op (fusegemm.torch_library.register) has the class's schema and traces on fake
    tensors to D (L, M, N); jax_ffi.spec_op plans the same output."""
    import fusegemm.torch_library as fg
    from torch._subclasses.fake_tensor import FakeTensorMode

    from fusegemm.ops.engine import Op, positional_operands
    monkeypatch.setattr("fusegemm.ops.device.device_arch", lambda d: "sm_90a")
    face = fg.register(SPEC, name="t_wgrad_fp8", d_dtype="float32")
    assert str(face.op.default._schema).startswith(
        "fusegemm::t_wgrad_fp8(Tensor a_tensor, Tensor sfa_tensor, Tensor b_tensor, Tensor sfb_tensor, "
        "Tensor padded_offsets, Tensor? row_ends=None, Tensor? alpha=None)")
    with FakeTensorMode():
        cuda = dict(device="cuda")
        a = torch.empty((256, 512), dtype=torch.float8_e4m3fn, **cuda)
        b = torch.empty((384, 512), dtype=torch.float8_e4m3fn, **cuda)
        sfa = torch.empty((4, 256), **cuda).t()
        sfb = torch.empty((4, 384), **cuda).t()
        out = face(a, sfa, b, sfb, torch.empty((2,), dtype=torch.int32, **cuda))
        assert {k: (tuple(v.shape), v.dtype) for k, v in out.items()} == {"d": ((2, 256, 384), torch.float32)}
    plan = Op.planned(SPEC)
    assert positional_operands("kscaled") == ("a_tensor", "sfa_tensor", "b_tensor", "sfb_tensor", "padded_offsets")
    assert plan.dims_of({"a_tensor": (256, 512), "b_tensor": (384, 512), "padded_offsets": (2,)}) == (384, 512, 2)


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_power_of_two_e8m0_scales_at_128_run_on_both_archs(arch):
    """The recipe's UE8M0 scales (sf_dtype float8_e8m0fnu, sf_vec_size 128): sm_90a converts them to
    the FP32 values they encode, sm_100a expands them into MX atoms (each over its four 32-token
    blocks); both exactly, so the operands the kernel parses and the reference are the FP32
    recipe's."""
    from fusegemm.formats import e8m0_bytes
    from fusegemm.ops.scaled_layouts import host_operands
    from fusegemm.selftest import wgrad_fp8_problem
    a, sfa, b, sfb, off, alpha = wgrad_fp8_problem([256, 0, 700, 100], 256, 192, 3, vec=128)
    ea, eb = e8m0_bytes(sfa.contiguous()), e8m0_bytes(sfb.contiguous())
    want = fusegemm.Op(SPEC, arch="sm_90a", d_dtype="float32").reference(a, sfa, b, sfb, off, inputs={"alpha": alpha})
    op = fusegemm.Op(SPEC, arch=arch, sf_dtype="float8_e8m0fnu", sf_vec_size=128, d_dtype="float32")
    assert op.check_support() and (op.e8m0_scales, op.blockwise_mx) == ((True, False) if arch == "sm_90a" else
                                                                         (False, True))
    ops, kw, _ = host_operands(op, (a, ea, b, eb, off), {}, None)
    call = op._parse(ops, kw)
    assert (call.vec, call.sf) == ((128, "float32") if arch == "sm_90a" else (32, "float8_e8m0fnu"))
    got = op.reference(a, ea, b, eb, off, inputs={"alpha": alpha})
    assert np.array_equal(np.asarray(got["d"]), np.asarray(want["d"]))
    if arch == "sm_100a":   # the expanded atoms decode to the same products through the MX path
        mx = fusegemm.Op(SPEC, arch=arch, d_dtype="float32").reference(a, ops[1], b, ops[3], off,
                                                                      inputs={"alpha": alpha})
        assert np.array_equal(np.asarray(mx["d"]), np.asarray(want["d"]))
    with pytest.raises(ArgumentError, match=r"^sfa_tensor.shape: got \(256, 4\)"):   # too few K blocks
        op._parse(*host_operands(op, (a, ea[:, :4], b, eb, off), {}, None)[:2])


class _Maps:
    """Records a launcher's tensor-map encodings."""

    def __init__(self):
        self.calls = {}

    def tiled(self, address, dtype, shape, strides, box, swizzle=128, *rest):
        self.calls[len(self.calls)] = dict(address=address, dtype=dtype, shape=shape, strides=strides, box=box,
                                           swizzle=swizzle)
        return b"\0" * 128


class _Launcher:
    """The loaded kernel's host side without a GPU: the compiled cubin's own contract."""

    def __init__(self, variant):
        src = render(variant)
        cub = compile_source(src.text, arch=variant.arch, kernel=src.symbol)
        self.contract = Cubin(cub.data).contract(src.symbol)
        self.tmaps, self.sms, self.cluster = _Maps(), 132, (1, 1)
        self.tile = (self.contract.tile_m, self.contract.tile_n)


@pytest.mark.parametrize("arch,vec,tokens", [("sm_90a", 128, [256, 0, 700, 100]), ("sm_100a", 32, [256, 0, 700, 100]),
                                             ("sm_90a", 128, [0, 0])])
def test_the_maps_cover_the_token_columns_with_the_kernels_boxes(arch, vec, tokens):
    """The launch values against the compiled kernel's contract: A / B maps over (T, rows) bytes with
    the contract's boxes and SW128, the scales' maps (blockwise: float32 (rows, T/128), boxes of the
    operand box's rows by one block; MXFP8: the atom layout), m_rows = M, k = T; no tokens at all:
    every map stands on an output buffer with a real extent (nothing is loaded)."""
    from fusegemm.selftest import wgrad_fp8_problem
    m, n = 256, 192
    a, sfa, b, sfb, off, _ = wgrad_fp8_problem(tokens, m, n, 3, vec=vec)
    op = fusegemm.Op(SPEC, arch=arch)
    op._launcher = ln = _Launcher(op.kernel_variant)
    c, t = ln.contract, a.shape[1]
    ends = torch.zeros(len(tokens), dtype=torch.int32)          # row_ends reach the launch
    call = op._parse((a, sfa, b, sfb, off), {"row_ends": ends})
    v = op._launch_values(call, {"d": 4096})
    assert (v["m_rows"], v["n"], v["k"], v["num_experts"], v["row_ends"]) == (m, n, t, len(tokens), ends.data_ptr())
    maps = list(ln.tmaps.calls.values())
    assert len(maps) == 4
    if t == 0:
        assert {x["address"] for x in maps} == {4096} and all(d > 0 for x in maps for d in x["shape"])
        return
    ma, mb, msa, msb = ({x["address"]: x for x in maps}[p.data_ptr()] for p in (a, b, sfa, sfb))
    assert (ma["shape"], ma["strides"], ma["box"], ma["swizzle"]) == ((t, m), (t,), (c.box_a_inner, c.box_a_outer), 128)
    assert (mb["shape"], mb["strides"], mb["box"]) == ((t, n), (t,), (c.box_b_inner, c.box_b_outer))
    if vec == 128:
        assert (msa["dtype"], msa["shape"], msa["strides"], msa["box"]) == ("float32", (m, t // 128),
                                                                            (4 * m,), (c.box_a_outer, 1))
        assert (msb["shape"], msb["strides"], msb["box"]) == ((n, t // 128), (4 * 192,), (c.box_b_outer, 1))
    else:
        kt = -(-(t // 32) // 4)
        assert (msa["dtype"], msa["shape"], msa["box"]) == ("uint32", (128, kt, 2, 1), (128, c.sf_box_k, 1, 1))
        assert (msb["shape"], msb["box"]) == ((128, kt, 2, 1), (128, c.sf_box_k, c.sf_box_nb, 1))
