"""Families that need more than one widget or a popup: forms, scrolling, menus, context menus,
dialogs, drag and drop, tabs."""
from __future__ import annotations

from agent.schema import Action
from trainer.sandbox.families_basic import random_text
from trainer.sandbox.task import FAILED, RUNNING, SUCCESS, WORDS, Task, Verdict


def _active_popup():
    from PySide6.QtWidgets import QApplication

    return QApplication.activePopupWidget()


class Form(Task):
    family, level, max_steps, title = "form", 3, 16, "Sign up"

    def build(self):
        from PySide6.QtWidgets import QCheckBox, QComboBox, QFormLayout, QLineEdit, QPushButton, QSpinBox

        rng = self.rng
        form = QFormLayout(self.body)
        form.setContentsMargins(self.margin, self.margin, self.margin, self.margin)
        form.setSpacing(self.spacing // 2 + 2)
        kinds = ["text", "text", "combo", "check", "spin"]
        chosen = rng.sample(kinds, rng.randint(2, 4))
        labels = iter(self.pick("fields", 4))
        self.fields = []  # (label, kind, widget, wanted)
        for kind in chosen:
            if kind == "text":
                label, w = next(labels), QLineEdit()
                want = random_text(rng) if rng.random() < 0.5 else rng.choice(WORDS["names"])
            elif kind == "combo":
                label, w = "Country" if rng.random() < 0.5 else "Plan", QComboBox()
                w.addItems(self.pick("cities", 4) if label == "Country" else ["Free", "Basic", "Pro", "Team"])
                want = w.itemText(rng.randint(1, 3))
            elif kind == "check":
                label = rng.choice(("Subscribe", "I agree to the terms", "Remember me"))
                w, want = QCheckBox(label), True
            else:
                label, w = "Quantity", QSpinBox()
                w.setRange(0, 50)
                want = rng.randint(1, 50)
            self.fields.append((label, kind, w, want))
            if kind == "check":
                form.addRow("", w)
            else:
                form.addRow(label + ":", w)
        self.submit = QPushButton(rng.choice(("Submit", "Send", "Register", "OK")))
        self.submitted = None
        self.submit.clicked.connect(self._on_submit)
        form.addRow("", self.submit)
        parts = []
        for label, kind, _, want in self.fields:
            if kind == "check":
                parts.append(f"tick '{label}'")
            else:
                parts.append(f"{label} '{want}'")
        self.instruction = f"Fill in the form ({'; '.join(parts)}) and press {self.submit.text()}."

    @staticmethod
    def _value(kind, w):
        return {"text": lambda: w.text(), "combo": lambda: w.currentText(), "check": lambda: w.isChecked(),
                "spin": lambda: w.value()}[kind]()

    def _wrong(self):
        return [f for f in self.fields if self._value(f[1], f[2]) != f[3]]

    def _on_submit(self):
        if self.submitted is None:
            self.submitted = not self._wrong()
            if not self.submitted:
                self.fail(f"submitted with wrong fields: {', '.join(f[0] for f in self._wrong())}")

    def check(self):
        progress = (len(self.fields) - len(self._wrong()) + (1 if self.submitted else 0)) / (len(self.fields) + 1)
        if self.submitted:
            return Verdict(SUCCESS, 1.0)
        return Verdict(RUNNING, progress)

    def expert(self):
        wrong = self._wrong()
        if not wrong:
            return (f"Every field is filled in; I'll press {self.submit.text()}.", self.click(self.submit))
        label, kind, w, want = wrong[0]
        if kind == "text":
            return self.type_into(w, want, label)
        if kind == "combo":
            return self.choose_in_combo(w, want, label)
        if kind == "check":
            return (f"'{label}' must be ticked; I'll tick it.", self.click_toggle(w))
        return self.type_into(w, str(want), label)


class ScrollFind(Task):
    family, level, max_steps, title = "scroll_find", 3, 14, "Directory"

    def build(self):
        from PySide6.QtWidgets import QLabel, QListWidget, QVBoxLayout

        rng = self.rng
        vocab = rng.choice(("cities", "files_numbered"))
        n = rng.randint(20, 40)
        if vocab == "cities":
            items = rng.sample(WORDS["cities"], min(n, len(WORDS["cities"])))
        else:
            items = [f"{rng.choice(('file', 'photo', 'scan', 'memo'))}_{i:03d}.{rng.choice(('txt', 'png', 'pdf'))}"
                     for i in rng.sample(range(1000), n)]
        if rng.random() < 0.5:
            items.sort()
        lay = QVBoxLayout(self.body)
        lay.setContentsMargins(self.margin, self.margin, self.margin, self.margin)
        lay.addWidget(QLabel(rng.choice(("All entries", "Browse", "Items"))))
        self.list = QListWidget()
        self.list.addItems(items)
        self.list.setMaximumHeight(rng.choice((146, 174, 202)))  # 5 to 7 rows of ROW_HEIGHT where there is room
        lay.addWidget(self.list)
        lay.addStretch(1)
        self.target = items[rng.randint(8, len(items) - 1)]
        self.instruction = rng.choice(("Find '{}' in the list and select it.", "Scroll to '{}' and click it."))
        self.instruction = self.instruction.format(self.target)

    def check(self):
        sel = [i.text() for i in self.list.selectedItems()]
        return Verdict(SUCCESS, 1.0) if sel == [self.target] else Verdict(RUNNING, 0.0)

    def expert(self):
        from PySide6.QtCore import Qt

        item = self.list.findItems(self.target, Qt.MatchExactly)[0]
        rect = self.list.visualItemRect(item)
        return self.scroll_to(self.list, rect, self.target) or (
            f"'{self.target}' is visible now; I'll click it.", self.click(self.list.viewport(), rect))


MENUS = {
    "File": "New|Open|Save|Save As|Export|Print|Close",
    "Edit": "Undo|Redo|Cut|Copy|Paste|Find|Replace",
    "View": "Zoom In|Zoom Out|Full Screen|Sidebar|Status Bar",
    "Insert": "Image|Table|Link|Chart|Comment",
    "Tools": "Options|Spelling|Macros|Plugins|Word Count",
    "Help": "Contents|Shortcuts|Updates|About",
}


class MenuChoice(Task):
    family, level, max_steps, title = "menu", 3, 6, "Editor"

    def build(self):
        from PySide6.QtWidgets import QMenuBar, QPlainTextEdit, QVBoxLayout

        rng = self.rng
        names = ["File"] + rng.sample([m for m in MENUS if m != "File"], rng.randint(2, 4))
        bar = QMenuBar()
        self.outer.insertWidget(1, bar)
        self.menus, self.actions, self.triggered = {}, {}, []
        for name in names:
            m = bar.addMenu(name)
            entries = MENUS[name].split("|")
            for e in rng.sample(entries, rng.randint(3, len(entries))):
                a = m.addAction(e)
                a.triggered.connect(lambda _=False, k=(name, e): self.triggered.append(k))
                self.actions[(name, e)] = a
            self.menus[name] = m
        self.bar = bar
        lay = QVBoxLayout(self.body)
        lay.setContentsMargins(2, 2, 2, 2)
        doc = QPlainTextEdit(rng.choice(("Dear team,\nthe draft is ready.", "TODO:\n- call Bob\n- ship", "")))
        lay.addWidget(doc)
        self.target = rng.choice(list(self.actions))
        self.instruction = f"Choose {self.target[0]} > {self.target[1]} from the menu."

    def check(self):
        if self.triggered:
            if self.triggered[0] == self.target:
                return Verdict(SUCCESS, 1.0)
            return Verdict(FAILED, 0.0, f"chose {' > '.join(self.triggered[0])}")
        return Verdict(RUNNING, 0.5 if _active_popup() is self.menus[self.target[0]] else 0.0)

    def expert(self):
        menu = self.menus[self.target[0]]
        if _active_popup() is menu:
            return (f"The {self.target[0]} menu is open; I'll choose '{self.target[1]}'.",
                    self.click(menu, menu.actionGeometry(self.actions[self.target])))
        rect = self.bar.actionGeometry(menu.menuAction())
        return (f"I need {self.target[1]} from the {self.target[0]} menu, so I'll open {self.target[0]}.", self.click(self.bar, rect))


class _FileList:
    """A file list with a context menu that remembers which item it was opened on."""

    def __init__(self, task: Task, files, entries):
        from PySide6.QtCore import Qt
        from PySide6.QtWidgets import QListWidget, QMenu

        self.task = task
        self.list = QListWidget()
        self.list.addItems(files)
        self.list.setContextMenuPolicy(Qt.CustomContextMenu)
        self.menu = QMenu(self.list)
        self.menu.setFont(task.font)
        self.actions = {e: self.menu.addAction(e) for e in entries}
        self.opened_on: str | None = None
        self.done: list[tuple[str, str]] = []
        for e, a in self.actions.items():
            a.triggered.connect(lambda _=False, e=e: self.done.append((self.opened_on, e)))
        self.list.customContextMenuRequested.connect(self._popup)

    def _popup(self, pos):
        item = self.list.itemAt(pos)
        if item is None:
            return
        self.opened_on = item.text()
        self.menu.popup(self.list.viewport().mapToGlobal(pos))  # non-blocking, unlike exec()


class ContextMenu(Task):
    family, level, max_steps, title = "context_menu", 4, 6, "Files"

    def build(self):
        from PySide6.QtWidgets import QLabel, QVBoxLayout

        rng = self.rng
        files = self.pick("files", rng.randint(4, 7))
        entries = rng.sample(["Open", "Rename", "Duplicate", "Delete", "Properties", "Share", "Compress"], rng.randint(3, 5))
        self.files = _FileList(self, files, entries)
        lay = QVBoxLayout(self.body)
        lay.setContentsMargins(self.margin, self.margin, self.margin, self.margin)
        lay.addWidget(QLabel(rng.choice(("Documents", "Downloads", "Desktop"))))
        lay.addWidget(self.files.list)
        self.target = (rng.choice(files), rng.choice(entries))
        self.instruction = f"Right-click '{self.target[0]}' and choose '{self.target[1]}'."

    def check(self):
        done = self.files.done
        if done:
            return Verdict(SUCCESS, 1.0) if done[0] == self.target else Verdict(FAILED, 0.0, f"did {done[0]}")
        open_right = _active_popup() is self.files.menu and self.files.opened_on == self.target[0]
        return Verdict(RUNNING, 0.5 if open_right else 0.0)

    def expert(self):
        from PySide6.QtCore import Qt

        fl = self.files
        if _active_popup() is fl.menu:
            if fl.opened_on == self.target[0]:
                return (f"The menu for '{self.target[0]}' is open; I'll choose '{self.target[1]}'.",
                        self.click(fl.menu, fl.menu.actionGeometry(fl.actions[self.target[1]])))
            return ("This menu belongs to the wrong file; I'll close it.", Action("hotkey", {"key": "esc"}))
        item = fl.list.findItems(self.target[0], Qt.MatchExactly)[0]
        scroll = self.scroll_to(fl.list, fl.list.visualItemRect(item), self.target[0])
        if scroll:
            return scroll
        return (f"I'll right-click '{self.target[0]}' to open its menu.",
                Action("right_single", {"start_box": self.screen.point_of(fl.list.viewport(), fl.list.visualItemRect(item))}))


class DialogAnswer(Task):
    family, level, max_steps, title = "dialog", 3, 6, "Editor"

    QUESTIONS = [
        ("Unsaved changes", "Save changes to '{f}' before closing?", ["Save", "Discard", "Cancel"]),
        ("Delete file", "Delete '{f}' permanently?", ["Delete", "Keep"]),
        ("Replace file", "'{f}' already exists. Replace it?", ["Replace", "Skip", "Cancel"]),
        ("Update available", "A new version is available. Install now?", ["Install", "Later"]),
        ("Share", "Share '{f}' with the team?", ["Share", "Don't share"]),
    ]

    def build(self):
        from PySide6.QtWidgets import QDialog, QHBoxLayout, QLabel, QPushButton, QVBoxLayout

        rng = self.rng
        title, question, answers = rng.choice(self.QUESTIONS)
        f = self.pick("files")
        lay = QVBoxLayout(self.body)
        lay.setContentsMargins(self.margin, self.margin, self.margin, self.margin)
        self.opener = QPushButton(rng.choice(("Close document", "Clean up", "Continue")))
        self.opener.clicked.connect(self._open)
        lay.addWidget(QLabel(f"Document: {f}"))
        lay.addWidget(self.opener)
        lay.addStretch(1)
        d = QDialog(self.screen.window)
        d.setWindowTitle(title)
        self.style_dialog(d)
        dl = QVBoxLayout(d)
        msg = QLabel(question.format(f=f))
        msg.setWordWrap(True)
        msg.setMinimumHeight(msg.fontMetrics().height() * 3)
        dl.addWidget(msg)
        row = QHBoxLayout()
        row.addStretch(1)
        self.answers, self.answered = {}, []
        for a in answers:
            b = QPushButton(a)
            b.setAutoDefault(False)
            b.clicked.connect(lambda _=False, a=a: self._answer(a))
            row.addWidget(b)
            self.answers[a] = b
        dl.addLayout(row)
        d.rejected.connect(lambda: self.answered.append("(closed)") if not self.answered else None)
        d.setFixedWidth(min(self.screen.width - 30, rng.choice((220, 240, 260))))
        self.dialog = d
        self.target = rng.choice(answers)
        self.starts_open = rng.random() < 0.5
        if self.starts_open:
            self.instruction = f"Answer the '{title}' dialog with '{self.target}'."
        else:
            self.instruction = f"Click '{self.opener.text()}', then answer the dialog with '{self.target}'."

    def after_show(self):
        if self.starts_open:
            self._open()

    def _open(self):
        d = self.dialog
        d.adjustSize()
        d.move((self.screen.width - d.width()) // 2, max(24, (self.screen.height - d.height()) // 2))
        d.open()  # window-modal and non-blocking

    def _answer(self, a):
        self.answered.append(a)
        self.dialog.done(1)

    def check(self):
        if self.answered:
            if self.answered[0] == self.target:
                return Verdict(SUCCESS, 1.0)
            return Verdict(FAILED, 0.5, f"answered '{self.answered[0]}'")
        return Verdict(RUNNING, 0.5 if self.dialog.isVisible() else 0.0)

    def expert(self):
        if not self.dialog.isVisible():
            return (f"I'll click '{self.opener.text()}' to bring up the dialog.", self.click(self.opener))
        return (f"The dialog asks '{self.dialog.windowTitle()}'; I'll answer '{self.target}'.", self.click(self.answers[self.target]))


class _Card:
    """A draggable label: real press/move/release handling, dropped into the zone under its centre."""

    @staticmethod
    def make(task, text, zones):
        from PySide6.QtWidgets import QLabel

        class Card(QLabel):
            def __init__(self):
                super().__init__(text, task.body)
                self.zone = None
                self._grab = None
                self.setStyleSheet(f"background:{task.rng.choice(('#fff6c2', '#d9f0ff', '#e3ffd9', '#ffe0e6'))};"
                                   "border:1px solid #777; border-radius:3px; padding:2px 4px; color:#222;")
                self.adjustSize()
                self.setProperty("elementRole", "other")  # listed (trainer.sandbox.elements): a thing to drag

            def mousePressEvent(self, e):
                self._grab = e.position().toPoint()
                self.raise_()

            def mouseMoveEvent(self, e):
                if self._grab is not None:
                    p = self.mapToParent(e.position().toPoint() - self._grab)
                    self.move(p)

            def mouseReleaseEvent(self, e):
                if self._grab is None:
                    return
                self._grab = None
                centre = self.mapToGlobal(self.rect().center())
                self.zone = None
                for name, z in zones.items():
                    if z.rect().contains(z.mapFromGlobal(centre)):
                        self.zone = name

        return Card()


class DragDrop(Task):
    family, level, max_steps, title = "drag_drop", 4, 5, "Board"

    def build(self):
        from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QVBoxLayout

        rng = self.rng
        names = rng.sample(("Trash", "Archive", "Done", "Later", "Shared", "Backup"), rng.randint(2, 3))
        outer = QVBoxLayout(self.body)
        outer.setContentsMargins(self.margin, self.margin, self.margin, self.margin)
        outer.addStretch(1)  # the upper part is where the cards lie
        row = QHBoxLayout()
        self.zones = {}
        for n in names:
            z = QFrame()
            z.setFrameShape(QFrame.StyledPanel)
            z.setMinimumHeight(rng.choice((60, 70, 80)))
            z.setStyleSheet("QFrame{border:2px dashed #888; border-radius:6px;}")
            z.setProperty("elementRole", "other")  # listed by its heading: where a card is dropped
            z.setProperty("elementName", n)
            zl = QVBoxLayout(z)
            lab = QLabel(n)
            lab.setStyleSheet("border:none; font-weight:bold;")
            zl.addWidget(lab)
            zl.addStretch(1)
            row.addWidget(z)
            self.zones[n] = z
        outer.addLayout(row)
        files = self.pick("files", rng.randint(2, 4))
        self.cards = {f: _Card.make(self, f, self.zones) for f in files}
        self.target = (rng.choice(files), rng.choice(names))
        self.instruction = f"Drag '{self.target[0]}' onto {self.target[1]}."

    def after_show(self):
        # cards flow in rows across the top of the body, placed once the layout knows its size
        x, y, row_h = self.margin, self.margin, 0
        for card in self.cards.values():
            if x + card.width() > self.body.width() - self.margin:
                x, y = self.margin, y + row_h + 6
            card.move(x, y + self.rng.randint(0, 6))
            card.home = card.geometry()  # where the expert puts back a card dropped in the wrong place
            card.show()
            row_h = max(row_h, card.height() + 6)
            x += card.width() + self.rng.randint(8, 20)

    def check(self):
        card = self.cards[self.target[0]]
        intruders = [f for f, c in self.cards.items() if f != self.target[0] and c.zone == self.target[1]]
        if card.zone == self.target[1] and not intruders:
            return Verdict(SUCCESS, 1.0)
        return Verdict(RUNNING, 0.0)

    def expert(self):
        intruders = [f for f, c in self.cards.items() if f != self.target[0] and c.zone == self.target[1]]
        if intruders:  # someone left a wrong card there: move it back up
            c = self.cards[intruders[0]]
            return (f"'{intruders[0]}' should not be in {self.target[1]}; I'll drag it out.",
                    Action("drag", {"start_box": self.screen.point_of(c), "end_box": self.screen.point_of(self.body, c.home)}))
        card, zone = self.cards[self.target[0]], self.zones[self.target[1]]
        return (f"I'll drag '{self.target[0]}' onto the {self.target[1]} area.",
                Action("drag", {"start_box": self.screen.point_of(card), "end_box": self.screen.point_of(zone)}))


class Tabs(Task):
    family, level, max_steps, title = "tabs", 3, 8, "Settings"

    def build(self):
        from PySide6.QtWidgets import QCheckBox, QTabWidget, QVBoxLayout, QWidget

        rng = self.rng
        names = self.pick("settings", rng.randint(3, 4))
        lay = QVBoxLayout(self.body)
        lay.setContentsMargins(self.margin, self.margin, self.margin, self.margin)
        self.tabs = QTabWidget()
        self.boxes = {}
        shared = rng.choice(WORDS["options"])  # the same label on every tab: a distractor
        for n in names:
            page = QWidget()
            pl = QVBoxLayout(page)
            opts = [shared] + [o for o in rng.sample(WORDS["options"], 3) if o != shared][:2]
            rng.shuffle(opts)
            for o in opts:
                c = QCheckBox(o)
                pl.addWidget(c)
                self.boxes[(n, o)] = c
            pl.addStretch(1)
            self.tabs.addTab(page, n)
        lay.addWidget(self.tabs)
        tab = rng.choice(names[1:])
        opt = shared if rng.random() < 0.5 else rng.choice([o for (t, o) in self.boxes if t == tab])
        self.target = (tab, opt)
        self.instruction = f"In the '{self.target[0]}' tab, turn on '{self.target[1]}'."

    def check(self):
        if self.boxes[self.target].isChecked():
            return Verdict(SUCCESS, 1.0)
        on_tab = self.tabs.tabText(self.tabs.currentIndex()) == self.target[0]
        return Verdict(RUNNING, 0.5 if on_tab else 0.0)

    def expert(self):
        tab, opt = self.target
        if self.tabs.tabText(self.tabs.currentIndex()) != tab:
            return self.open_tab(self.tabs, tab)
        return (f"I'm on the {tab} tab; I'll tick '{opt}'.", self.click_toggle(self.boxes[self.target]))
