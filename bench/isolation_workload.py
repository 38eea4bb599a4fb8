"""bench/isolation_cost.py's seeded workload: tenants sharing one system prompt, each with
private multi-turn chats, and the most an infinite cache could serve of it.

The text is made from word pools (no fetched corpus), so every configuration and every
run sees the same token ids for a seed.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from engine.model.tokenizer import Tokenizer

# Word pools for realistic-looking, seeded text (no fetched corpus).
_COMPANIES = ["Northwind Outfitters", "Bluebird Telecom", "Harbor Mutual", "Kestrel Air"]
_TOPICS = [
    "refunds",
    "shipping delays",
    "account security",
    "billing disputes",
    "warranty claims",
    "plan upgrades",
    "data export",
    "password resets",
    "loyalty points",
    "service outages",
    "invoice corrections",
    "international orders",
]
_VERBS = ["confirm", "explain", "check", "summarise", "escalate", "document", "verify", "offer"]
_OBJECTS = [
    "the order number",
    "the billing address",
    "the last four digits of the card",
    "the delivery window",
    "the ticket history",
    "the applicable policy section",
    "the customer's preferred contact channel",
    "the expected resolution time",
]
_QUALIFIERS = [
    "before taking any action",
    "in plain language",
    "without promising dates you cannot guarantee",
    "and never ask for a full card number",
    "when the customer seems unsure",
    "if the amount exceeds fifty dollars",
    "unless the customer has already done so",
    "and record it in the case notes",
]
_QUESTIONS = [
    "My parcel has not arrived yet, what should I do?",
    "Can I get a refund for a duplicate charge on my statement?",
    "How do I move my plan to the annual tier?",
    "Someone logged into my account from another country.",
    "The invoice lists a product I never ordered.",
    "Can you export all my data as a spreadsheet?",
    "I want to use my loyalty points on this order.",
    "The service has been down in my area since this morning.",
]
_FOLLOW_UPS = [
    "Thanks. And how long will that take?",
    "I already tried that, it did not help.",
    "Can you put that in writing for me?",
    "What if it happens again next month?",
    "Okay, please go ahead with that.",
    "Is there a fee for doing this?",
]


@dataclass(frozen=True)
class Turn:
    """One request of the workload: whose, which turn, when, and its prompt ids."""

    index: int
    tenant: int
    conversation: int  # global conversation number
    turn: int
    arrival_s: float  # scheduled send time, from the start of the run
    prompt_ids: tuple[int, ...]
    previous: int | None  # index of this conversation's previous turn


@dataclass(frozen=True)
class Workload:
    """The seeded requests and the system message's token ids (the published prefix)."""

    system_ids: tuple[int, ...]
    published_ids: tuple[int, ...]  # what the published configuration publishes
    system_content_tokens: int
    turns: tuple[Turn, ...]


def _sentence(rng: random.Random) -> str:
    return (
        f"When a customer asks about {rng.choice(_TOPICS)}, {rng.choice(_VERBS)} "
        f"{rng.choice(_OBJECTS)} {rng.choice(_QUALIFIERS)}."
    )


def system_prompt(tokenizer: Tokenizer, tokens: int, rng: random.Random) -> tuple[str, int]:
    """A support-desk policy of about `tokens` tokens; returns it and its exact token count."""
    company = rng.choice(_COMPANIES)
    parts = [f"You are the customer support assistant of {company}. Follow this policy."]
    section = 0
    while len(tokenizer.encode(" ".join(parts), add_special_tokens=False)) < tokens + 16:
        section += 1
        parts.append(f"\nSection {section}: {rng.choice(_TOPICS).capitalize()}.")
        parts.extend(_sentence(rng) for _ in range(6))
    ids = tokenizer.encode(" ".join(parts), add_special_tokens=False)[:tokens]
    text = tokenizer.decode(ids).rstrip()
    return text, len(tokenizer.encode(text, add_special_tokens=False))


def _user_message(rng: random.Random, first: bool, conversation: int) -> str:
    # A case number first: every conversation's text differs from its first tokens on.
    head = f"Case {1000 + conversation * 37 + rng.randrange(37)}: " if first else ""
    body = rng.choice(_QUESTIONS if first else _FOLLOW_UPS)
    return f"{head}{body} {_sentence(rng)}"


