"""A small offscreen desktop made of real Qt widgets: one app window plus its popups.

The sandbox is the only place outside app/ that imports PySide6. Everything Qt happens in
the process that owns the QApplication (one per process; an existing one, e.g. pytest-qt's,
is reused). A `Screen` is one app window at the screen origin; `render()` paints it and
every open popup, menu and dialog into one RGB array, and `perform()` turns a schema Action
(normalized points) into real input events, delivered the way the window system would: to
the popup that holds the mouse, else to the topmost window under the point, so modality,
focus-on-click, context menus, popups closing on an outside click and implicit mouse grabs
are Qt's own behaviour, not ours.
"""
from __future__ import annotations

import os

import numpy as np

from agent.schema import Action
from trainer.errors import TrainerError

_APP = None
_NOISE = ("This plugin does not support", "Mouse event at")  # offscreen and QTest noise: a press outside a popup is how it closes


class SandboxError(TrainerError):
    """A sandbox problem (bad family, seed, size or action), named with the offending value."""


def _immortal_none() -> None:
    """PySide6 (6.12 here) on Python 3.11 drops a reference to None each time a wrapped function
    returns a null pointer (activePopupWidget(), parentWidget(), QLabel.buddy(), childAt() over
    nothing...): a long sandbox run brings None's count to zero and the process aborts with
    "deallocating None". Python 3.12 made None immortal; here its count is raised out of reach."""
    import ctypes
    import sys

    if sys.version_info < (3, 12) and sys.implementation.name == "cpython" and sys.getrefcount(None) < 1 << 40:
        ctypes.c_ssize_t.from_address(id(None)).value += 1 << 48  # ob_refcnt is a PyObject's first field


def ensure_app():
    """The process's QApplication, created offscreen if none exists yet."""
    global _APP
    _immortal_none()
    from PySide6.QtCore import QCoreApplication, Qt, qInstallMessageHandler
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance()
    if app is None:
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
        QCoreApplication.setAttribute(Qt.AA_ShareOpenGLContexts, True)
        app = QApplication(["tandem-sandbox"])
        app.setStyle("Fusion")  # our own process: the same look on every platform
    if _APP is not app:
        _APP = app

        def quiet(mode, ctx, msg, _prev=[None]):  # noqa: B006 - drop only the known noise
            if not msg.startswith(_NOISE):
                import sys

                print(msg, file=sys.stderr)

        qInstallMessageHandler(quiet)
        # Determinism: no blinking caret, no animated popups; screenshots depend only on state.
        app.setCursorFlashTime(0)
        for effect in (Qt.UI_AnimateCombo, Qt.UI_AnimateMenu, Qt.UI_FadeMenu, Qt.UI_AnimateTooltip,
                       Qt.UI_FadeTooltip, Qt.UI_AnimateToolBox):
            app.setEffectEnabled(effect, False)
    return app


# UI-TARS key names -> Qt keys
def _qt_key(name: str):
    from PySide6.QtCore import Qt

    named = {
        "enter": Qt.Key_Return, "return": Qt.Key_Return, "tab": Qt.Key_Tab, "space": Qt.Key_Space,
        "backspace": Qt.Key_Backspace, "delete": Qt.Key_Delete, "del": Qt.Key_Delete, "esc": Qt.Key_Escape,
        "escape": Qt.Key_Escape, "home": Qt.Key_Home, "end": Qt.Key_End, "pageup": Qt.Key_PageUp,
        "pagedown": Qt.Key_PageDown, "up": Qt.Key_Up, "down": Qt.Key_Down, "left": Qt.Key_Left,
        "right": Qt.Key_Right, "insert": Qt.Key_Insert, "plus": Qt.Key_Plus, "minus": Qt.Key_Minus,
        "capslock": Qt.Key_CapsLock, "printscreen": Qt.Key_Print,
    }
    named.update({f"f{i}": getattr(Qt, f"Key_F{i}") for i in range(1, 13)})
    if name in named:
        return named[name]
    if len(name) == 1:
        return Qt.Key(ord(name.upper()))
    raise SandboxError(f"unknown key {name!r}")


