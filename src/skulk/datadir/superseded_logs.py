"""Retention of superseded event logs.

A master whose session would reuse indices already in its disk log moves that log aside as
`event_log.superseded-<unix seconds>` (`master.main.EventLogSlot.supersede`); a cold start
does so on every restart. Nothing read them back, so they piled up. They are kept for an
operator's forensics within a bound (`event_log.superseded_keep` copies, none older than
`event_log.superseded_max_age_days`) and pruned at start and at each supersede.

`to_prune` is pure; `prune_superseded` is the shell that lists and deletes.
"""

from __future__ import annotations

import logging
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from skulk.datadir.config import EventLogSection

logger = logging.getLogger(__name__)

SUPERSEDED_INFIX: Final = ".superseded-"
_STAMP: Final = re.compile(r"\.superseded-(\d+)(?:\..*)?$")


@dataclass(frozen=True)
class Retention:
    keep: int
    """Newest superseded logs kept; 0 keeps none."""
    max_age_s: float | None
    """Older than this is pruned even within `keep`; None: no age bound."""


def retention_from(section: EventLogSection) -> Retention:
    """The `event_log` section of skulk.yaml as a Retention (max age 0 means no limit)."""
    days = section.superseded_max_age_days
    return Retention(keep=section.superseded_keep, max_age_s=days * 86400.0 if days > 0 else None)


def superseded_name(live_dir: Path, now_s: float) -> Path:
    """Where `live_dir` is moved aside at `now_s` (unix seconds)."""
    return live_dir.with_name(f"{live_dir.name}{SUPERSEDED_INFIX}{int(now_s)}")


def to_prune(names: list[str], retention: Retention, now_s: float) -> list[str]:
    """The superseded logs to delete, newest kept first: every one past `keep`, and every
    one older than `max_age_s`. Names without a readable stamp are never touched."""
    stamped = sorted(((int(m.group(1)), n) for n in names if (m := _STAMP.search(n))), reverse=True)
    doomed = []
    for position, (stamp, name) in enumerate(stamped):
        too_old = retention.max_age_s is not None and now_s - stamp > retention.max_age_s
        if position >= retention.keep or too_old:
            doomed.append(name)
    return sorted(doomed)


def prune_superseded(live_dir: Path, retention: Retention, now_s: float) -> list[str]:
    """Delete the superseded copies of `live_dir` that `retention` does not keep. Errors are
    logged, never raised: retention must never stop a node."""
    try:
        names = [p.name for p in live_dir.parent.iterdir() if p.name.startswith(live_dir.name + SUPERSEDED_INFIX)]
    except OSError as exc:
        logger.warning("cannot list superseded event logs next to %s: %s", live_dir, exc)
        return []
    pruned = []
    for name in to_prune(names, retention, now_s):
        path = live_dir.parent / name
        try:
            shutil.rmtree(path) if path.is_dir() else path.unlink()
        except OSError as exc:
            logger.warning("cannot prune superseded event log %s: %s", path, exc)
            continue
        pruned.append(name)
    if pruned:
        logger.info("pruned %d superseded event log(s): %s", len(pruned), ", ".join(pruned))
    return pruned


__all__ = ["SUPERSEDED_INFIX", "Retention", "prune_superseded", "retention_from", "superseded_name", "to_prune"]
