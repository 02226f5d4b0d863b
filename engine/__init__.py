"""loraloom.engine: the inference runtime (torch only; no web framework, no database)."""
