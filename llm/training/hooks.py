"""Hooks of the GRPO loop (:func:`llm.training.grpo_loop.run_grpo`): where an experiment plugs in
without editing the loop.

A step of the loop is ``collect -> advantages -> update -> log``. Three kinds of hook act in it:

* a **lake picker** (:class:`LakePicker`, at most one): which ``N`` lakes a sampling round
  samples its groups on. Without one a round draws ``N`` fresh lakes of the stage's
  environment (:func:`default_lakes`);
* **round transforms** (:class:`RoundTransform`, any number, in order): a sampled and scored
  round in, a round out, before its groups are judged informative (e.g. guidance writes the
  planner's completion into groups that failed). :meth:`Round.rescore` scores new texts with
  the round's own key;
* an **auxiliary loss** (:class:`AuxLoss`, at most one): a supervised batch whose token NLL
  every update adds to the GRPO loss at :attr:`AuxLoss.weight` (the update's ``anchor_*``
  metrics; :class:`llm.rl.updates.GRPOIterations`), drawn once per step that trains.

Every hook may add to the step's metrics row (:meth:`Hook.metrics`, after the loop's own
keys) and check the mesh (:meth:`Hook.check_mesh`); per-round state goes in
:attr:`Round.extras` under the hook's own keys. Hooks run on the host, in every process alike
(every process holds the same lakes and completions), so they must be deterministic in the
round's keys.

The hooks a configuration asks for (``train.grpo.anchor`` / ``screen`` / ``guidance``) are built
by :func:`llm.training.experiments.registry.grpo_hooks`; ``run_grpo(..., hooks=[...])`` takes
any list instead.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from llm.rl import grpo


@dataclasses.dataclass(frozen=True)
class RoundKeys:
    """The keys of round ``r`` of step ``s``: ``fold_in(k, s)`` of the phase's data, sample and
    reward keys, then ``fold_in(., r)`` for ``r > 0`` (round 0 keeps a plain step's keys)."""

    data: jax.Array
    sample: jax.Array
    reward: jax.Array

    @classmethod
    def of(cls, base: Sequence[jax.Array], step: int, r: int) -> "RoundKeys":
        keys = [jax.random.fold_in(k, step) for k in base]
        if r:
            keys = [jax.random.fold_in(k, r) for k in keys]
        return cls(*keys)


@dataclasses.dataclass
class Round:
    """One sampling round of a step, on the host: ``N * G`` rows, group ``n``'s contiguous.

    Attributes:
      step, index: the step and the round's index in it.
      keys: its :class:`RoundKeys`.
      lakes: its ``N`` lakes (batched, not repeated).
      ids, pmask: ``[N * G, P]`` prompt ids (left-padded) and mask.
      out: the :class:`~llm.training.completions.Completions`.
      own: the policy's own samples' :class:`~llm.game.rewards.RewardResult` (the metrics').
      rewards: the rewards the advantages come from (``own`` unless a transform changed rows).
      texts: the ``N * G`` rows' completion texts (the sampled ones unless a transform changed rows).
      forced: ``[N * G]`` bool, rows whose think block the budget closed (reasoning mode).
      truncated: ``[N * G]`` bool, rows cut by a token budget.
      tokens, mask, train_mask: ``[N * G, T]`` completion ids, completion tokens, tokens that
        take the policy-gradient loss.
      gen_s: seconds its sampling took.
      extras: what hooks keep of the round, under their own keys.
      score: ``(texts, forced) -> RewardResult`` with the round's lakes, key and references.
    """

    step: int
    index: int
    keys: RoundKeys
    lakes: Any
    ids: np.ndarray
    pmask: np.ndarray
    out: Any
    own: Any
    rewards: Any
    texts: list
    forced: np.ndarray
    truncated: np.ndarray
    tokens: np.ndarray
    mask: np.ndarray
    train_mask: np.ndarray
    gen_s: float
    score: Callable[[list, np.ndarray], Any]
    extras: dict = dataclasses.field(default_factory=dict)

    def rescore(self, texts: list, forced: np.ndarray) -> Any:
        """Rewards of ``texts`` in this round's rows (the same lakes, key and references)."""
        return self.score(texts, forced)

    @property
    def groups(self) -> int:
        return int(np.asarray(self.lakes.num_agents).shape[0])

    @functools.cached_property
    def grouped(self) -> np.ndarray:
        """``[N, G]`` float32 :attr:`rewards` (the advantages' rewards)."""
        return np.asarray(self.rewards.reward, np.float32).reshape(self.groups, -1)

    @functools.cached_property
    def informative(self) -> np.ndarray:
        """``[N]`` bool: the advantages' rewards of the group are not all equal."""
        return ~np.asarray(grpo.zero_variance_groups(jnp.asarray(self.grouped)))

    @functools.cached_property
    def own_informative(self) -> np.ndarray:
        """``[N]`` bool: the policy's own rewards of the group are not all equal."""
        own = np.asarray(self.own.reward, np.float32).reshape(self.groups, -1)
        return ~np.asarray(grpo.zero_variance_groups(jnp.asarray(own)))


def selected(rounds: Sequence[Round], sel, values: Callable[[Round], np.ndarray]) -> np.ndarray:
    """``values(round)`` (``[N, ...]`` per group) of the groups a step's batch took
    (:class:`llm.rl.dynamic.GroupSelection`), in the batch's order."""
    return np.stack([values(x) for x in rounds])[sel.round, sel.group]


class Hook:
    """Base of every hook: no mesh constraint, no metrics."""

    def check_mesh(self, mesh) -> None:
        """Raise when the hook's batch sizes cannot be split over ``mesh``."""

    def metrics(self, rounds: Sequence[Round], sel) -> dict:
        """Keys this hook adds to the step's row: ``rounds`` sampled (round 0 first) and the
        batch's :class:`~llm.rl.dynamic.GroupSelection`."""
        return {}


class LakePicker(Hook):
    """Chooses the ``N`` lakes a sampling round samples on."""

    def pick(self, policy: Any, keys: RoundKeys, n: int, extras: dict) -> Any:
        """``n`` batched lakes for a round with ``keys``; ``policy`` is the current one; what
        the picker keeps of the round goes in ``extras``."""
        raise NotImplementedError


class RoundTransform(Hook):
    """Rewrites a sampled, scored round before its groups are judged."""

    def transform(self, rnd: Round) -> Round:
        raise NotImplementedError


class AuxLoss(Hook):
    """A supervised batch whose token NLL every update adds to the loss at :attr:`weight`."""

    weight: float = 0.0

    def batch(self, step: int, policy: Any) -> tuple[Any, dict]:
        """``(TokenBatch, metrics)`` of a step that trains (laid out on the mesh)."""
        raise NotImplementedError


def default_lakes(env: Any) -> Callable[[RoundKeys, int], Any]:
    """``(keys, n) -> lakes``: ``n`` fresh lakes of ``env`` from the round's data key."""
    from llm.game.lakes import sample_lakes

    return lambda keys, n: sample_lakes(keys.data, env, n, split="random")


@dataclasses.dataclass(frozen=True)
class Hooks:
    """A loop's hooks, sorted by kind (:meth:`of` checks there is at most one :class:`LakePicker`
    and one :class:`AuxLoss`)."""

    all: tuple = ()
    picker: Optional[LakePicker] = None
    transforms: tuple = ()
    aux: Optional[AuxLoss] = None

    @classmethod
    def of(cls, hooks: Sequence[Hook] = ()) -> "Hooks":
        hooks = tuple(hooks)
        odd = [type(h).__name__ for h in hooks if not isinstance(h, Hook)]
        if odd:
            raise TypeError(f"a GRPO hook derives from llm.training.hooks.Hook, got {odd}")
        return cls(all=hooks, picker=_at_most_one(hooks, LakePicker), aux=_at_most_one(hooks, AuxLoss),
                   transforms=tuple(h for h in hooks if isinstance(h, RoundTransform)))

    def check_mesh(self, mesh) -> None:
        for h in self.all:
            h.check_mesh(mesh)

    def metrics(self, rounds: Sequence[Round], sel) -> dict:
        row: dict = {}
        for h in self.all:
            row.update(h.metrics(rounds, sel))
        return row


def _at_most_one(hooks: Sequence[Hook], kind: type) -> Optional[Hook]:
    """The one hook of ``kind`` among ``hooks`` (``None``: none); two raise."""
    found = [h for h in hooks if isinstance(h, kind)]
    if len(found) > 1:
        raise ValueError(f"a GRPO loop takes at most one {kind.__name__}, got {[type(h).__name__ for h in found]}")
    return found[0] if found else None
