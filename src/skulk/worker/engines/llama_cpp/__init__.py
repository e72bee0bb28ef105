"""The in-process llama.cpp engine (llama-cpp-python): `engine.LlamaCppEngine`."""
