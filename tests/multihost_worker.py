"""One process of the multi-host test: a tiny Qwen2 trained for a few steps on a mesh spanning processes.

    python tests/multihost_worker.py --process-id I --num-processes N --port P --devices D --out FILE

Mirrors what a training iteration does across hosts: every process draws the same tasks from the same
seed; each process scores its own share of the rows
(its "environments") and the shares are all-gathered; the batch becomes a global array; the jitted
update runs on the global mesh. The final parameters (gathered to host) go to ``--out`` as an .npz.
With ``--num-processes 1`` the same program runs in one process over ``D`` devices, the reference.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--process-id", type=int, default=0)
    p.add_argument("--num-processes", type=int, default=1)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--devices", type=int, default=2, help="CPU devices of this process")
    p.add_argument("--mesh", default="1,2,2", help="data,fsdp,tensor over all processes' devices")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--step-fn", choices=("sgd", "train_step", "trainer"), default="sgd")
    p.add_argument("--out", required=True)
    return p.parse_args(argv)


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={args.devices}"
    os.environ["JAX_PLATFORMS"] = "cpu"
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

    import jax
    import numpy as np
    from flax import nnx

    from roleagent_jax.parallel import distributed

    if args.num_processes > 1:
        distributed.initialize(f"127.0.0.1:{args.port}", args.num_processes, args.process_id)
    if args.step_fn == "trainer":
        _trainer_iteration(args)
        return
    from qwen2_tiny import tiny_config

    from roleagent_jax.models import Qwen2ForCausalLM
    from roleagent_jax.parallel.sharding import make_mesh, param_shardings

    data, fsdp, tensor = (int(x) for x in args.mesh.split(","))
    mesh = make_mesh(data, fsdp, tensor)
    cfg = tiny_config(vocab_size=64, hidden_size=32, intermediate_size=48, max_position_embeddings=64)
    graphdef, params = nnx.split(Qwen2ForCausalLM(cfg, rngs=nnx.Rngs(0)))
    host_params = jax.tree.map(np.asarray, params)  # identical on every process (same seed)
    params = jax.device_put(host_params, param_shardings(host_params, mesh))

    # Host decisions: every process draws the same tasks from the same seed (as the trainer's sampler does).
    rows, length, pool = 8, 12, 32
    task_ids = np.random.default_rng(1000).integers(0, pool, rows)
    tokens = np.random.default_rng(7).integers(0, cfg.vocab_size, (pool, length)).astype(np.int32)
    # Each process scores only its share of the rows ("its environments"), then everyone gets all.
    share = distributed.process_share(rows)
    local = [(i, float(np.cos(task_ids[i])) + 0.1 * i) for i in share]
    scores = dict(kv for part in distributed.allgather_objects(local) for kv in part)
    weights = np.array([scores[i] for i in range(rows)], np.float32)
    batch = distributed.global_batch(
        {"input_ids": tokens[task_ids], "weights": weights, "mask": np.ones((rows, length), np.int32)}, mesh
    )

    if args.step_fn == "train_step":
        state, step = _real_train_step(graphdef, params, mesh)
    else:
        state, step = _sgd_step(graphdef, params, mesh)
    losses = []
    for _ in range(args.steps):
        state, loss = step(state, batch)
        losses.append(loss)
    final = distributed.fetch(state["params"] if isinstance(state, dict) else state.params)
    flat = {
        "/".join(str(getattr(k, "key", k)) for k in path): np.asarray(v)
        for path, v in jax.tree_util.tree_leaves_with_path(final)
    }
    flat.update(
        {
            "__init__/" + "/".join(str(getattr(k, "key", k)) for k in path): np.asarray(v)
            for path, v in jax.tree_util.tree_leaves_with_path(host_params)
        }
    )
    flat["__loss__"] = np.asarray(distributed.fetch(losses))
    flat["__task_ids__"] = task_ids
    flat["__weights__"] = weights
    np.savez(args.out, **flat)
    distributed.sync("done")


def _sgd_step(graphdef, params, mesh):
    """A plain jitted SGD step on a weighted next-token loss (no dependency on the RL train step)."""
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx

    def loss_fn(p, batch):
        logits = nnx.merge(graphdef, p)(batch["input_ids"], batch["mask"])
        ce = optax.softmax_cross_entropy_with_integer_labels(logits[:, :-1], batch["input_ids"][:, 1:])
        return jnp.mean(ce.mean(axis=1) * batch["weights"])

    @jax.jit
    def step(state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(state["params"], batch)
        new = jax.tree.map(lambda p, g: p - 0.5 * g, state["params"], grads)
        return {"params": new}, loss

    return {"params": params}, step


def _real_train_step(graphdef, params, mesh):
    """The project's PPO train step on the same batch (advantages = the weights, old = ref = current)."""
    import jax
    import jax.numpy as jnp

    from roleagent_jax.rl.logprobs import make_logprob_fn
    from roleagent_jax.rl.optimizer import TrainState, make_optimizer
    from roleagent_jax.rl.train_step import make_train_step

    # eps well above gradient round-off: Adam would otherwise blow float noise in near-zero gradients
    # (summed in a different order on one process) up to lr-sized update differences.
    optimizer = make_optimizer(1e-2, weight_decay=0.01, grad_clip=1.0, eps=1e-3)
    loss_cfg = dict(
        clip_eps=0.2, dual_clip=3.0, kl_type="low_var_kl", kl_coef=0.01, entropy_coef=0.001, agg="token-mean"
    )
    train = make_train_step(graphdef, optimizer, loss_cfg, mesh=mesh, micro_batches=2)
    logprob = make_logprob_fn(graphdef, mesh=mesh)
    state = TrainState.create(params, optimizer, jax.random.PRNGKey(0))

    def step(state, batch):
        full = {
            "input_ids": batch["input_ids"],
            "attention_mask": batch["mask"],
            "positions": jnp.broadcast_to(jnp.arange(batch["mask"].shape[1]), batch["mask"].shape),
            "loss_mask": batch["mask"],
            "advantages": batch["weights"],
        }
        full["old_logprobs"] = logprob(state.params, full)
        full["ref_logprobs"] = full["old_logprobs"]
        state, metrics = train(state, full)
        return state, metrics.get("loss", next(iter(metrics.values())))

    return state, step


