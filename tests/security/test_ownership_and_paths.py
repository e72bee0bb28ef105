"""Requests belong to whoever made them, and `/models/add` reads only where it may.

Before: `/v1/cancel/{id}` cancelled any request whose id it could find in `/state` (which
listed every task), and `/models/add` built a card from any path the node could read,
answering with what was there (and replaced a built-in card for the whole cluster when given
its id). Driven in-process through the real middleware, with client addresses chosen per
request."""

from __future__ import annotations

import asyncio

import httpx

from skulk.api.access import AccessPolicy
from skulk.api.app import ApiContext, create_app
from skulk.api.streams import CommandStreams
from skulk.models.cards import builtin_cards_dir, load_card
from tests.api.test_model_cards_routes import Cluster as CardCluster
from tests.api.test_openai_routes import CHAT, HANG_GUARD_S, STATE, FakeCluster, until
from tests.mockhub import tiny_artifacts  # noqa: F401 - fixture

KEY, OP = "inference-key", "operator-key"
POLICY = AccessPolicy(api_key=KEY, operator_key=OP)


def _client(app, address: str, key: str | None = None) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app, client=(address, 5000)),
                             base_url="http://skulk", headers=headers)


async def test_only_the_requester_cancels_its_request():
    streams = CommandStreams()
    cluster = FakeCluster(streams, "hang")
    app = create_app(ApiContext(node_id="n1", node_name="one", get_state=lambda: STATE,
                                get_master=lambda: ("n1", "s1"), submit_command=cluster.submit,
                                hold_input=cluster.hold_input, streams=streams, access=POLICY))
    async with _client(app, "10.1.1.5", KEY) as owner, _client(app, "127.0.0.1") as local, \
            _client(app, "10.1.1.6", OP) as operator:
        pending = asyncio.create_task(owner.post("/v1/chat/completions", json=CHAT))
        await until(lambda: bool(cluster.commands) and streams.stats()["deliveredFrames"] == 3)
        command_id = cluster.command_id
        # A loopback client is another requester: same 404 as an unknown id, nothing cancelled.
        other = await local.post(f"/v1/cancel/{command_id}")
        assert other.status_code == 404 and other.json()["error"]["code"] == "unknown_command"
        assert not pending.done() and streams.is_open(command_id)
        mine = await owner.post(f"/v1/cancel/{command_id}")
        assert mine.status_code == 200 and mine.json()["ownedHere"] is True
        assert (await asyncio.wait_for(pending, timeout=HANG_GUARD_S)).status_code == 499
        # The operator key may cancel anything known (here: nothing is left open).
        gone = await operator.post(f"/v1/cancel/{command_id}")
        assert gone.status_code == 404


BUILTIN = load_card(builtin_cards_dir() / "local--tiny-llama-gguf.toml")


def _cards_app(roots) -> tuple:
    cluster = CardCluster()
    context = ApiContext(node_id="n1", node_name="one", get_state=lambda: cluster.state,
                         submit_command=cluster.submit,
                         get_cards=lambda: {BUILTIN.model_id: BUILTIN, **cluster.state.custom_cards},
                         local_model_dirs=tuple(roots), access=POLICY)
    return create_app(context), cluster


async def test_models_add_reads_only_allowed_dirs_and_never_lists(tiny_artifacts, tmp_path):
    builtin = BUILTIN
    allowed = tiny_artifacts.gguf_path.parent
    app, cluster = _cards_app([allowed])
    secret_dir = tmp_path / "private"
    secret_dir.mkdir()
    (secret_dir / "weights-of-someone.gguf").write_bytes(b"GGUF")
    async with _client(app, "10.1.1.6", OP) as operator, _client(app, "10.1.1.5", KEY) as user:
        # Outside the allowed dirs: one refusal, whether the path exists or not, listing nothing.
        for path in ("/etc", "/etc/passwd", "/nonexistent/x.gguf", str(secret_dir), str(allowed / ".." / "..")):
            refused = await operator.post("/models/add", json={"path": path})
            assert refused.status_code == 403 and refused.json()["code"] == "path_not_allowed", (path, refused.text)
            assert "weights-of-someone" not in refused.text and "passwd" not in refused.json()["detail"]
        # Inside: a directory that is not an MLX folder is refused without a listing.
        directory = await operator.post("/models/add", json={"path": str(allowed)})
        assert directory.status_code == 400 and "model.gguf" not in directory.text
        # A built-in id is never replaced silently; an operator can, explicitly.
        clash = await operator.post("/models/add", json={"path": str(tiny_artifacts.gguf_path),
                                                         "modelId": builtin.model_id})
        assert clash.status_code == 409 and clash.json()["code"] == "card_exists"
        assert builtin.model_id not in cluster.state.custom_cards
        # Only the operator key adds cards at all.
        assert (await user.post("/models/add", json={"path": str(tiny_artifacts.gguf_path)})).status_code == 403
        added = await operator.post("/models/add", json={"path": str(tiny_artifacts.gguf_path)})
        assert added.status_code == 200, added.text
