"""Realtime voice over WS /v1/realtime (`skulk.api.routes.realtime` is the socket).

`audio` (PCM arithmetic), `turns` (server VAD turn-taking) and `session` (the OpenAI
realtime dialect as a state machine) are pure; `vad` wraps the Silero classifier. Audio
lives only in the memory of the socket that carries it: nothing here writes it anywhere.
"""
