"""The training loop end to end on generated games: exact resume, a killed run, the CLI and the demo."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest
from conftest import load_config, shrunk

ROOT = Path(__file__).resolve().parents[1]


def tiny_config(workdir: Path, iterations: int):
    c = shrunk(load_config("demo"), workdir, iterations)
    c.env.gen.n_train, c.env.max_steps, c.env.eval_splits = 4, 3, ()
    c.env.alfworld.num_receptacles, c.env.alfworld.num_objects = 4, 2
    c.warmstart.n_games = 4
    c.checkpoint.every = 1
    c.loss.kl_type, c.loss.kl_coef = "low_var_kl", 0.02  # the KL reference survives warm start and resume
    return c


def run_trainer(config):
    from roleagent_jax.run.trainer import Trainer

    trainer = Trainer(config)
    try:
        trainer.warm_start()
        for it in range(int(trainer.host["iteration"]), config.iterations):
            trainer.iteration(it)
            trainer.host["iteration"] = it + 1
            trainer.save()
        trainer.ckpt.wait()
        return jax.device_get(trainer.state), dict(trainer.host), trainer.task_sampler.state_dict()
    finally:
        trainer.close()


def assert_same_params(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_warmstart_plays_its_own_games_when_asked(tmp_path):
    """own_games: the expert's games come from their own seed, none of them is an RL game."""
    from roleagent_jax.envs import get_family
    from roleagent_jax.run.setup import Experts, make_task_pool

    c = tiny_config(tmp_path, 0)
    c.env.gen.n_train, c.warmstart.n_games = 3, 2
    family = get_family("alfworld")
    train = make_task_pool(c, family, "gen_seen", tmp_path, "train")
    c.warmstart.own_games = False
    assert Experts(c, family, train, tmp_path).pool().tasks == train.tasks[:2]
    c.warmstart.own_games = True
    own = Experts(c, family, train, tmp_path).pool()

    def games(pool):  # the game itself, without its file name (which carries seed and index)
        return {re.sub(r"gen\d+_seen_\d+", "", Path(t.payload).read_text()) for t in pool.tasks}

    assert len(own) == 2 and not {t.id for t in own.tasks} & {t.id for t in train.tasks}
    assert not games(own) & games(train)
    assert sorted(own.expert_plans) == [0, 1]


def test_each_setup_phase_and_evaluation_prints_a_progress_line(tmp_path, capsys):
    """Game generation, expert play, the tokenizer and evaluations each say what they are doing, and
    nothing when log.progress is off."""
    from roleagent_jax.run.setup import say
    from roleagent_jax.run.trainer import Trainer

    c = tiny_config(tmp_path / "run", 0)
    c.log.progress = True
    c.env.gen.n_eval = 2
    trainer = Trainer(c)
    try:
        trainer.evaluate("gen_unseen")
    finally:
        trainer.close()
    out = capsys.readouterr().out
    for line in (
        "games: 4 gen_seen games for train",
        "expert: playing 4 games",
        "tokenizer: fitting a 400-token BPE",
        "games: 2 gen_unseen games for eval",
        "evaluation: playing 2 gen_unseen games",
    ):
        assert line in out, out
    c.log.progress = False
    say(c, "hidden")
    assert "hidden" not in capsys.readouterr().out


@pytest.mark.slow
def test_two_plus_two_iterations_equal_four(tmp_path):
    full_state, full_host, full_sampler = run_trainer(tiny_config(tmp_path / "full", 4))
    run_trainer(tiny_config(tmp_path / "split", 2))
    split_state, split_host, split_sampler = run_trainer(tiny_config(tmp_path / "split", 4))
    assert split_host["sampled_tasks"] == full_host["sampled_tasks"]  # same tasks drawn after resume
    assert split_sampler["logits"] == full_sampler["logits"]
    assert split_sampler["rng"] == full_sampler["rng"]
    assert int(split_state.step) == int(full_state.step) > 0
    assert_same_params(split_state.params, full_state.params)
    assert_same_params(split_state.opt_state, full_state.opt_state)
    np.testing.assert_array_equal(split_state.rng, full_state.rng)
    lines = (tmp_path / "split" / "failure_memory.jsonl").read_text().splitlines()
    assert len(lines) == len((tmp_path / "full" / "failure_memory.jsonl").read_text().splitlines())


