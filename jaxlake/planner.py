"""Reference planner: collision-free joint plans under the exact rules of docs/rules.md#one-step (slip 0).

Host-side (numpy / Python) prioritized planning with space-time A*. It feeds supervised warm
starts, the "planner length" in metrics and the share of generated lakes a planner can solve.

A joint plan is *collision-free* when :func:`jaxlake.env.step` cancels none of its moves,
so every agent follows its planned path exactly. With paths ``p_i(0..T_i)`` (``T_i`` = the
step at which agent ``i`` reaches its goal and arrives) that means, for every pair
``i != j`` and step ``t -> t + 1``:

* no vertex conflict: ``p_i(t+1) != p_j(t+1)`` whenever both are on the board at ``t + 1``.
  This also forbids moving into the cell of an agent that waits there (rule 3b), while
  *following* into a cell vacated in the same step stays allowed;
* no swap: not ``p_i(t) = p_j(t+1)`` and ``p_i(t+1) = p_j(t)``;
* on the board: agent ``i`` at ``0 <= t <= T_i``; after arriving, with ``on_goal =
  "vanish"`` it is gone (its goal cell is free from ``T_i + 1``), with ``"stay"`` it occupies
  its goal for every ``t >= T_i``.

Paths use frozen region cells only (holes are fatal, walls are never bumped on purpose), an
agent never waits on or passes through its own goal (reaching it is arriving), and every
``T_i <= max_steps`` (arriving at the last step beats the timeout: docs/rules.md#time-outs).

The planner is complete for no class of instances (prioritized planning is not), and its
sum of costs is an upper bound on the optimum. It never raises on a lake it cannot solve
and never runs unbounded: the search has a node-expansion budget and an optional wall-clock
limit; it then returns ``found=False``.
"""

from __future__ import annotations

import dataclasses
import heapq
import time
from collections import deque
from typing import Any, Optional, Sequence

import jax
import numpy as np

from jaxlake.types import ACTION_DELTAS, ON_GOAL_STAY, STAY, Lake

_INF = np.iinfo(np.int64).max // 4


# ============================================================================ results
@dataclasses.dataclass(frozen=True)
class Solution:
    """A joint plan for one lake.

    Attributes:
      actions: ``[max_agents, T]`` int32; ``T`` = the horizon (default ``lake.max_steps``).
        Rows of absent slots and steps after an agent arrives are STAY. All STAY when not
        found.
      found: a collision-free plan was found; executed with slip 0 every agent arrives.
      sum_of_costs: sum over agents of their arrival step ``T_i`` (-1 when not found).
      makespan: max ``T_i`` (-1 when not found).
      path_len: ``[max_agents]`` int32 arrival step ``T_i`` per agent (waits included);
        -1 for absent slots and when not found.
      paths: per agent in play, ``[T_i + 1, 2]`` int32 cells from start to goal (empty
        tuple when not found).
      expansions: A* node expansions used, all orderings together.
      orderings: priority orderings tried.
      reason: why no plan was found ("" when found).
    """

    actions: np.ndarray
    found: bool
    sum_of_costs: int
    makespan: int
    path_len: np.ndarray
    paths: tuple[np.ndarray, ...]
    expansions: int
    orderings: int
    reason: str = ""


@dataclasses.dataclass(frozen=True)
class BatchSolution:
    """:func:`solve_batch` results stacked over ``B`` lakes.

    Attributes:
      actions: ``[B, max_agents, T]`` int32 (``T`` common to the batch).
      found: ``[B]`` bool.
      sum_of_costs / makespan: ``[B]`` int32 (-1 when not found).
      path_len: ``[B, max_agents]`` int32.
      solutions: the per-lake :class:`Solution` objects.
    """

    actions: np.ndarray
    found: np.ndarray
    sum_of_costs: np.ndarray
    makespan: np.ndarray
    path_len: np.ndarray
    solutions: tuple[Solution, ...]


