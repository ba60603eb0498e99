"""``engineer=heuristic``: a threshold ladder on the mixture's frontier that keeps what worked.

The ladder climbs while the policy succeeds and settles on the last config that worked once a
raise fails (no oscillation); it answers in edits (:mod:`jaxlake.engineers.edits`), so a raise
**adds** the harder config beside the ones that worked instead of replacing them."""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

from jaxlake.config import ConfigError, LakeConfig, to_plain
from jaxlake.engineers.base import Engineer, EngineerContext, Proposal, check_mode, stage_success
from jaxlake.engineers.edits import Edit, edit_proposal
from jaxlake.engineers.plr import component_success, level_key
from jaxlake.engineers.space import ConfigSpace, space_from_conf

#: Ladder dimensions (``size`` moves height and width together).
LADDER_FIELDS = ("size", "height", "width", "num_agents", "hole_density", "conflict_density", "slip_prob", "max_steps")


def _shift(space: ConfigSpace, config: LakeConfig, name: str, rungs: int) -> Optional[LakeConfig]:
    """``config`` with ladder dimension ``name`` moved ``rungs`` grid steps, the fields it did
    not move snapped onto the grid no harder than they were (None: it cannot move)."""
    moved = space.shift(config, ("height", "width") if name == "size" else (name,), rungs)
    if moved is None:
        return None
    moved = space.snap(moved, no_harder=True)
    return None if moved == config else moved


class HeuristicEngineer(Engineer):
    """A threshold ladder on the **frontier**, the config it added last (at first the current
    mixture's main component), in edits of the mixture.

    With ``p`` the success on the frontier's own lakes (``mode`` decoding, the per-component
    ``current_env`` evaluation; the whole training environment's, or the suite's with
    ``signal="suite"``, when there is no per-component result), one step is, in this order:

    1. ``p`` unknown -- ``keep``.
    2. **settled** (a raise has failed before): ``keep`` for the rest of the run; only if the
       settled config itself fails (``p < lower_below``) ``replace`` it by one rung lower and
       settle there.
    3. ``p >= raise_above`` -- the frontier worked: remember it as ``last_good`` and **add**
       the next ladder dimension's raise of it (round robin, skipping dimensions at their top)
       with a share of ``1 / (components + 1)``; with the mixture full, ``replace`` the
       component the policy succeeds on most by it.
    4. ``p < lower_below`` -- too hard: **drop** the frontier when ``last_good`` is still in the
       mixture (else ``replace`` it by ``last_good``) and settle there; without a
       ``last_good`` (the first config is already too hard) ``replace`` it one rung lower.
    5. otherwise the frontier is being learned: **reweight** it to twice its weight (``keep``
       when it is the only component).

    From one component the sequence ``0.9, 0.9, 0.1`` from ``A`` trains on ``A``, ``A + B``,
    ``A + B + C``, then drops ``C`` and stays on ``A + B``. Added configs lie in the
    engineer's ``space``.
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
        edit, why, state = self._step(ctx, space)
        return edit_proposal(ctx, edit, why, space=space, state=state)

    def _success(self, ctx: EngineerContext, config: LakeConfig) -> Optional[float]:
        if self.signal == "current_env" and len(ctx.current) > 1:
            per = component_success(ctx.eval_result, self.mode)
            if level_key(config) in per:
                return per[level_key(config)][0]
        return stage_success(ctx.eval_result, self.mode, self.signal)

    def _step(self, ctx: EngineerContext, space: ConfigSpace) -> tuple[Edit, str, dict]:
        state = dict(ctx.state or {})
        configs = list(ctx.current.configs)
        n = len(configs)
        frontier = LakeConfig.from_dict(state["frontier"]) if state.get("frontier") else None
        if frontier not in configs:
            frontier = ctx.base
        f_index = configs.index(frontier)
        pointer = int(state.get("next_rung", 0)) % len(self.ladder)
        p = self._success(ctx, frontier)
        new = {"next_rung": pointer, "last_good": state.get("last_good"), "settled": state.get("settled"),
               "frontier": frontier.to_dict(), "success": p}
        keep = Edit("keep")

        def replace(config: LakeConfig) -> Edit:
            return Edit("replace", None, (f_index,), ((1.0 / n, config),))

        if p is None:
            return keep, "no success measurement; keeping the environment", new
        if new["settled"]:
            settled = LakeConfig.from_dict(new["settled"])
            if p < self.lower_below and frontier == settled:
                lowered = self._lower(space, settled)
                if lowered is not None:
                    new["settled"] = new["frontier"] = lowered[1].to_dict()
                    return (replace(lowered[1]), f"success {p:.2f} < {self.lower_below} on the settled config: "
                                                 f"lower {lowered[0]} and settle there", new)
            return keep, f"success {p:.2f}; settled on the last config that worked after a failed raise", new
        if p >= self.raise_above:
            new["last_good"] = frontier.to_dict()
            for offset in range(len(self.ladder)):
                i = (pointer + offset) % len(self.ladder)
                f, step = self.ladder[i]
                moved = _shift(space, frontier, f, step)
                if moved is None or moved in configs:
                    continue
                new["next_rung"] = (i + 1) % len(self.ladder)
                new["frontier"] = moved.to_dict()
                why = f"success {p:.2f} >= {self.raise_above}: add {f} raised"
                if n + 1 <= space.edits.max_components:
                    return Edit("add", None, (), ((1.0 / (n + 1), moved),)), why, new
                best = max(range(n), key=lambda j: (self._success(ctx, configs[j]) or 0.0, -j))
                return (Edit("replace", None, (best,), ((1.0 / n, moved),)),
                        why + f", in place of the best-learned component #{best} (the mixture is full)", new)
            return keep, f"success {p:.2f} but every dimension is at its top", new
        if p < self.lower_below:
            last_good = LakeConfig.from_dict(new["last_good"]) if new["last_good"] else None
            if last_good is not None and last_good != frontier:
                new["settled"] = new["frontier"] = last_good.to_dict()
                if last_good in configs and n >= 2:
                    return (Edit("drop", None, (f_index,)), f"success {p:.2f} < {self.lower_below}: drop the failed "
                                                            "raise, keep what worked and settle there", new)
                return replace(last_good), f"success {p:.2f} < {self.lower_below}: back to the last config that " \
                                           "worked, settled there", new
            lowered = self._lower(space, frontier)
            if lowered is not None:
                new["frontier"] = lowered[1].to_dict()
                return replace(lowered[1]), f"success {p:.2f} < {self.lower_below}: lower {lowered[0]}", new
            return keep, f"success {p:.2f} but nothing can be lowered", new
        why = f"success {p:.2f} in [{self.lower_below}, {self.raise_above}): "
        if n >= 2:
            weights = tuple(2.0 * w if j == f_index else w for j, w in enumerate(ctx.current.weights))
            return Edit("reweight", weights), why + "twice the weight on what is being learned", new
        return keep, why + "keep what is being learned", new
