"""Two nodes on different builds (the same package version, another source commit, stamped
with SKULK_BUILD_COMMIT as a packager would): each reports its commit, and `/state` health
on either node warns `version_mismatch`, naming both builds and which node to upgrade."""

from __future__ import annotations

import pytest

from tests.cluster.harness import start_linked, wait_agreed
from tests.nodeproc import wait_for

pytestmark = pytest.mark.timeout(180)


def test_different_commits_raise_a_version_mismatch(spawn_node):
    commits = {"alpha": "1111aaaa2222", "beta": "3333bbbb4444"}
    nodes = start_linked(lambda name, extra_args: spawn_node(name, env={"SKULK_BUILD_COMMIT": commits[name]},
                                                             extra_args=extra_args), ["alpha", "beta"])
    wait_agreed(nodes, members=2)

    def mismatch(node):
        state = node.get("/state").json()
        reported = {r["nodeName"]: r.get("commit") for r in state["nodeResources"].values()}
        if reported != commits:
            return None
        reasons = [reason for health in state["nodeHealth"].values() for reason in health["reasons"]
                   if reason["code"] == "version_mismatch"]
        return reasons[0] if reasons else None

    for node in nodes:
        reason = wait_for(lambda node=node: mismatch(node), timeout_s=60, interval_s=0.5, what="version_mismatch")
        assert "(1111aaaa2222) on alpha" in reason["message"] and "(3333bbbb4444) on beta" in reason["message"]
        assert reason["remediation"].startswith("upgrade beta to ")
