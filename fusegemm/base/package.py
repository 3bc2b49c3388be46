"""Version and package-data folders, in either install layout."""
from __future__ import annotations

from pathlib import Path

# The one version string: pyproject.toml reads it (hatch dynamic version) and cache keys hash it.
__version__ = "0.1.0"

_HERE = Path(__file__).resolve().parent.parent  # the fusegemm package folder


def package_data_dir(name: str) -> Path:
    """Folder of a non-Python package part (``templates`` or ``specs``).

    In a wheel hatchling places them inside the package; in a source checkout (editable install,
    tests run from the repo) they sit at the repo top level, beside ``fusegemm/``.
    """
    inside = _HERE / name
    return inside if inside.is_dir() else _HERE.parent / name
