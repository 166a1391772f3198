"""Every config key the trainer reads, declared once: default, check and meaning.

`configs/base.py` builds its ConfigDict from `CONFIG`; `validate` runs the checks. List them with
`python -m roleagent_jax.config`. Checks across keys (and of files) are in `checks.py`.
"""

from __future__ import annotations

from roleagent_jax.backends.base import BACKENDS
from roleagent_jax.config.schema import FamilyOptions, Key, Section

# The algorithms as presets: the keys each one sets, over the config's values (`checks.apply_algo`).
# GRPO = episode-level advantages only; GiGPO adds step groups; Role-Agent adds WIA and AIW; the paper's
# ablations: wia = GiGPO + WIA, aiw = GiGPO + AIW.
ALGO_PRESETS = {
    "grpo": {"advantage.step_level": False, "wia.mode": "off", "aiw.enabled": False},
    "gigpo": {"advantage.step_level": True, "wia.mode": "off", "aiw.enabled": False},
    "wia": {"advantage.step_level": True, "aiw.enabled": False},
    "aiw": {"advantage.step_level": True, "wia.mode": "off"},
    "roleagent": {"advantage.step_level": True},
}
ALGOS = tuple(ALGO_PRESETS)
# Keys that were renamed (old -> new): a config file or command line that still sets one is refused.
RENAMED = {"wia.backend": "wia.similarity"}
DTYPES = ("float32", "bfloat16", "float16")

MODEL = Section("model", "the policy: a Hugging Face checkpoint, or a small random Qwen2", [
    Key("path", "", 'Hugging Face directory (config.json + safetensors); "" = build from model.init'),
    Key("required", False, "True: no model.path fails at start-up instead of training a random model"),
    Section("init", "random init when no path: a Qwen2 config.json's fields (checked as that file is)", [
        Key("hidden_size", 128, "width"),
        Key("intermediate_size", 352, "MLP width"),
        Key("num_hidden_layers", 2, "layers"),
        Key("num_attention_heads", 4, "query heads"),
        Key("num_key_value_heads", 2, "key/value heads (grouped-query attention)"),
        Key("rope_theta", 10000.0, "RoPE base"),
        Key("tie_word_embeddings", True, "the output projection is the embedding"),
        Key("max_position_embeddings", 2048, "context length"),
    ]),
    Key("param_dtype", "float32", "weights and optimizer state (float32 master weights for RL)",
        choices=DTYPES),
    Key("dtype", "float32", 'compute dtype ("bfloat16" on TPU)', choices=DTYPES),
    Key("remat", False, "recompute activations in the backward pass (less memory, more compute)"),
    Key("scan_layers", False, "one scanned layer body instead of unrolled layers (faster compiles)"),
])  # fmt: skip

LORA = Section("lora", "LoRA adapters: only they train; the base is frozen and is the KL reference", [
    Key("rank", 0, "0 = full fine-tuning"),
    Key("alpha", 16.0, "the update is scaled by alpha / rank"),
    Key("dropout", 0.0, "dropout on the adapters' input during updates"),
    Key("targets", ("q", "k", "v", "o", "gate", "up", "down"), "projections that get an adapter"),
    Key("layers", 0, "adapters on the top k layers only, 0 = every layer; no backward pass runs below "
        "the lowest adapted layer (peft's layers_to_transform)", ge=0),
])  # fmt: skip

TOKENIZER = Section("tokenizer", "the tokenizer", [
    Key("path", "", '"" = the model directory\'s tokenizer, or a trained BPE for random init'),
    Key("train_vocab_size", 1024, "vocabulary of the BPE trained for a random model", ge=300),
])  # fmt: skip

MESH = Section("mesh", "device mesh; data x fsdp x tensor must use every device", [
    Key("data", 1, "data-parallel axis (-1: all remaining devices)"),
    Key("fsdp", -1, "parameter-sharded data-parallel axis (-1: all remaining devices)"),
    Key("tensor", 1, "tensor-parallel axis (-1: all remaining devices)"),
])  # fmt: skip

