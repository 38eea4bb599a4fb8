"""A NaN or infinite row never changes another row's result (issue 46, item 1).

One tenant's broken adapter (NaN weights) makes its own rows NaN; every other row of
the batch must come out bit for bit as it would without it, on every weight path
(none, int8, int4, and the LM head's int8 activations where fbgemm runs them). The
int8-activation head used to quantize with one range for the whole batch, so a NaN
row shifted (or, first in the batch, broke) every other row's logits.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch
import torch.nn.functional as F

from engine.attention import cpu_kernels
from engine.attention.backend import AttentionMetadata
from engine.attention.select import get_attention_backend
from engine.attention.torch_backend import TorchAttentionBackend
from engine.config import ModelArchitecture
from engine.lora.batch import LoraBatch
from engine.lora.peft import TARGET_MODULES, AdapterInfo, AdapterWeights, module_shape
from engine.lora.stacks import LoraStacks
from engine.model import quant
from engine.model.forward_context import ForwardContext
from engine.model.llama import LlamaForCausalLM
from engine.model.quant import QuantizedLinear
from tests.utils.model_step import TINY_ARCH, allocate_kv_caches, contiguous_metadata

ARCH = TINY_ARCH
NAN, INF = float("nan"), float("inf")
FBGEMM = pytest.mark.skipif(not quant._fbgemm_linear(), reason="needs torch's fbgemm int8 linear")
# (weight_quant, the LM head's int8 activations): every path a product can take.
PATHS = [
    pytest.param("none", False, id="none"),
    pytest.param("int8", False, id="int8"),
    pytest.param("int8", True, id="int8-head-int8-activations", marks=FBGEMM),
    pytest.param("int4", False, id="int4"),
    pytest.param("int4", True, id="int4-head-int8-activations", marks=FBGEMM),
]
POISONS = {
    "nan_row": lambda r: r.fill_(NAN),
    "one_nan": lambda r: r.index_fill_(0, torch.tensor([5]), NAN),
    "inf_row": lambda r: r.fill_(INF),
    "one_minus_inf": lambda r: r.index_fill_(0, torch.tensor([7]), -INF),
}


def _product(mode: str, head_int8: bool, w: torch.Tensor, b: torch.Tensor) -> QuantizedLinear:
    if head_int8:
        return QuantizedLinear(w, b, 8, max_rows=None, int8_activations=True)
    return QuantizedLinear(w, b, {"int8": 8, "int4": 4}[mode], max_rows=None)


@pytest.mark.parametrize("poison", sorted(POISONS))
@pytest.mark.parametrize("bad_row", [0, 2, 4])
@pytest.mark.parametrize(("mode", "head_int8"), PATHS)
def test_a_non_finite_row_leaves_the_other_rows_bit_identical(
    mode: str, head_int8: bool, bad_row: int, poison: str
) -> None:
    torch.manual_seed(0)
    w, b = torch.randn(96, 64) * 0.05, torch.randn(96)
    x = torch.randn(5, 64)
    x[3] *= 1000.0  # an outlier row, too: it must not change the others either
    poisoned = x.clone()
    POISONS[poison](poisoned[bad_row])
    clean = [r for r in range(5) if r != bad_row]
    if mode == "none":
        # fp32 BLAS may sum differently at another row count (not another row's values):
        # the reference is the same batch with a zero row in the poisoned one's place.
        zeroed = x.clone()
        zeroed[bad_row] = 0.0
        out, ref = F.linear(poisoned, w, b), F.linear(zeroed, w, b)
        assert torch.equal(out[clean], ref[clean])
        return
    product = _product(mode, head_int8, w, b)
    # With int8 activations, both fbgemm input widths: 8 bits (VNNI) and 7 (without).
    for reduce_range in (False, True) if head_int8 else (product.reduce_range,):
        product.reduce_range = reduce_range
        out = product(poisoned)
        alone = torch.cat([product(x[r : r + 1]) for r in range(5)])
        assert torch.equal(out[clean], alone[clean]), reduce_range
        assert not out[bad_row].isfinite().all()  # the broken row is visibly broken


def _adapter(name: str, seed: int, rank: int = 4, poison: bool = False) -> AdapterWeights:
    """Random A/B for every projection of ARCH; `poison`: one A and one B hold NaN."""
    g = torch.Generator().manual_seed(seed)
    modules: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}
    for layer in range(ARCH.num_layers):
        for module in TARGET_MODULES:
            fan_in, fan_out = module_shape(ARCH, module)
            a = torch.randn(rank, fan_in, generator=g) / fan_in**0.5
            b = torch.randn(fan_out, rank, generator=g) * 0.2
            if poison and layer == 0 and module in ("q_proj", "down_proj"):
                a[1, 3] = NAN
                b[2, 0] = NAN
            modules[(layer, module)] = (a, b)
    info = AdapterInfo(name, rank, float(rank), name, TARGET_MODULES)
    return AdapterWeights(info, modules)


def _fuse_and_quantize(model: LlamaForCausalLM, mode: str, head_int8: bool) -> None:
    """Fuses `model`'s projections and, unless `mode` is "none", quantizes its weights so
    (`head_int8`: the LM head's activations in int8 too)."""
    model.fuse()
    if mode != "none":
        model.quantize_weights(
            mode,  # type: ignore[arg-type]
            max_rows=None,
            prefill_bf16=False,
            head_int8_activations=head_int8,
        )


def _run(
    model: LlamaForCausalLM,
    steps: Sequence[Sequence[Sequence[int]]],
    slots: Sequence[int | None],
    stacks: LoraStacks | None,
    segmented: bool,
) -> list[torch.Tensor]:
    """Runs `steps` (each: new tokens per sequence) with sequence i on adapter slot
    `slots[i]`; returns each step's logits, one row per sequence's last token."""
    block_size, blocks_per_seq = 4, 8
    caches = allocate_kv_caches(ARCH, len(slots) * blocks_per_seq, block_size)
    lengths = [0] * len(slots)
    # The CPU's default: its paged decode kernel attends each sequence on its own, so a
    # sequence's attention is the same alone (the torch reference batches decode rows
    # into one padded SDPA call, which may round differently from a single row's).
    backend = get_attention_backend("auto", torch.device("cpu"))
    logits = []
    with torch.no_grad():
        for new in steps:
            lens = [len(t) for t in new]
            meta = contiguous_metadata(
                lens, lengths, block_size=block_size, blocks_per_seq=blocks_per_seq
            )
            row_slots = [s for s, n in zip(slots, lens, strict=True) for _ in range(n)]
            lora = None
            if stacks is not None:
                lora = LoraBatch.build(stacks, row_slots, torch.device("cpu"), segmented=segmented)
            ctx = ForwardContext(backend=backend, meta=meta, kv_caches=caches, lora=lora)
            ids = torch.tensor([t for toks in new for t in toks])
            positions = torch.tensor(
                [p for c, n in zip(lengths, lens, strict=True) for p in range(c, c + n)]
            )
            hidden = model(ids, positions, ctx)
            last = torch.tensor(lens).cumsum(0) - 1
            logits.append(model.compute_logits(hidden.index_select(0, last)))
            lengths = [c + n for c, n in zip(lengths, lens, strict=True)]
    return logits


PROMPTS = [[3, 14, 15, 92, 65], [35, 89, 79], [32, 38, 46, 26, 43, 38], [27, 95]]
STEPS = [PROMPTS, [[7], [8], [9], [10]], [[11], [12], [13], [14]]]


@pytest.mark.parametrize("segmented", [False, True], ids=["grouped", "segmented"])
@pytest.mark.parametrize(("mode", "head_int8"), PATHS)
def test_a_nan_adapter_leaves_other_tenants_logits_bit_identical(
    mode: str, head_int8: bool, segmented: bool
) -> None:
    """Sequences 0 and 3 plain, 1 on a NaN adapter, 2 on a clean one, batched together
    through the real LoRA batch path; every product quantized at every size."""
    torch.manual_seed(2)
    model = LlamaForCausalLM(ARCH).eval()
    model.requires_grad_(False)
    _fuse_and_quantize(model, mode, head_int8)
    assert model.lm_head_quant is None or (model.lm_head_quant.packed is not None) == head_int8

    def stacks_with(slot_1: AdapterWeights) -> LoraStacks:
        stacks = LoraStacks(ARCH, max_loras=3, max_rank=4, dtype=torch.float32, device="cpu")
        stacks.load(0, _adapter("clean", 1))
        stacks.load(1, slot_1)
        return stacks

    slots = [None, 1, 0, None]
    poisoned = _run(model, STEPS, slots, stacks_with(_adapter("nan", 3, poison=True)), segmented)
    healthy = _run(model, STEPS, slots, stacks_with(_adapter("fine", 3)), segmented)
    for step, (bad, good) in enumerate(zip(poisoned, healthy, strict=True)):
        assert not bad[1].isfinite().all(), step  # the poisoned tenant's own output
        assert torch.equal(bad[[0, 2, 3]], good[[0, 2, 3]]), (step, (bad - good).abs().max())
    if mode == "none" or segmented or not cpu_kernels.available():
        # fp32 BLAS sums may differ with the row count (see the test above): the float
        # base products, and the segmented path's deltas (one bmm over every slot's rows).
        return
    # The clean adapter's tenant, bit for bit as when it runs alone. (The plain tenants
    # are compared above: a batch with any adapter row runs the MLP's middle in fp32, one
    # without in bf16, whatever the rows hold; the test below runs them alone.)
    alone = _run(model, [[s[2]] for s in STEPS], [0], stacks_with(_adapter("x", 5)), segmented)
    for step in range(len(STEPS)):
        assert torch.equal(poisoned[step][2], alone[step][0]), step


@pytest.mark.parametrize(("mode", "head_int8"), PATHS)
def test_a_nan_hidden_state_leaves_other_sequences_as_when_alone(
    mode: str, head_int8: bool
) -> None:
    """A token whose embedding is NaN makes its sequence NaN through every layer and the
    LM head; the sequences batched with it get exactly their logits when alone."""
    torch.manual_seed(6)
    arch = ModelArchitecture(**{**ARCH.__dict__, "tie_word_embeddings": False})
    model = LlamaForCausalLM(arch).eval()
    model.requires_grad_(False)
    model.model.embed_tokens.weight[90] = NAN  # token 90: only sequence 1 reads it
    _fuse_and_quantize(model, mode, head_int8)
    steps = [[PROMPTS[0], [90, 4, 5], *PROMPTS[2:]], *STEPS[1:]]
    slots = [None] * 4
    batch = _run(model, steps, slots, None, False)
    for step, logits in enumerate(batch):
        assert not logits[1].isfinite().any(), step
    if mode == "none":
        finite = _run(
            model, [[PROMPTS[0], [89, 4, 5], *PROMPTS[2:]], *STEPS[1:]], slots, None, False
        )
        for step, (bad, good) in enumerate(zip(batch, finite, strict=True)):
            assert torch.equal(bad[[0, 2, 3]], good[[0, 2, 3]]), step
        return
    if not cpu_kernels.available():
        pytest.skip("needs numba's CPU decode kernel (see _run)")
    for seq in (0, 2, 3):
        alone = _run(model, [[s[seq]] for s in steps], [None], None, False)
        for step in range(len(steps)):
            assert torch.equal(batch[step][seq], alone[step][0]), (seq, step)


def test_batched_decode_ignores_nan_in_cells_another_sequence_owns() -> None:
    """The torch backend's batched decode gathers whole blocks into a padded batch: a
    zero-padded block table reads block 0 and a reused block keeps its last owner's
    tail. Masked scores do not hide NaN there (0 * NaN is NaN), so those cells must not
    reach the product."""
    torch.manual_seed(4)
    heads, kv_heads, dim, block_size = 4, 2, 16, 4
    cache = torch.randn(2, 6, block_size, kv_heads, dim)
    # Sequence 0: 3 tokens in block 1 (its tail slot 3 is stale); sequence 1: 7 tokens
    # in blocks 2 and 3, its table padded with block 0 (the poisoned tenant's).
    tables = torch.tensor([[1, 0], [2, 3]], dtype=torch.int32)
    meta = AttentionMetadata(
        slot_mapping=torch.tensor([1 * block_size + 2, 3 * block_size + 2]),
        query_start_loc=torch.tensor([0, 1, 2], dtype=torch.int32),
        seq_lens=torch.tensor([3, 7], dtype=torch.int32),
        block_tables=tables,
        max_query_len=1,
        max_seq_len=7,
        query_lens_cpu=(1, 1),
        seq_lens_cpu=(3, 7),
    )
    q, k, v = (
        torch.randn(2, heads, dim),
        torch.randn(2, kv_heads, dim),
        torch.randn(2, kv_heads, dim),
    )
    clean = TorchAttentionBackend().forward(q, k, v, cache.clone(), meta, 0.25)
    dirty_cache = cache.clone()
    dirty_cache[:, 0] = NAN  # block 0: another sequence's NaN K/V
    dirty_cache[:, 1, 3] = NAN  # sequence 0's stale tail slot
    dirty_cache[:, 3, 3] = INF  # sequence 1's stale tail slot
    dirty = TorchAttentionBackend().forward(q, k, v, dirty_cache, meta, 0.25)
    assert torch.equal(dirty, clean)
