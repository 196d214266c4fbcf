"""The reference players' thoughts: one short sentence per step, written from the game's state and
the action the player chose, for expert demonstrations (`sandbox generate --suite games`).

    thought(spec, state, action, width, height)
        -> "Score 12. Sliding left merges two 4s and two 8s for 24 points."

Each sentence says only what the state shows (a merge the move makes, where the food is, a cell
the numbers prove safe); where the player's reason is a search it does not explain (the corner
heuristic of merge, blocks' placement score) the sentence names the goal, not a claim about it.
"""
from __future__ import annotations

from agent.schema import Action
from trainer.sandbox.games.dodge import STEP_MS, _hits_lane
from trainer.sandbox.games.levels import _parse
from trainer.sandbox.games.lights import solve
from trainer.sandbox.games.merge import slide
from trainer.sandbox.games.mines import FLAGGED, HIDDEN, deduce
from trainer.sandbox.games.spec import GameSpec


def thought(spec: GameSpec, state: dict, action: Action, width: int, height: int) -> str:
    """'Score N.' and what the reference player does in `state` with `action`, and why."""
    score = float(state.get("score") or 0.0)
    why = _WRITERS.get(spec.name, _plain)(state, action, width, height)
    return f"Score {score:g}. {why}"


def _key(action: Action) -> str | None:
    return action.args.get("key") if action.name == "hotkey" else None


def _pixel(action: Action, width: int, height: int) -> tuple[float, float] | None:
    box = action.args.get("start_box") if action.name == "click" else None
    return (float(box[0]) * width, float(box[1]) * height) if box else None


