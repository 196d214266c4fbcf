"""Mines (trainer/sandbox/games/mines.py + pages/mines.html): the deductions alone, then the page
through GameEnv in headless Chromium under the fake clock."""
from __future__ import annotations

import json
import random

import pytest

from agent.schema import Action
from tests.games_helpers import cell_click, game_env, play_to_end
from trainer.sandbox.games.mines import GAME, choose_cell, deduce, reference
from trainer.sandbox.games.spec import click

H, F = -1, -2  # hidden, flagged


def test_deduce_all_safe_all_mines_and_the_subset_rule():
    view = [
        [1, H, H],
        [1, 1, H],
        [0, 0, 0],
    ]
    safe, mines = deduce(view)
    # the (0,1) 1 sees only (1,0) hidden: a mine; then (1,1)'s 1 is satisfied: (2,0) and (2,1) are safe
    assert mines == {(1, 0)} and safe == {(2, 0), (2, 1)}
    # no single number decides here; the subset rule does: (0,1) sees {a, b} and (1,1) sees {a, b, c},
    # both 1, so c = (2,0) is safe; then (2,1) proves b = (1,0) a mine and (0,1) clears a = (0,0)
    view = [
        [H, H, H],
        [1, 1, 1],
        [0, 0, 0],
    ]
    safe, mines = deduce(view)
    assert mines == {(1, 0)} and safe == {(0, 0), (2, 0)}
    # all hidden: nothing is proved, and the player opens the middle (the first reveal is never a mine)
    blank = [[H] * 8 for _ in range(6)]
    assert deduce(blank) == (set(), set())
    assert choose_cell({"view": blank, "mines": 10}, random.Random(0)) == (4, 3)


def test_reference_clicks_a_proved_safe_cell_and_turns_flag_mode_off_first():
    view = [[1, H, H], [1, 1, H], [0, 0, 0]]
    state = {"view": view, "mines": 1, "cell": 36, "ox": 24, "oy": 36, "flag_mode": False, "flag_button": [280, 18]}
    a = reference(state, random.Random(0))
    assert a.name == "click"
    x, y = a.args["start_box"]
    assert (int((x * 336 - 24) // 36), int((y * 252 - 36) // 36)) in {(2, 0), (2, 1)}
    a = reference({**state, "flag_mode": True}, random.Random(0))
    assert a.args["start_box"] == (280 / 336, 18 / 252)


# ------------------------------------------------------------------ the page through GameEnv
env = game_env("mines")


def _cell(state, x, y):
    return cell_click(state, x, y)


def _play(env, seed, policy):
    return play_to_end(env, "mines", seed, policy)


def test_reference_player_beats_random_player(env):
    seeds = (1, 2, 3, 4)
    ref = [_play(env, s, "reference") for s in seeds]
    rnd = [_play(env, s, "random") for s in seeds]
    ref_mean = sum(i["score"] for i in ref) / len(seeds)
    rnd_mean = sum(i["score"] for i in rnd) / len(seeds)
    assert ref_mean > 1.5 * rnd_mean, (ref_mean, rnd_mean)
    for i in ref:  # a board ends the game: cleared (every safe cell + the bonus) or on a mine
        s = i["state"]
        assert s["over"] and i["status"] == "over"
        assert s["score"] == (s["revealed"] + 20 if s["won"] else s["revealed"])
    assert any(i["state"]["won"] and i["score"] == 8 * 6 - 10 + 20 for i in ref)


def test_first_click_is_safe_flags_block_reveals_and_a_mine_ends_the_game(env):
    _, info = env.reset(seed=7, options={"game": "mines"})
    s = info["state"]
    assert s["revealed"] == 0 and all(v == H for row in s["view"] for v in row)
    # a right click flags a hidden cell; a left click on a flag does nothing; a second right click lifts it
    _, reward, _, _, info = env.step(_action_right(s, 0, 0))
    assert info["state"]["view"][0][0] == F and reward == 0
    _, reward, _, _, info = env.step(_cell(s, 0, 0))
    assert info["state"]["view"][0][0] == F and info["state"]["revealed"] == 0
    # flag mode from the bar: a left click then flags, and toggles it back
    env.step(click(*s["flag_button"]))
    _, _, _, _, info = env.step(_cell(s, 0, 0))
    assert info["state"]["view"][0][0] == H and info["state"]["flag_mode"]
    env.step(click(*s["flag_button"]))
    # the first reveal is never a mine and opens its neighbours too (none of them is a mine)
    _, reward, terminated, _, info = env.step(_cell(s, 7, 5))
    s = info["state"]
    assert not terminated and s["revealed"] >= 4 and reward == s["score"] == s["revealed"]
    assert all(s["view"][y][x] >= 0 for x in (6, 7) for y in (4, 5))
    # play safe cells until a mine is proved, then click it: the game is over, the score stays
    for _ in range(40):
        safe, mines = deduce(s["view"])
        if mines:
            break
        _, _, terminated, _, info = env.step(env.reference_action())
        s = info["state"]
        assert not terminated or s["won"]
        if terminated:
            pytest.skip("seed 7 was cleared before a mine was proved")  # never for this seed; kept honest
    assert mines
    x, y = sorted(mines)[0]
    before = s["score"]
    _, reward, terminated, _, info = env.step(_cell(s, x, y))
    assert terminated and info["state"]["over"] and not info["state"]["won"]
    assert reward == 0 and info["score"] == before


def _action_right(state, x, y):
    a = _cell(state, x, y)
    return Action("right_single", dict(a.args))


def test_state_fields_are_present_json_able_and_the_same_for_the_same_seed(env):
    states = []
    for seed in (3, 3):
        _, info = env.reset(seed=seed, options={"game": "mines"})
        _, _, _, _, info = env.step(_cell(info["state"], 2, 2))
        states.append(info["state"])
    a = states[0]
    for key in ("score", "over", "level", "lives", "won", "revealed", "mines", "cols", "rows", "cell", "ox", "oy",
                "flag_mode", "flag_button", "view"):
        assert key in a, key
    assert json.loads(json.dumps(a)) == a
    assert states[0] == states[1]
    assert (a["cols"], a["rows"], a["mines"], a["level"], a["lives"]) == (8, 6, 10, None, None)
    assert GAME.clicks and not GAME.keys
