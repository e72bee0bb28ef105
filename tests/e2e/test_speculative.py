"""Speculative decoding on a real node: a custom card asks for it, the node serves the model
on llama-server with drafting, the OpenAI SDK's answer carries the drafted tokens as
`completion_tokens_details` (accepted and rejected predictions), and `/metrics` counts them.
N-gram drafting on a local model with the native llama-server; draft-model drafting on a hub
model whose draft GGUF the node downloads from the (mock) hub with it, served out of the
box by the bundled llama-server; and an MLX card drafting with an MLX (safetensors) draft
repo, fetched the same way and run beside the target by the MLX engine. That the greedy text
is the undrafted text is shown beside the engines (tests/worker/engines/served/
test_llama_server.py, tests/worker/engines/test_mlx_draft.py)."""

from __future__ import annotations

import httpx
import openai
import pytest

from skulk.models.cards import builtin_cards_dir, write_custom_card
from tests.cluster.harness import start_linked, wait_agreed
from tests.cluster.test_any_architecture import place
from tests.llama_server_kit import require_bundled_server, require_llama_server
from tests.mockhub import (  # noqa: F401
    GGUF_FILE,
    TINY_GGUF_REPO,
    TINY_MLX_REPO,
    hub_card,
    mock_hub,
    tiny_artifacts,
    tiny_repo_files,
)
from tests.worker.tiny_gguf import LONG_PROMPT, tiny_gguf  # noqa: F401

pytestmark = pytest.mark.timeout(300)

MODEL = "local/tiny-ngram"


def speculating_card(gguf) -> str:
    """The tiny GGUF's built-in card as a local-path card that asks for n-gram drafting."""
    text = (builtin_cards_dir() / "local--tiny-llama-gguf.toml").read_text()
    head, _, _ = text.partition("[placement]")
    head = head.replace('model_id = "local/tiny-llama-gguf"', f'model_id = "{MODEL}"')
    head = head.replace('source = "local-generated"', f'source = "local-path"\nlocal_path = "{gguf.parent}"\n'
                                                      f'gguf_file = "{gguf.name}"')
    head = head.replace("storage_size_bytes = 5_270_000", f"storage_size_bytes = {gguf.stat().st_size}")
    return head + ('[placement]\ncompatible_backends = ["llama_server", "llama_server-cpu"]\n\n'
                   '[runtime]\nspeculative = "ngram"\n')


def test_a_speculating_card_drafts_and_the_counts_reach_the_client_and_metrics(spawn_node, tmp_path,
                                                                             tiny_gguf):
    data_dir = tmp_path / "spec"
    (data_dir / "custom_model_cards").mkdir(parents=True)
    (data_dir / "custom_model_cards" / "local--tiny-ngram.toml").write_text(speculating_card(tiny_gguf))
    env = {"SKULK_LLAMA_SERVER_BIN": str(require_llama_server()), "SKULK_MODELS_LOCAL_DIRS": str(tiny_gguf.parent)}
    (node,) = start_linked(lambda name, extra_args: spawn_node(name, data_dir=data_dir, env=env,
                                                               extra_args=extra_args), ["spec"])
    wait_agreed([node], members=1)
    instance_id = place(node, MODEL)
    shards = node.get("/state").json()["instances"][instance_id]["shards"]
    assert [s["backend"].split("-")[0] for s in shards] == ["llama_server"]

    sdk = openai.OpenAI(base_url=node.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    chat = sdk.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": LONG_PROMPT}],
                                       max_tokens=300, temperature=0)
    assert chat.usage.completion_tokens_details is not None
    accepted = chat.usage.completion_tokens_details.accepted_prediction_tokens
    rejected = chat.usage.completion_tokens_details.rejected_prediction_tokens
    assert accepted is not None and rejected is not None and accepted + rejected > 0

    # A request may ask for what the model is served with, and is refused the rest by name.
    asked = sdk.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                        extra_body={"speculative": True})
    assert asked.choices[0].message.content is not None
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.completions.create(model=MODEL, prompt="hi", max_tokens=4, extra_body={"speculative": False})
    assert refused.value.code == "speculative_unsupported" and refused.value.param == "speculative"
    assert "a request cannot turn it off" in refused.value.message

    metrics = httpx.get(node.url + "/metrics", timeout=10).text
    drafted = _counter(metrics, "skulk_speculative_drafted_tokens_total", MODEL)
    kept = _counter(metrics, "skulk_speculative_accepted_tokens_total", MODEL)
    assert drafted >= accepted + rejected and 0 < kept <= drafted, (drafted, kept)


DRAFT_REPO = "mock-org/tiny-llama-draft-GGUF"


