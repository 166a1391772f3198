"""Train step: token grid, log-prob alignment, sharded == single-device, micro-batching, learning."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from qwen2_tiny import tiny_config

from roleagent_jax.models import Qwen2ForCausalLM
from roleagent_jax.parallel.sharding import make_mesh
from roleagent_jax.rl.logprobs import make_logprob_fn, target_index, token_logprobs
from roleagent_jax.rl.optimizer import TrainState, make_optimizer
from roleagent_jax.rl.ppo import pack_rows
from roleagent_jax.rl.train_step import make_train_step

VOCAB, PAD = 128, 0


def tiny_model(seed: int = 0) -> Qwen2ForCausalLM:
    return Qwen2ForCausalLM(tiny_config(max_position_embeddings=256), rngs=nnx.Rngs(seed))


def random_rows(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(1, VOCAB, size=int(rng.integers(2, 12))).tolist() for _ in range(n)]
    responses = [rng.integers(1, VOCAB, size=int(rng.integers(1, 9))).tolist() for _ in range(n)]
    return prompts, responses


@pytest.fixture(scope="module")
def setup():
    """One tiny model, one log-prob function (compiled once) and a batch shared by the tests."""
    graphdef, params = nnx.split(tiny_model())
    logprob = make_logprob_fn(graphdef)
    return graphdef, params, logprob, make_batch(logprob, params)


def make_batch(logprob, params, n=8, seed=0, kl=True):
    prompts, responses = random_rows(n, seed)
    batch = {k: jnp.asarray(v) for k, v in pack_rows(prompts, responses, PAD, length_bucket=8).items()}
    rng = np.random.default_rng(seed + 1)
    batch["advantages"] = jnp.asarray(rng.normal(size=n), jnp.float32)
    lp = logprob(params, batch)
    # Old log-probs a little off the current ones so both clip branches and the ratio matter.
    batch["old_logprobs"] = (
        lp + jnp.asarray(rng.normal(0, 0.3, size=lp.shape), jnp.float32) * batch["loss_mask"]
    )
    if kl:
        batch["ref_logprobs"] = lp + jnp.asarray(rng.normal(0, 0.2, size=lp.shape), jnp.float32)
    return batch


def copy(tree):
    return jax.tree.map(lambda x: jnp.array(np.asarray(x)), tree)


def host(tree):
    return jax.tree.map(lambda x: np.asarray(x), tree)


def assert_tree_close(a, b, tol):
    for x, y in zip(jax.tree.leaves(host(a)), jax.tree.leaves(host(b))):
        np.testing.assert_allclose(x, y, rtol=tol, atol=tol)


# --------------------------------------------------------------------------------------------------


def test_pack_rows_layout_and_left_truncation():
    stats = {}
    out = pack_rows(
        [[5, 6, 7], [1, 2, 3, 4, 9, 8]],
        [[10, 11], [12]],
        PAD,
        max_prompt=4,
        length_bucket=8,
        response_logprobs=[[-0.5, -1.5], [-2.0]],
        stats=stats,
    )
    assert stats == {"prompts_truncated": 1, "responses_truncated": 0}
    np.testing.assert_array_equal(out["input_ids"], [[0, 5, 6, 7, 10, 11, 0, 0], [3, 4, 9, 8, 12, 0, 0, 0]])
    np.testing.assert_array_equal(out["attention_mask"], [[0, 1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 0, 0, 0]])
    np.testing.assert_array_equal(out["positions"], [[0, 0, 1, 2, 3, 4, 0, 0], [0, 1, 2, 3, 4, 0, 0, 0]])
    np.testing.assert_array_equal(out["loss_mask"], [[0, 0, 0, 0, 1, 1, 0, 0], [0, 0, 0, 0, 1, 0, 0, 0]])
    np.testing.assert_array_equal(out["sampler_logprobs"][0, 4:6], [-0.5, -1.5])
    assert pack_rows([[1]], [[2]], PAD, length_bucket=(16, 32))["input_ids"].shape == (1, 16)
    with pytest.raises(ValueError, match="empty prompt"):
        pack_rows([[]], [[1]], PAD)


def test_token_logprobs_match_numpy():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 5, 11)).astype(np.float32) * 3
    ids = rng.integers(0, 11, size=(3, 5))
    lp, ent = token_logprobs(jnp.asarray(logits), jnp.asarray(ids))
    x = logits.astype(np.float64)
    logz = np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1)) + x.max(-1)
    logsm = x - logz[..., None]
    want_lp = np.zeros((3, 5))
    want_lp[:, 1:] = np.take_along_axis(logsm[:, :-1], ids[:, 1:, None], -1)[..., 0]
    want_ent = np.zeros((3, 5))
    want_ent[:, 1:] = -(np.exp(logsm) * logsm).sum(-1)[:, :-1]
    np.testing.assert_allclose(np.asarray(lp), want_lp, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(ent), want_ent, rtol=1e-5, atol=1e-5)


def test_logprobs_on_grid_equal_unpadded_rows(setup):
    """Padding and alignment: a response token's log-prob on the grid equals the one read from the row run
    without left padding (right-padded alone, positions 0..L-1): log_softmax(logits[t - 1])[token t]."""
    graphdef, params, logprob, _ = setup
    prompts, responses = random_rows(4, seed=3)
    packed = pack_rows(prompts, responses, PAD, length_bucket=8)
    lp = np.asarray(logprob(params, {k: jnp.asarray(v) for k, v in packed.items()}))
    width = max(len(p) + len(r) for p, r in zip(prompts, responses))
    plain = np.zeros((4, width), np.int32)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        plain[i, : len(p) + len(r)] = p + r
    logits = np.asarray(
        jax.jit(lambda p, x: nnx.merge(graphdef, p)(x))(params, jnp.asarray(plain)), np.float64
    )
    for i, (p, r) in enumerate(zip(prompts, responses)):
        logsm = logits[i] - np.log(np.exp(logits[i]).sum(-1, keepdims=True))
        want = [logsm[len(p) + j - 1, tok] for j, tok in enumerate(r)]
        got = lp[i][packed["loss_mask"][i] > 0]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_target_index_lists_each_rows_response_columns():
    packed = pack_rows([[1, 2, 3], [4]], [[5, 6], [7, 8, 9]], PAD, length_bucket=8)
    np.testing.assert_array_equal(
        packed["target_index"], [[3, 4, 0, 0, 0, 0, 0, 0], [3, 4, 5, 0, 0, 0, 0, 0]]
    )
    mask = np.zeros((2, 64), np.float32)
    mask[0, 40:57] = 1  # 17 targets: a width of 32 (the bucket is 16)
    assert target_index(mask).shape == (2, 32)
    with pytest.raises(ValueError, match="column 0"):
        target_index(np.ones((1, 4)))


def test_head_at_targets_equals_the_whole_grid(setup):
    """The LM head run at the response columns only gives today's log-probs there (0 elsewhere), and the
    same update: loss, metrics and new params, also over micro-batches."""
    graphdef, params, logprob, batch = setup
    whole = {k: v for k, v in batch.items() if k != "target_index"}
    mask = np.asarray(batch["loss_mask"]) > 0
    at, every = np.asarray(logprob(params, batch)), np.asarray(logprob(params, whole))
    np.testing.assert_allclose(at[mask], every[mask], rtol=1e-5, atol=1e-6)
    assert np.all(at[~mask] == 0.0) and np.any(every[~mask] != 0.0)
    opt = optax.sgd(1.0)
    cfg = dict(kl_type="low_var_kl", entropy_coef=0.01)
    for micro in (1, 2):
        step = make_train_step(graphdef, opt, cfg, micro_batches=micro)
        s1, m1 = step(TrainState.create(params, opt, jax.random.key(0)), batch)
        s2, m2 = step(TrainState.create(params, opt, jax.random.key(0)), whole)
        assert_tree_close(s1.params, s2.params, 1e-5)
        for k in m1:
            np.testing.assert_allclose(float(m1[k]), float(m2[k]), rtol=1e-5, atol=1e-6, err_msg=k)
        assert set(step.times) == {"forward_backward", "optimizer"}


def test_logprob_micro_batches_equal_one_pass(setup):
    graphdef, params, logprob, batch = setup
    split = make_logprob_fn(graphdef, micro_batches=4)(params, batch)
    np.testing.assert_allclose(np.asarray(split), np.asarray(logprob(params, batch)), rtol=1e-5, atol=1e-6)
    assert np.all(np.asarray(split)[np.asarray(batch["attention_mask"]) == 0] == 0.0)


def test_micro_batches_equal_full_batch(setup):
    graphdef, params, _, batch = setup
    opt = optax.sgd(1.0)
    cfg = dict(agg="seq-mean-token-mean", kl_type="low_var_kl")
    s1, m1 = make_train_step(graphdef, opt, cfg, micro_batches=1)(
        TrainState.create(params, opt, jax.random.key(0)), batch
    )
    s2, m2 = make_train_step(graphdef, opt, cfg, micro_batches=2)(
        TrainState.create(params, opt, jax.random.key(0)), batch
    )
    assert float(m1["loss"]) != 0.0 and float(m1["grad_norm"]) > 0
    assert_tree_close(s1.params, s2.params, 1e-5)
    for k in m1:
        np.testing.assert_allclose(float(m1[k]), float(m2[k]), rtol=1e-5, atol=1e-6, err_msg=k)
    with pytest.raises(ValueError, match="divisible"):
        make_train_step(graphdef, opt, cfg, micro_batches=3)(
            TrainState.create(params, opt, jax.random.key(0)), batch
        )


def test_the_guided_step_reads_the_experts_weights_and_micro_batches_equal_one(setup):
    """`loss.guided`: the step needs the batch's `guided_weight` and splits it with the rows; the
    expert-token metrics count and average over the expert's tokens only."""
    graphdef, params, _, batch = setup
    opt = optax.sgd(1.0)
    cfg = dict(agg="token-mean", kl_type="low_var_kl", guided="nll")
    with pytest.raises(ValueError, match="guided_weight"):
        make_train_step(graphdef, opt, cfg)(TrainState.create(params, opt, jax.random.key(0)), batch)
    weight = np.zeros(batch["loss_mask"].shape, np.float32)
    weight[:4] = 0.5 * np.asarray(batch["loss_mask"][:4])  # the first four rows are the expert's
    guided = {**batch, "guided_weight": jnp.asarray(weight)}
    runs = [
        make_train_step(graphdef, opt, cfg, micro_batches=m)(
            TrainState.create(params, opt, jax.random.key(0)), guided
        )
        for m in (1, 2)
    ]
    (s1, m1), (s2, m2) = runs
    assert_tree_close(s1.params, s2.params, 1e-5)
    for k in m1:
        np.testing.assert_allclose(float(m1[k]), float(m2[k]), rtol=1e-5, atol=1e-6, err_msg=k)
    assert float(m1["guided_tokens"]) == float(np.asarray(batch["loss_mask"][:4]).sum())
    assert 0 < float(m1["guided_prob"]) < 1