ENV = Section("env", "the scenario family, its splits and its workers", [
    Key("name", "alfworld", "the scenario family (roleagent_jax.envs.registered())"),
    Key("data_dir", "", 'the real splits\' data; "" = the family\'s own default ($ALFWORLD_DATA, ...)'),
    Key("data_required", False, "True: the real splits' data is checked at start-up, before any game"),
    Key("on_corrupt", "fail", "a real split's unreadable task file: fail naming it, or skip it (warning)",
        choices=("fail", "skip")),
    Key("train_split", "train", "a split of the family; ALFWorld: train | valid_* | gen_seen | gen_unseen"),
    Key("eval_splits", ("valid_seen", "valid_unseen"), "splits evaluated before, during and after RL"),
    Key("max_steps", 50, "steps per episode", ge=1),
    Key("history_k", 2, "earlier steps shown in the prompt", ge=0),
    Key("num_workers", 8, "environment worker processes", ge=1),
    Key("step_timeout", 60.0, "seconds one environment step may take", gt=0.0),
    Key("max_lost_share", 0.5, "share of an iteration's or evaluation's episodes that may be lost to the "
        "environment (a retriever down, a crashed or hung worker) before the run stops, exit 3",
        ge=0.0, le=1.0),
    Section("gen", "the family's generated splits (ALFWorld: gen_seen / gen_unseen)", [
        Key("dir", "", 'where generated tasks go ("" = <workdir>/games); share it between runs'),
        Key("n_train", 64, "tasks generated for training", ge=1),
        Key("n_eval", 24, "tasks generated per evaluation split", ge=1),
        Key("seed", 0, "generation seed (evaluation and warm-start games get their own offsets)", ge=0),
    ]),
    FamilyOptions("each family's own settings, under its name, defaults from the family's gen_options"),
])  # fmt: skip

ROLLOUT = Section("rollout", "episodes sampled per iteration", [
    Key("tasks_per_iter", 16, "tasks per iteration (B)", ge=1),
    Key("group_size", 8, "rollouts per task (G)", ge=2,
        why="every algorithm normalises a return within its task's G rollouts: with 1 the reward never "
        "reaches the advantage and the run cannot learn"),
    Key("temperature", 1.0, "sampling temperature", gt=0.0),
    Key("top_p", 1.0, "nucleus sampling", gt=0.0, le=1.0),
    Key("top_k", 0, "0 = off", ge=0),
    Key("max_prompt_tokens", 2048, "longer prompts are cut from the left", ge=16),
    Key("max_response_tokens", 512, "answer length", ge=1),
    Key("max_rows_per_call", 0, "sampler rows per call (0 = up to 256); lower it when prefill OOMs", ge=0),
    Key("backend", "jax", "what generates: the rollouts, evaluation and AIW's analyst (roleagent_jax.backends)",
        choices=tuple(BACKENDS)),
    # Tree-style branching: a step group of GiGPO then holds G different answers at one state instead of
    # the few that plain rollouts happen to share (search QA: a second search after the first).
    Key("branch_at", 0, "a task group's rollouts share their first k steps (one samples them, the others "
        "replay its answers) and branch at step k; 0 = plain rollouts; evaluation never branches", ge=0),
    Key("branch_openers", False, "branch j's answer at step branch_at (0: the first) starts with the "
        "family's action opener j (mod their number), forced, and out of the loss unless train_openers; the "
        "family must declare openers"),
    Key("expert_branch", False, "a task group's last branch plays the family's expert's next action at "
        "step branch_at, forced whole (trained only with train_openers), so a group none of whose own "
        "branches wins still holds a step that can (BREAD's expert prefix); the family needs an expert"),
    Key("expert_slots", 1, "with expert_branch: how many of a task group's last branches play the expert's "
        "step (each then samples on its own after it): more rows of the expert's step for the guided loss",
        ge=1),
    Key("expert_when", "always", "with expert_branch: always, or no_win: a group's own episodes play first "
        "and only a group none of which won (BREAD) plays its expert_slots again from the shared prefix with "
        "the expert's step (at most expert_slots episodes more per group, the prefix replayed, not sampled)",
        choices=("always", "no_win")),
    # Forced openers explore; only a gradient on them teaches the choice itself (a greedy model that never
    # searches twice gets none from the tokens after a forced <search>).
    Key("train_openers", False, "a branch's forced opener is trained as if the policy had sampled it: its "
        "old log-prob is the policy's own (ratio 1 at first; the sampler scores it in its prefill, so "
        "train.old_logprobs=sampler needs no pass of its own), its advantage the step's; False: openers "
        "only explore and carry no gradient"),
])  # fmt: skip

