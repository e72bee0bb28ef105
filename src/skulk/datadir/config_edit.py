"""Small edits to the operator's `skulk.yaml` that keep the rest of the file as they wrote it.

A switch the dashboard flips (today: `telemetry.enabled`) is persisted here so that it
survives a restart. The file is the operator's: its comments, key order, quoting and line
endings stay, and only the one value changes, in place when the key is there, added to its
section (or a new section at the end) when it is not. The edit is checked by parsing the
result: everything but that key must read back the same. Only a layout the line edit cannot
handle (a flow mapping such as `telemetry: {enabled: false}`) falls back to writing the
parsed mapping back out, which keeps every setting but drops that file's comments.

Pure text in, text out; writing the file (atomically) is the caller's.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from skulk.datadir.config import ConfigError, parse_config

_SECTION_RE = re.compile(r"^(?P<key>[A-Za-z_][\w-]*)\s*:\s*(?P<rest>.*?)\s*$")
_CHILD_RE = re.compile(r"^(?P<indent>[ \t]+)(?P<key>[A-Za-z_][\w-]*)(?P<colon>\s*:\s*)(?P<value>[^#\s][^#]*?|)"
                       r"(?P<tail>\s*(?:#.*)?)$")


def _newline_of(text: str) -> str:
    return "\r\n" if "\r\n" in text else "\n"


def _is_blank_or_comment(line: str) -> bool:
    stripped = line.strip()
    return not stripped or stripped.startswith("#")


def _body(line: str) -> str:
    return line.rstrip("\r\n")


def _line_edit(text: str, section: str, key: str, rendered: str) -> str | None:
    """`text` with `section.key: rendered` set by editing lines, or None when the section's
    layout is not a plain block mapping."""
    newline = _newline_of(text)
    lines = text.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines)
                  if (m := _SECTION_RE.match(_body(line))) and m["key"] == section and not line[:1].isspace()), None)
    if start is None:
        prefix = "" if not text or text.endswith(("\n", "\r")) else newline
        return f"{text}{prefix}{section}:{newline}  {key}: {rendered}{newline}"
    head = _SECTION_RE.match(_body(lines[start]))
    assert head is not None
    rest = head["rest"]
    if rest and not rest.startswith("#"):
        return None  # `section: {...}`, `section: null`, an anchor: not a block to edit line by line
    end = start + 1
    child_indent: str | None = None
    while end < len(lines):
        line = lines[end]
        if _is_blank_or_comment(line):
            end += 1
            continue
        if not line[:1].isspace():
            break  # the next top-level key
        child = _CHILD_RE.match(_body(line))
        indent = re.match(r"[ \t]*", line)
        this_indent = indent.group(0) if indent else ""
        if child_indent is None:
            child_indent = this_indent
        if child is not None and this_indent == child_indent and child["key"] == key:
            ending = line[len(_body(line)):]
            colon = child["colon"] if child["colon"][-1:].isspace() else child["colon"] + " "
            lines[end] = f"{child['indent']}{child['key']}{colon}{rendered}{child['tail']}{ending}"
            return "".join(lines)
        end += 1
    insert_at = start + 1
    if not lines[start].endswith(("\n", "\r")):
        lines[start] += newline
    lines.insert(insert_at, f"{child_indent or '  '}{key}: {rendered}{newline}")
    return "".join(lines)


def _mapping(text: str, path: Path) -> dict[str, Any]:
    parse_config(text, path)  # a file the node would refuse is never rewritten
    raw = yaml.safe_load(text) if text.strip() else None
    return raw if isinstance(raw, dict) else {}


def with_section_key(text: str, section: str, key: str, value: bool, path: Path = Path("skulk.yaml")) -> str:
    """`text` (a skulk.yaml) with `section.key` set to `value`, everything else kept (see the
    module docstring). Raises `ConfigError` when `text` itself is not a valid config."""
    before = _mapping(text, path)
    rendered = "true" if value else "false"
    wanted = {**before, section: {**(before.get(section) or {}), key: value}}
    edited = _line_edit(text, section, key, rendered)
    if edited is not None:
        try:
            if _mapping(edited, path) == wanted:
                return edited
        except ConfigError:
            pass
    return yaml.safe_dump(wanted, sort_keys=False, default_flow_style=False)


def with_telemetry_enabled(text: str, enabled: bool, path: Path = Path("skulk.yaml")) -> str:
    """`text` with `telemetry.enabled` set: the dashboard's consent switch, persisted."""
    return with_section_key(text, "telemetry", "enabled", enabled, path)


__all__ = ["with_section_key", "with_telemetry_enabled"]