def test_sharded_step_equals_single_device(setup):
    assert len(jax.devices()) == 8, "conftest should provide 8 fake CPU devices"
    graphdef, params, logprob, batch = setup
    opt = optax.sgd(1.0)  # the update is the gradient itself: the comparison sees every gradient entry
    single, m_single = make_train_step(graphdef, opt, {}, micro_batches=2)(
        TrainState.create(copy(params), opt, jax.random.key(0)), batch
    )
    mesh = make_mesh(data=2, fsdp=2, tensor=2)
    state = TrainState.create(copy(params), opt, jax.random.key(0), mesh=mesh)
    assert any(
        len(x.sharding.device_set) == 8 and not x.sharding.is_fully_replicated
        for x in jax.tree.leaves(state.params)
    )
    step = make_train_step(graphdef, opt, {}, mesh=mesh, micro_batches=2)
    sharded, m_sharded = step(state, batch)
    assert_tree_close(single.params, sharded.params, 1e-5)
    for k in m_single:
        np.testing.assert_allclose(float(m_single[k]), float(m_sharded[k]), rtol=1e-5, atol=1e-6, err_msg=k)
    spec = step.state_shardings(sharded).params
    for x, s in zip(
        jax.tree.leaves(sharded.params),
        jax.tree.leaves(spec, is_leaf=lambda v: isinstance(v, jax.sharding.Sharding)),
    ):
        assert x.sharding.is_equivalent_to(s, x.ndim)
    # Sharded log-probs agree with single-device ones.
    lp_mesh = make_logprob_fn(graphdef, mesh=mesh)(sharded.params, batch)
    lp_one = logprob(single.params, batch)
    np.testing.assert_allclose(np.asarray(lp_mesh), np.asarray(lp_one), rtol=1e-5, atol=1e-5)


