"""The staged pipeline with the IPPO student (``python -m jaxlake.run student=ippo``), end to end
through Hydra at the smoke settings: two stages with ``engineer=heuristic`` and with
``engineer=oracle`` (its probes train and score for real; the stage table printed, every stage file written, the suite's
``eval.json`` readable by the summaries and the records), resume after an interruption inside
stage 2's training (the resumed run equals the uninterrupted one), the closed-loop suite play
replayed exactly by the suite's scorer, one-line errors for settings IPPO cannot honour, and
the LLM default's settings untouched by the ``student`` group.

The runs call the entry point in this process (tests.support.run_cli), so the IPPO trainer and
the suite players compile once for all of them.
"""

import shutil

import jax
import numpy as np
import pytest
from tests.support import run_cli

from jaxlake.conf import CONF_DIR
from jaxlake.io import read_json

pytestmark = pytest.mark.slow

#: The smallest pipeline: IPPO's smoke settings, the tiny suite greedy only, few lakes around it.
SMOKE = ["student=ippo", "ippo=smoke", "eval=tiny", "env=tiny", "stages=2", "eval.sampled.num_samples=0",
         "eval.current_env_lakes=2", "eval.summary.env_stats_lakes=2"]
STAGE_FILES = {"env.yaml", "train.json", "checkpoint.npz", "policy.npz", "metrics.jsonl", "eval.json",
               "summary.json", "summary.txt", "engineer.json", "next_env.yaml"}


def _compose(*overrides):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(str(CONF_DIR), version_base=None):
        return compose(config_name="config", overrides=list(overrides))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return tmp_path_factory.mktemp("ippo_runs")


@pytest.fixture(scope="module")
def heuristic_run(runs):
    mp = pytest.MonkeyPatch()
    try:
        assert run_cli(mp, [f"runs_dir={runs}", "experiment=heuristic", "engineer=heuristic", *SMOKE]) is None
    finally:
        mp.undo()
    return runs / "heuristic"


def test_two_ippo_stages_with_the_heuristic_engineer(heuristic_run, capfd):
    run = heuristic_run
    info = read_json(run / "run.json")
    assert info["engineer"] == "heuristic" and info["settings"]["student"]["name"] == "ippo"
    assert info["settings"]["student"]["ippo"]["num_updates"] == 2
    for k in (1, 2):
        d = run / f"stage_{k}"
        assert STAGE_FILES <= {p.name for p in d.iterdir()}
        ev = read_json(d / "eval.json")
        assert ev["format"] == "jaxlake.eval/1" and ev["student"] == "ippo" and list(ev["modes"]) == ["greedy"]
        assert len(ev["episodes"]) == ev["suite"]["num_lakes"] == len(ev["grids"])
        assert all(set(e["failure_types"]) <= {"fell", "conflict", "timeout"} for e in ev["episodes"])
        assert not any(e["malformed"] for e in ev["episodes"])  # the plans it carried out parse back
        assert ev["current_env"]["modes"]["greedy"]["n"] == 2
        assert "behaviour" in read_json(d / "summary.json")
        train = read_json(d / "train.json")
        assert train["updates"] == 2 and train["policy"] == "policy.npz" and not train["resumed"]
    assert read_json(run / "stage_2" / "train.json")["init_from"] == "../stage_1/policy.npz"
    assert read_json(run / "start_eval.json")["checkpoint"] == "the initial IPPO parameters"
    assert "ippo_updates" in read_json(run / "stage_2" / "summary.json")["history"][0]["train"]
    # the table is the LLM's: row 0 (the start) and one row per stage
    from jaxlake.pipeline.records import stage_record, stage_table

    table = stage_table([stage_record(run / f"stage_{k}", k) for k in (1, 2)])
    assert table.splitlines()[2].startswith("| 0 | start: the initial IPPO parameters |")
    assert len(table.splitlines()) == 5


def test_two_ippo_stages_with_the_oracle_engineer(runs, monkeypatch):
    """``engineer=oracle`` (over edits): stage 1's engineer plays the student's rollouts on the
    components and candidates (IPPOStudent.success: sampled closed-loop plays), trains a probe of
    each distinct edit from stage 1's policy (the current environment first), scores them on the
    validation suite, keeps their records and proposes the best as stage 2's environment; the
    probes' weights are gone. (The other engineers with this student: their unit tests,
    tests/jaxlake/engineers/; the pipeline does not depend on which engineer decides.)"""
    args = [f"runs_dir={runs}", "experiment=oracle", "engineer=oracle", "engineer.pool=2", "engineer.lakes=2",
            "engineer.samples=1",
            "engineer.probe_steps=2", "engineer.validation_lakes_per_cell=2", *SMOKE]
    assert run_cli(monkeypatch, args) is None
    d = runs / "oracle" / "stage_1"
    record = read_json(d / "engineer.json")
    probes = record["probes"]
    assert record["engineer"] == "oracle" and len(probes) >= 2 and probes[0]["current"] and probes[0]["name"] == "keep"
    learn = record["learnability"]
    assert len(learn["candidates"]) == 2 and all(0 <= x["p"] <= 1 and x["n"] == 2 for x in learn["current"])
    assert record["edit"]["edit"] in ("keep", "reweight", "drop", "add", "replace")
    on_disk = [read_json(d / "probes" / f"candidate_{i}" / "probe.json") for i in range(len(probes))]
    assert [p["score"] for p in probes] == [p["score"] for p in on_disk]
    for p in on_disk:
        assert p["score"] == pytest.approx(np.mean(p["success"])) and p["n"] == len(p["success"])
        assert p["validation"]["lakes"] == p["n"]
        assert not [x for x in (d / "probes" / p["name"]).iterdir() if x.is_dir()]
    best = record["best"]
    assert probes[best]["score"] == max(p["score"] for p in probes)
    from jaxlake.mixture import load_mixture, mixture_to_obj

    assert mixture_to_obj(load_mixture(d / "next_env.yaml")) == probes[best]["mixture"]
    assert mixture_to_obj(load_mixture(runs / "oracle" / "stage_2" / "env.yaml")) == probes[best]["mixture"]
    assert read_json(runs / "oracle" / "stage_2" / "engineer.json")["probes"] == []  # the last stage: none


