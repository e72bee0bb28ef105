"""Downloading cards from a (mock) Hugging Face Hub over real HTTP with the real client."""

from __future__ import annotations

import hashlib
import itertools
import threading

import pytest

from skulk.artifacts.resolve import ensure_local_model
from skulk.models.artifact_errors import ArtifactUnavailable
from skulk.models.downloads import (
    MARKER_FILE_NAME,
    DownloadFailed,
    HubSource,
    ProgressGate,
    RetryPolicy,
    backoff_delay_s,
    classify_error,
    download_model,
    downloaded_models,
    gate_progress,
    local_artifact,
    read_marker,
    remove_model,
)
from tests.mockhub import (
    GGUF_FILE,
    HUB_TOKEN,
    PRIVATE_REPO,
    TINY_GGUF_REPO,
    TINY_MLX_REPO,
    hub_card,
    mock_hub,  # noqa: F401 - fixture
    tiny_artifacts,  # noqa: F401 - fixture
)

FAST = RetryPolicy(max_attempts=3, base_delay_s=0.05, max_delay_s=0.1, deadline_s=60)
MLX_FILES = sorted(
    ["config.json", "generation_config.json", "model.safetensors", "special_tokens_map.json", "tokenizer.json",
     "tokenizer_config.json"]
)


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_pull_mlx_repo_selects_model_files_and_reports_progress(mock_hub, tmp_path):
    progress: list[tuple[int, int]] = []
    path = download_model(hub_card(TINY_MLX_REPO), tmp_path, on_progress=lambda d, t: progress.append((d, t)),
                          policy=FAST)

    assert path == tmp_path / "mock-org--tiny-llama-mlx"
    assert sorted(p.name for p in path.iterdir() if p.name != MARKER_FILE_NAME) == MLX_FILES
    repo_files = mock_hub.repos[TINY_MLX_REPO].commits[mock_hub.repos[TINY_MLX_REPO].main]
    total = sum(len(repo_files[name]) for name in MLX_FILES)
    assert progress[-1] == (total, total)
    assert all(b[0] >= a[0] for a, b in itertools.pairwise(progress)), "progress went backwards"
    assert len(progress) > 2
    marker = read_marker(path)
    assert marker is not None and marker.revision == mock_hub.repos[TINY_MLX_REPO].main and not marker.pinned
    for name in MLX_FILES:
        assert (path / name).read_bytes() == repo_files[name]

    # A complete copy is reused without asking the hub anything.
    seen = len(mock_hub.requests)
    assert download_model(hub_card(TINY_MLX_REPO), tmp_path, policy=FAST) == path
    assert len(mock_hub.requests) == seen
    assert downloaded_models(tmp_path)[TINY_MLX_REPO][0].revision == marker.revision


def test_ensure_local_model_downloads_huggingface_cards(mock_hub, tmp_path):
    path = ensure_local_model(hub_card(TINY_GGUF_REPO, gguf_file=GGUF_FILE), tmp_path)
    assert path == tmp_path / "mock-org--tiny-llama-GGUF" / GGUF_FILE
    repo = mock_hub.repos[TINY_GGUF_REPO]
    assert _digest(path.read_bytes()) == _digest(repo.commits[repo.main][GGUF_FILE])
    # Only the card's quant: not the other quants, not the README.
    assert sorted(p.name for p in path.parent.iterdir()) == sorted([GGUF_FILE, MARKER_FILE_NAME])


def test_split_gguf_downloads_its_whole_shard_group(mock_hub, tmp_path):
    first = "split/tiny-llama-F16-00001-of-00002.gguf"
    path = download_model(hub_card(TINY_GGUF_REPO, gguf_file=first), tmp_path, policy=FAST)
    assert path.name == "tiny-llama-F16-00001-of-00002.gguf"
    assert (path.parent / "tiny-llama-F16-00002-of-00002.gguf").is_file()
    # Another quant of the same commit joins the same directory; the first stays.
    other = download_model(hub_card(TINY_GGUF_REPO, gguf_file=GGUF_FILE), tmp_path, policy=FAST)
    assert other == tmp_path / "mock-org--tiny-llama-GGUF" / GGUF_FILE and path.is_file()
    assert path == tmp_path / "mock-org--tiny-llama-GGUF" / first
    assert local_artifact(hub_card(TINY_GGUF_REPO, gguf_file=first), tmp_path) == path


