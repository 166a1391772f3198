"""Play every task of a split once with a policy and report success per task type.

    python -m roleagent_jax.evaluate --policy=expert --split=valid_seen --data=DIR
    python -m roleagent_jax.evaluate --env=alfworld --policy=random --split=gen_unseen --gen-n=24

The panel is fixed: the pool's task list, every task exactly once, each task's randomness seeded by
(seed, task id, step) so the result does not depend on worker count or batching. The last line printed
on stdout is one JSON object: {"split", "n", "success", "per_type", "lost", ...}. Episodes lost to the
environment (a retriever down, a crashed or hung worker) count in no rate; more than --max-lost-share of
them exits 3 after the summary.

A policy is any callable mapping a batch of `episodes.Turn` to response texts in the family's answer
format; the shared episode loop parses them. `--env` picks the family (default alfworld); the family's
own generation settings are flags too (ALFWorld: --num-receptacles, --num-objects; a mapping such as
search QA's --mix as NAME=VALUE,NAME=VALUE or JSON).

A model the trainer exported (`--checkpoint=<workdir>/hf_final`, `hf_warmstart`) carries what its run
was trained and evaluated with (`trained_settings`): the family and its options, the episode length, the
evaluation's generated games (count and seed), games per split, decoding and sampling seed. They are the
defaults here, so `--checkpoint` and `--split` alone replay the run's own evaluation; a flag given
overrides its value, and a line on stderr says which.
"""

from roleagent_jax.evaluation.cli import main

if __name__ == "__main__":
    main()
