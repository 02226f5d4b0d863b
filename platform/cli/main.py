"""The `loraloom` command line: the parser and the dispatch. The commands live in
cli_admin.py (on the database) and cli_client.py (over HTTP against a server)."""
from __future__ import annotations

import argparse
import logging
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from loraloom.engine.config import FP8_ACTIVATION_TERMS, KV_CACHE_DTYPES, QUANTIZATION_METHODS, EngineConfig

if TYPE_CHECKING:
    from loraloom.platform.settings import Settings

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
RESERVED_NAME_CHARACTERS = ":@/\\"  # kept free for the registry's "name:alias" and "name@version"
WORKER_STOP_TIMEOUT_S = 30
ROLE_CHOICES = ("admin", "developer", "inference")  # ApiKeyRole's values, without importing the database layer


def adapter_argument(value: str) -> tuple[str, Path]:
    """argparse type of --adapter: NAME=PATH."""
    name, separator, path = value.partition("=")
    if not separator or not name or not path:
        raise argparse.ArgumentTypeError(f"expected NAME=PATH (e.g. support-bot=./adapters/support-bot), got {value!r}")
    if any(character in RESERVED_NAME_CHARACTERS for character in name):
        raise argparse.ArgumentTypeError(
            f"adapter name {name!r} in {value!r} may not contain any of {RESERVED_NAME_CHARACTERS!r}; "
            "expected NAME=PATH"
        )
    return name, Path(path)


