"""The scheduling profile from ``--profile``, and the error every startup problem is reported as.

A problem found while assembling the extender is a :class:`StartupError` whose message names the
flag (and file) to fix; ``extender.__main__`` prints it and exits 2.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from extender.framework.profile import ProfileConfig, load_profile
from extender.plugins import default_profile, default_registry
from gpusched_api.errors import FieldError


class StartupError(Exception):
    """A configuration problem found at startup; the message says what to fix."""


def load_profile_file(path: str | None) -> ProfileConfig:
    """The profile at ``path`` over the default profile (the default itself when no path)."""
    registry = default_registry()
    if not path:
        return default_profile()
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except FileNotFoundError:
        raise StartupError(f"--profile {path}: no such file") from None
    except yaml.YAMLError as exc:
        raise StartupError(f"--profile {path}: not valid YAML: {exc}") from None
    try:
        return load_profile(raw, registry, base=default_profile())
    except FieldError as exc:
        raise StartupError(f"--profile {path}: {exc}") from None


def profile_requires_nvlink(profile: ProfileConfig) -> bool:
    """NvlinkTopology's requireNvlink in the profile (False when the profile gives no args for it,
    the plugin's default, or does not use it)."""
    if "NvlinkTopology" not in profile.enabled():
        return False
    return bool(getattr(profile.plugin_args.get("NvlinkTopology"), "require_nvlink", False))
