"""The `loraloom` command: `loraloom serve ...` and `loraloom model import-bundled`."""
from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from loraloom.engine.config import EngineConfig

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
RESERVED_NAME_CHARACTERS = ":@/\\"  # kept free for the registry's "name:alias" and "name@version"


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

    model = commands.add_parser("model", help="manage models")
    model_commands = model.add_subparsers(dest="model_command", required=True)
    import_bundled = model_commands.add_parser(
        "import-bundled", help="convert the bundled SmolLM2-135M-Instruct once; print its directory"
    )
    import_bundled.add_argument("--force", action="store_true", help="convert again even if already imported")
    return parser


def engine_config(args: argparse.Namespace) -> EngineConfig:
    return EngineConfig(
        block_size=args.block_size,
        num_kv_blocks=args.num_kv_blocks,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_loras=args.max_loras,
        max_lora_rank=args.max_lora_rank,
    )


def serve(args: argparse.Namespace) -> None:
    # Imported here: torch and the web stack take seconds to import, which `--help` need not pay.
    import uvicorn

    from loraloom.engine.async_engine import AsyncEngine
    from loraloom.engine.bundled import import_bundled
    from loraloom.platform.adapter_lookup import LocalAdapterLookup
    from loraloom.platform.api import create_app

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    model_dir = args.model if args.model is not None else import_bundled()
    try:
        engine = AsyncEngine.create(model_dir, engine_config(args))
        lookup = LocalAdapterLookup(
            base_names={engine.model_name}, adapters=dict(args.adapter), adapter_dir=args.adapter_dir
        )
    except (ValueError, FileNotFoundError) as error:  # bad model directory or adapter names: say which, no traceback
        sys.exit(f"loraloom serve: {error}")
    uvicorn.run(create_app(engine, lookup), host=args.host, port=args.port)


def main(argv: Sequence[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "serve":
        if len({name for name, _ in args.adapter}) != len(args.adapter):
            parser.error("--adapter: each NAME may be given once")
        serve(args)
    elif args.command == "model":
        from loraloom.engine.bundled import import_bundled

        print(import_bundled(force=args.force))


if __name__ == "__main__":
    main()
