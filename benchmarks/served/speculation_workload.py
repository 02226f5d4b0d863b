"""benchmarks/speculation.py's requests: extractive (quote or edit a passage given in the prompt),
templated (structured JSON from a short bio, one adapter) and open-ended chat.

Every set of requests is drawn with its own seed, so the sets of one run differ from each other; the two
servers under comparison get the same sets.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

SYSTEM = "You are a concise, friendly assistant."


@dataclass(frozen=True)
class SpecRequest:
    messages: tuple[tuple[str, str], ...]  # (role, content)
    max_tokens: int
    adapter: str | None  # None: the base model
    response_format: dict[str, Any] | None = None

    def body(self, base_name: str = "base") -> dict[str, Any]:
        """The /v1/chat/completions body: greedy, so both servers' outputs must be identical."""
        body: dict[str, Any] = {"model": self.adapter or base_name, "max_tokens": self.max_tokens, "temperature": 0,
                                "messages": [{"role": role, "content": content} for role, content in self.messages]}
        if self.response_format is not None:
            body["response_format"] = self.response_format
        return body

    def short(self) -> str:
        """One line naming the request: its model and the start of its last message."""
        text = self.messages[-1][1].replace("\n", " ")
        return f"[{self.adapter or 'base'}] {text[:110]}{'...' if len(text) > 110 else ''}"


# (a) Extractive. Each passage (80-150 words) comes with a word its quote instruction asks for and a
# replacement its edit instruction asks for.
@dataclass(frozen=True)
class Passage:
    text: str
    keyword: str  # "Quote the sentence that mentions <keyword>"
    replace: tuple[str, str]  # "Rewrite ... replacing <old> with <new>"


PASSAGES = [
    Passage("The lighthouse on Gull Point was built in 1871 to guide fishing boats past the northern reef. "
            "Its first keeper, Thomas Hale, lived in the small stone cottage beside the tower with his wife and "
            "three children. Every evening he climbed the ninety-two steps to light the lamp, and every morning "
            "he polished the great glass lens until it shone. In 1934 the lamp was converted to electricity, and "
            "the last keeper left the point in 1962. Today the cottage is a museum, and visitors can climb the "
            "tower on summer weekends to see the reef, the harbour and, on clear days, the distant islands.",
            "electricity", ("lighthouse", "beacon")),
    Passage("Sourdough bread is made without commercial yeast. Instead, the baker keeps a starter, a mixture of "
            "flour and water in which wild yeasts and lactic acid bacteria live together. The starter is fed "
            "with fresh flour and water every day, and a portion of it is mixed into the dough. Because the wild "
            "yeasts work slowly, the dough may rise for eight to twelve hours. During that time the bacteria "
            "produce acids that give the bread its sour taste and help it keep fresh for longer. A good loaf has "
            "a dark, crackling crust and an open, chewy crumb.",
            "bacteria", ("starter", "culture")),
    Passage("Our office will move to the new building on Harbour Street on Monday, the third of June. Please pack "
            "the contents of your desk into the boxes provided by Friday afternoon and label each box with your "
            "name and floor number. The movers will collect all boxes on Saturday morning. Computers and "
            "monitors will be moved by the IT team, so do not pack them yourself. Parking at the new building is "
            "limited, and staff are encouraged to take the bus or cycle. If you have questions about the move, "
            "contact Sarah in the facilities office.",
            "parking", ("Monday", "Tuesday")),
    Passage("Honeybees communicate the location of food through a movement called the waggle dance. A forager "
            "that has found a rich patch of flowers returns to the hive and walks in a figure of eight on the "
            "vertical comb. During the straight part of the dance she shakes her body from side to side. The "
            "angle of this straight run, measured from vertical, tells the other bees the direction of the food "
            "relative to the sun. The length of the run tells them how far away it is. Bees that follow the "
            "dance then fly out and find the flowers on their own.",
            "sun", ("bees", "insects")),
    Passage("To reset your router, first make sure it is switched on and connected to power. Find the small reset "
            "button on the back of the device; it is usually inside a narrow hole. Press and hold the button "
            "with a paper clip for about ten seconds, until the lights on the front begin to flash. Release the "
            "button and wait two or three minutes while the router restarts. After the reset, the network name "
            "and password are printed on the label under the router. You can then log in and choose a new "
            "password of your own.",
            "password", ("router", "modem")),
    Passage("The city council met on Tuesday evening to discuss the plan for the old railway yard. The proposal "
            "would turn the empty land into a park with a playground, a community garden and a small market "
            "hall. Supporters said the area badly needs green space, since most nearby streets have no trees. "
            "Some shop owners worried that the market hall would take customers from their businesses. After "
            "two hours of debate, the council voted seven to four to approve the first phase. Work on the "
            "playground is expected to begin next spring.",
            "playground", ("park", "garden")),
    Passage("Maria started running at the age of forty, after her doctor told her to get more exercise. At first "
            "she could only run for two minutes before she had to walk. She kept going three times a week, "
            "adding a minute each time. After six months she ran her first five kilometre race, finishing near "
            "the back but smiling. Two years later she completed a marathon in just under five hours. She says "
            "the hardest part was not the distance but getting out of the door on cold, dark mornings.",
            "marathon", ("Maria", "Elena")),
    Passage("Glaciers form where more snow falls in winter than melts in summer. Year after year the snow piles "
            "up, and the weight of the upper layers presses the lower ones into dense ice. When the ice becomes "
            "thick enough, it begins to flow slowly downhill under its own weight. As a glacier moves, it "
            "scrapes the rock beneath it and carries stones and soil along with it. Many of the valleys, lakes "
            "and long ridges we see in mountain regions today were shaped by glaciers during the last ice age.",
            "valleys", ("glacier", "ice sheet")),
]

