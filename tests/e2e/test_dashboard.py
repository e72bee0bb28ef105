"""The dashboard in a real browser (headless Debian Chromium via Playwright) against live
nodes: topology, placing from the UI, streamed chat with stop, delete, a node killed with -9
turning red and then disappearing; no request ever leaves the node; the API-key gate; a
placement's slot count on a node with llama-server (offered only where an engine has slots).
Screenshots of every page go to the test artefacts (`tests/e2e/browser.py`)."""

from __future__ import annotations

import re

import httpx
import pytest

from skulk.routing.join_token import decode_token
from tests.cluster.harness import node_id, start_linked, wait_agreed
from tests.e2e.browser import open_page
from tests.llama_server_kit import require_llama_server
from tests.mockhub import TINY_GGUF_REPO, mock_hub, tiny_artifacts  # noqa: F401 - fixtures
from tests.nodeproc import wait_for

pytest.importorskip("playwright")
from playwright.sync_api import expect

MODEL = "local/tiny-llama-gguf"
KEY = "s3cret-key"
PRUNE_DEADLINE_MS = 120_000
"""A killed node turns red at 20 s without a heartbeat and is pruned at 30 s; the rest is a
hang guard for a noisy machine."""

COUNT_TEXT_UPDATES = """() => {
  window.__updates = 0;
  new MutationObserver(() => { window.__updates += 1; })
    .observe(document.querySelector('[data-role="messages"]'), {subtree: true, characterData: true, childList: true});
}"""


def only_from(node_url: str, requests: list[str]) -> list[str]:
    """The requests that went anywhere but the node (data: URLs never leave the page)."""
    return [url for url in requests if not url.startswith(node_url + "/") and not url.startswith("data:")]


def send(page, text: str, max_tokens: int) -> object:
    page.fill('[data-role="max-tokens"]', str(max_tokens))
    page.fill('[data-role="input"]', text)
    answers = page.locator(".message.assistant")
    index = answers.count()
    page.click('[data-role="send"]')
    return answers.nth(index)  # this answer, not whichever is last later


