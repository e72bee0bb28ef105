"""The one election wire message, published on the election topic.

A node campaigning at election clock `clock` publishes `kind="candidate"`; the winner
publishes `kind="leader"` with the `session_id` of its master session. Candidates are
ranked by `(clock, seniority, commands_seen, node_id)`, higher wins (see `rank`). This
module holds only the type and its invariants; the state machine is `skulk.shared.election`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from skulk.shared.types.base import WireModel
from skulk.shared.types.common import NonNegInt
from skulk.shared.types.ids import NodeId, SessionId

ElectionKind = Literal["candidate", "leader"]

Rank = tuple[int, int, int, str]
"""(clock, seniority, commands_seen, node_id): compared as a tuple, higher wins."""


class ElectionMessage(WireModel):
    """A candidacy or a leadership announcement.

    `seniority` is the number of elections the sender has won in its lifetime and
    `commands_seen` the commands it has observed; a sender freezes both for one campaign
    (and the leadership it wins) so that every receiver ranks it the same way.
    """

    type: Literal["ElectionMessage"] = "ElectionMessage"
    kind: ElectionKind
    node_id: NodeId
    clock: NonNegInt
    seniority: NonNegInt
    commands_seen: NonNegInt
    session_id: SessionId | None = None
    high_water_idx: int | None = Field(default=None, ge=-1)
    """A leader's last indexed event when it announced (-1: none yet); None on candidacies.
    A follower that missed the tail of a burst has no later event to reveal the gap; the
    announcement, every LEADER_ANNOUNCE_S, does (`shared.sync.on_master_high_water`)."""

    @model_validator(mode="after")
    def _session_only_on_leader(self) -> ElectionMessage:
        # A leader without a session could not be followed; a candidate with one would
        # claim a session nobody elected.
        if self.kind == "leader" and self.session_id is None:
            raise ValueError("a leader message must carry session_id")
        if self.kind == "candidate" and (self.session_id is not None or self.high_water_idx is not None):
            raise ValueError("a candidate message must not carry session_id or high_water_idx")
        return self

    @property
    def rank(self) -> Rank:
        return (self.clock, self.seniority, self.commands_seen, self.node_id)


__all__ = ["ElectionKind", "ElectionMessage", "Rank"]
