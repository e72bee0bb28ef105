"""What a node says about its own make-up in diagnostics and capture bundles: its settings
with every secret redacted, and the versions of what it runs on.

Must never return a secret: the cluster key and API keys are replaced by REDACTED (or None
when unset), whatever else changes in the settings.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import platform
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from skulk import __version__

REDACTED = "<redacted>"
SECRET_FIELDS = frozenset({"cluster_key", "api_key", "token", "hf_token", "password", "secret"})
"""Setting names whose values never leave the node (matched at any depth)."""

REPORTED_PACKAGES = ("fastapi", "uvicorn", "pydantic", "eclipse-zenoh", "llama_cpp_python", "mlx", "mlx-lm",
                     "huggingface_hub", "prometheus-client", "httpx")


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _redact(f.name, getattr(value, f.name)) for f in dataclasses.fields(value)}
    model_dump = getattr(value, "model_dump", None)
    if model_dump is not None:
        return _plain(model_dump())
    if isinstance(value, Mapping):
        return {str(k): _redact(str(k), v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_plain(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return repr(value)


def _redact(name: str, value: Any) -> Any:
    if name.lower() in SECRET_FIELDS:
        return REDACTED if value else None
    return _plain(value)


def redacted_config(settings: Any) -> dict[str, Any]:
    """`settings` (a dataclass or pydantic model, nested) as JSON-ready data, secrets
    redacted. Pure."""
    plain = _plain(settings)
    return plain if isinstance(plain, dict) else {"value": plain}


@functools.cache
def versions() -> dict[str, Any]:
    """Skulk's version, the interpreter, the platform and the installed versions of the
    packages a bug report most often turns on (None: not installed). Read once per process:
    they cannot change under a running node, and a metrics scrape reads diagnostics."""
    packages: dict[str, str | None] = {}
    for name in REPORTED_PACKAGES:
        try:
            packages[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            packages[name] = None
    return {"skulk": __version__, "python": sys.version.split()[0], "platform": platform.platform(),
            "machine": platform.machine(), "packages": packages}
