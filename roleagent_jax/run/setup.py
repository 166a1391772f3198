"""What a run builds before its first RL iteration: task pools, the model and its tokenizer (loaded, or
made: a BPE fitted to the expert's games and a randomly initialised model), the expert's games and the
supervised warm start. The trainer calls these once; none of them holds state of its own.
"""

from __future__ import annotations

from pathlib import Path

import jax
from flax import nnx
from ml_collections import ConfigDict
from tqdm.auto import tqdm

from roleagent_jax.aiw import FailureMemory
from roleagent_jax.backends import make_backend
from roleagent_jax.config import family_options
from roleagent_jax.config.checks import pool_size_errors
from roleagent_jax.envs import EnvPool, Family, TaskPool
from roleagent_jax.envs.episodes import failed_games
from roleagent_jax.evaluation.trained_settings import GEN_SEED_OFFSETS
from roleagent_jax.models import Qwen2ForCausalLM, init_config, load_pretrained, save_pretrained
from roleagent_jax.models.lora import LoRAConfig
from roleagent_jax.models.tokenizer import PromptEncoder, eos_ids, load_tokenizer, train_bpe_tokenizer
from roleagent_jax.parallel import distributed
from roleagent_jax.parallel.sharding import shard_model
from roleagent_jax.rl.logprobs import make_logprob_fn
from roleagent_jax.rl.optimizer import make_optimizer
from roleagent_jax.rl.policy_weights import PolicyWeights
from roleagent_jax.rl.train_step import make_train_step
from roleagent_jax.run.checkpointing import WARMSTART_CHECKPOINTS, Checkpointer
from roleagent_jax.run.warmstart import (
    Example,
    episode_examples,
    expert_episodes,
    longer_than_median,
    repeat_long_episodes,
    run_sft,
    target_ids,
)
from roleagent_jax.sampling import capped_batch_buckets
from roleagent_jax.types import Trajectory

EXPERT_MAX_STEPS = 50  # the expert plays to the end even when RL episodes are cut shorter


def say(config: ConfigDict, text: str) -> None:
    """One progress line for a phase that shows no bar (game generation, expert play, tokenizer,
    evaluation), on process 0 and only with log.progress; written above any running bar."""
    if config.log.progress and distributed.is_main_process():
        tqdm.write(text)


def print_failed(where: str, trajs: list[Trajectory], pool: TaskPool) -> None:
    """Name each game lost to its environment (counted in no rate) and why."""
    for game in failed_games(trajs, pool):
        print(f"{where}: lost to the environment (not counted): {game['task']}: {game['reason']}", flush=True)


def env_pool(config: ConfigDict, family: Family, pool: TaskPool, max_steps: int | None = None) -> EnvPool:
    c = config.env
    return EnvPool(family, pool, num_workers=c.num_workers, step_timeout=c.step_timeout,
                   max_steps=max_steps or c.max_steps)  # fmt: skip


def train_pool(config: ConfigDict, family: Family, workdir: Path) -> TaskPool:
    """The RL pool, refused in config words when an iteration would draw more distinct tasks than it
    holds (`config.checks.pool_size_errors`; a real split's size is known once it is read), before any
    game is played or the warm start runs."""
    pool = make_task_pool(config, family, config.env.train_split, workdir, "train")
    sizes = pool_size_errors(config, family, len(pool))
    if sizes:
        raise ValueError(sizes[0])
    return pool


def make_task_pool(config: ConfigDict, family: Family, split: str, workdir: Path, purpose: str) -> TaskPool:
    """Real data splits come from the family's data folder; its generated splits go into the workdir.
    Both get the family's own settings (search QA's retriever serves its real data sets too).

    Every purpose draws its own games of the same distribution (its own seed offset): evaluation's are
    held out from both training sets, and the warm start's (with warmstart.own_games) are never RL's.
    With several processes, process 0 generates and the others then read the same files.
    """
    options = family_options(config, family)
    if split not in family.generated_splits:
        return family.task_pool(
            split, data_dir=config.env.data_dir or None, options=options, on_corrupt=config.env.on_corrupt
        )
    g = config.env.gen
    n = {"train": g.n_train, "eval": g.n_eval, "warmstart": config.warmstart.n_games}[purpose]
    offset = GEN_SEED_OFFSETS[purpose]
    say(config, f"games: {n} {split} games for {purpose} (made once, then reused)")
    gen_dir = Path(g.dir or workdir / "games") / f"{purpose}_{split}"

    def generate() -> TaskPool:
        return family.task_pool(split, gen_dir=gen_dir, n=n, seed=g.seed + offset, options=options)

    pool = generate() if distributed.is_main_process() else None
    distributed.sync(f"games/{purpose}/{split}")
    return pool if pool is not None else generate()


def eval_pool(
    config: ConfigDict, family: Family, split: str, workdir: Path, train_pool: TaskPool
) -> TaskPool:
    """An evaluation split's tasks: the RL pool itself for a real training split, else the split's own
    (a generated split's are held-out games)."""
    if split == config.env.train_split and split not in family.generated_splits:
        return train_pool
    return make_task_pool(config, family, split, workdir, "eval")


