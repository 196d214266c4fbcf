"""Where some of the app's windows are on screen, copied from Qt on the GUI thread (refresh) and
read from other threads (rects, at): the recorder leaves out input aimed at the app, and Drive
hides its control strip from the screenshots the agent sees.

Rectangles are in the OS input space that pynput and mss use: device pixels on X11 and Windows
(Qt's geometry times the device pixel ratio), points on macOS (Qt's geometry as is)."""
from __future__ import annotations

import threading

from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QApplication


class WindowRects:
    def __init__(self, widgets=None):
        """widgets: a callable giving the top-level widgets to follow (default: all of the app's)."""
        self._widgets = widgets or QApplication.topLevelWidgets
        self._lock = threading.Lock()
        self._rects: list[tuple[int, int, int, int]] = []
        self._active = False

    def refresh(self) -> None:
        points = QGuiApplication.platformName() == "cocoa"
        rects = []
        for w in self._widgets():
            if w.isVisible() and not w.isMinimized():
                g, r = w.frameGeometry(), 1.0 if points else w.devicePixelRatioF()
                rects.append((round(g.x() * r), round(g.y() * r), round(g.width() * r), round(g.height() * r)))
        active = QGuiApplication.applicationState() == Qt.ApplicationActive
        with self._lock:
            self._rects, self._active = rects, active

    def rects(self) -> list[tuple[int, int, int, int]]:
        with self._lock:
            return list(self._rects)

    def at(self, x: int, y: int) -> bool:
        return any(rx <= x < rx + rw and ry <= y < ry + rh for rx, ry, rw, rh in self.rects())

    def active(self) -> bool:
        """Whether the app has the keyboard (one of its windows is active)."""
        with self._lock:
            return self._active
