"""Bad input and accidents, as a careful user or an adversarial tester would cause them.

Each test is one probe: a restart that must not destroy a run, a corrupt checkpoint, a setting out of
range, a broken model directory, a duplicated metrics step. Every failure must name the key, file or
value in one line; nothing may be lost quietly.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import load_config

ROOT = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------------------------------
# checkpoints: a restart without resume, saves that do not happen, unreadable steps


def small_state(offset: float = 0.0) -> dict:
    return {"w": jnp.arange(4000.0).reshape(40, 100) + offset, "step": jnp.int32(offset)}


def write_steps(directory: Path, steps=(1, 2)) -> None:
    from roleagent_jax.run.checkpointing import Checkpointer

    ckpt = Checkpointer(directory, keep=5)
    for s in steps:
        ckpt.save(s, small_state(s), {"iteration": s})
    ckpt.close()


def test_fresh_start_refuses_to_run_over_an_earlier_runs_checkpoints(tmp_path):
    """resume=False in a workdir with checkpoints stops before touching anything (it used to delete the
    failure memory and then never checkpoint, as orbax declined the existing steps)."""
    from test_trainer import tiny_config

    from roleagent_jax.run.checkpointing import CheckpointError
    from roleagent_jax.run.trainer import Trainer

    workdir = tmp_path / "run"
    write_steps(workdir / "checkpoints")
    (workdir / "failure_memory.jsonl").write_text('{"task": 1}\n')
    c = tiny_config(workdir, 1)
    c.checkpoint.resume = False
    with pytest.raises(CheckpointError) as err:
        Trainer(c)
    message = str(err.value)
    assert "\n" not in message and "--config.workdir" in message
    assert "--config.checkpoint.overwrite=True" in message and "steps 1, 2" in message
    assert (workdir / "failure_memory.jsonl").read_text() == '{"task": 1}\n'
    assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == ["1", "2"]


def test_overwrite_moves_the_earlier_run_aside(tmp_path):
    from roleagent_jax.run.checkpointing import claim_workdir, saved_steps

    workdir = tmp_path / "run"
    write_steps(workdir / "checkpoints")
    assert claim_workdir(workdir, resume=True, overwrite=False) is None  # resuming is never refused
    aside = claim_workdir(workdir, resume=False, overwrite=True)
    assert not workdir.exists() and aside.parent == tmp_path and aside.name.startswith("run.replaced-")
    assert saved_steps(aside / "checkpoints") == [1, 2]


def test_overwrite_needs_resume_off():
    from roleagent_jax.config import validate

    c = base_config()
    c.checkpoint.overwrite = True
    with pytest.raises(ValueError, match=r"overwrite=True .* needs --config.checkpoint.resume=False"):
        validate(c)


def test_a_save_orbax_declines_raises(tmp_path):
    from roleagent_jax.run.checkpointing import Checkpointer, CheckpointError

    ckpt = Checkpointer(tmp_path / "ckpt")
    ckpt.save(2, small_state(2), {"iteration": 2})
    with pytest.raises(CheckpointError, match="step 2 already exists"):
        ckpt.save(2, small_state(3), {"iteration": 2})
    with pytest.raises(CheckpointError, match="declined to save checkpoint step 1"):
        ckpt.save(1, small_state(1), {"iteration": 1})
    ckpt.close()


def test_a_save_that_never_lands_raises(tmp_path, monkeypatch):
    """orbax only logs a failed background write; the step must then be missing loudly."""
    from roleagent_jax.run.checkpointing import Checkpointer, CheckpointError

    ckpt = Checkpointer(tmp_path / "ckpt")
    monkeypatch.setattr(ckpt._manager, "save", lambda step, args: True)  # reports success, writes nothing
    ckpt.save(1, small_state(1), {"iteration": 1})
    with pytest.raises(CheckpointError, match="step 1 was not written"):
        ckpt.wait()
    monkeypatch.undo()
    ckpt.close()


def _truncate_arrays(step_dir: Path) -> None:
    biggest = max((step_dir / "state").rglob("d/*"), key=lambda p: p.stat().st_size)
    os.truncate(biggest, 100)


def _delete_array_metadata(step_dir: Path) -> None:
    (step_dir / "state" / "manifest.ocdbt").unlink()


def _garbage_host_json(step_dir: Path) -> None:
    (step_dir / "host" / "metadata").write_text("{not json")


@pytest.mark.parametrize(
    "corrupt,where,why",
    [
        (_truncate_arrays, "state", "OUT_OF_RANGE"),
        (_delete_array_metadata, "state", "NOT_FOUND"),
        (_garbage_host_json, "host", "Expecting property name"),
    ],
)
def test_restore_falls_back_past_an_unreadable_step(tmp_path, capfd, corrupt, where, why):
    from roleagent_jax.run.checkpointing import Checkpointer

    directory = tmp_path / "ckpt"
    write_steps(directory)
    corrupt(directory / "2")
    ckpt = Checkpointer(directory)
    state, host = ckpt.restore(small_state())
    assert host == {"iteration": 1}
    np.testing.assert_array_equal(state["w"], small_state(1)["w"])
    err = capfd.readouterr().err
    assert f"step 2 ({directory / '2' / where}): " in err and why in err
    assert len([line for line in err.splitlines() if line.startswith("unreadable checkpoint step 2")]) == 1
    ckpt.save(2, small_state(2), {"iteration": 2})  # the resumed run can write its next step again
    ckpt.close()
    assert [p.name.split("-")[0] for p in sorted(directory.iterdir())] == ["1", "2", "2.unreadable"]


def test_no_readable_step_names_the_folder_to_delete(tmp_path):
    from roleagent_jax.run.checkpointing import Checkpointer, CheckpointError

    directory = tmp_path / "ckpt"
    write_steps(directory)
    _truncate_arrays(directory / "2")
    _garbage_host_json(directory / "1")
    ckpt = Checkpointer(directory)
    with pytest.raises(CheckpointError) as err:
        ckpt.restore(small_state())
    message = str(err.value)
    assert "\n" not in message and "step 2 (" in message and "step 1 (" in message
    assert message.endswith(f"delete {directory} to start this run afresh")
    ckpt.close()


@pytest.mark.slow
def test_resumed_runs_store_the_final_evaluation_and_log_each_step_once(tmp_path, monkeypatch):
    """checkpoint.every=1: the last iteration's step exists before the final evaluation, which must still
    be stored (a resumed finished run then neither trains nor evaluates again); a run killed between
    logging a step and checkpointing it logs that step once after resuming."""
    from test_trainer import tiny_config

    from roleagent_jax.run.trainer import Trainer

    evaluated_at = []

    def stamp(self, split, limit=0):
        evaluated_at.append(int(self.host["iteration"]))
        return {"per_type": {}, "success": float(self.host["iteration"])}

    monkeypatch.setattr(Trainer, "evaluate", stamp)

    def run():
        c = tiny_config(tmp_path, 2)
        c.env.eval_splits, c.eval.before, c.checkpoint.every = ("gen_seen",), False, 1
        trainer = Trainer(c)
        try:
            return trainer.run()["eval"]["after"]["gen_seen"]["success"]
        finally:
            trainer.close()

    def logged_steps():
        return [
            json.loads(line)["step"]
            for line in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()
        ]

    assert run() == 2.0 and evaluated_at == [2] and logged_steps() == [1, 2]
    import shutil

    shutil.rmtree(tmp_path / "checkpoints" / "2")  # killed after logging step 2, before its checkpoint
    assert run() == 2.0 and evaluated_at == [2, 2] and logged_steps() == [1, 2]
    with monkeypatch.context() as m:
        m.setattr(Trainer, "iteration", lambda self, it: pytest.fail("a finished run trained again"))
        assert run() == 2.0 and evaluated_at == [2, 2]  # the stored evaluation
    assert logged_steps() == [1, 2]


# ----------------------------------------------------------------------------------------------------
# metrics: a resumed run never holds a step twice


def _tb_purge_steps(tb_dir: Path) -> list[int]:
    """Steps of TensorBoard's purge markers (a SessionLog START event) in the event files."""
    from tensorboardX.proto.event_pb2 import Event

    steps = []
    for path in sorted(tb_dir.glob("events.out.tfevents.*")):
        data = path.read_bytes()
        pos = 0
        while pos < len(data):
            (length,) = struct.unpack("<Q", data[pos : pos + 8])
            event = Event.FromString(data[pos + 12 : pos + 12 + length])
            if event.HasField("session_log") and event.session_log.status == event.session_log.START:
                steps.append(event.step)
            pos += 12 + length + 4
    return steps


