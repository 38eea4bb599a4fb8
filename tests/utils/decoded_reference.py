"""A quantized checkpoint against a float model holding the weights it decodes to."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

import torch

from engine.config import ModelArchitecture
from engine.model.llama import LlamaForCausalLM
from engine.model.loader import load_model
from tests.utils.model_step import ModelStepper

# A checkpoint's decoded weights, named for the loaded architecture.
DecodedWeights = Callable[[ModelArchitecture], Iterable[tuple[str, torch.Tensor]]]


def logits_against_decoded(
    folder: Path, decoded: DecodedWeights, ids: list[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Loads the checkpoint in `folder` (float32, CPU) and a float reference of its
    architecture holding `decoded(arch)`; returns the logits of both for prompt `ids`."""
    loaded = load_model(str(folder), dtype=torch.float32, device="cpu")
    reference = LlamaForCausalLM.empty(loaded.arch, dtype=torch.float32, device="cpu")
    reference.load_weights(decoded(loaded.arch))
    return ModelStepper(loaded.model).step([ids]), ModelStepper(reference).step([ids])
