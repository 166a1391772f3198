"""AIW analysis prompt and the defensive failure-report parser on well-formed, malformed and hostile answers."""

import pytest

from roleagent_jax.aiw import (
    ANALYSIS_STOP,
    FailureReport,
    build_analysis_prompt,
    normalize_failure_type,
    parse_failure_report,
    taxonomy,
)
from roleagent_jax.envs import Family, get_family
from roleagent_jax.types import Step, Trajectory

ALFWORLD = get_family("alfworld")

GOOD = (
    "FAILURE_TYPE: wrong_receptacle\n"
    "DETAIL: put the apple in the sinkbasin instead of the fridge\n"
    "CRITICAL_STEP: 7\n"
    "LESSON: move the object to the receptacle the task names\n"
    "QUERY: clean then place wrong receptacle\n"
)

# (answer, expected type, expected critical step, expected lesson substring, expected query substring)
CASES = [
    (GOOD, "wrong_receptacle", 7, "receptacle the task names", "clean then place"),
    (
        GOOD + ANALYSIS_STOP + "\nFAILURE_TYPE: navigation_loop",
        "wrong_receptacle",
        7,
        "task names",
        "clean then",
    ),
    (GOOD.lower(), "wrong_receptacle", 7, "receptacle the task names", "clean then place"),
    # the paper's field names
    (
        "ROOT_CAUSE_TYPE: missing_precondition\nROOT_CAUSE_DETAIL: never heated\nCRITICAL_STEP: 5\n"
        "TRANSFERABLE_LESSON: heat before placing\nRETRIEVAL_QUERY: heat then place skipped heating",
        "missing_precondition",
        5,
        "heat before",
        "skipped heating",
    ),
    # the seed's field names
    (
        "DOMINANT_TYPE: REPETITIVE_EXPLORATION\nDETAIL: searched cabinet 1 four times\nCORE_LESSON: remember places\n"
        "RETRIEVAL_QUERY: pick and place repeated search",
        "repetitive_exploration",
        None,
        "remember places",
        "repeated search",
    ),
    # markdown: bold keys, bullets, headings
    (
        "## Analysis\n- **Failure Type**: Navigation Loop\n- **Detail**: went between desk 1 and bed 1\n"
        "- **Critical Step**: step 12\n- **Lesson**: visit new places\n- **Query**: look in light navigation loop",
        "navigation_loop",
        12,
        "visit new places",
        "look in light",
    ),
    # numbered list with the values on the next lines
    (
        "1. FAILURE_TYPE:\n   entity_confusion\n2. DETAIL:\n   took a tomato\n3. CRITICAL_STEP:\n   3\n"
        "4. LESSON:\n   check the object kind\n5. QUERY:\n   heat then place wrong object",
        "entity_confusion",
        3,
        "check the object kind",
        "wrong object",
    ),
    # everything on one line
    (
        "FAILURE_TYPE: wrong receptacle DETAIL: bad place CRITICAL_STEP: 3 LESSON: read the goal QUERY: two objects place",
        "wrong_receptacle",
        3,
        "read the goal",
        "two objects place",
    ),
    # JSON
    (
        '{"failure_type": "missing_precondition", "detail": "no cleaning", "critical_step": 4, '
        '"lesson": "clean first", "retrieval_query": "clean then place"}',
        "missing_precondition",
        4,
        "clean first",
        "clean then place",
    ),
    # extra prose before and after
    (
        "Let me think about this. The agent walked around a lot.\n\nFAILURE_TYPE: premature_give_up\n"
        "LESSON: keep going\nQUERY: cool then place gave up\n\nI hope this helps!",
        "premature_give_up",
        None,
        "keep going",
        "cool then place",
    ),
    # typo in the type name -> fuzzy match
    ("FAILURE_TYPE: navigaton lop\nQUERY: x", "navigation_loop", None, "", "x"),
    # type with an explanation attached
    ("FAILURE_TYPE: Wrong_Receptacle (it used the sink)\nLESSON: y", "wrong_receptacle", None, "y", ""),
    # paraphrased type -> keyword match
    ("TYPE: the agent gave up too early\nLESSON: persist", "premature_give_up", None, "persist", ""),
    ("FAILURE_TYPE: bad action formatting", "action_format_error", None, "", ""),
    # no type field, but exactly one taxonomy name in the prose
    (
        "The agent clearly shows exhaustive_exploration_failure here.",
        "exhaustive_exploration_failure",
        None,
        "",
        "",
    ),
    # truncated mid-answer (hit the token limit)
    (
        "FAILURE_TYPE: repeated_failed_action\nDETAIL: it kept trying to open the dr",
        "repeated_failed_action",
        None,
        "",
        "",
    ),
    ("FAILURE_TY", "unknown", None, "", ""),
    # missing fields: only a lesson -> usable, type unknown
    ("LESSON: always check the receptacle", "unknown", None, "always check the receptacle", ""),
    # placeholders echoed from the template are ignored
    (
        "FAILURE_TYPE: <one type name from the list>\nDETAIL: ...\nQUERY: <a short phrase>",
        "unknown",
        None,
        "",
        "",
    ),
    # non-ASCII, full-width colon
    (
        "FAILURE_TYPE：wrong_target_location\nLESSON：把物体放到目标位置 ✓\nQUERY: heat then place 目标",
        "wrong_target_location",
        None,
        "把物体",
        "heat then place",
    ),
    # unknown type string kept out of the taxonomy
    ("FAILURE_TYPE: cosmic rays\nDETAIL: who knows", "unknown", None, "", ""),
    # several taxonomy names in prose with no field -> ambiguous -> unknown
    ("Maybe navigation_loop, maybe wrong_receptacle.", "unknown", None, "", ""),
    # repeated fields: the first answer wins
    ("FAILURE_TYPE: navigation_loop\nFAILURE_TYPE: wrong_receptacle", "navigation_loop", None, "", ""),
    # control characters and tabs
    ("FAILURE_TYPE:\tentity_confusion\x00\x07\nLESSON: a\x1bb", "entity_confusion", None, "a b", ""),
    # critical step written in words only -> None, other fields fine
    ("FAILURE_TYPE: navigation_loop\nCRITICAL_STEP: the last one", "navigation_loop", None, "", ""),
    ("", "unknown", None, "", ""),
    ("\n\n   \n", "unknown", None, "", ""),
    # the trajectory echoed back before the answer; an empty first field is filled by a later one
    (
        "Step 3: go to desk 1\nFAILURE_TYPE:\n\nCRITICAL_STEP: 9\nFAILURE_TYPE: navigation_loop",
        "navigation_loop",
        9,
        "",
        "",
    ),
]


