"""AIW's label mix in a finished ALFWorld run, and its absent-entity claims checked against the games.

    python benchmarks/aiw_labels.py [--workdir runs/demo]

Reads the run's failure memory (`failure_memory.jsonl`: every failed episode AIW analysed, with its
label) and prints the share of each label per iteration. The heuristic labels an episode
`entity_confusion` when the policy named an object or receptacle that nothing in the episode showed;
whether that entity really is absent is a fact of the game, so each such claim is checked against the
game's full entity list (`AlfWorldEnv.entities()`, seen or not). The last line is one JSON object
{"bench": "aiw_labels", "top_share_max", "absent_claims", "absent_confirmed", ...}.

The run must use the embedded default's generated training split (its games are in the workdir).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from benchmarks.common import demo_config  # noqa: E402
from roleagent_jax.envs import get_family  # noqa: E402
from roleagent_jax.envs.alfworld.engine import AlfWorldEnv  # noqa: E402
from roleagent_jax.run.setup import make_task_pool  # noqa: E402

_ABSENT = re.compile(r"names ([a-z]+ \d+), which nothing in the episode showed")


def label_mix(records: list[dict]) -> dict[int, Counter]:
    mix: dict[int, Counter] = defaultdict(Counter)
    for r in records:
        mix[int(r["iteration"])][r["failure_type"]] += 1
    return dict(sorted(mix.items()))


def check_absent(records: list[dict], workdir: Path) -> tuple[int, int, list[str]]:
    """(claims, confirmed, examples of refuted claims) over the records naming an absent entity."""
    config = demo_config("alfworld")
    pool = make_task_pool(config, get_family("alfworld"), config.env.train_split, workdir, "train")
    env = AlfWorldEnv(config.env.max_steps)
    claims = confirmed = 0
    refuted = []
    for r in records:
        m = _ABSENT.search(r.get("detail", ""))
        if not m:
            continue
        env.reset(pool.tasks[int(r["task_id"])])
        claims += 1
        if m.group(1) in env.entities():
            refuted.append(f"task {r['task_id']}: {r['detail']}")
        else:
            confirmed += 1
    return claims, confirmed, refuted


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", default="runs/demo", help="a finished run of configs/demo.py")
    args = ap.parse_args()
    workdir = Path(args.workdir)
    path = workdir / "failure_memory.jsonl"
    if not path.is_file():
        sys.exit(f"no failure memory at {path}: run the demo first (or pass --workdir)")
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    mix = label_mix(records)
    top = {}
    print("| iteration | failures | label mix |\n|---|---|---|")
    for it, counts in mix.items():
        total = sum(counts.values())
        top[it] = max(counts.values()) / total
        cells = ", ".join(f"{k} {100 * v / total:.0f}%" for k, v in counts.most_common())
        print(f"| {it} | {total} | {cells} |")
    claims, confirmed, refuted = check_absent(records, workdir)
    print(f"\nabsent-entity claims: {claims}, confirmed by the game: {confirmed}")
    for line in refuted[:10]:
        print(f"  refuted: {line}")
    print(
        json.dumps(
            {
                "bench": "aiw_labels",
                "workdir": str(workdir),
                "failures": len(records),
                "top_share_max": round(max(top.values(), default=0.0), 4),
                "top_share_by_iteration": {str(k): round(v, 4) for k, v in top.items()},
                "absent_claims": claims,
                "absent_confirmed": confirmed,
            }
        )
    )


if __name__ == "__main__":
    main()
