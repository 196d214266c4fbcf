"""What a game is: one self-contained page written by this project and its Python side.

The page (trainer/sandbox/games/pages/<name>.html, inline JS, no network) draws the game on one
canvas of `width` x `height` CSS pixels at the page's top-left corner (body margin 0), so a
screenshot pixel is a CSS pixel, and exposes

    window.tandemGame = {
      reset(seed),   // a fresh game from the seed; all randomness from a seeded PRNG, never Math.random
      getState(),    // {score, over, level, lives, ...}: JSON-able; score never decreases within a game;
                     // over is true once the game has ended; level and lives are null where the game has none;
                     // plus the fields the reference player reads (board, positions, ...)
    }

It reads input from real mouse and keyboard events on the page (the environment dispatches them
through the DevTools protocol) and keeps time only through Date, performance.now, setTimeout /
setInterval and requestAnimationFrame, which the fake clock replaces (trainer.sandbox.games.clock),
so that the same seed and actions give the same frames.

The Python side (trainer/sandbox/games/<name>.py) defines GAME = GameSpec(...); the registry
(trainer.sandbox.games.registry) lists them. A reference player reads getState() and returns the
next action in the agent's action space (agent.schema.Action with pixel points converted by the
environment: see `point`), so that its demonstrations are ordinary trajectories.
"""
from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from agent.schema import Action

# the default model's screen: frames at this size reach it pixel-exact (no resampling)
WIDTH, HEIGHT = 336, 252
STEP_BUDGET = 100  # the report's normalization: a reference player's mean score at 100 steps is 100
# GameEnv's reward of a step: the score gained ("score"), or that over the game's reference mean in
# norms.json ("reference": a reference player's episode earns 1 on average, whatever the game's raw scale)
REWARD_SCALES = ("score", "reference")


def point(x: float, y: float, width: int = WIDTH, height: int = HEIGHT) -> tuple[float, float]:
    """A pixel position on the game's canvas as the normalized point a click Action carries."""
    return (min(max(x / width, 0.0), 1.0), min(max(y / height, 0.0), 1.0))


def click(x: float, y: float, width: int = WIDTH, height: int = HEIGHT) -> Action:
    return Action("click", {"start_box": point(x, y, width, height)})


def key(name: str) -> Action:
    """A key press in the UI-TARS spelling: 'up', 'down', 'left', 'right', 'space', 'enter', 'a'."""
    return Action("hotkey", {"key": name})


# reference(state, rng) -> the next action; rng is the player's own seeded RNG (ties, exploration)
ReferencePlayer = Callable[[dict, random.Random], Action]


@dataclass(frozen=True)
class GameSpec:
    name: str  # short id: the page is pages/<name>.html, the CLI's --games takes it
    title: str
    kind: str  # e.g. "tile merging", "falling blocks", "timing: dodging"
    instruction: str  # what the model is told, e.g. "Play 2048: slide tiles with the arrow keys ..."
    reference: ReferencePlayer
    reads: str  # what the score/verifier reads from getState(), for the README's table
    keys: tuple[str, ...] = ()  # keys the game reacts to (the random player presses these)
    clicks: bool = False  # whether the game reacts to clicks (the random player clicks the canvas)
    step_ms: int = 200  # game time the fake clock advances after each action
    width: int = WIDTH
    height: int = HEIGHT
    max_steps: int = STEP_BUDGET
    extra: dict = field(default_factory=dict)

    @property
    def page(self) -> str:
        return f"{self.name}.html"