def _assistant_message(rng: random.Random) -> str:
    # Scripted answers keep every configuration's prompts identical (the model's own
    # greedy answers could differ by rounding between cached and recomputed prefills).
    return " ".join(
        [f"I understand. Let me {rng.choice(_VERBS)} {rng.choice(_OBJECTS)}."]
        + [_sentence(rng) for _ in range(2)]
    )


def encode_chat(
    tokenizer: Tokenizer, messages: list[dict[str, str]], generation: bool
) -> list[int]:
    """Token ids of `messages` through the chat template, as the gateway encodes them."""
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=generation)
    return tokenizer.encode(text, add_special_tokens=False)


def user_header_prefix(tokenizer: Tokenizer, system: dict[str, str]) -> tuple[int, ...]:
    """The system message's ids and the user turn's header after it (`<|im_start|>user\\n`).

    The common prefix of two chats that differ only in the user's text: every chat
    whose first turn is the user's starts with it.
    """
    a = encode_chat(tokenizer, [system, {"role": "user", "content": "A"}], generation=False)
    b = encode_chat(tokenizer, [system, {"role": "user", "content": "B"}], generation=False)
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return tuple(a[:n])


def build_workload(
    tokenizer: Tokenizer,
    *,
    tenants: int,
    system_tokens: int,
    conversations: int,
    turns: int,
    rate: float,
    seed: int,
    publish: str = "system",
) -> Workload:
    """The seeded requests: prompts, tenants and one Poisson arrival schedule."""
    rng = random.Random(seed)
    content, content_tokens = system_prompt(tokenizer, system_tokens, rng)
    system = {"role": "system", "content": content}
    system_ids = tuple(encode_chat(tokenizer, [system], generation=False))
    published_ids = system_ids if publish == "system" else user_header_prefix(tokenizer, system)
    chats: list[list[tuple[int, ...]]] = []
    owners: list[int] = []
    for tenant in range(tenants):
        for _ in range(conversations):
            c = len(chats)
            messages = [system]
            prompts: list[tuple[int, ...]] = []
            for k in range(turns):
                messages.append({"role": "user", "content": _user_message(rng, k == 0, c)})
                ids = tuple(encode_chat(tokenizer, messages, generation=True))
                if ids[: len(published_ids)] != published_ids:
                    raise RuntimeError("the published ids are not a prefix of a prompt")
                if prompts and ids[: len(prompts[-1])] != prompts[-1]:
                    raise RuntimeError("a turn's prompt does not extend the previous one")
                prompts.append(ids)
                messages.append({"role": "assistant", "content": _assistant_message(rng)})
            chats.append(prompts)
            owners.append(tenant)
    # One Poisson process of all requests; each arrival goes to the next turn of a
    # conversation drawn from what is left, so every chat's turns keep their order.
    slots = [c for c in range(len(chats)) for _ in range(turns)]
    rng.shuffle(slots)
    clock = 0.0
    next_turn = [0] * len(chats)
    last: dict[int, int] = {}
    out: list[Turn] = []
    for c in slots:
        clock += rng.expovariate(rate)
        k = next_turn[c]
        next_turn[c] += 1
        out.append(Turn(len(out), owners[c], c, k, clock, chats[c][k], last.get(c)))
        last[c] = len(out) - 1
    return Workload(system_ids, published_ids, content_tokens, tuple(out))


def replay_hits(
    workload: Workload, config: str, block_size: int, order: Sequence[int] | None = None
) -> list[int]:
    """Cached tokens per request (by index) under an infinite cache, one request at a time.

    Requests go in `order` (turn indexes; default: arrival order). The most the engine
    can serve from its cache: a block hits when a prompt sent earlier in the same
    domain (or, for published blocks, in any domain) had the same prefix.
    """
    bs = block_size
    turns = workload.turns if order is None else [workload.turns[i] for i in order]
    published = len(workload.published_ids) // bs if config == "published" else 0
    seen: dict[int, set[tuple[int, ...]]] = {}
    public: set[tuple[int, ...]] = set()
    hits = [0] * len(workload.turns)
    for t in turns:
        own = seen.setdefault(0 if config == "shared" else t.tenant, set())
        ids = t.prompt_ids
        n = 0
        while (n + 1) * bs <= len(ids) - 1:
            key = ids[: (n + 1) * bs]
            if key not in (public if n < published else own):
                break
            n += 1
        hits[t.index] = n * bs
        for k in range(1, len(ids) // bs + 1):
            (public if k <= published else own).add(ids[: k * bs])
    return hits
