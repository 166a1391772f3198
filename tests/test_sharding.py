"""Mesh, partition rules and sharded execution on the fake 8-device CPU mesh (tests/conftest.py)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from qwen2_tiny import forward, left_padded_batch, max_diff_on_real, tiny_config, torch_qwen2

from roleagent_jax.models import KVCache, Qwen2ForCausalLM, init_cache, load_pretrained
from roleagent_jax.models.qwen2 import cache_sharding
from roleagent_jax.parallel import sharding

needs_8 = pytest.mark.skipif(
    jax.device_count() < 8, reason="needs 8 (fake) devices: run under tests/conftest.py"
)


@needs_8
def test_make_mesh_fills_and_validates():
    mesh = sharding.make_mesh(data=2, fsdp=-1, tensor=2)
    assert mesh.axis_names == sharding.AXES and dict(mesh.shape) == {"data": 2, "fsdp": 2, "tensor": 2}
    assert dict(sharding.make_mesh().shape) == {"data": 1, "fsdp": 8, "tensor": 1}
    assert dict(sharding.make_mesh(data=-1, fsdp=1, devices=jax.devices()[:4]).shape)["data"] == 4
    with pytest.raises(ValueError, match="needs 12 devices"):
        sharding.make_mesh(data=3, fsdp=2, tensor=2)
    with pytest.raises(ValueError, match="at most one"):
        sharding.make_mesh(data=-1, fsdp=-1)


@needs_8
def test_rules_cover_every_param_and_fall_back_to_replication():
    mesh = sharding.make_mesh(data=2, fsdp=2, tensor=2)
    cfg = tiny_config(vocab_size=127, num_key_value_heads=1)
    abstract = nnx.eval_shape(lambda: Qwen2ForCausalLM(cfg, rngs=nnx.Rngs(0)))
    specs = {
        "/".join(map(str, k)): v.get_value()
        for k, v in nnx.to_flat_state(sharding.param_specs(abstract, mesh=mesh))
    }
    assert specs["embed/embedding"] == P(None, "fsdp")  # odd vocab: replicated over tensor
    assert specs["lm_head/kernel"] == P("fsdp", None)
    assert specs["layers/0/attn/q_proj/kernel"] == P("fsdp", "tensor", None)
    assert specs["layers/1/attn/k_proj/kernel"] == P("fsdp", None, None)  # one KV head
    assert specs["layers/0/attn/q_proj/bias"] == P("tensor", None)
    assert specs["layers/0/attn/o_proj/kernel"] == P("tensor", None, "fsdp")
    assert specs["layers/0/mlp/up_proj/kernel"] == P("fsdp", "tensor")
    assert specs["layers/0/mlp/down_proj/kernel"] == P("tensor", "fsdp")
    assert specs["final_norm/scale"] == P(None)
    # Without a mesh the rules are returned as written; stacked layers get a leading layer dim.
    stacked = nnx.eval_shape(lambda: Qwen2ForCausalLM(cfg.replace(scan_layers=True), rngs=nnx.Rngs(0)))
    raw = {"/".join(map(str, k)): v.get_value() for k, v in nnx.to_flat_state(sharding.param_specs(stacked))}
    assert raw["embed/embedding"] == P("tensor", "fsdp")
    assert raw["layers/mlp/down_proj/kernel"] == P(None, "tensor", "fsdp")
    with pytest.raises(ValueError, match="no partition rule"):
        sharding.spec_for("mystery/kernel", (4, 4))


@needs_8
@pytest.mark.parametrize("scan_layers", [False, True])
def test_sharded_forward_equals_single_device(tmp_path, scan_layers):
    torch_qwen2(tie=False, kv_heads=2).save_pretrained(tmp_path)
    single, _ = load_pretrained(tmp_path, scan_layers=scan_layers)
    mesh = sharding.make_mesh(data=2, fsdp=2, tensor=2)
    sharded, _ = load_pretrained(tmp_path, mesh=mesh, scan_layers=scan_layers)

    want = sharding.param_shardings(nnx.state(sharded), mesh)
    for (key, var), (_, target) in zip(nnx.to_flat_state(nnx.state(sharded)), nnx.to_flat_state(want)):
        assert var[...].sharding.is_equivalent_to(target.get_value(), var[...].ndim), key
        assert var[...].sharding.spec == target.get_value().spec, key
    q = sharded.layers[0].attn.q_proj.kernel if not scan_layers else sharded.layers.attn.q_proj.kernel
    assert len(q[...].addressable_shards) == 8 and q[...].addressable_shards[0].data.size == q[...].size // 4

    ids, mask, _ = left_padded_batch(lengths=(9, 6, 3, 1, 9, 2, 5, 7))
    graphdef, params = nnx.split(sharded)
    fwd = jax.jit(lambda p, i, m: nnx.merge(graphdef, p)(i, m))
    bs = sharding.batch_sharding(mesh, 2)
    out = fwd(params, jax.device_put(ids, bs), jax.device_put(mask, bs))
    assert max_diff_on_real(out, forward(single, ids, mask), mask) <= 1e-5

    # The KV-cache step runs with the cache on its sharding and keeps it there.
    cfg = sharded.config
    cache = jax.device_put(init_cache(cfg, 8, 12), cache_sharding(mesh, cfg))
    step = jax.jit(
        lambda p, t, pos, c, w, m: nnx.merge(graphdef, p).decode(t, pos, c, w, m),
        out_shardings=(None, cache_sharding(mesh, cfg)),
        donate_argnums=(3,),
    )
    kv_mask = np.zeros((8, 12), bool)
    kv_mask[:, :9] = mask.astype(bool)
    pos = np.maximum(np.cumsum(mask, -1) - 1, 0)
    logits, cache = step(params, ids, pos, cache, jnp.int32(0), kv_mask)
    per_layer = P(("data", "fsdp"), "tensor", None, None)
    assert isinstance(cache, KVCache)
    if scan_layers:
        assert cache.k.sharding.spec == P(None, *per_layer)
    else:
        assert [k.sharding.spec for k in cache.k] == [per_layer] * cfg.num_hidden_layers
    assert max_diff_on_real(logits, forward(single, ids, mask), mask) <= 1e-5


@needs_8
def test_shard_model_and_batch_sharding():
    mesh = sharding.make_mesh(data=2, fsdp=2, tensor=2)
    cfg = tiny_config(num_hidden_layers=1)
    model = sharding.shard_model(Qwen2ForCausalLM(cfg, rngs=nnx.Rngs(0)), mesh)
    assert model.embed.embedding[...].sharding.spec == P("tensor", "fsdp")
    assert sharding.batch_sharding(mesh, 3).spec == P(("data", "fsdp"), None, None)
    assert sharding.BATCH_SPEC == P(("data", "fsdp"))
    assert cache_sharding(mesh, cfg).k[0].spec == P(("data", "fsdp"), "tensor", None, None)
    odd = cfg.replace(num_key_value_heads=1)
    assert cache_sharding(mesh, odd).k[0].spec == P(("data", "fsdp"), None, None, None)
    scanned = cache_sharding(mesh, cfg.replace(scan_layers=True)).k
    assert isinstance(scanned, NamedSharding) and scanned.spec == P(
        None, ("data", "fsdp"), "tensor", None, None
    )


def test_maybe_initialize_distributed_is_noop_single_process(monkeypatch):
    for var in ("JAX_COORDINATOR_ADDRESS", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    calls = []
    monkeypatch.setattr(jax.distributed, "initialize", lambda **kw: calls.append(kw))
    sharding.maybe_initialize_distributed()
    assert calls == []
    monkeypatch.setattr(sharding, "_initialized", False)
    monkeypatch.setattr(jax.distributed, "is_initialized", lambda: False)
    monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "10.0.0.1:1234")
    monkeypatch.setenv("JAX_NUM_PROCESSES", "2")
    monkeypatch.setenv("JAX_PROCESS_ID", "1")
    sharding.maybe_initialize_distributed()
    assert calls == [{"coordinator_address": "10.0.0.1:1234", "num_processes": 2, "process_id": 1}]
