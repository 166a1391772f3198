"""The guided loss of the expert's forced step (`loss.guided`): it touches only the expert's tokens, is
today's loss exactly when off, and its gradient is the hand-computed one; the batch marks the expert's
tokens; the opener probability at the branch state is the direct product of token probabilities."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import load_config
from flax import nnx

from roleagent_jax.config import validate
from roleagent_jax.models import Qwen2Config, Qwen2ForCausalLM
from roleagent_jax.rl.logprobs import make_logprob_fn
from roleagent_jax.rl.losses import LossConfig, loss_from_config, policy_loss
from roleagent_jax.rl.opener_probs import opener_probabilities
from roleagent_jax.rl.ppo import ppo_batch
from roleagent_jax.types import Row


def case():
    rng = np.random.default_rng(3)
    b, t = 3, 6
    old = rng.normal(-1.5, 0.5, (b, t))
    logp = old + rng.normal(0.0, 0.3, (b, t))
    ref = logp + rng.normal(0.0, 0.5, (b, t))
    adv = np.array([1.2, -0.8, 0.5])
    mask = np.ones((b, t))
    mask[2, 4:] = 0.0
    ent = rng.uniform(0.1, 2.0, (b, t))
    guided = np.zeros((b, t))
    guided[0, :3] = 0.7  # row 0's first three tokens are the expert's
    return [jnp.asarray(x, jnp.float32) for x in (logp, old, ref, adv, mask, ent, guided)]


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
@pytest.mark.parametrize("guided", ["shaped", "nll"])
def test_the_guided_loss_changes_only_the_experts_tokens_and_off_is_todays_loss(guided, agg):
    logp, old, ref, adv, mask, ent, weight = case()

    def loss(lp, **kw):
        num, den, _ = policy_loss(lp, old, ref, adv, mask, ent, agg=agg, **kw)
        return num / den

    plain = jax.grad(loss)(logp)
    # off: the default config's loss, with or without a weight grid, is today's exactly
    for kw in ({"guided": "none"}, {"guided": "none", "guided_weight": weight}, {"guided": guided,
               "guided_weight": jnp.zeros_like(weight)}):  # fmt: skip
        assert float(loss(logp, **kw)) == float(loss(logp))
        np.testing.assert_array_equal(jax.grad(lambda x, kw=kw: loss(x, **kw))(logp), plain)
    fn = loss_from_config(LossConfig(agg=agg))
    assert float(fn(logp, old, ref, adv, mask, ent)[0]) == float(policy_loss(logp, old, ref, adv, mask, ent,
                                                                              agg=agg)[0])  # fmt: skip
    # on: the gradient differs from today's on the expert's tokens, and only there
    grad = jax.grad(lambda x: loss(x, guided=guided, guided_weight=weight))(logp)
    expert = np.asarray(weight) > 0
    np.testing.assert_array_equal(np.asarray(grad)[~expert], np.asarray(plain)[~expert])
    assert (np.abs(np.asarray(grad) - np.asarray(plain))[expert] > 1e-6).all()


def test_shaped_and_nll_gradients_match_the_hand_computed_values():
    """One row of two tokens, the first the expert's (p = 0.05), no KL or entropy, token-mean over 2:
    shaped d/dlogp = -A p gamma / (p + gamma)^2 / 2 (no clip however far p moved), nll = -w / 2."""
    p, a, gamma, w = 0.05, 2.0, 0.1, 0.6
    logp = jnp.log(jnp.array([[p, 0.5]], jnp.float32))
    old = jnp.log(jnp.array([[0.001, 0.5]], jnp.float32))  # ratio 50 on the expert's token: unclipped
    mask, adv = jnp.ones((1, 2)), jnp.array([a])
    weight = jnp.array([[1.0, 0.0]])

    def loss(lp, guided, weight):
        num, den, _ = policy_loss(lp, old, None, adv, mask, kl_type="none", guided=guided,
                                  guided_weight=weight, guided_gamma=gamma)  # fmt: skip
        return num / den

    shaped = jax.grad(loss)(logp, "shaped", weight)
    assert float(shaped[0, 0]) == pytest.approx(-a * p * gamma / (p + gamma) ** 2 / 2, rel=1e-5)
    assert float(shaped[0, 0]) == pytest.approx(-0.2222222, rel=1e-5)
    assert float(loss(logp, "shaped", weight)) == pytest.approx(
        (-a * p / (p + gamma) - a * 1.0) / 2, rel=1e-5
    )
    nll = jax.grad(loss)(logp, "nll", w * weight)
    assert float(nll[0, 0]) == pytest.approx(-w / 2, rel=1e-6)
    assert float(shaped[0, 1]) == float(nll[0, 1]) == pytest.approx(-a / 2)  # the other token: plain PPO
    _, _, sums = policy_loss(logp, old, None, adv, mask, kl_type="none", guided="nll", guided_weight=weight)
    assert float(sums["guided_tokens"]) == 1 and float(sums["guided_prob"]) == pytest.approx(p)


def test_the_nll_weight_decays_from_mu_to_mu_end_and_shaped_weighs_one():
    cfg = LossConfig(guided="nll", guided_mu=0.9, guided_mu_end=0.1)
    assert [round(cfg.guided_weight(i, 5), 6) for i in range(5)] == [0.9, 0.7, 0.5, 0.3, 0.1]
    assert LossConfig(guided="shaped").guided_weight(3, 5) == 1.0
    assert LossConfig().guided_weight(0, 5) is None


def rows():
    def row(forced, expert, n=4):
        return Row(list(range(3, 8)), list(range(10, 10 + n)), [-0.5] * n, 0, 0, 0, 1, 0, 0.0, True, False,
                   forced_tokens=forced, expert_tokens=expert)  # fmt: skip

    return [row(0, 0), row(2, 0), row(4, 4)]  # sampled, a policy's opener, the expert's whole step


def test_the_batch_marks_the_experts_tokens_and_off_leaves_it_as_today():
    kw = dict(pad_id=0, max_prompt=16, max_response=8, mini_batch_rows=4)
    adv = np.ones(3, np.float32)
    off = ppo_batch(rows(), adv, **kw)
    assert "guided_weight" not in off
    start = 5
    assert off["loss_mask"][:3, start : start + 4].tolist() == [[1] * 4, [0, 0, 1, 1], [0] * 4]
    on = ppo_batch(rows(), adv, guided_weight=0.5, **kw)
    assert on["loss_mask"][:3, start : start + 4].tolist() == [[1] * 4, [0, 0, 1, 1], [1] * 4]
    expected = np.zeros_like(on["loss_mask"])
    expected[2, start : start + 4] = 0.5
    np.testing.assert_array_equal(on["guided_weight"], expected)  # the padding row weighs nothing
    for k in off:  # the rest is today's (the expert's tokens now carry the row's log-probs, never read)
        if k not in ("loss_mask", "target_index"):
            np.testing.assert_array_equal(off[k][[0, 1, 3]], on[k][[0, 1, 3]])


def test_guided_needs_the_experts_step_and_expert_settings_need_expert_branch():
    qa = load_config("search_qa_demo")
    qa.model.path, qa.model.required = "", False
    qa.loss.guided = "nll"
    qa.rollout.expert_slots, qa.rollout.expert_when = 2, "no_win"
    with pytest.raises(ValueError) as err:
        validate(qa)
    for line in ("--config.loss.guided='nll': needs rollout.expert_branch=True",
                 "--config.rollout.expert_slots=2: needs rollout.expert_branch=True",
                 "--config.rollout.expert_when='no_win': needs rollout.expert_branch=True"):  # fmt: skip
        assert line in str(err.value)
    qa.rollout.branch_at, qa.rollout.expert_branch = 1, True
    validate(qa)
    qa.rollout.expert_slots = qa.rollout.group_size
    with pytest.raises(ValueError, match=f"expert_slots={qa.rollout.group_size}: must be below"):
        validate(qa)


def test_the_opener_probability_is_the_product_of_its_token_probabilities():
    """Against a direct computation: the tiny model's next-token softmax applied token by token."""
    cfg = Qwen2Config(vocab_size=40, hidden_size=16, intermediate_size=24, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)  # fmt: skip
    model = Qwen2ForCausalLM(cfg, rngs=nnx.Rngs(1))
    graphdef, params = nnx.split(model)
    prompts = [("bridge", [5, 6, 7, 8]), ("single", [9, 10]), ("bridge", [11, 12, 13])]
    openers = [("<s>", [20, 21]), ("<a>", [22])]
    got = opener_probabilities(prompts, openers, lambda b: np.asarray(make_logprob_fn(graphdef)(params, b)),
                               pad_id=0, rows_multiple=4)  # fmt: skip

    def direct(prompt, opener):
        ids, p = list(prompt), 1.0
        for tok in opener:
            x = jnp.asarray([ids])
            logits = model(x, jnp.ones_like(x), jnp.arange(len(ids))[None])[0, -1]
            p *= float(jax.nn.softmax(logits.astype(jnp.float32))[tok])
            ids.append(tok)
        return p

    for text, ids in openers:
        each = {i: direct(p, ids) for i, (_, p) in enumerate(prompts)}
        assert got[f"rollout/opener_prob/{text}/bridge"] == pytest.approx((each[0] + each[2]) / 2, rel=1e-4)
        assert got[f"rollout/opener_prob/{text}/single"] == pytest.approx(each[1], rel=1e-4)
        assert got[f"rollout/opener_prob/{text}/all"] == pytest.approx(sum(each.values()) / 3, rel=1e-4)
    assert len(got) == 6


