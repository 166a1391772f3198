"""The heuristic analyser labels crafted ALFWorld-like failed trajectories, one per failure type."""

import pytest

from roleagent_jax.aiw import taxonomy
from roleagent_jax.envs import get_family
from roleagent_jax.envs.alfworld.goals import abstract_goal, parse_goal
from roleagent_jax.envs.alfworld.heuristic import RULE_ORDER, analyse
from roleagent_jax.types import Step, Trajectory

NOTHING = "Nothing happens."


def traj(
    task_type: str, goal: str, script: list[tuple[str | None, str]], won: bool = False, env_failed=False
):
    steps = []
    obs = "You are in the middle of a room."
    for action, nxt in script:
        valid = action is not None
        resp = f"<think>ok</think><action>{action}</action>" if valid else "I will now go somewhere"
        steps.append(Step(obs, [], resp, action, valid, 0.0, nxt))
        obs = nxt
    return Trajectory(task_id=0, task_type=task_type, goal=goal, steps=steps, won=won, env_failed=env_failed)


def arrive(r: str) -> str:
    return f"You arrive at {r}. On the {r}, you see nothing."


CLEAN = ("pick_clean_then_place_in_recep", "put a clean apple in fridge.")
HEAT = ("pick_heat_then_place_in_recep", "heat some egg and put it in garbagecan.")
SIMPLE = ("pick_and_place_simple", "put some pencil on desk.")
LOOK = ("look_at_obj_in_light", "examine the pillow with the desklamp.")
TWO = ("pick_two_obj_and_place", "put two cd in drawer.")
COOL = ("pick_cool_then_place_in_recep", "put a cool plate in cabinet.")


def pad(n: int) -> list[tuple[str, str]]:
    """n distinct harmless actions (to run an episode out of steps without looking repetitive)."""
    return [(f"examine book {i}", f"This is a normal book {i}.") for i in range(n)]


CRAFTED = {
    "action_format_error": (
        SIMPLE,
        [("go to desk 1", arrive("desk 1")), (None, NOTHING), (None, NOTHING), (None, NOTHING)],
        2,
    ),
    "missing_precondition": (
        CLEAN,
        [
            ("go to countertop 1", arrive("countertop 1")),
            ("take apple 1 from countertop 1", "You pick up the apple 1 from the countertop 1."),
            ("go to fridge 1", "You arrive at fridge 1. The fridge 1 is open."),
            ("move apple 1 to fridge 1", "You move the apple 1 to the fridge 1."),
        ],
        4,
    ),
    "entity_confusion": (
        HEAT,
        [
            ("go to countertop 1", arrive("countertop 1")),
            ("take potato 1 from countertop 1", "You pick up the potato 1 from the countertop 1."),
            ("go to microwave 1", arrive("microwave 1")),
            ("heat potato 1 with microwave 1", "You heat the potato 1 using the microwave 1."),
        ],
        2,
    ),
    "wrong_receptacle": (
        SIMPLE,
        [
            ("go to sidetable 1", arrive("sidetable 1")),
            ("take pencil 2 from sidetable 1", "You pick up the pencil 2 from the sidetable 1."),
            ("go to shelf 1", arrive("shelf 1")),
            ("move pencil 2 to shelf 1", "You move the pencil 2 to the shelf 1."),
        ],
        4,
    ),
    "wrong_object_interaction": (
        CLEAN,
        [
            ("go to countertop 1", arrive("countertop 1")),
            ("take apple 1 from countertop 1", "You pick up the apple 1 from the countertop 1."),
            ("go to microwave 1", arrive("microwave 1")),
            ("clean apple 1 with microwave 1", "You clean the apple 1 using the microwave 1."),
        ],
        4,
    ),
    "repeated_failed_action": (
        TWO,
        [
            ("go to drawer 1", arrive("drawer 1")),
            ("open drawer 2", NOTHING),
            ("go to desk 1", arrive("desk 1")),
            ("open drawer 2", NOTHING),
            ("look", "You are facing the desk 1."),
            ("open drawer 2", NOTHING),
        ],
        2,
    ),
    "navigation_loop": (
        LOOK,
        [("go to bed 1", arrive("bed 1")), ("go to desk 1", arrive("desk 1"))] * 3
        + [("go to shelf 1", arrive("shelf 1"))],
        1,
    ),
    "repetitive_exploration": (
        COOL,
        [
            ("go to cabinet 1", arrive("cabinet 1")),
            ("examine cabinet 1", "On the cabinet 1, you see nothing."),
            ("examine cabinet 1", "On the cabinet 1, you see nothing."),
            ("examine cabinet 1", "On the cabinet 1, you see nothing."),
        ],
        2,
    ),
    "premature_give_up": (
        COOL,
        [("go to fridge 1", arrive("fridge 1")), ("open fridge 1", "You open the fridge 1.")],
        2,
    ),
    "wrong_target_location": (
        CLEAN,
        [
            ("go to countertop 1", arrive("countertop 1")),
            ("take apple 1 from countertop 1", "You pick up the apple 1 from the countertop 1."),
            ("go to sinkbasin 1", arrive("sinkbasin 1")),
            ("clean apple 1 with sinkbasin 1", "You clean the apple 1 using the sinkbasin 1."),
            ("go to diningtable 1", arrive("diningtable 1")),
            ("go to shelf 1", arrive("shelf 1")),
        ]
        + pad(44),
        2,
    ),
    "exhaustive_exploration_failure": (
        SIMPLE,
        [
            (f"go to {r}", arrive(r))
            for r in ("drawer 1", "drawer 2", "shelf 1", "shelf 2", "bed 1", "sidetable 1", "dresser 1")
        ]
        + [(f"open drawer {i}", f"You open the drawer {i}.") for i in range(1, 44)],
        50,
    ),
}


