"""Registry failures, each answered by the API with one status code."""
from __future__ import annotations


class RegistryNotFoundError(LookupError):
    """No such adapter, version or alias in the caller's tenant (404; another tenant's looks the same)."""


class RegistryConflictError(Exception):
    """The change contradicts the registry's state, e.g. deleting a version an alias points to (409)."""


class UploadRejectedError(ValueError):
    """The uploaded files are refused before anything is registered (400); the message says why."""
