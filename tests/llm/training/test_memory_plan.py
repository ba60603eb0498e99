"""What a GRPO stage holds on the device while it samples (llm/training/stage.py, llm/training/phase.py)
and what the step plan says it holds (llm/benchmark/step_plan.py, ``python -m llm.memory --plan``).

One tiny stage per KL setting runs up to its first GRPO sampling call, where a spy counts
``jax.live_arrays()`` (the arrays the test process held before are left out) and stops the
run: nothing is compiled for it.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from jaxlake.config import LakeConfig
from llm.training import grpo_loop
from llm.training.config import StageConfig
from llm.training.stage import train_stage

ENV = LakeConfig(height=3, width=3, num_agents=1, hole_density=0.0, max_steps=6, max_height=4, max_width=4, max_agents=2)
#: The micro model of the trainer tests (160 KB of weights; the lakes live beside them take
#: about 250 bytes, 0.002 of the state).
ARCH = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
        "num_key_value_heads": 1, "head_dim": 16}


def _owned_policy(tokenizer):
    """A fresh policy handed to the stage to own (as one it loads itself)."""
    from flax import nnx

    from llm.model.config import Qwen3Config
    from llm.model.qwen3 import Qwen3ForCausalLM
    from llm.training.policy import Policy

    cfg = Qwen3Config(vocab_size=len(tokenizer), **ARCH)
    policy = Policy.from_model(Qwen3ForCausalLM(cfg, rngs=nnx.Rngs(0)), tokenizer)
    return Policy(policy.graphdef, policy.state, tokenizer, owned=True)


class _Stop(Exception):
    pass


def _buffers(arrays) -> dict:
    """``{(device, buffer address): bytes}`` of the arrays' shards: what the devices hold (two
    arrays on one buffer, as ``device_put`` onto the same device's mesh makes, count once)."""
    out = {}
    for x in arrays:
        for shard in x.addressable_shards:
            out[(shard.device.id, shard.data.unsafe_buffer_pointer())] = shard.data.nbytes
    return out


def _nbytes(arrays) -> int:
    return sum(_buffers(arrays).values())


def _first_sampling_call(tmp_path, monkeypatch, tokenizer, beta: float, resume: bool = False) -> dict:
    before = list(jax.live_arrays())  # held (so no buffer is reused) and left out of the count
    seen = set(_buffers(before))
    found = {}

    def spy(policy, ids, mask, key, gen, mesh, reasoning=None):
        live = {k: v for k, v in _buffers(jax.live_arrays()).items() if k not in seen}
        found.update(live_bytes=sum(live.values()), state_bytes=_nbytes(jax.tree_util.tree_leaves(policy.state)),
                     config=policy.module().config, prompt=ids.shape[1], rows=ids.shape[0], gen=gen)
        raise _Stop

    monkeypatch.setattr(grpo_loop, "sample_completions", spy)
    cfg = StageConfig.from_cfg({
        "train": {"seed": 0, "progress": False, "export_hf": False, "plot": False,
                  "warmstart": {"enabled": False},
                  "grpo": {"steps": 2 if resume else 1, "lakes_per_step": 1, "group_size": 2,
                           "max_new_tokens": 4, "loss": {"beta": beta}},
                  "eval": {"num_lakes": 0}},
        "prompt": {"system": "", "user": "{grid}\n{agents}", "use_system": False},
    })
    folder = tmp_path / f"beta{beta}{'-resumed' if resume else ''}"
    policy = _owned_policy(tokenizer)
    if resume:  # a GRPO checkpoint after step 1 (the starting weights): the stage resumes at step 2
        from llm.rl.optim import make_optimizer
        from llm.training.phase import Checkpoints

        opt = make_optimizer(cfg.train.grpo.optim, 2)
        Checkpoints(folder / "checkpoint", 1).save(policy, opt.init(policy.state), 1, jax.random.PRNGKey(0), 0)
    with pytest.raises(_Stop):
        train_stage(cfg, ENV, folder, policy=policy)
    del policy
    del before
    found["train"] = cfg.train
    return found


