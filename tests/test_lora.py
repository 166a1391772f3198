"""LoRA: a fresh adapter changes nothing, the PEFT export matches PyTorch ``peft`` on the exported base,
the merged export matches both, and only the adapters train."""

from __future__ import annotations

import dataclasses
import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P
from qwen2_tiny import forward, left_padded_batch, max_diff_on_real, tiny_config, torch_logits, torch_qwen2

from roleagent_jax.models import Qwen2Config, Qwen2ForCausalLM, load_pretrained, save_pretrained
from roleagent_jax.models.lora import LoRAConfig, LoRAParam, adapted_layers, add_lora, merged, projections
from roleagent_jax.models.peft_io import save_adapter
from roleagent_jax.parallel.sharding import make_mesh, param_shardings
from roleagent_jax.rl.logprobs import make_logprob_fn
from roleagent_jax.rl.optimizer import TrainState, make_optimizer
from roleagent_jax.rl.ppo import pack_rows
from roleagent_jax.rl.train_step import make_train_step

VOCAB = 128


def randomise_b(model, seed: int = 0) -> None:
    """Non-zero B so that the adapters change the logits (a fresh adapter would not)."""
    rng = np.random.default_rng(seed)
    for _, _, proj in projections(model, ("q", "k", "v", "o", "gate", "up", "down")):
        if proj.lora is not None:
            b = proj.lora.b[...]
            proj.lora.b[...] = jnp.asarray(rng.normal(0, 0.05, b.shape), jnp.float32)


@pytest.mark.parametrize("scan", [False, True])
def test_fresh_adapter_leaves_every_logit_unchanged(scan):
    (plain_def, plain), (graphdef, adapters, base) = lora_model(scan, rank=4)
    ids, mask, _ = left_padded_batch()
    before = np.asarray(forward(nnx.merge(plain_def, plain), ids, mask))
    model = nnx.merge(graphdef, adapters, base)
    assert len(jax.tree.leaves(nnx.state(model, LoRAParam))) == 2 * 7 * (1 if scan else 2)
    np.testing.assert_array_equal(np.asarray(forward(model, ids, mask)), before)


@pytest.mark.parametrize(
    "scan,targets,layers",
    [
        (False, ("q", "k", "v", "o", "gate", "up", "down"), 0),
        (True, ("q", "v", "o", "down"), 0),
        (False, ("q", "k", "v", "o", "gate", "up", "down"), 1),
        (True, ("q", "v", "o", "down"), 1),
    ],
)
def test_peft_adapter_on_the_exported_base_matches_ours(tmp_path, scan, targets, layers):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    torch_qwen2(tie=False, kv_heads=2, seed=3).save_pretrained(tmp_path / "src")
    model, _ = load_pretrained(tmp_path / "src", scan_layers=scan)
    add_lora(model, LoRAConfig(rank=4, alpha=12, targets=targets, layers=layers), nnx.Rngs(2))
    randomise_b(model)
    ids, mask, pos = left_padded_batch(seed=5)
    ours = np.asarray(forward(model, ids, mask))

    save_adapter(model, tmp_path / "adapter", str(tmp_path / "src"))
    save_pretrained(model, tmp_path / "merged")
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["lora_alpha"] == 12 and config["peft_type"] == "LORA"
    assert config["base_model_name_or_path"] == str(tmp_path / "src")
    n = model.config.num_hidden_layers
    assert config["layers_to_transform"] == (list(range(n - layers, n)) if layers else None)

    base = AutoModelForCausalLM.from_pretrained(tmp_path / "src").eval().float()
    peft_model = PeftModel.from_pretrained(base, tmp_path / "adapter").eval()
    theirs = torch_logits(peft_model, ids, mask, pos)
    plain = torch_logits(
        AutoModelForCausalLM.from_pretrained(tmp_path / "src").eval().float(), ids, mask, pos
    )
    assert max_diff_on_real(plain, theirs, mask) > 1e-2  # the adapters matter
    assert max_diff_on_real(ours, theirs, mask) <= 1e-4
    adapted = {
        int(m.group(1)) for k in peft_model.state_dict() if (m := re.search(r"layers\.(\d+)\..*lora_A", k))
    }
    assert adapted == set(range(n - layers if layers else 0, n))

    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval().float()
    assert max_diff_on_real(torch_logits(reloaded, ids, mask, pos), theirs, mask) <= 1e-4
    again, _ = load_pretrained(tmp_path / "merged", scan_layers=scan)
    assert max_diff_on_real(forward(again, ids, mask), ours, mask) <= 1e-4