def test_metrics_are_truncated_to_the_restored_step(tmp_path):
    from roleagent_jax.run.metrics import MetricLogger

    first = MetricLogger(tmp_path, tensorboard=True)
    for step in (1, 2, 3, 4):
        first.log(step, {"x": float(step)}, echo=False)
    first.close()
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 5, "x"')  # a line a kill cut short
    history = [{"step": s, "x": float(s)} for s in (1, 2, 3)]  # what the step-2 checkpoint may carry
    resumed = MetricLogger(tmp_path, tensorboard=True, history=history)
    resumed.resume_at(2)
    assert [h["step"] for h in resumed.history] == [1, 2]
    resumed.log(3, {"x": 30.0}, echo=False)
    resumed.close()
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["x"]) for r in lines] == [(1, 1.0), (2, 2.0), (3, 30.0)]
    assert _tb_purge_steps(tmp_path / "tb") == [3]  # TensorBoard drops the first run's steps >= 3


# ----------------------------------------------------------------------------------------------------
# settings: checked at start-up, each named


def base_config():
    return load_config("base")


@pytest.mark.parametrize(
    "key,value",
    [
        ("eval.temperature", -0.5),
        ("eval.limit", -1),
        ("warmstart.lr", 0.0),
        ("warmstart.batch_rows", 0),
        ("optim.warmup_steps", -1),
        ("warmstart.n_games", -1),
        ("warmstart.predictor_fraction", 1.5),
        ("warmstart.long_repeat", 0),
        ("aiw.max_tokens", 0),
        ("tokenizer.train_vocab_size", 100),
        ("env.gen.n_train", 0),
        ("env.gen.n_eval", 0),
        ("seed", -1),
        ("model.dtype", "float8"),
        ("model.param_dtype", "int8"),
    ],
)
def test_every_setting_is_checked_at_startup(key, value):
    from roleagent_jax.config import validate

    c = base_config()
    *parents, name = key.split(".")
    node = c
    for part in parents:
        node = node[part]
    node[name] = value
    with pytest.raises(ValueError) as err:
        validate(c)
    assert f"--config.{key}={value!r}" in str(err.value)


def test_the_familys_own_options_are_checked_at_startup():
    from roleagent_jax.config import validate

    c = base_config()
    c.env.alfworld.num_receptacles = 1
    with pytest.raises(ValueError, match=r"--config.env.alfworld: num_receptacles .* got 1"):
        validate(c)


def test_the_random_models_shape_is_checked_at_startup():
    from roleagent_jax.config import validate

    c = base_config()
    c.model.init.num_attention_heads = 3  # 128 is not divisible by 3
    with pytest.raises(ValueError, match=r"--config.model.init: .*hidden_size 128 .* num_attention_heads 3"):
        validate(c)


def test_tilde_is_expanded_in_paths(model_dir, tokenizer_dir, tmp_path, monkeypatch):
    import shutil

    from roleagent_jax.config import PATH_KEYS, validate

    monkeypatch.setenv("HOME", str(tmp_path))
    shutil.copytree(model_dir, tmp_path / "model")
    shutil.copytree(tokenizer_dir, tmp_path / "tok")
    c = base_config()
    c.workdir, c.model.path, c.tokenizer.path = "~/run", "~/model", "~/tok"
    c.env.data_dir, c.env.gen.dir = "~/data", "~/games"
    out = validate(c)
    assert out.workdir == str(tmp_path / "run") and out.model.path == str(tmp_path / "model")
    assert out.tokenizer.path == str(tmp_path / "tok") and out.env.data_dir == str(tmp_path / "data")
    assert out.env.gen.dir == str(tmp_path / "games") and len(PATH_KEYS) == 5


