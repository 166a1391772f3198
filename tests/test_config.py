"""Config files load, validate, and reject bad values with a message naming the key."""

import importlib.util
from pathlib import Path

import pytest

from roleagent_jax.config import apply_algo, validate

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def load(name):
    spec = importlib.util.spec_from_file_location(name, CONFIGS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


@pytest.mark.parametrize("name", ["base", "alfworld", "demo"])
def test_config_files_validate(name):
    c = load(name)
    c.model.path = ""
    validate(c)


def test_bad_values_are_named():
    c = load("base")
    c.advantage.mode = "zscore"
    c.train.micro_batch_rows = 7
    c.rollout.group_size = 0
    with pytest.raises(ValueError) as err:
        validate(c)
    msg = str(err.value)
    assert "advantage.mode='zscore'" in msg and "mean_std_norm" in msg
    assert "multiple of micro_batch_rows=7" in msg
    assert "rollout.group_size=0" in msg


def test_unknown_environment_names_the_known_families():
    c = load("base")
    c.env.name = "nope"
    with pytest.raises(ValueError, match=r"env.name='nope': must be one of alfworld"):
        validate(c)


def test_own_warmstart_games_need_a_count():
    c = load("base")
    c.warmstart.own_games = True
    c.warmstart.n_games = 0
    with pytest.raises(ValueError, match="own_games=True needs --config.warmstart.n_games >= 1"):
        validate(c)


def test_missing_model_dir():
    c = load("base")
    c.model.path = "/nonexistent/model"
    with pytest.raises(ValueError, match="directory not found"):
        validate(c)


def test_algo_presets():
    c = load("base")
    c.algo = "grpo"
    g = apply_algo(c)
    assert not g.advantage.step_level and g.wia.mode == "off" and not g.aiw.enabled
    c.algo = "roleagent"
    r = apply_algo(c)
    assert r.advantage.step_level and r.wia.mode == "separate" and r.aiw.enabled
