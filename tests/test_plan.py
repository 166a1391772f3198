"""The memory planner counts what the real state holds: parameters and optimizer state (global and per
device on a real sharded mesh), the KV cache, and the published Qwen2.5 parameter counts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from conftest import load_config
from flax import nnx
from qwen2_tiny import tiny_config

from roleagent_jax.models import BUILTIN_MODELS, Qwen2Config, Qwen2ForCausalLM, init_cache
from roleagent_jax.models.qwen2 import cache_sharding
from roleagent_jax.parallel.sharding import make_mesh, shard_model
from roleagent_jax.planner import advice, cli, memory, workload

REPO = Path(__file__).resolve().parents[1]
OPT = dict(lr=1e-6, weight_decay=0.01, grad_clip=1.0, warmup_steps=0, schedule="constant", total_steps=10)


def tiny(tie: bool = False, param_dtype: str = "float32") -> Qwen2Config:
    # 6 query heads / 3 KV heads / vocab 100: some dims do not divide tensor=2 or fsdp=4 (replicated).
    return tiny_config(
        vocab_size=100,
        hidden_size=48,
        num_attention_heads=6,
        num_key_value_heads=3,
        tie_word_embeddings=tie,
        param_dtype=param_dtype,
        dtype="bfloat16",
    )


def nbytes(tree) -> int:
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))


def device0_bytes(tree) -> int:
    """What device 0 really holds of a tree of sharded arrays."""
    dev = jax.devices()[0]
    total = 0
    for x in jax.tree.leaves(tree):
        total += sum(s.data.nbytes for s in x.addressable_shards if s.device == dev)
    return total


@pytest.mark.parametrize("tie,pdt", [(False, "float32"), (True, "bfloat16")])
def test_param_and_optimizer_bytes_equal_real_state(tie, pdt):
    from roleagent_jax.rl.optimizer import make_optimizer

    cfg = tiny(tie, pdt)
    params = nnx.state(Qwen2ForCausalLM(cfg, rngs=nnx.Rngs(0)))
    opt_state = make_optimizer(**OPT).init(params)
    abstract = memory.abstract_params(cfg)
    assert memory.tree_bytes(abstract) == nbytes(params)
    assert memory.tree_bytes(memory.abstract_opt_state(abstract, OPT)) == nbytes(opt_state)


@pytest.mark.parametrize("mesh_sizes", [(1, 4, 2), (2, 4, 1), (1, 8, 1)])
def test_per_device_bytes_equal_real_sharded_state(mesh_sizes):
    from roleagent_jax.rl.optimizer import TrainState, make_optimizer

    data, fsdp, tensor = mesh_sizes
    mesh = make_mesh(data, fsdp, tensor)
    cfg = tiny()
    model = shard_model(Qwen2ForCausalLM(cfg, rngs=nnx.Rngs(0)), mesh)
    params = nnx.state(model)
    state = TrainState.create(params, make_optimizer(**OPT), jax.random.PRNGKey(0), mesh=mesh)
    amesh = workload.abstract_mesh({"data": data, "fsdp": fsdp, "tensor": tensor})
    abstract = memory.abstract_params(cfg)
    assert memory.device_bytes(abstract, amesh) == device0_bytes(state.params)
    opt_abs = memory.abstract_opt_state(abstract, OPT)
    assert memory.device_bytes(opt_abs, amesh, params=abstract) == device0_bytes(state.opt_state)
    # Sharding really divided something (the test would be weak if everything were replicated).
    assert device0_bytes(state.params) < nbytes(state.params)


def test_kv_cache_bytes_equal_real_sharded_cache():
    mesh = make_mesh(1, 4, 2)
    cfg = tiny_config(vocab_size=100, hidden_size=48, dtype="bfloat16")
    cache = jax.device_put(init_cache(cfg, 16, 40), cache_sharding(mesh, cfg))
    total, dev = memory.kv_cache_bytes(cfg, 16, 40, dict(mesh.shape))
    assert total == nbytes(cache)
    assert dev == device0_bytes(cache)


@pytest.mark.parametrize("name,published", [("0.5b", 494_032_768), ("7b", 7_615_616_512)])
def test_builtin_qwen25_counts_match_transformers(name, published):
    """Built-in configs give the released models' sizes, counted independently by transformers (meta)."""
    import torch
    import transformers

    hf = BUILTIN_MODELS[name]
    fields = {k: v for k, v in hf.items() if k not in ("architectures", "model_type")}
    with torch.device("meta"):
        ref = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**fields))
    n_ref = sum(p.numel() for p in ref.parameters())  # tied weights are one parameter
    config = load_config("alfworld")
    cfg, _ = advice.model_config(name, config)
    abstract = memory.abstract_params(cfg)
    n_ours = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(abstract))
    assert n_ours == n_ref == published
    assert (
        memory.tree_bytes(abstract) == 2 * published
    )  # pretrained weights load in config.model.dtype = bf16


