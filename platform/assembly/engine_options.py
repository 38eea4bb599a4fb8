"""The engine options `cloister serve` and `cloister engine serve` derive from the
settings: the device, dtype and kernels this machine can run, and the KV events topic.
"""

from __future__ import annotations

import socket
from typing import Any

from server.settings import Settings


class DeviceUnavailableError(ValueError):
    """The `device` setting names a device this machine does not have."""


def resolve_device(requested: str, *, cuda_available: bool | None = None) -> str:
    """ "cpu" or "cuda" for the `device` setting; "cuda" without a GPU is refused."""
    if cuda_available is None:
        import torch

        cuda_available = bool(torch.cuda.is_available())
    if requested == "auto":
        return "cuda" if cuda_available else "cpu"
    if requested == "cuda" and not cuda_available:
        raise DeviceUnavailableError("device is 'cuda' but no CUDA GPU is available here")
    return requested


def resolve_dtype(requested: str, device: str) -> str:
    """The `dtype` setting on `device`: "auto" is bfloat16 on CUDA and float32 elsewhere."""
    if requested == "auto":
        return "bfloat16" if device == "cuda" else "float32"
    return requested


def resolve_fused_ops_setting(requested: str, device: str) -> str:
    """The `fused_ops` setting on `device`; "on" needs CUDA (the server runs no interpreter)."""
    if requested == "on" and device != "cuda":
        raise DeviceUnavailableError(
            f"fused_ops is 'on' but the device is {device!r}: the fused kernels need CUDA"
        )
    return requested


def resolve_weight_quant_setting(requested: str, device: str) -> str:
    """The `weight_quant` setting on `device`; int8/int4 kernels are the CPU's only.

    "auto" is "none" off the CPU; on it, each engine resolves it from its own model file
    (engine.model.quant.choose_weight_quant), since served models may differ."""
    if requested == "auto":
        return "auto" if device == "cpu" else "none"
    if requested != "none" and device != "cpu":
        raise DeviceUnavailableError(
            f"weight_quant is {requested!r} but the device is {device!r}: it runs on the CPU only"
        )
    return requested


def check_model_files(settings: Settings) -> None:
    """Reads each served model's metadata (config.json or the GGUF header), so that a
    missing, unknown or absurd model stops `cloister serve` with the file's name before
    anything is made; raises UnsupportedModelError."""
    from engine.errors import UnsupportedModelError
    from engine.model.loader import default_model_path
    from engine.planning.model_source import read_model_architecture

    for spec in settings.served_models:
        path = spec.path or default_model_path()
        try:
            read_model_architecture(path)
        except UnsupportedModelError as exc:
            raise UnsupportedModelError(f"model {spec.name!r} ({path}): {exc}") from None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            detail = f"{type(exc).__name__}: {exc}"
            raise UnsupportedModelError(f"model {spec.name!r} ({path}): {detail}") from None


def serve_engine_options(
    settings: Settings, *, cuda_available: bool | None = None
) -> dict[str, Any]:
    """The engine options `cloister serve` derives from its settings (besides the model).

    On CUDA, "auto" attention is triton and "auto" fused ops are on (the engine's own
    choices for the device); CUDA graphs are captured unless enforce_eager.
    """
    engine = settings.engine
    device = resolve_device(engine.device, cuda_available=cuda_available)
    # Every engine setting is an engine option of the same name, but where the engine
    # loop runs (engine_mode), which the server's wiring reads.
    return engine.model_dump(exclude={"engine_mode"}) | {
        "device": device,
        "dtype": resolve_dtype(engine.dtype, device),
        "weight_quant": resolve_weight_quant_setting(engine.weight_quant, device),
        "kv_events_topic": kv_events_topic(settings, settings.served_models[0].name),
        "fused_ops": resolve_fused_ops_setting(engine.fused_ops, device),
    }


def kv_events_topic(settings: Settings, model_name: str) -> str:
    """The topic of a model's KV events: the setting, else llm-d's kv@<host>@<model>."""
    if settings.engine.kv_events_topic:
        return settings.engine.kv_events_topic
    return f"kv@{socket.gethostname()}@{model_name}"
