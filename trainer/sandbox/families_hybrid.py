"""Hybrid families: a GUI app and the terminal/file tools (run_command, read_file, write_file) over
one workspace folder per episode (the UI-TARS-2 report's GUI-SDK tasks).

Each family prepares its files in the episode's workspace (`SandboxEnv(tools=True)` makes it; a
hybrid family gets one with the tools off too, for the app's own files), its app reads and writes
that folder, and its verifier reads files and widget state only. The scripted expert uses both
interfaces with the tools on, and the GUI alone with them off where the task has a GUI-only route
(`gui_route`); one that has none says why (`needs_tools`) and cannot be played with the tools off.
An expert that learns something from a tool reads it from the tool's recorded output (`tool_log`),
as a model would from its observation, never from the task's own variables.

- export_count: the app exports a CSV; count the rows matching a condition with a command, enter
  the number. GUI-only: page through the list and count by eye.
- config_to_form: a config file in the workspace goes into a settings form. Tools required.
- form_to_file: a record shown in the app goes into a file of a given format (JSON or key=value).
  GUI-only: the app's Export (format, file name).
- bulk_rename: rename every file of one kind; one shell loop, or a rename dialog per file.
- output_decides: which log is longest/largest decides what to attach; `wc`, or selecting each
  file to read its details.
- tool_trap: change settings in the app; its settings file is in the workspace but the app owns
  it, and an edit behind its back fails the task. The expert uses the GUI only.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from agent.schema import Action
from trainer.sandbox.task import FAILED, RUNNING, SUCCESS, WORDS, Task, Verdict

HYBRID_LEVEL = 6


class HybridTask(Task):
    """A task over a workspace folder. Subclasses set `gui_route` (False: no way without the tools,
    `needs_tools` saying why) and may size `max_steps` per episode in build()."""

    level = HYBRID_LEVEL
    gui_route = True
    needs_tools = ""

    def __init__(self, seed: int, screen, *, workspace, tools: bool):
        self.workspace = Path(workspace)
        self.tools = bool(tools)
        self.tool_log: list[tuple[Action, dict, str | None]] = []  # every tool action run here: its output, its error
        super().__init__(seed, screen)

    # ------------------------------------------------------------ files
    def path(self, name: str) -> Path:
        return self.workspace / name

    def write(self, name: str, text: str) -> None:
        self.path(name).write_text(text, encoding="utf-8")

    def read(self, name: str) -> str | None:
        try:
            return self.path(name).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            return None

    def files(self) -> list[str]:
        return sorted(p.name for p in self.workspace.iterdir() if p.is_file())

    # ------------------------------------------------------------ tools
    def after_tool(self, action: Action, output: dict, error: str | None = None) -> None:
        self.tool_log.append((action, output, error))

    def output_of(self, tool: str, target: str) -> str | None:
        """The output of the last successful `tool` run on `target` (a command or a path), or None."""
        for _, out, error in reversed(self.tool_log):
            if out["tool"] == tool and out["target"] == target and error is None and out["exit_code"] in (0, None):
                return out["output"]
        return None

    @staticmethod
    def run(command: str) -> Action:
        return Action("run_command", {"command": command})


def _form(task: Task, parent=None):
    from PySide6.QtWidgets import QFormLayout

    form = QFormLayout(parent if parent is not None else task.body)
    form.setContentsMargins(task.margin, task.margin // 2, task.margin, task.margin // 2)
    form.setVerticalSpacing(task.spacing // 2 + 2)
    return form


def _readonly(text: str):
    from PySide6.QtWidgets import QLineEdit

    w = QLineEdit(text)
    w.setReadOnly(True)
    return w


# ---------------------------------------------------------------- a. export_count
STATUSES = ("shipped", "pending", "cancelled", "returned")


class ExportCount(HybridTask):
    family, title = "export_count", "Orders"

    def build(self):
        from PySide6.QtWidgets import QHBoxLayout, QLabel, QLineEdit, QListWidget, QPushButton, QVBoxLayout

        rng = self.rng
        cities = self.pick("cities", 4)
        n = rng.randint(24, 40)
        self.rows = [(i, rng.choice(cities), rng.choice(STATUSES), rng.randint(5, 400))
                     for i in rng.sample(range(1000, 9999), n)]
        self.file = f"orders_{rng.randint(100, 999)}.csv"
        kind = rng.choice(("status", "city_status", "amount"))
        pivot = rng.choice(self.rows)
        if kind == "status":
            self.match = lambda r, s=pivot[2]: r[2] == s
            desc, self.command = f"with status '{pivot[2]}'", f"grep -c ',{pivot[2]},' {self.file}"
        elif kind == "city_status":
            self.match = lambda r, c=pivot[1], s=pivot[2]: r[1] == c and r[2] == s
            desc = f"from {pivot[1]} with status '{pivot[2]}'"
            self.command = f"grep -c ',{pivot[1]},{pivot[2]},' {self.file}"
        else:
            amounts = sorted(r[3] for r in self.rows)
            limit = amounts[rng.randint(n // 4, 3 * n // 4)] - 1
            self.match = lambda r, t=limit: r[3] > t
            desc = f"with an amount over {limit}"
            self.command = f"awk -F, 'NR > 1 && $4 > {limit}' {self.file} | wc -l"
        self.count = sum(map(self.match, self.rows))
        lay = QVBoxLayout(self.body)
        lay.setContentsMargins(self.margin, self.margin // 2, self.margin, self.margin // 2)
        lay.setSpacing(self.spacing // 2 + 1)
        top = QHBoxLayout()
        top.addWidget(QLabel("File:"))
        self.file_field = _readonly(self.file)
        top.addWidget(self.file_field, 1)
        self.export = QPushButton("Export CSV")
        self.export.clicked.connect(self._export)
        top.addWidget(self.export)
        lay.addLayout(top)
        lay.addWidget(QLabel("id  city  status  amount"))
        self.list = QListWidget()
        self.list.addItems([f"{r[0]} {r[1]} {r[2]} {r[3]}" for r in self.rows])
        lay.addWidget(self.list, 1)
        bottom = QHBoxLayout()
        bottom.addWidget(QLabel("Count:"))
        self.answer = QLineEdit()
        bottom.addWidget(self.answer, 1)
        self.submit = QPushButton("Submit")
        self.submit.clicked.connect(self._submit)
        bottom.addWidget(self.submit)
        lay.addLayout(bottom)
        self.submitted: str | None = None
        self.seen: set[int] = set()  # rows the GUI-only expert has had on screen
        self.max_steps = n // 2 + 10  # the GUI route pages through every row
        if self.tools:
            self.instruction = (f"Export the orders to a CSV file, count the orders {desc} with a command, "
                                "enter the number under Count and press Submit.")
        else:
            self.instruction = f"Count the orders {desc} in the list, enter the number under Count and press Submit."

    def _csv(self) -> str:
        return "id,city,status,amount\n" + "".join(f"{r[0]},{r[1]},{r[2]},{r[3]}\n" for r in self.rows)

    def _export(self):
        self.write(self.file, self._csv())

    def _submit(self):
        if self.submitted is None:
            self.submitted = self.answer.text().strip()
            if self.submitted != str(self.count):
                self.fail(f"submitted {self.submitted!r}, but {self.count} orders match")

    def check(self):
        if self.submitted is not None:
            return Verdict(SUCCESS, 1.0)  # a wrong answer failed at once (fail())
        exported = self.read(self.file) == self._csv()
        return Verdict(RUNNING, 0.25 * exported + 0.5 * (self.answer.text().strip() == str(self.count)))

    def _visible_rows(self) -> list[int]:
        vp = self.list.viewport().rect()
        return [i for i in range(self.list.count())
                if vp.contains(self.list.visualItemRect(self.list.item(i)).adjusted(0, 0, 0, -1))]

    def expert(self):
        from PySide6.QtWidgets import QApplication

        if self.tools:
            if self.read(self.file) != self._csv():
                return ("The orders are only in the app; I'll export them to a CSV file first.", self.click(self.export))
            out = self.output_of("run_command", self.command)
            if out is None or not out.strip().isdigit():
                return (f"The export is in {self.file}; I'll count the matching rows with a command.",
                        self.run(self.command))
            n = out.strip()
            if self.answer.text().strip() != n:
                return self.type_into(self.answer, n, "Count")
            return (f"The command counted {n} orders and Count holds {n}; I'll press Submit.", self.click(self.submit))
        visible = self._visible_rows()
        self.seen.update(visible)
        unseen = [i for i in range(len(self.rows)) if i not in self.seen]
        so_far = sum(self.match(self.rows[i]) for i in sorted(self.seen))
        if unseen:
            if QApplication.focusWidget() is not self.list:
                row = self.list.item(visible[0] if visible else 0)
                return ("I'll count the matching orders page by page; I'll click into the list first.",
                        self.click(self.list.viewport(), self.list.visualItemRect(row)))
            key = "pageup" if visible and unseen[0] < visible[0] else "pagedown"
            return (f"{so_far} matching orders so far, {len(unseen)} rows still unseen; I'll press {key}.",
                    Action("hotkey", {"key": key}))
        if self.answer.text().strip() != str(so_far):
            return self.type_into(self.answer, str(so_far), "Count")
        return (f"I've seen every row: {so_far} orders match, and Count holds it; I'll press Submit.",
                self.click(self.submit))


# ---------------------------------------------------------------- b. config_to_form
PROTOCOLS = ("http", "https", "ssh", "ftp", "smtp")
HOSTS = ("db", "api", "cache", "mail", "files", "auth", "queue", "search")


def parse_conf(text: str) -> dict[str, str]:
    """key = value lines ('#' comments and blank lines skipped); a line that is neither is an error."""
    out: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, eq, value = line.partition("=")
        if not eq or not key.strip():
            raise ValueError(f"line {n} is not key=value: {line!r}")
        if key.strip() in out:
            raise ValueError(f"key {key.strip()!r} given twice")
        out[key.strip()] = value.strip()
    return out


class ConfigToForm(HybridTask):
    family, title = "config_to_form", "Connection"
    gui_route = False
    needs_tools = "the settings are only in a file in the workspace, and the app cannot open files"

    def build(self):
        from PySide6.QtWidgets import QCheckBox, QComboBox, QLineEdit, QPushButton, QSpinBox

        rng = self.rng
        want = {"host": f"{rng.choice(HOSTS)}-{rng.randint(1, 9)}.{rng.choice(('example.net', 'corp.local', 'lan'))}",
                "port": str(rng.choice((21, 22, 25, 80, 443, 5432, 6379, 8080, 8443, rng.randint(1024, 9999)))),
                "protocol": rng.choice(PROTOCOLS), "timeout": str(rng.randint(5, 120)),
                "retries": str(rng.randint(0, 9)), "tls": rng.choice(("true", "false"))}
        keys = ["host", "port"] + rng.sample(["protocol", "timeout", "retries", "tls"], rng.randint(1, 3))
        self.keys = [k for k in want if k in keys]
        self.want = {k: want[k] for k in self.keys}
        self.json = rng.random() < 0.4
        self.file = rng.choice(("server", "connection", "remote", "upstream")) + (".json" if self.json else ".conf")
        distract = {"log_level": rng.choice(("debug", "info", "warn")), "backup_host": f"{rng.choice(HOSTS)}-0.lan"}
        if self.json:
            data = {**{k: (int(v) if v.isdigit() else v == "true" if k == "tls" else v) for k, v in self.want.items()},
                    **distract}
            text = json.dumps(dict(sorted(data.items(), key=lambda _: rng.random())), indent=2) + "\n"
        else:
            lines = [f"# {self.title.lower()} settings", f"# port = {rng.randint(1000, 9999)}  (old, unused)"]
            items = list(self.want.items()) + list(distract.items())
            rng.shuffle(items)
            lines += [f"{k} = {v}" for k, v in items]
            text = "\n".join(lines) + "\n"
        self.write(self.file, text)
        form = _form(self)
        self.fields = {}
        self.fields["host"] = QLineEdit(f"{rng.choice(HOSTS)}.localhost")
        form.addRow("Host:", self.fields["host"])
        self.fields["port"] = QSpinBox()
        self.fields["port"].setRange(1, 65535)
        self.fields["port"].setValue(rng.choice((3000, 8000, 9000)))
        form.addRow("Port:", self.fields["port"])
        if "protocol" in self.keys:
            c = QComboBox()
            c.addItems(PROTOCOLS)
            c.setCurrentIndex(rng.randrange(len(PROTOCOLS)))
            if c.currentText() == self.want["protocol"]:
                c.setCurrentIndex((c.currentIndex() + 1) % len(PROTOCOLS))
            self.fields["protocol"] = c
            form.addRow("Protocol:", c)
        for key, label, top in (("timeout", "Timeout (s):", 300), ("retries", "Retries:", 10)):
            if key in self.keys:
                s = QSpinBox()
                s.setRange(0, top)
                s.setValue((int(self.want[key]) + rng.randint(1, 5)) % (top + 1))
                self.fields[key] = s
                form.addRow(label, s)
        if "tls" in self.keys:
            self.fields["tls"] = QCheckBox("Use TLS")
            self.fields["tls"].setChecked(self.want["tls"] != "true")
            form.addRow("", self.fields["tls"])
        self.save = QPushButton("Save")
        self.save.clicked.connect(self._save)
        form.addRow("", self.save)
        self.saved = False
        self.max_steps = 3 * len(self.keys) + 6
        names = {"host": "Host", "port": "Port", "protocol": "Protocol", "timeout": "Timeout", "retries": "Retries",
                 "tls": "Use TLS"}
        self.instruction = (f"Copy the connection settings in {self.file} (in the workspace) into this form "
                            f"({', '.join(names[k] for k in self.keys)}) and press Save.")

    def _value(self, key: str) -> str:
        w = self.fields[key]
        if key == "host":
            return w.text().strip()
        if key == "protocol":
            return w.currentText()
        if key == "tls":
            return "true" if w.isChecked() else "false"
        return str(w.value())

    def _wrong(self) -> list[str]:
        return [k for k in self.keys if self._value(k) != self.want[k]]

    def _save(self):
        if not self.saved:
            self.saved = True
            if self._wrong():
                self.fail(f"saved with wrong fields: {', '.join(self._wrong())}")

    def check(self):
        if self.saved:
            return Verdict(SUCCESS, 1.0)
        return Verdict(RUNNING, (len(self.keys) - len(self._wrong())) / (len(self.keys) + 1))

    def _read_values(self) -> dict[str, str] | None:
        """The settings as the expert read them from the tool's output (None: not read yet)."""
        text = self.output_of("read_file", self.file)
        if text is None:
            return None
        try:
            if self.json:
                data = json.loads(text)
                return {k: ("true" if v is True else "false" if v is False else str(v)) for k, v in data.items()}
            return parse_conf(text)
        except ValueError:
            return None

    def expert(self):
        values = self._read_values()
        if values is None:
            return (f"The settings are in {self.file}; I'll read the file.", Action("read_file", {"path": self.file}))
        for key in self.keys:
            want, w = values[key], self.fields[key]
            if self._value(key) == want:
                continue
            if key == "protocol":
                return self.choose_in_combo(w, want, "Protocol")
            if key == "tls":
                return (f"{self.file} says tls = {want}; I'll {'tick' if want == 'true' else 'untick'} Use TLS.",
                        self.click_toggle(w))
            return self.type_into(w, want, key.capitalize())
        return (f"The form matches {self.file}; I'll press Save.", self.click(self.save))


