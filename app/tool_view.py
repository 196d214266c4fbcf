"""Tool calls and their output, as a supervisor reads them (Supervise, the step viewer).

A proposed run_command is shown as its command in a monospace block, marked as a call that runs
on this machine in the agent's workspace (read_file / write_file: the path, and the first lines
of what would be written). A tool's result (agent.schema's Observation.tool_output) is shown as
the command, its exit code and the first lines of its output, with how many more there are.
"""
from __future__ import annotations

import math

from PySide6.QtGui import QFontDatabase, QTextOption
from PySide6.QtWidgets import QFrame, QLabel, QPlainTextEdit, QVBoxLayout

from agent.schema import Action

TOOLS = ("run_command", "read_file", "write_file")
PREVIEW_LINES = 6


def is_tool(action: Action | None) -> bool:
    return action is not None and action.name in TOOLS


def monospace():
    return QFontDatabase.systemFont(QFontDatabase.FixedFont)


def first_lines(text: str, n: int = PREVIEW_LINES) -> str:
    """The first `n` lines of `text`, then "… N more lines" when there are more."""
    lines = text.splitlines()
    if len(lines) <= n:
        return "\n".join(lines)
    more = len(lines) - n
    return "\n".join(lines[:n] + [f"… {more} more line{'s' if more != 1 else ''}"])


def call_text(action: Action) -> str:
    """The body of a proposed tool call: the command, or the path (and the content to write)."""
    a = action.args
    if action.name == "run_command":
        return f"$ {a.get('command', '')}" + (f"\n(in {a['cwd']})" if a.get("cwd") else "")
    if action.name == "write_file":
        return f"{a.get('path', '')}\n───\n{first_lines(str(a.get('content', '')))}"
    return str(a.get("path", ""))


def call_summary(action: Action) -> str:
    """One line for a step list: `$ command`, or the tool and its path."""
    a = action.args
    return f"$ {a.get('command', '')}" if action.name == "run_command" else f"{action.name} {a.get('path', '')}"


def call_title(action: Action, workspace: str | None = None) -> str:
    what = {"run_command": "runs a shell command", "read_file": "reads a file",
            "write_file": "writes a file"}.get(action.name, action.name)
    where = f"the workspace {workspace}" if workspace else "the agent's workspace"
    return f"Tool call: {what} on this machine, in {where}"


def exit_text(out: dict) -> str:
    code = out.get("exit_code")
    if out["tool"] != "run_command":
        return "failed" if out.get("output", "").startswith("error:") else "done"
    return "did not run" if code is None else f"exit code {code}"


def output_text(out: dict, n: int = PREVIEW_LINES) -> str:
    """A tool's result for a person: the call, its exit code, the first lines of its output."""
    head = f"$ {out['target']}" if out["tool"] == "run_command" else f"{out['tool']} {out['target']}"
    body = first_lines(out.get("output") or "", n) or "(no output)"
    cut = "\n(the output was cut where it was recorded)" if out.get("truncated") else ""
    return f"{head}\n[{exit_text(out)}]\n{body}{cut}"


def legacy_tool_output(step) -> dict | None:
    """The result of a recorded tool step: its info's tool_output, or what episodes recorded
    before tool_output existed kept in info["tool_result"] (the executor's raw answer)."""
    if not is_tool(step.action):
        return None
    out = step.info.get("tool_output")
    if isinstance(out, dict) and out.get("tool") in TOOLS:
        return out
    r = step.info.get("tool_result")
    if not isinstance(r, dict):
        return None
    a = step.action.args
    if step.action.name == "run_command":
        return {"tool": "run_command", "target": str(a.get("command", "")), "exit_code": r.get("exit_code"),
                "output": str(r.get("output", "")), "truncated": bool(r.get("truncated_output"))}
    if step.action.name == "read_file":
        return {"tool": "read_file", "target": str(a.get("path", "")), "exit_code": None,
                "output": str(r.get("content", "")), "truncated": bool(r.get("truncated_output"))}
    return {"tool": "write_file", "target": str(a.get("path", "")), "exit_code": None,
            "output": f"wrote {r.get('bytes', '?')} bytes", "truncated": False}


