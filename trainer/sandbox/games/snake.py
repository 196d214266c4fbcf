"""Snake: the snake moves a cell every 200 ms by itself (one cell per step); the arrow keys turn it;
food scores a point and grows it; a wall or its own body ends the game.

The reference player: the shortest path to the food (BFS around the body), taken only when the
snake could still reach its own tail after eating (so it does not wall itself in); otherwise the
move that keeps the most cells reachable."""
from __future__ import annotations

import random
from collections import deque

from agent.schema import Action
from trainer.sandbox.games.spec import GameSpec, key

DIRS = {"up": (0, -1), "down": (0, 1), "left": (-1, 0), "right": (1, 0)}
OPPOSITE = {"up": "down", "down": "up", "left": "right", "right": "left"}


def _bfs(start, goal, blocked, cols, rows) -> list[str] | None:
    """Directions of a shortest path from start to goal through cells not in `blocked`."""
    prev = {start: None}
    todo = deque([start])
    while todo:
        cell = todo.popleft()
        if cell == goal:
            path = []
            while prev[cell] is not None:
                cell, d = prev[cell]
                path.append(d)
            return path[::-1]
        for d, (dx, dy) in DIRS.items():
            nxt = (cell[0] + dx, cell[1] + dy)
            if 0 <= nxt[0] < cols and 0 <= nxt[1] < rows and nxt not in blocked and nxt not in prev:
                prev[nxt] = (cell, d)
                todo.append(nxt)
    return None


def _reach(start, blocked, cols, rows) -> int:
    """How many cells are reachable from start."""
    seen, todo = {start}, [start]
    while todo:
        x, y = todo.pop()
        for dx, dy in DIRS.values():
            n = (x + dx, y + dy)
            if 0 <= n[0] < cols and 0 <= n[1] < rows and n not in blocked and n not in seen:
                seen.add(n)
                todo.append(n)
    return len(seen)


def _follow(body: list, path: list[str], food) -> list:
    """The body after moving along `path` (growing by one when the last move eats)."""
    body = list(body)
    for i, d in enumerate(path):
        dx, dy = DIRS[d]
        head = (body[0][0] + dx, body[0][1] + dy)
        eats = i == len(path) - 1 and head == food
        body = [head] + (body if eats else body[:-1])
    return body


def reference(state: dict, rng: random.Random) -> Action:
    cols, rows = int(state["cols"]), int(state["rows"])
    body = [tuple(c) for c in state["snake"]]
    food = tuple(state["food"]) if state.get("food") else None
    head, heading = body[0], state["dir"]
    if food is not None:
        path = _bfs(head, food, set(body[:-1]), cols, rows)
        if path:
            after = _follow(body, path, food)
            if _bfs(after[0], after[-1], set(after[:-1]), cols, rows) is not None or len(after) >= cols * rows:
                return key(path[0])
    # no safe way to the food: the move that leaves the most room, the tail's way first
    best, best_room = heading, -1
    for d, (dx, dy) in DIRS.items():
        if d == OPPOSITE[heading]:
            continue
        nxt = (head[0] + dx, head[1] + dy)
        if not (0 <= nxt[0] < cols and 0 <= nxt[1] < rows) or nxt in set(body[:-1]):
            continue
        moved = [nxt] + body[:-1]
        room = _reach(nxt, set(moved[1:-1]), cols, rows)
        tail_ok = _bfs(nxt, moved[-1], set(moved[1:-1]), cols, rows) is not None
        score = room + (1000 if tail_ok else 0) + rng.random()
        if score > best_room:
            best, best_room = d, score
    return key(best)


GAME = GameSpec(
    name="snake",
    title="Snake",
    kind="real time: steering",
    instruction="Play Snake: steer the snake with the arrow keys to eat the red food; each food scores a point "
                "and makes the snake longer. Do not run into the walls or the snake's own body.",
    reference=reference,
    reads="score (food eaten), over (hit a wall or itself), the snake's cells, its heading and the food",
    keys=("up", "down", "left", "right"),
    clicks=False,
    step_ms=200,
)
