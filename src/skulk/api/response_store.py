"""Stored Responses (`store`, `previous_response_id`, `GET`/`DELETE /v1/responses/{id}`):
what a node keeps of the responses it answered, so a client can continue a conversation by
id instead of resending it.

Bounded and short-lived on purpose: at most RESPONSE_STORE_CAPACITY responses per node
(least recently used dropped first), each for RESPONSE_TTL_S. A response is stored on the
node that answered it and is visible only to callers presenting the same API key (its
scope); another key finds nothing (404). Another node asks its peers for it
(`skulk.api.routes.openai._stored`: the peer token and the caller's key scope), so any node
reads and continues it; only the storing node deletes it. Pure apart from the lock: the
caller passes `now`.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from skulk.shared.types.common import ChatMessage

RESPONSE_STORE_CAPACITY = 512
"""Responses one node keeps. A stored conversation is its text, so this bounds memory to a
few hundred conversations' worth."""

RESPONSE_STORE_IMAGE_BYTES = 256 * 1024 * 1024
"""Image bytes (base64, as kept) across every stored conversation of one node: a conversation
with images is up to 32 MiB of them (`skulk.api.media.MAX_REQUEST_IMAGE_BYTES`), so the count
bound alone would allow 16 GiB; least recently used responses are dropped to stay under."""

RESPONSE_TTL_S = 3600.0
"""How long a stored response can be continued or fetched (an hour: a working session)."""


def key_scope(presented_key: str | None) -> str:
    """The scope of a caller: a digest of the API key it presented ("" without one), so
    stored responses never keep the key itself."""
    return hashlib.sha256(presented_key.encode()).hexdigest() if presented_key else ""


@dataclass(frozen=True)
class StoredResponse:
    scope: str
    stored_at_s: float
    body: dict[str, Any]
    conversation: tuple[ChatMessage, ...]
    """Every message up to and including this response's output: what a continuation sees
    before its own input."""

    @property
    def image_bytes(self) -> int:
        return sum(len(image.data_b64) for message in self.conversation for image in message.images)


class ResponseStore:
    """An LRU of stored responses with a TTL, keyed by response id."""

    def __init__(self, capacity: int = RESPONSE_STORE_CAPACITY, ttl_s: float = RESPONSE_TTL_S,
                 image_bytes: int = RESPONSE_STORE_IMAGE_BYTES) -> None:
        self._capacity, self._ttl_s, self._image_bytes = capacity, ttl_s, image_bytes
        self._items: OrderedDict[str, StoredResponse] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, response_id: str, item: StoredResponse) -> None:
        with self._lock:
            self._items[response_id] = item
            self._items.move_to_end(response_id)
            while len(self._items) > self._capacity:
                self._items.popitem(last=False)
            held = sum(kept.image_bytes for kept in self._items.values())
            while held > self._image_bytes and self._items:
                held -= self._items.popitem(last=False)[1].image_bytes

    def get(self, response_id: str, scope: str, now_s: float) -> StoredResponse | None:
        with self._lock:
            item = self._items.get(response_id)
            if item is None or item.scope != scope:
                return None
            if now_s - item.stored_at_s > self._ttl_s:
                del self._items[response_id]
                return None
            self._items.move_to_end(response_id)
            return item

    def delete(self, response_id: str, scope: str) -> bool:
        with self._lock:
            item = self._items.get(response_id)
            if item is None or item.scope != scope:
                return False
            del self._items[response_id]
            return True

    def __len__(self) -> int:
        return len(self._items)


__all__ = ["RESPONSE_STORE_CAPACITY", "RESPONSE_STORE_IMAGE_BYTES", "RESPONSE_TTL_S", "ResponseStore", "StoredResponse", "key_scope"]
