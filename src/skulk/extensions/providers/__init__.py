"""Capability providers: extensions that serve capabilities callable across nodes.

- `contract.py`: what a provider is (descriptors, handlers, the call context).
- `registry.py`: the node's guarded registry (`capability_tags()` for advertising).
- `lifecycle.py`: the pure per-direction lifecycle (started, ordered chunks, one terminal).
- `server.py` / `client.py`: the provider side and the caller side (`call_capability`).
- `fabric.py`: one node's end of both, fed by the node's receive loops.
- `errors.py`, `bounds.py`: every typed failure and every bound, once.

See docs/PROVIDERS.md. This package never imports the transport: the node passes publish
callables in.
"""

from skulk.extensions.providers.client import CapabilityCall, CapabilityClient
from skulk.extensions.providers.contract import CallContext
from skulk.extensions.providers.errors import CapabilityError
from skulk.extensions.providers.fabric import ProviderFabric
from skulk.extensions.providers.registry import ProviderRegistry, registry_from
from skulk.shared.types.providers import CapabilityDescriptor, IoMode

__all__ = [
    "CallContext",
    "CapabilityCall",
    "CapabilityClient",
    "CapabilityDescriptor",
    "CapabilityError",
    "IoMode",
    "ProviderFabric",
    "ProviderRegistry",
    "registry_from",
]
