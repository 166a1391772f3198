"""benchmarks/learning.py's tables: the behaviour rates each evaluated model reports, per seed."""

from benchmarks.learning import behaviour_lines, reported


def test_behaviour_rates_per_model_and_seed():
    """Only the models and splits whose evaluations reported rates are kept; each model's line gives every
    rate's value per seed, "-" where a seed's evaluation lacked it."""
    rates = {"second_search_needed": 0.25, "second_search_not_needed": 0.0, "needs_second_search": 4}
    behaviour = {
        "warm start": {"gen_test": [rates, rates]},
        "gigpo": {"gen_test": [{**rates, "second_search_needed": 0.5}, {"needs_second_search": 4}]},
        "grpo": {"gen_test": [{}, {}]},
    }
    kept = reported(behaviour)
    assert list(kept) == ["warm start", "gigpo"] and kept["gigpo"] == behaviour["gigpo"]
    assert behaviour_lines(kept) == [
        "warm start  gen_test: second_search_needed 0.250/0.250, second_search_not_needed 0.000/0.000, "
        "needs_second_search 4/4",
        "gigpo       gen_test: second_search_needed 0.500/-, second_search_not_needed 0.000/-, "
        "needs_second_search 4/4",
    ]
    assert reported({"warm start": {"gen_seen": [{}]}, "grpo": {}}) == {}  # a family without rates


def test_the_panel_plays_with_the_runs_prompt_and_rules(monkeypatch, tmp_path):
    """The extra panel evaluates a saved model with the family configured as the run's was: the demo's
    compact prompt and listed-commands rule, not the family's defaults (with those, a model trained on the
    compact prompt answers the paper's prompt with nothing valid)."""
    from conftest import load_config

    import benchmarks.learning as learning
    from roleagent_jax.evaluation import panel, policy

    seen = []
    monkeypatch.setattr(policy, "ModelPolicy", lambda *a, **k: "policy")
    monkeypatch.setattr(
        panel, "evaluate", lambda pol, family, *a, **k: seen.append(family.options) or {"success": 0.5}
    )
    c = load_config("demo")
    assert learning.panel_success(tmp_path, None, c, 2, "gen_unseen") == 0.5
    assert len(seen) == 2 and all(o["prompt"] == "compact" and o["valid"] == "available" for o in seen)
    assert (c.env.alfworld.prompt, c.env.alfworld.valid) == ("compact", "available")
