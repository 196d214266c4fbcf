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

The last three live in trainer.sandbox.families_hybrid_bulk.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from agent.schema import Action
from trainer.sandbox.task import RUNNING, SUCCESS, WORDS, Task, Verdict

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


def form_layout(task: Task, parent=None):
    """A form layout in the task's spacing, in `parent` (default: the task's body)."""
    from PySide6.QtWidgets import QFormLayout

    form = QFormLayout(parent if parent is not None else task.body)
    form.setContentsMargins(task.margin, task.margin // 2, task.margin, task.margin // 2)
    form.setVerticalSpacing(task.spacing // 2 + 2)
    return form


def readonly_field(text: str):
    """A line edit showing `text` that cannot be edited (a value the app shows)."""
    from PySide6.QtWidgets import QLineEdit

    w = QLineEdit(text)
    w.setReadOnly(True)
    return w


def right_button(layout, text: str, slot):
    """A push button `text` at the right end of a row added to `layout`, calling `slot` when clicked."""
    from PySide6.QtWidgets import QHBoxLayout, QPushButton

    row = QHBoxLayout()
    row.addStretch(1)
    b = QPushButton(text)
    b.clicked.connect(slot)
    row.addWidget(b)
    layout.addLayout(row)
    return b


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
        self.file_field = readonly_field(self.file)
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
        form = form_layout(self)
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
        form = form_layout(self)
        for k, v in self.record.items():
            form.addRow(f"{k.capitalize()}:", readonly_field(str(v)))
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
