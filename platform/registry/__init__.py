"""The adapter registry: uploads and their validation, immutable versions, aliases, and the
one path from `name` / `name:alias` / `name@N` to an AdapterHandle for the request path
(lookup.py). Services take a session and keyword-only arguments; the HTTP routes are in
platform/api/routes/adapters.py."""