# -- training --------------------------------------------------------------------------------------


def base_config(scan: bool = False) -> Qwen2Config:
    return tiny_config(scan_layers=scan)


def lora_model(scan: bool = False, dropout: float = 0.0, rank: int = 8):
    """((graphdef, params) of a random model, (graphdef, adapters, base) of it with fresh adapters)."""
    model = Qwen2ForCausalLM(base_config(scan), rngs=nnx.Rngs(0))
    plain = nnx.split(model)
    add_lora(model, LoRAConfig(rank=rank, alpha=16, dropout=dropout), nnx.Rngs(1))
    return plain, nnx.split(model, LoRAParam, ...)


def fixed_batch(n: int = 8):
    rng = np.random.default_rng(0)
    prompts = [rng.integers(1, VOCAB, size=int(rng.integers(2, 10))).tolist() for _ in range(n)]
    responses = [rng.integers(1, VOCAB, size=int(rng.integers(2, 8))).tolist() for _ in range(n)]
    batch = {k: jnp.asarray(v) for k, v in pack_rows(prompts, responses, 0, length_bucket=8).items()}
    batch["advantages"] = jnp.ones((n,), jnp.float32)
    return batch


def response_nll(logprob, adapters, batch, base) -> float:
    lp = np.asarray(logprob(adapters, batch, base))
    mask = np.asarray(batch["loss_mask"])
    return float(-(lp * mask).sum() / mask.sum())


def test_lora_step_trains_only_the_adapters_and_the_loss_falls():
    (plain_def, plain), (graphdef, adapters, base) = lora_model()  # scanned layers: the sharded test
    base_before = jax.tree.map(np.asarray, base)
    logprob = make_logprob_fn(graphdef)
    batch = fixed_batch()
    # The KL reference: the same base with the adapters off (zero), equal to the plain model.
    zeros = jax.tree.map(jnp.zeros_like, adapters)
    plain_lp = make_logprob_fn(plain_def)(plain, batch)
    np.testing.assert_array_equal(np.asarray(logprob(zeros, batch, base)), np.asarray(plain_lp))
    batch["ref_logprobs"] = plain_lp
    optimizer = make_optimizer(1e-2, weight_decay=0.0)
    state = TrainState.create(adapters, optimizer, jax.random.PRNGKey(0))
    moments = [x for x in jax.tree.leaves(state.opt_state) if x.ndim > 0]
    assert sum(x.size for x in moments) == 2 * sum(x.size for x in jax.tree.leaves(adapters))
    step = make_train_step(graphdef, optimizer, {"kl_type": "low_var_kl", "kl_coef": 0.01})
    nll = [response_nll(logprob, state.params, batch, base)]
    losses = []
    for _ in range(6):
        batch["old_logprobs"] = logprob(state.params, batch, base)  # each step on-policy, as an iteration
        state, metrics = step(state, batch, base)
        losses.append(float(metrics["loss"]))
        nll.append(response_nll(logprob, state.params, batch, base))
    assert all(b < a for a, b in zip(nll, nll[1:])), nll
    assert nll[-1] < nll[0] - 0.5, nll
    assert float(metrics["kl_ref"]) > 0
    for a, b in zip(jax.tree.leaves(base_before), jax.tree.leaves(base)):
        np.testing.assert_array_equal(a, np.asarray(b))  # the base never moves


needs_8 = pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (fake) devices (tests/conftest.py)")