def positive_int(value: str) -> int:
    """argparse type of the engine sizes."""
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value!r}") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value!r}")
    return number


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="loraloom", description="Multi-LoRA LLM serving.")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser(
        "serve", help="serve the OpenAI-compatible API", formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    serve.add_argument(
        "--model", type=Path, metavar="PATH", help="Llama checkpoint directory (Hugging Face layout); default: bundled"
    )
    serve.add_argument("--host", default=DEFAULT_HOST, help="address to listen on")
    serve.add_argument("--port", type=int, default=DEFAULT_PORT, help="port to listen on")
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

    model = commands.add_parser("model", help="manage models")
    model_commands = model.add_subparsers(dest="model_command", required=True)
    import_bundled = model_commands.add_parser(
        "import-bundled", help="convert the bundled SmolLM2-135M-Instruct once; print its directory"
    )
    import_bundled.add_argument("--force", action="store_true", help="convert again even if already imported")

    db = commands.add_parser("db", help="manage the database (LORALOOM_DATABASE_URL)")
    db_commands = db.add_subparsers(dest="db_command", required=True)
    db_commands.add_parser("upgrade", help="apply the migrations (serve also does this on start)")

    worker = commands.add_parser(
        "worker", help="run a training worker (queue `training`)", formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    worker.add_argument("--model", type=Path, metavar="PATH", help="the base the server serves; default: bundled")
    worker.add_argument("--broker-url", metavar="URL", help="default: LORALOOM_BROKER_URL, else the embedded broker")
    worker.add_argument("--loglevel", default="INFO")

    admin = commands.add_parser("admin", help="administer the database directly, without a server")
    admin_commands = admin.add_subparsers(dest="admin_command", required=True)
    create_key = admin_commands.add_parser(
        "create-key", help="create an API key (and its tenant if new); prints only the key on stdout"
    )
    create_key.add_argument("--tenant", required=True, help="tenant name; created if it does not exist")
    create_key.add_argument("--role", required=True, choices=ROLE_CHOICES)
    create_key.add_argument("--name", default="cli", help="what the key is for")

    add_client_commands(commands)
    from loraloom.platform.cli_training import add_training_commands

    add_training_commands(commands, positive_int)
    return parser


def add_client_commands(commands: argparse._SubParsersAction) -> None:
    """Commands that talk to a server: LORALOOM_BASE_URL (default http://127.0.0.1:8000) and LORALOOM_API_KEY."""
    keys = commands.add_parser("keys", help="API keys (server: LORALOOM_BASE_URL, LORALOOM_API_KEY)")
    key_commands = keys.add_subparsers(dest="keys_command", required=True)
    create = key_commands.add_parser("create", help="create a key (admin); prints only the key on stdout")
    create.add_argument("--name", required=True, help="what the key is for")
    create.add_argument("--role", required=True, choices=ROLE_CHOICES)
    create.add_argument("--tenant", help="tenant name; default: your key's tenant")
    create.add_argument("--expires-at", help="ISO 8601 time with offset, e.g. 2027-01-01T00:00:00Z")
    listing = key_commands.add_parser("list", help="list keys: prefix, role, last use (never the key)")
    listing.add_argument("--tenant", help="tenant name (admin); default: your key's tenant")
    revoke = key_commands.add_parser("revoke", help="revoke a key by id (admin)")
    revoke.add_argument("key_id", metavar="KEY_ID")

    adapters = commands.add_parser("adapters", help="adapters (server: LORALOOM_BASE_URL, LORALOOM_API_KEY)")
    adapter_commands = adapters.add_subparsers(dest="adapters_command", required=True)
    push = adapter_commands.add_parser(
        "push", help="upload a PEFT adapter directory (or a .tar.gz/.zip of one) as a new version"
    )
    push.add_argument("path", type=Path, metavar="DIR")
    push.add_argument("--name", required=True, help="adapter name; created on its first push")
    push.add_argument("--alias", help="also point this alias (e.g. prod) at the new version")
    adapter_commands.add_parser("list", help="list adapters")
    versions = adapter_commands.add_parser("versions", help="list an adapter's versions")
    versions.add_argument("name", metavar="NAME")
    promote = adapter_commands.add_parser("promote", help="point ALIAS of NAME at VERSION (promote or roll back)")
    promote.add_argument("name", metavar="NAME")
    promote.add_argument("alias", metavar="ALIAS")
    promote.add_argument("version", type=positive_int, metavar="VERSION")
    remove = adapter_commands.add_parser("rm", help="delete an adapter (NAME) or one version (NAME@N)")
    remove.add_argument("reference", metavar="NAME|NAME@N")
    remove.add_argument("--force", action="store_true", help="delete a version even if an alias points to it")


def engine_config(args: argparse.Namespace) -> EngineConfig:
    device = args.device or default_device()
    dtype = args.dtype or ("bfloat16" if device.startswith("cuda") else "float32")
    return EngineConfig(
        device=device,
        dtype=dtype,
        gpu_memory_utilization=args.gpu_memory_utilization,
        enforce_eager=args.enforce_eager,
        block_size=args.block_size,
        num_kv_blocks=args.num_kv_blocks,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_loras=args.max_loras,
        max_lora_rank=args.max_lora_rank,
        quantization=args.quantization,
        fp8_activation_terms=args.fp8_activation_terms,
        kv_cache_dtype=args.kv_cache_dtype,
    )


def default_device() -> str:
    import torch  # imported here: `--help` need not pay for torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def fraction(text: str) -> float:
    """An argparse type: a number in (0, 1]."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be a number in (0, 1], e.g. 0.9; got {text!r}")
    return value


def serve(args: argparse.Namespace) -> None:
    # Imported here: torch and the web stack take seconds to import, which `--help` need not pay.
    import uvicorn

    from loraloom.engine.async_engine import AsyncEngine
    from loraloom.engine.bundled import import_bundled
    from loraloom.platform.adapter_lookup import LocalAdapterLookup
    from loraloom.platform.api import create_app
    from sqlalchemy.exc import SQLAlchemyError

    from loraloom.platform.cli_admin import prepare_database, shown_url
    from loraloom.platform.registry_lookup import adapter_fetcher_from_settings, registry_lookup_from_settings
    from loraloom.platform.storage import storage_from_settings

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    settings = load_settings(args.broker_url)
    try:
        prepare_database(settings, sys.stderr)
    except SQLAlchemyError as error:
        sys.exit(f"loraloom serve: database {shown_url(settings.database_url)}: {error}")
    model_dir = args.model if args.model is not None else import_bundled()
    try:
        store = storage_from_settings(settings)
        engine = AsyncEngine.create(model_dir, engine_config(args), adapter_fetcher_from_settings(settings, store))
        local = LocalAdapterLookup(
            base_names={engine.model_name}, adapters=dict(args.adapter), adapter_dir=args.adapter_dir
        )
        lookup = registry_lookup_from_settings(settings, store, local)
    except (ValueError, FileNotFoundError) as error:  # bad model directory or adapter names: say which, no traceback
        sys.exit(f"loraloom serve: {error}")
    app = create_app(engine, lookup, settings)
    worker = None if args.no_worker else start_worker_process(model_dir, settings.broker_url)
    try:
        uvicorn.run(app, host=args.host, port=args.port)
    finally:
        if worker is not None:
            stop_worker_process(worker)


def start_worker_process(model_dir: Path, broker_url: str | None) -> subprocess.Popen:
    """`loraloom worker` beside the server, so `serve` alone trains too. A process of its own: it
    forks a fresh child per job, which the server's threads and CUDA state must not be part of."""
    from loraloom.platform.training.worker import end_with_parent

    command = [sys.executable, "-m", "loraloom.platform.cli", "worker", "--model", str(model_dir)]
    if broker_url is not None:
        command += ["--broker-url", broker_url]
    return subprocess.Popen(command, preexec_fn=end_with_parent)


def stop_worker_process(worker: subprocess.Popen) -> None:
    worker.terminate()  # Celery's warm shutdown; a running job is requeued by the reaper if it is cut off
    try:
        worker.wait(timeout=WORKER_STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        worker.kill()
        worker.wait()


def run_worker_command(args: argparse.Namespace) -> None:
    from sqlalchemy.exc import SQLAlchemyError

    from loraloom.engine.bundled import import_bundled
    from loraloom.platform.cli_admin import shown_url
    from loraloom.platform.db import upgrade_database
    from loraloom.platform.training.worker import run_worker

    logging.basicConfig(level=args.loglevel, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    settings = load_settings(args.broker_url)
    try:
        upgrade_database(settings.database_url)
    except SQLAlchemyError as error:
        sys.exit(f"loraloom worker: database {shown_url(settings.database_url)}: {error}")
    model_dir = args.model if args.model is not None else import_bundled()
    if not (model_dir / "config.json").is_file():
        sys.exit(f"loraloom worker: --model {model_dir}: no config.json there; pass the served base's directory")
    run_worker(settings, model_dir, loglevel=args.loglevel)


def load_settings(broker_url: str | None = None) -> Settings:
    from pydantic import ValidationError

    from loraloom.platform.settings import Settings

    try:
        settings = Settings()
    except ValidationError as error:
        sys.exit(f"loraloom: invalid LORALOOM_* environment settings:\n{error}")
    return settings if broker_url is None else settings.model_copy(update={"broker_url": broker_url})


def main(argv: Sequence[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "serve":
        if len({name for name, _ in args.adapter}) != len(args.adapter):
            parser.error("--adapter: each NAME may be given once")
        serve(args)
    elif args.command == "worker":
        run_worker_command(args)
    elif args.command == "model":
        from loraloom.engine.bundled import import_bundled

        print(import_bundled(force=args.force))
    elif args.command in ("db", "admin"):
        from loraloom.platform.cli_admin import run_admin_command

        run_admin_command(args, load_settings())
    else:
        from loraloom.platform.cli_client import run_client_command

        run_client_command(args)


if __name__ == "__main__":
    main()
