"""Multi-step families: several subgoals on one screen, checked when the task is committed."""
from __future__ import annotations

from agent.schema import Action
from trainer.sandbox.task import RUNNING, SUCCESS, WORDS, Task, Verdict


class SettingsChain(Task):
    """Open a tab, pick a dropdown value, tick a box, then Apply: four subgoals."""

    family, level, max_steps, title = "settings_chain", 5, 14, "Preferences"

    def build(self):
        from PySide6.QtWidgets import (
            QCheckBox,
            QComboBox,
            QFormLayout,
            QHBoxLayout,
            QPushButton,
            QTabWidget,
            QVBoxLayout,
            QWidget,
        )

        rng = self.rng
        names = self.pick("settings", 3)
        lay = QVBoxLayout(self.body)
        lay.setContentsMargins(self.margin, self.margin // 2, self.margin, self.margin // 2)
        self.tabs = QTabWidget()
        self.combos, self.boxes = {}, {}
        for n in names:
            page = QWidget()
            form = QFormLayout(page)
            form.setVerticalSpacing(3)
            c = QComboBox()
            c.addItems(rng.sample(("Light", "Dark", "System", "High contrast", "Sepia"), 4))
            form.addRow(rng.choice(("Theme:", "Mode:", "Style:")), c)
            self.combos[n] = c
            for o in rng.sample(WORDS["options"], 2):
                b = QCheckBox(o)
                form.addRow("", b)
                self.boxes[(n, o)] = b
            self.tabs.addTab(page, n)
        lay.addWidget(self.tabs, 1)
        row = QHBoxLayout()
        row.addStretch(1)
        self.apply = QPushButton("Apply")
        self.cancel = QPushButton("Cancel")
        row.addWidget(self.cancel)
        row.addWidget(self.apply)
        lay.addLayout(row)
        self.applied = None
        self.apply.clicked.connect(self._on_apply)
        self.cancel.clicked.connect(lambda: self.fail("pressed Cancel"))
        self.tab = rng.choice(names[1:])
        combo = self.combos[self.tab]
        self.value = combo.itemText(rng.randint(1, combo.count() - 1))
        self.option = rng.choice([o for (t, o) in self.boxes if t == self.tab])
        self.instruction = (f"In '{self.tab}', set the dropdown to '{self.value}', turn on '{self.option}', "
                            "then click Apply.")

    def _subgoals(self):
        return [self.tabs.tabText(self.tabs.currentIndex()) == self.tab or self._set_right(),
                self.combos[self.tab].currentText() == self.value, self.boxes[(self.tab, self.option)].isChecked()]

    def _set_right(self):
        return self.combos[self.tab].currentText() == self.value and self.boxes[(self.tab, self.option)].isChecked()

    def _on_apply(self):
        if self.applied is None:
            self.applied = self._set_right()
            if not self.applied:
                self.fail("applied before the settings were right")

    def check(self):
        if self.applied:
            return Verdict(SUCCESS, 1.0)
        return Verdict(RUNNING, sum(self._subgoals()) / 4)

    def expert(self):
        from PySide6.QtWidgets import QApplication

        combo = self.combos[self.tab]
        popup = QApplication.activePopupWidget()
        if combo.currentText() != self.value and popup is not None and popup is combo.view().window():
            return self.choose_in_combo(combo, self.value, "dropdown")
        if self._set_right():
            return ("Both settings are right; I'll click Apply.", self.click(self.apply))
        if self.tabs.tabText(self.tabs.currentIndex()) != self.tab:
            return self.open_tab(self.tabs, self.tab)
        if combo.currentText() != self.value:
            return self.choose_in_combo(combo, self.value, "dropdown")
        return (f"Now I'll turn on '{self.option}'.", self.click_toggle(self.boxes[(self.tab, self.option)]))


class SearchChain(Task):
    """Type a query, run the search, open the right result: three subgoals."""

    family, level, max_steps, title = "search_chain", 5, 10, "Contacts"

    SURNAMES = "Hopper Lovelace Turing Curie Noether Knuth Ritchie Liskov Hamilton Shannon Berners Torvalds".split()

    def build(self):
        from PySide6.QtWidgets import QHBoxLayout, QLabel, QLineEdit, QListWidget, QPushButton, QVBoxLayout

        rng = self.rng
        first = rng.sample(WORDS["names"], 6)
        people = [f"{f} {s}" for f in first for s in rng.sample(self.SURNAMES, 3)]
        self.people = rng.sample(people, 14)
        self.query = rng.choice(first)
        matches = [p for p in self.people if p.split()[0] == self.query]
        if not matches:
            self.people[0] = f"{self.query} {rng.choice(self.SURNAMES)}"
            matches = [self.people[0]]
        self.target = rng.choice(matches)
        lay = QVBoxLayout(self.body)
        lay.setContentsMargins(self.margin, self.margin, self.margin, self.margin)
        row = QHBoxLayout()
        self.search = QLineEdit()
        self.search.setPlaceholderText("Search contacts")
        self.button = QPushButton("Search")
        row.addWidget(self.search, 1)
        row.addWidget(self.button)
        lay.addLayout(row)
        self.results = QListWidget()
        lay.addWidget(self.results, 1)
        self.status = QLabel("No contact open")
        lay.addWidget(self.status)
        self.searched_for: str | None = None
        self.opened: str | None = None
        self.button.clicked.connect(self._run)
        self.search.returnPressed.connect(self._run)
        self.results.itemDoubleClicked.connect(self._open)
        self.results.addItems(sorted(self.people)[:5])  # recent contacts before any search
        self.instruction = f"Search for '{self.query}' and open the contact '{self.target}' (double-click)."

    def _run(self):
        q = self.search.text().strip().lower()
        self.searched_for = q
        self.results.clear()
        self.results.addItems([p for p in sorted(self.people) if q and q in p.lower()] or ["No results"])

    def _open(self, item):
        if item.text() == "No results":
            return
        self.opened = item.text()
        self.status.setText(f"Open: {self.opened}")
        if self.opened != self.target:
            self.fail(f"opened '{self.opened}'")

    def check(self):
        if self.opened == self.target:
            return Verdict(SUCCESS, 1.0)
        goals = [self.search.text() == self.query, self.searched_for == self.query.lower()]
        return Verdict(RUNNING, sum(goals) / 3)

    def expert(self):
        from PySide6.QtCore import Qt

        if self.searched_for == self.query.lower():
            found = self.results.findItems(self.target, Qt.MatchExactly)
            if found:
                rect = self.results.visualItemRect(found[0])
                scroll = self.scroll_to(self.results, rect, self.target)
                if scroll:
                    return scroll
                return (f"'{self.target}' is in the results; I'll double-click it to open it.",
                        Action("left_double", {"start_box": self.screen.point_of(self.results.viewport(), rect)}))
        if self.search.text() != self.query:
            return self.type_into(self.search, self.query, "search")
        return ("The query is typed; I'll run the search.", self.click(self.button))
