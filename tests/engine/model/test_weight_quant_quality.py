"""Weight-only int8/int4 on the real SmolLM2: close enough to its float weights to serve.

Measured on the bundled GGUF (whose decoder is stored as Q4_1, embeddings as Q8_0),
against the same model's fp32 path, over the four prompts and the text below:
the figures are in the thresholds' comments. The int8/int4 cases run every product
on the quantized weights (max_rows=None), prefill included, where serving would use
float ones: the worst case; int4_head_int8 adds int8 activations to the LM head's
products. The "served" case is int4 as `cloister serve` runs it on a
CPU with native bf16: decode products on int4, prefill products (more than 12 rows)
on a bf16 copy of the weights; "served_int8" is int8 so (the path `weight_quant=auto`
picks for Q8_0, Q5 and Q6 files; it picks int4 for Q4 ones, "none" for float ones).
Run as a script to print them:
    .venv/bin/python -m tests.engine.model.test_weight_quant_quality
"""

from __future__ import annotations

import math
from typing import Literal

import pytest
import torch

from engine.model import quant
from engine.model.llama import LlamaForCausalLM
from engine.model.loader import LoadedModel, load_model
from engine.model.quant import WeightQuant
from tests.utils.model_step import ModelStepper

pytestmark = pytest.mark.slow

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "Once upon a time, in a small village by the sea,",
]
NEW_TOKENS = 32
TEXT = (
    "The river rises in the mountains to the north and flows south through a wide valley "
    "of farms and small towns before it reaches the sea. In spring the snow melts and the "
    "water runs high and fast; in late summer it is slow and shallow enough to wade across "
    "in places. The first bridge was built of wood more than three hundred years ago, and "
    "the stone bridge that replaced it still carries the main road into the old city, "
    "where the market is held every Saturday morning in the square beside the church."
)

# Measured (int8 / int4): teacher-forced agreement 0.961 / 0.969, free-running greedy
# agreement position by position 0.625 / 0.617, perplexity ratio 0.999 / 1.009 (fp32:
# 27.29). int4 with the LM head's activations rounded to int8 per row on every product:
# 0.945 / 0.516 / 1.000. Served (int4, bf16 prefill; SwiGLU's middle in bf16; the head's
# decode products on int8 activations): on an AVX-512 BF16 + VNNI machine teacher-forced
# 0.984, free-running 0.719, perplexity ratio 1.001; on a Xeon with AMX 0.977, 0.492,
# 0.993. Served int8 (what `weight_quant=auto` picks for Q8_0, Q5 and Q6 files), on the
# AVX-512 BF16 + VNNI EPYC: teacher-forced 0.984, free-running 0.555, perplexity ratio
# 1.001. Free-running agreement is no bound: one early near-tie flips a prompt's whole
# tail, and which ties flip depends on the CPU's kernels (on the Xeon, the four prompts
# first part at fp32 top-2 margins of 0.29, 0.012, 0.082 and 0.005 logits). What must
# hold is that a continuation only ever parts from the float one at such a near-tie:
# a fault in the quantized products flips confident choices.
MIN_TEACHER_FORCED_AGREEMENT = {
    "int8": 0.93,
    "int4": 0.93,
    "int4_head_int8": 0.93,
    "served": 0.93,
    "served_int8": 0.93,
}
NEAR_TIE_LOGITS = 0.5  # the widest fp32 top-2 margin a first departure may have
MAX_PERPLEXITY_RATIO = {
    "int8": 1.02,
    "int4": 1.02,
    "int4_head_int8": 1.02,
    "served": 1.02,
    "served_int8": 1.02,
}
# How each case quantizes: (mode, max_rows, prefill_bf16, head_int8_activations).
CASES: dict[str, tuple[WeightQuant, int | None | Literal["auto"], bool, bool | None]] = {
    "int8": ("int8", None, False, False),
    "int4": ("int4", None, False, False),
    "int4_head_int8": ("int4", None, False, True),
    "served": ("int4", "auto", True, None),  # None: as the CPU allows, like the server
    # int8 as the server runs it: what `weight_quant=auto` picks for Q8_0, Q5 and Q6 files.
    "served_int8": ("int8", "auto", True, None),
}


def greedy(model: LlamaForCausalLM, prompts: list[list[int]], steps: int) -> list[list[int]]:
    """Greedy continuations of all prompts, decoded as one batch."""
    stepper = ModelStepper(model, num_seqs=len(prompts), max_len=128, block_size=16)
    logits = stepper.step(prompts)
    ends = torch.tensor([len(p) for p in prompts]).cumsum(0) - 1
    tokens = logits[ends].argmax(-1).tolist()
    outs = [[t] for t in tokens]
    for _ in range(steps - 1):
        tokens = stepper.step([[t] for t in tokens]).argmax(-1).tolist()
        for out, t in zip(outs, tokens, strict=True):
            out.append(t)
    return outs


