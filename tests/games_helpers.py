"""What the per-game tests share: whether Chromium is here, a module-scoped GameEnv of one game,
a click on a grid cell, and an episode played to its end by the reference or the random player."""
from __future__ import annotations

import pytest

from trainer.sandbox.games.browser import GameBrowserError, find_chromium
from trainer.sandbox.games.env import GameEnv
from trainer.sandbox.games.spec import click

try:
    find_chromium()
    HAVE_CHROMIUM = True
except GameBrowserError:
    HAVE_CHROMIUM = False
needs_chromium = pytest.mark.skipif(not HAVE_CHROMIUM, reason="chromium is not installed")


def game_env(name: str):
    """A module-scoped fixture: one GameEnv of game `name` (skipped without Chromium), closed after."""

    @pytest.fixture(scope="module")
    def env():
        if not HAVE_CHROMIUM:
            pytest.skip("chromium is not installed")
        e = GameEnv(name)
        yield e
        e.close()

    return env


def cell_click(state: dict, x: int, y: int):
    """A click on grid cell (x, y) of a game whose state gives its origin (ox, oy) and cell size."""
    c = state["cell"]
    return click(state["ox"] + (x + 0.5) * c, state["oy"] + (y + 0.5) * c)


def play_to_end(env, game: str, seed: int, policy: str, on_step=None) -> dict:
    """An episode of `game` by the reference player or a random action each step, to its end; the
    score never goes down. on_step(reward, info) sees every step. Returns the last info."""
    _, info = env.reset(seed=seed, options={"game": game})
    env.action_space.seed(seed)
    scores = [info["score"]]
    done = False
    while not done:
        action = env.reference_action() if policy == "reference" else env.action_space.sample()
        _, reward, terminated, truncated, info = env.step(action)
        if on_step is not None:
            on_step(reward, info)
        scores.append(info["score"])
        done = terminated or truncated
    assert scores == sorted(scores), "the score went down"
    return info