EXTRACTIVE_INSTRUCTIONS = (
    lambda p: f"Repeat the following passage exactly, word for word.\n\n{p.text}",
    lambda p: f"Here is a passage:\n\n{p.text}\n\nQuote the sentence that mentions {p.keyword}, exactly as written.",
    lambda p: (f"Rewrite the passage below, replacing every \"{p.replace[0]}\" with \"{p.replace[1]}\". "
               f"Keep everything else exactly the same.\n\n{p.text}"),
    lambda p: f"Copy the passage below and add a short title above it.\n\n{p.text}",
    lambda p: f"{p.text}\n\nRepeat the text above, then add one sentence that summarizes it.",
)


def _draw(pool: list, count: int, rng: random.Random) -> list:
    """`count` items of the pool, distinct while the pool lasts (then it is drawn again)."""
    drawn: list = []
    while len(drawn) < count:
        drawn += rng.sample(pool, min(len(pool), count - len(drawn)))
    return drawn


def extractive_requests(count: int, adapters: list[str | None], max_tokens: int, seed: int) -> list[SpecRequest]:
    """`count` requests that repeat, quote or edit a passage of their prompt; request i on adapters[i % n]."""
    rng = random.Random(seed)
    combos = [(p, i) for p in PASSAGES for i in range(len(EXTRACTIVE_INSTRUCTIONS))]
    return [SpecRequest((("system", SYSTEM), ("user", EXTRACTIVE_INSTRUCTIONS[i](p))), max_tokens,
                        adapters[k % len(adapters)])
            for k, (p, i) in enumerate(_draw(combos, count, rng))]


# (b) Templated: the same schema filled from a different short bio each time.
PERSON_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "city": {"type": "string"},
        "age": {"type": "integer"},
        "occupation": {"type": "string"},
        "hobbies": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["name", "city", "age", "occupation", "hobbies"],
    "additionalProperties": False,
}
PERSON_FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON_SCHEMA}}

