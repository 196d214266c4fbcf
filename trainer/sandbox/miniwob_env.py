"""MiniWoB++ behind the sandbox's environment shape: a real benchmark beside our own tasks.

    env = MiniWoBEnv(["click-test", "click-button"])
    obs, info = env.reset(seed=0, options={"family": "miniwob/click-button"})
    obs, reward, terminated, truncated, info = env.step(Action("click", {"start_box": (0.4, 0.6)}))

The same contract as trainer.sandbox.env.SandboxEnv, so the one episode runner
(trainer.rollout.runner) plays it: obs = {"screenshot": 210x160x3 RGB (MiniWoB's task area), "geometry"}
and, with observation="elements" (the default), "elements": the page's element list read from its
DOM (agent.elements.Element, screenshot pixels; trainer.sandbox.miniwob_elements) and
"elements_source": "dom", or why the list is None (the scan ran past `elements_budget` seconds,
the page's script failed); the episode goes on either way. A step takes an Action or a list of them
(a model's reply parsed where it arrives, never by the env); reward is 1 on the step
MiniWoB reports full success (raw reward 1), else 0; info has "instruction", "family"
("miniwob/<task>"), "success", "progress" (MiniWoB's raw reward, from 0, for partial credit),
"status", "steps", "max_steps", and "action_error" / "error" when something was
wrong. `terminated` is a real end (MiniWoB's verdict, or finished / call_user); `truncated` is a
time limit: the step limit, or MiniWoB's own episode clock ("timed out"), which `episode_seconds`
lengthens (10 s in most tasks: too short for a model that thinks for seconds a step).

An action MiniWoB++ cannot perform (a right click, a sideways scroll, a key outside its allowed
list) is the agent's mistake, reported in info["action_error"] and never raised. Hotkeys go
through miniwob's own allowed-key list (`ALLOWED_KEYS`: its default list and a few harmless keys
more). A reset or step that hangs is cut after `reset_timeout` / `step_timeout` seconds and its
Chromium killed (trainer.sandbox.miniwob_browser); a reset is tried once more on a fresh browser.

Needs the `miniwob` package and Chromium with chromedriver; `available()` says what is missing.
Chromium starts on the first reset, not when the env is built.
"""
from __future__ import annotations

import difflib

import gymnasium as gym
import numpy as np

from agent import coords
from agent.actions import KEY_ALIASES, validate
from agent.grammar import format_normalized
from agent.schema import Action, ScreenGeometry
from trainer.sandbox.env import (
    OBSERVATIONS,
    ActionSpace,
    ElementsSpace,
    GeometrySpace,
    NoteSpace,
    StepLater,
    to_actions,
)
from trainer.sandbox.miniwob_browser import (
    TASK_HEIGHT,
    TASK_WIDTH,
    Deadline,
    MiniWoBError,
    MiniWoBTimeout,
    check_versions,
    chromium_paths,
    make_environment,
)
from trainer.sandbox.miniwob_elements import SOURCE, read_elements, screen_scale
from trainer.sandbox.miniwob_oracle import element_box, oracle_action

PREFIX = "miniwob/"

# WebDriver's key names (miniwob.constants.WEBDRIVER_SPECIAL_KEYS) for the key words UI-TARS writes
KEY_NAMES = {"enter": "<Enter>", "tab": "<Tab>", "space": "<Space>", "backspace": "<Backspace>", "delete": "<Delete>",
             "esc": "<Escape>", "home": "<Home>", "end": "<End>", "pageup": "<PageUp>", "pagedown": "<PageDown>",
             "up": "<ArrowUp>", "down": "<ArrowDown>", "left": "<ArrowLeft>", "right": "<ArrowRight>",
             "insert": "<Insert>", "plus": "+", "minus": "-", **{f"f{i}": f"<F{i}>" for i in range(1, 13)}}
