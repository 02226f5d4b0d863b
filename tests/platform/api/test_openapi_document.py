"""The OpenAPI document as api_app() builds it, with no engine or database behind it (what
`make web-types` writes), and the 405s of its routes: what the contract test (tests/platform/contract)
relies on, checked where a failure says exactly which rule broke."""
from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from loraloom.platform.api.app import api_app
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
    version = document["components"]["schemas"]["AliasMoveBody"]["properties"]["version"]
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