# ---------------------------------------------------------------- c. form_to_file
FORMATS = {"json": "a JSON object", "kv": "key=value lines"}


def parse_record(text: str, fmt: str) -> dict:
    """A saved record: fmt "json" (one object) or "kv" (key=value lines). ValueError when the text
    is not in that format."""
    if fmt == "json":
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError(f"a JSON object was wanted, got {type(data).__name__}")
        return data
    data = parse_conf(text)
    return {k: (int(v) if re.fullmatch(r"-?\d+", v) else v) for k, v in data.items()}


def format_record(record: dict, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(record, indent=2) + "\n"
    return "".join(f"{k}={v}\n" for k, v in record.items())


class FormToFile(HybridTask):
    family, title = "form_to_file", "Contacts"

    def build(self):
        from PySide6.QtWidgets import QComboBox, QHBoxLayout, QLineEdit, QPushButton, QWidget

        rng = self.rng
        name = rng.choice(WORDS["names"])
        full = {"name": name, "email": f"{name.lower()}.{rng.randint(2, 98)}@example.org",
                "city": rng.choice(WORDS["cities"]), "age": rng.randint(18, 80),
                "team": rng.choice(("Sales", "Support", "Research", "Design", "Ops"))}
        keys = ["name"] + rng.sample(["email", "city", "age", "team"], rng.randint(2, 3))
        self.record = {k: full[k] for k in full if k in keys}
        self.fmt = rng.choice(tuple(FORMATS))
        self.file = rng.choice(("contact", "person", "card", "record")) + (".json" if self.fmt == "json" else ".cfg")
        form = _form(self)
        for k, v in self.record.items():
            form.addRow(f"{k.capitalize()}:", _readonly(str(v)))
        row = QWidget()
        h = QHBoxLayout(row)
        h.setContentsMargins(0, 0, 0, 0)
        self.format_box = QComboBox()
        self.format_box.addItems(["CSV", "JSON", "key=value"])
        self.format_box.setCurrentIndex(rng.randrange(3))
        h.addWidget(self.format_box)
        self.export = QPushButton("Export")
        self.export.clicked.connect(self._export)
        h.addWidget(self.export)
        self.name_field = QLineEdit(rng.choice(("export.txt", "contact.csv", "out.txt")))
        form.addRow("File name:", self.name_field)
        form.addRow("Format:", row)
        self.max_steps = 10
        self.instruction = (f"Save this contact to {self.file} as {FORMATS[self.fmt]} with the keys "
                            f"{', '.join(self.record)} (age as a number).") if "age" in self.record else (
            f"Save this contact to {self.file} as {FORMATS[self.fmt]} with the keys {', '.join(self.record)}.")

    def _export(self):
        """The app's own export: every field, in the chosen format, to the named file in the workspace."""
        name, fmt = self.name_field.text().strip(), self.format_box.currentText()
        if not name or "/" in name or name in (".", ".."):
            return
        if fmt == "CSV":
            text = ",".join(self.record) + "\n" + ",".join(str(v) for v in self.record.values()) + "\n"
        else:
            text = format_record(self.record, "json" if fmt == "JSON" else "kv")
        self.write(name, text)

    def problem(self) -> str | None:
        """What is wrong with the saved file, or None when it holds exactly the record."""
        text = self.read(self.file)
        if text is None:
            return f"no readable {self.file}"
        try:
            data = parse_record(text, self.fmt)
        except ValueError as e:
            return f"{self.file} is not {FORMATS[self.fmt]}: {e}"
        if data != self.record:
            return f"{self.file} holds {data}, not {self.record}"
        return None

    def check(self):
        problem = self.problem()
        if problem is None:
            return Verdict(SUCCESS, 1.0)
        return Verdict(RUNNING, 0.0 if self.read(self.file) is None else 0.5, problem)

    def expert(self):
        shown = ", ".join(f"{k} {v!r}" for k, v in self.record.items())
        if self.tools:
            return (f"The contact shows {shown}; I'll write it to {self.file} as {FORMATS[self.fmt]}.",
                    Action("write_file", {"path": self.file, "content": format_record(self.record, self.fmt)}))
        want = "JSON" if self.fmt == "json" else "key=value"
        if self.format_box.currentText() != want:
            return self.choose_in_combo(self.format_box, want, "Format")
        if self.name_field.text() != self.file:
            return self.type_into(self.name_field, self.file, "File name")
        return (f"Format {want} and file name {self.file} are set; I'll press Export.", self.click(self.export))


# ---------------------------------------------------------------- d. bulk_rename
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
        row = QHBoxLayout()
        row.addStretch(1)
        self.rename_button = QPushButton("Rename…")
        self.rename_button.clicked.connect(self._open)
        row.addWidget(self.rename_button)
        lay.addLayout(row)
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
        from PySide6.QtWidgets import QHBoxLayout, QLabel, QListWidget, QPushButton, QVBoxLayout

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
        self.details = _readonly("select a file")
        row.addWidget(self.details, 1)
        lay.addLayout(row)
        bottom = QHBoxLayout()
        bottom.addStretch(1)
        self.attach = QPushButton("Attach")
        self.attach.clicked.connect(self._attach)
        bottom.addWidget(self.attach)
        lay.addLayout(bottom)
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
        form = _form(self)
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


_ALL = [ExportCount, ConfigToForm, FormToFile, BulkRename, OutputDecides, ToolTrap]
HYBRID_FAMILIES: dict[str, type[HybridTask]] = {cls.family: cls for cls in _ALL}
