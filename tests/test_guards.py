"""The suite's own guards (tests/conftest.py): a test that hangs ends its worker instead of the
run, and a test whose worker crashes gets one rerun on a fresh worker; a test that crashes
twice fails. Checked on three throw-away tests in a pytest run of their own under xdist."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

THROWAWAY = '''
import os, signal, time
from pathlib import Path

def test_hangs():
    time.sleep(60)

def test_crashes_once():
    flag = Path(os.environ["FLAG"])
    if not flag.exists():
        flag.write_text("crashed")
        os.kill(os.getpid(), signal.SIGSEGV)

def test_after_them():
    pass
'''


def test_a_hang_fails_alone_and_a_crash_reruns_once(tmp_path):
    (tmp_path / "test_throwaway.py").write_text(THROWAWAY)
    env = dict(os.environ, JAXLAKE_TEST_HANG_S="3", FLAG=str(tmp_path / "flag"), PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.conftest", "-n", "2", "--dist", "loadfile",
                          "-p", "no:cacheprovider", "-q", "-c", os.devnull, "--rootdir", str(tmp_path), str(tmp_path)],
                         capture_output=True, text=True, cwd=str(tmp_path), env=env, timeout=300)
    last = out.stdout.strip().splitlines()[-1]
    assert out.returncode == 1, out.stdout[-3000:]
    assert "1 failed, 2 passed, 2 rerun" in last, out.stdout[-3000:]
    assert "FAILED test_throwaway.py::test_hangs" in out.stdout
    assert "test_throwaway.py::test_crashes_once: crashed 1 time(s)" in out.stdout
    assert "test_throwaway.py::test_hangs: crashed 2 time(s)" in out.stdout
