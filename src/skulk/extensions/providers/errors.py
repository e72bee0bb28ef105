"""Every way a capability call can fail, as one typed error.

    CapabilityError(kind, message, node)
    ├── before the provider runs (the caller's node or the provider's admission)
    │   capability_not_found, revision_mismatch, mode_unsupported, input_invalid,
    │   payload_too_large, overloaded, admission_refused, node_unreachable
    ├── while it runs
    │   deadline_exceeded, cancelled, provider_failed
    └── what it produced
        output_invalid (a result or chunk breaks the output schema),
        malformed_chunk (not JSON, over the chunk cap), protocol_violation (frames out of
        order, a gap that never closed)

`kind` is the machine-readable name a client matches on (the native error JSON's `code`);
`ERROR_KINDS` maps it to the API's error kind (and so to the HTTP status) in one place.
"""

from __future__ import annotations

from typing import Final, Literal, get_args

CapabilityErrorKind = Literal[
    "capability_not_found",
    "revision_mismatch",
    "mode_unsupported",
    "input_invalid",
    "payload_too_large",
    "overloaded",
    "admission_refused",
    "node_unreachable",
    "deadline_exceeded",
    "cancelled",
    "provider_failed",
    "output_invalid",
    "malformed_chunk",
    "protocol_violation",
]
CAPABILITY_ERROR_KINDS: Final[frozenset[str]] = frozenset(get_args(CapabilityErrorKind))

ApiKind = Literal[
    "invalid_request",
    "not_found",
    "overloaded",
    "unavailable",
    "timeout",
    "upstream",
    "cancelled",
    "conflict",
    "too_large",
]

ERROR_KINDS: Final[dict[CapabilityErrorKind, ApiKind]] = {
    "capability_not_found": "not_found",  # 404
    "revision_mismatch": "conflict",  # 409: re-read the descriptor
    "mode_unsupported": "invalid_request",  # 400
    "input_invalid": "invalid_request",  # 400, before the provider runs
    "payload_too_large": "too_large",  # 413
    "overloaded": "overloaded",  # 503 with Retry-After
    "admission_refused": "unavailable",  # 503: the provider's own admission said no
    "node_unreachable": "upstream",  # 502
    "deadline_exceeded": "timeout",  # 504
    "cancelled": "cancelled",  # 499
    "provider_failed": "upstream",  # 502
    "output_invalid": "upstream",  # 502: the provider broke its own contract
    "malformed_chunk": "upstream",
    "protocol_violation": "upstream",
}
"""Capability error kind -> the API's error kind (`skulk.api.errors.ErrorKind`)."""


class CapabilityError(Exception):
    """A call failed; `kind` says how, `node` where (None: on the caller's own node)."""

    def __init__(self, kind: CapabilityErrorKind, message: str, *, node: str | None = None) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind: CapabilityErrorKind = kind
        self.message = message
        self.node = node


def error_kind_from_wire(value: str | None) -> CapabilityErrorKind:
    """A kind read from another node; an unknown one (a newer build's) is a provider failure."""
    return value if value in CAPABILITY_ERROR_KINDS else "provider_failed"  # type: ignore[return-value]


__all__ = ["CAPABILITY_ERROR_KINDS", "ERROR_KINDS", "CapabilityError", "CapabilityErrorKind", "error_kind_from_wire"]
