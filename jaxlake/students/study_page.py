"""The UED study's page (docs/research/ued-study.md): the records' statistics, the page's JSON
and its generated Markdown block (:mod:`jaxlake.students.study` runs the units and calls these).

* :func:`encode` / :func:`decode`: a unit record's per-lake successes as hex of packed bits;
* :func:`paired`: a row against the baseline on the same lakes, over seeds and lake-pooled;
* :func:`payload`: the page's JSON from the records (per row its seeds, success per seed on the
  suite and every cell, CPU time, learning curve, and :func:`paired` against the baseline);
* :func:`render` / :func:`write_page`: the block between :data:`BEGIN` and :data:`END`, written
  from the JSON alone (the rest of the page is hand-written and kept), and :func:`verdict`,
  the plain sentence at its end.

Pure functions of records and JSON: no JAX, no training.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from jaxlake.io import write_json, write_marked
from jaxlake.stats import mean_ci, paired_difference

__all__ = ["BEGIN", "COMMAND", "END", "decode", "encode", "page_block", "paired", "payload", "render", "ued_text",
           "verdict", "write_page"]

BEGIN = "<!-- ued-study:begin -->"
END = "<!-- ued-study:end -->"
COMMAND = "python -m jaxlake.students.study"


def encode(success: Sequence[bool]) -> str:
    """Per-lake successes as hex of their packed bits (1024 lakes: 256 characters)."""
    return np.packbits(np.asarray(success, bool)).tobytes().hex()


def decode(text: str, n: int) -> np.ndarray:
    """The ``[n]`` bool successes :func:`encode` wrote."""
    return np.unpackbits(np.frombuffer(bytes.fromhex(text), np.uint8))[:n].astype(bool)


def paired(base: Mapping[int, np.ndarray], other: Mapping[int, np.ndarray]) -> Optional[dict]:
    """``other`` against ``base`` on the seeds both have (``{seed: [N] bool}``, the same lakes):

    * ``over_seeds``: per seed the difference of the success rates, then their mean, the
      half-width of the 95 % t interval over seeds and ``n`` seeds (:func:`jaxlake.stats.mean_ci`);
    * ``pooled``: every (seed, lake) pair as one paired lake (:func:`jaxlake.stats.paired_difference`):
      difference, half-width, lakes won and lost, the sign test's p, pairs.
    None when no seed is shared."""
    seeds = sorted(set(base) & set(other))
    if not seeds:
        return None
    per_seed = [float(np.mean(other[s]) - np.mean(base[s])) for s in seeds]
    m, h, n = mean_ci(per_seed)
    pd = paired_difference(np.concatenate([base[s] for s in seeds]), np.concatenate([other[s] for s in seeds]))
    return {"seeds": seeds, "per_seed": [round(d, 6) for d in per_seed],
            "over_seeds": {"diff": round(m, 6), "half": None if h is None else round(h, 6), "n": n},
            "pooled": {"diff": round(pd.diff, 6), "half": round(pd.half_width, 6), "won": pd.wins, "lost": pd.losses,
                       "p": float(f"{pd.p_value:.3g}"), "n": pd.n}}


def _outcomes(records: Sequence[dict], n: int) -> dict:
    """``{variant: {cell: {seed: [N] bool}}}`` of the records."""
    out: dict = {}
    for rec in records:
        cells = out.setdefault(rec["variant"], {})
        for cell, rows in rec["outcomes"].items():
            for seed, text in zip(rec["seeds"], rows):
                cells.setdefault(cell, {})[int(seed)] = decode(text, n)
    return out


def _per_seed(recs: Sequence[dict], key: str, fallback: str) -> list:
    """A record field per seed, in seed order (records before it was kept: the nominal value)."""
    pairs = [(s, v) for r in recs for s, v in zip(r["seeds"], r.get(key) or [r[fallback]] * len(r["seeds"]))]
    return [int(v) for _, v in sorted(pairs)]


def payload(records: Sequence[dict], study_node: Mapping[str, Any], support: Mapping[str, bool],
            commit: Optional[str] = None, command: str = COMMAND) -> dict:
    """The page's JSON from the (non-empty) records: per variant its seeds, success per seed
    (suite and cells), CPU time, curve, and :func:`paired` against the baseline (suite and
    cells); ``support`` marks each cell in or out of the training generator's support."""
    settings = records[0]["settings"]
    n, cells = int(settings["lakes_per_cell"]), list(settings["cells"])
    baseline = study_node["baseline"]
    names = list(study_node["methods"]) + [f"engineer_{e}" for e in study_node.get("engineers") or ()]
    order = [m for m in names if any(r["variant"] == m for r in records)]
    data = _outcomes(records, n)
    suite = {v: {s: np.concatenate([data[v][c][s] for c in cells]) for s in data[v][cells[0]]} for v in data}
    variants = []
    for v in order:
        recs = [r for r in records if r["variant"] == v]
        seeds = sorted(suite[v])
        curves = [row for r in recs if r.get("curve") for row in r["curve"]["success"]]
        row = {
            "name": v, "ued": recs[0]["ued"], "updates": recs[0]["updates"], "env_steps": recs[0]["env_steps"],
            "grad_steps": _per_seed(recs, "grad_steps", "updates"), "lake_steps": _per_seed(recs, "lake_steps", "env_steps"),
            "seeds": seeds, "cpu_s": round(sum(r["cpu_s"] for r in recs), 1),
            "wall_s": round(sum(r["wall_s"] for r in recs), 1),
            "suite": [round(float(np.mean(suite[v][s])), 6) for s in seeds],
            "cells": {c: [round(float(np.mean(data[v][c][s])), 6) for s in seeds] for c in cells},
            "curve": None if not curves else {"update": recs[0]["curve"]["update"],
                                              "success": [round(float(x), 4) for x in np.mean(np.asarray(curves), axis=0)]},
        }
        if v != baseline and baseline in suite:
            row["vs_baseline"] = {"suite": paired(suite[baseline], suite[v]),
                                  "cells": {c: paired(data[baseline][c], data[v][c]) for c in cells}}
        variants.append(row)
    return {"command": command, "commit": commit, "baseline": baseline, "settings": settings,
            "machine": records[0].get("machine", {}), "in_support": dict(support), "variants": variants}


