"""The recorder's element lists: the active window's accessibility tree (agent.host.atspi_elements),
read over and over in a thread of its own, so that the list beside an action's pre-action frame
was read before the input began (reading after the input would show what the action did).

The session asks `before(t)` when an input may begin an action and writes the answer as a raw
`elements` event: {t: reading's start, t_end: its end, elements: [Element dicts] | None, source}.
Reduction (agent.recorder.reduce) gives a step the last list read between the previous action's
end and this action's start, after any pause.

Privacy, as for frames: nothing is read while capture is not allowed (paused, a denied window
focused), and a reading that overlaps such a time is dropped. A text field that had the focus
while secret typing was on or a password field was focused keeps its name but loses its value for
the rest of the recording (what was typed there secretly would be in it).
"""
from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass

from agent.host.atspi_elements import AtspiElements
from agent.host.focused_window import FocusedWindow
from agent.schema import ScreenGeometry, monotonic


@dataclass(frozen=True)
class Snapshot:
    seq: int
    t0: float  # when the reading began (monotonic)
    t1: float  # when it ended
    elements: list | None  # [Element], None: no list
    source: str

    def event(self) -> dict:
        return {"t": self.t0, "kind": "elements", "t_end": self.t1, "source": self.source,
                "elements": None if self.elements is None else [e.to_dict() for e in self.elements]}


class ElementWatcher:
    """start() -> before(t)* -> stop(). allowed() False: capture is off (nothing is read);
    masked() True: secret typing or a password field right now. poke(delay) asks for a reading
    `delay` seconds from now (sooner than the next periodic one)."""

    HISTORY = 32

    def __init__(self, geometry: ScreenGeometry, *, allowed=lambda: True, masked=lambda: False,
                 interval: float = 0.3, reader=None):
        self.geometry = geometry
        self.allowed, self.masked = allowed, masked
        self.interval = interval
        self.reader = reader
        self.available = False
        self.reason = "not started"
        self.readings = 0
        self._history: deque[Snapshot] = deque(maxlen=self.HISTORY)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._seq = 0
        self._due: float | None = None  # when a poked reading is to begin
        self._secret_fields: set[tuple[str, str]] = set()  # (role, name) of fields typed into secretly

    def start(self) -> ElementWatcher:
        """Connect (never raises: see `available`, `reason`) and begin reading."""
        if self.reader is None:
            focus = FocusedWindow()  # X focus follows the pointer without a window manager: whose window is it
            self.reader = AtspiElements(focused_pid=focus.focused_pid)
            self._focus = focus
        self.reader.open()
        self.available, self.reason = bool(self.reader.available), self.reader.reason
        if self.available:
            self._wake.set()  # the first reading at once: the first action may come soon
            self._thread = threading.Thread(target=self._run, name="tandem-elements", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(3)
        if self.reader is not None:
            self.reader.close()
        focus = getattr(self, "_focus", None)
        if focus is not None:
            focus.close()

    def poke(self, delay: float = 0.0) -> None:
        self._due = monotonic() + delay
        self._wake.set()

    def clear(self) -> None:
        """Forget every reading (capture stopped being allowed: what was read before must not be
        given to an action after it)."""
        with self._lock:
            self._history.clear()

    def before(self, t: float) -> Snapshot:
        """The last reading that ended before t; where there is none, a snapshot saying why."""
        if not self.available:
            return Snapshot(-1, t, t, None, self.reason)
        with self._lock:
            for s in reversed(self._history):
                if s.t1 <= t:
                    return s
        return Snapshot(-1, t, t, None, "none: no element list was read before this input")

    # ------------------------------------------------------------ the reading thread
    def _run(self) -> None:
        pause = self.interval
        while not self._stop.is_set():
            self._wake.wait(pause)
            self._wake.clear()
            due, self._due = self._due, None
            if due is not None and due > monotonic() and self._stop.wait(due - monotonic()):
                break
            if self._stop.is_set():
                break
            if not self.allowed():
                continue
            t0 = monotonic()
            masked = self.masked()
            reading = self.reader.read(self.geometry)
            t1 = monotonic()
            pause = max(self.interval, t1 - t0)  # a slow tree (a browser) is read at most half the time
            if not self.allowed():
                continue  # capture stopped while it read: what it saw is not kept
            masked = masked or self.masked()
            elements = None if reading.elements is None else self._scrub(reading.elements, masked)
            with self._lock:
                self._seq += 1
                self._history.append(Snapshot(self._seq, t0, t1, elements, reading.source))
            self.readings += 1

    def _scrub(self, elements: list, masked: bool) -> list:
        """Values of text fields typed into secretly taken out (see the module's docstring)."""
        from dataclasses import replace

        if masked:
            self._secret_fields |= {(e.role, e.name) for e in elements if e.role == "text_field" and "focused" in e.states}
        return [replace(e, value=None) if (e.role, e.name) in self._secret_fields else e for e in elements]
