"""The MLX engine: `engine.MlxEngine`, with its batching, model families, multi-node group
(ring), pipeline and tensor sharding, sampling and text helpers."""
