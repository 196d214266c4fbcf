"""Levels (Crates, a push-box puzzle) through GameEnv: walking and pushing as its rules say, every
generated level solvable and unlocking the next, and its reference player against the random one."""
from __future__ import annotations

import json
import random
import time

import numpy as np
import pytest

from tests.games_helpers import game_env, needs_chromium
from trainer.sandbox.games import levels
from trainer.sandbox.games.env import GameEnv
from trainer.sandbox.games.spec import key

N_LEVELS = 10


env = game_env("levels")


def play(env, seed: int, policy, steps: int = 100) -> float:
    env.reset(seed=seed, options={"game": "levels"})
    total = 0.0
    for _ in range(steps):
        _, reward, term, trunc, info = env.step(policy())
        assert reward >= 0
        total += reward
        if term or trunc:
            break
    assert total == info["score"]
    return total


def cells(state: dict, chars: str) -> set[tuple[int, int]]:
    return {(x, y) for y, row in enumerate(state["grid"]) for x, ch in enumerate(row) if ch in chars}


@needs_chromium
def test_state_fields_are_there_and_json(env):
    _, info = env.reset(seed=0)
    state = info["state"]
    assert {"score", "over", "level", "lives", "grid", "player", "boxes", "goals", "placed", "moves",
            "levels"} <= set(state)
    assert state["score"] == 0 and state["over"] is False and state["level"] == 1 and state["lives"] is None
    assert state["levels"] == N_LEVELS
    # the grid and the lists say the same
    assert cells(state, "$*") == {tuple(b) for b in state["boxes"]}
    assert cells(state, ".*+") == {tuple(g) for g in state["goals"]}
    assert cells(state, "@+") == {tuple(state["player"])}
    assert len(state["boxes"]) == len(state["goals"]) == 1 and state["placed"] == 0
    assert json.loads(json.dumps(state)) == state


@needs_chromium
def test_walls_stop_the_player_crates_are_pushed_and_r_restarts(env):
    env.reset(seed=0)
    start = env.state
    walls = cells(start, "#")
    moved = False
    for name, (dx, dy) in levels.DIRS.items():  # every direction does what the grid says it should
        state = env.state
        px, py = state["player"]
        ahead, beyond = (px + dx, py + dy), (px + 2 * dx, py + 2 * dy)
        crates = {tuple(b) for b in state["boxes"]}
        _, reward, _, _, info = env.step(key(name))
        after = info["state"]
        if ahead in walls or (ahead in crates and (beyond in walls or beyond in crates)):
            assert after["player"] == [px, py] and after["moves"] == state["moves"]
        else:
            assert after["player"] == list(ahead) and after["moves"] == state["moves"] + 1
            if ahead in crates:
                assert {tuple(b) for b in after["boxes"]} == crates - {ahead} | {beyond}
            moved = True
    assert moved
    _, reward, _, _, info = env.step(key("r"))
    assert reward == 0 and info["state"]["grid"] == start["grid"] and info["state"]["restarts"] == 1


@needs_chromium
def test_every_level_is_solvable_unlocks_the_next_and_the_last_ends_the_game():
    env = GameEnv("levels", max_steps=100)
    try:
        for seed in (0, 1, 2):
            env.reset(seed=seed)
            expected = 0
            for level in range(1, N_LEVELS + 1):
                state = env.state
                assert state["level"] == level and not state["over"]
                n = len(state["boxes"])
                assert n == {1: 1, 2: 1, 3: 2, 4: 2, 5: 2, 6: 3, 7: 3, 8: 3, 9: 4, 10: 4}[level]
                assert state["placed"] < n  # not solved to begin with
                keys = levels.solve(state["grid"])
                assert keys, f"seed {seed} level {level} found no solution:\n" + "\n".join(state["grid"])
                _, reward, term, _, info = env.step([key(k) for k in keys])  # one step: the whole solution
                expected += 100 + 10 * (n - state["placed"])  # the level, and each crate placed
                assert reward == 100 + 10 * (n - state["placed"]) and info["score"] == expected
                assert info["state"]["solved"] == level
            assert term and info["state"]["over"] and info["status"] == "over" and info["state"]["level"] == N_LEVELS
    finally:
        env.close()


@needs_chromium
def test_the_same_seed_gives_the_same_levels_and_another_seed_others(env):
    grids = [env.reset(seed=s)[1]["state"]["grid"] for s in (5, 5, 6)]
    assert grids[0] == grids[1] and grids[0] != grids[2]


@needs_chromium
def test_reference_beats_random(env):
    ref = [play(env, s, lambda: env.reference_action()) for s in range(3)]
    env.action_space.seed(0)
    rand = [play(env, s, lambda: env.action_space.sample()) for s in range(3)]
    assert min(ref) >= 300 and np.mean(ref) > 3 * max(np.mean(rand), 50), (ref, rand)


def test_solve_pushes_around_and_finds_dead_ends():
    grid = ["#######",
            "#@ $ .#",
            "#     #",
            "#######"]
    assert levels.solve(grid) == ["right", "right", "right"]
    grid = ["######",
            "#@  .#",
            "# $  #",
            "#    #",
            "######"]
    keys = levels.solve(grid)
    state = levels._replay(grid, keys)
    assert keys and len(state) == len(keys)
    assert levels.solve(["#####", "#$ @#", "#  .#", "#####"]) is None  # a crate in a corner never leaves
    with pytest.raises(ValueError, match="no player"):
        levels.solve(["#####", "#$ .#", "#####"])


def test_the_player_caches_its_plan_and_is_fast_after_the_first_step():
    player = levels.CratesPlayer()
    grid = ["#########",
            "#@  #   #",
            "# $   $ #",
            "#  ##   #",
            "#.   . ##",
            "#########"]
    keys = levels.solve(grid)
    first = player({"grid": grid}, random.Random(0))
    assert first.args["key"] == keys[0]
    t0 = time.perf_counter()
    played = [player({"grid": g}, random.Random(0)).args["key"] for g in levels._replay(grid, keys)]
    assert (time.perf_counter() - t0) / len(keys) < 0.005
    assert played == keys
