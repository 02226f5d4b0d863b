"""The OpenAPI document as api_app() builds it, with no engine or database behind it (what
`make web-types` writes), and the 405s of its routes: what the contract test (tests/platform/contract)
relies on, checked where a failure says exactly which rule broke."""
from __future__ import annotations

import json

import jsonschema_rs
import pytest
from fastapi.testclient import TestClient

from loraloom.platform.api.app import api_app
from loraloom.platform.api.errors import APIError
from loraloom.platform.api.generation.streaming import SSE_DONE, sse_event
from loraloom.platform.api.schemas.chat import ChatChunkChoice, ChatCompletionChunk, ChatDelta
from loraloom.platform.api.schemas.completions import Completion, CompletionChoice
from loraloom.platform.api.sse import error_event
from loraloom.platform.db.models import MAX_INT64


@pytest.fixture(scope="module")
def app():
    return api_app()


@pytest.fixture(scope="module")
def document(app):
    return app.openapi()


def operations(document):
    for path, methods in document["paths"].items():
        for method, operation in methods.items():
            yield method, path, operation


def test_every_operation_with_a_parameter_or_body_documents_its_400_and_none_a_422(document):
    for method, path, operation in operations(document):
        responses = operation["responses"]
        assert "422" not in responses, (method, path)
        if operation.get("parameters") or operation.get("requestBody"):
            assert responses["400"]["content"]["application/json"]["schema"] == {
                "$ref": "#/components/schemas/ErrorResponse"}, (method, path)
    assert "HTTPValidationError" not in document["components"]["schemas"]


def test_64_bit_bounds_are_exact_integers(document):
    nullable = document["components"]["schemas"]["AliasMoveBody"]["properties"]["version"]  # or a split instead
    version = next(branch for branch in nullable.get("anyOf", [nullable]) if branch.get("type") == "integer")
    assert version["maximum"] == MAX_INT64 and isinstance(version["maximum"], int)
    assert version["minimum"] == 1 and isinstance(version["minimum"], int)


def test_names_state_the_patterns_their_services_check(document):
    from loraloom.platform.accounts.tenants import check_tenant_name

    parameters = {p["name"]: p["schema"] for p in document["paths"]["/v1/adapters/{name}/aliases/{alias}"]["get"]["parameters"]}
    assert parameters["name"]["pattern"].startswith("^") and parameters["alias"]["pattern"].endswith("$")
    tenant_name = document["components"]["schemas"]["TenantCreate"]["properties"]["name"]
    assert tenant_name["pattern"] == "^(?:[a-z0-9][a-z0-9_-]{0,63})$"
    check_tenant_name("acme-1")  # the pattern's kind of name passes the service's check


def test_create_routes_link_to_the_routes_that_take_what_they_made(document):
    created = document["paths"]["/v1/keys"]["post"]["responses"]["201"]
    linked = {link["operationId"]: link["parameters"] for link in created["links"].values()}
    revoke = document["paths"]["/v1/keys/{key_id}"]["delete"]["operationId"]
    assert linked[revoke] == {"key_id": "$response.body#/id"}


def test_generation_fields_state_the_bounds_their_validators_check(document):
    from loraloom.engine import MAX_LOGIT_BIAS_TOKENS
    from loraloom.platform.api.schemas.generation import MAX_CHOICES, MAX_STOP_STRINGS
    from loraloom.platform.api.tools.request import MAX_TOOLS

    chat = document["components"]["schemas"]["ChatCompletionRequest"]["properties"]
    assert (chat["n"]["minimum"], chat["n"]["maximum"]) == (1, MAX_CHOICES)
    stop_list = next(branch for branch in chat["stop"]["anyOf"] if branch.get("type") == "array")
    assert stop_list["maxItems"] == MAX_STOP_STRINGS
    bias = next(branch for branch in chat["logit_bias"]["anyOf"] if branch.get("type") == "object")
    assert bias["maxProperties"] == MAX_LOGIT_BIAS_TOKENS
    tools = next(branch for branch in chat["tools"]["anyOf"] if branch.get("type") == "array")
    assert (tools["minItems"], tools["maxItems"]) == (1, MAX_TOOLS)


def references(node):
    if isinstance(node, dict):
        if isinstance(node.get("$ref"), str):
            yield node["$ref"]
        for value in node.values():
            yield from references(value)
    elif isinstance(node, list):
        for value in node:
            yield from references(value)


def test_every_reference_names_a_component(document):
    components = document["components"]["schemas"]
    for reference in references(document):
        assert reference.startswith("#/components/schemas/") and reference.split("/")[-1] in components, reference


def event_data_is_documented(document, event_schema, data: str) -> bool:
    """Whether `data` is one of the forms the event schema names: a constant, or JSON of a component."""
    for form in event_schema["properties"]["data"]["anyOf"]:
        if "const" in form:
            if data == form["const"]:
                return True
            continue
        assert form["contentMediaType"] == "application/json"
        try:
            payload = json.loads(data)
        except json.JSONDecodeError:
            continue
        # The whole document as the root, so the component's own references resolve.
        schema = {**document, "$ref": form["contentSchema"]["$ref"]}
        if jsonschema_rs.Draft202012Validator(schema).is_valid(payload):
            return True
    return False


def sse_data(event: str) -> str:
    assert event.startswith("data: ") and event.endswith("\n\n"), event
    return event[len("data: "):-2]


CHAT_CHUNK = ChatCompletionChunk(id="chatcmpl-1", created=1, model="bot", choices=[
    ChatChunkChoice(index=0, delta=ChatDelta(role="assistant", content="Paris"), logprobs=None, finish_reason=None)])
COMPLETION_CHUNK = Completion(id="cmpl-1", created=1, model="", choices=[
    CompletionChoice(index=0, text="M", logprobs=None, finish_reason="length")])


@pytest.mark.parametrize(("path", "chunk", "other_chunk"), [
    ("/v1/chat/completions", CHAT_CHUNK, COMPLETION_CHUNK),
    ("/v1/completions", COMPLETION_CHUNK, CHAT_CHUNK),
])
def test_a_stream_documents_each_event_it_sends(document, path, chunk, other_chunk):
    # OpenAPI 3.1 describes an event stream by one event as a client parses it (schemathesis checks each).
    event_schema = document["paths"][path]["post"]["responses"]["200"]["content"]["text/event-stream"]["schema"]
    failure = error_event(APIError(400, "the adapter was deleted", param="model"))
    for event in (sse_event(chunk), failure, SSE_DONE):
        assert event_data_is_documented(document, event_schema, sse_data(event)), event
    assert not event_data_is_documented(document, event_schema, sse_data(sse_event(other_chunk)))
    assert not event_data_is_documented(document, event_schema, "[done]")


@pytest.mark.parametrize(("method", "path", "allow"), [
    ("OPTIONS", "/v1/adapters/bot", "DELETE, GET"),
    ("PATCH", "/v1/adapters/bot/aliases/prod", "DELETE, GET, PUT"),
    ("DELETE", "/v1/tenants", "GET, POST"),
])
def test_a_405_allows_every_method_of_the_path(app, method, path, allow):
    # Routing refuses the method before any dependency runs: no key, engine or database needed.
    response = TestClient(app).request(method, path)
    assert response.status_code == 405
    assert response.headers["allow"] == allow
    assert response.json()["error"]["type"] == "invalid_request_error"
