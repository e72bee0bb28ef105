"""`NETWORK_VERSION` moves with the wire: a digest of every topic's payload schema is pinned
to the current version, so a change to a message that crosses the network fails here until
the version is bumped in the same change (nodes of the two builds then reject each other as
"version" instead of half-understanding each other's messages)."""

from __future__ import annotations

import hashlib
import json

from skulk.routing.constants import NETWORK_VERSION
from skulk.routing.topics import _build_topics

PAYLOAD_SCHEMA_DIGESTS = {
    "skulk-net-3": "3a3cc4ca7fc01ddb78103b32099277be569fa81091555b02fa1c168a159047a3",
    "skulk-net-4": "f912f0e7f03685ea62b74ac304b4274f64bc7decd25c8e9e720f8053ee86e517",
    "skulk-net-5": "684698450e0e0b17964107c5bd2f1227ae6ea0e8107d4e22446333e8e779d8e6",
    "skulk-net-6": "a629563801baba3360ba5f4bcbca3f00a3b816b664c8e4ab25803ca995eac04d",
}
"""NETWORK_VERSION -> the digest of its payload schemas. On a wire change: bump
NETWORK_VERSION in skulk/routing/constants.py (saying why) and add its digest here."""


def payload_schema_digest() -> str:
    """The digest of every topic's JSON schema, prose left out (a docstring is no wire change)."""
    schemas = {name: _shape(topic.adapter.json_schema()) for name, topic in sorted(_build_topics().items())}
    return hashlib.sha256(json.dumps(schemas, sort_keys=True).encode()).hexdigest()


def _shape(schema: object) -> object:
    if isinstance(schema, dict):
        return {key: _shape(value) for key, value in schema.items() if key not in ("description", "title")}
    if isinstance(schema, list):
        return [_shape(item) for item in schema]
    return schema


def test_the_wire_schemas_belong_to_this_network_version():
    digest = payload_schema_digest()
    assert NETWORK_VERSION in PAYLOAD_SCHEMA_DIGESTS, (
        f"NETWORK_VERSION {NETWORK_VERSION!r} has no pinned digest: add {digest!r} for it")
    assert digest == PAYLOAD_SCHEMA_DIGESTS[NETWORK_VERSION], (
        "a message that crosses the network changed: bump NETWORK_VERSION (skulk/routing/constants.py) and pin "
        f"the new digest {digest!r} under it")
