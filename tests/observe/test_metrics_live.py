"""`GET /metrics` of a live node after real requests, read with Prometheus' own text parser:
the families exist and the counts match the requests made.

A real node process, a real runner, the real llama.cpp engine on the tiny GGUF model (which
never stops by itself, so every completion runs to max_tokens and token counts are exact).
"""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.cluster.harness import start_linked, wait_agreed
from tests.observe.serving_kit import MODEL, chat, place_and_wait

pytestmark = pytest.mark.timeout(240)


def scrape(node) -> dict[str, dict[tuple, float]]:
    """family name -> {(sample name, sorted labels): value}."""
    response = node.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    families = {}
    for family in text_string_to_metric_families(response.text):
        families[family.name] = {(s.name, tuple(sorted(s.labels.items()))): s.value for s in family.samples}
    return families


def value(families, family: str, sample: str, **labels) -> float:
    return families[family].get((sample, tuple(sorted(labels.items()))), 0.0)


def test_metrics_count_the_requests_a_live_node_served(spawn_node):
    (node,) = start_linked(spawn_node, ["metrics"])
    wait_agreed([node], members=1)
    instance_id = place_and_wait(node)

    for max_tokens in (3, 5):
        assert chat(node, max_tokens).status_code == 200
    assert chat(node, 4, stream=True).status_code == 200
    assert chat(node, 2, model="no/such-model").status_code == 404
    assert node.get("/no/such/route").status_code == 404

    families = scrape(node)
    route = "/v1/chat/completions"
    assert value(families, "skulk_http_requests", "skulk_http_requests_total",
                 route=route, method="POST", status="200") == 3
    assert value(families, "skulk_http_requests", "skulk_http_requests_total",
                 route=route, method="POST", status="404") == 1
    assert value(families, "skulk_http_requests", "skulk_http_requests_total",
                 route="unmatched", method="GET", status="404") == 1
    assert value(families, "skulk_http_request_duration_seconds", "skulk_http_request_duration_seconds_count",
                 route=route) == 4

    assert value(families, "skulk_generations", "skulk_generations_total", model=MODEL, outcome="completed") == 3
    assert value(families, "skulk_generated_tokens", "skulk_generated_tokens_total", model=MODEL) == 3 + 5 + 4
    assert value(families, "skulk_prompt_tokens", "skulk_prompt_tokens_total", model=MODEL) > 3 * 5
    assert value(families, "skulk_time_to_first_token_seconds", "skulk_time_to_first_token_seconds_count",
                 model=MODEL) == 3
    assert value(families, "skulk_inter_token_latency_seconds", "skulk_inter_token_latency_seconds_count",
                 model=MODEL) == (3 - 1) + (5 - 1) + (4 - 1)
    # Nothing is labelled with a raw path or a prompt.
    labels = {v for family in families.values() for (_, pairs) in family for _, v in pairs}
    assert "/no/such/route" not in labels and not any("hello" in label for label in labels)

    # Scrape-time families read from the node itself.
    assert value(families, "skulk_api_streams_open", "skulk_api_streams_open") == 0
    assert value(families, "skulk_instance_in_flight", "skulk_instance_in_flight", instance=instance_id) == 0
    assert value(families, "skulk_runners", "skulk_runners", state="Ready") == 1
    assert value(families, "skulk_event_log_applied_index", "skulk_event_log_applied_index") > 0
    assert value(families, "skulk_events_applied", "skulk_events_applied_total") > 0
    assert "skulk_transport_rejects" in families
    assert value(families, "skulk_master_events_indexed", "skulk_master_events_indexed_total") > 0
