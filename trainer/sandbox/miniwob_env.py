"""MiniWoB++ behind the sandbox's environment shape: a real benchmark beside our own tasks.

    env = MiniWoBEnv("click-button")
    obs, info = env.reset(seed=0)      # obs = {"screenshot", "geometry"}; info["instruction"]
    obs, reward, terminated, truncated, info = env.step(Action("click", {"start_box": (0.4, 0.6)}))

Needs the `miniwob` package and Debian's chromium + chromium-driver. Selenium must not reach
the internet (it fetches driver metadata otherwise), so MINIWOB_CHROMEDRIVER and SE_OFFLINE are
set here when the Debian driver is present. `available()`
says what is missing instead of failing at import.
"""
from __future__ import annotations

import os
import shutil

import numpy as np

from agent.schema import Action, ScreenGeometry

_KEYS = {"enter": "<Enter>", "return": "<Enter>", "tab": "<Tab>", "esc": "<Escape>", "escape": "<Escape>",
         "backspace": "<Backspace>", "delete": "<Delete>", "space": " ", "up": "<Up>", "down": "<Down>",
         "left": "<Left>", "right": "<Right>", "home": "<Home>", "end": "<End>"}
_MODS = {"ctrl": "C", "control": "C", "shift": "S", "alt": "A", "cmd": "M", "meta": "M"}


def available() -> str | None:
    """None when MiniWoB++ can run here, else what is missing."""
    try:
        import miniwob  # noqa: F401
    except ImportError:
        return "the `miniwob` package is not installed (pip install miniwob)"
    if not (shutil.which("chromium") or os.environ.get("MINIWOB_CHROME_BINARY")):
        return "chromium is not installed (apt-get install chromium chromium-driver)"
    if not (shutil.which("chromedriver") or os.environ.get("MINIWOB_CHROMEDRIVER")):
        return "chromedriver is not installed (apt-get install chromium-driver)"
    return None


def miniwob_key(combo: str) -> str:
    """UI-TARS 'ctrl a' -> MiniWoB/Selenium 'C-a'; 'enter' -> '<Enter>'."""
    parts = combo.lower().replace("+", " ").split()
    mods = [_MODS[p] for p in parts if p in _MODS]
    keys = [p for p in parts if p not in _MODS]
    if len(keys) != 1:
        raise ValueError(f"hotkey {combo!r} must name exactly one non-modifier key")
    key = _KEYS.get(keys[0], keys[0])
    return "-".join(mods + [key])


class MiniWoBEnv:
    """One MiniWoB++ task (e.g. 'click-button') with schema Actions in and screenshots out."""

    def __init__(self, task: str, max_steps: int = 10):
        missing = available()
        if missing:
            raise RuntimeError(f"MiniWoB++ is not available: {missing}")
        os.environ.setdefault("SE_OFFLINE", "true")
        if shutil.which("chromedriver"):
            os.environ.setdefault("MINIWOB_CHROMEDRIVER", shutil.which("chromedriver"))
        import gymnasium as gym
        import miniwob
        from miniwob.action import ActionSpaceConfig, ActionTypes

        gym.register_envs(miniwob)
        self.T = ActionTypes
        types = [ActionTypes.NONE, ActionTypes.CLICK_COORDS, ActionTypes.DBLCLICK_COORDS, ActionTypes.MOUSEDOWN_COORDS,
                 ActionTypes.MOUSEUP_COORDS, ActionTypes.SCROLL_UP_COORDS, ActionTypes.SCROLL_DOWN_COORDS,
                 ActionTypes.PRESS_KEY, ActionTypes.TYPE_TEXT]
        self.env = gym.make(f"miniwob/{task}-v1", action_space_config=ActionSpaceConfig(action_types=types))
        self.task, self.max_steps = task, max_steps
        self._steps = 0
        self._obs = None

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        obs, info = self.env.reset(seed=seed, options=options)
        self._steps = 0
        return self._wrap(obs), {"instruction": obs["utterance"], "family": f"miniwob/{self.task}", **info}

    def step(self, action: Action):
        h, w = self._obs["screenshot"].shape[:2]
        # MiniWoB's coordinates are CSS pixels of its 160x210 task area, the screenshot may be scaled
        scale = self.env.unwrapped.screenshot_scale if hasattr(self.env.unwrapped, "screenshot_scale") else 1.0

        def px(p):
            return np.array([p[0] * w / scale, p[1] * h / scale], dtype=np.float32)

        make = self.env.unwrapped.create_action
        n, a = action.name, action.args
        if n == "click":
            todo = [make(self.T.CLICK_COORDS, coords=px(a["start_box"]))]
        elif n == "left_double":
            todo = [make(self.T.DBLCLICK_COORDS, coords=px(a["start_box"]))]
        elif n == "drag":
            todo = [make(self.T.MOUSEDOWN_COORDS, coords=px(a["start_box"])), make(self.T.MOUSEUP_COORDS, coords=px(a["end_box"]))]
        elif n == "scroll":
            kind = self.T.SCROLL_UP_COORDS if a["direction"] == "up" else self.T.SCROLL_DOWN_COORDS
            todo = [make(kind, coords=px(a.get("start_box", (0.5, 0.5))))]
        elif n == "type":
            todo = [make(self.T.TYPE_TEXT, text=a["content"])]
        elif n == "hotkey":
            todo = [make(self.T.PRESS_KEY, key=miniwob_key(a["key"]))]
        else:  # wait, finished, call_user, right_single (no right click in MiniWoB)
            todo = [make(self.T.NONE)]
        reward, terminated, truncated, info = 0.0, False, False, {}
        for act in todo:
            obs, r, terminated, truncated, info = self.env.step(act)
            reward += float(r)
            if terminated or truncated:
                break
        self._steps += 1
        truncated = truncated or (not terminated and self._steps >= self.max_steps)
        if action.name in ("finished", "call_user"):
            terminated = True
        return self._wrap(obs), reward, bool(terminated), bool(truncated), {"instruction": obs["utterance"], **info}

    def _wrap(self, obs) -> dict:
        self._obs = obs
        shot = np.ascontiguousarray(obs["screenshot"][:, :, :3], dtype=np.uint8)
        return {"screenshot": shot, "geometry": ScreenGeometry.simple(shot.shape[1], shot.shape[0])}

    def close(self) -> None:
        self.env.close()
