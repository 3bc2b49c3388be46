"""Framework interop at the wrappers (runtime/interop.py), on CPU: which arguments make a call
foreign, how a foreign call imports and exports, and its errors. The GPU half (JAX and CuPy
arrays end to end, stream hand-over) is tests/gpu/test_interop_gpu.py."""
from __future__ import annotations

import sys
import types

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import fusegemm  # noqa: E402
from fusegemm.base.errors import ArgumentError, UnsupportedError  # noqa: E402
from fusegemm.runtime import interop  # noqa: E402
from fusegemm.tupledict import TupleDict  # noqa: E402


class Fake:
    """A DLPack producer from another framework, wrapping a torch CPU tensor."""

    def __init__(self, t):
        self.t = t
        self.streams = []

    def __dlpack__(self, stream=None, **kw):
        self.streams.append(stream)
        return self.t.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self.t.__dlpack_device__()


Fake.__module__ = "fakefw.arrays"


def test_which_arguments_are_foreign():
    assert interop.foreign(Fake(torch.zeros(2)))
    for native in (torch.zeros(2), np.zeros(2), None, "bfloat16", 3, torch.bfloat16, (128, 256)):
        assert not interop.foreign(native), native
    assert interop.framework(Fake(torch.zeros(2))) == "fakefw"


def test_a_foreign_host_array_reaches_the_device_rule():
    """Host memory from another framework is imported as is; the op names the device problem."""
    a = Fake(torch.zeros((256, 64), dtype=torch.bfloat16))
    with pytest.raises(ArgumentError, match=r"^a_tensor\.device: got cpu; allowed: a CUDA device"):
        fusegemm.grouped_gemm(a, torch.tensor([256], dtype=torch.int32), torch.ones(1),
                              torch.zeros((1, 128, 64), dtype=torch.bfloat16))
    with pytest.raises(ArgumentError, match=r"\.device: got cpu; allowed: a CUDA device"):
        fusegemm.grouped_gemm(torch.zeros((256, 64), dtype=torch.bfloat16), torch.tensor([256], dtype=torch.int32),
                              Fake(torch.ones(1)), torch.zeros((1, 128, 64), dtype=torch.bfloat16))


def test_wrappers_keep_their_signature_and_docs():
    import inspect
    for name in ("grouped_gemm", "grouped_gemm_srelu", "grouped_gemm_quant", "grouped_gemm_dswiglu", "gemm_amax"):
        fn = getattr(fusegemm, name)
        assert fn.__wrapped__ is not None and fn.__doc__ == fn.__wrapped__.__doc__
        assert inspect.signature(fn) == inspect.signature(fn.__wrapped__)


class Stream:
    def __init__(self):
        self.syncs = 0

    def synchronize(self):
        self.syncs += 1


@pytest.fixture
def consumer(monkeypatch):
    """A fake framework module whose from_dlpack records what it was handed."""
    mod = types.ModuleType("fakefw")
    got = []

    def from_dlpack(x, stream=None):
        if x.t.dtype == torch.bfloat16:
            raise TypeError("fakefw has no bfloat16")
        got.append(x)
        return ("fakefw", x.__dlpack__(stream=stream))
    mod.from_dlpack = from_dlpack
    monkeypatch.setitem(sys.modules, "fakefw", mod)
    return got


def test_outputs_go_to_the_callers_framework(consumer):
    s = Stream()
    out = TupleDict(d_tensor=torch.zeros(2), c_tensor=None, amax_tensor=torch.zeros(1, dtype=torch.bfloat16))
    res = interop._export(out, "fakefw", s)
    assert list(res.keys()) == ["d_tensor", "c_tensor", "amax_tensor"]
    assert res["d_tensor"][0] == "fakefw" and res["c_tensor"] is None
    assert isinstance(res["amax_tensor"], torch.Tensor)    # a dtype the framework cannot hold
    assert s.syncs == 1     # no consumer stream named: the kernel is finished before the hand-over


def test_a_consumer_that_names_its_stream_is_not_synchronised(consumer):
    s = Stream()
    h = interop._Handover(torch.zeros(2), s)
    h.__dlpack__(stream=None)
    assert s.syncs == 1
    assert h.__dlpack_device__() == torch.zeros(2).__dlpack_device__()


def test_foreign_calls_need_torch(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)    # `import torch` raises ImportError
    with pytest.raises(UnsupportedError, match=r"^got a fakefw\.arrays\.Fake argument: .*allocator; install torch, "
                                               r"or pass torch tensors$"):
        fusegemm.grouped_gemm(Fake(None), None, None)
