"""How right are AIW's failure labels? The ALFWorld heuristic analyser against faulty experts.

    python benchmarks/aiw.py [--games 36] [--max-steps 30] [--gen-dir DIR] [--compare OLD_HEURISTIC.py]
                             [--checkpoint MODEL_DIR]

Generates games of every task type (known expert plans), plays each with every faulty expert that
applies (envs/alfworld/faulty.py: one known mistake each, played through the episode loop), and
labels every failed episode with the heuristic analyser. Prints the label mix, the per-type
precision/recall table and, as the last line, one JSON object {"bench": "aiw", "macro_precision",
"macro_recall", ...}; the macro averages run over the types some faulty expert makes (the types no
expert makes are listed as "unobserved"). `--compare` labels the same set with another heuristic
module (a file path) and prints its label mix too, for a before/after view.

`--checkpoint` also asks a saved model (a Hugging Face folder such as `<workdir>/hf_final`) to analyse
every trajectory with the analyst prompt the training loop uses (greedy, `aiw.max_tokens` tokens) and
reports its parse rate (answers that name a failure type of the taxonomy) and, on all trajectories,
its accuracy and macro precision / recall, an unusable answer counting as wrong (`model_*` keys).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere
from benchmarks.common import demo_config  # noqa: E402
from roleagent_jax.aiw.taxonomy import UNKNOWN
from roleagent_jax.envs import get_family
from roleagent_jax.envs.alfworld.engine import AlfWorldEnv
from roleagent_jax.envs.alfworld.faulty import play_faulty
from roleagent_jax.envs.alfworld.heuristic import analyse
from roleagent_jax.envs.alfworld.procgen import generated_pool
from roleagent_jax.envs.alfworld.taxonomy import FAILURE_TYPES


def scores(truth: list[str], pred: list[str], types: list[str]) -> dict[str, dict[str, float]]:
    """Per-type precision, recall and support (precision 0 where a type was never predicted)."""
    out = {}
    for t in types:
        tp = sum(a == t and b == t for a, b in zip(truth, pred))
        n_pred, n_true = sum(b == t for b in pred), sum(a == t for a in truth)
        out[t] = {
            "precision": tp / n_pred if n_pred else 0.0,
            "recall": tp / n_true if n_true else 0.0,
            "support": n_true,
        }
    return out


def mix(labels: list[str]) -> str:
    n = len(labels)
    return ", ".join(f"{k} {v / n:.0%}" for k, v in Counter(labels).most_common())


def model_labels(checkpoint: str, family, trajectories: list, max_tokens: int) -> list:
    """The model's own analyses of `trajectories`, parsed: what the `llm` analyser sees in training."""
    import jax

    from roleagent_jax.aiw.loop import analysis_request
    from roleagent_jax.aiw.report_parser import parse_failure_report
    from roleagent_jax.evaluation.policy import ModelPolicy
    from roleagent_jax.sampling import SamplingParams

    policy = ModelPolicy(checkpoint, family, temperature=0.0)
    requests = [analysis_request(t, family, policy.encode, max_tokens) for t in trajectories]
    # the backend's sampler serves them in chunks of its largest batch
    results = policy.backend.generate(requests, SamplingParams(temperature=0.0), jax.random.PRNGKey(0))
    return [parse_failure_report(r.text, family) for r in results]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--games", type=int, default=36, help="generated games (task types in turn)")
    ap.add_argument("--max-steps", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--gen-dir", default=None, help="where generated games go (default: a temp folder)")
    ap.add_argument("--compare", default=None, help="another heuristic module file to label the set with")
    ap.add_argument("--checkpoint", default=None, help="a saved model (HF folder) to analyse the set too")
    ap.add_argument(
        "--max-tokens",
        type=int,
        default=demo_config().aiw.max_tokens,
        help="the model analyst's answer length",
    )
    args = ap.parse_args()

    start = time.perf_counter()
    gen_dir = args.gen_dir or tempfile.mkdtemp(prefix="aiw_bench_")
    pool = generated_pool(gen_dir, n=args.games, seed=args.seed)
    family = get_family("alfworld")
    labelled = play_faulty(family, pool, AlfWorldEnv(args.max_steps), max_steps=args.max_steps)
    truth = [label for _, _, label in labelled]
    pred = [analyse(tr, args.max_steps).failure_type for tr, _, _ in labelled]
    seconds = time.perf_counter() - start

    observed = sorted(set(truth))
    table = scores(truth, pred, observed)
    compare: dict[str, float] = {}
    print(f"{len(labelled)} failed trajectories from {len(pool)} games in {seconds:.0f}s")
    print(f"ground truth: {mix(truth)}")
    print(f"heuristic:    {mix(pred)}")
    if args.compare:
        spec = importlib.util.spec_from_file_location("other_heuristic", args.compare)
        other = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = other  # dataclasses look their module up while the file runs
        spec.loader.exec_module(other)
        other_analyse = getattr(other, "analyse", None) or other.heuristic_analyse  # older files' name
        before = [other_analyse(tr, args.max_steps).failure_type for tr, _, _ in labelled]
        old = scores(truth, before, observed)
        compare = {
            "compare_macro_precision": round(sum(r["precision"] for r in old.values()) / len(old), 4),
            "compare_macro_recall": round(sum(r["recall"] for r in old.values()) / len(old), 4),
        }
        print(f"{args.compare}: {mix(before)}; macro precision/recall {list(compare.values())}")
    model: dict[str, float | int] = {}
    if args.checkpoint:
        reports = model_labels(args.checkpoint, family, [tr for tr, _, _ in labelled], args.max_tokens)
        said = [r.failure_type for r in reports]
        own = scores(truth, said, observed)
        model = {
            "model_parse_rate": round(sum(r.failure_type != UNKNOWN for r in reports) / len(reports), 4),
            "model_accuracy": round(sum(a == b for a, b in zip(truth, said)) / len(truth), 4),
            "model_macro_precision": round(sum(r["precision"] for r in own.values()) / len(own), 4),
            "model_macro_recall": round(sum(r["recall"] for r in own.values()) / len(own), 4),
        }
        print(f"model analyst ({args.checkpoint}): {mix(said)}; {model}")
    print(f"{'failure type':32s} {'precision':>9s} {'recall':>7s} {'support':>7s}")
    for t, row in table.items():
        print(f"{t:32s} {row['precision']:9.3f} {row['recall']:7.3f} {row['support']:7d}")
    macro_p = sum(r["precision"] for r in table.values()) / len(table)
    macro_r = sum(r["recall"] for r in table.values()) / len(table)
    print(
        json.dumps(
            {
                "bench": "aiw",
                "games": len(pool),
                "trajectories": len(labelled),
                "macro_precision": round(macro_p, 4),
                "macro_recall": round(macro_r, 4),
                "accuracy": round(sum(a == b for a, b in zip(truth, pred)) / len(truth), 4),
                "observed": observed,
                "unobserved": sorted(set(FAILURE_TYPES) - set(observed)),
                "seconds": round(seconds, 1),
                **compare,
                **model,
            }
        )
    )


if __name__ == "__main__":
    main()
