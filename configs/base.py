"""Shared configuration pieces. Every knob the trainer reads is named here, with its default.

Override any value on the command line: `--config.rollout.group_size=4`. Unknown keys fail at start.
"""

from ml_collections import ConfigDict


def get_config() -> ConfigDict:
    c = ConfigDict()
    c.algo = (
        "roleagent"  # grpo | gigpo | wia (GiGPO + WIA) | aiw (GiGPO + AIW) | roleagent (GiGPO + WIA + AIW)
    )
    c.seed = 0
    c.workdir = "runs/default"
    c.iterations = 150

    c.model = ConfigDict()
    c.model.path = ""  # Hugging Face directory (config.json + safetensors); "" = build from model.init
    c.model.required = False  # True: no model.path fails at start-up instead of training a random model
    c.model.init = ConfigDict()  # random init when no path: a Qwen2 config.json's fields
    c.model.init.hidden_size = 128
    c.model.init.intermediate_size = 352
    c.model.init.num_hidden_layers = 2
    c.model.init.num_attention_heads = 4
    c.model.init.num_key_value_heads = 2
    c.model.init.rope_theta = 10000.0
    c.model.init.tie_word_embeddings = True
    c.model.init.max_position_embeddings = 2048
    c.model.param_dtype = "float32"  # weights and optimizer state (float32 master weights for RL)
    c.model.dtype = "float32"  # compute dtype ("bfloat16" on TPU)
    c.model.remat = False
    c.model.scan_layers = False

    c.lora = ConfigDict()  # LoRA adapters: only they train; the base is frozen and is the KL reference
    c.lora.rank = 0  # 0 = full fine-tuning
    c.lora.alpha = 16.0  # the update is scaled by alpha / rank
    c.lora.dropout = 0.0  # dropout on the adapters' input during updates
    c.lora.targets = ("q", "k", "v", "o", "gate", "up", "down")  # projections that get an adapter

    c.tokenizer = ConfigDict()
    c.tokenizer.path = ""  # "" = the model directory's tokenizer, or a trained BPE for random init
    c.tokenizer.train_vocab_size = 1024

    c.mesh = ConfigDict()
    c.mesh.data = 1
    c.mesh.fsdp = -1  # -1: all remaining devices
    c.mesh.tensor = 1

    c.env = ConfigDict()
    c.env.name = "alfworld"  # the scenario family (roleagent_jax.envs.registered())
    c.env.data_dir = ""  # "" = $ALFWORLD_DATA
    c.env.data_required = False  # True: the real splits' data is checked at start-up, before any game
    c.env.on_corrupt = (
        "fail"  # a real split's unreadable task file: fail naming it, or skip it with a warning
    )
    c.env.train_split = "train"  # a split of the family; ALFWorld: train | valid_* | gen_seen | gen_unseen
    c.env.eval_splits = ("valid_seen", "valid_unseen")
    c.env.max_steps = 50
    c.env.history_k = 2
    c.env.num_workers = 8
    c.env.step_timeout = 60.0
    c.env.gen = ConfigDict()  # the family's generated splits (ALFWorld: gen_seen / gen_unseen)
    c.env.gen.dir = ""  # where generated tasks go ("" = <workdir>/games); share it between runs
    c.env.gen.n_train = 64
    c.env.gen.n_eval = 24
    c.env.gen.seed = 0
    # Each family's own generation settings, under its name (read when env.name selects it).
    c.env.alfworld = ConfigDict()
    c.env.alfworld.num_receptacles = 6
    c.env.alfworld.num_objects = 6
    c.env.alfworld.prompt = "reference"  # reference (the published ALFWORLD_TEMPLATE) | compact (tiny models)
    c.env.alfworld.valid = (
        "format"  # format (<think> + <action>, as published) | available (a listed command)
    )
    c.env.search_qa = ConfigDict()  # generated knowledge base (gen_train / gen_test) and retrieval
    c.env.search_qa.kb_seed = 0
    c.env.search_qa.kb_worlds = 1  # knowledge bases a generated split's questions are spread over
    c.env.search_qa.kb_countries = 10
    c.env.search_qa.kb_cities = 50
    c.env.search_qa.kb_people = 160
    c.env.search_qa.kb_works = 240
    c.env.search_qa.mix = {"single_hop": 0.35, "bridge": 0.3, "bridge3": 0.2, "comparison": 0.15}
    c.env.search_qa.held_out = "entities"  # entities | questions | worlds: kept unseen by gen_test
    c.env.search_qa.topk = 3  # passages per search
    c.env.search_qa.max_turns = 4
    c.env.search_qa.retriever_url = ""  # real data sets: a retrieval server (POST /retrieve), or
    c.env.search_qa.corpus = ""  # a JSONL corpus indexed with BM25 in each worker
    c.env.search_qa.retriever_request = "query"  # query (Role-Agent's server) | queries (Search-R1's)
    c.env.search_qa.prompt = "reference"  # reference (verl-agent's SEARCH_TEMPLATE) | compact (tiny models)
    c.env.search_qa.valid = "format"  # format (one search or answer, as published) | block (first block)
    c.env.search_qa.passage_chars = 0  # retrieved text in the prompt: 0 = whole, as published; > 0 cuts it
    c.env.search_qa.win_reward = 1.0  # reward of an exact match (the reference's 1.0)
    c.env.search_qa.wording = "search_r1"  # search_r1 (its quoted titles, its invalid-turn message) | compact

    c.rollout = ConfigDict()
    c.rollout.tasks_per_iter = 16  # B
    c.rollout.group_size = 8  # G
    c.rollout.temperature = 1.0
    c.rollout.top_p = 1.0
    c.rollout.top_k = 0
    c.rollout.max_prompt_tokens = 2048
    c.rollout.max_response_tokens = 512
    c.rollout.max_rows_per_call = 0  # sampler rows per call (0 = up to 256); lower it when prefill OOMs

    c.advantage = ConfigDict()
    c.advantage.gamma = 0.95
    c.advantage.omega = 1.0
    c.advantage.mode = "mean_std_norm"  # mean_norm | mean_std_norm
    c.advantage.invalid_penalty = 0.1
    c.advantage.credit_invalid = True  # False: invalid actions never share a won episode's credit
    c.advantage.negative_scale = 1.0  # < 1 damps negative advantages (1 = as published)
    c.advantage.std_floor = 0.0  # > 0 floors the group std of mean_std_norm (all-fail groups)
    c.advantage.anchor_similarity = 1.0  # < 1 merges near-identical anchors into one step group

    c.loss = ConfigDict()
    c.loss.clip_eps = 0.2
    c.loss.dual_clip = 3.0
    c.loss.kl_type = "low_var_kl"  # low_var_kl | kl | none
    c.loss.kl_coef = 0.01
    c.loss.entropy_coef = 0.001
    c.loss.agg = "token-mean"  # token-mean | seq-mean-token-mean

    c.optim = ConfigDict()
    c.optim.lr = 1e-6
    c.optim.weight_decay = 0.01
    c.optim.grad_clip = 1.0
    c.optim.warmup_steps = 0
    c.optim.schedule = "constant"  # constant | cosine

    c.train = ConfigDict()
    c.train.mini_batch_rows = 256  # rows per optimizer step
    c.train.micro_batch_rows = 32  # rows per accumulation micro-batch
    c.train.ppo_epochs = 1
    # recompute: a forward pass before the update (robust to a lower-precision sampler) | sampler: the
    # rollout's own log-probs, one pass fewer
    c.train.old_logprobs = "recompute"

    c.wia = ConfigDict()
    c.wia.mode = "separate"  # separate (the paper's) | inline (the public code's) | off
    c.wia.horizon = 2
    c.wia.lam = 1.0
    c.wia.fraction = 1.0  # share of steps that get a prediction
    c.wia.max_tokens = 128
    c.wia.backend = "rapidfuzz"  # rapidfuzz | difflib
    # separate mode only. False (the paper's setting): predictions only score the agent through the WIA
    # multiplier; the action's advantage says nothing about whether a prediction was right, so training on
    # it would teach the world role to echo winning episodes. True (like the public code's inline mode):
    # each prediction is also a training row with the advantage of the action it predicts the outcome of.
    c.wia.train_predictor = False

    c.aiw = ConfigDict()
    c.aiw.enabled = True  # set by algo: on for aiw and roleagent
    c.aiw.analyser = "llm"  # llm: the policy analyses its own failures (heuristic stands in for bad answers)
    c.aiw.retrieval = "fuzzy"  # fuzzy: keyword match of the report | llm: the policy picks among candidates
    c.aiw.top_k = 3  # tasks retrieved per failure
    c.aiw.min_sim = 0.0  # retrieved tasks below this similarity are dropped
    c.aiw.self_boost = 1.0  # the failed task's own boost (retrieved tasks get their similarity)
    c.aiw.aggregate = "max"  # max | sum: how one round's boosts of a task combine
    c.aiw.eta = 1.0  # task-sampler step: logit += eta * boost
    c.aiw.decay = 0.9  # task-sampler logits decay per round (old failures fade)
    c.aiw.temperature = 1.0  # task-sampler softmax temperature
    c.aiw.epsilon = 0.2  # share of uniform sampling mixed in (every task stays reachable)
    c.aiw.cap = 0.05  # largest probability of one task (0 = no cap; never below 1 / tasks)
    # boost weight of a task whose recent rollouts all fail (or all win): its groups teach nothing
    c.aiw.unlearnable_weight = 0.25
    c.aiw.max_tokens = 256  # analyst and chooser answer length
    # (the retrieval's tie-break seed is the run's seed)

    c.warmstart = ConfigDict()  # supervised warm start on expert trajectories (0 steps = off)
    c.warmstart.steps = 0
    c.warmstart.copy_steps = 0  # steps of "repeat this random sequence" first: teaches a new model to copy
    c.warmstart.lr = 1e-3
    c.warmstart.batch_rows = 32
    c.warmstart.checkpoint_every = (
        250  # steps between warm-start checkpoints (0 = none); a kill resumes there
    )
    c.warmstart.n_games = 0  # games the expert plays (0 = the whole RL pool)
    c.warmstart.own_games = False  # generated splits: the warm start plays games RL never trains on
    c.warmstart.explore = 0.0  # share of expert steps played off-plan (DAgger-style recovery states)
    c.warmstart.predictor = True  # also teach the predictor role
    c.warmstart.predictor_fraction = 1.0  # share of expert steps that also give a predictor example
    # True: each target ends with the tokenizer's EOS, as a chat model's turn ends: search QA's answers
    # (no stop string) then end there instead of running to max_response_tokens
    c.warmstart.end_turn = False

    c.eval = ConfigDict()
    c.eval.before = True  # evaluate the starting (warm-started) model before RL
    c.eval.every = 5
    c.eval.temperature = 0.4
    c.eval.greedy = False
    c.eval.limit = 0  # 0 = every game of the split

    c.checkpoint = ConfigDict()
    c.checkpoint.every = 5
    c.checkpoint.keep = 3
    c.checkpoint.resume = True  # continue from the newest readable checkpoint in the workdir
    # With resume=False a workdir that holds checkpoints is refused; overwrite=True moves that earlier
    # run aside (to <workdir>.replaced-<time>) and starts afresh.
    c.checkpoint.overwrite = False

    c.log = ConfigDict()
    c.log.tensorboard = True
    c.log.progress = True
    return c
