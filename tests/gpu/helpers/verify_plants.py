"""Planted kernels for the first-run watchdog's GPU test (tests/gpu/test_verify_gpu.py): runners
for fusegemm/verify.py's child (``verify.RUNNER = "verify_plants:NAME"``) that build the class's
real cases, report ``built``, and then launch a kernel that never ends, one that faults, or the
real cases with a planted defect in their comparison."""
from __future__ import annotations

import ctypes


def hang(cls, device, built):
    import torch
    torch.cuda.init()
    built()
    torch.cuda._sleep(1 << 62)     # a kernel that spins for longer than anyone waits
    torch.cuda.synchronize()
    return []


_FAULT = b'extern "C" __global__ void fault(float* p) { p[threadIdx.x] = 1.0f; }'


def fault(cls, device, built):
    """A kernel that stores through an unmapped address: CUDA_ERROR_ILLEGAL_ADDRESS, which ends
    the context it ran in."""
    import torch
    from cuda.bindings import driver, nvrtc
    torch.cuda.init()
    torch.zeros(1, device=f"cuda:{device}")             # the primary context, current
    err, prog = nvrtc.nvrtcCreateProgram(_FAULT, b"fault.cu", 0, [], [])
    major, minor = torch.cuda.get_device_capability(device)
    nvrtc.nvrtcCompileProgram(prog, 1, [f"--gpu-architecture=compute_{major}{minor}".encode()])
    _, size = nvrtc.nvrtcGetPTXSize(prog)
    ptx = b" " * size
    nvrtc.nvrtcGetPTX(prog, ptx)
    _, module = driver.cuModuleLoadData(ptx)
    _, fn = driver.cuModuleGetFunction(module, b"fault")
    built()
    bad = ctypes.c_uint64(0x1000)                       # no allocation lives there
    args = (ctypes.c_void_p * 1)(ctypes.addressof(bad))
    driver.cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, 0, ctypes.addressof(args), 0)
    err, = driver.cuCtxSynchronize()
    raise RuntimeError(f"CUDA error after the planted kernel: {driver.cuGetErrorName(err)[1].decode()}")


def wrong(cls, device, built):
    """The class's real cases with every comparison planted to fail."""
    from fusegemm import output_compare, selftest
    selftest._compare = lambda got, ref, scale, dtype: (1.0, False)
    output_compare.compare_outputs = lambda *a, **k: (1.0, "planted defect")
    return selftest.run_class(cls, device, built)
