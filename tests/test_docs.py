"""The README and the documentation site are tested as a reader would use them.

* README.md is a door: at most 250 lines, and no date in it (measurements with dates belong on
  the research pages of docs/).
* Every ``python -m ...`` command of the project that README.md or a page of docs/ shows, in a
  ```bash block or in inline code, is composed by Hydra (``jaxlake.run``, ``jaxlake.pretrain``,
  ``jaxlake.bench``; then the pipeline's own settings check) or parsed by its argparse parser
  (every other command), with placeholders such as ``<name>`` substituted: a renamed option or a
  flag that no longer exists fails here, not in a reader's terminal.
* README's Python blocks run, and print what the ```text block after them shows; on the pages of
  docs/, every Python block followed by a ```text block (a block that shows its output) does.
* The reference pages (docs/reference/) are what docs/reference/generate.py writes from the code.
* The site builds with ``mkdocs build --strict`` (every warning, a broken link or anchor among
  them, fails).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import re
import runpy
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = REPO / "docs"
PAGES = [README, *sorted(p for p in DOCS.rglob("*.md") if "runs" not in p.relative_to(DOCS).parts)]
MAX_README_LINES = 250

#: Hydra entry points and their primary configs
HYDRA = {"jaxlake.run": "config", "jaxlake.pretrain": "pretrain", "jaxlake.bench": "bench", "jaxlake.ippo": "ippo",
         "jaxlake.students.study": "ued_study"}
#: argparse commands (the module run as ``python -m``; llm.benchmark's first word picks a mode)
ARGPARSE = {"jaxlake.study", "jaxlake.pipeline.study", "jaxlake.report", "jaxlake.pipeline.report",
            "jaxlake.launch", "jaxlake.baselines", "jaxlake.peers.setup", "jaxlake.students.bench", "llm.evaluate", "llm.training.evaluate",
            "llm.model.grow", "llm.benchmark", "llm.benchmark.cli", "llm.benchmark.memory",
            "llm.benchmark.step_plan", "llm.memory", "llm.engineer.reads"}
#: generated from the code (docs/reference/generate.py): their command lines are synopses
GENERATED = DOCS / "reference"
#: a value the reader fills in: ``<name>``, or a shell variable ``$NAME`` / ``${NAME}``
PLACEHOLDER = re.compile(r"<[^<>\s][^<>]*>|\$\{?[A-Za-z_]\w*\}?")
MONTHS = ("January|February|March|April|May|June|July|August|September|October|November|December|"
          "Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec")
DATE = re.compile(rf"\b(19|20)\d\d-[01]\d(-[0-3]\d)?\b|\b({MONTHS})\.? +[0-3]?\d\b|\b[0-3]?\d +({MONTHS})\b"
                  rf"|\b({MONTHS}) +(19|20)\d\d\b")


def _rel(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


# --------------------------------------------------------------------------- the README's size


def test_readme_is_a_door():
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_README_LINES, (
        f"README.md has {len(lines)} lines (at most {MAX_README_LINES}): move guides and research notes to docs/")
    dated = [f"{i}: {line.strip()}" for i, line in enumerate(lines, 1) if DATE.search(line)]
    assert not dated, "README.md holds dates (a measurement log belongs on a research page):\n" + "\n".join(dated)


def test_the_date_rule_catches_dates():
    for text in ("measured 2026-12-04", "on December 4", "4 Dec", "in March 2026", "(2026-11)"):
        assert DATE.search(text), text
    for text in ("0.918 -> 0.928", "768 lakes", "`max_tokens=2026`", "May the best engineer win", "v5e-32"):
        assert not DATE.search(text), text


def test_no_page_cites_an_issue_number():
    """Readers cannot resolve the project's issue numbers: a page, a GPU script or a config
    comment says what it means instead."""
    cited = re.compile(r"\bissues? #?\d+|\bissue\s+#\d+", re.I)
    files = PAGES + sorted((DOCS / "gpu").glob("*.sh")) + sorted((REPO / "conf").rglob("*.yaml"))
    bad = [f"{_rel(f)}:{i}: {line.strip()}" for f in files for i, line in enumerate(f.read_text().splitlines(), 1)
           if cited.search(line)]
    assert not bad, "\n".join(bad)
    assert cited.search("(issue 11's targets)") and cited.search("see issue #4") and not cited.search("an issue")


# --------------------------------------------------------------------------- commands


def _shell_lines(block: str) -> list[str]:
    """A ```bash block's commands: continuations joined, comments dropped, split at && ; |."""
    joined = re.sub(r"\\\n\s*", " ", block)
    out = []
    for line in joined.splitlines():
        line = re.sub(r"(^|\s)#.*$", "", line).strip()
        if line:
            out += [part.strip() for part in re.split(r"&&|\|\||;|\|", line) if part.strip()]
    return out


def _project_command(text: str) -> str | None:
    """``python -m <module> ...`` of this project in ``text`` (env assignments, ``time`` and the
    like before it dropped), else None."""
    m = re.search(r"\bpython3? -m ((?:jaxlake|llm)(?:\.\w+)*)(.*)$", text)
    return None if m is None else f"python -m {m.group(1)}{m.group(2)}".strip()


def doc_commands() -> list[tuple[str, str]]:
    """(where, command) for every project command the README and the pages show."""
    found = []
    for page in PAGES:
        if page.is_relative_to(GENERATED):
            continue
        text = page.read_text()
        for m in re.finditer(r"```(?:bash|sh|shell|console)\n(.*?)```", text, re.S):
            line_no = text.count("\n", 0, m.start()) + 2
            for part in _shell_lines(m.group(1)):
                command = _project_command(part)
                if command:
                    found.append((f"{_rel(page)}:{line_no}", command))
        prose = re.sub(r"```.*?```", "", text, flags=re.S)
        for m in re.finditer(r"(?<!`)`([^`]*\bpython3? -m (?:jaxlake|llm)[^`]*)`(?!`)", prose):
            command = _project_command(" ".join(m.group(1).split()))  # inline code may wrap lines
            if command and "..." not in command.split():  # `python -m llm.evaluate ... --against`: a mention
                line_no = text.find(m.group(0))
                found.append((f"{_rel(page)}:{text.count(chr(10), 0, line_no) + 1}", command))
    return found


COMMANDS = doc_commands()


def test_the_docs_show_commands():
    modules = {c.split()[2] for _, c in COMMANDS}
    assert {"jaxlake.run", "jaxlake.pretrain", "jaxlake.bench", "llm.evaluate", "llm.benchmark"} <= modules, modules


class _Parsed(Exception):
    pass


@contextlib.contextmanager
def _parse_only():
    """argparse parses, then stops the command before it runs (``_Parsed``)."""
    original = argparse.ArgumentParser.parse_args

    def parse_args(self, args=None, namespace=None):
        ns = original(self, args, namespace)
        raise _Parsed(ns)

    argparse.ArgumentParser.parse_args = parse_args
    try:
        yield
    finally:
        argparse.ArgumentParser.parse_args = original


def _argparse_ok(module: str, argv: list[str]) -> str | None:
    """None when ``python -m module argv`` parses, else argparse's message."""
    err = io.StringIO()
    saved = sys.argv
    sys.argv = [module, *argv]
    try:
        with _parse_only(), contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            runpy.run_module(module, run_name="__main__", alter_sys=True)
    except _Parsed:
        return None
    except SystemExit as stop:
        if stop.code in (0, None) and {"-h", "--help"} & set(argv):
            return None
        return f"exit {stop.code}: {err.getvalue().strip()[-800:]}"
    finally:
        sys.argv = saved
    return "the command ran to its end without parsing its arguments"


def _sweep_combos(overrides: list[str]) -> list[list[str]]:
    """The sweep's jobs to compose: job i takes each swept key's i-th value (its last when it has
    fewer), so every value of every key is composed once."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(overrides)
    values = []
    for text, ov in zip(overrides, parsed):
        if ov.is_sweep_override():
            key = text.split("=", 1)[0]
            values.append([f"{key}={v}" for v in ov.sweep_string_iterator()])
        else:
            values.append([text])
    return [[v[min(i, len(v) - 1)] for v in values] for i in range(max((len(v) for v in values), default=1))]


def _hydra_check(config_name: str, args: list[str], extra_first: tuple[str, ...] = ()) -> list[str]:
    """Problems composing ``args`` (a Hydra command line) against ``conf/``; [] when it composes."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    from jaxlake.conf import CONF_DIR

    overrides, keys_only, problems = list(extra_first), [], []
    i = 0
    while i < len(args):
        a = args[i]
        if a in ("-m", "--multirun"):
            pass
        elif a in ("-h", "--help", "--hydra-help", "--info", "--resolve"):
            pass
        elif a in ("--cfg", "-c", "--package", "-p"):
            i += 1
        elif a in ("-cn", "--config-name"):
            config_name = args[i + 1]
            i += 1
        elif a.startswith("-"):
            problems.append(f"unknown Hydra flag {a}")
        elif a.startswith(("hydra/", "hydra.")):
            group = re.match(r"hydra/(\w+)=(\w+)$", a)
            if group and not (CONF_DIR / "hydra" / group[1] / f"{group[2]}.yaml").is_file():
                problems.append(f"{a}: no conf/hydra/{group[1]}/{group[2]}.yaml")
        elif PLACEHOLDER.fullmatch(a):
            pass  # `<overrides>`: the reader's own
        elif PLACEHOLDER.search(a):
            keys_only.append(a.split("=", 1)[0])
        else:
            overrides.append(a)
        i += 1
    if problems:
        return problems
    from jaxlake.pipeline.settings import RunSettings

    for combo in _sweep_combos(overrides):
        GlobalHydra.instance().clear()
        try:
            with initialize_config_dir(str(CONF_DIR), version_base=None):
                cfg = compose(config_name, overrides=combo)
            if config_name in ("config", "pretrain"):
                RunSettings.from_cfg(cfg)
        except Exception as err:  # noqa: BLE001 - the message names the key
            return [f"{combo}: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"]
        finally:
            GlobalHydra.instance().clear()
        for key in keys_only:
            bare = key.lstrip("+~")
            if key.startswith("+"):
                continue
            if (CONF_DIR / bare).is_dir():
                continue
            if OmegaConf.select(cfg, bare, default="<absent>") == "<absent>":
                problems.append(f"{key}=<...>: no key {bare} in the composed config")
    return problems


def check_command(command: str) -> list[str]:
    """Problems with one project command; [] when it composes or parses."""
    command = PLACEHOLDER.sub(lambda m: f"<{'_'.join(m.group(0).strip('<>${}').split()) or 'value'}>", command)
    try:
        argv = [a for a in shlex.split(command) if a != "..."]
    except ValueError as err:
        return [f"not a shell command line: {err}"]
    module, args = argv[2], argv[3:]
    if not args and module in HYDRA.keys() | ARGPARSE:
        return []  # the command named in prose; with its arguments it is checked
    if module in HYDRA:
        if "--config-dir" in args or "-cd" in args or any(a.startswith("hydra.searchpath=") for a in args):
            return []  # a folder of the reader's own: the guide's block is run whole (tests/test_install.py)
        return _hydra_check(HYDRA[module], args)
    if module not in ARGPARSE:
        if importlib.util.find_spec(module) is None:
            return [f"no module {module}"]
        return [f"{module}: a command the docs show that tests/test_docs.py does not know how to check"]
    hydra_extra: list[str] = []
    if module in ("jaxlake.study", "jaxlake.pipeline.study") and "--" in args:
        args, hydra_extra = args[:args.index("--")], args[args.index("--") + 1:]
    problems = []
    if PLACEHOLDER.search(" ".join(args)):
        for fill in ("x", "1", "0.5"):
            problem = _argparse_ok(module, [PLACEHOLDER.sub(fill, a) for a in args])
            if problem is None:
                break
        else:
            problems.append(problem)
    else:
        problem = _argparse_ok(module, args)
        if problem is not None:
            problems.append(problem)
    if hydra_extra and not problems:
        study = args[args.index("--study") + 1] if "--study" in args else "cpu"
        problems += _hydra_check("config", hydra_extra, extra_first=(f"+study={study}",))
    return problems


@pytest.mark.parametrize("where, command", COMMANDS, ids=[f"{w}" for w, _ in COMMANDS])
def test_doc_command_composes(where, command):
    problems = check_command(command)
    assert not problems, f"{where}: `{command}`:\n" + "\n".join(problems)


@pytest.mark.parametrize("command, wrong", [
    ("python -m jaxlake.run pipeline.share_stage1=true", "share_stage1"),
    ("python -m jaxlake.run engineer=nonesuch", "nonesuch"),
    ("python -m jaxlake.run stages=0", "stages"),
    ("python -m jaxlake.run -m seed=0,1 pipeline.warmstart=sometimes", "warmstart"),
    ("python -m jaxlake.run train.nonesuch=<value>", "nonesuch"),
    ("python -m llm.evaluate runs/x/stage_1/policy --nonesuch", "nonesuch"),
    ("python -m llm.benchmark pack --nonesuch 3", "nonesuch"),
    ("python -m jaxlake.study --no-run -- pipeline.share_stage1=true", "share_stage1"),
    ("python -m jaxlake.nonesuch", "nonesuch"),
])
def test_the_check_catches_a_wrong_command(command, wrong):
    problems = check_command(command)
    assert problems and wrong in " ".join(problems), (command, problems)


# --------------------------------------------------------------------------- python blocks


def _python_blocks(path: Path, shown_only: bool) -> list[tuple[str, str | None]]:
    """Each ```python block with the ```text block right after it (its output), if any."""
    pattern = re.compile(r"```python\n(.*?)```\s*(?:```text\n(.*?)```)?", re.S)
    blocks = [(m.group(1), m.group(2)) for m in pattern.finditer(path.read_text())]
    return [(code, out) for code, out in blocks if "/data/" not in code and (out is not None or not shown_only)]


BLOCKS = [(README, code, out) for code, out in _python_blocks(README, shown_only=False)]
BLOCKS += [(page, code, out) for page in PAGES[1:] for code, out in _python_blocks(page, shown_only=True)]


def test_readme_has_examples():
    assert len([b for b in BLOCKS if b[0] == README]) >= 2


@pytest.mark.parametrize("page, code, expected", BLOCKS,
                         ids=[f"{_rel(p)}-block{i}" for i, (p, _, _) in enumerate(BLOCKS)])
def test_python_block_prints_what_the_page_shows(page, code, expected):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        exec(compile(code, str(page), "exec"), {"__name__": "docs_example"})
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


# --------------------------------------------------------------------------- generated pages, the site


def test_reference_pages_are_generated_from_the_code():
    res = subprocess.run([sys.executable, str(DOCS / "reference" / "generate.py"), "--check"], cwd=REPO,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]


def test_the_site_builds_strictly(tmp_path):
    # -f relative to the checkout: mkdocs 1.6 refuses `docs_dir: .` when the config's path is absolute
    res = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", "docs/mkdocs.yml",
                          "-d", str(tmp_path / "site")], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, (res.stdout + res.stderr)[-5000:]
    assert (tmp_path / "site" / "index.html").is_file()
    assert (tmp_path / "site" / "reference" / "api" / "index.html").is_file()
