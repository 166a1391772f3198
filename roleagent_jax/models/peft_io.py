"""The model's LoRA adapters as a Hugging Face ``peft`` adapter directory.

``peft`` (``PeftModel.from_pretrained(base, path)``) reads ``adapter_config.json`` and
``adapter_model.safetensors``; tensor names and layouts are the ones ``peft`` itself writes for a
Qwen2 causal LM: ``lora_A`` ``[rank, in]``, ``lora_B`` ``[out, rank]``, one pair per layer and module.
Adapters on the top blocks only are listed in ``layers_to_transform``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import jax
import numpy as np
from flax import nnx
from safetensors.numpy import save_file

from roleagent_jax.models.hf_io import _host
from roleagent_jax.models.lora import TARGETS, adapted_layers, projections

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
_HF_GROUP = {"attn": "self_attn", "mlp": "mlp"}


def adapter_tensors(model: nnx.Module) -> dict[str, np.ndarray]:
    """Every adapter of ``model`` under its ``peft`` name, on the host, float32."""
    out = {}
    first = (adapted_layers(model) or [0])[0]  # stacked adapters start at the lowest adapted block
    for layer, target, proj in projections(model, tuple(TARGETS)):
        if proj.lora is None:
            continue
        group, name, _ = TARGETS[target]
        a, b = _host(proj.lora.a[...]), _host(proj.lora.b[...])
        layers = range(a.shape[0]) if layer is None else [None]
        for i in layers:
            ai, bi = (a, b) if i is None else (a[i], b[i])
            index = layer if i is None else first + i
            rank = ai.shape[-1]
            prefix = f"base_model.model.model.layers.{index}.{_HF_GROUP[group]}.{name}"
            out[f"{prefix}.lora_A.weight"] = np.ascontiguousarray(ai.reshape(-1, rank).T, np.float32)
            out[f"{prefix}.lora_B.weight"] = np.ascontiguousarray(bi.reshape(rank, -1).T, np.float32)
    return out


def adapter_config(model: nnx.Module, base_model_name_or_path: str) -> dict:
    """``adapter_config.json`` content for ``model``'s adapters (rank, alpha, dropout from the model)."""
    adapted = [(t, p.lora) for _, t, p in projections(model, tuple(TARGETS)) if p.lora is not None]
    if not adapted:
        raise ValueError("the model has no LoRA adapters to export")
    lora = adapted[0][1]
    rank = lora.a[...].shape[-1]
    layers = adapted_layers(model)
    every = len(layers) == model.config.num_hidden_layers
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model_name_or_path,
        "r": rank,
        "lora_alpha": lora.scale * rank,
        "lora_dropout": lora.dropout,
        "target_modules": sorted({TARGETS[t][1] for t, _ in adapted}),
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "init_lora_weights": True,
        "inference_mode": True,
        "modules_to_save": None,
        # Adapters on some blocks only (``lora.layers``): peft then adapts exactly those.
        "layers_to_transform": None if every else layers,
        "layers_pattern": None if every else "layers",
    }


def save_adapter(model: nnx.Module, path: str | os.PathLike, base_model_name_or_path: str) -> None:
    """Write ``model``'s adapters as a ``peft`` adapter directory that names its base.

    In a multi-process run every process must call this (arrays are gathered); only process 0 writes.
    """
    config = adapter_config(model, base_model_name_or_path)
    tensors = adapter_tensors(model)
    if jax.process_index() != 0:
        return
    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / (WEIGHTS_FILE + ".tmp")
    save_file(tensors, tmp, metadata={"format": "pt"})
    os.replace(tmp, directory / WEIGHTS_FILE)
    (directory / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
