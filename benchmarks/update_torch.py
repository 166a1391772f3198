"""The project's LoRA PPO step against transformers + peft in TRL's layout, same rows and weights.

    python benchmarks/update_torch.py                        # SmolLM2-135M-Instruct when cached
    python benchmarks/update_torch.py --rows 8 --rounds 5 --rank 16 --top 8
    python benchmarks/update_torch.py --rows-file rows.jsonl # real rows (generation_replay.py --rows-out)
    python benchmarks/update_torch.py --tiny --rounds 1      # a tiny random model (the test's run)

Both sides start from the same base (``--model``, default the cached SmolLM2-135M-Instruct converted by
``python -m roleagent_jax.models.smollm2``, loaded in float32) and the same adapters: the project's
fresh rank-``--rank`` adapters on the top ``--top`` layers, written into a ``peft`` ``LoraConfig`` with the
same rank, alpha, target modules and ``layers_to_transform``. The torch side is TRL's layout: prompts
left-padded, responses right-padded, ``logits_to_keep`` at the response tokens, ``torch.optim.AdamW``
after ``clip_grad_norm_`` (the project's optimizer: global-norm clip 1.0, AdamW, decay 0.01). Both
compute the same loss (PPO clip, dual clip, entropy bonus, token mean; with ``kl``, low-variance KL to
the frozen base, whose log-probs each side computes inside the timed step as a trainer does).
Old log-probs are the base's own, a little perturbed, so the clip matters from the first step; the
first-step losses are asserted equal. The project runs its grid as the trainer builds it
(``pack_rows``, 64-token length bucket) and packed (``pack_segments``: ``train.pack_rows``).

Rows: ``--rows`` synthetic rows with prompts of 150-420 tokens and responses of 1-32 (the real-model
configs' rows), or ``--rows-file`` (JSON lines with ``prompt_ids`` and ``response_ids``). Rounds
alternate the sides so a busy machine slows all alike; times are medians, the ratios the median of
each round's own ratio. Reports seconds per row for each side, torch / project (> 1: the project is
faster) and the share of padded positions of each grid. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from benchmarks.common import print_json  # noqa: E402
from roleagent_jax.config import CONFIG  # noqa: E402
from roleagent_jax.models import load_pretrained  # noqa: E402
from roleagent_jax.models.lora import TARGETS, LoRAConfig, LoRAParam, add_lora  # noqa: E402
from roleagent_jax.models.peft_io import adapter_tensors  # noqa: E402
from roleagent_jax.rl.logprobs import make_logprob_fn  # noqa: E402
from roleagent_jax.rl.losses import LossConfig  # noqa: E402
from roleagent_jax.rl.optimizer import TrainState, make_optimizer  # noqa: E402
from roleagent_jax.rl.ppo import pack_rows, pack_segments, padded_share  # noqa: E402
from roleagent_jax.rl.train_step import make_train_step  # noqa: E402

LR = 1e-5
TINY = dict(
    vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
    num_key_value_heads=2, rope_theta=10000.0, tie_word_embeddings=True,
)  # fmt: skip


def synthetic_rows(
    n: int,
    vocab: int,
    prompt: tuple[int, int] = (150, 420),
    response: tuple[int, int] = (1, 32),
    seed: int = 0,
) -> list[tuple[list[int], list[int]]]:
    """``n`` (prompt, response) rows of random tokens, lengths uniform in the given closed ranges."""
    rng = np.random.default_rng(seed)
    return [
        (
            rng.integers(1, vocab, int(rng.integers(prompt[0], prompt[1] + 1))).tolist(),
            rng.integers(1, vocab, int(rng.integers(response[0], response[1] + 1))).tolist(),
        )
        for _ in range(n)
    ]


def read_rows(path: str | os.PathLike) -> list[tuple[list[int], list[int]]]:
    rows = []
    for i, line in enumerate(Path(path).read_text().splitlines()):
        if line.strip():
            record = json.loads(line)
            if not record.get("prompt_ids") or "response_ids" not in record:
                raise ValueError(f"{path}:{i + 1}: a row needs non-empty prompt_ids and response_ids")
            rows.append((record["prompt_ids"], record["response_ids"]))
    return rows


def trl_grid(rows, pad_id: int) -> dict[str, np.ndarray]:
    """TRL's layout: prompts left-padded to the longest, responses right-padded to the longest, side by
    side; ``response_mask`` ``[B, R]`` marks the response tokens."""
    width_p = max(len(p) for p, _ in rows)
    width_r = max(len(r) for _, r in rows)
    ids = np.full((len(rows), width_p + width_r), pad_id, np.int64)
    mask = np.zeros_like(ids)
    for i, (p, r) in enumerate(rows):
        ids[i, width_p - len(p) : width_p] = p
        ids[i, width_p : width_p + len(r)] = r
        mask[i, width_p - len(p) : width_p + len(r)] = 1
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "position_ids": np.maximum(np.cumsum(mask, 1) - 1, 0),
        "response_mask": mask[:, width_p:].astype(np.float32),
    }


def on_grid(values: list[np.ndarray], mask: np.ndarray) -> np.ndarray:
    """Each row's per-response-token values at its ``mask`` columns, in order (0 elsewhere)."""
    out = np.zeros(mask.shape, np.float32)
    for i, v in enumerate(values):
        cols = np.flatnonzero(mask[i] > 0)
        out[i, cols] = v[: cols.size]
    return out


