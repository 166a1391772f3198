"""The paper's search-QA run: Qwen2.5-7B-Instruct, trained on NQ + HotpotQA, evaluated on seven sets.

    python -m roleagent_jax.main --config=configs/search_qa.py \
        --config.model.path=/path/Qwen2.5-7B-Instruct --config.env.data_dir=/path/flashrag_datasets \
        --config.env.search_qa.retriever_url=http://127.0.0.1:8000/retrieve

Data: FlashRAG's JSONL files under env.data_dir (<data_dir>/nq/train.jsonl, .../hotpotqa/dev.jsonl,
...). Retrieval: Role-Agent's retrieval server (E5 over the 2018 Wikipedia dump in 100-word passages,
top 3; one {"query": ...} per request) behind env.search_qa.retriever_url; Search-R1's server takes
--config.env.search_qa.retriever_request=queries. Settings follow Role-Agent's run_search.sh: 256
questions x 5 rollouts, at most 4 turns, all of them in the prompt, step groups by anchor similarity >=
0.9, reward 1.0 for an exact match and invalid-format penalty 0.01, mini-batch 512, greedy evaluation
every 50 iterations and none before training, one pass over the training questions. The prompt, the
validity rule, whole passages and the reward are the family's defaults (the reference's).
"""

import os

from configs import base
from roleagent_jax.envs.search_qa import INVALID_PENALTY, MAX_TURNS, TOPK
from roleagent_jax.envs.search_qa.tasks import DATASETS, TRAIN_SETS


def get_config():
    c = base.get_config()
    c.workdir = "runs/search_qa"
    c.iterations = 660  # ~169k NQ + HotpotQA training questions / 256 per iteration: one epoch
    base.paper_run(c)

    c.env.name = "search_qa"
    c.env.data_dir = os.environ.get("SEARCH_QA_DATA", "")  # FlashRAG's dataset folder
    c.env.train_split = "+".join(f"{name}:train" for name in TRAIN_SETS)
    c.env.eval_splits = tuple(DATASETS)  # each at the split Search-R1 evaluates on
    c.env.max_steps = MAX_TURNS
    c.env.history_k = MAX_TURNS  # every earlier search and its results
    c.env.num_workers = 16
    c.env.search_qa.retriever_url = os.environ.get("SEARCH_QA_RETRIEVER", "http://127.0.0.1:8000/retrieve")
    c.env.search_qa.topk = TOPK
    c.env.search_qa.max_turns = MAX_TURNS

    c.rollout.tasks_per_iter = 256
    c.rollout.group_size = 5
    c.rollout.max_prompt_tokens = 4096

    c.advantage.invalid_penalty = INVALID_PENALTY
    c.advantage.anchor_similarity = 0.9  # retrieved passages rarely repeat exactly: near-equal ones group

    c.loss.kl_coef = 0.001
    c.loss.entropy_coef = 0.0
    c.optim.warmup_steps = 66  # 10% of the run
    c.train.mini_batch_rows = 512

    c.wia.horizon = 1  # ~5% of at most 4 turns rounds up to one predicted result
    c.wia.max_tokens = 256  # three passages
    c.aiw.retrieval = "fuzzy"

    c.eval.before = False  # run_search.sh: val_before_train=False
    c.eval.every = 50  # run_search.sh: test_freq=50
    c.eval.greedy = True  # the reference sets no val_kwargs: verl validates greedily
    c.eval.limit = 0  # every question of the seven sets (~52k)
    c.checkpoint.every = 50
    return c
