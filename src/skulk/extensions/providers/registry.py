"""The node's guarded registry of capabilities, built from the loaded extensions' providers.

`registration_refusal` is the pure decision (a descriptor that breaks the contract, a schema
that is not a JSON Schema, a handler missing for its I/O mode, an id@version already taken);
`ProviderRegistry.add` is the guard around provider code: a provider whose `descriptors()`
raises or returns junk is refused with a reason and the node goes on. Providers registered
first win an id@version (first-party ones are added before extensions).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from jsonschema.exceptions import SchemaError, best_match
from jsonschema.protocols import Validator
from jsonschema.validators import validator_for
from pydantic import ValidationError

from skulk.extensions.providers.bounds import MAX_DESCRIPTOR_BYTES, MAX_DESCRIPTORS_PER_NODE
from skulk.extensions.providers.contract import serves_streams, serves_unary
from skulk.extensions.providers.lifecycle import json_size
from skulk.shared.types.providers import CapabilityDescriptor

log = logging.getLogger(__name__)


def schema_refusal(schema: dict[str, Any]) -> str | None:
    try:
        validator_for(schema).check_schema(schema)
    except SchemaError as exc:
        return exc.message
    return None


def registration_refusal(descriptor: CapabilityDescriptor, provider: Any, taken: Iterable[str]) -> str | None:
    """Why `descriptor` (served by `provider`) may not be registered, or None."""
    size = json_size(descriptor.to_wire())
    if size > MAX_DESCRIPTOR_BYTES:
        return f"the descriptor is {size} bytes, over the cap of {MAX_DESCRIPTOR_BYTES}"
    for which, schema in (("input_schema", descriptor.input_schema), ("output_schema", descriptor.output_schema)):
        problem = schema_refusal(schema)
        if problem is not None:
            return f"{which} is not a valid JSON Schema: {problem}"
    if descriptor.io_mode == "unary" and not serves_unary(provider):
        return "a unary capability needs handle_call(capability_id, payload, ctx)"
    if descriptor.io_mode != "unary" and not serves_streams(provider):
        return f"a {descriptor.io_mode} capability needs handle_stream(capability_id, payload, inputs, ctx)"
    if descriptor.tag in set(taken):
        return f"{descriptor.tag} is already served on this node"
    return None


def _validator(schema: dict[str, Any]) -> Validator:
    cls = validator_for(schema)
    return cls(schema)


def schema_problem(validator: Validator, value: Any) -> str | None:
    """The first schema error of `value`, one line, or None."""
    error = best_match(validator.iter_errors(value))
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path)
    return f"{where or '(root)'}: {error.message}"[:500]


@dataclass(frozen=True)
class Registered:
    """One capability this node serves."""

    descriptor: CapabilityDescriptor
    provider: Any = field(compare=False, repr=False)
    source: str = ""
    """The extension that serves it."""
    input_validator: Validator = field(compare=False, repr=False, default=None)  # type: ignore[assignment]
    output_validator: Validator = field(compare=False, repr=False, default=None)  # type: ignore[assignment]

    def input_problem(self, value: Any) -> str | None:
        return schema_problem(self.input_validator, value)

    def output_problem(self, value: Any) -> str | None:
        return schema_problem(self.output_validator, value)


@dataclass(frozen=True)
class RegistrationRefused:
    source: str
    capability: str
    reason: str


class ProviderRegistry:
    """The capabilities this node serves, by id and version."""

    def __init__(self) -> None:
        self._by_tag: dict[str, Registered] = {}
        self.refused: list[RegistrationRefused] = []

    def add(self, provider: Any, source: str) -> list[RegistrationRefused]:
        """Register every descriptor of `provider`; returns (and keeps) the refusals."""
        refusals: list[RegistrationRefused] = []

        def refuse(capability: str, reason: str) -> None:
            entry = RegistrationRefused(source, capability, reason)
            refusals.append(entry)
            log.warning("capability %s of extension %s refused: %s", capability, source, reason)

        try:
            found = list(provider.descriptors())
        except Exception as exc:  # provider code must never break the node
            refuse("*", f"descriptors() raised {type(exc).__name__}: {exc}")
            found = []
        for raw in found:
            try:
                descriptor = raw if isinstance(raw, CapabilityDescriptor) else CapabilityDescriptor.model_validate(raw)
            except ValidationError as exc:
                refuse(
                    str(getattr(raw, "id", None) or (raw.get("id") if isinstance(raw, dict) else "?")),
                    f"not a capability descriptor: {exc.errors()[0]['msg']}",
                )
                continue
            if len(self._by_tag) >= MAX_DESCRIPTORS_PER_NODE:
                refuse(descriptor.tag, f"this node already serves {MAX_DESCRIPTORS_PER_NODE} capabilities")
                continue
            reason = registration_refusal(descriptor, provider, self._by_tag)
            if reason is not None:
                refuse(descriptor.tag, reason)
                continue
            self._by_tag[descriptor.tag] = Registered(
                descriptor, provider, source, _validator(descriptor.input_schema), _validator(descriptor.output_schema)
            )
            log.info(
                "capability %s (%s, revision %s) served by extension %s",
                descriptor.tag,
                descriptor.io_mode,
                descriptor.revision[:12],
                source,
            )
        self.refused.extend(refusals)
        return refusals

    def get(self, capability_id: str, version: str) -> Registered | None:
        return self._by_tag.get(f"{capability_id}@{version}")

    def descriptors(self) -> tuple[CapabilityDescriptor, ...]:
        return tuple(entry.descriptor for entry in self._by_tag.values())

    def capability_tags(self) -> tuple[str, ...]:
        """`id@version` of every capability served here: what the node advertises as tags."""
        return tuple(sorted(self._by_tag))

    def stats(self) -> dict[str, Any]:
        return {
            "capabilities": [
                {
                    "tag": e.descriptor.tag,
                    "ioMode": e.descriptor.io_mode,
                    "source": e.source,
                    "revision": e.descriptor.revision,
                }
                for e in self._by_tag.values()
            ],
            "refused": [{"source": r.source, "capability": r.capability, "reason": r.reason} for r in self.refused],
        }


def registry_from(providers_of: Iterable[tuple[str, Callable[[], Any]]]) -> ProviderRegistry:
    """A registry of every provider each extension's `providers()` returns (guarded)."""
    registry = ProviderRegistry()
    for source, providers in providers_of:
        try:
            found = list(providers())
        except Exception as exc:
            log.warning("extension %s: providers() raised %s: %s (skipped)", source, type(exc).__name__, exc)
            registry.refused.append(RegistrationRefused(source, "*", f"providers() raised {type(exc).__name__}: {exc}"))
            continue
        for provider in found:
            registry.add(provider, source)
    return registry


__all__ = [
    "ProviderRegistry",
    "Registered",
    "RegistrationRefused",
    "registration_refusal",
    "registry_from",
    "schema_problem",
    "schema_refusal",
]
