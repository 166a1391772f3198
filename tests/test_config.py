"""Config files load, validate, and reject bad values with a message naming the key."""

from pathlib import Path

import pytest
from conftest import load_config as load

from roleagent_jax.config import apply_algo, validate

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", ["base", "alfworld", "demo"])
def test_config_files_validate(name):
    c = load(name)
    c.model.path = ""
    # the paper config refuses to start without a model and its data (tests/test_paper_config.py)
    c.model.required = c.env.data_required = False
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


@pytest.mark.parametrize(
    "name, path, message",
    [
        ("base", "/nonexistent/model", "directory not found"),
        ("search_qa", "", "--config.model.path is empty"),
    ],
)
def test_a_missing_model_is_named(name, path, message):
    """A model directory that is not there, or none where the config needs one (the paper's), fails fast."""
    c = load(name)
    c.model.path = path
    with pytest.raises(ValueError, match=message):
        validate(c)


def test_algo_presets():
    c = load("base")
    c.algo = "grpo"
    g = apply_algo(c)
    assert not g.advantage.step_level and g.wia.mode == "off" and not g.aiw.enabled
    c.algo = "roleagent"
    r = apply_algo(c)
    assert r.advantage.step_level and r.wia.mode == "separate" and r.aiw.enabled
    for algo in ("grpo", "gigpo", "wia", "aiw", "roleagent"):  # each preset turns on what its name says
        c.algo = algo
        p = apply_algo(c)
        assert p.advantage.step_level == (algo != "grpo")
        assert (p.wia.mode == "separate") == (algo in ("wia", "roleagent"))
        assert p.aiw.enabled == (algo in ("aiw", "roleagent"))


def test_each_familys_options_are_its_own_defaults():
    """The trainer and the standalone evaluator (which reads the family) generate the same rooms."""
    from roleagent_jax.config import family_options
    from roleagent_jax.envs import get_family, registered

    c = load("base")
    for name in registered():
        family = get_family(name)
        assert family_options(c, family) == dict(family.gen_options), name
    assert family_options(c, get_family("alfworld"))["num_receptacles"] == (4, 6)


def test_a_room_size_takes_an_int_or_a_range_in_a_config_file():
    from roleagent_jax.config import family_options
    from roleagent_jax.envs import get_family

    c = load("base")
    c.env.alfworld.num_receptacles = 5
    c.env.alfworld.num_objects = (1, 3)
    options = family_options(validate(c), get_family("alfworld"))
    assert (options["num_receptacles"], options["num_objects"]) == (5, (1, 3))
    c.env.alfworld.num_objects = "many"
    with pytest.raises(
        ValueError, match=r"--config.env.alfworld.num_objects='many': must be an int or a pair"
    ):
        validate(c)


@pytest.mark.parametrize(
    ("name", "override", "key", "expected"),
    [
        ("base", "--config.env.alfworld.num_receptacles=6", "env.alfworld.num_receptacles", 6),
        ("base", "--config.env.alfworld.num_receptacles=3,5", "env.alfworld.num_receptacles", (3, 5)),
        ("demo", "--config.env.alfworld.num_receptacles=6", "env.alfworld.num_receptacles", 6),
        ("base", "--config.env.eval_splits=gen_seen", "env.eval_splits", ("gen_seen",)),
        ("base", "--config.lora.targets=('q','v')", "lora.targets", ("q", "v")),
        ("webshop_demo", "--config.env.webshop.protocol=webshop", "env.webshop.protocol", "webshop"),
        ("base", "--config.rollout.group_size=4", "rollout.group_size", 4),
    ],
)
def test_command_line_overrides(name, override, key, expected, monkeypatch):
    from absl import flags
    from ml_collections import config_flags

    argv = ["main", f"--config={REPO / 'configs' / f'{name}.py'}", override]
    monkeypatch.setattr("sys.argv", argv)  # ml_collections defines the override flags it finds there
    values = flags.FlagValues()
    holder = config_flags.DEFINE_config_file("config", None, "", flag_values=values, lock_config=True)
    values(argv)
    node = holder.value
    for part in key.split("."):
        node = node[part]
    assert node == expected and isinstance(node, type(expected))


def test_group_relative_algorithms_need_two_rollouts_per_task():
    c = load("demo")
    for algo in ("grpo", "gigpo", "wia", "aiw", "roleagent"):
        c.algo, c.rollout.group_size = algo, 1
        with pytest.raises(ValueError, match=r"--config.rollout.group_size=1: must be >= 2 .* cannot learn"):
            validate(c)


def test_the_mesh_must_fit_the_devices():
    c = load("demo")
    c.mesh.data, c.mesh.fsdp = 3, 1
    with pytest.raises(ValueError, match=r"--config.mesh: mesh data=3 x fsdp=1 x tensor=1 needs 3 devices"):
        validate(c)


def test_wia_with_no_predicted_step_is_refused_unless_wia_is_off():
    c = load("demo")
    c.wia.fraction = 0.0
    with pytest.raises(ValueError, match=r"--config.wia.fraction=0.0: WIA predicts no step"):
        validate(c)
    c.algo = "gigpo"  # no WIA: the share is not read
    validate(c)


def test_every_declared_key_is_in_the_built_config_once():
    from roleagent_jax.config import CONFIG

    c = load("base")
    names = [dotted for dotted, _ in CONFIG.keys()]
    assert len(names) == len(set(names))
    for dotted in names:
        node = c
        for part in dotted.split("."):
            node = node[part]


def test_a_renamed_key_is_refused_naming_the_new_one(monkeypatch, capsys):
    c = load("demo")
    with c.unlocked():
        c.wia.backend = "difflib"  # a config file written before wia.similarity
    with pytest.raises(ValueError, match=r"--config.wia.backend was renamed: set --config.wia.similarity"):
        validate(c)
    from roleagent_jax import main

    argv = ["main", f"--config={REPO / 'configs' / 'demo.py'}", "--config.wia.backend=difflib"]
    monkeypatch.setattr("sys.argv", argv)
    with pytest.raises(SystemExit):
        main.parse_flags(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].endswith(
        ": --config.wia.backend was renamed: set --config.wia.similarity instead"
    )


def test_the_rollout_backend_is_a_declared_key():
    from roleagent_jax.backends import BACKENDS
    from roleagent_jax.config import CONFIG

    c = load("demo")
    assert c.rollout.backend == CONFIG.default("rollout.backend") == "jax" and "jax" in BACKENDS
    c.rollout.backend = "vllm"
    with pytest.raises(ValueError, match=r"--config.rollout.backend='vllm': must be one of jax"):
        validate(c)
