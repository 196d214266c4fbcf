"""The desktop: mss for screenshots, pyautogui for the mouse and keyboard.

pyautogui and pynput fail at import without an X display (and pyautogui calls sys.exit when
tkinter is missing), so they are imported on first use, never at module import. pyautogui's
fail-safe stays on: slamming the pointer into a screen corner aborts. Coordinates come from the
frame's geometry (agent.coords.normalized_to_screen), which carries the monitor's origin (multi
monitor) and the physical/logical scale (HiDPI): the same transform the UI's click preview draws.
Text goes through `xdotool type` on X11 (pyautogui.write drops non-ASCII) and through
pyautogui.write elsewhere (non-ASCII refused there, naming the characters); no clipboard, so the
user's clipboard is never overwritten.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import threading
import time

from agent import coords
from agent.actions import REGISTRY, canonical_keys
from agent.executors.base import ExecutionError, Frame, interruptible_sleep
from agent.host.atspi_elements import AtspiElements
from agent.host.focused_window import FocusedWindow
from agent.host.password_focus import PasswordFocus
from agent.host.terminal_process import terminal_evidence
from agent.schema import Action, ScreenGeometry, monotonic

FOCUS_FACTS = ("focused_window", "password_focused", "focus_unknown")  # the keys _focus_facts may set

# Canonical key names (agent.actions.canonical_keys) that pyautogui spells otherwise.
_KEYS = {"plus": "+", "minus": "-"}


def pyautogui_key(name: str) -> str:
    """A canonical key name as pyautogui names it; cmd and win are one key (Command on macOS,
    the Windows/Super key elsewhere), which the gate's reading of hotkeys relies on."""
    k = name.lower()
    if k in ("cmd", "win"):
        return "command" if sys.platform == "darwin" else "win"
    return _KEYS.get(k, k)


def hotkey_keys(key: str) -> list[str]:
    """'ctrl shift t' / 'Control+Return' / 'ctrl w w' -> pyautogui names, in press order: the
    chord in the one spelling the gate judged (agent.actions.canonical_keys), then pyautogui's names."""
    if key.strip() == "+":
        return ["+"]
    return [pyautogui_key(p) for p in canonical_keys(key).split()]


