"""The one base class for wire models.

Every type that crosses a process or network boundary derives from `WireModel`: unknown
fields are rejected (a peer on another build must fail loudly, not half-work), Python names
are snake_case and the wire is camelCase, and instances are frozen so pure functions can
share them without defensive copies.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


class WireModel(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        alias_generator=to_camel,
        populate_by_name=True,
        frozen=True,
    )

    def to_wire(self) -> dict[str, Any]:
        """JSON-compatible dict with camelCase keys: the form that is msgpack'd or JSON'd."""
        return self.model_dump(mode="json", by_alias=True)
