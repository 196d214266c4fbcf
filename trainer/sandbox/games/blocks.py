"""Falling blocks (Tetris-like, written here): pages/blocks.html and its reference player.

The reference player looks at every rotation x column of the current piece dropped straight down
from where it is now, scores each resulting board by aggregate height, lines cleared, holes and
bumpiness (the weights of the well-known hand-tuned linear evaluation), and presses one key a step
toward the best placement: rotate first, then move sideways, then a hard drop once aligned.
"""
from __future__ import annotations

import random

from agent.schema import Action
from trainer.sandbox.games.spec import GameSpec, key

# weights of the linear board evaluation (height, lines, holes, bumpiness)
W_HEIGHT, W_LINES, W_HOLES, W_BUMPY = -0.510066, 0.760666, -0.35663, -0.184483


def _fits(board: list[list[int]], cells, x: int, y: int) -> bool:
    rows, cols = len(board), len(board[0])
    for cx, cy in cells:
        bx, by = x + cx, y + cy
        if bx < 0 or bx >= cols or by >= rows:
            return False
        if by >= 0 and board[by][bx]:
            return False
    return True


def _evaluate(board: list[list[int]], cells, x: int, y: int) -> float:
    """The score of the board after the piece (cells at x, y) locks there."""
    rows, cols = len(board), len(board[0])
    filled = {(x + cx, y + cy) for cx, cy in cells}
    heights = [0] * cols
    holes = 0
    full = 0
    for r in range(rows):
        row_full = True
        for c in range(cols):
            if board[r][c] or (c, r) in filled:
                if heights[c] == 0:
                    heights[c] = rows - r
            else:
                row_full = False
                if heights[c]:
                    holes += 1
        full += row_full
    # a cleared line lowers every column by one; holes below it stay holes (close enough to rank placements)
    heights = [max(0, h - full) for h in heights]
    bumpy = sum(abs(heights[i] - heights[i + 1]) for i in range(cols - 1))
    return W_HEIGHT * sum(heights) + W_LINES * full + W_HOLES * holes + W_BUMPY * bumpy


def _rotated(board, shapes, rot: int, x: int, y: int, turns: int) -> tuple[int, int] | None:
    """Where `turns` clockwise rotations leave the piece (the page's kicks: 0, -1, +1, -2, +2), or None."""
    for _ in range(turns):
        r = (rot + 1) % 4
        for kick in (0, -1, 1, -2, 2):
            if _fits(board, shapes[r], x + kick, y):
                rot, x = r, x + kick
                break
        else:
            return None
    return rot, x


def best_placement(state: dict) -> tuple[int, int] | None:
    """(rotation, x) of the best placement of the current piece reachable from where it is (rotate, then
    slide at its current row, then drop), or None when there is no piece."""
    piece = state.get("piece")
    if not piece or state.get("over"):
        return None
    board, shapes, y0 = state["board"], piece["shapes"], piece["y"]
    best, best_score = None, float("-inf")
    seen = set()
    for turns in range(4):
        at = _rotated(board, shapes, piece["rot"], piece["x"], y0, turns)
        if at is None:
            break
        rot, x0 = at
        cells = shapes[rot]
        left = min(c[0] for c in cells)
        footprint_cells = frozenset((cx - left, cy) for cx, cy in cells)
        xs = [x0]  # the columns it can slide to at its current row
        x = x0 - 1
        while _fits(board, cells, x, y0):
            xs.append(x)
            x -= 1
        x = x0 + 1
        while _fits(board, cells, x, y0):
            xs.append(x)
            x += 1
        for x in xs:
            y = y0
            while _fits(board, cells, x, y + 1):
                y += 1
            # identical footprints (O's rotations, S/Z/I pairs) only once, the fewest rotations first
            footprint = (footprint_cells, x + left, y)
            if footprint in seen:
                continue
            seen.add(footprint)
            s = _evaluate(board, cells, x, y)
            if s > best_score:
                best, best_score = (rot, x), s
    return best


def reference(state: dict, rng: random.Random) -> Action:
    target = best_placement(state)
    if target is None:
        return key("space")
    rot, x = target
    piece = state["piece"]
    if piece["rot"] != rot:
        return key("up")
    if piece["x"] < x:
        return key("right")
    if piece["x"] > x:
        return key("left")
    return key("space")


GAME = GameSpec(
    name="blocks",
    title="Blocks",
    kind="falling blocks",
    instruction=(
        "Play falling blocks: pieces fall on their own. Press left/right to move the piece, up to rotate it, "
        "down to drop it one row and space to drop it to the bottom. Fill whole rows to clear them and score; "
        "the game ends when the stack reaches the top."
    ),
    reference=reference,
    reads="score (10/30/50/80 for 1/2/3/4 lines cleared at once), lines, level (1 + lines // 10), over (a new piece cannot spawn)",
    keys=("left", "right", "up", "down", "space"),
    clicks=False,
    step_ms=200,
)