class DesktopExecutor:
    platform = "desktop"

    def __init__(self, *, monitor: int = 1, display: str | None = None, settle: float = 0.15, wait_seconds: float = 5.0,
                 drag_seconds: float = 0.2, scroll_clicks: int = 5, text_backend: str = "auto", stop_event=None,
                 password_fields: bool = True, elements: bool = True):
        """monitor: mss monitor index (1 = primary, 0 = all monitors as one image).
        settle: seconds to let the screen update after an action before the next screenshot.
        password_fields: watch the accessibility bus and mark observations taken while a password
        field is focused (the gate then asks before typing).
        elements: put the active window's element list (AT-SPI, agent.host.atspi_elements) on each frame."""
        self.monitor = monitor
        self.display = display or os.environ.get("DISPLAY")
        self.settle = settle
        self.wait_seconds = wait_seconds
        self.drag_seconds = drag_seconds
        self.scroll_clicks = scroll_clicks
        self.text_backend = text_backend
        self.stop_event = stop_event or threading.Event()
        self._sct = None
        self._sct_thread = None
        self._pg = None
        self._typing: subprocess.Popen | None = None
        self._last: Frame | None = None
        self.password_fields = password_fields
        self._password = None  # agent.host.password_focus.PasswordFocus, started with the first observation
        self._focus = None  # agent.host.focused_window.FocusedWindow, opened with the first observation
        self.elements = elements
        self._elements = None  # agent.host.atspi_elements.AtspiElements, connected with the first observation
        # () -> [(x, y, w, h)] in the OS input space: windows of the app itself (Drive's control
        # strip) painted out of the screenshot, so the agent neither sees nor clicks its own controls
        self.hidden_regions = None

    # ---------------------------------------------------------------- lazy back ends
    def _pyautogui(self):
        if self._pg is None:
            try:
                import pyautogui
            except (ImportError, KeyError, SystemExit) as e:  # SystemExit: mouseinfo without tkinter
                raise ExecutionError(f"pyautogui cannot start here ({type(e).__name__}: {e}); is there a display?") from None
            pyautogui.FAILSAFE = True
            pyautogui.PAUSE = 0  # the loop paces itself; pyautogui's 0.1 s per call would dominate a step
            self._pg = pyautogui
        return self._pg

    def _mss(self):
        # mss handles are per thread on X11; the loop may run in a worker thread
        if self._sct is None or self._sct_thread != threading.get_ident():
            import mss

            if self._sct is not None:
                self._sct.close()
            self._sct = mss.MSS(display=self.display) if self.display else mss.MSS()
            self._sct_thread = threading.get_ident()
        return self._sct

    # ---------------------------------------------------------------- observe
    def geometry_for(self, monitor: dict, width: int, height: int) -> ScreenGeometry:
        """mss reports the monitor in the OS input space; the grab's pixel size may be larger
        (HiDPI). The ratio is the scale factor."""
        return ScreenGeometry(
            logical_width=int(monitor["width"]), logical_height=int(monitor["height"]),
            physical_width=width, physical_height=height, scale_factor=width / monitor["width"],
            origin_x=int(monitor["left"]), origin_y=int(monitor["top"]),
        )

    def observe(self) -> Frame:
        sct = self._mss()
        monitors = sct.monitors
        if not 0 <= self.monitor < len(monitors):
            raise ExecutionError(f"monitor {self.monitor} does not exist; this screen has {len(monitors) - 1}")
        mon = monitors[self.monitor]
        t = monotonic()
        grab = sct.grab(mon)
        import numpy as np

        bgra = np.asarray(grab)
        try:
            import cv2

            pixels = cv2.cvtColor(bgra, cv2.COLOR_BGRA2BGR)  # contiguous BGR (~2 ms); encoders want contiguous
        except ImportError:
            pixels = bgra[:, :, :3]  # a view; encode_pixels copies it
        geometry = self.geometry_for(mon, grab.width, grab.height)
        hidden = self.hidden_regions() if self.hidden_regions is not None else None
        if hidden is not None:
            pixels = np.array(pixels)  # writable (a view of the grab is not)
            paint_out(pixels, hidden, geometry)
        extra = self._focus_facts(t)
        elements, source = self._element_list(geometry, hidden)
        self._last = Frame(geometry=geometry, pixels=pixels, bgr=True, time=t, extra=extra, elements=elements,
                           elements_source=source)
        return self._last

    def _element_list(self, geometry: ScreenGeometry, hidden) -> tuple[list | None, str | None]:
        """The active window's element list right after the grab, or (None, why not)."""
        if not self.elements:
            return None, None
        if self._elements is None:
            self._elements = AtspiElements(focused_pid=lambda: self._focus.focused_pid() if self._focus else None)
        reading = self._elements.read(geometry, hidden)
        return reading.elements, reading.source

    def _focus_facts(self, t: float, *, processes: bool = False) -> dict:
        """Where typed text would go, at time t: the focused window's title and class, whether a
        password field has focus, or why the focused window cannot be known here. With
        `processes`, also why the window's process is a terminal, if it is one (a /proc walk of
        its process tree: tests/bench/bench_gate_focus.py measures it)."""
        if self._focus is None:
            self._focus = FocusedWindow()
        facts: dict = {}
        if not self._focus.available:  # Windows, macOS, no DISPLAY: the gate asks before Enter instead
            facts["focus_unknown"] = self._focus.reason
        else:
            title, app, pid = self._focus.describe() if processes else (*self._focus.get(), None)
            if title or app:
                facts["focused_window"] = {"title": title, "app": app}
            if evidence := terminal_evidence(pid):
                facts.setdefault("focused_window", {"title": title, "app": app})["terminal"] = evidence
        if self.password_fields:
            if self._password is None:
                self._password = PasswordFocus().start(timeout=2.0)
            if self._password.active_at(t):
                facts["password_focused"] = True
        return facts

    def focus_now(self, frame: Frame) -> Frame:
        """`frame` with its focus facts read again now, the terminal test included: the loop calls
        it before each action the gate judges, as the previous action (a click) or the time the
        model took may have moved the focus since the screenshot."""
        extra = {k: v for k, v in frame.extra.items() if k not in FOCUS_FACTS}
        return dataclasses.replace(frame, extra={**extra, **self._focus_facts(monotonic(), processes=True)})

    def reset(self, *, seed=None, options=None):
        # the stop flag is not cleared here: its owner (AgentLoop) clears it when a run is set up
        return self.observe(), {}

    # ---------------------------------------------------------------- act
    def screen_point(self, p, geometry: ScreenGeometry) -> tuple[int, int]:
        return coords.normalized_to_screen(p, geometry)

    def step(self, action: Action):
        geometry = (self._last or self.observe()).geometry
        try:
            info = self.execute(action, geometry)
        except Exception as e:
            if type(e).__name__ == "FailSafeException":  # the user slammed the pointer into a corner
                self.stop_event.set()
                raise ExecutionError("pyautogui's fail-safe fired (pointer in a screen corner): stopping") from None
            raise
        if action.name != "wait" and self.settle:
            interruptible_sleep(self.settle, self.stop_event)
        frame = self.observe()
        terminated = action.name in ("finished", "call_user")
        return frame, 0.0, terminated, False, info

    def execute(self, action: Action, geometry: ScreenGeometry) -> dict:
        """Carry out one normalized action; returns what was done in screen pixels."""
        a, name = action.args, action.name
        if name in ("finished", "call_user"):
            return {}
        if name == "wait":
            interruptible_sleep(self.wait_seconds, self.stop_event)
            return {}
        pg = self._pyautogui()
        if name in ("click", "left_double", "right_single"):
            x, y = self.screen_point(a["start_box"], geometry)
            {"click": pg.click, "left_double": pg.doubleClick, "right_single": pg.rightClick}[name](x, y)
            return {"screen_point": [x, y]}
        if name == "drag":
            (x1, y1), (x2, y2) = self.screen_point(a["start_box"], geometry), self.screen_point(a["end_box"], geometry)
            pg.moveTo(x1, y1)
            pg.mouseDown(button="left")
            try:
                pg.moveTo(x2, y2, duration=self.drag_seconds)
            finally:
                pg.mouseUp(button="left")
            return {"screen_points": [[x1, y1], [x2, y2]]}
        if name == "hotkey":
            keys = hotkey_keys(a["key"])
            pg.hotkey(*keys)
            return {"keys": keys}
        if name == "type":
            return self.type_text(a["content"])
        if name == "scroll":
            info = {}
            if "start_box" in a:
                x, y = self.screen_point(a["start_box"], geometry)
                pg.moveTo(x, y)
                info["screen_point"] = [x, y]
            n = self.scroll_clicks
            d = a["direction"]
            if d in ("up", "down"):
                pg.scroll(n if d == "up" else -n)
            else:
                pg.hscroll(n if d == "right" else -n)
            return info
        raise ExecutionError(f"the desktop cannot execute {name!r} (an action for {', '.join(action_platforms(name))})")

    def type_text(self, content: str) -> dict:
        """Types `content`; each "\\n" (including a trailing one, UI-TARS's "submit") presses Enter."""
        pg = self._pyautogui()
        lines = content.split("\n")
        use_xdotool = self._use_xdotool()
        for i, line in enumerate(lines):
            if line:
                if use_xdotool:
                    self._xdotool_type(line)
                else:
                    bad = sorted({c for c in line if ord(c) > 126 or (ord(c) < 32 and c != "\t")})
                    if bad:
                        raise ExecutionError(f"cannot type {''.join(bad)!r} with pyautogui (ASCII only) and xdotool is not available")
                    pg.write(line, interval=0)
            if i < len(lines) - 1:
                if self.stop_event.is_set():
                    break
                pg.press("enter")
        return {"typed": content, "backend": "xdotool" if use_xdotool else "pyautogui"}

    def _use_xdotool(self) -> bool:
        if self.text_backend == "pyautogui":
            return False
        ok = sys.platform.startswith("linux") and bool(self.display) and shutil.which("xdotool") is not None
        if self.text_backend == "xdotool" and not ok:
            raise ExecutionError("text_backend 'xdotool' asked for, but xdotool or an X display is missing")
        return ok

    def _xdotool_type(self, text: str) -> None:
        # xdotool types a character missing from the keymap by remapping a spare keycode per
        # keystroke, and Qt often reads the key before it sees the new mapping: measured 3/10
        # intact at --delay 12 ("héllo" -> "hllo", even reordered). So the missing characters
        # are bound to spare keycodes first, all at once, clients get one moment to reload the
        # keymap, and then the whole text goes at --delay 0 with every keysym already present.
        for chunk in self._premapped(text):
            if self.stop_event.is_set():
                return
            self._xdotool(["type", "--delay", "0", "--", chunk])

    def _premapped(self, text: str):
        """Yields the text in chunks whose characters are mapped for the duration of the chunk."""
        chars = {c for c in text if not (" " <= c <= "~" or c == "\t")}
        if not chars:
            yield text
            return
        from Xlib import display as xdisplay

        d = xdisplay.Display(self.display)
        try:
            lo, hi = d.display.info.min_keycode, d.display.info.max_keycode
            current = d.get_keyboard_mapping(lo, hi - lo + 1)
            spare = [lo + i for i, syms in enumerate(current) if not any(syms)]
            if not spare:
                raise ExecutionError("the X keymap has no free keycode to type non-ASCII characters with")
            # chunks of text whose distinct non-ASCII characters fit the spare keycodes
            chunks, cur, cur_set = [], "", set()
            for c in text:
                if c in chars and c not in cur_set and len(cur_set) == len(spare):
                    chunks.append((cur, cur_set))
                    cur, cur_set = "", set()
                if c in chars:
                    cur_set.add(c)
                cur += c
            chunks.append((cur, cur_set))
            for chunk, needed in chunks:
                bound = list(zip(spare, sorted(needed), strict=False))  # keycodes to spare: some stay free
                for kc, ch in bound:
                    ks = ord(ch) if ord(ch) < 0x100 else 0x01000000 + ord(ch)  # X keysyms for Unicode
                    d.change_keyboard_mapping(kc, [(ks, ks)])
                d.sync()
                interruptible_sleep(0.1, self.stop_event)  # clients reload the keymap on MappingNotify
                try:
                    yield chunk
                finally:
                    # the client must read the keys before their keycodes change meaning again
                    time.sleep(0.05)
                    for kc, _ in bound:
                        d.change_keyboard_mapping(kc, [(0, 0)])
                    d.sync()
        finally:
            d.close()

    def _xdotool(self, args: list[str]) -> None:
        env = {**os.environ, "DISPLAY": self.display}
        # a Popen, so that the kill switch can end a long text at once
        self._typing = subprocess.Popen(["xdotool", *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            _, err = self._typing.communicate(timeout=60)
        finally:
            code, self._typing = self._typing.returncode, None
        if code not in (0, None) and not self.stop_event.is_set():
            raise ExecutionError(f"xdotool type failed ({code}): {err.decode(errors='replace').strip()}")

    # ---------------------------------------------------------------- safety
    def release(self) -> None:
        """Let go of every modifier and mouse button (the kill switch; safe from any thread)."""
        self.stop_event.set()
        p = self._typing
        if p is not None and p.poll() is None:
            p.kill()
        if self._pg is None:
            return
        for k in ("ctrl", "alt", "shift", "win"):
            try:
                self._pg.keyUp(k)
            except Exception:  # releasing is best effort, one failure must not stop the rest
                pass
        for b in ("left", "right", "middle"):
            try:
                self._pg.mouseUp(button=b)
            except Exception:
                pass

    def close(self) -> None:
        if self._elements is not None:
            self._elements.close()
            self._elements = None
        if self._password is not None:
            self._password.stop()
            self._password = None
        if self._focus is not None:
            self._focus.close()
            self._focus = None
        if self._sct is not None:
            try:
                self._sct.close()
            except Exception:  # closing a handle from another thread may fail; nothing is lost
                pass
            self._sct = None


def action_platforms(name: str) -> list[str]:
    spec = REGISTRY.get(name)
    return list(spec.platforms) if spec else []


def paint_out(pixels, regions, geometry: ScreenGeometry, value: int = 128) -> int:
    """Fill screen regions (x, y, w, h in the OS input space) of a grab with flat grey; returns
    how many regions touched this monitor."""
    touched = 0
    height, width = pixels.shape[:2]
    s = geometry.scale_factor
    for x, y, w, h in regions or ():
        x0 = max(0, int((x - geometry.origin_x) * s))
        y0 = max(0, int((y - geometry.origin_y) * s))
        x1 = min(width, int(round((x + w - geometry.origin_x) * s)))
        y1 = min(height, int(round((y + h - geometry.origin_y) * s)))
        if x0 < x1 and y0 < y1:
            pixels[y0:y1, x0:x1] = value
            touched += 1
    return touched
