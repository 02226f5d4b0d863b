"""`loraloom serve` and `loraloom worker`: the processes. serve runs the API over one engine (and a
training worker beside it, unless --no-worker); worker consumes the training queue."""
from __future__ import annotations

import argparse
import importlib.util
import logging
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from loraloom.engine import (FP8_ACTIVATION_TERMS, GENERATION_CONFIG_SOURCES, KV_CACHE_DTYPES, LORA_DTYPES,
                             QUANTIZATION_METHODS, SCHEDULING_POLICIES, SPECULATION_MODES,
                             EngineConfig)
from loraloom.platform.cli.options import adapter_argument, fraction, load_settings, positive_int
from loraloom.platform.log_format import configure_logging

if TYPE_CHECKING:
    from fastapi import FastAPI

    from loraloom.engine import EngineClient
    from loraloom.platform.settings import Settings

    from loraloom.platform.api.metrics_server import MetricsServer

DEFAULT_HOST = "127.0.0.1"
# settings.TOOL_PARSER_CHOICES, without importing pydantic-settings for `--help` (tests/platform/cli checks they agree)
TOOL_PARSER_CHOICES = ("auto", "smollm2", "hermes", "llama3_json")
DEFAULT_PORT = 8000


def add_serve_command(commands: argparse._SubParsersAction) -> None:
    serve = commands.add_parser(
        "serve", help="serve the OpenAI-compatible API", formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    serve.add_argument(
        "--model", type=Path, metavar="PATH", help="Llama checkpoint directory (Hugging Face layout); default: bundled"
    )
    serve.add_argument("--host", default=DEFAULT_HOST, help="address to listen on")
    serve.add_argument("--port", type=int, default=DEFAULT_PORT, help="port to listen on")
    serve.add_argument(
        "--metrics-port", type=int, default=None, metavar="PORT",
        help="also serve the Prometheus metrics without a key on this port (0: a free one); on the API's port "
        "/metrics needs the operator's key",
    )
    serve.add_argument(
        "--metrics-host", default=DEFAULT_HOST,
        help="address of --metrics-port: loopback by default; 0.0.0.0 only where the network limits who reaches it",
    )
    serve.add_argument(
        "--adapter",
        type=adapter_argument,
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="serve the PEFT adapter in PATH as NAME (repeatable)",
    )
    serve.add_argument(
        "--adapter-dir", type=Path, metavar="DIR", help="serve every PEFT adapter subdirectory of DIR by its name"
    )
    defaults = EngineConfig()
    engine_sizes = [
        ("--max-loras", defaults.max_loras, "adapter slots: distinct adapters in one step"),
        ("--max-lora-rank", defaults.max_lora_rank, "largest adapter rank accepted"),
        ("--num-kv-blocks", defaults.num_kv_blocks, "KV cache blocks in the pool"),
        ("--max-num-seqs", defaults.max_num_seqs, "requests running at once"),
        ("--max-num-batched-tokens", defaults.max_num_batched_tokens, "token budget of one step"),
        ("--block-size", defaults.block_size, "tokens per KV cache block"),
    ]
    for flag, default, help_text in engine_sizes:
        serve.add_argument(flag, type=positive_int, default=default, help=help_text)
    serve.add_argument("--device", default=None,
                       help="torch device to serve on (default: cuda when a GPU is visible, else cpu)")
    serve.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default=None,
                       help="activation dtype (default: bfloat16 on a GPU, float32 on the CPU)")
    serve.add_argument("--gpu-memory-utilization", type=fraction, default=defaults.gpu_memory_utilization,
                       help="share of the GPU's memory the engine may use; the KV cache gets what the weights, "
                       "adapter slots and activations leave of it")
    serve.add_argument("--scheduling-policy", choices=SCHEDULING_POLICIES, default=defaults.scheduling_policy,
                       help="how waiting requests are admitted: fair shares the engine across tenants by tokens "
                       "(each tenant's counter charged per token / its weight; the smallest counter goes first, and "
                       "a tenant under its share may preempt one over it); fcfs admits oldest first whoever asks")
    serve.add_argument("--speculation", choices=SPECULATION_MODES, default=defaults.speculation,
                       help="speculative decoding: auto proposes the tokens that followed the same few tokens "
                       "earlier in the request's own prompt and output, or in its adapter's recent answers (its own "
                       "tenant's only), and checks them with the request's own adapter in its next step, so a step "
                       "can emit several tokens; outputs are exactly those of decoding one token at a time. It pays "
                       "on answers that quote or edit their prompt and on templated answers; a request whose "
                       "proposals keep failing stops proposing. off decodes one token per request per step")
    serve.add_argument("--speculative-max-tokens", type=positive_int, default=defaults.speculative_max_tokens,
                       metavar="K", help="the most proposed tokens one request checks in one step")
    serve.add_argument(
        "--metrics-max-adapters", type=int, default=None, metavar="N",
        help="adapters whose requests get their own `model` label in the latency histograms and request "
        f"counters; later ones count as model=\"other\" (default: LORALOOM_METRICS_MAX_ADAPTERS, else "
        f"{defaults.metrics_max_adapters})",
    )
    serve.add_argument("--tool-parser", choices=TOOL_PARSER_CHOICES, default=None,
                       help="the format tool calls are constrained to and parsed in: auto reads the model family "
                       "from the chat template (default: LORALOOM_TOOL_PARSER, else auto); an adapter that names "
                       "its own (adapter_config.json's tool_parser) gets that one, and one with its own chat "
                       "template the format that template shows")
    serve.add_argument("--enforce-eager", action="store_true",
                       help="run every step eagerly instead of replaying decode steps from CUDA graphs")
    serve.add_argument(
        "--broker-url", metavar="URL",
        help="training job queue (redis://... or amqp://...); default: LORALOOM_BROKER_URL, else an embedded one",
    )
    serve.add_argument(
        "--no-worker", action="store_true",
        help="start no training worker (run `loraloom worker` elsewhere with the same database, storage and broker)",
    )
    serve.add_argument(
        "--no-engine", action="store_true",
        help="serve the API without an engine (the control plane: adapters, files, fine-tuning, keys, usage, the "
        "console), answering generation with a 503 that points at the inference gateway; --model and the engine "
        "flags still name the base the engine pods serve (its config, tokenizer and limits), no weights are loaded",
    )
    serve.add_argument(
        "--quantization",
        choices=QUANTIZATION_METHODS,
        default=None,
        help="fp8: quantize the base model's linear layers to FP8 at load (weights per channel, activations "
        "per token; lm_head and the last decoder layer stay unquantized). "
        "FP8 checkpoints (compressed-tensors) are FP8 without this flag",
    )
    serve.add_argument(
        "--fp8-activation-terms",
        type=int,
        choices=FP8_ACTIVATION_TERMS,
        default=defaults.fp8_activation_terms,
        help="with --quantization fp8: quantize each token's activations in this many e4m3 terms. 2 (default): "
        "the second term carries the first one's rounding error, which keeps the bundled model within 1%% of "
        "its BF16 perplexity, almost free at decode, twice the projections' FP8 FLOPs at prefill; 1: plain W8A8",
    )
    serve.add_argument(
        "--kv-cache-dtype",
        choices=KV_CACHE_DTYPES,
        default=defaults.kv_cache_dtype,
        help="auto: keep K/V in the model's dtype; fp8: store them in FP8 e4m3 with a K and a V scale per layer "
        "(half the memory of bf16, so twice the tokens fit), taken from the checkpoint (self_attn.k_scale/v_scale) "
        "or calibrated at start",
    )
    serve.add_argument(
        "--lora-dtype",
        choices=LORA_DTYPES,
        default=defaults.lora_dtype,
        help="auto: adapter weights in the model's dtype (applied exactly as PEFT would); on the CPU, bfloat16 "
        "or float16 halve the bytes each decode step reads for its adapters (faster when many requests use "
        "distinct adapters), rounding the weights once at load and still computing in float32",
    )
    serve.add_argument(
        "--generation-config",
        choices=GENERATION_CONFIG_SOURCES,
        default=defaults.generation_config,
        help="auto: sampling fields a request leaves out (temperature, top_p, top_k, repetition_penalty, "
        "max_tokens) come from the model's generation_config.json, as vLLM does; none: the server's own defaults "
        "(temperature 1, top_p 1)",
    )


