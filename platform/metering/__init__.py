"""Metering: what was served and done, recorded off the request path. usage.py (one row per
generation, and the sums of GET /v1/usage), audit.py (one row per mutating call),
batch_writer.py (the batched inserts both use), engine_metrics.py (Prometheus, read from the
engine at scrape time)."""
