"""Orbax round trip of an array pytree plus JSON host state, keep-N, and restore onto shardings."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from roleagent_jax.run.checkpointing import Checkpointer, from_jsonable, to_jsonable


def test_roundtrip_keep_n_and_shardings(tmp_path):
    mesh = jax.make_mesh((8,), ("data",))
    sharding = NamedSharding(mesh, PartitionSpec("data"))
    state = {
        "w": jax.device_put(jnp.arange(16.0).reshape(8, 2), sharding),
        "step": jnp.int32(3),
        "rng": jax.random.PRNGKey(7),
    }
    gen = np.random.default_rng(5)
    host = {"iteration": 3, "logits": np.linspace(-1, 1, 5), "rng": gen.bit_generator.state}
    ckpt = Checkpointer(tmp_path / "ckpt", keep=2)
    for step in (1, 2, 3):
        ckpt.save(step, jax.tree.map(lambda x, s=step: x + s, state), dict(host, iteration=step))
    ckpt.wait()
    assert ckpt.latest_step() == 3
    assert sorted(int(p.name) for p in (tmp_path / "ckpt").iterdir() if p.name.isdigit()) == [2, 3]
    template = jax.tree.map(jnp.zeros_like, state)
    restored, host_back = ckpt.restore(template)
    np.testing.assert_array_equal(restored["w"], state["w"] + 3)
    assert restored["w"].sharding == sharding
    np.testing.assert_array_equal(restored["rng"], state["rng"] + 3)
    assert host_back["iteration"] == 3
    np.testing.assert_array_equal(host_back["logits"], host["logits"])
    gen2 = np.random.default_rng()
    gen2.bit_generator.state = host_back["rng"]
    assert gen2.random() == np.random.default_rng(5).random()
    ckpt.close()


def test_empty_directory_restores_none(tmp_path):
    ckpt = Checkpointer(tmp_path / "none")
    assert ckpt.restore({"x": jnp.zeros(2)}) is None
    ckpt.close()


def test_jsonable_roundtrip():
    obj = {"a": np.arange(3, dtype=np.int64), "b": [np.float32(1.5), {"c": np.bool_(True)}]}
    back = from_jsonable(to_jsonable(obj))
    np.testing.assert_array_equal(back["a"], obj["a"])
    assert back["a"].dtype == np.int64 and back["b"][0] == 1.5 and back["b"][1]["c"] is True


def test_replace_skips_an_unchanged_step_and_replaces_a_changed_one(tmp_path):
    """The final save of a run whose last iteration is already checkpointed: unchanged host state leaves
    the step as it is (no rewrite); new host state (the final evaluation) replaces it."""
    directory = tmp_path / "ckpt"
    state = {"w": jnp.arange(6.0)}
    ckpt = Checkpointer(directory)
    ckpt.save(1, state, {"iteration": 1, "eval": {}})
    ckpt.wait()
    written = (directory / "1" / "host" / "metadata").stat().st_mtime_ns
    ckpt.save(1, state, {"iteration": 1, "eval": {}}, replace=True)
    ckpt.wait()
    assert (directory / "1" / "host" / "metadata").stat().st_mtime_ns == written
    ckpt.save(1, state, {"iteration": 1, "eval": {"after": 0.5}}, replace=True)
    ckpt.wait()
    assert sorted(p.name for p in directory.iterdir()) == ["1"]  # the old copy is gone once the new landed
    restored, host = ckpt.restore({"w": jnp.zeros(6)})
    assert host["eval"] == {"after": 0.5}
    np.testing.assert_array_equal(restored["w"], state["w"])
    ckpt.close()


def test_an_interrupted_replacement_puts_the_old_step_back(tmp_path):
    directory = tmp_path / "ckpt"
    ckpt = Checkpointer(directory)
    ckpt.save(1, {"w": jnp.ones(3)}, {"iteration": 1})
    ckpt.close()
    (directory / "1").rename(directory / "1.replaced")  # killed after moving it aside, before the new save
    again = Checkpointer(directory)
    assert again.latest_step() == 1 and sorted(p.name for p in directory.iterdir()) == ["1"]
    _, host = again.restore({"w": jnp.zeros(3)})
    assert host == {"iteration": 1}
    again.close()
