"""Every registered family matches transformers on tiny random weights of its real shape.

Folders are built and saved by transformers itself (tests/utils/hf_families.py), so
each family's own checkpoint layout is what our loader reads.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from engine import LLM, SamplingParams
from engine.attention.cpu_backend import CpuAttentionBackend
from engine.attention.torch_backend import TorchAttentionBackend
from engine.model.loader import load_model
from engine.model.registry import FAMILIES
from tests.utils.hf_families import (
    family_config,
    hf_greedy,
    hf_logits,
    load_reference,
    make_family_dir,
)
from tests.utils.model_step import ModelStepper

FAMILY_NAMES = [f.name for f in FAMILIES]
NEW_TOKENS = 32
# Mistral's and Qwen's default configs carry a window; these tests want none.
NO_WINDOW = {"sliding_window": None}


@pytest.fixture(scope="module", params=FAMILY_NAMES)
def family_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_family_dir(tmp_path_factory.mktemp(request.param), request.param, seed=5)


def test_the_loader_names_the_family(family_dir: Path) -> None:
    loaded = load_model(str(family_dir), dtype=torch.float32, device="cpu")
    assert loaded.arch.architecture == family_dir.name.split("-")[1]
    assert type(load_reference(family_dir)).__name__ in {
        a for f in FAMILIES if f.name == loaded.arch.architecture for a in f.hf_architectures
    }


def test_logits_match_in_a_mixed_batch(family_dir: Path) -> None:
    """A prompt in two chunks beside another sequence's prefill, then decodes."""
    model = load_model(str(family_dir), dtype=torch.float32, device="cpu").model
    reference = load_reference(family_dir)
    a, b = list(range(100, 113)), list(range(2000, 2009))
    stepper = ModelStepper(model, num_seqs=2, block_size=4)
    first = stepper.step([a[:7], b[:8]])
    second = stepper.step([a[7:12], b[8:9]])
    third = stepper.step([a[12:13], [42]])
    ours_a = torch.cat([first[:7], second[:5], third[:1]])
    ours_b = torch.cat([first[7:], second[5:], third[1:]])
    assert (ours_a - hf_logits(reference, a)).abs().max() <= 1e-3
    assert (ours_b - hf_logits(reference, b + [42])).abs().max() <= 1e-3


def test_bfloat16_tracks_transformers_in_bfloat16(family_dir: Path) -> None:
    ids = list(range(500, 524))
    low = load_model(str(family_dir), dtype=torch.bfloat16, device="cpu").model
    ours = ModelStepper(low).step([ids])
    reference = load_reference(family_dir).to(torch.bfloat16)
    theirs = hf_logits(reference, ids)
    assert ours.dtype == torch.float32
    assert (ours - theirs).abs().max() <= 0.1 * theirs.abs().max()
    assert (ours.argmax(-1) == theirs.argmax(-1)).float().mean() >= 0.9


def test_greedy_tokens_match_beside_other_requests_and_on_a_cache_hit(
    family_dir: Path,
) -> None:
    llm = LLM(str(family_dir), max_model_len=256, kv_cache_bytes=16 * 2**20, block_size=4)
    reference = load_reference(family_dir)
    prompts = [list(range(300, 321)), list(range(40, 49)), list(range(7000, 7030))]
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True, logprobs=0)
    miss = llm.generate(prompts, params)
    hit = llm.generate(prompts, params)
    for ids, cold, warm in zip(prompts, miss, hit, strict=True):
        assert cold.outputs[0].token_ids == hf_greedy(reference, ids)
        assert warm.outputs[0].token_ids == cold.outputs[0].token_ids
        assert warm.num_cached_tokens >= 8 > cold.num_cached_tokens == 0
        assert cold.outputs[0].logprobs is not None and warm.outputs[0].logprobs is not None
        for c, w in zip(cold.outputs[0].logprobs, warm.outputs[0].logprobs, strict=True):
            assert abs(c.chosen.logprob - w.chosen.logprob) <= 1e-4


WINDOWS = {
    "mistral": {"sliding_window": 8},
    "qwen3": {"sliding_window": 8, "use_sliding_window": True, "max_window_layers": 1},
    # transformers windows every Phi-3 layer, whatever layer_types says.
    "phi3": {"sliding_window": 8, "layer_types": ["full_attention", "sliding_attention"]},
}
EXPECTED_WINDOWS = {"mistral": [8, 8], "qwen3": [None, 8], "phi3": [8, 8]}