@pytest.mark.slow
def test_a_guided_no_win_iteration_runs_through_the_trainer_and_logs_each_openers_probability(tmp_path):
    """One search-QA iteration of a tiny random model with every setting on: the groups (none wins)
    replay with the expert's step, the update trains its tokens by the NLL term, and the opener
    probabilities at the branch state are logged."""
    from conftest import shrunk

    from roleagent_jax.envs import get_family
    from roleagent_jax.run.trainer import Trainer

    c = shrunk(load_config("search_qa_demo"), tmp_path / "run")
    c.model.path, c.model.required = "", False
    c.rollout.group_size, c.rollout.branch_at, c.rollout.branch_openers = 3, 1, True
    c.rollout.expert_branch, c.rollout.expert_when, c.rollout.train_openers = True, "no_win", True
    c.loss.guided, c.env.eval_splits, c.env.num_workers = "nll", (), 1
    c.train.old_logprobs = "recompute"
    trainer = Trainer(c)
    try:
        metrics = trainer.iteration(0)
    finally:
        trainer.close()
    for opener in get_family("search_qa").action_openers:
        assert 0 < metrics[f"rollout/opener_prob/{opener}/all"] < 1
    assert metrics["update/guided_tokens"] > 0 and 0 < metrics["update/guided_prob"] < 1
    assert metrics["time/opener_prob"] > 0
