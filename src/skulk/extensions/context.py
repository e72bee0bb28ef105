"""`ExtensionContext`: what every hook receives. The node identity and Skulk version, the
cluster's embedding serving in process (the equivalent of POST /v1/embeddings), a read
surface on the telemetry plane (`read_cluster()`) and a write surface
(`advertise_capability` / `withdraw_capability`).

The context holds plain callables that `skulk.node` wires, so it never imports the API or
the cluster: an extension reaches the fabric only through these methods.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from skulk import __version__
from skulk.extensions.capability_tags import CapabilityTags
from skulk.extensions.cluster_view import NodeView

Embed = Callable[[str, Sequence[str]], Awaitable[list[list[float]]]]
"""(model, inputs) -> one vector per input, as POST /v1/embeddings would answer."""


async def _no_embeddings(model: str, _inputs: Sequence[str]) -> list[list[float]]:
    raise RuntimeError(f"this node serves no embeddings to extensions (asked for {model!r})")


@dataclass(frozen=True)
class ExtensionContext:
    node_id: str
    node_name: str
    skulk_version: str = __version__
    embed_fn: Embed = field(default=_no_embeddings, repr=False)
    read_fn: Callable[[], tuple[NodeView, ...]] = field(default=lambda: (), repr=False)
    tags: CapabilityTags = field(default_factory=CapabilityTags, repr=False)

    async def embed(self, model: str, inputs: Sequence[str]) -> list[list[float]]:
        """Embeddings of `inputs` from a placed embedding model (typed API errors as for
        POST /v1/embeddings: a model not placed, a cluster without a master...)."""
        return await self.embed_fn(model, list(inputs))

    def read_cluster(self) -> tuple[NodeView, ...]:
        """Every member now, sorted by node id (`skulk.extensions.cluster_view.NodeView`)."""
        return self.read_fn()

    def advertise_capability(self, tag: str) -> None:
        """Publish `tag` on this node's telemetry (peers see it on the next resources round,
        every few seconds). ValueError for a malformed tag or past 32 tags."""
        self.tags.advertise(tag)

    def withdraw_capability(self, tag: str) -> None:
        """Stop advertising `tag` (a tag not advertised: nothing happens)."""
        self.tags.withdraw(tag)

    def capabilities(self) -> frozenset[str]:
        """The tags this node advertises now."""
        return self.tags.current()