@pytest.mark.parametrize("text,ftype,step,lesson,query", CASES)
def test_parser_cases(text, ftype, step, lesson, query):
    rep = parse_failure_report(text, ALFWORLD)
    assert isinstance(rep, FailureReport)
    assert rep.failure_type == ftype
    assert rep.critical_step == step
    assert lesson in rep.lesson
    assert query in rep.query
    assert rep.source == "llm"
    assert rep.failure_type in taxonomy(ALFWORLD)


def test_enough_cases():
    assert len(CASES) >= 20


def test_unusable_answer_keeps_raw_text():
    rep = parse_failure_report("the model rambled ☃ about nothing useful", ALFWORLD)
    assert rep.failure_type == "unknown" and not rep.usable
    assert rep.raw == "the model rambled ☃ about nothing useful"


@pytest.mark.parametrize(
    "text",
    [
        None,
        42,
        b"bytes",
        "x" * 200_000,
        "FAILURE_TYPE: " + "wrong " * 50_000,
        "DETAIL: " + "é" * 100_000,
        "\x00" * 1000,
    ],
)
def test_hostile_inputs_never_raise_and_are_capped(text):
    rep = parse_failure_report(text, ALFWORLD)  # type: ignore[arg-type]
    assert isinstance(rep, FailureReport)
    assert (
        len(rep.raw) <= 4000 and len(rep.detail) <= 400 and len(rep.lesson) <= 400 and len(rep.query) <= 400
    )


def test_long_field_is_capped():
    rep = parse_failure_report(
        "FAILURE_TYPE: navigation_loop\nLESSON: " + "go somewhere new " * 200, ALFWORLD
    )
    assert rep.failure_type == "navigation_loop" and len(rep.lesson) == 400 and rep.lesson.endswith("...")


def test_normalize_type_exact_and_fallback():
    for name in taxonomy(ALFWORLD):
        assert normalize_failure_type(name, ALFWORLD) == name
        assert normalize_failure_type(name.upper().replace("_", " "), ALFWORLD) == name
    assert normalize_failure_type("", ALFWORLD) == "unknown"
    with pytest.raises(ValueError):
        normalize_failure_type("loop", Family())  # a family without a taxonomy


def _traj(n_steps: int) -> Trajectory:
    steps = [
        Step(
            f"obs {i}",
            ["look"],
            f"<action>go to desk {i}</action>",
            f"go to desk {i}",
            True,
            0.0,
            f"You arrive at desk {i}.",
        )
        for i in range(n_steps)
    ]
    steps[3].valid, steps[3].action = False, None
    return Trajectory(
        task_id=5,
        task_type="pick_clean_then_place_in_recep",
        goal="put a clean apple in fridge.",
        steps=steps,
    )


def test_analysis_prompt_structure():
    p = build_analysis_prompt(_traj(6), ALFWORLD)
    assert "put a clean apple in fridge." in p and "pick_clean_then_place_in_recep" in p
    for field in ("FAILURE_TYPE:", "DETAIL:", "CRITICAL_STEP:", "LESSON:", "QUERY:"):
        assert field in p
    for name in taxonomy(ALFWORLD)[:-1]:
        assert name in p
    assert "1. go to desk 0 -> You arrive at desk 0." in p
    assert "4. INVALID:" in p
    assert ANALYSIS_STOP in p


def test_analysis_prompt_shows_refused_commands():
    """A well-formed command the environment did not offer is shown as what it was, not as invalid."""
    t = _traj(6)
    t.steps[2].valid, t.steps[2].parsed, t.steps[2].action = False, True, "take egg 9 from shelf 3"
    assert "3. REFUSED: take egg 9 from shelf 3 ->" in build_analysis_prompt(t, ALFWORLD)


def test_analysis_prompt_elides_long_episodes():
    p = build_analysis_prompt(_traj(50), ALFWORLD, max_steps_shown=8, describe_types=False)
    assert "1. go to desk 0" in p and "2. go to desk 1" in p and "50. go to desk 49" in p
    assert "(steps omitted)" in p and "10. go to desk 9 " not in p
    assert len(p) < 2000
    # a prompt answered in the requested format parses back
    answer = "FAILURE_TYPE: navigation_loop\nDETAIL: d\nCRITICAL_STEP: 44\nLESSON: l\nQUERY: clean then place loop\n"
    rep = parse_failure_report(answer + ANALYSIS_STOP, ALFWORLD)
    assert (rep.failure_type, rep.critical_step, rep.query) == (
        "navigation_loop",
        44,
        "clean then place loop",
    )
