"""Scattered outputs (``d_scatter``: problem row r's C and D rows are written to row ``d_index[r]`` of
(``d_rows``, N) outputs) on the CPU: the axis reaches the BF16 grouped kernels' source on both archs
and is refused, with the reason, where no kernel writes it (the K-grouped and block-scaled families)
or where the epilogue's stores are not per row (a paired, quantizing or reducing rule); the scattered
sm_90a kernels compile clean on the paths that store rows (deferred, staged with C, ping-pong) with
one index load per lane and tile and the plain kernel's stores, and the sm_100a kernels with their
engine's row stores; the first-run gate verifies a scattered variant as a class of its own;
``fusegemm.Op`` parses ``d_index`` / ``d_rows``, sizes the outputs by ``d_rows``, zeroes them whole
(not the tail) and refuses what does not belong. On the GPU (tests/gpu/test_scatter_gpu.py):
bit-equal to the same kernel's rows permuted, and the sm_100a engine's stores through its harness."""
from __future__ import annotations

import re
import textwrap

import pytest

from fusegemm import pipeline
from fusegemm.base.errors import ArgumentError, UnsupportedError
from fusegemm.generator import registry
from fusegemm.generator.render import render
from fusegemm.generator.variants import make_variant
from fusegemm.runtime.cubin_info import Cubin

torch = pytest.importorskip("torch")

from fusegemm.ops.engine import Op  # noqa: E402

from test_op import _launch, no_device  # noqa: E402,F401

BF16 = dict(tile_m=128, tile_n=256, cluster_m=1, cluster_n=1)


def test_the_axis_reaches_the_grouped_sources_and_is_refused_elsewhere():
    for arch in ("sm_90a", "sm_100a"):
        assert "kScatterD = true" in render(make_variant("grouped_gemm", arch=arch, d_scatter=True, **BF16)).text
        assert "kScatterD = false" in render(make_variant("grouped_gemm", arch=arch, **BF16)).text
        assert "scatter" in make_variant("grouped_gemm", arch=arch, d_scatter=True, **BF16).readable
        registry.resolve("grouped_gemm", arch, {"d_scatter": True})
    for family, arch, extra in (("grouped_gemm_wgrad", "sm_90a", {}), ("grouped_gemm_wgrad", "sm_100a", {}),
                                ("grouped_gemm_srelu", "sm_90a", {"ab_dtype": "float8_e4m3fn"}),
                                ("grouped_gemm_srelu", "sm_100a", {"ab_dtype": "float8_e4m3fn"})):
        with pytest.raises(UnsupportedError, match=r"scattered outputs \(d_index\) are the BF16 grouped"):
            registry.resolve(family, arch, {"d_scatter": True, "tile_m": 128, "cluster_m": 1, "cluster_n": 1,
                                            "sf_vec_size": 32, "sf_dtype": "float8_e8m0fnu", **extra})
    # A spec without the axis does not offer it.
    with pytest.raises(UnsupportedError, match="does not offer this axis"):
        make_variant("grouped_gemm_swiglu", arch="sm_90a", d_scatter=True)


def test_a_rule_whose_rows_are_not_stored_whole_is_refused(tmp_path, no_device):  # noqa: F811
    """A user spec may offer d_scatter; a paired (SwiGLU) rule's stores go through blocks laid out by
    problem row, so the variant is refused, naming the axis, by check_support and by rendering."""
    path = tmp_path / "scatter_swiglu.yaml"
    path.write_text(textwrap.dedent("""\
        schema: 2
        name: scatter_swiglu
        kernel: grouped_gemm
        summary: SwiGLU with a choice of scattered outputs.
        epilogue:
          pairing: {block: 32, roles: [gate, up], acc: true}
          compute:
            - h = acc.up * silu(acc.gate)
          outputs:
            d: {dtype: bfloat16, value: h}
        choices:
          d_scatter: [false, true]
          tile_m: [128]
          tile_n: [256]
          cluster_m: [1]
          cluster_n: [1]
        defaults: {d_scatter: false, tile_m: 128, tile_n: 256, cluster_m: 1, cluster_n: 1}
        """))
    Op(str(path), arch="sm_90a").check_support()
    op = Op(str(path), arch="sm_90a", d_scatter=True)
    with pytest.raises(UnsupportedError, match=r"^d_scatter: got True; allowed for element-wise epilogues only"):
        op.check_support()
    with pytest.raises(UnsupportedError, match=r"element-wise epilogues only"):
        render(op.variant)