def test_every_type_has_a_crafted_case():
    assert set(CRAFTED) == set(RULE_ORDER)
    assert set(RULE_ORDER) | {"unknown"} == set(taxonomy(get_family("alfworld")))


@pytest.mark.parametrize("expected", list(CRAFTED))
def test_heuristic_labels_crafted_trajectories(expected):
    (task_type, goal), script, crit = CRAFTED[expected]
    rep = analyse(traj(task_type, goal, script))
    assert rep.failure_type == expected, rep.detail
    assert rep.critical_step == crit
    assert rep.source == "heuristic" and rep.usable and rep.detail


@pytest.mark.parametrize("expected", list(CRAFTED))
def test_lesson_and_query_name_the_pattern_not_the_object(expected):
    (task_type, goal), script, _ = CRAFTED[expected]
    rep = analyse(traj(task_type, goal, script))
    spec = parse_goal(goal, task_type)
    pattern = {
        "pick_clean_then_place_in_recep": "clean then place",
        "pick_heat_then_place_in_recep": "heat then place",
        "pick_and_place_simple": "pick and place",
        "look_at_obj_in_light": "look in light",
        "pick_two_obj_and_place": "two objects place",
        "pick_cool_then_place_in_recep": "cool then place",
    }[task_type]
    assert rep.query.startswith(pattern) and pattern in rep.lesson
    assert spec.obj not in rep.query and spec.obj not in rep.lesson


def test_missing_precondition_for_look_tasks_and_clean_before_place_is_not_flagged():
    # turning the lamp on without holding the pillow
    rep = analyse(
        traj(
            *LOOK,
            [("go to desk 1", arrive("desk 1")), ("use desklamp 1", "You turn on the desklamp 1.")] + pad(48),
        )
    )
    assert rep.failure_type == "missing_precondition" and rep.critical_step == 2
    # cleaned first, then placed in the right receptacle: no precondition failure (ran out of steps instead)
    script = (
        CRAFTED["wrong_target_location"][1][:4]
        + [
            ("go to fridge 1", arrive("fridge 1")),
            ("move apple 1 to fridge 1", "You move the apple 1 to the fridge 1."),
        ]
        + pad(44)
    )
    assert analyse(traj(*CLEAN, script)).failure_type == "unknown"


def test_nothing_happens_actions_do_not_count_as_done():
    # "take" that failed is not holding; a failed move is not a placement
    script = [
        ("go to sidetable 1", arrive("sidetable 1")),
        ("take pencil 1 from sidetable 1", NOTHING),
        ("move pencil 1 to shelf 1", NOTHING),
    ] + pad(47)
    assert analyse(traj(*SIMPLE, script)).failure_type == "unknown"


def test_priority_root_cause_before_symptom():
    loop = [("go to bed 1", arrive("bed 1")), ("go to desk 1", arrive("desk 1"))] * 3
    # a format-error run of 5 explains the loop after it
    assert analyse(traj(*SIMPLE, [(None, NOTHING)] * 5 + loop)).failure_type == "action_format_error"
    # a few stray unparsable answers do not: the loop is what failed
    assert analyse(traj(*SIMPLE, [(None, NOTHING)] * 3 + loop)).failure_type == "navigation_loop"
    # with nothing else to explain the failure, even one unparsable answer is the label
    assert analyse(traj(*SIMPLE, [(None, NOTHING)])).failure_type == "action_format_error"


