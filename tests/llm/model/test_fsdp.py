"""FSDP sharding (llm/model/sharding.py) on a 2-D ``(data, fsdp)`` mesh of 4 forced host devices.

One subprocess (``XLA_FLAGS`` must be set before jax is imported, and this process already
imported it on one device) runs every multi-device check and prints a JSON summary:

* the GRPO update on meshes 1x4, 2x2 and 4x1 (plain data parallel, the default) equals the
  single-device update, compiles once per mesh (the state comes back in the layout it went in)
  and leaves each device with about a quarter of the parameters + AdamW state on 1x4 (bytes
  counted from ``addressable_shards``);
* greedy generation with the sharded state and a sharded batch equals the single-device one;
* an orbax checkpoint saved on 1x4 restores on 2x2 and on one device with equal values, and the
  trainer's phase checkpoint (``llm.training.phase.Checkpoints``) saved on 1x4 resumes on 2x2;
* a Hugging Face folder written by ``save_pretrained`` loads straight into fsdp=4 shards
  (whole tensors are never read: the reader's ``get`` is disabled) and exports back
  byte-identical.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from jax.sharding import PartitionSpec

from llm.model.errors import ModelConfigError as ConfigError
from llm.model import sharding as shd
from tests.support import xla_flags

SCRIPT = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    import jax, jax.numpy as jnp, numpy as np, optax
    from flax import nnx
    assert jax.device_count() == 4, jax.devices()
    from llm.rl import grpo
    from llm.model import hf_io
    from llm.model import sharding as shd
    from llm.model.checkpoint import restore_checkpoint, save_checkpoint
    from llm.generation.decode import GenerationConfig, generate_ids
    from llm.rl.grpo import GRPOLossConfig
    from llm.model.config import Qwen3Config
    from llm.model.qwen3 import Qwen3ForCausalLM
    from llm.rl.batches import GRPOBatch
    from llm.rl.updates import make_grpo_update, trace_counts

    tmp = Path(sys.argv[1])
    # head_dim=6: the q/k norms ([L, 6]) do not divide by fsdp=4 and stay whole
    config = Qwen3Config(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=6, tie_word_embeddings=False)
    model = Qwen3ForCausalLM(config, rngs=nnx.Rngs(0))
    graphdef, state0 = nnx.split(model)
    host0 = jax.device_get(state0)
    devs = jax.devices()
    meshes = {"1x4": shd.make_mesh(config={"data": 1, "fsdp": 4}), "2x2": shd.make_mesh(config={"data": 2, "fsdp": -1}),
              "4x1": shd.make_mesh(config={"data": -1, "fsdp": 1})}  # 4x1: plain data parallel, the default
    one = shd.make_mesh(devs[:1])

    B, P, T = 8, 7, 5
    rng = np.random.RandomState(0)
    pmask = np.arange(P)[None, :] >= rng.randint(0, P - 2, size=B)[:, None]
    cmask = np.arange(T)[None, :] < rng.randint(1, T + 1, size=B)[:, None]
    batch = GRPOBatch(prompt_ids=rng.randint(3, 256, size=(B, P)).astype(np.int32), prompt_mask=pmask,
                      tokens=rng.randint(3, 256, size=(B, T)).astype(np.int32), mask=cmask,
                      old_logp=np.where(cmask, -rng.uniform(4, 8, size=(B, T)), 0).astype(np.float32),
                      advantages=rng.randn(B).astype(np.float32),
                      ref_logp=np.where(cmask, -rng.uniform(4, 8, size=(B, T)), 0).astype(np.float32),
                      weights=np.asarray(grpo.token_weights(jnp.asarray(cmask), jnp.ones(B), "token_mean")))
    opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3, weight_decay=0.01))
    loss_cfg = GRPOLossConfig(beta=0.05)

    def leaves(tree):
        return [np.asarray(x) for x in jax.tree_util.tree_leaves(jax.device_get(tree))]

    def max_diff(a, b):
        return max(float(np.max(np.abs(x - y))) for x, y in zip(leaves(a), leaves(b)))

    def place(mesh):
        state = jax.device_put(host0)
        if mesh is None:
            return state, opt.init(state)
        state = shd.place_state(state, mesh)
        return state, shd.place_opt_state(opt.init(state), state, mesh)

    def layout_kept(tree, shardings):
        return all(x.sharding.is_equivalent_to(s, x.ndim) for x, s in
                   zip(jax.tree_util.tree_leaves(tree), jax.tree_util.tree_leaves(shardings)))

    res = {"report": shd.sharding_report(state0, meshes["1x4"])}
    # ---------------------------------------------------------------- GRPO update
    runs = {}
    for name, mesh in [("single", None)] + list(meshes.items()):
        update = make_grpo_update(graphdef, opt, loss_cfg, micro_batches=2, mesh=mesh)
        state, opt_state = place(mesh)
        b = shd.shard_batch(batch, mesh) if mesh is not None else jax.tree.map(jnp.asarray, batch)
        before = trace_counts()["grpo_update"]
        for _ in range(2):
            state, opt_state, m = update(state, opt_state, b)
        runs[name] = (state, opt_state, float(m["loss"]))
        if mesh is None:
            continue
        per_dev = shd.bytes_per_device((state, opt_state))
        res[name] = {
            "max_diff": max(max_diff(state, runs["single"][0]), max_diff(opt_state, runs["single"][1])),
            "loss_diff": abs(runs[name][2] - runs["single"][2]),
            "compiles": trace_counts()["grpo_update"] - before,
            "layout_kept": layout_kept(state, shd.state_shardings(state, mesh))
                           and layout_kept(opt_state, shd.opt_state_shardings(opt_state, state, mesh)),
            "fraction": max(per_dev.values()) / shd.total_bytes((state, opt_state)),
            "devices": len(per_dev),
        }

    # ---------------------------------------------------------------- generation
    gen = GenerationConfig(max_new_tokens=4, temperature=0.0)
    toks = []
    for mesh in (None, meshes["1x4"]):
        state = runs["single"][0] if mesh is None else runs["1x4"][0]
        ids, pm = (batch.prompt_ids, batch.prompt_mask) if mesh is None else \\
            shd.shard_batch((batch.prompt_ids, batch.prompt_mask), mesh)
        out = generate_ids((graphdef, state), ids, pm, None, gen, eos_token_ids=(), pad_token_id=0)
        toks.append(np.asarray(out[0]))
    res["same_tokens"] = bool(np.array_equal(toks[0], toks[1]))

    # ---------------------------------------------------------------- orbax: save 1x4, restore 2x2 / 1 device
    state14, opt14, _ = runs["1x4"]
    save_checkpoint(tmp / "ck", nnx.merge(graphdef, state14), 1, extra=opt14)
    template = jax.eval_shape(opt.init, state0)
    restored = {}
    for name, mesh in (("2x2", meshes["2x2"]), ("one", one), ("plain", None)):
        r = restore_checkpoint(tmp / "ck", mesh=mesh, extra=template)
        st = nnx.state(r.model)
        ok = True
        if mesh is not None:
            ok = layout_kept(st, shd.state_shardings(st, mesh)) and \\
                 layout_kept(r.extra, shd.opt_state_shardings(r.extra, st, mesh))
        restored[name] = {"max_diff": max(max_diff(st, state14), max_diff(r.extra, opt14)), "layout": ok,
                          "devices": len(shd.bytes_per_device((st, r.extra)))}
    # the trainer's checkpoints (llm.training.phase): saved on 1x4, resumed on 2x2 straight into shards
    from llm.training.phase import Checkpoints
    from llm.training.policy import Policy
    Checkpoints(tmp / "phase", 2, meshes["1x4"]).save(Policy(graphdef, state14, None), opt14, 3,
                                                      jax.random.PRNGKey(7), 5)
    host_state = jax.device_put(host0)
    st, ost, step, key, pos = Checkpoints(tmp / "phase", 2, meshes["2x2"]).restore(
        Policy(graphdef, host_state, None), opt.init(host_state))
    restored["phase"] = {"max_diff": max(max_diff(st, state14), max_diff(ost, opt14)),
                         "layout": layout_kept(st, shd.state_shardings(st, meshes["2x2"]))
                                   and layout_kept(ost, shd.opt_state_shardings(ost, st, meshes["2x2"])),
                         "devices": len(shd.bytes_per_device((st, ost))), "counters": [step, pos]}
    res["restore"] = restored

    # ---------------------------------------------------------------- Hugging Face in / out
    single = nnx.merge(graphdef, runs["single"][0])
    hf_io.save_pretrained(single, None, tmp / "hf")

    def whole(self, name):
        raise AssertionError(f"whole-tensor read of {name}")

    hf_io._TensorReader.get = whole
    loaded, _ = hf_io.from_pretrained(tmp / "hf", tokenizer=False, mesh=meshes["1x4"])
    st = nnx.state(loaded)
    per_dev = shd.bytes_per_device(st)
    hf_io.save_pretrained(loaded, None, tmp / "hf_back")
    res["hf"] = {
        "max_diff": max_diff(st, runs["single"][0]),
        "layout": layout_kept(st, shd.state_shardings(st, meshes["1x4"])),
        "fraction": max(per_dev.values()) / shd.total_bytes(st),
        "identical": all((tmp / "hf" / f).read_bytes() == (tmp / "hf_back" / f).read_bytes()
                         for f in (hf_io.WEIGHTS_FILE, hf_io.CONFIG_FILE)),
    }
    print(json.dumps(res))
    """
)


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fsdp")
    script = tmp / "fsdp_checks.py"
    script.write_text(SCRIPT)
    root = str(Path(__file__).parents[3])
    env = dict(os.environ, XLA_FLAGS=xla_flags("--xla_force_host_platform_device_count=4"), JAX_PLATFORMS="cpu",
               PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))
    out = subprocess.run([sys.executable, str(script), str(tmp)], env=env, capture_output=True, text=True,
                         timeout=600, cwd=root)
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_sharded_grpo_update_equals_single_device_and_holds_a_quarter(fsdp_run):
    for name in ("1x4", "2x2", "4x1"):
        r = fsdp_run[name]
        # AdamW (lr 1e-3) after 2 updates: float summation order only (measured 1e-6 / 6e-6)
        assert r["max_diff"] < 2e-5 and r["loss_diff"] < 1e-5, (name, r)
        assert r["compiles"] == 1 and r["layout_kept"], (name, r)
        assert r["devices"] == 4
    # fsdp=4: a quarter of params + AdamW state per device, plus the whole q/k norms and counters
    assert 0.25 <= fsdp_run["1x4"]["fraction"] < 0.26, fsdp_run["1x4"]
    # data=2 x fsdp=2: each device holds half (replicated over data)
    assert 0.5 <= fsdp_run["2x2"]["fraction"] < 0.51, fsdp_run["2x2"]
    # data=4 (the default mesh): every device holds the whole state
    assert fsdp_run["4x1"]["fraction"] == 1.0, fsdp_run["4x1"]


