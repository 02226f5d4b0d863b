"""The adapter registry: uploads and their validation, immutable versions, aliases, and the
resolution of `name` / `name:alias` / `name@N` for the request path. Services take a
session and keyword-only arguments; the HTTP routes are in platform/api/adapters.py and
the gateway's lookup in platform/registry_lookup.py."""