def _ci(values: Sequence[float]) -> str:
    m, h, n = mean_ci(values)
    if m is None:
        return "–"
    return f"{m:.3f}" if h is None else f"{m:.3f} ± {h:.3f}"


def _signed(d: Optional[dict]) -> str:
    if d is None:
        return "–"
    o = d["over_seeds"]
    return f"{o['diff']:+.3f}" + ("" if o["half"] is None else f" ± {o['half']:.3f}")


def verdict(payload: Mapping[str, Any]) -> str:
    """The plain sentence: which methods beat the baseline on the suite (the interval over
    seeds above 0), which are behind it, which cannot be told apart at this power."""
    base = payload["baseline"]
    beat, behind, tied, tied_seeds = [], [], [], []
    for v in payload["variants"]:
        d = (v.get("vs_baseline") or {}).get("suite")
        if d is None:
            continue
        o = d["over_seeds"]
        text = f"`{v['name']}` ({o['diff']:+.3f} ± {o['half']:.3f})" if o["half"] is not None else f"`{v['name']}`"
        if o["half"] is None or abs(o["diff"]) <= o["half"]:
            tied.append(text)
            tied_seeds.append(len(v["seeds"]))
        else:
            (beat if o["diff"] > 0 else behind).append(text)
    seeds = min(tied_seeds, default=0)  # the tied rows' seeds (a row of fewer seeds elsewhere says nothing of them)
    parts = [f"Beat `{base}` on the held-out suite: " + (", ".join(beat) if beat else "none") + "."]
    if behind:
        parts.append(f"Behind `{base}`: " + ", ".join(behind) + ".")
    if tied:
        parts.append(f"Cannot be told apart from `{base}` with {seeds} seeds: " + ", ".join(tied) + ".")
    return " ".join(parts)


