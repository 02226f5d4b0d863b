"""One router per resource. app.py includes them: every /v1 router behind `authenticate`,
operations (/health open, /metrics the operator's)."""
