"""The paper's command, configs/alfworld.py, in miniature: only its sizes are overridden.

A tiny Qwen2 written here in Hugging Face format (bf16 weights, a BPE tokenizer trained here), the real
ALFWorld games, the 8-device CPU mesh with fsdp > 1, WIA separate with horizon 2, the policy as analyst
and as retrieval chooser, KL on, 2 iterations at the paper's lr 1e-6, and a resume.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from conftest import load_config

ROOT = Path(__file__).resolve().parents[1]
# Text the tiny tokenizer is trained on: ALFWorld's kind of observations, actions and analyses.
TEXTS = [
    "You are in the middle of a room. Looking quickly around you, you see a cabinet 1, a countertop 1.",
    "Your task is to: put a clean apple in fridge. <think>I need the apple first.</think>",
    "<action>take apple 1 from countertop 1</action> You pick up the apple 1 from the countertop 1.",
    "Nothing happens. You open the fridge 1. The fridge 1 is open. In it, you see a lettuce 1.",
    "FAILURE_TYPE: wrong_object QUERY: clean then place LESSON: find the object first. CHOICE: 1, 2",
]


def paper_config():
    return load_config("alfworld")


def write_tiny_checkpoint(directory: Path) -> None:
    """A 1-layer transformers Qwen2 stored in bfloat16 (torch_dtype bfloat16) with its own tokenizer.json."""
    import torch
    from qwen2_tiny import one_layer_fields
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from roleagent_jax.models.tokenizer import train_bpe_tokenizer

    tok = train_bpe_tokenizer(TEXTS * 4, 320, directory)
    torch.manual_seed(0)
    fields = one_layer_fields(
        vocab_size=len(tok),
        intermediate_size=64,
        tie_word_embeddings=True,
        max_position_embeddings=1024,
        eos_token_id=tok.eos_token_id,
    )
    cfg = Qwen2Config(**fields)
    Qwen2ForCausalLM(cfg).to(torch.bfloat16).save_pretrained(directory)
    assert json.loads((directory / "config.json").read_text()).get("torch_dtype", "bfloat16") == "bfloat16"


def miniature(workdir: Path, model_dir: Path, data: Path, iterations: int):
    c = paper_config()
    c.workdir = str(workdir)
    c.iterations = iterations
    c.model.path = str(model_dir)
    c.env.data_dir = str(data)
    c.env.train_split = "valid_train"
    c.env.eval_splits = ("valid_seen",)
    c.env.max_steps = 2
    c.env.num_workers = 1
    c.mesh.data, c.mesh.fsdp = 2, 4
    c.rollout.tasks_per_iter = 1
    c.rollout.group_size = 2
    c.rollout.max_prompt_tokens = 256
    c.rollout.max_response_tokens = 6
    c.wia.max_tokens = 6
    c.aiw.max_tokens = 6
    c.train.mini_batch_rows = 8  # the batch axis is split over data x fsdp = 8 devices
    c.train.micro_batch_rows = 8
    c.eval.limit = 1
    c.checkpoint.every = 1
    c.log.progress = False
    c.log.tensorboard = False
    return c


def run(config, roles: list[str]):
    """Trainer.run() with every sampler request's role recorded; the final params (host copies)."""
    from roleagent_jax.run.trainer import Trainer
    from roleagent_jax.sampling import Sampler

    original = Sampler.generate

    def recording(self, params, requests, *args, **kw):
        roles.extend(r.role for r in requests)
        return original(self, params, requests, *args, **kw)

    Sampler.generate = recording
    trainer = Trainer(config)
    try:
        trainer.run()
        return jax.device_get(trainer.state.params), dict(trainer.host), list(trainer.logger.history)
    finally:
        Sampler.generate = original
        trainer.close()


@pytest.fixture
def compile_cache(tmp_path):
    """XLA's compilation cache on disk for this test: its three runs compile the same programs once."""
    from jax.experimental.compilation_cache import compilation_cache

    settings = {
        "jax_compilation_cache_dir": str(tmp_path / "xla_cache"),
        "jax_persistent_cache_min_compile_time_secs": 0.0,
        "jax_persistent_cache_min_entry_size_bytes": 0,
    }
    before = {k: getattr(jax.config, k) for k in settings}
    compilation_cache.reset_cache()
    for k, v in settings.items():
        jax.config.update(k, v)
    yield
    for k, v in before.items():
        jax.config.update(k, v)
    compilation_cache.reset_cache()


