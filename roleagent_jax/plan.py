"""The memory planner's command: `python -m roleagent_jax.plan --help` (`planner.cli`)."""

import sys

from roleagent_jax.planner.cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv))
