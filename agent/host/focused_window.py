"""The focused window's title and application class on X11, for the recorder's denylist and the
agent's gate (typing into a terminal is asked about), and which process owns a window (the
recorder leaves out input aimed at Tandem's own windows; the gate looks for a shell under it).
python-xlib is imported on first use; where there is no X display the answer is (None, None) or
None, never an error."""
from __future__ import annotations

import os
import socket
import sys


class FocusedWindow:
    """Reads the focused window's title and class on X11 (python-xlib), one connection per
    instance: use it from one thread. Without a window manager, X focus follows the pointer
    (PointerRoot), so the top-level window under the pointer is the focused one."""

    def __init__(self):
        self.available = sys.platform.startswith("linux") and bool(os.environ.get("DISPLAY"))
        # Windows and macOS are not read (no Win32 / Quartz code here); on Wayland only X11
        # (XWayland) windows are seen, so a native Wayland window's focus goes unnoticed
        self.reason = ("X11" if self.available else "no X display (DISPLAY is not set)" if sys.platform.startswith("linux")
                       else f"the focused window is read on Linux/X11 only, not on {sys.platform}")
        self._d = None

    def _display(self):
        if self._d is None:
            from Xlib import display

            self._d = display.Display()
            self._net_active = self._d.intern_atom("_NET_ACTIVE_WINDOW")
            self._net_name = self._d.intern_atom("_NET_WM_NAME")
            self._utf8 = self._d.intern_atom("UTF8_STRING")
            self._net_pid = self._d.intern_atom("_NET_WM_PID")
            self._res = self._d.has_extension("X-Resource")
        return self._d

    def _pid_in(self, w, depth=0) -> int | None:
        """The process owning the client window at w or below it (a window manager's frame holds
        the client as a child): the one that sets WM_CLASS or _NET_WM_PID."""
        try:
            p = w.get_full_property(self._net_pid, 0)
            net_wm_pid = int(p.value[0]) if p is not None and len(p.value) else None
            if net_wm_pid is not None or w.get_wm_class():
                return self._owner(w, net_wm_pid)
            if depth >= 3:
                return None
            children = w.query_tree().children
        except Exception:  # the window may vanish between the calls
            return None
        for c in reversed(children):  # the top-most first
            pid = self._pid_in(c, depth + 1)
            if pid is not None:
                return pid
        return None

    def _owner(self, w, net_wm_pid) -> int | None:
        """The pid of the client that made window w. The X server's own answer (X-Resource: the
        peer of the client's socket, right also for a Flatpak app in its own pid namespace) when
        it has one; else _NET_WM_PID, which the client sets itself and which counts only when the
        client runs on this machine (WM_CLIENT_MACHINE), as the EWMH says."""
        if self._res:
            try:
                from Xlib.ext import res

                for cid in self._d.res_query_client_ids([{"client": w.id, "mask": res.LocalClientPIDMask}]).ids:
                    if cid.spec.mask == res.LocalClientPIDMask and len(cid.value):
                        return int(cid.value[0])
            except Exception:  # the window may be gone; fall back to the property
                pass
        if net_wm_pid is None:
            return None
        machine = w.get_wm_client_machine()
        machine = machine.decode("latin-1") if isinstance(machine, bytes) else machine
        return net_wm_pid if machine in (None, "", socket.gethostname()) else None

    def _focused(self):
        """The focused top-level window (an Xlib window), or None."""
        d = self._display()
        root = d.screen().root
        p = root.get_full_property(self._net_active, 0)  # a window manager's answer
        if p is not None and p.value and p.value[0]:
            return d.create_resource_object("window", p.value[0])
        focus = d.get_input_focus().focus
        if isinstance(focus, int) or focus == root:  # PointerRoot / None: the window under the pointer
            return root.query_pointer().child or None
        return focus

    def focused_pid(self) -> int | None:
        """The process that owns the focused window, where it says (_NET_WM_PID); else None."""
        if not self.available:
            return None
        try:
            w = self._focused()
            return self._pid_in(w) if w else None
        except Exception:  # no X: unknown
            return None

    def pid_at(self, x: int, y: int) -> int | None:
        """The process owning the top-most window at screen point (x, y), or None."""
        if not self.available:
            return None
        try:
            root = self._display().screen().root
            child = root.translate_coords(root, int(x), int(y)).child  # stacking-aware
            return self._pid_in(child) if child else None
        except Exception:
            return None

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
        except Exception:  # the window may vanish between the calls
            return None, None
        return title or None, (cls[1] if cls else None)

    def _named_in(self, w, depth=0) -> tuple[str | None, str | None]:
        """The first title found at w or below it (clients are often children of a frame)."""
        title, cls = self._name(w)
        if title or cls or depth > 3:
            return title, cls
        try:
            children = w.query_tree().children
        except Exception:
            return None, None
        for c in reversed(children):
            title, cls = self._named_in(c, depth + 1)
            if title or cls:
                return title, cls
        return None, None

    def describe(self) -> tuple[str | None, str | None, int | None]:
        """(title, app class, owning pid) of the focused window, each None when unknown: what
        the agent's gate reads before each action."""
        if not self.available:
            return None, None, None
        try:
            w = self._focused()
            if not w:
                return None, None, None
            title, cls = self._named_in(w)
            return title, cls, self._pid_in(w)
        except Exception:  # no X, or a window gone: unknown, never a crash
            return None, None, None

    def get(self) -> tuple[str | None, str | None]:
        """(title, app class) of the focused window; (None, None) when unknown."""
        if not self.available:
            return None, None
        try:
            w = self._focused()
            return self._named_in(w) if w else (None, None)
        except Exception:  # no X, or a window gone: unknown, never a crash
            return None, None

    def close(self) -> None:
        if self._d is not None:
            try:
                self._d.close()
            except Exception:
                pass
            self._d = None
