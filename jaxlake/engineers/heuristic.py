"""``engineer=heuristic``: a threshold ladder that climbs while the policy succeeds and settles
on the last config that worked once a raise fails (no oscillation)."""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

from jaxlake.config import ConfigError, LakeConfig, to_plain
from jaxlake.engineers.base import Engineer, EngineerContext, Proposal, check_mode, stage_success
from jaxlake.engineers.space import ConfigSpace, check_in_space, space_from_conf
from jaxlake.mixture import Mixture

#: Ladder dimensions (``size`` moves height and width together).
LADDER_FIELDS = ("size", "height", "width", "num_agents", "hole_density", "conflict_density", "slip_prob", "max_steps")


def _shift(space: ConfigSpace, config: LakeConfig, name: str, rungs: int) -> Optional[LakeConfig]:
    """``config`` with ladder dimension ``name`` moved ``rungs`` grid steps (None: it cannot)."""
    return space.shift(config, ("height", "width") if name == "size" else (name,), rungs)


class HeuristicEngineer(Engineer):
    """A threshold ladder that climbs while the policy succeeds and settles where it failed.

    With ``p`` the success on the current environment (``mode`` decoding, see
    :func:`stage_success`), one step of the ladder is, in this order:

    1. ``p`` unknown -- keep the environment.
    2. **settled** (a raise has failed before, ``state["settled"]`` is that last good config):
       keep it for the rest of the run; only if the settled config itself fails
       (``p < lower_below``) lower it one rung (the ladder's last dimension that can go down)
       and settle there instead. It never raises again, so it cannot oscillate.
    3. ``p >= raise_above`` -- the config worked: remember it as ``last_good`` and raise the
       next dimension of ``ladder`` (round robin, skipping dimensions at their top) by its
       ``step`` grid rungs.
    4. ``p < lower_below`` -- too hard: with a ``last_good`` config other than the current one,
       go back to it and **settle** there (step 2 from now on); without one (the first config
       is already too hard), lower one rung and keep climbing from there.
    5. otherwise keep the current config (it is being learned; a later success raises on).

    So a success sequence ``0.9, 0.9, 0.1, 0.9, ...`` from ``A`` trains on ``A, B, C, B, B, ...``:
    ``C`` failed, ``B`` was the last config that worked, and the ladder stays there.
    Every proposal lies in the engineer's ``space`` (:func:`check_in_space`).
    """

    name = "heuristic"

    def __init__(
        self,
        ladder: Sequence[Mapping[str, Any]] = (
            {"field": "size", "step": 1},
            {"field": "num_agents", "step": 1},
            {"field": "hole_density", "step": 2},
            {"field": "conflict_density", "step": 2},
        ),
        raise_above: float = 0.7,
        lower_below: float = 0.3,
        signal: str = "current_env",
        mode: str = "greedy",
        space: Optional[Mapping[str, Any]] = None,
        name: str = "heuristic",
        **_: Any,
    ) -> None:
        ladder = to_plain(ladder)
        self.ladder = []
        for i, rung in enumerate(ladder):
            f, step = rung.get("field"), int(rung.get("step", 1))
            if f not in LADDER_FIELDS:
                raise ConfigError(f"engineer.ladder[{i}].field={f!r} not in {list(LADDER_FIELDS)}")
            if step < 1:
                raise ConfigError(f"engineer.ladder[{i}].step={step} not in [1, inf)")
            self.ladder.append((f, step))
        if not self.ladder:
            raise ConfigError("engineer.ladder: give at least one rung")
        if not 0.0 <= lower_below <= raise_above <= 1.0:
            raise ConfigError(
                f"engineer thresholds need 0 <= lower_below <= raise_above <= 1, got "
                f"lower_below={lower_below}, raise_above={raise_above}"
            )
        if signal not in ("current_env", "suite"):
            raise ConfigError(f"engineer.signal={signal!r} not in ['current_env', 'suite']")
        self.raise_above, self.lower_below = float(raise_above), float(lower_below)
        self.signal, self.mode, self.space_node, self.name = signal, check_mode(mode), space, name

    def _lower(self, space: ConfigSpace, config: LakeConfig) -> Optional[tuple[str, LakeConfig]]:
        for f, step in reversed(self.ladder):
            moved = _shift(space, config, f, -step)
            if moved is not None:
                return f, moved
        return None

    def propose(self, ctx: EngineerContext) -> Proposal:
        space = space_from_conf(ctx.base, self.space_node)
        proposal = self._step(ctx, space)
        if proposal.decision == "proposed":  # a kept environment is the run's, on the grid or not
            # fields the ladder did not move may still be off the grid (the run's initial env):
            # they snap to the nearest grid value no harder than their own, so only the rung the
            # ladder chose ever makes a lake harder (a failing policy never gets a harder lake)
            proposal.mixture = Mixture([(w, space.snap(c, no_harder=True)) for w, c in proposal.mixture])
            check_in_space(proposal.mixture, space, 1)
        return proposal

    def _step(self, ctx: EngineerContext, space: ConfigSpace) -> Proposal:
        current = ctx.base
        state = dict(ctx.state or {})
        pointer = int(state.get("next_rung", 0)) % len(self.ladder)
        p = stage_success(ctx.eval_result, self.mode, self.signal)
        new_state = {"next_rung": pointer, "last_good": state.get("last_good"), "settled": state.get("settled"),
                     "success": p}

        def go(config: LakeConfig, why: str) -> Proposal:
            if len(ctx.current) == 1 and ctx.current.main == config:
                return Proposal(ctx.current, "kept", why, state=new_state)
            return Proposal(Mixture.of(config), "proposed", why, state=new_state)

        if p is None:
            return Proposal(ctx.current, "kept", "no success measurement; keeping the environment", state=new_state)
        if new_state["settled"]:
            settled = LakeConfig.from_dict(new_state["settled"])
            if p < self.lower_below and current == settled:
                lowered = self._lower(space, settled)
                if lowered is not None:
                    new_state["settled"] = lowered[1].to_dict()
                    return go(lowered[1], f"success {p:.2f} < {self.lower_below} on the settled config: "
                                          f"lower {lowered[0]} and settle there")
            return go(settled, f"success {p:.2f}; settled on the last config that worked after a failed raise")
        if p >= self.raise_above:
            new_state["last_good"] = current.to_dict()
            for offset in range(len(self.ladder)):
                i = (pointer + offset) % len(self.ladder)
                f, step = self.ladder[i]
                moved = _shift(space, current, f, step)
                if moved is not None:
                    new_state["next_rung"] = (i + 1) % len(self.ladder)
                    return go(moved, f"success {p:.2f} >= {self.raise_above}: raise {f}")
            return go(current, f"success {p:.2f} but every dimension is at its top")
        if p < self.lower_below:
            last_good = new_state["last_good"]
            if last_good and LakeConfig.from_dict(last_good) != current:
                new_state["settled"] = last_good
                return go(LakeConfig.from_dict(last_good),
                          f"success {p:.2f} < {self.lower_below}: back to the last config that worked, settled there")
            lowered = self._lower(space, current)
            if lowered is not None:
                return go(lowered[1], f"success {p:.2f} < {self.lower_below}: lower {lowered[0]}")
            return go(current, f"success {p:.2f} but nothing can be lowered")
        return go(current, f"success {p:.2f} in [{self.lower_below}, {self.raise_above}): keep what is being learned")
