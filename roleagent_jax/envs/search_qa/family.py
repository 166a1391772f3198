"""Search QA as a scenario family: task pools, the env adapter, prompts, parser, behaviour rates, AIW.

Splits:
  gen_train, gen_test    questions over the generated knowledge base (options: kb_seed, the sizes,
                         mix), answered from a local BM25 index over its passages. Nothing to download.
                         With kb_worlds > 1 a split's questions are spread over that many knowledge
                         bases (seeds kb_seed, kb_seed + 1, ...); with held_out "worlds" gen_test asks
                         knowledge bases no training question asks (seeds from kb_seed + 1000).
  NAME[:SPLIT]           a FlashRAG JSONL set, NAME one of the seven (nq, triviaqa, popqa, hotpotqa,
                         2wikimultihopqa, musique, bamboogle), read from <data_dir>/NAME/SPLIT.jsonl
                         (SPLIT defaults to the one Search-R1 evaluates on); data_dir may also be the
                         JSONL file itself. Join sets with "+": "nq:train+hotpotqa:train".
  tfds:NAME[:SPLIT]      NQ-open or TriviaQA prepared with tensorflow-datasets under data_dir.
Real sets need a retriever: options retriever_url (a running retrieval server) or corpus (a JSONL
corpus indexed with BM25 in each worker).

Each task's payload says which retriever answers it, so a worker builds (and keeps) the retriever a
task needs on first use. The action the env receives is the turn in canonical form
("<search>query</search>" or "<answer>text</answer>"), which is also the response that produces it.
"""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from roleagent_jax.envs.base import Admissible, Family, History, Observation, PoolRequest, Task, TaskPool
from roleagent_jax.envs.search_qa import baselines, heuristic, prompts, second_search, taxonomy
from roleagent_jax.envs.search_qa.corpus import NO_RESULTS, Retriever, write_corpus
from roleagent_jax.envs.search_qa.engine import MAX_TURNS, TOPK, WIN_REWARD, WORDINGS, SearchQAEnv
from roleagent_jax.envs.search_qa.http_retriever import REQUESTS
from roleagent_jax.envs.search_qa.kb import KBSize, generate_kb
from roleagent_jax.envs.search_qa.parser import ANSWER, SEARCH, VALIDITY_RULES, one_action, parse_turn
from roleagent_jax.envs.search_qa.questions import DEFAULT_MIX, KINDS, generate_questions
from roleagent_jax.envs.search_qa.reference_prompt import build_reference_prompt
from roleagent_jax.envs.search_qa.tasks import DATASETS, QATask, check_dataset, dataset_file, load_flashrag
from roleagent_jax.types import Trajectory

GEN_SPLITS = {"gen_train": "train", "gen_test": "test"}
PROMPTS = ("reference", "compact")  # verl-agent's SEARCH_TEMPLATE | a short one for tiny models
HELD_OUT_WORLDS = 1000  # held_out "worlds": gen_test's knowledge bases start this far from kb_seed


@dataclass(frozen=True)
class QAPayload:
    """What a worker needs to play one question: the question and which retriever answers it."""

    task: QATask
    retriever: tuple  # ("kb", kb_seed, size fields...) | ("http", url, request) | ("bm25", corpus path)
    topk: int = TOPK
    max_turns: int = MAX_TURNS
    win_reward: float = WIN_REWARD
    wording: str = "search_r1"


EMPTY_RETRIEVER_SEARCHES = 4  # fewer empty searches in a row may be bad queries; more mean a broken retriever
_RETRIEVERS: dict[tuple, Retriever] = {}  # per process: one retriever per spec, built on first use