def test_optimizer_bytes_for_0_5b_extrapolate_from_a_real_bf16_state():
    """Adam's per-parameter bytes (whatever dtypes optax picks for each moment) measured on a real tiny
    bf16 state, times the 0.5B parameter count, plus the fixed scalars, is the planner's number."""
    from roleagent_jax.rl.optimizer import make_optimizer

    optimizer = make_optimizer(**OPT)
    scalars = nbytes(optimizer.init({}))
    small = nnx.state(Qwen2ForCausalLM(tiny(param_dtype="bfloat16"), rngs=nnx.Rngs(0)))
    n_small = sum(x.size for x in jax.tree.leaves(small))
    per_param = (nbytes(optimizer.init(small)) - scalars) / n_small
    cfg, _ = advice.model_config("0.5b", load_config("alfworld"))
    opt = memory.abstract_opt_state(memory.abstract_params(cfg), OPT)
    assert memory.tree_bytes(opt) == scalars + per_param * 494_032_768


def test_activation_estimate_behaves():
    cfg, _ = advice.model_config("1.5b", load_config("alfworld"))
    sizes = {"data": 1, "fsdp": 8, "tensor": 1}
    on = memory.activation_bytes(cfg, 16, 2560, sizes, remat=True)
    off = memory.activation_bytes(cfg, 16, 2560, sizes, remat=False)
    assert on["layers"] < off["layers"] / 4
    assert off["layers"] == cfg.num_hidden_layers * off["one_layer"]
    double = memory.activation_bytes(cfg, 32, 2560, sizes, remat=False)
    assert double["layers"] == 2 * off["layers"]
    split = memory.activation_bytes(cfg, 16, 2560, dict(sizes, tensor=2), remat=False)
    assert split["logits"] * 2 == off["logits"] and split["layers"] < off["layers"]
    # The head at 512 response tokens a row, a backward pass through the top 7 layers only.
    top = memory.activation_bytes(cfg, 16, 2560, sizes, remat=False, targets=512, backward_layers=7)
    assert top["layers"] == 7 * off["one_layer"] and top["logits"] * 5 == off["logits"]


def test_plan_1_5b_fits_v4_and_7b_gets_checked_advice():
    config = load_config("alfworld")
    small = advice.plan_from_config(config, "1.5b", "data:1,fsdp:8,tensor:1", chip="v4")
    assert small.fits and not small.advice
    big = advice.plan_from_config(config, "7b", "data:1,fsdp:8,tensor:1", chip="v5e")
    assert not big.fits and big.advice
    # On 16 GiB chips 7B training needs more chips; the advised mesh was re-planned and fits.
    assert any("--mesh=data:1,fsdp:16,tensor:1" in a for a in big.advice), big.advice
    assert big.params_total == 7_615_616_512
    assert big.phases["persistent"] < big.phases["train"] <= big.peak


def test_parse_mesh_and_bad_input():
    assert workload.parse_mesh("data:2,fsdp:4") == {"data": 2, "fsdp": 4, "tensor": 1}
    for bad in ("data=2", "pipe:2", "fsdp:0", "fsdp:x"):
        with pytest.raises(ValueError, match="bad mesh"):
            workload.parse_mesh(bad)
    with pytest.raises(FileNotFoundError, match="config.json"):
        advice.model_config("/nonexistent/dir", load_config("alfworld"))
    with pytest.raises(ValueError, match="unknown chip"):
        advice.plan_from_config(load_config("alfworld"), "0.5b", chip="tpu9")


def test_cli_prints_table_and_json_last_line():
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "roleagent_jax.plan",
            "--config=configs/alfworld.py",
            "--mesh=data:1,fsdp:4,tensor:2",
            "--model=0.5b",
            "--micro-batch-rows",
            "8",
            "--hbm-gb",
            "16",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["params"] == 494_032_768
    assert summary["mesh"] == {"data": 1, "fsdp": 4, "tensor": 2}
    assert summary["workload"]["micro_batch_rows"] == 8 and summary["hbm_gb"] == 16
    assert "| parameters" in out and "per device GiB" in out


