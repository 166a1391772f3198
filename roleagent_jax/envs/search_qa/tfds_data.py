"""NQ-open and TriviaQA from TensorFlow Datasets, when the user has prepared them (never downloaded here).

tensorflow-datasets reads a prepared dataset without TensorFlow only through its random-access data
sources, i.e. when the dataset was prepared in the ArrayRecord (or Parquet) file format:
`tfds build natural_questions_open --data_dir=DIR --file_format=array_record`. TFDS's default format,
TFRecord, can only be read through `tf.data`, so such a folder needs TensorFlow installed (it is then
used); without it the error says both ways out. The extra `qa` installs tensorflow-datasets.
"""

from __future__ import annotations

import os
from pathlib import Path

from roleagent_jax.envs.search_qa.tasks import QATask, as_asked

# our name -> (TFDS builder, default config, the FlashRAG name the tasks are reported under)
TFDS_SETS: dict[str, tuple[str, str | None, str]] = {
    "nq_open": ("natural_questions_open", None, "nq"),
    "trivia_qa": ("trivia_qa", "unfiltered.nocontext", "triviaqa"),
}


def _text(value) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _golds(name: str, example: dict) -> tuple[str, ...]:
    if name == "nq_open":
        answers = [_text(a) for a in example["answer"]]
    else:
        answer = example["answer"]
        answers = [_text(answer["value"]), *(_text(a) for a in answer["aliases"])]
    return tuple(dict.fromkeys(a.strip() for a in answers if _text(a).strip()))


def _examples(builder, split: str):
    from tensorflow_datasets.core import file_adapters

    if builder.info.file_format in file_adapters.FileFormat.with_random_access():
        source = builder.as_data_source(split=split)
        return (source[i] for i in range(len(source)))
    try:
        import tensorflow  # noqa: F401  (TFRecord can only be read through tf.data)
    except ImportError as exc:
        raise RuntimeError(
            f"{builder.name} under {builder.data_dir} is stored as {builder.info.file_format.value}, which "
            "only TensorFlow can read: install tensorflow, or prepare it again with "
            f"`tfds build {builder.name} --file_format=array_record` (read without TensorFlow)"
        ) from exc
    import tensorflow_datasets as tfds

    return tfds.as_numpy(builder.as_dataset(split=split, shuffle_files=False))


def load_tfds(
    name: str,
    data_dir: str | os.PathLike,
    split: str = "validation",
    config: str | None = None,
    limit: int = 0,
) -> list[QATask]:
    """Questions of a prepared TFDS dataset ("nq_open" or "trivia_qa") in the dataset's order."""
    if name not in TFDS_SETS:
        raise ValueError(f"unknown TFDS QA set {name!r}; known: {', '.join(TFDS_SETS)}")
    try:
        import tensorflow_datasets as tfds
    except ImportError as exc:
        raise ImportError(
            "reading TFDS datasets needs tensorflow-datasets: pip install 'roleagent_jax[qa]'"
        ) from exc
    if not data_dir or not Path(data_dir).is_dir():
        raise FileNotFoundError(f"TFDS data_dir not found: {data_dir!r}")
    builder_name, default_config, reported = TFDS_SETS[name]
    config = config or default_config
    full = f"{builder_name}/{config}" if config else builder_name
    builder = tfds.builder(full, data_dir=str(data_dir))
    if not builder.is_prepared():
        raise FileNotFoundError(
            f"{full} is not prepared under {data_dir} (looked in {builder.data_dir}); prepare it once "
            f"with `tfds build {builder_name} --data_dir={data_dir} --file_format=array_record`: "
            "nothing is downloaded at run time"
        )
    if split not in builder.info.splits:
        raise ValueError(f"{full} has no split {split!r}; it has {', '.join(builder.info.splits)}")
    tasks = []
    for i, example in enumerate(_examples(builder, split)):
        golds = _golds(name, example)
        if golds:
            tasks.append(
                QATask(as_asked(_text(example["question"])), golds, reported, reported, f"{name}_{i}")
            )
        if limit and len(tasks) >= limit:
            break
    return tasks
