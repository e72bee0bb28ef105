"""A vision GGUF repo on a (mock) Hugging Face hub, the way bartowski and ggml-org publish them:
the model's quants and an `mmproj` projector side by side. `POST /models/add` builds a card
that sees (capability `vision`, the projector as its companion from the same repo), the node
downloads both when the card is placed, and llama-server answers an image with the image's
tokens in the prompt."""

from __future__ import annotations

import base64
import io
from typing import Any

import httpx
import openai
import pytest
from PIL import Image

from skulk.models.card_builder import vision_projector
from skulk.models.hub_files import RepoFile
from skulk.models.tiny_models import TINY_SPEC, TINY_VISION_SPEC, generate_tiny_model
from tests.llama_server_kit import require_bundled_server
from tests.mockhub import MockHub, serve
from tests.nodeproc import wait_for

pytestmark = pytest.mark.timeout(300)

REPO = "mock-org/tiny-vlm-GGUF"
MODEL_FILE = "tiny-vlm-Q4_K_M.gguf"
PROJECTOR = "mmproj-tiny-vlm-f16.gguf"


@pytest.mark.parametrize(("names", "chosen"), [
    ([], None),
    (["m-Q4_K_M.gguf"], None),
    (["m-Q4_K_M.gguf", "mmproj-m-f16.gguf"], "mmproj-m-f16.gguf"),
    (["mmproj-m-Q8_0.gguf", "mmproj-m-F16.gguf", "m-Q4_K_M.gguf"], "mmproj-m-F16.gguf"),  # full precision first
    (["mmproj-m-q8_0.gguf", "mmproj-m-q4_0.gguf"], "mmproj-m-q8_0.gguf"),
    (["x/mmproj-model.gguf", "README.md"], "x/mmproj-model.gguf"),
])
def test_vision_projector(names, chosen):
    assert vision_projector([RepoFile(name, 1) for name in names]) == chosen


def test_a_vision_gguf_repo_is_added_with_its_projector_and_sees(spawn_node, tmp_path):
    require_bundled_server()
    made = generate_tiny_model(tmp_path / "made", TINY_SPEC, TINY_VISION_SPEC)
    assert made.projector_path is not None
    hub = MockHub()
    hub.add_repo(REPO, {MODEL_FILE: made.gguf_path.read_bytes(), PROJECTOR: made.projector_path.read_bytes(),
                        "README.md": b"# tiny vlm\n"}, tags=("gguf", "llama"))
    with serve(hub):
        node = spawn_node("vlm", env={"HF_ENDPOINT": hub.url, "SKULK_LLAMA_SERVER_BIN": "",
                                      "SKULK_BUNDLED_LLAMA_SERVER": "1",
                                      "SKULK_ENGINES_DIR": str(tmp_path / "no-engines-built")})
        node.wait_ready()
        wait_for(lambda: node.get("/v1/cluster").json().get("masterNodeId"), timeout_s=90, what="a master")
        added = httpx.post(node.url + "/models/add", json={"modelId": REPO}, timeout=60)
        assert added.status_code == 200, added.text
        card = added.json()["card"]
        assert "vision" in card["capabilities"]
        assert (card["ggufFile"], card["visionWeightsRepo"], card["visionWeightsFile"]) == (MODEL_FILE, REPO, PROJECTOR)
        # The projector's size from the listing: placement admits it beside the model on rank 0.
        assert card["visionWeightsSizeBytes"] == made.projector_path.stat().st_size
        previewed = wait_for(lambda: httpx.get(node.url + "/instance/previews", params={"modelId": REPO},
                                                timeout=10).json().get("previews"), timeout_s=90, what="a preview")
        (first, *_) = previewed[0]["shards"]
        assert first["projectorBytes"] == card["visionWeightsSizeBytes"] and "+ projector" in first["breakdown"]

        def placed():
            response = httpx.post(node.url + "/place_instance", json={"modelId": REPO}, timeout=10)
            return None if response.status_code in (404, 503) else response

        response = wait_for(placed, timeout_s=90, interval_s=0.5, what="placement")
        assert response.status_code == 200, response.text
        sdk = openai.OpenAI(base_url=node.url + "/v1", api_key="unused", max_retries=0, timeout=120)

        def ask(with_image: bool):
            parts: list[dict] = [{"type": "text", "text": "What is this?"}]
            if with_image:
                out = io.BytesIO()
                Image.new("RGB", (32, 32), (250, 250, 250)).save(out, format="PNG")
                url = "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()
                parts.append({"type": "image_url", "image_url": {"url": url}})
            return sdk.chat.completions.create(model=REPO, max_tokens=4, temperature=0,
                                               messages=[{"role": "user", "content": parts}])

        def answered():
            try:
                return ask(False)
            except openai.APIStatusError as exc:
                if exc.status_code == 503:  # still downloading or loading
                    return None
                raise

        try:
            plain = wait_for(answered, timeout_s=180, interval_s=1.0, what="the model serving")
        except TimeoutError as exc:
            raise AssertionError(f"{exc}\n{node.log()[-6000:]}") from None
        seen = ask(True)
        grown = seen.usage.prompt_tokens - plain.usage.prompt_tokens
        assert 16 <= grown <= 18, (plain.usage, seen.usage)  # the projector's 16 tokens, and the part separator
        assert [r.range for r in hub.file_requests(PROJECTOR)][-1] is None  # fetched whole, as a companion