@pytest.mark.slow
def test_a_finished_run_given_more_iterations_is_evaluated_again(tmp_path, monkeypatch):
    """Resuming a finished run reports its stored evaluation; extending it evaluates the new model."""
    from roleagent_jax.run.trainer import Trainer

    evaluated_at = []

    def stamp(self, split, limit=0):  # the evaluation names the iteration it saw
        evaluated_at.append(int(self.host["iteration"]))
        return {"per_type": {"pick_and_place_simple": 0.0}, "success": float(self.host["iteration"])}

    monkeypatch.setattr(Trainer, "evaluate", stamp)

    def after(iterations):
        c = tiny_config(tmp_path, iterations)
        c.env.eval_splits, c.eval.before = ("gen_seen",), False
        c.checkpoint.every = 2  # the last save then comes after the evaluation and stores it
        trainer = Trainer(c)
        try:
            return trainer.run()["eval"]["after"]["gen_seen"]["success"]
        finally:
            trainer.close()

    assert after(1) == 1.0 and evaluated_at == [1]
    with monkeypatch.context() as m:
        m.setattr(Trainer, "iteration", lambda self, it: pytest.fail("a finished run trained again"))
        assert after(1) == 1.0 and evaluated_at == [1]  # the stored evaluation, not a new one
    assert after(2) == 2.0 and evaluated_at == [1, 2]


@pytest.mark.slow
def test_sampler_logprobs_serve_as_old_logprobs(tmp_path):
    """old_logprobs='sampler': the update's old log-probs are the rollout's, token for token what a
    forward pass with the pre-update params gives, and that pass is skipped (only the KL reference runs)."""
    from roleagent_jax.rl.logprobs import MODEL_KEYS
    from roleagent_jax.run.trainer import Trainer

    c = tiny_config(tmp_path, 1)
    c.train.old_logprobs = "sampler"
    trainer = Trainer(c)
    try:
        trainer.warm_start()
        params0 = jax.device_get(trainer.state.params)
        batches, passes = [], []
        step, logprobs = trainer.train_step, trainer.logprobs

        def spy_step(state, batch, frozen=None):
            batches.append(jax.device_get(batch))
            return step(state, batch, frozen)

        def spy_logprobs(batch, params):
            passes.append(params)
            return logprobs(batch, params)

        trainer.train_step, trainer.logprobs = spy_step, spy_logprobs
        trainer.iteration(0)
        assert c.train.ppo_epochs == 1  # so one log-prob chunk per mini-batch means: the reference only
        assert batches and len(passes) == len(batches)
        for batch in batches:
            mask = batch["loss_mask"] > 0
            assert mask.any()
            model_batch = {k: batch[k] for k in (*MODEL_KEYS, "loss_mask")}
            recomputed = logprobs(model_batch, params0)
            np.testing.assert_allclose(batch["old_logprobs"][mask], recomputed[mask], atol=2e-4)
    finally:
        trainer.close()


def cli(workdir: Path, *overrides: str) -> list[str]:
    small = [
        "--config.model.init.hidden_size=32", "--config.model.init.intermediate_size=64",
        "--config.model.init.num_hidden_layers=1", "--config.model.init.num_attention_heads=2",
        "--config.model.init.num_key_value_heads=1", "--config.tokenizer.train_vocab_size=400",
        "--config.env.gen.n_train=4", "--config.env.gen.n_eval=2", "--config.env.alfworld.num_receptacles=4",
        "--config.env.alfworld.num_objects=2", "--config.env.max_steps=3", "--config.rollout.tasks_per_iter=2",
        "--config.rollout.group_size=2", "--config.rollout.max_response_tokens=8", "--config.wia.max_tokens=8",
        "--config.warmstart.steps=2", "--config.warmstart.batch_rows=4", "--config.warmstart.n_games=4",
        "--config.train.mini_batch_rows=8", "--config.train.micro_batch_rows=4",
    ]  # fmt: skip
    return [
        sys.executable,
        "-m",
        "roleagent_jax.main",
        f"--config={ROOT / 'configs' / 'demo.py'}",
        f"--config.workdir={workdir}",
        *small,
        *overrides,
    ]