def torch_policy_loss(torch, logp, entropy, old, ref, adv, mask, cfg: LossConfig):
    """``losses.policy_loss`` (token mean) in torch on ``[B, R]`` tensors."""
    ratio = torch.exp(torch.clamp(logp - old, -20.0, 20.0))
    adv = adv[:, None]
    pg = torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, 1 - cfg.clip_eps, 1 + cfg.clip_eps))
    if cfg.dual_clip is not None:
        pg = torch.where(adv < 0, torch.minimum(pg, -adv * cfg.dual_clip), pg)
    per_token = pg - cfg.entropy_coef * entropy
    if cfg.kl_type == "low_var_kl":
        d = torch.clamp(ref - logp, -20.0, 20.0)
        per_token = per_token + cfg.kl_coef * torch.clamp(torch.exp(d) - d - 1.0, -10.0, 10.0)
    return (per_token * mask).sum() / mask.sum().clamp(min=1.0)


class TorchSide:
    """transformers + peft: a ``LoraConfig`` like the project's adapters, their values copied in."""

    def __init__(self, model_dir: str, lora: LoRAConfig, layers: int, adapters: dict[str, np.ndarray]):
        import torch
        from peft import LoraConfig, get_peft_model
        from transformers import AutoModelForCausalLM

        self.torch = torch
        base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        config = LoraConfig(
            r=lora.rank,
            lora_alpha=lora.alpha,
            lora_dropout=0.0,
            target_modules=[TARGETS[t][1] for t in lora.targets],
            layers_to_transform=list(range(layers - lora.layers, layers)) if lora.layers else None,
            layers_pattern="layers" if lora.layers else None,
            bias="none",
            task_type="CAUSAL_LM",
        )
        self.model = get_peft_model(base, config)
        self.adapters = {k: torch.tensor(v) for k, v in adapters.items()}
        self.reset()

    def reset(self) -> None:
        """The initial adapters and a fresh optimizer."""
        from peft import set_peft_model_state_dict

        result = set_peft_model_state_dict(self.model, self.adapters)
        if getattr(result, "unexpected_keys", None):
            raise ValueError(f"adapters peft does not know: {result.unexpected_keys[:3]}")
        self.model.train()
        trained = [p for p in self.model.parameters() if p.requires_grad]
        if sum(p.numel() for p in trained) != sum(v.numel() for v in self.adapters.values()):
            raise ValueError("peft's trainable parameters differ from the project's adapters")
        self.optimizer = self.torch.optim.AdamW(
            trained, lr=LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01
        )

    def _logprobs(self, grid):
        torch = self.torch
        keep = grid["response_mask"].shape[1]
        logits = (
            self.model(
                input_ids=grid["input_ids"],
                attention_mask=grid["attention_mask"],
                position_ids=grid["position_ids"],
                logits_to_keep=keep + 1,
            )
            .logits[:, :-1]
            .float()
        )
        logz = torch.log_softmax(logits, -1)
        targets = grid["input_ids"][:, -keep:]
        logp = torch.gather(logz, -1, targets[..., None])[..., 0]
        entropy = -(logz.exp() * logz).sum(-1)
        return logp, entropy

    def step(self, grid, cfg: LossConfig) -> float:
        """One update; with KL the base's log-probs first (adapters off, no gradient)."""
        torch = self.torch
        ref = None
        if cfg.kl_type != "none":
            with torch.no_grad(), self.model.disable_adapter():
                ref = self._logprobs(grid)[0]
        logp, entropy = self._logprobs(grid)
        loss = torch_policy_loss(
            torch, logp, entropy, grid["old"], ref, grid["advantages"], grid["response_mask"], cfg
        )
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for p in self.model.parameters() if p.requires_grad], 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())


