"""The Role-Agent training loop: rollouts, WIA shaping, GiGPO advantages, PPO updates, AIW re-weighting.

Device work (generation, log-probs, updates) is jitted and sharded; this file is the thin host-side
orchestration between those calls, plus checkpoints, evaluation and logging. One iteration:

    tasks ~ AIW task sampler -> rollouts (agent + predictor prompts share each sampler call)
    -> WIA scores -> GiGPO advantages with return multipliers -> PPO mini-batch updates
    -> failure analysis -> memory + retrieval -> new task-sampling logits
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections import defaultdict
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from ml_collections import ConfigDict
from tqdm.auto import tqdm

from roleagent_jax import aiw, distributed
from roleagent_jax.advantages import gigpo_advantages, similar_anchor_hashes
from roleagent_jax.checkpointing import WARMSTART_CHECKPOINTS, Checkpointer, claim_workdir, write_json
from roleagent_jax.config import apply_algo, family_options, validate
from roleagent_jax.envs import EnvPool, Family, TaskPool, get_family
from roleagent_jax.episodes import failed_games, success_summary
from roleagent_jax.metrics import MetricLogger
from roleagent_jax.models import Qwen2Config, Qwen2ForCausalLM, load_pretrained, save_pretrained
from roleagent_jax.models.lora import LoRAConfig, LoRAParam, add_lora, merge_fn
from roleagent_jax.models.peft_io import save_adapter
from roleagent_jax.policy import write_prompt_settings
from roleagent_jax.rollout import RolloutResult, RolloutSettings, collect, wia_multipliers
from roleagent_jax.sampling import Sampler, SamplingParams, capped_batch_buckets
from roleagent_jax.sharding import make_mesh, shard_model
from roleagent_jax.tokenizer import chat_prompt, eos_ids, load_tokenizer, train_bpe_tokenizer
from roleagent_jax.train_step import (
    MODEL_KEYS,
    TrainState,
    make_logprob_fn,
    make_optimizer,
    make_train_step,
    pack_rows,
)
from roleagent_jax.warmstart import examples_from_episodes, expert_episodes, run_sft, target_ids

EXPERT_MAX_STEPS = 50


def _print_failed(where: str, trajs, pool) -> None:
    """Name each game whose environment failed (it counts as a loss) and why."""
    for game in failed_games(trajs, pool):
        print(
            f"{where}: environment failed (counted as a loss): {game['task']}: {game['reason']}", flush=True
        )


def say(config: ConfigDict, text: str) -> None:
    """One progress line for a phase that shows no bar (game generation, expert play, tokenizer,
    evaluation), on process 0 and only with log.progress; written above any running bar."""
    if config.log.progress and distributed.is_main_process():
        tqdm.write(text)


def make_task_pool(config: ConfigDict, family: Family, split: str, workdir: Path, purpose: str) -> TaskPool:
    """Real data splits come from the family's data folder; its generated splits go into the workdir.
    Both get the family's own settings (search QA's retriever serves its real data sets too).

    With several processes, process 0 generates and the others then read the same files.
    """
    if split not in family.generated_splits:
        return family.task_pool(
            split,
            data_dir=config.env.data_dir or None,
            options=family_options(config, family),
            on_corrupt=config.env.on_corrupt,
        )
    g = config.env.gen
    # Every purpose draws its own games of the same distribution (its own seed offset): evaluation's are
    # held out from both training sets, and the warm start's (with warmstart.own_games) are never RL's.
    n, offset = {
        "train": (g.n_train, 0),
        "eval": (g.n_eval, 1000),
        "warmstart": (config.warmstart.n_games, 2000),
    }[purpose]
    seed = g.seed + offset
    say(config, f"games: {n} {split} games for {purpose} (made once, then reused)")

    def generate() -> TaskPool:
        return family.task_pool(
            split,
            gen_dir=Path(g.dir or workdir / "games") / f"{purpose}_{split}",
            n=n,
            seed=seed,
            options=family_options(config, family),
        )

    pool = generate() if distributed.is_main_process() else None
    distributed.sync(f"games/{purpose}/{split}")
    return pool if pool is not None else generate()


def with_predictor_rows(rows: list, adv: np.ndarray, samples) -> tuple[list, np.ndarray]:
    """The predictor's answers as training rows, each with the advantage of the action it predicts the
    outcome of (``wia.train_predictor``): the world role learns from the same signal as the agent."""
    at = {(r.traj_id, r.step_index): i for i, r in enumerate(rows)}
    extra, extra_adv = [], []
    for traj_id, step, prompt_ids, res in samples:
        i = at[(traj_id, step)]
        extra.append(
            dataclasses.replace(
                rows[i], prompt_ids=prompt_ids, response_ids=list(res.token_ids), logprobs=list(res.logprobs)
            )
        )
        extra_adv.append(adv[i])
    return rows + extra, np.concatenate([adv, np.asarray(extra_adv, adv.dtype)])


class Trainer:
    """Owns the model, environments, optimizer state and AIW state of one run in `config.workdir`."""

    def __init__(self, config: ConfigDict):
        distributed.initialize()
        self.config = apply_algo(validate(config))
        c = self.config
        family = get_family(c.env.name)
        self.family = family.configured(family_options(c, family))  # its protocol, prompt and rules
        self.workdir = Path(c.workdir).absolute()
        claim_workdir(self.workdir, c.checkpoint.resume, c.checkpoint.overwrite)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.is_main = jax.process_index() == 0
        self.mesh = make_mesh(c.mesh.data, c.mesh.fsdp, c.mesh.tensor)
        self.settings = RolloutSettings(
            max_steps=c.env.max_steps,
            history_k=c.env.history_k,
            max_prompt_tokens=c.rollout.max_prompt_tokens,
            max_response_tokens=c.rollout.max_response_tokens,
            wia_mode=c.wia.mode,
            wia_horizon=c.wia.horizon,
            wia_fraction=c.wia.fraction,
            wia_max_tokens=c.wia.max_tokens,
        )
        self.train_pool = make_task_pool(c, self.family, c.env.train_split, self.workdir, "train")
        self.envs = self._env_pool(self.train_pool)
        self.ckpt = Checkpointer(self.workdir / "checkpoints", keep=c.checkpoint.keep)
        resuming = c.checkpoint.resume and self.ckpt.latest_step() is not None
        # No reference to the model is kept: its arrays live on as the state (or base) below only.
        model, self.model_config, self.tokenizer = self._build_model(resuming)
        self.base_graphdef = nnx.graphdef(model)  # the model without adapters (warm start, export)
        self.lora = LoRAConfig(**c.lora.to_dict())
        self.base = None  # with LoRA: the frozen base, a train-step input that is never updated
        if self.lora.rank:
            adapter_key = jax.random.fold_in(jax.random.PRNGKey(c.seed), 1)  # not the base init's stream
            shard_model(add_lora(model, self.lora, nnx.Rngs(adapter_key)), self.mesh)
            self.graphdef, params, self.base = nnx.split(model, LoRAParam, ...)
        else:
            self.graphdef, params = nnx.split(model)
        del model
        self.pad_id = self.tokenizer.pad_token_id
        self._merge = merge_fn(self.graphdef) if self.base is not None else None
        self._sampling_copy = None  # with LoRA: (step, id of the base, merged params) of the policy
        self.sampler = Sampler(
            self.base_graphdef,
            self.model_config,
            self.tokenizer,
            self.mesh,
            eos_ids=eos_ids(self.tokenizer),
            batch_buckets=capped_batch_buckets(c.rollout.max_rows_per_call),
        )
        self.optimizer = make_optimizer(
            c.optim.lr,
            weight_decay=c.optim.weight_decay,
            grad_clip=c.optim.grad_clip,
            warmup_steps=c.optim.warmup_steps,
            schedule=c.optim.schedule,
            total_steps=self._optimizer_steps(),
        )
        micro = c.train.mini_batch_rows // c.train.micro_batch_rows
        self.train_step = make_train_step(
            self.graphdef, self.optimizer, c.loss, mesh=self.mesh, micro_batches=micro, remat=c.model.remat
        )
        self.logprob_fn = make_logprob_fn(self.graphdef, mesh=self.mesh, micro_batches=micro)
        self.state = TrainState.create(params, self.optimizer, jax.random.PRNGKey(c.seed), mesh=self.mesh)
        self.ref_params = None
        if c.loss.kl_type != "none" and c.loss.kl_coef > 0:
            # With LoRA the reference is the base itself: adapters at zero, no second copy of the base.
            self.ref_params = (
                params
                if self.base is None
                else jax.tree.map(lambda x: jnp.zeros_like(x, device=x.sharding), params)
            )
        n_tasks = len(self.train_pool)
        self.task_sampler = aiw.TaskSampler(
            n_tasks,
            eta=c.aiw.eta,
            decay=c.aiw.decay,
            temperature=c.aiw.temperature,
            epsilon=c.aiw.epsilon,
            cap=max(c.aiw.cap, 1.0 / n_tasks) if c.aiw.cap else None,
            seed=c.seed,
        )
        # Every process computes the same AIW state from the same trajectories; each keeps its own file.
        name = "failure_memory.jsonl" if self.is_main else f"failure_memory.p{jax.process_index()}.jsonl"
        memory = aiw.FailureMemory(self.workdir / name)
        if not resuming and len(memory):  # records of an earlier run that never checkpointed
            memory.path.unlink()
            memory = aiw.FailureMemory(memory.path)
        self.aiw_state = aiw.AIWState(self.task_sampler, memory)
        self.host = {"iteration": 0, "warm_started": False, "eval": {}, "sft_losses": [], "sampled_tasks": []}
        if self.base is not None:  # the checkpoint names the base its adapters belong to
            self.host["lora_base"] = str(
                Path(c.model.path).absolute() if c.model.path else self.workdir / "hf_init"
            )
        history = None
        if resuming:
            start_base = self.host.get("lora_base")
            history = self._restore()
            warm_dir = self.workdir / "hf_warmstart"
            if self.base is not None and self.host["lora_base"] != start_base:
                self.base = self._load_base(Path(self.host["lora_base"]))
            elif self.ref_params is not None and self.host["warm_started"] and warm_dir.is_dir():
                self.ref_params = nnx.split(
                    load_pretrained(warm_dir, mesh=self.mesh, **self._load_settings())[0]
                )[1]
        self.logger = MetricLogger(
            self.workdir / "logs",
            tensorboard=c.log.tensorboard and self.is_main,
            history=history,
            write=self.is_main,
        )
        self.logger.resume_at(int(self.host["iteration"]))

    # ------------------------------------------------------------------ set-up

    def _load_settings(self) -> dict:
        """How every checkpoint this run reads is built: the config's dtypes, remat and layer scan
        apply to a pretrained model as to a new one."""
        m = self.config.model
        return dict(dtype=m.dtype, param_dtype=m.param_dtype, remat=m.remat, scan_layers=m.scan_layers)

    def _load_base(self, directory: Path):
        model, _ = load_pretrained(directory, mesh=self.mesh, **self._load_settings())
        return nnx.state(model, nnx.Param)

    def policy_params(self):
        """What the sampler runs: the full params, or with LoRA a copy of the base with the adapters
        merged into its kernels, made once per policy (it decodes faster than applying the adapters
        in every projection: docs/scaling.md) and dropped before each update."""
        if self.base is None:
            return self.state.params
        step = int(self.state.step)
        if self._sampling_copy is None or self._sampling_copy[:2] != (step, id(self.base)):
            self._sampling_copy = None  # free the old copy before making the new one
            self._sampling_copy = (step, id(self.base), self._merge(self.state.params, self.base))
        return self._sampling_copy[2]

    def policy_model(self) -> Qwen2ForCausalLM:
        """The current policy as a model (with its adapters when LoRA trains)."""
        if self.base is None:
            return nnx.merge(self.graphdef, self.state.params)
        return nnx.merge(self.graphdef, self.state.params, self.base)

    def _env_pool(self, pool: TaskPool, max_steps: int | None = None) -> EnvPool:
        c = self.config.env
        return EnvPool(self.family, pool, num_workers=c.num_workers, step_timeout=c.step_timeout,
                       max_steps=max_steps or c.max_steps)  # fmt: skip

    def _optimizer_steps(self) -> int:
        """Upper bound of optimizer steps in the run (for the cosine schedule): full-length episodes."""
        c = self.config
        rows = c.rollout.tasks_per_iter * c.rollout.group_size * c.env.max_steps
        return max(1, c.iterations * c.train.ppo_epochs * -(-rows // c.train.mini_batch_rows))

    def _build_model(self, resuming: bool):
        c = self.config
        init_dir = self.workdir / "hf_init"
        if c.model.path:
            model, mcfg = load_pretrained(c.model.path, mesh=self.mesh, **self._load_settings())
            tok = load_tokenizer(c.tokenizer.path or c.model.path)
            return model, mcfg, tok
        if resuming and init_dir.is_dir():
            model, mcfg = load_pretrained(init_dir, mesh=self.mesh, **self._load_settings())
            return model, mcfg, load_tokenizer(init_dir)
        tok = load_tokenizer(c.tokenizer.path) if c.tokenizer.path else self._train_tokenizer()
        mcfg = Qwen2Config.from_hf(
            dict(
                c.model.init.to_dict(),
                vocab_size=len(tok),
                model_type="qwen2",
                architectures=["Qwen2ForCausalLM"],
                eos_token_id=tok.eos_token_id,
            ),
            param_dtype=c.model.param_dtype,
            dtype=c.model.dtype,
            remat=c.model.remat,
            scan_layers=c.model.scan_layers,
        )
        model = shard_model(Qwen2ForCausalLM(mcfg, rngs=nnx.Rngs(c.seed)), self.mesh)
        save_pretrained(model, init_dir, tokenizer=tok)  # every process takes part; process 0 writes
        return model, mcfg, tok

    def _warmstart_pool(self) -> TaskPool:
        """The games the expert plays for the warm start: the first `n_games` of the RL pool, or, with
        `warmstart.own_games` on a generated split, games of their own. Then RL never trains on a game
        the model has memorised, and its gains are the ones that carry over to unseen games."""
        c = self.config
        if c.warmstart.own_games and c.env.train_split in self.family.generated_splits:
            return make_task_pool(c, self.family, c.env.train_split, self.workdir, "warmstart")
        n = min(c.warmstart.n_games or len(self.train_pool), len(self.train_pool))
        return self.train_pool.subset(list(range(n)))

    def _expert_trajectories(self):
        if not hasattr(self, "_experts"):
            pool = self._warmstart_pool()
            ids = list(range(len(pool)))
            say(self.config, f"expert: playing {len(ids)} games for the warm start's examples")
            # The expert plays to the end even when RL episodes are cut shorter.
            with self._env_pool(pool, EXPERT_MAX_STEPS) as envs:
                self._experts = expert_episodes(
                    self.family, envs, ids, EXPERT_MAX_STEPS, explore=self.config.warmstart.explore,
                    seed=self.config.seed,
                )  # fmt: skip
        return self._experts

    def _examples(self):
        c = self.config
        return examples_from_episodes(
            self._expert_trajectories(),
            self.family,
            c.env.history_k,
            c.wia.horizon,
            predictor=c.warmstart.predictor,
            predictor_fraction=c.warmstart.predictor_fraction,
        )

    def _train_tokenizer(self):
        """Fit a byte-level BPE to the text the model will read and write (expert-played games)."""
        texts = []
        for e in self._examples():
            texts += [e.prompt, e.target]
        say(
            self.config,
            f"tokenizer: fitting a {self.config.tokenizer.train_vocab_size}-token BPE to {len(texts)} texts",
        )
        if self.is_main:
            train_bpe_tokenizer(texts, self.config.tokenizer.train_vocab_size, self.workdir / "tokenizer")
        distributed.sync("tokenizer")
        return load_tokenizer(self.workdir / "tokenizer")  # as a resumed run will load it

    def encode_prompt(self, text: str) -> list[int]:
        return self.tokenizer.encode(chat_prompt(self.tokenizer, text), add_special_tokens=False)

    def encode_target(self, text: str) -> list[int]:
        return target_ids(self.tokenizer, text, self.config.warmstart.end_turn)

    # ------------------------------------------------------------------ checkpoints

    def _apply_sampler_settings(self) -> None:
        """The command line's task-sampler settings win over a checkpoint's (its logits and random state
        are kept): a resumed run can change eta, decay, temperature, epsilon or cap."""
        c, ts = self.config.aiw, self.task_sampler
        cap = max(c.cap, 1.0 / ts.n_tasks) if c.cap else None
        changed = [
            f"{k} {old} -> {new}"
            for k, old, new in (("eta", ts.eta, c.eta), ("decay", ts.decay, c.decay),
                                ("temperature", ts.temperature, c.temperature),
                                ("epsilon", ts.epsilon, c.epsilon), ("cap", ts.cap, cap))
            if old != new
        ]  # fmt: skip
        ts.eta, ts.decay, ts.temperature, ts.epsilon, ts.cap = c.eta, c.decay, c.temperature, c.epsilon, cap
        if changed and self.is_main:
            print("task sampler settings from the command line: " + ", ".join(changed), flush=True)

    def _host_state(self) -> dict:
        return dict(
            self.host,
            aiw=self.aiw_state.state_dict(),
            history=self.logger.history,
        )

    def save(self, replace: bool = False) -> None:
        self.ckpt.save(int(self.host["iteration"]), self.state, self._host_state(), replace=replace)

    def _restore(self) -> list[dict]:
        state, host = self.ckpt.restore(self.state)
        self.state = state
        self.aiw_state.load_state_dict(host.pop("aiw"))
        self._apply_sampler_settings()
        history = host.pop("history")
        self.host.update(host)
        print(f"resumed from {self.ckpt.directory} at iteration {self.host['iteration']}", flush=True)
        return history

    # ------------------------------------------------------------------ generation

    def generate_fn(self, params, sampling: SamplingParams, key):
        """One batched sampler call per invocation, each with its own fold of `key`."""
        calls = [0]

        def generate(requests):
            calls[0] += 1
            return self.sampler.generate(params, requests, sampling, jax.random.fold_in(key, calls[0]))

        return generate

    def evaluate(self, split: str, params=None, limit: int = 0) -> dict:
        """Every game of `split` once (fixed panel), sampled at the eval temperature."""
        c = self.config
        params = self.policy_params() if params is None else params
        generated = split in self.family.generated_splits
        pool = self.train_pool if split == c.env.train_split and not generated else None
        pool = pool or make_task_pool(c, self.family, split, self.workdir, "eval")
        ids = list(range(len(pool)))[: limit or None]
        say(c, f"evaluation: playing {len(ids)} {split} games")
        with self._env_pool(pool) as envs:
            sampling = SamplingParams(temperature=c.eval.temperature, greedy=c.eval.greedy)
            gen = self.generate_fn(params, sampling, jax.random.PRNGKey(c.seed + 17))
            settings = dataclasses.replace(self.settings, wia_mode="off")
            result = self._collect(gen, envs, ids, ids, settings, 0)
        _print_failed(f"evaluation on {split}", result.trajectories, pool)
        counts = self.host.setdefault("eval_counts", {})  # games per task type: the report's standard errors
        counts[split] = {
            k: sum(t.task_type == k for t in result.trajectories) for k in self.family.task_types
        }
        counts[split]["all"] = len(result.trajectories)
        return success_summary(result.trajectories, self.family.task_types)

    def _collect(self, generate, envs, task_ids: list[int], group_ids: list[int], settings, it: int):
        """Rollouts of all slots; with several processes each plays its share and the results are merged."""
        multi = jax.process_count() > 1
        share = distributed.process_share(len(task_ids))
        local = collect(
            generate, self.family, envs, task_ids[share.start : share.stop], group_ids[share.start : share.stop],
            self.tokenizer, settings, seed=self.config.seed, iteration=it, slot_offset=share.start,
            gather=distributed.allgather_objects if multi else None, rank=jax.process_index(),
        )  # fmt: skip
        if not multi:
            return local
        parts = distributed.allgather_objects(local)
        merged = RolloutResult([], [], {}, {})
        for part in parts:
            merged.trajectories += part.trajectories
            merged.rows += part.rows
            merged.predictions.update(part.predictions)
            merged.predictor_samples += part.predictor_samples
            for k, v in part.stats.items():  # counts add up; times overlap, so the slowest process counts
                merged.stats[k] = (
                    max(merged.stats.get(k, 0), v) if k.startswith("time") else merged.stats.get(k, 0) + v
                )
        return merged

    # ------------------------------------------------------------------ phases

    def _plain_token_ids(self) -> list[int]:
        """Every token id of the tokenizer that is not a special token (what copy batches draw from)."""
        special = set(self.tokenizer.all_special_ids)
        return [i for i in range(len(self.tokenizer)) if i not in special]

    def warm_start(self) -> None:
        """Supervised warm start of the whole model. With LoRA it makes the base (full weights, before
        any adapter trains): the adapters then learn RL on top of it, and it is the KL reference."""
        c = self.config
        if self.host["warm_started"] or c.warmstart.steps == 0:
            return
        examples = self._examples()
        every = c.warmstart.checkpoint_every
        ckpt = Checkpointer(self.workdir / WARMSTART_CHECKPOINTS, keep=2) if every else None
        lora = self.base is not None
        params, losses = run_sft(
            self.base_graphdef if lora else self.graphdef,
            self.base if lora else self.state.params,
            examples,
            self.encode_prompt,
            self.encode_target,
            self.pad_id,
            steps=c.warmstart.steps,
            batch_rows=c.warmstart.batch_rows,
            lr=c.warmstart.lr,
            seed=c.seed,
            progress=lambda it: tqdm(it, desc="warm start (SFT)", disable=not c.log.progress),
            checkpoint=ckpt,
            checkpoint_every=every,
            predictor_target_tokens=c.wia.max_tokens,
            copy_steps=c.warmstart.copy_steps,
            copy_tokens=self._plain_token_ids() if c.warmstart.copy_steps else (),
        )
        if ckpt is not None:
            ckpt.close()
        if lora:  # fresh adapters on the new base; the reference (adapters at zero) follows the base
            self.base = params
            self.host["lora_base"] = str(self.workdir / "hf_warmstart")
        else:
            self.state = TrainState.create(params, self.optimizer, self.state.rng, mesh=self.mesh)
            if self.ref_params is not None:
                self.ref_params = params
        save_pretrained(  # the KL reference (with LoRA: the base) of a resumed run
            nnx.merge(self.base_graphdef if lora else self.graphdef, params),
            self.workdir / "hf_warmstart",
            tokenizer=self.tokenizer,
        )
        self._write_prompt_settings(self.workdir / "hf_warmstart")
        stride = max(1, len(losses) // 50)  # ~50 points for the report, always ending on the last loss
        kept = list(losses[::stride]) + ([losses[-1]] if (len(losses) - 1) % stride else [])
        self.host.update(warm_started=True, sft_losses=kept)
        print(f"warm start: {len(examples)} examples, loss {losses[0]:.3f} -> {losses[-1]:.3f}", flush=True)

    def iteration(self, it: int) -> dict:
        c = self.config
        t0 = time.perf_counter()
        B, G = c.rollout.tasks_per_iter, c.rollout.group_size
        tasks = self.task_sampler.sample(B)
        self.host["sampled_tasks"].append(tasks.tolist())
        task_ids = np.repeat(tasks, G)
        group_ids = np.repeat(np.arange(B), G)
        key = jax.random.fold_in(self.state.rng, it)
        sampling = SamplingParams(
            temperature=c.rollout.temperature, top_p=c.rollout.top_p, top_k=c.rollout.top_k
        )
        result = self._collect(
            self.generate_fn(self.policy_params(), sampling, key),
            self.envs,
            task_ids.tolist(),
            group_ids.tolist(),
            self.settings,
            it,
        )
        t_rollout = time.perf_counter() - t0
        _print_failed(f"iteration {it}", result.trajectories, self.train_pool)
        metrics: dict[str, float] = {}
        rows = result.rows
        multiplier = None
        t1 = time.perf_counter()
        if c.wia.mode != "off" and rows:
            multiplier, wia_metrics = wia_multipliers(result, c.wia.lam, c.wia.backend)
            metrics.update(wia_metrics)
        t_wia = time.perf_counter() - t1
        t1 = time.perf_counter()
        adv = np.asarray(
            gigpo_advantages(
                np.array([r.reward for r in rows], np.float32),
                np.array([r.traj_id for r in rows]),
                np.array([r.group_id for r in rows]),
                np.array([r.step_index for r in rows]),
                self._anchor_hashes(rows),
                np.array([r.valid for r in rows]),
                gamma=c.advantage.gamma,
                omega=c.advantage.omega,
                mode=c.advantage.mode,
                invalid_penalty=c.advantage.invalid_penalty,
                step_level=c.advantage.step_level,
                return_multiplier=multiplier,
                credit_invalid=c.advantage.credit_invalid,
                negative_scale=c.advantage.negative_scale,
                std_floor=c.advantage.std_floor,
            )
        )
        t_adv = time.perf_counter() - t1
        if c.wia.train_predictor and result.predictor_samples:
            rows, adv = with_predictor_rows(rows, adv, result.predictor_samples)
            metrics["train/predictor_rows"] = float(len(result.predictor_samples))
        t1 = time.perf_counter()
        update_metrics = self._update(rows, adv, it)
        t_update = time.perf_counter() - t1
        t1 = time.perf_counter()
        if c.aiw.enabled:
            metrics.update(self._aiw(result.trajectories, it))
        t_aiw = time.perf_counter() - t1

        succ = success_summary(result.trajectories, self.family.task_types)
        metrics.update({f"train/success/{k}": v for k, v in succ.items()})
        metrics.update(update_metrics)
        episode_len = [len(t.steps) for t in result.trajectories]
        metrics.update(
            {
                "train/return": float(np.mean([t.total_reward for t in result.trajectories])),
                "train/episode_len": float(np.mean(episode_len)),
                "train/valid_rate": float(np.mean([r.valid for r in result.rows])) if result.rows else 0.0,
                "train/rows": len(rows),
                "train/adv_abs": float(np.abs(adv).mean()) if len(adv) else 0.0,
                "train/env_failed": float(np.sum([t.env_failed for t in result.trajectories])),
                "rollout/sampler_calls": result.stats["sampler_calls"],
                "rollout/tokens_per_s": result.stats["generated_tokens"]
                / max(result.stats["time_generate"], 1e-9),
                "rollout/prompts_truncated": result.stats["prompts_truncated"],
                "time/rollout": t_rollout,
                "time/generate": result.stats["time_generate"],
                "time/env": result.stats["time_env"],
                "time/wia": t_wia,
                "time/advantages": t_adv,
                "time/update": t_update,
                "time/aiw": t_aiw,
                "time/iteration": time.perf_counter() - t0,
            }
        )
        if not c.aiw.enabled:  # the AIW round reports the shares itself; without it they stay uniform
            types, index = np.unique(self.train_pool.task_types, return_inverse=True)
            shares = np.bincount(index, weights=self.task_sampler.probs(), minlength=len(types))
            metrics.update({f"aiw/share/{t}": float(p) for t, p in zip(types, shares, strict=True)})
        return metrics

    def _aiw(self, trajs, it: int) -> dict:
        """The policy analyses its failures (``aiw.analyser=llm``) and chooses among the retrieval's
        candidates (``aiw.retrieval=llm``), each role in one batched call of the rollout's sampler."""
        c = self.config
        failed = [t for t in trajs if not t.won]
        gen = self.generate_fn(
            self.policy_params(),
            SamplingParams(temperature=0.4),
            jax.random.fold_in(self.state.rng, 10_000 + it),
        )
        texts = None
        if c.aiw.analyser == "llm" and failed:
            requests = [
                aiw.analysis_request(t, self.family, self.encode_prompt, c.aiw.max_tokens) for t in failed
            ]
            texts = [r.text for r in gen(requests)]

        def choose(prompts: list[str]) -> list[str]:
            requests = [aiw.choice_request(p, self.encode_prompt, c.aiw.max_tokens) for p in prompts]
            return [r.text for r in gen(requests)]

        reports = aiw.analyse_failures(failed, self.family, texts, max_steps=c.env.max_steps)
        metrics = aiw.aiw_round(
            self.aiw_state, failed, reports, self.train_pool, self.family, c.aiw, it, seed=c.seed, played=trajs,
            choose_fn=choose if c.aiw.retrieval == "llm" else None,
        )  # fmt: skip
        if self.is_main:  # failure-type histogram and most boosted tasks of this round
            tqdm.write(f"[iter {it + 1}] " + aiw.format_round(metrics, self.aiw_state.history[-1]))
        return metrics

    def _anchor_hashes(self, rows) -> np.ndarray:
        """GiGPO's step-group keys: exact anchors, or near-identical ones merged within a task group when
        `advantage.anchor_similarity` < 1."""
        threshold = self.config.advantage.anchor_similarity
        if threshold >= 1.0:
            return np.array([r.anchor_hash for r in rows], np.uint64)
        return similar_anchor_hashes([r.anchor for r in rows], [r.group_id for r in rows], threshold)

    def _update(self, rows, adv: np.ndarray, it: int) -> dict:
        """PPO epochs over shuffled fixed-size mini-batches (zero-weight padding rows, one compile).

        Old-policy (and reference) log-probs are fixed for every row before the first update, so the
        ratio of later mini-batches measures how far the policy has moved in this iteration. With
        ``train.old_logprobs='sampler'`` the old ones are the sampler's own (log_softmax of the raw
        logits, the same quantity as the recomputed ones; the rollout cut prompts to the same limit), which
        saves one forward pass over the batch.
        """
        c = self.config
        self._sampling_copy = None  # the update needs the memory more than the sampler's copy
        if not rows:
            return {}
        from_sampler = c.train.old_logprobs == "sampler"
        packed = pack_rows(
            [r.prompt_ids for r in rows],
            [r.response_ids for r in rows],
            self.pad_id,
            max_prompt=c.rollout.max_prompt_tokens,
            max_response=max(c.rollout.max_response_tokens, c.wia.max_tokens * c.wia.train_predictor),
            response_logprobs=[r.logprobs for r in rows] if from_sampler else None,
        )
        n, mb = len(rows), c.train.mini_batch_rows
        padded = -(-n // mb) * mb
        fill = np.concatenate([np.arange(n), np.zeros(padded - n, np.int64)])
        packed = {k: v[fill] for k, v in packed.items()}
        packed["loss_mask"][n:] = 0  # padding rows repeat row 0 but weigh nothing
        packed["advantages"] = adv[fill].astype(np.float32)
        model_keys = (*MODEL_KEYS, "loss_mask")

        def logprobs(params) -> np.ndarray:
            chunks = []
            for start in range(0, padded, mb):
                chunk = {k: jnp.asarray(packed[k][start : start + mb]) for k in model_keys}
                chunks.append(distributed.fetch(self.logprob_fn(params, chunk, self.base)))
            return np.concatenate(chunks)

        packed["old_logprobs"] = (
            packed.pop("sampler_logprobs") if from_sampler else logprobs(self.state.params)
        )
        packed["ref_logprobs"] = (
            logprobs(self.ref_params) if self.ref_params is not None else packed["old_logprobs"]
        )
        rng = np.random.default_rng([c.seed, it])
        sums: dict[str, list[float]] = defaultdict(list)
        for _ in range(c.train.ppo_epochs):
            order = np.concatenate([rng.permutation(n), np.arange(n, padded)])
            for start in range(0, padded, mb):
                idx = order[start : start + mb]
                batch = {k: jnp.asarray(v[idx]) for k, v in packed.items()}
                self.state, m = self.train_step(self.state, batch, self.base)
                for k, v in m.items():
                    sums[f"update/{k}"].append(float(v))
        return {k: float(np.mean(v)) for k, v in sums.items()}

    # ------------------------------------------------------------------ driver

    def run(self) -> dict:
        c = self.config
        self.warm_start()
        if c.eval.before and "before" not in self.host["eval"] and c.env.eval_splits:
            self.host["eval"]["before"] = {s: self.evaluate(s, limit=c.eval.limit) for s in c.env.eval_splits}
            self._print_eval("before RL", self.host["eval"]["before"])
            self.save()
        start = int(self.host["iteration"])
        if start < c.iterations:  # a finished run extended to more iterations: its evaluation is stale
            self.host["eval"].pop("after", None)
        bar = tqdm(
            range(start, c.iterations),
            desc=f"RL ({c.algo})",
            disable=not c.log.progress,
            initial=start,
            total=c.iterations,
        )
        for it in bar:
            metrics = self.iteration(it)
            if c.eval.every and (it + 1) % c.eval.every == 0 and it + 1 < c.iterations:
                for split in c.env.eval_splits:
                    for k, v in self.evaluate(split, limit=c.eval.limit).items():
                        metrics[f"eval/{split}/{k}"] = v
            self.host["iteration"] = it + 1
            self.logger.log(it + 1, metrics, echo=not c.log.progress)
            bar.set_postfix(
                success=f"{metrics['train/success/all']:.2f}", ret=f"{metrics['train/return']:.2f}"
            )
            if c.checkpoint.every and (it + 1) % c.checkpoint.every == 0:
                self.save()
        if c.iterations == 0 and "before" in self.host["eval"]:
            self.host["eval"]["after"] = self.host["eval"]["before"]  # no RL ran: nothing changed
        if "after" not in self.host["eval"] and c.env.eval_splits:
            self.host["eval"]["after"] = {s: self.evaluate(s, limit=c.eval.limit) for s in c.env.eval_splits}
            self._print_eval("after RL", self.host["eval"]["after"])
        self.save(replace=True)  # the last iteration's step may exist already: it then gains the evaluation
        self.ckpt.wait()
        return self.finish()

    def finish(self) -> dict:
        from roleagent_jax.report import write_report

        final_dir = self.workdir / "hf_final"
        model = self.policy_model()
        save_pretrained(model, final_dir, tokenizer=self.tokenizer)  # adapters merged into the kernels
        if self.base is not None:
            save_adapter(model, final_dir / "adapter", self.host["lora_base"])
        self._write_prompt_settings(final_dir)
        summary = {
            "workdir": str(self.workdir),
            "algo": self.config.algo,
            "eval": self.host["eval"],
            "final_model": str(final_dir),
        }
        if self.is_main:
            report = write_report(self.workdir, self.config, self.logger.history, self.host, self.aiw_state)
            summary["report"] = str(report)
            write_json(self.workdir / "summary.json", summary)
        return summary

    def _write_prompt_settings(self, directory: Path) -> None:
        """roleagent.json beside exported weights, so `evaluate --checkpoint` prompts as training did."""
        if not self.is_main:
            return
        c = self.config
        write_prompt_settings(
            directory,
            history_k=c.env.history_k,
            max_prompt_tokens=c.rollout.max_prompt_tokens,
            max_response_tokens=c.rollout.max_response_tokens,
        )

    def close(self) -> None:
        self.ckpt.close()
        self.envs.close()
        self.logger.close()

    @staticmethod
    def _print_eval(title: str, results: dict) -> None:
        print(f"evaluation {title}: " + json.dumps(results), flush=True)