def test_a_draft_model_card_fetches_its_draft_and_drafts_with_it(spawn_node, tmp_path, mock_hub, tiny_artifacts):
    gguf = tiny_artifacts.gguf_path.read_bytes()
    mock_hub.add_repo(DRAFT_REPO, {GGUF_FILE: gguf}, tags=("gguf", "llama"))
    base = hub_card(TINY_GGUF_REPO, gguf_file=GGUF_FILE)
    card = type(base).model_validate({
        **base.model_dump(by_alias=False), "storage_size_bytes": len(gguf),
        "served_spec_draft_repo": DRAFT_REPO, "served_spec_draft_file": GGUF_FILE,
        "served_spec_draft_size_bytes": len(gguf), "runtime": {"speculative": "draft"},
        "placement": {"compatible_backends": ["llama_server", "llama_server-cpu"]}})
    data_dir = tmp_path / "draft"
    write_custom_card(data_dir / "custom_model_cards", card)
    require_bundled_server()
    env = {"HF_ENDPOINT": mock_hub.url, "SKULK_LLAMA_SERVER_BIN": "", "SKULK_BUNDLED_LLAMA_SERVER": "1",
           "SKULK_ENGINES_DIR": str(tmp_path / "no-engines-built")}
    (node,) = start_linked(lambda name, extra_args: spawn_node(name, data_dir=data_dir, env=env,
                                                               extra_args=extra_args), ["draft"])
    wait_agreed([node], members=1)
    place(node, TINY_GGUF_REPO)

    sdk = openai.OpenAI(base_url=node.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    chat = sdk.chat.completions.create(model=TINY_GGUF_REPO, messages=[{"role": "user", "content": LONG_PROMPT}],
                                       max_tokens=60, temperature=0)
    details = chat.usage.completion_tokens_details
    assert details is not None and details.accepted_prediction_tokens, details  # the same weights agree
    draft_file = data_dir / "models" / "mock-org--tiny-llama-draft-GGUF" / GGUF_FILE
    assert draft_file.read_bytes() == gguf  # fetched with the model, from the hub
    assert f"speculation draft-simple (draft {data_dir}/staging/mock-org--tiny-llama-draft-GGUF/{GGUF_FILE})" in node.log()
    metrics = httpx.get(node.url + "/metrics", timeout=10).text
    assert _counter(metrics, "skulk_speculative_accepted_tokens_total", TINY_GGUF_REPO) >= \
        details.accepted_prediction_tokens


MLX_DRAFT_REPO = "mock-org/tiny-llama-draft-mlx"


def test_an_mlx_card_drafts_with_an_mlx_draft_model(spawn_node, tmp_path, mock_hub, tiny_artifacts):
    """The tiny model's own weights as its draft, published as a second safetensors repo."""
    mlx_files, _ = tiny_repo_files(tiny_artifacts)
    mock_hub.add_repo(MLX_DRAFT_REPO, mlx_files, tags=("mlx", "safetensors", "llama"))
    base = hub_card(TINY_MLX_REPO)
    card = type(base).model_validate({
        **base.model_dump(by_alias=False), "served_spec_draft_repo": MLX_DRAFT_REPO,
        "served_spec_draft_size_bytes": len(mlx_files["model.safetensors"]), "runtime": {"speculative": "draft"}})
    data_dir = tmp_path / "mlx-draft"
    write_custom_card(data_dir / "custom_model_cards", card)
    env = {"HF_ENDPOINT": mock_hub.url}
    (node,) = start_linked(lambda name, extra_args: spawn_node(name, data_dir=data_dir, env=env,
                                                               extra_args=extra_args), ["mlxdraft"])
    wait_agreed([node], members=1)
    instance_id = place(node, TINY_MLX_REPO)
    shards = node.get("/state").json()["instances"][instance_id]["shards"]
    assert [s["backend"].split("-")[0] for s in shards] == ["mlx"]

    sdk = openai.OpenAI(base_url=node.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    chat = sdk.chat.completions.create(model=TINY_MLX_REPO, messages=[{"role": "user", "content": LONG_PROMPT}],
                                       max_tokens=40, temperature=0)
    assert chat.usage is not None
    details = chat.usage.completion_tokens_details
    assert details is not None and details.accepted_prediction_tokens, details  # the same weights agree
    print(f"MLX own draft on a node: {details.accepted_prediction_tokens} accepted, "
          f"{details.rejected_prediction_tokens} rejected")
    sampled = sdk.chat.completions.create(model=TINY_MLX_REPO, messages=[{"role": "user", "content": "hi"}],
                                          max_tokens=12, temperature=0.9, seed=3, extra_body={"speculative": True})
    assert sampled.usage is not None and sampled.usage.completion_tokens == 12
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.chat.completions.create(model=TINY_MLX_REPO, messages=[{"role": "user", "content": "hi"}],
                                    max_tokens=4, extra_body={"speculative": False})
    assert refused.value.code == "speculative_unsupported" and "is served with draft speculation" in \
        refused.value.message

    draft_dir = data_dir / "models" / "mock-org--tiny-llama-draft-mlx"
    assert (draft_dir / "model.safetensors").read_bytes() == mlx_files["model.safetensors"]  # fetched whole
    assert "speculation draft (draft " in node.log()
    metrics = httpx.get(node.url + "/metrics", timeout=10).text
    assert _counter(metrics, "skulk_speculative_accepted_tokens_total", TINY_MLX_REPO) >= \
        details.accepted_prediction_tokens
    assert _counter(metrics, "skulk_speculative_drafted_tokens_total", TINY_MLX_REPO) >= \
        details.accepted_prediction_tokens + (details.rejected_prediction_tokens or 0)


def _counter(exposition: str, name: str, model: str) -> float:
    for line in exposition.splitlines():
        if line.startswith(name) and f'model="{model}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0