def test_interrupted_transfer_resumes_from_where_it_stopped(mock_hub, tmp_path, monkeypatch):
    import huggingface_hub.constants

    # huggingface_hub writes the body in DOWNLOAD_CHUNK_SIZE pieces (10 MiB), and a cut loses
    # the unwritten piece; the tiny model is ~5 MB, so use smaller pieces to see the resume.
    monkeypatch.setattr(huggingface_hub.constants, "DOWNLOAD_CHUNK_SIZE", 64 * 1024)
    cut_at = 1_000_000
    mock_hub.cut_once(GGUF_FILE, cut_at)
    path = download_model(hub_card(TINY_GGUF_REPO, gguf_file=GGUF_FILE), tmp_path, policy=FAST)

    gets = mock_hub.file_requests(GGUF_FILE)
    assert len(gets) == 2, gets
    assert gets[0].range is None
    assert gets[1].range is not None and gets[1].range.startswith("bytes=")
    resumed_from = int(gets[1].range.removeprefix("bytes=").split("-")[0])
    assert 0 < resumed_from <= cut_at, "the resumed request re-fetched bytes it already had"
    repo = mock_hub.repos[TINY_GGUF_REPO]
    assert _digest(path.read_bytes()) == _digest(repo.commits[repo.main][GGUF_FILE])


def test_a_later_download_resumes_an_interrupted_one(mock_hub, tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "DOWNLOAD_CHUNK_SIZE", 64 * 1024)
    card = hub_card(TINY_MLX_REPO)
    cancel = threading.Event()
    stopped_at: list[int] = []

    def on_progress(done: int, _total: int) -> None:
        # Stop mid-way through the weights (~5 MB; the small files come first, sorted).
        if done > 2_000_000 and not cancel.is_set():
            stopped_at.append(done)
            cancel.set()

    with pytest.raises(DownloadFailed) as failure:  # an operator's Ctrl-C, a node shutdown
        download_model(card, tmp_path, on_progress=on_progress, cancel=cancel, policy=FAST)
    assert failure.value.kind == "cancelled"
    config_gets = len(mock_hub.file_requests("config.json"))

    path = download_model(card, tmp_path, policy=FAST)  # a new call, as a new process would

    weights = mock_hub.file_requests("model.safetensors")
    assert len(weights) == 2 and weights[0].range is None
    resumed_from = int(weights[1].range.removeprefix("bytes=").split("-")[0])
    assert resumed_from > 1_000_000, "the second download started the weights over"
    assert len(mock_hub.file_requests("config.json")) == config_gets, "a finished file was fetched again"
    repo = mock_hub.repos[TINY_MLX_REPO]
    assert _digest((path / "model.safetensors").read_bytes()) == _digest(repo.commits[repo.main]["model.safetensors"])
    assert not (tmp_path / ".mock-org--tiny-llama-mlx.partial").exists()


def test_unknown_repo_fails_typed_without_retrying(mock_hub, tmp_path):
    with pytest.raises(DownloadFailed) as failure:
        download_model(hub_card("mock-org/does-not-exist"), tmp_path, policy=FAST)
    assert failure.value.kind == "not_found"
    assert "does not exist" in failure.value.reason
    assert isinstance(failure.value, ArtifactUnavailable)  # the worker's failure path
    assert len(mock_hub.listing_requests("mock-org/does-not-exist")) == 1


def test_unknown_pinned_revision_fails_typed(mock_hub, tmp_path):
    with pytest.raises(DownloadFailed) as failure:
        download_model(hub_card(TINY_MLX_REPO, revision="0" * 40), tmp_path, policy=FAST)
    assert failure.value.kind == "not_found"
    assert "revision" in failure.value.reason


