"""Forming the MLX distributed group of one instance, and keeping it from wedging.

Three things every multi-rank MLX runner needs, kept apart from the model code:

- `ring_addresses` (pure): the "host:port" each rank of an instance listens on, decided from
  the instance alone so every rank computes the same list without talking to anyone.
- `form_group` (shell): `mx.distributed.init(backend="ring")` under a hard deadline. Ring init
  blocks forever (in native code, holding the GIL) when a neighbour never shows up; a Python
  rendezvous on the same ports runs first under the deadline and turns that into
  `GroupFormationFailed` naming the missing rank, so the runner reports a clear reason and the
  worker re-places the instance (a fresh placement is a fresh port).
- `EvalWatchdog` (shell): every collective of a running request is evaluated under a
  deadline. MLX cannot interrupt a blocked `mx.eval`, so on expiry the watchdog ends the
  process with `EXIT_GROUP_WEDGED`: a wedged group must become a dead runner the supervisor
  sees, never a live one that hangs every request behind it.

The control header that rank 0 broadcasts to its followers is here too (`Header`), because it
is the group's protocol, not the model's. This module never loads weights and never touches
the runner's queues. The ring's sockets are plain TCP: tensor traffic is not encrypted.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from skulk.shared.settings import setting
from skulk.shared.types.instances import Instance
from skulk.shared.types.stream_errors import StreamErrorType
from skulk.worker.engines.base import ModelLoadFailed

log = logging.getLogger(__name__)

GROUP_CONNECT_DEADLINE_ENV = "SKULK_GROUP_CONNECT_DEADLINE_SECONDS"
GROUP_CONNECT_DEADLINE_S = 120.0
"""How long a rank waits for the whole ring to connect (the seed's default). Past it the
runner fails its load: an instance that cannot form is re-placed, never left half-joined."""

EVAL_TIMEOUT_ENV = "SKULK_PIPELINE_EVAL_TIMEOUT_SECONDS"
EVAL_TIMEOUT_S = 60.0
"""Longest one guarded evaluation (a forward step plus its sends/receives, or a control
broadcast) may take before the group counts as wedged. Generous: a cold first prefill of a
large shard on a slow machine must not trip it; raise it with the env var if it does."""

EXIT_GROUP_WEDGED = 4
"""Runner exit code when a guarded evaluation outlives its deadline or the group breaks."""

WATCHDOG_TICK_S = 0.1
"""How often the watchdog thread checks its deadline: bounds how late it fires."""

LOOPBACK_HOST = "127.0.0.1"

RING_PORT_BASE = 40000
RING_PORT_SPAN = 20000
"""Ports derived for same-node groups come from [BASE, BASE + SPAN): below Linux's default
ephemeral range (32768-60999 overlaps it partly, so a clash is possible; it then fails the
group within its deadline and the re-placement draws another port)."""

MAX_RING_WORLD = 16
"""Ranks per derived port block: each placement gets MAX_RING_WORLD consecutive ports."""


class GroupFormationFailed(ModelLoadFailed):
    """The ring did not connect (deadline, refused bind, or no usable addresses)."""

    error_type = StreamErrorType.GROUP_FORMATION_FAILED


# ---------------------------------------------------------------------------------------
# Addresses (pure)
# ---------------------------------------------------------------------------------------


def derived_port_block(instance: Instance) -> int:
    """The first port of this placement's block. A function of the instance id and repair
    hop only, so every rank derives the same ports, and every fresh placement (a new
    instance id, or the next repair hop) a fresh block."""
    blocks = RING_PORT_SPAN // MAX_RING_WORLD
    digest = zlib.crc32(f"{instance.instance_id}/{instance.repair_hop}".encode())
    return RING_PORT_BASE + (digest % blocks) * MAX_RING_WORLD


def _split_host_port(entry: str) -> tuple[str, int | None]:
    host, sep, port = entry.rpartition(":")
    if sep and port.isdigit() and host and not host.endswith(":"):
        return host.strip("[]"), int(port)
    return entry.strip("[]"), None


def ring_addresses(instance: Instance) -> list[str]:
    """Each rank's "host:port", in rank order; [] for a single-rank instance.

    Rules, first match wins:
    1. One rank: no group.
    2. `ring_hosts` names every rank: use it; an entry without a port gets the derived port
       of its rank (placement may choose hosts and leave ports to the runners).
    3. No `ring_hosts` and every rank on one node: loopback, derived ports.
    4. Otherwise the placement did not say how the nodes reach each other: refuse."""
    world = len(instance.shards)
    if world == 1:
        return []
    if world > MAX_RING_WORLD:
        raise GroupFormationFailed(f"world size {world} exceeds the ring limit {MAX_RING_WORLD}")
    base = derived_port_block(instance)
    if instance.ring_hosts:
        if len(instance.ring_hosts) != world:
            raise GroupFormationFailed(
                f"instance {instance.instance_id} has {len(instance.ring_hosts)} ring hosts for {world} ranks"
            )
        out = []
        for rank, entry in enumerate(instance.ring_hosts):
            host, port = _split_host_port(entry)
            out.append(f"{host}:{port if port is not None else base + rank}")
        if len(set(out)) != world:
            raise GroupFormationFailed(f"ring addresses are not distinct: {out}")
        return out
    if len(set(instance.node_ids())) == 1:
        return [f"{LOOPBACK_HOST}:{base + rank}" for rank in range(world)]
    raise GroupFormationFailed(
        f"instance {instance.instance_id} spans nodes {sorted(set(instance.node_ids()))} "
        "but carries no ring_hosts: placement must choose the ring addresses"
    )


def hostfile_json(addresses: Sequence[str]) -> str:
    """MLX's ring hostfile: one list of addresses per rank (one connection each)."""
    return json.dumps([[address] for address in addresses])


def seconds_from_env(env: Mapping[str, str], name: str, default: float) -> float:
    """A positive number of seconds from `env[name]`, else `default` (bad values logged)."""
    raw = setting(name, env)
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        log.warning("%s=%r is not a number; using %s", name, raw, default)
        return default
    if value <= 0:
        log.warning("%s=%r is not positive; using %s", name, raw, default)
        return default
    return value


# ---------------------------------------------------------------------------------------
# Control header (pure): what rank 0 tells every rank before each collective step
# ---------------------------------------------------------------------------------------

OP_BEGIN = 1
"""A new request: sampling parameters follow in the header; every rank starts a fresh cache."""
OP_STEP = 2
"""One forward step over `n_tokens` inputs; `sample` says whether the last stage samples."""
OP_END = 3
"""The request is over (finished, cancelled or failed on rank 0): drop its cache."""
OP_SHUTDOWN = 4
"""Rank 0 is closing: followers leave their loop."""

HEADER_LEN = 8


@dataclass(frozen=True)
class Header:
    """A fixed-size int32 message; floats travel as their IEEE-754 bits so the all_sum that
    broadcasts it (only rank 0 contributes non-zeros) is exact."""

    op: int
    n_tokens: int = 0
    sample: bool = False
    tokens_follow: bool = False
    seed: int = 0
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0

    def encode(self) -> list[int]:
        import struct

        def bits(value: float) -> int:
            return struct.unpack("<i", struct.pack("<f", value))[0]

        flags = (1 if self.sample else 0) | (2 if self.tokens_follow else 0)
        return [self.op, self.n_tokens, flags, self.seed & 0x7FFFFFFF, bits(self.temperature),
                bits(self.top_p), self.top_k, bits(self.min_p)]

    @staticmethod
    def decode(values: Sequence[int]) -> Header:
        import struct

        def real(value: int) -> float:
            return struct.unpack("<f", struct.pack("<i", int(value)))[0]

        op, n_tokens, flags, seed, temperature, top_p, top_k, min_p = (int(v) for v in values)
        return Header(op, n_tokens, bool(flags & 1), bool(flags & 2), seed, real(temperature), real(top_p), top_k,
                      real(min_p))


# ---------------------------------------------------------------------------------------
# Shell: forming the group, guarding evaluations
# ---------------------------------------------------------------------------------------


RENDEZVOUS_POLL_S = 0.2
"""How long one rendezvous accept or connect attempt waits before the loop re-checks its
deadline."""

RING_INIT_MIN_S = 10.0
"""Least time left for `mx.distributed.init` after the rendezvous, however late it ended."""


def _endpoint(address: str) -> tuple[str, int]:
    host, port = _split_host_port(address)
    if port is None:
        raise GroupFormationFailed(f"ring address {address!r} has no port")
    return host, port


class _Lines:
    """Newline-framed messages on one rendezvous socket, read under a deadline."""

    def __init__(self, sock: Any) -> None:
        self.sock = sock
        self._buffer = b""
        sock.settimeout(RENDEZVOUS_POLL_S)

    def send(self, text: str) -> None:
        self.sock.sendall(text.encode() + b"\n")

    def read(self, deadline_at: float) -> str | None:
        """The next line; None at end of stream or when the deadline passes."""
        while b"\n" not in self._buffer:
            if time.monotonic() > deadline_at:
                return None
            try:
                chunk = self.sock.recv(256)
            except TimeoutError:
                continue
            except OSError:
                return None
            if not chunk:
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode(errors="replace")

    def wait_closed(self, deadline_at: float) -> None:
        while time.monotonic() < deadline_at:
            try:
                if not self.sock.recv(256):
                    return
            except TimeoutError:
                continue
            except OSError:
                return

    def close(self) -> None:
        self.sock.close()


def rendezvous(addresses: Sequence[str], rank: int, deadline_s: float, tag: str) -> None:
    """Wait (at most `deadline_s`) until both ring neighbours are up and have let go of
    their ports.

    MLX's ring init cannot be bounded from Python: it blocks in native code holding the GIL,
    so no Python thread or signal runs until it returns. This handshake runs first, in
    Python and under the deadline, on the very ports the ring will use:

    1. each rank listens on its own address, connects to its right neighbour (sending
       "tag/rank") and accepts its left one (checking its "tag/rank");
    2. it closes its listener and says so to both neighbours, then waits to hear the same
       from both: from then on no neighbour's rendezvous listener can swallow the ring's own
       connection (which would leave init waiting forever);
    3. the connecting side of each pair closes first, so no ring port is left in TIME_WAIT.

    Only then does the rank call init, which connects in moments."""
    import socket

    deadline_at = time.monotonic() + deadline_s
    world = len(addresses)
    right, left = (rank + 1) % world, (rank - 1) % world
    expected = f"{tag}/{left}"
    try:
        listener = socket.create_server(_endpoint(addresses[rank]))
    except OSError as exc:
        raise GroupFormationFailed(f"rank {rank} cannot listen on {addresses[rank]}: {exc}") from exc
    listener.settimeout(RENDEZVOUS_POLL_S)
    to_right: _Lines | None = None
    from_left: _Lines | None = None

    def fail(what: str) -> GroupFormationFailed:
        return GroupFormationFailed(f"rank {rank} could not form the ring {list(addresses)}: {what} within {deadline_s:g}s")

    try:
        with contextlib.ExitStack() as closing:
            while to_right is None or from_left is None:
                if time.monotonic() > deadline_at:
                    missing = [f"rank {right} at {addresses[right]}"] if to_right is None else []
                    if from_left is None and (to_right is not None or left != right):
                        missing.append(f"rank {left} (connecting to {addresses[rank]})")
                    raise fail(f"no answer from {' or '.join(missing)}")
                if to_right is None:
                    try:
                        conn = socket.create_connection(_endpoint(addresses[right]), timeout=RENDEZVOUS_POLL_S)
                    except OSError:
                        time.sleep(RENDEZVOUS_POLL_S / 2)
                    else:
                        to_right = _Lines(conn)
                        closing.callback(to_right.close)
                        to_right.send(f"{tag}/{rank}")
                if from_left is None:
                    try:
                        conn, _ = listener.accept()
                    except (TimeoutError, OSError):
                        continue
                    candidate = _Lines(conn)
                    hello = candidate.read(min(deadline_at, time.monotonic() + RENDEZVOUS_POLL_S * 10))
                    if hello == expected:
                        from_left = candidate
                        closing.callback(from_left.close)
                    else:
                        log.warning("rank %d: unexpected rendezvous hello %r (want %r)", rank, hello, expected)
                        candidate.close()
            listener.close()
            for peer in (to_right, from_left):
                peer.send("closed")
            for name, peer in (("right", to_right), ("left", from_left)):
                if peer.read(deadline_at) != "closed":
                    raise fail(f"the {name} neighbour did not finish the rendezvous")
            to_right.close()  # the connecting side closes first: no TIME_WAIT on ring ports
            from_left.wait_closed(deadline_at)
    finally:
        listener.close()


def form_group(addresses: Sequence[str], rank: int, deadline_s: float, tag: str = "skulk") -> Any:
    """Join the ring as `rank`; returns the mx.distributed.Group.

    Raises `GroupFormationFailed` when a neighbour does not show up within `deadline_s` (the
    rendezvous). Should the native init itself then stall (a neighbour that vanished right
    after answering, a failed post-TCP handshake), a native timer (faulthandler) dumps the
    stack and exits the process with code 1: nothing in Python can interrupt init.
    MLX reads the rank and hostfile from the environment once per process; a runner process
    hosts exactly one rank, so setting them here is safe."""
    import faulthandler

    import mlx.core as mx

    started = time.monotonic()
    rendezvous(addresses, rank, deadline_s, tag)
    with tempfile.NamedTemporaryFile("w", prefix="skulk-ring-", suffix=".json", delete=False) as f:
        f.write(hostfile_json(addresses))
        hostfile = f.name
    os.environ["MLX_RANK"] = str(rank)
    os.environ["MLX_HOSTFILE"] = hostfile
    remaining = max(RING_INIT_MIN_S, deadline_s - (time.monotonic() - started))
    log.info("rank %d: neighbours answered; joining ring %s (native init, hard limit %.0fs)", rank,
             list(addresses), remaining)
    faulthandler.dump_traceback_later(remaining, exit=True)
    try:
        group = mx.distributed.init(strict=True, backend="ring")
    except Exception as exc:
        raise GroupFormationFailed(f"rank {rank} failed to join the ring {list(addresses)}: {exc}") from exc
    finally:
        faulthandler.cancel_dump_traceback_later()
        try:
            os.unlink(hostfile)
        except OSError:
            pass
    if group.size() != len(addresses) or group.rank() != rank:
        raise GroupFormationFailed(
            f"ring formed as rank {group.rank()} of {group.size()}, expected {rank} of {len(addresses)}"
        )
    log.info("rank %d joined ring %s in %.2fs", rank, list(addresses), time.monotonic() - started)
    return group


def _die_wedged(reason: str) -> None:
    log.critical("%s; exiting with code %d", reason, EXIT_GROUP_WEDGED)
    try:
        sys.stderr.flush()
    finally:
        os._exit(EXIT_GROUP_WEDGED)


class EvalWatchdog:
    """Deadline for the evaluation in progress. `guard(label)` arms it around a blocking
    evaluation; one background thread checks the deadline every WATCHDOG_TICK_S and calls
    `on_expiry` (by default: log and exit the process) when an armed guard outlives it.
    Guards do not nest: one thread drives a rank's collectives."""

    def __init__(self, timeout_s: float, on_expiry: Callable[[str], None] = _die_wedged) -> None:
        self.timeout_s = timeout_s
        self._on_expiry = on_expiry
        self._lock = threading.Lock()
        self._armed: tuple[float, str] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="mlx-eval-watchdog", daemon=True)
        self._thread.start()

    @contextmanager
    def guard(self, label: str, timeout_s: float | None = None) -> Iterator[None]:
        limit = self.timeout_s if timeout_s is None else timeout_s
        with self._lock:
            self._armed = (time.monotonic() + limit, f"{label} did not complete within {limit:g}s")
        try:
            yield
        finally:
            with self._lock:
                self._armed = None

    def close(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        while not self._stop.wait(WATCHDOG_TICK_S):
            with self._lock:
                armed = self._armed
            if armed is not None and time.monotonic() > armed[0]:
                with self._lock:
                    self._armed = None
                self._on_expiry(armed[1])


__all__ = [
    "EVAL_TIMEOUT_ENV",
    "EVAL_TIMEOUT_S",
    "EXIT_GROUP_WEDGED",
    "GROUP_CONNECT_DEADLINE_ENV",
    "GROUP_CONNECT_DEADLINE_S",
    "HEADER_LEN",
    "OP_BEGIN",
    "OP_END",
    "OP_SHUTDOWN",
    "OP_STEP",
    "EvalWatchdog",
    "GroupFormationFailed",
    "Header",
    "derived_port_block",
    "form_group",
    "hostfile_json",
    "rendezvous",
    "ring_addresses",
    "seconds_from_env",
]
