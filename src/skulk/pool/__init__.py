"""llama.cpp RPC memory pooling: one GGUF instance over several nodes.

Rank 0's runner is the driver (in-process llama.cpp whose model spans its own device plus
one ggml RPC device per donor); every other rank's runner is a donor (a ggml RPC server on
loopback). Bytes between nodes cross only the authenticated, encrypted pool channel.

- `layout`: pure decisions (which layers on which device, ports, addresses, keys).
- `channel`: the authenticated relay between a driver and its donors.
- `rpc`: the ctypes binding to llama-cpp-python's libggml-rpc.
"""
