"""fusegemm inside torch: the custom op (opcheck), torch.compile(fullgraph=True) of a small MoE
block, CUDA graph capture and replay on a side stream, and launches from a kernel bundle in a
process without NVRTC. Tolerances: BF16 outputs of one kernel are compared exactly between
eager and compiled/replayed runs (same kernel, same inputs); against float64 references with
the bf16 rounding bound (2**-8 relative) plus the FP32 accumulation bound."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

import fusegemm  # noqa: E402

pytestmark = pytest.mark.gpu


def _problem(sizes, n, k, seed=0, pad_rows=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    l = len(sizes)
    m = sum(sizes) + pad_rows
    a = (torch.rand((m, k), generator=g, device="cuda") - 0.5).to(torch.bfloat16)
    b = (torch.rand((l, n, k), generator=g, device="cuda") - 0.5).to(torch.bfloat16)
    off = torch.tensor([sum(sizes[: i + 1]) for i in range(l)], dtype=torch.int32, device="cuda")
    alpha = torch.rand((l,), generator=g, device="cuda") + 0.5
    return a, off, alpha, b


def _reference(a, off, alpha, b):
    out = torch.zeros((int(off[-1]), b.shape[1]), dtype=torch.float64, device="cuda")
    start = 0
    for e, end in enumerate(off.tolist()):
        out[start:end] = float(alpha[e]) * (a[start:end].double() @ b[e].double().T)
        start = end
    return out


def _close(got, want, a, b, off):
    scale = torch.zeros_like(want)
    start = 0
    for e, end in enumerate(off.tolist()):
        scale[start:end] = a[start:end].double().abs() @ b[e].double().abs().T
        start = end
    err = (got[: want.shape[0]].double() - want).abs()
    assert bool((err <= 2.0**-8 * want.abs() + 2.0**-20 * 2 * scale + 1e-30).all()), float(err.max())


def test_opcheck():
    import fusegemm.torch_library as fg   # registers torch.ops.fusegemm.*
    assert torch.ops.fusegemm.grouped_gemm.default is not None and fg.grouped_gemm
    a, off, alpha, b = _problem([256, 512, 256], 256, 128, seed=1)
    for args in ((a, off, alpha, b, None, None, None, None, torch.bfloat16, torch.bfloat16, False, False),
                 (a, off, alpha, b, None, None, None, None, torch.float32, torch.bfloat16, True, False)):
        torch.library.opcheck(torch.ops.fusegemm.grouped_gemm.default, args)


class MoE(torch.nn.Module):
    """Routing -> grouped GEMM (gate and up) -> SwiGLU in torch -> grouped GEMM (down) -> combine.
    Static shapes: every expert's rows are padded to 256 inside a buffer sized for the worst case."""

    def __init__(self, experts=4, hidden=256, ffn=512, top_k=2, seed=0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.e, self.top_k = experts, top_k
        # Forward only: the custom op registers no autograd formula yet (backward raises torch's
        # "no autograd formula" error), so the weights do not require grad.
        p = lambda t: torch.nn.Parameter(t, requires_grad=False)  # noqa: E731
        self.router = p(torch.randn(hidden, experts, generator=g) * hidden ** -0.5)
        self.w1 = p((torch.randn(experts, 2 * ffn, hidden, generator=g) * hidden ** -0.5).bfloat16())
        self.w2 = p((torch.randn(experts, hidden, ffn, generator=g) * ffn ** -0.5).bfloat16())

    def forward(self, x):
        import fusegemm.torch_library as fg
        t = x.shape[0]
        probs, expert = torch.topk(torch.softmax(x.float() @ self.router, -1), self.top_k)
        flat = expert.reshape(-1)
        order = torch.argsort(flat, stable=True)
        counts = torch.nn.functional.one_hot(flat, self.e).sum(0)   # static shape (not bincount)
        padded = (counts + 255) // 256 * 256
        ends = torch.cumsum(padded, 0)
        starts = ends - padded
        rank = torch.arange(flat.numel(), device=x.device) - (torch.cumsum(counts, 0) - counts)[flat[order]]
        slot = torch.empty_like(flat)
        slot[order] = starts[flat[order]] + rank
        rows = (t * self.top_k + 256 * self.e + 255) // 256 * 256   # worst case, a multiple of 256
        a = torch.zeros((rows, x.shape[1]), dtype=torch.bfloat16, device=x.device)
        a[slot] = x.repeat_interleave(self.top_k, 0).bfloat16()
        ones = torch.ones(self.e, device=x.device)
        h, _ = fg.grouped_gemm(a, ends.to(torch.int32), ones, self.w1)
        gate, up = h.float().chunk(2, dim=-1)
        act = (torch.nn.functional.silu(gate) * up).bfloat16()
        y, _ = fg.grouped_gemm(act, ends.to(torch.int32), ones, self.w2)
        out = (y[slot].float() * probs.reshape(-1, 1)).view(t, self.top_k, -1).sum(1)
        return out


def test_torch_compile_fullgraph_moe_block_matches_eager():
    import torch._dynamo
    torch._dynamo.reset()
    model = MoE().cuda()
    x = torch.randn(300, 256, device="cuda")
    eager = model(x)
    compiled = torch.compile(model, fullgraph=True)
    got = compiled(x)
    torch.testing.assert_close(got, eager, rtol=2e-2, atol=2e-2)
    x2 = torch.randn(300, 256, device="cuda")         # new data, same shapes: no recompile needed
    torch.testing.assert_close(compiled(x2), model(x2), rtol=2e-2, atol=2e-2)


def test_torch_compile_reduce_overhead_replays_cuda_graphs():
    """mode="reduce-overhead": the compiled block is captured into a CUDA graph after warm-up
    and replayed for new data of the same shapes; every replay equals eager."""
    import torch._dynamo
    torch._dynamo.reset()
    model = MoE(seed=3).cuda()
    compiled = torch.compile(model, mode="reduce-overhead", fullgraph=True)
    for i in range(4):                                  # warm-up, capture, then replays
        x = torch.randn(300, 256, device="cuda", generator=torch.Generator(device="cuda").manual_seed(i))
        got = compiled(x).clone()                       # graph outputs are overwritten by the next replay
        torch.testing.assert_close(got, model(x), rtol=2e-2, atol=2e-2)


def test_cuda_graph_capture_and_replay_on_a_side_stream():
    """The wrapper, the class API and the custom op captured on a non-default stream; replays
    with new data in the same input buffers give the new results."""
    import fusegemm.torch_library as fg
    a, off, alpha, b = _problem([256, 0, 512], 256, 128, seed=3)
    op = fusegemm.GroupedGemm(a, None, torch.empty((a.shape[0], 256), dtype=torch.bfloat16, device="cuda"),
                              off, alpha, b).compile()
    d_cls = torch.empty((a.shape[0], 256), dtype=torch.bfloat16, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):   # warm-up (compiles, memoises) outside the capture
        fusegemm.grouped_gemm(a, off, alpha, b_tensor=b)
        fg.grouped_gemm(a, off, alpha, b)
        op.execute(a, d_tensor=d_cls, padded_offsets=off, alpha_tensor=alpha, b_tensor=b, current_stream=s)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=s):
        d_wrap = fusegemm.grouped_gemm(a, off, alpha, b_tensor=b)[0]
        d_op, _ = fg.grouped_gemm(a, off, alpha, b)
        op.execute(a, d_tensor=d_cls, padded_offsets=off, alpha_tensor=alpha, b_tensor=b, current_stream=s)
    for seed in (4, 5):
        a2, _, alpha2, b2 = _problem([256, 0, 512], 256, 128, seed=seed)
        a.copy_(a2), alpha.copy_(alpha2), b.copy_(b2)
        graph.replay()
        torch.cuda.synchronize()
        ref = _reference(a, off, alpha, b)
        for name, d in (("wrapper", d_wrap), ("custom op", d_op), ("class", d_cls)):
            _close(d, ref, a, b, off)
        assert torch.equal(d_wrap[:768], d_op[:768]) and torch.equal(d_wrap[:768], d_cls[:768])


