"""The typer shell of the cluster client: `skulk status|ps|place|unplace|chat` and `skulk
models search|add`. Each command reads flags, calls the node (`http.NodeClient`), and prints
what `views` made of the answer; an API error is printed plainly and exits 1.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from skulk.api.auth import API_KEY_ENV
from skulk.client import views
from skulk.client.http import ADD_TIMEOUT_S, DEFAULT_URL, URL_ENV, NodeClient
from skulk.client.views import ClientError
from skulk.shared.settings import setting

FAILURE_EXIT = 1

Url = Annotated[str, typer.Option("--url", envvar=URL_ENV, help="The node's API (default http://localhost:52415).")]


def _client(url: str) -> NodeClient:
    return NodeClient(url, setting(API_KEY_ENV) or None)


def _run(action: Callable[[], None]) -> None:
    """Run one command; an API error (or an unreachable node) prints plainly and exits 1."""
    try:
        action()
    except ClientError as exc:
        typer.echo(f"skulk: {exc}", err=True)
        raise typer.Exit(FAILURE_EXIT) from None


def _table(title: str, columns: tuple[str, ...], rows: list[tuple[str, ...]]) -> Table:
    table = Table(title=title, title_justify="left")
    for column in columns:  # ids must stay whole to be copied: fold, never truncate
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*row)
    return table


INSTANCE_COLUMNS = ("instance", "model", "sharding", "nodes", "runners", "context")


def status(url: Url = DEFAULT_URL) -> None:
    """Show the cluster: nodes (master, health, memory, backends, runners) and instances."""
    def action() -> None:
        with _client(url) as client:
            cluster, state = client.get("/v1/cluster"), client.get("/state")
        console = Console()
        console.print(_table("nodes", ("node", "id", "role", "alive", "health", "memory free / total",
                                       "backends", "runners"), views.node_rows(cluster, state)))
        for node_id, verdict in sorted(state.get("nodeHealth", {}).items()):
            for reason in verdict.get("reasons", []):
                console.print(f"[yellow]{views.short(node_id)}[/]: {reason['message']}"
                              + (f" (fix: {reason['remediation']})" if reason.get("remediation") else ""))
        rows = views.instance_rows(state)
        console.print(_table("instances", INSTANCE_COLUMNS, rows) if rows else "no instances placed")
        for line in views.instance_problems(state):
            console.print(line, style="yellow", markup=False)
    _run(action)


def ps(url: Url = DEFAULT_URL) -> None:
    """List placed instances with their runners' states."""
    def action() -> None:
        with _client(url) as client:
            state = client.get("/state")
        console = Console()
        rows = views.instance_rows(state)
        console.print(_table("instances", INSTANCE_COLUMNS, rows) if rows else "no instances placed")
        for line in views.instance_problems(state):
            console.print(line, style="yellow", markup=False)
    _run(action)


