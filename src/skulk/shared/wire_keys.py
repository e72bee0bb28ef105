"""camelCase for plain diagnostic dicts (pydantic models get it from their aliases)."""

from __future__ import annotations

from typing import Any, cast

from pydantic.alias_generators import to_camel


def to_camel_keys(value: Any) -> Any:
    """Recursively rename snake_case dict keys to camelCase; other values pass through."""
    if isinstance(value, dict):
        mapping = cast("dict[Any, Any]", value)
        return {to_camel(str(k)) if isinstance(k, str) else k: to_camel_keys(v) for k, v in mapping.items()}
    if isinstance(value, list | tuple):
        return [to_camel_keys(v) for v in cast("list[Any] | tuple[Any, ...]", value)]
    return value
