"""Summaries of a stage, as JSON and as rendered text (what the environment engineer reads).

Four parts, each switchable in the engineer's prompt (``conf/engineer/*.yaml`` ``context``):

* ``behaviour`` -- policy behaviour on the held-out suite: success, share arrived, fall /
  conflict / timeout / malformed rates, plan length and its ratio to the reference planner,
  broken down by every suite dimension; plus success on lakes of the training environment.
  Every line shows the malformed rate, and timeouts count well-formed answers only (a
  malformed answer that leaves agents standing is not a timeout).
* ``failures``  -- ``k`` failed episodes chosen to cover every failure type (malformed,
  fell, conflict, timeout) before repeating one, from as many different cells as possible:
  the grid, the plan, and each cause with its step.
* ``env_stats`` -- statistics of the training environment: targets against achieved hole
  and conflict densities, path lengths, share of lakes within the distance bounds, share
  solvable by the reference planner; per mixture component.
* ``history``   -- the stage history: each stage's environment, scores and the engineer's
  decision, with its analysis when it reasoned (cut at :data:`ANALYSIS_CHARS`).

:func:`summarize` builds the JSON (``summary.json``); :func:`render_summary` the text.
Inputs are plain JSON (an ``eval.json`` dict, see :mod:`jaxlake.suite` for episode records),
so a synthetic evaluation summarises like a real one.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

import jax
import numpy as np

from jaxlake.config import LakeConfig
from jaxlake.suite import FAILURE_TYPES, METRIC_KEYS

#: Summary parts, in prompt order.
PARTS = ("behaviour", "failures", "env_stats", "history")
#: Metrics shown per dimension value (the full set is in eval.json).
DIM_METRICS = ("score", "arrived_share", "fall_rate", "conflict_rate", "timeout_rate", "malformed_rate")


# ============================================================================ behaviour
def _round(x: Any, nd: int = 3) -> Any:
    return None if x is None else round(float(x), nd)


def _wellformed_timeout_rate(records: Sequence[Mapping[str, Any]]) -> Optional[float]:
    """Share of episodes that timed out with a well-formed answer (a malformed answer that
    leaves agents standing until the horizon is counted as malformed, not as a timeout)."""
    if not records:
        return None
    return float(np.mean([r["timed_out"] > 0 and not r["malformed"] for r in records]))


def _by_dim_episodes(eval_result: Mapping[str, Any], mode: str, dims: Sequence[str]) -> dict[str, dict[str, list]]:
    """``{dim: {value key: [episode records]}}`` of one mode, from the suite's cells."""
    from jaxlake.suite import value_key

    cells = {c["id"]: c.get("values") or {} for c in (eval_result.get("suite") or {}).get("cells", [])}
    out: dict[str, dict[str, list]] = {d: {} for d in dims}
    for r in eval_result.get("episodes") or []:
        if r.get("mode", mode) != mode or r.get("cell") not in cells:
            continue
        for d in dims:
            if d in cells[r["cell"]]:
                out[d].setdefault(value_key(cells[r["cell"]][d]), []).append(r)
    return out


