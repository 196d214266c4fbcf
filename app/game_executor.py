"""A browser game (trainer.sandbox.games) as an executor the app can drive: a GameEnv in its own process.

The same child process and pipe protocol as app.sandbox_executor (the game's Chromium belongs to
the child: when the app closes the executor, or dies, the child ends and the browser's watchdog
kills it). Between steps the game's fake clock stands still, so the screenshot a supervisor
looks at is the game as it is, however long they take; each step performs the action and moves
the game its configured time on (GameSpec.step_ms). Importing this module imports neither Qt
nor the browser.
"""
from __future__ import annotations

from dataclasses import dataclass

from agent.executors.base import ExecutionError
from agent.schema import Outcome
from app.sandbox_executor import SandboxProcessExecutor
from trainer.sandbox.games import registry


@dataclass
class GameOutcome(Outcome):
    """A game is scored, not passed (success stays None): its score, normalized, and in words."""

    text: str = ""


def game_choices() -> tuple[list[tuple[str, str]], str | None]:
    """([(name, title)] of the games this checkout has, why none can be played here or None).

    Why: the registry's reasons when there is no game, else the browser's when Chromium is missing."""
    try:
        from trainer.sandbox.games import registry  # lazy: optional: the code runs without it
        from trainer.sandbox.games.browser import (  # lazy: optional: the code runs without it
            GameBrowserError,
            find_chromium,
        )
    except Exception as e:  # the trainer may not be installed beside the app
        return [], f"the games are not installed here ({type(e).__name__}: {e})"
    found = [(name, spec.title) for name, spec in registry.games().items()]
    if not found:
        return [], "no game can be played here: " + "; ".join(f"{k}: {v}" for k, v in registry.missing().items())
    try:
        find_chromium()
    except GameBrowserError as e:
        return found, f"The games need Chromium: {e}."
    return found, None


def run_steps(executor, default: int) -> int:
    """The step limit of a run on `executor`: the page's default, or the executor's own budget where
    it has a longer one (a game's 100 steps), so the loop does not stop a game half way."""
    return max(default, int(getattr(executor, "step_budget", 0) or 0))


def game_verdict(executor) -> str:
    """A game's score at the end of a run ('' for any other executor). A game is scored, not passed,
    so the episode keeps no verdict and the pages ask the executor (it answers after close())."""
    return executor.outcome().text if isinstance(executor, GameProcessExecutor) else ""


class GameProcessExecutor(SandboxProcessExecutor):
    """reset/step/observe/outcome/expert_action over one game (by registry name) in a child process.

    The game's step budget (GameSpec.max_steps unless `max_steps`) ends the episode: a step that
    reaches it, or that ends the game, says terminated, so the agent loop stops there."""

    def __init__(self, game: str, seed: int = 0, *, max_steps: int | None = None, timeout: float = 60.0,
                 stop_event=None):
        try:
            self.spec = registry.game(game)
        except registry.GameError as e:
            raise ExecutionError(str(e)) from None
        super().__init__(registry.PREFIX + self.spec.name, seed, timeout=timeout, stop_event=stop_event)
        self.game = self.spec.name
        self.max_steps = int(max_steps) if max_steps is not None else self.spec.max_steps
        self.step_budget = self.max_steps  # the pages give a run this many steps (run_steps), not their default
        self.kw = {"env": "games", "games": self.game, "max_steps": self.max_steps}
        self.norm = float(registry.norms().get(self.game, {}).get("reference") or 0.0)
        self.over = False  # the game said it is over
        self.out_of_steps = False  # the step budget ran out first
        self.failure: str | None = None  # why the game stopped when its browser failed

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        opts = {**(options or {}), "game": self.game}
        opts.pop("family", None)
        frame, info = super().reset(seed=seed, options=opts)
        self.over = self.out_of_steps = False
        self.failure = None
        return frame, info

    def step(self, action):
        if self.done and action.name in ("finished", "call_user"):
            return self.observe(), 0.0, True, False, dict(self.info)
        pixels, geometry, reward, term, trunc, info, elements = self._call("step", action)
        self.info, self.last_reward = info, reward
        self.over = self.over or bool(info.get("state", {}).get("over"))
        self.out_of_steps = self.out_of_steps or (bool(trunc) and not info.get("error"))
        self.done = self.done or bool(term or trunc)
        if info.get("error") and self.done:  # the browser failed (or the game had ended): the run ends here
            self.failure = info["error"]
        elif info.get("action_error") or info.get("error"):  # the agent's mistake: the loop tells the policy
            raise ExecutionError(f"the game could not do {action.name}: {info.get('action_error') or info['error']}")
        return self._frame(pixels, geometry, elements), reward, bool(term or trunc), bool(trunc), info

    @property
    def score(self) -> float:
        return float(self.info.get("score") or 0.0)

    def normalized(self) -> float | None:
        """The score on the report's scale: 100 is the reference player's mean at the step budget."""
        return 100.0 * self.score / self.norm if self.norm > 0 else None

    def _score_text(self) -> str:
        n = self.normalized()
        return f"score {self.score:g}" + (f" (normalized {n:.0f})" if n is not None else "")

    def status(self) -> str:
        """One line for the page's status: the game, its score, its level, the steps taken."""
        if not self.info:
            return f"{self.spec.title}: starting"
        level = self.info.get("level")
        return (f"{self.spec.title}: {self._score_text()}" + (f", level {level}" if level is not None else "")
                + f"; step {self.info.get('steps', 0)} of {self.max_steps}")

    def outcome(self) -> GameOutcome:
        """Where the game stands: over (and its score), the step budget spent, or still going.
        Read from the last step's report, so it can be asked after close()."""
        n = self.normalized()
        reward = round(n / 100, 4) if n is not None else None  # the reference player's mean is 1
        if self.over:
            text = f"Game over: {self._score_text()}."
        elif self.failure:
            text = f"The game stopped at {self._score_text()}: {self.failure}."
        elif self.out_of_steps:
            text = f"The game's budget of {self.max_steps} steps ran out: {self._score_text()}."
        else:
            text = f"The game was left running at {self._score_text()}."
        return GameOutcome(success=None, reward=reward, source="game", text=text)

    def browser_ids(self) -> tuple[int, str] | None:
        """(process group, profile directory) of the game's Chromium, None before it starts: what
        the reaping checks (trainer.sandbox.games.browser.chromium_processes / tagged_processes) take."""
        got = self._call("browser")
        return (int(got[0]), got[1]) if got else None
