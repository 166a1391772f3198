"""Generation on the real workload: the sampler calls of real RL iterations, replayed through the
project's sampler and through ``transformers.generate`` on the same prompts, side by side.

    # 1. record: real iterations of a real-model config (updates included, so later prompts come from
    #    the trained policy), every backend call's requests and sampling settings -> calls.json
    python benchmarks/generation_replay.py record --config configs/search_qa_smol.py --iterations 2 \
        --out /tmp/sqa_calls.json --rows-out /tmp/sqa_rows.jsonl
    python benchmarks/generation_replay.py record --config configs/webshop_smol.py --iterations 2 \
        --out /tmp/ws_calls.json --rows-out /tmp/ws_rows.jsonl
    # 2. replay: the same calls through both, alternating call by call
    python benchmarks/generation_replay.py replay --calls /tmp/sqa_calls.json [--max-calls N]
    python benchmarks/generation_replay.py replay --calls /tmp/ws_calls.json
    # the shapes the project's sampler runs each call in (no model, seconds): chunks, padded positions
    python benchmarks/generation_replay.py plan --calls /tmp/sqa_calls.json

``record`` takes ``--config`` with any ``--set KEY=VALUE`` overrides (as ``--config.KEY=VALUE`` of the
training command); no warm start runs (``warmstart.steps=0``), so unless ``model.path`` names a
warm-started checkpoint the policy is the base SmolLM2, and the output says so. ``--rows-out`` writes the
iterations' training rows (``prompt_ids``, ``response_ids``) for ``benchmarks/update_torch.py
--rows-file``.

``replay`` loads the recorded model directory into both: the project's ``JaxBackend`` gets each call as
recorded (group prefixes, stop strings, response limits, background rows, temperature / top-p /
top-k); ``transformers.generate`` gets the same prompts, left-padded and batched by (max new tokens,
stop strings), with the same limits, ``stop_strings``, the end-of-turn ids as EOS and the same
temperature. Reports generated tokens/s and seconds per iteration's generation for each side and the
ratio (project / transformers, > 1: the project is faster). Compilation is not excluded from the
project's time unless ``--warm`` (each call runs once untimed first, both sides). Last line: one JSON
object.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks.common import print_json  # noqa: E402
from roleagent_jax.evaluation.trained_settings import SETTINGS_FILE  # noqa: E402
from roleagent_jax.sampling import SampleRequest, SamplingParams  # noqa: E402


def call_record(requests, sampling: SamplingParams, results, iteration: int, seconds: float) -> dict:
    """One backend call as JSON: its requests, sampling settings, and how many tokens each answer took."""
    return {
        "iteration": iteration,
        "seconds": round(seconds, 4),
        "sampling": {
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": sampling.top_k,
            "greedy": sampling.greedy,
        },
        "requests": [
            {
                "prompt_ids": [int(t) for t in r.prompt_ids],
                "max_new_tokens": r.max_new_tokens,
                "stop": list(r.stop),
                "role": r.role,
                "group": None if r.group is None else repr(r.group),
                "background": r.background,
            }
            for r in requests
        ],
        "generated": [len(x.token_ids) for x in results],
    }


def requests_of(call: dict) -> list[SampleRequest]:
    return [
        SampleRequest(
            prompt_ids=r["prompt_ids"],
            max_new_tokens=r["max_new_tokens"],
            stop=tuple(r["stop"]),
            role=r["role"],
            group=r["group"],
            background=r["background"],
        )
        for r in call["requests"]
    ]


class Recorder:
    """Wraps a backend's ``generate``: every call goes through and is kept as a ``call_record``."""

    def __init__(self, backend):
        self.backend, self.calls, self.iteration = backend, [], 0
        self._generate = backend.generate
        backend.generate = self

    def __call__(self, requests, sampling, key):
        start = time.perf_counter()
        results = self._generate(requests, sampling, key)
        self.calls.append(
            call_record(requests, sampling, results, self.iteration, time.perf_counter() - start)
        )
        return results


def record(args) -> dict:
    from roleagent_jax.config.files import load_config_file
    from roleagent_jax.run.trainer import Trainer

    overrides = [*args.set, "warmstart.steps=0", f"workdir={tempfile.mkdtemp(prefix='genreplay_')}"]
    config = load_config_file(args.config, overrides)
    trainer = Trainer(config, args.config)
    recorder = Recorder(trainer.backend)
    rows = []
    capture = trainer._update

    def update(batch_rows, adv, it):  # the iteration's training rows, then the real update
        rows.extend({"prompt_ids": r.prompt_ids, "response_ids": r.response_ids} for r in batch_rows)
        return capture(batch_rows, adv, it)

    trainer._update = update
    try:
        for it in range(args.iterations):
            recorder.iteration = it
            trainer.iteration(it)
    finally:
        trainer.close()
    model_dir = str(Path(config.model.path or Path(config.workdir) / "hf_init").expanduser().absolute())
    out = {
        "config": args.config,
        "overrides": args.set,
        "model": model_dir,
        # a model this project trained carries its run's settings; the base checkpoint does not
        "warm_started": (Path(model_dir) / SETTINGS_FILE).is_file(),
        "note": "no warm start ran here: the policy is the config's model.path",
        "iterations": args.iterations,
        "calls": recorder.calls,
    }
    Path(args.out).write_text(json.dumps(out))
    if args.rows_out:
        Path(args.rows_out).write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = {
        "bench": "generation_record",
        "config": args.config,
        "model": out["model"],
        "iterations": args.iterations,
        "calls": len(recorder.calls),
        "requests": sum(len(c["requests"]) for c in recorder.calls),
        "generated_tokens": sum(sum(c["generated"]) for c in recorder.calls),
        "rows": len(rows),
        "out": args.out,
    }
    print(out["note"])
    return summary


