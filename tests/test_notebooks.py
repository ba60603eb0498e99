"""The notebooks: committed clean, and executed top to bottom (FAST settings) with nbclient.

Each notebook runs in its own temporary working directory, in a kernel of *this*
interpreter (a private kernel spec under a temporary ``JUPYTER_PATH``: nothing is registered
globally), and must finish without a cell error and leave its artifacts (PNG figures, GIFs,
bench files, a training run folder) under ``outputs/`` (git-ignored).
"""

import json
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
NAMES = ("01_lakes.ipynb", "02_training.ipynb", "03_engineer.ipynb")
KERNEL = "jaxlake-test-python"


def _read(name):
    return nbformat.read(NOTEBOOKS / name, as_version=4)


@pytest.mark.parametrize("name", NAMES)
def test_committed_notebook_is_clean_and_parameterised(name):
    nb = _read(name)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code, name
    for c in code:  # committed without outputs: nothing stale
        assert c.get("outputs", []) == [], f"{name}: a cell has committed outputs"
        assert c.get("execution_count") is None, f"{name}: a cell has an execution count"
    params = [c for c in code if "parameters" in c.metadata.get("tags", [])]
    assert len(params) == 1, f"{name}: needs exactly one cell tagged 'parameters'"
    assert "FAST = True" in params[0].source, f"{name}: the committed default must be FAST = True"
    assert code.index(params[0]) == 0, f"{name}: the parameters cell must come first"


@pytest.fixture
def kernel_name(tmp_path_factory, monkeypatch):
    """A kernel spec for the running interpreter, visible only to this test process."""
    from jupyter_client.kernelspec import KernelSpecManager

    root = tmp_path_factory.mktemp("jupyter")
    spec_dir = root / "kernels" / KERNEL
    spec_dir.mkdir(parents=True)
    spec = {"argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "jaxlake tests", "language": "python"}
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    monkeypatch.setenv("JUPYTER_PATH", str(root))
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    found = KernelSpecManager().get_kernel_spec(KERNEL)
    assert found.argv[0] == sys.executable
    return KERNEL


def _execute(name, workdir, kernel):
    from nbclient import NotebookClient

    nb = _read(name)
    client = NotebookClient(nb, kernel_name=kernel, timeout=900, allow_errors=False,
                            resources={"metadata": {"path": str(workdir)}})
    client.execute()  # raises CellExecutionError (with the traceback) on any cell error
    nbformat.write(nb, workdir / f"executed_{name}")  # kept in the tmp dir for inspection
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    return nb, outputs


def _images(outputs, mime):
    return [o for o in outputs if o.get("output_type") in ("display_data", "execute_result") and mime in o.get("data", {})]


def _gif_frames(path):
    from PIL import Image

    with Image.open(path) as img:
        assert img.format == "GIF", path
        return img.n_frames


@pytest.mark.slow
def test_01_lakes_runs_and_writes_its_artifacts(tmp_path, kernel_name):
    _, outputs = _execute("01_lakes.ipynb", tmp_path, kernel_name)
    out = tmp_path / "outputs" / "01_lakes"
    for png in ("dimensions.png", "densities.png", "paths.png", "rollouts.png", "slip.png", "throughput.png",
                "bench_gpu.png", "bench_cpu/bench.png"):
        assert (out / png).is_file() and (out / png).stat().st_size > 10_000, png
    # the planner's rollout: frame 0 plus at least one step per frame until every agent arrived
    assert _gif_frames(out / "planner_rollout.gif") >= 2
    assert _gif_frames(out / "random_rollout.gif") >= 2
    bench = json.loads((out / "bench_cpu" / "bench.json").read_text())
    assert bench["schema"] == "jaxlake.bench/1"
    assert {r["kind"] for r in bench["results"] if r["status"] == "ok"} >= {"generator", "rollout"}
    assert len(_images(outputs, "image/png")) >= 6  # one per figure
    assert len(_images(outputs, "image/gif")) == 2
    text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
    assert "planner plan: arrived 4/4" in text  # a planner plan executes without a cancelled move


@pytest.mark.slow
def test_02_training_runs_and_writes_its_artifacts(tmp_path, kernel_name):
    _, outputs = _execute("02_training.ipynb", tmp_path, kernel_name)
    out = tmp_path / "outputs" / "02_training"
    for png in ("task.png", "curves.png", "failures.png", "examples.png"):
        assert (out / png).is_file() and (out / png).stat().st_size > 10_000, png
    assert _gif_frames(out / "final_policy.gif") >= 2
    stage = out / "stage_1"
    for f in ("metrics.jsonl", "train_eval.json", "curves.png", "policy/config.json"):
        assert (stage / f).is_file(), f
    rows = [json.loads(line) for line in (stage / "metrics.jsonl").read_text().splitlines()]
    ws = [r["step"] for r in rows if r["phase"] == "warmstart"]
    grpo = [r for r in rows if r["phase"] == "grpo"]
    assert ws == list(range(1, len(ws) + 1)) and len(ws) >= 10
    assert [r["step"] for r in grpo] == list(range(1, len(grpo) + 1)) and len(grpo) >= 5
    for r in grpo:  # the failure-type series the notebook plots
        for k in ("fall_rate", "conflict_rate", "timeout_rate", "malformed_rate", "success"):
            assert 0.0 <= r[k] <= 1.0, (k, r[k])
    ev = json.loads((stage / "train_eval.json").read_text())
    text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
    # the notebook's own replay of the held-out lakes agrees with what train_stage reported
    assert f"GRPO: success here {ev['final']['success']:.3f}, reported by train_stage {ev['final']['success']:.3f}" in text
    assert len(_images(outputs, "image/png")) >= 4  # task, curves, failures, examples
    assert len(_images(outputs, "image/gif")) == 1


@pytest.mark.slow
def test_03_engineer_runs_and_writes_its_artifacts(tmp_path, kernel_name):
    _, outputs = _execute("03_engineer.ipynb", tmp_path, kernel_name)
    out = tmp_path / "outputs" / "03_engineer"
    for png in ("current_env.png", "proposed_env.png"):
        assert (out / png).is_file() and (out / png).stat().st_size > 10_000, png
    stage = out / "run" / "stage_1"
    for f in ("summary.txt", "engineer.json", "env.yaml", "next_env.yaml"):
        assert (stage / f).is_file(), f
    eng = json.loads((stage / "engineer.json").read_text())
    assert eng["engineer"] == "policy" and eng["source"] == "policy"
    assert eng["decision"] in ("proposed", "kept", "fallback")
    text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
    assert eng["prompt"] in text  # the exact prompt is shown
    assert "rebuilt full prompt == engineer.json prompt: True" in text
    for name in ("policy_no_failures", "policy_no_env_stats", "policy_no_history"):
        assert f"=== {name}:" in text, name
    # the study section: the table and its plot when docs/results.json exists, else the command
    results = ROOT / "docs" / "results.json"
    if results.is_file():
        md = "".join(o.get("data", {}).get("text/markdown", "") for o in outputs)
        assert json.loads(results.read_text())["table_md"] in md
        assert len(_images(outputs, "image/png")) >= 3  # current and proposed lakes, study plot
    else:
        assert "python -m jaxlake.study" in text
        assert len(_images(outputs, "image/png")) >= 2