FIRST_NAMES = ["Maria", "James", "Aisha", "Kenji", "Olga", "Pedro", "Fatima", "Liam", "Chloe", "Ravi", "Ingrid",
               "Tomas", "Mei", "Samuel", "Nadia", "Oscar"]
LAST_NAMES = ["Lopez", "Smith", "Khan", "Tanaka", "Petrova", "Silva", "Haddad", "Murphy", "Martin", "Patel",
              "Larsen", "Novak", "Chen", "Okafor", "Rossi", "Berg"]
CITIES = ["Lisbon", "Toronto", "Nairobi", "Osaka", "Krakow", "Melbourne", "Denver", "Lyon", "Bergen", "Pune",
          "Valencia", "Glasgow"]
OCCUPATIONS = ["nurse", "software engineer", "teacher", "carpenter", "accountant", "chef", "pharmacist",
               "bus driver", "architect", "journalist", "electrician", "librarian"]
HOBBIES = ["hiking", "painting", "playing the guitar", "chess", "gardening", "cycling", "baking", "photography",
           "swimming", "reading novels", "bird watching", "knitting", "rock climbing", "cooking"]
BIO_TEMPLATES = [
    "{name} is a {age}-year-old {job} who lives in {city}. In their free time they enjoy {hobbies}.",
    "Born and raised in {city}, {name} works as a {job}. {name} is {age} years old and loves {hobbies}.",
    "Meet {name}, {age}, a {job} from {city}. Weekends are for {hobbies}.",
    "{name} has worked as a {job} in {city} for years. At {age}, their favourite pastimes are {hobbies}.",
]


def _bio(rng: random.Random) -> str:
    hobbies = rng.sample(HOBBIES, rng.choice([2, 3]))
    return rng.choice(BIO_TEMPLATES).format(
        name=f"{rng.choice(FIRST_NAMES)} {rng.choice(LAST_NAMES)}", age=rng.randint(19, 71),
        job=rng.choice(OCCUPATIONS), city=rng.choice(CITIES), hobbies=", ".join(hobbies[:-1]) + " and " + hobbies[-1])


def templated_requests(count: int, adapter: str, max_tokens: int, seed: int) -> list[SpecRequest]:
    """`count` extractions of the same JSON schema, each from a new random bio, all on one adapter."""
    rng = random.Random(seed)
    return [SpecRequest((("system", SYSTEM),
                         ("user", f"Extract the person's name, city, age, occupation and hobbies from this bio as "
                                  f"JSON.\n\nBio: {_bio(rng)}")), max_tokens, adapter, PERSON_FORMAT)
            for _ in range(count)]


# (c) Open-ended chat: poems, explanations, advice, stories; nothing to copy from the prompt.
CHAT_KINDS = [
    "Write a short poem about {}.",
    "Explain {} in simple words.",
    "Give me three pieces of advice about {}.",
    "Tell me a short story about {}.",
    "What are the pros and cons of {}?",
    "Describe {} to someone who has never seen it.",
]
CHAT_SUBJECTS = [
    "the ocean at night", "learning a new language", "autumn leaves", "working from home", "a lost umbrella",
    "how rainbows form", "saving money", "an old bicycle", "moving to a new city", "volcanoes",
    "a rainy Sunday", "keeping houseplants alive", "friendship", "public transport", "the first day of school",
    "electric cars", "mountain sunrises", "a busy kitchen", "time management", "owning a dog",
]


def chat_requests(count: int, adapters: list[str | None], max_tokens: int, seed: int) -> list[SpecRequest]:
    """`count` varied open-ended questions; request i on adapters[i % n]."""
    rng = random.Random(seed)
    combos = [(kind, subject) for kind in CHAT_KINDS for subject in CHAT_SUBJECTS]
    return [SpecRequest((("system", SYSTEM), ("user", kind.format(subject))), max_tokens, adapters[k % len(adapters)])
            for k, (kind, subject) in enumerate(_draw(combos, count, rng))]
