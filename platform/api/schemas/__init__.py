"""The request and response bodies of the API, one module per resource (common.py: what they share).
Pydantic models only; the routes in api/routes/ fill them from the services' results."""