def behaviour(eval_result: Mapping[str, Any], mode: str = "greedy") -> dict:
    """Overall metrics, per-dimension breakdown and training-env success of one mode.

    Every line carries the malformed rate; ``timeout_rate`` here counts only episodes with a
    well-formed answer (:func:`_wellformed_timeout_rate`), recomputed from the episode
    records when ``eval_result`` has them (``eval.json`` always does; without them the
    evaluation's own ``timeout_rate`` is shown as it is).
    """
    modes = eval_result.get("modes") or {}
    if mode not in modes:
        mode = next(iter(modes), mode)
    res = modes.get(mode) or {}
    out: dict[str, Any] = {
        "mode": mode,
        "n": res.get("n", 0),
        "overall": {k: _round(res.get(k)) for k in METRIC_KEYS},
        "by_dim": {
            dim: {v: {k: _round(m.get(k)) for k in DIM_METRICS} | {"n": m.get("n", 0)} for v, m in vals.items()}
            for dim, vals in (res.get("by_dim") or {}).items()
        },
        "scores": {m: _round(r.get("score")) for m, r in modes.items()},
    }
    episodes = [r for r in eval_result.get("episodes") or [] if r.get("mode", mode) == mode]
    if episodes:
        out["overall"]["timeout_rate"] = _round(_wellformed_timeout_rate(episodes))
        for dim, groups in _by_dim_episodes(eval_result, mode, list(out["by_dim"])).items():
            for v, recs in groups.items():
                if v in out["by_dim"][dim]:
                    out["by_dim"][dim][v]["timeout_rate"] = _round(_wellformed_timeout_rate(recs))
    out["timeouts_wellformed_only"] = bool(episodes)
    cur_node = eval_result.get("current_env") or {}
    cur = (cur_node.get("modes") or {}).get(mode)
    if cur:
        out["current_env"] = {k: _round(cur.get(k)) for k in METRIC_KEYS} | {"n": cur.get("n", 0)}
        cur_eps = [r for r in cur_node.get("episodes") or [] if r.get("mode", mode) == mode]
        if cur_eps:
            out["current_env"]["timeout_rate"] = _round(_wellformed_timeout_rate(cur_eps))
        comps = cur.get("by_component") or []
        if len(comps) > 1:  # a mixture: each component's success on its own lakes, not only the pool
            out["current_env"]["components"] = [
                {"weight": _round(c["weight"]), "config": c["config"], "n": c.get("n", 0),
                 **{k: _round(c.get(k)) for k in ("score", "fall_rate", "malformed_rate")}}
                for c in comps
            ]
    return out


# ============================================================================ failures
def _cause_lines(rec: Mapping[str, Any]) -> list[tuple[int, str, str]]:
    """``(step, type, text)`` for every failure cause of an episode, earliest first."""
    ev = rec.get("events") or {}
    causes = []
    if rec.get("malformed"):
        reasons = rec.get("malformed_reasons") or ["off-format text"]
        causes.append((0, "malformed", f"malformed answer: {reasons[0]}"))
    f = ev.get("first_fall")
    if f:
        causes.append((f["step"], "fell", f"step {f['step']}: agent {f['agent']} fell into the hole at row {f['cell'][0]} col {f['cell'][1]}"))
    c = ev.get("first_conflict")
    if c:
        causes.append(
            (
                c["step"],
                "conflict",
                f"step {c['step']}: agent {c['agent']}'s move {c['action']} from row {c['cell'][0]} col "
                f"{c['cell'][1]} was cancelled ({c['kind']} conflict)",
            )
        )
    for t in ev.get("timeouts") or []:
        causes.append(
            (
                t["step"],
                "timeout",
                f"step {t['step']}: agent {t['agent']} timed out at row {t['cell'][0]} col {t['cell'][1]}, "
                f"its goal is at row {t['goal'][0]} col {t['goal'][1]}",
            )
        )
    causes.sort(key=lambda x: x[0])
    return causes


def select_failures(records: Sequence[Mapping[str, Any]], k: int) -> list[Mapping[str, Any]]:
    """Up to ``k`` failed episodes: first one per failure type (in :data:`FAILURE_TYPES`
    order, preferring cells not chosen yet), then round robin over cells. Deterministic."""
    failed = sorted(
        (r for r in records if not r["success"]),
        key=lambda r: (r.get("mode") != "greedy", r.get("cell", -1), r.get("lake", 0), r.get("sample", 0)),
    )
    chosen: list[Mapping[str, Any]] = []
    used: set[int] = set()

    def ident(r):
        return (r.get("mode"), r.get("lake"), r.get("sample"))

    taken: set = set()
    for ftype in FAILURE_TYPES:
        if len(chosen) >= k:
            break
        if any(ftype in r["failure_types"] for r in chosen):
            continue
        having = [r for r in failed if ftype in r["failure_types"] and ident(r) not in taken]
        if not having:
            continue
        fresh = [r for r in having if r.get("cell") not in used]
        pick = (fresh or having)[0]
        chosen.append(pick)
        taken.add(ident(pick))
        used.add(pick.get("cell"))
    while len(chosen) < k:
        rest = [r for r in failed if ident(r) not in taken]
        if not rest:
            break
        fresh = [r for r in rest if r.get("cell") not in used]
        if not fresh:
            used = set()
            fresh = rest
        pick = fresh[0]
        chosen.append(pick)
        taken.add(ident(pick))
        used.add(pick.get("cell"))
    return chosen


