"""The pure session rules: who may use a session, fencing against re-placement and model
switches, transcript and snapshot bounds."""

from __future__ import annotations

import pytest

from skulk.api.access import Principal
from skulk.api.errors import InvalidRequest, Overloaded
from skulk.api.sessions import (
    MAX_TRANSCRIPT_CHARS,
    Session,
    SessionBook,
    SessionFenced,
    SessionLost,
    SessionNotFound,
    appended,
    parse_snapshot,
    session_refusal,
    snapshot_document,
    valid_session_id,
)
from tests.worker.tiny_gguf import tiny_gguf_card, tiny_instance

CARD = tiny_gguf_card()
INSTANCE = tiny_instance(CARD)
SESSION = Session("sess_ab12", CARD.model_id, str(INSTANCE.instance_id), "loopback", "hello")
OWNER = Principal("loopback", operator=False)
STRANGER = Principal("key:1234", operator=False)
OPERATOR = Principal("operator:99", operator=True)
REPLACED = INSTANCE.model_copy(update={"instance_id": "instance-1"})
SWITCHED = INSTANCE.model_copy(update={"model_id": "other/model"})


@pytest.mark.parametrize(
    "session, caller, instance, refused",
    [
        (SESSION, OWNER, INSTANCE, None),
        (SESSION, OPERATOR, INSTANCE, None),
        (SESSION, STRANGER, INSTANCE, SessionNotFound),
        (None, OWNER, INSTANCE, SessionNotFound),
        (SESSION, OWNER, None, SessionLost),
        (SESSION, OWNER, REPLACED, SessionFenced),
        (SESSION, OWNER, SWITCHED, SessionFenced),
        (SESSION, STRANGER, None, SessionNotFound),  # a stranger learns nothing about its state
    ],
)
def test_session_refusal(session, caller, instance, refused) -> None:
    got = session_refusal(session, "sess_ab12", caller, instance)
    assert (type(got) if got is not None else None) is refused
    if got is not None:
        assert got.code in ("session_not_found", "session_lost", "session_fenced")


def test_snapshot_round_trip_and_refusals() -> None:
    document = snapshot_document(SESSION)
    assert parse_snapshot(document) == ("sess_ab12", CARD.model_id, "hello")
    for broken in ([], {**document, "version": 9}, {**document, "model": 3}, {**document, "sessionId": "x"}):
        with pytest.raises(InvalidRequest):
            parse_snapshot(broken)


def test_transcripts_and_the_book_are_bounded() -> None:
    with pytest.raises(InvalidRequest):
        appended(SESSION, "x" * MAX_TRANSCRIPT_CHARS)
    assert appended(SESSION, " world").transcript == "hello world"
    book = SessionBook(limit=1)
    book.put(SESSION)
    book.put(appended(SESSION, "!"))  # the same session again is an update, not a new one
    with pytest.raises(Overloaded):
        book.put(Session("sess_cd34", CARD.model_id, "i", "loopback"))
    assert book.close("sess_ab12") and not book.close("sess_ab12")


@pytest.mark.parametrize("value, valid", [("sess_ab12", True), ("sess_", False), ("sess_../x", False),
                                          ("ab12", False), ("sess_" + "a" * 65, False)])
def test_only_our_ids_name_snapshot_files(value, valid) -> None:
    assert valid_session_id(value) is valid
