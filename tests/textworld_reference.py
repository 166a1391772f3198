"""Plain textworld, in a process of its own: the independent reference for our cached, memoized engine.

Our `roleagent_jax.envs.alfworld` changes textworld inside the process that imports it (its string
parsers remember what they parsed), so a reference in the test process would share the change. This
script never imports roleagent_jax. Run as

    python tests/textworld_reference.py GAME_FILE A B STEPS

it plays STEPS commands, command k being admissible[(A * k + B) % len(admissible)], under alfworld's
own wrappers, and prints one JSON list: [feedback, admissible commands] after the reset and each step.
"""

import json
import sys


def main() -> None:
    import textworld
    from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos
    from textworld.envs.pddl import PddlEnv

    game, a, b, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    env = AlfredInfos(AlfredDemangler(PddlEnv(textworld.EnvInfos(won=True, admissible_commands=True))))
    env.load(game)
    state = env.reset()
    out = [[state.feedback, state["admissible_commands"]]]
    for k in range(steps):
        cmds = state["admissible_commands"]
        state, _, _ = env.step(cmds[(a * k + b) % len(cmds)])
        out.append([state.feedback, state["admissible_commands"]])
    assert "roleagent_jax" not in sys.modules
    print(json.dumps(out))


def transcript(game: str, a: int, b: int, steps: int) -> list[list]:
    """The reference's transcript of one game (see the module docstring), from a fresh interpreter."""
    import subprocess

    done = subprocess.run(
        [sys.executable, __file__, str(game), str(a), str(b), str(steps)],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