@pytest.fixture(scope="module")
def at_sampling(tmp_path_factory):
    """The live bytes at the first GRPO sampling call, without and with a KL term."""
    from llm.game import default as default_model
    from llm.model.hf_io import load_tokenizer

    tokenizer = load_tokenizer(default_model.default_model_dir())  # the default tokenizer (cached)
    mp = pytest.MonkeyPatch()
    try:
        # one lake per step: the held-out lake the prompts are fitted to has the same shape
        found = {beta: _first_sampling_call(tmp_path_factory.mktemp("stage"), mp, tokenizer, beta)
                 for beta in (0.0, 0.05)}
        found["resumed"] = _first_sampling_call(tmp_path_factory.mktemp("stage"), mp, tokenizer, 0.05, resume=True)
        return found
    finally:
        mp.undo()


@pytest.mark.parametrize("beta, copies", [(0.0, 3.0), (0.05, 4.0), ("resumed", 4.0)])
def test_resident_state_while_sampling_is_weights_moments_and_reference(at_sampling, beta, copies):
    """Weights + two AdamW moments (+ the reference when beta > 0): 3.00x / 4.00x the
    parameter state (it was 4.00x / 5.00x: train_stage kept the starting policy alive and
    Checkpoints.start copied the state again). ``resumed``: beta > 0, resuming from a GRPO
    checkpoint (the reference was copied although the restored state does not share it)."""
    got = at_sampling[beta]
    ratio = got["live_bytes"] / got["state_bytes"]
    assert got["state_bytes"] > 100_000
    assert ratio == pytest.approx(copies, abs=0.01), ratio


def test_the_plan_holds_what_the_run_holds(at_sampling):
    """The step plan of the same tiny step (the sampler's prefill compiled from abstract
    shapes: it takes the sampling call's weights and prompts): the resident arrays plus the
    call's arguments are what the real run holds when it calls the sampler (the prompts,
    made on the device inside the call, are the difference)."""
    from llm.benchmark.step_plan import build_plan, step_shapes

    got = at_sampling[0.0]
    train = got["train"]
    shapes = step_shapes(train, train.prompt.reasoning, got["prompt"], 0)
    assert shapes.rows == got["rows"]
    plan = build_plan(got["config"], train, train.prompt.reasoning, shapes, groups=("sampling",),
                      sampling_parts=("prefill",), row_block_devices=())
    (call,) = plan.phases
    assert call.name == "sample: prefill" and plan.state_bytes == got["state_bytes"]
    held = call.resident_bytes + call.argument_bytes
    prompts = 2 * shapes.rows * shapes.prompt * 4  # ids int32 + mask (bool: 1 byte; int32 bound)
    assert got["live_bytes"] <= held <= got["live_bytes"] + prompts + 4096
    assert call.temp_bytes > 0 and call.peak_bytes == held + call.temp_bytes + call.output_bytes
    np.testing.assert_allclose(held / got["state_bytes"], 3.0, atol=0.01)


def test_the_plan_cuts_sampling_where_the_sampler_would(at_sampling):
    """The plan's row blocks follow the sampler's rule (llm.generation.row_blocks.auto_row_block):
    a call is cut when its need exceeds ROW_BLOCK_HEADROOM of the memory left beside the
    resident arrays and its arguments, not the whole of it."""
    from llm.benchmark.step_plan import Device, build_plan, step_shapes
    from llm.generation.row_blocks import ROW_BLOCK_HEADROOM

    got = at_sampling[0.0]
    train = got["train"]
    shapes = step_shapes(train, train.prompt.reasoning, got["prompt"], 0)

    def plan(*devices):
        return build_plan(got["config"], train, train.prompt.reasoning, shapes, groups=("sampling",),
                          sampling_parts=("call",), row_block_devices=devices)

    (call,) = plan().phases
    held, need = call.resident_bytes + call.argument_bytes, call.peak_bytes - call.resident_bytes - call.argument_bytes
    tight = Device("tight", held + int(need / (ROW_BLOCK_HEADROOM + 0.02)), 1.0)  # fits 97 %, not 95 %
    roomy = Device("roomy", held + int(need / ROW_BLOCK_HEADROOM) + 1024, 1.0)
    cut = plan(tight, roomy).row_blocks
    assert "roomy" not in cut  # the whole batch in one call
    assert cut["tight"]["sample: call"].rows < shapes.rows == 2
