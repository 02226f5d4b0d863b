"""Every error leaves the API in OpenAI's shape: {"error": {"message", "type", "param", "code"}}.

The services raise their own exceptions (registry/errors.py, training/errors.py, accounts/);
DOMAIN_ERRORS maps each to its status and code, once for every route. Services also report a
bad request field as a plain ValueError("field: ..."); the routers over those services take
`FieldErrorRoute`, which answers such an error with 400 naming the field.
"""
from __future__ import annotations

from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException

from loraloom.platform.accounts.tenants import TenantExistsError, TenantNotFoundError
from loraloom.platform.api.schemas.common import ErrorDetail, ErrorResponse
from loraloom.platform.registry.errors import RegistryConflictError, RegistryNotFoundError, UploadRejectedError
from loraloom.platform.training.datasets import DatasetReport, DatasetValidationError
from loraloom.platform.training.errors import TrainingConflictError, TrainingInputError, TrainingNotFoundError

INVALID_REQUEST = "invalid_request_error"
SERVER_ERROR = "server_error"
# For the OpenAPI document of routes that take a body.
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse} for status in (400, 404, 413, 500)
}


class APIError(Exception):
    """An error the API answers deliberately; `param` names the request field at fault."""

    def __init__(
        self,
        status_code: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        error_type: str = INVALID_REQUEST,
        headers: dict[str, str] | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.param = param
        self.code = code
        self.error_type = error_type
        self.headers = headers  # e.g. WWW-Authenticate on a 401
        self.details = details  # machine-readable specifics, e.g. a dataset's validation report


def error_response(error: APIError, headers: dict[str, str] | None = None) -> JSONResponse:
    body = ErrorResponse(
        error=ErrorDetail(message=error.message, type=error.error_type, param=error.param, code=error.code)
    ).model_dump()
    if error.details is not None:
        body["error"]["details"] = error.details
    return JSONResponse(body, status_code=error.status_code, headers=headers)


def field_error(error: ValueError, field_names: dict[str, str]) -> APIError:
    """A 400 from a ValueError whose message starts with "field: ..." (the engine's convention).

    `field_names` maps the engine's field names to what this endpoint's client
    called them (e.g. the engine's "prompt" is a chat client's "messages").
    """
    message = str(error)
    field, separator, detail = message.partition(": ")
    if not separator or " " in field:
        return APIError(400, message)
    param = field_names.get(field, field)
    return APIError(400, f"{param}: {detail}", param=param)


def _location_path(location: Sequence[Any]) -> str:
    """("body", "messages", 0, "content") -> "messages[0].content"."""
    parts = list(location[1:] if location and location[0] == "body" else location)
    path = ""
    for part in parts:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path


def _validation_message(detail: dict[str, Any]) -> str:
    context = detail.get("ctx") or {}
    if detail["type"] == "value_error" and "error" in context:
        return str(context["error"])  # our own validators' messages, without pydantic's "Value error, " prefix
    return detail["msg"]


def validation_error(error: RequestValidationError) -> APIError:
    details = list(error.errors())
    first = details[0]
    if first["type"] == "json_invalid":
        reason = (first.get("ctx") or {}).get("error", "JSON decode error")
        return APIError(400, f"The request body is not valid JSON: {reason}")
    param = _location_path(first["loc"]) or None
    messages = [f"{_location_path(d['loc']) or 'request body'}: {_validation_message(d)}" for d in details]
    return APIError(400, "; ".join(messages), param=param)


def report_details(report: DatasetReport) -> dict[str, Any]:
    """The validation report of a refused dataset: the first errors with line numbers, and counts per reason."""
    return {
        "format": None if report.format is None else report.format.value,
        "num_lines": report.num_lines,
        "num_errors": report.num_errors,
        "error_counts": report.error_counts,
        "errors": [
            {"line": error.line, "reason": error.reason, "message": error.message, "param": error.param}
            for error in report.errors
        ],
    }


# One entry per domain error: what the API answers when a service raises it, on any route.
DOMAIN_ERRORS: dict[type[Exception], Callable[[Any], APIError]] = {
    RegistryNotFoundError: lambda error: APIError(404, str(error), code="not_found"),
    RegistryConflictError: lambda error: APIError(409, str(error), code="conflict"),
    UploadRejectedError: lambda error: APIError(400, str(error), param=error.param, code="invalid_adapter"),
    TrainingNotFoundError: lambda error: APIError(404, str(error), code="not_found"),
    TrainingConflictError: lambda error: APIError(409, str(error), code="conflict"),
    TrainingInputError: lambda error: APIError(400, error.message, param=error.param, code=error.code),
    DatasetValidationError: lambda error: APIError(
        400, error.message, param=error.param, code=error.code, details={"report": report_details(error.report)}
    ),
    TenantExistsError: lambda error: APIError(409, str(error), param="name", code="tenant_exists"),
    TenantNotFoundError: lambda error: APIError(404, str(error), param="tenant", code="tenant_not_found"),
}
_DOMAIN_ERROR_TYPES = tuple(DOMAIN_ERRORS)


class FieldErrorRoute(APIRoute):
    """For routers over services that report a bad request field as a plain ValueError("field: ..."):
    such an error is a 400 naming the field. Domain errors (some are ValueErrors) pass on to
    their DOMAIN_ERRORS handler; on other routes a stray ValueError stays a 500."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def handle(request: Request) -> Response:
            try:
                return await handler(request)
            except ValueError as error:
                if isinstance(error, _DOMAIN_ERROR_TYPES):
                    raise
                raise field_error(error, {}) from None

        return handle


async def _api_error_handler(request: Request, error: APIError) -> JSONResponse:
    return error_response(error, headers=error.headers)


async def _validation_error_handler(request: Request, error: RequestValidationError) -> JSONResponse:
    return error_response(validation_error(error))


async def _http_error_handler(request: Request, error: StarletteHTTPException) -> JSONResponse:
    error_type = INVALID_REQUEST if error.status_code < 500 else SERVER_ERROR
    api_error = APIError(error.status_code, str(error.detail), error_type=error_type)
    return error_response(api_error, headers=error.headers)


async def _domain_error_handler(request: Request, error: Exception) -> JSONResponse:
    # Starlette picks the handler of the most specific class in the error's MRO.
    convert = next(DOMAIN_ERRORS[kind] for kind in type(error).__mro__ if kind in DOMAIN_ERRORS)
    return error_response(convert(error))


async def _unexpected_error_handler(request: Request, error: Exception) -> JSONResponse:
    # No traceback for the client. Starlette re-raises the error after this
    # response is sent, so the server (uvicorn) logs the traceback.
    return error_response(APIError(500, "Internal server error", error_type=SERVER_ERROR))


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(APIError, _api_error_handler)
    for domain_error in DOMAIN_ERRORS:
        app.add_exception_handler(domain_error, _domain_error_handler)
    app.add_exception_handler(RequestValidationError, _validation_error_handler)
    app.add_exception_handler(StarletteHTTPException, _http_error_handler)
    app.add_exception_handler(Exception, _unexpected_error_handler)
    _document_validation_errors_as_400(app)


def _document_validation_errors_as_400(app: FastAPI) -> None:
    """FastAPI documents a 422 for every route with a body; this API answers 400 instead."""
    generate_openapi = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = generate_openapi()  # also caches it in app.openapi_schema
            for operations in schema["paths"].values():
                for operation in operations.values():
                    operation.get("responses", {}).pop("422", None)
            for name in ("HTTPValidationError", "ValidationError"):
                schema.get("components", {}).get("schemas", {}).pop(name, None)
        return app.openapi_schema

    app.openapi = openapi