def load_settings(config: ConfigDict) -> dict:
    """How every checkpoint a run reads is built: the config's dtypes, remat and layer scan apply to a
    pretrained model as to a new one."""
    m = config.model
    return dict(dtype=m.dtype, param_dtype=m.param_dtype, remat=m.remat, scan_layers=m.scan_layers)


def load_params(config: ConfigDict, directory: str | Path, mesh) -> nnx.State:
    """The parameters of a saved model (a warm-start export, a LoRA base), sharded over `mesh`."""
    model, _ = load_pretrained(directory, mesh=mesh, **load_settings(config))
    return nnx.state(model, nnx.Param)


class Experts:
    """The expert's games for the warm start and the examples made of them, played once and kept (the
    tokenizer of a new model is fitted to the same examples the warm start then trains on)."""

    def __init__(self, config: ConfigDict, family: Family, train_pool: TaskPool, workdir: Path):
        self.config, self.family, self.train_pool, self.workdir = config, family, train_pool, workdir
        self._trajectories: list[Trajectory] | None = None
        self._examples: list[Example] | None = None

    def pool(self) -> TaskPool:
        """The first `n_games` of the RL pool, or, with `warmstart.own_games` on a generated split, games
        of their own: then RL never trains on a game the model has memorised, and its gains are the
        ones that carry over to unseen games."""
        c = self.config
        if c.warmstart.own_games and c.env.train_split in self.family.generated_splits:
            return make_task_pool(c, self.family, c.env.train_split, self.workdir, "warmstart")
        n = min(c.warmstart.n_games or len(self.train_pool), len(self.train_pool))
        return self.train_pool.subset(list(range(n)))

    def trajectories(self) -> list[Trajectory]:
        if self._trajectories is None:
            pool = self.pool()
            ids = list(range(len(pool)))
            say(self.config, f"expert: playing {len(ids)} games for the warm start's examples")
            with env_pool(self.config, self.family, pool, EXPERT_MAX_STEPS) as envs:
                self._trajectories = expert_episodes(
                    self.family, envs, ids, EXPERT_MAX_STEPS, explore=self.config.warmstart.explore,
                    seed=self.config.seed,
                )  # fmt: skip
        return self._trajectories

    def examples(self) -> list[Example]:
        if self._examples is None:  # built once: the tokenizer of a new model reads them, then the warm start
            c = self.config
            trajs, repeat = self.trajectories(), c.warmstart.long_repeat
            blocks = episode_examples(
                trajs, self.family, c.env.history_k, c.wia.horizon,
                predictor=c.warmstart.predictor, predictor_fraction=c.warmstart.predictor_fraction,
            )  # fmt: skip
            long, median = longer_than_median(trajs)
            self._examples = repeat_long_episodes(blocks, long, repeat)
            if repeat > 1 and distributed.is_main_process():
                n_long = sum(len(b) for b, is_long in zip(blocks, long) if is_long)
                print(
                    f"warm start: {sum(long)} of {sum(t.won for t in trajs)} won expert episodes longer "
                    f"than the median ({median:g} steps), their {n_long} examples x{repeat}: "
                    f"{n_long * repeat} of {len(self._examples)} examples",
                    flush=True,
                )
        return self._examples


def train_tokenizer(config: ConfigDict, experts: Experts, workdir: Path):
    """Fit a byte-level BPE to the text the model will read and write (the expert's games)."""
    texts = []
    for e in experts.examples():
        texts += [e.prompt, e.target]
    size = config.tokenizer.train_vocab_size
    say(config, f"tokenizer: fitting a {size}-token BPE to {len(texts)} texts")
    if distributed.is_main_process():
        train_bpe_tokenizer(texts, size, workdir / "tokenizer")
    distributed.sync("tokenizer")
    return load_tokenizer(workdir / "tokenizer")  # as a resumed run will load it


def build_model(config: ConfigDict, workdir: Path, mesh, resuming: bool, experts: Experts):
    """(model, model config, tokenizer): the pretrained model of `model.path`, the random model a
    resumed run saved in `hf_init`, or a new random model of `model.init` (saved there)."""
    c = config
    init_dir = workdir / "hf_init"
    if c.model.path:
        model, mcfg = load_pretrained(c.model.path, mesh=mesh, **load_settings(c))
        return model, mcfg, load_tokenizer(c.tokenizer.path or c.model.path)
    if resuming and init_dir.is_dir():
        model, mcfg = load_pretrained(init_dir, mesh=mesh, **load_settings(c))
        return model, mcfg, load_tokenizer(init_dir)
    tok = load_tokenizer(c.tokenizer.path) if c.tokenizer.path else train_tokenizer(c, experts, workdir)
    mcfg = init_config(c.model.init.to_dict(), len(tok), tok.eos_token_id, **load_settings(c))
    model = shard_model(Qwen2ForCausalLM(mcfg, rngs=nnx.Rngs(c.seed)), mesh)
    save_pretrained(model, init_dir, tokenizer=tok)  # every process takes part; process 0 writes
    return model, mcfg, tok


