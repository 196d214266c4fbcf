"""Input capture: pynput mouse and keyboard listeners whose callbacks only enqueue.

Each callback takes the time first (agent.schema.monotonic, the recording's one clock) and puts
one tuple on a SimpleQueue; naming keys, privacy, batching and writing happen in the session's
processing thread, so a slow disk never delays the system's input (pynput's hooks run inside
the input path on Windows and macOS). pynput is imported in start(): it fails at import without
a display.
"""
from __future__ import annotations

import queue

from agent.recorder.errors import RecorderError
from agent.schema import monotonic


def key_name(key) -> str:
    """A pynput key -> the raw event's key: a named key ('enter', 'ctrl_l') or one character."""
    name = getattr(key, "name", None)
    if name:
        return name
    char = getattr(key, "char", None)
    if char:
        return char
    vk = getattr(key, "vk", None)
    return f"vk{vk}" if vk is not None else "unknown"


class InputCapture:
    """Mouse and keyboard listeners feeding `events` with (kind, t, ...) tuples:
    ("move", t, x, y), ("mouse_down"/"mouse_up", t, x, y, button), ("scroll", t, x, y, dx, dy),
    ("key_down"/"key_up", t, pynput_key)."""

    def __init__(self):
        self.events: queue.SimpleQueue = queue.SimpleQueue()
        self._mouse = None
        self._keyboard = None

    def start(self) -> InputCapture:
        try:
            from pynput import keyboard, mouse
        except Exception as e:  # ImportError or Xlib errors without a display
            raise RecorderError(f"cannot hook the mouse and keyboard: {e}") from None
        put = self.events.put

        def on_move(x, y):
            put(("move", monotonic(), x, y))

        def on_click(x, y, button, pressed):
            put(("mouse_down" if pressed else "mouse_up", monotonic(), x, y, getattr(button, "name", str(button))))

        def on_scroll(x, y, dx, dy):
            put(("scroll", monotonic(), x, y, dx, dy))

        def on_press(key, injected=False):
            put(("key_down", monotonic(), key))

        def on_release(key, injected=False):
            put(("key_up", monotonic(), key))

        self._mouse = mouse.Listener(on_move=on_move, on_click=on_click, on_scroll=on_scroll)
        self._keyboard = keyboard.Listener(on_press=on_press, on_release=on_release)
        self._mouse.start()
        self._keyboard.start()
        # wait() returns once the hooks are live, so nothing done after start() is missed
        self._mouse.wait()
        self._keyboard.wait()
        return self

    def stop(self) -> None:
        for lst in (self._mouse, self._keyboard):
            if lst is not None:
                # not joined: on X11 a stopped listener's thread returns only at the next input
                # event (the RECORD context wakes then); it is a daemon, and our callbacks only enqueue
                lst.stop()
        self._mouse = self._keyboard = None