def _trainer_iteration(args) -> None:
    """One `Trainer.iteration` of a tiny demo-config run (procedural games, BPE tokenizer, tiny Qwen2)."""

    import jax
    import numpy as np

    from configs import demo
    from roleagent_jax.parallel import distributed
    from roleagent_jax.run.trainer import Trainer

    c = demo.get_config()
    c.workdir = str(Path(args.out).parent / "trainer_run")  # one workdir shared by the processes
    c.iterations, c.warmstart.steps, c.env.eval_splits = 1, 0, ()
    c.env.gen.n_train, c.warmstart.n_games, c.env.num_workers, c.env.max_steps = 8, 8, 1, 3
    c.rollout.tasks_per_iter, c.rollout.group_size, c.rollout.max_prompt_tokens = 2, 2, 256
    c.train.mini_batch_rows, c.train.micro_batch_rows = 8, 4
    c.model.init.hidden_size, c.model.init.intermediate_size = 32, 64
    c.tokenizer.train_vocab_size = 300
    c.log.progress, c.log.tensorboard, c.checkpoint.every = False, False, 0
    data, fsdp, tensor = (int(x) for x in args.mesh.split(","))
    c.mesh.data, c.mesh.fsdp, c.mesh.tensor = data, fsdp, tensor
    trainer = Trainer(c)
    try:
        metrics = trainer.iteration(0)
        params = distributed.fetch(trainer.state.params)
    finally:
        trainer.close()
    flat = {
        "/".join(str(getattr(k, "key", k)) for k in path): np.asarray(v)
        for path, v in jax.tree_util.tree_leaves_with_path(params)
    }
    flat["__rows__"] = np.asarray(metrics["train/rows"])
    np.savez(args.out, **flat)
    distributed.sync("done")


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except BaseException:
        # A normal exit would wait in jax.distributed's shutdown barrier for peers that may be blocked
        # in a collective this process will never join: leave at once with the traceback printed.
        import traceback

        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
