"""A policy's answers on a few lakes, opened up: prompt, completion, parsed plan, rollout, outcome.

For looking at what a policy does (notebooks, reports), not for training: the batch is
small and the per-lake bookkeeping is host-side Python. The completions come from the same
code path as training and evaluation (:class:`llm.game.prompter.Prompter`,
:func:`llm.training.completions.sample_completions`), the plans from :func:`jaxlake.text.parse_plan_detailed`
and the outcomes from one vmapped :func:`jaxlake.env.rollout`, so an example shows exactly
what the reward saw.

* :func:`policy_examples`: ``B`` lakes -> ``B`` :class:`Example` records;
* :func:`play_texts`: the same from given completion texts (a reference plan, a saved
  completion), no model needed;
* :func:`outcome_text`: a one-line verdict (``success``, ``B fell; A timed out``, ...);
* :func:`failure_rates`: success and failure-type rates of a list of examples, as in the
  training metrics.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxlake.env import Outcome, Trajectory, rollout
from jaxlake.text import pad_plan_agents, parse_plan_detailed
from jaxlake.types import Lake
from llm.game.prompts import unbatch


@dataclasses.dataclass(frozen=True)
class Example:
    """One lake and one completion, played in the simulator.

    Attributes:
      lake: the unbatched lake.
      prompt: the chat text the policy read ("" when the text did not come from a policy).
      completion: the completion text (a reasoning policy's: think block included; its plan
        is read from the answer after ``</think>``).
      plan: ``[max_agents, horizon]`` int32, the parsed plan (STAY where missing).
      malformed: the completion was off format (a reward term).
      reasons: why it is malformed (empty when it is not).
      outcome: the :class:`jaxlake.env.Outcome` of the rollout (numpy leaves).
      trajectory: the :class:`jaxlake.env.Trajectory` (numpy leaves), for the viewer.
    """

    lake: Lake
    prompt: str
    completion: str
    plan: np.ndarray
    malformed: bool
    reasons: tuple[str, ...]
    outcome: Outcome
    trajectory: Trajectory

    @property
    def success(self) -> bool:
        return bool(self.outcome.success)

    @property
    def num_agents(self) -> int:
        return int(self.lake.num_agents)


def _letter(i: int) -> str:
    return chr(ord("A") + i)


def outcome_text(example: Example) -> str:
    """A short verdict: ``success`` or which agents fell / timed out / were cancelled."""
    o, n = example.outcome, example.num_agents
    if bool(o.success):
        verdict = "success"
    else:
        parts = []
        for name, flags in (("fell", o.fell), ("timed out", o.timed_out), ("still walking", o.still_active)):
            who = [_letter(i) for i in range(n) if bool(flags[i])]
            if who:
                parts.append(f"{' '.join(who)} {name}")
        verdict = "; ".join(parts) or "not all arrived"
    cancelled = int(np.sum((o.vertex_conflicts + o.swap_conflicts + o.blocks)[:n]))
    if cancelled:
        verdict += f"; {cancelled} move{'s' if cancelled > 1 else ''} cancelled"
    if example.malformed:
        verdict += "; malformed"
    return verdict


@functools.lru_cache(maxsize=None)
def _runner(horizon: int):
    """``jit(vmap(rollout))`` for one horizon (compiled once per batch shape)."""
    return jax.jit(jax.vmap(lambda lake, plan, k: rollout(k, lake, plan, horizon=horizon)))


def play_texts(lakes: Lake, texts: Sequence[str], key: jax.Array, *, horizon: Optional[int] = None,
               prompts: Optional[Sequence[str]] = None) -> list[Example]:
    """Parse and play ``B`` completion texts on a batched ``lakes`` (leading axis ``B``).

    Args:
      lakes: batched lakes; lake ``b`` goes with ``texts[b]``.
      texts: ``B`` completions (anything: parsing never raises).
      key: PRNG key for slippery lakes (split per lake).
      horizon: rollout length (default: the batch's largest ``max_steps``, so every
        episode ends).
      prompts: optional ``B`` prompt texts to keep beside the completions.
    """
    texts = list(texts)
    singles = unbatch(lakes)
    if len(singles) != len(texts):
        raise ValueError(f"got {len(texts)} texts for {len(singles)} lakes")
    if prompts is not None and len(prompts) != len(texts):
        raise ValueError(f"got {len(prompts)} prompts for {len(texts)} texts")
    horizon = int(np.max(np.asarray(lakes.max_steps))) if horizon is None else int(horizon)
    max_agents = int(np.shape(np.asarray(lakes.starts))[-2])
    parsed = [parse_plan_detailed(t, int(lake.num_agents), horizon) for t, lake in zip(texts, singles)]
    plans = np.stack([pad_plan_agents(p.actions, max_agents) for p in parsed])
    out = jax.device_get(_runner(horizon)(lakes, jnp.asarray(plans), jax.random.split(key, len(texts))))
    examples = []
    for b, (lake, text, p) in enumerate(zip(singles, texts, parsed)):
        examples.append(Example(
            lake=lake,
            prompt="" if prompts is None else prompts[b],
            completion=text,
            plan=plans[b],
            malformed=bool(p.malformed),
            reasons=tuple(p.reasons),
            outcome=jax.tree_util.tree_map(lambda x, b=b: np.asarray(x)[b], out.outcome),
            trajectory=jax.tree_util.tree_map(lambda x, b=b: np.asarray(x)[b], out.trajectory),
        ))
    return examples


def policy_examples(policy: Any, lakes: Lake, key: jax.Array, *, prompt_config: Any = None,
                    max_new_tokens: int = 40, temperature: float = 0.0, horizon: Optional[int] = None,
                    prompt_bucket: int = 16) -> list[Example]:
    """Complete the prompts of ``B`` lakes with ``policy`` and play the answers.

    Args:
      policy: an :class:`llm.training.policy.Policy` (``llm.training.policy.load_policy`` or a stage's result).
      lakes: a batched :class:`Lake` (leading axis ``B``; a handful).
      key: PRNG key (sampling when ``temperature > 0``, and the slips).
      prompt_config: a :class:`llm.game.prompts.PromptConfig` (default: its defaults); use the
        one the policy was trained with (``TrainConfig.prompt``). With its reasoning on, the
        policy thinks first (at most ``reasoning.thinking_tokens``), as in training.
      max_new_tokens: completion budget (the answer's, after any think block), as in training.
      temperature: 0 decodes greedily (as the held-out evaluation does).
      horizon: rollout length (default: the batch's largest ``max_steps``).
      prompt_bucket: prompts are padded to a multiple of this many tokens.
    """
    from llm.game import prompts as prompt_lib
    from llm.training.completions import sample_completions
    from llm.generation.decode import GenerationConfig
    from llm.game.prompter import Prompter

    config = prompt_config if prompt_config is not None else prompt_lib.PromptConfig()
    prompter = Prompter.fit(policy.tokenizer, config, lakes, None, prompt_bucket)
    ids, mask = prompter.encode(lakes)
    k_gen, k_play = jax.random.split(key)
    gen = GenerationConfig(max_new_tokens=int(max_new_tokens), temperature=float(temperature))
    out = sample_completions(policy, ids, mask, k_gen, gen, None, config.reasoning)
    texts = prompt_lib.render_prompts(lakes, policy.tokenizer, config)
    if out.answers is None:
        return play_texts(lakes, out.texts, k_play, horizon=horizon, prompts=texts)
    # reasoning: the plan is the answer after </think>; the example keeps the whole completion
    played = play_texts(lakes, out.answers, k_play, horizon=horizon, prompts=texts)
    return [dataclasses.replace(e, completion=full) for e, full in zip(played, out.texts)]


def failure_rates(examples: Sequence[Example]) -> dict[str, float]:
    """Batch rates of a list of examples, defined as in the training metrics
    (:func:`llm.game.rewards.reward_metrics`): ``success`` and ``malformed_rate`` per completion,
    ``fall_rate`` / ``timeout_rate`` per agent (averaged per lake), ``conflict_rate`` the
    share of completions with at least one cancelled move."""
    if not examples:
        raise ValueError("failure_rates needs at least one example")

    def share(flags, n):
        return float(np.sum(np.asarray(flags)[:n])) / max(n, 1)

    rows = []
    for e in examples:
        o, n = e.outcome, e.num_agents
        cancelled = int(np.sum((o.vertex_conflicts + o.swap_conflicts + o.blocks)[:n]))
        rows.append((float(e.success), share(o.fell, n), share(o.timed_out, n), float(cancelled > 0), float(e.malformed)))
    m = np.mean(np.asarray(rows), axis=0)
    return dict(zip(("success", "fall_rate", "timeout_rate", "conflict_rate", "malformed_rate"), map(float, m)))
