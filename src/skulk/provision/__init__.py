"""Managed engine binaries: building llama.cpp's llama-server for this node, and finding it."""
