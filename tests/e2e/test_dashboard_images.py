"""Images in the dashboard chat, in a real browser (headless Chromium) against the API served
in process on the scripted cluster (tests/api/vision_kit.py): an image attached from a file
and one pasted go out as OpenAI `image_url` data URLs, reach the runner's params as checked
images, show as thumbnails in the history, and only the thumbnails are kept in localStorage.
What a model answers about an image needs the engine side (tests/worker)."""

from __future__ import annotations

import base64
import json

import pytest

from tests.api.live_server import live_server
from tests.api.vision_kit import SEEING, image_bytes, vision_app
from tests.e2e.browser import open_page

pytest.importorskip("playwright")
from playwright.sync_api import expect

PNG = image_bytes("PNG", (64, 48), (250, 0, 0))
JPEG = image_bytes("JPEG", (40, 40), (0, 0, 250))

PASTE = """async (b64) => {
  const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
  const data = new DataTransfer();
  data.items.add(new File([bytes], 'pasted.jpg', { type: 'image/jpeg' }));
  const event = new ClipboardEvent('paste', { clipboardData: data, bubbles: true, cancelable: true });
  document.querySelector('[data-role="input"]').dispatchEvent(event);
}"""


def test_attached_and_pasted_images_are_sent_and_kept_as_thumbnails():
    app, cluster = vision_app(texts=("A red", " square."))
    with live_server(app) as url, open_page("dashboard-images") as browser:
        page = browser.page
        sent: list[dict] = []
        page.on("request", lambda r: sent.append(json.loads(r.post_data or "{}"))
                if r.url.endswith("/v1/chat/completions") else None)
        page.goto(url + "/")
        page.click('nav [data-page="chat"]')
        expect(page.locator(f'[data-role="model"] option[value="{SEEING}"]')).to_have_count(1)
        page.select_option('[data-role="model"]', SEEING)
        page.set_input_files('[data-role="file"]', files=[{"name": "red.png", "mimeType": "image/png", "buffer": PNG}])
        page.evaluate(PASTE, base64.b64encode(JPEG).decode())
        expect(page.locator('[data-role="attachments"] img')).to_have_count(2)
        page.fill('[data-role="input"]', "What is this?")
        page.click('[data-role="send"]')
        answer = page.locator(".message.assistant").last
        expect(answer.locator(".text")).to_have_text("A red square.")
        expect(page.locator('[data-role="attachments"] img')).to_have_count(0)
        browser.shot("chat-with-images")

        [body] = sent
        parts = body["messages"][-1]["content"]
        assert parts[0] == {"type": "text", "text": "What is this?"}
        urls = [p["image_url"]["url"] for p in parts[1:]]
        assert [u.split(",", 1)[0] for u in urls] == ["data:image/png;base64", "data:image/jpeg;base64"]
        assert [base64.b64decode(u.split(",", 1)[1]) for u in urls] == [PNG, JPEG]
        images = cluster.params().messages[-1].images
        assert [(i.data, i.width, i.height) for i in images] == [(PNG, 64, 48), (JPEG, 40, 40)]

        kept = page.evaluate("() => localStorage.getItem('skulk.conversations')")
        assert base64.b64encode(PNG).decode()[:200] not in kept  # the full image is never stored
        page.reload()
        page.click('nav [data-page="chat"]')
        expect(page.locator(".message.user .images img")).to_have_count(2)
        assert not browser.errors, browser.errors
