"""Text interface (docs/rules.md#text-formats): render_text, parse_lake, parse_plan, format_plan."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import jax.numpy as jnp

from jaxlake.config import ConfigError
from jaxlake.text import (
    AgentLettersError,
    CapacityError,
    DuplicateSymbolError,
    EmptyLakeError,
    LakeParseError,
    LegacyHoleError,
    RaggedRowsError,
    UnknownSymbolError,
    UnpairedAgentError,
    format_plan,
    pad_plan_agents,
    parse_lake,
    parse_plan,
    parse_plan_batch,
    parse_plan_detailed,
    render_text,
)
from jaxlake.types import (
    ABSENT,
    ACTIVE,
    ARRIVED,
    DOWN,
    FELL,
    LEFT,
    ON_GOAL_STAY,
    ON_GOAL_VANISH,
    RIGHT,
    STAY,
    TIMED_OUT,
    UP,
    State,
)

LAKE = "A . . ~\n. ~ . b\nB . . a"
CAP = dict(max_height=6, max_width=6, max_agents=4)  # one canvas shape: one lake_stats compile


def make_state(pos, status, t=3):
    return State(pos=jnp.asarray(pos, jnp.int32), status=jnp.asarray(status, jnp.int32), t=jnp.int32(t))


# ============================================================================ render / parse
def test_parse_hand_lake_fields():
    lake = parse_lake(LAKE, slip_prob=0.25, max_steps=9, on_goal="stay", **CAP)
    assert lake.holes.shape == (6, 6) and lake.starts.shape == (4, 2)
    assert np.asarray(lake.region).sum() == 12 and np.asarray(lake.region)[:3, :4].all()
    assert sorted(map(tuple, np.argwhere(np.asarray(lake.holes)))) == [(0, 3), (1, 1)]
    np.testing.assert_array_equal(lake.starts, [[0, 0], [2, 0], [0, 0], [0, 0]])
    np.testing.assert_array_equal(lake.goals, [[2, 3], [1, 3], [0, 0], [0, 0]])
    assert int(lake.num_agents) == 2 and int(lake.max_steps) == 9
    assert int(lake.on_goal) == ON_GOAL_STAY
    assert float(lake.slip_prob) == pytest.approx(0.25)
    # stats by lake_stats: A (0,0)->(2,3) is 5 steps, B (2,0)->(1,3) is 4 steps.
    np.testing.assert_array_equal(lake.stats.path_len, [5, 4, -1, -1])
    assert float(lake.stats.hole_density) == pytest.approx(2 / 12)
    assert bool(lake.stats.dist_ok)


def test_parse_default_capacity_is_the_grid():
    lake = parse_lake(LAKE)
    assert lake.holes.shape == (3, 4) and lake.starts.shape == (2, 2)
    assert int(lake.on_goal) == ON_GOAL_VANISH and float(lake.slip_prob) == 0.0


def test_render_initial_exact():
    assert render_text(parse_lake(LAKE, **CAP)) == LAKE


def test_parse_accepts_cells_without_spaces_and_surrounding_blank_lines():
    lake = parse_lake("\n\nA..~\n.~.b\nB..a\n", **CAP)
    assert render_text(lake) == LAKE


def test_render_with_state_shows_active_agents_and_their_goals_only():
    text = "A . b C\n. ~ . d\nB D a c"
    vanish = parse_lake(text, **CAP)
    stay = parse_lake(text, on_goal="stay", **CAP)
    # A active at (1,0); B arrived (at its goal (0,2)); C fell into (1,1); D timed out.
    pos = [[1, 0], [0, 2], [1, 1], [2, 1]]
    state = make_state(pos, [ACTIVE, ARRIVED, FELL, TIMED_OUT])
    assert render_text(vanish, state) == ". . . .\nA ~ . .\n. . a ."
    assert render_text(stay, state) == ". . B .\nA ~ . .\n. . a ."
    # Everyone active, A standing on C's goal hides the letter 'c'.
    state = make_state([[2, 3], [2, 0], [0, 3], [1, 0]], [ACTIVE] * 4)
    assert render_text(vanish, state) == ". . b C\nD ~ . d\nB . a A"
    # Absent slots draw nothing even if pos says (0, 0).
    state = make_state([[0, 1], [0, 0], [0, 0], [0, 0]], [ACTIVE, ABSENT, ABSENT, ABSENT])
    assert render_text(parse_lake("A . b\nB a .", **CAP), state).splitlines()[0] == ". A ."


def test_render_rejects_batched_lake():
    lake = parse_lake(LAKE, **CAP)
    import jax

    batch = jax.tree_util.tree_map(lambda x: jnp.stack([x, x]), lake)
    with pytest.raises(ValueError, match="unbatched"):
        render_text(batch)


@st.composite
def grids(draw, max_h=6, max_w=6, max_agents=4, min_agents=1):
    """A rendered initial grid: random holes, ``n`` agents and goals on distinct cells."""
    h = draw(st.integers(1, max_h))
    w = draw(st.integers(2 if h == 1 else 1, max_w))
    cells = h * w
    if cells < 2 * min_agents:
        h, w, cells = max_h, max_w, max_h * max_w
    n = draw(st.integers(min_agents, min(max_agents, cells // 2)))
    order = draw(st.permutations(range(cells)))
    grid = np.where(np.asarray(draw(st.lists(st.booleans(), min_size=cells, max_size=cells))), "~", ".").astype(object)
    grid = grid.reshape(h, w)
    for i in range(n):
        grid[divmod(order[2 * i], w)] = chr(ord("A") + i)
        grid[divmod(order[2 * i + 1], w)] = chr(ord("a") + i)
    return "\n".join(" ".join(row) for row in grid)


def assert_round_trip(text, **cap):
    """text -> parse -> render gives the text back; render -> parse gives equal lake arrays."""
    lake = parse_lake(text, **cap)
    assert render_text(lake) == text
    again = parse_lake(render_text(lake), **cap)
    for name in ("holes", "region", "starts", "goals", "num_agents"):
        np.testing.assert_array_equal(getattr(again, name), getattr(lake, name))
    # Starts and goals are frozen, distinct region cells; every '~' is a hole and nothing else.
    n = int(lake.num_agents)
    cells = [tuple(x) for x in np.asarray(lake.starts)[:n]] + [tuple(x) for x in np.asarray(lake.goals)[:n]]
    assert len(set(cells)) == 2 * n
    assert not np.asarray(lake.holes)[tuple(np.asarray(cells).T)].any()
    assert np.asarray(lake.holes).sum() == text.count("~")
    return lake


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(grids())
def test_round_trip_property(text):
    assert_round_trip(text, **CAP)


CAP26 = dict(max_height=8, max_width=8, max_agents=26)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(grids(max_h=8, max_w=8, max_agents=26, min_agents=15))
def test_round_trip_property_up_to_26_agents(text):
    # 15+ agents: agent 14 ('O', goal 'o') is always in play, next to holes.
    lake = assert_round_trip(text, **CAP26)
    assert int(lake.num_agents) >= 15 and "O" in text and "o" in text


def test_round_trip_26_agents_every_letter():
    letters = [chr(ord("A") + i) for i in range(26)]
    goals = [chr(ord("a") + i) for i in range(26)]
    cells = letters + goals + ["~"] * 6 + ["."] * 6  # 64 cells: an 8x8 grid
    rng = np.random.default_rng(0)
    rng.shuffle(cells)
    text = "\n".join(" ".join(cells[8 * r: 8 * r + 8]) for r in range(8))
    lake = assert_round_trip(text, **CAP26)
    assert int(lake.num_agents) == 26 and np.asarray(lake.holes).sum() == 6
    r, c = divmod(cells.index("O"), 8)
    np.testing.assert_array_equal(lake.starts[14], [r, c])
    assert not bool(lake.holes[r, c])


def test_round_trip_generated_26_agent_lakes():
    """Generator output (8x8, 26 agents, holes) renders and reads back to the same arrays."""
    import jax

    from jaxlake.config import LakeConfig
    from jaxlake.generator import generate_batch

    cfg = LakeConfig(height=8, width=8, num_agents=26, hole_density=0.15, **CAP26)
    lakes = generate_batch(jax.random.key(3), cfg, 3)
    for b in range(3):
        lake = jax.tree.map(lambda x: x[b], lakes)
        text = render_text(lake)
        symbols = text.split()
        assert sorted(set(symbols) - {".", "~"}) == sorted(chr(ord("A") + i) for i in range(26)) + sorted(chr(ord("a") + i) for i in range(26))
        assert symbols.count("~") == int(np.asarray(lake.holes).sum())
        back = parse_lake(text, **CAP26)
        for name in ("holes", "region", "starts", "goals", "num_agents"):
            np.testing.assert_array_equal(getattr(back, name), getattr(lake, name))
        assert render_text(back) == text


@pytest.mark.parametrize(
    "text, match",
    [
        ("A . O\n. . a", r"'O' without goal 'o' \(row 0 col 2\)"),  # a format-1 hole
        ("A . O\nO . a", r"'O' without goal 'o' \(row 0 col 2, row 1 col 0\)"),
    ],
)
def test_legacy_hole_symbol_is_an_error_with_the_conversion(text, match):
    with pytest.raises(LegacyHoleError, match=match) as info:
        parse_lake(text)
    assert "parse_lake(text.replace('O', '~'))" in str(info.value)
    assert isinstance(info.value, LakeParseError)
    lake = parse_lake(text.replace("O", "~"))  # the documented conversion works
    assert int(lake.num_agents) == 1 and np.asarray(lake.holes).sum() == text.count("O")


def test_legacy_hole_with_agent_14_present_is_an_error():
    letters = [chr(ord("A") + i) for i in range(15)]
    goals = [chr(ord("a") + i) for i in range(15)]
    text = "\n".join(" ".join(row) for row in (letters[:8], letters[8:] + ["."], goals[:8], goals[8:] + ["."]))
    lake = parse_lake(text)  # one 'O' with goal 'o': agent 14, no guessing involved
    assert int(lake.num_agents) == 15 and not np.asarray(lake.holes).any()
    np.testing.assert_array_equal(lake.starts[14], [1, 6])
    assert render_text(lake) == text
    with pytest.raises(LegacyHoleError, match="2 'O' cells"):
        parse_lake(text[:-1] + "O")  # a format-1 hole beside agent 14


@pytest.mark.parametrize(
    "text, error, match",
    [
        ("", EmptyLakeError, "no grid rows"),
        ("A . a\n. .\n. . .", RaggedRowsError, "row 1 has 2 cells but row 0 has 3"),
        ("A . a\n. # .", UnknownSymbolError, r"'#' at row 1, col 1"),
        ("A . .\n. . .", UnpairedAgentError, "agent 'A' at row 0, col 0 has no goal 'a'"),
        ("A . a\nb . .", UnpairedAgentError, "goal 'b' at row 1, col 0 has no agent 'B'"),
        ("A . a\nC . c", AgentLettersError, "missing 'B'"),
        ("A . a\nA . .", DuplicateSymbolError, "agent 'A' appears twice"),
        ("A . a\na . .", DuplicateSymbolError, "goal 'a' appears twice"),
        (". . .\n. ~ .", UnpairedAgentError, "no agents"),
    ],
)
def test_parse_lake_errors(text, error, match):
    with pytest.raises(error, match=match) as info:
        parse_lake(text)
    assert isinstance(info.value, LakeParseError) and isinstance(info.value, ValueError)


def test_parse_lake_capacity_and_field_errors():
    with pytest.raises(CapacityError, match="3x4 grid exceeds the capacity max_height=2"):
        parse_lake(LAKE, max_height=2, max_width=8)
    with pytest.raises(CapacityError, match="num_agents=2, which exceeds max_agents=1"):
        parse_lake(LAKE, max_agents=1)
    with pytest.raises(ConfigError, match=r"slip_prob=1.5 not in \[0.0, 1.0\]"):
        parse_lake(LAKE, slip_prob=1.5)
    with pytest.raises(ConfigError, match=r"on_goal='float'"):
        parse_lake(LAKE, on_goal="float")
    with pytest.raises(ConfigError, match=r"unknown LakeConfig field\(s\) \['colour'\]"):
        parse_lake(LAKE, colour="blue")
    with pytest.raises(ConfigError, match="num_agents=3 does not match the grid's num_agents=2"):
        parse_lake(LAKE, num_agents=3)
    # Grid-derived fields may be passed when they agree; densities are ignored.
    lake = parse_lake(LAKE, height=3, width=4, num_agents=2, hole_density=0.5, conflict_density=0.0)
    assert int(lake.num_agents) == 2


# ============================================================================ plans
def test_parse_plan_basic_forms():
    actions, bad = parse_plan("A: U U R D\nB: llsr", 2, 6)
    assert not bad
    np.testing.assert_array_equal(
        actions, [[UP, UP, RIGHT, DOWN, STAY, STAY], [LEFT, LEFT, STAY, RIGHT, STAY, STAY]]
    )
    assert actions.dtype == np.int32
    # lower-case agent letter, spaces before the colon, blank lines, missing agent B
    actions, bad = parse_plan("\n  a : r d\n\n", 2, 3)
    assert not bad
    np.testing.assert_array_equal(actions, [[RIGHT, DOWN, STAY], [STAY, STAY, STAY]])


def test_parse_plan_horizon_cut_is_not_malformed():
    actions, bad = parse_plan("A: RRRRRRRR", 1, 3)
    assert not bad and actions.tolist() == [[RIGHT] * 3]


@pytest.mark.parametrize(
    "text, expected, reason",
    [
        ("Here is the plan:\nA: R", [[RIGHT, STAY], [STAY, STAY]], "stray text"),
        ("A: R\nC: D", [[RIGHT, STAY], [STAY, STAY]], "'C' not in play"),
        ("A: R\nA: D D\nB: U", [[RIGHT, STAY], [UP, STAY]], "'A' repeated"),
        ("A: R, D\nB: U", [[RIGHT, DOWN], [UP, STAY]], "off-format step text"),
        ("A: R X D", [[RIGHT, DOWN], [STAY, STAY]], "'X'"),
        ("A: UP\nB: D (done)", [[STAY, STAY], [DOWN, STAY]], "'UP'"),
        ("```\nA: R\n```", [[RIGHT, STAY], [STAY, STAY]], "stray text '```'"),
    ],
)
def test_parse_plan_malformed_keeps_readable_lines(text, expected, reason):
    result = parse_plan_detailed(text, 2, 2)
    assert result.malformed
    np.testing.assert_array_equal(result.actions, expected)
    assert any(reason in r for r in result.reasons), result.reasons
    actions, bad = parse_plan(text, 2, 2)
    assert bad and np.array_equal(actions, result.actions)


def test_parse_plan_non_text_inputs():
    for junk in (None, 3, ["A: R"]):
        actions, bad = parse_plan(junk, 2, 3)
        assert bad and actions.shape == (2, 3) and not actions.any()
    actions, bad = parse_plan(b"A: R", 1, 2)
    assert not bad and actions.tolist() == [[RIGHT, STAY]]
    actions, bad = parse_plan(b"A: R\xff", 1, 2)
    assert bad and actions.tolist() == [[RIGHT, STAY]]


@settings(max_examples=300, deadline=None)
@given(st.text(), st.integers(0, 26), st.integers(0, 12))
def test_parse_plan_never_raises(text, num_agents, horizon):
    result = parse_plan_detailed(text, num_agents, horizon)
    assert result.actions.shape == (num_agents, horizon) and result.actions.dtype == np.int32
    assert ((result.actions >= 0) & (result.actions <= 4)).all()
    assert result.malformed == bool(result.reasons)


plan_alphabet = st.sampled_from(list("ABCDEabcdeSUDLRsudlr: \n\t,.#xO"))


@settings(max_examples=300, deadline=None)
@given(st.text(plan_alphabet, max_size=80), st.integers(1, 4), st.integers(1, 8))
def test_parse_plan_near_format_never_raises(text, num_agents, horizon):
    actions, bad = parse_plan(text, num_agents, horizon)
    assert actions.shape == (num_agents, horizon)
    if not text.strip():
        assert not bad and not actions.any()


plan_lines = st.lists(
    st.tuples(
        st.integers(0, 5),  # agent index (may exceed num_agents)
        st.lists(st.integers(0, 4), max_size=10),  # steps
        st.booleans(),  # lower-case letters
        st.sampled_from(["", " ", "  ", "\t"]),  # separator between steps
    ),
    max_size=8,
)


@settings(max_examples=200, deadline=None)
@given(plan_lines, st.integers(1, 4), st.integers(0, 8))
def test_parse_plan_first_line_of_each_agent_wins(lines, num_agents, horizon):
    text = "\n".join(
        f"{chr(ord('A') + i)}: " + sep.join(("sudlr" if lower else "SUDLR")[a] for a in steps)
        for i, steps, lower, sep in lines
    )
    expected = np.zeros((num_agents, horizon), dtype=np.int32)
    seen, off_format = set(), False
    for i, steps, _, _ in lines:
        if i >= num_agents or i in seen:
            off_format = True
            continue
        seen.add(i)
        k = min(len(steps), horizon)
        expected[i, :k] = steps[:k]
    actions, bad = parse_plan(text, num_agents, horizon)
    np.testing.assert_array_equal(actions, expected)
    assert bad == off_format


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 5).flatmap(lambda n: st.integers(0, 9).flatmap(
    lambda t: st.lists(st.lists(st.integers(0, 4), min_size=t, max_size=t), min_size=n, max_size=n).map(
        lambda rows: np.asarray(rows, dtype=np.int32).reshape(n, t)))))
def test_format_parse_round_trip(actions):
    n, horizon = actions.shape
    text = format_plan(actions)
    back, bad = parse_plan(text, n, horizon)
    assert not bad
    np.testing.assert_array_equal(back, actions)
    assert not text.endswith("\n")


def test_format_plan_canonical_text():
    actions = np.asarray([[UP, UP, RIGHT, DOWN, STAY], [STAY] * 5, [STAY, LEFT, STAY, STAY, STAY]])
    assert format_plan(actions) == "A: U U R D\nB:\nC: S L"
    assert format_plan(actions, num_agents=1) == "A: U U R D"
    with pytest.raises(ValueError, match=r"actions must be in \[0, 4\]"):
        format_plan(np.asarray([[5]]))


def test_batched_padded_plans():
    texts = ["A: R\nB: D D", "garbage", "A: L"]
    actions, malformed = parse_plan_batch(texts, np.asarray([2, 3, 1]), max_agents=4, horizon=3)
    assert actions.shape == (3, 4, 3) and actions.dtype == np.int32
    assert malformed.tolist() == [False, True, False]
    np.testing.assert_array_equal(actions[0, :2], [[RIGHT, STAY, STAY], [DOWN, DOWN, STAY]])
    assert not actions[0, 2:].any() and not actions[1].any()
    assert actions[2, 0].tolist() == [LEFT, STAY, STAY]
    padded = pad_plan_agents(np.asarray([[UP, DOWN]]), 3)
    assert padded.tolist() == [[UP, DOWN], [STAY, STAY], [STAY, STAY]]
