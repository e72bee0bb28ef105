"""Typed wire model: every event, command, task, chunk and reading is a strict pydantic model."""
