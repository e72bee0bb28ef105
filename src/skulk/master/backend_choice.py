"""Which of a card's backend tags a node serves with, best first.

A card's `backend_preference` is the operator's word. Where it says nothing about the
served `llama_server` engine, a node that advertises it serves with it rather than with the
in-process `llama_cpp` engine on the same compute: llama-server decodes many requests at
once (its slots), the in-process engine one. So each `llama_cpp-<compute>` tag is tried
right after its `llama_server-<compute>` twin, when the card allows the twin.

How an operator chooses: list `llama_cpp-*` tags ahead of `llama_server-*` ones in the
card's `backend_preference` (the card then decides), drop `llama_server*` from its
`compatible_backends`, or leave a node without a llama-server (no SKULK_LLAMA_SERVER_BIN,
no `skulk engines install`, SKULK_BUNDLED_LLAMA_SERVER=0), which then never advertises it.

A twin is promoted only when it serves every workload the card's tasks promise
(`skulk.shared.types.workloads.card_workloads`): an embedding model (`tasks` holds
"Embedding") stays on the in-process engine, which computes embeddings, where llama-server
(started for generation) cannot. Pure; no I/O.
"""

from __future__ import annotations

from skulk.shared.types.cards import ModelCard
from skulk.shared.types.engines import SERVED_TWIN, serves_workload  # in-process engine -> its served twin
from skulk.shared.types.workloads import card_workloads


def _serves_tasks(tag: str, card: ModelCard) -> bool:
    engine = tag.partition("-")[0]
    return all(serves_workload(engine, kind) for kind in card_workloads(card.tasks))


def _twin(tag: str) -> str | None:
    engine, _, compute = tag.partition("-")
    served = SERVED_TWIN.get(engine)
    if served is None:
        return None
    return f"{served}-{compute}" if compute else served


def serving_order(card: ModelCard) -> tuple[str, ...]:
    """`card.ordered_backends`, with served twins promoted unless the card ranks them."""
    ordered = card.ordered_backends
    preference = card.placement.backend_preference
    if any(tag.startswith(tuple(SERVED_TWIN.values())) for tag in preference):
        return ordered  # the card ranks the served engine itself
    allowed = set(card.placement.compatible_backends)
    out: list[str] = []
    for tag in ordered:
        twin = _twin(tag)
        if twin is not None and twin in allowed and twin not in out and _serves_tasks(twin, card):
            out.append(twin)
        if tag not in out:
            out.append(tag)
    return tuple(out)


__all__ = ["SERVED_TWIN", "serving_order"]
