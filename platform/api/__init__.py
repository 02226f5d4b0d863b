"""loraloom.platform.api: the OpenAI-compatible HTTP API (FastAPI)."""
from loraloom.platform.api.app import create_app

__all__ = ["create_app"]
