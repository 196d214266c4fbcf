"""What every sandbox task is: widgets built from a seed, a verifier that reads their real state,
and a scripted expert that looks at the same widgets and says what to do next.

A task family subclasses `Task`: `build()` makes the widgets inside `self.body` and sets the
instruction; `check()` returns a `Verdict` from widget state only (never from the actions that
were taken, so acting on the wrong widget cannot pass); `expert()` returns the next
(thought, Action) toward the goal, with targets computed from widget geometry at that moment,
so the expert also recovers from a state someone else left behind.
"""
from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass

from agent.schema import Action
from trainer.sandbox.screen import SandboxError, Screen

HELDOUT_START = 1_000_000  # seeds >= this are kept for evaluation
SEED_LIMIT = 2**31 - 1

RUNNING, SUCCESS, FAILED = "running", "success", "failed"
ROW_HEIGHT = 28  # the model's token grid: a list row this tall never shares a token row with the next


def split_of(seed: int) -> str:
    return "heldout" if seed >= HELDOUT_START else "train"


@dataclass
class Verdict:
    status: str  # running | success | failed (an irreversible mistake)
    progress: float  # 0..1: the fraction of the task's subgoals met
    reason: str = ""


# ------------------------------------------------------------ vocabulary
WORDS = {
    "actions": "Save Open Cancel Delete Apply Export Import Print Share Send Reset Submit Next Back Close Help Edit Copy Paste Undo Redo Refresh Upload Download Archive Search Confirm Retry Skip Login Logout".split(),
    "fruits": "Apple Banana Cherry Mango Pear Peach Plum Grape Lemon Lime Kiwi Melon Orange Papaya Fig Apricot Guava Lychee".split(),
    "colours": "Red Green Blue Yellow Purple Orange Black White Grey Pink Brown Cyan Teal Navy".split(),
    "cities": "Paris London Berlin Madrid Rome Vienna Prague Lisbon Dublin Oslo Helsinki Warsaw Athens Zurich Tokyo Seoul Sydney Toronto Boston Denver Austin Lima Quito Cairo Nairobi Dakar Delhi Mumbai Hanoi Manila Osaka Kyoto Perth Cork Bergen Lyon Porto Seville Milan Naples Munich Hamburg Krakow Riga Tallinn Vilnius Sofia Minsk Kiev Ankara".split(),
    "names": "Alice Bob Carol Dave Erin Frank Grace Heidi Ivan Judy Mallory Niaj Olivia Peggy Rupert Sybil Trent Victor Walter Yara Zoe".split(),
    "fields": "Name Email City Phone Company Title Username Street Country Zip Website Nickname".split(),
    "files": "report.pdf notes.txt budget.xlsx photo.jpg slides.pptx data.csv todo.md invoice.pdf draft.docx song.mp3 backup.zip map.png".split(),
    "settings": "General Network Display Privacy Sound Storage Updates Accounts Power Keyboard".split(),
    "options": "Enable proxy|Auto update|Dark mode|Show hidden files|Send reports|Use cache|Remember me|Notifications|Spell check|Autosave|Sync now|Compact view".split("|"),
    "sizes": "Small Medium Large XL".split(),
    "apps": "Notes Mail Photos Tasks Files Music Calendar Contacts Weather Maps Budget Journal".split(),
}
FONTS = ("DejaVu Sans", "Nimbus Sans", "DejaVu Serif", "URW Gothic", "Nimbus Sans Narrow", "DejaVu Sans Condensed", "Sans Serif")
THEMES = [  # (window, base, text, button, accent, title bar)
    ("#f3f3f3", "#ffffff", "#202020", "#e8e8e8", "#2f6fdb", "#3c4a5e"),
    ("#ece8df", "#fbfaf6", "#2a2723", "#ddd6c8", "#b5651d", "#5b4a3a"),
    ("#e6eef3", "#ffffff", "#16222c", "#d4e1ea", "#1b8a7a", "#23556b"),
    ("#2b2d31", "#1e1f22", "#e6e6e6", "#3a3c41", "#5865f2", "#18191c"),
    ("#f5eef6", "#ffffff", "#2b1d2e", "#e7d9ea", "#9c27b0", "#5e2b66"),
    ("#eef3e6", "#ffffff", "#1f2a16", "#dbe6cc", "#4c8c2b", "#3d5a2a"),
    ("#fff8e6", "#fffdf7", "#2d2406", "#f1e3b8", "#d18f00", "#6b5310"),
    ("#263238", "#1c262b", "#eceff1", "#37474f", "#26a69a", "#11191d"),
]