@pytest.mark.parametrize("axes", [
    dict(),                                                            # deferred D stores
    dict(tile_m=64, tile_n=128),                                       # ping-pong
    dict(bias_dtype="bfloat16", generate_c=True, c_dtype="float32"),   # staged C and D, a column input
    dict(a_gather=True),                                               # gathered in, scattered out
])
def test_scattered_kernels_compile_clean_with_the_plain_stores(session_cache, axes):
    """0 local memory; the plain kernel's 16-byte global stores and WGMMAs, and 4 more 32-bit global
    loads (each lane's four d_index entries per tile). (With C and a column bias ptxas lays the
    staging out twice, one copy per branch: twice the static bias loads and shared stores, the same
    executed per tile.)"""
    from fusegemm.runtime.disasm import sass

    def counts(v):
        built = pipeline.get_kernel(v, session_cache)
        assert Cubin(built.cubin).resources(built.kernel_name).local_bytes == 0, (axes, "spills / local memory")
        text = sass(built.cubin)
        return {op: len(re.findall(rf"\s{re.escape(op)}\s", text)) for op in ("STG.E.128", "LDG.E.CONSTANT")} | {
            "HGMMA": len(re.findall(r"\sHGMMA\.", text))}

    scattered = counts(make_variant("grouped_gemm", arch="sm_90a", d_scatter=True, **{**BF16, **axes}))
    plain = counts(make_variant("grouped_gemm", arch="sm_90a", **{**BF16, **axes}))
    assert scattered["STG.E.128"] == plain["STG.E.128"] > 0 and scattered["HGMMA"] == plain["HGMMA"] > 0, axes
    assert scattered["LDG.E.CONSTANT"] == plain["LDG.E.CONSTANT"] + 4, (axes, scattered, plain)


@pytest.mark.parametrize("axes", [
    dict(BF16),                                                         # 1-CTA tile
    dict(),                                                             # the default 2-CTA 256-row tile
    dict(bias_dtype="bfloat16", generate_c=True, c_dtype="float32"),   # C and D, a column input
    dict(BF16, a_gather=True),                                          # gathered in (gather4), scattered out
])
def test_sm100_scattered_kernels_store_rows_through_the_engine(session_cache, axes):
    """sm_100a (not run on a Blackwell GPU; its epilogue engine's scattered stores run on the H200
    in the block harness, tests/gpu/test_scatter_gpu.py): 0 local memory, the plain kernel's
    shared memory, TMEM, MMAs and 16-byte global stores; one more index load (each lane's d_index
    entry per block) and eight row-index shuffles per stored 32 x 32 block of each output."""
    from fusegemm.runtime import disasm

    def built(**extra):
        b = pipeline.get_kernel(make_variant("grouped_gemm", arch="sm_100a", **axes, **extra), session_cache)
        assert Cubin(b.cubin).resources(b.kernel_name).local_bytes == 0, (axes, extra, "spills / local memory")
        return b, disasm.sass_histogram(b.cubin)

    (s, sh), (p, ph) = built(d_scatter=True), built()
    assert (s.contract.smem_bytes, s.contract.tmem_cols) == (p.contract.smem_bytes, p.contract.tmem_cols)
    assert disasm.count_prefix(sh, "UTCHMMA") == disasm.count_prefix(ph, "UTCHMMA") > 0
    assert sh["STG.E.128"] == ph["STG.E.128"] > 0
    assert sh["LDG.E.CONSTANT"] == ph["LDG.E.CONSTANT"] + 1
    outputs = 2 if axes.get("generate_c") else 1
    assert sh.get("SHFL.IDX", 0) == ph.get("SHFL.IDX", 0) + 8 * outputs, (sh.get("SHFL.IDX"), ph.get("SHFL.IDX"))


def test_the_gate_verifies_a_scattered_variant_as_its_own_class():
    """A scattered variant is a configuration class of its own (slug ``.d-scatter``), which
    all_classes enumerates on both archs, so its first launch on a GPU that never ran it runs the
    gate's cases with an index (selftest._scatter_index) instead of passing as the plain class."""
    from fusegemm import selftest
    from fusegemm.generator.config_class import config_class
    plain = config_class(make_variant("grouped_gemm", arch="sm_100a", **BF16))
    scattered = config_class(make_variant("grouped_gemm", arch="sm_100a", d_scatter=True, **BF16))
    assert scattered != plain and scattered.operands == ("d_scatter",)
    assert scattered.slug == plain.slug + ".d-scatter" and scattered.describe().endswith(", scattered outputs")
    assert scattered.axes()["d_scatter"] is True
    for arch in ("sm_90a", "sm_100a"):
        classes = selftest.all_classes(arch, ("grouped_gemm",))
        assert any(c.operands == ("d_scatter",) for c in classes), arch
    import numpy as np
    valid = np.array([True] * 5 + [False] * 3 + [True] * 2)
    index, d_rows = selftest._scatter_index(np.random.default_rng(0), valid)
    assert d_rows == 7 + 24 and index.dtype == np.int32
    assert (index[~valid] == -1).all() and index[0] == d_rows + 5          # padding, and past the outputs
    inside = index[valid][1:]
    assert len(set(inside.tolist())) == inside.size and ((inside >= 0) & (inside < d_rows)).all()
    rows = np.arange(10.0)[:, None]
    placed = selftest._placed(rows, index, d_rows)
    assert placed.shape == (d_rows, 1) and placed[index[1], 0] == 1.0 and placed.sum() == rows[valid][1:].sum()