def test_xla_arguments_equal_planned_state_plus_batch():
    """The compiled train step's per-device inputs are the planned params + optimizer state shards plus
    the batch rows of one device (scalars: step, key): XLA agrees with device_bytes."""
    import dataclasses

    config = load_config("demo")
    config.loss.kl_type, config.loss.kl_coef = "none", 0.0  # KL off: the batch has no reference log-probs
    cfg, sizes = tiny(), {"data": 1, "fsdp": 4, "tensor": 2}
    work = dataclasses.replace(
        workload.Workload.from_config(config), mini_batch_rows=16, micro_batch_rows=8, seq_len=64
    )
    xla = advice.xla_train_memory(cfg, sizes, work, advice.loss_settings(config))
    amesh = workload.abstract_mesh(sizes)
    params = memory.abstract_params(cfg)
    state = memory.device_bytes(params, amesh) + memory.device_bytes(
        memory.abstract_opt_state(params, work.optimizer), amesh, params=params
    )
    rows = 16 // 4
    # ids, mask, positions, loss mask, old log-probs; advantages; the response columns
    batch = rows * 64 * 4 * 5 + rows * 4 + rows * min(work.target_len, 64) * 4
    assert abs(xla["argument"] - (state + batch)) <= 16  # step and RNG key
    assert xla["temp"] > 0 and xla["total"] >= xla["argument"]
    with pytest.raises(ValueError, match="devices"):
        advice.xla_train_memory(cfg, {"data": 1, "fsdp": 2, "tensor": 1}, work, advice.loss_settings(config))


@pytest.mark.parametrize("model,mesh", [("1.5b", "data:1,fsdp:8,tensor:1"), ("7b", "data:1,fsdp:4,tensor:2")])
def test_docs_tables_are_current(model, mesh):
    """docs/scaling.md shows the planner's output verbatim; regenerate it when configs or code change:
    python -m roleagent_jax.plan --config=configs/alfworld.py --mesh=MESH --model=MODEL --chip=v4"""
    table = cli.format_table(advice.plan_from_config(load_config("alfworld"), model, mesh, chip="v4"))
    doc = (REPO / "docs" / "scaling.md").read_text()
    assert table in doc, f"docs/scaling.md is out of date for --model={model} --mesh={mesh}"


def test_rows_per_call_advice_is_a_config_knob_that_fits():
    """The advised --config.rollout.max_rows_per_call, set in the config, gives a plan whose rollout fits."""
    config = load_config("alfworld")
    big = advice.plan_from_config(config, "7b", "data:1,fsdp:8,tensor:1", chip="v4")
    advised = [a for a in big.advice if "max_rows_per_call=" in a]
    assert advised, big.advice
    rows = int(advised[0].split("max_rows_per_call=")[1].split(")")[0])
    config.rollout.max_rows_per_call = rows
    capped = advice.plan_from_config(config, "7b", "data:1,fsdp:8,tensor:1", chip="v4")
    assert capped.phases["rollout"] < big.phases["rollout"]
    assert f"{rows} rows x" in cli.format_table(capped)
    assert capped.fits, capped.advice


def search_qa_config():
    """The paper's search-QA shape: 256 questions x 5 rollouts; 4096-token prompts (retrieved passages
    over up to four turns) and 512-token responses are this project's assumption."""
    config = load_config("alfworld")
    config.rollout.tasks_per_iter, config.rollout.group_size = 256, 5
    config.rollout.max_prompt_tokens, config.rollout.max_response_tokens = 4096, 512
    return config


