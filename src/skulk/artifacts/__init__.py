"""Model artifacts: where a model's files come from (generated, a local path, the hub, the
model store), decided by the pure `plan` and carried out by `resolve` (blocking callers) and
the worker (the node)."""
