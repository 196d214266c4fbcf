"""The Drive page: give an instruction and let the agent drive this desktop, staying in control.

While the agent acts, the main window hides (out of the way and out of the screenshots) and the
control strip shows the current thought and action with Pause, Stop and the kill-switch hotkey
(a global hotkey: it works whatever window has the focus). With the "risky" gate, a risky step
waits for a confirmation dialog on top of everything; "call_user" opens a dialog that hands
control to the user and back. Pause takes effect before the next action is executed.
"""
from __future__ import annotations

import dataclasses
import threading

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QDialog,
    QHBoxLayout,
    QLabel,
    QListWidget,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from agent.grammar import format_for_display
from agent.host.killswitch import DEFAULT_HOTKEY, KillSwitch, KillSwitchError
from agent.run.gate import Decision, Gate, Takeover
from agent.run.loop import AgentLoop, LoopConfig
from agent.wording import end_reason_text, hotkey_label, plural
from app.agent_run import AgentRun, RunSetupError, queue_for_sync
from app.control_strip import ControlStrip
from app.game_executor import game_verdict, run_steps
from app.proposal_panel import frame_pixmap
from app.qt_supervisor import Pending, QtSupervisor
from app.run_form import RunForm
from app.screenshot_canvas import ScreenshotCanvas
from app.window_rects import WindowRects


class PausableGate(Gate):
    """A gate that holds the loop (before the proposal is executed) while paused. A stop while
    paused lets it go; the loop then sees the stop before executing anything."""

    def __init__(self, mode: str, supervisor=None):
        super().__init__(mode, supervisor)
        self.running = threading.Event()
        self.running.set()
        self.stop_event: threading.Event | None = None

    def why_ask(self, proposal, observation, *, after_call_user: bool = False):
        while not self.running.wait(0.05):
            if self.stop_event is not None and self.stop_event.is_set():
                return None
        return super().why_ask(proposal, observation, after_call_user=after_call_user)


class ConfirmDialog(QDialog):
    """On top of everything: the step the agent wants to take, drawn on its screenshot."""

    def __init__(self, pending: Pending, parent=None):
        super().__init__(parent, Qt.Dialog | Qt.WindowStaysOnTopHint)
        self.pending = pending
        req = pending.request
        asking_help = pending.mode == "takeover"
        self.setWindowTitle("Tandem: the agent asks for you" if asking_help else "Tandem: allow this step?")
        self.canvas = ScreenshotCanvas()
        self.canvas.setMinimumSize(560, 350)
        pm, w, h = frame_pixmap(req.observation)
        self.canvas.set_observation(pm, w, h)
        actions = req.proposal.actions if req.proposal is not None else []
        self.canvas.set_action(actions[0] if actions else None)
        what = "; ".join(format_for_display(a, req.observation.geometry) for a in actions)
        self.head = head = QLabel("The agent needs your help. Do what is needed, then resume or end the run."
                       if asking_help else f"Allow this step? ({req.why})")
        head.setObjectName("title")
        thought = QLabel(req.proposal.thought if req.proposal is not None else "")
        thought.setWordWrap(True)
        action = QLabel(what)
        action.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.value = None
        buttons = QHBoxLayout()
        if asking_help:
            choices = (("Resume the agent", Takeover([], resume=True, by="user")),
                       ("End the run", Takeover([], resume=False, by="user")))
        else:
            choices = (("Allow", Decision.approve(by="user")),
                       ("Don't allow", Decision.reject("the user did not allow this step", by="user")),
                       ("Stop the agent", Decision("stop", reason="stopped by the user", decided_by="user")))
        self.buttons = {}
        for label, value in choices:
            b = QPushButton(label)
            b.setAutoDefault(False)
            b.clicked.connect(lambda _=False, v=value: self._choose(v))
            buttons.addWidget(b)
            self.buttons[label] = b
        # Enter answers the safe way: a risky step needs a deliberate click on Allow
        self.buttons["Resume the agent" if asking_help else "Don't allow"].setDefault(True)
        lay = QVBoxLayout(self)
        lay.addWidget(head)
        lay.addWidget(self.canvas, 1)
        lay.addWidget(thought)
        lay.addWidget(action)
        lay.addLayout(buttons)

    def _choose(self, value) -> None:
        self.value = value
        self.accept()

    def reject(self) -> None:  # Esc or closing the dialog: the safe answer
        if self.value is None:
            self.value = (Takeover([], resume=False, by="user") if self.pending.mode == "takeover"
                          else Decision.reject("the user closed the confirmation", by="user"))
        super().reject()


