"""The block-scaled seeds as preset rows (fusegemm/presets.py ``SEEDS``): the generated faces keep
the seeds' signatures (every call on the seed pages binds to them; the wrappers mirror the numpy
references), the class API chooses the op the wrapper chooses, the torch faces trace under
``torch.compile``, and a row names only what the vocabulary knows."""
from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import fusegemm  # noqa: E402
from fusegemm import compat, presets, reference  # noqa: E402
from fusegemm.base.errors import ArgumentError  # noqa: E402
from fusegemm.ops import scaled_seeds  # noqa: E402
from fusegemm.ops.hows import HOWS  # noqa: E402

from test_scaled_errors import amax_base, base  # noqa: E402

SEEDS = Path(__file__).resolve().parents[3] / "shared" / "seeds"
ROWS = {row.name: row for row in presets.SEEDS}
# The wrappers' tiles and clusters default to the arch's preferred kernel (None) where the
# references state sm_100a's; the references also take host lists of discrete weights.
TILES = {"mma_tiler_mn", "cluster_shape_mn"}
HOST_ONLY = {"b_list", "sfb_list"}
GPU_ONLY = {"validate_offsets"}   # a launch option the numpy reference has no use for


def test_the_seeds_are_rows():
    assert sorted(ROWS) == ["gemm_amax", "grouped_gemm", "grouped_gemm_dswiglu", "grouped_gemm_quant",
                            "grouped_gemm_srelu"]
    for row in presets.SEEDS:
        assert getattr(fusegemm, row.name) is getattr(presets, row.name)
        assert row.name == "grouped_gemm" or getattr(presets, row.name) is getattr(scaled_seeds, row.name)
        assert getattr(fusegemm, row.cls) is getattr(presets, row.cls) is getattr(compat, row.cls + "Sm100")
        assert getattr(compat, row.cudnn) is getattr(fusegemm, row.name)


@pytest.mark.parametrize("name", sorted(ROWS))
def test_wrappers_mirror_the_references(name):
    """Names, order, kinds and defaults of each wrapper are its reference's (less the host-only
    lists; tiles default to None)."""
    got = {k: p for k, p in inspect.signature(getattr(fusegemm, name)).parameters.items() if k not in GPU_ONLY}
    want = {k: p for k, p in inspect.signature(getattr(reference, name)).parameters.items() if k not in HOST_ONLY}
    assert list(got) == list(want)
    for k, p in want.items():
        assert got[k].kind == p.kind, k
        assert got[k].default == (None if k in TILES else p.default), k


def _page_calls(seed: str) -> list[tuple[str, int, list[str]]]:
    """(callee, positional count, keywords) of every call written out on a seed page."""
    paths = list(SEEDS.glob(f"{seed}_*.txt"))
    if not paths:
        pytest.skip("the seed pages are not beside this checkout")
    calls = []
    for m in re.finditer(r"([\w.]+)\(\n(.*?)\n\)|([\w.]+)\(([^()\n]*)\)", paths[0].read_text(), re.S):
        callee, body = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
        if not re.search(r"wrapper_sm100$|Sm100$|\.execute$", callee):
            continue                                    # prose, functools.partial, jax.jit...
        call = ast.parse(f"f({body}\n)").body[0].value
        calls.append((callee.removeprefix("cudnn."), len(call.args), [k.arg for k in call.keywords]))
    return calls


@pytest.mark.parametrize("seed", ["000", "002", "003", "004"])
def test_every_call_on_the_seed_page_binds(seed):
    """Each call of a seed page's examples (wrapper, class, ``execute``) binds to the generated
    signature: its keywords are parameters, its positional arguments fit."""
    checked, cls = 0, None
    for callee, npos, keywords in _page_calls(seed):
        if callee.endswith("Sm100"):
            cls = getattr(compat, callee)
            fn = cls
        elif callee.endswith(".execute"):
            fn = cls.execute
            npos += 1                                   # self
        else:
            fn = getattr(compat, callee)
        inspect.signature(fn).bind_partial(*[None] * npos, **dict.fromkeys(keywords))
        checked += 1
    assert checked >= 3


