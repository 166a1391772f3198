"""A pretrained model, untrained here, on one family's held-out generated tasks with the paper's prompt.

    python benchmarks/zero_shot.py --model ~/.cache/roleagent_jax/SmolLM2-135M-Instruct --family webshop

The tasks are the family's demo evaluation pool (the demo config's generator settings, the first
``--n`` held-out tasks); the prompt settings (history window, prompt budget) are the paper config's.
Steps and the response budget are capped by flags because a CPU cannot afford the paper's. Reported,
with standard errors over tasks: the share of responses in the expected format (a parsable action),
the share of valid actions, success and the family's score; plus a few responses quoted verbatim.
The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere
from benchmarks.common import mean_se, print_json  # noqa: E402
from roleagent_jax.envs.registry import get_family  # noqa: E402
from roleagent_jax.evaluation.panel import evaluate_trajectories  # noqa: E402
from roleagent_jax.evaluation.policy import ModelPolicy  # noqa: E402
from roleagent_jax.run.setup import make_task_pool  # noqa: E402

# family -> (demo config, paper config)
CONFIGS = {
    "alfworld": ("configs/demo.py", "configs/alfworld.py"),
    "webshop": ("configs/webshop_demo.py", "configs/webshop.py"),
    "search_qa": ("configs/search_qa_demo.py", "configs/search_qa.py"),
}


def _config(path: str):
    module = importlib.import_module(Path(path).with_suffix("").as_posix().replace("/", "."))
    return module.get_config()


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="a Hugging Face Llama / Qwen2 directory")
    p.add_argument("--family", required=True, choices=sorted(CONFIGS))
    p.add_argument("--n", type=int, default=48, help="held-out tasks")
    p.add_argument("--max-steps", type=int, default=0, help="steps per episode (0: the demo config's)")
    p.add_argument("--max-response-tokens", type=int, default=160)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--batch-size", type=int, default=48)
    p.add_argument("--workdir", default="runs/zero_shot", help="where the generated tasks are written")
    p.add_argument("--quotes", type=int, default=6, help="responses quoted verbatim")
    args = p.parse_args(argv)

    demo_path, paper_path = CONFIGS[args.family]
    demo, paper = _config(demo_path), _config(paper_path)
    demo.env.gen.n_eval = args.n
    family = get_family(args.family)
    split = demo.env.eval_splits[-1]
    workdir = Path(args.workdir) / args.family
    pool = make_task_pool(demo, family, split, workdir, "eval")
    max_steps = args.max_steps or int(demo.env.max_steps)
    settings = {
        "history_k": int(paper.env.history_k),
        "max_prompt_tokens": int(paper.rollout.max_prompt_tokens),
        "max_response_tokens": args.max_response_tokens,
    }
    policy = ModelPolicy(args.model, family, args.temperature, settings=settings)
    start = time.perf_counter()
    trajs = evaluate_trajectories(
        policy, family, pool, num_workers=2, max_steps=max_steps, batch_size=args.batch_size
    )
    seconds = time.perf_counter() - start

    steps = [s for t in trajs for s in t.steps]
    fmt = mean_se([float(s.parsed) for s in steps])
    valid = mean_se([float(s.valid) for s in steps])
    success = mean_se([float(t.won) for t in trajs])
    out = {
        "family": args.family,
        "model": str(args.model),
        "split": split,
        "n": len(trajs),
        "steps": len(steps),
        "max_steps": max_steps,
        "settings": settings,
        "temperature": args.temperature,
        "format": fmt,
        "valid": valid,
        "success": success,
        "seconds": round(seconds, 1),
    }
    if any(t.score is not None for t in trajs):
        out[family.score_name] = mean_se([t.score or 0.0 for t in trajs])
    first = [t.steps[0].response for t in trajs if t.steps]
    out["common_first_responses"] = Counter(first).most_common(3)
    out["quotes"] = [
        {"goal": t.goal, "step": i, "response": s.response, "action": s.action, "valid": s.valid}
        for t in trajs[: args.quotes]
        for i, s in enumerate(t.steps[:2])
    ]
    for key in ("format", "valid", "success", family.score_name):
        if key in out:
            m, se = out[key]
            print(f"{key:8s} {100 * m:5.1f} +- {100 * se:4.1f} %", file=sys.stderr)
    print_json(out)
    return out


if __name__ == "__main__":
    main()
