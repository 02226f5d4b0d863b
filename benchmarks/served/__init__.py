"""Pieces of benchmarks/served_throughput.py: the workload, the server under test, the peers."""
