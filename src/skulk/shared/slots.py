"""Served-engine slots: how many requests one server instance decodes at once.

A served engine's slot count is a placement fact, not a runner-time setting: the node
advertises its setting (`SKULK_LLAMA_SERVER_PARALLEL`, `SKULK_VLLM_MAX_CONCURRENT_REQUESTS`)
in its NodeResources, the master stamps the count on the shard assignment after checking
that the KV cache for every slot fits, and the runner launches the server with exactly that
count. In-process engines decode one request at a time: one slot.

llama-server gives every slot its own KV cache of the full per-request context (Skulk
launches it with `--no-kv-unified`), so its KV footprint is context x slots. vLLM pages one
shared KV pool between its sequences, so its footprint is one context whatever
`--max-num-seqs` says. Pure: parsing and arithmetic only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from skulk.shared.types.cards import backend_engine
from skulk.shared.types.engines import SLOTTED_ENGINES

SLOT_SETTING_ENV: Mapping[str, str] = {name: t.setting_env for name, t in SLOTTED_ENGINES.items()}
"""Node setting per served engine: its slot count (the engine traits table's `slots`)."""

DEFAULT_SLOTS: Mapping[str, int] = {name: t.default for name, t in SLOTTED_ENGINES.items()}
"""Slots when nothing is configured (why each: `skulk.shared.types.engines.ENGINE_TRAITS`)."""

MAX_SLOTS: Mapping[str, int] = {name: t.maximum for name, t in SLOTTED_ENGINES.items()}
"""Above these a setting is refused as a typo."""

PER_SLOT_KV_ENGINES: frozenset[str] = frozenset(name for name, t in SLOTTED_ENGINES.items() if t.kv_per_slot)
"""Engines that reserve a whole context of KV cache for every slot."""

MAX_ANY_SLOTS = max(MAX_SLOTS.values())


@dataclass(frozen=True)
class SlotSettingError:
    """A node's slot setting that is not a whole number within bounds."""

    engine: str
    variable: str
    raw: str
    reason: str

    def describe(self) -> str:
        return f"{self.variable}={self.raw!r} {self.reason}"


def parse_slot_setting(engine: str, raw: str | None) -> int | SlotSettingError:
    """The slot count a node setting asks for (the engine's default when unset)."""
    variable = SLOT_SETTING_ENV[engine]
    bound = MAX_SLOTS[engine]
    if raw is None or not raw.strip():
        return DEFAULT_SLOTS[engine]
    try:
        value = int(raw.strip())
    except ValueError:
        return SlotSettingError(engine, variable, raw, f"is not a whole number; set it to how many requests one "
                                f"{engine} server decodes at once (1..{bound})")
    if not 1 <= value <= bound:
        return SlotSettingError(engine, variable, raw, f"is outside 1..{bound}")
    return value


def node_slot_settings(settings: Mapping[str, str]) -> tuple[dict[str, int], list[SlotSettingError]]:
    """Every served engine's slot count from a node's declarations, and the invalid ones."""
    slots: dict[str, int] = {}
    errors: list[SlotSettingError] = []
    for engine, variable in SLOT_SETTING_ENV.items():
        parsed = parse_slot_setting(engine, settings.get(variable))
        if isinstance(parsed, SlotSettingError):
            errors.append(parsed)
        else:
            slots[engine] = parsed
    return slots, errors


def engine_slots(backend: str, advertised: Mapping[str, int]) -> int:
    """How many slots a shard on `backend` gets from its node's advertised settings: the
    served engine's setting (its default for a node that advertises none), 1 in-process."""
    engine = backend_engine(backend)
    if engine not in SLOT_SETTING_ENV:
        return 1
    return advertised.get(engine, DEFAULT_SLOTS[engine])


def slotted(backend: str) -> bool:
    """Whether `backend`'s engine serves requests in slots an operator can choose."""
    return backend_engine(backend) in SLOT_SETTING_ENV


def requested_slots_refusal(backend: str, slots: int) -> str | None:
    """Why one placement's requested `slots` cannot run on `backend`, or None when they
    can: only served engines have slots, each within its own bound (`MAX_SLOTS`)."""
    engine = backend_engine(backend)
    if engine not in SLOT_SETTING_ENV:
        return (f"{backend} has no slots (an in-process engine decodes one request at a time); "
                f"slots apply to {' and '.join(sorted(SLOT_SETTING_ENV))}")
    bound = MAX_SLOTS[engine]
    if not 1 <= slots <= bound:
        return f"{engine} takes 1..{bound} slots, not {slots}"
    return None


def slot_choices(card_backends: Iterable[str], advertised: Iterable[Iterable[str]]) -> dict[str, int]:
    """The engines with slots a placement of a card can be given a slot count on, each with
    its most slots: the card's backend tags whose engine has slots and that some node
    advertises (`advertised`: each node's backend tags), as placement with `slots` picks
    them. Empty: the placement takes no slot count (the dashboard then offers none)."""
    offered = {tag for tags in advertised for tag in tags}
    return {backend_engine(tag): MAX_SLOTS[backend_engine(tag)]
            for tag in card_backends if slotted(tag) and tag in offered}


def kv_copies(backend: str, slots: int) -> int:
    """How many full contexts of KV a shard on `backend` with `slots` slots reserves."""
    return slots if backend_engine(backend) in PER_SLOT_KV_ENGINES else 1


__all__ = [
    "DEFAULT_SLOTS",
    "MAX_ANY_SLOTS",
    "MAX_SLOTS",
    "PER_SLOT_KV_ENGINES",
    "SLOT_SETTING_ENV",
    "SlotSettingError",
    "engine_slots",
    "kv_copies",
    "node_slot_settings",
    "parse_slot_setting",
    "requested_slots_refusal",
    "slot_choices",
    "slotted",
]
