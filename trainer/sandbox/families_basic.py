"""Single-widget families: buttons, check boxes, radio buttons, dropdowns, lists, text, sliders."""
from __future__ import annotations

import math

from agent.schema import Action
from trainer.sandbox.task import FAILED, RUNNING, SUCCESS, WORDS, Task, Verdict


def _grid(task: Task, parent, widgets, cols: int):
    from PySide6.QtWidgets import QGridLayout

    g = QGridLayout(parent)
    g.setContentsMargins(task.margin, task.margin, task.margin, task.margin)
    g.setSpacing(task.spacing)
    for i, w in enumerate(widgets):
        g.addWidget(w, i // cols, i % cols)
    return g


def _heading(text: str):
    from PySide6.QtWidgets import QLabel

    lab = QLabel(text)
    f = lab.font()
    f.setBold(True)
    lab.setFont(f)
    return lab


class ClickButton(Task):
    family, level, max_steps, title = "click_button", 1, 4, "Actions"

    def build(self):
        from PySide6.QtWidgets import QPushButton, QVBoxLayout, QWidget

        rng = self.rng
        n = rng.randint(3, 8)
        labels = self.pick("actions", n)
        self.target = rng.choice(labels)
        self.clicked: list[str] = []
        lay = QVBoxLayout(self.body)
        lay.setContentsMargins(self.margin, self.margin // 2, self.margin, 0)
        lay.addWidget(_heading(rng.choice(("Choose an action", "Document", "Quick actions", "Toolbox", ""))))
        grid = QWidget()
        self.buttons = {}
        for label in labels:
            b = QPushButton(label)
            b.setMinimumHeight(rng.choice((22, 24, 28)))
            b.clicked.connect(lambda _=False, lab=label: self.clicked.append(lab))
            self.buttons[label] = b
        _grid(self, grid, list(self.buttons.values()), max(math.ceil(n / 5), rng.choice((1, 2, 3))))
        if rng.random() < 0.5:
            lay.addStretch(rng.randint(1, 3))
        lay.addWidget(grid)
        lay.addStretch(rng.randint(1, 3))
        self.instruction = rng.choice(("Click the '{}' button.", "Press '{}'.", "Click on {}."))
        self.instruction = self.instruction.format(self.target)

    def check(self):
        if self.clicked and self.clicked[0] != self.target:
            return Verdict(FAILED, 0.0, f"clicked '{self.clicked[0]}' instead of '{self.target}'")
        if self.target in self.clicked:
            return Verdict(SUCCESS, 1.0)
        return Verdict(RUNNING, 0.0)

    def expert(self):
        return (f"I need to click the '{self.target}' button.", self.click(self.buttons[self.target]))


class CheckBoxes(Task):
    family, level, max_steps, title = "check_boxes", 1, 10, "Preferences"

    def build(self):
        from PySide6.QtWidgets import QCheckBox, QGroupBox, QVBoxLayout

        rng = self.rng
        n = rng.randint(3, 7)
        labels = self.pick(rng.choice(("fruits", "options")), n)
        self.want = set(rng.sample(labels, rng.randint(1, min(3, n))))
        lay = QVBoxLayout(self.body)
        lay.setContentsMargins(self.margin, self.margin, self.margin, self.margin)
        box = QGroupBox(rng.choice(("Options", "Select", "Shopping list", "Features")))
        inner = QVBoxLayout(box)
        inner.setSpacing(self.spacing // 2)
        self.boxes = {}
        for label in labels:
            c = QCheckBox(label)
            c.setChecked(rng.random() < 0.3)
            inner.addWidget(c)
            self.boxes[label] = c
        lay.addWidget(box)
        lay.addStretch(1)
        if all(self.boxes[k].isChecked() == (k in self.want) for k in labels):
            self.boxes[labels[0]].setChecked(not self.boxes[labels[0]].isChecked())
        names = sorted(self.want, key=labels.index)
        self.instruction = rng.choice(("Tick only {} and nothing else.", "Make sure exactly these are checked: {}."))
        self.instruction = self.instruction.format(", ".join(f"'{x}'" for x in names))

    def _wrong(self):
        return [k for k, c in self.boxes.items() if c.isChecked() != (k in self.want)]

    def check(self):
        wrong = self._wrong()
        progress = 1 - len(wrong) / len(self.boxes)
        return Verdict(SUCCESS if not wrong else RUNNING, progress)

    def expert(self):
        k = self._wrong()[0]
        if k in self.want:
            return (f"'{k}' should be ticked but is not; I'll tick it.", self.click_toggle(self.boxes[k]))
        return (f"'{k}' is ticked but should not be; I'll untick it.", self.click_toggle(self.boxes[k]))


class RadioChoice(Task):
    family, level, max_steps, title = "radio", 1, 4, "Order"

    def build(self):
        from PySide6.QtWidgets import QGroupBox, QHBoxLayout, QRadioButton, QVBoxLayout

        rng = self.rng
        groups = [("Size", list(self.pick("sizes", 4))), ("Colour", self.pick("colours", rng.randint(3, 5))),
                  ("Fruit", self.pick("fruits", rng.randint(3, 5)))]
        groups = rng.sample(groups, rng.randint(1, 2))
        lay = QHBoxLayout(self.body) if rng.random() < 0.5 else QVBoxLayout(self.body)
        lay.setContentsMargins(self.margin, self.margin, self.margin, self.margin)
        self.radios: dict[tuple[str, str], object] = {}
        for name, options in groups:
            box = QGroupBox(name)
            inner = QVBoxLayout(box) if isinstance(lay, QHBoxLayout) or len(options) > 4 else QHBoxLayout(box)
            for o in options:
                r = QRadioButton(o)
                inner.addWidget(r)
                self.radios[(name, o)] = r
            next(iter(r for (g, _), r in self.radios.items() if g == name)).setChecked(True)
            lay.addWidget(box)
        lay.addStretch(1)
        self.group, _ = rng.choice(groups)
        options = [o for g, o in self.radios if g == self.group]
        self.target = rng.choice(options[1:])
        self.instruction = f"Choose '{self.target}' as the {self.group.lower()}."

    def check(self):
        return Verdict(SUCCESS, 1.0) if self.radios[(self.group, self.target)].isChecked() else Verdict(RUNNING, 0.0)

    def expert(self):
        return (f"I need the '{self.target}' option in the {self.group} group.", self.click_toggle(self.radios[(self.group, self.target)]))


class Dropdown(Task):
    family, level, max_steps, title = "dropdown", 2, 6, "Settings"

    def build(self):
        from PySide6.QtWidgets import QComboBox, QFormLayout, QVBoxLayout, QWidget

        rng = self.rng
        fields = rng.sample([("Colour", "colours"), ("City", "cities"), ("Fruit", "fruits"), ("Size", "sizes")], rng.randint(1, 3))
        lay = QVBoxLayout(self.body)
        lay.setContentsMargins(self.margin, self.margin, self.margin, self.margin)
        form_w = QWidget()
        form = QFormLayout(form_w)
        form.setSpacing(self.spacing)
        self.combos = {}
        for label, vocab in fields:
            c = QComboBox()
            c.addItems(self.pick(vocab, min(len(self.rng_pool(vocab)), rng.randint(3, 6))))
            c.setMaxVisibleItems(8)
            form.addRow(label + ":", c)
            self.combos[label] = c
        lay.addWidget(form_w)
        lay.addStretch(1)
        self.field = rng.choice([f for f, _ in fields])
        combo = self.combos[self.field]
        self.target = combo.itemText(rng.randint(1, combo.count() - 1))
        self.instruction = rng.choice(("Set {f} to '{v}'.", "Choose '{v}' in the {f} dropdown.", "Select {v} as the {f}."))
        self.instruction = self.instruction.format(f=self.field, v=self.target)

    def rng_pool(self, vocab):
        return WORDS[vocab]

    def check(self):
        ok = self.combos[self.field].currentText() == self.target
        return Verdict(SUCCESS if ok else RUNNING, 1.0 if ok else 0.0)

    def expert(self):
        return self.choose_in_combo(self.combos[self.field], self.target, self.field)


class ListPick(Task):
    family, level, max_steps, title = "list_pick", 2, 4, "Library"

    def build(self):
        from PySide6.QtWidgets import QHBoxLayout, QLabel, QListWidget, QVBoxLayout

        rng = self.rng
        lay = QHBoxLayout(self.body)
        lay.setContentsMargins(self.margin, self.margin, self.margin, self.margin)
        names = rng.sample(("Source", "Destination", "Favourites", "Recent"), rng.randint(1, 2))
        vocab = rng.choice(("cities", "fruits", "names", "files"))
        self.lists = {}
        for name in names:
            col = QVBoxLayout()
            col.addWidget(QLabel(name))
            lw = QListWidget()
            lw.addItems(self.pick(vocab, rng.randint(4, 7)))
            col.addWidget(lw)
            lay.addLayout(col)
            self.lists[name] = lw
        self.name = rng.choice(names)
        lw = self.lists[self.name]
        self.target = lw.item(rng.randrange(lw.count())).text()
        where = f" in the {self.name} list" if len(names) > 1 else ""
        self.instruction = f"Select '{self.target}'{where}."

    def check(self):
        sel = [i.text() for i in self.lists[self.name].selectedItems()]
        return Verdict(SUCCESS, 1.0) if sel == [self.target] else Verdict(RUNNING, 0.0)

    def expert(self):
        lw = self.lists[self.name]
        item = lw.findItems(self.target, self._exact())[0]
        scroll = self.scroll_to(lw, lw.visualItemRect(item), self.target)
        if scroll:
            return scroll
        return (f"I'll click '{self.target}' in the {self.name} list.", self.click(lw.viewport(), lw.visualItemRect(item)))

    @staticmethod
    def _exact():
        from PySide6.QtCore import Qt

        return Qt.MatchExactly


def random_text(rng) -> str:
    kind = rng.randrange(4)
    if kind == 0:
        return f"{rng.choice(WORDS['names']).lower()}@{rng.choice(('mail.com', 'example.org', 'tandem.dev'))}"
    if kind == 1:
        return f"{rng.choice(WORDS['names'])} {rng.choice(WORDS['cities'])}"
    if kind == 2:
        return f"{rng.randint(1, 999)} {rng.choice(WORDS['fruits'])} Street"
    return " ".join(rng.choice(("hello", "world", "draft", "meeting", "at", "noon", "ship", "it", "today"))
                    for _ in range(rng.randint(2, 4)))


class TypeText(Task):
    family, level, max_steps, title = "type_text", 2, 6, "Contact"

    def build(self):
        from PySide6.QtWidgets import QFormLayout, QLineEdit, QVBoxLayout, QWidget

        rng = self.rng
        labels = self.pick("fields", rng.randint(1, 3))
        lay = QVBoxLayout(self.body)
        lay.setContentsMargins(self.margin, self.margin, self.margin, self.margin)
        w = QWidget()
        form = QFormLayout(w)
        self.edits = {}
        for lab in labels:
            e = QLineEdit()
            if rng.random() < 0.3:
                e.setPlaceholderText(f"Enter {lab.lower()}")
            form.addRow(lab + ":", e)
            self.edits[lab] = e
        lay.addWidget(w)
        lay.addStretch(1)
        self.field = rng.choice(labels)
        self.target = random_text(rng)
        if rng.random() < 0.3:  # something to replace first
            self.edits[self.field].setText(random_text(rng))
        self.instruction = rng.choice(("Type '{v}' into the {f} field.", "Enter '{v}' as the {f}.", "Set {f} to '{v}'."))
        self.instruction = self.instruction.format(f=self.field, v=self.target)

    def check(self):
        text = self.edits[self.field].text()
        if text == self.target:
            return Verdict(SUCCESS, 1.0)
        common = 0
        while common < min(len(text), len(self.target)) and text[common] == self.target[common]:
            common += 1
        return Verdict(RUNNING, common / len(self.target))

    def expert(self):
        return self.type_into(self.edits[self.field], self.target, self.field)


class Slider(Task):
    family, level, max_steps, title = "slider", 3, 5, "Mixer"

    def build(self):
        from PySide6.QtCore import Qt
        from PySide6.QtWidgets import QGridLayout, QLabel, QSlider

        rng = self.rng
        names = rng.sample(("Volume", "Brightness", "Bass", "Treble", "Speed", "Zoom"), rng.randint(1, 3))
        grid = QGridLayout(self.body)
        grid.setContentsMargins(self.margin, self.margin, self.margin, self.margin)
        self.sliders = {}
        top = rng.choice((5, 8, 10))
        for row, name in enumerate(names):
            s = QSlider(Qt.Horizontal)
            s.setRange(0, top)
            s.setValue(rng.randint(0, top))
            s.setTickPosition(QSlider.TicksBelow)
            s.setPageStep(1)
            value = QLabel(str(s.value()))
            s.valueChanged.connect(lambda v, lab=value: lab.setText(str(v)))
            grid.addWidget(QLabel(name), row, 0)
            grid.addWidget(s, row, 1)
            grid.addWidget(value, row, 2)
            self.sliders[name] = s
        grid.setRowStretch(len(names), 1)
        self.name = rng.choice(names)
        cur = self.sliders[self.name].value()
        self.target = rng.choice([v for v in range(top + 1) if v != cur])
        self.instruction = f"Set {self.name} to {self.target} (0 to {top})."

    def check(self):
        ok = self.sliders[self.name].value() == self.target
        return Verdict(SUCCESS if ok else RUNNING, 1.0 if ok else 0.0)

    def _handle_center(self, s, value):
        from PySide6.QtWidgets import QStyle, QStyleOptionSlider

        opt = QStyleOptionSlider()
        s.initStyleOption(opt)
        handle = s.style().subControlRect(QStyle.CC_Slider, opt, QStyle.SC_SliderHandle, s)
        groove = s.style().subControlRect(QStyle.CC_Slider, opt, QStyle.SC_SliderGroove, s)
        span = groove.width() - handle.width()
        x = groove.x() + QStyle.sliderPositionFromValue(s.minimum(), s.maximum(), value, span) + handle.width() // 2
        return handle.center(), handle.center().__class__(x, handle.center().y())

    def expert(self):
        s = self.sliders[self.name]
        start, _ = self._handle_center(s, s.value())
        _, end = self._handle_center(s, self.target)
        from PySide6.QtCore import QRect

        a = self.screen.point_of(s, QRect(start, start))
        b = self.screen.point_of(s, QRect(end, end))
        return (f"{self.name} is at {s.value()}; I'll drag its handle to {self.target}.", Action("drag", {"start_box": a, "end_box": b}))