def tall_rows(widget, height: int = ROW_HEIGHT) -> None:
    """Rows at least `height` pixels tall in a list view or in a combo box's popup list, still
    painted by the view's own delegate (a combo's popup keeps its menu look)."""
    from PySide6.QtWidgets import QComboBox, QStyledItemDelegate

    class TallRows(QStyledItemDelegate):
        def __init__(self, inner, parent):
            super().__init__(parent)
            self.inner = inner

        def paint(self, painter, option, index):
            self.inner.paint(painter, option, index)

        def sizeHint(self, option, index):
            size = self.inner.sizeHint(option, index)
            size.setHeight(max(size.height(), height))
            return size

    view = widget.view() if isinstance(widget, QComboBox) else widget
    if type(view.itemDelegate()).__name__ != "TallRows":  # once only
        inner = view.itemDelegate()
        widget.setItemDelegate(TallRows(inner, inner))  # a child of the delegate it wraps: it never outlives it
    view.setUniformItemSizes(True)


class Task:
    """One generated task. Subclasses set `family`, `level`, `max_steps` and write build/check/expert."""

    family = "base"
    level = 1
    max_steps = 8  # the env truncates after this many steps
    title = "App"

    def __init__(self, seed: int, screen: Screen):
        if not (0 <= int(seed) <= SEED_LIMIT):
            raise SandboxError(f"seed must be 0..{SEED_LIMIT}, got {seed!r}")
        self.seed = int(seed)
        # A family-specific stream, so two families with the same seed differ.
        self.rng = random.Random(f"{self.family}:{self.seed}")
        self.screen = screen
        self.instruction = ""
        self._failed: str | None = None
        self._build_frame()
        self.build()
        self._tall_rows()
        if not self.instruction:
            raise SandboxError(f"family {self.family} built no instruction")

    # ------------------------------------------------------------ to override
    def build(self) -> None:
        raise NotImplementedError

    def check(self) -> Verdict:
        raise NotImplementedError

    def expert(self) -> tuple[str, Action]:
        raise NotImplementedError

    def after_show(self) -> None:
        """Runs once the window is shown and laid out (e.g. to open a dialog or place free widgets)."""

    def after_tool(self, action: Action, output: dict, error: str | None = None) -> None:
        """Runs after a tool action (run_command, read_file, write_file) ran in the env's workspace,
        with what it gave back (agent.schema.Observation.tool_output's dict) and the error where the
        tool could not do it: an app that shows the workspace notices the change here, as a file
        manager watching its folder would."""

    # ------------------------------------------------------------ shared
    def verdict(self) -> Verdict:
        """check(), with an irreversible mistake recorded by a widget signal taking precedence."""
        if self._failed:
            return Verdict(FAILED, self.check().progress, self._failed)
        return self.check()

    def fail(self, reason: str) -> None:
        if not self._failed:
            self._failed = reason

    def pick(self, key: str, k: int | None = None):
        pool = WORDS[key]
        return self.rng.choice(pool) if k is None else self.rng.sample(pool, k)

    def _build_frame(self) -> None:
        """The window chrome: palette, font, a title bar, an optional menu bar, the body."""
        from PySide6.QtGui import QColor, QFont, QFontDatabase, QPalette
        from PySide6.QtWidgets import QLabel, QVBoxLayout, QWidget

        rng = random.Random(f"theme:{self.seed}")
        win, base, text, button, accent, bar = rng.choice(THEMES)
        self.accent = accent
        self.bar_color = bar
        pal = QPalette()
        for role, colour in ((QPalette.Window, win), (QPalette.Base, base), (QPalette.AlternateBase, button),
                             (QPalette.Text, text), (QPalette.WindowText, text), (QPalette.ButtonText, text),
                             (QPalette.Button, button), (QPalette.Highlight, accent),
                             (QPalette.HighlightedText, "#ffffff"), (QPalette.ToolTipBase, base)):
            pal.setColor(role, QColor(colour))
        w = self.screen.window
        w.setPalette(pal)
        w.setAutoFillBackground(True)
        fams = [f for f in FONTS if f in QFontDatabase.families()] or [w.font().family()]
        font = QFont(rng.choice(fams))
        font.setPixelSize(rng.choice((11, 11, 12, 12, 13)))
        w.setFont(font)
        self.font = font
        self.palette = pal
        outer = QVBoxLayout(w)
        outer.setContentsMargins(0, 0, 0, 0)
        outer.setSpacing(0)
        titlebar = QLabel(f"  {self.title}")
        titlebar.setObjectName("titlebar")
        titlebar.setFixedHeight(rng.choice((18, 20, 22)))
        titlebar.setStyleSheet(f"background:{bar}; color:white; font-weight:bold;")
        outer.addWidget(titlebar)
        self.outer = outer
        self.body = QWidget()
        self.body.setObjectName("body")
        outer.addWidget(self.body, 1)
        self.margin = rng.choice((6, 8, 10, 12))
        self.spacing = rng.choice((4, 6, 8))

    def _tall_rows(self) -> None:
        """Every list and combo box popup built gets rows at least ROW_HEIGHT pixels tall."""
        from PySide6.QtWidgets import QComboBox, QListView

        def in_combo(w):
            while w is not None and not isinstance(w, QComboBox):
                w = w.parent()
            return w is not None

        for c in self.screen.window.findChildren(QComboBox):
            tall_rows(c)
        for v in self.screen.window.findChildren(QListView):
            if not in_combo(v):  # a combo's popup list was done with its combo
                tall_rows(v)

    def style_dialog(self, dialog) -> None:
        """Dialogs are top-level windows: give them the app's look and frame colour."""
        dialog.setPalette(self.palette)
        dialog.setFont(self.font)
        dialog.setAutoFillBackground(True)
        dialog.setProperty("titleColor", self.bar_color)

    # ------------------------------------------------------------ expert helpers
    def click(self, widget, rect=None) -> Action:
        return Action("click", {"start_box": self.screen.point_of(widget, rect)})

    def click_toggle(self, button) -> Action:
        """A click on a check box's or radio button's box and label, where it reacts (not its empty right part)."""
        rect, indicator = self._toggle_rects(button)
        return self.click(button, rect if self.rng.random() < 0.5 else indicator)

    @staticmethod
    def _toggle_rects(button):
        """(the box and label, the box alone) of a check box or radio button, in its coordinates."""
        from PySide6.QtWidgets import QCheckBox, QStyle, QStyleOptionButton

        opt = QStyleOptionButton()
        button.initStyleOption(opt)
        check = isinstance(button, QCheckBox)
        rect = button.style().subElementRect(QStyle.SE_CheckBoxClickRect if check else QStyle.SE_RadioButtonClickRect,
                                             opt, button)
        indicator = button.style().subElementRect(
            QStyle.SE_CheckBoxIndicator if check else QStyle.SE_RadioButtonIndicator, opt, button)
        return rect, indicator

    def labelled_targets(self) -> list[tuple[str, Action, tuple[float, float, float, float]]]:
        """Every element on the shown screen that has a text and reacts to a click, with that click
        and the box it covers (normalized x0, y0, x1, y1): buttons, check boxes and radio buttons,
        list items, tabs and combo boxes (their shown text), in the window's widget order; a text
        shown twice is left out (which one would be meant?). Grounding: "click on X" for each."""
        from PySide6.QtWidgets import QAbstractButton, QCheckBox, QComboBox, QListWidget, QRadioButton, QTabBar

        root, out = self.screen.window, []

        def add(text, widget, rect=None):
            text = text.replace("&", "").strip()
            if text and widget.isVisible() and self.screen.visible_on_screen(widget, rect):
                out.append((text, self.click(widget, rect), self.screen.box_of(widget, rect)))

        for b in root.findChildren(QAbstractButton):
            add(b.text(), b, self._toggle_rects(b)[0] if isinstance(b, (QCheckBox, QRadioButton)) else None)
        for lw in root.findChildren(QListWidget):
            for i in range(lw.count()):
                add(lw.item(i).text(), lw.viewport(), lw.visualItemRect(lw.item(i)))
        for bar in root.findChildren(QTabBar):
            for i in range(bar.count()):
                add(bar.tabText(i), bar, bar.tabRect(i).intersected(self.screen.shown_rect(bar)))
        for combo in root.findChildren(QComboBox):
            add(combo.currentText(), combo)
        counts = Counter(t[0] for t in out)
        return [t for t in out if counts[t[0]] == 1]  # "click on X" must be unambiguous

    def scroll_to(self, view, rect, name: str) -> tuple[str, Action] | None:
        """A scroll of list `view` toward the row at `rect` (viewport coordinates) while the list
        does not show all of it; None once it does."""
        vp = view.viewport().rect()
        at = self.screen.point_of(view.viewport())
        if rect.top() < vp.top():
            return (f"'{name}' is above the visible part; I'll scroll up.",
                    Action("scroll", {"start_box": at, "direction": "up"}))
        if rect.bottom() > vp.bottom():
            return (f"I can't see '{name}' yet; I'll scroll down the list.",
                    Action("scroll", {"start_box": at, "direction": "down"}))
        return None

    def open_tab(self, tabs, name: str) -> tuple[str, Action]:
        """The next step to bring tab `name` forward: click it, or scroll the tab bar to it first."""
        from PySide6.QtCore import Qt
        from PySide6.QtWidgets import QToolButton

        from trainer.sandbox.elements import shown_tab_rect  # lazy: cycle with trainer.sandbox.elements

        bar = tabs.tabBar()
        i = [tabs.tabText(k) for k in range(tabs.count())].index(name)
        rect = bar.tabRect(i)
        arrows = [b for b in bar.findChildren(QToolButton) if b.isVisible()]
        part = shown_tab_rect(bar, i)  # the scroll arrows cover the bar's right end
        if part.width() < min(24, rect.width()) and arrows:
            want = Qt.RightArrow if rect.center().x() > bar.width() // 2 else Qt.LeftArrow
            arrow = next((b for b in arrows if b.arrowType() == want), arrows[-1])
            side = "right" if want == Qt.RightArrow else "left"
            return (f"The '{name}' tab is cut off; I'll scroll the tabs to the {side}.", self.click(arrow))
        return (f"I need the '{name}' tab; I'll open it.", self.click(bar, part))

    def choose_in_combo(self, combo, value: str, what: str) -> tuple[str, Action]:
        """The next step to make `combo` show `value`: open it, or pick the entry in its popup."""
        from PySide6.QtWidgets import QApplication

        view = combo.view()
        index = combo.findText(value)
        if index < 0:
            raise SandboxError(f"{what} has no entry {value!r}")
        popup = QApplication.activePopupWidget()
        if popup is not None and popup is view.window():
            rect = view.visualRect(combo.model().index(index, 0))
            if self.screen.visible_on_screen(view.viewport(), rect):
                return (f"The list of {what} is open; I'll pick '{value}'.",
                        self.click(view.viewport(), rect))
            key = "down" if view.currentIndex().row() < index else "up"
            if view.currentIndex().row() == index:
                key = "enter"
            return (f"'{value}' is outside the screen; I'll move to it with the keyboard.",
                    Action("hotkey", {"key": key}))
        if popup is not None:
            return ("Another popup is in the way; I'll close it first.", Action("hotkey", {"key": "esc"}))
        return (f"I need to set {what} to '{value}', so I'll open the {what} dropdown.", self.click(combo))

    def type_into(self, field, value: str, what: str) -> tuple[str, Action]:
        """The next step to make a line edit (or a spin box's editor) hold exactly `value`."""
        from PySide6.QtWidgets import QApplication, QLineEdit

        edit = field if isinstance(field, QLineEdit) else field.findChild(QLineEdit)
        if QApplication.focusWidget() is not edit and QApplication.focusWidget() is not field:
            return (f"I need to type into the {what} field, so I'll click it first.", self.click(field))
        current = edit.text()
        if current and not value.startswith(current) or edit.hasSelectedText() and current != value:
            if edit.selectedText() == current:
                return (f"The {what} field holds '{current}', selected; I'll type '{value}' over it.",
                        Action("type", {"content": value}))
            return (f"The {what} field holds '{current}'; I'll select it all to replace it.",
                    Action("hotkey", {"key": "ctrl a"}))
        rest = value[len(current):]
        return (f"I'll type '{rest}' into the {what} field.", Action("type", {"content": rest}))
