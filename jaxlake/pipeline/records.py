"""A finished stage as a record: its row in ``stages.jsonl`` (:func:`log_stage`), its record read
back from the stage folder (:func:`stage_record`) and the one-line / table views of them
(:func:`short_env`, :func:`stage_table`) that the pipeline prints and the study reuses, with
each stage's greedy suite score paired with the stage before it (:func:`paired_with_previous`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from jaxlake.io import read_json
from jaxlake.metrics import build_writer
from jaxlake.mixture import load_mixture, mixture_to_obj
from jaxlake.pipeline.settings import RunSettings

#: The starting policy's suite evaluation, in the run folder (``pipeline.start_eval``:
#: :func:`jaxlake.pipeline.stages.step_start_eval`), row 0 of :func:`stage_table`.
START_EVAL = "start_eval.json"


def stage_metrics(record: dict, decision: dict) -> dict:
    """The metrics row of a finished stage: phase ``stage``, step ``k``, the suite scores per
    decoding mode, the own-environment scores and the engineer's decision."""
    return {
        "phase": "stage",
        "step": record["stage"],
        "suite": {m: v for m, v in record["scores"].items() if v is not None},
        "current_env": {m: v for m, v in record["current_env"].items() if v is not None},
        "engineer": {"decision": str(record["decision"]), "reason": str(record["reason"]),
                     "changed": bool(decision.get("changed")), "wall_s": float(decision.get("wall_s") or 0.0)},
    }


def log_stage(cfg: Any, record: dict, decision: dict) -> None:
    """Log :func:`stage_metrics` to the run's back ends (``logger``): ``<run dir>/stages.jsonl``,
    ``<run dir>/tb/stage/``, the run folder's W&B run. Stage ``k``'s row replaces any row of
    stage ``k`` or later from an earlier attempt (``truncate("stage", k - 1)``). ``cfg``: the
    :class:`RunSettings` or a raw config."""
    s = RunSettings.of(cfg)
    k = int(record["stage"])
    with build_writer(s.logger, s.run_dir, jsonl_name="stages.jsonl", phases=("stage",),
                      name=s.experiment, run_config=s.record()) as writer:
        writer.truncate("stage", k - 1)
        writer.append(stage_metrics(record, decision))


def _scores(ev: dict) -> dict:
    """A suite evaluation's scores per decoding mode, on the suite and on the own environment."""
    cur = (ev.get("current_env") or {}).get("modes") or {}
    return {"scores": {m: r.get("score") for m, r in (ev.get("modes") or {}).items()},
            "current_env": {m: r.get("score") for m, r in cur.items()}}


def stage_record(d: Path, k: int) -> dict:
    ev = read_json(d / "eval.json")
    eng = read_json(d / "engineer.json")
    return {
        "stage": k,
        "dir": str(d),
        "env": mixture_to_obj(load_mixture(d / "env.yaml")),
        **_scores(ev),
        "decision": eng.get("decision"),
        "reason": eng.get("reason"),
        "next_env": eng.get("proposal"),
    }


def start_record(run_dir: Path) -> Optional[dict]:
    """Row 0 of :func:`stage_table`: the starting policy's scores from the run folder's
    ``start_eval.json`` (``None`` when it is not there or unreadable); no environment of its
    own (its own-environment check is on stage 1's lakes) and no engineer decision."""
    try:
        ev = read_json(Path(run_dir) / START_EVAL)
    except (OSError, ValueError):
        return None
    return {"stage": 0, "dir": str(run_dir), "env": None, "label": f"start: {ev.get('checkpoint') or 'the starting policy'}",
            **_scores(ev), "decision": None, "reason": None, "next_env": None}


#: Mixtures of more components than this are summarised by each field's range.
SHORT_ENV_COMPONENTS = 3


def _span(values: list) -> str:
    lo, hi = min(values), max(values)
    return f"{lo:g}" if lo == hi else f"{lo:g}-{hi:g}"


