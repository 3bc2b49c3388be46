"""The XLA FFI handler of fusegemm/jax_ffi.py driven on the CPU with call frames built in
ctypes (the layout of XLA's FFI C API): the metadata query, stages, buffer and attribute
decoding, the stream, and errors returned through XLA_FFI_Error_Create. The real target runs
under jax.jit on the GPU in tests/gpu/test_interop_gpu.py."""
from __future__ import annotations

import ctypes

import pytest

from fusegemm import jax_ffi as fx
from fusegemm.base.errors import ArgumentError


class Frame:
    """A call frame with two argument buffers, one result, attributes and a fake API table."""

    def __init__(self, stage=3, metadata=False):
        self.errors, self.keep = [], []

        def create(args_ptr):
            a = args_ptr.contents
            self.errors.append((a.errc, a.message.decode()))
            return 1234                      # any non-NULL XLA_FFI_Error*

        def stream_get(args_ptr):
            args_ptr.contents.stream = 0x5000
            return None

        self.create, self.stream_get = fx._ErrorCreate(create), fx._StreamGet(stream_get)
        api = fx._Api(struct_size=ctypes.sizeof(fx._Api), error_create=self.create, stream_get=self.stream_get)
        args = [self._buffer(16, (768, 256)), self._buffer(4, (3,))]
        rets = [self._buffer(11, (768, 128))]
        self.frame = fx._CallFrame(struct_size=ctypes.sizeof(fx._CallFrame), api=ctypes.pointer(api), stage=stage,
                                   args=self._list(args), rets=self._list(rets), attrs=self._attrs())
        self.keep.append(api)
        if metadata:
            md = fx._Metadata(struct_size=ctypes.sizeof(fx._Metadata))
            ext = fx._MetadataExt(base=fx._Ext(ctypes.sizeof(fx._MetadataExt), fx._METADATA, None),
                                  metadata=ctypes.pointer(md))
            self.keep += [md, ext]
            self.md = md
            self.frame.extension_start = ctypes.cast(ctypes.pointer(ext), ctypes.POINTER(fx._Ext))

    def _buffer(self, dtype, shape):
        dims = (ctypes.c_int64 * len(shape))(*shape)
        b = fx._Buffer(struct_size=ctypes.sizeof(fx._Buffer), dtype=dtype, data=None, rank=len(shape), dims=dims)
        self.keep += [dims, b]
        return b

    def _list(self, bufs):
        types = (ctypes.c_int * len(bufs))(*([1] * len(bufs)))
        items = (ctypes.c_void_p * len(bufs))(*[ctypes.addressof(b) for b in bufs])
        self.keep += [types, items]
        return fx._List(struct_size=ctypes.sizeof(fx._List), size=len(bufs), types=types, items=items)

    def _attrs(self):
        names, values, types = [], [], []
        for name, kind, payload in (("generate_c", fx._ATTR_SCALAR, (1, ctypes.c_bool(True))),
                                    ("tile", fx._ATTR_SCALAR, (5, ctypes.c_int64(256))),
                                    ("mode", fx._ATTR_STRING, b"dense")):
            raw = name.encode()
            names.append(fx._Span(ctypes.cast(ctypes.c_char_p(raw), ctypes.c_void_p), len(raw)))
            self.keep.append(raw)
            if kind == fx._ATTR_SCALAR:
                code, value = payload
                sc = fx._Scalar(code, ctypes.cast(ctypes.pointer(value), ctypes.c_void_p))
                self.keep += [value, sc]
                values.append(ctypes.addressof(sc))
            else:
                buf = ctypes.create_string_buffer(payload)
                span = fx._Span(ctypes.cast(buf, ctypes.c_void_p), len(payload))
                self.keep += [buf, span]
                values.append(ctypes.addressof(span))
            types.append(kind)
        name_ptrs = (ctypes.POINTER(fx._Span) * 3)(*[ctypes.pointer(n) for n in names])
        tarr, varr = (ctypes.c_int * 3)(*types), (ctypes.c_void_p * 3)(*values)
        self.keep += [names, name_ptrs, tarr, varr]
        return fx._Attrs(struct_size=ctypes.sizeof(fx._Attrs), size=3, types=tarr, names=name_ptrs, attrs=varr)

    def call(self, handler):
        return handler(ctypes.pointer(self.frame))


def test_execute_decodes_buffers_attributes_and_the_stream():
    seen = []
    handler = fx._handler(lambda args, rets, attrs, stream: seen.append((args, rets, attrs, stream)))
    f = Frame()
    assert f.call(handler) is None and f.errors == []
    args, rets, attrs, stream = seen[0]
    assert [(v.dtype, v.shape, v.strides) for v in args] == [("bfloat16", (768, 256), (256, 1)),
                                                              ("int32", (3,), (1,))]
    assert (rets[0].dtype, rets[0].shape, rets[0].strides) == ("float32", (768, 128), (128, 1))
    assert attrs == {"generate_c": True, "tile": 256, "mode": "dense"} and stream == 0x5000


def test_the_metadata_query_and_other_stages_run_nothing():
    ran = []
    handler = fx._handler(lambda *a: ran.append(a))
    f = Frame(metadata=True)
    assert f.call(handler) is None
    assert (f.md.api_version.major, f.md.api_version.minor, f.md.traits) == (0, 1, 0)
    assert Frame(stage=1).call(handler) is None            # prepare stage: nothing to do
    assert ran == []


@pytest.mark.parametrize("exc,code", [(ArgumentError("a_tensor.dtype", "float16", "bfloat16"), 3),
                                      (RuntimeError("boom"), 13)])
def test_failures_become_xla_errors(exc, code):
    def run(*a):
        raise exc
    f = Frame()
    assert f.call(fx._handler(run)) == 1234
    (errc, message), = f.errors
    assert errc == code and message.startswith("fusegemm: ")
    assert ("a_tensor.dtype: got float16; allowed: bfloat16" in message) if code == 3 else "RuntimeError: boom" in message


def test_an_unknown_buffer_type_is_an_argument_error():
    f = Frame()
    ctypes.cast(f.frame.args.items[1], ctypes.POINTER(fx._Buffer)).contents.dtype = 12     # F64
    assert f.call(fx._handler(lambda *a: None)) == 1234
    assert f.errors[0][0] == 3 and "args[1].dtype: got XLA type 12" in f.errors[0][1]