def add_worker_command(commands: argparse._SubParsersAction) -> None:
    worker = commands.add_parser(
        "worker", help="run a training worker (queue `training`)", formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    worker.add_argument("--model", type=Path, metavar="PATH", help="the base the server serves; default: bundled")
    worker.add_argument("--max-lora-rank", type=positive_int, default=EngineConfig().max_lora_rank,
                        help="the servers' --max-lora-rank: a job of a higher rank fails, since they could not load it")
    worker.add_argument("--broker-url", metavar="URL", help="default: LORALOOM_BROKER_URL, else the embedded broker")
    worker.add_argument("--loglevel", default="INFO")


def engine_config(args: argparse.Namespace) -> EngineConfig:
    device = args.device or default_device()
    dtype = args.dtype or ("bfloat16" if device.startswith("cuda") else "float32")
    return EngineConfig(
        device=device,
        dtype=dtype,
        gpu_memory_utilization=args.gpu_memory_utilization,
        enforce_eager=args.enforce_eager,
        scheduling_policy=args.scheduling_policy,
        speculation=args.speculation,
        speculative_max_tokens=args.speculative_max_tokens,
        block_size=args.block_size,
        num_kv_blocks=args.num_kv_blocks,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_loras=args.max_loras,
        max_lora_rank=args.max_lora_rank,
        quantization=args.quantization,
        fp8_activation_terms=args.fp8_activation_terms,
        kv_cache_dtype=args.kv_cache_dtype,
        lora_dtype=args.lora_dtype,
        **({} if args.metrics_max_adapters is None else {"metrics_max_adapters": args.metrics_max_adapters}),
        generation_config=args.generation_config,
    )


def use_settings_defaults(args: argparse.Namespace, settings: Settings) -> None:
    """The flags left out take their LORALOOM_* setting, where one exists."""
    if args.metrics_max_adapters is None:
        args.metrics_max_adapters = settings.metrics_max_adapters


def default_device() -> str:
    import torch  # imported here: `--help` need not pay for torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def serve(args: argparse.Namespace) -> None:
    # Imported here: torch and the web stack take seconds to import, which `--help` need not pay.
    import uvicorn
    from sqlalchemy.exc import SQLAlchemyError

    from loraloom.engine import EngineFacts, import_bundled
    from loraloom.platform.api.composition import compose_app
    from loraloom.platform.api.engineless import NO_ENGINE_DEVICE, EnginelessClient
    from loraloom.platform.api.overload import default_max_waiting
    from loraloom.platform.cli.admin import bootstrap_notice, prepare_database, shown_url
    from loraloom.platform.training.supervisor import TrainingSupervisor

    from loraloom.engine import reserve_for_step_thread

    if not args.no_engine:
        reserve_for_step_thread()  # before any thread runs torch: the engine's step thread alone gets all of its threads
    configure_logging(logging.INFO)
    settings = load_settings(args.broker_url)
    try:
        key_file = prepare_database(settings)
    except SQLAlchemyError as error:
        sys.exit(f"loraloom serve: database {shown_url(settings.database_url)}: {error}")
    except OSError as error:  # the key's file: the data directory is not writable
        sys.exit(f"loraloom serve: writing the bootstrap admin key: {error}; set LORALOOM_DATA_DIR to a writable "
                 "folder")
    if key_file is not None:
        logging.getLogger(__name__).warning(bootstrap_notice(key_file), extra={"bootstrap_key_file": str(key_file)})
    model_dir = args.model if args.model is not None else import_bundled()
    use_settings_defaults(args, settings)
    if args.tool_parser is not None:
        settings.tool_parser = args.tool_parser
    if settings.max_waiting_requests is None:  # a full server is judged against this engine's size
        settings.max_waiting_requests = default_max_waiting(args.max_num_seqs)
    # The training side: the worker beside the server (unless --no-worker), restarted when it dies or
    # gets stuck, and a reaper of jobs whose worker died.
    training = TrainingSupervisor(
        settings, None if args.no_worker else worker_command(model_dir, settings.broker_url, args.max_lora_rank)
    )
    try:
        engine = (serving_engine(model_dir, args, settings) if not args.no_engine
                  else EnginelessClient(EngineFacts.of_model_dir(model_dir, engine_config(args), device=NO_ENGINE_DEVICE),
                                        model_dir))
        app = compose_app(settings, engine, adapters=dict(args.adapter), adapter_dir=args.adapter_dir,
                          training=training)
    except (ValueError, FileNotFoundError) as error:  # bad model directory or adapter names: say which, no traceback
        sys.exit(f"loraloom serve: {error}")
    # uvicorn handles SIGTERM with a graceful shutdown, then raises it again with the handler found at
    # its start: the default one would end the process before the `finally` stops the worker.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    metrics = None if args.metrics_port is None else serve_metrics(app, args.metrics_host, args.metrics_port)
    training.start()
    try:
        # log_config=None: uvicorn's lines go through our JSON handler; its access log would repeat the
        # app's own request lines (api/request_log.py), which carry the request id, tenant and tokens.
        uvicorn.run(app, host=args.host, port=args.port, log_config=None, access_log=False, **fast_server_options())
    finally:
        training.stop()
        if metrics is not None:
            metrics.stop()


def serving_engine(model_dir: Path, args: argparse.Namespace, settings: Settings) -> EngineClient:
    """The engine in this process, fetching adapters from the registry's storage."""
    from loraloom.engine import AsyncEngine
    from loraloom.platform.registry.fetch import adapter_fetcher_from_settings
    from loraloom.platform.storage import storage_from_settings

    return AsyncEngine.create(model_dir, engine_config(args),
                              adapter_fetcher_from_settings(settings, storage_from_settings(settings)))


def serve_metrics(app: FastAPI, host: str, port: int) -> MetricsServer:
    """The app's metrics on their own listener (api/metrics_server.py), announced in the log."""
    from loraloom.platform.api.metrics_server import start_metrics_server

    try:
        metrics = start_metrics_server(app.state.metrics_registry, host, port)
    except OSError as error:  # the port is taken, the address is not ours: say which, no traceback
        sys.exit(f"loraloom serve: --metrics-port {port} on {host}: {error}")
    logging.getLogger(__name__).info("Prometheus metrics on http://%s:%d/metrics (no key)", host, metrics.port)
    return metrics


def _exit_on_sigterm(signum: int, frame: object) -> None:
    sys.exit(128 + signum)


def fast_server_options() -> dict[str, str]:
    """uvicorn's event loop and HTTP parser for `serve`: uvloop's and httptools', both in C and faster
    than the pure-Python ones, wherever they are installed (uvloop has no Windows build)."""
    return {
        "loop": "uvloop" if importlib.util.find_spec("uvloop") is not None else "asyncio",
        "http": "httptools" if importlib.util.find_spec("httptools") is not None else "h11",
    }


def worker_command(model_dir: Path, broker_url: str | None, max_lora_rank: int) -> list[str]:
    """`loraloom worker` beside the server, so `serve` alone trains too. A process of its own: it
    forks a fresh child per job, which the server's threads and CUDA state must not be part of.
    It trains for this server: its base, and its largest rank."""
    command = [sys.executable, "-m", "loraloom.platform.cli", "worker", "--model", str(model_dir),
               "--max-lora-rank", str(max_lora_rank)]
    if broker_url is not None:
        command += ["--broker-url", broker_url]
    return command


def run_worker_command(args: argparse.Namespace) -> None:
    from sqlalchemy.exc import SQLAlchemyError

    from loraloom.engine import import_bundled
    from loraloom.platform.cli.admin import shown_url
    from loraloom.platform.db import upgrade_database
    from loraloom.platform.training.worker import run_worker

    configure_logging(args.loglevel)
    settings = load_settings(args.broker_url)
    try:
        upgrade_database(settings.database_url)
    except SQLAlchemyError as error:
        sys.exit(f"loraloom worker: database {shown_url(settings.database_url)}: {error}")
    model_dir = args.model if args.model is not None else import_bundled()
    if not (model_dir / "config.json").is_file():
        sys.exit(f"loraloom worker: --model {model_dir}: no config.json there; pass the served base's directory")
    run_worker(settings, model_dir, args.max_lora_rank, loglevel=args.loglevel)
