"""Served engines: an inference server process (llama-server) owned by one runner.

`launch` decides (pure: slot count, argv, request body, stream events to tokens); `process`
owns the server process (start, health deadline, teardown of its whole process group, death
with its runner); `llama_server` is the `Engine` that streams requests through it.
"""