@pytest.mark.parametrize("name", sorted(ROWS))
def test_class_signatures_follow_the_wrapper(name):
    """A class's samples are samples of its ``execute``'s tensors, in order; its options are the
    wrapper's parameters with the wrapper's defaults (and seed 002's discrete mode); ``execute``
    takes the wrapper's operands and inputs and the outputs the wrapper returns."""
    row = ROWS[name]
    cls = getattr(fusegemm, row.cls)
    wrapper = inspect.signature(getattr(fusegemm, name)).parameters
    init = inspect.signature(cls).parameters
    execute = [p for p in inspect.signature(cls.execute).parameters if p != "self"]
    samples = [p.removeprefix("sample_") for p in init if p.startswith("sample_")]
    tensors = [p.removesuffix("_tensor") for p in execute
               if p not in ("b_ptrs", "sfb_ptrs", "n", "current_stream", *GPU_ONLY)]
    assert [s for s in tensors if s in samples] == samples
    assert set(tensors) - set(samples) <= {"row_scale"}          # seed 003's extension has no sample
    for p in init.values():
        if p.kind is p.KEYWORD_ONLY and p.name not in ("num_experts", "b_shape", "arch"):   # arch: seed 001's
            assert p.default == wrapper[p.name].default, p.name
    outputs = {out for out, _ in row.returns}
    assert set(execute) - {"current_stream"} <= set(wrapper) | outputs


@pytest.mark.parametrize("name", ["grouped_gemm_srelu", "grouped_gemm_quant", "grouped_gemm_dswiglu", "gemm_amax"])
def test_the_class_builds_the_op_the_wrapper_builds(name, monkeypatch):
    """Samples (the wrapper's inputs, and outputs of its dtypes) choose the very op the wrapper's
    arguments choose: one op, one kernel."""
    built = []
    real = scaled_seeds._op
    monkeypatch.setattr(scaled_seeds, "_op", lambda *a, **k: built.append(real(*a, **k)) or built[-1])
    if name == "gemm_amax":
        kw = amax_base()
        c = torch.zeros(2, 256, 200, dtype=torch.bfloat16).permute(2, 1, 0)      # M-major bf16 C
        with pytest.raises(ArgumentError, match=r"^a_tensor\.device: got cpu"):
            fusegemm.gemm_amax(**dict(kw, c_major="m", c_dtype=torch.bfloat16))
        op = fusegemm.GemmAmax(kw["a_tensor"], kw["b_tensor"], kw["sfa_tensor"], kw["sfb_tensor"], c)
    else:
        kw = base(name)
        with pytest.raises(ArgumentError, match=r"^a_tensor\.device: got cpu"):
            getattr(fusegemm, name)(**kw)
        d = torch.zeros(1, dtype=torch.uint8).view(torch.float8_e4m3fn)           # D's dtype is the sample's
        samples = {f"sample_{k.removesuffix('_tensor')}": v for k, v in kw.items() if k.endswith("_tensor")
                   or k == "padded_offsets"}
        samples["sample_d_row" if name.endswith("dswiglu") else "sample_d"] = d
        samples.pop("sample_row_scale", None)
        if name.endswith("srelu"):
            samples["sample_c"] = torch.zeros(1, dtype=torch.bfloat16)
        op = getattr(fusegemm, ROWS[name].cls)(**{k: v for k, v in samples.items() if k != "sample_d_tensor"},
                                               sf_vec_size=32)
    assert len(built) == 2 and built[0] is built[1] is op.op


def test_quirks_reach_the_outputs_and_the_variant():
    """``generate_amax`` gates amax, ``unsqueezed`` gives dSwiGLU's (L, 1, 1) amax, ``tanh_clamp``
    and ``epilogue_op`` reach (or are accepted by) the call; the rows say so."""
    assert ROWS["grouped_gemm_quant"].gates == (("amax", "generate_amax"),)
    assert ROWS["grouped_gemm_dswiglu"].unsqueezed == ("amax",)
    assert dict(ROWS["grouped_gemm_dswiglu"].accepts)["epilogue_op"] == (None, "none", "identity", "relu", "srelu")
    kw = base("grouped_gemm_srelu", tanh_clamp_scale=2)
    built = []
    real = scaled_seeds._op
    try:
        scaled_seeds._op = lambda *a, **k: built.append(real(*a, **k)) or built[-1]
        with pytest.raises(ArgumentError, match=r"^a_tensor\.device"):
            fusegemm.grouped_gemm_srelu(**kw)
        with pytest.raises(ArgumentError, match=r"^a_tensor\.device"):
            fusegemm.grouped_gemm_dswiglu(**base("grouped_gemm_dswiglu", epilogue_op="srelu"))
    finally:
        scaled_seeds._op = real
    assert built[0].variant.tanh_clamp_scale == 2.0 and type(built[0].variant.tanh_clamp_scale) is float


def test_rows_speak_the_vocabulary():
    """Every how a row names is one fusegemm/ops/hows.py knows, every parameter a field names is
    the wrapper's, and every sample a class maps is its constructor's."""
    for row in presets.PRESETS + presets.SEEDS:
        params = set(row.signature().parameters)
        assert {how for _, how, _ in row.axes} <= set(HOWS), row.name
        named = ({p for _, p in row.operands} | {p for _, p in row.inputs} | {p for _, _, p in row.axes}
                 | {p for _, p in row.gates} | {p for p, _ in row.accepts if p in params})
        assert named <= params, (row.name, named - params)
        if row.cls:
            init = set(inspect.signature(getattr(presets, row.cls)).parameters)
            assert {s for _, s, _ in row.samples} <= init and {p for p, _, _ in row.samples} <= params


