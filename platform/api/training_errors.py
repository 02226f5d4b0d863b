"""Turns the training services' exceptions into API errors, in one place for /v1/files and /v1/fine_tuning."""
from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute

from loraloom.platform.api.errors import APIError, field_error
from loraloom.platform.training.datasets import DatasetReport, DatasetValidationError
from loraloom.platform.training.errors import TrainingConflictError, TrainingInputError, TrainingNotFoundError


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


class TrainingRoute(APIRoute):
    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def handle(request: Request) -> Response:
            try:
                return await handler(request)
            except TrainingNotFoundError as error:
                raise APIError(404, str(error), code="not_found") from None
            except TrainingConflictError as error:
                raise APIError(409, str(error), code="conflict") from None
            except DatasetValidationError as error:
                raise APIError(400, error.message, param=error.param, code=error.code,
                               details={"report": report_details(error.report)}) from None
            except TrainingInputError as error:
                raise APIError(400, error.message, param=error.param, code=error.code) from None
            except ValueError as error:
                raise field_error(error, {}) from None

        return handle