def place(
    model: Annotated[str, typer.Argument(help="Model id, e.g. local/tiny-llama-gguf (see `skulk models list`).")],
    nodes: Annotated[int, typer.Option("--nodes", min=1, help="Least number of nodes to spread it over.")] = 1,
    sharding: Annotated[str, typer.Option("--sharding", help="Pipeline or Tensor.")] = "Pipeline",
    exclude: Annotated[list[str] | None, typer.Option("--exclude", help="Node (id, name or id prefix) to leave out; repeatable.")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Show the placement; place nothing.")] = False,
    slots: Annotated[int | None, typer.Option(
        "--slots", help="Requests a served engine (llama-server, vLLM) decodes at once for this placement, "
                        "instead of the node's setting.")] = None,
    kv_cache: Annotated[str | None, typer.Option(
        "--kv-cache", help="KV cache type: f16, q8_0 or q4_0 (a quantized cache admits a longer context; "
                           "default: the model card's, else the node's kv_cache_backend).")] = None,
    url: Url = DEFAULT_URL,
) -> None:
    """Place a model on the cluster (the planner's reason is printed when it cannot)."""
    def action() -> None:
        if sharding not in ("Pipeline", "Tensor"):
            raise ClientError(0, "invalid_request", f"--sharding must be Pipeline or Tensor, not {sharding!r}")
        with _client(url) as client:
            state = client.get("/state")
            body = {"modelId": model, "minNodes": nodes, "sharding": sharding,
                    "excludedNodes": views.resolve_nodes(exclude or [], state), "dryRun": dry_run}
            if slots is not None:
                body["slots"] = slots
            if kv_cache is not None:
                body["kvCacheType"] = kv_cache
            answer = client.post("/place_instance", body)
        console = Console()
        head = "would place" if dry_run else f"placed {answer['instanceId']}:"
        shards = answer["preview"].get("shards") or [{}]
        console.print(f"{head} {model} ({answer['preview'].get('sharding')}, "
                      f"context {answer['preview'].get('contextTokenLimit')} tokens, "
                      f"{shards[0].get('kvCacheType', 'f16')} KV cache)")
        console.print(_table("shards", ("node", "rank", "layers", "backend", "slots"),
                             views.preview_rows(answer["preview"], state)))
    _run(action)


def unplace(
    target: Annotated[str, typer.Argument(help="An instance id, or a model id (every instance of it).")],
    url: Url = DEFAULT_URL,
) -> None:
    """Delete an instance, or every instance of a model."""
    def action() -> None:
        with _client(url) as client:
            for instance_id in views.unplace_targets(target, client.get("/state")):
                client.delete(f"/instance/{instance_id}")
                typer.echo(f"deleting {instance_id}")
    _run(action)


def _prompts(prompt: str | None) -> Iterator[str] | None:
    """One-shot prompts (`-p`, or stdin when it is not a terminal); None means the REPL."""
    if prompt is not None:
        return iter([prompt])
    if not sys.stdin.isatty():
        text = sys.stdin.read().strip()
        if not text:
            raise ClientError(0, "invalid_request", "stdin was empty: nothing to send")
        return iter([text])
    return None


def _answer(client: NodeClient, model: str, messages: list[dict], max_tokens: int | None,
            temperature: float | None) -> str:
    """Stream one answer to stdout (reasoning to stderr, dimmed); returns the answer text."""
    body: dict = {"model": model, "messages": messages}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    if temperature is not None:
        body["temperature"] = temperature
    err = Console(stderr=True)
    text = []
    for delta in client.stream_chat(body):
        if delta.error is not None:
            sys.stdout.write("\n")
            raise delta.error
        if delta.reasoning:
            err.print(delta.reasoning, style="dim", end="")
        if delta.content:
            text.append(delta.content)
            sys.stdout.write(delta.content)
            sys.stdout.flush()
    sys.stdout.write("\n")
    return "".join(text)


PLACE_READY_DEADLINE_S = 900.0
"""How long `skulk chat` waits for a model it placed to download and load."""
PLACE_POLL_S = 0.5
SERVING_STATES = frozenset({"Ready", "Running"})
"""Runner states in which a placed model answers (Running: already serving another client)."""
CARD_SPREAD_DEADLINE_S = 15.0
"""How long a just-added card may take to reach the node that places it."""


def _placed_model_ids(state: dict) -> set[str]:
    return {i["modelId"] for i in state.get("instances", {}).values()}


def _place_new(client: NodeClient, model_id: str) -> dict:
    deadline = time.monotonic() + CARD_SPREAD_DEADLINE_S
    while True:
        try:
            return client.post("/place_instance", {"modelId": model_id})
        except ClientError as exc:
            if exc.status not in (404, 503) or time.monotonic() > deadline:
                raise
            time.sleep(PLACE_POLL_S)


def ensure_placed(client: NodeClient, typed: str) -> str:
    """The placed model id for what the user typed, placing it first when it is not placed,
    as `ollama run` does: a card id, a Hugging Face repo (`owner/repo[:QUANT]`) or an Ollama
    library name (`llama3.2:1b`; the node adds its card from the hub). The planner's choice
    is printed (stderr); returns once every runner is Ready."""
    state = client.get("/state")
    if typed in _placed_model_ids(state):
        return typed
    model_id = typed
    try:
        answer = client.post("/place_instance", {"modelId": typed})
    except ClientError as exc:
        if exc.status != 404:
            raise
        added = client.post("/models/add", {"modelId": typed}, timeout_s=ADD_TIMEOUT_S)
        model_id = added["modelId"]
        typer.echo(f"added {model_id} ({added.get('card', {}).get('ggufFile') or added.get('card', {}).get('family')})",
                   err=True)
        if model_id in _placed_model_ids(client.get("/state")):
            return model_id
        answer = _place_new(client, model_id)
    err = Console(stderr=True)
    err.print(f"placed {model_id} as {answer['instanceId']} ({answer['preview'].get('sharding')}, "
              f"context {answer['preview'].get('contextTokenLimit')} tokens)")
    err.print(_table("shards", ("node", "rank", "layers", "backend", "slots"),
                     views.preview_rows(answer["preview"], client.get("/state"))))
    _wait_ready(client, answer["instanceId"], err)
    return model_id


def _wait_ready(client: NodeClient, instance_id: str, err: Console) -> None:
    deadline = time.monotonic() + PLACE_READY_DEADLINE_S
    with err.status("downloading and loading...") as spinner:
        while time.monotonic() < deadline:
            state = client.get("/state")
            instance = state.get("instances", {}).get(instance_id)
            if instance is None:
                raise ClientError(0, "instance_gone", f"instance {instance_id} was removed while loading; see `skulk status`")
            runners = [state.get("runners", {}).get(s["runnerId"], {}) for s in instance.get("shards", [])]
            states = [r.get("state", "Pending") for r in runners]
            if states and all(s in SERVING_STATES for s in states):
                return
            failed = [r for r in runners if r.get("state") == "Failed"]
            if failed:
                raise ClientError(0, "runner_failed", f"a runner of {instance_id} failed: "
                                  f"{failed[0].get('errorMessage') or 'no reason given'}; see `skulk status`")
            spinner.update(f"loading: runners {', '.join(states) or 'pending'}")
            time.sleep(PLACE_POLL_S)
    raise ClientError(0, "timeout", f"{instance_id} was not Ready within {PLACE_READY_DEADLINE_S:.0f} s; "
                      "see `skulk status`")


def chat(
    model: Annotated[str, typer.Argument(help="A model id, Hugging Face repo (owner/repo[:QUANT]) or Ollama name "
                                              "(llama3.2:1b); placed first when it is not placed yet.")],
    prompt: Annotated[str | None, typer.Option("-p", "--prompt", help="Ask once and exit (stdin is read when it is not a terminal).")] = None,
    max_tokens: Annotated[int | None, typer.Option("--max-tokens", min=1, help="Cap on each answer's tokens.")] = None,
    temperature: Annotated[float | None, typer.Option("--temperature", min=0.0, help="Sampling temperature.")] = None,
    url: Url = DEFAULT_URL,
) -> None:
    """Chat with a model, placing it first if needed (like `ollama run`): streamed answers; an
    interactive REPL without -p (/exit or Ctrl-D leaves, Ctrl-C stops an answer)."""
    def action() -> None:
        with _client(url) as client:
            placed = ensure_placed(client, model)
            prompts = _prompts(prompt)
            if prompts is not None:
                for text in prompts:
                    _answer(client, placed, [{"role": "user", "content": text}], max_tokens, temperature)
                return
            _repl(client, placed, max_tokens, temperature)
    _run(action)


def _repl(client: NodeClient, model: str, max_tokens: int | None, temperature: float | None) -> None:
    history: list[dict] = []
    typer.echo(f"chatting with {model} at {client.url}; /exit or Ctrl-D to leave, Ctrl-C stops an answer")
    while True:
        try:
            line = input(">>> ").strip()
        except EOFError:
            typer.echo("")
            return
        if line in ("/exit", "/quit", "/bye"):
            return
        if not line:
            continue
        history.append({"role": "user", "content": line})
        try:
            answer = _answer(client, model, history, max_tokens, temperature)
        except KeyboardInterrupt:  # closing the stream cancels the generation on the node
            typer.echo("\n[stopped]")
            history.pop()
            continue
        except ClientError as exc:  # shown, and the conversation goes on
            typer.echo(f"skulk: {exc}", err=True)
            history.pop()
            continue
        history.append({"role": "assistant", "content": answer})


def models_search(
    query: Annotated[str, typer.Argument(help="Search text, or an exact GGUF file name.")],
    limit: Annotated[int, typer.Option("--limit", min=1, max=100, help="Most results to show.")] = 20,
    url: Url = DEFAULT_URL,
) -> None:
    """Search Hugging Face through the node (its HF_ENDPOINT and HF_TOKEN apply)."""
    def action() -> None:
        with _client(url) as client:
            answer = client.get("/models/search", params={"q": query, "limit": limit})
        rows = [(r["modelId"], r.get("format") or "-", str(r.get("downloads") or 0), str(r.get("likes") or 0),
                 r.get("matchedFile") or "") for r in answer.get("results", [])]
        Console().print(_table(f"results for {query!r}", ("model", "format", "downloads", "likes", "matched file"), rows)
                        if rows else f"no models match {query!r}")
    _run(action)


def models_add(
    source: Annotated[str, typer.Argument(help="A Hugging Face repo (owner/name) or a local model path the node can read.")],
    gguf_file: Annotated[str | None, typer.Option("--gguf-file", help="Which GGUF file of the repo.")] = None,
    onnx_file: Annotated[str | None, typer.Option(
        "--onnx-file", help="Which Piper voice (.onnx) of a repo that holds several.")] = None,
    override: Annotated[bool, typer.Option(
        "--override", help="Replace a card that already has this id (another voice of the same repo).")] = False,
    revision: Annotated[str | None, typer.Option("--revision", help="Pin a repo revision.")] = None,
    url: Url = DEFAULT_URL,
) -> None:
    """Add a custom model card to the cluster, built from the repo's (or file's) metadata."""
    def action() -> None:
        body: dict = ({"path": str(Path(source).resolve())} if _is_path(source) else {"modelId": source})
        if gguf_file:
            body["ggufFile"] = gguf_file
        if onnx_file:
            body["onnxFile"] = onnx_file
        if override:
            body["override"] = True
        if revision:
            body["revision"] = revision
        with _client(url) as client:
            answer = client.post("/models/add", body, timeout_s=ADD_TIMEOUT_S)
        card = answer.get("card", {})
        typer.echo(f"added {answer['modelId']} ({card.get('family')}, {card.get('numLayers')} layers, "
                   f"engines: {', '.join(card.get('placement', {}).get('compatibleBackends', [])[:1]) or '-'})")
    _run(action)


def _is_path(source: str) -> bool:
    return source.startswith(("/", ".", "~")) or Path(source).exists()


def register(app: typer.Typer, models_app: typer.Typer) -> None:
    """Add the client commands to the `skulk` CLI."""
    for command in (status, ps, place, unplace, chat):
        app.command()(command)
    models_app.command("search")(models_search)
    models_app.command("add")(models_add)


__all__ = ["register"]