def env():
    e = dict(os.environ)
    e.pop("XLA_FLAGS", None)  # one CPU device, as a user's laptop
    return e


def run_cmd(args: list[str], timeout: float | None = None) -> subprocess.CompletedProcess:
    """A command from the repository root on one CPU device, output captured as text."""
    return subprocess.run(args, capture_output=True, text=True, cwd=ROOT, env=env(), timeout=timeout)


@pytest.mark.slow  # a whole run end to end (40-140 s on 2 cores): `pytest -m slow`
def test_demo_cli_end_to_end(tmp_path):
    """The shortened demo: warm start, evaluation before/after, one RL iteration, report, HF export."""
    steps = "--config.warmstart.steps=102"  # the report keeps every 2nd loss: the last must still be there
    out = run_cmd(cli(tmp_path / "run", "--config.iterations=1", "--config.log.progress=false", steps), 900)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert set(summary["eval"]) == {"before", "after"}
    assert set(summary["eval"]["after"]) == {"gen_seen", "gen_unseen"}
    assert "success before -> after RL" in out.stdout
    report = Path(summary["report"])
    assert report.exists() and (report.parent / "before_after.png").exists()
    printed = re.search(r"warm start: \d+ examples, loss (\S+) -> (\S+)", out.stdout).groups()
    assert f"Warm start loss: {printed[0]} -> {printed[1]}" in report.read_text()  # the same last loss
    assert (Path(summary["final_model"]) / "model.safetensors").exists()
    assert list((tmp_path / "run" / "logs" / "tb").glob("events.out.tfevents.*"))
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(summary["final_model"])  # safetensors out, loadable by HF

    # The trained checkpoint plays real ALFWorld games through the evaluate command.
    from conftest import shared_alfworld_dir

    data = shared_alfworld_dir()
    split = ["--split=valid_seen", f"--data={data}"] if data else ["--split=gen_unseen", "--gen-n=3"]
    ev = run_cmd(
        [
            sys.executable,
            "-m",
            "roleagent_jax.evaluate",
            f"--checkpoint={summary['final_model']}",
            *split,
            "--limit=3",
            "--max-steps=3",
            f"--gen-dir={tmp_path / 'g'}",
        ],
        600,
    )
    assert ev.returncode == 0, ev.stderr[-3000:]
    result = json.loads(ev.stdout.strip().splitlines()[-1])
    assert result["n"] == 3 and 0.0 <= result["success"] <= 1.0 and result["per_type"]


def test_cli_rejects_bad_values(tmp_path):
    out = run_cmd(cli(tmp_path / "bad", "--config.advantage.mode=zscore"), 300)
    assert out.returncode != 0 and "advantage.mode='zscore'" in out.stderr
    out = run_cmd(cli(tmp_path / "bad", "--config.no_such_key=1"), 300)
    assert out.returncode != 0 and "no_such_key" in out.stderr
    out = run_cmd(cli(tmp_path / "bad", "--config.env.name=nope"), 300)
    assert out.returncode == 2 and "--config.env.name='nope': must be one of alfworld" in out.stderr