class _Block(QFrame):
    """A title line over a read-only monospace text block that fits its text (up to a limit)."""

    def __init__(self, max_lines: int, border: str, background: str, parent=None):
        super().__init__(parent)
        self.setObjectName("toolBlock")
        self.setFrameShape(QFrame.StyledPanel)
        self.setStyleSheet(f"QFrame#toolBlock {{ border: {border}; border-radius: 4px; background: {background}; }}")
        lay = QVBoxLayout(self)
        lay.setContentsMargins(6, 4, 6, 6)
        lay.setSpacing(3)
        self.title = QLabel()
        self.title.setWordWrap(True)
        self.body = QPlainTextEdit()
        self.body.setReadOnly(True)
        self.body.setFont(monospace())
        self.body.setLineWrapMode(QPlainTextEdit.WidgetWidth)
        self.body.setWordWrapMode(QTextOption.WrapAnywhere)  # as a terminal wraps; keeps the height below exact
        self.body.setFrameShape(QFrame.NoFrame)
        self._max_lines = max_lines
        lay.addWidget(self.title)
        lay.addWidget(self.body)
        lay.addStretch(1)  # beside a taller block, keep the text at the top
        self.hide()

    def _fill(self, title: str, color: str, text: str) -> None:
        self.title.setText(f"<b style='color:{color}'>{title}</b>")
        self.body.setPlainText(text)
        self.show()
        self._fit()

    def _fit(self) -> None:
        """As tall as the text's wrapped lines (up to the limit; it scrolls beyond), never cut."""
        fm = self.body.fontMetrics()
        margin = self.body.document().documentMargin()
        width = max(1.0, self.body.viewport().width() - 2 * margin - 4)
        lines = sum(max(1, math.ceil(fm.horizontalAdvance(line) / width)) for line in self.body.toPlainText().split("\n"))
        lines = min(self._max_lines, lines)
        self.body.setFixedHeight(int(lines * fm.lineSpacing() + 2 * margin + 6))

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        if not self.isHidden() and event.size().width() != event.oldSize().width():
            self._fit()

    def text(self) -> str:
        return "" if self.isHidden() else self.body.toPlainText()


class ToolCallView(_Block):
    """A proposed tool call (hidden for any other action)."""

    def __init__(self, parent=None):
        # orange, as the gate's risky actions: approving it runs a program here
        super().__init__(PREVIEW_LINES + 4, "2px solid #d9822b", "#fff6e8", parent=parent)
        self.workspace: str | None = None

    def set_action(self, action: Action | None, proposed: Action | None = None) -> None:
        if not is_tool(action):
            self.hide()
            return
        text = call_text(action)
        if proposed is not None and proposed != action:
            text += "\n\nproposed by the agent:\n" + call_text(proposed)
        self._fill(call_title(action, self.workspace), "#b35c00", text)
        self.setToolTip("Approving runs this with your rights (a command is not confined to the workspace); "
                        "edit it in the fields below first if it is wrong")


class ToolOutputView(_Block):
    """A tool's result: the call, its exit code (red when it failed), the first lines of its output."""

    def __init__(self, title: str = "Tool output", parent=None):
        super().__init__(PREVIEW_LINES + 4, "1px solid #c8c8c8", "#fafafa", parent=parent)
        self.heading = title
        self.output: dict | None = None

    def set_output(self, out: dict | None, title: str | None = None) -> None:
        self.output = out
        if out is None:
            self.hide()
            return
        failed = (out["tool"] == "run_command" and out.get("exit_code") != 0) or str(out.get("output", "")).startswith("error:")
        self._fill(f"{title or self.heading} · {exit_text(out)}", "#c0392b" if failed else "#2b9348", output_text(out))

    def set_text(self, title: str, text: str) -> None:
        """Plain text in the block (an old episode's text observation)."""
        self.output = None
        self._fill(title, "#555", first_lines(text, PREVIEW_LINES))