def retriever_for(spec: tuple) -> Retriever:
    """The retriever a payload names, built once per process."""
    if spec not in _RETRIEVERS:
        from roleagent_jax.envs.search_qa.bm25_retriever import BM25Retriever

        kind = spec[0]
        if kind == "kb":
            _RETRIEVERS[spec] = BM25Retriever(generate_kb(spec[1], KBSize(*spec[2:])).passages())
        elif kind == "bm25":
            _RETRIEVERS[spec] = BM25Retriever.from_jsonl(spec[1])
        elif kind == "http":
            from roleagent_jax.envs.search_qa.http_retriever import HTTPRetriever

            _RETRIEVERS[spec] = HTTPRetriever(spec[1], request=spec[2])
        else:
            raise ValueError(f"unknown retriever spec {spec!r}")
    return _RETRIEVERS[spec]


class SearchQAFamilyEnv:
    """The contract's Env over `SearchQAEnv`: Task in, Observation out.

    An episode lasts at most min(max_steps, the task's max_turns) turns: the paper's limit of 4 turns
    holds even under a caller's generic step budget (evaluation defaults to 50, expert play to more).
    """

    def __init__(self, max_steps: int):
        self.max_steps = max_steps
        self._engine: SearchQAEnv | None = None

    def reset(self, task: Task, expert: bool = False) -> Observation:
        payload = task.payload
        if not isinstance(payload, QAPayload):
            raise ValueError(f"task {task.id!r} is not a search-QA task (payload {type(payload).__name__})")
        turns = min(self.max_steps, payload.max_turns)
        self._engine = SearchQAEnv(
            retriever_for(payload.retriever), turns, payload.topk, payload.win_reward, payload.wording
        )
        text, info = self._engine.reset(payload.task, expert=expert and bool(payload.task.plan))
        return self._observation(text, 0.0, False, info)

    def step(self, action: str) -> Observation:
        if self._engine is None:
            raise RuntimeError("step() before reset()")
        text, reward, done, info = self._engine.step(action)
        return self._observation(text, reward, done, info)

    @staticmethod
    def _observation(text: str, reward: float, done: bool, info: dict) -> Observation:
        return Observation(
            text=text,
            anchor=info["anchor"],
            state=info["state"],
            admissible=None,
            reward=reward,
            done=done,
            won=info["won"],
            score=info["em"] if done else None,
            expert_plan=info.get("expert_plan"),
            info={k: info[k] for k in ("step", "valid", "turn_kind", "answer", "em")},
        )


def _size(options: Mapping[str, Any]) -> KBSize:
    return KBSize(options["kb_countries"], options["kb_cities"], options["kb_people"], options["kb_works"])


def _mix(options: Mapping[str, Any]) -> dict[str, float]:
    """The question mix: a mapping kind -> weight, or "kind:weight" items (a string joined by commas, or a
    sequence, as command-line flags give them)."""
    raw = options["mix"]
    if isinstance(raw, str):
        raw = [p for p in raw.split(",") if p.strip()]
    if not isinstance(raw, Mapping):
        pairs = [str(p).split(":") for p in raw]
        if any(len(p) != 2 for p in pairs):
            raise ValueError(f"env option 'mix' must be kind:weight items, got {options['mix']!r}")
        raw = {k.strip(): w for k, w in pairs}
    try:
        mix = {k: float(v) for k, v in raw.items()}
    except (TypeError, ValueError) as exc:
        raise ValueError(f"env option 'mix' needs numeric weights, got {options['mix']!r}") from exc
    if set(mix) - set(KINDS):
        raise ValueError(f"env option 'mix' names unknown question kinds {sorted(set(mix) - set(KINDS))}")
    return mix


def _play_expert(
    tasks: Sequence[QATask], retriever: Retriever, topk: int, max_turns: int, wording: str
) -> list[tuple[str, ...] | None]:
    """Each question's expert responses when the expert, reading real retrievals, answers right."""
    env = SearchQAEnv(retriever, max_turns, topk, wording=wording)
    plans = []
    for t in tasks:
        _, info = env.reset(t, expert=True)
        played, done = [], False
        while not done and info["expert_plan"]:
            played.append(info["expert_plan"][0])
            _, _, done, info = env.step(played[-1])
        plans.append(tuple(played) if info["won"] else None)
    return plans


