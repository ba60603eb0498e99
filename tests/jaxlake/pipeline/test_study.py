"""The engineer study end to end: ``python -m jaxlake.study`` runs its Hydra sweep
(``conf/study/cpu.yaml``, narrowed to three engineers x one seed x two tiny stages on the
micro model), shares stage 1 per seed, and writes the results page, its plots and
``results.json``; a rewrite keeps the hand-written text around the generated block. The
sweep is the suite's multirun (``python -m jaxlake.run -m``), and ``python -m jaxlake.report``
runs over its folder. The sweep that trains runs that command line in this process (the
programs the runs before it compiled are reused: a subprocess would trace and compile them
all again); the resumed sweep runs it as the subprocess the study starts."""

import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from jaxlake.conf import CONF_DIR

from jaxlake.pipeline import study
from jaxlake.pipeline.share import stage_key
from tests.support import run_cli, tiny_run_overrides

ROOT = Path(__file__).resolve().parents[3]


def test_study_config_composes_the_promised_sweep():
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(str(CONF_DIR), version_base=None):
        cfg = compose("config", overrides=["+study=cpu"], return_hydra_config=True)
    params = cfg.hydra.sweeper.params
    engineers = params.engineer.split(",")
    assert set(engineers) == {"policy", "policy_no_failures", "policy_no_env_stats", "policy_no_history", "base",
                              "heuristic", "plr", "accel", "random", "fixed", "manual"}
    # the power estimate's size: 5 seeds, 192 suite lakes; seeds first (a cut sweep stays paired)
    assert params.seed.split(",") == ["0", "1", "2", "3", "4"] and cfg.stages >= 3
    assert list(params) == ["seed", "engineer"]
    assert cfg.eval.name == "small" and cfg.eval.lakes_per_cell == 12
    assert cfg.pipeline.share_stages
    for name in engineers:  # every variant is a real engineer config
        assert (CONF_DIR / "engineer" / f"{name}.yaml").is_file()


def test_policy_answer_only_is_policy_without_a_reasoning_prompt():
    """Why the CPU study leaves policy_answer_only out: under the study's prompt (no reasoning
    turn) both engineers resolve to the same settings, answer-only; under prompt=reasoning
    they differ."""
    from hydra import compose, initialize_config_dir

    from jaxlake.engineers import build_engineer

    class Ctx:  # what PolicyEngineer.reasons reads of a stage context: the run's config
        def __init__(self, cfg):
            self.run_cfg = cfg

    def resolved(name, *extra):
        with initialize_config_dir(str(CONF_DIR), version_base=None):
            cfg = compose("config", overrides=["+study=cpu", f"engineer={name}", *extra])
        node = {k: v for k, v in dict(cfg.engineer).items() if k not in ("name", "reasoning")}
        return node, build_engineer(cfg.engineer).reasons(Ctx(cfg))

    assert resolved("policy") == resolved("policy_answer_only") == (resolved("policy")[0], False)
    assert resolved("policy", "prompt=reasoning")[1] is True
    assert resolved("policy_answer_only", "prompt=reasoning")[1] is False


def test_context_ablations_switch_exactly_one_part_off():
    from hydra import compose, initialize_config_dir

    for part in ("failures", "env_stats", "history"):
        with initialize_config_dir(str(CONF_DIR), version_base=None):
            cfg = compose("config", overrides=[f"engineer=policy_no_{part}"])
        ctx = dict(cfg.engineer.context)
        assert ctx.pop(part) is False and all(ctx.values()), (part, cfg.engineer.context)
        assert cfg.engineer.name == f"policy_no_{part}"


def test_stage1_key_ignores_the_engineer_and_cosmetics_but_not_training():
    from hydra import compose, initialize_config_dir

    from jaxlake.mixture import mixture_from_node

    def key(*overrides):
        with initialize_config_dir(str(CONF_DIR), version_base=None):
            cfg = compose("config", overrides=list(overrides))
        return stage_key(cfg, 1, [mixture_from_node(cfg.env)])

    base = key()
    assert key("engineer=heuristic") == base
    assert key("train.progress=false", "train.plot=false") == base
    assert key("train.grpo.steps=31") != base
    assert key("seed=1") != base
    assert key("env=tiny") != base and key("env=tiny", "env.hole_density=0.2") != key("env=tiny")
    assert key("eval=tiny") != base


