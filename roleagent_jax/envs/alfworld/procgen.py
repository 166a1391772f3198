"""Procedurally generated ALFWorld games: the embedded default that needs no download.

Each game is a PDDL problem for the `alfred` domain and grammar shipped inside the alfworld package,
laid out exactly like a real `game.tw-pddl` (typed object/receptacle/location constants, the same
initial predicates, the goal formula and task sentence of alfworld's goal library), so it runs through
the same backend and reads in ALFWorld's own words. Rooms are small on purpose: a handful of
receptacles and objects keep expert solutions at roughly 4-12 steps and CPU episodes fast.

The `seen` and `unseen` pools split the (task type, room, object, receptacle) combinations so that no
combination of one pool appears in the other. Every game is checked by alfworld's expert (the planner
plan is played on the engine and must win) before it is kept; failures are resampled.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import random
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import alfworld
from alfworld.gen.goal_library import gdict

from roleagent_jax.envs.alfworld.engine import AlfWorldEnv, memoize_textworld_parsers
from roleagent_jax.envs.alfworld.games import GAME_FILE, TASK_TYPES, pool_from_files
from roleagent_jax.envs.base import TaskPool
from roleagent_jax.envs.pool import SPAWN, main_hidden

_DATA = Path(alfworld.__file__).resolve().parent / "data"
DOMAIN_FILE = _DATA / "alfred.pddl"
GRAMMAR_FILE = _DATA / "alfred.twl2"
POOLS = ("seen", "unseen")
UNSEEN_EVERY = 4  # one combination in four (per task type) is held out for the unseen pool

# ---------------------------------------------------------------------------------------------------
# The world model: which receptacles each room has, what each can hold, and object affordances.
# Kept small and checked against alfworld's own tables in the tests.
# ---------------------------------------------------------------------------------------------------
OPENABLE = frozenset({"Cabinet", "Drawer", "Fridge", "Microwave", "Safe"})
HEATABLE = frozenset({"Apple", "Bread", "Cup", "Egg", "Mug", "Plate", "Potato", "Tomato"})
COOLABLE = frozenset(
    {"Apple", "Bowl", "Bread", "Cup", "Egg", "Lettuce", "Mug", "Pan", "Plate", "Pot", "Potato", "Tomato", "WineBottle"}
)  # fmt: skip
CLEANABLE = frozenset(
    {"Apple", "Bowl", "ButterKnife", "Cloth", "Cup", "DishSponge", "Egg", "Fork", "Kettle", "Knife", "Ladle",
     "Lettuce", "Mug", "Pan", "Plate", "Pot", "Potato", "SoapBar", "Spatula", "Spoon", "Tomato"}
)  # fmt: skip
CONTAINER_OBJECTS = frozenset({"Bowl", "Cup", "Mug", "Pan", "Plate", "Pot"})
LAMP = "DeskLamp"
LAMP_HOLDERS = ("Desk", "SideTable", "Dresser")
APPLIANCE = {  # the receptacle a state-changing task must visit
    "pick_clean_then_place_in_recep": "SinkBasin",
    "pick_heat_then_place_in_recep": "Microwave",
    "pick_cool_then_place_in_recep": "Fridge",
}
TASK_ROOMS = {
    "pick_and_place_simple": ("kitchen", "livingroom", "bedroom", "bathroom"),
    "look_at_obj_in_light": ("livingroom", "bedroom"),
    "pick_clean_then_place_in_recep": ("kitchen", "bathroom"),
    "pick_heat_then_place_in_recep": ("kitchen",),
    "pick_cool_then_place_in_recep": ("kitchen",),
    "pick_two_obj_and_place": ("kitchen", "livingroom", "bedroom", "bathroom"),
}

_FOOD = ("Apple", "Bread", "Egg", "Lettuce", "Potato", "Tomato")
_DISHES = ("Bowl", "Cup", "Mug", "Pan", "Plate", "Pot")
_UTENSILS = ("ButterKnife", "Fork", "Knife", "Ladle", "Spatula", "Spoon")
_KITCHEN_MISC = ("DishSponge", "Kettle", "PepperShaker", "SaltShaker", "SoapBottle", "WineBottle")
_BATH = ("Candle", "Cloth", "DishSponge", "HandTowel", "SoapBar", "SoapBottle", "SprayBottle", "TissueBox",
         "ToiletPaper")  # fmt: skip
_DESK_SMALL = ("AlarmClock", "Book", "CD", "CellPhone", "CreditCard", "KeyChain", "Pen", "Pencil", "Watch")
_LIVING = ("Book", "Box", "CellPhone", "CreditCard", "KeyChain", "Laptop", "Newspaper", "RemoteControl", "Statue",
           "TissueBox", "Vase", "Watch")  # fmt: skip
_SEATS = (
    "Book",
    "Box",
    "CellPhone",
    "CreditCard",
    "KeyChain",
    "Laptop",
    "Newspaper",
    "Pillow",
    "RemoteControl",
)

ROOMS: dict[str, dict[str, tuple[str, ...]]] = {
    "kitchen": {
        "CounterTop": _FOOD + _DISHES + _UTENSILS + _KITCHEN_MISC,
        "DiningTable": _FOOD + _DISHES + _UTENSILS + _KITCHEN_MISC,
        "Cabinet": (
            "Bowl",
            "Cup",
            "DishSponge",
            "Kettle",
            "Ladle",
            "Mug",
            "Pan",
            "PepperShaker",
            "Plate",
            "Pot",
            "SaltShaker",
            "SoapBottle",
            "WineBottle",
        ),  # fmt: skip
        "Drawer": _UTENSILS + ("DishSponge", "PepperShaker", "SaltShaker"),
        "Fridge": tuple(sorted(COOLABLE)),  # the fridge holds everything it can cool
        "Microwave": ("Apple", "Bowl", "Bread", "Cup", "Egg", "Mug", "Plate", "Potato", "Tomato"),
        "SinkBasin": (
            "Apple",
            "Bowl",
            "ButterKnife",
            "Cup",
            "DishSponge",
            "Egg",
            "Fork",
            "Kettle",
            "Knife",
            "Ladle",
            "Lettuce",
            "Mug",
            "Pan",
            "Plate",
            "Pot",
            "Potato",
            "Spatula",
            "Spoon",
            "Tomato",
        ),  # fmt: skip
        "StoveBurner": ("Kettle", "Pan", "Pot"),
        "GarbageCan": (
            "Apple",
            "Bread",
            "DishSponge",
            "Egg",
            "Lettuce",
            "Potato",
            "SoapBottle",
            "Tomato",
            "WineBottle",
        ),
        "Shelf": (
            "Bowl",
            "Cup",
            "DishSponge",
            "Kettle",
            "Mug",
            "PepperShaker",
            "Plate",
            "Pot",
            "SaltShaker",
            "SoapBottle",
            "WineBottle",
        ),  # fmt: skip
    },
    "bathroom": {
        "CounterTop": _BATH,
        "Cabinet": _BATH,
        "Drawer": _BATH,
        "Shelf": _BATH,
        "Toilet": _BATH,
        "SinkBasin": ("Cloth", "DishSponge", "HandTowel", "SoapBar"),
        "BathtubBasin": ("Cloth", "DishSponge", "HandTowel", "SoapBar"),
        "GarbageCan": (
            "Cloth",
            "DishSponge",
            "HandTowel",
            "SoapBar",
            "SoapBottle",
            "SprayBottle",
            "TissueBox",
            "ToiletPaper",
        ),  # fmt: skip
        "HandTowelHolder": ("HandTowel",),
        "ToiletPaperHanger": ("ToiletPaper",),
    },
    "bedroom": {
        "Bed": ("BaseballBat", "Book", "CellPhone", "Laptop", "Pillow", "TennisRacket"),
        "Desk": _DESK_SMALL + ("Bowl", "Laptop", "Mug", "TennisRacket"),
        "Dresser": _DESK_SMALL + ("Bowl", "Laptop", "Mug", "TennisRacket"),
        "SideTable": _DESK_SMALL + ("BaseballBat", "Bowl", "Laptop", "Mug", "TennisRacket"),
        "Drawer": ("Book", "CD", "CellPhone", "CreditCard", "KeyChain", "Pen", "Pencil", "Watch"),
        "Shelf": _DESK_SMALL + ("Bowl", "Mug"),
        "GarbageCan": ("CD", "Pen", "Pencil"),
        "Safe": ("CD", "CellPhone", "CreditCard", "KeyChain", "Watch"),
        "ArmChair": ("Book", "CellPhone", "CreditCard", "KeyChain", "Laptop", "Pillow"),
    },
    "livingroom": {
        "Sofa": _SEATS,
        "ArmChair": _SEATS,
        "Ottoman": _SEATS,
        "CoffeeTable": _LIVING,
        "SideTable": _LIVING,
        "Dresser": _LIVING,
        "Drawer": (
            "Book",
            "CellPhone",
            "CreditCard",
            "KeyChain",
            "Newspaper",
            "RemoteControl",
            "TissueBox",
            "Watch",
        ),
        "Shelf": tuple(o for o in _LIVING if o != "Laptop"),
        "Cabinet": ("Book", "Box", "Newspaper", "TissueBox", "Vase"),
        "GarbageCan": ("Newspaper", "TissueBox"),
    },
}


def room_objects(room: str) -> list[str]:
    return sorted({o for objs in ROOMS[room].values() for o in objs})


def _holders(room: str, obj: str) -> list[str]:
    return sorted(r for r, objs in ROOMS[room].items() if obj in objs)


def _task_objects(task_type: str, room: str) -> list[str]:
    objs = room_objects(room)
    if task_type == "pick_clean_then_place_in_recep":
        objs = [o for o in objs if o in CLEANABLE]
    elif task_type == "pick_heat_then_place_in_recep":
        objs = [o for o in objs if o in HEATABLE]
    elif task_type == "pick_cool_then_place_in_recep":
        objs = [o for o in objs if o in COOLABLE]
    if task_type in APPLIANCE:  # the appliance must be in the room and able to hold what it treats
        objs = [o for o in objs if APPLIANCE[task_type] in ROOMS[room]]
    return objs


def task_combinations(task_type: str) -> list[tuple[str, str, str, str]]:
    """All (task_type, room, object, target) a game can be about; target is the lamp for look_at tasks."""
    combos = []
    for room in TASK_ROOMS[task_type]:
        for obj in _task_objects(task_type, room):
            holders = _holders(room, obj)
            if task_type == "look_at_obj_in_light":
                if holders:
                    combos.append((task_type, room, obj, LAMP))
                continue
            for recep in holders:
                if recep == APPLIANCE.get(task_type):
                    continue
                if len(holders) < 2:  # the object must start somewhere other than the target type
                    continue
                combos.append((task_type, room, obj, recep))
    return combos


def _combo_hash(combo: tuple[str, ...]) -> str:
    return hashlib.sha1("|".join(combo).encode()).hexdigest()


def pool_combinations(task_type: str, pool: str) -> list[tuple[str, str, str, str]]:
    """The combinations of one pool: a fixed, seed-independent split, so seen and unseen never overlap."""
    if pool not in POOLS:
        raise ValueError(f"pool must be one of {POOLS}, got {pool!r}")
    ranked = sorted(task_combinations(task_type), key=_combo_hash)
    held = {c for i, c in enumerate(ranked) if i % UNSEEN_EVERY == UNSEEN_EVERY - 1}
    return sorted(c for c in ranked if (c in held) == (pool == "unseen"))


# ---------------------------------------------------------------------------------------------------
# Sizes and one game.
# ---------------------------------------------------------------------------------------------------
def _as_range(name: str, value, minimum: int) -> tuple[int, int]:
    lo, hi = (value, value) if isinstance(value, int) else tuple(value)
    if not (isinstance(lo, int) and isinstance(hi, int)) or lo > hi or lo < minimum:
        raise ValueError(f"{name} must be an int or (lo, hi) with {minimum} <= lo <= hi, got {value!r}")
    return lo, hi


@dataclass(frozen=True)
class GenSize:
    """Room size: receptacles in the room, non-goal objects (distractors), and extra goal-type copies."""

    num_receptacles: int | tuple[int, int] = (4, 6)
    num_objects: int | tuple[int, int] = (2, 4)
    extra_targets: int | tuple[int, int] = (0, 1)
    max_expert_steps: int = 12

    def ranges(self) -> dict[str, tuple[int, int]]:
        return {
            "num_receptacles": _as_range("num_receptacles", self.num_receptacles, 2),
            "num_objects": _as_range("num_objects", self.num_objects, 0),
            "extra_targets": _as_range("extra_targets", self.extra_targets, 0),
        }


def _encode(text: str) -> str:
    """ALFRED's mangling of names into PDDL identifiers (alfworld's Demangler reverses it)."""
    for a, b in (("-", "_minus_"), ("|", "_bar_"), ("+", "_plus_"), (".", "_dot_")):
        text = text.replace(a, b)
    return text


def _coord(rng: random.Random) -> str:
    v = rng.randint(-400, 400) / 100
    return f"{'+' if v >= 0 else '-'}{abs(v):05.2f}"


@dataclass
class _Scene:
    room: str
    receptacles: list[tuple[str, str, str]] = field(default_factory=list)  # (id, type, location)
    objects: list[tuple[str, str, str]] = field(default_factory=list)  # (id, type, receptacle id)
    start: str = ""
    used: set = field(default_factory=set)

    def new_id(self, name: str, rng: random.Random, suffix: str = "") -> str:
        while True:
            ident = _encode(f"{name}|{_coord(rng)}|{_coord(rng)}|{_coord(rng)}{suffix}")
            if ident not in self.used:
                self.used.add(ident)
                return ident

    def new_location(self, rng: random.Random) -> str:
        while True:
            x, z = rng.randint(-12, 12), rng.randint(-12, 12)
            ident = _encode(f"loc|{x}|{z}|{rng.randint(0, 3)}|{rng.choice((0, 15, 30, 45, 60))}")
            if ident not in self.used:
                self.used.add(ident)
                return ident

    def add_receptacle(self, rtype: str, rng: random.Random) -> str:
        if rtype == "SinkBasin":
            ident = self.new_id("Sink", rng, "|SinkBasin")
        elif rtype == "BathtubBasin":
            ident = self.new_id("Bathtub", rng, "|BathtubBasin")
        else:
            ident = self.new_id(rtype, rng)
        self.receptacles.append((ident, rtype, self.new_location(rng)))
        return ident

    def add_object(self, otype: str, recep_id: str, rng: random.Random) -> None:
        self.objects.append((self.new_id(otype, rng), otype, recep_id))


def _build_scene(combo, size: dict, rng: random.Random) -> _Scene:
    task_type, room, obj, target = combo
    scene = _Scene(room)
    table = ROOMS[room]
    look = task_type == "look_at_obj_in_light"
    holders = _holders(room, obj)
    start_types = [r for r in holders if look or r != target]
    required = [] if look else [target]
    if task_type in APPLIANCE:
        required.append(APPLIANCE[task_type])
    lamp_holder = rng.choice([h for h in LAMP_HOLDERS if h in table]) if look else ""
    if look:
        required.append(lamp_holder)
    start_type = rng.choice(start_types)
    required.append(start_type)
    n_recep = max(rng.randint(*size["num_receptacles"]), len(set(required)))
    rtypes = list(dict.fromkeys(required))
    others = sorted(set(table) - set(rtypes))
    rng.shuffle(others)
    while len(rtypes) < n_recep:  # fill with new types first, then second copies of openable ones
        if others:
            rtypes.append(others.pop())
        else:
            rtypes.append(rng.choice(sorted(OPENABLE & set(table)) or sorted(table)))
    rng.shuffle(rtypes)
    ids = {}
    for rtype in rtypes:
        ids.setdefault(rtype, []).append(scene.add_receptacle(rtype, rng))

    def place(otype: str, allowed: list[str]) -> bool:
        options = [i for t in allowed if t in ids for i in ids[t]]
        if not options:
            return False
        scene.add_object(otype, rng.choice(options), rng)
        return True

    n_goal = 2 if task_type == "pick_two_obj_and_place" else 1
    n_goal += rng.randint(*size["extra_targets"])
    place(obj, [start_type])
    for _ in range(n_goal - 1):
        place(obj, start_types)
    if look:
        scene.add_object(LAMP, ids[lamp_holder][0], rng)
    distractors = [o for o in room_objects(room) if o != obj]
    for _ in range(rng.randint(*size["num_objects"])):
        for _attempt in range(10):
            otype = rng.choice(distractors)
            if place(otype, _holders(room, otype)):
                break
    scene.start = scene.new_location(rng)
    return scene


def _problem(name: str, scene: _Scene, goal_pddl: str, goal_otypes: set[str], goal_rtypes: set[str]) -> str:
    room = ROOMS[scene.room]
    otypes = sorted({t for _, t, _ in scene.objects} | goal_otypes)
    rtypes = sorted({t for _, t, _ in scene.receptacles} | goal_rtypes)
    where = {rid: loc for rid, _, loc in scene.receptacles}
    decl = ["agent1 - agent"]
    decl += [f"{o} - object" for o, _, _ in scene.objects]
    decl += [f"{t}Type - otype" for t in otypes]
    decl += [f"{t}Type - rtype" for t in rtypes]
    decl += [f"{r} - receptacle" for r, _, _ in scene.receptacles]
    decl += [f"{loc} - location" for loc in sorted(set(where.values()) | {scene.start})]
    init = [f"(atLocation agent1 {scene.start})"]
    init += [f"(receptacleType {r} {t}Type)" for r, t, _ in scene.receptacles]
    init += [f"(objectType {o} {t}Type)" for o, t, _ in scene.objects]
    present_o = {t for _, t, _ in scene.objects}
    for rt in sorted({t for _, t, _ in scene.receptacles}):
        init += [f"(canContain {rt}Type {ot}Type)" for ot in sorted(present_o) if ot in room[rt]]
    init += [f"(openable {r})" for r, t, _ in scene.receptacles if t in OPENABLE]
    for o, t, _ in scene.objects:
        if t == LAMP:
            init.append(f"(toggleable {o})")
            continue
        init.append(f"(pickupable {o})")
        init += [f"({pred} {o})" for pred, group in (("isReceptacleObject", CONTAINER_OBJECTS),
                 ("cleanable", CLEANABLE), ("heatable", HEATABLE), ("coolable", COOLABLE)) if t in group]  # fmt: skip
    init += [f"(inReceptacle {o} {r})" for o, _, r in scene.objects]
    init += [f"(receptacleAtLocation {r} {loc})" for r, _, loc in scene.receptacles]
    init += [f"(objectAtLocation {o} {where[r]})" for o, _, r in scene.objects]
    body = "\n        ".join(decl)
    facts = "\n        ".join(init)
    return (
        f"\n(define (problem {name})\n(:domain alfred)\n(:objects\n        {body}\n        )\n\n"
        f"(:init\n        {facts}\n        )\n\n{goal_pddl.strip()}\n"
    )


def make_game(combo, size: GenSize, rng: random.Random, name: str) -> tuple[dict, dict]:
    """(game.tw-pddl content, traj_data.json content) for one combination; not yet checked."""
    task_type, room, obj, target = combo
    scene = _build_scene(combo, size.ranges(), rng)
    look = task_type == "look_at_obj_in_light"
    params = {
        "object_target": obj,
        "parent_target": "" if look else target,
        "toggle_target": LAMP if look else "",
        "mrecep_target": "",
        "object_sliced": False,
    }
    spec = gdict[task_type]
    goal = (
        spec["pddl"].format(obj=obj, recep=params["parent_target"], toggle=LAMP, mrecep="").replace("#", "-")
    )
    desc = rng.choice(spec["templates"]).format(
        obj=obj.lower(), recep=params["parent_target"].lower(), toggle=LAMP.lower(), mrecep=""
    )
    grammar = GRAMMAR_FILE.read_text().replace("UNKNOWN GOAL", desc)
    game = {
        "pddl_domain": DOMAIN_FILE.read_text(),
        "grammar": grammar,
        "pddl_problem": _problem(
            name, scene, goal, {obj, LAMP} if look else {obj}, set() if look else {target}
        ),
        "solvable": True,
    }
    traj = {"task_id": name, "task_type": task_type, "pddl_params": params, "task_desc": [desc], "room": room}
    return game, traj


def expert_check(game_file: str, env: AlfWorldEnv, max_steps: int) -> list[str] | None:
    """Play alfworld's planner expert on the engine; its winning plan, or None if it does not win in time."""
    obs = env.reset(game_file, expert=True)
    if obs.won:
        return None
    plan = []
    for _ in range(max_steps):
        if not obs.expert_plan:
            return None
        action = obs.expert_plan[0]
        plan.append(action)
        obs = env.step(action)
        if obs.won:
            return plan
        if obs.done:
            return None
    return None


