"""`skulk models pull|rm|list` against the mock hub (HF_ENDPOINT), through typer's runner."""

from __future__ import annotations

from typer.testing import CliRunner

from skulk.cli import app
from skulk.models.cards import write_custom_card
from tests.mockhub import (
    GGUF_FILE,
    TINY_GGUF_REPO,
    TINY_MLX_REPO,
    hub_card,
    mock_hub,  # noqa: F401 - fixture
    tiny_artifacts,  # noqa: F401 - fixture
)


def _invoke(*args: str):
    return CliRunner().invoke(app, list(args), catch_exceptions=False, env={"COLUMNS": "240"})


def test_pull_downloads_with_progress_then_rm_deletes(mock_hub, tmp_path):
    data_dir = tmp_path / "node"
    write_custom_card(data_dir / "custom_model_cards", hub_card(TINY_GGUF_REPO, gguf_file=GGUF_FILE))

    pulled = _invoke("models", "pull", TINY_GGUF_REPO, "--data-dir", str(data_dir))
    assert pulled.exit_code == 0, pulled.output
    target = data_dir / "models" / "mock-org--tiny-llama-GGUF" / GGUF_FILE
    assert str(target) in pulled.stdout
    assert target.is_file()
    assert "5.3/5.3 MB" in pulled.stderr  # the progress bar's final state: every byte

    listed = _invoke("models", "list", "--data-dir", str(data_dir))
    assert listed.exit_code == 0 and TINY_GGUF_REPO in listed.stdout
    row = next(line for line in listed.stdout.splitlines() if TINY_GGUF_REPO in line)
    assert "yes" in row

    removed = _invoke("models", "rm", TINY_GGUF_REPO, "--data-dir", str(data_dir))
    assert removed.exit_code == 0, removed.output
    assert not target.parent.exists()
    row = next(line for line in _invoke("models", "list", "--data-dir", str(data_dir)).stdout.splitlines()
               if TINY_GGUF_REPO in line)
    assert " no " in row
    again = _invoke("models", "rm", TINY_GGUF_REPO, "--data-dir", str(data_dir))
    assert again.exit_code == 1 and "no local copy" in again.stderr


def test_pull_failures_exit_with_the_reason(mock_hub, tmp_path):
    data_dir = tmp_path / "node"
    write_custom_card(data_dir / "custom_model_cards", hub_card("mock-org/gone"))

    # no card, so the hub is asked for the repo's metadata: it has no such repo
    missing_card = _invoke("models", "pull", "mock-org/no-card", "--data-dir", str(data_dir))
    assert missing_card.exit_code == 1 and "does not exist on the hub" in missing_card.stderr
    unknown_name = _invoke("models", "pull", "llama3.2:70b", "--data-dir", str(data_dir))
    assert unknown_name.exit_code == 2 and "Known here: llama3.2:1b, llama3.2:3b" in unknown_name.stderr

    missing_repo = _invoke("models", "pull", "mock-org/gone", "--data-dir", str(data_dir))
    assert missing_repo.exit_code == 1
    assert "not_found" in missing_repo.stderr and "does not exist" in missing_repo.stderr


def test_pull_fetches_companions_and_a_missing_one_fails(mock_hub, tmp_path):
    from skulk.shared.types.cards import ModelCard

    data_dir = tmp_path / "node"
    base = hub_card(TINY_GGUF_REPO, gguf_file=GGUF_FILE)
    card = ModelCard.model_validate({**base.model_dump(by_alias=False), "vision_weights_repo": TINY_MLX_REPO})
    write_custom_card(data_dir / "custom_model_cards", card)
    pulled = _invoke("models", "pull", TINY_GGUF_REPO, "--data-dir", str(data_dir))
    assert pulled.exit_code == 0, pulled.output
    assert f"companion {TINY_MLX_REPO}: {data_dir / 'models' / 'mock-org--tiny-llama-mlx'}" in pulled.stdout

    missing = ModelCard.model_validate({**base.model_dump(by_alias=False), "vision_weights_repo": "mock-org/gone"})
    write_custom_card(data_dir / "custom_model_cards", missing)
    failed = _invoke("models", "pull", TINY_GGUF_REPO, "--data-dir", str(data_dir))
    assert failed.exit_code == 1 and "companion vision repo mock-org/gone could not be obtained" in failed.stderr


def test_pull_refuses_to_eat_the_disk_reserve(mock_hub, tmp_path, monkeypatch):
    data_dir = tmp_path / "node"
    write_custom_card(data_dir / "custom_model_cards", hub_card(TINY_GGUF_REPO, gguf_file=GGUF_FILE))
    monkeypatch.setenv("SKULK_DISK_RESERVE_GB", str(10**9))
    refused = _invoke("models", "pull", TINY_GGUF_REPO, "--data-dir", str(data_dir))
    assert refused.exit_code == 1 and "(disk)" in refused.stderr and "reserve" in refused.stderr
    assert not (data_dir / "models" / "mock-org--tiny-llama-GGUF").exists()


def test_pull_of_an_ollama_name_downloads_the_mapped_quant(mock_hub, tiny_artifacts, tmp_path):
    gguf = tiny_artifacts.gguf_path.read_bytes()
    mock_hub.add_repo("bartowski/Llama-3.2-1B-Instruct-GGUF", {
        "Llama-3.2-1B-Instruct-Q4_K_M.gguf": gguf, "Llama-3.2-1B-Instruct-Q8_0.gguf": gguf}, tags=("gguf",))
    data_dir = tmp_path / "node"
    pulled = _invoke("models", "pull", "llama3.2:1b", "--data-dir", str(data_dir))
    assert pulled.exit_code == 0, pulled.output
    folder = data_dir / "models" / "bartowski--Llama-3.2-1B-Instruct-GGUF"
    assert [p.name for p in folder.glob("*.gguf")] == ["Llama-3.2-1B-Instruct-Q4_K_M.gguf"]
    assert "llama3.2:1b: bartowski/Llama-3.2-1B-Instruct-GGUF Llama-3.2-1B-Instruct-Q4_K_M.gguf" in pulled.stderr
