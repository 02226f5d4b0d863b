"""Speculative decoding over HTTP: `loraloom serve --speculation auto` against `--speculation off` on the
bundled model, greedy (temperature 0), one server per mode, both in the same run.

Method. Both servers are started as a user starts them (`--adapter-dir` with three PEFT adapters of
different ranks and module subsets, small init so their outputs stay fluent); load goes to one server at a
time. Each round sends every workload below to both servers, the same requests to each, in an order that
alternates by round (ABBA: auto first in even rounds, off first in odd ones), so load drift weighs on both
modes alike. Every measured set of requests is new (its own seed) and is sent by its own tenant, so the
auto server's per-(tenant, adapter) answer store starts empty for it: no figure depends on an earlier set's
answers, except (b)'s, whose warm-up is the point. Workloads:

  (a) extractive: repeat, quote or edit a passage of 80-150 words given in the prompt (base and the three
      adapters in turn), at batch 1 (one request after another) and batch 8 (8 concurrent);
  (b) templated: one adapter fills a fixed JSON schema (response_format json_schema: name, city, age,
      occupation, hobbies) from a short generated bio, batch 1, after --warmup such requests to that
      adapter on each server (they fill its answer store; not measured);
  (c) open-ended chat: poems, explanations, advice, stories (base and the adapters in turn), batch 1 and 8.

Reported per workload and batch: completion tokens / s of each mode (tokens over the wall time of its
requests, pooled over rounds), the speedup auto / off, the acceptance rate (accepted / proposed tokens:
deltas of the auto server's `server.speculation` in GET /v1/engine/status, read with the operator's key),
and whether every output was identical between the modes (text and completion tokens, request by request).

Targets (issue): (a) batch 1 >= 2.0x, (a) batch 8 >= 1.5x, (b) batch 1 >= 1.5x, (c) batch 1 and 8 >= 0.97x;
outputs identical in every case. A missed speed target is reported, not failed (exit status 0); any output
that differs between the modes is printed and makes the exit status 1, since greedy speculative decoding
must reproduce decoding one token at a time exactly.

    python benchmarks/speculation.py [--rounds 2] [--requests 16] [--max-tokens 128] [--warmup 20]
                                     [--speculative-max-tokens K] [--adapter-cache DIR] [--quick]

Not a test: figures go to BENCHMARKS.md with the machine and its load.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests")]

from served.server import LORALOOM, Server, running_server  # noqa: E402
from served.speculation_workload import (SpecRequest, chat_requests, extractive_requests,  # noqa: E402
                                         templated_requests)
from served.workload import ATTENTION, MLP, AdapterSpec, write_adapters  # noqa: E402

from loraloom.engine.model.bundled import import_bundled  # noqa: E402
from loraloom.platform.accounts.keys import OPERATOR_TENANT  # noqa: E402

MODES = ("auto", "off")
# Three adapters: ranks and module subsets differ, as customers' do (initials: q k v o g u d).
ADAPTERS = [AdapterSpec("spec0-r8-qkvogud", 8, tuple(ATTENTION + MLP)),
            AdapterSpec("spec1-r16-qkvo", 16, tuple(ATTENTION)),
            AdapterSpec("spec2-r32-gud", 32, tuple(MLP))]
TEMPLATED_ADAPTER = ADAPTERS[1].name
JSON_MAX_TOKENS = 96  # (b)'s budget: its JSON (about 50 tokens) ends the answer well before it
TEMPLATED_TENANT = "templated"
WARMUP_TOKENS = 8  # the one-time warm-up's budget (every model at batch 1 and 8)


@dataclass(frozen=True)
class Workload:
    name: str  # extractive, templated or chat
    label: str
    batch: int
    target: float  # the speedup auto / off the issue asks for


WORKLOADS = (
    Workload("extractive", "(a) extractive", 1, 2.0),
    Workload("extractive", "(a) extractive", 8, 1.5),
    Workload("templated", "(b) templated", 1, 1.5),
    Workload("chat", "(c) chat", 1, 0.97),
    Workload("chat", "(c) chat", 8, 0.97),
)


@dataclass
class SetResult:
    """One set of requests on one server: the wall time of its groups, each answer, the drafts verified."""

    seconds: float
    texts: list[str]
    tokens: list[int]
    drafted: int = 0
    accepted: int = 0


@dataclass
class Totals:
    seconds: float = 0.0
    tokens: int = 0
    drafted: int = 0
    accepted: int = 0

    def add(self, result: SetResult) -> None:
        self.seconds += result.seconds
        self.tokens += sum(result.tokens)
        self.drafted += result.drafted
        self.accepted += result.accepted

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


@dataclass
class Mismatch:
    where: str
    request: SpecRequest
    texts: dict[str, str]
    tokens: dict[str, int]


@dataclass
class Row:
    """A workload at one batch size, pooled over rounds."""

    totals: dict[str, Totals] = field(default_factory=lambda: {mode: Totals() for mode in MODES})
    requests: int = 0
    identical: int = 0
    valid_json: int = 0  # (b): answers that parse as JSON on both servers


@dataclass
class ModeServer:
    """A running server of one mode, with the operator's key and a developer key per tenant (made on demand:
    a new tenant has an empty answer store)."""

    mode: str
    server: Server
    data_dir: Path
    operator_key: str
    keys: dict[str, str] = field(default_factory=dict)

    def key(self, tenant: str) -> str:
        """A developer key of `tenant`, the tenant created first: the operator does both over the API."""
        if tenant not in self.keys:
            for path, body in (("/v1/tenants", {"name": tenant}),
                               ("/v1/keys", {"tenant": tenant, "role": "developer", "name": "speculation benchmark"})):
                response = httpx.post(f"{self.server.url}{path}", json=body, timeout=60,
                                      headers={"Authorization": f"Bearer {self.operator_key}"})
                if response.status_code != 201:
                    raise RuntimeError(f"POST {path}: {response.status_code}: {response.text}")
            self.keys[tenant] = response.json()["key"]
        return self.keys[tenant]

    def speculation(self) -> dict:
        """The operator's view of speculative decoding across the engine (drafted and accepted tokens, the store)."""
        response = httpx.get(f"{self.server.url}/v1/engine/status", timeout=60,
                             headers={"Authorization": f"Bearer {self.operator_key}"})
        response.raise_for_status()
        return response.json()["server"]["speculation"]


