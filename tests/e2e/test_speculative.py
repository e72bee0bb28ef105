"""N-gram speculative decoding on a real node: a custom card asks for it, the node serves the
model on llama-server with drafting, the OpenAI SDK's answer carries the drafted tokens as
`completion_tokens_details` (accepted and rejected predictions), and `/metrics` counts them.
That the greedy text is the undrafted text is shown beside the engine
(tests/worker/engines/served/test_llama_server.py)."""

from __future__ import annotations

import httpx
import openai
import pytest

from skulk.models.cards import builtin_cards_dir
from tests.cluster.harness import start_linked, wait_agreed
from tests.cluster.test_any_architecture import place
from tests.llama_server_kit import require_llama_server
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

    metrics = httpx.get(node.url + "/metrics", timeout=10).text
    drafted = _counter(metrics, "skulk_speculative_drafted_tokens_total", MODEL)
    kept = _counter(metrics, "skulk_speculative_accepted_tokens_total", MODEL)
    assert drafted >= accepted + rejected and 0 < kept <= drafted, (drafted, kept)


def _counter(exposition: str, name: str, model: str) -> float:
    for line in exposition.splitlines():
        if line.startswith(name) and f'model="{model}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0
