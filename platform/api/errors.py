"""Every error leaves the API in OpenAI's shape: {"error": {"message", "type", "param", "code"}}.

The services raise their own exceptions (registry/errors.py, training/errors.py, accounts/);
DOMAIN_ERRORS maps each to its status and code, once for every route. The engine reports a request
field it cannot serve as a RequestFieldError carrying the field, and so do the platform's services
(a tenant or alias name, a key's expiry, a limit): `field_error` is its one mapping, a 400 whose
`param` is the field as the client spelled it. Nothing reads a field back out of a message.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Message, Receive, Scope, Send

from loraloom.engine import EngineUnavailableError, RequestFailedError, RequestFieldError
from loraloom.platform.accounts.tenants import OperatorTenantSuspensionError, TenantExistsError, TenantNotFoundError
from loraloom.platform.api.asgi import HttpMiddleware
from loraloom.platform.api.engineless import NoEngineError
from loraloom.platform.api.schemas.common import ErrorDetail, ErrorResponse
from loraloom.platform.json_input import too_deep_message
from loraloom.platform.registry.errors import RegistryConflictError, RegistryNotFoundError, UploadRejectedError
from loraloom.platform.training.datasets import DatasetReport, DatasetValidationError
from loraloom.platform.training.errors import TrainingConflictError, TrainingInputError, TrainingNotFoundError

logger = logging.getLogger(__name__)

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


def field_error(error: RequestFieldError, spelled: Callable[[str], str] | None = None) -> APIError:
    """The 400 of a request field the engine cannot serve, naming the field in `param` and first in the
    message. `spelled` turns the engine's name for the field into the request's, where they differ (a
    chat's "prompt" is its "messages": GenerationRequest.request_field); without it they are the same."""
    param = error.field if spelled is None else spelled(error.field)
    return APIError(400, f"{param}: {error.problem}", param=param)


# Where FastAPI found a request field: not part of the field's name, which is what `param` carries.
_REQUEST_PARTS = ("body", "path", "query")


def _location_path(location: Sequence[Any]) -> str:
    """("body", "messages", 0, "content") -> "messages[0].content"; ("query", "after") -> "after"."""
    parts = list(location[1:] if location and location[0] in _REQUEST_PARTS else location)
    path = ""
    for part in parts:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path


# Pydantic's errors for a number outside a field's bounds: they say the bound, and the value is added.
_BOUND_ERRORS = {"greater_than", "greater_than_equal", "less_than", "less_than_equal"}


def _validation_message(detail: dict[str, Any]) -> str:
    context = detail.get("ctx") or {}
    if detail["type"] == "value_error" and "error" in context:
        return str(context["error"])  # our own validators' messages, without pydantic's "Value error, " prefix
    if detail["type"] in _BOUND_ERRORS:
        return f"{detail['msg']}, got {detail['input']!r}"
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
    OperatorTenantSuspensionError: lambda error: APIError(409, str(error), param="tenant",
                                                          code="operator_tenant_not_suspendable"),
    RequestFieldError: field_error,
    RequestFailedError: lambda error: APIError(500, str(error), error_type=SERVER_ERROR, code="generation_failed"),
    EngineUnavailableError: lambda error: APIError(
        503, str(error), error_type=SERVER_ERROR, code="engine_unavailable",
        headers={"Retry-After": str(error.retry_after_s)},
    ),
    NoEngineError: lambda error: APIError(503, str(error), error_type=SERVER_ERROR, code="no_engine"),
}


async def _api_error_handler(request: Request, error: APIError) -> JSONResponse:
    return error_response(error, headers=error.headers)


async def _validation_error_handler(request: Request, error: RequestValidationError) -> JSONResponse:
    return error_response(validation_error(error))


async def _http_error_handler(request: Request, error: StarletteHTTPException) -> JSONResponse:
    error_type = INVALID_REQUEST if error.status_code < 500 else SERVER_ERROR
    message = str(error.detail)
    if isinstance(error.__cause__, RecursionError):  # FastAPI's "error parsing the body" says no more
        message = too_deep_message("The request body")
    api_error = APIError(error.status_code, message, error_type=error_type)
    return error_response(api_error, headers=error.headers)


def api_error_for(error: Exception) -> APIError:
    """What the client is told of an error: its DOMAIN_ERRORS answer (the most specific class in
    its MRO), an APIError as it is, or a bare 500 with no internals."""
    if isinstance(error, APIError):
        return error
    convert = next((DOMAIN_ERRORS[kind] for kind in type(error).__mro__ if kind in DOMAIN_ERRORS), None)
    return internal_error() if convert is None else convert(error)


async def _domain_error_handler(request: Request, error: Exception) -> JSONResponse:
    api_error = api_error_for(error)
    return error_response(api_error, headers=api_error.headers)


def internal_error() -> APIError:
    return APIError(500, "Internal server error", error_type=SERVER_ERROR)  # no detail, no traceback for the client


async def _unexpected_error_handler(request: Request, error: Exception) -> JSONResponse:
    # Only errors raised outside UnexpectedErrors (in an outer middleware) get here. Starlette
    # re-raises the error after this response is sent, so the server (uvicorn) logs the traceback.
    return error_response(internal_error())


class UnexpectedErrors(HttpMiddleware):
    """Answers an error no handler claimed with the OpenAI-shaped 500 and logs its traceback here.

    Starlette's handler for Exception re-raises after answering, and uvicorn then closes the
    connection: a client's next request on the same keep-alive connection was reset. This
    middleware sits below the audit middleware (which records the 500) and does not re-raise.
    A response already begun (a stream) cannot become a 500: that error is re-raised, and
    closing the connection is then the only way to tell the client its response is cut off.
    """

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = False

        async def send_and_watch(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, send_and_watch)
        except Exception:
            if started:
                raise
            logger.exception("unexpected error answering %s %s", scope.get("method"), scope.get("path"))
            await error_response(internal_error())(scope, receive, send)


def install_error_handlers(app: FastAPI) -> None:
    """Every handler, and UnexpectedErrors: call it before adding other middlewares, so that it
    is the innermost and they see its 500."""
    app.add_middleware(UnexpectedErrors)
    app.add_exception_handler(APIError, _api_error_handler)
    for domain_error in DOMAIN_ERRORS:
        app.add_exception_handler(domain_error, _domain_error_handler)
    app.add_exception_handler(RequestValidationError, _validation_error_handler)
    app.add_exception_handler(StarletteHTTPException, _http_error_handler)
    app.add_exception_handler(Exception, _unexpected_error_handler)