# ============================================================================ search
class _Budget:
    """Shared node-expansion and wall-clock budget."""

    def __init__(self, max_expansions: int, max_time: Optional[float]):
        self.left = int(max_expansions)
        self.used = 0
        self.deadline = None if max_time is None else time.monotonic() + float(max_time)

    def spend(self) -> bool:
        """Spend one expansion; False when the budget is exhausted."""
        if self.left <= 0:
            return False
        self.left -= 1
        self.used += 1
        if self.deadline is not None and (self.used & 255) == 0 and time.monotonic() > self.deadline:
            self.left = 0
            return False
        return True


class Reservations:
    """Space-time cells and moves taken by the agents planned so far.

    Cells are flat indices ``r * W + c``.
    """

    def __init__(self) -> None:
        self.vertex: set[tuple[int, int]] = set()  # (t, cell)
        self.edge: set[tuple[int, int, int]] = set()  # (t, from, to): move between t and t+1
        self.forever: dict[int, int] = {}  # cell -> t from which it is occupied for good
        self.last: dict[int, int] = {}  # cell -> last t it is occupied (_INF if forever)

    def add(self, path: Sequence[int], stay: bool) -> None:
        for t, cell in enumerate(path):
            self.vertex.add((t, cell))
            if self.last.get(cell, -1) < t:
                self.last[cell] = t
        for t in range(len(path) - 1):
            self.edge.add((t, path[t], path[t + 1]))
        if stay:
            goal = path[-1]
            self.forever[goal] = min(self.forever.get(goal, _INF), len(path) - 1)
            self.last[goal] = _INF

    def cell_free(self, t: int, cell: int) -> bool:
        return (t, cell) not in self.vertex and t < self.forever.get(cell, _INF)

    def move_free(self, t: int, src: int, dst: int) -> bool:
        """No swap: nobody moves ``dst -> src`` between ``t`` and ``t + 1``."""
        return (t, dst, src) not in self.edge


def bfs_distances(frozen: np.ndarray, source: tuple[int, int]) -> np.ndarray:
    """BFS distances from ``source`` over ``frozen`` cells (``[H, W]`` bool, 4-neighbourhood);
    ``[H, W]`` int64, -1 where unreachable (everywhere when ``source`` is not frozen)."""
    h, w = frozen.shape
    dist = np.full((h, w), -1, dtype=np.int64)
    if not frozen[source]:
        return dist
    dist[source] = 0
    queue = deque([source])
    while queue:
        r, c = queue.popleft()
        for dr, dc in ACTION_DELTAS[1:]:
            nr, nc = r + dr, c + dc
            if 0 <= nr < h and 0 <= nc < w and frozen[nr, nc] and dist[nr, nc] < 0:
                dist[nr, nc] = dist[r, c] + 1
                queue.append((nr, nc))
    return dist


def _space_time_astar(
    start: int,
    goal: int,
    neighbours: list[list[int]],
    heuristic: np.ndarray,
    limit: int,
    stay_rule: bool,
    res: Reservations,
    budget: _Budget,
    avoid: frozenset[int] = frozenset(),
) -> Optional[list[int]]:
    """Earliest arrival ``start -> goal`` in (cell, t) avoiding ``res``, at ``t <= limit``.

    Entering ``goal`` is arriving: the path ends there, and it may only end at ``t`` if the
    goal is free then (and, under "stay", at every later step too). Among paths of the
    earliest arrival, one with few steps spent on ``avoid`` cells is preferred (a
    tie-break, not guaranteed minimal): the cells that agents planned later need.
    """
    if not res.cell_free(0, start):
        return None
    counter = 0
    first = int(start in avoid)
    # Heap key: (f = t + h, soft cost, -t): f is fixed per state (cell, t), so the soft
    # cost only orders states of one f; stale entries are skipped when popped.
    open_heap = [(int(heuristic[start]), first, 0, counter, start)]
    parent: dict[tuple[int, int], Optional[tuple[int, int]]] = {(0, start): None}
    soft: dict[tuple[int, int], int] = {(0, start): first}
    closed: set[tuple[int, int]] = set()
    while open_heap:
        _, cost, neg_t, _, cell = heapq.heappop(open_heap)
        t = -neg_t
        if (t, cell) in closed or cost > soft[(t, cell)]:
            continue
        if cell == goal:
            path = []
            node: Optional[tuple[int, int]] = (t, cell)
            while node is not None:
                path.append(node[1])
                node = parent[node]
            return path[::-1]
        closed.add((t, cell))
        if not budget.spend():
            return None
        nt = t + 1
        if nt > limit:
            continue
        for nxt in neighbours[cell]:  # includes `cell` itself (wait)
            key = (nt, nxt)
            h = int(heuristic[nxt])
            if nt + h > limit or key in closed:
                continue
            if not res.cell_free(nt, nxt) or (nxt != cell and not res.move_free(t, cell, nxt)):
                continue
            if nxt == goal and stay_rule and res.last.get(goal, -1) >= nt:
                continue  # an arrival now would block someone who passes later
            ncost = cost + (nxt in avoid)
            if soft.get(key, _INF) <= ncost:
                continue
            soft[key] = ncost
            parent[key] = (t, cell)
            counter += 1
            heapq.heappush(open_heap, (nt + h, ncost, -nt, counter, nxt))
    return None


