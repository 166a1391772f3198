"""Hugging Face checkpoints: transformers Qwen2 -> load_pretrained parity, save_pretrained -> transformers,
sharded (indexed) checkpoints, and clear errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
from flax import nnx
from qwen2_tiny import forward, left_padded_batch, max_diff_on_real, torch_logits, torch_qwen2

from roleagent_jax.models import Qwen2Config, load_pretrained, save_pretrained


@pytest.mark.parametrize("tie,kv_heads", [(False, 4), (False, 2), (True, 2), (True, 4)])
def test_load_matches_transformers_on_left_padded_batch(tmp_path, tie, kv_heads):
    torch_model = torch_qwen2(tie=tie, kv_heads=kv_heads)
    torch_model.save_pretrained(tmp_path)
    model, cfg = load_pretrained(tmp_path, attention_chunk=4)
    assert cfg.tie_word_embeddings == tie and cfg.num_key_value_heads == kv_heads
    assert (model.lm_head is None) == tie
    ids, mask, pos = left_padded_batch()
    ref = torch_logits(torch_model, ids, mask, pos)
    assert max_diff_on_real(forward(model, ids, mask), ref, mask) <= 1e-4


def test_sharded_checkpoint_with_index(tmp_path):
    torch_model = torch_qwen2(tie=False, kv_heads=2, seed=1)
    torch_model.save_pretrained(tmp_path, max_shard_size="20KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert len(list(tmp_path.glob("model-*.safetensors"))) > 2
    ids, mask, pos = left_padded_batch(seed=3)
    ref = torch_logits(torch_model, ids, mask, pos)
    for scan in (False, True):
        model, _ = load_pretrained(tmp_path, scan_layers=scan)
        assert max_diff_on_real(forward(model, ids, mask), ref, mask) <= 1e-4


@pytest.mark.parametrize("tie,scan", [(False, False), (True, True)])
def test_save_pretrained_reloads_in_transformers(tmp_path, tie, scan):
    from transformers import AutoModelForCausalLM

    torch_qwen2(tie=tie, kv_heads=2, seed=2).save_pretrained(tmp_path / "src")
    model, _ = load_pretrained(tmp_path / "src", scan_layers=scan)
    save_pretrained(model, tmp_path / "out")
    saved = json.loads((tmp_path / "out" / "config.json").read_text())
    assert saved["architectures"] == ["Qwen2ForCausalLM"] and saved["model_type"] == "qwen2"
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval().float()
    ids, mask, pos = left_padded_batch(seed=4)
    assert max_diff_on_real(forward(model, ids, mask), torch_logits(reloaded, ids, mask, pos), mask) <= 1e-4
    again, _ = load_pretrained(tmp_path / "out", scan_layers=scan)
    for (key, a), (_, b) in zip(nnx.to_flat_state(nnx.state(again)), nnx.to_flat_state(nnx.state(model))):
        np.testing.assert_array_equal(np.asarray(a[...]), np.asarray(b[...]), err_msg=str(key))


def test_bfloat16_round_trip(tmp_path):
    torch_qwen2(tie=False, kv_heads=2).save_pretrained(tmp_path / "src")
    model, cfg = load_pretrained(tmp_path / "src", dtype="bfloat16", param_dtype="bfloat16")
    assert cfg.param_dtype == "bfloat16" and model.embed.embedding[...].dtype.name == "bfloat16"
    save_pretrained(model, tmp_path / "bf16")
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["dtype"] == "bfloat16"
    again, cfg2 = load_pretrained(tmp_path / "bf16", param_dtype="bfloat16")
    assert cfg2.param_dtype == "bfloat16" and cfg2.dtype == "float32"  # compute stays fp32 unless asked
    master, cfg3 = load_pretrained(tmp_path / "bf16", dtype="bfloat16")  # default: float32 master weights
    assert cfg3.param_dtype == "float32" and cfg3.dtype == "bfloat16"
    flat = zip(
        nnx.to_flat_state(nnx.state(again)),
        nnx.to_flat_state(nnx.state(model)),
        nnx.to_flat_state(nnx.state(master)),
        strict=True,
    )
    for (key, a), (_, b), (_, m) in flat:
        assert a[...].dtype == b[...].dtype and m[...].dtype == np.float32
        np.testing.assert_array_equal(np.asarray(a[...]), np.asarray(b[...]), err_msg=str(key))
        np.testing.assert_array_equal(np.asarray(m[...]), np.asarray(b[...]).astype(np.float32))


def test_reads_bfloat16_checkpoint_from_transformers(tmp_path):
    import torch

    torch_model = torch_qwen2(tie=False, kv_heads=2).to(torch.bfloat16)
    torch_model.save_pretrained(tmp_path)
    model, cfg = load_pretrained(tmp_path)
    assert cfg.param_dtype == "float32" and cfg.dtype == "float32"  # bf16 values in float32 master weights
    assert model.layers[1].attn.o_proj.kernel[...].dtype == np.float32
    want = (
        torch_model.model.layers[1].self_attn.o_proj.weight.detach().float().numpy()
    )  # [hidden, heads * head_dim]
    got = np.asarray(model.layers[1].attn.o_proj.kernel[...])  # [heads, head_dim, hidden]
    np.testing.assert_array_equal(got.reshape(-1, cfg.hidden_size).T, want)
    ids, mask, pos = left_padded_batch()
    ref = torch_logits(torch_model.float(), ids, mask, pos)  # same bf16-rounded weights, fp32 compute
    assert max_diff_on_real(forward(model, ids, mask), ref, mask) <= 1e-4


def test_missing_directory_and_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_pretrained(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="config"):
        load_pretrained(tmp_path)
    torch_qwen2(tie=False, kv_heads=2).save_pretrained(tmp_path)
    (tmp_path / "model.safetensors").rename(tmp_path / "elsewhere.safetensors")
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        load_pretrained(tmp_path)


def test_wrong_architecture(tmp_path):
    torch_qwen2(tie=False, kv_heads=2).save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg.update(model_type="mistral", architectures=["MistralForCausalLM"])
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="expected a Qwen2 or Llama checkpoint"):
        load_pretrained(tmp_path)
    # relabelled as a Llama (no q/k/v biases), its bias tensors would be dropped silently: refused
    cfg.update(model_type="llama", architectures=["LlamaForCausalLM"])
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"q_proj\.bias .* has no attention bias"):
        load_pretrained(tmp_path)


def test_shape_mismatch_and_missing_tensor(tmp_path):
    torch_qwen2(tie=False, kv_heads=2).save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "intermediate_size": 80}))
    with pytest.raises(
        ValueError, match=r"mlp\.\w+_proj\.weight has shape \(\d+, \d+\) .* implies \((80, 64|64, 80)\)"
    ):
        load_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": 3}))
    with pytest.raises(ValueError, match=r"model.layers.2.* missing"):
        load_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "tie_word_embeddings": False}))
    tied_dir = tmp_path / "tied"
    torch_qwen2(tie=True, kv_heads=2).save_pretrained(tied_dir)
    tied_cfg = json.loads((tied_dir / "config.json").read_text())
    (tied_dir / "config.json").write_text(json.dumps({**tied_cfg, "tie_word_embeddings": False}))
    with pytest.raises(ValueError, match="lm_head.weight is missing"):
        load_pretrained(tied_dir)


def test_config_round_trip_and_overrides():
    cfg = Qwen2Config.from_hf(
        {
            "model_type": "qwen2",
            "vocab_size": 10,
            "hidden_size": 8,
            "intermediate_size": 12,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "rope_parameters": {"rope_type": "default", "rope_theta": 5000.0},
            "eos_token_id": [3, 4],
        },
        remat=True,
    )
    assert cfg.head_dim == 4 and cfg.rope_theta == 5000.0 and cfg.remat and cfg.eos_token_id == (3, 4)
    assert Qwen2Config.from_hf(cfg.to_hf()).replace(remat=True) == cfg
    with pytest.raises(ValueError, match="unknown Qwen2Config fields"):
        Qwen2Config.from_hf(cfg.to_hf(), not_a_field=1)


def _one_adamw_step(model, lr: float):
    """Params before and after one AdamW step on a next-token loss (compute in the model's dtype)."""
    import jax
    import jax.numpy as jnp
    import optax

    from roleagent_jax.rl.optimizer import make_optimizer

    graphdef, params = nnx.split(model)
    ids, mask, _ = left_padded_batch(seed=5)

    def loss(p):
        logits = nnx.merge(graphdef, p)(jnp.asarray(ids), jnp.asarray(mask))
        logp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32))
        picked = jnp.take_along_axis(logp, jnp.asarray(ids)[:, 1:, None], axis=-1)[..., 0]
        return -(picked * mask[:, 1:]).sum() / mask[:, 1:].sum()

    opt = make_optimizer(lr, weight_decay=0.0)

    @jax.jit
    def step(p):
        updates, _ = opt.update(jax.grad(loss)(p), opt.init(p), p)
        return optax.apply_updates(p, updates)

    return params, step(params)


