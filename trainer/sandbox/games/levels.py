"""Levels (Crates): a push-box puzzle whose levels unlock one after another. Arrow keys walk, walking
into a crate pushes it when the cell behind is free; all crates on targets solves the level (100
points) and opens the next, bigger one; each crate newly placed scores 10 (never taken back); R
restarts the level. Levels are generated from the seed backwards from the solved position, so each
one is solvable.

The reference player solves the level from getState()'s grid with a weighted A* over pushes (the
pushes each crate needs as the estimate, dead-end cells pruned) and caches the plan, so only the
first step of a level searches; it then presses one key per step.
"""
from __future__ import annotations

import heapq
import random
from collections import deque

from agent.schema import Action
from trainer.sandbox.games import spec

DIRS = {"up": (0, -1), "down": (0, 1), "left": (-1, 0), "right": (1, 0)}

Cell = tuple[int, int]
WEIGHT = 2  # the estimate's weight in the search: above 1 trades the fewest pushes for speed


def _parse(grid: list[str]) -> tuple[set[Cell], set[Cell], frozenset[Cell], Cell]:
    walls, goals, boxes, player = set(), set(), set(), None
    for y, row in enumerate(grid):
        for x, ch in enumerate(row):
            if ch == "#":
                walls.add((x, y))
            if ch in ".*+":
                goals.add((x, y))
            if ch in "$*":
                boxes.add((x, y))
            if ch in "@+":
                player = (x, y)
    if player is None:
        raise ValueError("levels: the grid has no player ('@' or '+')")
    return walls, goals, frozenset(boxes), player


def _push_distances(walls: set[Cell], goals: set[Cell]) -> dict[Cell, int]:
    """For each cell from which a lone crate can still reach a target: the fewest pushes to the nearest
    one (cells missing are dead ends: a crate there can never be placed)."""
    dist, todo = {c: 0 for c in goals}, deque(goals)
    while todo:
        c = todo.popleft()
        for dx, dy in DIRS.values():  # a crate at c - d pushed along d, the player standing at c - 2d
            q, stand = (c[0] - dx, c[1] - dy), (c[0] - 2 * dx, c[1] - 2 * dy)
            if q not in walls and stand not in walls and q not in dist:
                dist[q] = dist[c] + 1
                todo.append(q)
    return dist


def _walk(walls: set[Cell], boxes: frozenset[Cell], start: Cell) -> dict[Cell, tuple[Cell, str] | None]:
    """BFS over free cells from start: each reachable cell -> (previous cell, key), start -> None."""
    prev: dict[Cell, tuple[Cell, str] | None] = {start: None}
    todo = deque([start])
    while todo:
        c = todo.popleft()
        for name, (dx, dy) in DIRS.items():
            n = (c[0] + dx, c[1] + dy)
            if n not in prev and n not in walls and n not in boxes:
                prev[n] = (c, name)
                todo.append(n)
    return prev


def _reach(nbrs: dict[Cell, list[Cell]], boxes: frozenset[Cell], start: Cell) -> set[Cell]:
    """The free cells the player can walk to from start (the search's hot loop: no paths kept)."""
    seen, todo = {start}, [start]
    while todo:
        for n in nbrs[todo.pop()]:
            if n not in seen and n not in boxes:
                seen.add(n)
                todo.append(n)
    return seen


def _path(prev: dict, goal: Cell) -> list[str]:
    keys = []
    while prev[goal] is not None:
        goal, name = prev[goal]
        keys.append(name)
    return keys[::-1]


def solve(grid: list[str], max_nodes: int = 100_000) -> list[str] | None:
    """Key presses that solve the level drawn in grid (getState()['grid']), or None if none was found.

    Weighted A* over pushes: a node is the crates plus the area the player can walk to (so walks
    between pushes are not searched), the estimate is the pushes each crate needs to its nearest
    target, and crates are never pushed onto dead-end cells. Not always the fewest keys, but fast.
    """
    walls, goals, boxes, player = _parse(grid)
    need = _push_distances(walls, goals)

    floor = {(x, y) for y, row in enumerate(grid) for x in range(len(row)) if (x, y) not in walls}
    nbrs = {c: [n for dx, dy in DIRS.values() if (n := (c[0] + dx, c[1] + dy)) in floor] for c in floor}
    def estimate(bs: frozenset[Cell]) -> int:
        return sum(need[b] for b in bs)

    if any(b not in need for b in boxes):
        return None
    came: dict = {}  # node (crates, the walkable area's least cell) -> (parent node, crate pushed, direction)
    heap = [(WEIGHT * estimate(boxes), 0, 0, boxes, player, None)]
    tie = 0
    while heap and len(came) <= max_nodes:
        _, pushes, _, bs, pl, parent = heapq.heappop(heap)
        reach = _reach(nbrs, bs, pl)
        node = (bs, min(reach))
        if node in came:  # reached before with as few or fewer pushes
            continue
        came[node] = parent
        if bs <= goals:
            return _keys_for(walls, boxes, player, _pushes_to(came, node))
        for bx, by in bs:
            for name, (dx, dy) in DIRS.items():
                dest = (bx + dx, by + dy)
                if (bx - dx, by - dy) not in reach or dest in walls or dest in bs or dest not in need:
                    continue
                nbs = (bs - {(bx, by)}) | {dest}
                if _frozen(walls, goals, nbs, dest):
                    continue
                tie += 1
                heapq.heappush(heap, (pushes + 1 + WEIGHT * estimate(nbs), pushes + 1, tie, nbs, (bx, by),
                                      (node, (bx, by), name)))
    return None


