"""The master's custom-card decisions (AddCustomModelCard / DeleteCustomModelCard), as tables."""

from __future__ import annotations

import itertools

import pytest

from skulk.master.commands import DecisionContext, Refusal, decide
from skulk.shared.types.commands import AddCustomModelCard, DeleteCustomModelCard
from skulk.shared.types.events import CustomModelCardAdded, CustomModelCardDeleted
from skulk.shared.types.state import State
from tests.mockhub import hub_card

CARD = hub_card("org/model")
OTHER = hub_card("org/model", gguf_file="m-Q4_K_M.gguf")
WITH_CARD = State(custom_cards={CARD.model_id: CARD})


def ctx() -> DecisionContext:
    counter = itertools.count()
    return DecisionContext(new_id=lambda: f"e{next(counter)}", origin="n1")


@pytest.mark.parametrize(
    ("state", "command", "expected"),
    [
        (State(), AddCustomModelCard(command_id="c", card=CARD), [CustomModelCardAdded(event_id="e0", card=CARD)]),
        (WITH_CARD, AddCustomModelCard(command_id="c", card=CARD), []),  # the same card again: nothing to record
        (WITH_CARD, AddCustomModelCard(command_id="c", card=OTHER), [CustomModelCardAdded(event_id="e0", card=OTHER)]),
        (WITH_CARD, DeleteCustomModelCard(command_id="c", model_id=CARD.model_id),
         [CustomModelCardDeleted(event_id="e0", model_id=CARD.model_id)]),
        (State(), DeleteCustomModelCard(command_id="c", model_id=CARD.model_id), Refusal("unknown_card", "")),
    ],
)
def test_custom_card_decisions(state, command, expected):
    decision = decide(state, command, ctx())
    if isinstance(expected, Refusal):
        assert isinstance(decision, Refusal) and decision.code == expected.code
        assert CARD.model_id in decision.message
    else:
        assert decision == expected
