"""Text interface of MAPF-FrozenLake: lakes and plans as text (docs/rules.md#text-formats).

Host-side Python over numpy views of a *single, unbatched* lake; the LLM pipeline calls these
functions once per lake / completion.

Lake grid (``render_text`` / ``parse_lake``): one line per region row, cells separated by one
space, no trailing newline::

    A . . ~
    . ~ . b
    B . . a

``.`` frozen, ``~`` hole (open water), ``A``..``Z`` agent ``i`` at its cell, ``a``..``z``
goal of agent ``i``; an agent standing on a cell hides the goal letter there. The four kinds
of symbol are disjoint, so every grid reads one way only, for all 26 agents.

Plan (``parse_plan`` / ``format_plan``): one line per agent, ``A: U U R D``, action letters
``S U D L R`` (docs/rules.md#actions) with or without spaces, any case; missing lines and
missing steps are STAY, steps past the horizon are ignored. Parsing a plan never raises on
any text: what is off format sets a *malformed* flag (a reward term) and the readable lines
still run.

Format history (docs/rules.md#format-history): :data:`TEXT_FORMAT_VERSION` 1 drew holes as
``O``, which is also agent 14's capital letter. Version 2 draws them as ``~``. ``parse_lake``
reads ``O`` only as agent 14; a grid that uses ``O`` as a hole (no goal ``o``, or several
``O`` cells) raises :class:`LegacyHoleError`, whose message gives the conversion.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import Any, Optional, Sequence

import numpy as np

from jaxlake.config import FIELD_BOUNDS, MAX_CANVAS, ConfigError, LakeConfig, on_goal_code, reject_unknown
from jaxlake.types import (
    ACTION_LETTERS,
    ACTIVE,
    ARRIVED,
    MAX_AGENTS_LIMIT,
    NUM_ACTIONS,
    ON_GOAL_CODES,
    ON_GOAL_STAY,
    STAY,
    Lake,
    LakeStats,
    State,
)

#: Version of the lake text format (docs/rules.md#format-history); 2 since holes are ``~``.
TEXT_FORMAT_VERSION = 2
FROZEN_SYMBOL = "."
#: Hole symbol: not a letter and not ``.``, so it never collides with an agent or a goal.
HOLE_SYMBOL = "~"
#: The hole symbol of format version 1; in version 2 it is only agent 14's capital letter.
LEGACY_HOLE_SYMBOL = "O"


# ============================================================================ errors
class LakeParseError(ValueError):
    """A lake text cannot be read; the message says where and why."""


class EmptyLakeError(LakeParseError):
    """The text holds no grid rows."""


class RaggedRowsError(LakeParseError):
    """Rows of the grid have different lengths."""


class UnknownSymbolError(LakeParseError):
    """A cell holds a symbol that is not ``.``, ``~``, ``A``-``Z`` or ``a``-``z``."""


class DuplicateSymbolError(LakeParseError):
    """An agent or goal letter appears more than once."""


class UnpairedAgentError(LakeParseError):
    """An agent without its goal, or a goal without its agent."""


class AgentLettersError(LakeParseError):
    """Agent letters are not the consecutive run ``A, B, C, ...``."""


class LegacyHoleError(LakeParseError):
    """The grid uses ``O`` as a hole (text format version 1); holes are ``~`` now."""


class CapacityError(LakeParseError, ConfigError):
    """The grid (or its agents) does not fit the requested static capacity."""


# ============================================================================ rendering
def _lake_arrays(lake: Lake) -> dict[str, np.ndarray]:
    """Numpy views of one unbatched lake (checked)."""
    holes = np.asarray(lake.holes, dtype=bool)
    region = np.asarray(lake.region, dtype=bool)
    starts = np.asarray(lake.starts, dtype=np.int64)
    goals = np.asarray(lake.goals, dtype=np.int64)
    num_agents = np.asarray(lake.num_agents)
    if holes.ndim != 2 or num_agents.ndim != 0:
        raise ValueError(
            f"expected one unbatched lake (holes [H, W], num_agents []), got holes "
            f"{holes.shape} and num_agents {num_agents.shape}; index the batch first"
        )
    rows = np.flatnonzero(region.any(axis=1))
    cols = np.flatnonzero(region.any(axis=0))
    height = int(rows.max()) + 1 if rows.size else 0
    width = int(cols.max()) + 1 if cols.size else 0
    return dict(
        holes=holes,
        starts=starts,
        goals=goals,
        num_agents=int(num_agents),
        height=height,
        width=width,
        on_goal=int(np.asarray(lake.on_goal)),
    )


def render_text(lake: Lake, state: Optional[State] = None) -> str:
    """Render one lake as text (docs/rules.md#lake-grid); no trailing newline.

    Args:
      lake: one unbatched :class:`~jaxlake.types.Lake`.
      state: optional :class:`~jaxlake.types.State` of that lake. Without it the initial
        position is drawn: every agent in play on its start and every goal letter.

    With a state, exactly these are drawn:

    * every ``ACTIVE`` agent as its capital at ``state.pos`` and its goal as the lower-case
      letter at its goal cell;
    * every ``ARRIVED`` agent of a lake with ``on_goal = "stay"`` as its capital on its
      goal (it still occupies the cell);
    * nobody else: agents that fell, timed out, arrived under ``"vanish"`` or are absent
      are not drawn, and neither are their goal letters.

    An agent drawn on a cell hides a goal letter there. Holes are drawn as ``~``; agents are
    only ever drawn on frozen cells.
    """
    a = _lake_arrays(lake)
    n, h, w = a["num_agents"], a["height"], a["width"]
    grid = np.where(a["holes"][:h, :w], HOLE_SYMBOL, FROZEN_SYMBOL).astype(object)

    if state is None:
        show_goal = np.ones(n, dtype=bool)
        show_agent = np.ones(n, dtype=bool)
        pos = a["starts"][:n]
    else:
        status = np.asarray(state.status)[:n]
        pos = np.asarray(state.pos, dtype=np.int64)[:n]
        if status.ndim != 1 or pos.ndim != 2:
            raise ValueError(f"expected one unbatched state (status [A]), got status {np.shape(state.status)}")
        active = status == ACTIVE
        staying = (status == ARRIVED) & (a["on_goal"] == ON_GOAL_STAY)
        show_goal = active
        show_agent = active | staying
        pos = np.where(staying[:, None], a["goals"][:n], pos)

    for i in range(n):  # goals first so that agents hide them
        if show_goal[i]:
            r, c = a["goals"][i]
            grid[r, c] = chr(ord("a") + i)
    for i in range(n):
        if show_agent[i]:
            r, c = pos[i]
            grid[r, c] = chr(ord("A") + i)
    return "\n".join(" ".join(row) for row in grid)


# ============================================================================ lake parsing
#: Keyword fields ``parse_lake`` accepts (``LakeConfig`` fields; grid-derived ones checked).
_LAKE_FIELDS = {f.name for f in dataclasses.fields(LakeConfig)}


def _grid_rows(text: str) -> list[list[str]]:
    lines = text.splitlines()
    while lines and not lines[0].strip():
        lines.pop(0)
    while lines and not lines[-1].strip():
        lines.pop()
    if not lines:
        raise EmptyLakeError("lake text has no grid rows")
    rows = [[ch for ch in line if not ch.isspace()] for line in lines]
    for r, row in enumerate(rows):
        if not row:
            raise RaggedRowsError(f"row {r} is empty; every row needs {len(rows[0])} cells")
    width = len(rows[0])
    for r, row in enumerate(rows):
        if len(row) != width:
            raise RaggedRowsError(f"row {r} has {len(row)} cells but row 0 has {width}")
    return rows


def _check_range(name: str, value: Any, lo: float, hi: float, integer: bool) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ConfigError(f"{name}={value!r} must be a number")
    if integer:
        if float(value) != int(value):
            raise ConfigError(f"{name}={value!r} must be an integer")
        value = int(value)
    else:
        value = float(value)
    if not lo <= value <= hi:
        raise ConfigError(f"{name}={value} not in [{lo}, {hi}]")
    return value


def _reject_legacy_holes(rows: list[list[str]]) -> None:
    """Raise :class:`LegacyHoleError` when ``O`` cannot be agent 14 (format 1 holes)."""
    legacy = [(r, c) for r, row in enumerate(rows) for c, ch in enumerate(row) if ch == LEGACY_HOLE_SYMBOL]
    if not legacy:
        return
    has_goal = any(ch == LEGACY_HOLE_SYMBOL.lower() for row in rows for ch in row)
    if has_goal and len(legacy) == 1:
        return  # agent 14 with its goal: an ordinary agent
    where = ", ".join(f"row {r} col {c}" for r, c in legacy[:4]) + (", ..." if len(legacy) > 4 else "")
    why = f"{len(legacy)} 'O' cells" if has_goal else "'O' without goal 'o'"
    raise LegacyHoleError(
        f"{why} ({where}): 'O' is agent {ord(LEGACY_HOLE_SYMBOL) - ord('A')}'s letter and holes are "
        f"'{HOLE_SYMBOL}' since text format {TEXT_FORMAT_VERSION}; a format-1 grid with fewer than 15 "
        f"agents reads as parse_lake(text.replace('O', '{HOLE_SYMBOL}'))"
    )


def parse_lake(text: str, **fields: Any) -> Lake:
    """Read an initial grid (as :func:`render_text` writes it) back into a :class:`Lake`.

    The grid gives the region (``height x width``), holes, starts (capitals), goals
    (lower case) and ``num_agents``. Cells may be separated by any whitespace or none.
    Other :class:`~jaxlake.config.LakeConfig` fields come as keywords: ``slip_prob``
    (default 0.0), ``max_steps`` (16), ``on_goal`` (``"vanish"``), ``min_dist`` /
    ``max_dist`` (only used for ``stats.dist_ok``), and the static capacity ``max_height``,
    ``max_width``, ``max_agents`` (default: the grid's height, width and number of agents).
    ``height``, ``width`` and ``num_agents`` may be passed but must match the grid;
    ``hole_density`` / ``conflict_density`` are accepted and ignored (``stats`` holds the
    achieved values, computed by :func:`jaxlake.distances.lake_stats`).

    ``~`` is a hole and ``O`` is agent 14, nothing else. A grid that still writes holes as
    ``O`` (format version 1: ``O`` without goal ``o``, or more than one ``O``) raises
    :class:`LegacyHoleError` rather than being guessed at; its message gives the one-line
    conversion (docs/rules.md#format-history).

    Raises (all ``ValueError`` subclasses): :class:`EmptyLakeError`,
    :class:`RaggedRowsError` (names the row and both lengths), :class:`UnknownSymbolError`
    (names symbol, row and column), :class:`DuplicateSymbolError`,
    :class:`UnpairedAgentError` (agent without goal or goal without agent),
    :class:`AgentLettersError` (letters not ``A, B, C, ...``), :class:`LegacyHoleError`,
    :class:`CapacityError` (grid bigger than the capacity) and
    :class:`~jaxlake.config.ConfigError` (a keyword out of its range or unknown).
    """
    import jax.numpy as jnp

    reject_unknown("LakeConfig", fields, _LAKE_FIELDS)
    if not isinstance(text, str):
        raise LakeParseError(f"lake text must be a str, got {type(text).__name__}")
    rows = _grid_rows(text)
    h, w = len(rows), len(rows[0])

    _reject_legacy_holes(rows)
    holes = np.zeros((h, w), dtype=bool)
    starts: dict[int, tuple[int, int]] = {}
    goals: dict[int, tuple[int, int]] = {}
    for r, row in enumerate(rows):
        for c, ch in enumerate(row):
            if ch == FROZEN_SYMBOL:
                continue
            if ch == HOLE_SYMBOL:
                holes[r, c] = True
            elif "A" <= ch <= "Z":
                i = ord(ch) - ord("A")
                if i in starts:
                    raise DuplicateSymbolError(f"agent {ch!r} appears twice: at row {starts[i][0]}, col {starts[i][1]} and at row {r}, col {c}")
                starts[i] = (r, c)
            elif "a" <= ch <= "z":
                i = ord(ch) - ord("a")
                if i in goals:
                    raise DuplicateSymbolError(f"goal {ch!r} appears twice: at row {goals[i][0]}, col {goals[i][1]} and at row {r}, col {c}")
                goals[i] = (r, c)
            else:
                raise UnknownSymbolError(
                    f"unknown symbol {ch!r} at row {r}, col {c}; expected '.', '~', 'A'-'Z' or 'a'-'z'"
                )

    for i in sorted(set(starts) - set(goals)):
        r, c = starts[i]
        raise UnpairedAgentError(f"agent {chr(ord('A') + i)!r} at row {r}, col {c} has no goal {chr(ord('a') + i)!r}")
    for i in sorted(set(goals) - set(starts)):
        r, c = goals[i]
        raise UnpairedAgentError(f"goal {chr(ord('a') + i)!r} at row {r}, col {c} has no agent {chr(ord('A') + i)!r}")
    n = len(starts)
    if n == 0:
        raise UnpairedAgentError("the grid has no agents; need at least agent 'A' and goal 'a'")
    if sorted(starts) != list(range(n)):
        letters = "".join(chr(ord("A") + i) for i in sorted(starts))
        missing = "".join(chr(ord("A") + i) for i in range(n) if i not in starts)
        raise AgentLettersError(f"agent letters must be consecutive from 'A'; got {letters!r}, missing {missing!r}")

    for name, derived in (("height", h), ("width", w), ("num_agents", n)):
        if name in fields and fields[name] != derived:
            raise ConfigError(f"{name}={fields[name]} does not match the grid's {name}={derived}")

    max_height = _check_range("max_height", fields.get("max_height", h), 1, MAX_CANVAS, True)
    max_width = _check_range("max_width", fields.get("max_width", w), 1, MAX_CANVAS, True)
    max_agents = _check_range("max_agents", fields.get("max_agents", n), 1, MAX_AGENTS_LIMIT, True)
    if h > max_height or w > max_width:
        raise CapacityError(f"the {h}x{w} grid exceeds the capacity max_height={max_height}, max_width={max_width}")
    if n > max_agents:
        raise CapacityError(f"the grid has num_agents={n}, which exceeds max_agents={max_agents}")
    slip_prob = _check_range("slip_prob", fields.get("slip_prob", 0.0), *FIELD_BOUNDS["slip_prob"], False)
    max_steps = _check_range("max_steps", fields.get("max_steps", 16), *FIELD_BOUNDS["max_steps"], True)
    on_goal = fields.get("on_goal", "vanish")
    if isinstance(on_goal, str):
        on_goal = on_goal_code(on_goal)
    elif isinstance(on_goal, bool) or int(on_goal) not in ON_GOAL_CODES.values():
        raise ConfigError(f"on_goal={on_goal!r} not in {sorted(ON_GOAL_CODES)}")
    min_dist = _check_range("min_dist", fields.get("min_dist", 1), *FIELD_BOUNDS["min_dist"], True)
    max_dist = fields.get("max_dist")
    max_dist = max_height * max_width if max_dist is None else _check_range("max_dist", max_dist, *FIELD_BOUNDS["max_dist"], True)

    canvas_holes = np.zeros((max_height, max_width), dtype=bool)
    canvas_holes[:h, :w] = holes
    region = np.zeros((max_height, max_width), dtype=bool)
    region[:h, :w] = True
    start_arr = np.zeros((max_agents, 2), dtype=np.int32)
    goal_arr = np.zeros((max_agents, 2), dtype=np.int32)
    for i in range(n):
        start_arr[i] = starts[i]
        goal_arr[i] = goals[i]
    placeholder = LakeStats(
        hole_density=jnp.float32(holes.mean()),
        conflict_density=jnp.float32(0.0),
        path_len=jnp.full((max_agents,), -1, jnp.int32),
        dist_ok=jnp.bool_(False),
        attempts=jnp.int32(0),
    )
    lake = Lake(
        holes=jnp.asarray(canvas_holes),
        region=jnp.asarray(region),
        starts=jnp.asarray(start_arr),
        goals=jnp.asarray(goal_arr),
        num_agents=jnp.int32(n),
        slip_prob=jnp.float32(slip_prob),
        max_steps=jnp.int32(max_steps),
        on_goal=jnp.int32(on_goal),
        stats=placeholder,
    )
    return lake.replace(stats=_lake_stats_jit()(lake, min_dist, max_dist))


@functools.lru_cache(maxsize=1)
def _lake_stats_jit():
    """``jax.jit(distances.lake_stats)`` built on first use (one compile per canvas shape)."""
    import jax

    from jaxlake.distances import lake_stats

    return jax.jit(lake_stats)


# ============================================================================ plans
_LETTER_TO_ACTION = {letter: i for i, letter in enumerate(ACTION_LETTERS)}
_LINE_RE = re.compile(r"^\s*([A-Za-z])\s*:(.*)$", re.DOTALL)
#: A step body splits into runs of ASCII letters, runs of whitespace and single other chars.
_TOKEN_RE = re.compile(r"[A-Za-z]+|\s+|.", re.DOTALL)
_ACTIONS_RE = re.compile(r"[SUDLRsudlr]+")


@dataclasses.dataclass(frozen=True)
class PlanParse:
    """Result of :func:`parse_plan_detailed`.

    Attributes:
      actions: ``[num_agents, horizon]`` int32 action codes (STAY where nothing was read).
      malformed: True when anything was off format.
      reasons: one human-readable line per problem (empty when well formed).
      agents_read: agent indices that had a (first) readable line, in text order.
    """

    actions: np.ndarray
    malformed: bool
    reasons: tuple[str, ...]
    agents_read: tuple[int, ...]


def _short(line: str, limit: int = 40) -> str:
    return repr(line if len(line) <= limit else line[:limit] + "...")


def parse_plan_detailed(text: Any, num_agents: int, horizon: int) -> PlanParse:
    """Parse a joint plan and say what was off format. Never raises on any ``text``.

    Format: one line per agent, ``X: <letters>`` where ``X`` is the agent letter (``A`` =
    agent 0, either case) and the letters are ``S U D L R`` (either case) with or without
    whitespace between them. Rules:

    * blank lines are ignored; missing agent lines and missing steps are STAY;
    * steps past ``horizon`` are ignored (not malformed);
    * malformed (the line is ignored): stray lines that are not ``X: ...``, an agent letter
      ``>= num_agents``, a repeated agent (the FIRST line of an agent wins);
    * malformed (the line still runs): off-format step text is skipped and takes no step.
      The steps split into runs of ASCII letters, whitespace and single other characters; a
      letter run made only of action letters is read (``UURD`` is four steps), any other run
      is skipped: ``A: U,U`` reads ``U U``, ``A: U U (done)`` reads ``U U``, ``A: UP`` reads
      nothing.

    ``text`` that is not a ``str`` (``None``, bytes that are not UTF-8, ...) gives an
    all-STAY plan flagged malformed; bytes are decoded as UTF-8 with replacement.

    Args:
      text: the completion.
      num_agents: agents in play (``0 <= num_agents <= 26``).
      horizon: steps to return (``>= 0``).
    """
    num_agents, horizon = int(num_agents), int(horizon)
    if not 0 <= num_agents <= MAX_AGENTS_LIMIT:
        raise ValueError(f"num_agents={num_agents} not in [0, {MAX_AGENTS_LIMIT}]")
    if horizon < 0:
        raise ValueError(f"horizon={horizon} must be >= 0")
    actions = np.full((num_agents, horizon), STAY, dtype=np.int32)
    reasons: list[str] = []
    read: list[int] = []
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("utf-8", errors="replace")
    if not isinstance(text, str):
        return PlanParse(actions, True, (f"plan is not text but {type(text).__name__}",), ())

    for lineno, line in enumerate(text.splitlines()):
        if not line.strip():
            continue
        m = _LINE_RE.match(line)
        if m is None:
            reasons.append(f"line {lineno}: stray text {_short(line)}")
            continue
        letter, body = m.group(1), m.group(2)
        agent = ord(letter.upper()) - ord("A")
        if agent >= num_agents:
            reasons.append(f"line {lineno}: agent {letter.upper()!r} not in play (num_agents={num_agents})")
            continue
        if agent in read:
            reasons.append(f"line {lineno}: agent {letter.upper()!r} repeated; its first line wins")
            continue
        read.append(agent)
        steps: list[int] = []
        skipped: list[str] = []
        for token in _TOKEN_RE.findall(body):
            if token.isspace():
                continue
            if _ACTIONS_RE.fullmatch(token):
                steps.extend(_LETTER_TO_ACTION[ch] for ch in token.upper())
            else:
                skipped.append(token)
        if skipped:
            shown = " ".join(skipped)
            reasons.append(f"line {lineno}: agent {letter.upper()!r} has off-format step text {_short(shown, 30)} (skipped)")
        k = min(len(steps), horizon)
        actions[agent, :k] = steps[:k]
    return PlanParse(actions, bool(reasons), tuple(reasons), tuple(read))


def parse_plan(text: Any, num_agents: int, horizon: int) -> tuple[np.ndarray, bool]:
    """``(actions [num_agents, horizon] int32, malformed)``; see :func:`parse_plan_detailed`.

    Never raises on any ``text``.
    """
    result = parse_plan_detailed(text, num_agents, horizon)
    return result.actions, result.malformed


def pad_plan_agents(actions: np.ndarray, max_agents: int) -> np.ndarray:
    """Pad a ``[num_agents, T]`` plan with STAY rows to ``[max_agents, T]`` (for ``rollout``)."""
    actions = np.asarray(actions, dtype=np.int32)
    if actions.ndim != 2 or actions.shape[0] > max_agents:
        raise ValueError(f"actions {actions.shape} do not fit [max_agents={max_agents}, T]")
    out = np.full((max_agents, actions.shape[1]), STAY, dtype=np.int32)
    out[: actions.shape[0]] = actions
    return out


def parse_plan_batch(
    texts: Sequence[Any], num_agents: Sequence[int] | np.ndarray | int, max_agents: int, horizon: int
) -> tuple[np.ndarray, np.ndarray]:
    """Parse a batch of completions into rollout-ready plans. Never raises on the texts.

    Args:
      texts: ``B`` completions.
      num_agents: agents in play per completion (``[B]``, or one int for all), e.g.
        ``np.asarray(lakes.num_agents)`` of a batched lake.
      max_agents: static capacity of the lakes (rows of the padded plans).
      horizon: ``T`` steps per plan, e.g. the batch's ``max_steps``.

    Returns:
      ``(actions [B, max_agents, horizon] int32, malformed [B] bool)``; rows of absent agent
      slots are STAY.
    """
    texts = list(texts)
    counts = np.broadcast_to(np.asarray(num_agents, dtype=np.int64), (len(texts),))
    actions = np.full((len(texts), max_agents, horizon), STAY, dtype=np.int32)
    malformed = np.zeros((len(texts),), dtype=bool)
    for b, (text, n) in enumerate(zip(texts, counts)):
        if n > max_agents:
            raise ValueError(f"num_agents[{b}]={n} exceeds max_agents={max_agents}")
        acts, bad = parse_plan(text, int(n), horizon)
        actions[b, :n] = acts
        malformed[b] = bad
    return actions, malformed


def format_plan(actions: np.ndarray, num_agents: Optional[int] = None) -> str:
    """Canonical text of a plan: ``A: U U R D``, one line per agent, no trailing newline.

    Trailing STAYs of each agent are trimmed (they mean the same as missing steps), so an
    agent that only stays prints ``A:``. ``parse_plan(format_plan(a), n, T)`` returns ``a``.

    Args:
      actions: ``[A, T]`` action codes (``0..4``); e.g. a padded ``[max_agents, T]`` plan.
      num_agents: rows to print (default: all ``A`` rows).
    """
    actions = np.asarray(actions)
    if actions.ndim != 2:
        raise ValueError(f"actions must be [num_agents, T], got shape {actions.shape}")
    n = actions.shape[0] if num_agents is None else int(num_agents)
    if not 0 <= n <= min(actions.shape[0], MAX_AGENTS_LIMIT):
        raise ValueError(f"num_agents={n} not in [0, {min(actions.shape[0], MAX_AGENTS_LIMIT)}]")
    if actions.size and (actions.min() < 0 or actions.max() >= NUM_ACTIONS):
        raise ValueError(f"actions must be in [0, {NUM_ACTIONS - 1}], got values in [{actions.min()}, {actions.max()}]")
    lines = []
    for i in range(n):
        row = [int(x) for x in actions[i]]
        while row and row[-1] == STAY:
            row.pop()
        steps = " ".join(ACTION_LETTERS[x] for x in row)
        lines.append(f"{chr(ord('A') + i)}: {steps}" if steps else f"{chr(ord('A') + i)}:")
    return "\n".join(lines)
