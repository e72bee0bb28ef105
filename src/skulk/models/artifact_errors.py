"""The one error every way of getting a model's files ends with when it cannot.

Its own module, below everything that raises it (generation of the tiny models, hub
downloads, local paths, staging through the store), so none of those imports another just
for the exception: `downloads` and `tiny_models` used to import each other for it.
"""

from __future__ import annotations


class ArtifactUnavailable(Exception):
    """A card's artifact cannot be produced on this node: which model, and why."""

    def __init__(self, model_id: str, reason: str) -> None:
        self.model_id = model_id
        self.reason = reason
        super().__init__(model_id, reason)  # args that rebuild it (pickling across processes)

    def __str__(self) -> str:
        return f"model {self.model_id} is unavailable: {self.reason}"


__all__ = ["ArtifactUnavailable"]