def failure_cases(eval_result: Mapping[str, Any], k: int = 6) -> dict:
    """JSON of ``k`` failure cases covering every failure type present (suite episodes)."""
    episodes = eval_result.get("episodes") or []
    grids = eval_result.get("grids") or []
    cells = {c["id"]: c for c in (eval_result.get("suite") or {}).get("cells", [])}
    present = sorted({t for r in episodes for t in r.get("failure_types", [])}, key=FAILURE_TYPES.index)
    cases = []
    for r in select_failures(episodes, int(k)):
        causes = _cause_lines(r)
        lake = r.get("lake")
        cases.append(
            {
                "mode": r.get("mode"),
                "lake": lake,
                "cell": cells.get(r.get("cell"), {}).get("values"),
                "failure_types": list(r["failure_types"]),
                "grid": grids[lake] if isinstance(lake, int) and 0 <= lake < len(grids) else None,
                "plan": r.get("plan", ""),
                "completion": r.get("completion", ""),
                "step": causes[0][0] if causes else None,
                "cause": causes[0][2] if causes else "did not arrive",
                "causes": [c[2] for c in causes],
                "arrived_share": r.get("arrived_share"),
            }
        )
    covered = sorted({t for c in cases for t in c["failure_types"]}, key=FAILURE_TYPES.index)
    return {"types_present": present, "types_covered": covered, "cases": cases}


# ============================================================================ env stats
def environment_stats(mixture: Sequence[tuple[float, LakeConfig]], n: int, key: jax.Array, solve: bool = True) -> dict:
    """Statistics of ``n`` lakes generated from a mixture (``round(w * n)`` per component,
    at least one): achieved densities against targets, path lengths, distance bounds met,
    share solvable by the reference planner. Overall values weight components by ``w``."""
    from jaxlake.suite import generate_lakes, reference_soc

    comps = []
    for i, (w, cfg) in enumerate(mixture):
        m = max(1, int(round(float(w) * n)))
        keys = jax.random.split(jax.random.fold_in(key, i), m)
        lakes = generate_lakes(keys, [cfg] * m)
        st = jax.device_get(lakes.stats)
        present = np.asarray(lakes.agent_mask)
        path = np.asarray(st.path_len)[present]
        soc = reference_soc(lakes) if solve else None
        comps.append(
            {
                "weight": round(float(w), 4),
                "config": cfg.to_dict(),
                "lakes": m,
                "target_hole_density": cfg.hole_density,
                "hole_density": float(np.mean(st.hole_density)),
                "target_conflict_density": cfg.conflict_density,
                "conflict_density": float(np.mean(st.conflict_density)),
                "path_len_mean": float(np.mean(path)) if path.size else None,
                "path_len_min": int(np.min(path)) if path.size else None,
                "path_len_max": int(np.max(path)) if path.size else None,
                "dist_ok": float(np.mean(st.dist_ok)),
                "attempts_mean": float(np.mean(st.attempts)),
                "solvable": None if soc is None else float(np.mean(soc >= 0)),
            }
        )
    total = sum(c["weight"] for c in comps) or 1.0

    def wmean(key_):
        vals = [(c["weight"], c[key_]) for c in comps if c[key_] is not None]
        return None if not vals else float(sum(w * v for w, v in vals) / sum(w for w, _ in vals))

    overall = {k: wmean(k) for k in ("hole_density", "conflict_density", "path_len_mean", "dist_ok", "solvable")}
    return {"lakes": sum(c["lakes"] for c in comps), "overall": overall, "components": comps, "weight_sum": total}


