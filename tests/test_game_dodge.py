"""Dodge through GameEnv: it moves on the clock, the ship's keys, shots and collisions score and cost
lives as its rules say, and its reference player beats the random one."""
from __future__ import annotations

import json
import random
import time

import numpy as np
import pytest

from agent.schema import Action
from tests.games_helpers import game_env, needs_chromium
from trainer.sandbox.games import dodge
from trainer.sandbox.games.env import GameEnv
from trainer.sandbox.games.spec import key

WAIT = Action("wait", {})


env = game_env("dodge")


def play(env, seed: int, policy, steps: int = 100) -> float:
    env.reset(seed=seed, options={"game": "dodge"})
    total = 0.0
    for _ in range(steps):
        before = env.state
        _, reward, term, trunc, info = env.step(policy())
        after = info["state"]
        # the score is 10 a rock shot plus a point each whole second survived, nothing else
        seconds = after["timeMs"] // 1000 - before["timeMs"] // 1000
        assert reward == 10 * (after["shot"] - before["shot"]) + seconds
        total += reward
        if term or trunc:
            break
    assert total == info["score"]
    return total


@needs_chromium
def test_state_fields_are_there_and_json(env):
    _, info = env.reset(seed=0)
    state = info["state"]
    assert {"score", "over", "level", "lives", "ship", "objects", "bullets", "timeMs", "cooldownMs",
            "bulletSpeed", "shot", "fired"} <= set(state)
    assert state["score"] == 0 and state["over"] is False and state["level"] == 1 and state["lives"] == 3
    assert state["ship"]["lane"] == 6 and state["ship"]["x"] == 156 and state["bullets"] == []
    assert json.loads(json.dumps(state)) == state


@needs_chromium
def test_it_moves_on_the_game_clock_only(env):
    env.reset(seed=2)
    for _ in range(4):
        env.step(WAIT)
    before = env.state
    assert before["objects"] and before["timeMs"] == 4 * dodge.STEP_MS + 10  # reset runs one 1/60 s frame
    time.sleep(0.3)  # wall time while the policy thinks: the game does not move
    assert env.browser.evaluate("tandemGame.getState()") == before
    _, _, _, _, info = env.step(WAIT)
    after = info["state"]
    assert after["timeMs"] == before["timeMs"] + dodge.STEP_MS
    moved = {o["id"]: o for o in after["objects"]}
    for o in before["objects"]:
        if o["id"] in moved:  # each falls by its own speed over the step (10 ms ticks)
            assert moved[o["id"]]["y"] == pytest.approx(o["y"] + o["vy"] * dodge.STEP_MS / 1000, abs=1e-6)


@needs_chromium
def test_the_same_seed_and_keys_give_the_same_frames(env):
    runs = []
    for _ in range(2):
        obs, _ = env.reset(seed=9)
        frames, states = [obs["screenshot"]], []
        for i in range(25):
            obs, _, _, _, info = env.step(key(("left", "space", "right", "space", "right")[i % 5]))
            frames.append(obs["screenshot"])
            states.append(info["state"])
        runs.append((frames, states))
    assert runs[0][1] == runs[1][1]
    assert all(np.array_equal(a, b) for a, b in zip(runs[0][0], runs[1][0], strict=True))
    assert not np.array_equal(runs[0][0][5], runs[0][0][20])  # and the frames do change


@needs_chromium
def test_keys_move_the_ship_by_a_lane_and_space_fires_with_a_cooldown(env):
    env.reset(seed=1)
    _, _, _, _, info = env.step(key("left"))
    assert info["state"]["ship"]["lane"] == 5 and info["state"]["ship"]["x"] == 132
    for _ in range(8):
        _, _, _, _, info = env.step(key("left"))
    assert info["state"]["ship"]["lane"] == 0  # held at the edge
    _, _, _, _, info = env.step(key("right"))
    assert info["state"]["ship"]["lane"] == 1
    _, _, _, _, info = env.step(key("space"))
    assert info["state"]["fired"] == 1 and len(info["state"]["bullets"]) == 1
    assert info["state"]["bullets"][0]["x"] == 36
    _, _, _, _, info = env.step(key("space"))  # 150 ms later: the 250 ms cooldown is not over
    assert info["state"]["fired"] == 1
    _, _, _, _, info = env.step(key("space"))
    assert info["state"]["fired"] == 2


