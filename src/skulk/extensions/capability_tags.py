"""This node's advertised capability tags: a small node-local set published on the
telemetry plane (`NodeResources.capability_tags`), where peers see it on the next resources
round the way they see a node's backends. Nothing about a tag is event-sourced: a node that
restarts advertises nothing until its extensions advertise again.

`CapabilityTags` is the one writer for both extensions (`ExtensionContext.advertise_capability`)
and capability providers (their descriptors' `id@version`, advertised at start). `checked_tag` and `with_tag` are the
pure rules; the class only holds the current set. It never does I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final

MAX_TAGS: Final = 32
"""Tags one node may advertise: the set rides every resources reading (every 5 s), so it
stays a few hundred bytes."""

MAX_TAG_CHARS: Final = 64
TAG_PATTERN: Final = re.compile(r"^[a-z0-9][a-z0-9._@-]{0,63}$")
"""A tag: lowercase letters, digits and `._@-`, starting with a letter or digit (room for
`name@version` capability ids)."""


class CapabilityTagError(ValueError):
    """A tag an extension asked for is malformed or over the bound; the message says which."""


def checked_tag(tag: object) -> str:
    """`tag` when it is a well-formed tag, else CapabilityTagError."""
    if not isinstance(tag, str) or not TAG_PATTERN.match(tag):
        raise CapabilityTagError(
            f"a capability tag is 1-{MAX_TAG_CHARS} characters of [a-z0-9._@-] starting with a letter or digit, "
            f"got {tag!r}"
        )
    return tag


def with_tag(tags: frozenset[str], tag: object) -> frozenset[str]:
    """`tags` plus `tag` (idempotent), or CapabilityTagError past `MAX_TAGS`."""
    tag = checked_tag(tag)
    if tag in tags:
        return tags
    if len(tags) >= MAX_TAGS:
        raise CapabilityTagError(
            f"this node already advertises {MAX_TAGS} capability tags (the bound); "
            f"withdraw one before advertising {tag!r}"
        )
    return tags | {tag}


def without_tag(tags: frozenset[str], tag: object) -> frozenset[str]:
    """`tags` less `tag` (withdrawing a tag not advertised is a no-op)."""
    return tags - {checked_tag(tag)}


class CapabilityTags:
    """The node-local tag set; the telemetry service reads `published()` for each reading."""

    def __init__(self) -> None:
        self._tags: frozenset[str] = frozenset()

    def advertise(self, tag: str) -> None:
        self._tags = with_tag(self._tags, tag)

    def withdraw(self, tag: str) -> None:
        self._tags = without_tag(self._tags, tag)

    def advertise_all(self, tags: Iterable[str]) -> list[str]:
        """Advertise each of `tags` (a provider registry's `id@version` ids); returns one
        line per tag refused (malformed, or past the bound), for the caller to log."""
        refused: list[str] = []
        for tag in tags:
            try:
                self.advertise(tag)
            except CapabilityTagError as exc:
                refused.append(str(exc))
        return refused

    def current(self) -> frozenset[str]:
        return self._tags

    def published(self) -> list[str]:
        """The set as a reading carries it: sorted, so equal sets compare equal on the wire."""
        return sorted(self._tags)
