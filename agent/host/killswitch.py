"""The kill switch: a global hotkey that stops the agent and lets go of the keyboard and mouse.

Default hotkey: Ctrl+Alt+Shift+K (pynput notation `<ctrl>+<alt>+<shift>+k`): four keys, so no
application and no typed text triggers it by accident, and no desktop binds it by default (plain
Ctrl+Alt+K is taken by some IMEs and editors). Change it with `hotkey=`.

pynput is imported when the switch is started (it fails at import without a display); the
listener runs in pynput's own thread, and the callback only sets flags and releases keys, so the
agent stops within milliseconds of the key press, whatever the loop is doing. A fake keyboard
(xdotool, or the agent's own pyautogui) is heard too: that is the point of a global hook.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable

from agent.errors import TandemError
from agent.wording import hotkey_label

DEFAULT_HOTKEY = "<ctrl>+<alt>+<shift>+k"


class KillSwitchError(TandemError, RuntimeError):
    pass


class KillSwitch:
    """Calls each target's `stop(reason)` (an AgentLoop) or the given callables when the hotkey
    is pressed or `trigger()` is called."""

    def __init__(self, *targets, hotkey: str = DEFAULT_HOTKEY, on_trigger: Callable[[], None] | None = None):
        self.hotkey = hotkey
        self.targets = list(targets)
        self.on_trigger = on_trigger
        self.triggered = threading.Event()
        self.triggered_at: float | None = None
        self._listener = None

    def add(self, target) -> None:
        self.targets.append(target)

    def trigger(self, reason: str = "kill switch") -> None:
        if self.triggered_at is None:
            self.triggered_at = time.monotonic()
        self.triggered.set()
        for t in list(self.targets):
            try:
                t.stop(reason) if hasattr(t, "stop") else t()
            except Exception:  # one failing target must not keep the others running
                pass
        if self.on_trigger:
            self.on_trigger()

    def start(self) -> KillSwitch:
        """Listen for the hotkey (needs a display on X11)."""
        try:
            from pynput import keyboard
        except Exception as e:  # pynput raises ImportError or Xlib errors without a display
            raise KillSwitchError(f"cannot listen for the kill-switch hotkey {self.hotkey}: {e}") from None
        try:
            self._listener = keyboard.GlobalHotKeys({self.hotkey: lambda: self.trigger(f"kill switch ({hotkey_label(self.hotkey)})")})
        except ValueError as e:
            raise KillSwitchError(f"not a valid hotkey {self.hotkey!r}: {e}") from None
        self._listener.start()
        self._listener.wait()  # returns once the X record context is live: no key press is missed
        return self

    def stop(self, reason: str | None = None) -> None:
        """Stop listening (not a trigger)."""
        if self._listener is not None:
            self._listener.stop()
            self._listener = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        # the listener is stopped; `stop` on a switch means "stop listening", see trigger() for the other
        if self._listener is not None:
            self._listener.stop()
            self._listener = None


class ControlIndicator:
    """Tells a UI whether the agent has control of the input (the app shows a strip while it
    does). Pass `indicator.set` as AgentLoop's on_control; listeners get True/False."""

    def __init__(self):
        self.listeners: list[Callable[[bool], None]] = []
        self.active = False
        self.history: list[tuple[float, bool]] = []

    def connect(self, fn: Callable[[bool], None]) -> None:
        self.listeners.append(fn)

    def set(self, active: bool) -> None:
        self.active = bool(active)
        self.history.append((time.monotonic(), self.active))
        for fn in list(self.listeners):
            fn(self.active)
