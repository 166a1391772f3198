"""The Role-Agent training loop, one iteration at a time:

    tasks ~ AIW task sampler -> rollouts (agent + predictor prompts share each sampler call)
    -> WIA scores -> GiGPO advantages with return multipliers -> PPO mini-batch updates
    -> failure analysis -> memory + retrieval -> new task-sampling logits

Device work (generation, log-probs, updates) is jitted and sharded behind the rollout backend and the
train step; what a run builds before its first iteration is in `setup`. This file is the thin
host-side orchestration between those calls, plus checkpoints and evaluation.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import jax
import numpy as np
from flax import nnx
from ml_collections import ConfigDict
from tqdm.auto import tqdm

from roleagent_jax import aiw
from roleagent_jax.backends.base import FoldedCalls
from roleagent_jax.config import apply_algo, family_options, validate
from roleagent_jax.envs import get_family
from roleagent_jax.evaluation.trained_settings import EVAL_KEY_OFFSET, run_settings, write_settings
from roleagent_jax.models import save_pretrained
from roleagent_jax.models.tokenizer import PromptEncoder
from roleagent_jax.parallel import distributed
from roleagent_jax.parallel.sharding import make_mesh
from roleagent_jax.rl.opener_probs import opener_metrics
from roleagent_jax.rl.optimizer import TrainState
from roleagent_jax.rl.update import pack_multiple, ppo_update
from roleagent_jax.run import setup
from roleagent_jax.run.checkpointing import Checkpointer, write_json
from roleagent_jax.run.closing import close_all
from roleagent_jax.run.evaluation_phase import evaluate_split
from roleagent_jax.run.metrics import MetricLogger, eval_metrics, iteration_metrics
from roleagent_jax.run.outages import check_environment
from roleagent_jax.run.record import open_workdir
from roleagent_jax.run.rollout import collect_all
from roleagent_jax.sampling import SamplingParams
from roleagent_jax.types import RolloutSettings
from roleagent_jax.wia.credit import shaped_advantages


class Trainer:
    """Owns the model, environments, optimizer state and AIW state of one run in `config.workdir`."""

    experts_type = setup.Experts  # who plays the warm start's games (a subclass may bring its own)

    def __init__(self, config: ConfigDict, config_file: str = ""):
        distributed.initialize()
        self.config = c = apply_algo(validate(config))
        self.config_file = config_file  # recorded in the workdir, named when another run resumes there
        self.workdir = Path(c.workdir).absolute()
        fresh = not self.workdir.exists()
        self.lock = None  # the workdir's lock, once claimed (`record.open_workdir`)
        try:
            self._build(c)
        except BaseException:  # refused or failed while building: a new run leaves no half-made workdir
            if self.lock is not None:  # claimed by this run (process 0)
                self.lock.release()
                if fresh:
                    shutil.rmtree(self.workdir, ignore_errors=True)
            raise

    def _build(self, c: ConfigDict) -> None:
        family = get_family(c.env.name)
        self.family = family.configured(family_options(c, family))  # its protocol, prompt and rules
        self.is_main = jax.process_index() == 0
        self.lock = open_workdir(self.workdir, c, self.config_file, self.is_main)
        self.mesh = make_mesh(c.mesh.data, c.mesh.fsdp, c.mesh.tensor)
        self.settings = RolloutSettings.from_config(c)
        self.train_pool = setup.train_pool(c, self.family, self.workdir)
        # Made now, so a split that cannot be built stops the run before any work (and they are reused).
        self.eval_pools = {s: self._eval_pool(s) for s in c.env.eval_splits}
        self.envs = setup.env_pool(c, self.family, self.train_pool)
        self.experts = self.experts_type(c, self.family, self.train_pool, self.workdir)
        self.ckpt = Checkpointer(self.workdir / "checkpoints", keep=c.checkpoint.keep)
        resuming = c.checkpoint.resume and self.ckpt.latest_step() is not None
        self.weights, params, self.model_config, self.tokenizer = setup.policy_weights(
            c, self.workdir, self.mesh, resuming, self.experts
        )
        self.encode_prompt = PromptEncoder(self.tokenizer)
        self.backend, self.logprob_fn, self.optimizer, self.train_step = setup.update_programs(
            c, self.weights, self.model_config, self.tokenizer, self.mesh
        )
        self.state = TrainState.create(params, self.optimizer, jax.random.PRNGKey(c.seed), mesh=self.mesh)
        # The KL reference: the warm-started model; with LoRA the base itself (no second copy).
        self.kl = c.loss.kl_type != "none" and c.loss.kl_coef > 0
        self.weights.keep_reference(params, self.kl)
        self.aiw_state = aiw.AIWState.from_config(
            self.train_pool, c, setup.failure_memory(self.workdir, resuming)
        )
        self.task_sampler = self.aiw_state.sampler
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
        """Token log-probs [B, T] of a `ppo.pack_rows` grid under the full weights `params` (0: padding)."""
        return np.asarray(distributed.fetch(self.logprob_fn(params, batch)))

    def generate_fn(self, sampling: SamplingParams, key):
        """The current policy's batched sampler call, each invocation with its own fold of `key`."""
        self.backend.update_weights(self.policy_params())
        return FoldedCalls(self.backend, sampling, key)

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
        check_environment(f"iteration {it + 1}", result.trajectories, self.train_pool, self.family, c)
        opener = opener_metrics(self.family.action_openers, self.tokenizer, result.branch_prompts,
                                lambda b: self.logprobs(b, self.policy_params()), c.train.mini_batch_rows, times)  # fmt: skip
        rows, adv, metrics = shaped_advantages(
            result.trajectories, result.predictions, result.rows, result.predictor_samples, c, times
        )
        metrics.update(opener)
        t1 = time.perf_counter()
        metrics.update(self._update(rows, adv, it))
        times["update"], t1 = time.perf_counter() - t1, time.perf_counter()
        metrics.update(self._aiw(result.trajectories, it))
        times["aiw"] = time.perf_counter() - t1
        times["iteration"] = time.perf_counter() - t0
        return iteration_metrics(metrics, result, rows, adv, self.family.task_types, times)

    def _update(self, rows, adv: np.ndarray, it: int) -> dict:
        """PPO on this iteration's rows (`rl.update`), the sampler's copy dropped after the fixed log-probs."""
        if not rows:
            self.weights.drop_sampling_copy()
            return {}
        self.state, metrics = ppo_update(
            self.train_step, self.state, rows, adv, self.config, it, pad_id=self.tokenizer.pad_token_id,
            old_logprobs=lambda batch: self.logprobs(batch, self.policy_params()),
            ref_logprobs=(lambda batch: self.logprobs(batch, self.weights.kl_reference)) if self.kl else None,
            frozen=self.weights.base, release=self._release_sampler, pack=pack_multiple(self.config, self.mesh),
        )  # fmt: skip
        return metrics

    def _release_sampler(self) -> None:  # the update needs the memory more
        self.weights.drop_sampling_copy()
        self.backend.update_weights(None)

    def _aiw(self, trajs, it: int) -> dict:
        """The AIW round: the policy analyses its failures and re-weights the tasks (`aiw.policy_round`);
        without AIW the outcomes only feed the task sampler (`aiw.record_round`)."""
        c = self.config
        if not c.aiw.enabled:
            return aiw.record_round(self.task_sampler, trajs, self.train_pool.task_types)
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
        if self.is_main:  # what `evaluate --checkpoint` plays the tasks with (`trained_settings`)
            write_settings(self.workdir / "hf_warmstart", run_settings(c, self.family.options))
        self.host.update(warm_started=True, sft_losses=losses)

    def evaluate(self, split: str, limit: int = 0) -> dict:
        """Every game of `split` once, at the eval decoding: `evaluation_phase.evaluate_split`'s summary."""
        c = self.config
        gen = self.generate_fn(
            SamplingParams(temperature=c.eval.temperature, greedy=c.eval.greedy),
            jax.random.PRNGKey(c.seed + EVAL_KEY_OFFSET),
        )
        pool = self.eval_pools.get(split) or self._eval_pool(split)
        return evaluate_split(c, self.family, pool, split, gen, self.tokenizer, self.settings, limit)

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
        from roleagent_jax.run.report import write_report

        final_dir = self.workdir / "hf_final"
        self.weights.export(self.state.params, final_dir, self.tokenizer, fix_modes=self.is_main)
        summary = {"workdir": str(self.workdir), "algo": self.config.algo, "eval": self.host["eval"],
                   "final_model": str(final_dir)}  # fmt: skip
        if self.is_main:
            write_settings(final_dir, run_settings(self.config, self.family.options))
            report = write_report(self.workdir, self.config, self.logger.history, self.host, self.aiw_state)
            summary["report"] = str(report)
            write_json(self.workdir / "summary.json", summary)
        return summary

    # ------------------------------------------------------------------ checkpoints

    def save(self, replace: bool = False) -> None:
        host = dict(self.host, aiw=self.aiw_state.state_dict(), history=self.logger.history)
        self.ckpt.save(int(self.host["iteration"]), self.state, host, replace=replace)

    def _restore(self) -> list[dict]:
        """The newest checkpoint's state; the command line's task-sampler settings win over the saved
        ones, and the KL reference (or LoRA base) is reloaded from where the run exported it."""
        c = self.config
        self.state, host = self.ckpt.restore(self.state)
        changed = self.aiw_state.resume(host.pop("aiw"), c.aiw)
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
        """The checkpointer (awaiting its last save), the environments, the logger and the workdir's lock,
        each closed whatever failed before it (`closing.close_all`)."""
        parts = [getattr(self, name, None) for name in ("ckpt", "envs", "logger")]
        close_all([p.close if p is not None else None for p in parts] + [self.lock and self.lock.release])
