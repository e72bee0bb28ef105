"""Model card files: finding, loading, resolving and writing the TOML cards.

Built-in cards ship in `resources/model_cards/` (in a wheel: `skulk/_resources/model_cards`);
user cards live in the node's custom cards directory and override built-ins with the same
model_id. One file per card, named from its model_id with '/' -> '--' (`card_file_name`).

Loading never lets one broken file hide the others: `load_cards` and `resolve_cards` return
every good card plus a `CardError` per bad file, each naming the file and the field to fix.
This module only reads and writes card files; it never decides placement or downloads.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from pydantic import ValidationError
from pydantic.alias_generators import to_snake

import skulk
from skulk.datadir.atomic_file import write_atomic
from skulk.shared.types.cards import ModelCard, is_model_id
from skulk.shared.types.ids import ModelId

CARD_SUFFIX = ".toml"
BUILTIN_CARDS_RELATIVE = Path("resources") / "model_cards"
"""Where built-in cards sit in a source checkout, relative to the repository root."""
WHEEL_CARDS_RELATIVE = Path("_resources") / "model_cards"
"""Where pyproject's force-include puts them in an installed wheel, relative to the package."""

_TOML_LINE_RE = re.compile(r"at line (\d+)")


class CardError(Exception):
    """A card file that cannot be used: which file, which field (None when the whole file is
    unreadable or not TOML), what is wrong, and for TOML syntax errors the line."""

    def __init__(self, path: Path, field: str | None, message: str, line: int | None = None) -> None:
        self.path = Path(path)
        self.field = field
        self.message = message
        self.line = line
        super().__init__(path, field, message, line)  # args that rebuild it (pickling)

    def __str__(self) -> str:
        where = f"field {self.field}" if self.field else (f"line {self.line}" if self.line else "file")
        return f"bad card {self.path}: {where}: {self.message}"

    def __repr__(self) -> str:
        return f"CardError(path={str(self.path)!r}, field={self.field!r}, message={self.message!r}, line={self.line!r})"


@dataclass(frozen=True)
class CardSet:
    """The usable cards by model_id, the files that were rejected, and which ids came from
    the custom directory (the ones a user may edit or delete)."""

    cards: Mapping[ModelId, ModelCard] = field(default_factory=dict)
    errors: tuple[CardError, ...] = ()
    custom_ids: frozenset[ModelId] = frozenset()


# ---------------------------------------------------------------------------------------
# Locations
# ---------------------------------------------------------------------------------------


def card_file_name(model_id: str) -> str:
    """'mlx-community/Llama-3.2-1B-Instruct-4bit' -> 'mlx-community--Llama-3.2-1B-Instruct-4bit.toml'."""
    return model_id.replace("/", "--") + CARD_SUFFIX


def builtin_cards_dir() -> Path:
    """The built-in cards directory: the installed wheel's copy, else the source checkout's
    (the nearest ancestor of this file holding pyproject.toml and resources/model_cards)."""
    installed = Path(skulk.__file__).resolve().parent / WHEEL_CARDS_RELATIVE
    if installed.is_dir():
        return installed
    for ancestor in Path(__file__).resolve().parents:
        candidate = ancestor / BUILTIN_CARDS_RELATIVE
        if candidate.is_dir() and (ancestor / "pyproject.toml").is_file():
            return candidate
    raise FileNotFoundError(
        f"built-in model cards not found: neither {installed} nor a source checkout's {BUILTIN_CARDS_RELATIVE}"
    )


# ---------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------


def _format_loc(loc: tuple[Any, ...]) -> str:
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text


def _describe(error: Mapping[str, Any]) -> tuple[str, str]:
    """(field, message) for one pydantic error, phrased for someone editing a TOML file."""
    loc = tuple(error["loc"])
    if error["type"] != "extra_forbidden":
        # pydantic reports a *missing* field by its camelCase wire alias; cards speak
        # snake_case. An unknown key keeps the spelling the user wrote, to be findable.
        loc = tuple(to_snake(p) if isinstance(p, str) else p for p in loc)
    ctx = error.get("ctx") or {}
    if error["type"] == "card_field":
        return _format_loc(loc + tuple(ctx["field"].split("."))), ctx["message"]
    message = {
        "missing": "required field is missing",
        "extra_forbidden": "unknown key (not part of the model card schema)",
    }.get(error["type"], cast(str, error["msg"]))  # pydantic error messages are str
    return _format_loc(loc) or "(card)", message.removeprefix("Value error, ")


def card_error_from_validation(path: Path, exc: ValidationError) -> CardError:
    """One CardError for a failed validation: the first problem's field, the rest appended."""
    problems = [_describe(e) for e in exc.errors(include_url=False)]
    field_name, message = problems[0]
    if len(problems) > 1:
        message += "; also " + "; ".join(f"field {f}: {m}" for f, m in problems[1:])
    return CardError(path, field_name, message)


def parse_card(path: Path, data: Mapping[str, Any]) -> ModelCard:
    """Validate already-parsed TOML data as a card; errors name `path`."""
    try:
        return ModelCard.model_validate(data)
    except ValidationError as exc:
        raise card_error_from_validation(path, exc) from None