def test_generation_with_sharded_state_equals_single_device(fsdp_run):
    assert fsdp_run["same_tokens"]


def test_checkpoint_saved_on_1x4_restores_on_2x2_and_one_device(fsdp_run):
    r = fsdp_run["restore"]
    for name in ("2x2", "one", "plain"):
        assert r[name]["max_diff"] == 0.0 and r[name]["layout"], (name, r[name])
    assert r["2x2"]["devices"] == 4 and r["one"]["devices"] == 1 and r["plain"]["devices"] == 1
    # the trainer's phase checkpoints resume on another mesh, straight into its shards
    assert r["phase"]["max_diff"] == 0.0 and r["phase"]["layout"] and r["phase"]["devices"] == 4, r["phase"]
    assert r["phase"]["counters"] == [3, 5]


def test_hf_checkpoint_loads_into_fsdp_shards_and_exports_byte_identical(fsdp_run):
    r = fsdp_run["hf"]
    assert r["max_diff"] == 0.0 and r["layout"] and r["identical"], r
    assert 0.25 <= r["fraction"] < 0.26, r


def test_report_says_what_stays_whole(fsdp_run):
    report = {line.split(" ")[0]: line for line in fsdp_run["report"]}
    assert "whole: no splittable dimension divides by fsdp=4" in report["layers.self_attn.q_norm.weight"]
    assert "split on vocab (256 / 4)" in report["embed_tokens.embedding"]
    assert "split on mlp" in report["layers.mlp.down_proj.kernel"]


