"""The served benchmark's adapters and requests.

Adapters differ the way customers' do: ranks from 4 to 64 and different target-module subsets
(all seven, attention only, MLP only, a couple of projections). Requests are chat prompts with
mixed output budgets, some of them behind one long shared system prompt.
"""
from __future__ import annotations

import argparse
import random
from dataclasses import dataclass
from pathlib import Path

ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
MLP = ["gate_proj", "up_proj", "down_proj"]
MODULE_SUBSETS = [ATTENTION + MLP, ATTENTION, MLP, ["q_proj", "v_proj"], ["o_proj", "down_proj"],
                  ["q_proj", "k_proj", "v_proj", "gate_proj"]]
RANKS = [4, 8, 16, 32, 48, 64, 12, 24]

TOPICS = [
    "the history of the printing press", "how vaccines train the immune system", "why the sky is blue",
    "the rules of chess for a beginner", "how to brew a good cup of coffee", "the water cycle",
    "what a compiler does", "how bees communicate", "the causes of the French revolution",
    "how solar panels make electricity", "the difference between weather and climate",
    "how to plan a vegetable garden", "why cats purr", "how airplanes stay in the air",
    "how a bill becomes a law", "what makes bread rise", "how the heart pumps blood",
]
STYLES = ["in simple words", "with one example", "briefly, in two sentences", "for a ten year old",
          "as a numbered list", "with an analogy"]
SHORT_SYSTEM = "You are a concise, friendly assistant."
# The long shared prefix a support deployment puts before every conversation (~300 tokens).
LONG_SYSTEM = (
    "You are the customer-support assistant of Northwind Outdoor Gear. Follow these rules in every answer. "
    "Greet the customer once, politely, and never repeat the greeting. Answer only questions about our "
    "products, orders, shipping, returns and warranties, or general outdoor knowledge that helps a customer "
    "choose equipment. Orders ship within two business days from our warehouses in Denver and Rotterdam; "
    "standard shipping takes three to seven days, express shipping one to two days. Returns are accepted "
    "within sixty days for unused items in their original packaging; worn items may be returned within "
    "thirty days if they are defective. Tents, sleeping bags and backpacks carry a five-year warranty against "
    "manufacturing defects; footwear carries two years; electronics such as headlamps and GPS units carry one "
    "year. Never promise refunds, discounts or delivery dates beyond these rules; offer to connect the "
    "customer with a human agent instead. Do not ask for payment details. Keep answers short, use plain "
    "language, and when a question is unclear, ask one clarifying question. When you recommend equipment, "
    "consider the season, the altitude, the number of people and the customer's experience. Always remind "
    "customers to check local weather and trail conditions before a trip."
)


@dataclass(frozen=True)
class AdapterSpec:
    name: str
    rank: int
    modules: tuple[str, ...]


@dataclass(frozen=True)
class ChatRequest:
    messages: tuple[tuple[str, str], ...]  # (role, content)
    max_tokens: int
    adapter: str | None  # None: the base model

    def message_dicts(self) -> list[dict[str, str]]:
        return [{"role": role, "content": content} for role, content in self.messages]