def lake_arrays(lake: Lake) -> dict[str, Any]:
    """One unbatched lake as host arrays: ``frozen`` (``[H, W]`` region and not a hole),
    ``starts`` / ``goals`` (``[A, 2]``), ``num_agents``, ``max_steps`` and ``stay`` (``on_goal``
    is ``"stay"``). Raises ``ValueError`` on a batched lake."""
    holes = np.asarray(lake.holes, dtype=bool)
    region = np.asarray(lake.region, dtype=bool)
    if holes.ndim != 2 or np.ndim(lake.num_agents) != 0:
        raise ValueError(
            f"solve takes one unbatched lake (holes [H, W]), got holes {holes.shape}; use solve_batch"
        )
    return dict(
        frozen=region & ~holes,
        starts=np.asarray(lake.starts, dtype=np.int64),
        goals=np.asarray(lake.goals, dtype=np.int64),
        num_agents=int(np.asarray(lake.num_agents)),
        max_steps=int(np.asarray(lake.max_steps)),
        stay=int(np.asarray(lake.on_goal)) == ON_GOAL_STAY,
    )


def _not_found(max_agents: int, horizon: int, reason: str, expansions: int = 0, orderings: int = 0) -> Solution:
    return Solution(
        actions=np.full((max_agents, horizon), STAY, dtype=np.int32),
        found=False,
        sum_of_costs=-1,
        makespan=-1,
        path_len=np.full((max_agents,), -1, dtype=np.int32),
        paths=(),
        expansions=expansions,
        orderings=orderings,
        reason=reason,
    )


def _actions_from_path(path: Sequence[int], width: int, horizon: int) -> np.ndarray:
    out = np.full((horizon,), STAY, dtype=np.int32)
    codes = {delta: a for a, delta in enumerate(ACTION_DELTAS)}
    for t in range(len(path) - 1):
        (r0, c0), (r1, c1) = divmod(path[t], width), divmod(path[t + 1], width)
        out[t] = codes[(r1 - r0, c1 - c0)]
    return out