def test_a_later_stage_key_follows_the_environments_so_far():
    from hydra import compose, initialize_config_dir

    from jaxlake.mixture import mixture_from_node

    with initialize_config_dir(str(CONF_DIR), version_base=None):
        cfg = compose("config")
        other = compose("config", overrides=["env=tiny"])
    a, b = mixture_from_node(cfg.env), mixture_from_node(other.env)
    assert stage_key(cfg, 2, [a, b]) != stage_key(cfg, 2, [b, b])  # another stage 1 before it
    assert stage_key(cfg, 2, [a, b]) != stage_key(cfg, 2, [a, a])  # another environment now
    assert stage_key(cfg, 2, [a, a]) != stage_key(cfg, 1, [a])
    with pytest.raises(ValueError, match="stages 1..2"):
        stage_key(cfg, 2, [a])


def test_unknown_study_is_a_clear_error(capsys):
    assert study.main(["--study", "nope", "--no-run"]) == 2
    assert "conf/study/nope.yaml" in capsys.readouterr().err


def _sweeps_in_this_process(monkeypatch):
    """``study.run_sweep`` runs its command (``python -m jaxlake.run -m +study=...``) in this
    process: the same argument list to the same entry point (``tests.support.run_cli``), its
    exit status returned as the subprocess's would be. Returns the commands run so."""
    commands = []

    def call(cmd):
        assert cmd[:3] == [sys.executable, "-m", "jaxlake.run"], cmd
        commands.append(cmd)
        code = run_cli(monkeypatch, cmd[3:])
        return 0 if code is None else int(code)

    monkeypatch.setattr(study, "subprocess", SimpleNamespace(call=call))
    return commands