class JaxSide:
    """The project's step (``make_train_step``) with the reference pass (``make_logprob_fn`` on the base)."""

    def __init__(self, model_dir: str, lora: LoRAConfig):
        model, self.config = load_pretrained(model_dir)
        self.plain_def, self.base_state = nnx.split(model)
        add_lora(model, lora, nnx.Rngs(1))
        self.adapters = adapter_tensors(model)
        self.graphdef, self.params, self.base = nnx.split(model, LoRAParam, ...)
        self.optimizer = make_optimizer(LR)
        self.ref_fn = make_logprob_fn(self.plain_def)
        self.steps: dict[str, object] = {}

    def logprobs(self, grid: dict[str, np.ndarray]) -> np.ndarray:
        return np.asarray(self.ref_fn(self.base_state, {k: jnp.asarray(v) for k, v in grid.items()}))

    def reset(self, cfg: LossConfig) -> None:
        self.cfg = cfg
        if cfg.kl_type not in self.steps:
            self.steps[cfg.kl_type] = make_train_step(self.graphdef, self.optimizer, cfg)
        self.step_fn = self.steps[cfg.kl_type]
        self.state = TrainState.create(jax.tree.map(jnp.copy, self.params), self.optimizer, jax.random.key(0))

    def step(self, grid: dict[str, np.ndarray], pack: bool) -> float:
        """One update on the trainer's grid, or packed; with KL the base's log-probs first."""
        batch = pack_segments(grid)[0] if pack else grid
        batch = {k: jnp.asarray(v) for k, v in batch.items()}
        if self.cfg.kl_type != "none":
            model_keys = ("input_ids", "attention_mask", "positions", "target_index")
            batch["ref_logprobs"] = self.ref_fn(self.base_state, {k: batch[k] for k in model_keys})
        self.state, metrics = self.step_fn(self.state, batch, self.base)
        return float(metrics["loss"])


def tiny_model_dir(tmp: str) -> str:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    Qwen2ForCausalLM(Qwen2Config(**TINY)).save_pretrained(tmp)
    return tmp


def default_model_dir() -> str:
    from roleagent_jax.models import smollm2

    found = smollm2.cached()
    if found is None:
        raise SystemExit(
            f"SmolLM2 is not cached in {smollm2.model_dir()}: run python -m roleagent_jax.models.smollm2, "
            "or give --model DIR or --tiny"
        )
    return str(found[1])


