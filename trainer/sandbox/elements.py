"""The sandbox screen's element list: its real widgets as agent.elements.Element entries.

`screen_elements(screen)` walks every visible window of a Screen bottom to top (the app window,
dialogs, popups: combo lists, menus, context menus) and lists what a user can act on or read as
a target, each with its box in screenshot pixels (the pixel space of Screen.render(); x1, y1
exclusive). A click at the centre of a box acts on its element: a check box's box is its box and
label (where it reacts, not its empty right part), a list row's box is its part inside the
viewport, a tab's box leaves out the tab bar's scroll arrows, and a box partly covered by a
window above it (a popup, a dialog with its title bar) shrinks to its largest uncovered part; a
fully covered one is left out. Plain labels appear only as the names of the fields they label;
a family lists a widget of its own (a card to drag, a drop zone) by giving it the dynamic
property "elementRole" (its name: "elementName", else its text).
"""
from __future__ import annotations

from agent.elements import Element
from trainer.sandbox.screen import Screen
from trainer.sandbox.task import Task

MIN_SIDE = 3  # a clipped box thinner than this (a row's last pixels at a viewport edge) is left out
DIALOG_BAR = 18  # the title bar Screen._paint_frame draws above a dialog


def plain(text: str) -> str:
    """A Qt text without its mnemonic marks ('&Save' -> 'Save', '&&' -> '&'), on one line."""
    return " ".join(str(text).replace("&&", "\0").replace("&", "").replace("\0", "&").split())


def shown_tab_rect(bar, index: int):
    """The part of tab `index` that its QTabBar shows (bar coordinates): clipped by the bar's
    parents and stopping before the scroll arrows, which cover the bar's right end."""
    from PySide6.QtWidgets import QToolButton

    part = bar.tabRect(index).intersected(Screen.shown_rect(bar))
    arrows = [b for b in bar.findChildren(QToolButton) if b.isVisible()]
    if arrows:
        part.setRight(min(part.right(), min(b.geometry().left() for b in arrows) - 1))
    return part


def screen_elements(screen) -> list[Element]:
    """Every element of `screen` (a trainer.sandbox.screen.Screen), window by window bottom to top,
    in widget order inside each."""
    return [e for e, _ in element_targets(screen)]


def element_targets(screen) -> list[tuple[Element, object]]:
    """screen_elements() with, for each element, a probe `hit(x, y) -> bool`: whether a press at
    screen pixel (x, y) reaches this element (its window takes the press, the widget under the point
    is its widget or inside it, and the row, tab, menu action or click area there is this one)."""
    windows = screen.windows()
    out = []
    for k, win in enumerate(windows):
        covers = [_cover(screen, w) for w in windows[k + 1:]]
        walker = _Walker(screen, win)
        walker.walk(win)
        for e, hit in walker.found:
            box = _uncovered(e.box, covers)
            if box is not None:
                out.append((Element(e.role, e.name, box, e.states, e.value), hit))
    return out


def _cover(screen, w) -> tuple[int, int, int, int]:
    """The screen pixels a window hides: its geometry, plus the frame and title bar drawn around a dialog."""
    g = w.geometry()
    x0, y0, x1, y1 = g.x(), g.y(), g.x() + g.width(), g.y() + g.height()
    if w is not screen.window and w.windowType() != screen._qt().Popup:
        x0, y0, x1, y1 = x0 - 1, y0 - DIALOG_BAR, x1 + 1, y1 + 1
    return (x0, y0, x1, y1)


def _uncovered(box, covers):
    """`box` less the windows above it: its largest uncovered rectangle, or None when none is left."""
    for cx0, cy0, cx1, cy1 in covers:
        x0, y0, x1, y1 = box
        if cx0 >= x1 or cx1 <= x0 or cy0 >= y1 or cy1 <= y0:
            continue
        pieces = [(x0, y0, min(x1, cx0), y1), (max(x0, cx1), y0, x1, y1),
                  (x0, y0, x1, min(y1, cy0)), (x0, max(y0, cy1), x1, y1)]
        pieces = [p for p in pieces if p[2] - p[0] >= MIN_SIDE and p[3] - p[1] >= MIN_SIDE]
        if not pieces:
            return None
        box = max(pieces, key=lambda p: (p[2] - p[0]) * (p[3] - p[1]))
    return box