def _operands(t=300, m=512, n=256, k=64, l=2):
    a = torch.zeros((m, k), dtype=torch.bfloat16)
    b = torch.zeros((l, n, k), dtype=torch.bfloat16)
    off = torch.tensor([256, 512], dtype=torch.int32)
    return a, b, off


def test_op_parses_d_index_and_sizes_the_outputs_by_d_rows(no_device):  # noqa: F811
    op = Op("grouped_gemm", arch="sm_90a", d_scatter=True, bias_dtype="bfloat16", generate_c=True)
    a, b, off = _operands()
    idx = torch.full((512,), -1, dtype=torch.int32)
    call = op._parse((a, off, b), {"d_index": idx, "d_rows": 300})
    assert (call.m, call.d_rows) == (512, 300)
    assert {k: v[0] for k, v in op._buffers(call).items()} == {"c": (300, 256), "d": (300, 256)}
    values, _ = _launch(op, call, {"alpha": 0}, {"c": 2000, "d": 1000})
    assert values["d_index"] == idx.data_ptr() and values["d_rows"] == 300 and values["m_rows"] == 512
    plain = Op("grouped_gemm", arch="sm_90a")
    call = plain._parse((a, off, b), {})
    values, _ = _launch(plain, call, {"alpha": 0}, {"d": 1000})
    assert (values["d_index"], values["d_rows"]) == (0, 0)
    assert {k: v[0] for k, v in plain._buffers(call).items()} == {"d": (512, 256)}


def test_d_index_and_d_rows_are_refused_where_they_do_not_belong():
    a, b, off = _operands()
    scattered, plain = Op("grouped_gemm", arch="sm_90a", d_scatter=True), Op("grouped_gemm", arch="sm_90a")
    idx = torch.zeros(512, dtype=torch.int32)
    with pytest.raises(ArgumentError, match=r"^d_index: got None; allowed: an int32 \(M,\) output row index"):
        scattered._parse((a, off, b), {})
    with pytest.raises(ArgumentError, match=r"^d_index: got given; allowed: .*d_scatter=True, else None"):
        plain._parse((a, off, b), {"d_index": idx})
    with pytest.raises(ArgumentError, match=r"^d_rows: got 300; allowed: None .* without d_scatter=True"):
        plain._parse((a, off, b), {"d_rows": 300})
    for bad in (None, -1, 2.0, True, 2 ** 31):
        with pytest.raises(ArgumentError, match=r"^d_rows: got .*; allowed: an int in \[0, 2\^31\)"):
            scattered._parse((a, off, b), {"d_index": idx, "d_rows": bad})
    with pytest.raises(ArgumentError, match=r"^d_index.dtype"):
        scattered._parse((a, off, b), {"d_index": idx.long(), "d_rows": 4})
    with pytest.raises(ArgumentError, match=r"^d_index.shape\[0\]: got 256; allowed: 512 \(one output row per"):
        scattered._parse((a, off, b), {"d_index": idx[:256], "d_rows": 4})