def short_env(mixture_obj: list) -> str:
    """A mixture in one line: ``5x5 n=2 holes=0.1 conflict=0.5``, ``0.50*(...) + 0.50*(...)``;
    beyond :data:`SHORT_ENV_COMPONENTS` components each field's range, ``8 configs, equal
    weights: 4x4-6x6 n=1-2 holes=0-0.2 conflict=0-1``."""
    keys = ("height", "width", "num_agents", "hole_density", "conflict_density")
    if len(mixture_obj) > SHORT_ENV_COMPONENTS:
        cs = [comp["config"] for comp in mixture_obj]
        hs, ws = [c["height"] for c in cs], [c["width"] for c in cs]
        size = (f"{min(hs)}x{min(hs)}-{max(hs)}x{max(hs)}" if hs == ws and min(hs) != max(hs)
                else f"{_span(hs)}x{_span(ws)}")
        weights = [float(comp["weight"]) for comp in mixture_obj]
        said = "equal weights" if max(weights) - min(weights) < 1e-6 else f"weights {min(weights):.2f}-{max(weights):.2f}"
        return (f"{len(cs)} configs, {said}: {size} n={_span([c['num_agents'] for c in cs])} "
                f"holes={_span([c['hole_density'] for c in cs])} conflict={_span([c['conflict_density'] for c in cs])}")
    parts = []
    for comp in mixture_obj:
        c = comp["config"]
        body = "{}x{} n={} holes={:g} conflict={:g}".format(*(c[k] for k in keys))
        parts.append(body if len(mixture_obj) == 1 else f"{comp['weight']:.2f}*({body})")
    return " + ".join(parts)


def _paired_against_file(record: dict, before: Path) -> Optional[Any]:
    """Stage ``record``'s greedy suite episodes paired with those of the evaluation ``before``
    (``None`` when it is missing, or not of the same suite)."""
    from llm.training.evaluate import paired_against

    if int(record["stage"]) < 1 or not before.is_file():
        return None
    try:
        return paired_against(read_json(Path(record["dir"]) / "eval.json"), read_json(before), mode="greedy")[1]
    except (ValueError, KeyError, OSError):
        return None


def paired_with_previous(record: dict) -> Optional[Any]:
    """Stage ``k``'s greedy suite score against stage ``k - 1``'s on the same lakes, a
    :class:`jaxlake.stats.PairedDifference` (``llm.training.evaluate.paired_against``), read
    from the two stage folders' ``eval.json`` (stage 1's against the run folder's
    ``start_eval.json``, the starting policy's); ``None`` when the previous evaluation is
    missing or the two are not of one suite (another ``eval=``)."""
    k, here = int(record["stage"]), Path(record["dir"])
    return _paired_against_file(record, here.parent / (START_EVAL if k == 1 else f"stage_{k - 1}/eval.json"))


def _paired_cell(d: Optional[Any]) -> str:
    return "–" if d is None else f"{d.diff:+.3f} ± {d.half_width:.3f} ({d.wins} won, {d.losses} lost)"


def paired_with_start(record: dict) -> Optional[Any]:
    """Stage ``k``'s greedy suite score against the starting policy's (the run folder's
    ``start_eval.json``) on the same lakes: what the run has gained so far."""
    return _paired_against_file(record, Path(record["dir"]).parent / START_EVAL)


def run_gain_line(records: list) -> Optional[str]:
    """One line under the stage table: the last stage against the start, paired (``None``
    without a start evaluation)."""
    if not records:
        return None
    d = paired_with_start(records[-1])
    if d is None:
        return None
    return f"stage {records[-1]['stage']} vs the start (stage 0), paired on the suite: {_paired_cell(d)}"


def stage_table(records: list) -> str:
    """Markdown table: stage, environment, suite scores, the greedy score's paired change from
    the stage before (95 % interval; lakes won and lost), own-environment success, decision.
    Row 0, when the run folder has ``start_eval.json``: the starting policy, on stage 1's
    environment (stage 1's paired change is against it)."""
    modes = sorted({m for r in records for m in r["scores"]}, key=lambda m: (m != "greedy", m))
    head = ("| stage | environment | " + " | ".join(f"suite {m}" for m in modes)
            + " | greedy vs previous stage | own env (greedy) | engineer |")
    rows = [head, "|---|---|" + "---|" * len(modes) + "---|---|---|"]
    start = start_record(Path(records[0]["dir"]).parent) if records and int(records[0]["stage"]) == 1 else None
    for r in ([start] if start else []) + list(records):
        scores = " | ".join("–" if r["scores"].get(m) is None else f"{r['scores'][m]:.3f}" for m in modes)
        own = r["current_env"].get("greedy")
        env = r.get("label") or short_env(r["env"])
        decision = "–" if r["decision"] is None else f"{r['decision']}: {r['reason']}"
        rows.append(
            f"| {r['stage']} | {env} | {scores} | {_paired_cell(paired_with_previous(r))} | "
            f"{'–' if own is None else f'{own:.3f}'} | {decision} |"
        )
    return "\n".join(rows)