def _cell(state: dict, action: Action, width: int, height: int) -> tuple[int, int] | None:
    """(column, row) of a click on a square grid drawn from (ox, oy) with `cell`-pixel cells."""
    p = _pixel(action, width, height)
    if p is None or not all(k in state for k in ("ox", "oy", "cell")):
        return None
    return int((p[0] - state["ox"]) // state["cell"]), int((p[1] - state["oy"]) // state["cell"])


def _plain(state: dict, action: Action, width: int, height: int) -> str:
    k = _key(action)
    if k:
        return f"I press {k}."
    p = _pixel(action, width, height)
    return f"I click at ({p[0]:.0f}, {p[1]:.0f})." if p else f"I {action.name}."


def _merge(state: dict, action: Action, width: int, height: int) -> str:
    k = _key(action)
    if k not in ("up", "down", "left", "right") or "board" not in state:
        return _plain(state, action, width, height)
    board = [list(map(int, row)) for row in state["board"]]
    _, gained, changed = slide(board, k)
    if gained:
        return f"Sliding {k} merges tiles for {gained} points."
    if changed:
        return f"Sliding {k} merges nothing now; I take it to keep the big tiles in order for later merges."
    return f"I slide {k}."


def _snake(state: dict, action: Action, width: int, height: int) -> str:
    k = _key(action)
    if not k or not state.get("snake"):
        return _plain(state, action, width, height)
    hx, hy = state["snake"][0]
    food = state.get("food")
    if not food:
        return f"I steer {k}."
    fx, fy = food
    where = [f"{abs(fx - hx)} {'right' if fx > hx else 'left'}" if fx != hx else "",
             f"{abs(fy - hy)} {'down' if fy > hy else 'up'}" if fy != hy else ""]
    where = " and ".join(w for w in where if w) or "here"
    toward = (k == "right" and fx > hx) or (k == "left" and fx < hx) or (k == "down" and fy > hy) or (k == "up" and fy < hy)
    if toward:
        return f"The food is {where} of the head; I steer {k} toward it."
    return f"The food is {where} of the head, but the way there is not safe yet; I steer {k} to keep room."


def _blocks(state: dict, action: Action, width: int, height: int) -> str:
    k = _key(action)
    if k == "up":
        return "I rotate the piece into the turn that fits the stack best."
    if k in ("left", "right"):
        return f"I move the piece {k} toward the column where it fits best."
    if k == "space":
        return "The piece is lined up; I drop it."
    return _plain(state, action, width, height)


def _mines(state: dict, action: Action, width: int, height: int) -> str:
    p = _pixel(action, width, height)
    fb = state.get("flag_button")
    if p is not None and fb is not None and _cell(state, action, width, height) not in _grid_cells(state):
        return f"Flag mode is {'on' if state.get('flag_mode') else 'off'}; I switch it {'off' if state.get('flag_mode') else 'on'}."
    at = _cell(state, action, width, height)
    view = state.get("view")
    if at is None or not view:
        return _plain(state, action, width, height)
    x, y = at
    if all(v in (HIDDEN, FLAGGED) for row in view for v in row):
        return f"Nothing is open yet; I reveal row {y + 1}, column {x + 1} (the first reveal is never a mine)."
    safe, _ = deduce(view)
    if (x, y) in safe:
        return f"The numbers around it prove row {y + 1}, column {x + 1} safe; I reveal it."
    return f"No cell is certainly safe; I reveal row {y + 1}, column {x + 1}, one of the least risky."


def _grid_cells(state: dict) -> set:
    view = state.get("view") or []
    return {(x, y) for y, row in enumerate(view) for x in range(len(row))}


def _lights(state: dict, action: Action, width: int, height: int) -> str:
    at = _cell(state, action, width, height)
    lights = state.get("lights")
    if at is None or lights is None:
        return _plain(state, action, width, height)
    x, y = at
    on = sum(bool(v) for row in lights for v in row)
    presses = solve(lights) or []
    lit = "1 light is on" if on == 1 else f"{on} lights are on"
    if (x, y) in presses:
        if len(presses) == 1:
            return f"{lit}; pressing row {y + 1}, column {x + 1} clears the board."
        return f"{lit}; {len(presses)} presses clear them, and I press row {y + 1}, column {x + 1} first."
    return f"{lit}; I press row {y + 1}, column {x + 1}."


def _memory(state: dict, action: Action, width: int, height: int) -> str:
    p = _pixel(action, width, height)
    cards = state.get("cards") or []
    if p is None or not cards:
        return _plain(state, action, width, height)
    hit = next((i for i, c in enumerate(cards) if c["x"] <= p[0] <= c["x"] + c["w"] and c["y"] <= p[1] <= c["y"] + c["h"]),
               None)
    if hit is None:
        return _plain(state, action, width, height)
    cols = int(state.get("cols") or 1)
    where = f"row {hit // cols + 1}, column {hit % cols + 1}"
    up = [c for c in cards if c["face"] is not None and not c["matched"]]
    if len(up) == 1 and not state.get("pending"):
        return f"One card is face up; I turn over the card at {where} to look for its pair."
    return f"I turn over the card at {where}."


def _dodge(state: dict, action: Action, width: int, height: int) -> str:
    k = _key(action)
    ship = state.get("ship")
    if k is None or ship is None:
        return _plain(state, action, width, height)
    danger = _hits_lane(state, ship["lane"], 2 * STEP_MS / 1000)
    if k in ("left", "right"):
        if danger:
            return f"Something is about to hit my lane; I dodge {k}."
        if not any(o.get("kind") == "rock" for o in state.get("objects") or []):
            return f"No rock to shoot; I move {k} toward the middle lane."
        return f"I move {k} to get under a rock I can shoot."
    if k == "space":
        return "I fire from my lane." if not danger else "No lane beside me is clear; I fire and hold my lane."
    return _plain(state, action, width, height)


def _levels(state: dict, action: Action, width: int, height: int) -> str:
    k = _key(action)
    grid = state.get("grid")
    if k == "r":
        return "A crate is stuck where it can no longer reach a ring; I restart the level."
    if k not in ("up", "down", "left", "right") or not grid:
        return _plain(state, action, width, height)
    _, _, boxes, (px, py) = _parse(list(grid))
    dx, dy = {"up": (0, -1), "down": (0, 1), "left": (-1, 0), "right": (1, 0)}[k]
    level = state.get("level")
    head = f"Level {level}: " if level is not None else ""
    if (px + dx, py + dy) in boxes:
        return f"{head}I push the crate {k}, on my plan to put every crate on a ring."
    return f"{head}I walk {k} to get behind the next crate to push."


_WRITERS = {"merge": _merge, "snake": _snake, "blocks": _blocks, "mines": _mines, "lights": _lights,
            "memory": _memory, "dodge": _dodge, "levels": _levels}