def teacher_forced_agreement(
    model: LlamaForCausalLM, prompts: list[list[int]], targets: list[list[int]]
) -> float:
    """Share of target tokens that are `model`'s argmax given the targets before them."""
    hits = total = 0
    for prompt, target in zip(prompts, targets, strict=True):
        logits = ModelStepper(model, max_len=128, block_size=16).step([prompt + target[:-1]])
        chosen = logits[len(prompt) - 1 :].argmax(-1).tolist()
        hits += sum(a == b for a, b in zip(chosen, target, strict=True))
        total += len(target)
    return hits / total


def perplexity(model: LlamaForCausalLM, ids: list[int]) -> float:
    """exp(mean NLL) of `ids` under `model`, in one prefill."""
    logits = ModelStepper(model, max_len=len(ids) + 16, block_size=16).step([ids])
    nll = torch.nn.functional.cross_entropy(logits[:-1], torch.tensor(ids[1:]))
    return math.exp(nll.item())


Reference = tuple[list[list[int]], float, list[list[float]]]


def reference(loaded: LoadedModel) -> Reference:
    """The float weights' greedy continuations, perplexity, and top-2 margins (logits)
    at each position of those continuations."""
    model, tok = loaded.model, loaded.tokenizer
    model.quantize_weights("none")
    prompts = [tok.encode(p) for p in PROMPTS]
    tokens = greedy(model, prompts, NEW_TOKENS)
    margins = []
    for prompt, target in zip(prompts, tokens, strict=True):
        logits = ModelStepper(model, max_len=128, block_size=16).step([prompt + target[:-1]])
        top = logits[len(prompt) - 1 :].topk(2, dim=-1).values
        margins.append((top[:, 0] - top[:, 1]).tolist())
    return tokens, perplexity(model, tok.encode(TEXT)), margins


def measure(loaded: LoadedModel, case: str, ref: Reference) -> dict[str, float]:
    """Agreement and perplexity ratio of `case` (see CASES) against the float weights' `ref`."""
    model, tok = loaded.model, loaded.tokenizer
    prompts = [tok.encode(p) for p in PROMPTS]
    ref_tokens, ref_ppl, ref_margins = ref
    model.quantize_weights(*CASES[case])
    try:
        out = greedy(model, prompts, NEW_TOKENS)
        forced = teacher_forced_agreement(model, prompts, ref_tokens)
        ppl = perplexity(model, tok.encode(TEXT))
    finally:
        model.quantize_weights("none")
    same = sum(
        a == b for r, o in zip(ref_tokens, out, strict=True) for a, b in zip(r, o, strict=True)
    )
    # Where each continuation first parts from the float one, how sure the float was.
    flips = [
        margins[next(i for i, (a, b) in enumerate(zip(r, o, strict=True)) if a != b)]
        for r, o, margins in zip(ref_tokens, out, ref_margins, strict=True)
        if r != o
    ]
    return {
        "free_run_agreement": same / (len(PROMPTS) * NEW_TOKENS),
        "widest_flip_margin": max(flips, default=0.0),
        "teacher_forced_agreement": forced,
        "perplexity_fp32": ref_ppl,
        "perplexity": ppl,
        "perplexity_ratio": ppl / ref_ppl,
    }


@pytest.fixture(scope="module")
def smollm2() -> LoadedModel:
    return load_model(None, dtype=torch.float32, device="cpu")


@pytest.fixture(scope="module")
def fp32_reference(smollm2: LoadedModel) -> Reference:
    """Computed once for both modes."""
    return reference(smollm2)


@pytest.mark.parametrize("case", sorted(CASES))
def test_quantized_weights_keep_greedy_output_and_perplexity(
    smollm2: LoadedModel, fp32_reference: Reference, case: str
) -> None:
    if CASES[case][3] and not quant._fbgemm_linear():
        pytest.skip(reason="int8 activations need torch's fbgemm int8 linear")
    if CASES[case][3] and not quant.vnni():
        # Without VNNI the activations round to 7 bits, and the engine never picks them
        # (int8_dot_products; the served case shows what it does pick). Measured on an
        # AVX2 EPYC: teacher-forced 0.867, perplexity ratio 0.996: too many near-ties flip.
        pytest.skip(reason="int8 activations serve only on a CPU with VNNI; this one has none")
    figures = measure(smollm2, case, fp32_reference)
    assert figures["teacher_forced_agreement"] >= MIN_TEACHER_FORCED_AGREEMENT[case], figures
    assert figures["widest_flip_margin"] <= NEAR_TIE_LOGITS, figures
    assert figures["perplexity_ratio"] <= MAX_PERPLEXITY_RATIO[case], figures


if __name__ == "__main__":
    loaded = load_model(None, dtype=torch.float32, device="cpu")
    floats = reference(loaded)
    for name in CASES:
        print(name, measure(loaded, name, floats))
