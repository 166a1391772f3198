"""Agent prompt structure and the action parser's robustness."""

import random

import pytest

from roleagent_jax.envs.alfworld.prompts import (
    ACTION_STOP,
    build_agent_prompt,
    clean_observation,
    parse_action,
)

ADM = ["go to cabinet 1", "go to countertop 1", "take apple 1 from countertop 1", "look", "inventory"]
INTRO = (
    "-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a room. Looking quickly around you, "
    "you see a cabinet 1, and a countertop 1.\n\nYour task is to: put a hot apple in cabinet."
)


def test_prompt_structure_and_history_window():
    history = [(INTRO, "go to cabinet 1"), ("You arrive at cabinet 1. The cabinet 1 is closed.", "look"),
               ("You are facing the cabinet 1. Next to it, you see nothing.", "go to countertop 1")]  # fmt: skip
    now = "You arrive at countertop 1. On the countertop 1, you see a apple 1."
    p = build_agent_prompt("put a hot apple in cabinet.", history, now, ADM, step=3, k=2)
    assert "put a hot apple in cabinet." in p
    assert "Step 4" in p
    assert now in p
    for cmd in ADM:
        assert cmd in p
    assert "<think>" in p and "<action>" in p
    # only the last two pairs are shown
    assert "You arrive at cabinet 1. The cabinet 1 is closed." in p
    assert "Next to it, you see nothing." in p
    assert "Did: go to cabinet 1" not in p  # the oldest pair falls outside the window
    assert "Did: look" in p and "Did: go to countertop 1" in p
    assert "Welcome" not in p  # the first observation's banner is not repeated
    assert p.count("Your task is to") == 0


def test_prompt_first_step_and_k0():
    p = build_agent_prompt("g.", [], INTRO, ADM, step=0)
    assert "Step 1" in p and "No actions yet" in p
    assert "you see a cabinet 1, and a countertop 1." in p
    p0 = build_agent_prompt("g.", [(INTRO, "look")], "x", ADM, step=1, k=0)
    assert "Did:" not in p0


def test_prompt_is_compact():
    p = build_agent_prompt("put a hot apple in cabinet.", [(INTRO, "look")] * 2, INTRO, ADM, step=2)
    assert len(p) < 1200  # a few hundred tokens at most for a small generated room


def test_clean_observation():
    assert clean_observation(INTRO).startswith("You are in the middle of a room.")
    assert "task" not in clean_observation(INTRO)


@pytest.mark.parametrize(
    "response, expected",
    [
        ("<think>cab</think><action>go to cabinet 1</action>", ("go to cabinet 1", True)),
        ("<think>x</think>\n<action>  Go   To Cabinet 1 </action>", ("go to cabinet 1", True)),
        ("<ACTION>look</ACTION>", ("look", True)),
        ("<think>x</think><action>go to cabinet 1", ("go to cabinet 1", True)),  # stop string cut off
        ("<think>x</think><action>open fridge 1</action>", ("open fridge 1", False)),  # inadmissible
        ("go to cabinet 1", (None, False)),  # missing tags
        ("<think>go to cabinet 1</think>", (None, False)),
        ("", (None, False)),
        ("<action></action>", (None, False)),
        ("<action>   </action>", (None, False)),
        ("<action>look</action><action>inventory</action>", (None, False)),  # repeated tags
        ("<action>look</action></action>", (None, False)),
        ("</action>look<action>", (None, False)),
        ("<action><think>look</think></action>", (None, False)),
        ("<action>gö to cabinet 1</action>", (None, False)),  # non-ASCII
        ("<action>去厨房</action>", (None, False)),
        ("<action>look\x00</action>", (None, False)),
    ],
)
def test_parse_action_cases(response, expected):
    assert parse_action(response, ADM) == expected


def test_parse_without_admissible_list():
    assert parse_action("<action>do a dance</action>", None) == ("do a dance", True)
    assert parse_action("no tags", None) == (None, False)


def test_parse_garbage_never_raises():
    rng = random.Random(0)
    alphabet = "<>/actionthk \n\t" + "".join(chr(c) for c in range(32, 127)) + "éß中\u200b\ud7ff"
    big = "".join(rng.choice(alphabet) for _ in range(100_000))
    assert parse_action(big, ADM)[1] is False
    assert parse_action("<action>" + "a" * 100_000 + "</action>", ADM) == (None, False)
    assert parse_action("<action>look</action>" + "x" * 100_000, ADM) == ("look", True)
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 200)))
        action, valid = parse_action(text, ADM)
        assert valid is False or action in ADM
    assert parse_action(None, ADM) == (None, False)  # type: ignore[arg-type]
    assert parse_action(b"<action>look</action>", ADM) == (None, False)  # type: ignore[arg-type]


def test_action_stop_closes_the_action():
    assert ACTION_STOP == "</action>"
    assert parse_action("<think>t</think><action>look" + ACTION_STOP, ADM) == ("look", True)
