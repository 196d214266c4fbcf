"""Hybrid families where files and tasks go in bulk or the tools decide (or mislead): bulk_rename,
output_decides, tool_trap (trainer.sandbox.families_hybrid says what a hybrid family is)."""
from __future__ import annotations

from agent.schema import Action
from trainer.sandbox.families_hybrid import HybridTask, form_layout, readonly_field, right_button
from trainer.sandbox.task import FAILED, RUNNING, SUCCESS, WORDS, Verdict


class BulkRename(HybridTask):
    family, title = "bulk_rename", "Files"

    def build(self):
        from PySide6.QtWidgets import (
            QDialog,
            QHBoxLayout,
            QLabel,
            QLineEdit,
            QListWidget,
            QPushButton,
            QVBoxLayout,
        )

        rng = self.rng
        n = rng.randint(5, 9)
        kind = rng.choice(("lower", "prefix", "jpeg"))
        if kind == "lower":
            olds = [f"IMG_{k:04d}.JPG" for k in rng.sample(range(10000), n)]
            self.rename = lambda f: f[:-4] + ".jpg"
            self.command = 'for f in *.JPG; do mv -- "$f" "${f%.JPG}.jpg"; done'
            self.instruction = ("Rename every .JPG file so its extension is lower-case (IMG_0001.JPG becomes "
                                "IMG_0001.jpg); leave the other files alone.")
        elif kind == "prefix":
            prefix = rng.choice(("trip_", "old_", "2024_", "draft_"))
            words = rng.sample([w.lower() for w in WORDS["cities"] + WORDS["fruits"]], n)
            olds = [f"{w}.png" for w in words]
            self.rename = lambda f, p=prefix: p + f
            self.command = f'for f in *.png; do mv -- "$f" "{prefix}$f"; done'
            self.instruction = (f"Add the prefix '{prefix}' to the name of every .png file ({olds[0]} becomes "
                                f"{prefix}{olds[0]}); leave the other files alone.")
        else:
            words = rng.sample([w.lower() for w in WORDS["names"] + WORDS["colours"]], n)
            olds = [f"{w}.jpeg" for w in words]
            self.rename = lambda f: f[:-5] + ".jpg"
            self.command = 'for f in *.jpeg; do mv -- "$f" "${f%.jpeg}.jpg"; done'
            self.instruction = (f"Change the extension of every .jpeg file to .jpg ({olds[0]} becomes "
                                f"{olds[0][:-5]}.jpg); leave the other files alone.")
        others = rng.sample(["notes.txt", "todo.md", "data.csv", "readme.txt", "index.html"], rng.randint(1, 3))
        self.originals = {}  # content -> the name it must end up with
        for f in olds + others:
            content = f"{f} {rng.getrandbits(48):012x}\n"
            self.write(f, content)
            self.originals[content] = self.rename(f) if f in olds else f
        self.olds = olds
        lay = QVBoxLayout(self.body)
        lay.setContentsMargins(self.margin, self.margin // 2, self.margin, self.margin // 2)
        lay.addWidget(QLabel("Workspace"))
        self.list = QListWidget()
        lay.addWidget(self.list, 1)
        self.rename_button = right_button(lay, "Rename…", self._open)
        d = QDialog(self.screen.window)
        d.setWindowTitle("Rename")
        self.style_dialog(d)
        dl = QVBoxLayout(d)
        dl.addWidget(QLabel("New name:"))
        self.new_name = QLineEdit()
        self.new_name.returnPressed.connect(self._rename)
        dl.addWidget(self.new_name)
        self.error = QLabel("")
        dl.addWidget(self.error)
        buttons = QHBoxLayout()
        buttons.addStretch(1)
        cancel, ok = QPushButton("Cancel"), QPushButton("OK")
        for b in (cancel, ok):
            b.setAutoDefault(False)
            buttons.addWidget(b)
        cancel.clicked.connect(d.reject)
        ok.clicked.connect(self._rename)
        dl.addLayout(buttons)
        d.setFixedWidth(min(self.screen.width - 30, 240))
        self.dialog, self.renaming = d, None
        self._refresh()
        self.max_steps = 3 * n + 8  # the GUI route: select, Rename…, type the new name, per file

    def _refresh(self):
        bar = self.list.verticalScrollBar()
        at = bar.value()
        self.list.clear()
        self.list.addItems(self.files())
        bar.setValue(at)  # the view stays where it was, as a file manager's does

    def after_tool(self, action, output, error=None):
        super().after_tool(action, output, error)
        self._refresh()  # the app watches its folder

    def _open(self):
        item = self.list.currentItem()
        if item is None or not item.isSelected():
            return
        self.renaming = item.text()
        self.new_name.setText(self.renaming)
        self.new_name.selectAll()
        self.error.setText("")
        d = self.dialog
        d.adjustSize()
        d.move((self.screen.width - d.width()) // 2, max(24, (self.screen.height - d.height()) // 2))
        d.open()
        self.new_name.setFocus()

    def _rename(self):
        new = self.new_name.text().strip()
        if not new or "/" in new or new in (".", ".."):
            self.error.setText("Not a valid name")
            return
        if new != self.renaming and self.path(new).exists():
            self.error.setText(f"{new} already exists")
            return
        if self.path(self.renaming).exists():
            self.path(self.renaming).rename(self.path(new))
        self.dialog.accept()
        self._refresh()

    def _state(self) -> tuple[dict, list[str]]:
        """(content -> its name now, for the files still there; the names that are wrong)."""
        now = {}
        for f in self.files():
            text = self.read(f)
            if text in self.originals:
                now[text] = f
        wrong = [now.get(c) for c, want in self.originals.items() if now.get(c) != want]
        return now, wrong

    def check(self):
        now, wrong = self._state()
        lost = [want for c, want in self.originals.items() if c not in now]
        if lost:
            return Verdict(FAILED, 0.0, f"files lost: {', '.join(lost)}")
        if not wrong and set(self.files()) == set(self.originals.values()):
            return Verdict(SUCCESS, 1.0)
        return Verdict(RUNNING, 1 - len(wrong) / len(self.originals))

    def expert(self):
        from PySide6.QtCore import Qt

        now, _ = self._state()
        pending = [(now[c], want) for c, want in self.originals.items() if c in now and now[c] != want]
        if not pending:
            return ("Every file has its new name.", Action("finished", {}))
        if self.tools and self.output_of("run_command", self.command) is None:
            return (f"{len(pending)} files to rename: one shell loop does them all.", self.run(self.command))
        shown = self.list.viewport().rect()
        rows = {self.list.item(i).text(): i for i in range(self.list.count())}

        def order(p):  # a file on screen first, then the list's order (the fewest scrolls)
            rect = self.list.visualItemRect(self.list.item(rows[p[0]]))
            return (not shown.contains(rect.adjusted(0, 0, 0, -1)), rows[p[0]])

        old, new = min(pending, key=order) if not self.dialog.isVisible() else next(
            (p for p in pending if p[0] == self.renaming), pending[0])
        if self.dialog.isVisible():
            if self.renaming == old:
                return (f"The rename dialog is open for {old}; I'll type {new}.", Action("type", {"content": new + "\n"}))
            return ("This dialog is for the wrong file; I'll close it.", Action("hotkey", {"key": "esc"}))
        item = self.list.findItems(old, Qt.MatchExactly)[0]
        if not item.isSelected():
            scroll = self.scroll_to(self.list, self.list.visualItemRect(item), old)
            return scroll or (f"{len(pending)} files still to rename; I'll select {old}.",
                              self.click(self.list.viewport(), self.list.visualItemRect(item)))
        return (f"{old} is selected; I'll press Rename….", self.click(self.rename_button))


# ---------------------------------------------------------------- e. output_decides
CRITERIA = {"most_lines": ("the most lines", "wc -l *.log"), "fewest_lines": ("the fewest lines", "wc -l *.log"),
            "largest": ("the largest size in bytes", "wc -c *.log"), "smallest": ("the smallest size in bytes", "wc -c *.log")}


class OutputDecides(HybridTask):
    family, title = "output_decides", "Attach log"

    def build(self):
        from PySide6.QtWidgets import QHBoxLayout, QLabel, QListWidget, QVBoxLayout

        rng = self.rng
        k = rng.randint(4, 6)
        names = rng.sample(("api", "worker", "db", "auth", "cron", "mail", "web", "cache", "queue", "proxy"), k)
        counts = rng.sample(range(12, 240), k)
        self.stats = {}
        for name, lines in zip(names, counts, strict=True):
            while True:
                text = "".join(f"{rng.choice(('INFO', 'WARN', 'DEBUG'))} {'x' * rng.randint(4, 70)}\n"
                               for _ in range(lines))
                size = len(text.encode())
                if size not in [s for _, s in self.stats.values()]:
                    break
            self.write(f"{name}.log", text)
            self.stats[f"{name}.log"] = (lines, size)
        self.criterion = rng.choice(tuple(CRITERIA))
        pick = {"most_lines": lambda s: s[0], "fewest_lines": lambda s: -s[0], "largest": lambda s: s[1],
                "smallest": lambda s: -s[1]}[self.criterion]
        self.target = max(self.stats, key=lambda f: pick(self.stats[f]))
        lay = QVBoxLayout(self.body)
        lay.setContentsMargins(self.margin, self.margin // 2, self.margin, self.margin // 2)
        lay.addWidget(QLabel("Logs"))
        self.list = QListWidget()
        self.list.addItems(list(self.stats))
        self.list.currentTextChanged.connect(self._show)
        lay.addWidget(self.list, 1)
        row = QHBoxLayout()
        row.addWidget(QLabel("Details:"))
        self.details = readonly_field("select a file")
        row.addWidget(self.details, 1)
        lay.addLayout(row)
        self.attach = right_button(lay, "Attach", self._attach)
        self.inspected: list[str] = []
        self.attached: str | None = None
        self.max_steps = k + 6
        self.instruction = f"Attach the log file with {CRITERIA[self.criterion][0]}."

    def _show(self, name: str):
        if name in self.stats:
            lines, size = self.stats[name]
            self.details.setText(f"{lines} lines, {size} bytes")
            if name not in self.inspected:
                self.inspected.append(name)

    def _selected(self) -> str | None:
        items = self.list.selectedItems()
        return items[0].text() if items else None

    def _attach(self):
        if self.attached is None:
            self.attached = self._selected() or ""
            if self.attached != self.target:
                self.fail(f"attached {self.attached or 'nothing'}, not {self.target}")

    def check(self):
        if self.attached is not None:
            return Verdict(SUCCESS, 1.0)
        return Verdict(RUNNING, 0.5 if self._selected() == self.target else 0.0)

    def _from_output(self) -> str | None:
        """The file the criterion picks, from the wc output the expert ran (None: not run yet)."""
        out = self.output_of("run_command", CRITERIA[self.criterion][1])
        if out is None:
            return None
        rows = [line.split() for line in out.splitlines()]
        sizes = {r[1]: int(r[0]) for r in rows if len(r) == 2 and r[0].isdigit() and r[1] != "total"}
        if not sizes:
            return None
        biggest = self.criterion in ("most_lines", "largest")
        return (max if biggest else min)(sizes, key=sizes.get)

    def expert(self):
        from PySide6.QtCore import Qt

        what = CRITERIA[self.criterion][0]
        if self.tools:
            target = self._from_output()
            if target is None:
                command = CRITERIA[self.criterion][1]
                return (f"The list shows only names; '{command}' tells which log has {what}.", self.run(command))
            why = f"The command's output shows {target} has {what}"
        else:
            left = [f for f in self.stats if f not in self.inspected]
            if left:
                item = self.list.findItems(left[0], Qt.MatchExactly)[0]
                rect = self.list.visualItemRect(item)
                return self.scroll_to(self.list, rect, left[0]) or (
                    f"I need each log's details to find the one with {what}; I'll select {left[0]}.",
                    self.click(self.list.viewport(), rect))
            pick = {"most_lines": lambda f: self.stats[f][0], "fewest_lines": lambda f: -self.stats[f][0],
                    "largest": lambda f: self.stats[f][1], "smallest": lambda f: -self.stats[f][1]}[self.criterion]
            target = max(self.inspected, key=pick)
            why = f"Of the details I've read, {target} has {what}"
        if self._selected() != target:
            rect = self.list.visualItemRect(self.list.findItems(target, Qt.MatchExactly)[0])
            return self.scroll_to(self.list, rect, target) or (
                f"{why}; I'll select it.", self.click(self.list.viewport(), rect))
        return (f"{why} and it is selected; I'll press Attach.", self.click(self.attach))


# ---------------------------------------------------------------- f. tool_trap
THEMES = ("Light", "Dark", "System", "Sepia")


class ToolTrap(HybridTask):
    family, title = "tool_trap", "Preferences"

    def build(self):
        from PySide6.QtWidgets import QCheckBox, QComboBox, QPushButton, QSpinBox

        rng = self.rng
        form = form_layout(self)
        self.theme = QComboBox()
        self.theme.addItems(THEMES)
        self.theme.setCurrentIndex(rng.randrange(len(THEMES)))
        form.addRow("Theme:", self.theme)
        self.font_size = QSpinBox()
        self.font_size.setRange(8, 24)
        self.font_size.setValue(rng.randint(9, 12))
        form.addRow("Font size:", self.font_size)
        self.autosave = QCheckBox("Autosave")
        self.autosave.setChecked(rng.random() < 0.5)
        form.addRow("", self.autosave)
        self.apply = QPushButton("Apply")
        self.apply.clicked.connect(self._apply)
        form.addRow("", self.apply)
        wanted = {"theme": rng.choice([t for t in THEMES if t != self.theme.currentText()]),
                  "font_size": rng.choice([v for v in range(10, 21) if v != self.font_size.value()]),
                  "autosave": not self.autosave.isChecked()}
        keys = rng.sample(list(wanted), rng.randint(2, 3))
        self.want = {k: wanted[k] for k in wanted if k in keys}
        self.file = "prefs.ini"
        self._save_file()
        self.applied = False
        self.max_steps = 12
        parts = {"theme": f"the theme to {self.want.get('theme')}", "font_size": f"the font size to {self.want.get('font_size')}",
                 "autosave": f"Autosave {'on' if self.want.get('autosave') else 'off'}"}
        self.instruction = f"In the app, set {' and '.join(parts[k] for k in self.want)}, then press Apply."
        if self.tools:
            self.instruction += f" (The app keeps its settings in {self.file} in the workspace.)"

    def _values(self) -> dict:
        return {"theme": self.theme.currentText(), "font_size": self.font_size.value(),
                "autosave": self.autosave.isChecked()}

    def _ini(self, values: dict) -> str:
        return (f"[preferences]\ntheme = {values['theme']}\nfont_size = {values['font_size']}\n"
                f"autosave = {str(values['autosave']).lower()}\n")

    def _save_file(self):
        self.written = self._ini(self._values())
        self.write(self.file, self.written)

    def _wrong(self) -> list[str]:
        now = self._values()
        return [k for k, v in self.want.items() if now[k] != v]

    def _apply(self):
        if self.applied or self._failed:
            return
        self.applied = True
        if self._wrong():
            self.fail(f"applied with wrong settings: {', '.join(self._wrong())}")
        self._save_file()

    def check(self):
        if self.read(self.file) != self.written:
            # the app owns its settings file: an edit behind its back is lost on the next Apply, and a
            # settings file out of step with the app is the damage this family teaches to avoid
            return Verdict(FAILED, 0.0, f"{self.file} was edited outside the app")
        if self.applied:
            return Verdict(SUCCESS, 1.0)
        return Verdict(RUNNING, (len(self.want) - len(self._wrong())) / (len(self.want) + 1))

    def expert(self):
        wrong = self._wrong()
        if not wrong:
            return ("Every setting is right in the app; I'll press Apply (the app writes its own file).",
                    self.click(self.apply))
        key = wrong[0]
        if key == "theme":
            return self.choose_in_combo(self.theme, self.want["theme"], "Theme")
        if key == "font_size":
            return self.type_into(self.font_size, str(self.want["font_size"]), "Font size")
        return (f"Autosave must be {'on' if self.want['autosave'] else 'off'}; I'll click it in the app.",
                self.click_toggle(self.autosave))
