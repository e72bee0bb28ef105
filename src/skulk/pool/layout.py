"""Pure decisions for a llama.cpp pool: device split, ports, addresses and keys.

Placement gives every rank a contiguous layer range, rank 0 first. llama.cpp assigns
layers to devices differently: layers before `n_layer + 1 - n_gpu_layers` stay on the host
CPU, the rest (plus the output layer, index n_layer) go to the model's device list in
proportion to `tensor_split`. So a CPU driver keeps its own range on the CPU by offloading
exactly the donors' layers plus the output layer, and a split weighted by each donor's layer
count (the last donor also takes the output layer) reproduces placement's ranges exactly
(`device_split`). A driver with its own accelerator puts that device first instead.
"""

from __future__ import annotations

import hashlib
import hmac
import zlib
from dataclasses import dataclass

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from skulk.shared.types.ids import NodeId
from skulk.shared.types.instances import Instance, ShardAssignment

POOL_PORT_BASE = 30000
POOL_PORT_SPAN = 10000
"""Donor channel ports come from [30000, 40000), below MLX's ring block, one block of
MAX_POOL_WORLD ports per placement, derived from the instance id and repair hop (so every
rank derives the same port and a re-placement gets a fresh one)."""
MAX_POOL_WORLD = 16
"""ggml's RPC backend takes at most GGML_RPC_MAX_SERVERS (16) servers."""

LOOPBACK_HOST = "127.0.0.1"

_POOL_KEY_SALT = b"skulk/cluster-key/v1"
_POOL_KEY_INFO = b"skulk llama.cpp pool channel|v1"


class PoolLayoutError(Exception):
    """The instance does not describe a usable pool (a placement bug or a hand-made one)."""


@dataclass(frozen=True)
class DeviceSplit:
    """What the driver passes llama.cpp: its device list is (own accelerator if any, then
    one RPC device per donor in rank order)."""

    n_gpu_layers: int
    tensor_split: tuple[float, ...]


def is_pooled(instance: Instance) -> bool:
    return len(instance.shards) > 1


def device_split(shards: list[ShardAssignment] | tuple[ShardAssignment, ...], num_layers: int,
                 driver_device: bool = False) -> DeviceSplit:
    """n_gpu_layers and tensor_split reproducing `shards`' layer ranges (see module doc).
    `driver_device`: the driver offloads its own range to its accelerator (first device)."""
    ordered = sorted(shards, key=lambda s: s.rank)
    if len(ordered) < 2:
        raise PoolLayoutError("a pool needs a driver and at least one donor")
    start = 0
    for shard in ordered:
        if shard.start_layer != start:
            raise PoolLayoutError(f"rank {shard.rank} starts at layer {shard.start_layer}, expected {start}")
        start = shard.end_layer
    if start != num_layers:
        raise PoolLayoutError(f"the ranks cover {start} of {num_layers} layers")
    counts = [s.end_layer - s.start_layer for s in ordered]
    counts[-1] += 1  # the output layer goes with the last device
    if driver_device:
        return DeviceSplit(n_gpu_layers=num_layers + 1, tensor_split=tuple(float(c) for c in counts))
    return DeviceSplit(n_gpu_layers=num_layers + 1 - counts[0], tensor_split=tuple(float(c) for c in counts[1:]))


def pool_port(instance: Instance, rank: int) -> int:
    """The port of rank `rank`'s donor channel (rank 0, the driver, listens on none)."""
    if not 0 < rank < MAX_POOL_WORLD:
        raise PoolLayoutError(f"rank {rank} has no donor port (pool world limit {MAX_POOL_WORLD})")
    blocks = POOL_PORT_SPAN // MAX_POOL_WORLD
    digest = zlib.crc32(f"pool/{instance.instance_id}/{instance.repair_hop}".encode())
    return POOL_PORT_BASE + (digest % blocks) * MAX_POOL_WORLD + rank


def donor_host(instance: Instance, rank: int) -> str:
    """The host a donor's channel listens on and its driver dials: placement's ring host for
    the rank; loopback when every rank is on one node. Refused otherwise (never a guess)."""
    if instance.ring_hosts:
        if len(instance.ring_hosts) != len(instance.shards):
            raise PoolLayoutError(f"{len(instance.ring_hosts)} ring hosts for {len(instance.shards)} ranks")
        return instance.ring_hosts[rank]
    if len(set(instance.node_ids())) == 1:
        return LOOPBACK_HOST
    raise PoolLayoutError(
        f"instance {instance.instance_id} spans nodes {sorted(set(instance.node_ids()))} but placement "
        "stamped no addresses for them (their network reports had not arrived); re-place it"
    )


@dataclass(frozen=True)
class Donor:
    rank: int
    node_id: NodeId
    host: str
    port: int


def donors(instance: Instance) -> list[Donor]:
    if len(instance.shards) > MAX_POOL_WORLD:
        raise PoolLayoutError(f"a pool of {len(instance.shards)} ranks exceeds ggml's limit of {MAX_POOL_WORLD}")
    return [Donor(s.rank, s.node_id, donor_host(instance, s.rank), pool_port(instance, s.rank))
            for s in sorted(instance.shards, key=lambda s: s.rank) if s.rank > 0]


def derive_pool_key(cluster_key: str) -> bytes:
    """The cluster's pool channel secret: HKDF-SHA256 of the cluster key under its own info
    string, so it reveals nothing of the key, the wire key or the peer token."""
    key = cluster_key.strip()
    if not key:
        raise ValueError("cluster key is empty")
    hkdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=_POOL_KEY_SALT, info=_POOL_KEY_INFO)
    return hkdf.derive(key.encode("utf-8"))


def channel_key(pool_key: bytes, instance: Instance, rank: int) -> bytes:
    """The secret of one donor's channel: bound to the instance, repair hop and rank, so a
    transcript for one pool (or one donor) is worthless against another."""
    label = f"{instance.instance_id}/{instance.repair_hop}/{rank}".encode()
    return hmac.new(pool_key, label, hashlib.sha256).digest()


__all__ = [
    "LOOPBACK_HOST",
    "MAX_POOL_WORLD",
    "POOL_PORT_BASE",
    "POOL_PORT_SPAN",
    "DeviceSplit",
    "Donor",
    "PoolLayoutError",
    "channel_key",
    "derive_pool_key",
    "device_split",
    "donor_host",
    "donors",
    "is_pooled",
    "pool_port",
]
