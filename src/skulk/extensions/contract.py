"""What an extension is: the object its entry point's zero-argument factory returns.

Required attributes: `name` (lowercase letters, digits, '-', '_' and '.', at most 64
characters), `version` (the extension's own), `skulk_versions` (a PEP 440 specifier the
running Skulk version must satisfy, e.g. ">=0.1,<0.2"). Everything else is optional and
found by attribute: a hook an extension does not define is simply not called. Hooks:

- `transform_chat_request(params, ctx)`: chat middleware on the API node, after the wire
  adapter and before dispatch; may return new params (None: unchanged).
- `observe_chat_response(summary, ctx)`: called once per finished chat response, in the
  background, with an immutable summary.
- `on_start(ctx)`: once, when the node's API is up (providers need it: they have no chat
  hook to reach the context through).
- `providers()`: the capability providers this extension serves (skulk.extensions.providers).

`failure_policy` says what a raising `transform_chat_request` does to its request:
"skip" (the default: logged, the request goes on untransformed) or "fail" (the request
ends with a typed 502 `extension_failed` naming the extension: a policy filter that cannot
run must not let the request through). Observers and start hooks are always skipped on
failure. This module is pure: it only describes and checks the shape.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final, Literal

FailurePolicy = Literal["skip", "fail"]
FAILURE_POLICIES: Final[tuple[FailurePolicy, ...]] = ("skip", "fail")

HOOKS: Final = ("transform_chat_request", "observe_chat_response", "on_start", "providers")
"""Attribute names an extension may define; the loader records which ones it found."""

_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")


@dataclass(frozen=True)
class ExtensionShape:
    """The checked surface of one extension object."""

    name: str
    version: str
    skulk_versions: str
    failure_policy: FailurePolicy
    hooks: tuple[str, ...]


class ExtensionShapeError(ValueError):
    """The factory's object is not an extension; the message says what is wrong."""


def shape_of(obj: Any) -> ExtensionShape:
    """Check `obj` against the contract and describe it, or raise ExtensionShapeError."""
    name = getattr(obj, "name", None)
    if not isinstance(name, str) or not _NAME.match(name):
        raise ExtensionShapeError(f"name must be a string matching {_NAME.pattern}, got {name!r}")
    version = getattr(obj, "version", None)
    if not isinstance(version, str) or not version.strip():
        raise ExtensionShapeError(f"version must be a non-empty string, got {version!r}")
    specifier = getattr(obj, "skulk_versions", None)
    if not isinstance(specifier, str) or not specifier.strip():
        raise ExtensionShapeError(f"skulk_versions must be a PEP 440 specifier string, got {specifier!r}")
    policy = getattr(obj, "failure_policy", "skip")
    if policy not in FAILURE_POLICIES:
        raise ExtensionShapeError(f"failure_policy must be one of {', '.join(FAILURE_POLICIES)}, got {policy!r}")
    hooks = tuple(hook for hook in HOOKS if callable(getattr(obj, hook, None)))
    return ExtensionShape(name=name, version=version, skulk_versions=specifier, failure_policy=policy, hooks=hooks)