# ============================================================================ history
def history_entry(
    stage: int,
    mixture: Sequence[tuple[float, LakeConfig]],
    eval_result: Optional[Mapping[str, Any]] = None,
    train: Optional[Mapping[str, Any]] = None,
    engineer: Optional[Mapping[str, Any]] = None,
) -> dict:
    """One stage of the history: its environment, scores, training metrics and decision."""
    entry: dict[str, Any] = {
        "stage": int(stage),
        "env": [{"weight": round(float(w), 4), "config": c.to_dict()} for w, c in mixture],
    }
    if eval_result is not None:
        entry["scores"] = {m: _round(r.get("score")) for m, r in (eval_result.get("modes") or {}).items()}
        cur = (eval_result.get("current_env") or {}).get("modes") or {}
        if cur:
            entry["current_env_scores"] = {m: _round(r.get("score")) for m, r in cur.items()}
    if train:
        entry["train"] = {k: (_round(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v) for k, v in train.items()}
    if engineer:
        entry["engineer"] = {k: engineer.get(k) for k in ("engineer", "decision", "reason", "analysis")
                             if engineer.get(k) is not None}
    return entry


# ============================================================================ summary
def summarize(
    eval_result: Mapping[str, Any],
    env_stats: Optional[Mapping[str, Any]] = None,
    history: Sequence[Mapping[str, Any]] = (),
    k_failures: int = 6,
    mode: str = "greedy",
) -> dict:
    """The stage summary (``summary.json``): ``behaviour``, ``failures``, ``env_stats``,
    ``history`` (see the module docstring)."""
    return {
        "behaviour": behaviour(eval_result, mode),
        "failures": failure_cases(eval_result, k_failures),
        "env_stats": dict(env_stats) if env_stats is not None else None,
        "history": [dict(h) for h in history],
    }


def _fmt(x: Any, nd: int = 2) -> str:
    if x is None:
        return "n/a"
    if isinstance(x, float):
        return f"{x:.{nd}f}"
    return str(x)


def _config_line(cfg: Mapping[str, Any]) -> str:
    keys = ("height", "width", "num_agents", "hole_density", "conflict_density", "slip_prob", "max_steps", "min_dist", "max_dist", "on_goal")
    return ", ".join(f"{k}={_fmt(cfg[k])}" for k in keys if k in cfg)


def brief_config(cfg: Mapping[str, Any]) -> str:
    """A config in the brief summary's few words: ``6x6, 2 agents, holes 0.2, conflict 0.5``
    (slip, a step limit, distance bounds and the goal rule only where they are set)."""
    n = cfg.get("num_agents", 1)
    out = [f"{cfg.get('height')}x{cfg.get('width')}", f"{n} agent{'s' if n != 1 else ''}",
           f"holes {_fmt(cfg.get('hole_density', 0.0), 1)}", f"conflict {_fmt(cfg.get('conflict_density', 0.0))}"]
    if cfg.get("slip_prob"):
        out.append(f"slip {_fmt(cfg['slip_prob'])}")
    if cfg.get("max_dist") is not None:
        out.append(f"distance {cfg.get('min_dist', 1)}-{cfg['max_dist']}")
    elif cfg.get("min_dist", 1) not in (None, 1):
        out.append(f"distance >= {cfg['min_dist']}")
    return ", ".join(out)


def current_env_line(c: Mapping[str, Any]) -> str:
    """The behaviour part's line of the policy on its training environment (``current_env``),
    the same in the full and the brief summary: the line the engineer's teacher reads."""
    return (f"on the training environment ({c['n']} lakes): success {_fmt(c['score'])}, arrived "
            f"{_fmt(c['arrived_share'])}, fall {_fmt(c['fall_rate'])}, conflict {_fmt(c.get('conflict_rate'))}, "
            f"timeout {_fmt(c['timeout_rate'])}, malformed {_fmt(c.get('malformed_rate'))}")


def _render_behaviour(b: Mapping[str, Any], brief: bool = False) -> list[str]:
    if brief:
        return _brief_behaviour(b)
    o = b["overall"]
    lines = [
        f"## Policy behaviour on the held-out suite ({b['mode']} decoding, {b['n']} episodes)",
        f"success {_fmt(o['score'])}, agents arrived {_fmt(o['arrived_share'])}, episodes with a fall "
        f"{_fmt(o['fall_rate'])}, with a conflict {_fmt(o['conflict_rate'])}, with a timeout "
        f"{_fmt(o['timeout_rate'])}, malformed {_fmt(o['malformed_rate'])}",
        f"written plan length {_fmt(o['plan_len'], 1)} steps; on successes the plan costs "
        f"{_fmt(o['soc_ratio'])} times the reference planner's; planner solves {_fmt(o['solvable'])} of the lakes",
    ]
    if "current_env" in b:
        c = b["current_env"]
        lines.append(current_env_line(c))
        for i, comp in enumerate(c.get("components") or []):
            lines.append(
                f"- component #{i}, weight {_fmt(comp['weight'])}: {_config_line(comp['config'])} ({comp['n']} lakes): "
                f"success {_fmt(comp['score'])}, fall {_fmt(comp['fall_rate'])}, malformed {_fmt(comp['malformed_rate'])}"
            )
    if b.get("timeouts_wellformed_only"):
        lines.append("(timeouts count well-formed answers only; a malformed answer counts as malformed)")
    for dim, vals in b["by_dim"].items():
        parts = [
            f"{v}: success {_fmt(m['score'])} fall {_fmt(m['fall_rate'])} conflict {_fmt(m['conflict_rate'])} "
            f"timeout {_fmt(m['timeout_rate'])} malformed {_fmt(m.get('malformed_rate'))}"
            for v, m in vals.items()
        ]
        lines.append(f"by {dim}: " + "; ".join(parts))
    other = {m: s for m, s in b.get("scores", {}).items() if m != b["mode"]}
    if other:
        lines.append("other decoding: " + ", ".join(f"{m} success {_fmt(s)}" for m, s in other.items()))
    return lines


def _rates(m: Mapping[str, Any], keys: Sequence[str] = ("fall", "conflict", "timeout", "malformed")) -> str:
    return ", ".join(f"{k} {_fmt(m.get(k + '_rate'))}" for k in keys)


def _brief_behaviour(b: Mapping[str, Any]) -> list[str]:
    """The behaviour part in few tokens (small models' context): the same headline rates, the
    training environment's line word for word (the line a reader acts on), a component a line
    (by its ``#``, the current environment's numbering) and success only by dimension."""
    o = b["overall"]
    lines = [f"## Policy behaviour on the held-out suite ({b['mode']}, {b['n']} episodes)",
             f"success {_fmt(o['score'])}, arrived {_fmt(o['arrived_share'])}, {_rates(o)}"]
    if "current_env" in b:
        c = b["current_env"]
        lines.append(current_env_line(c))
        for i, comp in enumerate(c.get("components") or []):
            lines.append(f"- #{i}: success {_fmt(comp['score'])}, fall {_fmt(comp['fall_rate'])}")
    for dim, vals in b["by_dim"].items():
        lines.append(f"success by {dim}: " + ", ".join(f"{v} {_fmt(m['score'])}" for v, m in vals.items()))
    return lines


def _render_failures(f: Mapping[str, Any]) -> list[str]:
    lines = [f"## Failure cases ({len(f['cases'])}; types seen: {', '.join(f['types_present']) or 'none'})"]
    for i, c in enumerate(f["cases"], start=1):
        cell = ", ".join(f"{k}={v}" for k, v in (c.get("cell") or {}).items())
        lines.append(f"### Case {i}: {', '.join(c['failure_types'])} ({cell})")
        if c.get("grid"):
            lines.append("grid:")
            lines.append(c["grid"])
        written = (c.get("completion") or "").strip()
        if written and written != (c["plan"] or "").strip():
            # malformed answers: show what the policy wrote, then what the simulator ran
            lines.append("answer as written:")
            lines.append(written)
            lines.append("plan as read:")
        else:
            lines.append("plan:")
        lines.append(c["plan"] or "(empty)")
        for cause in c["causes"] or [c["cause"]]:
            lines.append(f"- {cause}")
    return lines


def _render_env_stats(e: Optional[Mapping[str, Any]], brief: bool = False) -> list[str]:
    if not e:
        return ["## Training environment statistics", "(not measured)"]
    o = e["overall"]
    if brief:
        return [f"## Training environment statistics ({e['lakes']} lakes)",
                f"holes {_fmt(o['hole_density'])}, conflict {_fmt(o['conflict_density'])}, shortest path "
                f"{_fmt(o['path_len_mean'], 1)}, solvable {_fmt(o['solvable'])}"] + [
            f"- #{i}: holes {_fmt(c['hole_density'])}, conflict {_fmt(c['conflict_density'])}, path "
            f"{_fmt(c['path_len_mean'], 1)} [{c['path_len_min']}, {c['path_len_max']}], solvable {_fmt(c['solvable'])}"
            for i, c in enumerate(e["components"])]
    lines = [
        f"## Training environment statistics ({e['lakes']} generated lakes)",
        f"hole density {_fmt(o['hole_density'])}, conflict density {_fmt(o['conflict_density'])}, mean "
        f"shortest path {_fmt(o['path_len_mean'], 1)}, distance bounds met {_fmt(o['dist_ok'])}, solvable by "
        f"the planner {_fmt(o['solvable'])}",
    ]
    for i, c in enumerate(e["components"]):
        lines.append(
            f"- #{i} weight {_fmt(c['weight'])}: {_config_line(c['config'])}; achieved hole density "
            f"{_fmt(c['hole_density'])} (target {_fmt(c['target_hole_density'])}), conflict density "
            f"{_fmt(c['conflict_density'])} (target {_fmt(c['target_conflict_density'])}), path length "
            f"{_fmt(c['path_len_mean'], 1)} [{c['path_len_min']}, {c['path_len_max']}], solvable {_fmt(c['solvable'])}"
        )
    return lines


#: Longest engineer analysis shown per stage of the history (characters; cut with "...").
ANALYSIS_CHARS = 400


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."


def _render_history(h: Sequence[Mapping[str, Any]], brief: bool = False) -> list[str]:
    lines = ["## Stage history"]
    if not h:
        lines.append("(first stage)")
    config = brief_config if brief else _config_line
    for e in h:
        env = "; ".join(f"{_fmt(c['weight'])} x ({config(c['config'])})" for c in e["env"])
        scores = ", ".join(f"{m} {_fmt(s)}" for m, s in (e.get("scores") or {}).items())
        line = f"stage {e['stage']}: env {env}"
        if scores:
            line += f" -> suite success {scores}"
        cur = e.get("current_env_scores")
        if cur:
            line += ", on its own env " + ", ".join(f"{m} {_fmt(s)}" for m, s in cur.items())
        eng = e.get("engineer")
        if eng:
            line += f"; engineer {eng.get('decision')}: {eng.get('reason')}"
            if eng.get("analysis"):  # reasoning engineers: why this environment was chosen
                line += f"\n  analysis: {_clip(' '.join(str(eng['analysis']).split()), ANALYSIS_CHARS)}"
        lines.append(line)
    return lines


def render_summary(summary: Mapping[str, Any], parts: Sequence[str] = PARTS, brief: bool = False) -> str:
    """The summary as text, with only the ``parts`` asked for (in :data:`PARTS` order).

    ``brief``: the same numbers a reader acts on in about a third of the tokens, for a model
    whose context cannot hold the full text (configs as :func:`brief_config`, a component
    a short line, success only by dimension, no plan-length line; failure cases as in full)."""
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        raise ValueError(f"unknown summary part(s) {unknown}; choose from {list(PARTS)}")
    chunks = []
    if "behaviour" in parts:
        chunks.append(_render_behaviour(summary["behaviour"], brief))
    if "failures" in parts:
        chunks.append(_render_failures(summary["failures"]))
    if "env_stats" in parts:
        chunks.append(_render_env_stats(summary.get("env_stats"), brief))
    if "history" in parts:
        chunks.append(_render_history(summary.get("history") or [], brief))
    return "\n\n".join("\n".join(c) for c in chunks)
