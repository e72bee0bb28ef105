"""The cluster client behind `skulk status|ps|place|unplace|chat` and `skulk models
search|add`: the node's own HTTP API, nothing else. `views` is the pure core (rows, target
resolution, error decoding); `http` moves bytes; `commands` is the typer shell."""
