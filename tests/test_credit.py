"""Credit in hand-made ALFWorld groups: which action the advantages push up, under each setting.

Each group is written as episodes of (state, observation, action, valid) steps, the way the engine
reports them: the observation is what the agent read before acting, the state the engine's facts.
"""

from __future__ import annotations

import numpy as np

from roleagent_jax.rl.advantages import hash_anchor, row_advantages
from roleagent_jax.types import Row

WIN = 10.0
NOTHING = "Nothing happens."
DRESSER = "You arrive at dresser 1. On the dresser 1, you see a laptop 1."
START = "You are in the middle of a room."
SETTINGS = dict(gamma=0.95, omega=1.0, mode="mean_norm", invalid_penalty=0.1, anchor_similarity=1.0)


def rows_of(episodes: list[list[tuple[str, str, str, bool]]], won: list[bool]) -> list[Row]:
    rows = []
    for traj, (steps, win) in enumerate(zip(episodes, won, strict=True)):
        for t, (state, obs, _action, valid) in enumerate(steps):
            reward = WIN if win and t == len(steps) - 1 else 0.0
            rows.append(Row([], [], [], traj, 0, 0, t, hash_anchor(obs), reward, valid, False, obs, state))
    return rows


def by_episode(adv: np.ndarray, rows: list[Row]) -> list[float]:
    return [
        float(sum(a for a, r in zip(adv, rows) if r.traj_id == t)) for t in sorted({r.traj_id for r in rows})
    ]


def test_a_small_penalty_on_malformed_output_cannot_make_a_valid_loop_the_best_failure():
    """All three episodes fail. Under the old demo setting (2.0 on every unavailable command) the one
    that loops on available commands earned the most; with the reference's 0.1 on malformed output only,
    the loop and the episode that made progress and then mistyped a command are a penalty's width apart."""
    loop = [("s0", START, "look", True)] * 15
    progress = [("s0", START, "go to sidetable 1", True), ("s1", "...", "take phone 1", True)]
    progress += [("s2", "...", "go to dresser 1", True)] + [
        ("s3", DRESSER, "put phone in dreser 1", True)
    ] * 12
    junk = [("s0", START, "<act", False)] * 15
    rows = rows_of([loop, progress, junk], [False, False, False])
    old_rows = [
        Row(**{**r.__dict__, "valid": r.traj_id == 0 or (r.traj_id == 1 and r.step_index < 3)}) for r in rows
    ]
    old = by_episode(
        row_advantages(old_rows, anchor="state", **{**SETTINGS, "invalid_penalty": 2.0}), old_rows
    )
    assert old[0] > 15 and old[0] > old[1] + 10  # validity, not progress, was the reward
    new = by_episode(row_advantages(rows, anchor="state", **SETTINGS), rows)
    # what separates them now is at most the penalty, counted over fifteen steps at two levels
    assert abs(new[0] - new[1]) < 15 * 0.1 and max(map(abs, new)) < 15 * 0.1 * 2


def test_state_anchors_keep_a_failing_loop_out_of_the_winners_step_group():
    """The winner reaches the dresser holding the phone; a failing episode arrives at the same dresser text
    seven times with empty hands. By observation text the loop's visits share the winner's step group and
    inflate the winning move's credit; by state the winning move is compared with nothing it did not share."""
    winner = [("start", START, "go to sidetable 1", True), ("side", "...", "take phone 1", True)]
    winner += [("holding", "...", "go to dresser 1", True), ("dresser+phone", DRESSER, "put phone 1", True)]
    loop = [("start", START, "go to dresser 1", True)]
    for _ in range(7):
        loop += [
            ("dresser", DRESSER, "go to sidetable 1", True),
            ("side-empty", "...", "go to dresser 1", True),
        ]
    rows = rows_of([winner, loop], [True, False])
    put = next(i for i, r in enumerate(rows) if r.traj_id == 0 and r.step_index == 3)
    by_obs = row_advantages(rows, anchor="observation", **SETTINGS)
    by_state = row_advantages(rows, anchor="state", **SETTINGS)
    episode_only = row_advantages(rows, anchor="state", **{**SETTINGS, "omega": 0.0})
    assert by_state[put] == episode_only[put]  # its state is its own: no step-level credit from the loop
    assert by_obs[put] - episode_only[put] > 8.0  # 10 against seven visits at 0 by the dresser's text
    loop_at_dresser = [i for i, r in enumerate(rows) if r.traj_id == 1 and r.state == "dresser"]
    np.testing.assert_allclose(by_state[loop_at_dresser], episode_only[loop_at_dresser], atol=1e-6)


def test_state_anchors_tell_a_progress_move_from_a_useless_one_after_nothing_happens():
    """Two failing episodes each get "Nothing happens." once: one holding the phone by the dresser (then it
    goes on to the shelf), one at the start with empty hands (then it looks around). A winner also passes
    the start. By observation both moves sit in one step group and score exactly alike; by state each is
    compared with the moves made from its own state."""
    winner = [("start", START, "go to sidetable 1", True), ("side", "...", "take phone 1", True)]
    winner += [("holding", "...", "go to shelf 1", True), ("shelf+phone", "...", "put phone 1", True)]
    progress = [("start", START, "go to sidetable 1", True), ("side", "...", "take phone 1", True)]
    progress += [("dresser+phone", DRESSER, "put phone in dreser 1", True)]
    progress += [
        ("dresser+phone", NOTHING, "go to shelf 1", True),
        ("shelf+phone", "...", "examine shelf 1", True),
    ]
    useless = [
        ("start", START, "jump", True),
        ("start", NOTHING, "look", True),
        ("start", "...", "look", True),
    ]
    rows = rows_of([winner, progress, useless], [True, False, False])
    shelf = next(i for i, r in enumerate(rows) if r.traj_id == 1 and r.step_index == 3)
    look = next(i for i, r in enumerate(rows) if r.traj_id == 2 and r.step_index == 1)
    by_obs = row_advantages(rows, anchor="observation", **SETTINGS)
    by_state = row_advantages(rows, anchor="state", **SETTINGS)
    obs_episode = row_advantages(rows, anchor="observation", **{**SETTINGS, "omega": 0.0})
    assert by_obs[shelf] - obs_episode[shelf] == by_obs[look] - obs_episode[look]  # one step group, alike
    # by state, the useless look shares the start with the winner's first move and loses against it
    episode_only = row_advantages(rows, anchor="state", **{**SETTINGS, "omega": 0.0})
    assert by_state[look] - episode_only[look] < -1.0
    assert by_state[shelf] - episode_only[shelf] == 0.0  # only its own mistyped move shares that state