def test_shared_prefix_plan_stores_one_prefix_per_group():
    """A group's identical first prompts (all but one token shared): the KV cache is one 2048-slot
    prefix per sharing group (16 agent + 16 predictor groups of 8) plus 64 + 512 own slots per row,
    counted here from the model's shapes alone; prefill and the rollout peak shrink with it."""
    config = load_config("alfworld")
    mesh = "data:1,fsdp:8,tensor:1"
    plain = advice.plan_from_config(config, "1.5b", mesh, chip="v4")
    shared = advice.plan_from_config(config, "1.5b", mesh, chip="v4", shared_prefix=2047)
    cfg, _ = advice.model_config("1.5b", config)
    per_slot = cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * cfg.head_dim * 2  # K and V, bf16
    kv = {name: dev for name, _, dev, _ in shared.rows}["KV cache (rollout)"]
    assert kv == per_slot * (32 * 2048 + 256 * (64 + 512)) // 8
    assert {name: dev for name, _, dev, _ in plain.rows}["KV cache (rollout)"] == per_slot * 256 * 2560 // 8
    for phase in ("persistent", "logprob", "train"):
        assert shared.phases[phase] == plain.phases[phase]
    assert shared.phases["rollout"] < plain.phases["rollout"] / 4
    # Half the prompt shared: the rows keep 1024 + 512 slots each; a 16-token head does not pay.
    half = advice.plan_from_config(config, "1.5b", mesh, chip="v4", shared_prefix=1024)
    assert {name: dev for name, _, dev, _ in half.rows}["KV cache (rollout)"] == per_slot * (
        32 * 1024 + 256 * (1024 + 512)
    ) // 8
    short = advice.plan_from_config(config, "1.5b", mesh, chip="v4", shared_prefix=16)
    assert short.rows == plain.rows and short.peak == plain.peak
    with pytest.raises(ValueError, match="shared prefix tokens"):
        advice.plan_from_config(config, "1.5b", mesh, chip="v4", shared_prefix=2048)


def test_shared_prefix_groups_of_five_fill_grid_groups_of_five():
    """Search-QA's groups of 5: calls take whole groups (51 of them in 256 rows) and the grid is
    5 rows per group, 56 groups (a multiple of the 8 batch shards)."""
    work = workload.Workload.from_config(search_qa_config(), shared_prefix=4095)
    layout = memory.rollout_layout(work, {"data": 1, "fsdp": 8, "tensor": 1})
    assert (layout.groups, layout.rows_per_group, layout.prefix_bucket, layout.suffix_bucket) == (
        56,
        5,
        4096,
        64,
    )
    assert int((layout.slots >= 0).sum()) == 255 and int((layout.prefix_len == 4095).sum()) == 51


SHARED_DOCS = [
    ("alfworld", "1.5b", "data:1,fsdp:8,tensor:1", "v4", 2047),
    ("search_qa", "7b", "data:1,fsdp:8,tensor:1", "h100", 0),
    ("search_qa", "7b", "data:1,fsdp:8,tensor:1", "h100", 4095),
]


@pytest.mark.parametrize("shape,model,mesh,chip,shared", SHARED_DOCS)
def test_docs_shared_prefix_tables_are_current(shape, model, mesh, chip, shared):
    """docs/scaling.md's shared-prefix section shows these plans verbatim (commands in the doc)."""
    config = load_config("alfworld") if shape == "alfworld" else search_qa_config()
    table = cli.format_table(advice.plan_from_config(config, model, mesh, chip=chip, shared_prefix=shared))
    doc = (REPO / "docs" / "scaling.md").read_text()
    assert table in doc, f"docs/scaling.md is out of date for {shape} --shared-prefix-tokens={shared}"


@pytest.mark.slow
def test_docs_shared_prefix_summary_is_current():
    """The per-device summary rows of docs/scaling.md's shared-prefix section (12 plans: slow)."""
    doc = (REPO / "docs" / "scaling.md").read_text()
    shapes = [
        ("ALFWorld 16 x 8 (+128 predictor rows), 1.5B, fsdp:8 (v4)", load_config("alfworld"), "1.5b", "v4"),
        ("ALFWorld 16 x 8 (+128 predictor rows), 7B, fsdp:8 (v4)", load_config("alfworld"), "7b", "v4"),
        ("search-QA 256 x 5 (+5 predictor rows each), 7B, fsdp:8 (h100)", search_qa_config(), "7b", "h100"),
    ]
    for label, config, model, chip in shapes:
        prompt = config.rollout.max_prompt_tokens
        for n in (0, 256, prompt // 2, prompt - 1):
            p = advice.plan_from_config(config, model, "data:1,fsdp:8,tensor:1", chip=chip, shared_prefix=n)
            dev = {name: d for name, _, d, _ in p.rows}
            row = (
                f"| {label} | {n} | {dev['KV cache (rollout)'] / workload.GIB:.2f} | "
                f"{dev['prefill transient'] / workload.GIB:.2f} | {p.phases['rollout'] / workload.GIB:.2f} |"
            )
            assert row in doc, row