def test_dashboard_drives_a_two_node_cluster(spawn_node, mock_hub):
    nodes = start_linked(spawn_node, ["alpha", "beta"])
    wait_agreed(nodes, members=2)
    alpha, beta = nodes
    beta_id = node_id(beta)
    with open_page("dashboard") as browser:
        page = browser.page
        page.goto(alpha.url + "/")
        # Topology: both nodes, the master marked, the graph drawn.
        expect(page.locator(".node-card")).to_have_count(2)
        expect(page.locator(".node-card .pill.master")).to_have_count(1)
        expect(page.locator("svg .gnode")).to_have_count(2)
        expect(page.locator("#link-status")).to_have_text("live")
        browser.shot("topology")

        # Place the tiny model from the Models page; it shows up running.
        page.click('nav [data-page="models"]')
        page.select_option('[data-role="model-select"]', MODEL)
        page.locator('[data-role="previews"] button[data-action="place"]').first.click()
        row = page.locator(f'tr[data-model-id="{MODEL}"]')
        expect(row).to_have_count(1)
        # No node here runs an engine with slots (in-process llama.cpp only): no slot field.
        expect(page.locator('[data-role="slots-field"]')).to_be_hidden()
        expect(row.locator(".runner-states")).to_have_text("Ready", timeout=120_000)
        browser.shot("models")

        # Chat: a message streams into the page, with TTFT and tokens/s.
        page.click('nav [data-page="chat"]')
        expect(page.locator('[data-role="model"]')).to_have_value(MODEL)
        page.evaluate(COUNT_TEXT_UPDATES)
        answer = send(page, "Tell me about the weather.", 48)
        expect(answer).to_have_attribute("data-state", "done")
        assert answer.locator(".text").inner_text().strip()
        assert page.evaluate("window.__updates") >= 3, "the answer arrived in one piece, not streamed"
        expect(answer.locator(".stats")).to_contain_text("TTFT")
        expect(answer.locator(".stats")).to_contain_text("48 tokens")

        # Stop: a long answer ends at the button, well short of its budget.
        long_answer = send(page, "Tell me a very long story.", 1500)
        expect(long_answer.locator(".text")).not_to_be_empty()
        page.click('[data-role="stop"]')
        expect(long_answer).to_have_attribute("data-state", "stopped")
        stopped_at = len(long_answer.locator(".text").inner_text())
        assert long_answer.locator(".stats").inner_text().startswith("stopped")
        # The node is free again: the next message is answered in full.
        after = send(page, "Hello again.", 8)
        expect(after).to_have_attribute("data-state", "done")
        assert len(long_answer.locator(".text").inner_text()) == stopped_at
        browser.shot("chat")

        # Settings: tracing switch, another node's diagnostics, the event log.
        page.click('nav [data-page="settings"]')
        page.select_option('[data-role="diag-node"]', beta_id)
        page.click('[data-role="diag-load"]')
        expect(page.locator('[data-role="diagnostics"]')).to_contain_text(beta_id)
        expect(page.locator('[data-role="node-settings"]')).to_contain_text("beta")  # its settings
        expect(page.locator('[data-role="events"]')).to_contain_text("InstanceCreated")
        page.check('[data-role="tracing"]')
        expect(page.locator('[data-role="tracing"]')).to_be_checked()
        # The node's log level, changed from the page, until it restarts.
        page.select_option('[data-role="log-level"]', "DEBUG")
        wait_for(lambda: alpha.get("/v1/diagnostics/log-level").json()["level"] == "DEBUG", timeout_s=30,
                 what="the log level set from the page")
        # Invite a node: the button shows the one line to run on the new machine.
        page.click('[data-role="invite"]')
        command = page.locator('[data-role="invite-command"]')
        expect(command).to_contain_text("skulk run --join skulk-join1-")
        assert decode_token(command.inner_text().split()[-1]).api_endpoints == (alpha.url,)
        browser.shot("settings")

        # Delete the instance from the Models page: it disappears.
        page.click('nav [data-page="models"]')
        page.click(f'tr[data-model-id="{MODEL}"] button[data-action="delete"]')
        expect(page.locator('[data-role="no-instances"]')).to_be_visible()

        # Hub search and add (the mock hub), then remove the custom card again.
        page.fill('[data-role="search-form"] input[name="q"]', "tiny-llama")
        page.click('[data-role="search-form"] button[type="submit"]')
        add = page.locator(f'[data-role="search-results"] button[data-model-id="{TINY_GGUF_REPO}"]')
        add.click()
        expect(add).to_have_text(f"Added {TINY_GGUF_REPO}")
        custom = page.locator('[data-role="cards"] tr', has_text=TINY_GGUF_REPO)
        expect(custom).to_contain_text("custom")
        browser.shot("models-hub-add")
        custom.locator('button[data-action="delete-card"]').click()
        expect(custom).to_have_count(0)

        # A node killed with -9 turns red, then disappears.
        page.click('nav [data-page="topology"]')
        beta.proc.kill()
        card = page.locator(f'.node-card[data-node-id="{beta_id}"]')
        expect(card).to_have_class(re.compile(r"\blevel-error\b"), timeout=PRUNE_DEADLINE_MS)
        expect(card.locator(".health-detail")).not_to_be_empty()
        browser.shot("topology-node-down")
        expect(card).to_have_count(0, timeout=PRUNE_DEADLINE_MS)
        expect(page.locator(".node-card")).to_have_count(1)

        # Dark theme and phone width, same tokens.
        page.click("#theme-toggle")
        page.set_viewport_size({"width": 390, "height": 844})
        browser.shot("topology-phone-dark")

        assert only_from(alpha.url, browser.requests) == []
        assert browser.errors == []


