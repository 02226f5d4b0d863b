"""Error plumbing that needs no engine: OpenAI error shape for unexpected errors, the engine's
RequestFieldError as the client's field (raised by the engine and by the services alike), domain errors,
and the body size cap (on a small app with real routes)."""
from __future__ import annotations

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.testclient import TestClient
from live_api import serve_in_thread

from loraloom.engine import ChatTemplateError, RequestFieldError
from loraloom.platform.api.errors import field_error, install_error_handlers
from loraloom.platform.registry.references import check_adapter_name
from loraloom.platform.registry.errors import RegistryNotFoundError, UploadRejectedError
from loraloom.platform.training.errors import TrainingInputError
from loraloom.platform.api.middleware import BodySizeLimit

BODY_LIMIT = 1000
UPLOAD_LIMIT = 5000


@pytest.fixture(scope="module")
def client() -> TestClient:
    app = FastAPI()
    install_error_handlers(app)
    app.add_middleware(BodySizeLimit, max_body_bytes=BODY_LIMIT, max_upload_bytes=UPLOAD_LIMIT)

    @app.post("/echo-length")
    @app.post("/v1/adapters/{name}/versions")
    async def echo_length(request: Request) -> dict[str, int]:
        return {"length": len(await request.body())}

    @app.get("/fail")
    async def fail() -> None:
        raise RuntimeError("secret internal detail")

    @app.get("/stray-value-error")
    async def stray_value_error() -> None:
        raise ValueError("name: not a field error here")

    @app.get("/engine-refuses")
    async def engine_refuses() -> None:
        raise RequestFieldError("response_format", "the JSON schema cannot be served: $ref cycles")

    @app.get("/registry-missing")
    async def registry_missing() -> None:
        raise RegistryNotFoundError("adapter 'bot' does not exist")

    @app.get("/service/field-error")
    async def service_field_error() -> None:
        check_adapter_name("a b", reserved=frozenset())

    @app.get("/service/upload-rejected")
    async def service_upload_rejected() -> None:
        raise UploadRejectedError("adapter_model.safetensors is missing")

    @app.get("/service/training-input")
    async def service_training_input() -> None:
        raise TrainingInputError(code="invalid_hyperparameters", message="n_epochs: must be >= 1", param="n_epochs")

    # Starlette re-raises after answering (for the server's log); the client must still get the 500.
    return TestClient(app, raise_server_exceptions=False)


def test_unexpected_error_is_500_in_openai_shape_without_details(client):
    response = client.get("/fail")
    assert response.status_code == 500
    assert response.json() == {
        "error": {"message": "Internal server error", "type": "server_error", "param": None, "code": None}
    }
    assert "secret" not in response.text and "Traceback" not in response.text


@pytest.mark.parametrize("size", [0, BODY_LIMIT])
def test_body_up_to_the_limit_reaches_the_route(client, size):
    response = client.post("/echo-length", content=b"x" * size)
    assert response.status_code == 200 and response.json() == {"length": size}


def test_body_over_the_limit_is_413(client):
    response = client.post("/echo-length", content=b"x" * (BODY_LIMIT + 1))
    assert response.status_code == 413
    error = response.json()["error"]
    assert error["code"] == "request_too_large" and str(BODY_LIMIT) in error["message"]


def test_chunked_body_over_the_limit_is_413(client):
    chunks = (b"x" * 300 for _ in range(4))  # no Content-Length: the cap counts what arrives
    assert client.post("/echo-length", content=chunks).status_code == 413


def test_adapter_uploads_stream_under_their_own_larger_cap(client):
    size = BODY_LIMIT * 3  # over the JSON cap, under the upload cap
    response = client.post("/v1/adapters/bot/versions", content=b"x" * size)
    assert response.status_code == 200 and response.json() == {"length": size}
    too_large = client.post("/v1/adapters/bot/versions", content=b"x" * (UPLOAD_LIMIT + 1))
    assert too_large.status_code == 413 and str(UPLOAD_LIMIT) in too_large.json()["error"]["message"]
    # Only the upload route gets the larger cap.
    assert client.post("/v1/adapters/bot/aliases/prod", content=b"x" * size).status_code == 413


def test_field_error_names_the_clients_field():
    refused = RequestFieldError("max_tokens", "lower max_tokens to at most 7")
    error = field_error(refused, lambda field: "max_completion_tokens" if field == "max_tokens" else field)
    assert (error.status_code, error.param) == (400, "max_completion_tokens")
    assert error.message == "max_completion_tokens: lower max_tokens to at most 7"
    assert field_error(refused).param == "max_tokens"  # no spelling: the engine's name is the client's

    nested = field_error(ChatTemplateError("messages[0].role", "'robot' is not one of system, user"))
    assert nested.param == "messages[0].role"
    assert nested.message == "messages[0].role: 'robot' is not one of system, user"


def test_a_request_field_error_is_a_400_naming_the_field_on_any_route(client):
    response = client.get("/engine-refuses")
    assert response.status_code == 400
    assert response.json()["error"] == {"message": "response_format: the JSON schema cannot be served: $ref cycles",
                                         "type": "invalid_request_error", "param": "response_format", "code": None}


def test_domain_errors_get_their_status_and_code_on_any_route(client):
    missing = client.get("/registry-missing")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"


def test_a_service_s_field_error_is_a_400_naming_the_field_and_a_stray_value_error_a_bare_500(client):
    response = client.get("/service/field-error")
    assert response.status_code == 400 and response.json()["error"]["param"] == "name"
    assert "'a b' is not a valid adapter name" in response.json()["error"]["message"]
    # A plain ValueError is a bug, whatever its message looks like: a 500 that says nothing of it.
    stray = client.get("/stray-value-error")
    assert stray.status_code == 500 and "name" not in stray.text


def test_value_error_domain_errors_keep_their_own_mapping(client):
    rejected = client.get("/service/upload-rejected").json()["error"]
    assert (rejected["param"], rejected["code"]) == ("files", "invalid_adapter")
    training = client.get("/service/training-input").json()["error"]
    assert (training["param"], training["code"]) == ("n_epochs", "invalid_hyperparameters")


def test_a_500_keeps_the_keep_alive_connection_for_the_next_request():
    """Issue 12 item 10: Starlette's handler for Exception re-raised after answering and uvicorn then
    closed the connection, so the client's next request on it was reset. On a real uvicorn server,
    one client: a 500, then a good request, both on the same TCP connection."""
    app = FastAPI()
    install_error_handlers(app)
    ports: list[int] = []

    @app.get("/fail")
    async def fail(request: Request) -> None:
        ports.append(request.client.port)
        raise RuntimeError("secret internal detail")

    @app.get("/ok")
    async def ok(request: Request) -> dict[str, int]:
        return {"port": request.client.port}

    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    with serve_in_thread(app) as url, httpx.Client(base_url=url, limits=limits) as http:
        for _ in range(3):
            failed = http.get("/fail")
            assert failed.status_code == 500 and failed.json()["error"]["type"] == "server_error"
            assert "secret" not in failed.text
            assert failed.headers.get("connection") != "close"
            assert http.get("/ok").json() == {"port": ports[-1]}, "the 500 closed the connection"
    assert len(set(ports)) == 1