def policy_weights(config: ConfigDict, workdir: Path, mesh, resuming: bool, experts: Experts):
    """The run's model split into the trained weights (full, or LoRA adapters on a frozen base) and
    their params; with them the model's config and the tokenizer. No reference to the model is kept:
    its arrays live on as the train state (or the LoRA base)."""
    c = config
    model, model_config, tokenizer = build_model(c, workdir, mesh, resuming, experts)
    start_dir = str(Path(c.model.path or workdir / "hf_init").absolute())
    weights, params = PolicyWeights.split(
        model, LoRAConfig(**c.lora.to_dict()), c.seed, mesh, base_dir=start_dir
    )
    return weights, params, model_config, tokenizer


def plain_token_ids(tokenizer) -> list[int]:
    """Every token id of the tokenizer that is not a special token (what copy batches draw from)."""
    special = set(tokenizer.all_special_ids)
    return [i for i in range(len(tokenizer)) if i not in special]


def warm_start(config: ConfigDict, graphdef, params, examples: list[Example], tokenizer, workdir: Path):
    """Supervised warm start of the whole model on the expert's examples; resumes from its own
    checkpoints. Returns (params, ~50 of the losses for the report, always ending on the last)."""
    c = config
    every = c.warmstart.checkpoint_every
    ckpt = Checkpointer(workdir / WARMSTART_CHECKPOINTS, keep=2) if every else None
    params, losses = run_sft(
        graphdef,
        params,
        examples,
        PromptEncoder(tokenizer),
        lambda text: target_ids(tokenizer, text, c.warmstart.end_turn),
        tokenizer.pad_token_id,
        steps=c.warmstart.steps,
        batch_rows=c.warmstart.batch_rows,
        lr=c.warmstart.lr,
        schedule=c.warmstart.schedule,
        seed=c.seed,
        progress=lambda it: tqdm(it, desc="warm start (SFT)", disable=not c.log.progress),
        checkpoint=ckpt,
        checkpoint_every=every,
        predictor_target_tokens=c.wia.max_tokens,
        copy_steps=c.warmstart.copy_steps,
        copy_tokens=plain_token_ids(tokenizer) if c.warmstart.copy_steps else (),
    )
    if ckpt is not None:
        ckpt.close()
    stride = max(1, len(losses) // 50)
    kept = list(losses[::stride]) + ([losses[-1]] if (len(losses) - 1) % stride else [])
    print(f"warm start: {len(examples)} examples, loss {losses[0]:.3f} -> {losses[-1]:.3f}", flush=True)
    return params, kept


def make_optimizer_for(config: ConfigDict):
    """RL's optimizer from the `optim` section; the cosine schedule spans an upper bound of the run's
    optimizer steps (every episode at full length)."""
    c, o = config, config.optim
    rows = c.rollout.tasks_per_iter * c.rollout.group_size * c.env.max_steps
    total = max(1, c.iterations * c.train.ppo_epochs * -(-rows // c.train.mini_batch_rows))
    return make_optimizer(o.lr, weight_decay=o.weight_decay, grad_clip=o.grad_clip,
                          warmup_steps=o.warmup_steps, schedule=o.schedule, total_steps=total)  # fmt: skip


def update_programs(config: ConfigDict, weights: PolicyWeights, model_config, tokenizer, mesh):
    """The run's jitted programs: the rollout backend (its sampler), the log-prob pass of the old policy
    and the KL reference (the full model's forward pass, as the update computes it), the optimizer and
    the train step. Returns them in that order."""
    c = config
    micro = c.train.mini_batch_rows // c.train.micro_batch_rows
    backend = make_backend(
        c.rollout.backend, weights.base_graphdef, model_config, tokenizer, mesh,
        eos_ids=eos_ids(tokenizer), batch_buckets=capped_batch_buckets(c.rollout.max_rows_per_call),
    )  # fmt: skip
    logprob_fn = make_logprob_fn(weights.base_graphdef, mesh=mesh, micro_batches=micro)
    optimizer = make_optimizer_for(c)
    train_step = make_train_step(weights.graphdef, optimizer, c.loss, mesh=mesh,
                                 micro_batches=micro, remat=c.model.remat)  # fmt: skip
    return backend, logprob_fn, optimizer, train_step


def failure_memory(workdir: Path, resuming: bool) -> FailureMemory:
    """AIW's failure memory file. Every process computes the same AIW state from the same trajectories;
    each keeps its own file. A new run drops the records of an earlier one that never checkpointed."""
    rank = jax.process_index()
    memory = FailureMemory(
        workdir / ("failure_memory.jsonl" if rank == 0 else f"failure_memory.p{rank}.jsonl")
    )
    if not resuming and len(memory):
        memory.path.unlink()
        memory = FailureMemory(memory.path)
    return memory