def solve(
    lake: Lake,
    *,
    max_time: Optional[float] = None,
    max_expansions: int = 200_000,
    max_orderings: int = 32,
    horizon: Optional[int] = None,
    seed: int = 0,
) -> Solution:
    """Find a collision-free joint plan for one lake (slip 0); never raises on a hard lake.

    Prioritized planning: agents are planned one after another with space-time A* (BFS
    heuristic, earliest arrival), each avoiding the ones before it and, as a tie-break,
    the start cells (and under "stay" the goal cells) of the agents planned after it.
    First ordering: longest BFS distance first; under "stay", agents whose goal lies on
    fewer other agents' shortest paths come first (an arrived agent blocks its goal for
    good, so such goals should be taken last). After a failure the agent that failed moves
    to the front; then random orderings (``seed``), up to ``max_orderings`` distinct ones.
    The result is deterministic for a given lake and arguments (``max_time`` aside).

    Args:
      lake: one unbatched lake (its ``slip_prob`` is ignored: plans are for slip 0).
      max_time: optional wall-clock limit in seconds for the whole search.
      max_expansions: A* node-expansion budget for the whole search.
      max_orderings: most priority orderings to try.
      horizon: plan length ``T`` (default ``lake.max_steps``); every agent must arrive by
        ``min(horizon, max_steps)``.
      seed: seed of the random orderings.

    Returns:
      :class:`Solution`; ``found=False`` (with ``reason``) when no plan was found.
    """
    a = lake_arrays(lake)
    frozen, n, max_agents = a["frozen"], a["num_agents"], a["starts"].shape[0]
    T = a["max_steps"] if horizon is None else int(horizon)
    if T < 0:
        raise ValueError(f"horizon={T} must be >= 0")
    limit = min(T, a["max_steps"])
    h, w = frozen.shape
    starts = [tuple(int(v) for v in a["starts"][i]) for i in range(n)]
    goals = [tuple(int(v) for v in a["goals"][i]) for i in range(n)]

    def inside(cell: tuple[int, int]) -> bool:
        return 0 <= cell[0] < h and 0 <= cell[1] < w and bool(frozen[cell])

    for i in range(n):
        if not inside(starts[i]) or not inside(goals[i]):
            return _not_found(max_agents, T, f"agent {i}: start or goal is not a frozen region cell")
    if len(set(starts) | set(goals)) != 2 * n:
        return _not_found(max_agents, T, "starts and goals are not pairwise distinct")

    heuristics = []
    for i in range(n):
        dist = bfs_distances(frozen, goals[i])
        d = int(dist[starts[i]])
        if d < 0:
            return _not_found(max_agents, T, f"agent {i}: goal unreachable from start")
        if d > limit:
            return _not_found(max_agents, T, f"agent {i}: distance {d} exceeds the horizon {limit}")
        heuristics.append(np.where(dist < 0, _INF, dist).reshape(-1))

    flat = lambda cell: cell[0] * w + cell[1]  # noqa: E731
    neighbours: list[list[int]] = [[] for _ in range(h * w)]
    for r in range(h):
        for c in range(w):
            if frozen[r, c]:
                for dr, dc in ACTION_DELTAS:  # STAY first: wait in place
                    if inside((r + dr, c + dc)):
                        neighbours[r * w + c].append((r + dr) * w + c + dc)

    budget = _Budget(max_expansions, max_time)
    rng = np.random.default_rng(seed)
    dists = [int(heuristics[i][flat(starts[i])]) for i in range(n)]
    if a["stay"]:
        # An arrived agent blocks its goal for good: agents whose goal lies on others'
        # shortest paths go later (they wait for the others to pass), then longest first.
        on_paths = _goal_on_shortest_paths(frozen, starts, goals, heuristics, dists)
        order = tuple(sorted(range(n), key=lambda i: (on_paths[i], -dists[i], i)))
    else:
        order = tuple(sorted(range(n), key=lambda i: (-dists[i], i)))
    tried: set[tuple[int, ...]] = set()
    reason = "no ordering succeeded"
    while len(tried) < max_orderings and budget.left > 0:
        tried.add(order)
        res = Reservations()
        paths: dict[int, list[int]] = {}
        failed = None
        for k, i in enumerate(order):
            later = order[k + 1 :]
            avoid = frozenset(flat(starts[j]) for j in later)
            if a["stay"]:
                avoid |= frozenset(flat(goals[j]) for j in later)
            path = _space_time_astar(
                flat(starts[i]), flat(goals[i]), neighbours, heuristics[i], limit, a["stay"], res, budget, avoid
            )
            if path is None:
                failed = i
                break
            paths[i] = path
            res.add(path, a["stay"])
        if failed is None:
            return _assemble(paths, n, max_agents, w, T, budget.used, len(tried))
        if budget.left <= 0:
            reason = "search budget exhausted (max_expansions / max_time)"
            break
        order = _next_order(order, failed, tried, rng, n)
        if order is None:
            break
    return _not_found(max_agents, T, reason, budget.used, len(tried))


