"""Reading repository metadata from the Hugging Face Hub (listings, search, small files).

The I/O half of model discovery: the routes ask here for a repo's file listing, a search,
a config.json or the first bytes of a GGUF file, and hand the answers to the pure
`card_builder`. Every call is one bounded request (METADATA_TIMEOUT_S, byte caps) through
huggingface_hub's own session, with HF_ENDPOINT/HF_TOKEN read at call time (`HubSource`).
Failures come out as `HubError` with the same kinds the downloader uses, so an API maps
"no such repo" and "not allowed" to distinct answers. Blocking: call from a thread.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from skulk.models.downloads import METADATA_TIMEOUT_S, FailureKind, HubSource, classify_error
from skulk.models.hub_files import RepoFile

CONFIG_LIMIT_BYTES = 4 * 1024 * 1024
"""Largest config.json read (real ones are a few KB; a bigger one is not a config)."""
SEARCH_LIMIT = 20
"""Most results one hub search returns to a caller."""


class HubError(Exception):
    """A metadata request that failed: what was asked, why, and the downloader's kind."""

    def __init__(self, what: str, reason: str, kind: FailureKind) -> None:
        self.what = what
        self.reason = reason
        self.kind = kind
        super().__init__(what, reason, kind)

    def __str__(self) -> str:
        return f"{self.what}: {self.reason}"


@dataclass(frozen=True)
class RepoListing:
    repo_id: str
    revision: str
    """The commit the listing is at (a pinned revision, or what main pointed to)."""
    files: tuple[RepoFile, ...]


@dataclass(frozen=True)
class SearchHit:
    repo_id: str
    tags: tuple[str, ...]
    downloads: int | None
    likes: int | None


def _api(hub: HubSource):  # -> huggingface_hub.HfApi
    from huggingface_hub import HfApi

    return HfApi(endpoint=hub.endpoint, token=hub.token)


def _call(what: str, op):
    try:
        return op()
    except HubError:
        raise
    except Exception as exc:
        _retryable, kind, reason = classify_error(exc)
        raise HubError(what, reason, kind) from exc


def repo_listing(repo_id: str, hub: HubSource, revision: str | None = None) -> RepoListing:
    def op() -> RepoListing:
        info = _api(hub).model_info(repo_id, revision=revision or "main", files_metadata=True,
                                    timeout=METADATA_TIMEOUT_S)
        files = tuple(RepoFile(s.rfilename, s.size) for s in (info.siblings or []))
        return RepoListing(repo_id, info.sha or (revision or "main"), files)

    return _call(f"listing {repo_id}", op)


def search(query: str, hub: HubSource, limit: int = SEARCH_LIMIT) -> list[SearchHit]:
    def op() -> list[SearchHit]:
        return [
            SearchHit(m.id, tuple(m.tags or ()), m.downloads, m.likes)
            for m in _api(hub).list_models(search=query, limit=limit)
        ]

    return _call(f"searching {query!r}", op)


def _stream(repo_id: str, path: str, revision: str, hub: HubSource, limit_bytes: int,
            range_end: int | None = None, range_start: int = 0) -> bytes:
    from huggingface_hub import hf_hub_url
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

    url = hf_hub_url(repo_id, path, revision=revision, endpoint=hub.endpoint)
    headers = build_hf_headers(token=hub.token)
    headers["Accept-Encoding"] = "identity"
    if range_end is not None:
        headers["Range"] = f"bytes={range_start}-{range_end - 1}"
    with get_session().stream("GET", url, headers=headers, timeout=METADATA_TIMEOUT_S,
                              follow_redirects=True) as response:
        if response.status_code >= 400:
            response.read()
            hf_raise_for_status(response)
        if range_start and response.status_code != 206:  # a whole file from byte 0 is not what was asked
            raise ValueError(f"the server answered a Range request from byte {range_start} with the whole file")
        chunks: list[bytes] = []
        size = 0
        for chunk in response.iter_bytes():
            chunks.append(chunk)
            size += len(chunk)
            if size >= limit_bytes:
                break
    return b"".join(chunks)[:limit_bytes]


def read_json(repo_id: str, path: str, revision: str, hub: HubSource) -> dict[str, Any]:
    """A small JSON file of the repo (config.json), capped at CONFIG_LIMIT_BYTES."""
    data = _call(f"reading {repo_id}/{path}", lambda: _stream(repo_id, path, revision, hub, CONFIG_LIMIT_BYTES))
    try:
        parsed = json.loads(data)
    except ValueError as exc:
        raise HubError(f"reading {repo_id}/{path}", f"not JSON: {exc}", "error") from None
    if not isinstance(parsed, dict):
        raise HubError(f"reading {repo_id}/{path}", "not a JSON object", "error")
    return parsed


def read_range(repo_id: str, path: str, revision: str, hub: HubSource, offset: int, size_bytes: int) -> bytes:
    """Up to `size_bytes` of a repo file from byte `offset` (a Range request; fewer at the
    file's end). A server that ignores Range is an error, not a read from byte 0."""
    return _call(f"reading {repo_id}/{path}", lambda: _stream(repo_id, path, revision, hub, size_bytes,
                                                             range_end=offset + size_bytes, range_start=offset))


def read_prefix(repo_id: str, path: str, revision: str, hub: HubSource, size_bytes: int) -> bytes:
    """The first `size_bytes` of a repo file (a Range request; a server that ignores Range is
    still read no further than that)."""
    return _call(f"reading {repo_id}/{path}",
                 lambda: _stream(repo_id, path, revision, hub, size_bytes, range_end=size_bytes))


def growing_prefixes(limit_bytes: int, first_bytes: int = 1024 * 1024) -> Iterator[int]:
    """1 MiB, 4 MiB, 16 MiB, ... up to the limit: most GGUF headers fit the first read."""
    size = first_bytes
    while size < limit_bytes:
        yield size
        size *= 4
    yield limit_bytes


__all__ = [
    "CONFIG_LIMIT_BYTES",
    "SEARCH_LIMIT",
    "HubError",
    "RepoListing",
    "SearchHit",
    "growing_prefixes",
    "read_json",
    "read_prefix",
    "read_range",
    "repo_listing",
    "search",
]
