"""Memory (matching pairs) through GameEnv: its rules on scripted clicks, its reference player (with a
memory of its own) against the random one."""
from __future__ import annotations

import json
import random
import time

import numpy as np

from agent.schema import Action
from tests.games_helpers import game_env, needs_chromium
from trainer.sandbox.games import memory
from trainer.sandbox.games.env import GameEnv
from trainer.sandbox.games.spec import click

WAIT = Action("wait", {})
BOARDS = [(4, 4), (4, 5), (4, 6), (5, 6)]


env = game_env("memory")


def tap(env, i: int):
    c = env.state["cards"][i]
    return env.step(click(c["x"] + c["w"] / 2, c["y"] + c["h"] / 2))


def faces_up(state: dict) -> dict[int, int]:
    return {i: c["face"] for i, c in enumerate(state["cards"]) if c["face"] is not None and not c["matched"]}


def play(env, seed: int, policy, steps: int = 100) -> float:
    env.reset(seed=seed, options={"game": "memory"})
    total = 0.0
    for _ in range(steps):
        _, reward, term, trunc, info = env.step(policy())
        total += reward
        if term or trunc:
            break
    assert total == info["score"]
    return total


@needs_chromium
def test_state_fields_are_there_and_json(env):
    _, info = env.reset(seed=0)
    state = info["state"]
    assert {"score", "over", "level", "lives", "cards", "rows", "cols", "flips", "pending", "seed",
            "pairsFound", "pairsTotal"} <= set(state)
    assert state["score"] == 0 and state["over"] is False and state["level"] == 1 and state["lives"] is None
    assert (state["rows"], state["cols"], state["pairsTotal"]) == (4, 4, 8) and len(state["cards"]) == 16
    assert all(c["face"] is None and not c["matched"] and c["w"] >= 40 and c["h"] >= 40 for c in state["cards"])
    assert json.loads(json.dumps(state)) == state


@needs_chromium
def test_a_mismatch_turns_back_after_its_delay_and_a_match_stays_and_scores(env):
    for seed in range(20):  # a seed whose cards 0 and 1 differ
        if len(set(tap_two(env, seed).values())) == 2:
            break
    state = env.state
    assert state["pending"] and set(faces_up(state)) == {0, 1} and state["score"] == 0 and state["flips"] == 2
    for _ in range(2):  # 600 ms of the 800 ms delay: still face up, however long the test thinks
        time.sleep(0.2)
        _, _, _, _, info = env.step(WAIT)
        assert set(faces_up(info["state"])) == {0, 1}
    for _ in range(2):
        _, _, _, _, info = env.step(WAIT)
    assert faces_up(info["state"]) == {} and not info["state"]["pending"]
    # learn every face by turning the cards over two by two, then click a known pair
    seen = learn_board(env)
    a, b = next((i, j) for i in seen for j in seen if i < j and seen[i] == seen[j]
                and not env.state["cards"][i]["matched"])
    flips = env.state["flips"]
    _, r1, _, _, _ = tap(env, a)
    _, r2, _, _, info = tap(env, b)
    assert r1 == 0 and r2 == 10 and info["state"]["cards"][a]["matched"] and info["state"]["cards"][b]["matched"]
    assert info["state"]["flips"] == flips + 2 and info["state"]["pairsFound"] >= 1
    for _ in range(5):  # a matched pair stays up
        _, _, _, _, info = env.step(WAIT)
    assert info["state"]["cards"][a]["face"] == seen[a] and info["state"]["cards"][b]["face"] == seen[b]
    _, reward, _, _, info = tap(env, a)  # clicking a matched card does nothing
    assert reward == 0 and info["state"]["flips"] == flips + 2


def tap_two(env, seed: int) -> dict[int, int]:
    env.reset(seed=seed, options={"game": "memory"})
    tap(env, 0)
    _, _, _, _, info = tap(env, 1)
    return {i: c["face"] for i, c in enumerate(info["state"]["cards"][:2])}


