"""The games behind the sandbox's environment shape, in headless Chromium under a fake clock.

    env = GameEnv()
    obs, info = env.reset(seed=3, options={"game": "snake"})    # or {"family": "games/snake"}
    obs, reward, terminated, truncated, info = env.step(key("up"))

The same contract as trainer.sandbox.env.SandboxEnv and MiniWoBEnv, so the one episode runner
(trainer.rollout.runner) plays it: obs = {"screenshot": HEIGHT x WIDTH x 3 RGB (the game's canvas),
"geometry"}, and with observation="elements" "elements": None and "elements_source" saying why (a
game is one canvas: it has no element list). A step takes an Action or a list of them; after each
action (a `wait` is time alone) the fake clock (clock.js) moves the game GameSpec.step_ms forward,
and nothing moves between steps, however long the policy thinks. reward is the score gained
(with reward_scale="reference", over the game's reference mean in norms.json, as PPO trains);
`terminated` when the game says it is over (or the agent says finished / call_user), `truncated` at
the step budget (GameSpec.max_steps). info: "instruction", "family" ("games/<name>"), "game",
"state" (the page's getState()), "score", "success" (always False: a game is scored, not passed),
"progress" (the score over the game's reference mean, capped at 1; 0 where no norm is known),
"steps", "max_steps", "task_seed", "level", "status", and "action_error" / "error" when something
was wrong. An action the game cannot take is reported in info["action_error"], never raised.

One Chromium per env (trainer.sandbox.games.browser), started on the first reset and reaped by
close(), by garbage collection, and by the watchdog when this process dies. Each reset loads the
game's page afresh (the clock starts at zero, no timer of the last episode survives) and calls
tandemGame.reset(seed). Seeds from trainer.sandbox.task.HELDOUT_START on are the held-out split.
"""
from __future__ import annotations

import random
import time

import gymnasium as gym
import numpy as np

from agent import coords
from agent.actions import canonical_keys, validate
from agent.grammar import format_normalized
from agent.schema import Action, ScreenGeometry
from trainer.sandbox.env import OBSERVATIONS, ElementsSpace, GeometrySpace, NoteSpace, StepLater, to_actions
from trainer.sandbox.games import registry
from trainer.sandbox.games.browser import CDPBrowser, GameBrowserError, key_event
from trainer.sandbox.games.spec import HEIGHT, REWARD_SCALES, WIDTH, GameSpec, click, key
from trainer.sandbox.games.thoughts import thought
from trainer.sandbox.task import HELDOUT_START

CLOCK_JS = (registry.HERE / "clock.js").read_text(encoding="utf-8")
NO_ELEMENTS = "none: a game canvas"
FRAME_MS = 1000 / 60
SCROLL_PIXELS = 100  # one scroll action, as a wheel delta in CSS pixels


class GameActionSpace(gym.Space):
    """The random player of a game: the game's keys (GameSpec.keys) pressed and, where it takes
    clicks, clicks anywhere on its canvas, half and half when it has both."""

    def __init__(self, spec: GameSpec | None = None, seed=None):
        super().__init__(None, None, seed)
        self.spec = spec

    def contains(self, x) -> bool:
        if isinstance(x, (list, tuple)):
            return bool(x) and all(self.contains(a) for a in x)
        return isinstance(x, Action) and validate(x) is None

    def sample(self, mask=None, probability=None) -> Action:
        r = self.np_random
        keys = tuple(self.spec.keys) if self.spec else ("up", "down", "left", "right", "space")
        clicks = self.spec.clicks if self.spec else True
        if clicks and (not keys or r.random() < 0.5):
            w, h = (self.spec.width, self.spec.height) if self.spec else (WIDTH, HEIGHT)
            return click(float(r.uniform(0, w)), float(r.uniform(0, h)), w, h)
        if not keys:
            return Action("wait", {})
        return key(keys[int(r.integers(len(keys)))])