def test_bf16_checkpoint_trains_in_float32_master_weights_at_lr_1e6(tmp_path):
    """A bf16-saved checkpoint loads into float32 parameters (bf16 compute), and one AdamW step at the
    paper's lr 1e-6 moves weights of magnitude ~0.02; kept in bfloat16 those weights would not move."""
    import torch

    torch_qwen2(tie=False, kv_heads=2, layers=1).to(torch.bfloat16).save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["dtype"] == "bfloat16"

    def moved_share(param_dtype):  # None: load_pretrained's default
        kwargs = {} if param_dtype is None else {"param_dtype": param_dtype}
        model, cfg = load_pretrained(tmp_path, dtype="bfloat16", **kwargs)
        param_dtype = param_dtype or "float32"
        assert cfg.param_dtype == param_dtype and cfg.dtype == "bfloat16"
        before, after = _one_adamw_step(model, 1e-6)
        w0 = np.asarray(before["layers"][0]["mlp"]["up_proj"]["kernel"][...].astype(np.float32))
        w1 = np.asarray(after["layers"][0]["mlp"]["up_proj"]["kernel"][...].astype(np.float32))
        assert str(before["layers"][0]["mlp"]["up_proj"]["kernel"][...].dtype) == param_dtype
        near = (np.abs(w0) > 0.015) & (np.abs(w0) < 0.025)
        assert near.sum() > 100
        return float(np.mean(w0[near] != w1[near]))

    assert moved_share(None) > 0.95
    assert moved_share("bfloat16") < 0.05  # the defect this guards against


