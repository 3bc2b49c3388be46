"""Launch planning on the host, without a GPU: the persistent grid (worked table) and the
cluster attributes a kernel is loaded and launched with."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from fusegemm.base.errors import ArgumentError
from fusegemm.ops.prepared import persistent_grid
from fusegemm.runtime import launch as launch_mod
from fusegemm.runtime import load as load_mod

# (m_rows, n, tile, ctas per tile, cluster, SMs) -> CTAs. Before the fix the grid was counted in
# tiles: max(cs, min(sms, tiles) // cs * cs), which the last column records.
GRID_TABLE = [
    # 2-CTA tiles: each tile needs a pair, so 8 tiles need 16 CTAs (was 8: half the tiles idle)
    ((1024, 512, (256, 256), 2, (2, 1), 148), 16, 8),
    # a 2x2 cluster of 1-CTA tiles walks 2x2 blocks: 12 tiles = 4 blocks = 16 CTAs (was 12)
    ((512, 768, (128, 256), 1, (2, 2), 148), 16, 12),
    ((1024, 512, (128, 256), 1, (2, 2), 148), 16, 16),
    # large problems: one CTA per SM, whole clusters
    ((16384, 4096, (256, 256), 2, (2, 1), 148), 148, 148),
    ((16384, 4096, (128, 256), 1, (1, 1), 132), 132, 132),
    ((2048, 2048, (128, 128), 1, (4, 4), 148), 144, 144),
    # 4x4 cluster of CTA pairs: 2 MMA units along M -> 4 x 2 blocks of 8 CTAs' tiles
    ((2048, 2048, (256, 256), 2, (4, 4), 148), 128, 64),
    # sm_90a: 1x1 clusters, one CTA per tile when tiles are fewer than SMs
    ((256, 256, (128, 256), 1, (1, 1), 132), 2, 2),
    ((256, 8, (64, 128), 1, (1, 1), 132), 4, 4),
]


@pytest.mark.parametrize("args,want,old", GRID_TABLE, ids=[str(i) for i in range(len(GRID_TABLE))])
def test_persistent_grid_worked_table(args, want, old):
    m, n, tile, cpt, cluster, sms = args
    assert persistent_grid(m, n, tile, cpt, cluster, sms) == want
    assert want % (cluster[0] * cluster[1]) == 0 and want <= sms


class FakeDriver:
    """The cuda-bindings calls _load makes, recorded."""

    def __init__(self):
        self.calls = []
        self.CUdevice_attribute = SimpleNamespace(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN="optin")
        self.CUfunction_attribute = SimpleNamespace(
            CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES="max_dyn_smem",
            CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED="non_portable")

    def cuDeviceGet(self, d):
        return (0, d)

    def cuDeviceGetAttribute(self, attr, dev):
        return (0, 232448)

    def cuModuleLoadData(self, cubin):
        return (0, "module")

    def cuModuleGetFunction(self, module, name):
        return (0, 1234)

    def cuFuncSetAttribute(self, fn, attr, value):
        self.calls.append((attr, value))
        return (0,)


@pytest.mark.parametrize("max_ctas,expect", [(16, True), (8, False), (1, False)])
def test_non_portable_clusters_are_allowed_at_load(monkeypatch, max_ctas, expect):
    """A 4x4 cluster (16 CTAs, legal for the sm_100a kernels) needs the function attribute
    NON_PORTABLE_CLUSTER_SIZE_ALLOWED, or its launch fails; it is set when the kernel's
    contract allows more than the portable 8 CTAs."""
    fake = FakeDriver()
    monkeypatch.setattr(load_mod, "driver", lambda: fake)
    k = load_mod._load(b"cubin", "k", 1024, ctx=1, device=0, max_cluster_ctas=max_ctas)
    assert (("non_portable", 1) in fake.calls) == expect
    assert ("max_dyn_smem", 1024) in fake.calls and k.max_cluster_ctas == max_ctas


def test_launch_refuses_a_cluster_beyond_the_kernel(monkeypatch):
    monkeypatch.setattr(launch_mod, "driver", lambda: pytest.fail("the driver was called"))
    k = load_mod.LoadedKernel(function=None, module=None, handle=1, name="k", smem_bytes=0, context=1,
                              device=0, max_cluster_ctas=8)
    cfg = launch_mod.LaunchConfig(grid=(16, 1, 1), block=(256, 1, 1), cluster=(16, 1, 1))
    with pytest.raises(ArgumentError, match=r"^LaunchConfig.cluster: got \(16, 1, 1\); allowed: at most 8 CTAs"):
        launch_mod.launch(k, cfg, launch_mod.ParamBuffer(8), 0)


class _ClusterDriver:
    """The driver calls of a cluster launch and an occupancy query, recorded."""

    class CUlaunchConfig(SimpleNamespace):
        pass

    class CUlaunchAttribute:
        def __init__(self):
            self.id = None
            self.value = SimpleNamespace(clusterDim=SimpleNamespace(x=0, y=0, z=0))

    CUlaunchAttributeID = SimpleNamespace(CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION="cluster_dim")

    def __init__(self):
        self.seen = []

    @staticmethod
    def CUstream(handle):
        return ("stream", handle)

    def cuLaunchKernelEx(self, lc, fn, argv, extra):
        self.seen.append(("launch", lc, fn, argv))
        return (0,)

    def cuOccupancyMaxActiveClusters(self, fn, lc):
        self.seen.append(("occupancy", lc, fn, None))
        return (0, 30)


def _geometry(lc):
    a = lc.attrs[0]
    return ((lc.gridDimX, lc.gridDimY, lc.gridDimZ), (lc.blockDimX, lc.blockDimY, lc.blockDimZ),
            lc.sharedMemBytes, lc.numAttrs, a.id, (a.value.clusterDim.x, a.value.clusterDim.y, a.value.clusterDim.z))


def test_cluster_launch_and_occupancy_query_describe_the_cluster(monkeypatch):
    """A cluster launch (cuLaunchKernelEx) and the persistent grid's occupancy query
    (cuOccupancyMaxActiveClusters: one cluster of the kernel's block and shared memory) hand the
    driver the geometry and the cluster-dimension attribute; only the launch names a stream."""
    drv = _ClusterDriver()
    monkeypatch.setattr(launch_mod, "driver", lambda: drv)
    monkeypatch.setattr(launch_mod, "_ACTIVE_CLUSTERS", {})
    k = load_mod.LoadedKernel(function="fn", module=None, handle=7, name="k", smem_bytes=4096, context=1,
                              device=0, max_cluster_ctas=16)
    cfg = launch_mod.LaunchConfig(grid=(8, 1, 1), block=(384, 1, 1), cluster=(2, 1, 1), smem_bytes=4096)
    params = launch_mod.ParamBuffer(8)
    launch_mod.launch(k, cfg, params, 5)
    assert launch_mod.max_active_clusters(k, 384, 4) == 30
    assert launch_mod.max_active_clusters(k, 384, 4) == 30      # cached: one query
    (what1, lc1, fn1, argv), (what2, lc2, fn2, _) = drv.seen
    assert (what1, fn1, argv, lc1.hStream) == ("launch", "fn", params.argv_address, ("stream", 5))
    assert _geometry(lc1) == ((8, 1, 1), (384, 1, 1), 4096, 1, "cluster_dim", (2, 1, 1))
    assert (what2, fn2, hasattr(lc2, "hStream")) == ("occupancy", "fn", False)
    assert _geometry(lc2) == ((4, 1, 1), (384, 1, 1), 4096, 1, "cluster_dim", (4, 1, 1))


def test_op_cache_is_reentrant():
    """Making an op may make another one through the same cache in the same thread (the
    first-run gate runs selftest cases through the public wrappers while the first op
    compiles): that must not deadlock. Seen on the H200 as a hung first call."""
    import threading

    from fusegemm.ops.prepared import OpCache
    cache = OpCache()
    done = []

    def outer():
        done.append(cache.get_or_create("a", lambda: cache.get_or_create("b", lambda: "inner") + "+outer"))
    t = threading.Thread(target=outer, daemon=True)
    t.start()
    t.join(timeout=10)
    assert done == ["inner+outer"], "nested get_or_create deadlocked"


def test_prepared_launch_checks_once_and_passes_the_geometry(monkeypatch):
    """``prepare`` refuses a geometry the kernel was not loaded for when it is prepared (not
    at a later call), hands the driver the grid, block, shared memory, stream and argument
    array it was given (pointers as pointer objects: the prepared call has no argtypes, and a
    plain int would go as a 32-bit C int), and turns a driver error code into CudaError naming
    the kernel."""
    import ctypes
    CudaError = load_mod.CudaError
    seen = []

    def as_value(x):
        if isinstance(x, ctypes.c_void_p):
            return ("ptr", x.value)
        if isinstance(x, ctypes.Array):
            return ("array", ctypes.addressof(x))
        return x

    def fake_launch(*args):
        seen.append(tuple(as_value(x) for x in args))
        return 700 if seen[-1][8] == ("ptr", 99) else 0     # stream 99: CUDA_ERROR_ILLEGAL_ADDRESS

    class Drv:
        CUresult = int

        @staticmethod
        def cuGetErrorName(err):
            return (0, b"CUDA_ERROR_ILLEGAL_ADDRESS")
    monkeypatch.setattr(launch_mod, "_direct", {False: fake_launch, True: fake_launch})
    monkeypatch.setattr(load_mod, "driver", lambda: Drv)
    k = load_mod.LoadedKernel(function=None, module=None, handle=2**40 + 77, name="kern", smem_bytes=4096,
                              context=1, device=0)
    with pytest.raises(ArgumentError, match=r"^LaunchConfig.smem_bytes: got 8192"):
        launch_mod.prepare(k, launch_mod.LaunchConfig(grid=(4, 1, 1), block=(128, 1, 1), smem_bytes=8192))
    assert not seen
    go = launch_mod.prepare(k, launch_mod.LaunchConfig(grid=(4, 2, 1), block=(384, 1, 1), smem_bytes=4096))
    buf = launch_mod.ParamBuffer(16)
    go(buf, 2**45 + 5)
    go(buf, 0)
    argv = ("array", buf.argv_address)
    assert seen == [(("ptr", 2**40 + 77), 4, 2, 1, 384, 1, 1, 4096, ("ptr", 2**45 + 5), argv, None),
                    (("ptr", 2**40 + 77), 4, 2, 1, 384, 1, 1, 4096, None, argv, None)]
    with pytest.raises(CudaError, match=r"cuLaunchKernel\(kern\) failed: CUDA_ERROR_ILLEGAL_ADDRESS"):
        go(buf, 99)


def test_call_patterns_key_module_weights_and_refuse_other_subclasses():
    """An ``nn.Parameter`` (a module's weights: the MoE layer's w1 and w2) keys a call pattern as
    the plain tensor does, so a layer's forward GEMMs take the memo (they took the full
    validation on every step: about 0.5 ms of host time per MoE step on the H200); other tensor
    subclasses still key nothing."""
    torch = pytest.importorskip("torch")
    from fusegemm.ops.prepared import addresses, pattern
    w = torch.randn(4, 8)
    p = torch.nn.Parameter(w.clone())
    key_t, _ = pattern((torch.ones(2), w), {}, {}, None)
    key_p, flat = pattern((torch.ones(2), p), {}, {}, None)
    assert key_p is not None and key_p == key_t
    assert addresses(flat)[1] == p.data_ptr() != 0

    class Sub(torch.Tensor):
        pass
    assert pattern((w.as_subclass(Sub),), {}, {}, None)[0] is None