class DrivePage(QWidget):
    run_finished = Signal(object)

    def __init__(self, store, window=None, hotkey: str = DEFAULT_HOTKEY):
        super().__init__()
        self.store, self.window, self.hotkey = store, window, hotkey
        self.run: AgentRun | None = None
        self.executor = None
        self.gate: PausableGate | None = None
        self.supervisor: QtSupervisor | None = None
        self.kill_switch: KillSwitch | None = None
        self.dialog: ConfirmDialog | None = None
        self._proposed = ""  # the last proposal's actions as shown: a refusal names what it refused
        self.last_result = None
        self.strip = ControlStrip(hotkey)
        self.strip.pause_toggled.connect(self.set_paused)
        self.strip.stop_clicked.connect(lambda: self.stop("stopped by the user"))
        self.form = RunForm(store, "drive", gates=("risky", "all", "auto"), executors=("desktop", "android", "sandbox", "game"))
        self.start_btn = QPushButton("Let the agent drive")
        self.start_btn.setDefault(True)
        self.start_btn.clicked.connect(self.start_from_form)
        self.status = QLabel(f"On this desktop the window hides while the agent acts. Stop it any time with "
                             f"{hotkey_label(hotkey)} or the strip's Stop button.")
        self.status.setWordWrap(True)
        self.steps = QListWidget()
        self.steps.hide()  # until the first step: an empty white box said nothing
        self.steps_empty = QLabel("The agent's steps will be listed here as it acts.")
        self.steps_empty.setObjectName("muted")
        self.steps_empty.setAlignment(Qt.AlignTop | Qt.AlignLeft)
        self.strip_rects = WindowRects(lambda: [self.strip])  # painted out of the agent's screenshots
        self._strip_timer = QTimer(self)
        self._strip_timer.setInterval(250)
        self._strip_timer.timeout.connect(self.strip_rects.refresh)
        title = QLabel("Drive: the agent uses this computer, your phone, a sandbox task or a browser game")
        title.setObjectName("title")
        lay = QVBoxLayout(self)
        lay.addWidget(title)
        lay.addWidget(self.form)
        row = QHBoxLayout()
        row.addStretch(1)
        row.addWidget(self.start_btn)
        lay.addLayout(row)
        lay.addWidget(self.status)
        lay.addWidget(self.steps, 1)
        lay.addWidget(self.steps_empty, 1)

    # ------------------------------------------------------------ starting
    def start_from_form(self) -> None:
        try:
            executor = self._executor()
            policy = self.form.build_policy(executor.platform)
        except RunSetupError as e:
            self.status.setText(f"Cannot start: {e}")
            return
        instruction = self.form.instruction.text().strip()
        if not instruction and not hasattr(executor, "prepare"):  # a sandbox task brings its own
            self.status.setText("Cannot start: type what the agent should do.")
            return
        self.form.remember()
        self.start_run(policy, executor, instruction, gate=self.form.gate.currentData())

    def _executor(self):
        return self.form.build_executor()

    def start_run(self, policy, executor, instruction: str, *, gate: str = "risky", config: LoopConfig | None = None):
        if self.run is not None and self.run.running:
            raise RuntimeError("the agent is already driving")
        self.steps.clear()
        self.steps.hide()
        self.steps_empty.show()
        self.executor = executor
        self.supervisor = QtSupervisor("user")
        self.supervisor.asked.connect(self._asked)
        self.supervisor.withdrawn.connect(self._withdrawn)
        self.gate = PausableGate(gate, self.supervisor if gate != "auto" else None)
        supervisor, page_gate, hotkey = self.supervisor, self.gate, self.hotkey
        run_config = config or LoopConfig(max_steps=run_steps(executor, 50))
        if run_config.kind is None:  # a person answers every step only with the "all" gate; else the agent drives
            run_config = dataclasses.replace(run_config, kind="supervised" if gate == "all" else "autonomous")

        def build(run):
            loop = AgentLoop(policy, executor, store=self.store, gate=page_gate, config=run_config)
            supervisor.stop_event = page_gate.stop_event = loop.stop_event
            self.kill_switch = KillSwitch(loop, hotkey=hotkey)
            try:
                self.kill_switch.start()
            except KillSwitchError as e:  # no global hotkey here (no X display, Wayland): say so on the strip
                run.event.emit("kill_switch_off", str(e))
                self.kill_switch = None
            return loop, instruction or executor.prepare()

        def close(loop):
            if self.kill_switch is not None:
                self.kill_switch.stop()
            executor.close()
            policy.close()

        self.run = run = AgentRun(build, on_close=close)
        run.step.connect(self._step)
        run.control.connect(lambda on: self.strip.set_state(
            "Paused" if self.strip.pause_btn.isChecked() else ("Acting" if on else "Waiting")))
        run.event.connect(self._event)
        run.finished.connect(self._finished)
        run.failed.connect(self._failed)
        self.strip.pause_btn.setChecked(False)
        self.strip.set_state("Starting")
        self.strip.set_step(instruction, "")
        self.strip.place()
        self.strip.show()
        self.strip.raise_()
        if hasattr(executor, "hidden_regions"):  # the desktop: the agent must not see (or click) the strip
            self.strip_rects.refresh()
            executor.hidden_regions = self.strip_rects.rects
            self._strip_timer.start()
        if self.window is not None and executor.platform == "desktop":
            self.window.hide()  # out of the way and out of the screenshots (a phone's are its own)
        self.start_btn.setEnabled(False)
        self.status.setText("The agent is driving…")
        run.start()
        return run

    # ------------------------------------------------------------ control
    def set_paused(self, paused: bool) -> None:
        if self.gate is None:
            return
        if paused:
            self.gate.running.clear()
        else:
            self.gate.running.set()

    def stop(self, reason: str = "stopped by the user") -> None:
        if self.gate is not None:
            self.gate.running.set()
        if self.run is not None:
            self.run.stop(reason)

    def _event(self, kind: str, payload) -> None:
        if kind == "proposal":
            p = payload["proposal"]
            geo = payload["observation"].geometry if payload.get("observation") is not None else None
            if p.ok:
                self._proposed = "; ".join(format_for_display(a, geo) for a in p.actions)
                self.strip.set_step(p.thought, self._proposed)
            else:  # the parser's message is for developers: the strip says what happened, the tooltip why
                self._proposed = "the model's reply did not parse; asking again"
                self.strip.set_step(p.thought, self._proposed, detail=p.parse_error or "")
        elif kind == "decision" and payload["decision"].kind == "reject":  # the log says what was refused
            self.steps_empty.hide()
            self.steps.show()
            self.steps.addItem(f"✗ not allowed: {self._proposed} ({payload['decision'].reason})")
        elif kind == "kill_switch_off":
            self.strip.set_kill_switch_problem(payload)

    def _asked(self, pending: Pending) -> None:
        self.strip.set_state("Asks you")
        self.dialog = dlg = ConfirmDialog(pending)
        dlg.finished.connect(lambda _=0: self._answer(dlg))
        dlg.show()
        dlg.raise_()
        dlg.activateWindow()

    def _answer(self, dlg: ConfirmDialog) -> None:
        if self.supervisor is not None and dlg.value is not None:
            self.supervisor.answer(dlg.pending, dlg.value)
        if self.dialog is dlg:
            self.dialog = None
        dlg.deleteLater()

    def _withdrawn(self, pending: Pending) -> None:
        if self.dialog is not None and self.dialog.pending is pending:
            self.dialog.value = Decision("stop", reason="stopped")
            self.dialog.close()

    def _step(self, step) -> None:
        err = f"  ✗ {step.info['error']}" if step.info.get("error") else ""
        self.steps_empty.hide()
        self.steps.show()
        self.steps.addItem(f"{step.index + 1}. {format_for_display(step.action, getattr(step.observation, 'geometry', None))}{err}")
        status = getattr(self.executor, "status", None)
        if callable(status):  # a game: its score as it goes
            self.status.setText(f"The agent is driving… {status()}")

    def _end(self, text: str) -> None:
        self.strip.hide()
        if self.window is not None:
            self.window.show()
            self.window.raise_()
        self.start_btn.setEnabled(True)
        self.status.setText(text)

    def _finished(self, result) -> None:
        self.last_result = result
        # a run with a person's decisions in it (risky steps answered) is training data: it syncs
        decided = result.episode.kind == "supervised" or any(d.get("by") for d in result.episode.meta.get("decisions", []))
        queued = queue_for_sync(self.store, self.window, result.episode.id) if decided else ""
        verdict = game_verdict(self.executor)
        self._end(f"The agent stopped after {plural(result.steps, 'step')}: {end_reason_text(result.reason)}."
                  + (f" {verdict}" if verdict else "") + (f" Decisions {queued}." if queued else ""))
        self.run_finished.emit(result)

    def _failed(self, text: str) -> None:
        self._end(f"The run failed: {text.splitlines()[0]}")

    def shutdown(self) -> None:
        if self.run is not None and self.run.running:
            self.stop("the window closed")
            self.run.wait(10)
        self.strip.hide()