MODIFIERS = {"alt": "A-", "ctrl": "C-", "cmd": "M-", "win": "M-", "shift": "S-"}  # after agent.actions.KEY_ALIASES
MODIFIER_ORDER = ("A-", "C-", "M-", "S-")  # the order of miniwob.constants.ALL_POSSIBLE_KEYS
# besides miniwob's DEFAULT_ALLOWED_KEYS (Humphreys et al. 2022): harmless keys an agent needs in forms
EXTRA_KEYS = ("<Escape>", "<Home>", "<End>", "S-<Tab>")


def allowed_keys() -> tuple[str, ...]:
    """The keys the adapter lets MiniWoB++ press, in the order of its PRESS_KEY index."""
    from miniwob.constants import DEFAULT_ALLOWED_KEYS

    return tuple(DEFAULT_ALLOWED_KEYS) + tuple(k for k in EXTRA_KEYS if k not in DEFAULT_ALLOWED_KEYS)


def miniwob_key(combo: str) -> str:
    """A UI-TARS hotkey in MiniWoB/WebDriver spelling: 'ctrl a' -> 'C-a', 'enter' -> '<Enter>',
    'up' -> '<ArrowUp>', 'shift tab' -> 'S-<Tab>', 'shift a' -> 'A', 'Z' -> 'Z'. A single
    character keeps its case. Raises ValueError naming a key WebDriver has no name for."""
    words = str(combo).replace("+", " ").split()
    mods, keys, i = [], [], 0
    while i < len(words):
        word = words[i]
        low = word.lower()
        if low == "page" and i + 1 < len(words) and words[i + 1].lower() in ("up", "down"):
            low, i = "page" + words[i + 1].lower(), i + 1
        i += 1
        if len(low) == 1:
            keys.append(word)
            continue
        low = KEY_ALIASES.get(low, low)
        if low in MODIFIERS:
            mods.append(MODIFIERS[low])
        elif low in KEY_NAMES:
            keys.append(KEY_NAMES[low])
        else:
            raise ValueError(f"hotkey {combo!r}: MiniWoB++ (WebDriver) has no key {word!r}")
    if len(keys) != 1:
        raise ValueError(f"hotkey {combo!r} must name exactly one non-modifier key, got {len(keys)}")
    key = keys[0]
    if len(key) == 1 and key.isalpha():
        if mods == ["S-"]:  # shift a = A: MiniWoB presses shift itself for a capital
            key, mods = key.upper(), []
        elif mods:  # ctrl A = ctrl a: the letter's key
            key = key.lower()
    return "".join(sorted(set(mods), key=MODIFIER_ORDER.index)) + key


def key_index(combo: str, keys: tuple[str, ...] | None = None) -> int:
    """The PRESS_KEY index of a UI-TARS hotkey in `keys` (default `allowed_keys()`); ValueError
    naming the key when MiniWoB++ cannot press it."""
    keys = allowed_keys() if keys is None else keys
    key = miniwob_key(combo)
    if key not in keys:
        named = ", ".join(k for k in keys if k.startswith("<") or "-" in k[:2])
        raise ValueError(f"MiniWoB++ cannot press {combo!r} (as {key!r}): it is not among its allowed keys "
                         f"(single letters, digits and punctuation, and {named})")
    return keys.index(key)


def task_names() -> list[str]:
    """The MiniWoB++ tasks the installed package registers (its miniwob.envs.miniwob_envs; the
    FlightWoB sites, with their own screen size and web server, aside)."""
    from miniwob.environment import MiniWoBEnvironment
    from miniwob.envs import miniwob_envs

    return sorted(c.subdomain for c in vars(miniwob_envs).values()
                  if isinstance(c, type) and issubclass(c, MiniWoBEnvironment) and c.subdomain)


def task_of(name: str) -> str:
    """'miniwob/click-test' or 'click-test' -> 'click-test'; ValueError for a task the package lacks."""
    task = name[len(PREFIX):] if name.startswith(PREFIX) else name
    known = task_names()
    if task not in known:
        near = difflib.get_close_matches(task, known, n=3)
        hint = f"; did you mean {', '.join(near)}?" if near else f" (it has {len(known)}, e.g. click-test, click-button)"
        raise ValueError(f"unknown MiniWoB++ task {name!r}{hint}")
    return task