def _modifier(name: str):
    from PySide6.QtCore import Qt

    return {
        "ctrl": Qt.ControlModifier, "control": Qt.ControlModifier, "alt": Qt.AltModifier,
        "option": Qt.AltModifier, "shift": Qt.ShiftModifier, "win": Qt.MetaModifier, "super": Qt.MetaModifier,
        "meta": Qt.MetaModifier, "cmd": Qt.MetaModifier, "command": Qt.MetaModifier,
    }.get(name)


class Screen:
    """One app window of `width`x`height` pixels at the screen origin, and its popups."""

    WHEEL_NOTCHES = 3  # one scroll action = three wheel notches

    def __init__(self, width: int = 320, height: int = 240):
        if not (64 <= width <= 4096 and 64 <= height <= 4096):
            raise SandboxError(f"screen size must be 64..4096 pixels a side, got {width}x{height}")
        self.app = ensure_app()
        from PySide6.QtWidgets import QWidget

        self.width, self.height = width, height
        self.window = QWidget()
        self.window.setObjectName("sandbox-window")
        self.window.setAttribute(self._qt().WA_DontShowOnScreen, False)
        self.window.setWindowFlags(self._qt().FramelessWindowHint)
        self.window.setFixedSize(width, height)
        self.window.move(0, 0)
        self._closed = False

    @staticmethod
    def _qt():
        from PySide6.QtCore import Qt

        return Qt

    def show(self) -> None:
        from PySide6.QtTest import QTest

        self.window.show()
        self.window.move(0, 0)
        QTest.qWaitForWindowExposed(self.window, 1000)
        self.settle()

    def settle(self) -> None:
        """Let Qt deliver what the last input posted (popups opening, layouts, deferred deletes)."""
        self.app.processEvents()
        self.app.processEvents()
        self._keep_on_screen()

    def _keep_on_screen(self) -> None:
        """Move popups and dialogs inside our screen, as a real screen edge would (the offscreen
        platform's screen is larger than ours, so Qt itself does not flip them)."""
        for w in self.windows()[1:]:
            g = w.geometry()
            x = min(max(0, g.x()), max(0, self.width - g.width()))
            y = min(max(0, g.y()), max(0, self.height - g.height()))
            if (x, y) != (g.x(), g.y()):
                w.move(x, y)
                self.app.processEvents()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for w in self.windows():
            w.hide()
        self.window.hide()
        self.window.deleteLater()
        self.settle()

    # ------------------------------------------------------------ windows
    def windows(self) -> list:
        """Visible top-level widgets, bottom to top: the app window, dialogs, then popups."""
        from PySide6.QtWidgets import QApplication

        Qt = self._qt()
        tops = [w for w in QApplication.topLevelWidgets() if w.isVisible() and w is not self.window and self._ours(w)]
        dialogs = [w for w in tops if w.windowType() != Qt.Popup]
        popups = [w for w in tops if w.windowType() == Qt.Popup]
        modal = QApplication.activeModalWidget()
        if modal in dialogs:  # the modal one is on top of the other dialogs
            dialogs.remove(modal)
            dialogs.append(modal)
        active = QApplication.activePopupWidget()
        if active in popups:
            popups.remove(active)
            popups.append(active)
        return ([self.window] if self.window.isVisible() else []) + dialogs + popups

    def _ours(self, w) -> bool:
        """Top-levels that belong to this screen (a shared QApplication may hold others)."""
        p = w
        while p is not None:
            if p is self.window:
                return True
            p = p.parentWidget() if p.parentWidget() is not None else getattr(p, "_sandbox_owner", None)
        return False

    def top_window(self):
        """Where keys go: the open popup, else the modal dialog, else the topmost window."""
        from PySide6.QtWidgets import QApplication

        popup = QApplication.activePopupWidget()
        if popup is not None and self._ours(popup):
            return popup
        modal = QApplication.activeModalWidget()
        if modal is not None and self._ours(modal):
            return modal
        return self.windows()[-1] if self.windows() else self.window

    def window_at(self, x: int, y: int):
        """The window a press at screen pixel (x, y) goes to, as the window system would route it."""
        from PySide6.QtCore import QPoint
        from PySide6.QtWidgets import QApplication

        popup = QApplication.activePopupWidget()
        if popup is not None and self._ours(popup):
            return popup  # a popup holds the mouse: an outside press closes it
        for w in reversed(self.windows()):
            if w.geometry().contains(QPoint(x, y)):
                return w  # Qt itself blocks this press when a modal dialog is open elsewhere
        return self.window

    # ------------------------------------------------------------ pixels
    def render(self) -> np.ndarray:
        """The screen as an HxWx3 uint8 RGB array: the window, its dialogs and popups."""
        from PySide6.QtGui import QColor, QImage, QPainter

        img = QImage(self.width, self.height, QImage.Format_RGB888)
        img.fill(QColor(40, 44, 52))
        p = QPainter(img)
        for w in self.windows():
            g = w.geometry()
            if w is not self.window and w.windowType() != self._qt().Popup:
                self._paint_frame(p, w)
            p.drawPixmap(g.topLeft(), w.grab())
        p.end()
        ptr = img.constBits()
        arr = np.frombuffer(ptr, np.uint8, img.sizeInBytes()).reshape(self.height, img.bytesPerLine())
        return arr[:, : self.width * 3].reshape(self.height, self.width, 3).copy()

    def _paint_frame(self, p, w) -> None:
        """A dialog's title bar and border (the offscreen platform draws no decorations)."""
        from PySide6.QtCore import QRect, Qt
        from PySide6.QtGui import QColor, QFont

        g = w.geometry()
        bar = QRect(g.x() - 1, g.y() - 18, g.width() + 2, 18)
        p.fillRect(bar, QColor(w.property("titleColor") or "#3c4a5e"))
        p.setPen(QColor(110, 110, 110))
        p.drawRect(QRect(g.x() - 1, g.y() - 18, g.width() + 1, g.height() + 18))
        p.setPen(QColor("white"))
        f = QFont(w.font())
        f.setBold(True)
        p.setFont(f)
        p.drawText(bar.adjusted(6, 0, -4, 0), Qt.AlignVCenter | Qt.AlignLeft, w.windowTitle())

    def elements(self) -> list:
        """The screen's element list (agent.elements.Element, screenshot pixels): what a user can act
        on in every visible window, bottom to top (trainer.sandbox.elements)."""
        from trainer.sandbox.elements import screen_elements  # lazy: cycle with trainer.sandbox.elements

        return screen_elements(self)

    # ------------------------------------------------------------ geometry
    @staticmethod
    def shown_rect(widget):
        """The part of the widget its parents do not clip away (its whole rect when unknown)."""
        vis = widget.visibleRegion().boundingRect()
        return vis if not vis.isEmpty() else widget.rect()

    def point_of(self, widget, rect=None) -> tuple[float, float]:
        """The normalized screen point at the centre of `rect` (widget coordinates) or the widget."""
        r = (rect if rect is not None else widget.rect()).intersected(self.shown_rect(widget))
        g = widget.mapToGlobal(r.center())
        if not (0 <= g.x() < self.width and 0 <= g.y() < self.height):
            raise SandboxError(f"{widget.objectName() or type(widget).__name__} at ({g.x()}, {g.y()}) is off the {self.width}x{self.height} screen")
        return ((g.x() + 0.5) / self.width, (g.y() + 0.5) / self.height)

    def box_of(self, widget, rect=None) -> tuple[float, float, float, float]:
        """The normalized screen box (x0, y0, x1, y1) of `rect` (widget coordinates) or the widget, as shown."""
        r = (rect if rect is not None else widget.rect()).intersected(self.shown_rect(widget))
        tl, br = widget.mapToGlobal(r.topLeft()), widget.mapToGlobal(r.bottomRight())
        return (tl.x() / self.width, tl.y() / self.height, (br.x() + 1) / self.width, (br.y() + 1) / self.height)

    def visible_on_screen(self, widget, rect=None) -> bool:
        r = (rect if rect is not None else widget.rect()).intersected(self.shown_rect(widget))
        if r.isEmpty():
            return False
        tl, br = widget.mapToGlobal(r.topLeft()), widget.mapToGlobal(r.bottomRight())
        return widget.isVisible() and tl.x() >= 0 and tl.y() >= 0 and br.x() < self.width and br.y() < self.height

    def pixel(self, point) -> tuple[int, int]:
        x = min(self.width - 1, max(0, int(point[0] * self.width)))
        y = min(self.height - 1, max(0, int(point[1] * self.height)))
        return x, y

    # ------------------------------------------------------------ input
    def perform(self, action: Action) -> None:
        """Deliver one action as real Qt input. Raises SandboxError for what cannot be done.

        Some Qt widgets answer input with a blocking loop of their own (a text field's context
        menu runs QMenu.exec, dragging selected text runs QDrag.exec). Such a loop would stall
        the env, so a watchdog timer ends it the way a person would: the drag is dropped where
        the drag action ends, a menu or dialog is dismissed with Escape.
        """
        from PySide6.QtCore import QThread, QTimer

        base = QThread.currentThread().loopLevel()
        self._drop_at = None
        nested = []

        def watchdog():
            if QThread.currentThread().loopLevel() > base:
                nested.append(action.name)
                self._end_nested_loop()

        timer = QTimer()
        timer.setInterval(0)
        timer.timeout.connect(watchdog)
        timer.start()
        try:
            self._perform(action)
        finally:
            timer.stop()
        self.nested_loops = nested

    def _end_nested_loop(self) -> None:
        from PySide6.QtCore import QPoint
        from PySide6.QtTest import QTest

        Qt = self._qt()
        if self._drop_at is not None and self.app.activePopupWidget() is None:
            x, y = self._drop_at
            self._drop_at = None
            w = self.window_at(x, y)
            QTest.mouseMove(w.windowHandle(), w.mapFromGlobal(QPoint(x, y)))
            QTest.mouseRelease(w.windowHandle(), Qt.LeftButton, Qt.NoModifier, w.mapFromGlobal(QPoint(x, y)))
            return
        QTest.keyClick(self._key_target(), Qt.Key_Escape)

    def _perform(self, action: Action) -> None:
        from PySide6.QtCore import QPoint
        from PySide6.QtTest import QTest
        from shiboken6 import isValid

        Qt = self._qt()
        name, args = action.name, action.args
        if name in ("click", "left_double", "right_single"):
            self._pointer_moved_on()
            x, y = self.pixel(args["start_box"])
            w = self.window_at(x, y)
            local = w.mapFromGlobal(QPoint(x, y))
            win = w.windowHandle()
            if name == "click":
                QTest.mouseClick(win, Qt.LeftButton, Qt.NoModifier, local)
            elif name == "right_single":
                QTest.mouseClick(win, Qt.RightButton, Qt.NoModifier, local)
            else:
                QTest.mouseDClick(win, Qt.LeftButton, Qt.NoModifier, local)
        elif name == "drag":
            x0, y0 = self.pixel(args["start_box"])
            x1, y1 = self.pixel(args["end_box"])
            w = self.window_at(x0, y0)
            win = w.windowHandle()
            self._drop_at = (x1, y1)  # where a real drag-and-drop (QDrag) started by this press lands
            QTest.mousePress(win, Qt.LeftButton, Qt.NoModifier, w.mapFromGlobal(QPoint(x0, y0)))
            for k in range(1, 9):  # the mouse travels; the press's window keeps the grab
                if not (isValid(w) and isValid(win)):  # it closed and was deleted (a text field's context menu)
                    break
                t = k / 8
                QTest.mouseMove(win, w.mapFromGlobal(QPoint(round(x0 + (x1 - x0) * t), round(y0 + (y1 - y0) * t))))
                self.app.processEvents()
            if isValid(w) and isValid(win):
                QTest.mouseRelease(win, Qt.LeftButton, Qt.NoModifier, w.mapFromGlobal(QPoint(x1, y1)))
        elif name == "scroll":
            self._wheel(args.get("start_box"), args["direction"])
        elif name == "type":
            self._type(str(args.get("content", "")))
        elif name == "hotkey":
            self._hotkey(str(args["key"]))
        elif name in ("wait", "finished", "call_user"):
            pass
        else:
            raise SandboxError(f"action {name!r} is not available in the sandbox")
        self.settle()

    def _pointer_moved_on(self) -> None:
        """A combo box's popup ignores a release for a double-click interval after the press that
        opened it, unless the pointer has moved more than 9 pixels since (Qt's guard against the
        opening click picking an entry). No time passes between env steps, so a click on an entry
        just below the combo (a popup moved up to stay on screen) would be ignored; a person's hand
        has moved on by then, so the popup is told so: a move far outside its list (no entry hovered)."""
        from PySide6.QtCore import QEvent, QPointF
        from PySide6.QtGui import QMouseEvent
        from PySide6.QtWidgets import QComboBox

        Qt = self._qt()
        popup = self.app.activePopupWidget()
        if popup is None or not isinstance(popup.parentWidget(), QComboBox) or not self._ours(popup):
            return
        vp = popup.parentWidget().view().viewport()
        far = QPointF(-10 * self.width, -10 * self.height)
        ev = QMouseEvent(QEvent.MouseMove, far, vp.mapToGlobal(far), Qt.NoButton, Qt.NoButton, Qt.NoModifier)
        self.app.sendEvent(vp, ev)

    def _wheel(self, point, direction: str) -> None:
        from PySide6.QtCore import QPoint, QPointF, Qt
        from PySide6.QtGui import QWheelEvent

        x, y = self.pixel(point) if point is not None else (self.width // 2, self.height // 2)
        w = self.window_at(x, y)
        target = w.childAt(w.mapFromGlobal(QPoint(x, y))) or w
        local = target.mapFromGlobal(QPoint(x, y))
        step = 120 * self.WHEEL_NOTCHES
        delta = {"up": QPoint(0, step), "down": QPoint(0, -step), "left": QPoint(step, 0), "right": QPoint(-step, 0)}[direction]
        ev = QWheelEvent(QPointF(local), QPointF(x, y), QPoint(0, 0), delta, Qt.NoButton, Qt.NoModifier,
                         Qt.NoScrollPhase, False)
        self.app.sendEvent(target, ev)  # unaccepted wheels climb to the parents, as in Qt

    def _key_target(self):
        """The widget keys go to: the focus widget inside the popup/modal/top window, else that window."""
        top = self.top_window()
        fw = self.app.focusWidget()
        if fw is not None and (fw is top or top.isAncestorOf(fw)):
            return fw
        return top.focusWidget() or top

    def _type(self, text: str) -> None:
        from PySide6.QtTest import QTest

        Qt = self._qt()
        parts = text.split("\n")
        for i, part in enumerate(parts):
            if part:
                QTest.keyClicks(self._key_target(), part)
            if i < len(parts) - 1:
                QTest.keyClick(self._key_target(), Qt.Key_Return)
            self.app.processEvents()

    def _hotkey(self, combo: str) -> None:
        from PySide6.QtTest import QTest

        Qt = self._qt()
        mods, key = Qt.NoModifier, None
        for part in combo.lower().replace("+", " ").split():
            m = _modifier(part)
            if m is not None:
                mods |= m
            else:
                key = _qt_key(part)
        if key is None:
            raise SandboxError(f"hotkey {combo!r} presses only modifiers")
        QTest.keyClick(self._key_target(), key, mods)