def test_resume_after_an_interruption_in_training(heuristic_run, runs, monkeypatch):
    """Stage 2 dies after its first chunk's checkpoint; the same command resumes it from
    there and ends where the uninterrupted run ended."""
    import jaxlake.students.checkpoint as ckpt

    run = runs / "resumed"
    shutil.copytree(heuristic_run / "stage_1", run / "stage_1")
    shutil.copy(heuristic_run / "start_eval.json", run / "start_eval.json")
    save = ckpt.save

    def dying(path, tree, meta):
        out = save(path, tree, meta)
        if "stage_2" in str(path) and meta.get("chunk") == 1:
            raise KeyboardInterrupt("killed after chunk 1")
        return out

    args = [f"runs_dir={runs}", "experiment=resumed", "engineer=heuristic", *SMOKE]
    monkeypatch.setattr(ckpt, "save", dying)
    with pytest.raises(KeyboardInterrupt):
        run_cli(monkeypatch, args)
    assert (run / "stage_2" / "checkpoint.npz").is_file() and not (run / "stage_2" / "train.json").exists()
    monkeypatch.setattr(ckpt, "save", save)
    assert run_cli(monkeypatch, args) is None
    assert read_json(run / "stage_2" / "train.json")["resumed"]
    with np.load(run / "stage_2" / "policy.npz") as a, np.load(heuristic_run / "stage_2" / "policy.npz") as b:
        assert all(np.array_equal(a[k], b[k]) for k in b.files if k != "meta")
    mine, theirs = (read_json(r / "stage_2" / "eval.json") for r in (run, heuristic_run))
    assert [e["success"] for e in mine["episodes"]] == [e["success"] for e in theirs["episodes"]]
    # rerunning the finished run is a no-op
    assert run_cli(monkeypatch, args) is None


def test_the_suite_scorer_replays_the_closed_loop_play():
    """The actions the student took, scored by the suite's scorer, give the closed-loop outcome."""
    from jaxlake import env as core
    from jaxlake.generator import generate_batch
    from jaxlake.config import LakeConfig
    from jaxlake.students.network import ActorCritic
    from jaxlake.students.play import play_plans
    from jaxlake.types import ARRIVED, ABSENT

    lakes = generate_batch(jax.random.PRNGKey(3), LakeConfig(height=4, width=4, num_agents=2, hole_density=0.2,
                                                             slip_prob=0.3, max_steps=8), 16)
    net = ActorCritic(hidden=(8,))
    obs_grid = jax.numpy.zeros((9, 9, 6))
    from jaxlake.students.envs import lake_obs

    o = lake_obs(lakes, core.reset(lakes), 2, 4)
    params = net.init(jax.random.PRNGKey(0), o.grid[0], o.scalars[0], o.avail[0])
    del obs_grid
    keys = jax.random.split(jax.random.PRNGKey(5), 16)
    for sk in (None, jax.random.PRNGKey(9)):
        plans = play_plans(params, net.apply, lakes, keys, actors=2, radius=4, horizon=8, sample_key=sk)
        rolled = jax.vmap(lambda k, l, p: core.rollout(k, l, p, horizon=8).final_state.status)(keys, lakes, plans)
        success = np.all((np.asarray(rolled) == ARRIVED) | (np.asarray(rolled) == ABSENT), axis=-1)
        from jaxlake.suite import score_texts
        from jaxlake.text import format_plan

        texts = [format_plan(np.asarray(plans[i]), int(lakes.num_agents[i])) for i in range(16)]
        recs = score_texts(lakes, texts, jax.random.PRNGKey(5), horizon=8)
        assert [r["success"] for r in recs] == list(success)


@pytest.mark.parametrize("extra, line", [
    (["ippo.radius=null"], "ippo.radius=null"),
    (["pipeline.warmstart=all"], "pipeline.warmstart='all'"),
    (["pipeline.warmstart_env=space"], "pipeline.warmstart_env='space'"),
    (["pipeline.share_stages=/tmp/x"], "pipeline.share_stages"),
    (["ippo.num_minibatches=3"], "ippo.num_minibatches=3"),
    (["ippo.lr=2"], "ippo.lr=2"),
])
def test_settings_ippo_cannot_honour_fail_in_one_line(extra, line):
    from jaxlake.pipeline.settings import resolve, user_error

    with pytest.raises(Exception) as err:
        resolve(_compose("student=ippo", *extra))
    text = user_error(err.value)
    assert text is not None and text.startswith(line) and "\n" not in text


def test_the_llm_default_settings_are_unchanged():
    from omegaconf import open_dict

    from jaxlake.pipeline.settings import SETTINGS, resolve

    cfg = _compose()
    s = resolve(cfg)
    assert s.student == "llm" and s.ippo is None and "ippo" not in cfg
    assert set(s.settings) == set(SETTINGS) | {"pipeline.warmstart", "model.novice"}
    with open_dict(cfg):  # a config without the group (run folders made before it) resolves the same
        del cfg["student"]
    assert resolve(cfg) == s and resolve(cfg).settings == s.settings
    ippo = resolve(_compose("student=ippo"))
    assert ippo.student == "ippo" and ippo.ippo.radius == 4
    assert {k: v for k, v in ippo.settings.items() if k != "student"} == s.settings
