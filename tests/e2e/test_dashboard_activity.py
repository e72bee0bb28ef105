"""The dashboard worth watching, in a real browser against a live node: after a chat the
Activity page charts the cluster's tokens/s and TTFT from every node's telemetry
(`nodeResources[].serving`), per-instance load and per-node memory, and a timeline of
events with their times; the topology draws the placed model's layers on its node; chat
answers render as Markdown that cannot inject markup; conversations survive a reload."""

from __future__ import annotations

import re

import pytest

from tests.e2e.browser import open_page
from tests.e2e.test_dashboard import only_from, send
from tests.e2e.test_openai_serving import MODEL, client, one_node, place, wait_instance_ready  # noqa: F401 - fixture
from tests.nodeproc import wait_for

pytest.importorskip("playwright")
from playwright.sync_api import expect

HOSTILE = ("<img src=x onerror=\"window.__pwned=1\"> **bold** `<b>code</b>` [click](javascript:window.__pwned=2) "
           "[ok](https://example.com/a)\n\n```html\n<script>window.__pwned=3</script>\n```\n- one\n- two")

RENDER = """async (text) => {
  const { render } = await import('/static/markdown.js');
  const box = document.createElement('div');
  box.append(render(text));
  document.body.append(box);
  return { html: box.innerHTML, imgs: box.querySelectorAll('img, script, [onerror]').length,
           links: [...box.querySelectorAll('a')].map((a) => a.getAttribute('href')),
           strong: box.querySelector('strong')?.textContent, code: box.querySelector('pre code')?.textContent,
           items: box.querySelectorAll('li').length };
}"""

RATES = """async () => {
  const h = await import('/static/history.js');
  const node = (tokens, ttftSum, ttftCount) => ({ name: 'a', tokens, ttftSum, ttftCount, memoryUsed: 50, gpuUse: null });
  let history = [];
  history = h.remember(history, { t: 0, nodes: { a: node(0, 0, 0) }, instances: {}, models: {} });
  history = h.remember(history, { t: 5000, nodes: { a: node(100, 1, 2) }, instances: {}, models: {} });
  history = h.remember(history, { t: 25000, nodes: { a: node(20, 0, 0) }, instances: {}, models: {} });  // restarted
  return { rates: h.tokensPerSecond(history)[0].points, ttft: h.timeToFirstToken(history)[0].points };
}"""


def test_activity_charts_topology_markdown_and_kept_conversations(one_node):
    node = one_node
    instance = place(node)
    wait_instance_ready(node, instance["instanceId"])
    client(node).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=24)

    def served():
        for resources in node.get("/state").json()["nodeResources"].values():
            serving = resources.get("serving") or {}
            if serving.get("generatedTokens", 0) >= 24 and serving.get("ttftCount", 0) >= 1:
                return serving
        return None

    serving = wait_for(served, timeout_s=30, what="serving counters in the node's telemetry")
    assert serving["generations"] >= 1 and serving["ttftSecondsSum"] > 0

    with open_page("dashboard-activity") as browser:
        page = browser.page
        page.goto(node.url + "/")
        # Field telemetry is asked about once per browser; declining sends nothing.
        expect(page.locator("#telemetry-ask")).to_be_visible()
        page.click("#telemetry-no")
        expect(page.locator("#telemetry-ask")).to_be_hidden()
        assert node.get("/v1/telemetry").json()["enabled"] is False
        # Topology: the placed model's layers, all on this one node.
        placement = page.locator(f'.placement[data-instance-id="{instance["instanceId"]}"]')
        expect(placement).to_contain_text(MODEL)
        expect(placement.locator(".shard")).to_have_count(1)
        expect(placement.locator(".shard")).to_contain_text("solo")

        # Pure pieces, in the browser: safe Markdown, and rates that survive a counter reset.
        rendered = page.evaluate(RENDER, HOSTILE)
        assert rendered["imgs"] == 0 and "<img" not in rendered["html"] and "<script" not in rendered["html"]
        assert rendered["links"] == ["https://example.com/a"]
        assert rendered["strong"] == "bold" and "<script>" in rendered["code"] and rendered["items"] == 2
        assert page.evaluate("window.__pwned") is None
        rates = page.evaluate(RATES)
        assert rates["rates"] == [[5000, 20], [25000, 0]]  # a restart's drop is not a negative rate
        assert rates["ttft"][0] == [5000, 0.5]

        # Chat from the page: the answer renders, and the conversation is kept in the browser.
        page.click('nav [data-page="chat"]')
        expect(page.locator('[data-role="model"]')).to_have_value(MODEL)
        answer = send(page, "Write a **short** list.", 16)
        expect(answer).to_have_attribute("data-state", "done")
        expect(page.locator('[data-role="conversation"] option')).to_contain_text(["Write a **short** list."])
        page.reload()
        expect(page.locator("#pages")).to_be_visible()
        expect(page.locator("#telemetry-ask")).to_be_hidden()  # asked once: the answer is remembered
        page.click('nav [data-page="chat"]')
        expect(page.locator(".message.user .text")).to_have_text(["Write a **short** list."])
        expect(page.locator(".message.assistant")).to_have_count(1)
        expect(page.locator(".message.assistant .stats")).to_contain_text("16 tokens")

        # Activity: tokens/s above zero once two readings of the counters are in; the rest drawn.
        page.click('nav [data-page="activity"]')
        tokens_chart = page.locator('[data-chart="Cluster tokens/s"]')
        expect(tokens_chart.locator("polyline, circle")).not_to_have_count(0, timeout=60_000)
        expect(page.locator('[data-chart="Memory used per node"] .legend')).to_contain_text("solo")
        expect(page.locator('[data-chart="In flight per instance"] .legend')).to_contain_text(MODEL)
        expect(page.locator('[data-chart="Time to first token"]')).to_be_visible()
        created = page.locator('.timeline li[data-event-type="InstanceCreated"]')
        expect(created).to_have_count(1)
        expect(created.locator("time")).to_have_text(re.compile(r"\d\d:\d\d:\d\d"))
        browser.shot("activity")

        # The consent switch in Settings: on, the preview shows the pending batch; off again.
        page.click('nav [data-page="settings"]')
        page.check('[data-role="telemetry"]')
        wait_for(lambda: node.get("/v1/telemetry").json()["enabled"], timeout_s=30, what="telemetry on")
        expect(page.locator('[data-role="telemetry-status"]')).to_contain_text("install id")
        page.click('[data-role="telemetry-details"] summary')
        expect(page.locator('[data-role="telemetry-preview"]')).to_contain_text('"schemaVersion"')
        page.uncheck('[data-role="telemetry"]')
        wait_for(lambda: not node.get("/v1/telemetry").json()["enabled"], timeout_s=30, what="telemetry off")
        assert only_from(node.url, browser.requests) == []
        assert browser.errors == []
