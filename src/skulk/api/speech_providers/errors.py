"""A core serving failure (`skulk.api.errors.ApiError`) as the provider contract's typed error.

One table from the API's error kind to the capability error kind, so the speech providers
answer the same failure the same way the routes do, in the fabric's terms: the caller's
mistake is `input_invalid` / `payload_too_large`, capacity that is missing or busy is
`admission_refused` / `overloaded`, and what went wrong after the command ran is
`provider_failed` (the message carries the core error's code). Pure.
"""

from __future__ import annotations

from typing import Final

from skulk.api.errors import ApiError, ErrorKind
from skulk.extensions.providers.errors import CapabilityError, CapabilityErrorKind

CAPABILITY_KINDS: Final[dict[ErrorKind, CapabilityErrorKind]] = {
    "invalid_request": "input_invalid",
    "too_large": "payload_too_large",
    "not_found": "admission_refused",  # the model is not placed (now)
    "unavailable": "admission_refused",  # no master, a model not serving
    "overloaded": "overloaded",
    "timeout": "deadline_exceeded",
    "cancelled": "cancelled",
    "upstream": "provider_failed",
    "internal": "provider_failed",
    "forbidden": "admission_refused",
    "conflict": "provider_failed",
}


def capability_error(error: ApiError) -> CapabilityError:
    """`error` as the capability error a caller of the provider sees."""
    code = f" ({error.code})" if error.code else ""
    return CapabilityError(CAPABILITY_KINDS.get(error.kind, "provider_failed"), f"{error.message}{code}")


__all__ = ["CAPABILITY_KINDS", "capability_error"]
