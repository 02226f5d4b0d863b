"""Adapters on the engine side: the handle the engine is told, reading and validating PEFT files,
the host-memory cache, the GPU slot table and the LoRA-wrapped linear layers.

Kept free of imports: the scheduler imports `slots` without pulling in torch."""
