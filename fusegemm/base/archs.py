"""The one arch table: the GPU architectures fusegemm compiles for.

Adding an architecture is a row here, its rows and policy in ``generator/registry.py`` (which
kernel each kernel class runs there) and its headers under
``templates/include/fusegemm/<headers>/``; everything else (NVRTC targets, the CLI's ``--arch``,
``FUSEGEMM_ARCHS``, device dispatch, spec surfaces, the first-run verification gate) reads this
table.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Arch:
    """One compilation target.

    Attributes
    ----------
    name : str
        NVRTC ``-arch`` value, e.g. ``sm_90a``.
    capability : tuple of int
        Compute capability (major, minor) of the devices that run it.
    headers : str
        Folder of its kernel headers under ``templates/include/fusegemm/``.
    gpus : str
        What it is, for people.
    executed : bool
        Whether the project's own tests have executed its kernels on real hardware. On an arch
        where this is False, the first launch of each kernel family on a device runs that
        family's selftest cases first (``fusegemm/verify.py``).
    """

    name: str
    capability: tuple[int, int]
    headers: str
    gpus: str
    executed: bool

    @property
    def short(self) -> str:
        """``sm90a`` (kernel names, symbols)."""
        return self.name.replace("_", "")


ARCHS: dict[str, Arch] = {a.name: a for a in (
    Arch("sm_100a", (10, 0), "sm100", "Blackwell (B200, GB200)", executed=False),
    Arch("sm_90a", (9, 0), "sm90", "Hopper (H100, H200)", executed=True),
)}
ARCH_NAMES: tuple[str, ...] = tuple(ARCHS)


def arch(name: str) -> Arch:
    """The table entry of ``name``; ValueError naming the known archs otherwise."""
    try:
        return ARCHS[name]
    except KeyError:
        raise ValueError(f"arch: got {name!r}; allowed: {', '.join(ARCHS)}") from None


def arch_of_capability(major: int, minor: int) -> Arch | None:
    """The arch whose kernels run on compute capability ``major.minor``, or None."""
    return next((a for a in ARCHS.values() if a.capability == (major, minor)), None)


def supported_capabilities() -> str:
    """"9.0 (sm_90a), 10.0 (sm_100a)" for messages."""
    return ", ".join(f"{a.capability[0]}.{a.capability[1]} ({a.name})"
                     for a in sorted(ARCHS.values(), key=lambda a: a.capability))
