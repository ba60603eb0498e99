"""The GPU scripts never rot: ``docs/gpu/train.sh`` and ``docs/gpu/generate.sh`` run here, on the
CPU, with the smoke-test presets their own headers give (the line ending ``# smoke test on CPU``,
read from the script, so the documented command is the one tested), and the JSON files they
write hold every field of the benchmark's rows, at the sizes the presets ask for.

A GPU lent for a few minutes then never meets a script that a renamed flag or a moved module
broke. ``REPEATS=1`` (each timing once) and ``OUT`` (a temporary folder) are added to the
presets; the numbers measured are not checked beyond being finite, only that the script ran
its benchmarks end to end and recorded them.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from llm.benchmark.generate import GenRow
from llm.benchmark.train import StepRow, TrainRow

REPO = Path(__file__).resolve().parents[1]
GPU = REPO / "docs" / "gpu"
SMOKE = "# smoke test on CPU"

pytestmark = pytest.mark.slow  # two benchmark processes, ~15 s on 2 idle cores


def smoke_preset(script: Path) -> dict[str, str]:
    """The ``VAR=value`` settings of the header's smoke-test command (continued lines joined);
    the command must run this very script."""
    header = []
    for line in script.read_text().splitlines()[1:]:
        if not line.startswith("#"):
            break
        header.append(line[1:])
    lines = "\n".join(header).replace("\\\n", " ").splitlines()
    (command,) = [line.split(SMOKE)[0] for line in lines if SMOKE in line]
    words = shlex.split(command)
    at = words.index("bash")
    assert words[at:] == ["bash", f"docs/gpu/{script.name}"], words
    preset = dict(word.split("=", 1) for word in words[:at])
    assert preset.get("DEVICE") == "cpu" and preset.get("MODEL") == "tiny", preset
    return preset


def run_script(name: str, out: Path, tmp_path: Path) -> dict[str, str]:
    """Run ``docs/gpu/<name>`` with its smoke preset, ``REPEATS=1`` and ``OUT=out``; returns the
    preset used. Compilations go to the test session's cache (tests/conftest.py), else to a
    folder of this test, never to the script's default /tmp/jaxlake_jax_cache."""
    preset = {**smoke_preset(GPU / name), "REPEATS": "1", "OUT": str(out)}
    env = {**os.environ, **preset}
    env.setdefault("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "xla_cache"))
    done = subprocess.run(["bash", str(GPU / name)], cwd=str(tmp_path), env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, f"{name} failed:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    return preset


def check_rows(found: list[dict], row_type: type, sizes: dict) -> None:
    """Each row has exactly ``row_type``'s fields, every float finite, the ``sizes`` asked for."""
    fields = [f.name for f in dataclasses.fields(row_type)]
    assert found
    for row in found:
        assert list(row) == fields, f"{row_type.__name__} fields: {sorted(set(fields) ^ set(row))} differ"
        bad = {k: v for k, v in row.items() if isinstance(v, float) and not math.isfinite(v)}
        assert not bad, bad
        assert {k: row[k] for k in sizes} == sizes


def test_train_script_at_its_cpu_preset(tmp_path):
    out = tmp_path / "out"
    p = run_script("train.sh", out, tmp_path)
    model = p["MODEL"]
    assert sorted(f.name for f in out.iterdir()) == [f"grpo_{model}.json", f"train_{model}.json"]
    meta = {"device_kind", "jax", "peak_flops", "peak_source", "argv", "rows"}

    train = json.loads((out / f"train_{model}.json").read_text())
    assert set(train) == meta and train["device_kind"] == "cpu" and train["peak_flops"] > 0
    assert train["argv"]["models"] == model and train["argv"]["repeats"] == 1
    micro = [int(m) for m in p["MICRO"].split(",")]
    assert len(train["rows"]) == len(micro)  # one remat policy (the default, full)
    check_rows(train["rows"], TrainRow, dict(model=model, rows=int(p["ROWS"]), prompt_len=int(p["PROMPT"]),
                                             completion_len=int(p["COMPLETION"]), remat="full"))
    assert [r["micro_batches"] for r in train["rows"]] == micro
    for r in train["rows"]:
        assert r["update_s"] > 0 and r["tokens_per_s"] > 0 and r["compile_s"] > 0 and r["peak_bytes"] > 0

    grpo = json.loads((out / f"grpo_{model}.json").read_text())
    assert set(grpo) == meta and grpo["argv"]["models"] == model
    check_rows(grpo["rows"], StepRow, dict(model=model, lakes=int(p["LAKES"]), group_size=int(p["GROUP"]),
                                           prompt_len=int(p["PROMPT"]), new_tokens=int(p["NEW"]),
                                           micro_batches=int(p["STEP_MICRO"]), mu=1, beta=0.0))
    (step,) = grpo["rows"]
    assert step["step_s"] > 0 and step["sample_s"] > 0 and step["update_s"] > 0 and step["ref_logp_s"] == 0.0


def test_generate_script_at_its_cpu_preset(tmp_path):
    out = tmp_path / "out"
    p = run_script("generate.sh", out, tmp_path)
    assert p["BIG_BATCHES"] == ""  # the preset skips the big-batch run (static cache only)
    model, batches = p["MODEL"], p["BATCHES"]
    name = f"generate_{model}_b{batches.replace(',', '_')}.json"
    assert [f.name for f in out.iterdir()] == [name]
    got = json.loads((out / name).read_text())
    assert set(got) == {"bandwidth", "bandwidth_source", "peak_flops", "peak_source", "device_kind", "jax", "torch",
                        "rows", "early_finish"}
    assert got["device_kind"] == "cpu" and got["bandwidth"] > 0 and got["peak_flops"] > 0
    assert re.match(r"\d+\.\d+", got["torch"]) and got["early_finish"] == []  # no EOS_AFTER in the preset
    engines = ["ours", "transformers (dynamic cache)", "transformers (static cache)"]
    sizes = [int(b) for b in batches.split(",")]
    assert sorted((r["batch"], r["engine"]) for r in got["rows"]) == sorted((b, e) for b in sizes for e in engines)
    check_rows(got["rows"], GenRow, dict(model=model, dtype="bfloat16", prompt_len=int(p["PROMPT"]),
                                         new_tokens=int(p["NEW"])))
    for r in got["rows"]:
        assert r["prefill_tok_s"] > 0 and 0.0 <= r["agreement"] <= 1.0
        # a decode step of the tiny preset can be shorter than the timing noise: then the
        # benchmark writes NaN (JSON null) rather than a rate it did not measure
        assert r["decode_tok_s"] is None or r["decode_tok_s"] > 0, r
