"""Sessions: a conversation held open on a placed model, its KV kept hot by the engine.

A session is the text a client has committed so far (its *transcript*) bound to one
placed instance. Every call that touches the model sends the whole transcript as the
request's raw prompt through the ordinary generation path (task, relayed task input,
rank-0 runner), and the engine's prefix cache (`skulk.shared.prefix_cache`) finds
the session's KV by its tokens, hot in the context or restored from the cold store. So
a session can never decode on wrong KV: the KV re-used is whatever matches the tokens
sent, and a runner that lost it (restart, eviction) simply evaluates them again.

The transcript lives in this API node's memory (bounded: `MAX_SESSIONS`,
`MAX_TRANSCRIPT_CHARS`), never in State or the event log, like any prompt. A snapshot
writes it to the data dir (`<data>/sessions/<id>.json`) and returns the same document, so a
session can be restored on this node or, by posting the document, on any node serving the
same model. A session is fenced to the instance it opened on: once the model is
re-placed or switched, its calls are refused (`session_fenced`) rather than silently run
elsewhere; restore it from a snapshot to continue.

Pure: `session_refusal`, `snapshot_document` and `parse_snapshot` decide; `SessionBook` is
the bounded in-memory table the routes use.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from skulk.api.access import Principal
from skulk.api.errors import ApiError, Conflict, InvalidRequest, NotFound, Overloaded
from skulk.shared.types.instances import Instance

SESSION_ID_PREFIX = "sess_"
MAX_SESSIONS = 256
"""Open sessions per API node; one more is refused (`Overloaded`) until one closes."""
MAX_TRANSCRIPT_CHARS = 4 * 1024 * 1024
"""A transcript's bound; the model's context refuses far shorter ones anyway."""
SNAPSHOT_VERSION = 1


class SessionNotFound(NotFound):
    """No open session of the caller's has this id (another principal's looks the same)."""

    default_code = "session_not_found"

    def __init__(self, session_id: str) -> None:
        super().__init__(f"No open session of yours has the id {session_id!r}.", param="session_id")


class SessionFenced(Conflict):
    """The session's model was re-placed or switched since it opened."""

    default_code = "session_fenced"


class SessionLost(Conflict):
    """The session's model is no longer placed anywhere in the cluster."""

    default_code = "session_lost"


@dataclass(frozen=True, slots=True)
class Session:
    session_id: str
    model_id: str
    instance_id: str
    owner: str
    """`Principal.id` of whoever opened it: only they (or an operator) may use it."""
    transcript: str = ""
    tokens_held: int = 0
    """Prompt plus output tokens of the last call (what the runner's KV holds for it)."""
    cached_tokens: int = 0
    """Prompt tokens the last call re-used from the engine's prefix cache."""


def new_session_id() -> str:
    return SESSION_ID_PREFIX + secrets.token_hex(12)


def session_refusal(
    session: Session | None, session_id: str, caller: Principal, instance: Instance | None
) -> ApiError | None:
    """Why `caller` may not use `session` now (None: it may). Unknown and not-yours look
    the same; a model that is gone or was re-placed refuses with a typed conflict."""
    if session is None or not (session.owner == caller.id or caller.cancels_any):
        return SessionNotFound(session_id)
    if instance is None:
        return SessionLost(
            f"{session.model_id} is no longer placed; the session's KV is gone. Place the model and "
            f"restore the session from a snapshot (POST /v1/sessions/restore)."
        )
    if instance.instance_id != session.instance_id or instance.model_id != session.model_id:
        return SessionFenced(
            f"The session was opened on instance {session.instance_id} of {session.model_id}, which has since "
            f"been re-placed or switched (now {instance.instance_id} of {instance.model_id}); it is not continued "
            f"on another instance. Restore it from a snapshot (POST /v1/sessions/restore)."
        )
    return None


def appended(session: Session, text: str) -> Session:
    """`session` with `text` added to its transcript (refused past `MAX_TRANSCRIPT_CHARS`)."""
    if len(session.transcript) + len(text) > MAX_TRANSCRIPT_CHARS:
        raise InvalidRequest(f"The session's transcript would exceed {MAX_TRANSCRIPT_CHARS} characters.", param="text")
    return replace(session, transcript=session.transcript + text)


def snapshot_document(session: Session) -> dict[str, Any]:
    """What a snapshot holds: enough to continue the conversation on any instance of the model."""
    return {
        "version": SNAPSHOT_VERSION,
        "sessionId": session.session_id,
        "model": session.model_id,
        "transcript": session.transcript,
        "tokensHeld": session.tokens_held,
    }


def parse_snapshot(document: Any) -> tuple[str, str, str]:
    """(session id, model id, transcript) of a snapshot document, or `InvalidRequest`."""
    if not isinstance(document, Mapping):
        raise InvalidRequest("A snapshot must be a JSON object.", param="snapshot")
    if document.get("version") != SNAPSHOT_VERSION:
        raise InvalidRequest(f"Unsupported snapshot version {document.get('version')!r}.", param="snapshot.version")
    values: tuple[Any, ...] = tuple(document.get(key) for key in ("sessionId", "model", "transcript"))
    if not all(isinstance(v, str) for v in values) or not values[0].startswith(SESSION_ID_PREFIX):
        raise InvalidRequest("A snapshot needs string sessionId, model and transcript.", param="snapshot")
    if len(values[2]) > MAX_TRANSCRIPT_CHARS:
        raise InvalidRequest(f"The snapshot's transcript exceeds {MAX_TRANSCRIPT_CHARS} characters.",
                             param="snapshot.transcript")
    return values  # type: ignore[return-value]


def valid_session_id(session_id: str) -> bool:
    """Ids are ours (`sess_` + hex): anything else never names a file."""
    rest = session_id.removeprefix(SESSION_ID_PREFIX)
    return session_id.startswith(SESSION_ID_PREFIX) and 0 < len(rest) <= 64 and all(
        c in "0123456789abcdef" for c in rest)


class SessionBook:
    """This API node's open sessions, at most `limit`."""

    def __init__(self, limit: int = MAX_SESSIONS) -> None:
        self._limit = limit
        self._sessions: dict[str, Session] = {}

    def get(self, session_id: str) -> Session | None:
        return self._sessions.get(session_id)

    def put(self, session: Session) -> Session:
        if session.session_id not in self._sessions and len(self._sessions) >= self._limit:
            raise Overloaded(f"This node holds {self._limit} open sessions; close one first.")
        self._sessions[session.session_id] = session
        return session

    def close(self, session_id: str) -> bool:
        return self._sessions.pop(session_id, None) is not None

    def __len__(self) -> int:
        return len(self._sessions)


__all__ = [
    "MAX_SESSIONS",
    "MAX_TRANSCRIPT_CHARS",
    "SESSION_ID_PREFIX",
    "Session",
    "SessionBook",
    "SessionFenced",
    "SessionLost",
    "SessionNotFound",
    "appended",
    "new_session_id",
    "parse_snapshot",
    "session_refusal",
    "snapshot_document",
    "valid_session_id",
]