@pytest.mark.slow
def test_killed_run_resumes_exactly(tmp_path):
    """SIGKILL a real training process after its second checkpoint; the resumed run ends where an
    uninterrupted one does."""
    args = [
        "--config.iterations=4",
        "--config.checkpoint.every=1",
        "--config.env.eval_splits=()",
        "--config.log.progress=false",
        "--config.log.tensorboard=false",
    ]
    ref = run_cmd(cli(tmp_path / "ref", *args))
    assert ref.returncode == 0, ref.stderr[-3000:]
    proc = subprocess.Popen(
        cli(tmp_path / "killed", *args),
        cwd=ROOT,
        env=env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    ckpt = tmp_path / "killed" / "checkpoints"
    deadline = time.time() + 900
    while time.time() < deadline and not (ckpt / "2").is_dir():
        time.sleep(0.2)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    resumed = run_cmd(cli(tmp_path / "killed", *args))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stdout
    a = (tmp_path / "ref" / "hf_final" / "model.safetensors").read_bytes()
    b = (tmp_path / "killed" / "hf_final" / "model.safetensors").read_bytes()
    assert a == b


def test_anchor_similarity_config_merges_near_identical_step_groups():
    """advantage.anchor_similarity=1 keys step groups by exact anchors; below 1 near-identical anchors
    of one task group share a key (the reference's optional similarity clustering)."""
    from roleagent_jax.rl.advantages import anchor_keys, hash_anchor
    from roleagent_jax.types import Row

    texts = ["You arrive at drawer 1.", "You arrive at drawer 1!", "You arrive at drawer 1.", "x"]
    rows = [Row([], [], [], i, 0, 0, 0, hash_anchor(t), 0.0, True, False, t) for i, t in enumerate(texts)]
    assert anchor_keys(rows, 1.0, "observation").tolist() == [hash_anchor(t) for t in texts]
    merged = anchor_keys(rows, 0.9, "observation")
    assert merged[0] == merged[1] == merged[2] != merged[3]


def test_trainer_and_evaluate_generate_the_same_games_by_default(tmp_path):
    """With no room settings given, a training run and `python -m roleagent_jax.evaluate` make the same
    games from the same seed: both take the family's own defaults."""
    from roleagent_jax.config import family_options
    from roleagent_jax.envs import get_family
    from roleagent_jax.evaluation import cli
    from roleagent_jax.run.setup import make_task_pool

    c = load_config("base")
    c.env.gen.n_train, c.log.progress = 3, False
    family = get_family("alfworld")
    pool = make_task_pool(
        c, family.configured(family_options(c, family)), "gen_seen", tmp_path / "run", "train"
    )
    cli.main(["--split=gen_seen", "--gen-n=3", "--gen-seed=0", f"--gen-dir={tmp_path / 'eval'}",
                   "--num-workers=1", "--limit=1", "--quiet"])  # fmt: skip

    def games(folder: Path) -> dict[str, bytes]:  # every file the generator wrote, by relative path
        return {str(f.relative_to(folder)): f.read_bytes() for f in folder.rglob("*") if f.is_file()}

    trained = games(tmp_path / "run" / "games" / "train_gen_seen")
    assert len(pool) == 3 and sum(name.endswith("game.tw-pddl") for name in trained) == 3
    assert trained == games(tmp_path / "eval")


def test_a_start_refused_while_building_leaves_no_workdir(tmp_path):
    """A split that cannot be built (a real QA set without a retriever) stops a new run before the warm
    start, and the workdir it had begun is gone: the next try starts clean."""
    from roleagent_jax.run.trainer import Trainer

    c = shrunk(load_config("search_qa_demo"), tmp_path / "run")
    c.env.gen.n_train, c.env.eval_splits = 4, ("nq",)
    with pytest.raises(ValueError, match="needs a retriever"):
        Trainer(c)
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_levers_run_and_the_selection_state_survives_a_resume(tmp_path):
    """Learnability selection, dropped uniform and flat groups and an upper clip of its own, in the loop: 2 + 2
    iterations equal 4 (the selection's counts come back from the checkpoint), and each iteration logs
    its signal shares."""
    from roleagent_jax.run.trainer import Trainer

    def config(name, iterations):
        c = tiny_config(tmp_path / name, iterations)
        c.aiw.selection, c.train.drop_flat_groups, c.loss.clip_eps_high = "learnability", True, 0.28
        c.train.drop_uniform_groups = True
        return c

    full_state, full_host, full_sampler = run_trainer(config("full", 4))
    run_trainer(config("split", 2))
    split_state, split_host, split_sampler = run_trainer(config("split", 4))
    assert split_host["sampled_tasks"] == full_host["sampled_tasks"]
    assert split_sampler["plays"] == full_sampler["plays"] and sum(full_sampler["plays"]) > 0
    assert split_sampler["wins"] == full_sampler["wins"]
    assert_same_params(split_state.params, full_state.params)
    trainer = Trainer(config("split", 4))
    try:
        metrics = trainer.iteration(4)
    finally:
        trainer.close()
    assert 0.0 <= metrics["train/uniform_groups"] <= 1.0 and 0.0 <= metrics["train/zero_step_groups"] <= 1.0
    assert "train/dropped_rows" in metrics