def hf_batches(call: dict) -> list[tuple[int, tuple[str, ...], list[list[int]]]]:
    """A call's prompts grouped by (max new tokens, stop strings): one ``generate`` each."""
    groups: dict[tuple[int, tuple[str, ...]], list[list[int]]] = defaultdict(list)
    for r in call["requests"]:
        groups[(r["max_new_tokens"], tuple(r["stop"]))].append(r["prompt_ids"])
    return [(n, stop, prompts) for (n, stop), prompts in groups.items()]


class TorchGenerate:
    """``transformers.generate`` on left-padded batches, stopping at the end-of-turn ids and the stops."""

    def __init__(self, model_dir: str, eos: list[int]):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        torch.set_num_threads(os.cpu_count() or 1)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.eos = eos
        self.pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else eos[0]

    def call(self, call: dict, seed: int) -> int:
        """Runs every batch of ``call``; returns the tokens generated (each row up to its EOS / stop)."""
        torch = self.torch
        sampling = call["sampling"]
        greedy = sampling["greedy"] or sampling["temperature"] == 0.0
        torch.manual_seed(seed)
        total = 0
        for max_new, stop, prompts in hf_batches(call):
            width = max(len(p) for p in prompts)
            ids = torch.full((len(prompts), width), self.pad, dtype=torch.long)
            mask = torch.zeros_like(ids)
            for i, p in enumerate(prompts):
                ids[i, width - len(p) :] = torch.tensor(p)
                mask[i, width - len(p) :] = 1
            options = dict(
                do_sample=not greedy, max_new_tokens=max_new, eos_token_id=self.eos, pad_token_id=self.pad
            )
            if not greedy:
                options.update(
                    temperature=sampling["temperature"], top_p=sampling["top_p"], top_k=sampling["top_k"]
                )
            if stop:
                options.update(stop_strings=list(stop), tokenizer=self.tokenizer)
            with torch.no_grad():
                out = self.model.generate(input_ids=ids, attention_mask=mask, **options)[:, width:]
            total += generated_tokens(out.numpy(), self.eos, self.pad)
        return total


def generated_tokens(out: np.ndarray, eos: list[int], pad: int) -> int:
    """Tokens ``generate`` produced per row, up to and including its first EOS (then padding follows)."""
    total = 0
    for row in out:
        ends = np.flatnonzero(np.isin(row, eos))
        total += int(ends[0] + 1) if ends.size else int(np.sum(row != pad))  # a stop string pads the rest
    return total


def replay(args) -> dict:
    from flax import nnx

    from roleagent_jax.backends import make_backend
    from roleagent_jax.models import load_pretrained
    from roleagent_jax.models.tokenizer import eos_ids, load_tokenizer
    from roleagent_jax.sampling.plan import capped_batch_buckets

    recording = json.loads(Path(args.calls).read_text())
    calls = recording["calls"][: args.max_calls] if args.max_calls else recording["calls"]
    if not calls:
        raise SystemExit(f"{args.calls}: no recorded calls")
    model_dir = args.model or recording["model"]
    model, model_config = load_pretrained(model_dir)
    tokenizer = load_tokenizer(model_dir)
    graphdef, params = nnx.split(model)
    rows = max(len(c["requests"]) for c in calls)
    backend = make_backend(
        "jax",
        graphdef,
        model_config,
        tokenizer,
        eos_ids=eos_ids(tokenizer),
        batch_buckets=capped_batch_buckets(rows),
    )
    backend.update_weights(params)
    hf = TorchGenerate(model_dir, eos_ids(tokenizer))

    def ours(i, call):
        sampling = SamplingParams(**call["sampling"])
        results = backend.generate(requests_of(call), sampling, jax.random.key(i))
        return sum(len(r.token_ids) for r in results)

    def theirs(i, call):
        return hf.call(call, i)

    sides = {"jax": ours, "transformers": theirs}
    seconds = {s: 0.0 for s in sides}
    tokens = {s: 0 for s in sides}
    for i, call in enumerate(calls):
        for side, fn in sides.items():
            if args.warm:
                fn(i, call)
            start = time.perf_counter()
            tokens[side] += fn(i, call)
            seconds[side] += time.perf_counter() - start
        print(
            f"call {i + 1}/{len(calls)}: {len(call['requests'])} requests, "
            + ", ".join(f"{s} {seconds[s]:.1f}s {tokens[s]} tokens" for s in sides),
            flush=True,
        )
    iterations = len({c["iteration"] for c in calls})
    rate = {s: tokens[s] / max(seconds[s], 1e-9) for s in sides}
    print(
        f"model {model_dir} (warm-started: {recording.get('warm_started', False)}); "
        + "; ".join(f"{s} {rate[s]:.1f} tok/s" for s in sides)
    )
    return {
        "bench": "generation_replay",
        "config": recording.get("config"),
        "model": model_dir,
        "warm_started": recording.get("warm_started", False),
        "calls": len(calls),
        "requests": sum(len(c["requests"]) for c in calls),
        "iterations": iterations,
        "tokens": tokens,
        "tokens_per_s": {s: round(v, 1) for s, v in rate.items()},
        "s_per_iteration": {s: round(seconds[s] / iterations, 2) for s in sides},
        "speedup_vs_transformers": round(rate["jax"] / max(rate["transformers"], 1e-9), 3),
        "time_ratio_transformers_over_jax": round(seconds["transformers"] / max(seconds["jax"], 1e-9), 3),
        "warm": args.warm,
    }


