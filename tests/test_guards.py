"""The suite's own guards (tests/conftest.py): a test that hangs ends its worker instead of the
run, a test whose worker crashes gets one rerun on a fresh worker, and a test that crashes twice
fails while the rest of its file runs. Checked on throw-away tests in a pytest run of their own
under xdist (two workers, whole files each, as the suite runs), the hang in the last file, where
xdist's own crash handling left the workers waiting forever."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

FILES = {
    "test_a.py": '''
import os, signal
from pathlib import Path

def test_first():
    pass

def test_crashes_once():
    flag = Path(os.environ["FLAG"])
    if not flag.exists():
        flag.write_text("crashed")
        os.kill(os.getpid(), signal.SIGSEGV)

def test_after_the_crash():
    pass
''',
    "test_b.py": '''
import time

def test_b1():
    time.sleep(1)

def test_b2():
    time.sleep(1)
''',
    "test_c.py": '''
import time

def test_hangs():
    time.sleep(120)

def test_after_the_hang():
    pass
''',
}


def test_a_hang_fails_alone_and_a_crash_reruns_once(tmp_path):
    for name, text in FILES.items():
        (tmp_path / name).write_text(text)
    env = dict(os.environ, JAXLAKE_TEST_HANG_S="3", FLAG=str(tmp_path / "flag"), PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.conftest", "-n", "2", "--dist", "loadfile",
                          "-p", "no:cacheprovider", "-v", "-c", os.devnull, "--rootdir", str(tmp_path), str(tmp_path)],
                         capture_output=True, text=True, cwd=str(tmp_path), env=env, timeout=300)
    last = out.stdout.strip().splitlines()[-1]
    assert out.returncode == 1, out.stdout[-3000:]
    assert "1 failed, 6 passed, 2 rerun" in last, out.stdout[-3000:]
    assert "FAILED test_c.py::test_hangs" in out.stdout
    for passed in ("test_a.py::test_crashes_once", "test_a.py::test_after_the_crash", "test_c.py::test_after_the_hang"):
        assert f"PASSED {passed}" in out.stdout, passed
    assert "test_a.py::test_crashes_once: crashed 1 time(s)" in out.stdout
    assert "test_c.py::test_hangs: crashed 2 time(s)" in out.stdout
