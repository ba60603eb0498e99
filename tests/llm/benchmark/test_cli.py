"""``python -m llm.benchmark``'s command line (llm.benchmark.cli): ``--help`` names every mode
the command dispatches to, and each mode's own ``--help`` answers under its own name."""

import re
import subprocess
import sys

import pytest

from llm.benchmark import cli


def test_help_lists_every_mode():
    """The real entry point (``__main__``), in a fresh interpreter: each mode of
    :data:`cli.MODES` has its line in the help, and the help lists no mode that is not one."""
    out = subprocess.run([sys.executable, "-m", "llm.benchmark", "--help"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "\nmodes (" in out.stdout, f"--help lists no modes:\n{out.stdout}"
    listed = out.stdout.split("\nmodes (", 1)[1].splitlines()[1:]
    names = [line.split()[0] for line in listed if line.startswith("  ")]
    assert names == list(cli.MODES), out.stdout
    for name in cli.MODES:
        assert re.search(rf"^  {name} +\S", out.stdout, re.M), f"--help does not list the mode {name!r}"
    assert "python -m llm.benchmark <mode> --help" in out.stdout


def test_module_docstring_names_every_mode():
    usage = re.search(r"python -m llm\.benchmark \[([^]]+)\]", cli.__doc__).group(1)
    assert [m.strip() for m in usage.split("|")] == list(cli.MODES)
    for name in cli.MODES:
        assert f"* ``{name}``:" in cli.__doc__, name


@pytest.mark.parametrize("mode", list(cli.MODES))
def test_every_mode_has_its_own_help(mode, capsys):
    with pytest.raises(SystemExit) as stop:
        cli.main([mode, "--help"])
    assert stop.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: python -m llm.benchmark {mode} ")