@pytest.mark.slow
def test_study_end_to_end(tmp_path, micro_model, capfd, monkeypatch):
    runs = tmp_path / "runs"
    page = tmp_path / "docs" / "results.md"
    page.parent.mkdir()
    page.write_text("# My study\n\nHand-written reading.\n")
    # (the tiny suite at its own 2 lakes per cell: the study's 12 would only cost time here)
    extra = [f"runs_dir={runs}", "engineer=heuristic,fixed,policy_no_history", "seed=0", "stages=2",
             *tiny_run_overrides(micro_model), "eval.lakes_per_cell=2"]
    with monkeypatch.context() as here:
        commands = _sweeps_in_this_process(here)
        assert study.main(["--results", str(page), "--", *extra]) == 0
    assert len(commands) == 1 and commands[0][3:5] == ["-m", "+study=cpu"]

    root = runs / "study_cpu"
    log = json.loads((root / "study.json").read_text())
    assert len(log["invocations"]) == 1 and log["invocations"][0]["rc"] == 0

    payload = json.loads(page.with_suffix(".json").read_text())
    rows = payload["rows"]
    assert {(r["variant"], r["seed"], r["stage"]) for r in rows} == {
        (v, 0, k) for v in ("heuristic", "fixed", "policy_no_history") for k in (1, 2)
    }
    first = [r for r in rows if r["stage"] == 1]
    # stage 1 trained once for the seed, copied into the other two runs: identical scores
    assert sorted(r["shared"] for r in first) == [False, True, True]
    assert len({(r["score_greedy"], r["score_sampled"], r["own_env_greedy"]) for r in first}) == 1
    fixed = [r for r in rows if r["variant"] == "fixed"]
    assert len({r["env"] for r in fixed}) == 1  # the baseline never moves
    assert payload["wall_s"] > 0 and "python -m jaxlake.study" in payload["command"]

    text = page.read_text()
    assert text.startswith("# My study\n\nHand-written reading.\n")
    assert text.count(study.BEGIN) == 1 and text.count(study.END) == 1
    for v in ("heuristic", "fixed", "policy_no_history"):
        assert f"| {v} | 1 |" in text
    assert "stage 2 − fixed (paired)" in text
    assert "### Engineer decisions" in text and study.decision_table(rows) in text
    assert "### Values chosen" in text and study.choice_table(rows) in text
    for png in ("last_stage.png", "score_per_stage.png", "breakdown.png"):
        assert (page.parent / "results" / png).stat().st_size > 1000
    assert payload["table_md"] in text
    # the floor and the ceiling beside the engineers: fixed plans on the suite's own lakes
    from jaxlake import baselines
    from jaxlake.suite import build_suite, load_eval_conf

    assert payload["baselines"] == baselines.suite_baselines(build_suite(load_eval_conf("tiny")))
    for row in baselines.table_rows(payload["baselines"], columns=2, extra=1):
        assert row in payload["table_md"]

    # rewriting from the finished runs keeps the prose and replaces the block
    page.write_text(text.replace("Hand-written reading.", "Edited reading.") + "\nA footnote.\n")
    assert study.main(["--no-run", "--results", str(page), "--", f"runs_dir={runs}"]) == 0
    again = page.read_text()
    assert "Edited reading." in again and again.rstrip().endswith("A footnote.")
    assert again.count(study.BEGIN) == 1
    assert len(json.loads((root / "study.json").read_text())["invocations"]) == 1

    # a resumed sweep (the study's own subprocess) finds every stage complete and trains nothing
    capfd.readouterr()
    assert study.main(["--results", str(page), "--", *extra]) == 0
    err = capfd.readouterr().err
    assert "stage 2: complete, skipped" in err and "training" not in err

    # a later stage is shared exactly when the engineers chose the same environments so far:
    # each distinct stage-2 environment is trained once, the other runs copy it
    by_env: dict = {}
    for r in rows:
        if r["stage"] == 2:
            by_env.setdefault(r["env"], []).append(r["shared"])
    assert all(sorted(flags) == [False] + [True] * (len(flags) - 1) for flags in by_env.values()), by_env
    # a shared stage is a copy of the one that trained (its records and scores), named in its
    # shared_from.json; the engineer's files and the later summaries are each run's own
    for r in rows:
        d = root / f"{r['variant']}_seed0" / f"stage_{r['stage']}"
        for own in ("engineer.json", "next_env.yaml") + (("summary.json",) if r["stage"] > 1 else ()):
            assert (d / own).is_file(), (d, own)
        if r["shared"]:
            source = Path(json.loads((d / "shared_from.json").read_text())["dir"])
            assert source != d and source.name == d.name and not (source / "shared_from.json").exists()
            assert json.loads((d / "eval.json").read_text()) == json.loads((source / "eval.json").read_text())

    # the archive beside the page: every finished run's records, no checkpoints
    archive = page.parent / "results" / "runs"
    archived = sorted(d.name for d in archive.iterdir() if d.is_dir())
    assert archived == ["fixed_seed0", "heuristic_seed0", "policy_no_history_seed0"]
    assert (archive / "study.json").is_file()
    for d in archive.iterdir():
        if d.is_dir():
            assert (d / "run.json").is_file() and (d / "stage_2" / "eval.json").is_file()
            assert not list(d.rglob("*.safetensors")) and not list(d.rglob("checkpoint"))
    # ... from which a fresh checkout (another runs folder) resumes: nothing trains, same table
    fresh = tmp_path / "fresh_runs"
    capfd.readouterr()
    with monkeypatch.context() as here:
        _sweeps_in_this_process(here)
        assert study.main(["--results", str(page), "--", *[e for e in extra if not e.startswith("runs_dir=")],
                           f"runs_dir={fresh}"]) == 0
    err = capfd.readouterr().err
    assert "restored 3 finished runs" in err and "training" not in err
    again = json.loads(page.with_suffix(".json").read_text())
    assert [(r["variant"], r["stage"], r["score_greedy"]) for r in again["rows"]] == [
        (r["variant"], r["stage"], r["score_greedy"]) for r in payload["rows"]]

    # the multirun's folders: one per job (Hydra's sweep subdir), the fixed engineer keeps its env
    jobs = {json.loads((d / "run.json").read_text())["engineer"]: d for d in root.iterdir() if (d / "run.json").is_file()}
    assert set(jobs) == {"heuristic", "fixed", "policy_no_history"}
    assert all(d.name == f"{e}_seed0" for e, d in jobs.items())
    assert yaml.safe_load((jobs["fixed"] / "stage_1" / "next_env.yaml").read_text()) == yaml.safe_load(
        (jobs["fixed"] / "stage_1" / "env.yaml").read_text())
    # python -m jaxlake.report over the sweep: the engineer x stage table, report.md and its plots
    out = subprocess.run([sys.executable, "-m", "jaxlake.report", str(root)], capture_output=True, text=True,
                         cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stderr
    table = out.stdout
    assert "| engineer | stage 1 | stage 2 |" in table and "(n=1)" in table
    for v in ("heuristic", "fixed", "policy_no_history"):
        assert f"| {v} | " in table, v
    assert (root / "report.md").is_file()
    assert (root / "score_per_stage.png").stat().st_size > 0 and (root / "breakdown.png").stat().st_size > 0
    # every run under a folder, found recursively, reported together
    allrep = subprocess.run([sys.executable, "-m", "jaxlake.report", str(runs), "--no-plots"], capture_output=True,
                            text=True, cwd=ROOT, timeout=600)
    assert allrep.returncode == 0, allrep.stderr
    assert " run(s): " in allrep.stdout and all(f"{e} (seed 0)" in allrep.stdout for e in jobs)
    assert (runs / "report.md").is_file() and not (runs / "breakdown.png").exists()


def test_study_needs_runs(tmp_path, capsys):
    code = study.main(["--no-run", "--results", str(tmp_path / "r.md"), "--", f"runs_dir={tmp_path}"])
    assert code == 1
    assert "run the sweep first" in capsys.readouterr().err
    assert not (tmp_path / "r.md").exists()


def test_decision_table_counts_fallbacks_and_edits_per_engineer():
    rows = [{"variant": v, "seed": s, "stage": k, "decision": d, "attempts": a, "edit": e}
            for v, s, k, d, a, e in [
                ("fixed", 0, 1, "kept", None, "keep"), ("fixed", 0, 2, None, None, None),
                ("external", 0, 1, "fallback", 3, None), ("external", 0, 2, "proposed", 2, "add"),
                ("external", 1, 1, "proposed", 1, "add"), ("external", 1, 2, None, None, None),
                ("policy", 0, 1, "proposed", 1, "reweight")]]
    table = study.decision_table(rows)
    lines = table.splitlines()
    assert lines[0] == "| engineer | decisions | proposed | kept | fallback | answers retried | edits |"
    assert "| fixed | 1 | 0 | 1 | 0 | – | keep×1 |" in lines
    assert "| external | 3 | 2 | 0 | 1 (33 %) | 2 of 3 | add×2 |" in lines
    assert "| policy | 1 | 1 | 0 | 0 | 0 of 1 | reweight×1 |" in lines


def _proposal(*configs):
    w = 1.0 / len(configs)
    return [{"weight": w, "config": dict(zip(("height", "width", "num_agents", "hole_density", "conflict_density"), c))}
            for c in configs]


def test_choice_table_counts_each_value_and_skips_fallbacks():
    rows = [
        {"variant": "policy", "seed": 0, "stage": 1, "decision": "proposed", "proposal": _proposal((5, 5, 2, 0.1, 0.25))},
        {"variant": "policy", "seed": 0, "stage": 2, "decision": "kept", "proposal": _proposal((5, 5, 2, 0.1, 0.25))},
        {"variant": "policy", "seed": 1, "stage": 1, "decision": "fallback", "proposal": _proposal((9, 9, 4, 0.3, 1.0))},
        {"variant": "policy", "seed": 1, "stage": 2, "decision": "proposed",
         "proposal": _proposal((4, 6, 1, 0.0, 0.75), (11, 11, 3, 0.2, 0.0))},
        {"variant": "fixed", "seed": 0, "stage": 1, "decision": "kept", "proposal": _proposal((5, 5, 2, 0.1, 0.5))},
        {"variant": "fixed", "seed": 0, "stage": 2, "decision": None, "proposal": None},
    ]
    counts = study.value_counts(rows, "policy")
    assert counts["height"] == {5: 2, 4: 1, 11: 1}  # the fallback's 9 is not a choice
    assert counts["conflict_density"] == {0.25: 2, 0.75: 1, 0.0: 1}
    assert counts["components"] == {1: 2, 2: 1}
    lines = study.choice_table(rows).splitlines()
    assert lines[0] == "| engineer | choices | height | width | agents | holes | conflict | components |"
    assert "| policy | 3 | 4×1 5×2 11×1 | 5×2 6×1 11×1 | 1×1 2×2 3×1 | 0×1 0.1×2 0.2×1 | 0×1 0.25×2 0.75×1 | 1×2 2×1 |" in lines
    assert "| fixed | 1 | 5×1 | 5×1 | 2×1 | 0.1×1 | 0.5×1 | 1×1 |" in lines


def test_a_second_study_into_the_same_folder_is_refused(tmp_path):
    from jaxlake.io import FolderLock, FolderLockError

    root = tmp_path / "study_cpu"
    root.mkdir()
    with FolderLock(root / "study.lock", what="study folder"):  # a study that is running
        with pytest.raises(FolderLockError, match=f"the study folder {root} is in use by this process"):
            study.run_sweep("cpu", [f"runs_dir={tmp_path}"], root)
    assert sorted(p.name for p in root.iterdir()) == []  # no sweep started, no study.json


def test_noise_table_measures_disagreement_with_fixed_lake_by_lake():
    def row(variant, seed, wins):
        return {"variant": variant, "seed": seed, "stage": 2, "lakes": {(0, i): w for i, w in enumerate(wins)}}

    rows = [row("fixed", 0, [1, 1, 0, 0]), row("plr", 0, [1, 0, 1, 1]),   # 3 of 4 disagree, +1 lake
            row("fixed", 1, [1, 1, 1, 1]), row("plr", 1, [1, 1, 1, 0])]   # 1 of 4, -1 lake
    line = [x for x in study.noise_table(rows).splitlines() if x.startswith("| plr")][0]
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[:4] == ["plr", "2", "4", "0.500"]
    assert cells[4] == f"{(0.5 / 4) ** 0.5:.3f}"
    assert cells[5] == f"{(2 * 0.25 ** 2) ** 0.5:.3f}"  # differences +0.25 and -0.25: sd 0.354
    # pooled: 8 paired lakes, plr won 2 (seed 0 lakes 2, 3) and lost 2 (seed 0 lake 1, seed 1 lake 3)
    from jaxlake.stats import paired_difference

    pooled = paired_difference([1, 1, 0, 0, 1, 1, 1, 1], [1, 0, 1, 1, 1, 1, 1, 0])
    assert pooled.wins == 2 and pooled.losses == 2 and pooled.diff == 0.0
    assert cells[6:] == [f"+0.000 ± {pooled.half_width:.3f}", "2", "2", "1"]


def test_archive_keeps_the_records_without_checkpoints_and_restores_only_missing_runs(tmp_path):
    from jaxlake.pipeline.archive import archive_run, episode_rows, restore_runs

    run = tmp_path / "runs" / "fixed_seed0"
    (run / "stage_1" / "checkpoint").mkdir(parents=True)
    (run / "stage_1" / "checkpoint" / "big.bin").write_bytes(b"0" * 1000)
    (run / "run.json").write_text(json.dumps({"engineer": "fixed", "run_dir": str(run)}))
    source = tmp_path / "runs" / "policy_seed0" / "stage_1"
    (run / "stage_1" / "shared_from.json").write_text(json.dumps({"dir": str(source), "key": "k"}))
    ep = {"lake": 3, "cell": 1, "mode": "greedy", "sample": 0, "success": True, "completion": "A: R R", "plan": "A: R R"}
    (run / "stage_1" / "eval.json").write_text(json.dumps({"format": 1, "grids": [[1]], "episodes": [ep],
                                                          "current_env": {"grids": [[2]], "episodes": [ep]}}))
    (run / "stage_1" / "engineer.json").write_text("{}")
    archive = tmp_path / "docs" / "results" / "runs"
    assert archive_run(run, archive) == archive / "fixed_seed0"
    kept = archive / "fixed_seed0" / "stage_1"
    assert sorted(p.name for p in kept.iterdir()) == ["engineer.json", "eval.json", "shared_from.json"]
    # no path of the machine that made the run: its folder is dropped, a sibling stage is relative
    assert json.loads((archive / "fixed_seed0" / "run.json").read_text()) == {"engineer": "fixed"}
    assert json.loads((kept / "shared_from.json").read_text()) == {"dir": "../../policy_seed0/stage_1", "key": "k"}
    ev = json.loads((kept / "eval.json").read_text())
    assert "grids" not in ev and "grids" not in ev["current_env"] and ev["archived"] is True
    outcome = {k: ep[k] for k in ("lake", "cell", "mode", "sample", "success")}
    assert ev["episodes"] == {"columns": {k: [v] for k, v in outcome.items()}}  # by column, outcomes only
    assert episode_rows(ev) == episode_rows(ev["current_env"]) == [outcome]
    assert archive_run(run, archive) is None  # already archived: kept as it is

    fresh = tmp_path / "fresh"
    (fresh / "other_seed0").mkdir(parents=True)
    (fresh / "other_seed0" / "run.json").write_text("{}")
    assert restore_runs(archive, fresh) == ["fixed_seed0"]
    back = json.loads((fresh / "fixed_seed0" / "stage_1" / "eval.json").read_text())
    assert back["episodes"] == back["current_env"]["episodes"] == [outcome]  # rows again, as a run writes them
    assert study.lake_outcomes(back) == study.lake_outcomes(ev) == {(1, 3): True}
    assert restore_runs(archive, fresh) == []  # a run folder that is there is never overwritten
    assert not list(fresh.glob(".*tmp"))


def test_the_committed_pages_archive_is_not_git_ignored():
    """The archive exists to be committed with its page; a ``runs/`` rule in .gitignore once kept
    every archived run of docs/results.md out of the repository, so nothing could resume."""
    from jaxlake.pipeline.archive import default_archive, git_ignores

    repo = Path(__file__).resolve().parents[3]
    if shutil.which("git") is None or not (repo / ".git").exists():
        pytest.skip("needs git and a git checkout of the project")
    assert git_ignores(default_archive(repo / study.DEFAULT_PAGE)) is None


def test_the_committed_archive_names_no_path_of_the_machine_that_made_it():
    """Archived records travel with the repository: no absolute path of the sweep's machine in a
    run's folder (``run.json``), a shared stage's source or a recorded sweep override."""
    from jaxlake.pipeline.archive import STUDY_FILE, default_archive

    archive = default_archive(Path(__file__).resolve().parents[3] / study.DEFAULT_PAGE)
    runs = [d for d in archive.iterdir() if (d / "run.json").is_file()]
    assert runs, f"{archive} holds no archived run"
    for d in runs:
        assert "run_dir" not in json.loads((d / "run.json").read_text()), d
        for f in d.glob("stage_*/shared_from.json"):
            assert not Path(json.loads(f.read_text())["dir"]).is_absolute(), f
    for inv in json.loads((archive / STUDY_FILE).read_text())["invocations"]:
        for o in inv["overrides"]:
            key, _, value = o.partition("=")
            assert not (key == "pipeline.archive" and Path(value).is_absolute()), o


def test_git_ignores_names_the_rule_that_hides_an_archive(tmp_path):
    from jaxlake.pipeline.archive import git_ignores

    if shutil.which("git") is None:
        pytest.skip("needs git")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    archive = tmp_path / "docs" / "results" / "runs"
    assert git_ignores(archive) is None  # not there yet, not ignored
    (tmp_path / ".gitignore").write_text("build/\nruns/\n")
    assert git_ignores(archive) == ".gitignore:2:runs/"
    (tmp_path / ".gitignore").write_text("runs/\n!docs/results/runs/\n")
    assert git_ignores(archive) is None  # re-included by a negation
    (tmp_path / ".gitignore").write_text("/runs/\n")
    assert git_ignores(archive) is None
    assert git_ignores(tmp_path / "runs") == ".gitignore:1:/runs/"
    assert git_ignores(tmp_path.parent / "elsewhere_not_a_repo_xyz") is None  # outside any work tree


def test_the_committed_page_is_what_its_archive_rebuilds(tmp_path, monkeypatch):
    """docs/results.md's generated block and docs/results.json are what `python -m jaxlake.study
    --no-run` writes in a fresh folder from the runs archived beside the page: the page and its
    archive agree, so a fresh checkout resumes the sweep the page shows."""
    from jaxlake.pipeline.archive import STUDY_FILE, default_archive

    repo = Path(__file__).resolve().parents[3]
    page = repo / study.DEFAULT_PAGE
    archive = default_archive(page)
    assert (archive / STUDY_FILE).is_file(), f"{archive} holds no {STUDY_FILE}: the page has no archive"
    monkeypatch.chdir(tmp_path)
    (tmp_path / "docs").mkdir()
    shutil.copy(page, tmp_path / "docs" / "results.md")
    assert study.main(["--no-run", "--archive", str(archive)]) == 0
    assert (tmp_path / "docs" / "results.md").read_text() == page.read_text()
    assert json.loads((tmp_path / "docs" / "results.json").read_text()) == json.loads(page.with_suffix(".json").read_text())
