"""LoRA: a fresh adapter changes nothing, the PEFT export matches PyTorch ``peft`` on the exported base,
the merged export matches both, and only the adapters train."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from qwen2_tiny import forward, left_padded_batch, max_diff_on_real, torch_logits, torch_qwen2

from roleagent_jax.models import load_pretrained, save_pretrained
from roleagent_jax.models.lora import LoRAConfig, LoRAParam, add_lora, projections
from roleagent_jax.models.peft_io import save_adapter


def randomise_b(model, seed: int = 0) -> None:
    """Non-zero B so that the adapters change the logits (a fresh adapter would not)."""
    rng = np.random.default_rng(seed)
    for _, _, proj in projections(model, ("q", "k", "v", "o", "gate", "up", "down")):
        if proj.lora is not None:
            b = proj.lora.b[...]
            proj.lora.b[...] = jnp.asarray(rng.normal(0, 0.05, b.shape), jnp.float32)


@pytest.mark.parametrize("scan", [False, True])
def test_fresh_adapter_leaves_every_logit_unchanged(tmp_path, scan):
    torch_qwen2(tie=False, kv_heads=2).save_pretrained(tmp_path)
    model, _ = load_pretrained(tmp_path, scan_layers=scan)
    ids, mask, _ = left_padded_batch()
    before = np.asarray(forward(model, ids, mask))
    add_lora(model, LoRAConfig(rank=4, alpha=8), nnx.Rngs(1))
    assert len(jax.tree.leaves(nnx.state(model, LoRAParam))) == 2 * 7 * (1 if scan else 2)
    np.testing.assert_array_equal(np.asarray(forward(model, ids, mask)), before)


@pytest.mark.parametrize(
    "scan,targets", [(False, ("q", "k", "v", "o", "gate", "up", "down")), (True, ("q", "v", "o", "down"))]
)
def test_peft_adapter_on_the_exported_base_matches_ours(tmp_path, scan, targets):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    torch_qwen2(tie=False, kv_heads=2, seed=3).save_pretrained(tmp_path / "src")
    model, _ = load_pretrained(tmp_path / "src", scan_layers=scan)
    add_lora(model, LoRAConfig(rank=4, alpha=12, targets=targets), nnx.Rngs(2))
    randomise_b(model)
    ids, mask, pos = left_padded_batch(seed=5)
    ours = np.asarray(forward(model, ids, mask))

    save_adapter(model, tmp_path / "adapter", str(tmp_path / "src"))
    save_pretrained(model, tmp_path / "merged")
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["lora_alpha"] == 12 and config["peft_type"] == "LORA"
    assert config["base_model_name_or_path"] == str(tmp_path / "src")

    base = AutoModelForCausalLM.from_pretrained(tmp_path / "src").eval().float()
    peft_model = PeftModel.from_pretrained(base, tmp_path / "adapter").eval()
    theirs = torch_logits(peft_model, ids, mask, pos)
    plain = torch_logits(
        AutoModelForCausalLM.from_pretrained(tmp_path / "src").eval().float(), ids, mask, pos
    )
    assert max_diff_on_real(plain, theirs, mask) > 1e-2  # the adapters matter
    assert max_diff_on_real(ours, theirs, mask) <= 1e-4

    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval().float()
    assert max_diff_on_real(torch_logits(reloaded, ids, mask, pos), theirs, mask) <= 1e-4
    again, _ = load_pretrained(tmp_path / "merged", scan_layers=scan)
    assert max_diff_on_real(forward(again, ids, mask), ours, mask) <= 1e-4