def available() -> str | None:
    """None when MiniWoB++ can run here, else what is missing."""
    try:
        import miniwob  # noqa: F401
    except ImportError:
        return ("the `miniwob` package is not installed (pip install -r requirements-test.txt, or "
                "pip install miniwob==1.1.0 selenium==4.51.0)")
    try:
        binary, driver = chromium_paths()
    except MiniWoBError as e:
        return str(e)
    return check_versions(binary, driver)


# a text caret blinks whether or not the action did anything (about 1x14 px on a 160x210 page): fewer
# changed pixels than this are not a change the action made
CARET_PIXELS = 40


def _changed(before, after) -> bool:
    """Did the page's look change beyond a blinking caret?"""
    if before.shape != after.shape:
        return True
    return int(np.count_nonzero(np.any(before != after, axis=-1))) > CARET_PIXELS


class MiniWoBEnv(StepLater, gym.Env):
    """MiniWoB++ tasks (e.g. 'click-button') with schema Actions in, screenshots out."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 4}
    platform = "sandbox"  # the action platform a reply is parsed for: the sandbox's desktop actions

    def __init__(self, tasks: str | list[str] | None = None, *, max_steps: int = 10,
                 episode_seconds: float | None = None, reset_timeout: float = 30.0, step_timeout: float = 30.0, launch_timeout: float = 60.0,
                 coords_space: str = coords.SMART_RESIZE, render_mode: str | None = None,
                 observation: str = "elements", elements_budget: float = 1.0):
        missing = available()
        if missing:
            raise MiniWoBError(f"MiniWoB++ is not available: {missing}")
        names = [tasks] if isinstance(tasks, str) else list(tasks or ["click-test"])
        if not names:
            raise ValueError("MiniWoBEnv needs at least one task")
        self.tasks = [task_of(t) for t in names]
        if int(max_steps) < 1:
            raise ValueError(f"max_steps must be at least 1, got {max_steps}")
        if episode_seconds is not None and not float(episode_seconds) > 0:
            raise ValueError(f"episode_seconds must be > 0 (or None for each task's own limit), got {episode_seconds}")
        for name, value in (("reset_timeout", reset_timeout), ("step_timeout", step_timeout),
                            ("launch_timeout", launch_timeout)):
            if not float(value) > 0:
                raise ValueError(f"{name} must be > 0 seconds, got {value}")
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"render_mode must be None or 'rgb_array', got {render_mode!r}")
        if observation not in OBSERVATIONS:
            raise ValueError(f"observation must be one of {OBSERVATIONS}, got {observation!r}")
        if not float(elements_budget) > 0:
            raise ValueError(f"elements_budget must be > 0 seconds, got {elements_budget}")
        self.observation, self.elements_budget = observation, float(elements_budget)
        coords.model_extent(coords_space, TASK_WIDTH, TASK_HEIGHT)  # raises on an unknown space
        self.max_steps, self.episode_seconds = int(max_steps), episode_seconds
        self.reset_timeout, self.step_timeout = float(reset_timeout), float(step_timeout)
        self.launch_timeout = float(launch_timeout)
        self.coords_space, self.render_mode = coords_space, render_mode
        self.width, self.height = TASK_WIDTH, TASK_HEIGHT
        self.observation_space = gym.spaces.Dict({
            "screenshot": gym.spaces.Box(0, 255, (self.height, self.width, 3), np.uint8),
            "geometry": GeometrySpace(self.width, self.height),
            **({"elements": ElementsSpace(self.width, self.height), "elements_source": NoteSpace()}
               if observation == "elements" else {}),
        })
        self.action_space = ActionSpace()  # the sandbox's random policy: clicks, drags, scrolls, typing, keys
        self.keys = allowed_keys()
        self.restarts = 0  # browsers started again after a reset failed or hung
        self._env = None  # miniwob's environment, with its browser
        self._task = self._loaded = None  # the episode's task; the task the browser has open
        self._raw = None  # miniwob's last observation (utterance, DOM, fields, screenshot)
        self._obs = None
        self.scale = (1.0, 1.0)  # screenshot pixels per CSS pixel (miniwob_elements.screen_scale)
        self._seed, self._instruction = None, ""
        self._steps, self._done, self._limit_s = 0, False, None
        self._verdict = ("running", 0.0, None)

    # ------------------------------------------------------------ gym API
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        options = dict(options or {})
        seed = int(self.np_random.integers(2 ** 31)) if seed is None else int(seed)
        family = options.get("family")
        task = task_of(family) if family else self.tasks[seed % len(self.tasks)]
        for attempt in (1, 2):
            try:
                self._launch(task)  # bounded by launch_timeout and the driver's page-load timeout
                with Deadline(self.reset_timeout, f"reset of {PREFIX}{task} (seed {seed})", self._kill):
                    if task != self._loaded:
                        self._env.load(task)
                        self._loaded = task
                    self._set_time_limit()
                    raw, _ = self._env.reset(seed=seed)
                    self._measure()
                    self._task, self._done = task, False
                    self._wrap(raw)
                    self._read_elements()
                break
            except Exception as e:  # a hung or crashed browser: a fresh one gets one more try
                self._drop()
                if attempt == 2:
                    raise MiniWoBError(f"reset of {PREFIX}{task} (seed {seed}) failed twice, Chromium killed "
                                       f"each time: {e}") from e
                self.restarts += 1
        self._task, self._seed, self._steps, self._done = task, seed, 0, False
        self._instruction = str(raw["utterance"])
        self._verdict = ("running", 0.0, None)
        return self._obs, self._info()

    def step(self, action):
        if self._raw is None:
            raise RuntimeError("call reset() before step()")
        extra: dict = {}
        actions = to_actions(action, extra)
        if self._done:
            extra["error"] = "the episode is over; call reset()"
            actions = []
        before = self._obs["screenshot"]
        ended_by_agent, ran, timed_out = False, False, False
        try:
            with Deadline(self.step_timeout, f"step of {PREFIX}{self._task}", self._kill):
                for a in actions:
                    problem = validate(a)
                    if problem:
                        extra["action_error"] = problem
                        break
                    if a.name in ("finished", "call_user"):
                        ended_by_agent = True
                        break
                    try:
                        todo = self._to_miniwob(a)
                    except ValueError as e:  # something MiniWoB++ cannot do: the agent's mistake
                        extra["action_error"] = str(e)
                        break
                    for act in todo:
                        if self._check_done():
                            break
                        raw, *_ = self._env.step(act)
                        ran = True
                        self._wrap(raw)
                    if self._check_done():
                        break
                if not self._done:
                    self._check_done()  # MiniWoB's clock may have run out meanwhile
                if not self._done:
                    self._read_elements()
        except MiniWoBTimeout as e:
            extra["error"] = str(e)
            timed_out = True
            self._drop()
            if self.observation == "elements":
                self._obs = {**self._obs, "elements": None, "elements_source": "no element list: the step timed out"}
        self._steps += 1
        status, progress, reason = self._verdict
        success = status == "success"
        reward = 1.0 if success and not self._done else 0.0
        clock_ran_out = reason == "timed out"
        terminated = (status != "running" and not clock_ran_out) or ended_by_agent
        truncated = not terminated and (clock_ran_out or timed_out or self._steps >= self.max_steps)
        self._done = self._done or terminated or truncated
        info = self._info()
        info.update(extra)
        changed = ran and "action_error" not in extra and not terminated and not timed_out
        info["screen_changed"] = _changed(before, self._obs["screenshot"]) if changed else None
        return self._obs, reward, bool(terminated), bool(truncated), info

    def render(self):
        if self.render_mode == "rgb_array":
            return self._obs["screenshot"] if self._obs else np.zeros((self.height, self.width, 3), np.uint8)
        return None

    def close(self):
        self._drop()

    # ------------------------------------------------------------ the oracle (expert) and the DOM
    def expert_action(self) -> tuple[str, Action]:
        """The DOM oracle's next (thought, action) (trainer.sandbox.miniwob_oracle)."""
        if self._raw is None:
            raise RuntimeError("call reset() before expert_action()")
        return oracle_action(self._task, self._raw)

    def expert_response(self) -> str:
        """The oracle's next step as UI-TARS text in this env's coordinate space."""
        thought, action = self.expert_action()
        return format_normalized(thought, [action], self.coords_space, self.width, self.height)

    def expert_click(self) -> tuple[float, float] | None:
        """Where the oracle would click now (normalized), or None."""
        try:
            _, action = self.expert_action()
        except (MiniWoBError, RuntimeError):
            return None
        box = action.args.get("start_box") if action.name == "click" else None
        return (float(box[0]), float(box[1])) if box else None

    def labelled_targets(self) -> list[tuple[str, Action, tuple[float, float, float, float]]]:
        """(text, click, normalized box) for each leaf element with text on the page now."""
        if self._raw is None:
            raise RuntimeError("call reset() before labelled_targets()")
        out = []
        for e in self._raw["dom_elements"]:
            if e["text"]:
                box = element_box(e)
                if box[2] > box[0] and box[3] > box[1]:
                    centre = ((box[0] + box[2]) / 2, (box[1] + box[3]) / 2)
                    out.append((e["text"], Action("click", {"start_box": centre}), box))
        return out

    @property
    def browser(self):
        """The running Browser (trainer.sandbox.miniwob_browser), or None before the first reset."""
        return self._env.instance.browser if self._env is not None else None

    @property
    def driver(self):
        """The Selenium WebDriver of the running browser (None before the first reset)."""
        return self._env.instance.driver if self._env is not None else None

    # ------------------------------------------------------------ helpers
    def _launch(self, task: str) -> None:
        """Start miniwob's environment, with its browser, on `task` unless it runs already."""
        if self._env is not None:
            return
        from miniwob.action import ActionSpaceConfig, ActionTypes

        T = ActionTypes
        config = ActionSpaceConfig(
            action_types=[T.NONE, T.CLICK_COORDS, T.DBLCLICK_COORDS, T.MOUSEDOWN_COORDS, T.MOUSEUP_COORDS,
                          T.SCROLL_UP_COORDS, T.SCROLL_DOWN_COORDS, T.PRESS_KEY, T.TYPE_TEXT],
            allowed_keys=self.keys)
        self._env = make_environment(task, config, launch_timeout=self.launch_timeout)
        self._loaded = task

    def _set_time_limit(self) -> None:
        """MiniWoB's episode clock (core.EPISODE_MAX_TIME, read when an episode starts): episode_seconds,
        or the task's own, which the page keeps aside the first time it is changed."""
        ms = "null" if self.episode_seconds is None else int(float(self.episode_seconds) * 1000)
        self._limit_s = float(self._env.instance.driver.execute_script(
            "if (window.tandemOwnMaxTime === undefined) { window.tandemOwnMaxTime = core.EPISODE_MAX_TIME; }"
            f"core.EPISODE_MAX_TIME = {ms} === null ? window.tandemOwnMaxTime : {ms};"
            "return core.EPISODE_MAX_TIME;")) / 1000.0

    def _check_done(self) -> bool:
        """Read MiniWoB's verdict into self._verdict; True once the task has ended."""
        meta = self._env.instance.get_metadata()
        if not meta["done"]:
            return False
        raw = float(meta["raw_reward"])
        status = "success" if raw >= 1.0 else "failed"
        self._verdict = (status, max(0.0, min(1.0, raw)), meta.get("reason"))
        return True

    def _to_miniwob(self, a: Action) -> list:
        """One schema action as miniwob actions; ValueError for what MiniWoB++ cannot do."""
        make = self._env.create_action

        def px(p):  # a normalized point on the screenshot -> the page's CSS pixels
            return np.array([p[0] * self.width / self.scale[0], p[1] * self.height / self.scale[1]], dtype=np.float32)

        n, args = a.name, a.args
        if n == "click":
            return [make("CLICK_COORDS", coords=px(args["start_box"]))]
        if n == "left_double":
            return [make("DBLCLICK_COORDS", coords=px(args["start_box"]))]
        if n == "drag":
            return [make("MOUSEDOWN_COORDS", coords=px(args["start_box"])),
                    make("MOUSEUP_COORDS", coords=px(args["end_box"]))]
        if n == "scroll":
            if args["direction"] not in ("up", "down"):
                raise ValueError(f"scroll: MiniWoB++ scrolls only up and down, not {args['direction']!r}")
            kind = "SCROLL_UP_COORDS" if args["direction"] == "up" else "SCROLL_DOWN_COORDS"
            return [make(kind, coords=px(args.get("start_box", (0.5, 0.5))))]
        if n == "type":  # a newline is the Enter key, as UI-TARS writes 'text\n' to submit
            out = []
            for i, part in enumerate(args["content"].split("\n")):
                if i:
                    out.append(make("PRESS_KEY", key=self.keys.index("<Enter>")))
                if part:
                    out.append(make("TYPE_TEXT", text=part))
            return out
        if n == "hotkey":
            return [make("PRESS_KEY", key=key_index(args["key"], self.keys))]
        if n == "wait":
            return [make("NONE")]
        if n == "right_single":
            raise ValueError("right_single: MiniWoB++ has no right click")
        raise ValueError(f"{n}: not an action MiniWoB++ can perform")

    def _wrap(self, raw) -> None:
        self._raw = raw
        shot = np.ascontiguousarray(raw["screenshot"][:, :, :3], dtype=np.uint8)
        self._obs = {"screenshot": shot, "geometry": ScreenGeometry.simple(shot.shape[1], shot.shape[0])}
        if self.observation == "elements":
            # until _read_elements reads the page; and so it stays once the task has ended, when
            # MiniWoB's observation is an empty page (no DOM, a black screenshot)
            self._obs.update(elements=[], elements_source=SOURCE)

    def _read_elements(self) -> None:
        """The page's element list into the observation (observation="elements"); once the task
        has ended, MiniWoB shows no page, and the list is empty."""
        if self.observation != "elements" or not self._raw["dom_elements"]:
            return
        items, source = read_elements(self._env.instance.driver, self.scale, self.width, self.height,
                                      self.elements_budget)
        self._obs = {**self._obs, "elements": items, "elements_source": source}  # a new dict: the last one was handed out

    def _measure(self) -> None:
        """self.scale from the page's viewport, as miniwob's screenshot crops and resizes it."""
        inst = self._env.instance
        ratio = float(inst.driver.execute_script("return window.devicePixelRatio;") or 1.0)
        self.scale = screen_scale(inst.inner_width, inst.inner_height, ratio, self.width, self.height)

    def _info(self) -> dict:
        status, progress, reason = self._verdict
        info = {"instruction": self._instruction, "family": PREFIX + self._task, "task_seed": self._seed,
                "level": None, "progress": progress, "status": status, "success": status == "success",
                "steps": self._steps, "max_steps": self.max_steps, "episode_seconds": self._limit_s}
        if reason:
            info["reason"] = str(reason)
        return info

    def _kill(self) -> None:
        """Kill the browser now (from the Deadline's timer thread)."""
        browser = self.browser
        if browser is not None:
            browser.kill()

    def _drop(self) -> None:
        """Close and forget the browser (a fresh one starts on the next reset)."""
        env, self._env, self._loaded = self._env, None, None
        if env is not None:
            browser = env.instance.browser
            if browser is not None:
                browser.close()

