"""Merge (2048-like) through GameEnv: its rules on scripted moves, its reference player against the random one."""
from __future__ import annotations

import json
import random
import time

import numpy as np

from tests.games_helpers import game_env, needs_chromium
from trainer.sandbox.games import merge
from trainer.sandbox.games.env import GameEnv
from trainer.sandbox.games.spec import key

env = game_env("merge")


def play(env, seed: int, policy, steps: int = 100) -> float:
    env.reset(seed=seed, options={"game": "merge"})
    total = 0.0
    for _ in range(steps):
        _, reward, term, trunc, info = env.step(policy())
        total += reward
        if term or trunc:
            break
    assert total == info["score"]
    return total


def test_slide_merges_once_per_tile_from_the_leading_edge():
    board = [[2, 2, 2, 2], [4, 0, 4, 8], [0, 0, 0, 0], [2, 4, 8, 16]]
    after, gained, changed = merge.slide(board, "left")
    assert after == [[4, 4, 0, 0], [8, 8, 0, 0], [0, 0, 0, 0], [2, 4, 8, 16]] and gained == 4 + 4 + 8 and changed
    after, gained, changed = merge.slide(board, "right")
    assert after[0] == [0, 0, 4, 4] and after[1] == [0, 0, 8, 8] and gained == 16
    assert merge.slide([[2, 4, 8, 16]] * 4, "left")[2] is False  # nothing moves: no move


@needs_chromium
def test_state_fields_are_there_and_json(env):
    _, info = env.reset(seed=0)
    state = info["state"]
    assert {"score", "over", "level", "lives", "board", "moves"} <= set(state)
    assert state["score"] == 0 and state["over"] is False and state["level"] is None and state["lives"] is None
    assert sorted(v for row in state["board"] for v in row if v) in ([2, 2], [2, 4], [4, 4])
    assert json.loads(json.dumps(state)) == state


@needs_chromium
def test_moves_follow_the_rules_and_score_the_merges(env):
    env.reset(seed=5)
    for direction in ("left", "down", "right", "up", "left", "down") * 3:
        before = env.state
        expected, gained, changed = merge.slide(before["board"], direction)
        _, reward, term, _, info = env.step(key(direction))
        board = info["state"]["board"]
        new = [(r, c) for r in range(4) for c in range(4) if board[r][c] != expected[r][c]]
        if changed:  # the slide, plus one new 2 or 4 on a cell the slide left empty
            assert reward == gained and info["state"]["moves"] == before["moves"] + 1
            assert len(new) == 1 and expected[new[0][0]][new[0][1]] == 0 and board[new[0][0]][new[0][1]] in (2, 4)
        else:  # a move that changes nothing is no move: no new tile
            assert reward == 0 and board == before["board"] and info["state"]["moves"] == before["moves"]
        if term:
            break


@needs_chromium
def test_the_game_ends_when_no_move_is_left():
    env = GameEnv("merge", max_steps=1000)  # past the budget: this test wants the end
    try:
        env.reset(seed=1)
        over = False
        for i in range(1000):  # cycling three directions fills the board quickly
            _, _, over, _, info = env.step(key(("up", "left", "right")[i % 3]))
            if over:
                break
    finally:
        env.close()
    assert over and info["state"]["over"] and info["status"] == "over"
    board = info["state"]["board"]
    assert all(all(board[r][c] for c in range(4)) for r in range(4))
    assert all(merge.slide(board, d)[2] is False for d in ("up", "down", "left", "right"))


@needs_chromium
def test_reference_beats_random(env):
    ref = [play(env, s, lambda: env.reference_action()) for s in range(3)]
    rng = np.random.default_rng(0)
    rand = [play(env, s, lambda: key(("up", "down", "left", "right")[int(rng.integers(4))])) for s in range(3)]
    assert np.mean(ref) > np.mean(rand) * 1.15, (ref, rand)


def test_reference_is_fast():
    state = {"board": [[2, 4, 8, 16], [32, 64, 128, 256], [0, 2, 0, 4], [8, 0, 2, 0]]}
    t0 = time.perf_counter()
    for _ in range(50):
        merge.reference(state, random.Random(0))
    assert (time.perf_counter() - t0) / 50 < 0.005
