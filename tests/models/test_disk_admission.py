"""The disk reserve a hub download keeps: the pure admission arithmetic, the env knob, and
refusals through the mock hub that happen before any byte is written."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from skulk.datadir.config import ConfigError, SkulkConfig, with_env_overrides
from skulk.model_store.eviction import DEFAULT_RESERVE_BYTES, GIB
from skulk.models.disk_admission import DISK_RESERVE_ENV, admit, bytes_to_fetch, reserve_bytes_from_env
from skulk.models.downloads import DownloadFailed, RetryPolicy, download_model
from tests.mockhub import (
    GGUF_FILE,
    TINY_GGUF_REPO,
    TINY_MLX_REPO,
    hub_card,
    mock_hub,  # noqa: F401 - fixture
    tiny_artifacts,  # noqa: F401 - fixture
)

FAST = RetryPolicy(max_attempts=3, base_delay_s=0.05, max_delay_s=0.1, deadline_s=60)


@pytest.mark.parametrize(
    ("sizes", "present", "free", "reserve", "needed", "fits"),
    [
        ({"a": 100}, {}, 100, 0, 100, True),  # exactly fits
        ({"a": 100}, {}, 99, 0, 100, False),
        ({"a": 100}, {}, 150, 60, 100, False),  # the reserve is what refuses it
        ({"a": 100}, {}, 160, 60, 100, True),
        ({"a": 100, "b": 50}, {"a": 100}, 50, 0, 50, True),  # a finished file credits fully
        ({"a": 100}, {"a": 40}, 60, 0, 60, True),  # a resumable partial credits what it has
        ({"a": 100}, {"a": 400}, 0, 0, 0, True),  # an oversize partial never credits past the size
        ({"a": 100}, {"b": 100}, 99, 0, 100, False),  # another file's bytes credit nothing
        ({}, {}, 0, 10, 0, False),  # nothing to fetch, but the volume is already inside the reserve
        ({}, {}, 10, 10, 0, True),
    ],
)
def test_admit(sizes, present, free, reserve, needed, fits):
    verdict = admit(sizes, present, free, reserve)
    assert (verdict.needed_bytes, verdict.fits) == (needed, fits)
    assert verdict.shortfall_bytes == max(0, needed + reserve - free)


def test_a_refusal_states_the_arithmetic():
    reason = admit({"a": 3 * GIB}, {}, 12 * GIB, 10 * GIB).reason("/models")
    assert "/models" in reason
    for figure in (3 * GIB, 10 * GIB, 13 * GIB, 12 * GIB, 1 * GIB):  # needed, reserve, sum, free, short
        assert str(figure) in reason


def test_bytes_to_fetch_sums_what_is_missing():
    assert bytes_to_fetch({"a": 10, "b": 20}, {"a": 5, "b": 25}) == 5


@pytest.mark.parametrize(
    ("env", "expected"),
    [({}, DEFAULT_RESERVE_BYTES), ({DISK_RESERVE_ENV: ""}, DEFAULT_RESERVE_BYTES), ({DISK_RESERVE_ENV: "0"}, 0),
     ({DISK_RESERVE_ENV: "0.5"}, GIB // 2), ({DISK_RESERVE_ENV: " 2 "}, 2 * GIB)],
)
def test_reserve_from_env(env, expected):
    assert reserve_bytes_from_env(env) == expected


@pytest.mark.parametrize("value", ["-1", "lots", "nan"])
def test_a_malformed_reserve_is_an_error_naming_the_variable(value):
    with pytest.raises(ValueError, match=DISK_RESERVE_ENV):
        reserve_bytes_from_env({DISK_RESERVE_ENV: value})
    with pytest.raises(ConfigError, match=DISK_RESERVE_ENV):
        with_env_overrides(SkulkConfig(), {DISK_RESERVE_ENV: value})


def test_the_env_overrides_the_config_file():
    assert with_env_overrides(SkulkConfig(), {}).model_store.disk_reserve_gb == 10.0
    assert with_env_overrides(SkulkConfig(), {DISK_RESERVE_ENV: "1.5"}).model_store.disk_reserve_gb == 1.5


# -- through the mock hub -----------------------------------------------------------------------


def written_files(models_dir: Path) -> list[str]:
    """Every file under the models dir except the lock files a download opens first."""
    if not models_dir.exists():
        return []
    return sorted(str(p.relative_to(models_dir)) for p in models_dir.rglob("*")
                  if p.is_file() and not p.name.endswith(".lock"))


def test_a_download_that_would_eat_the_reserve_is_refused_before_writing(mock_hub, tmp_path):
    card = hub_card(TINY_GGUF_REPO, gguf_file=GGUF_FILE)
    size = len(mock_hub.repos[TINY_GGUF_REPO].commits[mock_hub.repos[TINY_GGUF_REPO].main][GGUF_FILE])
    with pytest.raises(DownloadFailed) as caught:
        download_model(card, tmp_path, policy=FAST, reserve_bytes=10 * GIB, free_bytes=lambda _p: 10 * GIB + size - 1)
    assert caught.value.kind == "disk"
    assert f"{size} bytes" in caught.value.reason and f"{10 * GIB} bytes" in caught.value.reason
    assert written_files(tmp_path) == []
    assert mock_hub.file_requests(GGUF_FILE) == [] and mock_hub.file_requests(GGUF_FILE, "HEAD") == []
    # With one more byte free it fits.
    path = download_model(card, tmp_path, policy=FAST, reserve_bytes=10 * GIB, free_bytes=lambda _p: 10 * GIB + size)
    assert path.stat().st_size == size


def test_the_env_knob_sets_the_reserve_of_a_bare_download(mock_hub, tmp_path, monkeypatch):
    monkeypatch.setenv(DISK_RESERVE_ENV, str(10**9))  # a billion GiB: no real disk has that free
    card = hub_card(TINY_MLX_REPO)
    with pytest.raises(DownloadFailed) as caught:
        download_model(card, tmp_path, policy=FAST)
    assert caught.value.kind == "disk" and DISK_RESERVE_ENV in caught.value.reason
    assert written_files(tmp_path) == []
    monkeypatch.setenv(DISK_RESERVE_ENV, "0")
    assert download_model(card, tmp_path, policy=FAST).is_dir()


def test_resumable_bytes_are_credited(mock_hub, tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "DOWNLOAD_CHUNK_SIZE", 64 * 1024)
    card = hub_card(TINY_GGUF_REPO, gguf_file=GGUF_FILE)
    size = len(mock_hub.repos[TINY_GGUF_REPO].commits[mock_hub.repos[TINY_GGUF_REPO].main][GGUF_FILE])
    cancel = threading.Event()

    def stop_halfway(done: int, _total: int) -> None:
        if done >= size // 2:
            cancel.set()

    with pytest.raises(DownloadFailed):
        download_model(card, tmp_path, policy=FAST, on_progress=stop_halfway, cancel=cancel, reserve_bytes=0,
                       free_bytes=lambda _p: size)
    have = sum(os.path.getsize(tmp_path / f) for f in written_files(tmp_path) if f.endswith(".incomplete"))
    assert 0 < have < size
    # Only the missing bytes must fit now.
    download_model(card, tmp_path, policy=FAST, reserve_bytes=0, free_bytes=lambda _p: size - have)


def test_concurrent_downloads_cannot_spend_the_same_free_bytes(mock_hub, tmp_path):
    """Admission and transfer are serialized per models dir: with room for either model but
    not both, exactly one download lands and the other is refused, whichever goes first."""
    mlx, gguf = hub_card(TINY_MLX_REPO), hub_card(TINY_GGUF_REPO, gguf_file=GGUF_FILE)
    gguf_size = len(mock_hub.repos[TINY_GGUF_REPO].commits[mock_hub.repos[TINY_GGUF_REPO].main][GGUF_FILE])
    mlx_files = mock_hub.repos[TINY_MLX_REPO].commits[mock_hub.repos[TINY_MLX_REPO].main]
    mlx_size = sum(len(b) for name, b in mlx_files.items() if "/" not in name and name != "README.md")
    budget = gguf_size + mlx_size - 1

    def free(_path: Path) -> int:  # a volume of `budget` bytes holding only this models dir
        return budget - sum(p.stat().st_size for p in tmp_path.rglob("*") if p.is_file())

    outcomes: dict[str, object] = {}

    def pull(card) -> None:
        try:
            outcomes[card.model_id] = download_model(card, tmp_path, policy=FAST, reserve_bytes=0, free_bytes=free)
        except DownloadFailed as exc:
            outcomes[card.model_id] = exc

    threads = [threading.Thread(target=pull, args=(c,)) for c in (mlx, gguf)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    failures = [o for o in outcomes.values() if isinstance(o, DownloadFailed)]
    assert len(outcomes) == 2 and len(failures) == 1 and failures[0].kind == "disk"