@dataclass
class GeneratedSet:
    folder: Path
    game_files: list[str]
    manifest: dict


@functools.cache
def _checker(max_expert_steps: int) -> AlfWorldEnv:
    """The engine that checks games with alfworld's planner expert: one per process, which is an ALFWorld
    worker like the env pool's (the textworld parser memo goes on with it)."""
    memoize_textworld_parsers()
    return AlfWorldEnv(max_steps=max_expert_steps, expert_type="planner")


@functools.cache
def _combinations(task_type: str, pool: str) -> tuple[tuple[str, str, str, str], ...]:
    return tuple(pool_combinations(task_type, pool))


def _one_game(
    i: int, folder: Path, seed: int, pool: str, size: GenSize, max_attempts: int
) -> tuple[str, list[str]]:
    """Game i of a set: (its path relative to folder, the expert's winning plan); resampled until won."""
    task_type = TASK_TYPES[i % len(TASK_TYPES)]
    for attempt in range(max_attempts):
        rng = random.Random(f"{seed}:{pool}:{i}:{attempt}")
        combo = rng.choice(_combinations(task_type, pool))
        name = f"gen{seed}_{pool}_{i:05d}"
        game, traj = make_game(combo, size, rng, name)
        _, room, obj, target = combo
        rel = Path(f"{task_type}-{obj}-None-{target}-{room}") / f"trial_{name}"
        path = folder / rel
        path.mkdir(parents=True, exist_ok=True)
        game_file = path / GAME_FILE
        game_file.write_text(json.dumps(game, indent=1))
        (path / "traj_data.json").write_text(json.dumps(traj, indent=1))
        plan = expert_check(str(game_file), _checker(size.max_expert_steps), size.max_expert_steps)
        if plan is not None:
            return str(rel / GAME_FILE), plan
        game_file.unlink()
        (path / "traj_data.json").unlink()
        path.rmdir()
    raise RuntimeError(
        f"could not generate a solvable {task_type} game for index {i} in {max_attempts} tries"
    )