@needs_chromium
def test_collisions_cost_lives_and_the_game_ends_at_zero():
    env = GameEnv("dodge", max_steps=600)
    try:
        env.reset(seed=3)
        lives, term, info = 3, False, None
        for _ in range(600):  # steer under the lowest falling thing, never shoot
            state = env.state
            ship = state["ship"]
            falling = [o for o in state["objects"] if o["y"] < ship["y"]]
            target = max(falling, key=lambda o: o["y"])["x"] if falling else ship["x"]
            a = WAIT if abs(target - ship["x"]) <= 12 else key("left" if target < ship["x"] else "right")
            _, reward, term, _, info = env.step(a)
            assert info["state"]["lives"] in (lives, lives - 1)
            lives = info["state"]["lives"]
            assert reward == info["state"]["timeMs"] // 1000 - state["timeMs"] // 1000  # nothing shot
            if term:
                break
    finally:
        env.close()
    assert term and lives == 0 and info["state"]["over"] and info["status"] == "over"
    frozen = dict(info["state"])
    assert frozen["fired"] == 0 and frozen["shot"] == 0


@needs_chromium
def test_reference_beats_random(env):
    ref = [play(env, s, lambda: env.reference_action()) for s in range(3)]
    env.action_space.seed(0)
    rand = [play(env, s, lambda: env.action_space.sample()) for s in range(3)]
    assert np.mean(ref) > 2 * np.mean(rand), (ref, rand)


def test_reference_dodges_what_would_hit_it_and_aims_at_rocks():
    ship = {"x": 156, "y": 232, "halfWidth": 12, "halfHeight": 7, "lane": 6, "lanes": 14, "laneWidth": 24}
    base = {"ship": ship, "bullets": [], "cooldownMs": 0, "bulletSpeed": 420}
    bomb_above = {"id": 1, "kind": "bomb", "x": 158, "y": 200, "r": 9, "vy": 100}
    assert dodge.reference({**base, "objects": [bomb_above]}, random.Random(0)).args["key"] in ("left", "right")
    rock_left = {"id": 2, "kind": "rock", "x": 84, "y": 60, "r": 10, "vy": 50}
    assert dodge.reference({**base, "objects": [rock_left]}, random.Random(0)).args["key"] == "left"
    rock_over = {**rock_left, "x": 150}
    assert dodge.reference({**base, "objects": [rock_over]}, random.Random(0)).args["key"] == "space"
    # a bullet already on its way to that rock: it looks for another
    covered = {**base, "objects": [rock_over], "bullets": [{"x": 156, "y": 120}], "cooldownMs": 100}
    assert dodge.reference(covered, random.Random(0)).args["key"] != "left"


def test_reference_is_fast():
    ship = {"x": 156, "y": 232, "halfWidth": 12, "halfHeight": 7, "lane": 6, "lanes": 14, "laneWidth": 24}
    rng = random.Random(0)
    objects = [{"id": i, "kind": rng.choice(("rock", "bomb")), "x": rng.uniform(12, 324), "y": rng.uniform(10, 240),
                "r": 10, "vy": rng.uniform(40, 170)} for i in range(25)]
    state = {"ship": ship, "objects": objects, "bullets": [{"x": 100, "y": 150}] * 5, "cooldownMs": 0,
             "bulletSpeed": 420}
    t0 = time.perf_counter()
    for _ in range(50):
        dodge.reference(state, rng)
    assert (time.perf_counter() - t0) / 50 < 0.005
