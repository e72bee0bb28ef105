"""Type guards for JSON values decoded from the wire or from a caller's schema.

`isinstance(value, dict)` tells the type checker only "some dict", so every key and value
read after it is Unknown. A JSON object's keys are always strings, so these guards narrow
to the shape JSON really has; at run time they are exactly the isinstance checks.
"""

from __future__ import annotations

from typing import Any, TypeGuard


def is_json_object(value: object) -> TypeGuard[dict[str, Any]]:
    """`value` is a JSON object (a dict; its keys are strings because JSON's are)."""
    return isinstance(value, dict)


def is_json_array(value: object) -> TypeGuard[list[Any]]:
    """`value` is a JSON array (a list)."""
    return isinstance(value, list)


__all__ = ["is_json_array", "is_json_object"]