def operator_key(data_dir: Path) -> str:
    """An admin key of the operator's tenant, made with `loraloom admin`: its engine status has the server view."""
    env = {**os.environ, "LORALOOM_DATA_DIR": str(data_dir)}
    return subprocess.run([str(LORALOOM), "admin", "create-key", "--tenant", OPERATOR_TENANT, "--role", "admin",
                           "--name", "speculation benchmark"],
                          env=env, check=True, capture_output=True, text=True).stdout.strip()


async def _send_set(url: str, key: str, requests: list[SpecRequest], batch: int) -> SetResult:
    """Send the requests `batch` at a time (each group concurrently, the next when all of it answered); the
    seconds are the groups' wall times summed."""
    limits = httpx.Limits(max_connections=batch + 4, max_keepalive_connections=batch + 4)
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {key}"}, limits=limits,
                                 timeout=None) as client:
        async def one(request: SpecRequest) -> tuple[str, int]:
            response = await client.post("/v1/chat/completions", json=request.body())
            if response.status_code != 200:
                raise RuntimeError(f"{response.status_code}: {response.text}")
            answer = response.json()
            return answer["choices"][0]["message"]["content"] or "", answer["usage"]["completion_tokens"]

        seconds, answers = 0.0, []
        for start in range(0, len(requests), batch):
            began = time.perf_counter()
            answers += await asyncio.gather(*(one(request) for request in requests[start:start + batch]))
            seconds += time.perf_counter() - began
    return SetResult(seconds, [text for text, _ in answers], [tokens for _, tokens in answers])


def send_set(server: ModeServer, tenant: str, requests: list[SpecRequest], batch: int) -> SetResult:
    """One set on one server, with the drafted and accepted tokens it moved in the server's counters."""
    key = server.key(tenant)  # made before the clock starts
    before = server.speculation()
    result = asyncio.run(_send_set(server.server.url, key, requests, batch))
    after = server.speculation()
    result.drafted = after["draft_tokens"] - before["draft_tokens"]
    result.accepted = after["accepted_tokens"] - before["accepted_tokens"]
    return result


def compare(where: str, requests: list[SpecRequest], results: dict[str, SetResult]) -> list[Mismatch]:
    """The requests whose answer (text or completion tokens) differs between the modes."""
    found = []
    for i, request in enumerate(requests):
        texts = {mode: results[mode].texts[i] for mode in MODES}
        tokens = {mode: results[mode].tokens[i] for mode in MODES}
        if len(set(texts.values())) > 1 or len(set(tokens.values())) > 1:
            found.append(Mismatch(where, request, texts, tokens))
    return found


def print_mismatch(mismatch: Mismatch) -> None:
    print(f"\n!!! OUTPUT MISMATCH ({mismatch.where}): {mismatch.request.short()}")
    print(f"    request body: {json.dumps(mismatch.request.body())}")
    for mode in MODES:
        print(f"    --speculation {mode} ({mismatch.tokens[mode]} tokens): {mismatch.texts[mode]!r}")


