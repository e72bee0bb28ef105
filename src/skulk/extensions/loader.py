"""Finds the installed extensions at node start and decides which ones run.

Every entry point in the `skulk.extensions` group is loaded and its factory called; an
extension that cannot be imported, whose factory raises, whose object breaks the contract,
whose `skulk_versions` does not admit the running Skulk, or whose name another extension
already took is skipped with a one-line reason. A skipped extension never stops the node:
the reasons are shown by `skulk doctor`, `skulk extensions list` and
`/v1/diagnostics/node`. `SKULK_EXTENSIONS_DISABLE=1` skips discovery entirely.

`admission_refusal` is the pure decision; `load_extensions` is the shell around it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Final

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from skulk import __version__
from skulk.extensions.contract import ExtensionShape, ExtensionShapeError, shape_of
from skulk.shared.settings import setting

ENTRY_POINT_GROUP: Final = "skulk.extensions"
DISABLE_ENV: Final = "SKULK_EXTENSIONS_DISABLE"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadedExtension:
    """An extension that runs: its checked shape, the object, and the entry point it came from."""

    shape: ExtensionShape
    obj: Any = field(compare=False, repr=False)
    entry_point: str


@dataclass(frozen=True)
class SkippedExtension:
    """An entry point that does not run, and why (one line for operators)."""

    entry_point: str
    reason: str
    name: str | None = None


@dataclass(frozen=True)
class ExtensionSet:
    """What discovery found. Empty when nothing is installed: Skulk then runs unchanged."""

    loaded: tuple[LoadedExtension, ...] = ()
    skipped: tuple[SkippedExtension, ...] = ()
    disabled: bool = False

    def with_hook(self, hook: str) -> tuple[LoadedExtension, ...]:
        return tuple(ext for ext in self.loaded if hook in ext.shape.hooks)


def admission_refusal(shape: ExtensionShape, running_version: str, taken_names: Iterable[str]) -> str | None:
    """Why this extension may not run here, or None when it may."""
    try:
        specifier = SpecifierSet(shape.skulk_versions)
    except InvalidSpecifier:
        return f"skulk_versions {shape.skulk_versions!r} is not a PEP 440 specifier"
    try:
        running = Version(running_version)
    except InvalidVersion:
        return f"the running Skulk version {running_version!r} is not a PEP 440 version"
    if not specifier.contains(running, prereleases=True):
        return f"supports Skulk {shape.skulk_versions}, this node runs {running_version}: upgrade the extension and the fleet together"
    if shape.name in set(taken_names):
        return f"another extension already uses the name {shape.name!r}"
    return None


def _label(ep: EntryPoint) -> str:
    return f"{ep.name} = {ep.value}"


def load_from(
    found: Iterable[EntryPoint],
    running_version: str = __version__,
    *,
    on_skip: Callable[[SkippedExtension], None] | None = None,
) -> ExtensionSet:
    """Load each entry point in `found`, in name order, keeping the ones that may run."""
    loaded: list[LoadedExtension] = []
    skipped: list[SkippedExtension] = []

    def skip(entry: SkippedExtension) -> None:
        skipped.append(entry)
        if on_skip is not None:
            on_skip(entry)

    for ep in sorted(found, key=lambda e: (e.name, e.value)):
        label = _label(ep)
        try:
            factory = ep.load()
        except Exception as exc:  # an extension's import must never stop the node
            skip(SkippedExtension(label, f"import failed: {type(exc).__name__}: {exc}"))
            continue
        if not callable(factory):
            skip(SkippedExtension(label, "the entry point is not a callable factory"))
            continue
        try:
            obj = factory()
        except Exception as exc:
            skip(SkippedExtension(label, f"factory raised {type(exc).__name__}: {exc}"))
            continue
        try:
            shape = shape_of(obj)
        except ExtensionShapeError as exc:
            skip(SkippedExtension(label, f"not an extension: {exc}"))
            continue
        refusal = admission_refusal(shape, running_version, (ext.shape.name for ext in loaded))
        if refusal is not None:
            skip(SkippedExtension(label, refusal, name=shape.name))
            continue
        loaded.append(LoadedExtension(shape=shape, obj=obj, entry_point=label))
    return ExtensionSet(loaded=tuple(loaded), skipped=tuple(skipped))


def _log_skip(entry: SkippedExtension) -> None:
    log.warning("extension %s skipped: %s", entry.name or entry.entry_point, entry.reason)


def disabled_by(env: Mapping[str, str] | None = None) -> bool:
    """Does `SKULK_EXTENSIONS_DISABLE` (in `env`, default this process's) skip discovery?"""
    return setting(DISABLE_ENV, env).lower() not in ("", "0", "false", "no", "off")


def load_extensions(env: Mapping[str, str] | None = None) -> ExtensionSet:
    """Discover the installed extensions (the node's start calls this once; `skulk doctor`
    and `skulk extensions list` too, to show what a node started here would run)."""
    if disabled_by(env):
        log.info("extensions disabled by %s", DISABLE_ENV)
        return ExtensionSet(disabled=True)
    result = load_from(entry_points(group=ENTRY_POINT_GROUP), on_skip=_log_skip)
    for ext in result.loaded:
        log.info(
            "extension %s %s loaded from %s (hooks: %s)",
            ext.shape.name,
            ext.shape.version,
            ext.entry_point,
            ", ".join(ext.shape.hooks) or "none",
        )
    return result
