"""May this node's campaign end in a master, given who campaigns with it? (pure, table-tested)

Why: a node cut off by the network (not paused: it keeps running) loses the presence of
every peer, master included, and campaigns. Deciding alone, it would lead a session of its
own at a higher election clock; when the link heals the cluster would meet two leaders, the
higher clock would win, and the healthy master would be deposed (every stream in the
cluster failing with it). So a campaign decides only when a majority of the cluster's
members (as the replicated State lists them, `State.nodes`, which only a live master
changes: it adds joiners and prunes departed nodes) campaign in it: the deciding node and
the candidates it recorded at its clock. Candidacies, not presence: presence of the peers
behind a cut goes link by link, seconds apart, so a peer can still look present when the
window closes; a candidacy is only heard from a node that also lost the master and is
reachable. A minority keeps campaigning, harmlessly, until it hears the current leader
again and adopts it; the leader answers its candidacy, so no election happens and the
master does not change.

The members move with the cluster while a master is live (the survivors of one departure
after another keep electing) and freeze while none is, so a cut node cannot shrink them to
itself. Trade-offs, by design:
- two members: either alone may decide (from one side a cut and a death look the same);
- a cluster that loses a majority at once (the master among them) elects no master until
  enough of those nodes come back; nodes keep serving what they already serve meanwhile;
- a node that knows no members (a cold start, a fresh node) decides with whoever it hears;
- a node that is not a member (pruned, or not yet joined) never decides: it adopts the
  leader it hears. (Seen on a healed cut: the master's event burst, which prunes the cut
  node, reached it before the master's announcement did, and with two members left it
  would have led alone.)
"""

from __future__ import annotations

from collections.abc import Iterable


def has_quorum(members: frozenset[str], candidates: Iterable[str], me: str) -> bool:
    """True when this node may end its campaign (lead, or follow the winner): no members
    known yet; otherwise only as a member itself (a node the master pruned, say one cut off
    whose link just healed and whose replica has just learnt so, follows and never decides),
    with a member set of at most two, or a strict majority of the members campaigning
    (`candidates`: the nodes whose candidacy it recorded, itself included)."""
    if not members:
        return True
    if me not in members:
        return False
    if len(members) <= 2:
        return True
    campaigning = len((frozenset(candidates) | {me}) & members)
    return 2 * campaigning > len(members)


__all__ = ["has_quorum"]
