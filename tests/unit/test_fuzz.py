"""Property-based fuzzing (hypothesis) of what users hand fusegemm: op arguments, spec files and
the cache directory. Every case must end in fusegemm's typed errors (or a valid result), within a
time bound -- never another exception, a hang or a corrupted kernel served.

CI runs the "ci" profile (seeded, bounded: well under 60 s in all); ``HYPOTHESIS_PROFILE=long``
runs many more examples locally. The number of cases each run tried is printed at the end
(``-s`` shows it) and recorded in the closing note.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

torch = pytest.importorskip("torch")

from fusegemm.base.errors import FusegemmError, SpecError  # noqa: E402
from fusegemm.generator.spec import parse_spec  # noqa: E402

settings.register_profile("ci", max_examples=120, derandomize=True, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
settings.register_profile("long", max_examples=5000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

SPECS = Path(__file__).resolve().parents[2] / "specs"
COUNTS: dict[str, int] = {}


def _count(name: str) -> None:
    COUNTS[name] = COUNTS.get(name, 0) + 1


@pytest.fixture(scope="module", autouse=True)
def _report():
    yield
    print("\nfuzz cases run:", json.dumps(COUNTS, sort_keys=True))


# ---------------------------------------------------------------- (a) op arguments on CPU

DTYPES = [torch.bfloat16, torch.float16, torch.float32, torch.int32, torch.int64, torch.uint8,
          torch.float8_e4m3fn]


@st.composite
def tensors(draw, ndim_max=3, max_extent=600):
    ndim = draw(st.integers(0, ndim_max))
    shape = [draw(st.sampled_from([0, 1, 2, 3, 8, 64, 128, 255, 256, 300, 512, max_extent]))
             for _ in range(ndim)]
    while int(np.prod(shape, dtype=np.int64)) > 1 << 20:   # bounded memory: shrink the largest extent
        shape[shape.index(max(shape))] = 4
    shape = tuple(shape)
    dtype = draw(st.sampled_from(DTYPES))
    t = torch.zeros(shape, dtype=dtype) if dtype != torch.float8_e4m3fn else \
        torch.zeros(shape, dtype=torch.uint8).view(torch.float8_e4m3fn)
    how = draw(st.sampled_from(["plain", "transposed", "sliced", "offset"]))
    if how == "transposed" and t.dim() >= 2:
        t = t.transpose(0, 1)
    elif how == "sliced" and t.dim() >= 1 and t.shape[-1] > 1:
        t = t[..., ::2]
    elif how == "offset" and t.numel() > 1:
        t = t.reshape(-1)[1:]
    return t


def _good_bf16():
    a = torch.zeros((512, 128), dtype=torch.bfloat16)
    return dict(a_tensor=a, padded_offsets=torch.tensor([256, 512], dtype=torch.int32),
                alpha_tensor=torch.ones(2), b_tensor=torch.zeros((2, 256, 128), dtype=torch.bfloat16))


def _typed(exc: BaseException) -> None:
    assert isinstance(exc, FusegemmError), f"{type(exc).__name__}: {exc}"
    msg = str(exc)
    assert msg and len(msg) < 2000
    if type(exc).__name__ == "ArgumentError":
        assert "got" in msg and "allowed" in msg, msg


@given(which=st.sampled_from(["a_tensor", "padded_offsets", "alpha_tensor", "b_tensor", "bias_tensor",
                              "prob_tensor", "b_ptrs"]),
       value=st.one_of(st.none(), tensors(), st.integers(-3, 3), st.text(max_size=3)),
       options=st.fixed_dictionaries({}, optional={
           "c_dtype": st.sampled_from(["bfloat16", "float32", "int8", torch.float16, None]),
           "generate_c": st.sampled_from([True, False, 1, "yes"]),
           "mma_tiler_mn": st.sampled_from([(128, 256), (64, 64), [128, 128], (1,), "x"]),
           "n": st.sampled_from([None, 256, 7, -1, 2.0]),
       }))
def test_grouped_gemm_arguments(which, value, options):
    import fusegemm
    kw = {**_good_bf16(), which: value}
    _count("op arguments: grouped_gemm")
    with pytest.raises(Exception) as info:   # CPU tensors: even a valid call ends at the device check
        fusegemm.grouped_gemm(**kw, **options)
    _typed(info.value)


@given(which=st.sampled_from(["a_tensor", "b_tensor", "sfa_tensor", "sfb_tensor", "padded_offsets",
                              "alpha_tensor", "prob_tensor", "norm_const_tensor"]),
       value=st.one_of(st.none(), tensors(ndim_max=6, max_extent=300)),
       sf_vec_size=st.sampled_from([32, 16, 0, 33]))
def test_block_scaled_arguments(which, value, sf_vec_size):
    import fusegemm
    from test_scaled_errors import base   # a valid seeded srelu call on CPU tensors
    kw = {**base("grouped_gemm_srelu"), which: value, "sf_vec_size": sf_vec_size}
    _count("op arguments: grouped_gemm_srelu")
    with pytest.raises(Exception) as info:
        fusegemm.grouped_gemm_srelu(**kw)
    _typed(info.value)


# ---------------------------------------------------------------- (b) spec files

SPEC_TEXTS = {p.name: p.read_text() for p in sorted(SPECS.glob("*.yaml"))}
TOKENS = ["", "~", ".inf", "-.nan", "1e-320", "1.0e999", "[", "]", "{", "}", ":", "- ", "&x", "*x",
          "!!python/object/apply:os.system ['true']", "'", '"', "#", "x" * 3000, "é", "\t", "\x00",
          "0x10", "true", "[[[[[[[[", "{a: 1}", "d = acc; asm(\"trap\")", "tile_n: 64", "256", "-1"]


@st.composite
def mutated_specs(draw):
    name = draw(st.sampled_from(sorted(SPEC_TEXTS)))
    lines = SPEC_TEXTS[name].splitlines()
    for _ in range(draw(st.integers(1, 4))):
        if not lines:
            break
        i = draw(st.integers(0, len(lines) - 1))
        op = draw(st.sampled_from(["delete", "duplicate", "replace_value", "insert", "indent", "dedent",
                                   "swap", "truncate"]))
        if op == "delete":
            del lines[i]
        elif op == "duplicate":
            lines.insert(i, lines[i])
        elif op == "replace_value":
            key, sep, _ = lines[i].partition(":")
            lines[i] = key + ":" + " " + draw(st.sampled_from(TOKENS)) if sep else draw(st.sampled_from(TOKENS))
        elif op == "insert":
            lines.insert(i, draw(st.sampled_from(TOKENS)))
        elif op == "indent":
            lines[i] = "  " + lines[i]
        elif op == "dedent":
            lines[i] = lines[i].lstrip()
        elif op == "swap":
            j = draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
        else:
            lines = lines[:i]
    return name, "\n".join(lines) + "\n"


@given(case=mutated_specs())
def test_mutated_specs(case):
    name, text = case
    _count("spec files")
    t0 = time.perf_counter()
    try:
        parse_spec(text, name, expected_name=name[:-5])
    except SpecError as exc:
        assert str(exc).startswith(name), str(exc)[:300]
        assert len(str(exc)) < 1200
    except FusegemmError:
        pass
    assert time.perf_counter() - t0 < 2.0


# ---------------------------------------------------------------- (c) the cache directory


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """One built entry to corrupt (a small sm_100a kernel: ~0.4 s)."""
    from fusegemm import build, pipeline
    from fusegemm.runtime.cache import KernelCache
    root = tmp_path_factory.mktemp("pristine")
    v = build.select(["grouped_gemm"], ("sm_100a",), choices={"tile_m": 128})[0][0]
    p = pipeline.plan(v)
    built = pipeline.compile_planned(p, KernelCache(root, disk=True))
    return root, p, built


CORRUPTIONS = ["truncate_cubin", "flip_cubin", "flip_meta", "meta_not_object", "meta_wrong_key",
               "delete_cubin", "delete_meta", "cubin_is_dir", "entry_is_file", "garbage_source",
               "meta_wrong_size"]


@settings(max_examples=max(10, settings.default.max_examples // 3))   # each heal is a ~0.3 s compile
@given(what=st.lists(st.sampled_from(CORRUPTIONS), min_size=1, max_size=3),
       where=st.floats(0.0, 0.999), byte=st.integers(1, 255))
def test_cache_corruption_never_serves_a_bad_kernel(pristine, tmp_path_factory, what, where, byte):
    from fusegemm import pipeline
    from fusegemm.runtime.cache import KernelCache
    src_root, p, built = pristine
    root = tmp_path_factory.mktemp("fuzzcache")
    shutil.copytree(src_root, root, dirs_exist_ok=True)
    entry = KernelCache(root, disk=True).entry_dir(p.name, p.key)
    _count("cache corruptions")
    for w in what:
        cubin, meta = entry / "kernel.cubin", entry / "meta.json"
        try:
            if w == "truncate_cubin":
                data = cubin.read_bytes()
                cubin.write_bytes(data[:int(len(data) * where)])
            elif w == "flip_cubin":
                data = bytearray(cubin.read_bytes())
                data[int(len(data) * where)] ^= byte
                cubin.write_bytes(bytes(data))
            elif w == "flip_meta":
                data = bytearray(meta.read_bytes())
                data[int(len(data) * where)] ^= byte
                meta.write_bytes(bytes(data))
            elif w == "meta_not_object":
                meta.write_text(json.dumps([1, 2, 3]))
            elif w == "meta_wrong_key":
                m = json.loads(meta.read_text())
                m["key"] = "0" * 64
                meta.write_text(json.dumps(m))
            elif w == "meta_wrong_size":
                m = json.loads(meta.read_text())
                m["cubin_size"] = 1
                meta.write_text(json.dumps(m))
            elif w == "delete_cubin":
                cubin.unlink()
            elif w == "delete_meta":
                meta.unlink()
            elif w == "cubin_is_dir":
                cubin.unlink()
                cubin.mkdir()
            elif w == "entry_is_file":
                shutil.rmtree(entry)
                entry.write_bytes(b"junk")
            elif w == "garbage_source":
                (entry / "kernel.cu").write_bytes(os.urandom(64))
        except (OSError, ValueError, TypeError):
            pass   # an earlier corruption removed (or un-JSONed) what this one edits
    cache = KernelCache(root, disk=True)
    got = cache.get(p.name, p.key)
    assert got is None or got.cubin == built.cubin, "a corrupted entry was served"
    cache.entries()                                          # listing never raises
    healed = pipeline.compile_planned(p, KernelCache(root, disk=True))
    # Not byte-compared with the original: NVRTC 12.9's sm_100a output can differ by a byte
    # between two compiles of one source in one process (seen here); the kernel is the same.
    assert healed.contract == built.contract and healed.resources == built.resources
    again = KernelCache(root, disk=True).get(p.name, p.key)
    assert again is not None and again.cubin == healed.cubin, "the entry did not heal"
