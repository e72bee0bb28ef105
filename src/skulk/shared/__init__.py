"""Shared, pure parts of Skulk: typed model, reducer, election. Nothing here does I/O."""