ADVANTAGE = Section("advantage", "GiGPO / GRPO advantages", [
    Key("gamma", 0.95, "discount of step returns", ge=0.0, le=1.0),
    Key("omega", 1.0, "weight of the step-group advantage", ge=0.0),
    Key("mode", "mean_std_norm", "group normalisation", choices=("mean_norm", "mean_std_norm")),
    Key("invalid_penalty", 0.1, "subtracted from an invalid action's score (the task's win is 10)", ge=0.0),
    Key("penalty_levels", "both", "where the penalty counts: both (the reference), step, episode",
        choices=("both", "step", "episode")),
    Key("credit_invalid", True, "False: invalid rows keep no positive credit; their valid group-mates "
        "share it (the sums stay zero)"),
    Key("negative_scale", 1.0, "< 1 damps negative advantages (1 = as published)", ge=0.0, le=1.0),
    Key("std_floor", 0.0, "> 0 floors the group std of mean_std_norm (all-fail groups)", ge=0.0),
    Key("anchor", "state", "step groups keyed by the family's state identity, or by the observation text "
        "(the reference's; merges 'Nothing happens.' from every state)", choices=("state", "observation")),
    Key("anchor_similarity", 1.0, "< 1 merges near-identical anchors into one step group", gt=0.0, le=1.0),
    Key("step_level", True, "set by algo: GiGPO's step groups, off for grpo"),
])  # fmt: skip

LOSS = Section("loss", "the PPO loss", [
    Key("clip_eps", 0.2, "ratio clip", gt=0.0, le=1.0),
    Key("clip_eps_high", 0.0, "upper ratio clip of positive advantages (DAPO's Clip-Higher: 0.28 lets rare "
        "good tokens grow, against entropy collapse); 0 = clip_eps", ge=0.0),
    Key("dual_clip", 3.0, "dual-clip bound of negative advantages", gt=1.0),
    Key("kl_type", "low_var_kl", "KL to the reference", choices=("low_var_kl", "kl", "none")),
    Key("kl_coef", 0.01, "KL weight", ge=0.0),
    Key("entropy_coef", 0.001, "entropy bonus", ge=0.0),
    Key("agg", "token-mean", "how token losses are averaged", choices=("token-mean", "seq-mean-token-mean")),
    # Off by default until a run shows it helps. nll is the one to try first: its gradient on a token the
    # policy gives 1% is as large as on any other, where shaped's (A p gamma / (p + gamma)^2) is ~0.08 A.
    Key("guided", "none", "the loss of the expert's forced step (rollout.expert_branch) instead of the ratio: "
        "none (the PPO term, trained only with train_openers) | shaped (LUFFY: -A p / (p + guided_gamma), "
        "unclipped) | nll (CHORD: guided_mu x NLL, the advantage unused); KL and entropy leave those tokens "
        "out (losses.policy_loss)", choices=("none", "shaped", "nll")),
    Key("guided_gamma", 0.1, "shaped: gamma of p / (p + gamma); the gradient in log p peaks at p = gamma",
        gt=0.0),
    Key("guided_mu", 0.9, "nll: the weight of each expert token's NLL at the first iteration (the token-mean "
        "counts every token of the mini-batch)", ge=0.0),
    Key("guided_mu_end", 0.05, "nll: the weight at the last iteration, linear in between", ge=0.0),
])  # fmt: skip

OPTIM = Section("optim", "AdamW for RL", [
    Key("lr", 1e-6, "learning rate", gt=0.0),
    Key("weight_decay", 0.01, "decoupled weight decay", ge=0.0),
    Key("grad_clip", 1.0, "global-norm clip (0 = off)", ge=0.0),
    Key("warmup_steps", 0, "linear warm-up steps", ge=0),
    Key("schedule", "constant", "after warm-up", choices=("constant", "cosine")),
])  # fmt: skip