def _steps(x: float) -> str:
    """Lake steps: millions with two decimals from a million on, else the count."""
    return f"{x / 1e6:.2f} M" if x >= 1e6 else f"{x:,.0f}"


def ued_text(u: Mapping[str, Any]) -> str:
    """A row's ``ippo.ued`` in a few words."""
    method = u["method"]
    if method == "engineer":
        return f"engineer={u['engineer']}, {u['stages']} stages (dr inside)"
    if method == "dr":
        return "dr"
    if method == "sfl":
        parts = [f"{u['sfl_levels']} levels x {u['sfl_repeats']}", f"keep {u['sfl_buffer']}",
                 f"{u['sfl_ratio']:g} of a pool", f"every {u['sfl_every']}"]
    else:
        parts = [u["score"], "robust" if u["robust"] else "not robust"]
        if "replay_prob" in u:
            parts.append(f"replay {u['replay_prob']:g}")
        if method == "accel":
            parts.append(f"{'1-' if 'budget' in u else ''}{u['num_edits']} edits")
    if u.get("budget") == "lake_steps":
        parts.append("lake steps")
    return f"{method} ({', '.join(parts)})"


def render(payload: Mapping[str, Any]) -> str:
    """The generated block (without its markers), from the page's JSON alone."""
    s, base = payload["settings"], payload["baseline"]
    ippo, cells = s["ippo"], list(s["cells"])
    env = ", ".join(f"{c['config']['height']}x{c['config']['width']} n={c['config']['num_agents']} "
                    f"holes={c['config']['hole_density']:g}" for c in s["env"])
    variants = payload["variants"]
    cpu = sum(v["cpu_s"] for v in variants)
    wall = sum(v["wall_s"] for v in variants)

    def cell_text(name: str) -> str:
        f = s["cells"][name]
        return ", ".join(f"{k}={v}" for k, v in f.items()) or "the training lakes"

    support = payload.get("in_support") or {}

    m = payload.get("machine") or {}
    out = [
        f"**Command:** `{payload['command']}`" + (f" (commit `{payload['commit']}`)" if payload.get("commit") else "")
        + "  ",
        f"**Training:** {env}; every row {ippo['num_updates']} updates of {ippo['num_envs']} lakes x "
        f"{ippo['num_steps']} steps, the same IPPO settings, its `ippo.ued` the only difference. At the "
        f"`grad_steps` budget each of them is a policy update (the same gradient steps and learning-rate "
        f"schedule as `dr`, whose {variants[0]['env_steps']:,} lake steps a seed are the unit; plays without a "
        f"policy update come on top), at `lake_steps` a play, trained or not (`dr`'s lake steps); the table "
        f"gives each row's policy updates and lake steps (SFL's scoring rollouts included).  ",
        f"**Held-out suite:** {len(cells)} cells x {s['lakes_per_cell']} held-out lakes (seed {s['suite_seed']}), "
        "played greedily; the same lakes for every row and seed.  ",
        f"**Compute:** {cpu / 60:.1f} CPU min, {wall / 60:.1f} wall min ({m.get('backend', '?')}, "
        f"{m.get('cpu_count', '?')} cores), compiles and suite included.",
        "",
        *(["| cell | lake fields set on env | a lake the training generator can make |", "|---|---|---|",
            *[f"| {c} | {cell_text(c)} | {'yes' if support.get(c) else 'no'} |" for c in cells]] if support else
          ["| cell | lake fields set on env |", "|---|---|", *[f"| {c} | {cell_text(c)} |" for c in cells]]),
        "",
        "### Held-out success (greedy)",
        "",
        "Mean ± 95 % t interval over seeds; *suite* is the mean over all the cells' lakes.",
        "",
        "| row | ippo.ued | seeds | policy updates | lake steps | suite | " + " | ".join(cells) + " | CPU s a seed |",
        "|---|---|---|---|---|---|" + "---|" * len(cells) + "---|",
    ]
    for v in variants:
        n = max(len(v["seeds"]), 1)
        grad = v.get("grad_steps") or [v["updates"]] * n
        lake = v.get("lake_steps") or [v["env_steps"]] * n
        out.append(f"| {v['name']} | {ued_text(v['ued'])} | {len(v['seeds'])} | {np.mean(grad):.0f} | "
                   f"{_steps(np.mean(lake))} | {_ci(v['suite'])} | "
                   + " | ".join(_ci(v["cells"][c]) for c in cells) + f" | {v['cpu_s'] / n:.0f} |")
    out += ["", f"### Paired with `{base}`", "",
            f"*Over seeds*: per seed, the row's suite success minus `{base}`'s on the same lakes; mean ± 95 % t "
            f"interval over those differences. *Lakes pooled*: every (seed, lake) pair as one paired lake "
            f"(t interval over the per-lake differences; it leaves out the seed-to-seed spread, so it is the "
            f"narrower), lakes won and lost against `{base}`, and the exact sign test's p.", "",
            "| row | seeds | suite − " + base + ", over seeds | lakes pooled | won | lost | p |",
            "|---|---|---|---|---|---|---|"]
    for v in variants:
        d = (v.get("vs_baseline") or {}).get("suite")
        if d is None:
            continue
        p = d["pooled"]
        p_text = f"{p['p']:.2g}" if p["p"] > 0 else "< 1e-300"
        out.append(f"| {v['name']} | {d['over_seeds']['n']} | {_signed(d)} | {p['diff']:+.3f} ± {p['half']:.3f} | "
                   f"{p['won']} | {p['lost']} | {p_text} |")
    out += ["", f"Per cell, over seeds (mean ± 95 % t interval of the per-seed difference with `{base}`):", "",
            "| row | " + " | ".join(cells) + " |", "|---|" + "---|" * len(cells)]
    for v in variants:
        vb = v.get("vs_baseline")
        if vb is None:
            continue
        out.append(f"| {v['name']} | " + " | ".join(_signed(vb["cells"][c]) for c in cells) + " |")
    halves = [v["vs_baseline"]["suite"]["over_seeds"]["half"] for v in variants
              if v.get("vs_baseline") and v["vs_baseline"]["suite"]["over_seeds"]["half"] is not None]
    out += ["", "**Verdict.** " + verdict(payload)
            + (f" The widest paired interval over seeds on the suite is ±{max(halves):.3f}." if halves else "")]
    curved = [v for v in variants if v.get("curve")]
    if not curved:
        return "\n".join(out)
    updates = curved[0]["curve"]["update"]
    shown = curve_columns(len(updates))
    out += ["", "### In-jit check during training", "",
            f"Greedy success on {ippo['eval_lakes']} held-out lakes of the training distribution (the trainer's own "
            f"check, `ippo.eval_lakes`, every {ippo['eval_every']} updates), mean over seeds, by update.", "",
            "| row | " + " | ".join(str(updates[i]) for i in shown) + " |",
            "|---|" + "---|" * len(shown)]
    for v in curved:
        out.append(f"| {v['name']} | " + " | ".join(f"{v['curve']['success'][i]:.3f}" for i in shown) + " |")
    return "\n".join(out)


def curve_columns(n: int, most: int = 8) -> list[int]:
    """At most ``most`` evenly spaced chunk indices of ``n``, the last always included."""
    if n <= most:
        return list(range(n))
    step = -(-n // most)
    return sorted({*range(n - 1, -1, -step)})


def write_page(page: Path, payload: Mapping[str, Any]) -> str:
    """(Re)write the generated block of ``page`` and ``<page stem>.json``; returns the block."""
    page = Path(page)
    block = write_marked(page, render(payload), begin=BEGIN, end=END, title="The UED study of the IPPO student")
    write_json(page.with_suffix(".json"), payload)
    return block


def page_block(page: Path) -> str:
    """The generated block of ``page``, markers included."""
    text = Path(page).read_text(encoding="utf-8")
    return text[text.index(BEGIN): text.index(END) + len(END)]

