"""The operator's intent on disk: `<data dir>/intent.json`, kept by every node.

Every node folds the events it applies into a `ClusterIntent` (`skulk.shared.intent`) and
rewrites this file, atomically, whenever the intent changes (a placement, an operator's
delete, a custom card). The first master of a cold start reads its own copy to restore the
cluster (`skulk.master.restore`). A missing file is an empty intent; an unreadable one is
logged and treated as empty (never a reason not to start). A write that fails (a full
disk) is logged once and retried at the next change: the node keeps serving.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Final

from pydantic import ValidationError

from skulk.datadir.atomic_file import write_atomic
from skulk.shared.intent import ClusterIntent, fold_intent
from skulk.shared.types.events import IndexedEvent
from skulk.shared.types.ids import InstanceId
from skulk.shared.types.instances import Instance
from skulk.shared.types.state import State

logger = logging.getLogger(__name__)

INTENT_FILE: Final = "intent.json"


def load_intent(path: Path) -> ClusterIntent:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return ClusterIntent()
    except OSError as exc:
        logger.error("cannot read the intent record %s (%s); starting without it", path, exc)
        return ClusterIntent()
    try:
        return ClusterIntent.model_validate_json(text)
    except ValidationError as exc:
        logger.error("the intent record %s is not valid (%s); starting without it", path, exc.errors()[:1])
        return ClusterIntent()


def save_intent(path: Path, intent: ClusterIntent) -> None:
    """Replace the record atomically: readers see the old file or the new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, intent.model_dump_json(by_alias=True))


class IntentRecord:
    """This node's intent, folded from applied events and persisted on change."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.intent = load_intent(path)
        self._instances: dict[InstanceId, Instance] = {}
        self._failing = False
        self.writes = 0

    def observe(self, indexed: IndexedEvent, state: State) -> None:
        """Fold one applied event (`state` is State after it) and persist a change."""
        folded = fold_intent(self.intent, indexed.event, self._instances, state)
        self._instances = dict(state.instances)
        if folded == self.intent:
            return
        self.intent = folded
        try:
            save_intent(self.path, folded)
        except OSError as exc:
            if not self._failing:
                logger.error("cannot write the intent record %s (%s); will retry at the next change", self.path, exc)
            self._failing = True
            return
        self._failing = False
        self.writes += 1

    def stats(self) -> dict[str, object]:
        return {"placements": sorted(self.intent.placements), "customCards": sorted(self.intent.custom_cards),
                "writes": self.writes, "writeFailing": self._failing}


__all__ = ["INTENT_FILE", "IntentRecord", "load_intent", "save_intent"]