def test_scattered_outputs_zero_their_unnamed_rows_not_their_tail(monkeypatch, no_device):  # noqa: F811
    """__call__'s scattered C and D: the rows no index names are zeroed on the launch stream before
    the launch (tail.zero_unnamed, given d_index, d_rows, the offsets, L, M and the row ends; the
    whole buffers where its kernels cannot serve them), and the tail kernel is not run on them
    (their rows are not the problem's); tail=False leaves them unwritten."""
    from fusegemm.ops import prepared_launch
    from fusegemm.runtime import load

    op = Op("grouped_gemm", arch="sm_90a", d_scatter=True)
    a, b, off = _operands()
    idx = torch.zeros(512, dtype=torch.int32)
    memsets, tails, launches = [], [], []

    class _Driver:
        def cuMemsetD32Async(self, ptr, value, words, stream):
            memsets.append((ptr, value, words))
            return (0,)

    monkeypatch.setattr(load, "driver", lambda: _Driver())
    monkeypatch.setattr(load, "check", lambda r, what: None)
    monkeypatch.setattr(prepared_launch._tail, "zero_tail", lambda *a, **k: tails.append(a))
    monkeypatch.setattr(op, "_launcher", object())
    monkeypatch.setattr(op, "_check_devices", lambda call, deferred: 0)
    monkeypatch.setattr(op, "_prepare", lambda *a, **k: (_Entry(), ()))
    monkeypatch.setattr(op, "_run", lambda e, ptrs, offs, stream, zero=None, **k: _zero_rows(op, zero, launches))

    class _Entry:
        pass

    def _zero_rows(op, zero, log):
        log.append(None if zero is None else {k: tuple(v.shape) for k, v in zero.items()})

    out = op(a, off, b, d_index=idx, d_rows=300, inputs={"alpha": torch.ones(2)})
    assert tuple(out["d"].shape) == (300, 256) and launches == [{"d": (300, 256)}]
    op(a, off, b, d_index=idx, d_rows=300, inputs={"alpha": torch.ones(2)}, tail=False)
    assert launches[-1] is None
    # The launch half: the unnamed rows zeroed by the small kernels, no tail kernel; where they
    # cannot serve the buffers, the buffers memset whole (words = bytes / 4).
    monkeypatch.undo()
    d = torch.empty((300, 256), dtype=torch.bfloat16)
    monkeypatch.setattr(load, "driver", lambda: _Driver())
    monkeypatch.setattr(load, "check", lambda r, what: None)
    monkeypatch.setattr(load, "thread_context", lambda device: None)
    monkeypatch.setattr(prepared_launch._tail, "zero_tail", lambda *a, **k: tails.append(a))
    unnamed = []
    for served, ends in ((True, None), (False, 3)):
        monkeypatch.setattr(prepared_launch._tail, "zero_unnamed",
                            lambda *a, served=served, **k: unnamed.append(a) or served)
        call = type("C", (), {"d_rows": 300, "l": 2, "m": 512})()
        entry = type("E", (), {"empty": True, "resets": (), "call": call, "rebase": (("a", 0), ("d_index", 2)),
                               "offsets": 1, "row_ends": ends})()
        prepared_launch.PreparedLaunch._run(op, entry, (0xA0, 0xB0, 0xC0, 0xD0), None, 7, zero={"d": d})
        assert unnamed[-1] == ([d], 0xC0, 300, 0xB0, 2, 512, 7, op.device, 0xD0 if ends else 0)
        assert memsets == ([] if served else [(d.data_ptr(), 0, 300 * 256 * 2 // 4)]) and tails == []


@pytest.mark.parametrize("axes", [dict(), dict(bias_dtype="bfloat16", generate_c=True, c_dtype="float32")])
def test_the_scattered_spec_case_passes_an_index_and_places_its_reference(monkeypatch, axes):
    """selftest._run_spec's scattered case (the first-run gate's) against a stand-in for the kernel
    that takes the interpreter's outputs and stores their rows through what it is given: the case
    passes d_index and d_rows and compares the reference's rows placed by the index (a stand-in
    that ignored the index, or a case that compared unplaced rows, fails here)."""
    import numpy as np

    from fusegemm import selftest
    from fusegemm.ops import device

    def kernel(self, a, off, *rest, inputs=None, d_index=None, d_rows=None, **kw):
        ref = self.reference(a, off, *rest, inputs=inputs)
        return {k: torch.from_numpy(selftest._placed(np.asarray(v, np.float32)[:len(d_index)],
                                                     d_index.numpy(), d_rows))
                for k, v in ref.items() if np.ndim(v) == 2}

    monkeypatch.setattr(Op, "__call__", kernel)
    monkeypatch.setattr(device, "device_arch", lambda d: "sm_100a")
    case = dict(spec="grouped_gemm", tokens=[256, 0, 300], n=256, k=64,
                axes={"d_scatter": True, "tile_m": 128, "cluster_m": 1, "cluster_n": 1, **axes})
    err, ok, detail = selftest._run_spec(case, "cpu")
    assert ok, (err, detail)

    def unplaced(self, a, off, *rest, inputs=None, d_index=None, d_rows=None, **kw):
        ref = self.reference(a, off, *rest, inputs=inputs)
        return {k: torch.from_numpy(np.asarray(v, np.float32)[:d_rows]) for k, v in ref.items() if np.ndim(v) == 2}

    monkeypatch.setattr(Op, "__call__", unplaced)
    assert not selftest._run_spec(case, "cpu")[1]