def plan(args) -> dict:
    """The chunks ``replay`` runs each recorded call in through the project's sampler (`Sampler.plan`,
    with its buckets), from the requests alone: their shapes, and prefilled positions against the
    prompts' real tokens. The compile charge is the recorded model's (SmolLM2's where its folder is gone)."""
    from roleagent_jax.models.config import Qwen2Config
    from roleagent_jax.sampling.plan import (
        SMOLLM2_WEIGHTS,
        Buckets,
        capped_batch_buckets,
        cost_model,
        plan_call,
    )

    recording = json.loads(Path(args.calls).read_text())
    calls = recording["calls"][: args.max_calls] if args.max_calls else recording["calls"]
    buckets = Buckets.make(capped_batch_buckets(max(len(c["requests"]) for c in calls)))
    found = (Path(recording["model"]) / "config.json").is_file()
    weights = Qwen2Config.from_hf(recording["model"]).matmul_weights if found else SMOLLM2_WEIGHTS
    if not found:
        print(f"no config.json in {recording['model']}: the compile is charged as for SmolLM2", flush=True)
    model = cost_model(args.platform, weights)
    foreground, rows = 0, []
    for i, call in enumerate(calls):
        planned = plan_call(requests_of(call), buckets, model, foreground)
        foreground = planned.foreground_rows or foreground
        shapes = [
            f"{c.rows}x{c.prompt_bucket}"
            + (f" + {c.layout.groups}x{c.layout.prefix_bucket} shared" if c.layout else "")
            + f" /{c.new_tokens} new"
            for c in planned.chunks
        ]
        rows.append({"requests": len(call["requests"]), "waiting": len(planned.waiting), "chunks": shapes,
                     "prefill_positions": planned.prefill_positions, "real_tokens": planned.real_tokens})  # fmt: skip
        print(f"call {i + 1}: {rows[-1]['requests']} requests ({rows[-1]['waiting']} wait): "
              f"{', '.join(shapes)}; prefill {planned.prefill_positions} positions for "
              f"{planned.real_tokens} prompt tokens", flush=True)  # fmt: skip
    return {
        "bench": "generation_plan",
        "calls_file": args.calls,
        "platform": args.platform,
        "batch_buckets": list(buckets.batch),
        "prompt_buckets": list(buckets.prompt),
        "calls": rows,
        "prefill_positions": sum(r["prefill_positions"] for r in rows),
        "real_tokens": sum(r["real_tokens"] for r in rows),
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="record the sampler calls of real iterations")
    rec.add_argument("--config", required=True)
    rec.add_argument("--set", action="append", default=[], help="KEY=VALUE, as --config.KEY=VALUE")
    rec.add_argument("--iterations", type=int, default=2)
    rec.add_argument("--out", required=True)
    rec.add_argument("--rows-out", default=None)
    rep = sub.add_parser("replay", help="replay recorded calls through both samplers")
    rep.add_argument("--calls", required=True)
    rep.add_argument("--model", default=None, help="default: the recorded model directory")
    rep.add_argument("--max-calls", type=int, default=0)
    rep.add_argument("--warm", action="store_true", help="run each call once untimed first (compiles)")
    shapes = sub.add_parser("plan", help="the sampler's chunks and padded positions for each recorded call")
    shapes.add_argument("--calls", required=True)
    shapes.add_argument("--max-calls", type=int, default=0)
    shapes.add_argument("--platform", default=jax.default_backend(), help="cost model: cpu, gpu or tpu")
    args = parser.parse_args(argv)
    summary = {"record": record, "replay": replay, "plan": plan}[args.command](args)
    print_json(summary)
    return summary


if __name__ == "__main__":
    main()
