"""loraloom.platform.api: the OpenAI-compatible HTTP API (FastAPI). `app.create_app` builds it."""