def test_launches_from_a_bundle_without_nvrtc(tmp_path):
    """Build a bundle, then launch every seed op family's BF16 grouped GEMM from it in a process
    where NVRTC cannot be imported and compiling raises."""
    from fusegemm import build
    path = tmp_path / "k.fgb"
    vs, _ = build.select(["grouped_gemm"], ("sm_90a",))
    build.write_bundle(vs, path)
    code = textwrap.dedent("""
        import json, sys
        import fusegemm.runtime.nvrtc as nv
        def no_nvrtc(): raise SystemExit("fusegemm tried to load NVRTC")   # (torch's CUDA init maps its own)
        nv.load = no_nvrtc
        import fusegemm.runtime.compile as comp
        def refuse(*a, **k): raise SystemExit("a compile was attempted")
        comp.compile_source = refuse
        import torch, fusegemm
        a = torch.randn(512, 128, device="cuda").bfloat16()
        b = torch.randn(2, 256, 128, device="cuda").bfloat16()
        off = torch.tensor([256, 512], dtype=torch.int32, device="cuda")
        d = fusegemm.grouped_gemm(a, off, torch.ones(2, device="cuda"), b_tensor=b)[0]
        ref = torch.cat([a[:256].float() @ b[0].float().T, a[256:].float() @ b[1].float().T])
        err = float((d.float() - ref).abs().max())
        print(json.dumps({"err": err, "patched": nv.load is no_nvrtc}))
    """)
    empty = tmp_path / "empty"
    empty.mkdir()
    env = {**os.environ, "FUSEGEMM_BUNDLE": str(path), "FUSEGEMM_CACHE_DIR": str(empty),
           "FUSEGEMM_CACHE_READONLY": "1"}
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["patched"] and out["err"] < 0.5    # and exit 0: fusegemm never asked for NVRTC
    assert not any(empty.iterdir())


