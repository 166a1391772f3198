"""LoRA in the training loop: a run resumed from its checkpoint ends exactly where an uninterrupted one
does, the checkpoint holds only adapters and names its base, and the final export loads in ``peft``."""

import json
import os

import jax
import numpy as np
import pytest
from test_trainer import assert_same_params, run_trainer, tiny_config

LORA = {"rank": 4, "alpha": 8.0, "dropout": 0.1, "targets": ("q", "v", "o", "down")}


def lora_config(workdir, iterations: int):
    c = tiny_config(workdir, iterations)
    c.lora.update(LORA)
    return c


@pytest.mark.slow
def test_lora_one_plus_one_iterations_equal_two(tmp_path):
    full_state, full_host, _ = run_trainer(lora_config(tmp_path / "full", 2))
    run_trainer(lora_config(tmp_path / "split", 1))
    split_state, split_host, _ = run_trainer(lora_config(tmp_path / "split", 2))
    assert split_host["lora_base"] == str(tmp_path / "split" / "hf_warmstart")  # the warm start made it
    assert split_host["sampled_tasks"] == full_host["sampled_tasks"]
    assert int(split_state.step) == int(full_state.step) > 0
    assert_same_params(split_state.params, full_state.params)
    assert_same_params(split_state.opt_state, full_state.opt_state)
    paths = [jax.tree_util.keystr(k) for k, _ in jax.tree_util.tree_flatten_with_path(split_state.params)[0]]
    assert paths and all("['lora']" in p for p in paths)  # only adapters are trained and checkpointed


@pytest.mark.slow
def test_lora_run_exports_a_merged_model_and_a_peft_adapter(tmp_path):
    from peft import PeftModel
    from qwen2_tiny import left_padded_batch, max_diff_on_real, torch_logits
    from transformers import AutoModelForCausalLM

    from roleagent_jax.run.trainer import Trainer

    trainer = Trainer(lora_config(tmp_path / "run", 1))
    try:
        trainer.warm_start()
        metrics = trainer.iteration(0)
        trainer.host["iteration"] = 1
        trainer.finish()
    finally:
        trainer.close()
    assert metrics["time/update/forward_backward"] > 0 and metrics["time/update/optimizer"] > 0
    final = tmp_path / "run" / "hf_final"
    config = json.loads((final / "adapter" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(tmp_path / "run" / "hf_warmstart")
    assert sorted(config["target_modules"]) == ["down_proj", "o_proj", "q_proj", "v_proj"]
    mask = os.umask(0)
    os.umask(mask)
    modes = {
        p.name: p.stat().st_mode & 0o777
        for p in [*final.iterdir(), *(final / "adapter").iterdir()]
        if p.is_file()
    }
    assert set(modes.values()) == {0o666 & ~mask}, modes  # adapters readable as the folder's other files
    base = AutoModelForCausalLM.from_pretrained(config["base_model_name_or_path"]).eval().float()
    adapted = PeftModel.from_pretrained(base, final / "adapter").eval()
    merged = AutoModelForCausalLM.from_pretrained(final).eval().float()
    ids, mask, pos = left_padded_batch()
    ids = np.minimum(ids, merged.config.vocab_size - 1)
    assert (
        max_diff_on_real(torch_logits(adapted, ids, mask, pos), torch_logits(merged, ids, mask, pos), mask)
        <= 1e-4
    )
