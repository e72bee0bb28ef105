"""What follows from an election result, and where the elected master is reached: pure.

`skulk.node.Node` holds the running master and the open streams; which of them an election
changes is decided here, so the rules read as a table (tests/cluster/test_master_role.py)
and the node only carries the answer out:

- a new session (not the first one this node hears) fails the streams the change affects
  (which ones: `skulk.api.failover.failover_failures`);
- a running master steps down when this node is no longer master, or masters another
  session;
- this node starts a master when it is elected and runs none (after any step-down).

`master_api_endpoint` says where the elected master's API is: its State record, else its
latest telemetry (the record lands a tick after the telemetry does).
"""

from __future__ import annotations

from dataclasses import dataclass

from skulk.shared.telemetry_view import TelemetryView
from skulk.shared.types.ids import NodeId
from skulk.shared.types.state import State


@dataclass(frozen=True)
class MasterRoleChange:
    """What an election result changes on this node."""

    fail_failover_streams: bool
    stop_master: bool
    start_master: bool


def master_role_change(previous_session: str | None, elected_session: str, i_am_master: bool,
                       running_session: str | None) -> MasterRoleChange:
    """The changes for an election naming `elected_session` (this node the master or not),
    given the session this node followed before and the session of the master it runs
    (None: it runs none)."""
    stop = running_session is not None and (not i_am_master or running_session != elected_session)
    runs_after = running_session is not None and not stop
    return MasterRoleChange(
        fail_failover_streams=previous_session is not None and previous_session != elected_session,
        stop_master=stop,
        start_master=i_am_master and not runs_after,
    )


def master_api_endpoint(master_id: str | None, state: State, telemetry: TelemetryView) -> str | None:
    """The elected master's advertised API endpoint (its store address), once known."""
    if master_id is None:
        return None
    node = NodeId(master_id)  # the replica keeps the elected id as a plain string
    info = state.nodes.get(node)
    if info is not None and info.api_endpoint:
        return info.api_endpoint
    reading = telemetry.nodes.get(node)
    resources = getattr(reading, "resources", None)
    return getattr(resources, "api_endpoint", None)


__all__ = ["MasterRoleChange", "master_api_endpoint", "master_role_change"]
