"""The decision widget: one proposed step, and the supervisor's answer.

Shows the screenshot with the proposed action drawn (app.screenshot_canvas), the thought and the
action; a tool call (run_command, read_file, write_file) as its command or path in a monospace
block (app.tool_view), and the output of the last tool call, which the agent sees with this step. Keys: Enter approves (an approve after any change is an edit: a click on the screenshot
moves the click or draws a new drag, the action editor changes text, hotkey or scroll, the thought
box rewrites the thought), R asks for a reason and rejects, T takes over (compose your own steps
on the screenshot, then hand control back or end the run), Esc resets the edits.
Emits `answered(pending, Decision | Takeover)`; what to do with it (a local QtSupervisor, a remote
decision message) is the page's business.
"""
from __future__ import annotations

import time

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QImage, QPixmap
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from agent import coords
from agent.actions import validate
from agent.grammar import format_action, format_for_display
from agent.run.gate import Decision, HumanStep, Takeover
from agent.schema import Action
from agent.wording import plural
from app.action_editor import ActionEditor
from app.screenshot_canvas import ScreenshotCanvas
from app.tool_view import ToolCallView, ToolOutputView, is_tool


def frame_pixmap(frame) -> tuple[QPixmap | None, int, int]:
    """(pixmap, width, height) of an executor Frame (pixels or encoded bytes). Main thread only."""
    if frame is None or not frame.has_image:
        g = getattr(frame, "geometry", None)
        return None, (g.physical_width if g else 16), (g.physical_height if g else 10)
    if frame.pixels is not None:
        px = frame.pixels
        h, w = px.shape[:2]
        if not px.flags["C_CONTIGUOUS"]:
            import numpy as np

            px = np.ascontiguousarray(px)
        fmt = QImage.Format_BGR888 if frame.bgr else QImage.Format_RGB888
        img = QImage(px.data, w, h, px.strides[0], fmt).copy()  # copy: the array may go away
        return QPixmap.fromImage(img), w, h
    pm = QPixmap()
    pm.loadFromData(frame.encoded)
    return pm, pm.width(), pm.height()