@pytest.mark.parametrize("family", list(WINDOWS))
def test_sliding_window_layers_match_transformers_past_the_window(
    tmp_path: Path, family: str
) -> None:
    """Prompts and outputs several windows long, chunked and batched, with the prefix
    cache on: every layer with a window sees only its last 8 positions."""
    folder = make_family_dir(tmp_path, family, seed=2, **WINDOWS[family])
    reference = load_reference(folder)
    loaded = load_model(str(folder), dtype=torch.float32, device="cpu")
    windows = [loaded.arch.layer_window(i) for i in range(loaded.arch.num_layers)]
    assert windows == EXPECTED_WINDOWS[family]
    a, b = list(range(100, 130)), list(range(2000, 2011))
    stepper = ModelStepper(loaded.model, num_seqs=2, block_size=4)
    first = stepper.step([a[:13], b[:10]])
    second = stepper.step([a[13:30], b[10:11]])
    assert (torch.cat([first[:13], second[:17]]) - hf_logits(reference, a)).abs().max() <= 1e-3
    assert (torch.cat([first[13:], second[17:]]) - hf_logits(reference, b)).abs().max() <= 1e-3
    llm = LLM(str(folder), max_model_len=128, kv_cache_bytes=8 * 2**20, block_size=4)
    assert llm.engine.max_model_len == 128  # the window does not bound the context
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    prompts = [list(range(900, 918)), list(range(40, 45))]
    cold = llm.generate(prompts, params)
    warm = llm.generate(prompts, params)  # a prefix-cache hit
    for ids, c, w in zip(prompts, cold, warm, strict=True):
        assert c.outputs[0].token_ids == hf_greedy(reference, ids, steps=24)
        assert w.outputs[0].token_ids == c.outputs[0].token_ids and w.num_cached_tokens > 0


def test_qwen_ignores_a_window_it_does_not_turn_on(tmp_path: Path) -> None:
    folder = make_family_dir(tmp_path, "qwen2", sliding_window=24, use_sliding_window=False)
    loaded = load_model(str(folder), dtype=torch.float32, device="cpu")
    assert loaded.arch.sliding_window is None
    assert all(loaded.arch.layer_window(i) is None for i in range(loaded.arch.num_layers))


@pytest.mark.parametrize("overrides", [{}, {"attention_bias": True}], ids=["plain", "biased"])
def test_the_capacity_planner_counts_every_familys_parameters(
    overrides: dict[str, bool],
) -> None:
    from engine.config import ModelArchitecture
    from engine.model.hf_loader import architecture_from_config
    from engine.model.llama import LlamaForCausalLM
    from engine.planning.capacity import count_active_parameters, count_parameters
    from tests.utils.hf_families import family_config

    for name in FAMILY_NAMES:
        if overrides and name in ("mistral", "phi3"):
            continue  # their configs have no attention_bias
        arch: ModelArchitecture = architecture_from_config(
            family_config(name, **overrides).to_dict()
        )
        model = LlamaForCausalLM.empty(arch, dtype=torch.float32, device="meta")
        assert count_parameters(arch) == sum(p.numel() for p in model.parameters()), name
        # A token runs through the router and k experts of each sparse layer (any k of
        # them: they are all the same size), and through all of a dense model.
        k = arch.num_experts_per_tok
        active = sum(
            p.numel()
            for n, p in model.named_parameters()
            if ".experts." not in n or int(n.split(".experts.")[1].split(".")[0]) < k
        )
        assert count_active_parameters(arch) == active, name


@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe"])
def test_transformers_fused_in_memory_experts_load_like_the_saved_checkpoint(
    tmp_path: Path, family: str
) -> None:
    """transformers 5 holds experts fused ([E, 2I, H] and [E, H, I]) in memory and saves
    them one tensor per expert; the family's mapping takes both."""
    from engine.model.llama import LlamaForCausalLM
    from engine.model.registry import family_named

    folder = make_family_dir(tmp_path, family, seed=8)
    saved = load_model(str(folder), dtype=torch.float32, device="cpu")
    reference = load_reference(folder)
    state = reference.state_dict()
    assert any(name.endswith(".mlp.experts.gate_up_proj") for name in state)
    mapper = family_named(family).hf_weights
    model = LlamaForCausalLM.empty(saved.arch, dtype=torch.float32, device="cpu")
    model.load_weights(pair for n, t in state.items() for pair in mapper(n, t, saved.arch))
    ids = list(range(60, 75))
    torch.testing.assert_close(
        ModelStepper(model).step([ids]), ModelStepper(saved.model).step([ids]), atol=0, rtol=0
    )


def test_gemma3_final_logit_softcapping_matches_transformers(tmp_path: Path) -> None:
    folder = make_family_dir(tmp_path, "gemma3", seed=3, final_logit_softcapping=2.0)
    loaded = load_model(str(folder), dtype=torch.float32, device="cpu")
    assert loaded.arch.final_logit_softcap == 2.0
    ids = list(range(300, 320))
    ours = ModelStepper(loaded.model).step([ids])
    assert ours.abs().max() <= 2.0  # capped
    assert (ours - hf_logits(load_reference(folder), ids)).abs().max() <= 1e-4


