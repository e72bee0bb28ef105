"""A small real Hugging Face Hub over HTTP, for tests of the download path.

No hub is reachable here, so tests point HF_ENDPOINT at this server and drive the real
`huggingface_hub` client against it. It speaks the part of the Hub API that client uses to
list, search and download models (read from huggingface_hub's source):

- `GET /api/models/{repo}` and `/api/models/{repo}/revision/{rev}` -> `{id, sha, siblings}`
  (sizes and LFS sha256 with `?blobs=true`), 404 `RevisionNotFound` for an unknown revision;
- `GET /api/models?search=&limit=` -> matching repos (no pagination: one page);
- `HEAD`/`GET /{repo}/resolve/{rev}/{path}` with `ETag`, `X-Repo-Commit`, `Content-Length`,
  `Accept-Ranges`, and `Range: bytes=N-` answered 206 with `Content-Range`;
- 404 `RepoNotFound` for unknown repos, 401 for a repo that requires a token when none (or
  another) is sent, 404 `EntryNotFound` for unknown files.

Faults for tests: `cut_once(path, after_bytes)` ends the next transfer of a file after that
many body bytes (the client sees a short body and resumes), `fail_once(path, status)`
answers the next request for a file with an error status. Every request is recorded (method,
path, Range header) in a bounded log, so a test can assert what was or was not re-fetched.
Repositories live in memory; a repo has named commits and a movable `main`.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import deque
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

REQUEST_LOG_LIMIT = 10_000
"""Requests kept for assertions; older ones are dropped (tests make far fewer)."""
CHUNK_BYTES = 64 * 1024


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    range: str | None
    authorization: str | None


@dataclass
class MockRepo:
    repo_id: str
    commits: dict[str, dict[str, bytes]]
    """Commit sha (40 hex) -> files (repo-relative path -> bytes)."""
    main: str
    token: str | None = None
    """When set, every request for this repo must carry `Authorization: Bearer <token>`."""
    tags: tuple[str, ...] = ()

    def resolve(self, revision: str) -> str | None:
        if revision == "main":
            return self.main
        return revision if revision in self.commits else None


def commit_sha(label: str) -> str:
    """A deterministic fake commit id for a label."""
    return hashlib.sha1(label.encode()).hexdigest()


@dataclass
class MockHub:
    repos: dict[str, MockRepo] = field(default_factory=dict)
    requests: deque[Request] = field(default_factory=lambda: deque(maxlen=REQUEST_LOG_LIMIT))
    _cuts: dict[str, int] = field(default_factory=dict)
    _failures: dict[str, int] = field(default_factory=dict)
    _failure_counts: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    url: str = ""

    # -- content -----------------------------------------------------------------------------

    def add_repo(self, repo_id: str, files: Mapping[str, bytes], *, label: str | None = None,
                 token: str | None = None, tags: tuple[str, ...] = ()) -> str:
        """Create a repo whose main is one commit holding `files`; returns the commit sha."""
        sha = commit_sha(label or repo_id)
        self.repos[repo_id] = MockRepo(repo_id, {sha: dict(files)}, sha, token=token, tags=tags)
        return sha

    def push(self, repo_id: str, files: Mapping[str, bytes], *, label: str) -> str:
        """A new commit on main (main moves; the old commit stays addressable)."""
        sha = commit_sha(label)
        repo = self.repos[repo_id]
        repo.commits[sha] = dict(files)
        repo.main = sha
        return sha

    # -- faults ------------------------------------------------------------------------------

    def cut_once(self, path: str, after_bytes: int) -> None:
        """The next GET of a file whose repo path is `path` stops after `after_bytes`."""
        with self._lock:
            self._cuts[path] = after_bytes

    def fail_once(self, name: str, status: int, times: int = 1) -> None:
        """The next `times` requests for file `name` (or, when `name` is a repo id, for that
        repo's listing) answer `status`."""
        with self._lock:
            self._failures[name] = status
            self._failure_counts[name] = times

    def clear_faults(self) -> None:
        with self._lock:
            self._cuts.clear()
            self._failures.clear()
            self._failure_counts.clear()

    def _take(self, table: dict[str, int], name: str) -> int | None:
        with self._lock:
            if table is self._failures and name in table:
                self._failure_counts[name] -= 1
                if self._failure_counts[name] > 0:
                    return table[name]
            return table.pop(name, None)

    # -- assertions --------------------------------------------------------------------------

    def listing_requests(self, repo_id: str) -> list[Request]:
        return [r for r in list(self.requests) if r.path.startswith(f"/api/models/{repo_id}")]

    def file_requests(self, path: str, method: str = "GET") -> list[Request]:
        return [r for r in list(self.requests) if r.method == method and r.path.endswith("/" + path)
                and "/resolve/" in r.path]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    hub: MockHub  # set on the subclass made per server

    def log_message(self, *_args: object) -> None:  # quiet test output
        return None

    # -- plumbing ----------------------------------------------------------------------------

    def _send(self, status: int, body: bytes = b"", headers: Mapping[str, str] | None = None,
              content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, data: object, headers: Mapping[str, str] | None = None) -> None:
        self._send(status, json.dumps(data).encode(), headers)

    def _error(self, status: int, code: str | None, message: str) -> None:
        headers = {"X-Error-Message": message}
        if code:
            headers["X-Error-Code"] = code
        self._json(status, {"error": message}, headers)

    def _authorized(self, repo: MockRepo) -> bool:
        if repo.token is None:
            return True
        return self.headers.get("Authorization") == f"Bearer {repo.token}"

    def _repo_or_error(self, repo_id: str) -> MockRepo | None:
        repo = self.hub.repos.get(repo_id)
        if repo is None:
            self._error(404, "RepoNotFound", "Repository not found")
            return None
        if not self._authorized(repo):
            if self.headers.get("Authorization"):
                self._error(401, None, "Invalid credentials in Authorization header")
            else:
                self._error(401, "RepoNotFound", "Invalid username or password.")
            return None
        return repo

    # -- routes ------------------------------------------------------------------------------

    def do_HEAD(self) -> None:
        self._route()

    def do_GET(self) -> None:
        self._route()

    def _route(self) -> None:
        parts = urlsplit(self.path)
        path = unquote(parts.path)
        query = parse_qs(parts.query)
        self.hub.requests.append(Request(self.command, path, self.headers.get("Range"),
                                         self.headers.get("Authorization")))
        segments = [s for s in path.split("/") if s]
        if segments[:2] == ["api", "models"]:
            if len(segments) == 2:
                return self._search(query)
            if len(segments) == 4:
                return self._info("/".join(segments[2:4]), "main", query)
            if len(segments) == 6 and segments[4] == "revision":
                return self._info("/".join(segments[2:4]), segments[5], query)
        if len(segments) >= 5 and segments[2] == "resolve":
            return self._file("/".join(segments[:2]), segments[3], "/".join(segments[4:]))
        self._error(404, None, f"no route {path}")

    def _search(self, query: Mapping[str, list[str]]) -> None:
        needle = (query.get("search") or [""])[0].lower()
        limit = int((query.get("limit") or ["1000"])[0])
        found = [
            {"id": repo.repo_id, "modelId": repo.repo_id, "sha": repo.main, "tags": list(repo.tags),
             "downloads": 0, "likes": 0, "private": repo.token is not None}
            for repo_id, repo in sorted(self.hub.repos.items())
            if needle in repo_id.lower()
        ]
        self._json(200, found[:limit])

    def _info(self, repo_id: str, revision: str, query: Mapping[str, list[str]]) -> None:
        repo = self._repo_or_error(repo_id)
        if repo is None:
            return
        sha = repo.resolve(revision)
        if sha is None:
            return self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        status = self.hub._take(self.hub._failures, repo_id)
        if status is not None:
            return self._error(status, None, "injected failure")
        blobs = (query.get("blobs") or ["false"])[0].lower() == "true"
        siblings = []
        for name, content in sorted(repo.commits[sha].items()):
            entry: dict[str, object] = {"rfilename": name}
            if blobs:
                entry["size"] = len(content)
                entry["blobId"] = hashlib.sha1(content).hexdigest()
            siblings.append(entry)
        self._json(200, {"id": repo.repo_id, "modelId": repo.repo_id, "sha": sha, "private": repo.token is not None,
                         "tags": list(repo.tags), "siblings": siblings})

    def _file(self, repo_id: str, revision: str, name: str) -> None:
        repo = self._repo_or_error(repo_id)
        if repo is None:
            return
        sha = repo.resolve(revision)
        if sha is None:
            return self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        content = repo.commits[sha].get(name)
        if content is None:
            return self._error(404, "EntryNotFound", f"{name} does not exist at {revision}", )
        status = self.hub._take(self.hub._failures, name)
        if status is not None:
            return self._error(status, None, "injected failure")
        headers = {
            "ETag": f'"{hashlib.sha256(content).hexdigest()}"',
            "X-Repo-Commit": sha,
            "Accept-Ranges": "bytes",
        }
        start = 0
        range_header = self.headers.get("Range")
        if range_header and range_header.startswith("bytes=") and self.command == "GET":
            first = range_header[len("bytes="):].split("-", 1)[0]
            start = int(first) if first else 0
        body = content[start:]
        self.send_response(206 if start else 200)
        self.send_header("Content-Type", "application/octet-stream")
        for key, value in headers.items():
            self.send_header(key, value)
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(content) - 1}/{len(content)}")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command == "HEAD":
            return
        cut = self.hub._take(self.hub._cuts, name)
        if cut is not None:
            self.wfile.write(body[:cut])
            self.wfile.flush()
            self.close_connection = True  # the client sees a body shorter than Content-Length
            return
        try:
            for offset in range(0, len(body), CHUNK_BYTES):
                self.wfile.write(body[offset:offset + CHUNK_BYTES])
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client read what it wanted (a header) and left