def test_private_repo_needs_a_token(mock_hub, tmp_path, monkeypatch):
    with pytest.raises(DownloadFailed) as failure:
        download_model(hub_card(PRIVATE_REPO), tmp_path, policy=FAST)
    assert failure.value.kind == "unauthorized"
    assert "HF_TOKEN" in failure.value.reason
    assert len(mock_hub.listing_requests(PRIVATE_REPO)) == 1

    with pytest.raises(DownloadFailed) as failure:
        download_model(hub_card(PRIVATE_REPO), tmp_path, hub=HubSource(mock_hub.url, "hf_wrong"), policy=FAST)
    assert failure.value.kind == "unauthorized"

    monkeypatch.setenv("HF_TOKEN", HUB_TOKEN)  # read at call time, like HF_ENDPOINT
    path = download_model(hub_card(PRIVATE_REPO), tmp_path, policy=FAST)
    assert (path / "model.safetensors").is_file()
    assert all(r.authorization == f"Bearer {HUB_TOKEN}" for r in mock_hub.file_requests("model.safetensors"))


def test_transient_errors_are_retried_then_reported(mock_hub, tmp_path):
    mock_hub.fail_once(TINY_MLX_REPO, 503)
    path = download_model(hub_card(TINY_MLX_REPO), tmp_path, policy=FAST)
    assert (path / "config.json").is_file()
    assert len(mock_hub.listing_requests(TINY_MLX_REPO)) == 2

    mock_hub.fail_once(TINY_GGUF_REPO, 503, times=10)
    with pytest.raises(DownloadFailed) as failure:
        download_model(hub_card(TINY_GGUF_REPO, gguf_file=GGUF_FILE), tmp_path, policy=FAST)
    assert failure.value.kind == "transient"
    assert "503" in failure.value.reason and "3 attempts" in failure.value.reason
    assert len(mock_hub.listing_requests(TINY_GGUF_REPO)) == FAST.max_attempts


def test_pinned_revision_is_never_replaced_by_another(mock_hub, tmp_path):
    repo = mock_hub.repos[TINY_MLX_REPO]
    first = repo.main
    old_config = repo.commits[first]["config.json"]
    second = mock_hub.push(TINY_MLX_REPO, {**repo.commits[first], "config.json": b'{"moved": true}'}, label="v2")

    pinned = download_model(hub_card(TINY_MLX_REPO, revision=first), tmp_path, policy=FAST)
    assert pinned == tmp_path / f"mock-org--tiny-llama-mlx@{first}"
    assert (pinned / "config.json").read_bytes() == old_config
    assert read_marker(pinned).revision == first and read_marker(pinned).pinned

    # main moved: the unpinned card gets main's bytes in its own directory; the pin is untouched.
    main = download_model(hub_card(TINY_MLX_REPO), tmp_path, policy=FAST)
    assert main != pinned and read_marker(main).revision == second
    assert (main / "config.json").read_bytes() == b'{"moved": true}'
    assert (pinned / "config.json").read_bytes() == old_config
    seen = len(mock_hub.requests)
    assert download_model(hub_card(TINY_MLX_REPO, revision=first), tmp_path, policy=FAST) == pinned
    assert len(mock_hub.requests) == seen

    # A pinned directory carrying another revision is the wrong artifact: replaced, but only
    # once the pinned revision has fully downloaded.
    marker_path = pinned / MARKER_FILE_NAME
    marker_path.write_text(marker_path.read_text().replace(first, second))
    assert local_artifact(hub_card(TINY_MLX_REPO, revision=first), tmp_path) is None
    mock_hub.fail_once(TINY_MLX_REPO, 404, times=10)
    with pytest.raises(DownloadFailed):
        download_model(hub_card(TINY_MLX_REPO, revision=first), tmp_path, policy=FAST)
    assert (pinned / "config.json").read_bytes() == old_config, "a failed fetch destroyed the previous copy"
    mock_hub.clear_faults()
    again = download_model(hub_card(TINY_MLX_REPO, revision=first), tmp_path, policy=FAST)
    assert again == pinned and read_marker(pinned).revision == first
    assert (pinned / "config.json").read_bytes() == old_config