def run_module(module: str, *args: str, timeout: float) -> subprocess.CompletedProcess:
    """`python -m module args` from the repository root, without this process's XLA_FLAGS."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    command = [sys.executable, "-m", module, *args]
    return subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env, timeout=timeout)


def run_main(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return run_module("roleagent_jax.main", *args, timeout=timeout)


def assert_one_line_error(out: subprocess.CompletedProcess, *needles: str) -> None:
    assert out.returncode == 2, out.stderr[-2000:]
    assert "Traceback" not in out.stderr, out.stderr[-2000:]
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), out.stderr[-2000:]
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_cli_unknown_key_is_one_line():
    out = run_main("--config=configs/demo.py", "--config.no_such_key=1")
    assert_one_line_error(out, "--config.no_such_key", "no such key")


def test_cli_missing_config_file_is_one_line():
    out = run_main("--config=configs/nope.py")
    assert_one_line_error(out, "configs/nope.py")


def test_cli_bad_value_is_one_line_and_debug_keeps_the_traceback(tmp_path):
    args = ["--config=configs/demo.py", f"--config.workdir={tmp_path}", "--config.eval.limit=-1"]
    assert_one_line_error(run_main(*args), "--config.eval.limit=-1")
    debug = run_main(*args, "--debug")
    assert debug.returncode != 0 and "Traceback" in debug.stderr and "eval.limit" in debug.stderr


def test_cli_names_a_tilde_path_expanded(tmp_path):
    home = Path.home()
    out = run_main(
        "--config=configs/demo.py", f"--config.workdir={tmp_path}", "--config.model.path=~/no_model_here"
    )
    assert_one_line_error(out, f"--config.model.path='{home / 'no_model_here'}': directory not found")


@pytest.mark.parametrize(
    "args,needles",
    [
        (("--config=configs/webshop_demo.py", "--config.env.webshop.page_size=0"), ("--config.env.webshop",)),
        (("--config=configs/demo.py", "--config.env.alfworld.num_receptacles=1"), ("--config.env.alfworld",)),
        (("--config=configs/demo.py", "--config.env.alfworld.num_receptacles=x"), ("num_receptacles=x",)),
        (("--config=configs/demo.py", "--config.rollout.group_size=1"), ("--config.rollout.group_size=1",)),
        (("--config=configs/demo.py", "--config.algo=grpo", "--config.rollout.group_size=1"), ("cannot learn",)),
        (("--config=configs/demo.py", "--config.mesh.data=3"), ("--config.mesh", "devices")),
        (("--config=configs/demo.py", "--config.wia.fraction=0"), ("--config.wia.fraction=0.0",)),
        (
            ("--config=configs/demo.py", "--config.warmstart.own_games=True", "--config.env.train_split=train"),
            ("--config.warmstart.own_games=True", "real data"),
        ),
        (("--config=configs/demo.py", "--config.train.micro_batch_rows=48"), ("micro_batch_rows=48",)),
        (
            ("--config=configs/demo.py", "--config.lora.rank=4", "--config.lora.layers=9"),
            ("--config.lora.layers=9: the model has only 3 layers", "model.init.num_hidden_layers"),
        ),
    ],
    ids=["page-size", "rooms", "rooms-not-int", "group-1", "grpo-group-1", "mesh", "wia-fraction", "own-games",
         "micro-batch", "lora-layers"],
)  # fmt: skip
def test_cli_refusal_is_one_line_and_leaves_no_workdir(tmp_path, args, needles):
    """Every start-up refusal comes before the workdir is made: nothing generated, nothing to clean up."""
    workdir = tmp_path / "run"
    out = run_main(*args, f"--config.workdir={workdir}", timeout=120)
    assert_one_line_error(out, *needles)
    assert not workdir.exists() or not any(workdir.iterdir())


# ----------------------------------------------------------------------------------------------------
# model directories: every corruption names the file


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """A tiny Qwen2 written in Hugging Face format (config.json + model.safetensors)."""
    from flax import nnx
    from qwen2_tiny import one_layer_config

    from roleagent_jax.models import Qwen2ForCausalLM, save_pretrained

    cfg = one_layer_config(max_position_embeddings=64)
    path = tmp_path_factory.mktemp("model")
    save_pretrained(Qwen2ForCausalLM(cfg, rngs=nnx.Rngs(0)), path)
    return path


def copy_of(model_dir: Path, tmp_path: Path) -> Path:
    import shutil

    return Path(shutil.copytree(model_dir, tmp_path / "m"))


def test_intact_model_dir_loads(model_dir):
    from roleagent_jax.models import load_pretrained

    model, cfg = load_pretrained(model_dir)
    assert cfg.hidden_size == 32 and model.embed.embedding[...].shape == (64, 32)


@pytest.mark.parametrize(
    "edit,needle",
    [
        (lambda cfg: "{not json", "not valid JSON"),
        (lambda cfg: json.dumps({k: v for k, v in cfg.items() if k != "hidden_size"}), "'hidden_size' is missing"),
        (lambda cfg: json.dumps({**cfg, "num_hidden_layers": "2"}), "'num_hidden_layers' must be a positive integer"),
        (lambda cfg: json.dumps({**cfg, "rope_theta": "big"}), "'rope_theta' must be a positive number"),
        (lambda cfg: json.dumps({**cfg, "tie_word_embeddings": "yes"}), "'tie_word_embeddings' must be true or false"),
        (lambda cfg: json.dumps({**cfg, "num_attention_heads": 0}), "'num_attention_heads' must be a positive integer"),
        (lambda cfg: json.dumps([1, 2]), "expected a JSON object"),
    ],
)  # fmt: skip
def test_bad_config_json_names_file_and_field(model_dir, tmp_path, edit, needle):
    from roleagent_jax.models import load_pretrained

    path = copy_of(model_dir, tmp_path)
    config_json = path / "config.json"
    config_json.write_text(edit(json.loads(config_json.read_text())))
    with pytest.raises(ValueError) as err:
        load_pretrained(path)
    assert str(err.value).startswith(f"{config_json}: ") and needle in str(err.value)


def _rewrite_header(data: bytes, change) -> bytes:
    """The same file with its JSON header changed by ``change(header)``."""
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    change(header)
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    return struct.pack("<Q", len(blob)) + blob + data[8 + n :]


def _first_tensor(header: dict) -> dict:
    return header[next(k for k in sorted(header) if k != "__metadata__")]


@pytest.mark.parametrize(
    "corrupt,needle",
    [
        (lambda data: b"", "empty file (0 bytes)"),
        (lambda data: data[:5], "header too small"),
        (lambda data: data[: len(data) - 40], "not fully covered"),
        (lambda data: struct.pack("<Q", len(data) * 10) + data[8:], "invalid header length"),
        (lambda data: data[:8] + b"[" + data[9:], "invalid JSON"),
        (
            lambda data: _rewrite_header(
                data, lambda h: _first_tensor(h).update(data_offsets=[0, 10 * len(data)])
            ),
            "invalid shape, data type, or offset",
        ),
        (
            lambda data: _rewrite_header(
                data, lambda h: _first_tensor(h).update(shape=[s + 1 for s in _first_tensor(h)["shape"]])
            ),
            "invalid shape, data type, or offset",
        ),
        (lambda data: _rewrite_header(data, lambda h: _first_tensor(h).update(dtype="F16")), "invalid shape"),
    ],
    ids=["empty", "short", "truncated", "header-length", "header-json", "offsets", "shape", "dtype"],
)
def test_corrupt_safetensors_names_the_file(model_dir, tmp_path, corrupt, needle):
    from roleagent_jax.models import load_pretrained

    path = copy_of(model_dir, tmp_path)
    weights = path / "model.safetensors"
    weights.write_bytes(corrupt(weights.read_bytes()))
    with pytest.raises(ValueError) as err:
        load_pretrained(path)
    message = str(err.value)
    assert message.startswith(f"{weights}: ") and needle in message and "\n" not in message


def test_bad_index_names_the_file(model_dir, tmp_path):
    from roleagent_jax.models import load_pretrained

    path = copy_of(model_dir, tmp_path)
    index = path / "model.safetensors.index.json"
    index.write_text('{"weight_map": {"model.embed_tokens.weight": "model.safetensors",')
    with pytest.raises(ValueError, match=f"^{index}: not a valid index"):
        load_pretrained(path)
    index.write_text(json.dumps({"weight_map": {"not.in.the.file": "model.safetensors"}}))
    with pytest.raises(ValueError, match=f"{path / 'model.safetensors'}: tensor not.in.the.file listed in"):
        load_pretrained(path)


def test_bf16_checkpoint_loads_into_float32_master_weights(model_dir, tmp_path):
    """Whatever the checkpoint's torch_dtype, parameters default to float32 (compute may be bf16)."""
    from flax import nnx

    from roleagent_jax.models import load_pretrained, save_pretrained

    model, _ = load_pretrained(model_dir, param_dtype="bfloat16")
    save_pretrained(model, tmp_path / "bf16")
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["torch_dtype"] == "bfloat16"
    loaded, cfg = load_pretrained(tmp_path / "bf16", dtype="bfloat16")
    assert cfg.param_dtype == "float32" and cfg.dtype == "bfloat16"
    leaves = jax.tree.leaves(nnx.state(loaded, nnx.Param))
    assert leaves and all(leaf.dtype == jnp.float32 for leaf in leaves)


