"""Merge (2048-like): the arrow keys slide all tiles; two equal tiles that meet merge and score their
sum; a new 2 or 4 appears after every move that changes the board; no such move left ends it.

The reference player keeps its big tiles in the bottom-left corner: each move that changes the
board is scored by what it merges now plus a corner-gradient and free-cell heuristic of the board
it leaves, looking one move further ahead (the best follow-up, new tiles not guessed)."""
from __future__ import annotations

import random

from agent.schema import Action
from trainer.sandbox.games.spec import GameSpec, key

N = 4
MOVES = ("down", "left", "right", "up")  # ties go to the moves that keep the corner
# bottom-left corner, snake-shaped: the biggest tile in the corner, the next ones along the bottom row
WEIGHTS = ((2 ** 0, 2 ** 1, 2 ** 2, 2 ** 3),
           (2 ** 7, 2 ** 6, 2 ** 5, 2 ** 4),
           (2 ** 8, 2 ** 9, 2 ** 10, 2 ** 11),
           (2 ** 15, 2 ** 14, 2 ** 13, 2 ** 12))


def _line(direction: str, i: int) -> list[tuple[int, int]]:
    """Line i's cells from the edge the tiles slide toward (as the page's line())."""
    if direction == "left":
        return [(i, k) for k in range(N)]
    if direction == "right":
        return [(i, N - 1 - k) for k in range(N)]
    if direction == "up":
        return [(k, i) for k in range(N)]
    return [(N - 1 - k, i) for k in range(N)]


def slide(board: list[list[int]], direction: str) -> tuple[list[list[int]], int, bool]:
    """(the board after sliding, the score it gains, whether anything moved): the page's rule."""
    out = [row[:] for row in board]
    gained, changed = 0, False
    for i in range(N):
        cells = _line(direction, i)
        tiles = [board[r][c] for r, c in cells if board[r][c]]
        values, j = [], 0
        while j < len(tiles):
            if j + 1 < len(tiles) and tiles[j + 1] == tiles[j]:
                values.append(2 * tiles[j])
                gained += 2 * tiles[j]
                j += 2
            else:
                values.append(tiles[j])
                j += 1
        values += [0] * (N - len(values))
        for (r, c), v in zip(cells, values, strict=True):
            changed = changed or out[r][c] != v
            out[r][c] = v
    return out, gained, changed


def _value(board: list[list[int]]) -> float:
    free = sum(v == 0 for row in board for v in row)
    grad = sum(WEIGHTS[r][c] * board[r][c] for r in range(N) for c in range(N))
    return grad / 2 ** 12 + 8.0 * free


def reference(state: dict, rng: random.Random) -> Action:
    board = [list(map(int, row)) for row in state["board"]]
    best, best_score = None, float("-inf")
    for m in MOVES:
        after, gained, changed = slide(board, m)
        if not changed:
            continue
        follow = 0.0
        for m2 in MOVES:
            after2, gained2, changed2 = slide(after, m2)
            if changed2:
                follow = max(follow, gained2 + _value(after2))
        score = 2 * gained + _value(after) + 0.5 * follow + 1e-6 * rng.random()
        if m == "up":
            score -= 64.0  # up pulls the corner tile out: only when nothing else moves
        if score > best_score:
            best, best_score = m, score
    return key(best or "down")


GAME = GameSpec(
    name="merge",
    title="Merge",
    kind="tile merging (2048-like)",
    instruction="Play Merge: press the arrow keys to slide all tiles; two equal tiles that meet merge into one "
                "and score its value. Get the highest score you can before the board fills up.",
    reference=reference,
    reads="score (the merged tiles' values), over (no move changes the board), the 4x4 board",
    keys=("up", "down", "left", "right"),
    clicks=False,
    step_ms=200,
)