def _goal_on_shortest_paths(frozen, starts, goals, heuristics, dists) -> list[int]:
    """For each agent ``j``: how many other agents have ``goal_j`` on a shortest path."""
    n, w = len(starts), frozen.shape[1]
    counts = [0] * n
    for i in range(n):
        from_start = bfs_distances(frozen, starts[i]).reshape(-1)
        on_sp = (from_start >= 0) & (from_start + heuristics[i] == dists[i])
        for j in range(n):
            if j != i and on_sp[goals[j][0] * w + goals[j][1]]:
                counts[j] += 1
    return counts


def _next_order(order, failed, tried, rng, n) -> Optional[tuple[int, ...]]:
    promoted = (failed,) + tuple(i for i in order if i != failed)
    if promoted not in tried:
        return promoted
    for _ in range(64):
        candidate = tuple(int(i) for i in rng.permutation(n))
        if candidate not in tried:
            return candidate
    return None


def _assemble(paths, n, max_agents, width, horizon, expansions, orderings) -> Solution:
    actions = np.full((max_agents, horizon), STAY, dtype=np.int32)
    path_len = np.full((max_agents,), -1, dtype=np.int32)
    cells = []
    for i in range(n):
        actions[i] = _actions_from_path(paths[i], width, horizon)
        path_len[i] = len(paths[i]) - 1
        cells.append(np.asarray([divmod(c, width) for c in paths[i]], dtype=np.int32))
    lengths = path_len[:n]
    return Solution(
        actions=actions,
        found=True,
        sum_of_costs=int(lengths.sum()),
        makespan=int(lengths.max()) if n else 0,
        path_len=path_len,
        paths=tuple(cells),
        expansions=expansions,
        orderings=orderings,
    )


# ============================================================================ batches
def _unbatch(lakes: Lake) -> list[Lake]:
    host = jax.tree_util.tree_map(np.asarray, lakes)
    if np.ndim(host.num_agents) != 1:
        raise ValueError(f"expected a batched lake (num_agents [B]), got num_agents shape {np.shape(host.num_agents)}")
    size = host.num_agents.shape[0]
    return [jax.tree_util.tree_map(lambda x, b=b: x[b], host) for b in range(size)]


def solve_batch(lakes: Lake, *, horizon: Optional[int] = None, **kwargs: Any) -> BatchSolution:
    """:func:`solve` on every lake of a batched ``Lake`` (leading axis ``B``; a host loop).

    ``horizon`` defaults to the batch's largest ``max_steps`` so that plans stack to
    ``[B, max_agents, T]``. Other keywords go to :func:`solve`; each lake gets its own
    budget.
    """
    singles = _unbatch(lakes)
    T = int(np.max(np.asarray(lakes.max_steps))) if horizon is None else int(horizon)
    sols = tuple(solve(lake, horizon=T, **kwargs) for lake in singles)
    max_agents = lakes.starts.shape[-2]
    return BatchSolution(
        actions=np.stack([s.actions for s in sols]) if sols else np.zeros((0, max_agents, T), np.int32),
        found=np.asarray([s.found for s in sols], dtype=bool),
        sum_of_costs=np.asarray([s.sum_of_costs for s in sols], dtype=np.int32),
        makespan=np.asarray([s.makespan for s in sols], dtype=np.int32),
        path_len=np.stack([s.path_len for s in sols]) if sols else np.zeros((0, max_agents), np.int32),
        solutions=sols,
    )


def solvable_share(lakes: Lake, **kwargs: Any) -> float:
    """Share of the batch's lakes for which :func:`solve` finds a plan (keywords as there)."""
    found = solve_batch(lakes, **kwargs).found
    return float(found.mean()) if found.size else 0.0