@contextmanager
def serve(hub: MockHub) -> Iterator[MockHub]:
    """Serve `hub` on a free loopback port until the block ends (even when it fails);
    `hub.url` is its base URL, the value for HF_ENDPOINT."""
    handler = type("BoundHandler", (_Handler,), {"hub": hub})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True,
                              name="mockhub")
    thread.start()
    hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield hub
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


# ---------------------------------------------------------------------------------------
# The project's tiny generated model, published on a mock hub (fixtures for test modules:
# `from tests.mockhub import mock_hub, tiny_artifacts`)
# ---------------------------------------------------------------------------------------

import pytest  # noqa: E402 - fixtures below; the server above has no pytest dependency

TINY_MLX_REPO = "mock-org/tiny-llama-mlx"
TINY_GGUF_REPO = "mock-org/tiny-llama-GGUF"
PRIVATE_REPO = "mock-org/private-tiny-llama"
HUB_TOKEN = "hf_mocktoken"
GGUF_FILE = "tiny-llama-Q4_K_M.gguf"


@pytest.fixture(scope="session")
def tiny_artifacts(tmp_path_factory):
    """The generated tiny model (HF folder + GGUF), written once per test session."""
    from skulk.models.tiny_models import TINY_SPEC, generate_tiny_model

    return generate_tiny_model(tmp_path_factory.mktemp("tiny-model"), TINY_SPEC)