def run(args, model_dir: str) -> dict:
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    lora = LoRAConfig(rank=args.rank, alpha=args.alpha, layers=args.top)
    jside = JaxSide(model_dir, lora)
    layers = jside.config.num_hidden_layers
    tside = TorchSide(model_dir, lora, layers, jside.adapters)
    vocab = jside.config.vocab_size
    if args.rows_file:
        rows = read_rows(args.rows_file)[: args.rows]
    elif args.tiny:
        rows = synthetic_rows(args.rows, vocab, prompt=(10, 40), response=(1, 8))
    else:
        rows = synthetic_rows(args.rows, vocab)
    pad = 0
    grid = pack_rows([p for p, _ in rows], [r for _, r in rows], pad)
    rng = np.random.default_rng(0)
    advantages = rng.normal(size=len(rows)).astype(np.float32)
    model_keys = ("input_ids", "attention_mask", "positions", "target_index")
    base_lp = jside.logprobs({k: grid[k] for k in model_keys})
    mask = grid["loss_mask"] > 0
    old = [
        base_lp[i][mask[i]] + rng.normal(0, 0.1, mask[i].sum()).astype(np.float32) for i in range(len(rows))
    ]
    grid.update(advantages=advantages, old_logprobs=on_grid(old, grid["loss_mask"]))
    tgrid = trl_grid(rows, pad)
    tgrid["old"] = on_grid(old, tgrid["response_mask"])
    tgrid["advantages"] = advantages
    tgrid = {k: torch.tensor(v) for k, v in tgrid.items()}
    packed = pack_segments(grid)[0]
    record = {
        "bench": "update_torch",
        "model": "tiny-random" if args.tiny else model_dir,
        "rows": len(rows),
        "real_tokens": int(grid["attention_mask"].sum()),
        "response_tokens": int(grid["loss_mask"].sum()),
        "lora": {"rank": lora.rank, "alpha": lora.alpha, "top_layers": lora.layers, "layers": layers},
        "grid": list(grid["input_ids"].shape),
        "packed_grid": list(packed["input_ids"].shape),
        "padded_share": {
            "grid": round(padded_share(grid), 4),
            "packed": round(padded_share(packed), 4),
            "trl": round(1 - float(tgrid["attention_mask"].float().mean()), 4),
        },
        "rounds": args.rounds,
    }
    sides = ("jax", "jax_packed", "torch")
    for name, cfg in (("no_kl", LossConfig(kl_type="none")), ("kl", LossConfig(kl_type="low_var_kl"))):
        first, compile_s = {}, {}
        for side in sides:  # the first step of each from the same adapters: the losses must agree
            start = time.perf_counter()
            if side == "torch":
                tside.reset()
                first[side] = tside.step(tgrid, cfg)
            else:
                jside.reset(cfg)
                first[side] = jside.step(grid, pack=side == "jax_packed")
            compile_s[side] = time.perf_counter() - start
        for side in sides[1:]:
            if not np.isclose(first[side], first["jax"], rtol=1e-3, atol=1e-4):
                raise AssertionError(f"{name}: first-step loss {side} {first[side]} != jax {first['jax']}")
        jside.reset(cfg)  # both programs compiled; the timed rounds start from fresh adapters
        tside.reset()
        times = {side: [] for side in sides}
        for _ in range(args.rounds):
            for side in sides:
                start = time.perf_counter()
                if side == "torch":
                    tside.step(tgrid, cfg)
                else:
                    jside.step(grid, pack=side == "jax_packed")
                times[side].append(time.perf_counter() - start)
        per_row = {side: float(np.median(t)) / len(rows) for side, t in times.items()}
        record[name] = {
            "s_per_row": {side: round(v, 5) for side, v in per_row.items()},
            "torch_over_jax": round(float(np.median(np.divide(times["torch"], times["jax"]))), 3),
            "torch_over_jax_packed": round(
                float(np.median(np.divide(times["torch"], times["jax_packed"]))), 3
            ),
            "first_loss": {side: round(v, 6) for side, v in first.items()},
            "first_step_s": {side: round(v, 2) for side, v in compile_s.items()},
        }
        print(
            f"{name:6s} s/row " + "  ".join(f"{s} {per_row[s]:.4f}" for s in sides)
            + f"  torch/jax x{record[name]['torch_over_jax']}  torch/packed x{record[name]['torch_over_jax_packed']}"
            f"  first losses {first}",
            flush=True,
        )  # fmt: skip
    return record


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a Hugging Face Llama / Qwen2 directory")
    parser.add_argument("--tiny", action="store_true", help="a tiny random Qwen2 and short rows")
    parser.add_argument("--rows", type=int, default=8, help="rows per step")
    parser.add_argument("--rows-file", default=None, help="JSON lines with prompt_ids and response_ids")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--alpha", type=float, default=CONFIG.default("lora.alpha"))
    parser.add_argument("--top", type=int, default=8, help="adapters on the top TOP layers (0: every layer)")
    args = parser.parse_args(argv)
    if args.rows < 1 or args.rounds < 1 or args.rank < 1:
        parser.error("--rows, --rounds and --rank must be >= 1")
    if args.tiny:
        args.top = min(args.top, TINY["num_hidden_layers"] // 2)
        with tempfile.TemporaryDirectory() as tmp:
            record = run(args, tiny_model_dir(tmp))
    else:
        record = run(args, args.model or default_model_dir())
    print_json(record)
    return record


if __name__ == "__main__":
    main()
