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