def test_adamw_steps_raise_likelihood_of_rewarded_responses(setup):
    graphdef, _, logprob, _ = setup
    params = nnx.split(tiny_model(seed=1))[1]
    ref = copy(params)
    batch = make_batch(logprob, params, kl=True)
    batch["advantages"] = jnp.ones_like(batch["advantages"])
    batch["old_logprobs"] = logprob(params, batch)
    opt = make_optimizer(3e-3, weight_decay=0.01, grad_clip=1.0, warmup_steps=2)
    state = TrainState.create(params, opt, jax.random.key(0))
    step = make_train_step(graphdef, opt, dict(clip_eps=0.2), micro_batches=2, remat=True)
    mask = np.asarray(batch["loss_mask"])

    def mean_lp(p):
        return float((np.asarray(logprob(p, batch)) * mask).sum() / mask.sum())

    start = mean_lp(state.params)
    losses, lrs = [], []
    for _ in range(6):
        state, m = step(state, batch)
        losses.append(float(m["loss"]))
        lrs.append(float(m["lr"]))
    assert mean_lp(state.params) > start + 0.05
    assert losses[-1] < losses[0]
    np.testing.assert_allclose(lrs[:3], [0.0, 1.5e-3, 3e-3], rtol=1e-6)
    assert int(state.step) == 6
    # The state copied its params: the caller's arrays (the KL reference) survived the donations.
    assert_tree_close(params, ref, 0.0)


