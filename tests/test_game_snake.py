"""Snake through GameEnv: its rules on scripted moves, its reference player against the random one."""
from __future__ import annotations

import json
import random

import numpy as np

from agent.schema import Action
from tests.games_helpers import game_env, needs_chromium
from trainer.sandbox.games import snake
from trainer.sandbox.games.spec import key

pytestmark = needs_chromium
WAIT = Action("wait", {})


env = game_env("snake")


def play(env, seed: int, policy, steps: int = 100) -> float:
    _, info = env.reset(seed=seed, options={"game": "snake"})
    total = 0.0
    for _ in range(steps):
        _, reward, term, trunc, info = env.step(policy())
        total += reward
        if term or trunc:
            break
    assert total == info["score"]
    return total


def test_state_fields_are_there_and_json(env):
    _, info = env.reset(seed=0)
    state = info["state"]
    assert {"score", "over", "level", "lives", "snake", "food", "dir", "cols", "rows"} <= set(state)
    assert state["score"] == 0 and state["over"] is False and state["level"] is None and state["lives"] is None
    assert state["snake"] == [[9, 7], [8, 7], [7, 7]] and state["dir"] == "right"
    assert json.loads(json.dumps(state)) == state


def test_it_moves_by_itself_and_dies_on_the_wall(env):
    seed = next(s for s in range(50) if env.reset(seed=s)[1]["state"]["food"][1] != 7)  # no food on its row
    env.reset(seed=seed)
    for i in range(11):  # head at x=9 on a 21-wide board: ten cells to the last column, the eleventh is the wall
        _, reward, term, _, info = env.step(WAIT)
        assert info["state"]["snake"][0] == [10 + i, 7] and not term and reward == 0
    _, reward, term, trunc, info = env.step(WAIT)
    assert term and not trunc and info["state"]["over"] and info["status"] == "over"


def test_it_cannot_turn_back_and_dies_on_itself(env):
    env.reset(seed=3)
    _, _, term, _, info = env.step(key("left"))  # straight back: ignored
    assert not term and info["state"]["dir"] == "right"
    # grow to five by eating, then turn in a tight square into its own body
    for _ in range(200):
        state = env.state
        if state["length"] >= 5:
            break
        _, _, term, _, _ = env.step(snake.reference(state, random.Random(0)))
        assert not term
    assert env.state["length"] >= 5
    heading = env.state["dir"]
    turn = {"right": ("down", "left", "up"), "left": ("up", "right", "down"), "up": ("right", "down", "left"),
            "down": ("left", "up", "right")}[heading]
    over = False
    for k in turn:
        _, _, over, _, info = env.step(key(k))
        if over:
            break
    assert over and info["state"]["over"]


def test_eating_scores_and_grows(env):
    _, info = env.reset(seed=11)
    length = info["state"]["length"]
    for _ in range(60):
        _, reward, term, _, info = env.step(snake.reference(env.state, random.Random(0)))
        if reward:
            break
    assert reward == 1.0 and info["score"] == 1 and info["state"]["length"] == length + 1


def test_reference_beats_random(env):
    ref = [play(env, s, lambda: env.reference_action()) for s in range(3)]
    rng = np.random.default_rng(0)
    rand = [play(env, s, lambda: key(("up", "down", "left", "right")[int(rng.integers(4))])) for s in range(3)]
    assert np.mean(ref) > np.mean(rand) + 3, (ref, rand)


def test_reference_is_fast():
    state = {"cols": 21, "rows": 14, "dir": "left", "food": [3, 3],
             "snake": [[x, 7] for x in range(20, 5, -1)] + [[x, 8] for x in range(6, 21)]}
    import time

    t0 = time.perf_counter()
    for _ in range(20):
        snake.reference(state, random.Random(0))
    assert (time.perf_counter() - t0) / 20 < 0.005
