"""The names users type for a model, resolved to the Hugging Face repo (and quant) Skulk uses.

A user coming from Ollama types `llama3.2:1b` or `qwen3:30b-a3b`; one coming from Hugging Face
types `owner/repo`, `owner/repo:Q4_K_M` or Ollama's `hf.co/owner/repo:Q4_K_M`. All of them
resolve here, in one pure function over one data table (`resources/ollama_library.toml`), so
`POST /ollama/api/pull`, `POST /models/add`, `skulk models pull` and `skulk chat` accept the
same names and refuse the same ones with the same words.
"""

from __future__ import annotations

import difflib
import functools
import re
import tomllib
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Literal

from skulk.models.cards import builtin_cards_dir
from skulk.shared.types.cards import is_model_id

LIBRARY_FILE = "ollama_library.toml"
"""Beside the built-in cards directory (resources/, in a wheel skulk/_resources/)."""
HUB_PREFIXES = ("hf.co/", "huggingface.co/", "https://huggingface.co/")
"""How Ollama spells a Hugging Face repo (`ollama pull hf.co/owner/repo:Q4_K_M`)."""
_QUANT_TAG_RE = re.compile(r"^(?:i?q\d[a-z0-9_]*|f16|fp16|bf16|f32|mxfp4)$", re.IGNORECASE)
MAX_SUGGESTIONS = 5


class UnknownModelName(ValueError):
    """The text names no card, no repo and no library entry; the message says what does."""


@dataclass(frozen=True)
class OllamaLibrary:
    names: Mapping[str, str]
    """'llama3.2:1b' -> 'bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M'."""
    latest: Mapping[str, str]
    """'llama3.2' -> '3b': the tag a bare name means."""


@dataclass(frozen=True)
class ResolvedName:
    typed: str
    model_id: str
    """A card id or a Hugging Face repo id."""
    quant: str | None
    """The GGUF quant to pick from the repo (None: the card's, or the default preference)."""
    via: Literal["card", "repo", "ollama"]


def library_path() -> Path:
    return builtin_cards_dir().parent / LIBRARY_FILE


def parse_library(text: str) -> OllamaLibrary:
    """The table from TOML text; every entry must be 'owner/repo:QUANT' and every [latest]
    tag must name an entry (ValueError naming the first that is not)."""
    data = tomllib.loads(text)
    names = {str(k): str(v) for k, v in data.get("names", {}).items()}
    latest = {str(k): str(v) for k, v in data.get("latest", {}).items()}
    for name, target in names.items():
        repo, _, quant = target.partition(":")
        if ":" not in name or not is_model_id(repo) or not _QUANT_TAG_RE.match(quant or ""):
            raise ValueError(f"{LIBRARY_FILE}: {name!r} = {target!r} is not 'name:tag' = 'owner/repo:QUANT'")
    for name, tag in latest.items():
        if f"{name}:{tag}" not in names:
            raise ValueError(f"{LIBRARY_FILE}: [latest] {name!r} = {tag!r} names no entry {name}:{tag}")
    return OllamaLibrary(names=MappingProxyType(names), latest=MappingProxyType(latest))


def load_library(path: Path | None = None) -> OllamaLibrary:
    """The table at `path` (default: the shipped one, read once per process)."""
    if path is None:
        return _shipped_library()
    return parse_library(path.read_text(encoding="utf-8"))


@functools.cache
def _shipped_library() -> OllamaLibrary:
    return parse_library(library_path().read_text(encoding="utf-8"))


def placed_model_id(typed: str, placed: Collection[str], card_ids: Collection[str],
                    library: OllamaLibrary) -> str:
    """The placed model a request's `model` means: itself when placed; else the repo its
    name resolves to, when that is placed (`ollama run llama3.2:1b` after a pull); else
    itself (the caller's 404 then names what was typed)."""
    if typed in placed:
        return typed
    try:
        resolved = resolve_model_name(typed, card_ids, library)
    except UnknownModelName:
        return typed
    return resolved.model_id if resolved.model_id in placed else typed


def _repo_and_quant(text: str) -> tuple[str, str | None]:
    repo, _, quant = text.partition(":")
    return repo, (quant.upper() if quant and quant.lower() != "latest" else None)


def resolve_model_name(text: str, card_ids: Collection[str], library: OllamaLibrary) -> ResolvedName:
    """What `text` names: a card id as is; `owner/repo[:QUANT]` (also after `hf.co/`); or an
    Ollama library name `name[:tag]`, whose tag may end in a quant (`1b-q8_0`)."""
    typed = text.strip()
    if typed in card_ids:
        return ResolvedName(typed, typed, None, "card")
    bare = next((typed[len(p):] for p in HUB_PREFIXES if typed.lower().startswith(p)), typed)
    if "/" in bare:
        repo, quant = _repo_and_quant(bare)
        if not is_model_id(repo):
            raise UnknownModelName(f"{typed!r} is not a Hugging Face repo id ('owner/name', optionally ':QUANT')")
        return ResolvedName(typed, repo, quant, "card" if repo in card_ids and quant is None else "repo")
    name, _, tag = bare.lower().partition(":")
    tag = library.latest.get(name, "") if tag in ("", "latest") else tag
    quant: str | None = None
    key = f"{name}:{tag}"
    if key not in library.names and "-" in tag:
        size, _, last = tag.rpartition("-")
        if _QUANT_TAG_RE.match(last):
            key, quant = f"{name}:{size.split('-')[0]}", last.upper()
    if key not in library.names:
        raise UnknownModelName(_unknown(typed, name, library))
    repo, mapped_quant = _repo_and_quant(library.names[key])
    return ResolvedName(typed, repo, quant or mapped_quant, "ollama")


def _unknown(typed: str, name: str, library: OllamaLibrary) -> str:
    same = sorted(k for k in library.names if k.split(":")[0] == name)
    near = same or difflib.get_close_matches(typed.lower(), list(library.names), n=MAX_SUGGESTIONS, cutoff=0.5)
    hint = f" Known here: {', '.join(near[:MAX_SUGGESTIONS])}." if near else ""
    return (f"{typed!r} is no model card, Hugging Face repo or Ollama library name Skulk knows.{hint} "
            "Name a Hugging Face GGUF repo instead ('owner/repo' or 'owner/repo:Q4_K_M').")


__all__ = [
    "HUB_PREFIXES",
    "LIBRARY_FILE",
    "OllamaLibrary",
    "ResolvedName",
    "UnknownModelName",
    "library_path",
    "load_library",
    "parse_library",
    "placed_model_id",
    "resolve_model_name",
]
