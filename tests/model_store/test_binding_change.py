"""What a fresh store choice asks of the node: persist it, announce it, or nothing (pure table)."""

from __future__ import annotations

import pytest

from skulk.model_store.host import StoreAddress, StoreChoice
from skulk.model_store.node_store import BindingChange, binding_change

A, B = StoreAddress("10.0.0.1", 52415), StoreAddress("10.0.0.2", 52415)
MASTER_A = StoreChoice(A, "master", False)
MASTER_B = StoreChoice(B, "master", False)
SELF_A = StoreChoice(A, "bootstrap", True)
EXPLICIT_B = StoreChoice(B, "explicit", False)


@pytest.mark.parametrize(
    ("choice", "last", "written", "expected"),
    [
        (MASTER_A, None, None, BindingChange(A, "model store: http://10.0.0.1:52415 (master)")),
        (MASTER_A, MASTER_A, A, BindingChange()),  # nothing changed: no write, no log
        (MASTER_B, MASTER_A, A, BindingChange(B, "model store: http://10.0.0.2:52415 (master)")),
        (MASTER_A, None, A, BindingChange(None, "model store: http://10.0.0.1:52415 (master)")),  # already on disk
        (EXPLICIT_B, MASTER_A, A, BindingChange(None, "model store: http://10.0.0.2:52415 (explicit)")),
        (SELF_A, None, None, BindingChange(None, "model store: http://10.0.0.1:52415 (bootstrap); this node hosts it")),
        (None, MASTER_A, A,
         BindingChange(None, "model store: none (no API and no store to follow); downloads go straight to the hub")),
        (None, None, None, BindingChange()),
    ],
)
def test_binding_change(choice, last, written, expected) -> None:  # type: ignore[no-untyped-def]
    assert binding_change(choice, last, written) == expected
