"""The release a gpusched component is (``gpusched version``, the extender's ``/version``): the
version of the installed ``gpusched`` distribution, set once in pyproject.toml and baked into each
image by its ``pip install``."""

from __future__ import annotations

from importlib import metadata

DISTRIBUTION = "gpusched"


def release() -> str:
    """``0.1.0`` and the like; a sentence saying why where the code runs from a tree nobody
    installed (the version is then unknowable, and a guess would defeat the skew check)."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return f"unknown (the {DISTRIBUTION} distribution is not installed: pip install -e .)"
