"""Minesweeper-like (written here): pages/mines.html and its reference player.

The reference player reads the visible board only (getState()'s view: -1 hidden, -2 flagged, 0..8
a revealed count). It never spends a step on flags (they do not score): it keeps the mines it has
deduced in its head. Deductions: around a number, if the known mines already account for it, the
other hidden neighbours are safe; if the hidden neighbours are exactly the missing mines, they are
all mines; and the subset rule between two numbers (one's unknown neighbours inside the other's).
With nothing safe it guesses the hidden cell of lowest estimated risk.
"""
from __future__ import annotations

import random

from agent.schema import Action
from trainer.sandbox.games.spec import GameSpec, click

HIDDEN, FLAGGED = -1, -2


def _neighbours(x: int, y: int, cols: int, rows: int):
    for dy in (-1, 0, 1):
        for dx in (-1, 0, 1):
            nx, ny = x + dx, y + dy
            if (dx or dy) and 0 <= nx < cols and 0 <= ny < rows:
                yield nx, ny


def deduce(view: list[list[int]]) -> tuple[set, set]:
    """(safe, mines): hidden cells the visible numbers prove safe / prove mined."""
    rows, cols = len(view), len(view[0])
    mines: set = set()
    safe: set = set()
    numbers = [(x, y) for y in range(rows) for x in range(cols) if view[y][x] > 0]
    changed = True
    while changed:
        changed = False
        constraints = []  # (unknown neighbours, mines among them)
        for x, y in numbers:
            unknown, known = [], 0
            for n in _neighbours(x, y, cols, rows):
                if view[n[1]][n[0]] in (HIDDEN, FLAGGED):
                    if n in mines:
                        known += 1
                    elif n not in safe:
                        unknown.append(n)
            need = view[y][x] - known
            if not unknown:
                continue
            if need == 0:
                safe.update(unknown)
                changed = True
            elif need == len(unknown):
                mines.update(unknown)
                changed = True
            else:
                constraints.append((frozenset(unknown), need))
        if changed:
            continue
        # subset rule: A inside B means B - A holds need(B) - need(A) mines
        for a, na in constraints:
            for b, nb in constraints:
                if a is b or not a < b:
                    continue
                rest = b - a
                if nb - na == 0:
                    safe.update(rest)
                    changed = True
                elif nb - na == len(rest):
                    mines.update(rest)
                    changed = True
    return safe, mines


def _risk(view, mines_total: int, mines: set, safe: set) -> dict:
    """An estimate of each undecided hidden cell's chance of a mine: the worst local ratio
    (missing mines / unknown cells) around its numbers, else the density of the rest of the board."""
    rows, cols = len(view), len(view[0])
    undecided = [
        (x, y) for y in range(rows) for x in range(cols)
        if view[y][x] in (HIDDEN, FLAGGED) and (x, y) not in mines and (x, y) not in safe
    ]
    left = max(mines_total - len(mines), 0)
    density = left / len(undecided) if undecided else 1.0
    risk = {}
    for c in undecided:
        local = []
        for nx, ny in _neighbours(c[0], c[1], cols, rows):
            v = view[ny][nx]
            if v <= 0:
                continue
            unknown = [
                n for n in _neighbours(nx, ny, cols, rows)
                if view[n[1]][n[0]] in (HIDDEN, FLAGGED) and n not in mines and n not in safe
            ]
            known = sum(1 for n in _neighbours(nx, ny, cols, rows) if n in mines)
            local.append((v - known) / len(unknown))
        risk[c] = max(local) if local else density
    return risk


def choose_cell(state: dict, rng: random.Random) -> tuple[int, int]:
    view = state["view"]
    rows, cols = len(view), len(view[0])
    if all(v in (HIDDEN, FLAGGED) for row in view for v in row):
        return cols // 2, rows // 2  # the first reveal is never a mine and opens its neighbours
    safe, mines = deduce(view)
    if safe:
        return min(safe, key=lambda c: (c[1], c[0]))
    risk = _risk(view, state["mines"], mines, safe)
    low = min(risk.values())
    return rng.choice(sorted(c for c, r in risk.items() if r == low))


def reference(state: dict, rng: random.Random) -> Action:
    x, y = choose_cell(state, rng)
    flagged = state["view"][y][x] == FLAGGED
    # a reveal needs flag mode off; lifting a flag (only a player other than this one sets them) needs it on
    if state.get("flag_mode") != flagged:
        return click(*state["flag_button"])
    cell = state["cell"]
    return click(state["ox"] + (x + 0.5) * cell, state["oy"] + (y + 0.5) * cell)


GAME = GameSpec(
    name="mines",
    title="Mines",
    kind="logic: minesweeper",
    instruction=(
        "Play minesweeper: click a cell to reveal it; a number tells how many of its 8 neighbours hide a mine. "
        "Reveal every safe cell without clicking a mine. Right-click a cell, or switch on 'Flag' at the top right "
        "and click, to mark a mine."
    ),
    reference=reference,
    reads="score (1 per safe cell revealed, +20 when every safe cell is revealed), over (a mine or a cleared board)",
    keys=(),
    clicks=True,
    step_ms=200,
)