class SearchQA(Family):
    name = "search_qa"
    task_types = (*KINDS, *DATASETS)
    # The contract has one stop string and search QA needs two; searches stop here, answers end the
    # response by EOS (trained models emit it after </answer>) or at max_response_tokens.
    action_stop = "</search>"
    # A branch forced to open one of these writes no <think> block first; both validity rules accept that.
    action_openers = (f"<{SEARCH}>", f"<{ANSWER}>")
    empty_action = ""
    has_expert = True
    score_name = "em"
    generated_splits = tuple(GEN_SPLITS)
    gen_options = {
        "kb_seed": 0,
        "kb_worlds": 1,
        "kb_countries": KBSize.countries,
        "kb_cities": KBSize.cities,
        "kb_people": KBSize.people,
        "kb_works": KBSize.works,
        "mix": dict(DEFAULT_MIX),
        "held_out": "entities",
        "topk": TOPK,
        "max_turns": MAX_TURNS,
        "retriever_url": "",
        "corpus": "",
        # The reference's choices: Role-Agent's retrieval server ("query"; Search-R1's: "queries"), the
        # SEARCH_TEMPLATE prompt, its one-action rule ("format"; "block": the first block decides), the
        # retrieved passages whole (passage_chars 0; > 0 cuts them), reward 1.0 for an exact match.
        "retriever_request": "query",
        "prompt": "reference",
        "valid": "format",
        "passage_chars": 0,
        "win_reward": WIN_REWARD,
        "wording": "search_r1",  # observations in Search-R1's words (engine.WORDINGS)
    }
    predictor_framing = prompts.PREDICTOR_FRAMING
    analysis_intro = prompts.ANALYSIS_INTRO
    failure_types = taxonomy.SEARCH_QA_TYPES
    failure_keywords = taxonomy.FAILURE_KEYWORDS
    pattern_keywords = taxonomy.PATTERN_KEYWORDS

    def make_env(self, max_steps: int) -> SearchQAFamilyEnv:
        if max_steps < 1:
            raise ValueError(f"max_steps (turns) must be >= 1, got {max_steps}")
        return SearchQAFamilyEnv(max_steps)

    # ------------------------------------------------------------------ tasks

    def data_tasks(self, request: PoolRequest) -> TaskPool:
        """Real data sets joined by "+"; with ``on_corrupt="skip"`` a data set whose file cannot be read
        is left out with a warning naming it."""
        split, data_dir, opts = request.split, request.data_dir, request.options
        self.check_split(split)  # an unknown name is named before a retriever is asked for
        spec = self._real_retriever(opts, split)
        tasks: list[QATask] = []
        for part in split.split("+"):
            try:
                tasks += _load_part(part.strip(), data_dir)
            except ValueError as err:
                if request.on_corrupt != "skip":
                    raise
                warnings.warn(f"skipped {part.strip()!r}: {err}", stacklevel=3)
        return TaskPool([_task(t, spec, opts) for t in tasks], source=f"{split} from {data_dir}")

    def generated_tasks(self, request: PoolRequest) -> TaskPool:
        """n questions over the generated knowledge bases the options name (see the module)."""
        split, n, seed = request.split, request.n, request.seed
        opts, gen_dir = request.options, request.gen_dir
        if n < 1:
            raise ValueError(f"split {split!r} is generated: give the number of questions (n >= 1), got {n}")
        worlds, held_out = opts["kb_worlds"], str(opts["held_out"])
        if not isinstance(worlds, int) or worlds < 1:
            raise ValueError(f"env option 'kb_worlds' must be an integer >= 1, got {worlds!r}")
        size = _size(opts)
        first = opts["kb_seed"] + (HELD_OUT_WORLDS if held_out == "worlds" and split == "gen_test" else 0)
        tasks: list[Task] = []
        folders = []
        for w in range(worlds):
            count = n // worlds + (w < n % worlds)
            if not count:
                continue
            kb_seed = first + w
            kb = generate_kb(kb_seed, size)
            questions = generate_questions(kb, count, GEN_SPLITS[split], seed, _mix(opts), held_out)
            if worlds > 1:  # ids stay unique across knowledge bases
                questions = [replace(q, id=f"{q.id}_kb{kb_seed}") for q in questions]
            spec = ("kb", kb_seed, size.countries, size.cities, size.people, size.works)
            plans = _play_expert(
                questions, retriever_for(spec), opts["topk"], opts["max_turns"], opts["wording"]
            )
            tasks += [_task(q, spec, opts, plan) for q, plan in zip(questions, plans)]
            if gen_dir:
                folder = (
                    Path(gen_dir)
                    / f"search_qa_kb{kb_seed}_{size.countries}_{size.cities}_{size.people}_{size.works}"
                )
                folder.mkdir(parents=True, exist_ok=True)
                write_corpus(kb.passages(), folder / "corpus.jsonl")
                _write_questions(questions, folder / f"{split}_n{count}_seed{seed}.jsonl")
                folders.append(folder)
        seeds = f"kb_seed={first}" if worlds == 1 else f"kb_seeds={first}..{first + worlds - 1}"
        source = f"generated {split} n={n} seed={seed} {seeds}"
        if folders:
            source += (
                f" (files in {folders[0]})"
                if len(folders) == 1
                else f" (files in {len(folders)} folders of {gen_dir})"
            )
        return TaskPool(tasks, source)

    def check_split(self, split: str) -> None:
        if split not in self.generated_splits:
            for part in split.split("+"):
                _check_part(part.strip())

    @staticmethod
    def _real_retriever(opts: dict, split: str) -> tuple:
        if opts["retriever_url"]:
            return ("http", str(opts["retriever_url"]), opts["retriever_request"])
        if opts["corpus"]:
            path = Path(str(opts["corpus"]))
            if not path.is_file():
                raise FileNotFoundError(f"search_qa corpus file not found: {path}")
            return ("bm25", str(path.resolve()))
        raise ValueError(
            f"search_qa split {split!r} needs a retriever: set the env option retriever_url (a running "
            "retrieval server, POST /retrieve) or corpus (a JSONL corpus for local BM25)"
        )

    # ------------------------------------------------------------------ agent

    def agent_prompt(
        self, goal: str, history: History, observation: str, admissible: Admissible, step: int, history_k: int
    ) -> str:
        if self.options["prompt"] == "reference":
            return build_reference_prompt(goal, prompts.recent_turns(history, observation, history_k), step)
        chars = self.options["passage_chars"]
        return prompts.build_agent_prompt(goal, history, observation, step, k=history_k, passage_chars=chars)

    def parse_action(self, response: str, admissible: Sequence[str] | None) -> tuple[str | None, bool]:
        turn = parse_turn(response)
        if self.options["valid"] == "block":
            return turn.action, turn.valid
        return turn.action, turn.valid and one_action(response)

    def check_options(self, options: Mapping[str, Any]) -> None:
        for key, allowed in (
            ("retriever_request", REQUESTS),
            ("prompt", PROMPTS),
            ("valid", VALIDITY_RULES),
            ("wording", WORDINGS),
        ):
            if options[key] not in allowed:
                raise ValueError(f"{key}={options[key]!r}: must be one of {', '.join(allowed)}")
        if not isinstance(options["passage_chars"], int) or options["passage_chars"] < 0:
            raise ValueError(f"passage_chars={options['passage_chars']!r}: must be an integer >= 0")
        if not isinstance(options["win_reward"], (int, float)) or options["win_reward"] <= 0:
            raise ValueError(f"win_reward={options['win_reward']!r}: must be a number > 0")

    def random_response(self, rng, goal: str, observation: Observation) -> str:
        return baselines.random_response(rng, goal, observation.text)

    def format_action(self, action: str) -> str:
        """Actions are already responses: "<search>query</search>" or "<answer>text</answer>"."""
        turn = parse_turn(action)
        return turn.action if turn.valid else f"<{SEARCH}>{action}</{SEARCH}>"

    # ------------------------------------------------------------------ evaluation

    def behaviour(self, trajs: Sequence[Trajectory], pool: TaskPool) -> dict[str, float]:
        """Second-search rates: how often an episode searched twice, on the tasks whose expert plan holds
        two or more searches and on the others (`second_search.second_search_rates`); tasks without a
        plan (real data sets) are left out."""
        return second_search.second_search_rates(trajs, pool.expert_plans)

    def warnings(self, trajs: Sequence[Trajectory]) -> list[str]:
        """A retriever that found nothing for every one of several queries is broken (an empty index, a
        wrong corpus), not a run of bad queries: its episodes can only fail, and would teach the policy
        that searching never helps."""
        found = [
            s.next_observation != f"<information>{NO_RESULTS}</information>"
            for t in trajs
            for s in t.steps
            if s.next_observation.startswith("<information>")
        ]
        if len(found) < EMPTY_RETRIEVER_SEARCHES or any(found):
            return []
        return [
            f"the retriever returned no passage for any of {len(found)} searches: check its index and "
            "corpus (retriever_url, corpus)"
        ]

    # ------------------------------------------------------------------ AIW

    def analyse_failure(self, traj, max_steps: int):
        return heuristic.analyse(traj, max_steps)

    def abstract_goal(self, goal: str, task_type: str) -> str:
        return taxonomy.abstract_question(goal)

    def pattern_name(self, task_type: str) -> str:
        return taxonomy.pattern_of(task_type)

    def pattern_text(self, task_type: str) -> str:
        return taxonomy.pattern_description(task_type)


