"""What a spec declares and what each arch implements, as plain data, and the wording of its
values and constraints: read by ``fusegemm show`` and by the generated documentation
(fusegemm/docsgen.py), so both say the same thing."""
from __future__ import annotations

from typing import Any


def prebuild_kernels(s: Any) -> list[tuple[str, str]]:
    """(kernel name, variant name) of each prebuild variant of ``s``, in order.

    The kernel's name is what ``fusegemm build`` prints before the hash, and what ``fusegemm
    inspect`` takes (as a prefix); the variant's also names the axes that do not reach that
    kernel (the cluster's ``mc`` where one cubin serves every cluster shape), so it is no
    kernel's name. A variant its arch's kernel does not implement (build skips it) keeps the
    variant's name.
    """
    from .base.errors import UnsupportedError
    from .generator.registry import resolve
    from .generator.render import kernel_name
    from .generator.variants import prebuild_variants
    out = []
    for v in prebuild_variants(s):
        try:
            name = kernel_name(v, resolve(v.kernel, v.arch, v.choices))
        except UnsupportedError:
            name = v.readable
        out.append((name, v.readable))
    return out


def spec_info(s: Any, prebuild: list[str] | None = None) -> dict[str, Any]:
    """A spec (generator/spec.py's Spec) and its implementations per arch (the registry).

    Parameters
    ----------
    s : Spec
        A loaded spec (``fusegemm.load_spec`` or ``generator.spec.find_spec``).
    prebuild : list of str, optional
        Readable names of its prebuild variants (computed when None); ``prebuild_kernels`` holds
        their kernels' names (:func:`prebuild_kernels`).
    """
    from .generator import registry
    kernels = prebuild_kernels(s)
    if prebuild is None:
        prebuild = [variant for _, variant in kernels]
    impls: dict[str, Any] = {}
    for arch in s.choice_map["arch"]:
        row = registry.lookup(s.kernel, arch)
        impls[arch] = {"status": registry.status(s.kernel, arch)} if row is None else {
            "status": row.status, "template": row.template, "kernel": row.kernel, "rule": row.rule,
            "source_axes": list(row.axes_for(s.epilogue.axes_read())),
            "limits": [{"axis": l.axis, "values": list(l.values), "because": l.because, "when": dict(l.when),
                        "condition": l.condition()} for l in row.limits],
            "defaults": dict(registry.policy(arch).defaults_for(row.kernel_class)),
            "runs_as": [{"axis": r.axis, "value": r.value, "runs_as": r.runs_as, "because": r.because,
                         "when": dict(r.when), "condition": r.condition()} for r in row.runs_as],
            # Modes this kernel has that no GPU has run (each first-run gated: fusegemm/verify.py).
            "unexecuted": [{"axis": axis, "value": value, "because": why}
                           for axis, value, why in registry.UNEXECUTED_MODES.get((row.kernel_class, arch), ())]}
    return {
        "name": s.name, "path": s.path, "kernel": s.kernel, "problem": s.problem, "seed": s.seed,
        "summary": s.summary,
        "epilogue": epilogue_info(s),
        "choices": {a: list(v) for a, v in s.choices},
        "constraints": [{"if": dict(c.when), "then": dict(c.then), "because": c.because}
                        for c in s.constraints],
        "defaults": dict(s.defaults),
        "prebuild": prebuild,
        "prebuild_kernels": [kernel for kernel, _ in kernels],   # what build prints; inspect takes
        "implementations": impls,
    }


def _when(cond) -> dict[str, list[Any]]:
    return {axis: list(vals) for axis, vals in cond.terms}


def epilogue_info(s: Any) -> dict[str, Any]:
    """The spec's epilogue (generator/epilogue.py's Epilogue) as plain data."""
    from .generator.epilogue import QUANTIZED
    ep = s.epilogue
    quantized = [o.name for o in ep.outputs if o.quantize is not None]
    return {
        "inputs": {i.name: {"per": i.per, "dtype": i.dtype, "slot": i.slot, "default": i.default,
                            "paired": i.paired, "optional": i.dtype in s.choice_map
                            and "none" in s.choice_map[i.dtype]}
                   for i in ep.inputs},
        "pairing": None if ep.pairing is None else {"block": ep.pairing.block, "roles": list(ep.pairing.roles),
                                                    "acc": ep.pairing.acc},
        "constants": list(ep.constants),
        "compute": [st.text for st in ep.statements],
        "outputs": {o.name: {"slot": o.slot, "dtype": o.dtype, "value": o.value,
                             "paired": None if o.paired is None else dict(zip(ep.pairing.roles, o.paired)),
                             "when": _when(o.when),
                             "quantize": None if o.quantize is None else dict(o.quantize.__dict__)}
                    for o in ep.outputs},
        # SFD quantization: E8M0-style scale per 32 elements, for the outputs that declare it,
        # in the variants where their dtype is one of `dtypes`.
        "quantization": {"block": 32, "dtypes": list(QUANTIZED), "outputs": quantized} if quantized else None,
        "reductions": [{"name": r.name, "kind": r.kind, "of": r.of, "scope": r.scope, "slot": r.slot,
                        "when": _when(r.when)} for r in ep.reductions],
    }


# Wording shared by `fusegemm show` and the op pages (fusegemm/docsgen.py): one phrasing.
def code_list(values: Any) -> str:
    """The values as a comma list of code spans: ``"`64`, `128`"``."""
    return ", ".join(f"`{v}`" for v in values)


def declared_values(axis: str, declared: Any) -> str:
    """The declared values of ``axis`` (markdown); an open numeric axis (tanh_clamp_scale) also
    takes any value the caller passes, each compiled as its own kernel."""
    from .generator.axes import AXES
    a = AXES.get(axis)
    if a is not None and a.constant:
        return f"{code_list(declared)}, or any positive float at call time (compile-time: each value is its own kernel)"
    return code_list(declared)


def constraint_text(c: dict[str, Any]) -> str:
    """A constraint (``{"if": ..., "then": ..., "because": ...}``) in words, markdown:
    ``tile_m = 256 ⇒ cluster_m ∈ {2, 4}: because``."""
    def side(d: dict[str, Any]) -> str:
        parts = []
        for k, v in d.items():
            vals = list(v) if isinstance(v, (list, tuple)) else [v]
            parts.append(f"`{k} = {vals[0]}`" if len(vals) == 1 else f"`{k}` ∈ {{{', '.join(map(str, vals))}}}")
        return " and ".join(parts)
    return f"{side(c['if'])} ⇒ {side(c['then'])}: {c['because']}"