# ----------------------------------------------------------------------------- in-process (one device)


def test_mesh_config_errors_name_the_field():
    with pytest.raises(ConfigError, match="mesh.fsdp=0"):
        shd.MeshConfig(fsdp=0)
    with pytest.raises(ConfigError, match="both be -1"):
        shd.MeshConfig(data=-1, fsdp=-1)
    with pytest.raises(ConfigError, match="unknown mesh field"):
        shd.MeshConfig.from_dict({"tensor": 2})
    with pytest.raises(ConfigError, match="mesh.fsdp=4 does not divide the 6 devices"):
        shd.MeshConfig(fsdp=4).resolve(6)
    with pytest.raises(ConfigError, match="data=2 x fsdp=3 = 6 devices, but there are 4"):
        shd.MeshConfig(data=2, fsdp=3).resolve(4)
    assert shd.MeshConfig(data=2, fsdp=-1).resolve(8) == (2, 4)
    mesh = shd.make_mesh()
    assert mesh.axis_names == shd.MESH_AXES and dict(mesh.shape)[shd.FSDP_AXIS] == 1


def test_param_spec_splits_the_largest_dividing_dimension_never_layers():
    spec, why = shd.param_spec(("layers", "mlp", "up_proj", "kernel"), (4, 32, 96), 8)
    assert spec == PartitionSpec(None, None, "fsdp") and "mlp" in why
    # the largest (vocab=250) does not divide by 4: the next one (embed) is split
    spec, _ = shd.param_spec(("embed_tokens", "embedding"), (250, 64), 4)
    assert spec == PartitionSpec(None, "fsdp")
    # the stacked layer axis (8, divisible) is never split
    spec, why = shd.param_spec(("layers", "input_layernorm", "weight"), (8, 30), 4)
    assert spec == PartitionSpec() and "whole" in why
    assert shd.param_spec(("norm", "weight"), (64,), 1)[0] == PartitionSpec()
