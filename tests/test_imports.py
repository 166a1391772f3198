"""The package's import graph runs down the floors of docs/architecture.md and has no circle, counting
imports inside functions (they run as well) and those made only for type checking (a circle of types is
a circle of meaning, even when nothing runs it).

The floors, lowest first, are the rooms (sub-packages) and root modules of the package: a module imports
from its own room or from a room on a lower floor, never from one on its own floor or above.

The environment packages stay on their floor: nothing they import, directly or through the modules they
import, at module level or inside a function, reaches JAX or the device floors' modules (the mesh, the
model, the sampler, the backends and the RL update), so environment worker processes never load them.
Imports made only for type checking do not run and are not counted there."""

import ast
from collections import deque
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "roleagent_jax"

# The floors, lowest first; rooms on one floor do not import each other. "" is the package's own
# `__init__`, which imports nothing of it.
FLOORS: tuple[tuple[str, ...], ...] = (
    ("", "types"),  # plain records
    ("envs",),  # the environment contract, the families, the episode loop: no JAX
    ("parallel",),  # the mesh, partition rules, multi-host helpers
    ("models",),  # the model, checkpoints in and out, LoRA, the tokenizer
    ("sampling",),  # the jitted KV-cache sampler
    ("backends",),  # rollout backends around the sampler
    ("rl",),  # advantages, the PPO loss and update, log-probs, the optimizer, the trained weights
    ("wia", "aiw"),  # world-in-agent (its credit scales the advantages); failure analysis, task sampling
    ("config",),  # every key, its default and checks
    ("evaluation", "planner"),  # playing a split with a policy; the memory planner
    ("run",),  # a training run
    ("main", "evaluate", "plan"),  # the commands
)

# What environment code must never reach: JAX and its libraries, and the device floors' rooms.
DEVICE_LIBRARIES = ("jax", "jaxlib", "flax", "optax", "orbax")
MODEL_FLOOR = tuple(f"roleagent_jax.{room}" for room in ("parallel", "models", "sampling", "backends", "rl"))


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """Ids of the import nodes under an ``if TYPE_CHECKING:`` (they never run)."""
    found = set()
    for node in ast.walk(tree):
        test = getattr(node, "test", None) if isinstance(node, ast.If) else None
        name = test.id if isinstance(test, ast.Name) else getattr(test, "attr", None)
        if name == "TYPE_CHECKING":
            found |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return found


def import_tables(typing_only: bool = True) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """Per module of the package: the package modules it imports, and the outside packages it imports
    (top-level names). ``typing_only=False`` leaves out imports made only for type checking."""
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    outside: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        skip = set() if typing_only else _type_checking_nodes(tree)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges, external = set(), set()
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(
                        package.split(".")[: len(package.split(".")) - node.level + 1] + [base]
                    ).strip(".")
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            else:
                continue
            edges |= {t for t in targets if t in modules and t != name}
            external |= {t.split(".")[0] for t in targets if t.split(".")[0] != PACKAGE.name}
        graph[name], outside[name] = edges, external
    return graph, outside


