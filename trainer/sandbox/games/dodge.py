"""Dodge: a timing game. The ship at the bottom moves one lane per left/right press and fires with
space; grey rocks can be shot (10 points), red spiked bombs cannot and must be dodged; a point a
second survived; things fall faster over time; a collision costs one of 3 lives.

The reference player reads the ship, the falling objects (x, y, radius, fall speed) and the bullets
in flight: it steps out of the way of anything that would hit it within two steps, else moves under
the rock it can shoot soonest (not already covered by a bullet, not shielded by a bomb) and fires.
"""
from __future__ import annotations

import random

from agent.schema import Action
from trainer.sandbox.games import spec

STEP_MS = 150


def _lane_x(state: dict, lane: int) -> float:
    ship = state["ship"]
    return ship["laneWidth"] / 2 + lane * ship["laneWidth"]


def _hits_lane(state: dict, lane: int, horizon_s: float) -> bool:
    """Whether any falling object reaches the ship's body in `lane` within the next horizon_s seconds."""
    ship = state["ship"]
    x, top, bottom = _lane_x(state, lane), ship["y"] - ship["halfHeight"], ship["y"] + ship["halfHeight"]
    for o in state["objects"]:
        if abs(o["x"] - x) >= o["r"] + ship["halfWidth"] + 2:
            continue
        y_end = o["y"] + o["vy"] * horizon_s
        if y_end + o["r"] >= top - 2 and o["y"] - o["r"] <= bottom:
            return True
    return False


def _time_to_kill(state: dict, rock: dict, moves: int, dt: float, lane_x: float) -> float | None:
    """Seconds until a bullet fired from lane_x after `moves` steps meets the rock, or None when it
    cannot (a bomb in the way, or the rock would reach the ship first)."""
    ship = state["ship"]
    muzzle = ship["y"] - ship["halfHeight"]
    t0 = moves * dt + state["cooldownMs"] / 1000 * (moves == 0)
    y1 = rock["y"] + rock["vy"] * t0
    tb = (muzzle - y1) / (state["bulletSpeed"] + rock["vy"])
    if tb <= 0 or y1 + rock["vy"] * tb > muzzle - rock["r"] - 12:
        return None
    for o in state["objects"]:  # a bomb between the ship and the rock swallows the bullet
        if o["kind"] == "bomb" and abs(o["x"] - lane_x) <= o["r"] + 3 and rock["y"] < o["y"] < muzzle:
            return None
    return t0 + tb


def reference(state: dict, rng: random.Random) -> Action:
    ship = state["ship"]
    lane, lanes = ship["lane"], ship["lanes"]
    dt = STEP_MS / 1000
    near = [n for n in (lane - 1, lane + 1) if 0 <= n < lanes]
    if _hits_lane(state, lane, 2 * dt):  # dodge first: a neighbor lane that stays clear longest
        for horizon in (2 * dt, dt):
            safe = [n for n in near if not _hits_lane(state, n, horizon)]
            if safe:
                pick = min(safe, key=lambda n: abs(n - lanes / 2 + 0.5))
                return spec.key("left" if pick < lane else "right")
    best = None  # (time to kill, lane to fire from)
    for o in state["objects"]:
        if o["kind"] != "rock":
            continue
        if any(abs(b["x"] - o["x"]) <= o["r"] + 3 and b["y"] > o["y"] for b in state["bullets"]):
            continue  # a bullet is already on its way
        target = min(range(lanes), key=lambda n: abs(_lane_x(state, n) - o["x"]))
        t = _time_to_kill(state, o, abs(target - lane), dt, _lane_x(state, target))
        if t is not None and (best is None or t < best[0]):
            best = (t, target)
    goal = best[1] if best else (lanes - 1) // 2
    if goal == lane:
        return spec.key("space")
    step = lane - 1 if goal < lane else lane + 1
    if _hits_lane(state, step, 2 * dt):
        return spec.key("space")  # hold the lane rather than step into something
    return spec.key("left" if step < lane else "right")


GAME = spec.GameSpec(
    name="dodge",
    title="Dodge",
    kind="timing: shooting and dodging",
    instruction=("Play Dodge: move the ship at the bottom with the left and right arrow keys and shoot with "
                 "space. Shoot the grey rocks for points, dodge the red spiked bombs (they cannot be shot); "
                 "a hit costs a life and the game ends at 0 lives."),
    reference=reference,
    reads="score (10 a rock shot, 1 a second survived), lives (3, one lost a collision), over (0 lives)",
    keys=("left", "right", "space"),
    step_ms=STEP_MS,
)
