"""Blocks (trainer/sandbox/games/blocks.py + pages/blocks.html): the placement search alone, then the
page through GameEnv in headless Chromium under the fake clock."""
from __future__ import annotations

import json
import random

from agent.schema import Action
from tests.games_helpers import game_env, play_to_end
from trainer.sandbox.games.blocks import GAME, best_placement, reference
from trainer.sandbox.games.spec import key

# the page's I piece: a 4-box, horizontal in rotation 0 (row 1), vertical in rotation 1 (column 2)
I_SHAPES = [
    [[0, 1], [1, 1], [2, 1], [3, 1]],
    [[2, 0], [2, 1], [2, 2], [2, 3]],
    [[3, 2], [2, 2], [1, 2], [0, 2]],
    [[1, 3], [1, 2], [1, 1], [1, 0]],
]


def _state(board, shapes=I_SHAPES, rot=0, x=3, y=0):
    return {"board": board, "over": False, "piece": {"type": "I", "rot": rot, "x": x, "y": y, "shapes": shapes}}


def _board(filled_rows: dict[int, set[int]]):
    return [[1 if c in filled_rows.get(r, ()) else 0 for c in range(10)] for r in range(20)]


def test_best_placement_completes_the_line_and_takes_the_well():
    # the bottom row lacks columns 0-3: the I piece lies there (rotation 0 at x 0) and clears it
    state = _state(_board({19: set(range(4, 10))}))
    assert best_placement(state) == (0, 0)
    assert reference(state, random.Random(0)) == key("left")  # one key a step toward it
    # four rows lack only column 9: the I piece stands up in it (rotation 1, column 2 of its box -> x 7)
    well = _board({r: set(range(9)) for r in range(16, 20)})
    assert best_placement(_state(well)) == (1, 7)
    assert reference(_state(well), random.Random(0)) == key("up")
    assert reference(_state(well, rot=1, x=5), random.Random(0)) == key("right")
    assert reference(_state(well, rot=1, x=7), random.Random(0)) == key("space")  # aligned: drop
    # a wall in the piece's row it cannot pass: only the columns it can slide to count
    walled = _board({1: {1}, 19: set(range(4, 10))})
    rot, x = best_placement(_state(walled))
    assert (rot, x) != (0, 0) and (x >= 2 or rot != 0)
    assert best_placement({"board": well, "over": True, "piece": None}) is None


# ------------------------------------------------------------------ the page through GameEnv
env = game_env("blocks")


def _play(env, seed, policy):
    rewards, lines = [], [0]

    def seen(reward, info):
        rewards.append(reward)
        lines.append(info["state"]["lines"])

    info = play_to_end(env, "blocks", seed, policy, seen)
    # the score is the lines' points: 10/30/50/80 for 1/2/3/4 cleared by one piece
    points = {0: 0, 1: 10, 2: 30, 3: 50, 4: 80}
    assert rewards == [points[b - a] for a, b in zip(lines, lines[1:], strict=False)]
    assert info["score"] == sum(rewards)
    return info


def test_reference_player_beats_random_player(env):
    ref = [_play(env, s, "reference") for s in (1, 2, 3)]
    rnd = [_play(env, s, "random") for s in (1, 2, 3)]
    ref_mean = sum(i["score"] for i in ref) / 3
    rnd_mean = sum(i["score"] for i in rnd) / 3
    assert ref_mean >= 40 and ref_mean > rnd_mean + 30, (ref_mean, rnd_mean)
    assert all(i["state"]["lines"] >= 3 and not i["state"]["over"] for i in ref)


def test_gravity_runs_on_the_game_clock_and_each_key_moves_the_piece(env):
    _, info = env.reset(seed=4, options={"game": "blocks"})
    p = info["state"]["piece"]
    assert (p["y"], p["rot"], info["state"]["gravity_ms"], GAME.step_ms) == (0, 0, 800, 200)
    wait = Action("wait", {})
    ys = []
    for _ in range(8):  # a row every 800 ms of game time: every 4th step of 200 ms
        _, _, _, _, info = env.step(wait)
        ys.append(info["state"]["piece"]["y"])
    assert ys == [0, 0, 0, 1, 1, 1, 1, 2]
    p = info["state"]["piece"]
    _, _, _, _, info = env.step(key("left"))
    assert info["state"]["piece"]["x"] == p["x"] - 1
    _, _, _, _, info = env.step(key("right"))
    assert info["state"]["piece"]["x"] == p["x"]
    _, _, _, _, info = env.step(key("down"))
    assert info["state"]["piece"]["y"] == p["y"] + 1
    _, _, _, _, info = env.step(key("up"))
    q = info["state"]["piece"]
    assert q["rot"] == 1 or q["type"] == "O"
    pieces, nxt = info["state"]["pieces"], info["state"]["next"]
    _, _, _, _, info = env.step(key("space"))  # a hard drop locks it at the bottom, the next one spawns
    s = info["state"]
    assert s["pieces"] == pieces + 1 and s["piece"]["type"] == nxt and s["piece"]["y"] == 0
    assert sum(v > 0 for row in s["board"] for v in row) == 4 and any(s["board"][19])


def test_hard_drops_in_the_middle_stack_up_until_a_piece_cannot_spawn(env):
    _, info = env.reset(seed=2, options={"game": "blocks"})
    steps, terminated = 0, False
    while not terminated:
        _, reward, terminated, truncated, info = env.step(key("space"))
        steps += 1
        assert reward == 0 and not truncated
    s = info["state"]
    assert s["over"] and info["status"] == "over" and s["score"] == 0 and s["lines"] == 0
    assert 5 <= steps < GAME.max_steps
    assert any(s["board"][0][c] or s["board"][1][c] for c in range(3, 7))  # the stack reached the top


def test_state_fields_are_present_json_able_and_the_same_for_the_same_seed(env):
    runs = []
    for seed in (6, 6, 7):
        env.reset(seed=seed, options={"game": "blocks"})
        for k in ("left", "space", "up", "right", "right", "space"):
            _, _, _, _, info = env.step(key(k))
        runs.append(info["state"])
    a = runs[0]
    for field in ("score", "over", "level", "lives", "lines", "pieces", "cols", "rows", "gravity_ms", "board",
                  "piece", "next"):
        assert field in a, field
    for field in ("type", "rot", "x", "y", "shapes"):
        assert field in a["piece"], field
    assert json.loads(json.dumps(a)) == a
    assert a == runs[1] and a["board"] != runs[2]["board"]
    assert (a["level"], a["lives"], a["cols"], a["rows"]) == (1, None, 10, 20)