class ProposalPanel(QWidget):
    answered = Signal(object, object)  # pending, Decision | Takeover
    displayed = Signal(object, float)  # pending, perf_counter when its screenshot was painted

    def __init__(self, name: str = "supervisor", parent=None):
        super().__init__(parent)
        self.name = name
        self.pending = None
        self.compose = False  # composing a takeover
        self.human_steps: list[HumanStep] = []
        self._original: Action | None = None
        self._dirty = False
        self._shown_at = 0.0
        self.asking_reason = False  # the reason box is open: Enter rejects, Esc closes it
        self.setFocusPolicy(Qt.StrongFocus)

        self.title = QLabel("Waiting for the agent…")
        self.title.setObjectName("title")
        self.title.setWordWrap(True)  # end-of-run sentences are long: wrap, never widen the window
        self.busy = QProgressBar()  # moving while the agent thinks: a model can take many seconds
        self.busy.setRange(0, 0)
        self.busy.setTextVisible(False)
        self.busy.setFixedSize(120, 10)
        self.subtitle = QLabel("")
        self.subtitle.setObjectName("muted")
        self.subtitle.setWordWrap(True)
        self.canvas = ScreenshotCanvas()
        self.canvas.pointsEdited.connect(self._canvas_edit)

        self.thought = QPlainTextEdit()
        self.thought.setPlaceholderText("The agent's thought (edit to rewrite it)")
        self.thought.setTabChangesFocus(True)
        self.thought.setFixedHeight(96)
        self.thought.textChanged.connect(self._thought_edit)
        self.action_text = QLabel("")
        self.action_text.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.action_text.setWordWrap(True)
        self.tool_call = ToolCallView()  # a proposed command or file operation, readable before it runs
        self.last_output = ToolOutputView("Output of the last tool call")  # what the agent sees with this step
        self.editor = ActionEditor()
        self.editor.changed.connect(self._editor_edit)
        self.steps_list = QListWidget()
        self.steps_list.setFixedHeight(90)
        self.reason = QLineEdit()
        self.reason.setPlaceholderText("Why is it wrong? Enter rejects")
        self.reason.setToolTip("Why this step is wrong: the agent is asked again and told why (Enter rejects, Esc cancels)")
        self.status = QLabel("")
        self.status.setWordWrap(True)

        self.approve_btn = QPushButton("Approve  ⏎")
        self.approve_btn.setDefault(True)
        self.reject_btn = QPushButton("Reject…  R")
        self.takeover_btn = QPushButton("Take over  T")
        self.stop_btn = QPushButton("Stop run")
        self.stop_btn.setObjectName("danger")
        self.reset_btn = QPushButton("Reset edits  Esc")
        self.add_btn = QPushButton("Add step  A")
        self.handback_btn = QPushButton("Run my steps, hand back  ⏎")
        self.end_btn = QPushButton("Run my steps, end run")
        self.approve_btn.clicked.connect(self.approve)
        self.reject_btn.clicked.connect(self._reject_clicked)
        self.takeover_btn.clicked.connect(self.start_takeover)
        self.stop_btn.clicked.connect(self.stop_run)
        self.reset_btn.clicked.connect(self.reset_edits)
        self.add_btn.clicked.connect(self.add_step)
        self.handback_btn.clicked.connect(lambda: self.finish_takeover(True))
        self.end_btn.clicked.connect(lambda: self.finish_takeover(False))

        side = QWidget()
        sl = QVBoxLayout(side)
        sl.setContentsMargins(8, 0, 0, 0)
        sl.addWidget(QLabel("Thought"))
        sl.addWidget(self.thought)
        sl.addWidget(QLabel("Action"))
        sl.addWidget(self.action_text)
        sl.addWidget(self.editor)
        self.steps_label = QLabel("Your steps")
        sl.addWidget(self.steps_label)
        sl.addWidget(self.steps_list)
        sl.addWidget(self.reason)
        sl.addStretch(1)
        for row in ((self.approve_btn, self.reject_btn), (self.takeover_btn, self.reset_btn),
                    (self.add_btn, self.handback_btn), (self.end_btn, self.stop_btn)):
            h = QHBoxLayout()
            for b in row:
                h.addWidget(b)
            sl.addLayout(h)
        sl.addWidget(self.status)
        # under the screenshot, as wide as it: the tool output the agent sees with it, the proposed call
        left = QWidget()
        ll = QVBoxLayout(left)
        ll.setContentsMargins(0, 0, 0, 0)
        ll.addWidget(self.canvas, 1)
        blocks = QHBoxLayout()
        blocks.addWidget(self.last_output, 1)
        blocks.addWidget(self.tool_call, 1)
        ll.addLayout(blocks)
        self.split = split = QSplitter(Qt.Horizontal)
        split.addWidget(left)
        split.addWidget(side)
        split.setStretchFactor(0, 3)
        split.setStretchFactor(1, 1)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        head = QHBoxLayout()
        head.addWidget(self.title, 3)  # a word-wrapped label without stretch shrinks to a few words a line
        head.addWidget(self.busy)
        head.addStretch(1)
        lay.addLayout(head)
        lay.addWidget(self.subtitle)
        lay.addWidget(split, 1)
        self.read_only = False
        self.clear()

    # ------------------------------------------------------------ state
    def clear(self, message: str = "Waiting for the agent…", busy: bool | None = None) -> None:
        """No request on screen; `busy` (default: the message says it waits) shows the agent is at work."""
        self.pending = None
        self.compose = False
        self.title.setText(message)
        self.busy.setVisible(message.rstrip().endswith("Waiting for the agent…") if busy is None else busy)
        self.subtitle.setText("")
        self.canvas.set_action(None)
        self.canvas.set_proposal(None)
        self.tool_call.hide()
        self.last_output.set_output(None)
        self.reason.clear()
        self.asking_reason = False
        self._sync_controls()

    def show_pending(self, pending, read_only: bool = False) -> None:
        """Show a request (anything with .request and .mode) and wait for the human."""
        self.pending, self.read_only = pending, read_only
        req = pending.request
        self.compose = pending.mode == "takeover"
        self.human_steps = []
        self.steps_list.clear()
        pm, w, h = frame_pixmap(req.observation)
        self._image = (w, h)
        self.canvas.set_observation(pm, w, h, missing="no screenshot (a text observation)")
        self.last_output.set_output(getattr(req.observation, "tool_output", None))
        self._load_proposal()
        sizes = self.split.sizes()
        if is_tool(self._original) and sum(sizes) > 0 and sizes[1] < 340:  # room to edit a command
            self.split.setSizes([sum(sizes) - 340, 340])
        kind = "The agent asks for you — take over" if self.compose else f"Step {req.step_index + 1}: review the proposal"
        self.title.setText(kind)
        self.busy.hide()
        self.subtitle.setText(f"{req.instruction}  ·  why asked: {req.why}" + (
            "  ·  read only: claim the run to decide" if read_only else ""))
        self.status.setText("")
        self.reason.clear()
        self.asking_reason = False
        self._sync_controls()
        self.canvas.repaint()  # painted now, so the time below is when the human can see it
        self._shown_at = time.perf_counter()
        self.displayed.emit(pending, self._shown_at)
        if not read_only:
            self.setFocus(Qt.OtherFocusReason)

    def _load_proposal(self) -> None:
        p = self.pending.request.proposal
        actions = list(p.actions) if p is not None else []
        self._original = actions[0] if actions else None
        self._dirty = False
        self.thought.blockSignals(True)
        self.thought.setPlainText("" if self.compose else (p.thought if p is not None else ""))
        self.thought.setPlaceholderText("Why you do this (optional)" if self.compose else "The agent's thought (edit to rewrite it)")
        self.thought.blockSignals(False)
        start = self._original or Action("click", {"start_box": (0.5, 0.5)})
        if self.compose and not start.points():
            start = Action("click", {"start_box": (0.5, 0.5)})
        self.editor.set_action(start, self.pending.request.platform, *self._image)
        self.canvas.set_action(start)
        self.canvas.set_proposal(None)
        self._show_action_text()

    def _sync_controls(self) -> None:
        active = self.pending is not None and not self.read_only
        deciding = active and not self.compose
        for b in (self.approve_btn, self.reject_btn, self.takeover_btn, self.reset_btn):
            b.setVisible(not self.compose)
            b.setEnabled(deciding)
        for b in (self.add_btn, self.handback_btn, self.end_btn):
            b.setVisible(self.compose)
            b.setEnabled(active and self.compose)
        self.steps_label.setVisible(self.compose)
        self.steps_list.setVisible(self.compose)
        self.stop_btn.setEnabled(active)
        self.editor.setEnabled(active)
        self.thought.setReadOnly(not active)
        self.reason.setVisible(deciding and self.asking_reason)
        self.approve_btn.setText("Approve with edits  ⏎" if self._changed() else "Approve  ⏎")

    def _screen_text(self, a: Action) -> str:
        """The action with its points in screen pixels (what the executor will click)."""
        frame = self.pending.request.observation if self.pending is not None else None
        if frame is None or not a.points():
            return format_action(a)
        try:
            return format_action(a.map_points(lambda p: coords.normalized_to_screen(p, frame.geometry))) + "  [screen px]"
        except coords.CoordinateError:
            return format_action(a)

    def _show_action_text(self) -> None:
        a = self._current_action() if self.pending is not None else None
        edited = self._original is not None and a != self._original and not self.compose
        if is_tool(a):  # the command (or path) in its own block, with the agent's if it was edited
            self.tool_call.set_action(a, self._original if edited else None)
            self.action_text.setText(f"{a.name}, edited by you" if edited else a.name)
            return
        self.tool_call.set_action(None)
        text = self._screen_text(a) if a is not None else ""
        if edited:
            text += f"\nproposed: {self._screen_text(self._original)}"
        self.action_text.setText(text)

    def _changed(self) -> bool:
        if self.pending is None or self.compose:
            return False
        p = self.pending.request.proposal
        return self._current_action() != self._original or self.thought.toPlainText() != (p.thought if p else "")

    def _current_action(self) -> Action | None:
        try:
            return self.editor.action()
        except (KeyError, ValueError):
            return None

    # ------------------------------------------------------------ edits
    def _canvas_edit(self, points: dict) -> None:
        if self.pending is None or self.read_only:
            return
        self.editor.set_points(points)  # fires editor.changed -> _editor_edit

    def _editor_edit(self) -> None:
        a = self._current_action()
        self._dirty = True
        self.canvas.set_action(a)
        self.canvas.set_proposal(self._original if (a != self._original and not self.compose) else None)
        self._show_action_text()
        self._sync_controls()

    def _thought_edit(self) -> None:
        self._sync_controls()

    def reset_edits(self) -> None:
        if self.pending is not None and not self.compose:
            self._load_proposal()
            self.status.setText("")
            self._sync_controls()

    # ------------------------------------------------------------ answers
    def _seconds(self) -> float:
        return round(time.perf_counter() - self._shown_at, 3)

    def _send(self, value) -> None:
        pending = self.pending
        kind = getattr(value, "kind", "takeover")
        said = {"approve": "Approved.", "edit": "Approved with your edits.", "stop": "Stopping the run.",
                "reject": f"Rejection recorded (“{getattr(value, 'reason', '')}”): the agent is asked again."}.get(
                    kind, "Your steps were sent.")
        self.clear(said if kind == "stop" else f"{said} Waiting for the agent…")
        self.answered.emit(pending, value)

    def approve(self) -> None:
        if self.pending is None or self.read_only or self.compose:
            return
        a = self._current_action()
        problem = validate(a, normalized=True) if a is not None else None
        if problem:
            self.status.setText(f"Not a valid action: {problem}")
            return
        p = self.pending.request.proposal
        new_thought = self.thought.toPlainText()
        thought = new_thought if new_thought != (p.thought if p else "") else None
        actions = None
        if a is not None and a != self._original:
            actions = [a] + list(p.actions[1:] if p is not None else [])
        if thought is None and actions is None:
            self._send(Decision.approve(by=self.name, seconds=self._seconds()))
        else:
            self._send(Decision.edit(actions, thought, by=self.name, seconds=self._seconds()))

    def _reject_clicked(self) -> None:
        if self.reason.text().strip():
            self.reject()
        else:
            self.ask_reason()

    def ask_reason(self) -> None:
        if self.pending is None or self.read_only or self.compose:
            return
        self.asking_reason = True
        self.reason.setVisible(True)
        self.reason.setFocus(Qt.ShortcutFocusReason)
        self.status.setText("Type why, then Enter to reject (Esc cancels).")

    def reject(self, reason: str | None = None) -> None:
        if self.pending is None or self.read_only or self.compose:
            return
        reason = (reason if reason is not None else self.reason.text()).strip()
        if not reason:
            self.ask_reason()
            self.status.setText("A rejection needs a reason: the agent is asked again and told why.")
            return
        self._send(Decision.reject(reason, by=self.name, seconds=self._seconds()))

    def stop_run(self) -> None:
        if self.pending is None or self.read_only:
            return
        self._send(Decision("stop", reason=f"stopped by {self.name}", decided_by=self.name, seconds=self._seconds()))

    def start_takeover(self) -> None:
        """Compose your own steps on this screenshot; they run when you hand back (or end)."""
        if self.pending is None or self.read_only or self.compose:
            return
        self.compose = True
        self.human_steps = []
        self.steps_list.clear()
        self._load_proposal()
        self.title.setText("You have control: click on the screenshot, then Add step or hand back")
        self._sync_controls()

    def add_step(self) -> bool:
        if not self.compose or self.pending is None:
            return False
        a = self._current_action()
        problem = validate(a, normalized=True) if a is not None else "no action"
        if problem:
            self.status.setText(f"Not a valid action: {problem}")
            return False
        self.human_steps.append(HumanStep(self.thought.toPlainText().strip(), a))
        frame = self.pending.request.observation
        self.steps_list.addItem(format_for_display(a, frame.geometry if frame is not None else None))
        self.thought.clear()
        self._dirty = False
        self.status.setText(f"{plural(len(self.human_steps), 'step')} ready")
        return True

    def finish_takeover(self, resume: bool) -> None:
        if not self.compose or self.pending is None:
            return
        if not self.human_steps and self._dirty and not self.add_step():
            return
        self._send(Takeover(list(self.human_steps), resume=resume, by=self.name))

    # ------------------------------------------------------------ keys
    def keyPressEvent(self, event) -> None:
        # not hasFocus(): a window that is not active (another window on top) has no focus at all
        key, typing = event.key(), self.asking_reason
        if self.pending is None or self.read_only:
            return super().keyPressEvent(event)
        if key in (Qt.Key_Return, Qt.Key_Enter):
            if typing:
                self.reject()
            elif self.compose:
                self.finish_takeover(True)
            else:
                self.approve()
        elif key == Qt.Key_Escape:
            if typing:
                self.reason.clear()
                self.asking_reason = False
                self.setFocus()
                self._sync_controls()
                self.status.setText("")
            else:
                self.reset_edits()
        elif key == Qt.Key_R and not self.compose and not event.modifiers():
            self.ask_reason()
        elif key == Qt.Key_T and not self.compose and not event.modifiers():
            self.start_takeover()
        elif key == Qt.Key_A and self.compose and not event.modifiers():
            self.add_step()
        else:
            super().keyPressEvent(event)
