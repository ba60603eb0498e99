"""The UED study (``python -m jaxlake.students.study``, conf/ued_study.yaml) at the smallest
settings: two methods (dr and SFL) x two seeds (vmapped) on a two-cell suite of a few lakes, end to end,
at equal policy updates with the lake steps each played;
the page's generated block rebuilt identically from its JSON and the JSON from the archive; a
rerun, and a fresh checkout with only the archive, train nothing; a record of other settings
refused; and the paired intervals against a hand computation."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from jaxlake.io import jsonable, read_json
from jaxlake.students import study as S


def _cfg(tmp_path: Path, **study):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    from jaxlake.conf import CONF_DIR

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(str(CONF_DIR), version_base=None):
            cfg = compose("ued_study", overrides=["ippo=smoke", "ippo.eval_lakes=8", f"runs_dir={tmp_path / 'runs'}",
                                                  "experiment=smoke"])
    finally:
        GlobalHydra.instance().clear()
    plain = OmegaConf.to_container(cfg, resolve=True)
    plain.pop("hydra", None)
    plain["study"].update({"seeds": 2, "seed_batch": 2, "lakes_per_cell": 8,
                           "methods": {"dr": {"method": "dr"}, "sfl": {"method": "sfl"}},
                           "cells": {"tiny": {}, "7x7": {"height": 7, "width": 7, "max_steps": 28}},
                           "results": str(tmp_path / "docs" / "ued.md"), **study})
    return OmegaConf.create(plain)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ued")
    cfg = _cfg(tmp)
    page = tmp / "docs" / "ued.md"
    page.parent.mkdir(parents=True)
    page.write_text("# Hand-written title\n\nHand-written text.\n")
    payload = S.study_main(cfg)
    return tmp, cfg, page, payload


def test_the_study_writes_records_archive_page_and_json(smoke):
    tmp, cfg, page, payload = smoke
    names = {"dr_seeds0-1.json", "sfl_seeds0-1.json"}
    assert {p.name for p in (tmp / "runs" / "smoke").glob("*.json")} == names
    assert {p.name for p in (tmp / "docs" / "ued" / "runs" / "smoke").glob("*.json")} == names
    text = page.read_text()
    assert text.startswith("# Hand-written title\n\nHand-written text.\n") and S.BEGIN in text and S.END in text
    assert read_json(page.with_suffix(".json")) == json.loads(json.dumps(jsonable(payload)))
    rows = {v["name"]: v for v in payload["variants"]}
    assert list(rows) == ["dr", "sfl"] and rows["dr"]["seeds"] == rows["sfl"]["seeds"] == [0, 1]
    # the same policy updates; SFL's lake steps add its scoring rollouts (64 levels x 4 episodes
    # x 16 steps before each of the 2 updates)
    assert rows["dr"]["grad_steps"] == rows["sfl"]["grad_steps"] == [2, 2]
    assert rows["dr"]["lake_steps"] == [2 * 4 * 8] * 2
    assert rows["sfl"]["lake_steps"] == [2 * 4 * 8 + 2 * 64 * 4 * 16] * 2
    assert "vs_baseline" not in rows["dr"] and rows["sfl"]["vs_baseline"]["suite"]["seeds"] == [0, 1]
    assert "**Verdict.**" in text and "| sfl | sfl (64 levels x 4, keep 16, 0.5 of a pool, every 1) | 2 | 2 | " in text
    assert payload["in_support"] == {"tiny": True, "7x7": False} and "| 7x7 | height=7, width=7, max_steps=28 | no |" in text


def test_the_paired_numbers_are_the_records_lakes(smoke):
    tmp, cfg, page, payload = smoke
    recs = {r["variant"]: r for r in S.load_records(tmp / "runs" / "smoke")}
    suite = {v: [np.concatenate([S.decode(recs[v]["outcomes"][c][i], 8) for c in ("tiny", "7x7")])
                 for i in range(2)] for v in recs}
    per_seed = [suite["sfl"][i].mean() - suite["dr"][i].mean() for i in range(2)]
    got = payload["variants"][1]["vs_baseline"]["suite"]
    assert got["per_seed"] == pytest.approx(per_seed, abs=1e-6)
    assert got["pooled"]["n"] == 2 * 2 * 8
    won = sum(int((b & ~a).sum()) for a, b in zip(suite["dr"], suite["sfl"]))
    assert got["pooled"]["won"] == won
    assert payload["variants"][0]["suite"] == pytest.approx([s.mean() for s in suite["dr"]], abs=1e-6)


def test_the_block_is_rebuilt_identically_from_json_and_archive(smoke):
    tmp, cfg, page, payload = smoke
    block = S.page_block(page)
    stored = read_json(page.with_suffix(".json"))
    assert f"{S.BEGIN}\n{S.render(stored)}\n{S.END}" == block
    archived = S.load_records(tmp / "docs" / "ued" / "runs" / "smoke")
    again = S.summarize(archived, {"baseline": "dr", "methods": cfg.study.methods}, commit=stored["commit"])
    assert json.loads(json.dumps(jsonable(again))) == stored


def test_a_rerun_and_a_fresh_checkout_train_nothing(smoke, monkeypatch):
    tmp, cfg, page, payload = smoke
    before = page.read_text()

    def no_training(*a, **k):
        raise AssertionError("a finished unit was trained again")

    monkeypatch.setattr(S, "run_unit", no_training)
    S.study_main(cfg)  # the same folder: every unit has its record
    assert page.read_text() == before
    shutil.rmtree(tmp / "runs")  # a fresh checkout: only the archive beside the page
    S.study_main(cfg)
    assert page.read_text() == before
    assert {p.name for p in (tmp / "runs" / "smoke").glob("*.json")} == {"dr_seeds0-1.json", "sfl_seeds0-1.json"}


def test_records_of_other_settings_are_refused(smoke):
    tmp, cfg, page, payload = smoke
    other = _cfg(tmp, lakes_per_cell=4)
    with pytest.raises(S.StudyError, match="lakes_per_cell: 8 -> 4"):
        S.study_main(other)
    # a method's record of other ippo.ued settings (e.g. before a change of the defaults)
    changed = _cfg(tmp, methods={"dr": {"method": "dr"}, "sfl": {"method": "sfl", "sfl_ratio": 0.25}})
    with pytest.raises(S.StudyError, match="ued.sfl_ratio: 0.5 -> 0.25"):
        S.study_main(changed)


def test_the_cells_in_the_training_generators_support():
    """The hard in-support cells of conf/ued_study.yaml are lakes env=tiny's generator makes (its
    2-3 holes of 25); more holes, agents or a larger lake are not."""
    from jaxlake.config import LakeConfig
    from jaxlake.mixture import Mixture

    from jaxlake.conf import CONF_DIR
    from omegaconf import OmegaConf

    env = Mixture.of(LakeConfig())
    cells = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "ued_study.yaml"))["study"]["cells"]
    got = {c: S.in_support(env, S.cell_mixture(env, f)) for c, f in cells.items()}
    assert got == {"tiny": True, "holes3_conflict": True, "long_conflict": True, "holes20": False, "agents3": False,
                   "7x7": False, "7x7_holes20": False, "8x8_agents4": False}
    assert S._hole_counts(LakeConfig()) == {0, 2, 3} and S._hole_counts(LakeConfig(hole_density=0.2)) == {0, 4, 5}
    assert not S.in_support(env, S.cell_mixture(env, {"max_dist": None, "min_dist": 1, "slip_prob": 0.1}))


def test_bad_settings_name_the_field(tmp_path):
    with pytest.raises(S.StudyError, match="study.baseline='nope'"):
        S.Study.from_cfg(_cfg(tmp_path, baseline="nope"))
    with pytest.raises(S.StudyError, match="study.cells.big"):
        S.Study.from_cfg(_cfg(tmp_path, cells={"big": {"height": 99}}))
    with pytest.raises(S.StudyError, match="study.methods.x"):
        S.Study.from_cfg(_cfg(tmp_path, methods={"dr": {"method": "dr"}, "x": {"method": "paired"}}))


def test_paired_matches_a_hand_computation():
    base = {0: np.array([1, 0, 1, 1], bool), 1: np.array([0, 0, 1, 1], bool), 2: np.array([1, 1, 1, 0], bool),
            7: np.array([1, 1, 1, 1], bool)}  # seed 7: the other row does not have it
    other = {0: np.array([1, 1, 1, 1], bool), 1: np.array([0, 1, 1, 0], bool), 2: np.array([1, 1, 1, 1], bool)}
    got = S.paired(base, other)
    assert got["seeds"] == [0, 1, 2]
    # per seed: 3/4 -> 4/4, 2/4 -> 2/4, 3/4 -> 4/4
    assert got["per_seed"] == pytest.approx([0.25, 0.0, 0.25])
    # mean 1/6; sd sqrt(((1/12)^2 * 2 + (1/6)^2) / 2) = sqrt(1/48); t(2, 97.5 %) = 4.302653
    o = got["over_seeds"]
    assert o["n"] == 3 and o["diff"] == pytest.approx(1 / 6, abs=1e-6)
    assert o["half"] == pytest.approx(4.302653 * (1 / 48) ** 0.5 / 3 ** 0.5, abs=1e-5)
    # pooled: 12 lake pairs, differences three +1, one -1, eight 0: mean 1/6;
    # sum of squares 3 (5/6)^2 + (7/6)^2 + 8 (1/6)^2 = 11/3, sd sqrt(1/3); t(11, 97.5 %) = 2.200985
    p = got["pooled"]
    assert (p["n"], p["won"], p["lost"]) == (12, 3, 1) and p["diff"] == pytest.approx(1 / 6, abs=1e-6)
    assert p["half"] == pytest.approx(2.200985 * (1 / 3) ** 0.5 / 12 ** 0.5, abs=1e-5)
    assert p["p"] == pytest.approx(2 * (1 + 4) / 16, abs=1e-3)  # exact sign test: 2 P(X <= 1), X ~ Bin(4, 1/2)
    assert S.paired(base, {}) is None


def test_the_bits_round_trip():
    rs = np.random.RandomState(0)
    for n in (1, 7, 8, 1024, 1001):
        x = rs.rand(n) < 0.5
        assert np.array_equal(S.decode(S.encode(x), n), x)


def test_verdict_sorts_beat_behind_and_tied():
    def row(name, diff, half):
        return {"name": name, "seeds": [0, 1, 2], "vs_baseline": {"suite": {"over_seeds": {"diff": diff, "half": half}}}}

    payload = {"baseline": "dr", "variants": [{"name": "dr", "seeds": [0, 1, 2]}, row("a", 0.05, 0.02),
                                              row("b", -0.04, 0.01), row("c", 0.01, 0.02)]}
    text = S.verdict(payload)
    assert "Beat `dr` on the held-out suite: `a` (+0.050 ± 0.020)." in text
    assert "Behind `dr`: `b` (-0.040 ± 0.010)." in text
    assert "Cannot be told apart from `dr` with 3 seeds: `c` (+0.010 ± 0.020)." in text
    # the tied rows' seeds, not the fewest of any row (a row cut short elsewhere)
    payload["variants"].append({**row("d", -0.3, 0.05), "seeds": [0]})
    assert "Cannot be told apart from `dr` with 3 seeds" in S.verdict(payload)


def test_the_command_runs_under_hydra(tmp_path, monkeypatch):
    """``python -m jaxlake.students.study`` parses its overrides; a bad one ends in one line."""
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    monkeypatch.setattr(sys, "argv", ["jaxlake.students.study", "ippo=smoke", "study.baseline=nope",
                                      f"runs_dir={tmp_path}", "hydra/job_logging=none", "hydra/hydra_logging=none"])
    with pytest.raises(SystemExit) as stop:
        S.main()
    GlobalHydra.instance().clear()
    assert stop.value.code == 1


def test_an_engineer_row_runs_the_pipeline_at_the_same_lake_steps(tmp_path):
    """An engineer row is ``python -m jaxlake.run student=ippo engineer=<e>`` on the study's lakes
    and IPPO settings, its stages together the method rows' updates; the command composes."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from jaxlake.conf import CONF_DIR

    study = S.Study.from_cfg(_cfg(tmp_path, engineers=["fixed", "heuristic"], engineer_stages=2))
    cmd = S.engineer_command(study, "heuristic", 3, tmp_path / "eng")
    assert cmd[1:5] == ["-m", "jaxlake.run", "student=ippo", "engineer=heuristic"]
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(str(CONF_DIR), version_base=None):
            cfg = compose("config", overrides=cmd[3:])
    finally:
        GlobalHydra.instance().clear()
    assert cfg.stages == 2 and cfg.seed == 3 and cfg.ippo.num_updates * cfg.stages == study.config.num_updates
    assert list(cfg.ippo.hidden) == list(study.config.hidden) and cfg.env.height == 5
    with pytest.raises(S.StudyError, match="study.engineers: 'nobody'"):
        S.Study.from_cfg(_cfg(tmp_path, engineers=["nobody"]))


def test_the_sign_test_holds_the_pooled_lakes():
    """Pooled over seeds, thousands of lakes disagree: the exact sign test must not overflow
    (it once divided by the float 2.0 ** m, past 1023 an OverflowError)."""
    from scipy.stats import binomtest

    from jaxlake.stats import sign_test_p

    for won, lost in ((1154, 3383), (1500, 1400), (3, 1)):
        assert sign_test_p(won, lost) == pytest.approx(binomtest(won, won + lost, 0.5).pvalue, rel=1e-9, abs=1e-300)