def test_a_corrupt_model_directory_fails_at_startup(model_dir, tmp_path):
    """validate() reads the model directory's headers, so a broken file stops the run before any game."""
    from roleagent_jax.config import validate

    path = copy_of(model_dir, tmp_path)
    (path / "model.safetensors").write_bytes(b"")
    c = base_config()
    c.model.path = str(path)
    with pytest.raises(
        ValueError, match=rf"--config.model.path='{path}': {path / 'model.safetensors'}: empty file"
    ):
        validate(c)


# ----------------------------------------------------------------------------------------------------
# split names, the evaluate CLI, data files


@pytest.mark.parametrize("key", ["env.train_split", "env.eval_splits"])
def test_unknown_split_names_fail_at_startup_with_the_known_ones(key):
    from roleagent_jax.config import validate

    c = base_config()
    if key == "env.train_split":
        c.env.train_split = "bogus"
    else:
        c.env.eval_splits = ("valid_seen", "bogus")
    with pytest.raises(ValueError) as err:
        validate(c)
    assert f"--config.{key}" in str(err.value) and "'bogus'" in str(err.value)
    assert "valid_unseen" in str(err.value) and "gen_seen" in str(err.value)


def test_a_family_without_listed_splits_accepts_any_name():
    from roleagent_jax.envs.base import Family
    from roleagent_jax.envs.registry import get_family

    assert Family().known_splits() is None
    assert "gen_seen" in get_family("alfworld").known_splits()


def test_cli_bogus_eval_split_is_one_line_before_any_work():
    out = run_main("--config=configs/demo.py", "--config.env.eval_splits=bogus", timeout=120)
    assert_one_line_error(out, "--config.env.eval_splits", "bogus", "gen_unseen")


def fake_split(root: Path, corrupt: bool = True) -> Path:
    """A real-layout ALFWorld split of two games, the second one's file truncated mid-JSON."""
    split = root / "json_2.1.1" / "valid_seen"
    grammar = 'Your task is to: put a mug in cabinet."'
    for i, name in enumerate(
        ("pick_and_place_simple-Mug-None-Cabinet-1", "pick_and_place_simple-Cup-None-Shelf-2")
    ):
        game = split / name / "trial_1" / "game.tw-pddl"
        game.parent.mkdir(parents=True)
        text = json.dumps({"solvable": True, "grammar": grammar, "pddl_problem": "x"})
        game.write_text(text[:20] if corrupt and i == 1 else text)
    return split


def test_a_corrupt_game_file_fails_naming_it_by_default(tmp_path):
    from roleagent_jax.envs.registry import get_family

    split = fake_split(tmp_path)
    bad = split / "pick_and_place_simple-Cup-None-Shelf-2" / "trial_1" / "game.tw-pddl"
    with pytest.raises(ValueError, match="corrupt game file " + str(bad).replace("/", "/")):
        get_family("alfworld").task_pool("valid_seen", data_dir=tmp_path)


def test_a_corrupt_game_file_is_skipped_with_a_warning_when_asked(tmp_path):
    from roleagent_jax.envs.registry import get_family

    fake_split(tmp_path)
    with pytest.warns(UserWarning, match="Shelf-2/trial_1/game.tw-pddl"):
        pool = get_family("alfworld").task_pool("valid_seen", data_dir=tmp_path, on_corrupt="skip")
    assert [Path(t.id).parent.parent.name for t in pool.tasks] == ["pick_and_place_simple-Mug-None-Cabinet-1"]


def test_evaluate_cli_names_a_corrupt_game_file_and_skips_it_on_request(tmp_path):
    fake_split(tmp_path)
    out = run_evaluate("--split=valid_seen", f"--data={tmp_path}", timeout=120)
    assert_one_line_error(out, "corrupt game file", "Shelf-2/trial_1/game.tw-pddl")
    from roleagent_jax.evaluation.cli import build_parser

    assert build_parser().parse_args(["--on-corrupt=skip"]).on_corrupt == "skip"


