"""The helpers of benchmarks/update_torch.py and benchmarks/generation_replay.py on tiny models."""

import json

import numpy as np
import pytest

from benchmarks import generation_replay as replay
from benchmarks import update_torch
from roleagent_jax.rl.ppo import pack_rows
from roleagent_jax.sampling import SampleRequest, SampleResult, SamplingParams


def test_trl_grid_left_pads_prompts_and_right_pads_responses():
    rows = [([1, 2, 3], [4, 5]), ([6], [7, 8, 9])]
    grid = update_torch.trl_grid(rows, pad_id=0)
    np.testing.assert_array_equal(grid["input_ids"], [[1, 2, 3, 4, 5, 0], [0, 0, 6, 7, 8, 9]])
    np.testing.assert_array_equal(grid["position_ids"][1, 2:], [0, 1, 2, 3])
    np.testing.assert_array_equal(grid["response_mask"], [[1, 1, 0], [1, 1, 1]])
    values = [np.asarray([0.1, 0.2]), np.asarray([0.3, 0.4, 0.5])]
    np.testing.assert_allclose(
        update_torch.on_grid(values, grid["response_mask"]), [[0.1, 0.2, 0], [0.3, 0.4, 0.5]]
    )
    ours = pack_rows([p for p, _ in rows], [r for _, r in rows], 0)
    placed = update_torch.on_grid(values, ours["loss_mask"])
    np.testing.assert_allclose(placed[ours["loss_mask"] > 0], [0.1, 0.2, 0.3, 0.4, 0.5])


def test_synthetic_rows_follow_the_length_ranges(tmp_path):
    rows = update_torch.synthetic_rows(50, 100, prompt=(150, 420), response=(1, 32))
    assert all(150 <= len(p) <= 420 and 1 <= len(r) <= 32 for p, r in rows)
    assert all(0 < t < 100 for p, r in rows for t in p + r)
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps({"prompt_ids": p, "response_ids": r}) + "\n" for p, r in rows[:3]))
    assert update_torch.read_rows(path) == rows[:3]
    path.write_text('{"prompt_ids": [], "response_ids": [1]}\n')
    with pytest.raises(ValueError, match="rows.jsonl:1"):
        update_torch.read_rows(path)


def test_update_torch_tiny_run_first_losses_agree():
    """The whole benchmark on a tiny random model: torch + peft and the project (plain and packed) reach
    the same first-step loss with and without KL (the run asserts it), and packing pads less."""
    pytest.importorskip("torch")
    pytest.importorskip("peft")
    record = update_torch.main(["--tiny", "--rows", "4", "--rounds", "1"])
    for name in ("no_kl", "kl"):
        first = record[name]["first_loss"]
        assert first["torch"] == pytest.approx(first["jax"], rel=1e-3, abs=1e-4)
        assert all(v > 0 for v in record[name]["s_per_row"].values())
    share = record["padded_share"]
    assert 0 <= share["packed"] < share["grid"] < 1
    assert record["lora"]["top_layers"] == 2


def test_call_record_round_trips_and_batches_by_limits():
    requests = [
        SampleRequest([1, 2, 3], 8, ("</a>",), group=(0, 1)),
        SampleRequest([4, 5], 8, ("</a>",), group=(0, 1)),
        SampleRequest([6], 4, (), role="world"),
    ]
    results = [SampleResult([7, 8], [-0.1, -0.2], "x", "stop", "agent")] * 3
    call = json.loads(json.dumps(replay.call_record(requests, SamplingParams(0.7), results, 2, 1.5)))
    back = replay.requests_of(call)
    assert [r.prompt_ids for r in back] == [[1, 2, 3], [4, 5], [6]]
    assert back[0].group == back[1].group != back[2].group and back[0].stop == ("</a>",)
    assert call["sampling"]["temperature"] == 0.7 and call["generated"] == [2, 2, 2]
    assert replay.hf_batches(call) == [(8, ("</a>",), [[1, 2, 3], [4, 5]]), (4, (), [[6]])]


def test_generated_tokens_counts_up_to_the_first_eos():
    out = np.asarray([[5, 6, 2, 0, 0], [5, 6, 7, 8, 9], [5, 0, 0, 0, 0]])
    assert replay.generated_tokens(out, eos=[2], pad=0) == 3 + 5 + 1


def test_replay_tiny_model(tmp_path):
    """Recorded calls replayed through both samplers on a tiny model: greedy answers, same lengths."""
    pytest.importorskip("torch")
    from qwen2_tiny import game_tokenizer, sampling_qwen2

    tok = game_tokenizer()
    sampling_qwen2(len(tok)).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    prompts = [tok.encode(t)[:12] for t in ("You arrive at the kitchen.", "Nothing happens. You open")]
    requests = [SampleRequest(p, 6, ("fridge",)) for p in prompts]
    results = [SampleResult([], [], "", "length", "agent")] * 2
    calls = [replay.call_record(requests, SamplingParams(temperature=0.0), results, 0, 0.0)]
    path = tmp_path / "calls.json"
    path.write_text(json.dumps({"model": str(tmp_path), "calls": calls, "warm_started": False}))
    record = replay.main(["replay", "--calls", str(path)])
    assert record["tokens"]["jax"] == record["tokens"]["transformers"] > 0
    assert record["iterations"] == 1 and record["requests"] == 2


def test_plan_gives_each_recorded_calls_chunks_without_a_model(tmp_path):
    """6 prompts of 60 tokens and 6 of 700 (the 12-row bucket, as `replay` caps it): one chunk would
    prefill 12 x 768 positions; the CPU plan runs 8 x 64 + 8 x 768."""
    requests = [SampleRequest([3] * (60 if i % 2 else 700), 16) for i in range(12)]
    results = [SampleResult([], [], "", "length", "agent")] * 12
    calls = [replay.call_record(requests, SamplingParams(), results, 0, 0.0)]
    path = tmp_path / "calls.json"
    path.write_text(json.dumps({"model": "unused", "calls": calls}))
    record = replay.main(["plan", "--calls", str(path), "--platform", "cpu"])
    assert record["calls"][0]["chunks"] == ["8x64 /16 new", "8x768 /16 new"]
    assert (record["prefill_positions"], record["real_tokens"]) == (8 * 64 + 8 * 768, 6 * 60 + 6 * 700)
