"""docs/rules.md is the project's one specification: its examples run, its anchors exist, and
nothing in the repository points to a specification outside it."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "docs" / "rules.md"
# Spelled in pieces so that this file does not match its own search.
OUTSIDE_SPEC = ("DES" + "IGN", "../" + "shared", "/work/" + "shared")


def tracked_text_files() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    files = []
    for name in out.decode().split("\0"):
        path = ROOT / name
        if name and path.is_file() and path.suffix not in {".png", ".jpg", ".gif", ".pdf", ".npz", ".safetensors"}:
            files.append(path)
    return files


def github_slugs(markdown: str) -> set[str]:
    """Anchors GitHub gives the headings of a Markdown text (duplicates get ``-1``, ``-2``...)."""
    slugs: set[str] = set()
    counts: dict[str, int] = {}
    in_fence = False
    for line in markdown.splitlines():
        if line.startswith("```"):
            in_fence = not in_fence
            continue
        m = None if in_fence else re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m is None:
            continue
        text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", lambda g: g.group(1) or "", m.group(1))
        slug = re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")
        n = counts.get(slug, 0)
        counts[slug] = n + 1
        slugs.add(slug if n == 0 else f"{slug}-{n}")
    return slugs


def test_no_file_cites_a_specification_outside_the_repository():
    hits = []
    for path in tracked_text_files():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for lineno, line in enumerate(text.splitlines(), 1):
            if any(s in line for s in OUTSIDE_SPEC):
                hits.append(f"{path.relative_to(ROOT)}:{lineno}: {line.strip()[:100]}")
    assert not hits, "cite docs/rules.md instead:\n" + "\n".join(hits)


def test_every_cited_rules_anchor_exists():
    anchors = github_slugs(RULES.read_text(encoding="utf-8"))
    assert {"lakes", "conflicts", "generator-guarantees", "densities", "lake-grid", "plans", "format-history"} <= anchors
    cited: dict[str, list[str]] = {}
    pattern = re.compile(r"docs/rules\.md#([A-Za-z0-9_\-]+)|(?<=\]\()(?:rules\.md)?#([A-Za-z0-9_\-]+)")
    for path in tracked_text_files() + [RULES]:
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for m in pattern.finditer(text):
            anchor = m.group(1) or m.group(2)
            if m.group(2) and path != RULES and "rules.md#" not in m.group(0):
                continue  # a same-page link of another Markdown file
            cited.setdefault(anchor, []).append(str(path.relative_to(ROOT)))
    assert len(cited) >= 10  # the code and tests do cite the rules
    missing = {a: sorted(set(where)) for a, where in cited.items() if a not in anchors}
    assert not missing, f"anchors cited but not in docs/rules.md: {missing}"


# ----------------------------------------------------------------------------- step examples
STATUS_CODES = {"ACTIVE": 0, "ARRIVED": 1, "FELL": 2, "TIMED_OUT": 3, "ABSENT": 4}


def step_examples() -> list[tuple[str, dict, str, str, str, dict]]:
    """Every ```step block: (id, options, before grid, plan, after grid, expected statuses)."""
    text = RULES.read_text(encoding="utf-8")
    examples = []
    for k, m in enumerate(re.finditer(r"^```step([^\n]*)\n(.*?)^```", text, re.S | re.M)):
        options = dict(kv.split("=", 1) for kv in m.group(1).split())
        before, plan, after, statuses = [], [], [], {}
        for line in m.group(2).splitlines():
            if line.startswith("="):
                for item in line[1:].split(","):
                    letter, status = item.split()
                    statuses[letter] = status
                continue
            left, middle, right = (part.strip() for part in line.split("|"))
            before += [left] if left else []
            plan += [middle] if middle else []
            after += [right] if right else []
        examples.append((f"step{k}", options, "\n".join(before), "\n".join(plan), "\n".join(after), statuses))
    return examples


EXAMPLES = step_examples()


def test_rules_has_step_examples():
    assert len(EXAMPLES) >= 10


@pytest.mark.parametrize("name, options, before, plan, after, statuses", EXAMPLES, ids=[e[0] for e in EXAMPLES])
def test_rules_step_example(name, options, before, plan, after, statuses):
    import jax

    from jaxlake.env import reset, step
    from jaxlake.text import parse_lake, parse_plan, render_text

    cap = dict(max_height=4, max_width=5, max_agents=4)  # one canvas: one compile of step
    lake = parse_lake(before, slip_prob=0.0, on_goal=options.get("on_goal", "vanish"),
                      max_steps=int(options.get("max_steps", 16)), **cap)
    n = int(lake.num_agents)
    steps = max(len(line.split(":", 1)[1].split()) for line in plan.splitlines())
    actions, malformed = parse_plan(plan, n, steps)
    assert not malformed, plan
    padded = np.zeros((cap["max_agents"], steps), np.int32)
    padded[:n] = actions
    state, jit_step = reset(lake), jax.jit(step)
    for k in range(steps):
        state, _ = jit_step(jax.random.key(k), lake, state, padded[:, k])
    assert int(state.t) == steps
    assert render_text(lake, state) == after
    for letter, status in statuses.items():
        assert int(state.status[ord(letter) - ord("A")]) == STATUS_CODES[status], (letter, status)


def test_rules_state_the_text_format_the_code_uses():
    from jaxlake.text import FROZEN_SYMBOL, HOLE_SYMBOL, LEGACY_HOLE_SYMBOL, TEXT_FORMAT_VERSION

    text = RULES.read_text(encoding="utf-8")
    section = text[text.index("### Lake grid"): text.index("### Plans")]
    assert f"| `{FROZEN_SYMBOL}` | frozen |" in section
    assert f"| `{HOLE_SYMBOL}` | hole" in section
    history = text[text.index("### Format history"):]
    assert f"TEXT_FORMAT_VERSION = {TEXT_FORMAT_VERSION}`): holes are `{HOLE_SYMBOL}`" in history
    assert f"holes were `{LEGACY_HOLE_SYMBOL}`" in history