def test_gemma3_reads_transformers_4_configs_the_same(tmp_path: Path) -> None:
    """Older configs spell the rotary bases and the layer pattern differently."""
    import json

    from engine.model.hf_loader import architecture_from_config, read_config

    folder = make_family_dir(tmp_path, "gemma3", seed=1, rope_parameters={
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
    })  # fmt: skip
    v5 = read_config(folder)
    v4 = {k: v for k, v in v5.items() if k not in ("layer_types", "rope_parameters")}
    v4 |= {
        "rope_theta": 1e6,
        "rope_scaling": {"rope_type": "linear", "factor": 8.0},
        "rope_local_base_freq": 10000.0,
        "sliding_window_pattern": 6,
    }
    arch = architecture_from_config(v5)
    assert architecture_from_config(json.loads(json.dumps(v4))) == arch
    assert [arch.layer_window(i) for i in range(6)] == [8, 8, 8, 8, 8, None]
    assert (arch.rope_theta, arch.local_rope_theta) == (1e6, 10000.0)
    assert dict(arch.rope_scaling or ()) == {"rope_type": "linear", "factor": 8.0}
    # And the scaled global rotary matches transformers too.
    ids = list(range(40, 60))
    ours = ModelStepper(load_model(str(folder), dtype=torch.float32, device="cpu").model)
    assert (ours.step([ids]) - hf_logits(load_reference(folder), ids)).abs().max() <= 1e-3


def _uncapped(model: torch.nn.Module) -> None:
    """Switches the attention soft cap off in every layer (what a backend ignoring it
    would compute)."""
    for layer in model.model.layers:
        layer.self_attn.softcap = None


@pytest.mark.parametrize("backend", [TorchAttentionBackend, CpuAttentionBackend])
def test_gemma2_attention_softcap_matches_transformers(tmp_path: Path, backend: type) -> None:
    """A cap of 3 bends most scores. Prefill chunks, a lone decode row beside a chunk,
    then two decode rows together (the reference's batched path, the CPU kernel), all
    past the window of 8; without the cap the same steps leave transformers' logits."""
    folder = make_family_dir(
        tmp_path, "gemma2", seed=4, attn_logit_softcapping=3.0, final_logit_softcapping=None
    )
    loaded = load_model(str(folder), dtype=torch.float32, device="cpu")
    assert loaded.arch.attention_softcap == 3.0 and loaded.arch.final_logit_softcap is None
    assert [loaded.arch.layer_window(i) for i in range(4)] == [8, None, 8, None]
    reference = load_reference(folder)
    a, b = list(range(100, 130)), list(range(2000, 2011))
    expected_a, expected_b = hf_logits(reference, a), hf_logits(reference, b + [42])

    def run() -> tuple[torch.Tensor, torch.Tensor]:
        stepper = ModelStepper(loaded.model, num_seqs=2, block_size=4, backend=backend())
        first = stepper.step([a[:13], b[:10]])
        second = stepper.step([a[13:29], b[10:11]])
        third = stepper.step([a[29:30], [42]])
        ours_a = torch.cat([first[:13], second[:16], third[:1]])
        ours_b = torch.cat([first[13:], second[16:], third[1:]])
        return (ours_a - expected_a).abs().max(), (ours_b - expected_b).abs().max()

    assert max(run()) <= 1e-3
    _uncapped(loaded.model)
    assert min(run()) > 1e-2


def test_gemma3_ignores_an_attention_softcap_as_transformers_does(tmp_path: Path) -> None:
    """transformers' Gemma 3 keeps attn_logit_softcapping in its config but never caps
    its attention; neither do we, so the logits stay its own."""
    folder = make_family_dir(tmp_path, "gemma3", seed=6, attn_logit_softcapping=2.0)
    loaded = load_model(str(folder), dtype=torch.float32, device="cpu")
    assert loaded.arch.attention_softcap is None
    ids = list(range(300, 320))
    expected = hf_logits(load_reference(folder), ids)
    assert (ModelStepper(loaded.model).step([ids]) - expected).abs().max() <= 1e-3


def test_gemma2_reads_transformers_4_configs_the_same() -> None:
    """transformers 4 wrote neither layer_types (the even layers have the window) nor
    rope_parameters (rope_theta instead)."""
    from engine.model.hf_loader import architecture_from_config

    v5 = family_config("gemma2", num_hidden_layers=5).to_dict()
    v4 = {k: v for k, v in v5.items() if k not in ("layer_types", "rope_parameters")}
    v4 |= {"rope_theta": 10000.0, "hidden_act": "gelu_pytorch_tanh"}
    arch = architecture_from_config(v5)
    assert architecture_from_config(v4) == arch
    assert [arch.layer_window(i) for i in range(5)] == [8, None, 8, None, 8]
    assert (arch.attention_softcap, arch.final_logit_softcap) == (50.0, 30.0)
    assert arch.attention_scale == 16**-0.5 and not arch.qk_norm and arch.sandwich_norms
    assert arch.local_rope_theta is None  # one rotary base for every layer


@pytest.mark.parametrize("cap", [0.0, -50.0, float("nan"), float("inf"), "50"])
def test_a_bad_attention_softcap_is_refused_by_name(cap: object) -> None:
    from engine.config import ModelArchitecture
    from engine.errors import UnsupportedModelError
    from tests.utils.model_step import TINY_ARCH

    with pytest.raises(UnsupportedModelError, match="attention_softcap"):
        dataclasses.replace(TINY_ARCH, attention_softcap=cap)
    assert ModelArchitecture.__dataclass_fields__["attention_softcap"].default is None
