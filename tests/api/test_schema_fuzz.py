"""Schema fuzz: schemathesis generates requests from the app's own OpenAPI document for every
route and method, and no answer may be a 5xx. Bad input must always be a 4xx in the
caller's wire shape; a 500 there is a validation gap.

In-process (ASGI) against a scripted cluster, so generation and embedding requests that
pass validation also complete. Bounded: few examples per operation, no deadline, slow-data
health checks off, so the whole module runs in seconds on two cores."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from skulk.routing.invites import InviteBook
from tests.api.scripted_cluster import scripted_app
from tests.api.test_openai_routes import INSTANCE
from tests.observe.telemetry_kit import collector

MAX_EXAMPLES_PER_OPERATION = 20
"""Enough to hit every optional field and type branch of the request bodies seen so far;
more finds nothing new and costs seconds per route."""

# Every model name binds to the placed instance, so requests that pass validation go all
# the way through generation (or embedding) and serialisation instead of stopping at 404.
# Invites come from a real book, so the join route's refusals are fuzzed too; field telemetry
# is a real collector over a data dir of its own (its switch writes skulk.yaml there).
_INVITES = InviteBook("fuzz-cluster-key")
_TELEMETRY_DIR = tempfile.TemporaryDirectory(prefix="skulk-fuzz-telemetry-")  # removed at exit
_TELEMETRY = collector(Path(_TELEMETRY_DIR.name))
APP, _CLUSTER = scripted_app(["<think>a</think>", "Hel", "lo"], vectors=lambda n: [[0.6, 0.8]] * n,
                             context_fields={
                                 "instance_lookup": lambda _model_id: INSTANCE,
                                 "issue_invite": lambda ttl: _INVITES.issue(time.time(), ttl, ["http://127.0.0.1:1"], []),
                                 "redeem_invite": lambda join: _INVITES.redeem(join.invite_id, join.proof, time.time()),
                                 "get_telemetry_status": _TELEMETRY.status,
                                 "set_telemetry_enabled": _TELEMETRY.set_enabled,
                                 "preview_telemetry": _TELEMETRY.preview,
                             })
OUTSIDE_THE_PROCESS = r"^/(models/(search|add)|store(/|$)|ollama/api/(pull|delete)$|v1/events$)"
"""Routes this in-process fuzz leaves out, because what they answer depends on the world
outside the app: the Hugging Face hub (model search and add: no network here, and retries
with backoff), and the node's model store (without one they answer 503 by design; Ollama's
pull and delete go through it too). Their validation is tested where their context is built.
`/v1/events` takes no input and never ends (a server-sent event stream):
tests/api/test_events_route.py reads it."""

schema = schemathesis.openapi.from_asgi("/openapi.json", APP).exclude(path_regex=OUTSIDE_THE_PROCESS)

pytestmark = pytest.mark.timeout(120)


@schema.parametrize()
@settings(
    max_examples=MAX_EXAMPLES_PER_OPERATION,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
    database=None,
)
def test_no_route_answers_5xx(case):
    response = case.call()
    case.validate_response(response, checks=[not_a_server_error])
