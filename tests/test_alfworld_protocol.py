"""ALFWorld plays the reference protocol by default: ALFWORLD_TEMPLATE without `help`, and the
reference's format rule for valid actions; the compact prompt and availability rule stay options."""

import pytest

from roleagent_jax.envs.registry import get_family

ADM = ["go to cabinet 1", "go to countertop 1", "look", "inventory", "help"]
INTRO = (
    "-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a room. Looking quickly around you, "
    "you see a cabinet 1, and a countertop 1.\n\nYour task is to: put a hot apple in cabinet."
)
GOAL = "put a hot apple in cabinet."


@pytest.fixture(scope="module")
def family():
    return get_family("alfworld")


def _listed(prompt: str) -> list[str]:
    listed = prompt.split("Your admissible actions of the current situation are: [")[1].split("].")[0]
    return [c.strip().strip("'") for c in listed.split("\n")]


def test_reference_list_holds_no_help(family):
    for step, history in ((0, []), (1, [(INTRO, "look")])):
        prompt = family.agent_prompt(GOAL, history, "You see a cabinet 1.", ADM, step, 2)
        assert _listed(prompt) == [c for c in ADM if c != "help"]
        assert "'help'" not in prompt


def test_reference_template_slots(family):
    history = [(INTRO, "go to cabinet 1"), ("You arrive at cabinet 1.", "look"), ("Nothing happens.", "look")]
    first = family.agent_prompt(GOAL, [], INTRO, ADM, 0, 2)
    assert first.startswith("\nYou are an expert agent operating in the ALFRED Embodied Environment.\n")
    assert f"Your current observation is: {INTRO}\n" in first and "Prior to this step" not in first
    later = family.agent_prompt(GOAL, history, "You arrive at countertop 1.", ADM, 3, 2)
    assert f"Your task is to: {GOAL}\n" in later
    assert "you have already taken 3 step(s). Below are the most recent 2 observations" in later
    assert "[Observation 2: 'You arrive at cabinet 1.', Action 2: 'look']\n" in later
    assert "[Observation 3: 'Nothing happens.', Action 3: 'look']" in later and "Observation 1" not in later
    assert "You are now at step 4 and your current observation is: You arrive at countertop 1." in later
    assert later.endswith("present it within <action> </action> tags.\n")


@pytest.mark.parametrize(
    "response, expected",
    [
        ("<think>go</think><action>go to cabinet 1</action>", ("go to cabinet 1", True)),
        (
            "<think>go</think><action>Go To Cabinet 1</action>",
            ("go to cabinet 1", True),
        ),  # the list's spelling
        ("<think>try</think><action>open fridge 1</action>", ("open fridge 1", True)),  # not available: valid
        ("<action>go to cabinet 1</action>", ("go to cabinet 1", False)),  # no reasoning block
        ("<think>去</think><action>look</action>", ("look", False)),  # a CJK character
        ("<think>x</think><action>look", (None, False)),  # cut before </action> (at the length limit)
        ("<think>x</think> look", (None, False)),  # no action block
    ],
)
def test_reference_format_rule(family, response, expected):
    assert family.parse_action(response, ADM) == expected


def test_compact_options_keep_the_old_rules(family):
    compact = family.configured({"prompt": "compact", "valid": "available"})
    assert compact.parse_action("<think>try</think><action>open fridge 1</action>", ADM) == (
        "open fridge 1",
        False,
    )
    assert compact.parse_action("<action>look</action>", ADM) == ("look", True)
    assert "help" in compact.agent_prompt(GOAL, [], INTRO, ADM, 0, 1)  # the compact list is the engine's
    for f in (family, compact):  # the expert's answers read back as valid under either rule
        assert all(f.parse_action(f.format_action(c), ADM) == (c, True) for c in ADM)


def test_bad_options_name_the_key_and_value(family):
    with pytest.raises(ValueError, match="prompt='short'"):
        family.configured({"prompt": "short"})
    with pytest.raises(ValueError, match="valid='strict'"):
        family.configured({"valid": "strict"})
