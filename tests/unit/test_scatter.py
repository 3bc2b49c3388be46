"""Scattered outputs (``d_scatter``: problem row r's C and D rows are written to row ``d_index[r]`` of
(``d_rows``, N) outputs) on the CPU: the axis reaches the sm_90a BF16 kernel's source and is refused,
with the reason, where no kernel writes it (sm_100a, the K-grouped and block-scaled families) or where
the epilogue's stores are not per row (a paired, quantizing or reducing rule); the scattered kernels
compile clean on the paths that store rows (deferred, staged with C, ping-pong) with one index load
per lane and tile and the plain kernel's stores; ``fusegemm.Op`` parses ``d_index`` / ``d_rows``, sizes
the outputs by ``d_rows``, zeroes them whole (not the tail) and refuses what does not belong.
On the GPU (tests/gpu/test_scatter_gpu.py): bit-equal to the same kernel's rows permuted."""
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


def test_the_axis_reaches_the_sm90_source_and_is_refused_elsewhere():
    assert "kScatterD = true" in render(make_variant("grouped_gemm", arch="sm_90a", d_scatter=True, **BF16)).text
    assert "kScatterD = false" in render(make_variant("grouped_gemm", arch="sm_90a", **BF16)).text
    assert "scatter" in make_variant("grouped_gemm", arch="sm_90a", d_scatter=True, **BF16).readable
    with pytest.raises(UnsupportedError, match="sm_100a kernel's TMEM epilogue has none"):
        registry.resolve("grouped_gemm", "sm_100a", {"d_scatter": True})
    for family, arch, extra in (("grouped_gemm_wgrad", "sm_90a", {}), ("grouped_gemm_wgrad", "sm_100a", {}),
                                ("grouped_gemm_srelu", "sm_90a", {"ab_dtype": "float8_e4m3fn"}),
                                ("grouped_gemm_srelu", "sm_100a", {"ab_dtype": "float8_e4m3fn"})):
        with pytest.raises(UnsupportedError, match=r"scattered outputs \(d_index\) are the sm_90a BF16 grouped"):
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


def test_scattered_outputs_are_zeroed_whole_not_their_tail(monkeypatch, no_device):  # noqa: F811
    """__call__'s scattered C and D: the whole buffers are zeroed on the launch stream before the
    launch (the rows no index names come back zero), and the tail kernel is not run on them (their
    rows are not the problem's); tail=False leaves them unwritten."""
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
    # The launch half: scattered row buffers memset whole (words = bytes / 4), no tail kernel.
    monkeypatch.undo()
    d = torch.empty((300, 256), dtype=torch.bfloat16)
    monkeypatch.setattr(load, "driver", lambda: _Driver())
    monkeypatch.setattr(load, "check", lambda r, what: None)
    monkeypatch.setattr(load, "thread_context", lambda device: None)
    monkeypatch.setattr(prepared_launch._tail, "zero_tail", lambda *a, **k: tails.append(a))
    entry = type("E", (), {"empty": True, "resets": ()})()
    prepared_launch.PreparedLaunch._run(op, entry, (), None, 0, zero={"d": d})
    assert memsets == [(d.data_ptr(), 0, 300 * 256 * 2 // 4)] and tails == []