def test_a_placement_with_a_chosen_slot_count(spawn_node):
    """On a node with llama-server the Models page offers a slot count: a count beyond the
    engine's bound shows the API's typed refusal; a good one previews, places and shows."""
    node = spawn_node("slotted", env={"SKULK_LLAMA_SERVER_BIN": str(require_llama_server())}).wait_ready()
    wait_for(lambda: any("llama_server-cpu" in r.get("backends", [])
                         for r in node.get("/state").json()["nodeResources"].values()),
             timeout_s=60, what="llama_server advertised")
    with open_page("dashboard-slots") as browser:
        page = browser.page
        page.goto(node.url + "/")
        page.click('nav [data-page="models"]')
        page.select_option('[data-role="model-select"]', MODEL)
        slots = page.locator('[data-role="slots"]')
        expect(slots).to_be_visible()
        expect(page.locator('[data-role="slots-hint"]')).to_contain_text("llama_server: 1-64")

        slots.fill("65")
        slots.press("Enter")
        error = page.locator('skulk-models [data-role="error"]')
        expect(error).to_contain_text("invalid_slot_setting")
        expect(error).to_contain_text("1..64")
        expect(page.locator('[data-role="previews"] button[data-action="place"]')).to_have_count(0)

        slots.fill("2")
        slots.press("Enter")
        expect(error).to_have_text("")
        preview = page.locator('[data-role="previews"] tbody tr').first
        expect(preview).to_contain_text("llama_server-cpu")
        expect(preview.locator(".slots")).to_have_text("2 slots")
        preview.locator('button[data-action="place"]').click()
        row = page.locator(f'tr[data-model-id="{MODEL}"]')
        expect(row.locator(".slots")).to_have_text("2")
        expect(row.locator(".runner-states")).to_have_text("Ready", timeout=120_000)
        browser.shot("models-slots")
        instance_id = row.get_attribute("data-instance-id")
        placed = node.get(f"/instance/{instance_id}").json()
        assert placed["requestedSlots"] == 2 and [s["slots"] for s in placed["shards"]] == [2]
        assert placed["shards"][0]["backend"] == "llama_server-cpu"
        assert only_from(node.url, browser.requests) == []
        assert browser.errors == []


def test_with_an_api_key_the_dashboard_shows_nothing_until_the_key_is_entered(spawn_node):
    # Keys required from loopback too (the browser runs on the node's own machine, which the
    # default exempts): what a browser on another machine meets.
    keyed = spawn_node("keyed", env={"SKULK_API_KEY": KEY, "SKULK_API_REQUIRE_KEY_ON_LOOPBACK": "1"},
                       extra_args=["--no-worker"])
    wait_for(lambda: httpx.get(keyed.url + "/node_id", headers={"Authorization": f"Bearer {KEY}"},
                               timeout=5).status_code == 200, timeout_s=60, what="keyed node up")
    with open_page("dashboard-api-key") as browser:
        page = browser.page
        page.goto(keyed.url + "/")
        expect(page.locator("#key-prompt")).to_be_visible()
        expect(page.locator("#pages")).to_be_hidden()
        assert page.locator(".node-card").count() == 0
        browser.shot("api-key-prompt")
        page.fill("#key-input", "wrong")
        page.click("#key-prompt button[type=submit]")
        expect(page.locator("#key-error")).to_contain_text("refused")
        expect(page.locator("#pages")).to_be_hidden()
        page.fill("#key-input", KEY)
        page.click("#key-prompt button[type=submit]")
        expect(page.locator(".node-card")).to_have_count(1)
        expect(page.locator("#link-status")).to_have_text("live")
        assert page.evaluate("sessionStorage.getItem('skulk.apiKey')") == KEY
        browser.shot("api-key-unlocked")
        assert only_from(keyed.url, browser.requests) == []
        assert browser.errors == []