def test_cancel_stops_a_download_and_remove_cleans_up(mock_hub, tmp_path):
    cancel = threading.Event()

    def on_progress(done: int, _total: int) -> None:
        if done > 0:
            cancel.set()

    with pytest.raises(DownloadFailed) as failure:
        download_model(hub_card(TINY_MLX_REPO), tmp_path, on_progress=on_progress, cancel=cancel, policy=FAST)
    assert failure.value.kind == "cancelled"
    assert local_artifact(hub_card(TINY_MLX_REPO), tmp_path) is None

    path = download_model(hub_card(TINY_MLX_REPO), tmp_path, policy=FAST)
    pinned = download_model(hub_card(TINY_MLX_REPO, revision=mock_hub.repos[TINY_MLX_REPO].main), tmp_path,
                            policy=FAST)
    removed = remove_model(tmp_path, TINY_MLX_REPO)
    assert set(removed) == {path, pinned}
    assert not path.exists() and not pinned.exists()
    assert remove_model(tmp_path, TINY_MLX_REPO) == []


# ---------------------------------------------------------------------------------------
# Pure parts
# ---------------------------------------------------------------------------------------


def _http_error(status: int, error_code: str | None = None):
    import httpx2
    from huggingface_hub.utils import hf_raise_for_status

    headers = {"X-Error-Code": error_code} if error_code else {}
    response = httpx2.Response(status, headers=headers,
                                request=httpx2.Request("GET", "https://hub.test/api/models/a/b"))
    try:
        hf_raise_for_status(response)
    except Exception as exc:
        return exc
    raise AssertionError("no error raised")


@pytest.mark.parametrize(
    ("make", "retryable", "kind"),
    [
        (lambda: _http_error(404, "RepoNotFound"), False, "not_found"),
        (lambda: _http_error(401, "RepoNotFound"), False, "unauthorized"),
        (lambda: _http_error(403), False, "unauthorized"),
        (lambda: _http_error(401), False, "unauthorized"),
        (lambda: _http_error(404, "RevisionNotFound"), False, "not_found"),
        (lambda: _http_error(404, "EntryNotFound"), False, "not_found"),
        (lambda: _http_error(403, "GatedRepo"), False, "unauthorized"),
        (lambda: _http_error(503), True, "transient"),
        (lambda: _http_error(429), True, "transient"),
        (lambda: _http_error(400), False, "error"),
        (lambda: ConnectionError("reset"), True, "transient"),
        (lambda: OSError(28, "No space left on device"), False, "disk"),
        (lambda: OSError("Consistency check failed"), True, "transient"),
        (lambda: ValueError("bug"), False, "error"),
    ],
)
def test_classify_error(make, retryable, kind):
    assert classify_error(make())[:2] == (retryable, kind)


@pytest.mark.parametrize(("attempt", "expected"), [(1, 1.0), (2, 2.0), (3, 4.0), (5, 16.0), (9, 16.0)])
def test_backoff_is_exponential_and_capped(attempt, expected):
    assert backoff_delay_s(attempt, RetryPolicy(base_delay_s=1.0, max_delay_s=16.0)) == expected


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, HubSource(None, None)),
        ({"HF_ENDPOINT": "http://mirror:8080/", "HF_TOKEN": "t"}, HubSource("http://mirror:8080", "t")),
        ({"HF_ENDPOINT": "", "HF_TOKEN": ""}, HubSource(None, None)),
    ],
)
def test_hub_source_from_env(env, expected):
    assert HubSource.from_env(env) == expected


@pytest.mark.parametrize(
    ("gate", "now", "done", "total", "passes"),
    [
        (ProgressGate(), 0.0, 10, 100, True),  # the first sample
        (ProgressGate(10.0, 10), 10.5, 20, 100, False),  # too soon
        (ProgressGate(10.0, 10), 11.0, 20, 100, True),  # interval elapsed
        (ProgressGate(10.0, 10), 10.1, 100, 100, True),  # the final sample always passes
        (ProgressGate(10.0, 50), 20.0, 40, 100, False),  # backwards (a restarted transfer)
        (ProgressGate(10.0, 100), 20.0, 100, 100, False),  # the final sample only once
    ],
)
def test_gate_progress(gate, now, done, total, passes):
    new_gate, passed = gate_progress(gate, now, done, total, min_interval_s=1.0)
    assert passed is passes
    assert new_gate == (ProgressGate(now, done) if passes else gate)
