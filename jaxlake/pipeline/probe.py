"""Probe stages: a short training stage on a candidate environment, scored on a validation suite.

The oracle engineer (:mod:`jaxlake.engineers.oracle`) asks, after stage ``k``, how much each of
a few candidate environments would teach the policy. :func:`make_probe` gives it
``probe(mixture, name, steps)``, which

1. trains ``steps`` steps (GRPO steps for the LLM, IPPO updates for the IPPO student) from
   stage ``k``'s policy on ``mixture``, with stage ``k + 1``'s seeds, in
   ``stage_k/probes/<name>/``: the student's own :meth:`train` on settings shortened by its
   :meth:`probe_settings` (no warm start, no held-out evaluation during training, no export);
2. scores the result, greedy, on the **validation suite**: the held-out suite's cells with
   lakes of their own (:func:`jaxlake.suite.validation_suite`: another seed, and none of the
   held-out suite's lakes), so the oracle never reads the test it is judged on;
3. keeps ``probe.json`` (the mixture, the score, the lakes won, the wall time) and deletes the
   probe's weights, which nothing reads again.

A probe whose ``probe.json`` exists is read back, not retrained: a run cut short during the
engineer's turn resumes it. The validation suite is built once per process (cached).

:func:`run_rollouts` is the probe without training: the stage's policy plays fresh lakes of each
component of a mixture, sampled, and each component's success comes back (the learnability the
``sfl`` engineer and the oracle over edits read, ``ctx.rollouts``).
"""

from __future__ import annotations

import dataclasses
import functools
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Optional

from jaxlake.io import read_json, write_json
from jaxlake.mixture import Mixture, mixture_to_obj
from jaxlake.pipeline.folder import log, stage_path
from jaxlake.pipeline.settings import PipelineError, RunSettings

#: The validation suite's seed is the held-out suite's plus this.
VALIDATION_SEED_OFFSET = 104_729
#: The probe's record file in its folder.
PROBE_FILE = "probe.json"