class _Walker:
    """One window's widget tree, depth first, collecting Elements (boxes before occlusion)."""

    def __init__(self, screen, window):
        self.screen, self.window = screen, window
        self.found: list[tuple[Element, object]] = []
        self._labels = None

    # ------------------------------------------------------------ geometry
    def box(self, widget, rect=None):
        """The screen box of `rect` (widget coordinates; the whole widget by default) as shown:
        clipped by the widget's parents and the screen; None when too little of it is left."""
        r = (rect if rect is not None else widget.rect()).intersected(Screen.shown_rect(widget))
        if r.isEmpty():
            return None
        tl = widget.mapToGlobal(r.topLeft())
        x0, y0 = max(0, tl.x()), max(0, tl.y())
        x1, y1 = min(self.screen.width, tl.x() + r.width()), min(self.screen.height, tl.y() + r.height())
        if x1 - x0 < MIN_SIDE or y1 - y0 < MIN_SIDE:
            return None
        return (x0, y0, x1, y1)

    def add(self, role, name, widget, rect=None, states=(), value=None, part=None):
        """List an element; `part(point)` (widget coordinates) tells whether a press there is on it
        (a row, a tab, a menu action, a click area), where the widget alone does not."""
        box = self.box(widget, rect)
        if box is None:
            return
        from PySide6.QtCore import QPoint

        screen, window = self.screen, self.window

        def hit(x: int, y: int) -> bool:
            if screen.window_at(x, y) is not window:
                return False
            under = window.childAt(window.mapFromGlobal(QPoint(x, y))) or window
            if under is not widget and not widget.isAncestorOf(under):
                return False
            return part is None or bool(part(widget.mapFromGlobal(QPoint(x, y))))

        self.found.append((Element(role, name, box, tuple(states), value), hit))

    # ------------------------------------------------------------ walk
    def walk(self, widget) -> None:
        from PySide6.QtWidgets import (
            QAbstractButton,
            QAbstractItemView,
            QAbstractSlider,
            QAbstractSpinBox,
            QComboBox,
            QLineEdit,
            QMenu,
            QMenuBar,
            QPlainTextEdit,
            QSlider,
            QTabBar,
            QTextEdit,
        )

        if widget is not self.window:
            if widget.isWindow() or not widget.isVisible():
                return
            if isinstance(widget, QAbstractButton):
                return self.button(widget)
            if isinstance(widget, QComboBox):
                return self.combo(widget)
            if isinstance(widget, (QLineEdit, QAbstractSpinBox, QTextEdit, QPlainTextEdit)):
                return self.text_field(widget)
            if isinstance(widget, QSlider):
                return self.slider(widget)
            if isinstance(widget, QAbstractSlider):  # scroll bars and dials: not targets
                return
            if isinstance(widget, QAbstractItemView):
                return self.items(widget)
        if isinstance(widget, QTabBar):
            self.tabs(widget)  # then its scroll arrows, children buttons
        elif isinstance(widget, (QMenuBar, QMenu)):
            self.menu(widget)
        if widget is not self.window and self.tagged(widget, "elementRole"):  # a family's own target
            name = widget.property("elementName") if self.tagged(widget, "elementName") else (
                widget.text() if hasattr(widget, "text") else "")
            self.add(str(widget.property("elementRole")), plain(name), widget)
            return
        for child in self.children(widget):
            self.walk(child)

    @staticmethod
    def tagged(widget, name: str) -> bool:
        """Whether the widget has dynamic property `name` (asked first: property() of an unset one
        returns None, which leaks a reference to None in PySide; see screen._immortal_none)."""
        return any(bytes(n) == name.encode() for n in widget.dynamicPropertyNames())

    @staticmethod
    def children(widget) -> list:
        """The visible child widgets in reading order: by vertical centre (a grid's row of buttons of
        unequal heights is one line), then left to right; sorted() is stable, so ties keep tree order.
        (Not the layouts' own order: wrappers of the QLayoutItems that itemAt() hands out outlive
        their items in PySide and corrupt its wrapper map.)"""
        from PySide6.QtWidgets import QWidget

        kids = [c for c in widget.children() if isinstance(c, QWidget) and not c.isWindow() and c.isVisible()]
        return sorted(kids, key=lambda c: (2 * c.geometry().y() + c.geometry().height(), c.geometry().x()))

    # ------------------------------------------------------------ kinds
    def button(self, b) -> None:
        from PySide6.QtWidgets import QCheckBox, QRadioButton

        states = [] if b.isEnabled() else ["disabled"]
        if isinstance(b, (QCheckBox, QRadioButton)):
            if b.isChecked():
                states.append("checked")
            role = "checkbox" if isinstance(b, QCheckBox) else "radio"
            rect = Task._toggle_rects(b)[0]
            return self.add(role, plain(b.text()), b, rect, states, part=rect.contains)
        if b.isCheckable() and b.isChecked():
            states.append("checked")
        self.add("button", self.button_name(b), b, None, states)

    @staticmethod
    def button_name(b) -> str:
        from PySide6.QtCore import Qt
        from PySide6.QtWidgets import QToolButton

        name = plain(b.text()) or plain(b.toolTip()) or b.accessibleName()
        if not name and isinstance(b, QToolButton):  # a tab bar's scroll arrows, a menu bar's overflow
            name = {Qt.LeftArrow: "scroll left", Qt.RightArrow: "scroll right", Qt.UpArrow: "scroll up",
                    Qt.DownArrow: "scroll down"}.get(b.arrowType(), "")
            if not name and b.objectName() == "qt_menubar_ext_button":
                name = "more menus"
        return name

    def combo(self, c) -> None:
        states = [] if c.isEnabled() else ["disabled"]
        if c.view().isVisible():
            states.append("expanded")
        if c.isEditable():
            states.append("editable")
        self.add("combo", self.label_of(c) or plain(c.currentText()), c, None, states, c.currentText())

    def text_field(self, w) -> None:
        from PySide6.QtWidgets import QAbstractSpinBox, QApplication, QLineEdit, QPlainTextEdit, QTextEdit

        edit = w.findChild(QLineEdit) if isinstance(w, QAbstractSpinBox) else w
        states = [] if w.isEnabled() else ["disabled"]
        focus = QApplication.focusWidget()
        if focus is not None and (focus is w or w.isAncestorOf(focus)):
            states.append("focused")
        placeholder = edit.placeholderText() if hasattr(edit, "placeholderText") else ""
        name = self.label_of(w) or plain(placeholder)
        if isinstance(edit, QLineEdit) and edit.echoMode() in (QLineEdit.Password, QLineEdit.PasswordEchoOnEdit):
            return self.add("text_field", name, w, None, states + ["password"], None)
        if isinstance(w, QAbstractSpinBox):
            value = w.text()
        elif isinstance(w, (QPlainTextEdit, QTextEdit)):
            value = w.toPlainText()
        else:
            value = w.text()
        self.add("text_field", name, w, None, states, value)

    def slider(self, s) -> None:
        from PySide6.QtWidgets import QStyle, QStyleOptionSlider

        opt = QStyleOptionSlider()
        s.initStyleOption(opt)
        groove = s.style().subControlRect(QStyle.CC_Slider, opt, QStyle.SC_SliderGroove, s)
        states = [] if s.isEnabled() else ["disabled"]
        self.add("slider", self.label_of(s), s, groove, states, f"{s.value()} of {s.minimum()}-{s.maximum()}",
                 part=groove.contains)

    def items(self, view) -> None:
        """A list's (table's, tree's) rows that show inside its viewport, clipped to it."""
        from PySide6.QtCore import QModelIndex, Qt
        from PySide6.QtWidgets import QListView, QTableView, QTreeView

        model, vp = view.model(), view.viewport()
        if model is None:
            return
        sel = view.selectionModel()
        disabled = not view.isEnabled()

        def rows(parent):
            cols = range(model.columnCount(parent)) if isinstance(view, QTableView) else (
                [view.modelColumn()] if isinstance(view, QListView) else [0])
            for r in range(model.rowCount(parent)):
                for c in cols:
                    idx = model.index(r, c, parent)
                    rect = view.visualRect(idx)
                    if rect.isEmpty():
                        continue
                    states = ["selected"] if sel is not None and sel.isSelected(idx) else []
                    if disabled or not (model.flags(idx) & Qt.ItemIsEnabled):
                        states.append("disabled")
                    self.add("list_item", plain_item(model.data(idx, Qt.DisplayRole)), vp,
                             rect.intersected(vp.rect()), states, part=lambda p, idx=idx: view.indexAt(p) == idx)
                first = model.index(r, 0, parent)
                if isinstance(view, QTreeView) and view.isExpanded(first):
                    rows(first)

        rows(view.rootIndex() if view.rootIndex().isValid() else QModelIndex())

    def tabs(self, bar) -> None:
        for i in range(bar.count()):
            if not bar.isTabVisible(i):
                continue
            states = ["selected"] if i == bar.currentIndex() else []
            if not bar.isTabEnabled(i):
                states.append("disabled")
            self.add("tab", plain(bar.tabText(i)), bar, shown_tab_rect(bar, i), states,
                     part=lambda p, i=i: bar.tabAt(p) == i)

    def menu(self, m) -> None:
        """A menu bar's or menu's entries (separators left out) at their action geometry."""
        from PySide6.QtWidgets import QApplication, QMenuBar

        popup = QApplication.activePopupWidget()
        for a in m.actions():
            if a.isSeparator() or not a.isVisible():
                continue
            states = [] if a.isEnabled() else ["disabled"]
            if a.isCheckable() and a.isChecked():
                states.append("checked")
            if isinstance(m, QMenuBar) and a.menu() is not None and popup is a.menu():
                states.append("expanded")
            self.add("menu_item", plain(a.text()), m, m.actionGeometry(a), states,
                     part=lambda p, a=a: m.actionAt(p) is a)

    # ------------------------------------------------------------ labels
    def label_of(self, field) -> str:
        """The text of the label naming `field`: a QLabel whose buddy it is, else the nearest label
        to its left on its row (a form or grid row); '' when it has none."""
        from PySide6.QtCore import QPoint

        if self._labels is None:
            from PySide6.QtWidgets import QLabel

            labels = [lab for lab in self.window.findChildren(QLabel) if lab.isVisible() and plain(lab.text())]
            self._labels = [(lab, lab.buddy()) for lab in labels]  # asked once per frame
        for lab, buddy in self._labels:
            if buddy is field:
                return _label_text(lab)
        top = field.mapTo(self.window, QPoint(0, 0))
        fy0, fy1 = top.y(), top.y() + field.height()
        best, right = None, None
        for lab, _ in self._labels:
            p = lab.mapTo(self.window, QPoint(0, 0))
            cy = p.y() + lab.height() / 2
            end = p.x() + lab.width()
            if fy0 <= cy <= fy1 and end <= top.x() + 2 and (right is None or end > right):
                best, right = lab, end
        return _label_text(best) if best is not None else ""


def _label_text(label) -> str:
    return plain(label.text()).rstrip(":").strip()


def plain_item(data) -> str:
    return " ".join(str(data).split()) if data is not None else ""
