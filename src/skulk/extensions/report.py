"""How the extensions a node found are described: the `extensions` section of
/v1/diagnostics/node (`discovery_report`, filled in with counters by the runtime) and the
lines `skulk extensions list` prints from it (`report_lines`). Pure: data in, data out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from skulk.extensions.loader import DISABLE_ENV, ExtensionSet


def discovery_report(found: ExtensionSet) -> dict[str, Any]:
    """What discovery found, in the diagnostics' camelCase shape."""
    return {
        "disabled": found.disabled,
        "loaded": [
            {
                "name": ext.shape.name,
                "version": ext.shape.version,
                "entryPoint": ext.entry_point,
                "skulkVersions": ext.shape.skulk_versions,
                "hooks": list(ext.shape.hooks),
                "failurePolicy": ext.shape.failure_policy,
                "counters": {},
            }
            for ext in found.loaded
        ],
        "skipped": [{"entryPoint": s.entry_point, "name": s.name, "reason": s.reason} for s in found.skipped],
    }


def report_lines(section: Mapping[str, Any]) -> list[str]:
    """One line per loaded extension (with its hook counters when a node reported them) and
    per skipped one (with its reason)."""
    if section.get("disabled"):
        return [f"discovery is off ({DISABLE_ENV} is set): no extension runs"]
    loaded = section.get("loaded") or []
    skipped = section.get("skipped") or []
    if not loaded and not skipped:
        return ["no extensions installed (entry-point group skulk.extensions)"]
    lines: list[str] = []
    for ext in loaded:
        lines.append(
            f"loaded   {ext['name']} {ext['version']}  [{', '.join(ext['hooks']) or 'no hooks'}; "
            f"on failure: {ext['failurePolicy']}]  {ext['entryPoint']}"
        )
        for hook, counts in sorted((ext.get("counters") or {}).items()):
            lines.append(
                f"           {hook}: {counts['calls']} calls, {counts['failures']} failures, "
                f"{counts['timeouts']} timeouts"
            )
    for entry in skipped:
        lines.append(f"skipped  {entry.get('name') or entry['entryPoint']}: {entry['reason']}")
    queue = section.get("observerQueue")
    if queue and queue.get("dropped"):
        lines.append(f"observer queue: {queue['dropped']} summaries dropped (capacity {queue['capacity']})")
    tags = section.get("capabilityTags")
    if tags:
        lines.append(f"advertised capability tags: {', '.join(tags)}")
    return lines