def test_optimizer_and_batch_validation(setup):
    with pytest.raises(ValueError, match="cosine"):
        make_optimizer(1e-3, schedule="cosine")
    with pytest.raises(ValueError, match="schedule"):
        make_optimizer(1e-3, schedule="linear")
    graphdef, params, _, batch = setup
    opt = optax.sgd(0.1)
    step = make_train_step(graphdef, opt, {"kl_type": "kl"})
    batch = {k: v for k, v in batch.items() if k != "ref_logprobs"}
    with pytest.raises(ValueError, match="ref_logprobs"):
        step(TrainState.create(params, opt, jax.random.key(0)), batch)


def test_optimizer_keeps_bfloat16_params_finite():
    # Regression: hyper-parameters cast to the params' dtype made b2 = 0.999 -> 1.0 and the update NaN.
    params = {"w": jnp.full((4,), 0.5, jnp.bfloat16)}
    opt = make_optimizer(1e-2)
    state = opt.init(params)
    updates, _ = opt.update({"w": jnp.full((4,), 0.1, jnp.bfloat16)}, state, params)
    new = optax.apply_updates(params, updates)
    assert np.all(np.isfinite(np.asarray(new["w"], np.float32)))
    assert np.all(np.asarray(new["w"], np.float32) < 0.5)


def test_the_upper_clip_at_its_off_value_leaves_the_update_unchanged(setup):
    """clip_eps_high = 0 is the symmetric clip: the same step as naming clip_eps for both bounds; a
    higher upper clip does change it (the batch's ratios reach past 1 + clip_eps)."""
    graphdef, params, _, batch = setup
    opt = optax.sgd(1.0)

    def step(**loss):
        cfg = dict(clip_eps=0.2, kl_type="low_var_kl", **loss)
        return make_train_step(graphdef, opt, cfg)(
            TrainState.create(copy(params), opt, jax.random.key(0)), batch
        )

    (off, m_off), (same, m_same), (_, m_high) = step(), step(clip_eps_high=0.2), step(clip_eps_high=0.5)
    assert_tree_close(off.params, same.params, 0.0)
    assert float(m_off["loss"]) == float(m_same["loss"])
    assert float(m_off["clip_frac_high"]) > 0 and float(m_high["clip_frac_high"]) < float(
        m_off["clip_frac_high"]
    )
    assert float(m_high["loss"]) != float(m_off["loss"])