def valid_json(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


def workload_requests(workload: Workload, args, round_number: int, seed_offset: int) -> list[SpecRequest]:
    """The set a workload sends in a round: new for each (workload, batch, round), the same on both servers.
    Batch-8 sets send --requests rounded up to a multiple of 8, so every group is a full batch."""
    count = args.requests if workload.batch == 1 else -(-args.requests // 8) * 8
    seed = 1000 * (round_number + 1) + seed_offset
    models: list[str | None] = [None] + [spec.name for spec in ADAPTERS]
    if workload.name == "extractive":
        return extractive_requests(count, models, args.max_tokens, seed)
    if workload.name == "templated":
        return templated_requests(count, TEMPLATED_ADAPTER, JSON_MAX_TOKENS, seed)
    return chat_requests(count, models, args.max_tokens, seed)


def run_both(servers: dict[str, ModeServer], order: tuple[str, ...], tenant: str, requests: list[SpecRequest],
             batch: int) -> dict[str, SetResult]:
    return {mode: send_set(servers[mode], tenant, requests, batch) for mode in order}


def warm_up(servers: dict[str, ModeServer], args) -> list[Mismatch]:
    """One-time costs out of the figures (every adapter loaded into its slot, first forwards at batch 1 and 8),
    then --warmup templated requests to (b)'s adapter on (b)'s tenant: they fill its answer store on the auto
    server, as a deployment's steady traffic would. Their answers are compared too."""
    models: list[str | None] = [None] + [spec.name for spec in ADAPTERS]
    first = extractive_requests(8, models, WARMUP_TOKENS, seed=7)
    mismatches = []
    templated = templated_requests(args.warmup, TEMPLATED_ADAPTER, JSON_MAX_TOKENS, seed=99)
    sets = [("warm-up", first[:len(models)], "warmup", 1), ("warm-up", first, "warmup", 8),
            ("(b) warm-up", templated, TEMPLATED_TENANT, 1)]
    for name, requests, tenant, batch in sets:
        if not requests:
            continue
        results = run_both(servers, MODES, tenant, requests, batch)
        mismatches += compare(name, requests, results)
    auto = servers["auto"].speculation()
    print(f"warm-up done: auto server drafted {auto['draft_tokens']} tokens, accepted {auto['accepted_tokens']}; "
          f"answer store {auto['store_tokens']} tokens ({auto['store_bytes'] / 1e3:.0f} kB)", flush=True)
    return mismatches


def run_rounds(servers: dict[str, ModeServer], args) -> tuple[dict[tuple[str, int], Row], list[Mismatch]]:
    rows = {(w.name, w.batch): Row() for w in WORKLOADS}
    mismatches = warm_up(servers, args)
    for round_number in range(args.rounds):
        order = MODES if round_number % 2 == 0 else MODES[::-1]
        for offset, workload in enumerate(WORKLOADS):
            requests = workload_requests(workload, args, round_number, offset)
            # Each set its own tenant (its own empty answer store), except (b): its warm-up filled its store.
            tenant = TEMPLATED_TENANT if workload.name == "templated" else \
                f"{workload.name}-b{workload.batch}-r{round_number}"
            results = run_both(servers, order, tenant, requests, workload.batch)
            where = f"{workload.label} batch {workload.batch} round {round_number}"
            found = compare(where, requests, results)
            mismatches += found
            row = rows[(workload.name, workload.batch)]
            for mode in MODES:
                row.totals[mode].add(results[mode])
            row.requests += len(requests)
            row.identical += len(requests) - len(found)
            if workload.name == "templated":
                row.valid_json += sum(valid_json(results["auto"].texts[i]) and valid_json(results["off"].texts[i])
                                      for i in range(len(requests)))
            auto, off = results["auto"], results["off"]
            speedup = (sum(auto.tokens) / auto.seconds) / (sum(off.tokens) / off.seconds)
            rate = f"{auto.accepted / auto.drafted:.0%} of {auto.drafted} drafted" if auto.drafted else "no drafts"
            print(f"  round {round_number} ({'-'.join(order)}) {workload.label:15} batch {workload.batch}: "
                  f"auto {sum(auto.tokens) / auto.seconds:6.1f} tok/s, off {sum(off.tokens) / off.seconds:6.1f} tok/s, "
                  f"{speedup:.3f}x; accepted {rate}; {len(requests) - len(found)}/{len(requests)} identical"
                  f"{'' if not off.drafted else f'; THE OFF SERVER DRAFTED {off.drafted} TOKENS'}", flush=True)
            for mismatch in found:
                print_mismatch(mismatch)
    return rows, mismatches


def print_table(rows: dict[tuple[str, int], Row]) -> None:
    print(f"\n{'workload':16} {'batch':>5} {'off tok/s':>10} {'auto tok/s':>11} {'speedup':>8}  {'target':16} "
          f"{'acceptance':24} outputs")
    for workload in WORKLOADS:
        row = rows[(workload.name, workload.batch)]
        auto, off = row.totals["auto"], row.totals["off"]
        speedup = auto.tokens_per_s / off.tokens_per_s if off.tokens_per_s else 0.0
        verdict = "met" if speedup >= workload.target else "MISSED"
        acceptance = (f"{auto.accepted / auto.drafted:.0%} ({auto.accepted}/{auto.drafted})" if auto.drafted
                      else "no drafts")
        note = f", {row.valid_json}/{row.requests} valid JSON" if workload.name == "templated" else ""
        print(f"{workload.label:16} {workload.batch:>5} {off.tokens_per_s:10.1f} {auto.tokens_per_s:11.1f} "
              f"{speedup:7.3f}x  >= {workload.target:.2f}x {verdict:6} {acceptance:24} "
              f"{row.identical}/{row.requests} identical{note}")


def print_per_model(speculation: dict) -> None:
    """The auto server's acceptance per model, every tenant's drafts together (warm-ups included)."""
    by_model: dict[str, list[int]] = {}
    for line in speculation["models"]:
        counts = by_model.setdefault(line["model"], [0, 0])
        counts[0] += line["accepted_tokens"]
        counts[1] += line["draft_tokens"]
    print("acceptance per model (auto server, all requests): " + ", ".join(
        f"{model} {accepted / drafted:.0%} of {drafted}" for model, (accepted, drafted) in sorted(by_model.items())
        if drafted))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2, help="rounds, alternating which mode goes first")
    parser.add_argument("--requests", type=int, default=16,
                        help="requests per set at batch 1; batch-8 sets send it rounded up to a multiple of 8")
    parser.add_argument("--max-tokens", type=int, default=128,
                        help="max_tokens of (a) and (c) ((b) ends with its JSON)")
    parser.add_argument("--warmup", type=int, default=20, help="(b)'s warm-up requests to its adapter on each server")
    parser.add_argument("--speculative-max-tokens", type=int, default=None, metavar="K",
                        help="passed to the auto server (default: the server's own default)")
    parser.add_argument("--adapter-cache", type=Path, default=None,
                        help="directory to keep the generated adapters in between runs")
    parser.add_argument("--quick", action="store_true",
                        help="a tiny run: 1 round, 2 requests per batch-1 set, 16 tokens, 2 (b) warm-up requests")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.requests, args.max_tokens, args.warmup = 1, 2, 16, 2
    started = time.monotonic()
    model_dir = import_bundled()
    print(f"speculative decoding over HTTP, auto against off: {args.rounds} round(s), {args.requests} requests per "
          f"batch-1 set, max_tokens {args.max_tokens} ((b): {JSON_MAX_TOKENS}), (b) warm-up {args.warmup}; "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at start", flush=True)
    print("adapters: " + ", ".join(spec.name for spec in ADAPTERS) + f"; (b) on {TEMPLATED_ADAPTER}", flush=True)
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        adapter_root = args.adapter_cache or Path(tmp) / "adapters"
        write_adapters(model_dir, adapter_root, ADAPTERS)
        servers: dict[str, ModeServer] = {}
        for mode in MODES:
            data_dir = Path(tmp) / mode
            data_dir.mkdir()
            serve_args = ["--adapter-dir", str(adapter_root), "--max-loras", str(len(ADAPTERS)),
                          "--max-lora-rank", str(max(spec.rank for spec in ADAPTERS)), "--speculation", mode]
            if mode == "auto" and args.speculative_max_tokens is not None:
                serve_args += ["--speculative-max-tokens", str(args.speculative_max_tokens)]
            server = stack.enter_context(running_server(data_dir, serve_args, data_dir / "serve.log"))
            servers[mode] = ModeServer(mode, server, data_dir, operator_key(data_dir))
        print(f"both servers up after {time.monotonic() - started:.0f} s", flush=True)
        rows, mismatches = run_rounds(servers, args)
        store = servers["auto"].speculation()
    print_table(rows)
    print_per_model(store)
    print(f"auto server at the end: acceptance {store['acceptance_rate']}, answer store {store['store_tokens']} tokens "
          f"({store['store_bytes'] / 1e3:.0f} kB); load average {os.getloadavg()[0]:.2f} at end; "
          f"{(time.monotonic() - started) / 60:.1f} min in all")
    if mismatches:
        print(f"\n!!! {len(mismatches)} OUTPUT(S) DIFFER BETWEEN --speculation auto AND off (greedy: they must not):")
        for mismatch in mismatches:
            print_mismatch(mismatch)
        sys.exit(1)
    print("every output identical between --speculation auto and off")


if __name__ == "__main__":
    main()
