"""Engine replicas on Ray Serve: served throughput with one and with two replicas under the same mixed
multi-adapter load, in one run, and how often a request landed on a replica already holding its adapter.

For each replica count it starts a local Ray cluster, the loraloom app (platform/ray_serve: gateway +
engine deployment) on a throwaway PostgreSQL database and a file:// blob store, pushes the mixed
workload's adapters through the API, warms each adapter once, then sends the realistic mixed workload
(benchmarks/served/workload.py: budgets 16-256, a third behind a long shared system prompt, adapters
drawn with a skew) over HTTP, all at once.

"Landed on a holder": a request served by a replica whose host cache already held its adapter. Each
replica's own account (the status it posts to the replica board) gives its host-cache misses, one per
adapter it had to fetch; the share is 1 - misses / adapter requests over the measured batch.

    python benchmarks/ray_replicas.py [--requests 40] [--adapters 8] [--replicas 1 2]

Not a test: figures go to BENCHMARKS.md with the machine's load. On a machine with fewer cores than
replicas x torch threads, the replicas share the cores: the ratio then shows the cost of routing and of
the extra process, not added capacity.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import socket
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests")]

import httpx  # noqa: E402
import ray  # noqa: E402
from ray import serve  # noqa: E402
from postgres_databases import POSTGRES_URL, throwaway_postgres_database  # noqa: E402
from served.server import Server, send_batch  # noqa: E402
from served.workload import adapter_specs, mixed_requests, write_adapters  # noqa: E402

from loraloom.engine import ADAPTER_FILES  # noqa: E402
from loraloom.engine.model.bundled import import_bundled  # noqa: E402
from loraloom.platform.ray_serve.app import build_application  # noqa: E402
from loraloom.platform.ray_serve.engine_deployment import EngineDeployment  # noqa: E402
from loraloom.platform.ray_serve.replica_board import replica_board  # noqa: E402

ENGINE = {"max_loras": 8, "max_lora_rank": 64}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def ray_app(replicas: int, cpus_per_replica: int, data_dir: Path, database_url: str) -> Iterator[Server]:
    """The loraloom app on a fresh local Ray cluster; a developer key of tenant `bench`."""
    from live_api import make_key, migrated_settings  # tests/live_api.py

    settings = migrated_settings(data_dir, database_url)
    key = make_key(settings, tenant="bench", role="developer")
    os.environ.update({"LORALOOM_DATA_DIR": str(data_dir), "LORALOOM_DATABASE_URL": database_url})
    ray.init(num_cpus=cpus_per_replica * replicas + 2, include_dashboard=False, namespace=f"loraloom-bench-{replicas}",
             log_to_driver=False)
    try:
        port = free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        engine = EngineDeployment.options(num_replicas=replicas, ray_actor_options={"num_cpus": cpus_per_replica})
        serve.run(build_application({"engine": ENGINE}, engine=engine), name="loraloom", route_prefix="/")
        yield Server(f"http://127.0.0.1:{port}", key, None)
    finally:
        serve.shutdown()
        ray.shutdown()


def push_adapters(server: Server, adapters_dir: Path, names: list[str]) -> None:
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {server.key}"}, timeout=300) as client:
        for name in names:
            files = [("files", (file, (adapters_dir / name / file).read_bytes())) for file in ADAPTER_FILES]
            response = client.post(f"/v1/adapters/{name}/versions", files=files)
            if response.status_code not in (200, 201):
                raise RuntimeError(f"pushing {name}: {response.status_code} {response.text}")


def host_cache_misses() -> dict[str, int]:
    return {post.replica: post.stats.host_cache_misses_total for post in ray.get(replica_board().live_posts.remote())}


def run(replicas: int, cpus_per_replica: int, adapters_dir: Path, names: list[str], requests, work: Path) -> dict:
    with (throwaway_postgres_database(POSTGRES_URL) as database_url,
          ray_app(replicas, cpus_per_replica, work / f"data-{replicas}", database_url) as server):
        push_adapters(server, adapters_dir, names)
        # Warm: each adapter's first request (one token), so the measured batch sees no first loads.
        first_of_each = {request.adapter: request for request in reversed(requests) if request.adapter is not None}
        send_batch(server, [dataclasses.replace(request, max_tokens=1) for request in first_of_each.values()])
        before = host_cache_misses()
        result = send_batch(server, requests)
        after = host_cache_misses()
        misses = sum(after[replica] - before.get(replica, 0) for replica in after)
        adapter_requests = sum(1 for request in requests if request.adapter is not None)
        return {"tok_s": result.tokens_per_s, "tokens": result.completion_tokens, "seconds": result.seconds,
                "on_holder": 1 - misses / adapter_requests, "replicas_seen": len(after), "texts": result.texts}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--adapters", type=int, default=8)
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 2])
    # Ray sets an actor's OMP_NUM_THREADS to its num_cpus: this is also each replica's torch threads.
    parser.add_argument("--cpus-per-replica", type=int, default=1)
    args = parser.parse_args()

    model_dir = import_bundled()
    with tempfile.TemporaryDirectory(prefix="loraloom-ray-bench-") as scratch:
        work = Path(scratch)
        specs = adapter_specs(args.adapters)
        write_adapters(model_dir, work / "adapters", specs)
        names = [spec.name for spec in specs]
        requests = mixed_requests(args.requests, names, seed=7)
        results = {replicas: run(replicas, args.cpus_per_replica, work / "adapters", names, requests, work)
                   for replicas in args.replicas}

    print(f"{args.requests} mixed chats over {args.adapters} adapters, all sent at once, over HTTP (Ray Serve, "
          f"{args.cpus_per_replica} CPU(s) and torch thread(s) per replica)")
    print("| replicas | tok/s | tokens | seconds | landed on a holder |")
    print("|---|---|---|---|---|")
    for replicas, row in results.items():
        print(f"| {replicas} ({row['replicas_seen']} posting) | {row['tok_s']:.1f} | {row['tokens']} | "
              f"{row['seconds']:.1f} | {row['on_holder']:.0%} |")
    if 1 in results and 2 in results:
        same = sum(a == b for a, b in zip(results[1]["texts"], results[2]["texts"]))
        print(f"two replicas / one: {results[2]['tok_s'] / results[1]['tok_s']:.2f}; "
              f"identical answers {same}/{len(requests)}")


if __name__ == "__main__":
    main()