def run_evaluate(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return run_module("roleagent_jax.evaluate", *args, timeout=timeout)


@pytest.mark.parametrize("flag", ["--max-steps=0", "--limit=-1", "--batch-size=-1", "--num-workers=0"])
def test_evaluate_cli_arguments_are_checked(flag):
    out = run_evaluate("--policy=random", "--split=gen_seen", "--gen-n=1", flag)
    assert_one_line_error(out, flag)


class FailingEnvs:
    """An env pool whose second game's environment crashes at reset (as a dead worker reports it)."""

    def __init__(self, pool):
        self.pool = pool

    def reset(self, task_ids, expert=False):
        from roleagent_jax.envs.base import Observation

        return [
            Observation(
                text="", anchor="", admissible=[], done=True, failed=True, info={"error": "OSError: boom"}
            )
            if t == 1
            else Observation(text="You are in a room.", anchor="room", admissible=["look"])
            for t in task_ids
        ]

    def step(self, actions):
        from roleagent_jax.envs.base import Observation

        return {
            i: Observation(text="done", anchor="done", admissible=[], done=True, won=True) for i in actions
        }


def test_failed_games_are_listed_by_name_and_reason():
    from roleagent_jax.envs.base import Task, TaskPool
    from roleagent_jax.envs.registry import get_family
    from roleagent_jax.evaluation.panel import RandomPolicy, run_episodes, summarize

    family = get_family("alfworld")
    pool = TaskPool([Task(f"game{i}", family.task_types[0], "goal", None) for i in range(3)])
    trajs = run_episodes(RandomPolicy(family), family, FailingEnvs(pool), [0, 1, 2], max_steps=3)
    summary = summarize("s", trajs, family.task_types, pool=pool)
    assert (summary["lost"], summary["n"]) == (1, 2)  # the lost game is no loss of the policy's
    assert summary["failed_games"] == [{"task": "game1", "reason": "OSError: boom"}]
    assert summary["success"] == 1.0 and summary["wins"] == [1, None, 1]


# ----------------------------------------------------------------------------------------------------
# tokenizer directories


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> Path:
    from roleagent_jax.models.tokenizer import train_bpe_tokenizer

    path = tmp_path_factory.mktemp("tok")
    train_bpe_tokenizer(["go to the fridge", "take the apple from the table"] * 20, 300, path)
    return path


@pytest.mark.parametrize(
    "name,content,needle",
    [
        ("tokenizer.json", '{"version": "1.0", "model": ', "not valid JSON"),
        ("tokenizer.json", '{"version": "1.0", "model": {"type": "Nope"}}', "not a valid tokenizer"),
        ("tokenizer_config.json", "\x00\x01garbage", "not valid JSON"),
    ],
)
def test_a_corrupt_tokenizer_directory_names_the_file(tokenizer_dir, tmp_path, name, content, needle):
    import shutil

    from roleagent_jax.config import validate
    from roleagent_jax.models.tokenizer import load_tokenizer

    path = Path(shutil.copytree(tokenizer_dir, tmp_path / "t"))
    load_tokenizer(path)  # intact: loads
    (path / name).write_text(content)
    with pytest.raises(ValueError, match=needle) as err:
        load_tokenizer(path)
    assert str(path / name) in str(err.value) and "\n" not in str(err.value)
    c = base_config()
    c.tokenizer.path = str(path)
    with pytest.raises(ValueError, match=f"--config.tokenizer.path=.*{name}.*{needle}"):
        validate(c)


# ----------------------------------------------------------------------------------------------------
# help


@pytest.mark.parametrize(
    "module,needles",
    [
        (
            "roleagent_jax.main",
            (
                "--config",
                "workdir",
                "model.path",
                "env.eval_splits",
                "log.progress",
                "python -m roleagent_jax.config",
            ),
        ),
        ("roleagent_jax.evaluate", ("--split", "--data", "--limit", "--checkpoint", "roleagent_jax.config")),
        ("roleagent_jax.plan", ("--config", "--mesh", "--model", "--micro-batch-rows", "configs/base.py")),
    ],
)
def test_help_names_the_common_flags_and_points_to_the_docs(module, needles):
    out = subprocess.run(
        [sys.executable, "-m", module, "--help"], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    text = " ".join(out.stdout.split())
    for needle in (*needles, "README.md", "docs/"):
        assert needle in text, (module, needle)


def test_every_key_is_listed_with_its_default_and_check():
    out = subprocess.run(
        [sys.executable, "-m", "roleagent_jax.config"], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "rollout.group_size = 8  [>= 2]  rollouts per task (G)" in out.stdout
    assert "env.alfworld: num_receptacles=(4, 6), num_objects=(2, 4)" in out.stdout


# ----------------------------------------------------------------------------------------------------
# the warm start: checkpoints every N steps, a kill resumes to the same result


def test_a_killed_warm_start_resumes_to_the_same_parameters(tmp_path):
    from qwen2_tiny import Killed, char_ids, kill_after, tiny_sft_model

    from roleagent_jax.run.checkpointing import Checkpointer
    from roleagent_jax.run.warmstart import Example, run_sft

    graphdef, params = tiny_sft_model()
    examples = [Example(f"go to room {i}", f"take key {i % 5}", "agent") for i in range(12)]
    encode = char_ids

    def sft(checkpoint=None, progress=None):
        return run_sft(
            graphdef, params, examples, encode, encode, 0, steps=7, batch_rows=4, lr=1e-2, seed=3,
            progress=progress, checkpoint=checkpoint, checkpoint_every=2,
        )  # fmt: skip

    whole, whole_losses = sft()
    first = Checkpointer(tmp_path / "ws", keep=2)
    with pytest.raises(Killed):
        sft(first, kill_after(5))  # steps 1-5 ran; 2 and 4 were saved
    first.close()
    assert sorted(int(p.name) for p in (tmp_path / "ws").iterdir() if p.name.isdigit()) == [2, 4]
    second = Checkpointer(tmp_path / "ws", keep=2)
    ran = []
    resumed, losses = sft(second, lambda steps: (ran.append(s) or s for s in steps))
    second.close()
    assert ran == [4, 5, 6]  # only the steps after the last checkpoint
    assert losses == pytest.approx(whole_losses, rel=0, abs=0)
    for a, b in zip(jax.tree.leaves(resumed), jax.tree.leaves(whole), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_a_fresh_start_refuses_to_run_over_a_killed_warm_start(tmp_path):
    from roleagent_jax.run.checkpointing import CheckpointError, claim_workdir

    write_steps(tmp_path / "warmstart_checkpoints", steps=(2,))
    with pytest.raises(CheckpointError, match="warmstart_checkpoints holds checkpoints"):
        claim_workdir(tmp_path, resume=False, overwrite=False)


def test_webshop_split_names_are_checked_too():
    from roleagent_jax.config import validate

    c = base_config()
    c.env.name, c.env.train_split, c.env.eval_splits = "webshop", "gen_train", ("gen_test", "test")
    validate(c)
    c.env.eval_splits = ("valid_seen",)
    with pytest.raises(
        ValueError, match="--config.env.eval_splits: unknown split 'valid_seen'; webshop knows"
    ):
        validate(c)


# ----------------------------------------------------------------------------------------------------
# real-model paths: a half-made tokenizer, a workdir that cannot be one, ignored or misspelled settings,
# an adapter where a model belongs, a folder that cannot be written; files readable as their folder's


@pytest.fixture(scope="module")
def full_model_dir(model_dir, tokenizer_dir, tmp_path_factory) -> Path:
    """The tiny model with a tokenizer beside it, as an exported model folder holds them."""
    import shutil

    path = Path(shutil.copytree(model_dir, tmp_path_factory.mktemp("full") / "m"))
    for f in tokenizer_dir.iterdir():
        shutil.copy(f, path / f.name)
    return path


def test_a_tokenizer_json_without_its_config_is_refused_at_startup(full_model_dir, tmp_path):
    """No end-of-turn token and no chat template: the warm start used to crash with a TypeError and
    leave a half-made workdir."""
    import shutil

    path = Path(shutil.copytree(full_model_dir, tmp_path / "m"))
    (path / "tokenizer_config.json").unlink()
    workdir = tmp_path / "run"
    out = run_main(
        "--config=configs/base.py", f"--config.model.path={path}", f"--config.workdir={workdir}", timeout=120
    )
    assert_one_line_error(out, "--config.model.path", str(path / "tokenizer_config.json"), "end-of-turn")
    assert not workdir.exists()


@pytest.mark.parametrize("below", [False, True], ids=["file", "under-a-file"])
def test_a_workdir_that_is_a_file_is_one_line_naming_the_key(tmp_path, below):
    (tmp_path / "f").write_text("x")
    workdir = tmp_path / "f" / "run" if below else tmp_path / "f"
    out = run_main("--config=configs/demo.py", f"--config.workdir={workdir}", timeout=120)
    assert_one_line_error(out, f"--config.workdir='{workdir}'", "is a file")
    assert (tmp_path / "f").read_text() == "x"


@pytest.mark.parametrize(
    "value,needle",
    [("3", "--config.model.init.num_hidden_layers=3 is ignored"), ("-5", "num_hidden_layers")],
    ids=["ignored", "invalid"],
)
def test_model_init_with_a_model_path_is_refused(full_model_dir, tmp_path, value, needle):
    """model.path decides the shape: a size set beside it (unlike the checkpoint's) would be silently
    ignored, and a size that cannot be right is refused whatever else is set."""
    workdir = tmp_path / "run"
    out = run_main(
        "--config=configs/base.py",
        f"--config.model.path={full_model_dir}",
        f"--config.model.init.num_hidden_layers={value}",
        f"--config.workdir={workdir}",
        timeout=120,
    )
    assert_one_line_error(out, needle, "--config.model.init")
    assert not workdir.exists()


def test_model_init_matching_the_checkpoint_is_accepted(full_model_dir):
    """A config that names the sizes its checkpoint has (a demo continued from its own warm start)."""
    from roleagent_jax.config import startup_errors
    from roleagent_jax.models.hf_io import check_pretrained

    c = base_config()
    c.model.path = str(full_model_dir)
    c.model.init.num_hidden_layers = check_pretrained(full_model_dir).num_hidden_layers
    assert not [e for e in startup_errors(c) if "model.init" in e]


def test_lora_targets_as_one_string_show_the_form_that_works(tmp_path):
    out = run_main(
        "--config=configs/demo.py", "--config.lora.targets=q,v", f"--config.workdir={tmp_path / 'r'}"
    )
    assert_one_line_error(out, "--config.lora.targets", "--config.lora.targets=\"('q', 'v')\"")


def test_a_mapping_flag_that_does_not_parse_shows_the_forms_that_work(tmp_path):
    out = run_main(
        "--config=configs/search_qa_demo.py",
        "--config.env.search_qa.mix=single_hop=0.5,bridge=0.5",
        f"--config.workdir={tmp_path / 'r'}",
    )
    assert_one_line_error(out, "--config.env.search_qa.mix", "--config.KEY.name=value")


def test_search_qa_unknown_split_is_named_with_the_valid_ones(tmp_path):
    out = run_evaluate("--env=search_qa", "--split=bogus")
    assert_one_line_error(out, "unknown search_qa split 'bogus'", "gen_test", "hotpotqa")
    workdir = tmp_path / "run"
    out = run_main(
        "--config=configs/search_qa_demo.py",
        "--config.env.eval_splits=('bogus',)",
        "--config.env.gen.n_train=2",
        "--config.rollout.tasks_per_iter=2",
        f"--config.workdir={workdir}",
    )
    assert_one_line_error(out, "unknown search_qa split 'bogus'")
    assert not workdir.exists()


def test_an_adapter_only_checkpoint_names_its_base(tmp_path):
    adapter = tmp_path / "hf_final" / "adapter"
    adapter.mkdir(parents=True)
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "/models/base-7b"}))
    out = run_evaluate(f"--checkpoint={adapter}", "--split=gen_seen")
    assert_one_line_error(out, str(adapter), "LoRA adapters only", "/models/base-7b")


def test_convert_names_the_users_folder_when_it_cannot_be_made(tmp_path, capsys, monkeypatch):
    from roleagent_jax.models import convert

    (tmp_path / "f").write_text("x")
    gguf = tmp_path / "unread.gguf"  # the folder fails before the file is read
    gguf.write_bytes(b"GGUF")
    with pytest.raises(SystemExit) as err:
        convert.main([f"--gguf={gguf}", f"--out={tmp_path / 'f' / 'model'}"])
    line = capsys.readouterr().err.strip()
    assert err.value.code == 2 and "\n" not in line and line.startswith(f"error: {tmp_path / 'f' / 'model'}:")

    def read_only(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(tmp_path / ".model.x1y2"))

    monkeypatch.setattr(convert.tempfile, "mkdtemp", read_only)  # a read-only folder, even for root
    with pytest.raises(SystemExit):
        convert.main([f"--gguf={gguf}", f"--out={tmp_path / 'model'}"])
    line = capsys.readouterr().err.strip()
    assert line == f"error: {tmp_path / 'model'}: cannot create it (Permission denied)"
    assert not list(tmp_path.glob(".model*"))


def test_written_weights_are_readable_as_the_folders_other_files(model_dir, tmp_path):
    """safetensors writes owner-only files: weights and adapters get the umask's mode, as config.json."""
    from roleagent_jax.models import load_pretrained, save_pretrained
    from roleagent_jax.models.hf_io import save_tensors

    model, _ = load_pretrained(model_dir)
    old = os.umask(0o027)
    try:
        save_pretrained(model, tmp_path / "m")
        save_tensors({"a": np.zeros(2, np.float32)}, tmp_path / "adapter.safetensors")
    finally:
        os.umask(old)
    modes = {
        p.name: p.stat().st_mode & 0o777
        for p in [*(tmp_path / "m").iterdir(), tmp_path / "adapter.safetensors"]
    }
    assert modes == {"config.json": 0o640, "model.safetensors": 0o640, "adapter.safetensors": 0o640}


# ----------------------------------------------------------------------------------------------------
# a workdir belongs to one run: a resume that would change what its checkpoints mean is refused


def recorded_workdir(tmp_path: Path) -> Path:
    """A workdir whose run (configs/demo.py) recorded itself, with a checkpoint and games beside it."""
    from roleagent_jax.run.record import run_record, write_record

    workdir = tmp_path / "run"
    write_steps(workdir / "checkpoints", steps=(1,))
    (workdir / "games").mkdir()
    c = load_config("demo")
    c.workdir = str(workdir)
    write_record(workdir, run_record(c, str(ROOT / "configs" / "demo.py")))
    return workdir


def tree(folder: Path) -> dict[str, float]:
    return {str(p.relative_to(folder)): p.stat().st_mtime for p in sorted(folder.rglob("*"))}


def test_resuming_a_workdir_with_another_config_is_refused_before_anything_is_written(tmp_path):
    workdir = recorded_workdir(tmp_path)
    before = tree(workdir)
    out = run_main("--config=configs/search_qa_demo.py", f"--config.workdir={workdir}", timeout=120)
    assert_one_line_error(
        out, f"--config.workdir='{workdir}' holds another run", "configs/demo.py",
        "env.name='search_qa' (its run: 'alfworld')", "--config.checkpoint.overwrite=True",
    )  # fmt: skip
    assert tree(workdir) == before


@pytest.mark.parametrize(
    "key,value",
    [("model.path", "/models/other"), ("tokenizer.path", "/tok"), ("algo", "grpo"), ("lora.rank", 4),
     ("env.alfworld.num_objects", (2, 3)), ("rollout.group_size", 4), ("warmstart.long_repeat", 3)],
)  # fmt: skip
def test_a_resume_that_changes_what_the_checkpoints_mean_names_the_key(tmp_path, key, value):
    from roleagent_jax.run.record import check_resume, run_record

    workdir = recorded_workdir(tmp_path)
    c = load_config("demo")
    *parents, name = key.split(".")
    node = c
    for part in parents:
        node = node[part]
    node[name] = value
    with pytest.raises(ValueError) as err:
        check_resume(workdir, run_record(c, "configs/demo.py"))
    message = str(err.value)
    assert "\n" not in message and f"--config.workdir='{workdir}'" in message and f"{key}=" in message


def test_a_resume_may_change_how_long_and_how_the_run_evaluates_logs_and_runs(tmp_path):
    from roleagent_jax.run.record import check_resume, run_record

    workdir = recorded_workdir(tmp_path)
    c = load_config("demo")
    c.workdir = str(tmp_path / "elsewhere" / ".." / "run")
    c.iterations, c.eval.limit, c.eval.before, c.env.eval_splits = 99, 3, False, ("gen_seen",)
    c.log.tensorboard, c.checkpoint.every, c.mesh.fsdp, c.env.num_workers, c.aiw.eta = False, 1, 1, 2, 0.5
    check_resume(workdir, run_record(c, "a/copy/of/demo.py"))


def test_a_key_declared_after_a_run_started_counts_as_its_default_on_resume(tmp_path):
    """A run recorded before `rollout.branch_at` existed played without branching: it resumes with the
    key's default and is refused with another value."""
    from roleagent_jax.run.record import RUN_FILE, check_resume, run_record

    workdir = recorded_workdir(tmp_path)
    saved = json.loads((workdir / RUN_FILE).read_text())
    del saved["config"]["rollout.branch_at"], saved["config"]["rollout.branch_openers"]
    (workdir / RUN_FILE).write_text(json.dumps(saved))
    c = load_config("demo")
    check_resume(workdir, run_record(c, "configs/demo.py"))
    c.rollout.branch_at = 1
    with pytest.raises(ValueError, match=r"rollout.branch_at=1 \(its run: 0\)"):
        check_resume(workdir, run_record(c, "configs/demo.py"))


def test_the_keys_a_resume_may_change_are_documented():
    from roleagent_jax.run.record import RESUMABLE

    doc = (ROOT / "docs" / "scaling.md").read_text()
    assert [key for key in RESUMABLE if f"`{key}`" not in doc] == []


def test_each_key_a_resume_may_change_is_a_declared_key_or_section():
    """A renamed key left in RESUMABLE would silently stop matching, and a resume that changes it be refused."""
    from roleagent_jax.config import CONFIG
    from roleagent_jax.run.record import RESUMABLE

    declared = [dotted for dotted, _ in CONFIG.keys()]
    assert [k for k in RESUMABLE if not any(d == k or d.startswith(k + ".") for d in declared)] == []


# ----------------------------------------------------------------------------------------------------
# evaluate: what a checkpoint's settings file and the family's flags may hold, checked before any work


def test_evaluate_refuses_an_episodes_folder_it_cannot_write_before_playing(tmp_path, capsys, monkeypatch):
    from roleagent_jax.evaluation import cli

    def read_only(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(cli.tempfile, "TemporaryFile", read_only)  # a read-only folder, even for root
    episodes = tmp_path / "ro" / "episodes.jsonl"
    episodes.parent.mkdir()
    with pytest.raises(SystemExit) as err:
        cli.main(["--policy=random", "--split=gen_seen", "--gen-n=1", f"--gen-dir={tmp_path / 'g'}",
                       f"--episodes={episodes}"])  # fmt: skip
    out = capsys.readouterr()
    assert err.value.code == 2 and out.out == ""
    assert (
        out.err == f"error: --episodes={episodes}: cannot write in '{episodes.parent}' (Permission denied)\n"
    )
    assert not (tmp_path / "g").exists() and not any(episodes.parent.iterdir())


def checkpoint_with_settings(tmp_path: Path, settings) -> Path:
    """A model folder (its config.json is never read: the settings fail first) with `settings`."""
    folder = tmp_path / "hf_final"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "roleagent.json").write_text(json.dumps(settings))
    return folder


@pytest.mark.parametrize(
    "settings,needle",
    [
        ({"env": ["alfworld"]}, "env=['alfworld']: must be a JSON object"),
        ({"eval": {"temperature": "hot"}}, "eval.temperature='hot': must be a number"),
        ({"max_rows_per_call": None}, "max_rows_per_call=None: must be an integer"),
        ({"env": {"name": "alfworld", "options": [1]}}, "env.options=[1]: must be a JSON object"),
        ({"env": {"name": "alfworld", "max_steps": 0}}, "env.max_steps=0: must be >= 1"),
        ({"env": {"name": "nowhere"}}, "env.name='nowhere': must be one of alfworld"),
        ({"env": {"name": "alfworld", "options": {"num_receptacles": 1.5}}},
         "env.options.num_receptacles=1.5: must be an int or a pair lo,hi of ints"),
        ({"env": {"name": "alfworld", "options": {"num_receptacles": [1, 3]}}}, "env.options: num_receptacles"),
    ],
    ids=["env-list", "temperature", "row-cap-null", "options-list", "max-steps", "family", "option-type",
         "option-range"],
)  # fmt: skip
def test_a_checkpoints_settings_file_is_checked_field_by_field(tmp_path, settings, needle):
    folder = checkpoint_with_settings(tmp_path, settings)
    out = run_evaluate(f"--checkpoint={folder}", "--split=gen_seen")
    assert_one_line_error(out, f"{folder / 'roleagent.json'}: {needle}")


def test_an_option_the_family_no_longer_has_is_named_not_dropped(tmp_path):
    folder = checkpoint_with_settings(tmp_path, {"env": {"name": "alfworld", "options": {"rooms": 3}}})
    out = run_evaluate(f"--checkpoint={folder}", "--split=gen_seen")
    assert_one_line_error(
        out, str(folder / "roleagent.json"), "unknown option(s) ['rooms']", "num_receptacles"
    )


@pytest.mark.parametrize(
    "args,needle",
    [
        (("--num-receptacles=1.5",), "--num-receptacles=1.5: must be an int or a pair lo,hi of ints"),
        (("--num-receptacles=abc",), "--num-receptacles='abc': must be an int or a pair lo,hi of ints"),
        (("--num-receptacles=1",), "alfworld options: num_receptacles"),
        (("--env=search_qa", "--split=gen_test", "--topk=abc"), "--topk='abc': must be an integer"),
    ],
    ids=["float", "text", "too-small", "search-qa-topk"],
)
def test_evaluates_family_flags_are_checked_as_the_trainer_checks_them(tmp_path, args, needle):
    out = run_evaluate("--policy=random", "--split=gen_seen", "--gen-n=1", f"--gen-dir={tmp_path}", *args)
    assert_one_line_error(out, needle)
    assert not any(tmp_path.iterdir())


def test_evaluate_names_an_unknown_split_before_loading_the_model(tmp_path):
    folder = checkpoint_with_settings(tmp_path, {"env": {"name": "alfworld"}})  # an unreadable model
    out = run_evaluate(f"--checkpoint={folder}", "--split=gen_sen")
    assert_one_line_error(out, "--split=gen_sen: unknown alfworld split", "valid_seen", "gen_unseen")


def test_lora_layers_above_the_checkpoints_layer_count_fail_at_startup(full_model_dir):
    from roleagent_jax.config import validate

    c = base_config()
    c.model.path, c.lora.rank, c.lora.layers = str(full_model_dir), 4, 2
    with pytest.raises(
        ValueError, match=r"--config.lora.layers=2: the model has only 1 layers \(.*config.json\)"
    ):
        validate(c)
    c.lora.layers = 1
    validate(c)


# ----------------------------------------------------------------------------------------------------
# config files: the training command and the learning benchmark load them alike


def test_a_config_file_without_get_config_is_named(tmp_path):
    config = tmp_path / "mine.py"
    config.write_text("workdir = 'runs/x'\n")
    out = run_main(f"--config={config}", f"--config.workdir={tmp_path / 'run'}")
    assert_one_line_error(out, f"--config={config}: the file defines no get_config()")
    assert not (tmp_path / "run").exists()


def run_learning_benchmark(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "learning.py"), *args],
        capture_output=True,
        text=True,
        cwd=ROOT.parent,  # run as a script from anywhere
        timeout=120,
    )


