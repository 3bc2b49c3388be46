"""Block-scaled grouped problems whose GEMM is exact, for the GPU tests of spec-authored
block-scaled backends (tests/gpu/test_dsrelu_mx_gpu.py, test_dglu_mx_gpu.py): FP8 operands of
small integers with power-of-two scales, so every product and sum of the GEMM is exact in any
order and the kernel differs from the references only in its epilogue's own rounding."""
from __future__ import annotations

import numpy as np
import torch

from fusegemm.formats import blockwise_sfa_layout, pack_sf
from fusegemm.output_compare import to_device


# fusegemm.Op's axes for the recipe names operands() takes.
RECIPES = {"mx": {}, "blockwise": {"sf_dtype": "float32", "sf_vec_size": 128}}


def operands(sizes: list[int], n: int, k: int, recipe: str, rng: np.random.Generator) -> tuple:
    """(host operands by the wrapper's names, each expert's SFB for discrete weights, A and B
    dequantized in float64) on the CPU; ``recipe`` "mx" (E8M0 per 32 K) or "blockwise" (FP32, A
    1x128, B 128x128). Draws from ``rng`` in a fixed order (the callers' inputs come after)."""
    import ml_dtypes
    m, l = sum(sizes), len(sizes)
    e4m3 = ml_dtypes.float8_e4m3fn
    aq = rng.integers(-3, 4, (m, k)).astype(e4m3)
    bq = rng.integers(-3, 4, (l, n, k)).astype(e4m3)
    if recipe == "mx":
        e8m0 = ml_dtypes.float8_e8m0fnu
        sa = np.exp2(rng.integers(-1, 2, (m, k // 32))).astype(np.float32).astype(e8m0)
        sb = np.exp2(rng.integers(-1, 2, (l, n, k // 32))).astype(np.float32).astype(e8m0)
        sfa, sfb = to_device(pack_sf(sa), "cpu"), to_device(pack_sf(sb, batch_first=True), "cpu")
        per_expert_sfb = [to_device(pack_sf(sb[e]), "cpu") for e in range(l)]
        a64 = aq.astype(np.float64) * np.repeat(sa.astype(np.float64), 32, axis=1)
        b64 = bq.astype(np.float64) * np.repeat(sb.astype(np.float64), 32, axis=2)
    else:
        sa = np.exp2(rng.integers(-1, 2, (m, -(-k // 128)))).astype(np.float32)
        sb = np.exp2(rng.integers(-1, 2, (l, -(-n // 128), -(-k // 128)))).astype(np.float32)
        sfa, sfb = blockwise_sfa_layout(torch.from_numpy(sa)), torch.from_numpy(sb)
        per_expert_sfb = [sfb[e].contiguous() for e in range(l)]
        a64 = aq.astype(np.float64) * np.repeat(sa, 128, axis=1)[:, :k]
        b64 = bq.astype(np.float64) * np.repeat(np.repeat(sb, 128, axis=1), 128, axis=2)[:, :n, :k]
    host = {"a_tensor": to_device(aq, "cpu"), "sfa_tensor": sfa,
            "padded_offsets": torch.tensor(np.cumsum(sizes), dtype=torch.int32),
            "b_tensor": to_device(bq, "cpu"), "sfb_tensor": sfb}
    return host, per_expert_sfb, a64, b64


def on_device(host: dict, per_expert_sfb: list, n: int, discrete: bool) -> tuple[dict, list]:
    """(the operands on the GPU, what must stay alive): discrete weights as ``b_ptrs`` /
    ``sfb_ptrs`` / ``n`` in place of ``b_tensor`` / ``sfb_tensor``."""
    dev = {key: v.cuda() for key, v in host.items()}
    keep: list = []
    if discrete:
        bs = [t.contiguous() for t in dev.pop("b_tensor")]
        sbs = [t.cuda() for t in per_expert_sfb]
        dev.pop("sfb_tensor")
        keep = bs + sbs
        dev.update(b_ptrs=torch.tensor([t.data_ptr() for t in bs], dtype=torch.int64, device="cuda"),
                   sfb_ptrs=torch.tensor([t.data_ptr() for t in sbs], dtype=torch.int64, device="cuda"), n=n)
    return dev, keep


def outputs_per_build(spec: str, recipe: str, axes: dict, builds: dict[str, str], sizes: list[int], n: int, k: int,
                      seed: int, input_seed: int, build_axes: dict[str, dict] | None = None) -> dict:
    """Each build's outputs by name: ``fusegemm.Op(spec, **RECIPES[recipe], **axes)`` (with
    ``build_axes[name]`` over ``axes`` where given) compiled with the NVRTC defines ``builds[name]``
    (FUSEGEMM_NVRTC_EXTRA), run on one problem of operands() (``seed``) with the same epilogue
    inputs for every build (tests/epilogue_inputs.py, ``input_seed``). The A/B tests of a header
    switch or a tile compare them."""
    import fusegemm
    from epilogue_inputs import epilogue_inputs
    from fusegemm.runtime import config
    host, per_sfb, _, _ = operands(sizes, n, k, recipe, np.random.default_rng(seed))
    dev, keep = on_device(host, per_sfb, n, discrete=False)
    outs = {}
    for name, extra in builds.items():
        with config.override(FUSEGEMM_NVRTC_EXTRA=extra):
            op = fusegemm.Op(spec, **RECIPES[recipe], **{**axes, **(build_axes or {}).get(name, {})}).compile()
        g = torch.Generator(device="cuda").manual_seed(input_seed)
        ins = epilogue_inputs(op, sum(sizes), n, len(sizes), g, width=op.widths(n)[0])
        outs[name] = op(**dev, inputs=ins)
    torch.cuda.synchronize()
    return outs


def dprob_atol(outs, name: str = "dprob") -> float:
    """dprob sums a row's partial sums (one per 128-column pass, or per 32-column block in the
    harness) by atomics in whatever order they finish, so a build that runs them at other times
    differs by ulps of the partials (the epilogue warpgroup did on the H200): a floor of
    2^-16 x max|dprob| over its finite rows (the harness feeds NaN and Inf rows). outs: a call's
    outputs (tensors or arrays by name); name: another output summed by atomics the same way
    (dbias: a column's sums per warp and tile)."""
    if name not in outs:
        return 1e-5
    dprob = outs[name]
    v = np.asarray(dprob.cpu() if hasattr(dprob, "cpu") else dprob, dtype=np.float64)
    finite = np.abs(v[np.isfinite(v)])
    return max(1e-5, 2.0 ** -16 * float(finite.max())) if finite.size else 1e-5
