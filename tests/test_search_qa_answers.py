"""Exact match (SQuAD normalisation), the final-answer extractor and the turn parser."""

import unicodedata

import pytest

from roleagent_jax.envs.search_qa import exact_match, extract_answer, normalize_answer, parse_turn


@pytest.mark.parametrize(
    "prediction, golds, expected",
    [
        ("The Eiffel Tower", ["eiffel tower"], 1.0),  # article and case
        ("an apple", ["Apple"], 1.0),
        ("  Paris.  ", ["paris"], 1.0),  # punctuation and spaces
        ("U.S.A.", ["USA"], 1.0),  # punctuation inside the word disappears
        ("rock-and-roll", ["rockandroll"], 1.0),
        ("the   beatles!!", ["Beatles"], 1.0),
        ("Théâtre", ["théâtre"], 1.0),  # non-ASCII letters are lowered, kept
        ("Theatre", ["Théâtre"], 0.0),  # accents are not stripped (SQuAD keeps them)
        ("Zürich", ["zu\u0308rich"], 1.0),  # composed vs decomposed form of the same letter
        ("“Paris”", ["Paris"], 0.0),  # curly quotes are not ASCII punctuation (as SQuAD scores it)
        ("Lyon", ["Paris", "Lyon", "Nice"], 1.0),  # any of several golds
        ("Marseille", ["Paris", "Lyon"], 0.0),
        ("Paris France", ["Paris"], 0.0),  # extra words do not match
        ("theater", ["the ater"], 0.0),  # "the" is only dropped as a word
        ("a", ["the"], 0.0),  # an answer that normalises to nothing never matches
        ("", ["Paris"], 0.0),
        (None, ["Paris"], 0.0),
        ("Paris", [], 0.0),
        ("Paris", "Paris", 1.0),  # one gold given as a string is one answer, not characters
        ("P", "Paris", 0.0),
        ("1,000", ["1000"], 1.0),
    ],
)
def test_exact_match(prediction, golds, expected):
    assert exact_match(prediction, golds) == expected


def test_normalize_answer_steps():
    assert normalize_answer("  The  QUICK, brown fox; a dog & AN owl ") == "quick brown fox dog owl"
    decomposed = unicodedata.normalize("NFD", "Café")
    assert decomposed != "Café" and normalize_answer(decomposed) == normalize_answer("Café") == "café"


@pytest.mark.parametrize(
    "response, expected",
    [
        ("<think>hm</think><answer> Paris </answer>", "Paris"),
        ("<answer>Lyon</answer> then <answer>Paris</answer>", "Paris"),  # the last complete block
        ("<answer>Paris</answer> <answer>unfinished", "Paris"),  # an unclosed block is not complete
        ("<answer>stray <answer>Nice</answer>", "Nice"),  # a stray opening tag before the real one
        ("<answer>Nice</answer> trailing </answer>", "Nice"),  # a stray closing tag after it
        ("<ANSWER>Rome</Answer>", "Rome"),
        ("< answer >Oslo</ answer >", "Oslo"),
        ("<answer></answer>", ""),
        ("no tags at all", None),
        ("<answer>never closed", None),
        ("</answer> closed before <answer>", None),
        ("", None),
        (None, None),
    ],
)
def test_extract_answer(response, expected):
    assert extract_answer(response) == expected


@pytest.mark.parametrize(
    "response, kind, content",
    [
        ("<think>need it</think><search> capital of  Veltia </search>", "search", "capital of Veltia"),
        ("<answer>Tarsk</answer>", "answer", "Tarsk"),
        ("<search>a</search><answer>b</answer>", "search", "a"),  # the first complete block decides
        ("<answer>b</answer><search>a</search>", "answer", "b"),
        ("<search>unclosed <answer>x</answer>", "answer", "x"),  # the only complete block
        ("<search>a <b>c</b></search>", None, ""),  # a tag inside the block
        ("<search>   </search>", None, ""),
        ("<search>" + "q" * 301 + "</search>", None, ""),
        ("just text", None, ""),
        ("<search>x</answer>", None, ""),
        (None, None, ""),
    ],
)
def test_parse_turn(response, kind, content):
    turn = parse_turn(response)
    assert (turn.kind, turn.content) == (kind, content)
    assert turn.valid == (kind is not None)
    if turn.valid:
        assert parse_turn(turn.action) == turn  # the canonical action parses back to the same turn
    else:
        assert turn.action is None and turn.error
