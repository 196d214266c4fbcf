"""Lights out (trainer/sandbox/games/lights.py + pages/lights.html): the GF(2) solver alone, then the
page through GameEnv in headless Chromium under the fake clock."""
from __future__ import annotations

import json
import random

import pytest

from tests.games_helpers import cell_click, game_env, play_to_end
from trainer.sandbox.games.lights import GAME, solve
from trainer.sandbox.games.spec import click


def _press(lights, x, y):
    n = len(lights)
    for dx, dy in ((0, 0), (1, 0), (-1, 0), (0, 1), (0, -1)):
        if 0 <= x + dx < n and 0 <= y + dy < n:
            lights[y + dy][x + dx] ^= 1


@pytest.mark.parametrize("n", [3, 4, 5, 6, 7])
def test_solve_clears_boards_made_by_random_presses_in_no_more_presses(n):
    rng = random.Random(n)
    for _ in range(30):
        lights = [[0] * n for _ in range(n)]
        pressed = 0
        for y in range(n):
            for x in range(n):
                if rng.random() < 0.5:
                    _press(lights, x, y)
                    pressed += 1
        presses = solve(lights)
        assert presses is not None and len(presses) <= pressed
        for x, y in presses:
            _press(lights, x, y)
        assert not any(map(any, lights))


def test_solve_finds_the_single_press_and_says_when_there_is_none():
    lights = [[0] * 4 for _ in range(4)]
    _press(lights, 2, 1)
    assert solve(lights) == [(2, 1)]  # 4x4 has a null space: the minimum is still the one press
    corner = [[0] * 5 for _ in range(5)]
    corner[0][0] = 1  # one lit corner of a 5x5 is not reachable by presses
    assert solve(corner) is None


# ------------------------------------------------------------------ the page through GameEnv
env = game_env("lights")


def _cell(state, x, y):
    return cell_click(state, x, y)


def _play(env, seed, policy):
    return play_to_end(env, "lights", seed, policy)


def test_reference_player_beats_random_player(env):
    ref = [_play(env, s, "reference") for s in (1, 2, 3)]
    rnd = [_play(env, s, "random") for s in (1, 2, 3)]
    ref_mean = sum(i["score"] for i in ref) / 3
    rnd_mean = sum(i["score"] for i in rnd) / 3
    assert ref_mean > 3 * rnd_mean and ref_mean > 50, (ref_mean, rnd_mean)
    assert all(i["level"] >= 4 for i in ref)  # 3x3, 4x4 and 5x5 solved within the 100 steps
    assert all(i["steps"] == GAME.max_steps for i in ref)  # lights never ends by itself


def test_a_click_toggles_the_cell_and_its_four_neighbours_and_solving_levels_up(env):
    _, info = env.reset(seed=5, options={"game": "lights"})
    s0 = info["state"]
    assert (s0["n"], s0["level"], s0["score"], s0["over"], s0["lives"]) == (3, 1, 0, False, None)
    _, _, _, _, info = env.step(_cell(s0, 1, 1))
    s1 = info["state"]
    toggled = {(x, y) for y in range(3) for x in range(3) if s0["lights"][y][x] != s1["lights"][y][x]}
    if s1["level"] == 1:  # (the centre press may have solved it; then the board is the next level's)
        assert toggled == {(1, 1), (0, 1), (2, 1), (1, 0), (1, 2)}
        assert s1["score"] == max(0, s0["lit"] - s1["lit"])
    # finish the level with the solver's presses: level 2 is a 4x4 and the level's points are banked
    state = s1
    while state["level"] == 1:
        x, y = solve(state["lights"])[0]
        _, reward, _, _, info = env.step(_cell(state, x, y))
        assert reward >= 0
        state = info["state"]
    assert state["n"] == 4 and state["level"] == 2
    assert state["score"] == 10 + s0["start_lit"]  # 10 for the level + its lights turned off
    # a click outside the grid changes nothing
    _, reward, _, _, info = env.step(click(5, 245))
    assert reward == 0 and info["state"]["lights"] == state["lights"]


def test_state_fields_are_present_json_able_and_the_same_for_the_same_seed(env):
    _, a = env.reset(seed=11, options={"game": "lights"})
    _, b = env.reset(seed=11, options={"game": "lights"})
    _, c = env.reset(seed=12, options={"game": "lights"})
    for key in ("score", "over", "level", "lives", "n", "lit", "start_lit", "cell", "ox", "oy", "lights"):
        assert key in a["state"], key
    assert json.loads(json.dumps(a["state"])) == a["state"]
    assert a["state"] == b["state"] and a["state"]["lights"] != c["state"]["lights"]
    assert a["state"]["lit"] == sum(map(sum, a["state"]["lights"])) > 0
