"""QA datasets: the FlashRAG JSONL loaders of the seven sets, and NQ-open / TriviaQA through TFDS."""

import json
import sys
from pathlib import Path

import pytest

from roleagent_jax.envs.search_qa.tasks import DATASETS, dataset_file, load_flashrag


def _write(path: Path, records) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


@pytest.mark.parametrize("name", list(DATASETS))
def test_flashrag_loader_reads_each_set(tmp_path, name):
    split = DATASETS[name][1]
    _write(
        tmp_path / name / f"{split}.jsonl",
        [
            {
                "id": f"{split}_0",
                "question": "who wrote hamlet? ",
                "golden_answers": ["Shakespeare", "W. S."],
                "metadata": {"x": 1},
            },  # fmt: skip
            "",
            {"question": "capital of france", "golden_answers": "Paris"},  # one gold as a string; no id
        ],
    )
    tasks = load_flashrag(dataset_file(tmp_path, name), name)
    assert [(t.question, t.golds, t.source, t.kind, t.id) for t in tasks] == [
        ("who wrote hamlet?", ("Shakespeare", "W. S."), name, name, f"{split}_0"),
        ("capital of france?", ("Paris",), name, name, f"{name}_2"),  # "?" added, as Search-R1 does
    ]
    assert len(load_flashrag(dataset_file(tmp_path, name), name, limit=1)) == 1


def test_dataset_file_layout():
    assert dataset_file("/d", "hotpotqa") == Path("/d/hotpotqa/dev.jsonl")
    assert dataset_file("/d", "nq", "train") == Path("/d/nq/train.jsonl")
    with pytest.raises(ValueError, match="unknown QA dataset 'squad'; known: nq, triviaqa"):
        dataset_file("/d", "squad")


@pytest.mark.parametrize(
    "line, message",
    [
        ("{not json", r"bad.jsonl:1: not valid JSON"),
        ('["a list"]', r"bad.jsonl:1: expected a JSON object"),
        ('{"golden_answers": ["x"]}', r"bad.jsonl:1: key 'question' must be a non-empty string"),
        (
            '{"question": "q", "golden_answers": []}',
            r"bad.jsonl:1: key 'golden_answers' must be a non-empty list",
        ),
        (
            '{"question": "q", "golden_answers": [1]}',
            r"key 'golden_answers' must be a non-empty list of strings",
        ),
        ('{"question": "q"}', r"key 'golden_answers'"),
    ],
)
def test_flashrag_loader_errors_name_file_and_line(tmp_path, line, message):
    with pytest.raises(ValueError, match=message):
        load_flashrag(_write(tmp_path / "bad.jsonl", [line]), "nq")


def test_flashrag_loader_missing_and_empty(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nq file not found: .*nope.jsonl"):
        load_flashrag(tmp_path / "nope.jsonl", "nq")
    with pytest.raises(ValueError, match=r"holds no questions"):
        load_flashrag(_write(tmp_path / "empty.jsonl", [""]), "musique")
    with pytest.raises(ValueError, match="unknown QA dataset"):
        load_flashrag(tmp_path / "x.jsonl", "squad")


# ---------------------------------------------------------------------------------------------- TFDS


def _prepare(builder_cls, data_dir: Path, examples: dict, **kwargs) -> None:
    """Prepare a dataset offline in ArrayRecord: the real builder, fed local examples."""
    from etils import epath

    class Local(builder_cls, skip_registration=True):
        name = builder_cls.name
        pkg_dir_path = epath.Path(sys.modules[builder_cls.__module__].__file__).parent

        def _split_generators(self, dl_manager):
            return {split: self._generate_examples(rows) for split, rows in examples.items()}

        def _generate_examples(self, rows):
            yield from enumerate(rows)

    Local(data_dir=str(data_dir), file_format="array_record", **kwargs).download_and_prepare()


def _trivia_example(q: str, value: str, aliases: list[str]) -> dict:
    answer = {"aliases": aliases, "normalized_aliases": [a.lower() for a in aliases], "matched_wiki_entity_name": "",
              "normalized_matched_wiki_entity_name": "", "normalized_value": value.lower(), "type": "WikipediaEntity",
              "value": value}  # fmt: skip
    return {"question": q, "question_id": "tq", "question_source": "", "entity_pages": [], "search_results": [],
            "answer": answer}  # fmt: skip


def test_tfds_nq_open_and_trivia_qa_without_tensorflow(tmp_path):
    tfds = pytest.importorskip(
        "tensorflow_datasets", reason="tensorflow-datasets is not installed (extra 'qa')"
    )
    from tensorflow_datasets.datasets.natural_questions_open import (
        natural_questions_open_dataset_builder as nq,
    )
    from tensorflow_datasets.datasets.trivia_qa import trivia_qa_dataset_builder as tq

    from roleagent_jax.envs.search_qa.tfds_data import load_tfds

    assert tfds.__version__
    _prepare(nq.Builder, tmp_path, {"validation": [{"question": "who is q0", "answer": ["a0", "b"]},
                                                   {"question": "who is q1", "answer": ["a1"]}],
                                    "train": [{"question": "t", "answer": ["x"]}]})  # fmt: skip
    _prepare(tq.Builder, tmp_path, {"validation": [_trivia_example("Which river?", "Orrin", ["Orrin", "R. Orrin"])]},
             config="unfiltered.nocontext")  # fmt: skip
    got = load_tfds("nq_open", tmp_path)
    assert [(t.question, t.golds, t.source, t.kind) for t in got] == [
        ("who is q0", ("a0", "b"), "nq", "nq"),
        ("who is q1", ("a1",), "nq", "nq"),
    ]
    assert [t.golds for t in load_tfds("nq_open", tmp_path, split="train")] == [("x",)]
    trivia = load_tfds("trivia_qa", tmp_path)
    assert [(t.question, t.golds, t.kind) for t in trivia] == [
        ("Which river?", ("Orrin", "R. Orrin"), "triviaqa")
    ]
    assert "tensorflow" not in sys.modules  # read without TensorFlow
    with pytest.raises(ValueError, match="has no split 'dev'; it has"):
        load_tfds("nq_open", tmp_path, split="dev")
    with pytest.raises(FileNotFoundError, match=r"trivia_qa/rc is not prepared under .*tfds build trivia_qa"):
        load_tfds("trivia_qa", tmp_path, config="rc")
    with pytest.raises(FileNotFoundError, match="TFDS data_dir not found"):
        load_tfds("nq_open", tmp_path / "missing")
    with pytest.raises(ValueError, match="unknown TFDS QA set 'squad'"):
        load_tfds("squad", tmp_path)
