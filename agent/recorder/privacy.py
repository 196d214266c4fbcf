"""Privacy by construction: a denylist of apps and window titles, the focused window on X11, and
the recorder's own control hotkeys (pause/resume, secret typing, a note) which are never recorded.

While a denied window is focused no frame is grabbed and no input event is kept (a 'denied'
marker is written instead). The focused window is sampled by the session's processing thread
about every 50 ms, so input is dropped from within 50 ms of the focus change.
The denylist acts on the FOCUSED window: a denied window that is visible but not focused still
appears in other windows' frames (blur it in review). On other platforms than X11 the focused
window is unknown: the denylist then cannot protect,
and the session says so in the episode's meta (privacy.denylist_active = false).
"""
from __future__ import annotations

from dataclasses import dataclass

from agent.host.focused_window import FocusedWindow  # also imported from here by the recorder session
from agent.recorder.errors import RecorderError

DEFAULT_DENYLIST = (
    "1password", "bitwarden", "keepass", "lastpass", "dashlane", "keychain access", "password",
    "online banking", "private browsing", "incognito",
)

_MOD_ALIASES = {"ctrl": "ctrl", "control": "ctrl", "alt": "alt", "shift": "shift", "cmd": "win", "super": "win", "win": "win"}


@dataclass(frozen=True)
class Hotkey:
    """A chord like 'ctrl+alt+shift+p': modifiers held when `key` is pressed."""

    modifiers: frozenset
    key: str
    text: str

    @classmethod
    def parse(cls, text: str) -> Hotkey:
        parts = [p.strip().lower().strip("<>") for p in text.split("+")]
        if len(parts) < 2 or not parts[-1]:
            raise RecorderError(f"a control hotkey needs modifiers and a key, like 'ctrl+alt+shift+p'; got {text!r}")
        mods = set()
        for p in parts[:-1]:
            if p not in _MOD_ALIASES:
                raise RecorderError(f"unknown modifier {p!r} in hotkey {text!r}; use ctrl, alt, shift or cmd")
            mods.add(_MOD_ALIASES[p])
        return cls(frozenset(mods), parts[-1], text)

    def matches(self, held: set, key: str) -> bool:
        k = key.lower()
        if len(k) == 1 and ord(k) < 32:  # ctrl+p as '\x10' on some platforms
            k = chr(ord(k) + 96)
        return k == self.key and held == set(self.modifiers)


DEFAULT_HOTKEYS = {
    "pause": "ctrl+alt+shift+p",  # pause / resume
    "secret": "ctrl+alt+shift+s",  # secret typing on / off
    "note": "ctrl+alt+shift+n",  # open the note box (the app) / mark a note time
}


class Denylist:
    """Case-insensitive substrings matched against the focused window's title and app class."""

    def __init__(self, entries=DEFAULT_DENYLIST):
        self.entries = tuple(e.strip().lower() for e in entries if e and e.strip())

    def match(self, title: str | None, app: str | None = None) -> str | None:
        """The entry that denies this window, or None."""
        hay = " ".join(x for x in (title, app) if x).lower()
        for e in self.entries:
            if e in hay:
                return e
        return None




class OwnWindows:
    """Which input was aimed at the recording app itself (its Pause button, its note box): that
    input is not part of the demonstration and is left out. On X11 a window says which process
    owns it (_NET_WM_PID), so the top-most window at a click's point and the focused window are
    compared with `pid`. Elsewhere the app passes `at(x, y)` and `focused()` callables built from
    its own window rectangles and active state (not stacking-aware: a foreign window above the
    app's counts as the app's). Called from the session's processing thread only."""

    def __init__(self, pid: int | None = None, at=None, focused=None):
        self.pid, self._at, self._focused = pid, at, focused
        self._x11 = None

    def _window(self):
        if self._x11 is None:
            self._x11 = FocusedWindow()
        return self._x11 if self._x11.available else None

    def at(self, x: int, y: int) -> bool:
        w = self._window() if self.pid is not None else None
        if w is not None:
            return w.pid_at(x, y) == self.pid
        return bool(self._at and self._at(x, y))

    def focused(self) -> bool:
        w = self._window() if self.pid is not None else None
        if w is not None:
            return w.focused_pid() == self.pid
        return bool(self._focused and self._focused())

    def close(self) -> None:
        if self._x11 is not None:
            self._x11.close()
