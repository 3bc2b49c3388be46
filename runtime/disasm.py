"""SASS of a cubin through the pip disassembler wheels (optional extra ``fusegemm[disasm]``).

``nvidia-cuda-nvdisasm`` ships a static ``nvdisasm`` that reads 12.9 and 13.x cubins. It is
found over all of ``sys.path`` (CUDA 13 layout ``nvidia/cu13/bin``, CUDA 12 ``nvidia/cuda_nvdisasm/bin``).
"""
from __future__ import annotations

import collections
import functools
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from ..base.errors import ToolchainError

_BIN_DIRS = ("nvidia/cu13/bin", "nvidia/cuda_nvdisasm/bin", "nvidia/cu12/bin")
# "/*0040*/   @!P0 UTCHMMA.2CTA gdesc[UR4], ... ;" -> opcode with modifiers
_INSN = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*(?:\.[A-Z0-9_]+)*)")


@functools.lru_cache(maxsize=2)
def find_tool(name: str = "nvdisasm") -> Path:
    for entry in sys.path:
        for rel in _BIN_DIRS:
            cand = Path(entry or ".") / rel / name
            if cand.is_file() and os.access(cand, os.X_OK):
                return cand
    raise ToolchainError(f"{name} not found: SASS inspection needs the optional disassembler "
                         f"wheels. Install them with: pip install 'fusegemm[disasm]' "
                         f"(nvidia-cuda-nvdisasm, nvidia-cuda-cuobjdump)")


def available() -> bool:
    try:
        find_tool()
    except ToolchainError:
        return False
    return True


def sass(cubin: bytes) -> str:
    """Disassembled SASS text of every kernel in ``cubin``."""
    tool = find_tool()
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        res = subprocess.run([str(tool), "-c", f.name], capture_output=True, text=True, timeout=300)
    if res.returncode != 0:
        raise ToolchainError(f"nvdisasm failed ({res.returncode}): {res.stderr.strip()[:500]}")
    return res.stdout


def opcodes(text: str) -> list[str]:
    """Every instruction's opcode (with modifiers), in the order of the SASS text."""
    return [m.group(1) for m in _INSN.finditer(text)]


def histogram(text: str) -> dict[str, int]:
    """Opcode (with modifiers) -> count, most frequent first."""
    counts = collections.Counter(opcodes(text))
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def sass_histogram(cubin: bytes) -> dict[str, int]:
    return histogram(sass(cubin))


def count_prefix(hist: dict[str, int], prefix: str) -> int:
    """Instructions whose opcode starts with ``prefix`` (``UTCHMMA`` counts every modifier form)."""
    return sum(n for op, n in hist.items() if op == prefix or op.startswith(prefix + ".")
               or (prefix.endswith(".") and op.startswith(prefix)))
