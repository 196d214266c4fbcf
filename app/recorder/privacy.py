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

import os
import sys
from dataclasses import dataclass

from app.recorder.errors import RecorderError

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
    def parse(cls, text: str) -> "Hotkey":
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


class FocusedWindow:
    """Reads the focused window's title and class on X11 (python-xlib), one connection per
    instance: use it from one thread. Without a window manager, X focus follows the pointer
    (PointerRoot), so the top-level window under the pointer is the focused one."""

    def __init__(self):
        self.available = sys.platform.startswith("linux") and bool(os.environ.get("DISPLAY"))
        self._d = None

    def _display(self):
        if self._d is None:
            from Xlib import display

            self._d = display.Display()
            self._net_active = self._d.intern_atom("_NET_ACTIVE_WINDOW")
            self._net_name = self._d.intern_atom("_NET_WM_NAME")
            self._utf8 = self._d.intern_atom("UTF8_STRING")
        return self._d

    def _name(self, w) -> tuple[str | None, str | None]:
        title = None
        try:
            p = w.get_full_property(self._net_name, self._utf8)
            if p is not None and p.value:
                title = p.value.decode("utf-8", "replace") if isinstance(p.value, bytes) else str(p.value)
            if not title:
                n = w.get_wm_name()
                title = n.decode("latin-1") if isinstance(n, bytes) else n
            cls = w.get_wm_class()
        except Exception:  # noqa: BLE001 - the window may vanish between the calls
            return None, None
        return title or None, (cls[1] if cls else None)

    def _named_in(self, w, depth=0) -> tuple[str | None, str | None]:
        """The first title found at w or below it (clients are often children of a frame)."""
        title, cls = self._name(w)
        if title or cls or depth > 3:
            return title, cls
        try:
            children = w.query_tree().children
        except Exception:  # noqa: BLE001
            return None, None
        for c in reversed(children):
            title, cls = self._named_in(c, depth + 1)
            if title or cls:
                return title, cls
        return None, None

    def get(self) -> tuple[str | None, str | None]:
        """(title, app class) of the focused window; (None, None) when unknown."""
        if not self.available:
            return None, None
        try:
            d = self._display()
            root = d.screen().root
            p = root.get_full_property(self._net_active, 0)  # a window manager's answer
            if p is not None and p.value and p.value[0]:
                return self._named_in(d.create_resource_object("window", p.value[0]))
            focus = d.get_input_focus().focus
            if isinstance(focus, int) or focus == root:  # PointerRoot / None: the window under the pointer
                child = root.query_pointer().child
                if not child:
                    return None, None
                return self._named_in(child)
            return self._named_in(focus)
        except Exception:  # noqa: BLE001 - no X, or a window gone: unknown, never a crash
            return None, None

    def close(self) -> None:
        if self._d is not None:
            try:
                self._d.close()
            except Exception:  # noqa: BLE001
                pass
            self._d = None
