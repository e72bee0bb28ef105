"""Writes docs/SETTINGS.md from the settings registry (`skulk.shared.settings`).

Run after adding or changing a setting: `uv run python scripts/gen_settings_doc.py`.
tests/shared/test_settings.py fails while the file and the registry differ.
"""

from __future__ import annotations

from pathlib import Path

from skulk.shared.settings import settings_table

HEADER = """# Settings

Every `SKULK_*` environment variable a node, its runners or the CLI reads, generated from
`src/skulk/shared/settings.py` (the registry code reads them through) by
`scripts/gen_settings_doc.py`. Most node settings also have a `skulk.yaml` key or a flag,
named in the meaning; the environment beats the file, and flags beat both. `internal`
settings are set by the node for its own runner processes; `test` ones are test-suite knobs,
never set in production.

"""


def main() -> None:
    path = Path(__file__).resolve().parent.parent / "docs" / "SETTINGS.md"
    path.write_text(HEADER + settings_table(), encoding="utf-8")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
