"""A run's exported models evaluate as the run evaluated them: `evaluate --checkpoint=DIR --split=S`
alone plays the same tasks with the same prompts and decoding, for each family's demo config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import load_config, shrunk

# Each demo shrunk to seconds: few, small games, a short warm start, one RL iteration, greedy evaluation.
SIZES = {
    "demo": {"env.max_steps": 4},
    "webshop_demo": {"env.webshop.n_products": 50, "env.max_steps": 3, "env.num_workers": 1},
    "search_qa_demo": {"env.search_qa.kb_people": 40, "env.search_qa.kb_works": 40},
}


def finished_run(name: str, workdir: Path, greedy: bool = True) -> dict:
    """A tiny run of configs/<name>.py through the trainer; its summary."""
    from roleagent_jax.run.trainer import Trainer

    c = shrunk(load_config(name), workdir)
    c.env.gen.n_train, c.env.gen.n_eval, c.warmstart.n_games = 4, 3, 4
    c.warmstart.steps = 6
    c.eval.greedy = greedy
    for key, value in SIZES[name].items():
        parent, _, leaf = key.rpartition(".")
        node = c
        for part in parent.split("."):
            node = node[part]
        node[leaf] = value
    trainer = Trainer(c)
    try:
        return trainer.run()
    finally:
        trainer.close()


def evaluate_checkpoint(model_dir: Path, split: str, *flags: str) -> dict:
    from roleagent_jax.evaluation.cli import main

    return main([f"--checkpoint={model_dir}", f"--split={split}", "--quiet", *flags])


@pytest.fixture
def played(monkeypatch) -> list:
    """Every evaluation's episodes, as (task, [(observation, response), ...]) in task order, recorded
    where the trainer and the command summarise them."""
    from roleagent_jax.evaluation import cli
    from roleagent_jax.run import evaluation_phase

    record, summarize = [], cli.summarize

    def recording(split, trajs, *args, **kwargs):
        episodes = [(t.task_id, [(s.observation, s.response) for s in t.steps]) for t in trajs]
        record.append(sorted(episodes, key=lambda e: e[0]))
        return summarize(split, trajs, *args, **kwargs)

    monkeypatch.setattr(cli, "summarize", recording)
    monkeypatch.setattr(evaluation_phase, "summarize", recording)
    return record


def replays(name: str, workdir: Path, played: list, greedy: bool = True) -> None:
    """hf_warmstart replays the run's evaluation before RL, hf_final the one after: the same summary and
    the same responses to the same observations in every episode."""
    summary = finished_run(name, workdir, greedy)
    runs_own = {("before", s): played[i] for i, s in enumerate(summary["eval"]["before"])}
    runs_own |= {("after", s): played[len(runs_own) + i] for i, s in enumerate(summary["eval"]["after"])}
    workdir = Path(summary["workdir"])
    for when, model in (("before", "hf_warmstart"), ("after", "hf_final")):
        for split, expected in summary["eval"][when].items():
            got = evaluate_checkpoint(workdir / model, split)
            assert played[-1] == runs_own[when, split], (name, when, split)
            assert got == json.loads(json.dumps(expected)), (name, when, split)


@pytest.mark.slow  # a tiny run per family, then two evaluations: 1.5-3 minutes each on 2 cores
@pytest.mark.parametrize("name", ["search_qa_demo", "demo", "webshop_demo"])
def test_a_checkpoint_replays_its_runs_evaluation(tmp_path, name, played, capsys):
    """The same games, episode length, family options, prompts and (greedy) decoding: every response and
    figure the same."""
    replays(name, tmp_path / "run", played)
    settings = json.loads((tmp_path / "run" / "hf_final" / "roleagent.json").read_text())
    assert settings["env"]["name"] == load_config(name).env.name and settings["eval"]["greedy"] is True
    assert settings["env"]["gen_n"] == 3 and settings["env"]["gen_seed"] == 1000
    assert "as the run evaluated" not in capsys.readouterr().err  # --quiet


@pytest.mark.slow  # a tiny run, then an evaluation: ~1.5 minutes on 2 cores
def test_a_flag_given_overrides_the_runs_setting_and_says_so(tmp_path, capsys):
    summary = finished_run("search_qa_demo", tmp_path / "run")
    final = Path(summary["final_model"])
    got = evaluate_checkpoint(final, "gen_test", "--gen-n=2", "--max-steps=1", "--mix=single_hop=1")
    assert got["n"] == 2 and got["mean_steps"] <= 1 and set(got["count_per_type"]) == {"single_hop"}
    err = capsys.readouterr().err
    assert "the command line overrides the run's settings" in err
    assert "--gen-n=2 (the run's: 3)" in err and "--max-steps=1 (the run's: 4)" in err and "--mix=" in err


def test_the_settings_file_carries_what_the_run_trained_with():
    from roleagent_jax.config import family_options
    from roleagent_jax.envs import get_family
    from roleagent_jax.evaluation.trained_settings import run_settings

    c = load_config("search_qa_demo")
    c.rollout.max_rows_per_call = 24
    settings = run_settings(c, family_options(c, get_family("search_qa")))
    assert settings["max_rows_per_call"] == 24  # the policy that replays it samples in calls this size
    env = settings["env"]
    assert env["options"]["mix"] == {"single_hop": 0.4, "bridge": 0.4, "comparison": 0.2}
    assert env["options"]["prompt"] == "compact" and env["options"]["held_out"] == "questions"
    assert env["max_steps"] == c.env.max_steps and env["gen_n"] == 96 and env["eval_splits"] == ["gen_test"]
    assert settings["eval"] == {"greedy": False, "temperature": 0.4, "limit": 0, "seed": 17, "batch_size": 0}
    assert settings["history_k"] == 2 and settings["max_response_tokens"] == 24


def test_an_older_settings_file_keeps_the_flags_defaults():
    """A roleagent.json of the prompt settings only (written before the run's settings were) changes
    nothing but the prompt."""
    from roleagent_jax.envs import get_family
    from roleagent_jax.evaluation.cli import apply_defaults, build_parser

    family = get_family("alfworld")
    args = build_parser(family).parse_args(["--split=gen_seen"])
    options, notes = apply_defaults(args, {"history_k": 1}, family)
    assert (args.max_steps, args.gen_n, args.gen_seed, args.batch_size, args.temperature) == (
        50,
        24,
        0,
        32,
        0.4,
    )
    assert options == {} and notes == []


@pytest.mark.parametrize(
    "text,value",
    [
        ("single_hop=0.4,bridge=0.4,comparison=0.2", {"single_hop": 0.4, "bridge": 0.4, "comparison": 0.2}),
        ('{"single_hop": 0.5, "bridge": 0.5}', {"single_hop": 0.5, "bridge": 0.5}),
        ("{'single_hop': 1}", {"single_hop": 1}),
        ("4,6", (4, 6)),
        ("compact", "compact"),
    ],
)
def test_a_mapping_option_is_given_on_the_command_line(text, value):
    from roleagent_jax.envs import get_family
    from roleagent_jax.evaluation.cli import build_parser

    args = build_parser(get_family("search_qa")).parse_args([f"--mix={text}"])
    assert args.option_mix == value
