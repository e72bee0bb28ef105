"""What an election result changes on a node (skulk.cluster.master_role): pure, one row a case."""

from __future__ import annotations

import pytest

from skulk.cluster.master_role import MasterRoleChange, master_api_endpoint, master_role_change
from skulk.shared.telemetry_view import TelemetryView
from skulk.shared.types.state import State


@pytest.mark.parametrize(("previous", "elected", "i_am_master", "running", "expected"), [
    # First election this node hears: nothing to fail over; it starts a master if elected.
    (None, "s1", True, None, MasterRoleChange(False, False, True)),
    (None, "s1", False, None, MasterRoleChange(False, False, False)),
    # Re-elected in the same session: the running master runs on.
    ("s1", "s1", True, "s1", MasterRoleChange(False, False, False)),
    # Same session heard again by a follower: nothing changes.
    ("s1", "s1", False, None, MasterRoleChange(False, False, False)),
    # A new session elsewhere: affected streams fail; a master here steps down.
    ("s1", "s2", False, "s1", MasterRoleChange(True, True, False)),
    ("s1", "s2", False, None, MasterRoleChange(True, False, False)),
    # A new session here: streams fail over, the old master stops, a new one starts.
    ("s1", "s2", True, "s1", MasterRoleChange(True, True, True)),
    ("s1", "s2", True, None, MasterRoleChange(True, False, True)),
    # Elected in s2 while running a master of s1: the stale one steps down, a new one starts.
    ("s2", "s2", True, "s1", MasterRoleChange(False, True, True)),
])
def test_master_role_change(previous, elected, i_am_master, running, expected):
    assert master_role_change(previous, elected, i_am_master, running) == expected


def test_master_api_endpoint_unknown_master():
    assert master_api_endpoint(None, State(), TelemetryView()) is None
    assert master_api_endpoint("n1", State(), TelemetryView()) is None