def _frozen(walls: set[Cell], goals: set[Cell], boxes: frozenset[Cell], moved: Cell) -> bool:
    """Whether the crate just pushed to `moved` closes a 2x2 block of walls and crates with a crate off
    its target in it: none of them can ever move again."""
    x, y = moved
    for ox in (-1, 0):
        for oy in (-1, 0):
            square = [(x + ox + i, y + oy + j) for i in (0, 1) for j in (0, 1)]
            if all(c in walls or c in boxes for c in square) and any(c in boxes and c not in goals for c in square):
                return True
    return False


def _pushes_to(came: dict, node) -> list[tuple[Cell, str]]:
    out = []
    while came[node] is not None:
        node, box, name = came[node]
        out.append((box, name))
    return out[::-1]


def _keys_for(walls: set[Cell], boxes: frozenset[Cell], player: Cell, pushes: list[tuple[Cell, str]]) -> list[str]:
    """The key presses that walk to each push in turn and make it."""
    keys: list[str] = []
    for (bx, by), name in pushes:
        dx, dy = DIRS[name]
        keys += _path(_walk(walls, boxes, player), (bx - dx, by - dy)) + [name]
        boxes = (boxes - {(bx, by)}) | {(bx + dx, by + dy)}
        player = (bx, by)
    return keys


class CratesPlayer:
    """The reference player: plans a level once and replays the plan one key per step.

    The plan is cached by the grid it expects before each key (so any position already planned for,
    in any episode, costs a dict lookup); a position off every plan is solved afresh.
    """

    MAX_CACHED = 50_000

    def __init__(self) -> None:
        self._next: dict[tuple[str, ...], str] = {}

    def __call__(self, state: dict, rng: random.Random) -> Action:
        grid = tuple(state["grid"])
        if grid not in self._next:
            keys = solve(list(grid))
            if not keys:
                return spec.key("r")  # stuck (a crate in a dead end): restart the level
            if len(self._next) > self.MAX_CACHED:
                self._next.clear()
            for key_name, g in zip(keys, _replay(list(grid), keys), strict=True):
                self._next[tuple(g)] = key_name
        return spec.key(self._next[grid])


def _replay(grid: list[str], keys: list[str]) -> list[list[str]]:
    """The grid before each key of a solution (the crates moved as the page moves them)."""
    walls, goals, boxes, player = _parse(grid)
    boxes = set(boxes)
    out = []
    for name in keys:
        out.append(_draw(grid, walls, goals, boxes, player))
        dx, dy = DIRS[name]
        player = (player[0] + dx, player[1] + dy)
        if player in boxes:
            boxes.remove(player)
            boxes.add((player[0] + dx, player[1] + dy))
    return out


def _draw(grid: list[str], walls: set, goals: set, boxes: set, player: Cell) -> list[str]:
    rows = []
    for y, row in enumerate(grid):
        line = []
        for x in range(len(row)):
            c = (x, y)
            if c in walls:
                line.append("#")
            elif c in boxes:
                line.append("*" if c in goals else "$")
            elif c == player:
                line.append("+" if c in goals else "@")
            else:
                line.append("." if c in goals else " ")
        rows.append("".join(line))
    return rows


GAME = spec.GameSpec(
    name="levels",
    title="Crates (levels)",
    kind="multi-level puzzle: push boxes",
    instruction=("Play Crates: move with the arrow keys; walking into a crate pushes it if the cell behind it "
                 "is free. Push every crate onto a yellow ring to solve the level and unlock the next one. "
                 "Press r to restart a level if a crate gets stuck."),
    reference=CratesPlayer(),
    reads="score (100 a level solved, 10 a crate newly placed), level (unlocked level), over (all 10 solved)",
    keys=("up", "down", "left", "right", "r"),
    step_ms=200,
)
