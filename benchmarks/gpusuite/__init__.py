"""The pieces of benchmarks/gpu_suite.py: shapes and sizes, ceilings, kernel checks, scenarios, the peer, the table."""
