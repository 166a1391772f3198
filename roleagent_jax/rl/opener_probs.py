"""The policy's probability of each action opener at the branch state: whether the choice the branches
exist to teach moves, read every iteration instead of after a whole run.

One log-prob pass over one row per opener per task group (the group leader's branch-state prompt with
the opener appended, `rollout.RolloutResult.branch_prompts`), so it costs a small fraction of the
update's own passes.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Sequence

import jax.numpy as jnp
import numpy as np

from roleagent_jax.rl.logprobs import MODEL_KEYS, TARGET_KEY
from roleagent_jax.rl.ppo import pack_rows


def opener_probabilities(
    branch_prompts: Sequence[tuple[str, Sequence[int]]],
    openers: Sequence[tuple[str, Sequence[int]]],
    logprobs: Callable[[dict], np.ndarray],
    pad_id: int,
    rows_multiple: int = 1,
) -> dict[str, float]:
    """`rollout/opener_prob/<opener>/<type>`: the mean over task groups of a type (and `all`) of
    p(opener's tokens | branch-state prompt), the product of the opener's token probabilities.

    `branch_prompts`: (task type, prompt ids) per group; `openers`: (text, token ids); `logprobs`: token
    log-probs [B, T] of a `ppo.pack_rows` grid (the trainer's pass under the current policy), called on
    chunks of `rows_multiple` rows (padding rows repeat the first and are dropped)."""
    if not branch_prompts or not openers:
        return {}
    pairs = [(kind, prompt, text, ids) for kind, prompt in branch_prompts for text, ids in openers]
    packed = pack_rows([p for _, p, _, _ in pairs], [ids for *_, ids in pairs], pad_id)
    n = len(pairs)
    padded = -(-n // rows_multiple) * rows_multiple
    fill = np.concatenate([np.arange(n), np.zeros(padded - n, np.int64)])
    keys = (*MODEL_KEYS, "loss_mask", TARGET_KEY)
    grid = {k: packed[k][fill] for k in keys}
    lp = np.concatenate(
        [
            np.asarray(logprobs({k: jnp.asarray(v[s : s + rows_multiple]) for k, v in grid.items()}))
            for s in range(0, padded, rows_multiple)
        ]
    )[:n]
    prob = np.exp((lp * packed["loss_mask"]).sum(axis=1))
    by_key: dict[str, list[float]] = defaultdict(list)
    for (kind, _, text, _), p in zip(pairs, prob, strict=True):
        by_key[f"rollout/opener_prob/{text}/{kind}"].append(float(p))
        by_key[f"rollout/opener_prob/{text}/all"].append(float(p))
    return {k: float(np.mean(v)) for k, v in by_key.items()}


def opener_metrics(
    openers: Sequence[str],
    tokenizer,
    branch_prompts: Sequence[tuple[str, list[int]]],
    logprobs: Callable[[dict], np.ndarray],
    rows_multiple: int,
    times: dict[str, float],
) -> dict[str, float]:
    """`opener_probabilities` for the family's opener texts at the branch states an iteration played,
    under the policy that played them (before the update moves it); its seconds in
    ``times["opener_prob"]``. Nothing for a family without openers or an iteration without branches."""
    if not (openers and branch_prompts):
        return {}
    start = time.perf_counter()
    encoded = [(o, tokenizer.encode(o, add_special_tokens=False)) for o in openers]
    out = opener_probabilities(
        branch_prompts, encoded, logprobs, tokenizer.pad_token_id, rows_multiple=rows_multiple
    )
    times["opener_prob"] = time.perf_counter() - start
    return out
