"""Tokens of a config's warm-start rows under each prompt option: what choosing a prompt costs.

    python benchmarks/prompt_tokens.py --config=configs/webshop_smol.py
    python benchmarks/prompt_tokens.py --config=configs/search_qa_smol.py

On a CPU a train step costs in proportion to its tokens (SmolLM2-135M: forward + backward ~110
tokens/s), so a prompt is chosen by what it costs on the rows the warm start trains on. The expert
plays the config's warm-start goals; each agent row is the chat-templated prompt plus the target,
counted with the config's tokenizer (the checkpoint's). Plays no model. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import print_json  # noqa: E402
from roleagent_jax.config import family_options  # noqa: E402
from roleagent_jax.envs import EnvPool, get_family  # noqa: E402
from roleagent_jax.models.tokenizer import chat_prompt, load_tokenizer  # noqa: E402
from roleagent_jax.run.setup import EXPERT_MAX_STEPS  # noqa: E402
from roleagent_jax.run.warmstart import examples_from_episodes, expert_episodes  # noqa: E402

# (label, family options changed, history_k): the config's own first, then the alternatives.
VARIANTS = {
    "webshop": [
        ("compact, earlier page cut to 160 chars, k=1", {"prompt": "compact", "history_chars": 160}, 1),
        ("compact, whole earlier page, k=1", {"prompt": "compact", "history_chars": 0}, 1),
        ("compact, no earlier page", {"prompt": "compact", "history_chars": 160}, 0),
        ("reference, earlier page cut to 160 chars, k=1", {"prompt": "reference", "history_chars": 160}, 1),
        ("reference, whole pages, k=2 (the paper's)", {"prompt": "reference", "history_chars": 0}, 2),
    ],
    "search_qa": [
        ("compact, passages cut to 1200 chars, k=2", {"prompt": "compact", "passage_chars": 1200}, 2),
        ("compact, passages cut to 400 chars, k=2", {"prompt": "compact", "passage_chars": 400}, 2),
        ("compact, passages cut to 600 chars, k=1", {"prompt": "compact", "passage_chars": 600}, 1),
        ("reference, whole passages, k=4 (the paper's)",
         {"prompt": "reference", "passage_chars": 0, "valid": "format", "wording": "search_r1"}, 4),
    ],
}  # fmt: skip


def load_config(path: str):
    spec = importlib.util.spec_from_file_location("config", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


def row_tokens(config, options: dict, history_k: int, tokenizer, gen_dir: str) -> list[int]:
    """Tokens of each agent row the warm start would train on under `options`."""
    family = get_family(config.env.name)
    opts = dict(family_options(config, family), **options)
    configured = family.configured(opts)
    pool = configured.task_pool(
        config.env.train_split, gen_dir=gen_dir, n=config.env.gen.n_train, seed=config.env.gen.seed,
        options=opts,
    )  # fmt: skip
    ids = list(range(min(config.warmstart.n_games or len(pool), len(pool))))  # as the trainer picks them
    with EnvPool(configured, pool, num_workers=1, max_steps=EXPERT_MAX_STEPS) as envs:
        trajs = expert_episodes(configured, envs, ids, EXPERT_MAX_STEPS)
    rows = examples_from_episodes(trajs, configured, history_k, 1, predictor=False)
    return [
        len(tokenizer.encode(chat_prompt(tokenizer, r.prompt), add_special_tokens=False))
        + len(tokenizer.encode(r.target, add_special_tokens=False))
        for r in rows
    ]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", required=True, help="a config file with model.path (its tokenizer is used)")
    args = p.parse_args()
    config = load_config(args.config)
    tokenizer = load_tokenizer(config.tokenizer.path or config.model.path)
    out = []
    with tempfile.TemporaryDirectory() as gen_dir:
        for label, options, history_k in VARIANTS[config.env.name]:
            n = row_tokens(config, options, history_k, tokenizer, gen_dir)
            out.append({"prompt": label, "rows": len(n), "mean": round(statistics.mean(n)), "max": max(n),
                        "total": sum(n)})  # fmt: skip
            print(
                f"{label}: {len(n)} rows, mean {out[-1]['mean']}, longest {max(n)}, all {sum(n)}", flush=True
            )
    print_json({"config": args.config, "variants": out})


if __name__ == "__main__":
    main()
