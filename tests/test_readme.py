"""README's Python examples run and print what README shows."""

import contextlib
import io
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def _blocks():
    text = README.read_text()
    # Each ```python block, with the ```text block right after it (its expected output), if any.
    pattern = re.compile(r"```python\n(.*?)```\s*(?:```text\n(.*?)```)?", re.S)
    return [(m.group(1), m.group(2)) for m in pattern.finditer(text)]


RUNNABLE = [(code, out) for code, out in _blocks() if "/data/" not in code]


def test_readme_has_examples():
    assert len(RUNNABLE) >= 2


@pytest.mark.parametrize("code, expected", RUNNABLE, ids=[f"block{i}" for i in range(len(RUNNABLE))])
def test_readme_block(code, expected):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        exec(compile(code, str(README), "exec"), {"__name__": "readme"})
    got = buf.getvalue().strip().splitlines()
    if expected is None:
        return
    want = expected.strip().splitlines()
    assert len(got) == len(want), (got, want)
    for g, w in zip(got, want):
        if w.endswith("..."):  # a number shown to its first digits
            assert g.startswith(w[:-3]), (g, w)
        else:
            assert g == w