def test_bad_calls_name_the_face():
    with pytest.raises(TypeError, match=r"^grouped_gemm_srelu\(\): got an unexpected keyword argument 'bogus'$"):
        fusegemm.grouped_gemm_srelu(None, bogus=1)
    with pytest.raises(TypeError, match=r"^GemmAmax\(\): missing a required argument: 'sample_b'$"):
        fusegemm.GemmAmax(None)
    with pytest.raises(TypeError, match=r"^grouped_gemm_quant\(\): multiple values for argument 'sfa_tensor'$"):
        fusegemm.grouped_gemm_quant(None, None, None, None, sfa_tensor=None)
    with pytest.raises(TypeError, match=r"^grouped_gemm_dswiglu\(\): too many positional arguments$"):
        fusegemm.grouped_gemm_dswiglu(*[None] * 22)


def test_torch_faces_trace_in_full_graphs():
    """The seeds' torch faces bind in a way torch.compile(fullgraph=True) traces: the graph
    builds, and the op itself then refuses the CPU tensors as the eager call does."""
    import torch._dynamo

    import fusegemm.torch_library as fg
    kw = base("grouped_gemm_srelu")

    def f(a, b, sfa, sfb, off, alpha, nc, prob):
        c, d, _, _, _, _ = fg.grouped_gemm_srelu(a, b, sfa, sfb, off, alpha, norm_const=nc, prob=prob,
                                                 sf_vec_size=32, d_dtype=torch.float8_e4m3fn)
        return c.float().sum(), d.view(torch.uint8)
    args = [kw[k] for k in ("a_tensor", "b_tensor", "sfa_tensor", "sfb_tensor", "padded_offsets", "alpha_tensor",
                            "norm_const_tensor", "prob_tensor")]
    torch._dynamo.reset()
    with pytest.raises(ArgumentError, match=r"^a_tensor\.device: got cpu"):
        torch.compile(f, fullgraph=True)(*args)


def test_a_resolved_calls_launcher_reads_the_values_binding_gives():
    """A wrapper call resolved before is launched from its arguments as passed (no binding): for
    each way of passing them (by position, by keyword, left out) the launcher hands the op the
    values binding gives, and the picker (outputs the seed reshapes) reads them too. A fake op
    records what it is handed."""
    from fusegemm.ops import faces, scaled_seeds
    row = presets.BY_NAME["grouped_gemm"]
    sig = row.signature()
    bind = faces.binder(sig, row.name)
    picks = ("a_tensor", "padded_offsets", "b_tensor", "b_ptrs", "n", "alpha_tensor")
    seen = []

    class FakeOp:
        def _call_memo(self, e, flat, stream, validate, tail, shaped):
            seen.append((flat, stream, validate, tail, shaped))
            return {"d": "D"}
    op = FakeOp()
    scaled_seeds._AS_IS[op] = True
    hit = (row, op, {}, True, [(object(), picks), None])
    a, off, alpha, b, prob = "A", "OFF", "ALPHA", "B", "PROB"
    calls = [((a, off, alpha, b), {}), ((a, off, alpha), {"b_tensor": b, "current_stream": 7}),
             ((a,), {"alpha_tensor": alpha, "padded_offsets": off, "b_tensor": b, "validate_offsets": True}),
             ((a, off, alpha, None, None, "PTRS", 5, None, "k", prob), {"current_stream": 3})]
    for args, kwargs in calls:
        want = bind(args, kwargs)
        seen.clear()
        out = faces._launcher(sig, hit, len(args), tuple(kwargs))(args, kwargs)
        assert seen == [(tuple(want[p] for p in picks), want["current_stream"], want["validate_offsets"], False,
                         False)], (args, kwargs)
        assert list(out.items()) == [("d_tensor", "D"), ("c_tensor", None)]
        got = faces._picker(sig, row, len(args), tuple(kwargs))(args, kwargs)
        assert got == {p: want[p] for p in got} and set(got) >= set(picks) | {"prob_tensor", "current_stream"}
    # A parameter the call leaves out reads its default (here ones that are not None), one the
    # signature lacks reads None.
    take = faces._taker(sig, 2, ("m_aligned",), ("d_dtype", "m_aligned", "padded_offsets", "absent"))
    assert take((a, off), {"m_aligned": 256}) == ("bfloat16", 256, off, None)
    assert faces._taker(sig, 1, (), ("c_dtype",))((a,), {}) == ("bfloat16",)