TRAIN = Section("train", "the update", [
    Key("mini_batch_rows", 256, "rows per optimizer step", ge=1),
    Key("micro_batch_rows", 32, "rows per accumulation micro-batch (divides mini_batch_rows)", ge=1),
    Key("ppo_epochs", 1, "passes over an iteration's rows", ge=1),
    Key("old_logprobs", "recompute", "recompute: a forward pass before the update (robust to a "
        "lower-precision sampler) | sampler: the rollout's own log-probs (forced tokens scored by its "
        "prefill when trained), one pass fewer",
        choices=("recompute", "sampler")),
    Key("pack_rows", False, "each mini-batch's rows packed end to end in fewer grid rows (block-diagonal "
        "attention, the same log-probs) for the log-prob passes and the update: less padding computed"),
    # A group whose every advantage is 0 gives the policy gradient nothing; its rows would only cost a
    # backward pass for their KL and entropy terms (and dilute the token mean of the others).
    Key("drop_flat_groups", False, "leave task groups whose every row's advantage is 0 out of the update "
        "(the others' token mean then weighs only rows with signal)"),
    # Under GiGPO a group whose episodes all end alike rarely has every advantage 0 (one episode's detour
    # gives its step groups a spread), so drop_flat_groups leaves out nothing there (WebShop: 50% uniform
    # groups, 0 rows dropped) while the update is most of an iteration's time.
    Key("drop_uniform_groups", False, "leave task groups whose episode returns are all equal out of the "
        "update, their step credit included (DAPO's filter_groups): saves their backward passes, loses "
        "the shorter-path signal GiGPO's step groups find in them"),
])  # fmt: skip

WIA = Section("wia", "world-model imagination: the policy predicts what its action will do", [
    Key("mode", "separate", "separate (the paper's) | inline (the public code's) | off",
        choices=("separate", "inline", "off")),
    Key("horizon", 2, "steps predicted ahead", ge=1),
    Key("lam", 1.0, "shaping strength", ge=0.0),
    Key("fraction", 1.0, "share of steps that get a prediction", ge=0.0, le=1.0),
    Key("fill", "group_mean", "R_pre of a step that drew no prediction: its task group's mean, or none (0)",
        choices=("group_mean", "none")),
    Key("max_tokens", 128, "prediction length", ge=1),
    Key("similarity", "rapidfuzz", "string similarity of prediction and outcome (wia.scoring)",
        choices=("rapidfuzz", "difflib")),
    # separate mode only. False (the paper's setting): predictions only score the agent through the WIA
    # multiplier; the action's advantage says nothing about whether a prediction was right, so training on
    # it would teach the world role to echo winning episodes. True (like the public code's inline mode):
    # each prediction is also a training row with the advantage of the action it predicts the outcome of.
    Key("train_predictor", False, "separate mode: predictions also train, with their action's advantage"),
])  # fmt: skip

AIW = Section("aiw", "task sampling steered by analysed failures (retrieval ties break by the seed)", [
    Key("enabled", True, "set by algo: on for aiw and roleagent"),
    Key("analyser", "llm", "llm: the policy analyses its failures (heuristic stands in for bad answers)",
        choices=("llm", "heuristic")),
    Key("retrieval", "fuzzy", "fuzzy: keyword match of the report | llm: the policy picks a candidate",
        choices=("fuzzy", "llm")),
    Key("top_k", 3, "tasks retrieved per failure", ge=1),
    Key("min_sim", 0.0, "retrieved tasks below this similarity are dropped", ge=0.0, le=1.0),
    Key("self_boost", 1.0, "the failed task's own boost (retrieved tasks get their similarity)", ge=0.0),
    Key("aggregate", "max", "how one round's boosts of a task combine", choices=("max", "sum")),
    Key("eta", 1.0, "task-sampler step: logit += eta * boost", ge=0.0),
    Key("decay", 0.9, "task-sampler logits decay per round (old failures fade)", ge=0.0, le=1.0),
    Key("temperature", 1.0, "task-sampler softmax temperature", gt=0.0),
    Key("epsilon", 0.2, "share of uniform sampling mixed in (every task stays reachable)", ge=0.0, le=1.0),
    Key("cap", 0.05, "largest probability of one task (0 = no cap; never below 1 / tasks)", ge=0.0, le=1.0),
    Key("unlearnable_weight", 0.25, "boost weight of a task whose recent rollouts all fail (or all win): its "
        "groups teach nothing", ge=0.0, le=1.0),
    Key("max_tokens", 256, "analyst and chooser answer length", ge=1),
    Key("selection", "aiw", "task sampling: aiw (the failure logits alone) | learnability (times each task's "
        "p(1-p), p its success, Beta-smoothed toward its task type's; unseen tasks count as p = 1/2)",
        choices=("aiw", "learnability")),
    Key("selection_strength", 1.0, "learnability selection: probabilities times (4 p (1-p)) ** strength",
        gt=0.0),
])  # fmt: skip