@pytest.mark.parametrize("n_in,shape", [(-1, (6, 4)), (0, (3, 4)), (1, (4, 3, 2)), (2, (3, 2, 4))])
def test_block_reads_equal_slices_of_the_whole_tensor(tmp_path, n_in, shape):
    """Each device's block is read from the file on its own; it must equal that block of the full
    tensor in our layout, whichever axes (and parts of an axis group) are cut."""
    import itertools

    from safetensors.numpy import save_file

    from roleagent_jax.models.hf_io import _Checkpoint, _hf_shape, _read_block

    rng = np.random.default_rng(0)
    ours = rng.standard_normal(shape).astype(np.float32)
    if n_in < 0:
        hf = ours
    elif n_in == 0:
        hf = ours.reshape(-1)
    else:
        hf = np.ascontiguousarray(ours.reshape(int(np.prod(shape[:n_in])), -1).T)
    assert hf.shape == _hf_shape(shape, n_in)
    save_file({"t": hf}, tmp_path / "model.safetensors")
    ckpt = _Checkpoint(tmp_path)
    cuts = [[slice(None), slice(0, 1), slice(1, d)] if d > 1 else [slice(None)] for d in shape]
    for index in itertools.product(*cuts):
        np.testing.assert_array_equal(
            _read_block(ckpt, "t", shape, n_in, index), ours[index], err_msg=str(index)
        )


def test_large_models_are_written_as_shards_and_a_later_save_leaves_no_stale_file(tmp_path, monkeypatch):
    import torch
    from transformers import AutoModelForCausalLM

    from roleagent_jax.models import hf_io

    torch_model = torch_qwen2(tie=False, kv_heads=2, seed=3)
    torch_model.save_pretrained(tmp_path / "src")
    model, _ = load_pretrained(tmp_path / "src")
    monkeypatch.setattr(hf_io, "MAX_SHARD_BYTES", 40_000)
    save_pretrained(model, tmp_path / "out")
    shards = sorted(p.name for p in (tmp_path / "out").glob("model*.safetensors"))
    assert len(shards) > 2 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    index = json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())
    assert sorted(set(index["weight_map"].values())) == shards
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval().float()
    for name, p in torch_model.named_parameters():
        torch.testing.assert_close(dict(reloaded.named_parameters())[name], p, rtol=0, atol=0)
    monkeypatch.setattr(hf_io, "MAX_SHARD_BYTES", 2**30)
    save_pretrained(model, tmp_path / "out")  # now one file: the shards and their index must go
    assert sorted(p.name for p in (tmp_path / "out").iterdir() if "safetensors" in p.name) == [
        "model.safetensors"
    ]
    again, _ = load_pretrained(tmp_path / "out")
    ids, mask, _ = left_padded_batch(seed=6)
    np.testing.assert_array_equal(
        np.asarray(forward(again, ids, mask)), np.asarray(forward(model, ids, mask))
    )
