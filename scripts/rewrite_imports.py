#!/usr/bin/env python3
"""Rewrite references to modules that moved in the layout change (issue 13) to their new
paths: imports, dotted strings (monkeypatch targets, `python -m`, logger names) and
slash paths in prose (`store/downloads.py`).

Idempotent: running it twice changes nothing the second time, so it can be re-run over a
branch merged after the move (`python scripts/rewrite_imports.py src tests bench README.md
docs`), followed by `uv run ruff check --fix --select I src tests` to re-sort the imports.

With no arguments it rewrites src/, tests/, bench/, docs/ and README.md under the current
directory. `--check` only lists the files it would change (exit 1 when there are any).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

MOVES: dict[str, str] = {
    # the node's own data dir
    "skulk.store.config": "skulk.datadir.config",
    "skulk.store.event_log": "skulk.datadir.event_log",
    "skulk.store.snapshots": "skulk.datadir.snapshots",
    "skulk.store.lease": "skulk.datadir.lease",
    "skulk.store.paths": "skulk.datadir.paths",
    "skulk.store.file_lock": "skulk.datadir.file_lock",
    "skulk.store.secret_file": "skulk.datadir.secret_file",
    "skulk.store.intent_record": "skulk.datadir.intent_record",
    "skulk.store.superseded_logs": "skulk.datadir.superseded_logs",
    # model files: cards, the hub, downloads, companions, the generated tiny models
    "skulk.store.cards": "skulk.models.cards",
    "skulk.store.card_builder": "skulk.models.card_builder",
    "skulk.store.hub_files": "skulk.models.hub_files",
    "skulk.store.hub_meta": "skulk.models.hub_meta",
    "skulk.store.downloads": "skulk.models.downloads",
    "skulk.store.companions": "skulk.models.companions",
    "skulk.store.disk_admission": "skulk.models.disk_admission",
    "skulk.store.tiny_models": "skulk.models.tiny_models",
    "skulk.store.artifact_errors": "skulk.models.artifact_errors",
    # the cluster's model store
    "skulk.store.model_store": "skulk.model_store.node_store",
    "skulk.store.store_host": "skulk.model_store.host",
    "skulk.store.store_fetch": "skulk.model_store.fetch",
    "skulk.store.staging": "skulk.model_store.staging",
    "skulk.store.eviction": "skulk.model_store.eviction",
    "skulk.store.store_memory": "skulk.model_store.memory",
    # engines as packages
    "skulk.worker.engines.llama_cpp": "skulk.worker.engines.llama_cpp.engine",
    "skulk.worker.engines.mlx_engine": "skulk.worker.engines.mlx.engine",
    "skulk.worker.engines.mlx_batch": "skulk.worker.engines.mlx.batch",
    "skulk.worker.engines.mlx_family": "skulk.worker.engines.mlx.family",
    "skulk.worker.engines.mlx_group": "skulk.worker.engines.mlx.group",
    "skulk.worker.engines.mlx_pipeline": "skulk.worker.engines.mlx.pipeline",
    "skulk.worker.engines.mlx_sampling": "skulk.worker.engines.mlx.sampling",
    "skulk.worker.engines.mlx_tensor": "skulk.worker.engines.mlx.tensor",
    "skulk.worker.engines.mlx_text": "skulk.worker.engines.mlx.text",
    "skulk.worker.engines.mlx_prefix": "skulk.worker.engines.mlx.prefix",
    "skulk.worker.engines.llama_cpp_prefix": "skulk.worker.engines.llama_cpp.prefix",
    "skulk.worker.engines.llama_pool": "skulk.worker.engines.llama_cpp.pool",
    # tests mirror src/
    "tests.store.test_config": "tests.datadir.test_config",
    "tests.store.test_event_log": "tests.datadir.test_event_log",
    "tests.store.test_lease": "tests.datadir.test_lease",
    "tests.store.test_paths": "tests.datadir.test_paths",
    "tests.store.test_superseded_logs": "tests.datadir.test_superseded_logs",
    "tests.store.test_card_builder": "tests.models.test_card_builder",
    "tests.store.test_cards": "tests.models.test_cards",
    "tests.store.test_companions": "tests.models.test_companions",
    "tests.store.test_disk_admission": "tests.models.test_disk_admission",
    "tests.store.test_downloads": "tests.models.test_downloads",
    "tests.store.test_hub_files": "tests.models.test_hub_files",
    "tests.store.test_tiny_models": "tests.models.test_tiny_models",
    "tests.store.test_binding_change": "tests.model_store.test_binding_change",
    "tests.store.test_model_store": "tests.model_store.test_model_store",
    "tests.store.test_staging": "tests.model_store.test_staging",
    "tests.store.test_staging_progress": "tests.model_store.test_staging_progress",
    "tests.store.test_store_fetch": "tests.model_store.test_store_fetch",
    "tests.store.test_store_host": "tests.model_store.test_store_host",
    "tests.store.test_store_memory": "tests.model_store.test_store_memory",
    "tests.store.test_eviction": "tests.model_store.test_eviction",
}
"""Old module -> new module."""


def _path_form(module: str) -> str:
    return module.removeprefix("skulk.").replace(".", "/") + ".py"


def _pattern(old: str, new: str) -> re.Pattern[str]:
    # Not inside a longer name; and when the new path extends the old one (a module that
    # became a package), not where the new suffix already follows: that keeps it idempotent.
    guard = ""
    if new.startswith(old + "."):
        guard = rf"(?!\.{re.escape(new[len(old) + 1:])}\b)"
    return re.compile(rf"(?<![\w.]){re.escape(old)}(?![\w]){guard}")


RULES: list[tuple[re.Pattern[str], str]] = []
for _old, _new in MOVES.items():
    RULES.append((_pattern(_old, _new), _new))
    # prose and comments name files as `store/downloads.py` or `skulk/store/downloads.py`
    RULES.append((re.compile(rf"(?<![\w/]){re.escape(_path_form(_old))}"), _path_form(_new)))
    RULES.append((re.compile(rf"(?<![\w])skulk/{re.escape(_path_form(_old))}"), "skulk/" + _path_form(_new)))


_FROM_PACKAGE = re.compile(r"\bfrom (skulk(?:\.\w+)+) import (\w+)( as \w+)?\b(?! *[(,])")


def _from_package(match: re.Match[str]) -> str:
    """`from skulk.store import hub_meta` (a module imported from its package)."""
    package, name = match.group(1), match.group(2)
    new = MOVES.get(f"{package}.{name}")
    if new is None:
        return match.group(0)
    new_package, new_name = new.rsplit(".", 1)
    alias = match.group(3) or ("" if new_name == name else f" as {name}")
    return f"from {new_package} import {new_name}{alias}"


def rewrite(text: str) -> str:
    text = _FROM_PACKAGE.sub(_from_package, text)
    for pattern, replacement in RULES:
        text = pattern.sub(replacement, text)
    return text


def _files(targets: list[str]) -> list[Path]:
    files: list[Path] = []
    for target in targets:
        path = Path(target)
        if path.is_dir():
            files.extend(p for p in sorted(path.rglob("*")) if p.suffix in (".py", ".md", ".toml", ".sh", ".txt")
                         and ".venv" not in p.parts)
        elif path.exists():
            files.append(path)
    return files


def main(argv: list[str]) -> int:
    check = "--check" in argv
    targets = [a for a in argv if a != "--check"] or ["src", "tests", "bench", "docs", "README.md"]
    changed = []
    for path in _files(targets):
        text = path.read_text(encoding="utf-8")
        new = rewrite(text)
        if new != text:
            changed.append(path)
            if not check:
                path.write_text(new, encoding="utf-8")
    for path in changed:
        print(path)
    return 1 if check and changed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
