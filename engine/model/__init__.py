"""The base model: the Llama forward over a paged KV cache, its layers, the checkpoint loader, FP8
weights and KV-cache scales, the bundled default checkpoint and random weights for tests."""