# ---------------------------------------------------------------- block-scaled custom ops

def _scaled_args(op):
    """Positional arguments of torch.ops.fusegemm.<op> for a seeded integer problem, and the
    numpy reference's outputs."""
    from fusegemm import reference
    from fusegemm.output_compare import device_args
    from fusegemm.problems import make_batched_problem, make_grouped_problem
    if op == "gemm_amax":
        kw = make_batched_problem(m=200, n=264, k=256, batch=2, values="integer", seed=5).kwargs()
        d, _ = device_args(kw)
        return (d["a_tensor"], d["b_tensor"], d["sfa_tensor"], d["sfb_tensor"], "n", torch.float32, 32), \
            reference.gemm_amax(**kw)
    kw = make_grouped_problem(op, num_experts=3, tokens=[256, 0, 300], n=256, k=256, values="integer", seed=5,
                              d_dtype="float8_e4m3fn").kwargs(sf_vec_size=32)
    d, _ = device_args(kw)
    if op == "grouped_gemm_srelu":
        args = (d["a_tensor"], d["b_tensor"], d["sfa_tensor"], d["sfb_tensor"], d["padded_offsets"],
                d["alpha_tensor"], None, None, None, None, d["norm_const_tensor"], d["prob_tensor"],
                torch.bfloat16, torch.float8_e4m3fn, 32, False, False, None, "page")
    elif op == "grouped_gemm_quant":
        args = (d["a_tensor"], d["sfa_tensor"], d["padded_offsets"], d["alpha_tensor"], d["b_tensor"],
                d["sfb_tensor"], None, None, None, None, d["norm_const_tensor"], d["prob_tensor"], None,
                torch.float8_e4m3fn, 32, False, False, True, "page")
    else:
        args = (d["a_tensor"], d["b_tensor"], d["c_tensor"], d["sfa_tensor"], d["sfb_tensor"], d["padded_offsets"],
                d["alpha_tensor"], d["beta_tensor"], d["prob_tensor"], d["norm_const_tensor"],
                torch.float8_e4m3fn, 32, False, "page")
    return args, getattr(reference, op)(**kw)


SCALED = ["grouped_gemm_srelu", "grouped_gemm_quant", "grouped_gemm_dswiglu", "gemm_amax"]