MLX_REPO = "mock-org/tiny-llava-mlx"


def test_an_mlx_repo_with_a_vision_tower_is_added_as_a_card_that_sees(spawn_node, tmp_path):
    """The MLX counterpart: a LLaVA safetensors repo (config.json with a vision_config, the
    processor configs) becomes a card that sees, and MLX's vision path (mlx-vlm) serves it."""
    from skulk.models.tiny_models import write_mlx_vlm

    write_mlx_vlm(tmp_path / "hf", TINY_SPEC, TINY_VISION_SPEC)
    hub = MockHub()
    hub.add_repo(MLX_REPO, {p.name: p.read_bytes() for p in sorted((tmp_path / "hf").iterdir())},
                 tags=("mlx", "safetensors"))
    with serve(hub):
        node = spawn_node("vlm-mlx", env={"HF_ENDPOINT": hub.url})
        node.wait_ready()
        wait_for(lambda: node.get("/v1/cluster").json().get("masterNodeId"), timeout_s=90, what="a master")
        added = httpx.post(node.url + "/models/add", json={"modelId": MLX_REPO}, timeout=60)
        assert added.status_code == 200, added.text
        card = added.json()["card"]
        assert "vision" in card["capabilities"] and card["family"] == "llava"

        def placed():
            response = httpx.post(node.url + "/place_instance", json={"modelId": MLX_REPO}, timeout=10)
            return None if response.status_code in (404, 503) else response

        response: Any = wait_for(placed, timeout_s=90, interval_s=0.5, what="placement")
        assert response.status_code == 200, response.text
        sdk = openai.OpenAI(base_url=node.url + "/v1", api_key="unused", max_retries=0, timeout=120)

        def ask(with_image: bool) -> Any:
            parts: list[Any] = [{"type": "text", "text": "What is this?"}]
            if with_image:
                out = io.BytesIO()
                Image.new("RGB", (32, 32), (250, 250, 250)).save(out, format="PNG")
                url = "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()
                parts.append({"type": "image_url", "image_url": {"url": url}})
            messages: Any = [{"role": "user", "content": parts}]
            return sdk.chat.completions.create(model=MLX_REPO, max_tokens=4, temperature=0, messages=messages)

        def answered():
            try:
                return ask(False)
            except openai.APIStatusError as exc:
                if exc.status_code == 503:  # still downloading or loading
                    return None
                raise

        try:
            plain: Any = wait_for(answered, timeout_s=180, interval_s=1.0, what="the model serving")
        except TimeoutError as exc:
            raise AssertionError(f"{exc}\n{node.log()[-6000:]}") from None
        grown = ask(True).usage.prompt_tokens - plain.usage.prompt_tokens
        assert 16 <= grown <= 18, grown  # the tower's 16 embeddings, and the part separator
