"""Shared kit for the observability tests that serve the tiny llama.cpp model on real nodes."""

from __future__ import annotations

import httpx

from tests.nodeproc import NodeProcess, wait_for

MODEL = "local/tiny-llama-gguf"
READY_DEADLINE_S = 120.0
"""Hang guard for a runner to load the tiny model on a loaded 2-core machine."""


def place_and_wait(api: NodeProcess, **body) -> str:
    """Place MODEL through `api` (retrying while cluster info gossips) until its runners serve;
    returns the instance id."""
    def placed():
        response = httpx.post(api.url + "/place_instance", json={"modelId": MODEL, **body}, timeout=10)
        if response.status_code == 503:
            return None
        assert response.status_code == 200, response.text
        return response.json()["instanceId"]

    instance_id = wait_for(placed, timeout_s=60, interval_s=0.5, what="a placement")

    def ready():
        response = api.get(f"/instance/{instance_id}")
        if response.status_code != 200:
            return None
        runners = response.json()["runners"].values()
        failed = [r for r in runners if r["state"] == "Failed"]
        assert not failed, f"runner failed: {failed}"
        return bool(runners) and all(r["state"] in ("Ready", "Running") for r in runners)

    wait_for(ready, timeout_s=READY_DEADLINE_S, interval_s=0.25, what=f"instance {instance_id} ready")
    return instance_id


def chat(api: NodeProcess, max_tokens: int, *, stream: bool = False, model: str = MODEL) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "hello there"}], "max_tokens": max_tokens,
            "temperature": 0, "stream": stream}
    response = httpx.post(api.url + "/v1/chat/completions", json=body, timeout=60)
    return response