def tiny_repo_files(artifacts) -> tuple[dict[str, bytes], dict[str, bytes]]:
    """(MLX repo files, GGUF repo files) built from the generated model, with the clutter a
    real repo has (README, other runtimes' weights, other quants, a split file)."""
    mlx = {p.name: p.read_bytes() for p in sorted(artifacts.hf_dir.iterdir()) if p.is_file()}
    mlx["README.md"] = b"# tiny llama\n"
    mlx["original/consolidated.pth"] = b"\0" * 1024
    gguf = artifacts.gguf_path.read_bytes()
    half = len(gguf) // 2
    gguf_files = {
        GGUF_FILE: gguf,
        "tiny-llama-Q8_0.gguf": gguf,
        "split/tiny-llama-F16-00001-of-00002.gguf": gguf[:half],
        "split/tiny-llama-F16-00002-of-00002.gguf": gguf[half:],
        "README.md": b"# tiny llama gguf\n",
    }
    return mlx, gguf_files


@pytest.fixture
def mock_hub(tiny_artifacts, monkeypatch):
    """A served MockHub holding the tiny model as an MLX repo, a GGUF repo and a private
    (token-only) MLX repo; HF_ENDPOINT points at it and no HF_TOKEN is set."""
    mlx, gguf = tiny_repo_files(tiny_artifacts)
    hub = MockHub()
    hub.add_repo(TINY_MLX_REPO, mlx, tags=("mlx", "safetensors", "llama"))
    hub.add_repo(TINY_GGUF_REPO, gguf, tags=("gguf", "llama"))
    hub.add_repo(PRIVATE_REPO, mlx, token=HUB_TOKEN, tags=("mlx",))
    with serve(hub):
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        monkeypatch.delenv("HF_TOKEN", raising=False)
        monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
        monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        yield hub


def hub_card(model_id: str, *, gguf_file: str | None = None, revision: str | None = None):
    """A huggingface card of the tiny model's shape for `model_id` (GGUF when gguf_file)."""
    from skulk.models.tiny_models import TINY_SPEC
    from skulk.shared.types.cards import ModelCard

    backends = ["llama_cpp", "llama_cpp-cpu"] if gguf_file else ["mlx", "mlx-cpu"]
    return ModelCard.model_validate({
        "model_id": model_id, "name": model_id, "family": "llama", "source": "huggingface",
        "source_revision": revision, "gguf_file": gguf_file, "quantization": "f32",
        "storage_size_bytes": 5_000_000, "tasks": ["TextGeneration"], "capabilities": ["text"],
        "num_layers": TINY_SPEC.num_layers, "hidden_size": TINY_SPEC.hidden_size,
        "num_attention_heads": TINY_SPEC.num_attention_heads, "num_key_value_heads": TINY_SPEC.num_key_value_heads,
        "head_dim": TINY_SPEC.head_dim, "vocab_size": TINY_SPEC.vocab_size, "context_length": TINY_SPEC.context_length,
        "placement": {"compatible_backends": backends},
    })
