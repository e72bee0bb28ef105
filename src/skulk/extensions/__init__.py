"""Extensions: separately installed packages that Skulk discovers at node start (the
`skulk.extensions` entry-point group) and calls at fixed points in the serving path.

`contract` is what an extension author implements; `loader` finds, checks and skips them.
Nothing here may let an extension break inference: every call into extension code is
guarded by the caller (see the developer guide, docs/EXTENSIONS.md)."""
