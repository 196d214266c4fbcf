"""Lights out (written here): pages/lights.html and its reference player.

The reference player solves the board over GF(2): a press toggles its cell and its four neighbours,
so the presses p that clear lights b solve A p = b with A the n*n x n*n toggle matrix. Gaussian
elimination on bitmask rows gives one solution and the null space (4x4 and 5x5 boards have one);
the player takes the solution with the fewest presses and clicks its first press in reading order.
Re-solving after each press gives the same solution less that press, so it never wanders.
"""
from __future__ import annotations

import random
from functools import lru_cache

from agent.schema import Action
from trainer.sandbox.games.spec import GameSpec, click


@lru_cache(maxsize=16)
def _reduced(n: int) -> tuple[list[tuple[int, int]], list[int]]:
    """Row-reduce the toggle matrix of an n x n board once: ([(pivot column, row mask, combination)...]
    as pairs of (row bits, which original rows were added), null-space basis as press masks)."""
    size = n * n
    rows = []
    for i in range(size):
        x, y = i % n, i // n
        m = 1 << i
        for dx, dy in ((1, 0), (-1, 0), (0, 1), (0, -1)):
            nx, ny = x + dx, y + dy
            if 0 <= nx < n and 0 <= ny < n:
                m |= 1 << (ny * n + nx)
        rows.append((m, 1 << i))  # (coefficients, which equations were combined into this row)
    pivots = []  # (column, row index) in the reduced system
    r = 0
    for col in range(size):
        pr = next((k for k in range(r, size) if rows[k][0] >> col & 1), None)
        if pr is None:
            continue
        rows[r], rows[pr] = rows[pr], rows[r]
        for k in range(size):
            if k != r and rows[k][0] >> col & 1:
                rows[k] = (rows[k][0] ^ rows[r][0], rows[k][1] ^ rows[r][1])
        pivots.append((col, r))
        r += 1
    pivot_cols = {c for c, _ in pivots}
    free = [c for c in range(size) if c not in pivot_cols]
    basis = []
    for f in free:  # set one free variable, solve the pivots for a homogeneous solution
        v = 1 << f
        for c, row in pivots:
            if rows[row][0] >> f & 1:
                v |= 1 << c
        basis.append(v)
    # each pivot row: (pivot column, the equations whose sum gives it, its free-column bits)
    return [(c, rows[row][1]) for c, row in pivots] + [(-1, rows[k][1]) for k in range(r, size)], basis


def solve(lights: list[list[int]]) -> list[tuple[int, int]] | None:
    """The fewest presses (x, y) that turn every light off, in reading order; None if there is none."""
    n = len(lights)
    b = 0
    for y, row in enumerate(lights):
        for x, v in enumerate(row):
            if v:
                b |= 1 << (y * n + x)
    combos, basis = _reduced(n)
    p = 0
    for col, combo in combos:
        parity = (b & combo).bit_count() & 1
        if col < 0:
            if parity:  # a zero row with a lit right-hand side: no solution
                return None
        elif parity:
            p |= 1 << col  # free variables at 0
    best = p
    for mask in range(1, 1 << len(basis)):
        q = p
        for i, v in enumerate(basis):
            if mask >> i & 1:
                q ^= v
        if q.bit_count() < best.bit_count():
            best = q
    return [(i % n, i // n) for i in range(n * n) if best >> i & 1]


def reference(state: dict, rng: random.Random) -> Action:
    presses = solve(state["lights"])
    if not presses:  # nothing lit (or unsolvable, which the page never makes): any cell
        x, y = rng.randrange(state["n"]), rng.randrange(state["n"])
    else:
        x, y = presses[0]
    cell = state["cell"]
    return click(state["ox"] + (x + 0.5) * cell, state["oy"] + (y + 0.5) * cell)


GAME = GameSpec(
    name="lights",
    title="Lights",
    kind="puzzle: lights out",
    instruction=(
        "Play lights out: clicking a cell toggles it and the cells above, below, left and right of it. "
        "Turn every light off to reach the next, bigger level."
    ),
    reference=reference,
    reads=(
        "score (10 per level solved + per level the most lights it had off net: lit at its start minus lit now), "
        "level (grid of min(level + 2, 7) cells a side), over is never true"
    ),
    keys=(),
    clicks=True,
    step_ms=200,
)
