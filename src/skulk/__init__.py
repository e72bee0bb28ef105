"""Skulk: one cluster of mixed machines serving language models as if it were one machine."""

__version__ = "0.1.0"
