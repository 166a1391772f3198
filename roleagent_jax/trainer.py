"""The Role-Agent training loop, one iteration at a time:

    tasks ~ AIW task sampler -> rollouts (agent + predictor prompts share each sampler call)
    -> WIA scores -> GiGPO advantages with return multipliers -> PPO mini-batch updates
    -> failure analysis -> memory + retrieval -> new task-sampling logits

Device work (generation, log-probs, updates) is jitted and sharded behind the rollout backend and the
train step; what a run builds before its first iteration is in `run_setup`. This file is the thin
host-side orchestration between those calls, plus checkpoints and evaluation.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import nnx
from ml_collections import ConfigDict
from tqdm.auto import tqdm

from roleagent_jax import aiw, distributed
from roleagent_jax import run_setup as setup
from roleagent_jax.advantages import row_advantages
from roleagent_jax.backends import make_backend
from roleagent_jax.checkpointing import Checkpointer, claim_workdir, write_json
from roleagent_jax.config import apply_algo, family_options, validate
from roleagent_jax.config.checks import pool_size_errors
from roleagent_jax.envs import get_family
from roleagent_jax.episodes import lost_share
from roleagent_jax.evaluate import summarize
from roleagent_jax.exit_codes import EnvironmentOutage
from roleagent_jax.logprobs import make_logprob_fn
from roleagent_jax.metrics import MetricLogger, eval_metrics, iteration_metrics
from roleagent_jax.models import save_pretrained
from roleagent_jax.models.lora import LoRAConfig
from roleagent_jax.optimizer import TrainState
from roleagent_jax.policy_weights import PolicyWeights
from roleagent_jax.ppo import ppo_batch, ppo_epochs
from roleagent_jax.rollout import RolloutResult, collect_all
from roleagent_jax.run_record import check_resume, run_record, write_record
from roleagent_jax.sampling import SamplingParams, capped_batch_buckets
from roleagent_jax.sharding import make_mesh
from roleagent_jax.tokenizer import PromptEncoder, eos_ids
from roleagent_jax.train_step import make_train_step
from roleagent_jax.trained_settings import EVAL_KEY_OFFSET, run_settings, write_settings
from roleagent_jax.types import RolloutSettings
from roleagent_jax.wia import wia_multipliers, with_predictor_rows
from roleagent_jax.workdir_lock import WorkdirLock, check_free


def timed(fn: Callable[[Any], Any], name: str, times: dict[str, float]) -> Callable[[Any], Any]:
    """``fn`` that adds its seconds to ``times[name]`` (its result must be ready when it returns)."""

    def run(arg):
        start = time.perf_counter()
        out = fn(arg)
        times[name] = times.get(name, 0.0) + time.perf_counter() - start
        return out

    return run


class Trainer:
    """Owns the model, environments, optimizer state and AIW state of one run in `config.workdir`."""

    experts_type = setup.Experts  # who plays the warm start's games (a subclass may bring its own)

    def __init__(self, config: ConfigDict, config_file: str = ""):
        distributed.initialize()
        self.config = c = apply_algo(validate(config))
        self.config_file = config_file  # recorded in the workdir, named when another run resumes there
        self.workdir = Path(c.workdir).absolute()
        fresh = not self.workdir.exists()
        self.lock: WorkdirLock | None = None
        try:
            self._build(c)
        except BaseException:  # refused or failed while building: a new run leaves no half-made workdir
            if self.lock is not None:
                self.lock.release()
            if fresh and jax.process_index() == 0 and self.lock is not None:
                shutil.rmtree(self.workdir, ignore_errors=True)
            raise

    def _build(self, c: ConfigDict) -> None:
        family = get_family(c.env.name)
        self.family = family.configured(family_options(c, family))  # its protocol, prompt and rules
        record = run_record(c, self.config_file)
        if not c.checkpoint.overwrite:  # overwrite moves the earlier run aside, record and all
            check_resume(self.workdir, record)
        check_free(self.workdir)  # a workdir another live run holds is neither resumed nor moved aside
        claim_workdir(self.workdir, c.checkpoint.resume, c.checkpoint.overwrite)
        try:
            self.workdir.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise ValueError(
                f"--config.workdir={c.workdir!r}: cannot make it ({err.strerror or err})"
            ) from err
        self.is_main = jax.process_index() == 0
        if self.is_main:
            self.lock = WorkdirLock(self.workdir)
            write_record(self.workdir, record)
        self.mesh = make_mesh(c.mesh.data, c.mesh.fsdp, c.mesh.tensor)
        self.settings = RolloutSettings.from_config(c)
        self.train_pool = setup.make_task_pool(c, self.family, c.env.train_split, self.workdir, "train")
        sizes = pool_size_errors(c, self.family, len(self.train_pool))  # a real split's size is known now
        if sizes:
            raise ValueError(sizes[0])
        # Made now, so a split that cannot be built stops the run before any work (and they are reused).
        self.eval_pools = {s: self._eval_pool(s) for s in c.env.eval_splits}
        self.envs = setup.env_pool(c, self.family, self.train_pool)
        self.experts = self.experts_type(c, self.family, self.train_pool, self.workdir)
        self.ckpt = Checkpointer(self.workdir / "checkpoints", keep=c.checkpoint.keep)
        resuming = c.checkpoint.resume and self.ckpt.latest_step() is not None
        model, self.model_config, self.tokenizer = setup.build_model(
            c, self.workdir, self.mesh, resuming, self.experts
        )
        self.encode_prompt = PromptEncoder(self.tokenizer)
        start_dir = str(Path(c.model.path or self.workdir / "hf_init").absolute())
        self.weights, params = PolicyWeights.split(
            model, LoRAConfig(**c.lora.to_dict()), c.seed, self.mesh, base_dir=start_dir
        )
        del model  # no reference to the model is kept: its arrays live on as the state (or the LoRA base)
        micro = c.train.mini_batch_rows // c.train.micro_batch_rows
        self.backend = make_backend(
            c.rollout.backend, self.weights.base_graphdef, self.model_config, self.tokenizer, self.mesh,
            eos_ids=eos_ids(self.tokenizer), batch_buckets=capped_batch_buckets(c.rollout.max_rows_per_call),
        )  # fmt: skip
        # The old-policy and reference log-probs: the full model's forward pass, as the update computes it.
        self.logprob_fn = make_logprob_fn(self.weights.base_graphdef, mesh=self.mesh, micro_batches=micro)
        self.optimizer = setup.make_optimizer_for(c)
        self.train_step = make_train_step(self.weights.graphdef, self.optimizer, c.loss, mesh=self.mesh,
                                          micro_batches=micro, remat=c.model.remat)  # fmt: skip
        self.state = TrainState.create(params, self.optimizer, jax.random.PRNGKey(c.seed), mesh=self.mesh)
        # The KL reference: the warm-started model; with LoRA the base itself (no second copy).
        self.kl = c.loss.kl_type != "none" and c.loss.kl_coef > 0
        self.weights.keep_reference(params, self.kl)
        self.task_sampler = aiw.TaskSampler.from_config(len(self.train_pool), c.aiw, seed=c.seed)
        self.aiw_state = aiw.AIWState(self.task_sampler, setup.failure_memory(self.workdir, resuming))
        self.host = {"iteration": 0, "warm_started": False, "eval": {}, "sft_losses": [], "sampled_tasks": []}
        self.host.update(self.weights.host_state())  # with LoRA: the base its adapters belong to
        history = self._restore() if resuming else None
        self.logger = MetricLogger(self.workdir / "logs", tensorboard=c.log.tensorboard and self.is_main,
                                   history=history, write=self.is_main)  # fmt: skip
        self.logger.resume_at(int(self.host["iteration"]))

    # ------------------------------------------------------------------ the policy

    def policy_params(self):
        """The full weights the sampler runs (with LoRA, the merged copy)."""
        return self.weights.sampling(self.state.params, int(self.state.step))

    def logprobs(self, batch, params) -> np.ndarray:
        """Token log-probs [B, T] of a `ppo.pack_rows` grid under the full weights `params`, 0 on
        padding."""
        return np.asarray(distributed.fetch(self.logprob_fn(params, batch)))

    def generate_fn(self, sampling: SamplingParams, key):
        """The current policy's batched sampler call, each invocation with its own fold of `key`."""
        self.backend.update_weights(self.policy_params())
        calls = [0]

        def generate(requests):
            calls[0] += 1
            return self.backend.generate(requests, sampling, jax.random.fold_in(key, calls[0]))

        return generate

    # ------------------------------------------------------------------ one iteration

    def iteration(self, it: int) -> dict:
        c = self.config
        t0 = time.perf_counter()
        B, G = c.rollout.tasks_per_iter, c.rollout.group_size
        tasks = self.task_sampler.sample(B)
        self.host["sampled_tasks"].append(tasks.tolist())
        sampling = SamplingParams(
            temperature=c.rollout.temperature, top_p=c.rollout.top_p, top_k=c.rollout.top_k
        )
        result = collect_all(
            self.generate_fn(sampling, jax.random.fold_in(self.state.rng, it)), self.family, self.envs,
            np.repeat(tasks, G).tolist(), np.repeat(np.arange(B), G).tolist(), self.tokenizer, self.settings,
            seed=c.seed, iteration=it,
        )  # fmt: skip
        times = {"rollout": time.perf_counter() - t0}
        self._check_environment(f"iteration {it + 1}", result.trajectories, self.train_pool)
        metrics: dict[str, float] = {}
        lost = {t.traj_id for t in result.trajectories if t.env_failed}  # no loss of the agent's: no rows
        rows, multiplier = [r for r in result.rows if r.traj_id not in lost], None
        t1 = time.perf_counter()
        if c.wia.mode != "off" and rows:
            multiplier, wia_metrics = wia_multipliers(
                result.trajectories, result.predictions, rows, c.wia.lam, c.wia.similarity, c.wia.fill
            )
            metrics.update(wia_metrics)
        times["wia"], t1 = time.perf_counter() - t1, time.perf_counter()
        adv = row_advantages(rows, return_multiplier=multiplier, **c.advantage.to_dict())
        times["advantages"] = time.perf_counter() - t1
        if c.wia.train_predictor and result.predictor_samples:
            rows, adv = with_predictor_rows(rows, adv, result.predictor_samples)
            metrics["train/predictor_rows"] = float(len(result.predictor_samples))
        t1 = time.perf_counter()
        metrics.update(self._update(rows, adv, it))
        times["update"], t1 = time.perf_counter() - t1, time.perf_counter()
        if c.aiw.enabled:
            metrics.update(self._aiw(result.trajectories, it))
        else:  # the AIW round reports the shares itself; without it they stay uniform
            shares = self.task_sampler.type_shares(self.train_pool.task_types)
            metrics.update({f"aiw/share/{t}": p for t, p in shares.items()})
        times["aiw"] = time.perf_counter() - t1
        times["iteration"] = time.perf_counter() - t0
        return iteration_metrics(metrics, result, rows, adv, self.family.task_types, times)

    def _check_environment(self, what: str, trajs, pool) -> None:
        """Stop the run (`EnvironmentOutage`, exit 3, before anything of this iteration or evaluation is
        kept) when more than `env.max_lost_share` of the episodes were lost to the environment; else name
        the lost games and print what the family finds wrong with the environment."""
        share, limit = lost_share(trajs), self.config.env.max_lost_share
        if share > limit:
            reasons = sorted({t.env_error or "environment failed" for t in trajs if t.env_failed})
            raise EnvironmentOutage(
                f"{what} lost {sum(t.env_failed for t in trajs)} of {len(trajs)} episodes to the environment "
                f"({'; '.join(reasons)[:300]}), more than --config.env.max_lost_share={limit}"
            )
        setup.print_failed(what, trajs, pool)
        for line in self.family.warnings(trajs):
            print(f"warning: {what}: {line}", flush=True)

    def _update(self, rows, adv: np.ndarray, it: int) -> dict:
        """PPO on this iteration's rows: log-probs fixed first, then the sampler's copy of the policy is
        dropped (the update needs the memory more) and the mini-batch epochs run."""
        c = self.config
        if not rows:
            self.weights.drop_sampling_copy()
            return {}
        times: dict[str, float] = {}
        packed = ppo_batch(
            rows, adv, pad_id=self.tokenizer.pad_token_id, max_prompt=c.rollout.max_prompt_tokens,
            max_response=max(c.rollout.max_response_tokens, c.wia.max_tokens * c.wia.train_predictor),
            mini_batch_rows=c.train.mini_batch_rows,
            old_logprobs=None if c.train.old_logprobs == "sampler" else timed(self._old_logprobs, "old_logprobs", times),
            ref_logprobs=timed(self._ref_logprobs, "ref_logprobs", times) if self.kl else None,
            train_forced=c.rollout.train_openers,
        )  # fmt: skip
        self.weights.drop_sampling_copy()
        self.backend.update_weights(None)
        self.state, metrics = ppo_epochs(
            self.train_step, self.state, packed, len(rows), mini_batch_rows=c.train.mini_batch_rows,
            epochs=c.train.ppo_epochs, rng=np.random.default_rng([c.seed, it]), frozen=self.weights.base,
        )  # fmt: skip
        return {**metrics, **{f"time/update/{k}": v for k, v in times.items()}}

    def _old_logprobs(self, batch) -> np.ndarray:
        return self.logprobs(batch, self.policy_params())

    def _ref_logprobs(self, batch) -> np.ndarray:
        return self.logprobs(batch, self.weights.kl_reference)

    def _aiw(self, trajs, it: int) -> dict:
        """The AIW round: the policy analyses its failures and re-weights the tasks (`aiw.policy_round`)."""
        c = self.config
        gen = self.generate_fn(
            SamplingParams(temperature=0.4), jax.random.fold_in(self.state.rng, 10_000 + it)
        )
        metrics = aiw.policy_round(
            self.aiw_state, trajs, self.train_pool, self.family, c.aiw, it, seed=c.seed, generate=gen,
            encode=self.encode_prompt, max_steps=c.env.max_steps,
        )  # fmt: skip
        if self.is_main:  # failure-type histogram and most boosted tasks of this round
            tqdm.write(f"[iter {it + 1}] " + aiw.format_round(metrics, self.aiw_state.history[-1]))
        return metrics

    # ------------------------------------------------------------------ phases

    def warm_start(self) -> None:
        """Supervised warm start of the whole model. With LoRA it makes the base (full weights, before
        any adapter trains): the adapters then learn RL on top of it, and it is the KL reference."""
        c = self.config
        if self.host["warm_started"] or c.warmstart.steps == 0:
            return
        graphdef, start = self.weights.warm_start_weights(self.state.params)
        params, losses = setup.warm_start(
            c, graphdef, start, self.experts.examples(), self.tokenizer, self.workdir
        )
        trained = self.weights.take_warm_start(params, str(self.workdir / "hf_warmstart"))
        if trained is not None:  # the trained params changed: a new train state starts from them
            self.state = TrainState.create(trained, self.optimizer, self.state.rng, mesh=self.mesh)
        self.host.update(self.weights.host_state())
        save_pretrained(  # the KL reference (with LoRA: the base) of a resumed run
            nnx.merge(graphdef, params), self.workdir / "hf_warmstart", tokenizer=self.tokenizer
        )
        self._write_prompt_settings(self.workdir / "hf_warmstart")
        self.host.update(warm_started=True, sft_losses=losses)

    def evaluate(self, split: str, limit: int = 0) -> dict:
        """Every game of `split` once (fixed panel), sampled at the eval temperature: `evaluate.summarize`
        of the episodes (success per type, the family's score and behaviour rates, diagnostics)."""
        c = self.config
        pool = self.eval_pools.get(split) or self._eval_pool(split)
        ids = list(range(len(pool)))[: limit or None]
        setup.say(c, f"evaluation: playing {len(ids)} {split} games")
        with setup.env_pool(c, self.family, pool) as envs:
            gen = self.generate_fn(
                SamplingParams(temperature=c.eval.temperature, greedy=c.eval.greedy),
                jax.random.PRNGKey(c.seed + EVAL_KEY_OFFSET),
            )
            settings = dataclasses.replace(
                self.settings, wia_mode="off", branch_at=0, branch_openers=False, expert_branch=False
            )
            result: RolloutResult = collect_all(
                gen, self.family, envs, ids, ids, self.tokenizer, settings, c.seed
            )
        self._check_environment(f"evaluation on {split}", result.trajectories, pool)
        f = self.family
        return summarize(split, result.trajectories, f.task_types, f.score_name, pool, f)

    def _eval_pool(self, split: str):
        return setup.eval_pool(self.config, self.family, split, self.workdir, self.train_pool)

    def _evaluate_all(self, when: str) -> None:
        c = self.config
        self.host["eval"][when] = {s: self.evaluate(s, limit=c.eval.limit) for s in c.env.eval_splits}
        print(f"evaluation {when} RL: " + json.dumps(self.host["eval"][when]), flush=True)

    def run(self) -> dict:
        c = self.config
        self.warm_start()
        if c.eval.before and "before" not in self.host["eval"] and c.env.eval_splits:
            self._evaluate_all("before")
            self.save()
        start = int(self.host["iteration"])
        if start < c.iterations:  # a finished run extended to more iterations: its evaluation is stale
            self.host["eval"].pop("after", None)
        bar = tqdm(range(start, c.iterations), desc=f"RL ({c.algo})", disable=not c.log.progress,
                   initial=start, total=c.iterations)  # fmt: skip
        for it in bar:
            metrics = self.iteration(it)
            if c.eval.every and (it + 1) % c.eval.every == 0 and it + 1 < c.iterations:
                for split in c.env.eval_splits:
                    summary = self.evaluate(split, limit=c.eval.curve_games or c.eval.limit)
                    metrics.update(eval_metrics(split, summary))
            self.host["iteration"] = it + 1
            self.logger.log(it + 1, metrics, echo=not c.log.progress)
            self.ckpt.check()  # a background save that failed stops the run now, not at the next save
            bar.set_postfix(success=f"{metrics['train/success/all']:.2f}", ret=f"{metrics['train/return']:.2f}")  # fmt: skip
            if c.checkpoint.every and (it + 1) % c.checkpoint.every == 0:
                self.save()
        if c.iterations == 0 and "before" in self.host["eval"]:
            self.host["eval"]["after"] = self.host["eval"]["before"]  # no RL ran: nothing changed
        if "after" not in self.host["eval"] and c.env.eval_splits:
            self._evaluate_all("after")
        self.save(replace=True)  # the last iteration's step may exist already: it then gains the evaluation
        self.ckpt.wait()
        return self.finish()

    def finish(self) -> dict:
        from roleagent_jax.report import write_report

        final_dir = self.workdir / "hf_final"
        self.weights.export(self.state.params, final_dir, self.tokenizer, fix_modes=self.is_main)
        self._write_prompt_settings(final_dir)
        summary = {"workdir": str(self.workdir), "algo": self.config.algo, "eval": self.host["eval"],
                   "final_model": str(final_dir)}  # fmt: skip
        if self.is_main:
            report = write_report(self.workdir, self.config, self.logger.history, self.host, self.aiw_state)
            summary["report"] = str(report)
            write_json(self.workdir / "summary.json", summary)
        return summary

    def _write_prompt_settings(self, directory: Path) -> None:
        """roleagent.json beside exported weights, so `evaluate --checkpoint` plays the run's tasks with
        its prompts and decoding (`trained_settings`)."""
        if self.is_main:
            write_settings(directory, run_settings(self.config, self.family.options))

    # ------------------------------------------------------------------ checkpoints

    def save(self, replace: bool = False) -> None:
        host = dict(self.host, aiw=self.aiw_state.state_dict(), history=self.logger.history)
        self.ckpt.save(int(self.host["iteration"]), self.state, host, replace=replace)

    def _restore(self) -> list[dict]:
        """The newest checkpoint's state; the command line's task-sampler settings win over the saved
        ones, and the KL reference (or LoRA base) is reloaded from where the run exported it."""
        c = self.config
        self.state, host = self.ckpt.restore(self.state)
        self.aiw_state.load_state_dict(host.pop("aiw"))
        changed = self.task_sampler.configure(c.aiw)
        if changed and self.is_main:
            print("task sampler settings from the command line: " + ", ".join(changed), flush=True)
        history = host.pop("history")
        self.host.update(host)
        print(f"resumed from {self.ckpt.directory} at iteration {self.host['iteration']}", flush=True)
        source = self.weights.frozen_source(self.host, self.workdir / "hf_warmstart")
        if source is not None:
            self.weights.load_frozen(setup.load_params(c, source, self.mesh), source)
        return history

    def close(self) -> None:
        """Close the checkpointer (awaiting its last save), the environments, the logger and the
        workdir's lock, each whatever failed before it; the first failure is raised afterwards."""
        first: BaseException | None = None
        for part in ("ckpt", "envs", "logger", "lock"):
            obj = getattr(self, part, None)
            if obj is None:
                continue
            try:
                obj.release() if part == "lock" else obj.close()
            except BaseException as err:  # noqa: BLE001 - the others must still close
                first = first or err
        if first is not None:
            raise first
