"""Packed update grids (`ppo.pack_segments`): several rows end to end in one grid row with a
block-diagonal causal mask give the log-probs, loss and update of the unpacked grid."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from qwen2_tiny import tiny_config

from roleagent_jax.models import Qwen2ForCausalLM
from roleagent_jax.rl.logprobs import make_logprob_fn
from roleagent_jax.rl.optimizer import TrainState
from roleagent_jax.rl.ppo import pack_rows, pack_segments, padded_share, ppo_epochs
from roleagent_jax.rl.train_step import make_train_step

VOCAB, PAD = 128, 0


def rows(n: int, seed: int):
    """Prompts of 2-30 tokens and responses of 1-8: lengths spread as an RL batch's are."""
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(1, VOCAB, size=int(rng.integers(2, 30))).tolist() for _ in range(n)]
    responses = [rng.integers(1, VOCAB, size=int(rng.integers(1, 9))).tolist() for _ in range(n)]
    return prompts, responses


@pytest.fixture(scope="module")
def setup():
    graphdef, params = nnx.split(Qwen2ForCausalLM(tiny_config(max_position_embeddings=256), rngs=nnx.Rngs(0)))
    logprob = make_logprob_fn(graphdef)
    grid = pack_rows(*rows(8, 0), PAD, length_bucket=8)
    rng = np.random.default_rng(1)
    grid["advantages"] = rng.normal(size=8).astype(np.float32)
    lp = np.asarray(logprob(params, {k: jnp.asarray(v) for k, v in grid.items()}))
    grid["old_logprobs"] = lp + rng.normal(0, 0.3, lp.shape).astype(np.float32) * grid["loss_mask"]
    grid["ref_logprobs"] = lp + rng.normal(0, 0.2, lp.shape).astype(np.float32) * grid["loss_mask"]
    return graphdef, params, logprob, grid


def device(batch):
    return {k: jnp.asarray(v) for k, v in batch.items()}


def test_pack_segments_layout_and_round_trip():
    grid = pack_rows([[1, 2, 3], [4], [5, 6]], [[10, 11], [12, 13, 14], [15]], PAD, length_bucket=8)
    grid["advantages"] = np.asarray([1.0, 2.0, 3.0], np.float32)
    packed, packing = pack_segments(grid, row_multiple=2)
    # longest first: row 0 (5 tokens) then row 1 (4) opens a second row, row 2 (3) fits after row 0
    np.testing.assert_array_equal(packed["input_ids"][0], [1, 2, 3, 10, 11, 5, 6, 15])
    np.testing.assert_array_equal(packed["attention_mask"][0], [1, 1, 1, 1, 1, 2, 2, 2])
    np.testing.assert_array_equal(packed["positions"][0], [0, 1, 2, 3, 4, 0, 1, 2])
    np.testing.assert_array_equal(packed["advantages"][0], [1, 1, 1, 1, 1, 3, 3, 3])
    np.testing.assert_array_equal(packed["target_index"][0, :3], [3, 4, 7])
    np.testing.assert_array_equal(packed["input_ids"][1, :4], [4, 12, 13, 14])
    assert packed["input_ids"].shape == (2, 8)
    np.testing.assert_array_equal(packing.unpack(packed["loss_mask"]), grid["loss_mask"])
    np.testing.assert_array_equal(
        packing.unpack(packed["input_ids"]), grid["input_ids"] * grid["attention_mask"]
    )
    assert padded_share(packed) == pytest.approx(1 - 12 / 16)
    assert padded_share(grid) == pytest.approx(1 - 12 / 24)
    assert pack_segments(grid, row_multiple=4)[0]["input_ids"].shape == (4, 8)
    grid["loss_mask"][1] = 0  # a row with no loss token is left out
    packed, packing = pack_segments(grid)
    assert packed["input_ids"].shape == (1, 8) and packing.row[1] == -1
    assert np.all(packing.unpack(packed["loss_mask"])[1] == 0)


def test_packed_logprobs_equal_unpacked(setup):
    _, params, logprob, grid = setup
    keys = ("input_ids", "attention_mask", "positions", "loss_mask", "target_index")
    plain = np.asarray(logprob(params, device({k: grid[k] for k in keys})))
    packed, packing = pack_segments({k: grid[k] for k in keys})
    assert packed["input_ids"].shape[0] < grid["input_ids"].shape[0]
    got = packing.unpack(np.asarray(logprob(params, device(packed))))
    mask = grid["loss_mask"] > 0
    assert np.all(plain[mask] < 0)
    np.testing.assert_allclose(got[mask], plain[mask], rtol=1e-5, atol=1e-5)
    assert np.all(got[~mask] == 0.0)


@pytest.mark.parametrize("micro", [1, 2])
def test_packed_update_equals_unpacked(setup, micro):
    """Loss, every metric and the new parameters of one step (KL and entropy on) agree within 1e-5."""
    graphdef, params, _, grid = setup
    opt = optax.adam(1e-2)
    step = make_train_step(graphdef, opt, dict(kl_type="low_var_kl", entropy_coef=0.01), micro_batches=micro)
    s1, m1 = step(TrainState.create(params, opt, jax.random.key(0)), device(grid))
    s2, m2 = step(TrainState.create(params, opt, jax.random.key(0)), device(pack_segments(grid, micro)[0]))
    assert float(m1["loss"]) != 0.0
    for k in m1:
        np.testing.assert_allclose(float(m2[k]), float(m1[k]), rtol=1e-5, atol=1e-5, err_msg=k)
    for a, b in zip(jax.tree.leaves(s1.params), jax.tree.leaves(s2.params)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=1e-5)


def test_ppo_epochs_packed_equal_unpacked_with_less_padding(setup):
    """Mini-batches are shuffled rows, then packed: the same steps, less padding reported."""
    graphdef, params, _, grid = setup
    opt = optax.adam(1e-2)
    step = make_train_step(graphdef, opt, dict(kl_type="low_var_kl"))
    out = {}
    for pack in (0, 1):
        state = TrainState.create(jax.tree.map(jnp.copy, params), opt, jax.random.key(0))
        out[pack] = ppo_epochs(
            step, state, grid, 8, mini_batch_rows=4, epochs=2, rng=np.random.default_rng(0), pack=pack
        )
    (s0, m0), (s1, m1) = out[0], out[1]
    for k in ("update/loss", "update/kl_ref", "update/ratio", "update/grad_norm"):
        np.testing.assert_allclose(m1[k], m0[k], rtol=1e-5, atol=1e-5, err_msg=k)
    for a, b in zip(jax.tree.leaves(s0.params), jax.tree.leaves(s1.params)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=1e-5)
    assert 0 < m1["update/padded_share"] < m0["update/padded_share"] < 1


def test_pack_rows_needs_token_mean():
    from configs.demo import get_config
    from roleagent_jax.config.checks import validate

    config = get_config()
    config.train.pack_rows = True
    config.loss.agg = "seq-mean-token-mean"
    with pytest.raises(ValueError, match="pack_rows=True needs loss.agg=token-mean"):
        validate(config)