@pytest.mark.parametrize(
    "args,needle",
    [
        (("--set", "iterations"), "--set iterations: expected KEY=VALUE"),
        (("--config=configs/nope.py",), "--config=configs/nope.py: cannot load the config file"),
        (("--config=/nonexistent/configs/demo.py",), "--config=/nonexistent/configs/demo.py: cannot load"),
        (("--set", "rollout.group_size=1"), "--config.rollout.group_size=1: must be >= 2"),
        (("--set", "no.such=1"), "--config.no.such: no such key"),
        (("--set", "iterations=abc"), "--config.iterations=abc"),
    ],
    ids=["no-value", "missing-config", "outside-config", "group-1", "no-such-key", "not-an-int"],
)
def test_the_learning_benchmark_refuses_bad_settings_before_any_run(tmp_path, args, needle):
    out = run_learning_benchmark(f"--workdir={tmp_path / 'runs'}", *args)
    assert_one_line_error(out, needle)
    assert not (tmp_path / "runs").exists()


def test_the_learning_benchmark_refuses_a_warm_start_without_weights(full_model_dir, tmp_path):
    import shutil

    warm = Path(shutil.copytree(full_model_dir, tmp_path / "hf_warmstart"))
    (warm / "model.safetensors").unlink()
    out = run_learning_benchmark(f"--workdir={tmp_path / 'runs'}", f"--warmstart={warm}")
    assert_one_line_error(out, f"--config.model.path='{warm}'", "safetensors")
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("kind", ["missing", "folder", "unreadable"])
def test_convert_names_a_bad_gguf_and_leaves_no_folder_it_made(tmp_path, capsys, kind):
    from roleagent_jax.models import convert

    gguf = tmp_path / "model.gguf"
    if kind == "folder":
        gguf.mkdir()
    elif kind == "unreadable":
        gguf.write_bytes(b"not a gguf file")
    out = tmp_path / "a" / "b" / "model"
    with pytest.raises(SystemExit) as err:
        convert.main([f"--gguf={gguf}", f"--out={out}"])
    line = capsys.readouterr().err.strip()
    why = {
        "missing": "no such file",
        "folder": "is a folder, not a GGUF file",
        "unreadable": "not a readable GGUF",
    }
    assert err.value.code == 2 and "\n" not in line and line.startswith(f"error: {gguf}: {why[kind]}")
    assert not (tmp_path / "a").exists()
