"""The engineer study: ``python -m jaxlake.study`` runs a sweep and writes its results page.

::

    python -m jaxlake.study                   # conf/study/cpu.yaml, then docs/results.md
    python -m jaxlake.study --no-run          # rewrite docs/results.md from the finished runs
    python -m jaxlake.study --study cpu -- engineer=policy,fixed seed=0,1   # extra Hydra overrides

1. **Sweep.** ``python -m jaxlake.run -m +study=<name> <overrides>`` in a subprocess: every
   engineer variant x seed of ``conf/study/<name>.yaml`` (runs in
   ``<runs_dir>/<experiment>/<variant>_seed<seed>/``; rerunning resumes). Its wall time is
   appended to ``<runs_dir>/<experiment>/study.json``. Stages that two runs share (stage 1 of a
   seed; a later one where their engineers chose the same environments) are trained once
   (``pipeline.share_stages``).
   **Across machines:** each finished run's record files (no checkpoints; a few kB per stage)
   are archived beside the page (``<page stem>/runs/``, :mod:`jaxlake.pipeline.archive`), and
   restored into the sweep folder before the next sweep, which then skips them: commit the
   archive with the page and a sweep cut short on one machine resumes on another.
2. **Results.** From the runs' ``stage_<k>/eval.json`` (held-out suite), ``train.json`` and
   ``engineer.json``: the aggregate score (mean success over the suite) per variant and stage
   as mean ± 95 % CI over seeds, the last stage's score paired with the ``fixed`` baseline of
   the same seed (stage 1 is shared per seed, so pairs differ only by the engineer's
   choices), the environments each engineer chose, plots, and ``results.json`` (the table and
   one row per variant x seed x stage, read by ``notebooks/03_engineer.ipynb``), beside the page.

The results page keeps hand-written text: only the part between ``<!-- study:begin -->``
and ``<!-- study:end -->`` is regenerated (a new page gets a short header around it).
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from jaxlake.io import FolderLock, FolderLockError, read_json, write_json, write_marked
from jaxlake.mixture import load_mixture, mixture_to_obj
from jaxlake.pipeline.archive import (STUDY_FILE, archive_study_record, default_archive, episode_rows, git_ignores,
                                      restore_runs, restore_study_record)
from jaxlake.pipeline.records import short_env
from jaxlake.pipeline.report import find_runs, load_run, plot_breakdown, plot_scores
from jaxlake.stats import mean_ci, paired_difference
from jaxlake.suite import lake_outcomes as suite_outcomes
from jaxlake.conf import CONF_DIR

#: The results page when ``--results`` is not given, relative to the current folder (in a
#: clone of the repository, run from its root, that is the committed ``docs/results.md``).
DEFAULT_PAGE = Path("docs") / "results.md"
BEGIN = "<!-- study:begin -->"
END = "<!-- study:end -->"
#: Table order: the paper's method, its ablations, then the baselines.
ORDER = ("policy", "policy_answer_only", "policy_no_failures", "policy_no_env_stats", "policy_no_history", "base",
         "oracle", "oracle_single", "oracle_strong", "sfl", "heuristic", "plr", "accel", "random", "manual",
         "fixed_broad", "fixed")
BASELINE = "fixed"


class StudyError(RuntimeError):
    """The study cannot run or has nothing to report."""


# ============================================================================ the sweep
def study_root(study: str, overrides: Sequence[str]) -> Path:
    """``<runs_dir>/<experiment>`` of the study config with ``overrides`` applied."""
    from hydra import compose, initialize_config_dir

    plain = [o for o in overrides if o.split("=", 1)[0].lstrip("+~") in ("runs_dir", "experiment")]
    with initialize_config_dir(str(CONF_DIR), version_base=None):
        cfg = compose("config", overrides=[f"+study={study}", *plain])
    return Path(str(cfg.runs_dir)) / str(cfg.experiment)


def sweep_command(study: str, overrides: Sequence[str]) -> list[str]:
    return [sys.executable, "-m", "jaxlake.run", "-m", f"+study={study}", *overrides]


def run_sweep(study: str, overrides: Sequence[str], root: Path) -> float:
    """Run the sweep (output streamed); record its wall time in ``root/study.json``. The study
    folder is locked meanwhile (``root/study.lock``, :class:`jaxlake.io.FolderLock`): a second
    study into the same folder refuses at once, naming the first's PID and host (each job of
    the sweep also locks its own run folder)."""
    cmd = sweep_command(study, overrides)
    root.mkdir(parents=True, exist_ok=True)
    with FolderLock(root / "study.lock", what="study folder"):
        print("[study] " + " ".join(shlex.quote(c) for c in cmd[1:]), file=sys.stderr, flush=True)
        t0 = time.time()
        code = subprocess.call(cmd)  # in the current folder, like the runs' relative runs_dir
        wall = time.time() - t0
        log = _read(root / STUDY_FILE) or {"invocations": []}
        log["invocations"].append({"study": study, "overrides": list(overrides), "wall_s": round(wall, 1),
                                   "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t0)), "rc": code})
        write_json(root / STUDY_FILE, log)
    if code != 0:
        raise StudyError(f"the sweep exited with status {code}; rerun the same command to resume it")
    return wall


# ============================================================================ results
def _read(path: Path) -> Optional[Any]:
    """A JSON file, or None when it is not there."""
    return read_json(path) if Path(path).is_file() else None


def collect_rows(root: Path) -> list[dict]:
    """One row per run x stage: variant, seed, stage, suite scores, own-env score, env, decision,
    and ``suite`` (the suite's description from eval.json, which :func:`suite_baselines` reads)."""
    rows = []
    if not Path(root).is_dir():
        raise StudyError(f"{root} does not exist; run the sweep first (python -m jaxlake.study)")
    for d in find_runs(root):
        run = load_run(d)
        for k, ev in sorted(run["stages"].items()):
            sd = Path(d) / f"stage_{k}"
            modes = ev.get("modes") or {}
            own = ((ev.get("current_env") or {}).get("modes") or {}).get("greedy") or {}
            eng = _read(sd / "engineer.json") or {}
            train = _read(sd / "train.json") or {}
            rows.append({
                "variant": run["engineer"],
                "seed": int(run["seed"]),
                "stage": int(k),
                "score_greedy": (modes.get("greedy") or {}).get("score"),
                "score_sampled": (modes.get("sampled") or {}).get("score"),
                "own_env_greedy": own.get("score"),
                "env": short_env(mixture_to_obj(load_mixture(sd / "env.yaml"))) if (sd / "env.yaml").is_file() else None,
                "decision": eng.get("decision"),
                "attempts": len(eng["attempts"]) if isinstance(eng.get("attempts"), list) else None,
                "changed": eng.get("changed"),
                "proposal": eng.get("proposal"),
                "edit": (eng.get("edit") or {}).get("edit"),
                "shared": (sd / "shared_from.json").is_file(),
                "train_wall_s": train.get("wall_s"),
                "eval_wall_s": ev.get("wall_s"),
                "engineer_wall_s": eng.get("wall_s"),
                "dir": str(sd),
                "suite": ev.get("suite"),
                "lakes": lake_outcomes(ev),
            })
    if not rows:
        raise StudyError(f"no finished stages under {root}; run the sweep first (python -m jaxlake.study)")
    return rows


def lake_outcomes(ev: Mapping[str, Any], mode: str = "greedy") -> dict:
    """``{(cell, lake): success}`` of the suite's ``mode`` episodes (the first sample of each),
    from a run's ``eval.json`` or an archived one (:func:`jaxlake.suite.lake_outcomes`)."""
    return suite_outcomes(episode_rows(ev), mode)


def noise_table(rows: Sequence[dict]) -> str:
    """What the paired intervals are made of, per engineer against ``fixed`` on the last stage
    (greedy): the share of suite lakes where the two runs of a seed disagree (one solves the
    lake, the other does not; mean over seeds), the lake noise of one seed's difference that
    share allows (at most sqrt(share / lakes)), and the standard deviation of the paired
    difference over seeds (what the interval is built from); then the difference pooled over
    seeds, every (seed, lake) pair one paired lake (:func:`jaxlake.stats.paired_difference`:
    mean ± 95 % interval, won and lost lakes, the sign test's p), which leaves the seed-to-seed
    spread out and so is narrower than the interval over seeds."""
    stages = sorted({r["stage"] for r in rows})
    last = stages[-1]
    base = {r["seed"]: r for r in rows if r["variant"] == BASELINE and r["stage"] == last}
    out = ["| engineer | seeds | lakes | disagreeing with fixed | lake noise, one seed (≤) | sd of the difference over seeds "
           "| lakes pooled over seeds | won | lost | p |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for v in _variants(rows):
        if v == BASELINE:
            continue
        shares, diffs, n, ours, theirs = [], [], 0, [], []
        for r in rows:
            b = base.get(r["seed"])
            if r["variant"] != v or r["stage"] != last or b is None or not r.get("lakes") or not b.get("lakes"):
                continue
            both = set(r["lakes"]) & set(b["lakes"])
            if not both:
                continue
            n = len(both)
            shares.append(sum(r["lakes"][x] != b["lakes"][x] for x in both) / n)
            diffs.append(sum(r["lakes"][x] - b["lakes"][x] for x in both) / n)
            keys = sorted(both)
            theirs += [b["lakes"][x] for x in keys]
            ours += [r["lakes"][x] for x in keys]
        if not shares:
            continue
        q = float(np.mean(shares))
        sd = f"{np.std(diffs, ddof=1):.3f}" if len(diffs) > 1 else "–"
        pd = paired_difference(theirs, ours)
        out.append(f"| {v} | {len(shares)} | {n} | {q:.3f} | {np.sqrt(q / n):.3f} | {sd} "
                   f"| {pd.diff:+.3f} ± {pd.half_width:.3f} | {pd.wins} | {pd.losses} | {pd.p_value:.2g} |")
    return "\n".join(out)


def _variants(rows: Sequence[dict]) -> list[str]:
    names = {r["variant"] for r in rows}
    return [v for v in ORDER if v in names] + sorted(names - set(ORDER))


def _cell(values: Sequence[float]) -> str:
    m, h, n = mean_ci([v for v in values if v is not None])
    if m is None:
        return "–"
    return f"{m:.3f} (n={n})" if h is None else f"{m:.3f} ± {h:.3f}"


def _scores(rows: Sequence[dict], variant: str, stage: int, key: str) -> list[float]:
    return [r[key] for r in rows if r["variant"] == variant and r["stage"] == stage and r[key] is not None]


def suite_baselines(rows: Sequence[dict]) -> Optional[dict]:
    """The plan baselines (:mod:`jaxlake.baselines`) on the suite the rows were scored on, or
    None when the runs were not all scored on one suite (or no row names its suite)."""
    from jaxlake.baselines import described_baselines

    suites = {json.dumps(r["suite"], sort_keys=True): r["suite"] for r in rows if r.get("suite")}
    return described_baselines(next(iter(suites.values()))) if len(suites) == 1 else None


def score_table(rows: Sequence[dict], key: str = "score_greedy", paired: bool = True,
                baselines: Optional[Mapping[str, float]] = None) -> str:
    """Variant x stage, mean ± 95 % CI over seeds; with ``paired``, a last column with the
    last stage minus the ``fixed`` run of the same seed (mean ± 95 % CI of the differences);
    ``baselines`` (``{name: score}``, :func:`suite_baselines`) add a row each, in italics."""
    stages = sorted({r["stage"] for r in rows})
    last = stages[-1]
    base = {r["seed"]: r[key] for r in rows if r["variant"] == BASELINE and r["stage"] == last}
    paired = paired and bool(base)
    head = "| engineer | seeds | " + " | ".join(f"stage {s}" for s in stages) + " |"
    out = [head + (f" stage {last} − fixed (paired) |" if paired else ""),
           "|---|---|" + "---|" * (len(stages) + int(paired))]
    for v in _variants(rows):
        seeds = sorted({r["seed"] for r in rows if r["variant"] == v})
        cells = [_cell(_scores(rows, v, s, key)) for s in stages]
        diffs = [r[key] - base[r["seed"]] for r in rows
                 if r["variant"] == v and r["stage"] == last and r[key] is not None and base.get(r["seed"]) is not None]
        diff = "–" if v == BASELINE or not diffs else _cell(diffs)
        if diff != "–" and not diff.startswith("-"):
            diff = "+" + diff
        out.append(f"| {v} | {len(seeds)} | " + " | ".join(cells) + " |" + (f" {diff} |" if paired else ""))
    if baselines:
        from jaxlake.baselines import table_rows

        out += table_rows(baselines, len(stages), extra=int(paired))
    return "\n".join(out)


def env_table(rows: Sequence[dict]) -> str:
    """The environment each variant trained on per stage (seed by seed)."""
    stages = sorted({r["stage"] for r in rows})
    out = ["| engineer | seed | " + " | ".join(f"stage {s}" for s in stages) + " |",
           "|---|---|" + "---|" * len(stages)]
    for v in _variants(rows):
        for seed in sorted({r["seed"] for r in rows if r["variant"] == v}):
            by = {r["stage"]: r["env"] for r in rows if r["variant"] == v and r["seed"] == seed}
            out.append(f"| {v} | {seed} | " + " | ".join(by.get(s) or "–" for s in stages) + " |")
    return "\n".join(out)


def decision_table(rows: Sequence[dict]) -> str:
    """Per engineer: its decisions over every run and stage (``proposed`` / ``kept`` /
    ``fallback``, the last when no valid answer came in any attempt and the current
    environment was kept), how many answers needed a retry (model-backed engineers), and the
    kinds of edit of the mixture its answers made (``add×3 reweight×1``; runs of earlier versions,
    before every answer was an edit, show none)."""
    out = ["| engineer | decisions | proposed | kept | fallback | answers retried | edits |",
           "|---|---|---|---|---|---|---|"]
    for v in _variants(rows):
        made = [r for r in rows if r["variant"] == v and r.get("decision")]
        count = {d: sum(r["decision"] == d for r in made) for d in ("proposed", "kept", "fallback")}
        fb = count["fallback"]
        fb_cell = f"{fb} ({100 * fb / len(made):.0f} %)" if fb and made else str(fb)
        tried = [r["attempts"] for r in made if r.get("attempts")]
        retried = f"{sum(a > 1 for a in tried)} of {len(tried)}" if tried else "–"
        kinds: dict[str, int] = {}
        for r in made:
            if r.get("edit"):
                kinds[r["edit"]] = kinds.get(r["edit"], 0) + 1
        edits = " ".join(f"{k}×{c}" for k, c in sorted(kinds.items(), key=lambda kc: (-kc[1], kc[0]))) or "–"
        out.append(f"| {v} | {len(made)} | {count['proposed']} | {count['kept']} | {fb_cell} | {retried} | {edits} |")
    return "\n".join(out)


#: The fields whose chosen values :func:`choice_table` counts, with their column names.
CHOICE_FIELDS = (("height", "height"), ("width", "width"), ("num_agents", "agents"),
                 ("hole_density", "holes"), ("conflict_density", "conflict"))


def value_counts(rows: Sequence[dict], variant: str) -> dict[str, dict[Any, int]]:
    """How often ``variant`` chose each value of each field, over every decision that was not a
    fallback (``proposed`` or ``kept``: the environment the engineer put forward, counted once
    per mixture component), plus ``components``: how many components its proposals had."""
    counts: dict[str, dict[Any, int]] = {f: {} for f, _ in CHOICE_FIELDS}
    counts["components"] = {}
    for r in rows:
        if r["variant"] != variant or r.get("decision") not in ("proposed", "kept") or not r.get("proposal"):
            continue
        comps = r["proposal"]
        counts["components"][len(comps)] = counts["components"].get(len(comps), 0) + 1
        for comp in comps:
            for field, _ in CHOICE_FIELDS:
                v = comp["config"][field]
                counts[field][v] = counts[field].get(v, 0) + 1
    return counts


def choice_table(rows: Sequence[dict]) -> str:
    """Per engineer: how often it chose each value (``value×count``, most chosen first within a
    field's natural order), over its non-fallback decisions; see :func:`value_counts`."""
    head = "| engineer | choices | " + " | ".join(name for _, name in CHOICE_FIELDS) + " | components |"
    out = [head, "|---|---|" + "---|" * (len(CHOICE_FIELDS) + 1)]
    for v in _variants(rows):
        counts = value_counts(rows, v)
        n = sum(counts["components"].values())
        if not n:
            continue
        cells = [" ".join(f"{val:g}×{c}" for val, c in sorted(counts[f].items())) for f, _ in CHOICE_FIELDS]
        cells.append(" ".join(f"{val}×{c}" for val, c in sorted(counts["components"].items())))
        out.append(f"| {v} | {n} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def plot_final(rows: Sequence[dict], path: Path, key: str = "score_greedy") -> Path:
    """Last-stage score per variant: bars (mean, 95 % CI) with one dot per seed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    last = max(r["stage"] for r in rows)
    variants = _variants(rows)
    fig, ax = plt.subplots(figsize=(max(4.5, 1.0 + 0.7 * len(variants)), 3.6))
    for i, v in enumerate(variants):
        xs = _scores(rows, v, last, key)
        m, h, _ = mean_ci(xs)
        if m is None:
            continue
        ax.bar(i, m, yerr=h or 0.0, capsize=4, color="#9ecae1" if v != BASELINE else "#cccccc", edgecolor="#333333")
        ax.plot([i] * len(xs), xs, "o", color="#08519c", markersize=3)
    ax.set_xticks(range(len(variants)))
    ax.set_xticklabels(variants, rotation=35, ha="right")
    ax.set_ylabel(f"stage {last} aggregate score")
    ax.set_title("Last stage: mean, 95 % CI, seeds as dots", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return Path(path)


def wall_time(root: Path, rows: Sequence[dict]) -> tuple[float, str]:
    """The study's wall time: recorded sweep invocations, else the span of its files."""
    log = _read(Path(root) / STUDY_FILE)
    if log and log.get("invocations"):
        return float(sum(i["wall_s"] for i in log["invocations"])), "sweep invocations recorded in study.json"
    return compute_time(rows), "the stages' recorded training, evaluation and engineer times"


def compute_time(rows: Sequence[dict]) -> float:
    """Seconds of training, evaluation and engineer time the runs record, each shared stage
    counted once (a copy from the store repeats its origin's records)."""
    total = 0.0
    for r in rows:
        parts = [r["engineer_wall_s"]] + ([] if r["shared"] else [r["train_wall_s"], r["eval_wall_s"]])
        total += sum(float(x) for x in parts if x is not None)
    return total


def results_section(root: Path, rows: Sequence[dict], command: str, assets: Path) -> tuple[str, dict]:
    """The generated markdown (between the markers) and the results.json payload."""
    wall, how = wall_time(root, rows)
    compute = compute_time(rows)
    trained = sum(not r["shared"] for r in rows)
    stages = sorted({r["stage"] for r in rows})
    seeds = sorted({r["seed"] for r in rows})
    floors = suite_baselines(rows)
    greedy = score_table(rows, "score_greedy", baselines=floors)
    parts = [
        f"**Command:** `{command}`  ",
        f"**Wall time:** {wall / 60:.1f} min on this machine ({how}); {len({(r['variant'], r['seed']) for r in rows})} runs, "
        f"{len(stages)} stages, seeds {seeds}.  ",
        f"**Compute:** {compute / 60:.1f} min of training, evaluation and engineer time; {trained} of "
        f"{len(rows)} stages trained, the others copied from an identical stage (`pipeline.share_stages`).  ",
        f"**Runs:** `{root}`",
        "",
        "### Aggregate score on the held-out suite (greedy decoding)",
        "",
        "Mean success over every suite lake, mean ± 95 % CI (Student t over seeds). The last column",
        "pairs each run with the `fixed` run of the same seed: stage 1 is shared per seed, so the",
        "difference is what the engineer's choices did."
        + ("" if floors is None else
           " The rows in italics play fixed plans on the same lakes (jaxlake/baselines.py): every agent"
           " walking straight to its goal (rows, then columns, blind to holes: the floor), every agent's"
           " shortest path as if alone (holes avoided, no coordination) and the reference planner (the"
           " ceiling)."),
        "",
        greedy,
    ]
    noise = noise_table(rows)
    if noise.count("\n") > 1:
        parts += ["", "### Where the paired intervals come from", "",
                  "Per engineer against `fixed`, last stage, greedy: the share of suite lakes the two runs of a",
                  "seed disagree on, the lake noise of one seed's difference it allows (at most sqrt(share /",
                  "lakes)), and the seed-to-seed standard deviation of the paired difference, from which the",
                  "interval above is built (t over seeds). *Lakes pooled over seeds*: every (seed, lake) pair",
                  "as one paired lake, with the lakes won and lost against `fixed` and the sign test's p; it",
                  "leaves the seed-to-seed spread out, so it is the narrower of the two and speaks for these",
                  "seeds' runs, not for a new seed.", "", noise]
    if any(r["score_sampled"] is not None for r in rows):
        parts += ["", "### Aggregate score (sampled decoding)", "", score_table(rows, "score_sampled")]
    if any(r["own_env_greedy"] is not None for r in rows):
        parts += ["", "### Success on the stage's own training environment (greedy)", "",
                  "Not comparable across engineers (each trains on its own environments); it shows",
                  "how hard each engineer made the task.", "", score_table(rows, "own_env_greedy", paired=False)]
    parts += ["", "### Environments chosen (height x width, agents n, hole and conflict densities)", "", env_table(rows)]
    parts += ["", "### Engineer decisions", "",
              "Every proposal over all runs and stages; a fallback keeps the current environment because no",
              "attempt gave a valid answer in the engineer's space.", "", decision_table(rows)]
    parts += ["", "### Values chosen", "",
              "How often each engineer chose each value (`value×count`) over its decisions that were not",
              "fallbacks (the environment it put forward for the next stage, one count per mixture",
              "component; the last stage's proposal is counted although no stage trains on it).", "",
              choice_table(rows)]
    assets.mkdir(parents=True, exist_ok=True)
    runs = [load_run(d) for d in find_runs(root)]
    plot_final(rows, assets / "last_stage.png")
    plot_scores(runs, assets / "score_per_stage.png")
    plot_breakdown(runs, assets / "breakdown.png")
    parts += ["", f"![last-stage score per engineer]({assets.name}/last_stage.png)", "",
              f"![score per stage]({assets.name}/score_per_stage.png)", "",
              f"![last-stage score per suite dimension]({assets.name}/breakdown.png)"]
    payload = {"command": command, "wall_s": round(wall, 1), "wall_source": how, "compute_s": round(compute, 1),
               "root": str(root),
               "table_md": greedy, "baselines": floors, "rows": [{k: v for k, v in r.items() if k not in ("dir", "suite", "lakes")} for r in rows]}
    return "\n".join(parts), payload


def write_results(root: Path, page: Path, command: str) -> dict:
    """(Re)write the generated part of ``page``, its plots (``<page stem>/``) and
    ``<page stem>.json``."""
    page = Path(page)
    rows = collect_rows(root)
    assets = page.parent / page.stem
    section, payload = results_section(Path(root), rows, command, assets)
    write_marked(page, section, begin=BEGIN, end=END, title="Study results")
    write_json(page.with_suffix(".json"), payload)
    return payload


def read_results(path: Optional[Path] = None) -> Optional[dict]:
    """``docs/results.json`` under the current folder (or ``path``), None when the study has not been written."""
    return _read(Path(path) if path is not None else DEFAULT_PAGE.with_suffix(".json"))


# ============================================================================ CLI
def _under(path: Path, here: Path) -> str:
    """``path`` relative to the folder ``here`` when it lies inside it, else as it is."""
    return path.relative_to(here).as_posix() if path.is_relative_to(here) else str(path)


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    parser = argparse.ArgumentParser(
        prog="python -m jaxlake.study",
        description="Run the engineer study sweep (conf/study/<name>.yaml) and write its results page.",
        epilog="Hydra overrides for the sweep go after `--`, e.g. -- engineer=policy,fixed seed=0,1 model=qwen3_4b",
    )
    parser.add_argument("--study", default="cpu", help="conf/study/<name>.yaml (default: cpu)")
    parser.add_argument("--results", type=Path, default=DEFAULT_PAGE,
                        help="the results page (default: docs/results.md in the current folder; its plots go to <page stem>/, its data to <page stem>.json)")
    parser.add_argument("--no-run", action="store_true", help="only rewrite the results from finished runs")
    parser.add_argument("--archive", type=Path, default=None,
                        help="where finished runs' record files are kept and restored from (default: <page stem>/runs/ "
                             "beside the page, committed with it, so a sweep resumes on another machine)")
    parser.add_argument("--no-archive", action="store_true", help="neither keep nor restore finished runs' records")
    args = parser.parse_args(argv)
    if not (CONF_DIR / "study" / f"{args.study}.yaml").is_file():
        known = sorted(p.stem for p in (CONF_DIR / "study").glob("*.yaml"))
        print(f"error: --study={args.study!r}: no conf/study/{args.study}.yaml; choose from {known}", file=sys.stderr)
        return 2
    root = study_root(args.study, extra)
    page, here = Path(args.results).resolve(), Path.cwd().resolve()
    shown = _under(page, here)
    command = " ".join(["python -m jaxlake.study"] + ([f"--study {args.study}"] if args.study != "cpu" else [])
                       + ([f"--results {shown}"] if page != DEFAULT_PAGE.resolve() else [])
                       + (["--", *map(shlex.quote, extra)] if extra else []))
    archive = None if args.no_archive else (args.archive or default_archive(page)).resolve()
    try:
        if archive is not None:
            rule = git_ignores(archive)
            if rule is not None:
                print(f"[study] warning: git ignores the archive {archive} ({rule}): its runs will not be committed, "
                      f"so a sweep cut short will not resume in another checkout", file=sys.stderr, flush=True)
            restored = restore_runs(archive, root)
            if restored:
                print(f"[study] restored {len(restored)} finished runs from {archive} into {root} (their stages are "
                      f"skipped; delete a run's folder there to run it again)", file=sys.stderr, flush=True)
            restore_study_record(archive, root)  # earlier sessions' sweep invocations
        if not args.no_run:
            try:
                # the archive relative to this folder when inside it, so the invocations study.json
                # records name no path of this machine
                run_sweep(args.study, extra + ([f"pipeline.archive={_under(archive, here)}"] if archive is not None else []),
                          root)
            finally:
                if archive is not None:
                    archive_study_record(root, archive)
        payload = write_results(root, args.results, command)
    except (StudyError, FolderLockError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(payload["table_md"])
    print(f"\n[study] wrote {args.results} ({payload['wall_s'] / 60:.1f} min of sweep wall time)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
