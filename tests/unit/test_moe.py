"""fusegemm.moe on the CPU: the gate/up interleave helpers, the dSwiGLU formulas against autograd,
and torch.autograd.gradcheck of ExpertMLPFunction's hand-written backward (torch backend, float64;
ragged and empty experts, a row past the last expert). The fusegemm backend is held to the torch
one on the H200 (tests/gpu/test_moe_gpu.py)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from fusegemm import moe  # noqa: E402


def test_interleave_puts_gate_and_up_in_alternating_32_row_blocks():
    g = torch.Generator().manual_seed(0)
    wg, wu = torch.randn(2, 64, 8, generator=g), torch.randn(2, 64, 8, generator=g)
    w1 = moe.interleave_gate_up(wg, wu)
    assert torch.equal(w1[:, :32], wg[:, :32]) and torch.equal(w1[:, 32:64], wu[:, :32])
    assert torch.equal(w1[:, 64:96], wg[:, 32:]) and torch.equal(w1[:, 96:], wu[:, 32:])
    x = torch.randn(5, 8, generator=g)
    gate, up = moe.split_gate_up(x @ w1[1].T)
    torch.testing.assert_close(gate, x @ wg[1].T)
    torch.testing.assert_close(up, x @ wu[1].T)
    assert torch.equal(moe.join_gate_up(gate, up), x @ w1[1].T)
    with pytest.raises(ValueError, match="w_gate/w_up: got"):
        moe.interleave_gate_up(torch.zeros(1, 48, 8), torch.zeros(1, 48, 8))


def test_swiglu_backward_matches_autograd():
    g = torch.Generator().manual_seed(1)
    pre = torch.randn(7, 128, dtype=torch.float64, generator=g, requires_grad=True)
    prob = torch.rand(7, dtype=torch.float64, generator=g, requires_grad=True)
    dh = torch.randn(7, 64, dtype=torch.float64, generator=g)
    gate, up = moe.split_gate_up(pre)
    (torch.nn.functional.silu(gate) * up * prob[:, None]).backward(dh)
    dg, dprob = moe.swiglu_backward(pre.detach(), dh, prob.detach())
    torch.testing.assert_close(dg, pre.grad)
    torch.testing.assert_close(dprob, prob.grad)


def test_gradcheck_of_the_layers_backward():
    g = torch.Generator().manual_seed(2)
    off = torch.tensor([2, 2, 5], dtype=torch.int32)          # ragged, an empty expert, row 5 past the end
    x = torch.randn(6, 4, dtype=torch.float64, generator=g, requires_grad=True)
    prob = torch.rand(6, dtype=torch.float64, generator=g, requires_grad=True)
    w1 = (torch.randn(3, 64, 4, dtype=torch.float64, generator=g) * 0.5).requires_grad_()
    w2 = (torch.randn(3, 4, 32, dtype=torch.float64, generator=g) * 0.5).requires_grad_()
    fn = lambda x, prob, w1, w2: moe.ExpertMLPFunction.apply(x, off, prob, w1, w2, "torch")  # noqa: E731
    assert torch.autograd.gradcheck(fn, (x, prob, w1, w2), eps=1e-6, atol=1e-7)
    y = fn(x, prob, w1, w2)
    assert torch.equal(y[5], torch.zeros(4, dtype=torch.float64))


def test_module_arguments():
    with pytest.raises(ValueError, match="intermediate: got 48; allowed: a multiple of 32"):
        moe.ExpertMLP(2, 64, 48)
    with pytest.raises(ValueError, match="backend: got 'cublas'; allowed: torch, fusegemm"):
        moe.ExpertMLP(2, 64, 64, backend="cublas")
    with pytest.raises(ValueError, match="wgrad: got 'cutlass'; allowed: auto, torch, fusegemm"):
        moe.ExpertMLP(2, 64, 64, wgrad="cutlass")
    with pytest.raises(ValueError, match="wgrad: got 'x'; allowed: auto, torch, fusegemm"):
        moe.ExpertMLPFunction.apply(torch.zeros(256, 64), torch.tensor([256], dtype=torch.int32), torch.zeros(256),
                                    torch.zeros(1, 128, 64), torch.zeros(1, 64, 64), "torch", "bf16", None, "x")
    m = moe.ExpertMLP(2, 64, 64, backend="torch", dtype=torch.float32)
    assert m.w1.shape == (2, 128, 64) and m.w2.shape == (2, 64, 64)
    gpu_only = moe.ExpertMLP(2, 64, 64)
    with pytest.raises(ValueError, match="x: got a tensor on cpu; allowed: a CUDA tensor for backend 'fusegemm'"):
        gpu_only(torch.zeros(256, 64, dtype=torch.bfloat16), torch.tensor([256, 256], dtype=torch.int32),
                 torch.zeros(256))


def _layers_on(recipe, off, x, prob):
    layer = moe.ExpertMLP(3, 64, 64, backend="torch", dtype=torch.float32, recipe=recipe,
                          generator=torch.Generator().manual_seed(1))
    xi, pi = x.clone().requires_grad_(), prob.clone().requires_grad_()
    y = layer(xi, off, pi)
    y.backward(torch.randn(y.shape, generator=torch.Generator().manual_seed(3)))
    return dict(y=y.detach(), dx=xi.grad, dprob=pi.grad, dw1=layer.w1.grad, dw2=layer.w2.grad), layer.amax


def test_mxfp8_recipe_is_the_bf16_layer_within_mxfp8_rounding():
    """The MXFP8 recipe (torch backend: the kernels' quantization points, emulated) against the
    same layer unquantized: every output and gradient within 8% (relative Frobenius; E4M3 rounds
    to 2**-4 relative, a few roundings compound) and not equal (the quantization is in the loop);
    the amax side outputs are the per-expert max |y| and |dx|, -inf for the empty expert."""
    g = torch.Generator().manual_seed(0)
    off = torch.tensor([256, 256, 768], dtype=torch.int32)
    x = torch.zeros(1024, 64)
    x[:200], x[256:700] = torch.randn(200, 64, generator=g), torch.randn(444, 64, generator=g)
    prob = torch.rand(1024, generator=g)
    plain, none = _layers_on("bf16", off, x, prob)
    mx, amax = _layers_on("mxfp8", off, x, prob)
    assert none == {}
    for key in plain:
        rel = float((mx[key] - plain[key]).norm() / plain[key].norm())
        assert 1e-3 < rel < 0.08, (key, rel)
    assert not mx["y"][768:].any() and not mx["dx"][768:].any() and not mx["dprob"][768:].any()
    for key, t in (("y", mx["y"]), ("dx", mx["dx"])):
        want = torch.stack([t[:256].abs().max(), torch.tensor(float("-inf")), t[256:768].abs().max()])[:, None]
        assert torch.equal(amax[key], want), key


def test_mxfp8_arguments():
    with pytest.raises(ValueError, match="recipe: got 'fp8'; allowed: bf16, mxfp8, fp8_block"):
        moe.ExpertMLP(2, 64, 64, recipe="fp8")
    with pytest.raises(ValueError, match="hidden: got 48; allowed: a multiple of 32 with recipe 'mxfp8'"):
        moe.ExpertMLP(2, 48, 64, recipe="mxfp8")
    with pytest.raises(ValueError, match="hidden / intermediate: got 64 / 64; allowed: a multiple of 128 / of 64"):
        moe.ExpertMLP(2, 64, 64, recipe="fp8_block")


def test_fp8_block_recipe_is_the_bf16_layer_within_fp8_rounding():
    """The blockwise FP8 recipe (torch backend: its quantization points with the recipe's own
    quantizers) against the same layer unquantized: every output and gradient within 10% (relative
    Frobenius; e4m3 rounds to 2**-4 relative and the weight gradients' operands are quantized
    twice) and not equal; rows past the last expert stay zero."""
    g = torch.Generator().manual_seed(0)
    off = torch.tensor([256, 256, 768], dtype=torch.int32)
    x = torch.zeros(1024, 128)
    x[:200], x[256:700] = torch.randn(200, 128, generator=g), torch.randn(444, 128, generator=g)
    prob = torch.rand(1024, generator=g)
    out = {}
    for recipe in ("bf16", "fp8_block"):
        layer = moe.ExpertMLP(3, 128, 64, backend="torch", dtype=torch.float32, recipe=recipe,
                              generator=torch.Generator().manual_seed(1))
        xi, pi = x.clone().requires_grad_(), prob.clone().requires_grad_()
        y = layer(xi, off, pi)
        y.backward(torch.randn(y.shape, generator=torch.Generator().manual_seed(3)))
        out[recipe] = dict(y=y.detach(), dx=xi.grad, dprob=pi.grad, dw1=layer.w1.grad, dw2=layer.w2.grad)
    for key, plain in out["bf16"].items():
        rel = float((out["fp8_block"][key] - plain).norm() / plain.norm())
        assert 1e-3 < rel < 0.1, (key, rel)
    bw = out["fp8_block"]
    assert not bw["y"][768:].any() and not bw["dx"][768:].any() and not bw["dprob"][768:].any()
    assert not bw["dw1"][1].any() and not bw["dw2"][1].any()      # the empty expert


@pytest.mark.parametrize("with_ends", [False, True])
def test_fp8_block_kernels_trace_on_meta_tensors(monkeypatch, with_ends):
    """The fusegemm backend of the blockwise recipe, traced without a GPU (meta tensors, the ops'
    fake implementations, sm_90a): every kernel call's operands pass the ops' checks (layouts,
    dtypes, scale shapes) and the layer's output and gradients come back with the parameters'
    shapes. (FakeTensorMode's CUDA tensors cannot run the quantizers in a CPU-only torch.) The
    routing's row ends reach both FP8 weight gradients (which skip the padding's 128-token blocks)."""
    monkeypatch.setattr("fusegemm.ops.device.device_arch", lambda d: "sm_90a")
    calls = []
    recipe_op = moe._recipe_op

    def recording(step, over=()):
        face = recipe_op(step, over)
        return lambda *a, **kw: (calls.append((step, kw.get("row_ends"))), face(*a, **kw))[1]
    monkeypatch.setattr(moe, "_recipe_op", recording)
    meta = dict(device="meta")
    x = torch.empty((768, 256), dtype=torch.bfloat16, **meta).requires_grad_()
    prob = torch.empty((768,), **meta).requires_grad_()
    w1 = torch.empty((3, 256, 256), dtype=torch.bfloat16, **meta).requires_grad_()
    w2 = torch.empty((3, 256, 128), dtype=torch.bfloat16, **meta).requires_grad_()
    off = torch.empty((3,), dtype=torch.int32, **meta)
    ends = torch.empty((3,), dtype=torch.int32, **meta) if with_ends else None
    y = moe.ExpertMLPFunction.apply(x, off, prob, w1, w2, "fusegemm", "fp8_block", None, "auto", ends)
    assert tuple(y.shape) == (768, 256) and y.dtype == torch.bfloat16
    y.backward(torch.empty_like(y))
    assert [tuple(t.grad.shape) for t in (x, prob, w1, w2)] == [(768, 256), (768,), (3, 256, 256), (3, 256, 128)]
    assert w1.grad.dtype == torch.bfloat16 and x.grad.dtype == torch.bfloat16
    wgrads = [e for step, e in calls if step.startswith("wgrad")]
    assert len(wgrads) == 2 and all((e is ends) if with_ends else (e is None) for e in wgrads), calls


def test_training_example_on_the_cpu():
    """examples/moe_training.py --cpu, shortened: both recipes learn (loss falls below 0.8 of its
    start) and the MXFP8 curve stays within 5% of the BF16 one at every step, while the
    recipes' first outputs differ by MXFP8 rounding (1-10%)."""
    import json
    import subprocess
    import sys
    from pathlib import Path
    script = Path(__file__).resolve().parents[2] / "examples" / "moe_training.py"
    r = subprocess.run([sys.executable, str(script), "--cpu", "--steps", "40", "--lr", "3e-3"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert out["ok"] and out["track"] <= 0.05 and max(out["final_over_first"].values()) < 0.8, out
    assert 0.01 < out["y_rel_diff_first_step"] < 0.1, out["y_rel_diff_first_step"]
    assert len(out["loss"]["bf16"]) == len(out["loss"]["mxfp8"]) == 40


def test_fp8_block_training_tracks_bf16_on_the_cpu():
    """examples/moe_training.py --cpu --recipe fp8_block (hidden 128), shortened: the blockwise
    recipe learns and stays within 5% of the BF16 curve at every step (measured: 1.6%), while the
    first outputs differ by its FP8 rounding."""
    import json
    import subprocess
    import sys
    from pathlib import Path
    script = Path(__file__).resolve().parents[2] / "examples" / "moe_training.py"
    r = subprocess.run([sys.executable, str(script), "--cpu", "--recipe", "fp8_block", "--hidden", "128",
                        "--steps", "40", "--lr", "3e-3"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert out["ok"] and out["track"] <= 0.05 and max(out["final_over_first"].values()) < 0.8, out
    assert 0.01 < out["y_rel_diff_first_step"] < 0.1, out["y_rel_diff_first_step"]
    assert len(out["loss"]["fp8_block"]) == 40


def test_layer_inputs_are_checked_by_name():
    """Issue 32, probe 9: the torch backend took offsets of the wrong length, unaligned or out of
    order, zero experts, and a wrong hidden size ended in torch's matmul error; each is an
    ArgumentError naming the argument, what it got and what is allowed."""
    from fusegemm.base.errors import ArgumentError
    for args, name, got in (((0, 64, 64), "experts", 0), ((2, 0, 64), "hidden", 0), ((2, 64, -32), "intermediate", -32),
                            ((2.0, 64, 64), "experts", 2.0), ((True, 64, 64), "experts", True)):
        with pytest.raises(ArgumentError, match=rf"^{name}: got {got}; allowed: a positive integer$"):
            moe.ExpertMLP(*args, backend="torch")
    m = moe.ExpertMLP(2, 64, 64, backend="torch", dtype=torch.float32)
    x, prob, off = torch.zeros(512, 64), torch.zeros(512), torch.tensor([256, 512], dtype=torch.int32)
    assert m(x, off, prob).shape == (512, 64)
    ROW_ENDS = r"an int32 tensor of shape \(2,\): one row end per expert"
    # row ends (the routing's): the torch backend's matmuls read every row (the padding is zero)
    assert torch.equal(m(x, off, prob, torch.tensor([100, 300], dtype=torch.int32)), m(x, off, prob))
    cases = [
        ((x, torch.tensor([256, 512, 512], dtype=torch.int32), prob),
         r"padded_offsets.shape: got \(3,\); allowed: \(2,\): one end row per expert"),
        ((x, torch.tensor([256.0, 512.0]), prob),
         r"padded_offsets.dtype: got torch.float32; allowed: an integer dtype \(torch.int32\)"),
        ((x, torch.tensor([100, 512], dtype=torch.int32), prob),
         r"padded_offsets\[0\]: got 100; allowed: a multiple of 256 \(each expert's rows are padded to 256\)"),
        ((x, torch.tensor([512, 256], dtype=torch.int32), prob),
         r"padded_offsets\[1\]: got 256; allowed: at least padded_offsets\[0\] = 512 \(nondecreasing\)"),
        ((x, torch.tensor([256, 768], dtype=torch.int32), prob),
         r"padded_offsets\[1\]: got 768; allowed: at most 512, the rows of x"),
        ((torch.zeros(512, 32), off, prob),
         r"x.shape: got \(512, 32\); allowed: \(M, 64\): 64 is the layer's hidden size"),
        ((torch.zeros(512), off, prob), r"x.shape: got \(512,\); allowed: \(M, 64\): 64 is the layer's hidden size"),
        ((x, off, torch.zeros(256)), r"prob.shape: got \(256,\); allowed: \(512,\): one weight per row of x"),
        ((x.double(), off, prob), r"x.dtype: got torch.float64; allowed: torch.float32: the expert weights' dtype"),
        ((x.to("meta"), off, prob), r"x.device: got meta; allowed: cpu: the expert weights' device"),
        ((x, off, prob.to("meta")), r"prob.device: got meta; allowed: cpu: x's device"),
        ((x, off, prob, torch.tensor([100, 300, 500], dtype=torch.int32)),
         r"row_ends: got \(\(3,\), torch.int32\); allowed: " + ROW_ENDS),
        ((x, off, prob, torch.tensor([100, 300])), r"row_ends: got \(\(2,\), torch.int64\); allowed: " + ROW_ENDS),
        ((x, off, prob, [100, 300]), r"row_ends: got list; allowed: " + ROW_ENDS),
    ]
    for args, message in cases:
        with pytest.raises(ArgumentError, match=f"^{message}$"):
            m(*args)
    # the autograd function checks the shapes too (the gradcheck above calls it with small,
    # unaligned offsets: alignment is the layer's contract)
    with pytest.raises(ArgumentError, match=r"^padded_offsets.shape: got \(1,\); allowed: \(2,\)"):
        moe.ExpertMLPFunction.apply(x, off[:1], prob, m.w1, m.w2, "torch")


def test_weight_cache_quantizes_once_per_weight_version(monkeypatch):
    """ExpertMLP(weight_cache=True), fp8_block: the weights' quantizations are made on the first
    call and reused while both weights keep their address, version and layout; an in-place
    update (an optimizer's step) or a new Parameter makes them again. Off (the default), another
    recipe, the torch backend or a CUDA-graph capture: None (the function quantizes each step). (CPU tensors stand in
    for CUDA ones; on the GPU: tests/gpu/test_moe_gpu.py.)"""
    from fusegemm.base.errors import ArgumentError
    made = []
    monkeypatch.setattr(moe.qz, "quantize_128x128", lambda w, transposed=False: made.append(w) or (
        ("q", w._version), ("qt", w._version)))
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    m = moe.ExpertMLP(2, 128, 64, recipe="fp8_block", weight_cache=True, dtype=torch.float32)
    first = m._weights_q()
    assert len(made) == 2 and m._weights_q() is first and len(made) == 2
    with torch.no_grad():
        m.w2.mul_(0.5)                                  # what torch.optim's in-place updates do
    again = m._weights_q()
    assert len(made) == 4 and again is not first and again[2] == ("q", m.w2._version)
    m.w1 = torch.nn.Parameter(m.w1.detach().clone())   # a new tensor: a new address
    assert m._weights_q() is not again and len(made) == 6
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert m._weights_q() is None                       # a graph capture quantizes in the graph
    for kw in ({"weight_cache": False}, {"recipe": "bf16", "weight_cache": True},
               {"backend": "torch", "weight_cache": True}):
        assert moe.ExpertMLP(2, 128, 64, **{"recipe": "fp8_block", **kw})._weights_q() is None
    with pytest.raises(ArgumentError, match="weight_cache"):
        moe.ExpertMLP(2, 128, 64, recipe="fp8_block", weight_cache=1)


def test_padding_is_left_unzeroed_only_where_no_kernel_reads_it(monkeypatch):
    """moe._padding_unread: the BF16 layer may leave its GEMMs' unwritten padding rows unzeroed
    only on the fusegemm backend, on sm_90a (every M tile a multiple of the K-grouped kernel's
    64-row k-block), with row ends, and with both weight gradients on the K-grouped kernel
    (torch's _grouped_mm reads every row of an expert's range)."""
    from types import SimpleNamespace
    arch = {"now": "sm_90a"}
    monkeypatch.setattr("fusegemm.ops.device.device_arch", lambda d: arch["now"])
    cuda = torch.device("cuda", 0)
    x = SimpleNamespace(device=cuda, shape=(4096 * 8 + 32 * 256, 7168))       # dsv3-32's rows
    w1 = SimpleNamespace(shape=(32, 4096, 7168))
    ends = torch.zeros(32, dtype=torch.int32)
    assert moe._padding_unread("fusegemm", "auto", ends, x, w1)
    assert moe._padding_unread("fusegemm", "fusegemm", ends, x, w1)
    assert not moe._padding_unread("fusegemm", "torch", ends, x, w1)
    assert not moe._padding_unread("fusegemm", "auto", None, x, w1)
    assert not moe._padding_unread("torch", "auto", ends, x, w1)
    assert not moe._padding_unread("fusegemm", "auto", ends, SimpleNamespace(device=torch.device("cpu"),
                                                                            shape=x.shape), w1)
    odd = SimpleNamespace(shape=(32, 4096 + 64, 7168))      # 2F not whole wgrad tiles: auto picks torch's kernel
    assert not moe._padding_unread("fusegemm", "auto", ends, x, odd)
    arch["now"] = "sm_100a"   # (the rule is argued for the sm_90a kernels only, whatever the wgrad)
    assert not moe._padding_unread("fusegemm", "auto", ends, x, w1)
    assert not moe._padding_unread("fusegemm", "fusegemm", ends, x, w1)


def test_tail_reaches_the_four_bf16_gemms_and_only_them(monkeypatch):
    """ExpertMLPFunction's ``tail=False`` (where _padding_unread allows it) reaches fc1, fc2, the
    dSwiGLU GEMM and fc1's data gradient, not the weight gradients; by default no GEMM gets it.
    (The backend's calls recorded around the torch backend, whose GEMMs take no ``tail``.)"""
    torch_be, seen = moe._BACKENDS["torch"], []

    class Recording:
        def __getattr__(self, name):
            fn = getattr(torch_be, name)

            def call(*a, tail=True, **kw):
                seen.append((name, tail))
                return fn(*a, **kw)
            return call
    monkeypatch.setitem(moe._BACKENDS, "torch", Recording())
    monkeypatch.setattr(moe, "_padding_unread", lambda *a: True)
    g = torch.Generator().manual_seed(5)
    off = torch.tensor([2, 2, 5], dtype=torch.int32)
    x = torch.randn(6, 4, generator=g, requires_grad=True)
    prob = torch.rand(6, generator=g)
    w1 = torch.randn(3, 64, 4, generator=g, requires_grad=True)
    w2 = torch.randn(3, 4, 32, generator=g, requires_grad=True)
    ends = torch.tensor([1, 2, 4], dtype=torch.int32)
    for tail in (True, False):
        seen.clear()
        moe.ExpertMLPFunction.apply(x, off, prob, w1, w2, "torch", "bf16", None, "auto", ends, None,
                                    tail).sum().backward()
        assert sorted(n for n, t in seen if not t) == ([] if tail else ["dgrad", "dswiglu", "fc1", "gemm"]), seen
        assert {n for n, _ in seen} == {"fc1", "gemm", "dswiglu", "dgrad", "wgrad"}, seen


def test_routed_dswiglu_runs_the_cooperative_tile_when_dy_is_gathered(monkeypatch):
    """moe._routed_dswiglu_tile: RoutedMLPFunction's dSwiGLU GEMM takes the block's ping-pong tile on
    permuted rows, and with dy gathered the spec's default, the cooperative 128 x 256 tile (measured
    0.93-1.00x of itself on permuted rows where the gathered ping-pong tile ran 0.68-0.74x)."""
    from fusegemm.generator.variants import make_variant
    monkeypatch.setattr("fusegemm.ops.device.device_arch", lambda d: "sm_90a")
    permuted = moe._routed_dswiglu_tile(False, 0, 2048)
    assert permuted == {"tile_m": 64, "tile_n": 256}
    assert moe._routed_dswiglu_tile(True, 0, 2048) == {}
    default = make_variant("grouped_gemm_dswiglu_bf16", arch="sm_90a", a_gather=True, b_major="n")
    assert (default.tile_m, default.tile_n) == (128, 256)


def test_moe_block_loads_is_checked_and_falls_back_where_the_gathered_path_does_not_run():
    """MoEBlock(loads=...): "auto" by default, "permuted" from PERMUTED_MIN_INTERMEDIATE up and
    "gathered" below; anything but "auto", "permuted" or "gathered" is an ArgumentError naming
    ``loads``; "gathered" runs RoutedMLPFunction only on the fusegemm backend's bf16 recipe on an
    sm_90a GPU, outside torch.compile, so on the CPU it is the permuted block, value for value."""
    from fusegemm.base.errors import ArgumentError
    block = moe.MoEBlock(32, 64, 4, 2, backend="torch")
    assert block.loads == "auto" and block.resolved_loads() == "gathered"
    wide = moe.MoEBlock(16, moe.PERMUTED_MIN_INTERMEDIATE, 2, 1, backend="torch", dtype=torch.float32)
    assert wide.resolved_loads() == "permuted"
    narrow = moe.MoEBlock(16, moe.PERMUTED_MIN_INTERMEDIATE - 32, 2, 1, backend="torch", dtype=torch.float32)
    assert narrow.resolved_loads() == "gathered"
    assert moe.MoEBlock(32, 64, 4, 2, backend="torch", loads="permuted").resolved_loads() == "permuted"
    with pytest.raises(ArgumentError, match="loads.*'auto', 'permuted' or 'gathered'"):
        moe.MoEBlock(32, 64, 4, 2, backend="torch", loads="scattered")
    x = torch.randn(50, 32, generator=torch.Generator().manual_seed(0))
    logits = torch.randn(50, 4, generator=torch.Generator().manual_seed(1))
    out = {}
    for loads in ("permuted", "gathered"):
        block = moe.MoEBlock(32, 64, 4, 2, backend="torch", dtype=torch.float32, loads=loads,
                             generator=torch.Generator().manual_seed(2))
        assert block._gathered_runs(x) is False
        out[loads] = block(x, logits)
    assert torch.equal(out["permuted"], out["gathered"])
    with pytest.raises(ArgumentError, match="loads"):
        moe.RoutedMLPFunction.apply(x, *([None] * 7), "auto", "sideways")