@pytest.mark.slow  # three runs of the paper's config on real games: ~2 minutes on 2 cores
def test_paper_config_end_to_end(tmp_path, alfworld_data, compile_cache):
    from flax import nnx

    from roleagent_jax.models import load_pretrained

    model_dir = tmp_path / "tiny-qwen2"
    write_tiny_checkpoint(model_dir)
    c = miniature(tmp_path / "full", model_dir, alfworld_data, iterations=2)
    assert (c.algo, c.wia.mode, c.wia.horizon, c.aiw.analyser, c.aiw.retrieval) == (
        "roleagent", "separate", 2, "llm", "llm",
    )  # fmt: skip
    assert c.optim.lr == 1e-6 and c.loss.kl_coef > 0 and c.loss.kl_type != "none"
    roles: list[str] = []
    full, full_host, history = run(c, roles)
    assert {"agent", "predictor", "analyst", "chooser"} <= set(roles), sorted(set(roles))
    logged = {k for entry in history for k in entry}
    assert {"aiw/analyst_parsed_rate", "aiw/choice_llm_rate", "wia/lms_h2"} <= logged, sorted(logged)

    start = nnx.split(load_pretrained(model_dir, param_dtype="float32")[0])[1]
    moved = 0.0
    for before, after in zip(jax.tree.leaves(start), jax.tree.leaves(full), strict=True):
        assert after.dtype == np.float32  # float32 master weights from a bf16 checkpoint
        moved = max(moved, float(np.abs(np.asarray(after) - np.asarray(before)).max()))
    assert 0.0 < moved < 1e-4  # two iterations at lr 1e-6 move the weights, and only by that much

    split = tmp_path / "split"
    run(miniature(split, model_dir, alfworld_data, iterations=1), [])
    resumed, resumed_host, _ = run(miniature(split, model_dir, alfworld_data, iterations=2), [])
    assert resumed_host["sampled_tasks"] == full_host["sampled_tasks"]
    for x, y in zip(jax.tree.leaves(full), jax.tree.leaves(resumed), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_paper_config_without_model_or_data_fails_in_one_line_per_setting(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("ALFWORLD_DATA", "ROLEAGENT_MODEL")}
    env.update(HOME=str(tmp_path), PYTHONPATH=str(ROOT), ALFWORLD_DATA=str(tmp_path / "no-data"))
    cmd = [sys.executable, "-m", "roleagent_jax.main", f"--config={ROOT / 'configs' / 'alfworld.py'}",
           f"--config.workdir={tmp_path / 'run'}"]  # fmt: skip
    # $ALFWORLD_DATA pointing nowhere: the alfworld package sets a default when it is unset.
    cmd.append("--config.env.data_dir=")
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and 1 <= len(lines) <= 3, out.stderr
    assert "Traceback" not in out.stderr
    assert any("model.path" in line for line in lines) and any("env.data_dir" in line for line in lines)
    assert not (tmp_path / "run").exists()  # nothing started: no workdir, no game loaded


def test_ablation_presets():
    from roleagent_jax.config import apply_algo

    c = paper_config()
    got = {}
    for algo in ("grpo", "gigpo", "wia", "aiw", "roleagent"):
        c.algo = algo
        a = apply_algo(c)
        got[algo] = (a.advantage.step_level, a.wia.mode != "off", a.aiw.enabled)
    assert got == {
        "grpo": (False, False, False),
        "gigpo": (True, False, False),
        "wia": (True, True, False),
        "aiw": (True, False, True),
        "roleagent": (True, True, True),
    }


def test_predictor_rows_take_the_advantage_of_their_action():
    from roleagent_jax.run.rollout import Row
    from roleagent_jax.sampling import SampleResult
    from roleagent_jax.wia import with_predictor_rows

    rows = [
        Row([1, 2], [3], [-0.5], traj_id=t, group_id=0, task_id=0, step_index=s, anchor_hash=0,
            reward=0.0, valid=True, done=False)
        for t, s in ((0, 0), (0, 1), (1, 0))
    ]  # fmt: skip
    adv = np.array([0.5, -1.0, 2.0], np.float32)
    samples = [(1, 0, [7, 8], SampleResult([9, 10], [-0.1, -0.2], "x", "stop", "predictor")),
               (0, 1, [7], SampleResult([11], [-0.3], "y", "stop", "predictor"))]  # fmt: skip
    out, out_adv = with_predictor_rows(rows, adv, samples)
    assert out[:3] == rows and out_adv[:3].tolist() == adv.tolist()
    assert out_adv[3:].tolist() == [2.0, -1.0]
    assert (out[3].prompt_ids, out[3].response_ids, out[3].logprobs) == ([7, 8], [9, 10], [-0.1, -0.2])
    assert (out[4].traj_id, out[4].step_index, out[4].response_ids) == (0, 1, [11])


def test_resume_takes_the_command_lines_task_sampler_settings():
    """A checkpoint's sampler state keeps its logits and random state; eta, decay, temperature, epsilon
    and cap come from the resumed run's config."""
    from roleagent_jax.aiw import TaskSampler

    saved = TaskSampler(10, eta=3.0, decay=0.5, temperature=2.0, epsilon=0.0, cap=0.5, seed=1)
    saved.update({2: 1.0})
    ts, aiw = TaskSampler(10, seed=1), paper_config().aiw
    ts.load_state_dict(saved.state_dict())
    changed = ts.configure(aiw)
    assert (ts.eta, ts.decay, ts.temperature, ts.epsilon) == (
        aiw.eta,
        aiw.decay,
        aiw.temperature,
        aiw.epsilon,
    )
    assert ts.cap == max(aiw.cap, 0.1)  # never below 1 / tasks
    np.testing.assert_array_equal(ts.logits, saved.logits)
    assert ts.rng.bit_generator.state == saved.rng.bit_generator.state
    assert "eta 3.0 -> 1.0" in changed