def _task(q: QATask, spec: tuple, opts: Mapping[str, Any], plan: tuple[str, ...] | None = None) -> Task:
    payload = QAPayload(
        q, spec, int(opts["topk"]), int(opts["max_turns"]), float(opts["win_reward"]), opts["wording"]
    )
    return Task(q.id, q.kind, q.question, payload, plan)


def _write_questions(questions: Sequence[QATask], path: Path) -> None:
    with path.open("w", encoding="utf-8") as f:
        for q in questions:
            record = {
                "id": q.id,
                "question": q.question,
                "golden_answers": list(q.golds),
                "metadata": {"kind": q.kind},
            }
            f.write(json.dumps(record, ensure_ascii=False) + "\n")


_PART = re.compile(r"^(tfds:)?([\w.-]+)(?::([\w.-]+))?$")


def _check_part(part: str) -> None:
    """ValueError naming `part` and every valid split when it is no split search QA knows."""
    m = _PART.match(part)
    if m and (m.group(1) or m.group(2) in DATASETS):
        return
    raise ValueError(
        f"unknown search_qa split {part!r}: generated {', '.join(GEN_SPLITS)}, or real data sets "
        f"{', '.join(DATASETS)} (NAME or NAME:SPLIT, tfds:NAME[:SPLIT]; several joined by +)"
    )


def _load_part(part: str, data_dir) -> list[QATask]:
    m = _PART.match(part)
    if not m:
        raise ValueError(f"cannot read split {part!r}: use NAME, NAME:SPLIT or tfds:NAME[:SPLIT]")
    tfds_prefix, name, sub = m.groups()
    if not data_dir:
        raise FileNotFoundError(f"split {part!r} is real data: give its folder or file as data_dir (--data)")
    if tfds_prefix:
        from roleagent_jax.envs.search_qa.tfds_data import load_tfds

        return load_tfds(name, data_dir, sub or "validation")
    check_dataset(name)
    path = Path(data_dir)
    return load_flashrag(path if path.is_file() else dataset_file(path, name, sub), name)