@needs_8
def test_sharded_lora_step_with_dropout_equals_single_device():
    _, (graphdef, adapters, base) = lora_model(scan=True, dropout=0.1)
    logprob = make_logprob_fn(graphdef)
    batch = fixed_batch()
    batch["old_logprobs"] = logprob(adapters, batch, base)
    optimizer = optax.sgd(1.0)  # the update is the gradient itself: the comparison sees every entry
    loss_cfg = {"kl_type": "none"}
    single = TrainState.create(adapters, optimizer, jax.random.PRNGKey(0))
    step = make_train_step(graphdef, optimizer, loss_cfg, micro_batches=2)
    mesh = make_mesh(data=2, fsdp=2, tensor=2)
    sharded = TrainState.create(adapters, optimizer, jax.random.PRNGKey(0), mesh=mesh)
    sharded_base = jax.device_put(base, param_shardings(base, mesh))
    sharded_step = make_train_step(graphdef, optimizer, loss_cfg, mesh=mesh, micro_batches=2)
    spec = sharded.params["layers"]["attn"]["q_proj"]["lora"]["b"][...].sharding.spec
    assert spec == P(None, None, "tensor", None)  # [layers, rank, heads, head_dim]: heads over tensor
    single, m1 = step(single, batch, base)
    sharded, m2 = sharded_step(sharded, batch, sharded_base)
    np.testing.assert_allclose(float(m1["loss"]), float(m2["loss"]), rtol=1e-5, atol=1e-6)
    for a, b in zip(jax.tree.leaves(single.params), jax.tree.leaves(sharded.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    # The adapters' dropout is on in the update (a keyed forward differs from the deterministic one).
    model = nnx.merge(graphdef, single.params, base)
    keyed = model(batch["input_ids"], dropout_key=jax.random.PRNGKey(1))
    assert float(jnp.abs(keyed - model(batch["input_ids"])).max()) > 1e-4


def dot_count(jaxpr) -> int:
    """Matmuls a jaxpr runs: its dot_general equations, those inside a scan once per iteration."""
    total = 0
    for eqn in jaxpr.eqns:
        total += eqn.primitive.name == "dot_general"
        times = eqn.params["length"] if eqn.primitive.name == "scan" else 1
        for value in eqn.params.values():
            for sub in value if isinstance(value, tuple | list) else (value,):
                sub = getattr(sub, "jaxpr", sub)
                if hasattr(sub, "eqns"):
                    total += times * dot_count(sub)
    return total


def top_k_model(scan: bool, layers: int, rank: int = 4):
    model = Qwen2ForCausalLM(tiny_config(scan_layers=scan, num_hidden_layers=4), rngs=nnx.Rngs(0))
    add_lora(model, LoRAConfig(rank=rank, layers=layers), nnx.Rngs(1))
    randomise_b(model)
    return model


@pytest.mark.parametrize("scan", [False, True])
def test_no_backward_pass_below_the_lowest_adapted_layer(scan):
    """The step's backward matmuls (its program's matmuls minus the forward's) grow by one block's worth
    per adapted layer and are the head's input gradient plus the adapted blocks' only: nothing runs
    backward through the frozen blocks below."""
    from roleagent_jax.rl.logprobs import model_logprobs

    batch = fixed_batch()
    batch["old_logprobs"] = batch["ref_logprobs"] = jnp.zeros(batch["loss_mask"].shape)
    optimizer = make_optimizer(1e-3)
    backward = {}
    for layers in (1, 2, 4):
        graphdef, adapters, base = nnx.split(top_k_model(scan, layers), LoRAParam, ...)
        step = make_train_step(graphdef, optimizer, {"kl_type": "low_var_kl"})
        state = TrainState.create(adapters, optimizer, jax.random.PRNGKey(0))
        whole = dot_count(jax.make_jaxpr(step._step_fn)(state, batch, base).jaxpr)
        trace = jax.make_jaxpr(model_logprobs, static_argnums=(0, 3))
        forward = dot_count(trace(graphdef, adapters, batch, False, base).jaxpr)
        backward[layers] = whole - forward
    block = backward[2] - backward[1]  # one more adapted block
    assert block > 0 and backward[4] == backward[2] + 2 * block, backward
    # One adapted block: at most a block's backward plus the head's input gradient (the lowest adapted
    # block needs no gradient for its own input); a backward through the 3 frozen blocks would add theirs.
    assert backward[1] <= block + 1, backward


@pytest.mark.parametrize("scan", [False, True])
def test_top_k_adapters_sit_on_the_top_layers_and_train(scan):
    model = top_k_model(scan, layers=2)
    assert adapted_layers(model) == [2, 3]
    ids, mask, _ = left_padded_batch()
    # The merged model runs every block alike (one scan): the split scan computes the same function.
    np.testing.assert_allclose(forward(merged(model), ids, mask), forward(model, ids, mask), atol=1e-5)
    graphdef, adapters, base = nnx.split(model, LoRAParam, ...)
    step = make_train_step(graphdef, optax.sgd(1.0), {"kl_type": "none"})
    batch = fixed_batch()
    batch["old_logprobs"] = make_logprob_fn(graphdef)(adapters, batch, base)
    state, metrics = step(TrainState.create(adapters, optax.sgd(1.0), jax.random.PRNGKey(0)), batch, base)
    moved = [
        float(jnp.abs(a - b).max()) for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(adapters))
    ]
    assert float(metrics["grad_norm"]) > 0 and max(moved) > 0
    with pytest.raises(ValueError, match="lora.layers=5: the model has only 4 layers"):
        top_k_model(scan, layers=5)


# -- configuration and planning --------------------------------------------------------------------


def test_bad_lora_config_names_the_key_and_value():
    from test_config import load

    from roleagent_jax.config import validate

    for key, value, text in (
        ("rank", -1, "--config.lora.rank=-1: must be an integer >= 0"),
        ("alpha", 0.0, "--config.lora.alpha=0.0: must be a number > 0"),
        ("dropout", 1.0, "--config.lora.dropout=1.0: must be a number in [0, 1)"),
        ("targets", ("q", "qkv"), "--config.lora.targets=('q', 'qkv'): must be distinct names among"),
        ("layers", -1, "--config.lora.layers=-1: must be"),
    ):
        c = load("base")
        c.lora[key] = value
        with pytest.raises(ValueError, match=re.escape(text)):
            validate(c)


def test_plan_counts_the_adapters_their_optimizer_state_and_no_reference_copy():
    from test_plan import OPT, load_config, tiny

    from roleagent_jax.planner import memory, workload

    cfg = tiny(param_dtype="bfloat16")
    work = dataclasses.replace(
        workload.Workload.from_config(load_config("alfworld")), optimizer=OPT, lora_rank=8, kl=True
    )
    sizes = {"data": 1, "fsdp": 1, "tensor": 1}
    lora = memory.make_plan(cfg, "tiny", sizes, work, 32)
    full = memory.make_plan(cfg, "tiny", sizes, dataclasses.replace(work, lora_rank=0), 32)
    model = add_lora(Qwen2ForCausalLM(cfg, rngs=nnx.Rngs(0)), LoRAConfig(rank=8), nnx.Rngs(1))
    _, adapters, base = nnx.split(model, LoRAParam, ...)
    real_opt = make_optimizer(**OPT).init(adapters)
    rows = {name: (g, dev) for name, g, dev, _ in lora.rows}
    assert rows["parameters"][0] == nbytes(adapters) + nbytes(base)
    assert rows["optimizer state"][0] == nbytes(real_opt)
    assert rows["reference model"] == (0, 0)
    kernels = [v for k, v in nnx.to_flat_state(base) if str(k[-2]).endswith("_proj") and k[-1] == "kernel"]
    assert rows["sampling copy (LoRA)"][0] == nbytes(kernels)  # every projection has an adapter
    assert lora.phases["persistent"] < full.phases["persistent"] / 2
    # Adapters on the top layer only: its adapters' optimizer state, one layer's activations.
    top = memory.make_plan(cfg, "tiny", sizes, dataclasses.replace(work, lora_layers=1), 32)
    one = add_lora(Qwen2ForCausalLM(cfg, rngs=nnx.Rngs(0)), LoRAConfig(rank=8, layers=1), nnx.Rngs(1))
    top_rows = {name: (g, dev) for name, g, dev, _ in top.rows}
    assert top_rows["optimizer state"][0] == nbytes(make_optimizer(**OPT).init(nnx.state(one, LoRAParam)))
    assert top_rows["optimizer state"][0] < rows["optimizer state"][0]
    assert top_rows["activations (remat off)"][1] < rows["activations (remat off)"][1]


def nbytes(tree) -> int:
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))


@pytest.mark.slow
def test_docs_lora_plan_is_current():
    """docs/scaling.md shows the 7B LoRA plan verbatim; regenerate it when configs or code change:
    python -m roleagent_jax.plan --config=configs/alfworld.py --mesh=data:1,fsdp:8,tensor:1 --model=7b \
    --chip=v4 --lora-rank=16"""
    from test_plan import REPO, load_config

    from roleagent_jax.planner import advice, cli

    config = load_config("alfworld")
    table = cli.format_table(
        advice.plan_from_config(config, "7b", "data:1,fsdp:8,tensor:1", "v4", lora_rank=16)
    )
    assert table in (REPO / "docs" / "scaling.md").read_text()