class GameEnv(StepLater, gym.Env):
    """The games of trainer.sandbox.games.registry with schema Actions in, screenshots out."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 5}
    platform = "sandbox"  # the action platform a reply is parsed for: the sandbox's desktop actions

    def __init__(self, games: str | list[str] | None = None, *, max_steps: int | None = None,
                 observation: str = "pixels", coords_space: str = coords.SMART_RESIZE, render_mode: str | None = None,
                 call_timeout: float = 20.0, launch_timeout: float = 30.0, realtime: bool = False,
                 reward_scale: str = "score"):
        names = [games] if isinstance(games, str) else list(games or registry.games())
        if not names:
            raise registry.GameError("no game can be played here: "
                                     + "; ".join(f"{k}: {v}" for k, v in registry.missing().items()))
        self.specs = {registry.game(n).name: registry.game(n) for n in names}  # GameError lists the known ones
        self.games = list(self.specs)
        if max_steps is not None and int(max_steps) < 1:
            raise ValueError(f"max_steps must be at least 1, got {max_steps}")
        if observation not in OBSERVATIONS:
            raise ValueError(f"observation must be one of {OBSERVATIONS}, got {observation!r}")
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"render_mode must be None or 'rgb_array', got {render_mode!r}")
        for name, value in (("call_timeout", call_timeout), ("launch_timeout", launch_timeout)):
            if not float(value) > 0:
                raise ValueError(f"{name} must be > 0 seconds, got {value}")
        coords.model_extent(coords_space, WIDTH, HEIGHT)  # raises on an unknown space
        if reward_scale not in REWARD_SCALES:
            raise ValueError(f"reward_scale must be one of {REWARD_SCALES}, got {reward_scale!r}")
        if reward_scale == "reference":  # every game needs its 100 (norms.json), named here, not mid-run
            normed = registry.norms()
            unnormed = [n for n in self.specs if not float((normed.get(n) or {}).get("reference") or 0) > 0]
            if unnormed:
                raise registry.GameError(f"reward_scale 'reference' needs each game's reference mean in norms.json; "
                                         f"{', '.join(unnormed)} has none (run `python main.py sandbox games calibrate "
                                         f"--games {','.join(unnormed)} --episodes 20`)")
        self.reward_scale = reward_scale
        first = self.specs[self.games[0]]
        self.width, self.height = first.width, first.height
        if any((s.width, s.height) != (self.width, self.height) for s in self.specs.values()):
            raise registry.GameError("the games of one GameEnv must share one canvas size")
        self._max_steps = None if max_steps is None else int(max_steps)
        self.observation, self.coords_space, self.render_mode = observation, coords_space, render_mode
        self.call_timeout, self.launch_timeout = float(call_timeout), float(launch_timeout)
        # realtime: the game's clock follows the wall clock (a step lasts step_ms of real time): what a
        # browser game is without the fake clock, for the benchmark
        self.realtime = bool(realtime)
        self.observation_space = gym.spaces.Dict({
            "screenshot": gym.spaces.Box(0, 255, (self.height, self.width, 3), np.uint8),
            "geometry": GeometrySpace(self.width, self.height),
            **({"elements": ElementsSpace(self.width, self.height), "elements_source": NoteSpace()}
               if observation == "elements" else {}),
        })
        self.action_space = GameActionSpace(first if len(self.specs) == 1 else None)
        self.browser: CDPBrowser | None = None
        self.spec: GameSpec | None = None
        self._obs = None
        self._state: dict = {}
        self._seed, self._steps, self._done = None, 0, False
        self._rng = random.Random(0)
        self._norm = 0.0
        self._wall = 0.0
        self._errors: list[str] = []
        # where a step's time goes (seconds, summed): input, clock advance + getState, screenshot
        self.timing = {"input": 0.0, "advance": 0.0, "screenshot": 0.0}

    @property
    def max_steps(self) -> int:
        if self._max_steps is not None:
            return self._max_steps
        return self.spec.max_steps if self.spec else max(s.max_steps for s in self.specs.values())

    # ------------------------------------------------------------ gym API
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        options = dict(options or {})
        seed = int(self.np_random.integers(2 ** 31)) if seed is None else int(seed)
        name = options.get("game") or options.get("family")
        spec = registry.game(name) if name else self.specs[self.games[seed % len(self.games)]]
        if self.reward_scale == "reference" and not float(registry.norms().get(spec.name, {}).get("reference") or 0) > 0:
            raise registry.GameError(f"reward_scale 'reference': game {spec.name!r} has no reference mean in norms.json")
        for attempt in (1, 2):
            try:
                self._launch()
                self.browser.navigate(registry.page_url(spec), "window.tandemGame && window.__tandemClock",
                                      timeout=self.launch_timeout)
                state = self.browser.evaluate(
                    f"(() => {{ tandemGame.reset({seed}); __tandemClock.advance({FRAME_MS}); "
                    "return tandemGame.getState(); })()", what=f"reset of {registry.PREFIX}{spec.name} (seed {seed})")
                break
            except GameBrowserError as e:  # a hung or crashed browser: a fresh one gets one more try
                self._drop()
                if attempt == 2:
                    raise GameBrowserError(f"reset of {registry.PREFIX}{spec.name} (seed {seed}) failed twice: {e}") from e
        self.spec, self._seed, self._steps, self._done = spec, seed, 0, False
        self._state = self._checked(state)
        self._errors = []
        self._page_errors()  # the last episode's are not this one's
        self._rng = random.Random(f"reference:{spec.name}:{seed}")
        self._norm = float(registry.norms().get(spec.name, {}).get("reference") or 0.0)
        self.action_space = GameActionSpace(spec)
        self._wall = time.monotonic()
        self._observe()
        return self._obs, self._info()

    def step(self, action):
        if self.spec is None:
            raise RuntimeError("call reset() before step()")
        extra: dict = {}
        actions = to_actions(action, extra)
        if self._done:
            extra["error"] = "the episode is over; call reset()"
            actions = []
        before = self._score()
        ended_by_agent, performed = False, 0
        try:
            for a in actions:
                problem = validate(a)
                if problem:
                    extra["action_error"] = problem
                    break
                if a.name in ("finished", "call_user"):
                    ended_by_agent = True
                    break
                try:
                    self._perform(a)
                except ValueError as e:  # something the game cannot take: the agent's mistake
                    extra["action_error"] = f"{a.name}: {e}"
                    break
                self._advance()
                performed += 1
                if self._state.get("over"):
                    break
            if not self._done and not performed and not ended_by_agent:
                self._advance()  # a step whose action did nothing still lets the step's time pass
            if self.browser is not None:
                self._observe()
        except GameBrowserError as e:  # hung (killed), crashed, or the page's getState() threw: the episode ends here
            extra["error"] = str(e)
            self._drop()
            self._done = True
        self._steps += 1
        errors = self._page_errors()
        if errors:  # the game's own bugs (uncaught in its handlers and timers), for whoever writes games
            extra["page_errors"] = errors
        reward = max(0.0, self._score() - before)
        if self.reward_scale == "reference":
            reward /= self._norm
        terminated = bool(self._state.get("over")) or ended_by_agent
        truncated = not terminated and (self.browser is None or self._steps >= self.max_steps)
        self._done = self._done or terminated or truncated
        info = self._info()
        info.update(extra)
        return self._obs, float(reward), bool(terminated), bool(truncated), info

    def render(self):
        if self.render_mode == "rgb_array":
            return self._obs["screenshot"] if self._obs else np.zeros((self.height, self.width, 3), np.uint8)
        return None

    def close(self):
        self._drop()

    def __del__(self):
        try:
            self._drop()
        except Exception:
            pass

    # ------------------------------------------------------------ the reference player
    def reference_action(self) -> Action:
        """The game's reference player's next action for the state now (its RNG seeded by the episode)."""
        if self.spec is None:
            raise RuntimeError("call reset() before reference_action()")
        return self.spec.reference(self._state, self._rng)

    def expert_action(self) -> tuple[str, Action]:
        """(thought, action) of the reference player: what ExpertActor and demonstrations ask for;
        the thought a short sentence from the state (trainer.sandbox.games.thoughts)."""
        a = self.reference_action()
        return thought(self.spec, self._state, a, self.width, self.height), a

    def expert_response(self) -> str:
        thought, action = self.expert_action()
        return format_normalized(thought, [action], self.coords_space, self.width, self.height)

    def expert_click(self) -> tuple[float, float] | None:
        return None

    def labelled_targets(self) -> list:
        return []  # a canvas has no labelled elements

    @property
    def state(self) -> dict:
        """The page's last getState()."""
        return dict(self._state)

    # ------------------------------------------------------------ helpers
    def _launch(self) -> None:
        if self.browser is not None and self.browser.alive:
            return
        self._drop()
        self.browser = CDPBrowser.launch(width=self.width, height=self.height, timeout=self.launch_timeout)
        self.browser.timeout = self.call_timeout
        self.browser.add_init_script(CLOCK_JS)

    def _drop(self) -> None:
        browser, self.browser = getattr(self, "browser", None), None
        if browser is not None:
            browser.close()

    def _page_errors(self) -> list[str]:
        """Uncaught exceptions in the page since the last step, as the clock script saw them: its
        timers' and frames' (it catches those and goes on) and its event handlers', scripts' and
        promises' (a window listener, at once; the same errors' DevTools events, which can come a
        step late, are dropped)."""
        errors, self._errors = self._errors, []
        if self.browser is not None:
            self.browser.page_errors()
        return [e.splitlines()[0] if e else "an exception" for e in errors]

    def _checked(self, state) -> dict:
        if not isinstance(state, dict) or "score" not in state or "over" not in state:
            raise GameBrowserError(f"{self.spec.name if self.spec else 'the game'}: getState() must return an object "
                                   f"with score and over, got {state!r}")
        return state

    def _score(self) -> float:
        return float(self._state.get("score") or 0.0)

    def _px(self, p) -> tuple[float, float]:
        return float(p[0]) * self.width, float(p[1]) * self.height

    def _perform(self, a: Action) -> None:
        """One action as mouse and key events; ValueError for one the game cannot take."""
        t0 = time.perf_counter()
        b, n, args = self.browser, a.name, a.args
        if n == "click":
            b.click(*self._px(args["start_box"]))
        elif n == "left_double":
            b.click(*self._px(args["start_box"]), count=2)
        elif n == "right_single":
            b.click(*self._px(args["start_box"]), button="right")
        elif n == "drag":
            b.drag(*self._px(args["start_box"]), *self._px(args["end_box"]))
        elif n == "scroll":
            x, y = self._px(args.get("start_box", (0.5, 0.5)))
            dx, dy = {"up": (0, -1), "down": (0, 1), "left": (-1, 0), "right": (1, 0)}[args["direction"]]
            b.wheel(x, y, dx * SCROLL_PIXELS, dy * SCROLL_PIXELS)
        elif n == "hotkey":
            b.press(canonical_keys(args["key"]).split())
        elif n == "type":
            events = [key_event("enter") if c == "\n" else key_event(c.lower() if c.isalpha() else c, c.isupper())
                      for c in args["content"]]
            for c, ev in zip(args["content"], events, strict=True):
                b.key_stroke(ev, 8 if c.isalpha() and c.isupper() else 0)
        elif n == "wait":
            pass
        else:
            raise ValueError("not an action a game can take (it takes clicks, drags, scrolls, keys, typing and wait)")
        self.timing["input"] += time.perf_counter() - t0

    def _advance(self) -> None:
        """Move the game's clock step_ms on (in realtime mode: let step_ms of wall time pass, and
        move it by the wall time that did) and read its state."""
        t0 = time.perf_counter()
        ms = float(self.spec.step_ms)
        if self.realtime:
            due = self._wall + ms / 1000
            time.sleep(max(0.0, due - time.monotonic()))
            now = time.monotonic()
            ms, self._wall = (now - self._wall) * 1000, now
        got = self.browser.evaluate(
            f"(() => {{ const c = __tandemClock; c.advance({ms}); const errors = c.errors(); c.clearErrors(); "
            "return {state: tandemGame.getState(), errors}; })()", what=f"a step of {registry.PREFIX}{self.spec.name}")
        self._errors += list(got.get("errors") or [])
        self._state = self._checked(got.get("state"))
        self.timing["advance"] += time.perf_counter() - t0

    def _observe(self) -> None:
        t0 = time.perf_counter()
        shot = self.browser.screenshot(self.width, self.height)
        self.timing["screenshot"] += time.perf_counter() - t0
        self._obs = {"screenshot": shot, "geometry": ScreenGeometry.simple(self.width, self.height)}
        if self.observation == "elements":
            self._obs.update(elements=None, elements_source=NO_ELEMENTS)

    def _info(self) -> dict:
        spec, score = self.spec, self._score()
        over = bool(self._state.get("over"))
        return {"instruction": spec.instruction, "family": registry.PREFIX + spec.name, "game": spec.name,
                "task_seed": self._seed, "split": "heldout" if (self._seed or 0) >= HELDOUT_START else "train",
                "state": dict(self._state), "score": score, "success": False,
                "progress": min(1.0, score / self._norm) if self._norm > 0 else 0.0,
                "status": "over" if over else "running", "level": self._state.get("level"),
                "steps": self._steps, "max_steps": self.max_steps}