def load_card(path: Path) -> ModelCard:
    """Read and validate one card file, raising CardError for any problem."""
    path = Path(path)
    try:
        with path.open("rb") as handle:
            data = tomllib.load(handle)
    except tomllib.TOMLDecodeError as exc:
        match = _TOML_LINE_RE.search(str(exc))
        raise CardError(path, None, f"invalid TOML: {exc}", int(match.group(1)) if match else None) from None
    except UnicodeDecodeError as exc:
        raise CardError(path, None, f"not UTF-8 text: {exc}") from None
    except OSError as exc:
        raise CardError(path, None, f"cannot read: {exc.strerror or exc}") from None
    return parse_card(path, data)


def _card_files(directory: Path) -> list[Path]:
    # Dotfiles are skipped: they are editor swap files or our own in-flight temp files.
    return sorted(
        p for p in directory.iterdir() if p.suffix == CARD_SUFFIX and not p.name.startswith(".") and p.is_file()
    )


def load_cards(directory: Path | None) -> CardSet:
    """Every card in `directory` (missing or None = no cards). A file is rejected if it does
    not validate, if its name is not `card_file_name(model_id)`, or if an earlier file (by
    name) already defined its model_id; the rest still load."""
    if directory is None or not Path(directory).is_dir():
        return CardSet()
    cards: dict[ModelId, ModelCard] = {}
    errors: list[CardError] = []
    for path in _card_files(Path(directory)):
        try:
            card = load_card(path)
        except CardError as exc:
            errors.append(exc)
            continue
        expected = card_file_name(card.model_id)
        if path.name != expected:
            # write/delete find a card by this name; a mismatch would make it undeletable.
            errors.append(CardError(path, "model_id", f"{card.model_id!r} must live in a file named {expected!r}"))
        elif card.model_id in cards:
            errors.append(CardError(path, "model_id", f"{card.model_id!r} is defined twice in {directory}"))
        else:
            cards[card.model_id] = card
    return CardSet(cards=cards, errors=tuple(errors))


def resolve_cards(builtin_dir: Path | None, custom_dir: Path | None) -> CardSet:
    """Built-in cards overlaid by custom cards with the same model_id. Errors from both
    directories are reported; a custom card that fails to load leaves the built-in (if any)
    in effect rather than removing the model."""
    builtin = load_cards(builtin_dir)
    custom = load_cards(custom_dir)
    return CardSet(
        cards={**builtin.cards, **custom.cards},
        errors=builtin.errors + custom.errors,
        custom_ids=frozenset(custom.cards),
    )


# ---------------------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------------------

_TOML_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}
_BARE_KEY_RE = re.compile(r"^[A-Za-z0-9_-]+$")


def _toml_string(value: str) -> str:
    out = []
    for char in value:
        if char in _TOML_ESCAPES:
            out.append(_TOML_ESCAPES[char])
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            out.append(f"\\u{ord(char):04X}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def _toml_key(key: str) -> str:
    return key if _BARE_KEY_RE.match(key) else _toml_string(key)


def _toml_value(value: Any) -> str:
    # bool before int: bool is an int subclass.
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return _toml_string(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} to a model card")


def _toml_table(data: Mapping[str, Any], prefix: str, lines: list[str]) -> None:
    tables = {k: v for k, v in data.items() if isinstance(v, Mapping)}
    for key, value in data.items():
        if value is not None and key not in tables:
            lines.append(f"{_toml_key(key)} = {_toml_value(value)}")
    for key, value in tables.items():
        body = {k: v for k, v in value.items() if v is not None}
        if not body:
            continue  # an all-default section reads back identically when omitted
        header = f"{prefix}{_toml_key(key)}"
        lines.extend(["", f"[{header}]"])
        _toml_table(body, header + ".", lines)


def dump_card(card: ModelCard) -> str:
    """The card as TOML with snake_case keys in schema order; None values are omitted."""
    lines: list[str] = []
    _toml_table(card.model_dump(mode="python", by_alias=False), "", lines)
    return "\n".join(lines) + "\n"


def write_custom_card(custom_dir: Path, card: ModelCard) -> Path:
    """Write `card` into `custom_dir` (created if needed) as `card_file_name(model_id)`,
    atomically: readers see the old file or the new one, never a torn one. Returns the path."""
    text = dump_card(card)
    target = Path(custom_dir) / card_file_name(card.model_id)
    # Refuse to write anything that would not load back as the same card.
    if parse_card(target, tomllib.loads(text)) != card:
        raise RuntimeError(f"model card writer is not faithful for {card.model_id}")
    target.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(target, text, newline="\n")
    return target


def delete_custom_card(custom_dir: Path, model_id: str) -> bool:
    """Remove the custom card for `model_id`. True if a file was removed, False if there was
    none. Built-in cards are never touched: deleting a custom override re-exposes them."""
    if not is_model_id(model_id):
        raise ValueError(f"{model_id!r} is not a model id")
    target = Path(custom_dir) / card_file_name(model_id)
    try:
        target.unlink()
    except FileNotFoundError:
        return False
    return True


__all__ = [
    "BUILTIN_CARDS_RELATIVE",
    "CARD_SUFFIX",
    "WHEEL_CARDS_RELATIVE",
    "CardError",
    "CardSet",
    "builtin_cards_dir",
    "card_error_from_validation",
    "card_file_name",
    "delete_custom_card",
    "dump_card",
    "load_card",
    "load_cards",
    "parse_card",
    "resolve_cards",
    "write_custom_card",
]