def projection_shapes(config: dict) -> dict[str, tuple[int, int]]:
    """(in, out) features of each projection a LoRA may target, from a Llama config.json."""
    hidden, inter, heads = config["hidden_size"], config["intermediate_size"], config["num_attention_heads"]
    head_dim = config.get("head_dim", hidden // heads)
    q, kv = heads * head_dim, config["num_key_value_heads"] * head_dim
    return {"q_proj": (hidden, q), "k_proj": (hidden, kv), "v_proj": (hidden, kv), "o_proj": (q, hidden),
            "gate_proj": (hidden, inter), "up_proj": (hidden, inter), "down_proj": (inter, hidden)}


def lora_weights_per_decode_step(config: dict, specs: list[AdapterSpec]) -> int:
    """LoRA weights a decode step reads with one request on each of these adapters: A [r, in] and
    B [out, r] of every module each targets, in every layer."""
    shapes = projection_shapes(config)
    per_layer = sum(spec.rank * sum(shapes[module]) for spec in specs for module in spec.modules)
    return per_layer * config["num_hidden_layers"]


def base_linear_weights(config: dict) -> int:
    """Weights of the base model's linears a decode step reads: every projection of every layer and the lm_head."""
    per_layer = sum(n_in * n_out for n_in, n_out in projection_shapes(config).values())
    return per_layer * config["num_hidden_layers"] + config["vocab_size"] * config["hidden_size"]


def adapter_specs(count: int, ranks: list[int] | None = None,
                  subsets: list[list[str]] | None = None) -> list[AdapterSpec]:
    """`count` adapters cycling through the ranks and module subsets (co-prime cycle lengths mix them).

    The names say each adapter's rank and modules (initials: q k v o g u d), so a kept adapter
    directory (--adapter-cache) is never reused for a different mix.
    """
    ranks, subsets = ranks or RANKS, subsets or MODULE_SUBSETS
    specs = []
    for i in range(count):
        rank, modules = ranks[i % len(ranks)], tuple(subsets[i % len(subsets)])
        initials = "".join(module[0] for module in modules)
        specs.append(AdapterSpec(f"tenant{i}-r{rank}-{initials}", rank, modules))
    return specs


# --modules names a subset as projections joined by commas, or one of these words.
SUBSET_WORDS = {"all": ATTENTION + MLP, "attention": ATTENTION, "mlp": MLP}


def parse_subset(text: str) -> list[str]:
    """`q,v`, `q_proj,v_proj`, `all`, `attention` or `mlp` as module names (argparse type)."""
    if text in SUBSET_WORDS:
        return SUBSET_WORDS[text]
    modules = [name if name.endswith("_proj") else f"{name}_proj" for name in text.split(",") if name]
    unknown = [name for name in modules if name not in ATTENTION + MLP]
    if not modules or unknown:
        raise argparse.ArgumentTypeError(
            f"unknown module(s) {unknown or text!r}: use projections of {[m.removesuffix('_proj') for m in ATTENTION + MLP]} "
            f"joined by commas, or one of {sorted(SUBSET_WORDS)}")
    return modules


def subset_text(modules: list[str]) -> str:
    """parse_subset's inverse: `all`, `attention`, `mlp` or projections joined by commas."""
    words = [word for word, subset in SUBSET_WORDS.items() if subset == list(modules)]
    return words[0] if words else ",".join(module.removesuffix("_proj") for module in modules)


def positive_rank(text: str) -> int:
    """A rank of at least 1 (argparse type)."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"a rank is a whole number of at least 1, got {text!r}")
    return int(text)


def add_adapter_mix_arguments(parser) -> None:
    """--ranks and --modules: a mix of your own in place of the default one (held-out adapters)."""
    parser.add_argument("--ranks", type=positive_rank, nargs="+", default=None, metavar="R",
                        help=f"ranks the adapters cycle through (default {' '.join(map(str, RANKS))})")
    parser.add_argument("--modules", type=parse_subset, nargs="+", default=None, metavar="SUBSET",
                        help="module subsets the adapters cycle through: projections joined by commas, or all, "
                             f"attention, mlp (default {' '.join(subset_text(subset) for subset in MODULE_SUBSETS)})")


def specs_from_args(args, count: int) -> list[AdapterSpec]:
    """adapter_specs with the mix add_adapter_mix_arguments parsed."""
    return adapter_specs(count, args.ranks, args.modules)


# How the adapters' weights are saved: "float32", as PEFT saves what it trains (its adapter weights stay
# float32 even on a bfloat16 base), or "bfloat16", as many published adapters are.
SAVED_DTYPES = ("float32", "bfloat16")


def write_adapters(model_dir: Path, root: Path, specs: list[AdapterSpec], saved_as: str = "float32") -> None:
    """Real PEFT adapters (tests/lora_factory.py) in root/<name>/, as `serve --adapter-dir` reads them."""
    import torch
    from lora_factory import make_peft_adapter

    for i, spec in enumerate(specs):
        if not (root / spec.name / "adapter_config.json").exists():
            make_peft_adapter(model_dir, root / spec.name, rank=spec.rank, alpha=2 * spec.rank,
                              target_modules=list(spec.modules), seed=500 + i, init_scale=0.02,
                              saved_as=getattr(torch, saved_as))


def question(rng: random.Random) -> str:
    return f"Please explain {rng.choice(TOPICS)} {rng.choice(STYLES)}."


def uniform_requests(count: int, adapters: list[str | None], max_tokens: int, seed: int) -> list[ChatRequest]:
    """`count` short chats, request i on adapters[i % len(adapters)], all with the same budget."""
    rng = random.Random(seed)
    return [ChatRequest((("system", SHORT_SYSTEM), ("user", question(rng))), max_tokens, adapters[i % len(adapters)])
            for i in range(count)]


def mixed_requests(count: int, adapters: list[str], seed: int) -> list[ChatRequest]:
    """The realistic mix: budgets from 16 to 256 tokens, a third behind the long shared system prompt,
    adapters drawn with a skew (a few popular ones, a tail)."""
    rng = random.Random(seed)
    weights = [1.0 / (k + 1) for k in range(len(adapters))]
    requests = []
    for i in range(count):
        system = LONG_SYSTEM if i % 3 == 0 else SHORT_SYSTEM
        budget = rng.choice([16, 32, 64, 128, 256])
        adapter = rng.choices(adapters, weights)[0]
        requests.append(ChatRequest((("system", system), ("user", question(rng))), budget, adapter))
    return requests
