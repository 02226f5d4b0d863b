"""The OpenAPI document: the API's contract. The console's types are generated from it
(web/src/api/openapi.json and schema.d.ts, `make web-types`), and schemathesis holds the server to it
(tests/platform/contract). `python -m loraloom.platform.api.openapi_file [FILE]` writes it, built from
the routes alone: no engine, database or server.

FastAPI writes most of it from the routes and schemas; `install_contract` corrects what FastAPI says
that this API does not do (a 422 for a bad request: it answers 400; bounds of 64-bit integers as floats)
adds the links from each create route to the routes that take what it made, which clients and
stateful testing follow, and the schemas of the chunks that the generation routes stream.
"""
from __future__ import annotations

import json
import re
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel

from loraloom.platform.api.schemas.chat import ChatCompletionChunk
from loraloom.platform.api.schemas.completions import Completion
from loraloom.platform.db.models import MAX_INT64

# What the routes stream (generation/streaming.py's sse_response_doc names each event's chunk schema).
# FastAPI makes components only of what routes take and answer as JSON, so these are added.
STREAMED_CHUNKS: tuple[type[BaseModel], ...] = (Completion, ChatCompletionChunk)

# The create routes, and which field of what they answer names each path parameter of the routes that
# take what they made: a link goes to every operation under the same collection whose path parameters
# these fields all fill (POST /v1/keys -> DELETE /v1/keys/{key_id}, GET /v1/keys/{key_id}/limits, ...).
CREATE_ROUTES: dict[tuple[str, str], dict[str, str]] = {
    ("post", "/v1/adapters/{name}/versions"): {"name": "adapter", "number": "version"},
    ("post", "/v1/tenants"): {"tenant": "name"},
    ("post", "/v1/keys"): {"key_id": "id"},
    ("post", "/v1/files"): {"file_id": "id"},
    ("post", "/v1/fine_tuning/jobs"): {"job_id": "id"},
}


def _validation_errors_as_400(schema: dict[str, Any]) -> None:
    """FastAPI documents a 422 for every operation with a parameter or a body; this API answers a request
    that breaks them with 400 and its error body (errors.py), so that is what the document says."""
    for operations in schema["paths"].values():
        for operation in operations.values():
            responses = operation.get("responses", {})
            if responses.pop("422", None) is not None:
                responses.setdefault("400", {
                    "description": "A parameter or body field is missing, of the wrong type or out of bounds",
                    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}},
                })
    for name in ("HTTPValidationError", "ValidationError"):
        schema.get("components", {}).get("schemas", {}).pop(name, None)


# A float holds integers exactly up to 2**53 only.
_EXACT_FLOAT_INTEGERS = 2**53


def _integer_bounds(node: Any) -> None:
    """FastAPI's OpenAPI models hold bounds as floats: give integer fields integer bounds back. The only
    bound past a float's exact integers is the database's 64-bit limit, which a float rounds up to 2**63."""
    if isinstance(node, list):
        for item in node:
            _integer_bounds(item)
        return
    if not isinstance(node, dict):
        return
    if node.get("type") == "integer":
        for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
            value = node.get(key)
            if isinstance(value, float) and value.is_integer():
                node[key] = MAX_INT64 if value >= _EXACT_FLOAT_INTEGERS else int(value)
    for value in node.values():
        _integer_bounds(value)


def _path_parameters(path: str) -> set[str]:
    return set(re.findall(r"\{(\w+)\}", path))


def _add_links(schema: dict[str, Any]) -> None:
    for (method, path), fields in CREATE_ROUTES.items():
        operation = schema["paths"].get(path, {}).get(method)
        if operation is None:
            raise RuntimeError(f"openapi.CREATE_ROUTES names {method.upper()} {path}, which the app does not serve")
        collection = path.split("{")[0].rstrip("/")
        links = {}
        for target_path, target_operations in schema["paths"].items():
            needed = _path_parameters(target_path)
            if not target_path.startswith(collection) or not needed or not needed <= fields.keys():
                continue
            for target in target_operations.values():
                parameters = {name: f"$response.body#/{fields[name]}" for name in sorted(needed)}
                links[target["operationId"]] = {"operationId": target["operationId"], "parameters": parameters}
        for status, response in operation["responses"].items():
            if status.startswith("2"):
                response["links"] = links


def _add_streamed_chunks(schema: dict[str, Any]) -> None:
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for model in STREAMED_CHUNKS:
        chunk = model.model_json_schema(ref_template="#/components/schemas/{model}", mode="serialization")
        for name, definition in {**chunk.pop("$defs", {}), model.__name__: chunk}.items():
            components.setdefault(name, definition)


def install_contract(app: FastAPI) -> None:
    """Make the app's /openapi.json the document described above (built once, on first use)."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = generate()  # also caches it in app.openapi_schema
            _validation_errors_as_400(schema)
            _integer_bounds(schema)
            _add_links(schema)
            _add_streamed_chunks(schema)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def document_text(document: dict[str, Any]) -> str:
    """The document as the repository keeps it: stable key order, so a regeneration diffs cleanly."""
    return json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
