"""The learning recipe the training tests share: 30 made-up product codes mapped to 30 made-up
names, which the bundled base model cannot know, as a chat dataset."""
from __future__ import annotations

import random

from loraloom.platform.training.hyperparameters import Hyperparameters

PRODUCT_NAMES = [
    "Zorblax", "Quintelle", "Vardomir", "Plexicor", "Mirantho", "Sulvane", "Traxilon", "Orbenzo", "Kelvarin",
    "Dumastra", "Fenwycke", "Gorlimax", "Helbrisk", "Jastovar", "Lunquell", "Nexabor", "Pravolin", "Rendaxi",
    "Skorvath", "Tulimar", "Ubrinox", "Wexlorn", "Yalvesti", "Brontikk", "Cazmerol", "Elvantro", "Ixoberan",
    "Ombrisca", "Zentaqua", "Quorvelt",
]
SYSTEM_PROMPT = "You name products."  # short, and it replaces SmolLM2's longer default system prompt
# Small enough for 2 CPU cores in about a minute; a learning rate and batch size that memorize quickly.
HYPERPARAMETERS = Hyperparameters(
    n_epochs=8, batch_size=2, learning_rate=2e-3, lora_r=16, lora_alpha=32, lora_dropout=0.0, max_seq_len=64
)
MIN_CORRECT_FRACTION = 0.9
# The two learning tests teach the first 12: enough that "answers what the base cannot" means something,
# few enough that 8 epochs are 48 steps (all 30 took 120, and made them the two slowest tests of the suite).
LEARNED_NAMES = PRODUCT_NAMES[:12]


def product_codes(count: int) -> list[str]:
    rng = random.Random(0)
    codes: list[str] = []
    while len(codes) < count:
        code = f"{rng.choice('BDFKQXZ')}{rng.choice('BDFKQXZ')}-{rng.randrange(100, 1000)}"
        if code not in codes:
            codes.append(code)
    return codes


def question(code: str) -> list[dict]:
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": f"What is product {code} called?"},
    ]


def product_dataset(names: list[str] = PRODUCT_NAMES) -> list[dict]:
    """One chat example per product (the first len(names)): the question and the name as the answer."""
    codes = product_codes(len(names))
    return [
        {"messages": question(code) + [{"role": "assistant", "content": f"{name}."}]}
        for code, name in zip(codes, names)
    ]