def learn_board(env) -> dict[int, int]:
    """Turn every card over (two at a time) and return index -> face."""
    seen: dict[int, int] = {}
    for i in range(len(env.state["cards"])):
        if env.state["cards"][i]["matched"]:
            seen[i] = env.state["cards"][i]["face"]
            continue
        _, _, _, _, info = tap(env, i)
        seen[i] = info["state"]["cards"][i]["face"]
        assert seen[i] is not None
    return seen


@needs_chromium
def test_boards_grow_by_level_and_the_game_ends_when_all_are_cleared():
    env = GameEnv("memory", max_steps=1000)  # past the budget: this test wants the end
    try:
        env.reset(seed=4)
        term = False
        for level, (rows, cols) in enumerate(BOARDS, start=1):
            state = env.state
            assert state["level"] == level and (state["rows"], state["cols"]) == (rows, cols)
            assert state["pairsTotal"] == rows * cols // 2
            score0 = state["score"]
            seen = learn_board(env)
            assert sorted(seen.values()) == sorted(list(range(rows * cols // 2)) * 2)  # every face twice
            for face in range(rows * cols // 2):
                if env.state["level"] != level or env.state["over"]:
                    break
                a, b = [i for i, f in seen.items() if f == face]
                if env.state["cards"][a]["matched"]:
                    continue
                tap(env, a)
                _, _, term, _, info = tap(env, b)
            assert env.state["score"] == score0 + 10 * rows * cols // 2 + 50  # every pair, and the board's bonus
        assert term and env.state["over"] and info["status"] == "over"
        assert env.state["score"] == sum(10 * r * c // 2 + 50 for r, c in BOARDS)
    finally:
        env.close()


@needs_chromium
def test_reference_beats_random(env):
    ref = [play(env, s, lambda: env.reference_action()) for s in range(3)]
    env.action_space.seed(0)
    rand = [play(env, s, lambda: env.action_space.sample()) for s in range(3)]
    assert np.mean(ref) > 3 * max(np.mean(rand), 10), (ref, rand)


def fake_state(seed: int, flips: int, faces: list, level: int = 1, pending: bool = False) -> dict:
    cards = [{"x": 10 + 50 * (i % 4), "y": 30 + 50 * (i // 4), "w": 46, "h": 46, "face": f, "matched": False}
             for i, f in enumerate(faces)]
    return {"seed": seed, "game": 1, "level": level, "flips": flips, "pending": pending, "cards": cards}


def clicked(action) -> int:
    x, y = action.args["start_box"][0] * 336, action.args["start_box"][1] * 252
    return int((x - 10) // 50) + 4 * int((y - 30) // 50)


def test_the_player_remembers_faces_and_forgets_them_on_a_new_game():
    player, rng = memory.MemoryPlayer(), random.Random(0)
    hidden = [None] * 16
    # it saw card 3 show face 5 and card 9 show face 5 (a pending mismatch with others, now face down)
    player(fake_state(7, 1, hidden[:3] + [5] + hidden[4:]), rng)
    player(fake_state(7, 3, hidden[:9] + [5] + hidden[10:]), rng)
    assert clicked(player(fake_state(7, 4, hidden), rng)) in (3, 9)  # a known pair first
    # with card 3 face up, the twin it remembers
    assert clicked(player(fake_state(7, 5, hidden[:3] + [5] + hidden[4:]), rng)) == 9
    # a new game of the same seed (fewer flips): the memory is gone, it picks a card it has not seen
    picks = {clicked(player(fake_state(7, 0, hidden), random.Random(s))) for s in range(30)}
    assert len(picks) > 5
    # another seed's game does not disturb this one's memory
    player(fake_state(7, 1, hidden[:3] + [5] + hidden[4:]), rng)
    player(fake_state(7, 3, hidden[:9] + [5] + hidden[10:]), rng)
    player(fake_state(8, 2, hidden), rng)
    assert clicked(player(fake_state(7, 4, hidden), rng)) in (3, 9)


def test_reference_is_fast():
    player, rng = memory.MemoryPlayer(), random.Random(0)
    faces = [None] * 30
    faces[4] = 2
    state = fake_state(1, 10, faces, level=4)
    t0 = time.perf_counter()
    for _ in range(50):
        player(state, rng)
    assert (time.perf_counter() - t0) / 50 < 0.005