def test_refused_commands_are_read_not_called_format_errors():
    """Well-formed but inadmissible commands (parsed=True, valid=False) are classified by what they were."""
    room = ["go to countertop 1", "go to fridge 1", "look"]
    start = "You are in the middle of a room. You see a countertop 1 and a fridge 1."

    def refused(cmds: list[str]) -> Trajectory:
        steps = [
            Step(start, room, f"<action>{c}</action>", c, False, 0.0, NOTHING, parsed=True) for c in cmds
        ]
        return Trajectory(task_id=0, task_type=HEAT[0], goal=HEAT[1], steps=steps)

    absent = analyse(refused(["take egg 1 from shelf 3"]))
    assert absent.failure_type == "entity_confusion" and "shelf 3" in absent.detail
    again = analyse(refused(["open fridge 1"] * 4))
    assert again.failure_type == "repeated_failed_action"
    wrong = analyse(refused(["heat egg 1 with fridge 1"]))
    assert wrong.failure_type == "wrong_object_interaction"
    # many different refused commands, none naming an entity: still commands that had no effect
    varied = analyse(refused([f"go to the kitchen {w}" for w in ("now", "please", "again")]))
    assert varied.failure_type == "repeated_failed_action" and "3 of 3" in varied.detail


def test_won_and_env_failed_episodes_are_not_labelled():
    script = CRAFTED["navigation_loop"][1]
    assert analyse(traj(*LOOK, script, won=True)).failure_type == "unknown"
    rep = analyse(traj(*LOOK, script, env_failed=True))
    assert rep.failure_type == "unknown" and "environment" in rep.detail


def test_deterministic():
    (tt, goal), script, _ = CRAFTED["repeated_failed_action"]
    assert analyse(traj(tt, goal, script)) == analyse(traj(tt, goal, script))


@pytest.mark.parametrize(
    "goal,tt,obj,recep,transform,count",
    [
        ("put a clean apple in fridge.", "pick_clean_then_place_in_recep", "apple", "fridge", "clean", 1),
        (
            "clean some lettuce and put it in diningtable.",
            "pick_clean_then_place_in_recep",
            "lettuce",
            "diningtable",
            "clean",
            1,
        ),
        ("put a hot potato in fridge.", "pick_heat_then_place_in_recep", "potato", "fridge", "heat", 1),
        (
            "cool some bread and put it in countertop.",
            "pick_cool_then_place_in_recep",
            "bread",
            "countertop",
            "cool",
            1,
        ),
        ("put some spraybottle on toilet.", "pick_and_place_simple", "spraybottle", "toilet", None, 1),
        ("find two cd and put them in drawer.", "pick_two_obj_and_place", "cd", "drawer", None, 2),
        (
            "Your task is to: put two spatula in drawer.",
            "pick_two_obj_and_place",
            "spatula",
            "drawer",
            None,
            2,
        ),
        ("look at alarmclock under the desklamp.", "look_at_obj_in_light", "alarmclock", None, None, 1),
    ],
)
def test_parse_goal(goal, tt, obj, recep, transform, count):
    g = parse_goal(goal, tt)
    assert (g.obj, g.recep, g.transform, g.count) == (obj, recep, transform, count)
    assert obj not in abstract_goal(goal, tt)


def test_parse_goal_garbage_is_empty():
    g = parse_goal("dance wildly ☃", "pick_heat_then_place_in_recep")
    assert g.obj is None and g.transform == "heat"


def test_pick_two_with_only_one_object_found_is_exhaustive_failure():
    places = ("drawer 1", "drawer 2", "shelf 1", "shelf 2", "bed 1", "sidetable 1", "dresser 1")
    script = (
        [
            ("go to desk 1", arrive("desk 1")),
            ("take cd 1 from desk 1", "You pick up the cd 1 from the desk 1."),
            ("go to drawer 3", arrive("drawer 3")),
            ("move cd 1 to drawer 3", "You move the cd 1 to the drawer 3."),
        ]
        + [(f"go to {r}", arrive(r)) for r in places]
        + pad(39)
    )
    rep = analyse(traj(*TWO, script))
    assert rep.failure_type == "exhaustive_exploration_failure" and "2 different cds" in rep.detail
    assert rep.query.startswith("two objects place")