@pytest.mark.parametrize("op", SCALED)
def test_block_scaled_custom_ops_opcheck_and_match_the_reference(op):
    import fusegemm.torch_library as fg
    from fusegemm.output_compare import compare_outputs
    args, ref = _scaled_args(op)
    custom = getattr(torch.ops.fusegemm, op).default
    # opcheck's test_schema compares inputs with arithmetic torch lacks for FP8 ("mul_cuda" not
    # implemented for Float8_e4m3fn); what it checks -- no input mutated, no output aliasing an
    # input -- is checked by hand below on the raw bytes.
    torch.library.opcheck(custom, args, test_utils=("test_autograd_registration", "test_faketensor",
                                                    "test_aot_dispatch_dynamic"))
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    before = [t.view(torch.uint8).clone() if t.dtype.itemsize == 1 else t.clone() for t in tensors]
    results = custom(*args)
    for t, b in zip(tensors, before):
        assert torch.equal(t.view(torch.uint8) if t.dtype.itemsize == 1 else t, b), "an input was mutated"
    spans = [(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()) for t in tensors]
    for r in results:
        p = r.untyped_storage().data_ptr()
        assert r.numel() == 0 or not any(lo <= p < lo + n for lo, n in spans), "an output aliases an input"
    names = {"grouped_gemm_srelu": fg.SRELU_OUT, "grouped_gemm_quant": fg.QUANT_OUT,
             "grouped_gemm_dswiglu": fg.DSWIGLU_OUT, "gemm_amax": fg.AMAX_OUT}[op]
    out = dict(zip(names, results))
    got = {k: (None if ref[k] is None else out[k]) for k in ref.keys()}
    err, problem = compare_outputs(ref, got, exact=op != "grouped_gemm_dswiglu", rtol=1e-5)
    assert problem is None, (op, problem, err)


def test_block_scaled_custom_ops_compile_fullgraph():
    """The srelu custom op inside torch.compile(fullgraph=True) gives the eager bytes."""
    import fusegemm.torch_library  # noqa: F401 -- registers torch.ops.fusegemm.* (alone under xdist too)
    args, _ = _scaled_args("grouped_gemm_srelu")

    def f(*a):
        c, d, d_col, amax, sfd_row, sfd_col = torch.ops.fusegemm.grouped_gemm_srelu(*a)
        return c.float().sum(), d.view(torch.uint8), sfd_row.view(torch.uint8)

    import torch._dynamo
    torch._dynamo.reset()
    eager = f(*args)
    compiled = torch.compile(f, fullgraph=True)(*args)
    assert torch.equal(eager[0], compiled[0]) and torch.equal(eager[1], compiled[1])
    assert torch.equal(eager[2], compiled[2])


def test_spec_op_custom_op_matches_the_class_and_compiles():
    """torch.ops.fusegemm.epilogue_gemm (any grouped-GEMM spec, here the SwiGLU example): opcheck,
    the same bytes as fusegemm.EpilogueGemm, and torch.compile(fullgraph=True) of fc1 (spec op) ->
    fc2 (grouped GEMM) equal to eager."""
    import torch._dynamo

    import fusegemm.torch_library as fg
    g = torch.Generator(device="cuda").manual_seed(4)
    off = torch.tensor([256, 256, 768], dtype=torch.int32, device="cuda")
    a = (torch.rand((768, 256), generator=g, device="cuda") - 0.5).bfloat16()
    w1 = (torch.rand((3, 1024, 256), generator=g, device="cuda") - 0.5).bfloat16()
    w2 = (torch.rand((3, 256, 512), generator=g, device="cuda") - 0.5).bfloat16()
    alpha, prob = torch.ones(3, device="cuda"), torch.rand(768, generator=g, device="cuda")
    torch.library.opcheck(torch.ops.fusegemm.epilogue_gemm.default,
                          ("grouped_gemm_swiglu", '{"d_dtype": "bfloat16"}', a, off, w1, None, None, "alpha,prob",
                           [alpha, prob]))
    want = fusegemm.EpilogueGemm("grouped_gemm_swiglu", d_dtype="bfloat16")(a, off, w1,
                                                                           inputs={"alpha": alpha, "prob": prob})
    got = fg.epilogue_gemm("grouped_gemm_swiglu", a, off, w1, inputs={"alpha": alpha, "prob": prob},
                           d_dtype="bfloat16")
    assert list(got) == list(want.keys()) and torch.equal(got["d"], want["d"])

    def mlp(a, off, w1, w2, alpha, prob):
        h = fg.epilogue_gemm("grouped_gemm_swiglu", a, off, w1, inputs={"alpha": alpha, "prob": prob},
                             d_dtype="bfloat16")["d"]
        return fg.grouped_gemm(h, off, alpha, w2)[0]

    torch._dynamo.reset()
    eager = mlp(a, off, w1, w2, alpha, prob)
    compiled = torch.compile(mlp, fullgraph=True)(a, off, w1, w2, alpha, prob)
    assert torch.equal(eager, compiled)