WARMSTART = Section("warmstart", "supervised warm start on expert trajectories (0 steps = off)", [
    Key("steps", 0, "optimizer steps", ge=0),
    Key("copy_steps", 0, 'steps of "repeat this random sequence" first: teaches a new model to copy',
        ge=0),
    Key("lr", 1e-3, "learning rate", gt=0.0),
    Key("schedule", "cosine", "learning rate over the steps: cosine decay to 0, or constant (a pretrained "
        "model's one epoch)", choices=("cosine", "constant")),
    Key("batch_rows", 32, "rows per step", ge=1),
    Key("checkpoint_every", 250, "steps between warm-start checkpoints (0 = none); a kill resumes there",
        ge=0),
    Key("n_games", 0, "games the expert plays (0 = the whole RL pool)", ge=0),
    Key("own_games", False, "generated splits: the warm start plays games RL never trains on"),
    Key("explore", 0.0, "share of expert steps played off-plan (DAgger-style recovery states)",
        ge=0.0, le=0.9),
    Key("predictor", True, "also teach the predictor role"),
    Key("predictor_fraction", 1.0, "share of expert steps that also give a predictor example",
        ge=0.0, le=1.0),
    Key("long_repeat", 1, "copies of the examples of expert episodes longer than the median one: a rarer "
        "multi-step plan (a second search) gets weight (1 = each example once)", ge=1),
    Key("end_turn", False, "each target ends with the tokenizer's EOS, as a chat model's turn ends: search "
        "QA's answers (no stop string) then end there instead of running to max_response_tokens"),
])  # fmt: skip

EVAL = Section("eval", "evaluation on env.eval_splits", [
    Key("before", True, "evaluate the starting (warm-started) model before RL"),
    Key("every", 5, "iterations between evaluations (0 = before and after RL only)", ge=0),
    Key("temperature", 0.4, "sampling temperature", ge=0.0),
    Key("greedy", False, "greedy decoding instead"),
    Key("limit", 0, "games per split (0 = every game of the split)", ge=0),
    Key("curve_games", 0, "games per split in the evaluations every `every` iterations (0 = as `limit`): the "
        "same first games each time, a learning curve's fixed subset", ge=0),
])  # fmt: skip

CHECKPOINT = Section("checkpoint", "checkpoints in <workdir>/checkpoints", [
    Key("every", 5, "iterations between checkpoints (0 = only the last)", ge=0),
    Key("keep", 3, "checkpoints kept", ge=1),
    Key("resume", True, "continue from the newest readable checkpoint in the workdir"),
    # With resume=False a workdir that holds checkpoints is refused; overwrite=True moves that earlier run
    # aside (to <workdir>.replaced-<time>) and starts afresh.
    Key("overwrite", False, "move an earlier run aside and start afresh (needs resume=False)"),
])  # fmt: skip

LOG = Section("log", "what the run prints and writes", [
    Key("tensorboard", True, "TensorBoard events next to logs/metrics.jsonl"),
    Key("progress", True, "progress bars (False: plain lines, for log files)"),
])  # fmt: skip

CONFIG = Section("", "a run", [
    Key("algo", "roleagent", "grpo | gigpo | wia (GiGPO + WIA) | aiw (GiGPO + AIW) | roleagent (GiGPO + "
        "WIA + AIW)", choices=ALGOS),
    Key("seed", 0, "model init, sampling and task order", ge=0),
    Key("workdir", "runs/default", "checkpoints, logs/metrics.jsonl and report/report.md go here"),
    Key("iterations", 150, "RL iterations after the warm start", ge=0),
    MODEL, LORA, TOKENIZER, MESH, ENV, ROLLOUT, ADVANTAGE, LOSS, OPTIM, TRAIN, WIA, AIW, WARMSTART, EVAL,
    CHECKPOINT, LOG,
])  # fmt: skip
