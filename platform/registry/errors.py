"""Registry and lookup failures, each answered by the API with one status code."""
from __future__ import annotations


class RegistryNotFoundError(LookupError):
    """No such adapter, version or alias in the caller's tenant (404; another tenant's looks the same)."""


class RegistryConflictError(Exception):
    """The change contradicts the registry's state, e.g. deleting a version an alias points to (409)."""


class UploadRejectedError(ValueError):
    """The uploaded files are refused before anything is registered (400); the message says why, and
    `param` names the field at fault: "files", or an adapter_config.json field such as "lora_alpha"."""

    def __init__(self, message: str, *, param: str = "files") -> None:
        super().__init__(message)
        self.param = param


class AdapterNotFoundError(LookupError):
    """A request names no adapter that exists (for its tenant): the API answers 404 with code model_not_found."""

    def __init__(self, name: str) -> None:
        super().__init__(f"The model or adapter {name!r} does not exist; GET /v1/models lists what is served")
        self.name = name


class InvalidAdapterError(ValueError):
    """The adapter exists but its directory cannot be served as it is: the API answers 400."""