def _checked_games(folder: Path, n: int, seed: int, pool: str, size: GenSize, max_attempts: int,
                   workers: int | None) -> list[tuple[str, list[str]]]:  # fmt: skip
    """Every game of the set, in index order, made in `workers` processes (None: one per core, max 8)."""
    workers = min(os.cpu_count() or 1, 8) if workers is None else workers
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    make = functools.partial(
        _one_game, folder=folder, seed=seed, pool=pool, size=size, max_attempts=max_attempts
    )
    workers = min(workers, n // 4)  # a process costs about a second to start: not worth it for a few games
    if workers <= 1:
        return [make(i) for i in range(n)]
    # A worker that dies breaks the executor (an error here, not a hang); results come in index order.
    with ProcessPoolExecutor(workers, SPAWN) as executor:
        with main_hidden():  # map submits every job at once, which starts the workers
            made = executor.map(make, range(n))
        return list(made)


def generate(out_dir: str | os.PathLike, n: int, seed: int, pool: str = "seen", size: GenSize | None = None,
             max_attempts: int = 50, workers: int | None = None) -> GeneratedSet:  # fmt: skip
    """Write n expert-checked games (task types in turn) into out_dir, or reuse them if already there.

    Same arguments -> byte-identical files, whatever `workers` is. Game i uses its own RNG seeded by
    (seed, pool, i, attempt), so one game's resampling never shifts the others, and the games can be
    made in parallel processes (`workers`; None: one per core, at most 8).
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    size = size or GenSize()
    size.ranges()  # validates
    folder = Path(out_dir)
    params = {"n": n, "seed": seed, "pool": pool, "size": asdict(size), "version": 1}
    manifest_path = folder / "manifest.json"
    if manifest_path.is_file():
        manifest = json.loads(manifest_path.read_text())
        files = [str(folder / f) for f in manifest.get("games", [])]
        if manifest.get("params") == json.loads(json.dumps(params)) and all(os.path.isfile(f) for f in files):
            return GeneratedSet(folder, sorted(files), manifest)
        raise ValueError(
            f"{folder} already holds generated games made with other settings ({manifest.get('params')}); "
            "use another folder or delete it"
        )
    made = _checked_games(folder, n, seed, pool, size, max_attempts, workers)
    games = [rel for rel, _ in made]
    plans = dict(made)
    manifest = {"params": params, "games": sorted(games), "expert_plans": plans}
    tmp = manifest_path.with_suffix(".json.tmp")  # a kill mid-write leaves no half manifest to trust
    tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True))
    tmp.replace(manifest_path)
    return GeneratedSet(folder, sorted(str(folder / g) for g in games), manifest)


def generated_pool(out_dir: str | os.PathLike, n: int, seed: int, pool: str = "seen", **size) -> TaskPool:
    """n procedurally generated games (reused when out_dir already holds the same set), with their plans.

    `size` takes GenSize fields: num_receptacles, num_objects, extra_targets (int or (lo, hi)),
    max_expert_steps. Different settings go to different sub-folders of out_dir.
    """
    gen_size = GenSize(**size)
    tag = hashlib.sha1(json.dumps(asdict(gen_size), sort_keys=True).encode()).hexdigest()[:8]
    folder = Path(out_dir) / f"{pool}_n{n}_seed{seed}_{tag}"
    made = generate(folder, n, seed, pool, gen_size)
    known = made.manifest.get("expert_plans", {})
    plans = {str(folder / rel): plan for rel, plan in known.items()}
    return pool_from_files(made.game_files, source=str(folder), plans=plans)