def import_graph() -> dict[str, set[str]]:
    return import_tables()[0]


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    found, state = [], {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                found.append(path[path.index(nxt) :] + [nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return found


def floor_breaches(
    graph: dict[str, set[str]],
    outside: dict[str, set[str]],
    start: str,
    modules: tuple[str, ...],
    libraries: tuple[str, ...],
) -> list[list[str]]:
    """For each module under ``start`` that reaches one of ``modules`` (or a module under one) or one of
    the outside ``libraries``: the shortest import chain that does. Importing ``a.b.c`` runs the
    ``a`` and ``a.b`` packages too, so a module also reaches its parent packages."""

    def banned(name: str) -> bool:
        return any(name == m or name.startswith(m + ".") for m in modules)

    def parents(name: str) -> list[str]:
        parts = name.split(".")
        return [p for p in (".".join(parts[:i]) for i in range(1, len(parts))) if p in graph]

    breaches = []
    for first in sorted(m for m in graph if m == start or m.startswith(start + ".")):
        came_from, queue = {first: None}, deque([first])
        while queue:
            node = queue.popleft()
            hit = next((lib for lib in sorted(outside.get(node, ())) if lib in libraries), None)
            if banned(node) or hit:
                chain = [node] + ([hit] if hit else [])
                while came_from[chain[0]] is not None:
                    chain.insert(0, came_from[chain[0]])
                breaches.append(chain)
                break
            for nxt in sorted(graph[node] | set(parents(node))):
                if nxt not in came_from:
                    came_from[nxt] = node
                    queue.append(nxt)
    return breaches


def room_of(module: str) -> str:
    """``roleagent_jax.rl.ppo`` -> ``rl``; a root module is its own room; the package itself is ``""``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def upward_imports(graph: dict[str, set[str]], floors: tuple[tuple[str, ...], ...]) -> list[str]:
    """Every import that does not run down the floors (to a room above, or to another room on its own
    floor), and every room no floor names, one line each."""
    floor = {room: level for level, rooms in enumerate(floors) for room in rooms}
    found = sorted({f"room {room_of(m)!r} is on no floor" for m in graph if room_of(m) not in floor})
    for module, targets in sorted(graph.items()):
        here = room_of(module)
        for target in sorted(targets):
            there = room_of(target)
            if here in floor and there in floor and there != here and floor[there] >= floor[here]:
                found.append(f"{module} -> {target}")
    return found


def test_floor_check_finds_an_upward_import():
    floors = (("", "types"), ("envs",), ("rl", "wia"), ("run",))
    graph = {
        "p": set(),
        "p.types": set(),
        "p.envs.base": {"p.types"},
        "p.rl.ppo": {"p.envs.base", "p.rl.losses"},
        "p.rl.losses": set(),
        "p.wia.shaping": {"p.envs.base"},
        "p.run.trainer": {"p.rl.ppo", "p.wia.shaping"},
    }
    assert upward_imports(graph, floors) == []
    graph["p.envs.base"].add("p.wia.shaping")  # a lazy import up a floor
    graph["p.wia.shaping"].add("p.rl.losses")  # a sibling room on the same floor
    graph["p.scale.mesh"] = set()  # a room no floor names
    assert upward_imports(graph, floors) == [
        "room 'scale' is on no floor",
        "p.envs.base -> p.wia.shaping",
        "p.wia.shaping -> p.rl.losses",
    ]


def test_imports_run_down_the_floors():
    graph = import_graph()
    assert "roleagent_jax.run.trainer" in graph and graph["roleagent_jax.envs.base"]
    assert upward_imports(graph, FLOORS) == []


def test_cycle_finder_finds_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c", "a"]]


def test_no_import_circle_in_the_package():
    graph = import_graph()
    assert "roleagent_jax.envs.base" in graph and graph["roleagent_jax.envs.pool"]
    assert cycles(graph) == []


def test_floor_check_finds_jax_and_model_code_through_other_modules():
    graph = {
        "p": set(),
        "p.envs": set(),
        "p.envs.a": {"p.text"},
        "p.envs.b": set(),
        "p.envs.c": {"p.tools"},
        "p.text": set(),
        "p.tools": set(),
        "p.tools.deep": set(),
        "p.models": set(),
        "p.models.qwen": set(),
    }
    outside = {"p.text": {"re"}, "p.envs.b": {"numpy"}}
    assert floor_breaches(graph, outside, "p.envs", ("p.models",), ("jax",)) == []
    outside["p.text"].add("jax")  # an env module reaches JAX through a helper it imports
    graph["p.envs.b"].add("p.models.qwen")  # another imports model code directly
    graph["p.tools"].add("p.tools.deep")
    graph["p.tools.deep"].add("p.models")  # a third reaches it two modules away
    assert floor_breaches(graph, outside, "p.envs", ("p.models",), ("jax",)) == [
        ["p.envs.a", "p.text", "jax"],
        ["p.envs.b", "p.models.qwen"],
        ["p.envs.c", "p.tools", "p.tools.deep", "p.models"],
    ]
    # a package's own __init__ runs when one of its modules is imported
    assert floor_breaches(
        {"q": {"q.m"}, "q.m": set(), "q.e": set()}, {"q.m": {"jax"}}, "q.e", (), ("jax",)
    ) == [["q.e", "q", "q.m", "jax"]]


def test_environment_packages_import_no_jax_and_no_model_code():
    graph, outside = import_tables(typing_only=False)
    assert "roleagent_jax.envs.alfworld.family" in graph and all(m in graph for m in MODEL_FLOOR)
    assert floor_breaches(graph, outside, "roleagent_jax.envs", MODEL_FLOOR, DEVICE_LIBRARIES) == []
