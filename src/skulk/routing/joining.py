"""The joining side of an invite: redeem a token, keep the key, remember the peers.

`skulk run --join TOKEN` (or `--join -` from stdin, or `--join-file`) calls `join_cluster`
before the node starts: it proves the token at the inviting node's API (each endpoint the
token carries, in order, each with a deadline), unwraps the cluster key with the release it
gets, writes the key to the data dir's `cluster.key` (0600; a different key already there is
kept beside it as `cluster.key.replaced`, never silently lost), and writes the inviter's
transport endpoints to `joined.json`, the bootstrap peers of this and every later start that
gives none. From then on the node starts with no key and no peers typed.

Nothing here logs or prints a token, a proof, a release or a key.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, get_args

import httpx

from skulk.datadir.atomic_file import write_atomic
from skulk.datadir.secret_file import SecretFileError, read_secret_file
from skulk.routing.cluster_key import CLUSTER_KEY_FILE
from skulk.routing.join_token import JoinToken, decode_release, decode_token, open_token, proof_of
from skulk.shared.types.invites import InviteRefusalReason, InviteRefused, JoinRequest

log = logging.getLogger(__name__)

JOINED_FILE: Final = "joined.json"
REPLACED_KEY_SUFFIX: Final = ".replaced"
JOIN_PATH: Final = "/v1/cluster/join"
ENDPOINT_TIMEOUT_S: Final = 10.0
"""Deadline of one redemption attempt (connect included); the next endpoint is tried after."""
CONNECT_TIMEOUT_S: Final = 4.0
CLOCK_SLACK_S: Final = 300.0
"""A token is refused locally as expired only this far past its expiry (the inviting node's
clock decides otherwise: machines' clocks differ)."""
MAX_TOKEN_INPUT_BYTES: Final = 16 * 1024

Post = Callable[[str, dict[str, Any]], tuple[int, dict[str, Any]]]
"""POST a JSON body to a URL: (status, JSON body); raises `OSError`/`httpx.HTTPError` when
the endpoint cannot be reached."""

_REASONS: Final[frozenset[str]] = frozenset(get_args(InviteRefusalReason))


@dataclass(frozen=True)
class Joined:
    cluster_key: str = field(repr=False)
    invite_id: str
    peers: tuple[str, ...]
    inviter: str
    """The API endpoint that admitted this node."""


def read_token(value: str | None, file: Path | None, stdin: Callable[[], str]) -> str | None:
    """The token text from `--join` (`-`: standard input) or `--join-file`; None when neither."""
    if value is not None and file is not None:
        raise InviteRefused("conflict", "give the token once: --join or --join-file, not both")
    if file is not None:
        try:
            with file.open(encoding="utf-8") as handle:
                return handle.read(MAX_TOKEN_INPUT_BYTES)
        except (OSError, UnicodeDecodeError) as exc:
            raise InviteRefused("malformed", f"cannot read the join token file {file}: {exc}") from None
    if value == "-":
        return stdin()[:MAX_TOKEN_INPUT_BYTES]
    return value


def http_post(url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    timeout = httpx.Timeout(ENDPOINT_TIMEOUT_S, connect=CONNECT_TIMEOUT_S)
    response = httpx.post(url, json=body, timeout=timeout, follow_redirects=False)
    try:
        parsed = response.json()
    except ValueError:
        parsed = {}
    return response.status_code, parsed if isinstance(parsed, dict) else {}


def _refusal(status: int, body: dict[str, Any]) -> InviteRefused | None:
    """The inviting node's typed refusal (`code: invite_<reason>`), or None for any other answer."""
    code = str(body.get("code") or "")
    reason = code.removeprefix("invite_")
    if 400 <= status < 500 and code.startswith("invite_") and reason in _REASONS:
        reason_typed: InviteRefusalReason = reason  # pyright: ignore[reportAssignmentType]
        return InviteRefused(reason_typed, str(body.get("detail") or code))
    return None


def redeem(token: JoinToken, node_name: str, now: float, post: Post = http_post) -> Joined:
    """Prove `token` at the inviting node and open the key it carries."""
    if now > token.expires_at + CLOCK_SLACK_S:
        raise InviteRefused("expired", f"this invite expired {int(now - token.expires_at)} s ago; "
                                       "ask for a new one with `skulk cluster invite`")
    request = JoinRequest(invite_id=token.invite_id, proof=proof_of(token),
                          node_name=node_name[:128]).to_wire()
    failures: list[str] = []
    for endpoint in token.api_endpoints:
        url = endpoint.rstrip("/") + JOIN_PATH
        try:
            status, body = post(url, request)
        except (OSError, httpx.HTTPError) as exc:
            failures.append(f"{endpoint}: {type(exc).__name__}")
            continue
        refused = _refusal(status, body)
        if refused is not None:
            raise refused
        if status != 200 or not isinstance(body.get("release"), str):
            failures.append(f"{endpoint}: HTTP {status}")
            continue
        key = open_token(token, decode_release(body["release"]))
        return Joined(cluster_key=key, invite_id=token.invite_id, peers=token.peers, inviter=endpoint)
    raise InviteRefused("unreachable", "no endpoint of the inviting node answered ("
                        + "; ".join(failures) + "); is it running, and reachable from this machine?")


def store_joined(data_home: Path, joined: Joined) -> bool:
    """Keep the key and the peers in the data dir. Returns whether a different key that was
    there is now kept aside as `cluster.key.replaced`."""
    data_home.mkdir(parents=True, exist_ok=True)
    key_path = data_home / CLUSTER_KEY_FILE
    replaced = False
    if key_path.exists():
        try:
            previous = read_secret_file(key_path, "cluster key")
        except SecretFileError:
            previous = None
        if previous != joined.cluster_key:
            key_path.replace(key_path.with_name(CLUSTER_KEY_FILE + REPLACED_KEY_SUFFIX))
            replaced = True
    if not key_path.exists():
        write_atomic(key_path, joined.cluster_key + "\n")  # mkstemp: created 0600
    record = {"inviteId": joined.invite_id, "inviter": joined.inviter, "bootstrapPeers": list(joined.peers),
              "joinedAt": time.time()}
    write_atomic(data_home / JOINED_FILE, json.dumps(record, indent=2) + "\n")
    return replaced


def _joined_record(data_home: Path) -> dict[str, Any]:
    try:
        record = json.loads((data_home / JOINED_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def joined_peers(data_home: Path) -> tuple[str, ...]:
    """The bootstrap peers a join remembered (none: never joined, or the file is unreadable)."""
    peers = _joined_record(data_home).get("bootstrapPeers")
    return tuple(p for p in peers if isinstance(p, str)) if isinstance(peers, list) else ()


def join_cluster(token_text: str, data_home: Path, node_name: str, post: Post = http_post) -> Joined | None:
    """Decode, redeem and store: what `skulk run --join` does before the node starts. A
    token this data dir already joined with is not redeemed again (None): a restart that
    still passes `--join` (a service's command line, SKULK_JOIN_TOKEN left set) just starts."""
    token = decode_token(token_text)
    if _joined_record(data_home).get("inviteId") == token.invite_id and (data_home / CLUSTER_KEY_FILE).exists():
        log.info("this data dir joined through invite %s already; starting with its key", token.invite_id)
        return None
    joined = redeem(token, node_name, time.time(), post)
    if store_joined(data_home, joined):
        log.warning("joined a cluster: the key this data dir held before is kept in %s%s",
                    CLUSTER_KEY_FILE, REPLACED_KEY_SUFFIX)
    log.info("joined the cluster through invite %s at %s; bootstrap peers %s", joined.invite_id, joined.inviter,
             ", ".join(joined.peers) or "none (multicast)")
    return joined


__all__ = ["JOINED_FILE", "Joined", "join_cluster", "joined_peers", "read_token", "redeem", "store_joined"]
