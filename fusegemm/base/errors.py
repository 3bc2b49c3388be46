"""Exceptions of fusegemm. Every message names what was received and what is allowed."""
from __future__ import annotations


class FusegemmError(Exception):
    """Base class of every error fusegemm raises on purpose."""


class ConfigError(FusegemmError, ValueError):
    """A ``FUSEGEMM_*`` environment variable has a value that cannot be used."""


class SpecError(FusegemmError, ValueError):
    """A YAML spec is invalid. The message starts with ``file:line: key:``."""

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None,
                 key: str | None = None) -> None:
        where = ""
        if path is not None:
            where = f"{path}:{line}: " if line is not None else f"{path}: "
        if key:
            where += f"{key}: "
        super().__init__(where + message)
        self.path, self.line, self.key = path, line, key


class UnsupportedError(FusegemmError, ValueError):
    """A requested configuration is outside the supported surface (says why).

    ``axis`` names the variant axis at fault when there is one (``tile_m``, ``d_dtype``...), so
    an op can translate it into its own argument name.
    """

    def __init__(self, message: str, *, axis: str | None = None) -> None:
        super().__init__(message)
        self.axis = axis


class ArgumentError(FusegemmError, ValueError):
    """A call argument is invalid; raised before any launch."""

    def __init__(self, name: str, received: object, allowed: str, hint: str = "") -> None:
        msg = f"{name}: got {received}; allowed: {allowed}"
        if hint:
            msg += f". {hint}"
        super().__init__(msg)
        self.name, self.received, self.allowed = name, received, allowed


class ToolchainError(FusegemmError, RuntimeError):
    """A required wheel (NVRTC, CUDA headers, CUTLASS, disassembler) is missing or broken."""


class CompileError(FusegemmError, RuntimeError):
    """NVRTC rejected a generated kernel.

    Carries the kernel name, the spec file, the architecture, the full NVRTC log and the
    offending source lines (with a caret under the reported column when NVRTC gives one).
    """

    def __init__(self, *, kernel: str, spec_path: str | None, arch: str, log: str,
                 excerpt: str) -> None:
        self.kernel, self.spec_path, self.arch, self.log, self.excerpt = (
            kernel, spec_path, arch, log, excerpt)
        head = f"NVRTC failed to compile kernel {kernel} for {arch}"
        if spec_path:
            head += f" (spec {spec_path})"
        body = f"{head}\n--- NVRTC log ---\n{log.rstrip()}"
        if excerpt:
            body += f"\n--- offending source ---\n{excerpt.rstrip()}"
        super().__init__(body)


class CacheError(FusegemmError, RuntimeError):
    """The kernel cache directory cannot be used (permissions, disk)."""


class ContractError(FusegemmError, RuntimeError):
    """A compiled kernel's exported contract disagrees with what its launcher needs."""


class UnverifiedError(FusegemmError, RuntimeError):
    """A kernel family failed its first-run verification on an arch fusegemm has not executed on."""
