"""Wire constants of the cluster transport: the network version and the key-expression layout.

`NETWORK_VERSION` names the wire protocol of this build. It is bound into the wire key (see
`cluster_key.derive_wire_key`) and into every key expression, so two builds whose wire
behaviour differs cannot read each other's traffic: they are counted and logged as rejects,
never half-joined. Bump it in the same change as anything that alters what goes on the wire
(envelope layout, key-expression layout, payload framing, presence token shape, QoS).

This module must never import zenoh or do I/O: it is plain data shared by pure code.
"""

from __future__ import annotations

import re
from typing import Final

NETWORK_VERSION: Final = "skulk-net-6"
# 2: presence tokens must answer proof challenges (routing/presence.py); a build without
# them would never count as alive, so it is told apart as another version instead.
# 3: messages gained fields (KV cache type and speculation counts, a turn's continuation,
# the build's commit); a model that forbids unknown fields would refuse them from a newer
# build, so builds told apart by version instead. tests/routing/test_wire_version.py pins
# the payload schemas to this name.
# 4: NodeResources carries the node's serving counters and runner load (`serving`), which
# the dashboard charts over time, and its hardware class (`hardware_class`, for opted-in
# field telemetry); NodeFacts carries a Mac's chip name (`cpu_brand`).
# 5: model cards lost the inert `mtp_sidecar_repo` / `assistant_model_repo` and gained the
# draft model's size (`served_spec_draft_size_bytes`) and `runtime.speculative = "draft"`;
# NodeResources carries the capability tags the node's extensions advertise
# (`capability_tags`, skulk.extensions.capability_tags); providers' calls and data travel
# on two new node-addressed topics (`provider_calls`, `provider_data`); chat messages carry
# images (`ChatMessage.images`, base64 in a request's full params on the data plane).
# 6: speech: cards gained tasks Transcription / SpeechSynthesis, capabilities stt / tts and
# an `audio` section and `onnx_file` (a Piper voice in a hub repo); the workload unions carry
# transcription and speech params and results
# (the audio, base64 with its SHA-256, in a request's full params on the data plane);
# a request's input crosses in chunks (`task_inputs` carries TaskInputChunk, answered on
# `task_input_acks`); a leader's announcement carries its last index (`high_water_idx`);
# cards carry their projector's size (`vision_weights_size_bytes`).

# Every key expression this build publishes or subscribes to starts with this prefix.
KEY_ROOT: Final = "skulk"

# Reserved key segment for liveliness (presence) tokens; no topic may use it as a name.
PRESENCE_SEGMENT: Final = "presence"

# Node ids, session ids and topic names become single key-expression chunks, so they must not
# contain '/', wildcards ('*', '$'), selector characters ('?', '#') or whitespace. A leading
# '@' would make a zenoh "verbatim" chunk, so the first character is further restricted.
MAX_ID_CHARS: Final = 128
ID_PATTERN: Final = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}")


def key_prefix(network_version: str = NETWORK_VERSION) -> str:
    """`skulk/<NETWORK_VERSION>`: the root under which this build's traffic lives."""
    return f"{KEY_ROOT}/{network_version}"


def is_valid_id(value: str) -> bool:
    """True when `value` can be used as one key-expression chunk (node id, session id, topic)."""
    return isinstance(value, str) and ID_PATTERN.fullmatch(value) is not None


def check_id(kind: str, value: str) -> str:
    """Return `value` or raise ValueError naming what was wrong with it."""
    if not is_valid_id(value):
        raise ValueError(
            f"invalid {kind} {value!r}: expected 1-{MAX_ID_CHARS} characters of "
            "[A-Za-z0-9_.-], not starting with '.' or '-'"
        )
    return value


def topic_key(topic_name: str, node_id: str | None = None, *, network_version: str = NETWORK_VERSION) -> str:
    """Key expression of a topic: `skulk/<ver>/<topic>` or `skulk/<ver>/<topic>/<node>`."""
    base = f"{key_prefix(network_version)}/{topic_name}"
    return base if node_id is None else f"{base}/{node_id}"


def presence_root(network_version: str = NETWORK_VERSION) -> str:
    """Key expression under which presence (liveliness) tokens are declared."""
    return f"{key_prefix(network_version)}/{PRESENCE_SEGMENT}"
