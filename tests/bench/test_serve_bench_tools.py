"""The GPU check's serve tools on the CPU: the random-weight model folder and the load client.

bench/serve_model.py must write a folder `cloister serve` loads in the shape asked
for; bench/serve_load.py must measure a live gateway's streamed completions and
count what the server says it generated.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from bench.serve_load import run
from bench.serve_model import SHAPES, VOCAB, hf_config, write_model_dir
from engine.model.hf_loader import architecture_from_config
from engine.model.loader import load_model
from tenancy.limiter.memory import MemoryLimiter
from tests.utils.live_gateway import make_test_engine, start_gateway
from tests.utils.tiny_model import smollm2_tokenizer_dir


def test_the_served_shapes_are_the_published_ones() -> None:
    smol = architecture_from_config(hf_config(SHAPES["smollm2-135m"], 8192))
    assert (smol.num_layers, smol.hidden_size, smol.intermediate_size) == (30, 576, 1536)
    assert (smol.num_heads, smol.num_kv_heads, smol.head_dim) == (9, 3, 64)
    assert smol.vocab_size == VOCAB == 49152 and smol.tie_word_embeddings
    llama = architecture_from_config(hf_config(SHAPES["llama-1b"], 8192))
    assert (llama.num_layers, llama.hidden_size, llama.num_heads, llama.num_kv_heads) == (
        16,
        2048,
        32,
        8,
    )


@pytest.mark.slow  # the first use of SmolLM2's tokenizer converts it from the GGUF
def test_the_model_folder_loads_in_its_shape_with_seeded_weights(tmp_path: Path) -> None:
    tok = smollm2_tokenizer_dir()
    folder = write_model_dir(tmp_path / "a", "tiny", tok, device=torch.device("cpu"), seed=3)
    again = write_model_dir(tmp_path / "b", "tiny", tok, device=torch.device("cpu"), seed=3)
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        names = set(f.keys())
        assert f.get_tensor("model.norm.weight").dtype == torch.bfloat16
        embed = f.get_tensor("model.embed_tokens.weight")
    with safe_open(str(again / "model.safetensors"), "pt") as f:
        assert torch.equal(embed, f.get_tensor("model.embed_tokens.weight"))  # same seed
    assert "lm_head.weight" not in names  # tied, like SmolLM2
    loaded = load_model(str(folder), dtype=torch.float32, device="cpu")
    shape = SHAPES["tiny"]
    assert (loaded.arch.num_layers, loaded.arch.hidden_size) == (
        shape.num_layers,
        shape.hidden_size,
    )
    assert loaded.tokenizer.encode("Hello there")  # the copied tokenizer works
    assert json.loads((folder / "config.json").read_text())["vocab_size"] == VOCAB


@pytest.mark.slow  # likewise (the tiny model's tokenizer)
def test_the_load_client_measures_a_live_gateway(tmp_path: Path) -> None:
    gw, stop = start_gateway(tmp_path, engine=make_test_engine(tmp_path), limiter=MemoryLimiter())
    try:
        key = gw.tenant("bench")
        args = argparse.Namespace(
            base_url=gw.base_url,
            model=gw.model,
            api_key=key,
            num_prompts=4,
            concurrency=2,
            input_len=12,
            output_len=5,
            vocab=VOCAB,
            seed=0,
            eos_bias=True,
        )
        figures = run(args)
        assert figures["completed"] == 4 and figures["failed"] == 0, figures["first_error"]
        # Counted from the server's usage: 4 requests of 5 tokens (EOS biased away).
        assert figures["total_output_tokens"] == 20
        assert figures["ttft_ms"]["p50"] > 0 and figures["output_throughput"] > 0
        bad = run(argparse.Namespace(**{**vars(args), "api_key": "sk-wrong", "num_prompts": 1}))
        assert bad["completed"] == 0 and bad["failed"] == 1
        assert bad["first_error"].startswith("HTTP 401")
    finally:
        stop()