@dataclasses.dataclass(frozen=True)
class ProbeSettings:
    """How a probe is run and scored.

    Attributes:
      steps: training steps of a probe (GRPO steps, or IPPO updates).
      lakes_per_cell: validation lakes per cell of the held-out suite's grid.
      seed_offset: the validation suite's seed is the held-out suite's plus this.
    """

    steps: int = 8
    lakes_per_cell: int = 8
    seed_offset: int = VALIDATION_SEED_OFFSET

    def __post_init__(self) -> None:
        for name, low in (("steps", 1), ("lakes_per_cell", 1)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise PipelineError(f"engineer.probe.{name}={v!r} must be an integer in [{low}, inf)")
        if self.seed_offset == 0:
            raise PipelineError("engineer.probe.seed_offset=0 would make the validation suite the held-out one")


@functools.lru_cache(maxsize=2)
def _validation(spec: Any, seed: int, lakes_per_cell: int, solve: bool) -> tuple[Any, dict]:
    from jaxlake.suite import validation_suite

    return validation_suite(spec, seed, lakes_per_cell, solve=solve)


def validation_of(s: RunSettings, probe: ProbeSettings) -> tuple[Any, dict]:
    """``(suite, report)``: the validation suite of the run's held-out suite (cached)."""
    if s.eval is None:
        raise PipelineError("probing needs a held-out suite (eval=...) to build its validation suite from")
    spec = s.eval.suite
    return _validation(spec, int(spec.seed) + int(probe.seed_offset), int(probe.lakes_per_cell), bool(s.eval.planner))


def _greedy_only(s: RunSettings) -> RunSettings:
    """The run's settings with an evaluation that decodes greedily only, on no lake of the
    stage's own environment (a probe reads one number)."""
    node = {**dict(s.eval.node), "greedy": True, "sampled": {"num_samples": 0}, "current_env_lakes": 0}
    return dataclasses.replace(s, eval=dataclasses.replace(s.eval, node=node))


def run_probe(s: RunSettings, k: int, d: Path, init: Path, mixture: Mixture, name: str,
              probe: ProbeSettings) -> dict:
    """One probe after stage ``k`` (folder ``d``) from the policy ``init``: its record."""
    from jaxlake.pipeline.student import build_student

    folder = d / "probes" / name
    done = folder / PROBE_FILE
    if done.is_file():
        return read_json(done)
    student = build_student(s)
    t0 = time.perf_counter()
    suite, report = validation_of(s, probe)
    short = student.probe_settings(s, probe.steps)
    if folder.exists():  # a probe cut short: its weights are not worth resuming
        shutil.rmtree(folder)
    log(f"stage {k}: probe {name}: {probe.steps} steps on {len(mixture)} config(s) from this stage's policy")
    train = student.train(short, k + 1, folder, mixture, init, quiet=True)
    key = next(key for key in student.policy_keys if train.get(key))
    policy = stage_path(s, folder, train[key])
    ev = student.evaluate(_greedy_only(s), k, policy, mixture, f"probe {name}", suite=suite)
    greedy = ev["modes"]["greedy"]
    won = [int(e["success"]) for e in ev["episodes"] if e.get("mode") == "greedy"]
    record = {
        "name": name,
        "mixture": mixture_to_obj(mixture),
        "steps": probe.steps,
        "score": float(greedy["score"]),
        "n": int(greedy.get("n", len(won))),
        "success": won,
        "validation": report,
        "wall_s": round(time.perf_counter() - t0, 2),
    }
    for item in folder.iterdir():  # the weights and checkpoints: nothing reads them again
        if item.is_dir():
            shutil.rmtree(item, ignore_errors=True)
    write_json(done, record)
    return record


def make_probe(s: RunSettings, k: int, d: Path, init: Path) -> Callable[..., dict]:
    """``probe(mixture, name, **settings)`` for the engineer of stage ``k`` (:func:`run_probe`;
    ``settings``: :class:`ProbeSettings` fields, the rest at their defaults)."""

    def probe(mixture: Any, name: str, **settings: Any) -> dict:
        import jax

        if jax.process_count() > 1:
            raise PipelineError(f"probes (engineer=oracle) run in one process; this run has {jax.process_count()}")
        unknown = sorted(set(settings) - {f.name for f in dataclasses.fields(ProbeSettings)})
        if unknown:
            raise PipelineError(f"engineer.probe: unknown setting(s) {unknown}")
        return run_probe(s, k, d, init, Mixture.of(mixture), str(name), ProbeSettings(**settings))

    return probe


#: The rollouts' lake seed is this plus ``1000 * run seed + stage``: fresh lakes, none of the
#: suite's, the same for every engineer of a seed and stage.
ROLLOUT_SEED = 7_340_033


def run_rollouts(s: RunSettings, k: int, policy: Optional[Path], mixture: Any, lakes: int, samples: int) -> list[dict]:
    """``[{"p", "n"}]``: the policy at ``policy`` (stage ``k``'s) played ``samples`` times, sampled, on
    ``lakes`` fresh lakes of each component of ``mixture``, in its order (:meth:`Student.success`)."""
    import jax

    from jaxlake.pipeline.student import build_student

    if jax.process_count() > 1:
        raise PipelineError(f"rollouts (engineer=sfl, oracle) run in one process; this run has {jax.process_count()}")
    for name, v in (("lakes", lakes), ("samples", samples)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise PipelineError(f"engineer.{name}={v!r} must be an integer in [1, inf)")
    mixture = Mixture.of(mixture)
    t0 = time.perf_counter()
    out = build_student(s).success(s, policy, mixture, lakes, samples, ROLLOUT_SEED + 1000 * int(s.seed) + int(k))
    log(f"stage {k}: rollouts of {len(mixture)} config(s) x {lakes} lakes x {samples} samples "
        f"({time.perf_counter() - t0:.1f} s)")
    return out
