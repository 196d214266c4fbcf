"""The Supervise page: review a live agent step by step, here or over the sync connection.

"Run here": start an agent on this machine (this desktop, a sandbox task or a browser game); each
gated proposal appears in the ProposalPanel and the loop's thread waits (QtSupervisor) until you
answer (a game stands still meanwhile, and the status line gives its score). With
"let remote supervisors decide", proposals go through the backend instead (RunPublisher), and
the run id is shown for others to watch. "Watch a run": subscribe to a run elsewhere by its id;
everyone subscribed sees each proposal, the one who claimed the run decides.
Every supervised episode is queued for sync when it ends.
"""
from __future__ import annotations

import threading

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QPushButton,
    QSplitter,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from agent import protocol as P
from agent.grammar import format_for_display
from agent.run.gate import Gate
from agent.run.loop import AgentLoop, LoopConfig
from agent.run.supervision import SupervisionError, request_from_wire
from agent.storage.secret_store import saved_secret
from agent.sync.client import signing_name
from agent.sync.live_link import RunPublisher, RunWatcher
from agent.sync.session import SyncError
from agent.wording import end_reason_text, plural
from app.agent_run import AgentRun, RunSetupError, queue_for_sync
from app.decisions_view import DecisionsView
from app.game_executor import game_verdict, run_steps
from app.proposal_panel import ProposalPanel
from app.qt_supervisor import Pending, QtSupervisor
from app.run_form import RunForm
from app.tool_view import ToolOutputView, call_summary, exit_text, is_tool


class LiveEvents(QObject):
    """Events of a LiveLink (its own thread) delivered on the main thread."""

    received = Signal(object)


def outcome_text(outcome) -> str:
    """What a checker said about the task, for a person: '' when nothing judged it. A game's
    outcome (app.game_executor.GameOutcome) says its score."""
    if getattr(outcome, "text", ""):
        return outcome.text
    if outcome is None or outcome.success is None:
        return ""
    who = {"verifier": "The sandbox's verifier"}.get(outcome.source or "", "The check")
    return f"{who} says the task {'succeeded' if outcome.success else 'was not done'}."


def sync_credentials(store, window) -> tuple[str | None, str | None]:
    """The server and token the app syncs with (the embedded backend's when none is configured)."""
    url = getattr(window, "sync_url", None) or store.get_setting("sync.server_url")

    token = saved_secret(store, "sync.token") or saved_secret(store, "sync.embedded_token")
    return url, token


class SupervisePage(QWidget):
    run_finished = Signal(object)  # RunResult

    def __init__(self, store, window=None, name: str | None = None):
        super().__init__()
        self.store, self.window = store, window
        self.name = name or signing_name(store, "supervisor")
        self.run: AgentRun | None = None
        self.executor = None  # the run's: a game's gives its score for the status line
        self._running_text = ""
        self.supervisor: QtSupervisor | None = None
        self.publisher = None
        self.watcher = None
        self.live_events = LiveEvents()
        self.live_events.received.connect(self._live_event)
        self.last_episode_id: str | None = None
        self.last_result = None
        self.displays: list[tuple[object, float]] = []  # (pending, shown at), for the latency bench

        # -- run here
        self.form = RunForm(store, "supervise", gates=("all", "risky"), executors=("desktop", "sandbox", "game"),
                            tools=True)
        self.publish_box = QCheckBox("Let remote supervisors decide (publish this run over sync)")
        self.start_btn = QPushButton("Start run")
        self.start_btn.clicked.connect(self.start_from_form)
        self.stop_btn = QPushButton("Stop")
        self.stop_btn.setObjectName("danger")
        self.stop_btn.clicked.connect(lambda: self.stop("stopped by the supervisor"))
        self.run_label = QLabel("")
        self.run_label.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.run_label.setWordWrap(True)
        here = QWidget()
        hl = QVBoxLayout(here)
        hl.addWidget(self.form)
        row = QHBoxLayout()
        row.addWidget(self.publish_box, 1)
        row.addWidget(self.start_btn)
        row.addWidget(self.stop_btn)
        hl.addLayout(row)
        hl.addWidget(self.run_label)

        # -- watch a run elsewhere
        url, token = sync_credentials(store, window)
        self.server = QLineEdit(url or "")
        self.server.setPlaceholderText("ws://host:8765")
        self.token = QLineEdit(token or "")
        self.token.setEchoMode(QLineEdit.Password)
        self._synced_with = (url or "", token or "")  # what the fields were filled with: they follow sync
        if hasattr(window, "sync_changed"):
            window.sync_changed.connect(self._follow_sync)
        self.run_id = QLineEdit()
        self.run_id.setPlaceholderText("the run id shown where the agent runs")
        self.watch_btn = QPushButton("Watch")
        self.watch_btn.clicked.connect(self.watch_from_form)
        self.claim_btn = QPushButton("Claim: I decide")
        self.claim_btn.clicked.connect(self.toggle_claim)
        self.claim_btn.setEnabled(False)
        self.claim_label = QLabel("Not watching.")
        self.claim_label.setWordWrap(True)
        remote = QWidget()
        rf = QFormLayout(remote)
        rf.addRow("Server", self.server)
        rf.addRow("Token", self.token)
        rf.addRow("Run id", self.run_id)
        rr = QHBoxLayout()
        rr.addWidget(self.watch_btn)
        rr.addWidget(self.claim_btn)
        rr.addWidget(self.claim_label, 1)
        rf.addRow("", rr)
        self.claimed_by: str | None = None

        self.setup = QTabWidget()
        self.setup.addTab(here, "Run here")
        self.setup.addTab(remote, "Watch a run")

        # -- the proposal, the steps, the decisions
        self.panel = ProposalPanel(self.name)
        self.panel.clear("No run yet: start one above, or watch a run on another machine.")
        self.panel.answered.connect(self._answered)
        self.panel.displayed.connect(lambda p, t: self.displays.append((p, t)))
        self.steps = QListWidget()
        self.steps.setWordWrap(True)  # a long command wraps instead of hiding its exit code off the edge
        self.steps.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.step_output = ToolOutputView("Last tool output")  # the newest tool step's result, as it ran
        steps_tab = QWidget()
        stl = QVBoxLayout(steps_tab)
        stl.setContentsMargins(0, 0, 0, 0)
        stl.addWidget(self.steps, 1)
        stl.addWidget(self.step_output)
        self.decisions = DecisionsView(store)
        side = QTabWidget()
        side.addTab(steps_tab, "Steps")
        side.addTab(self.decisions, "Decisions")
        split = QSplitter(Qt.Horizontal)
        split.addWidget(self.panel)
        split.addWidget(side)
        split.setStretchFactor(0, 4)
        split.setStretchFactor(1, 1)
        split.setSizes([1200, 260])
        lay = QVBoxLayout(self)
        lay.addWidget(self.setup)
        lay.addWidget(split, 1)
        self._sync_buttons()

    # ------------------------------------------------------------ running here
    def _notify(self, text: str) -> None:
        self.run_label.setText(text)
        if self.window is not None and hasattr(self.window, "notify"):
            self.window.notify(text)

    def _sync_buttons(self) -> None:
        running = self.run is not None and self.run.running
        self.start_btn.setEnabled(not running)
        self.stop_btn.setEnabled(running)
        self.form.setEnabled(not running)
        self.publish_box.setEnabled(not running)

    def start_from_form(self) -> None:
        """Start a run from the form's choices; errors in the choices are shown, not raised."""
        try:
            tools = self.form.build_tools()
            executor = self.form.build_executor()
            platform = executor.platform
            policy = self.form.build_policy(platform)
        except RunSetupError as e:
            self._notify(f"Cannot start: {e}")
            return
        self.form.remember()
        self.start_run(policy, executor, self.form.instruction.text().strip() or None, gate=self.form.gate.currentData(),
                       publish=self.publish_box.isChecked(), tools=tools)

    def start_run(self, policy, executor, instruction: str | None = None, *, gate: str = "all", publish: bool = False,
                  config: LoopConfig | None = None, tools=None) -> AgentRun:
        """Run `policy` on `executor` in a worker thread, gated by this page (or by remote
        supervisors when `publish`). A sandbox executor supplies the instruction when none is given.
        `tools`: a TerminalExecutor over the run's workspace, for a policy with the terminal tools."""
        if self.run is not None and self.run.running:
            raise RuntimeError("a run is already going; stop it first")
        self.steps.clear()
        self.step_output.set_output(None)
        self.executor = executor
        self.panel.tool_call.workspace = str(tools.root) if tools is not None else None
        self.panel.clear()  # "Waiting for the agent…"
        supervisor = None
        if publish:
            url, token = sync_credentials(self.store, self.window)
            if not url or not token:
                self._notify("Cannot publish: sync is not set up (no server or token)")
                return None
            try:
                self.publisher = RunPublisher(url, token).start()
            except SyncError as e:
                self._notify(f"Cannot publish: {e}")
                return None
            supervisor = self.publisher.supervisor
            self.run_id.setText(self.publisher.run_id)
        else:
            self.supervisor = supervisor = QtSupervisor(self.name)
            supervisor.asked.connect(self._asked)
            supervisor.withdrawn.connect(self._withdrawn)
        store, publisher = self.store, self.publisher if publish else None

        def build(run):
            text = instruction
            if text is None:
                if not hasattr(executor, "prepare"):
                    raise RunSetupError("give an instruction")
                text = executor.prepare()
            loop = AgentLoop(policy, executor, store=store, gate=Gate(gate, supervisor), tools=tools,
                             config=config or LoopConfig(max_steps=run_steps(executor, 30), kind="supervised"))
            supervisor.stop_event = loop.stop_event
            return loop, text

        def close(loop):
            executor.close()
            if tools is not None:
                tools.close()
            policy.close()
            if publisher is not None:
                publisher.end(loop.episode.meta.get("end_reason") if loop and loop.episode else "ended")

        self.run = run = AgentRun(build, on_close=close)
        run.step.connect(self._step)
        run.control.connect(self._control)
        run.finished.connect(self._finished)
        run.failed.connect(self._failed)
        run.event.connect(self._loop_event)
        run.start()
        where = "remote supervisors decide" if publish else "you decide here"
        self._running_text = f"Running ({where})" + (f"; run id {self.publisher.run_id}" if publish else "")
        self._notify(self._running_text)
        self._sync_buttons()
        return run

    def _loop_event(self, kind: str, payload) -> None:
        loop = self.run.loop if self.run is not None else None
        if kind == "decision" and loop is not None and loop.episode is not None:
            self.decisions.follow(loop.episode)  # counted as it is made, not when the run ends

    def stop(self, reason: str = "stopped by the supervisor") -> None:
        if self.run is not None:
            self.run.stop(reason)

    def _game_status(self, waiting: bool = False) -> None:
        """The status line with a game's score now (the loop waits for an answer, or has just stepped)."""
        status = getattr(self.executor, "status", None)
        if callable(status) and self.run is not None and self.run.running:
            self.run_label.setText(f"{self._running_text}. {status()}"
                                   + (" (the game is paused until you answer)" if waiting else ""))

    def _asked(self, pending: Pending) -> None:
        self._game_status(waiting=True)
        self.panel.show_pending(pending)
        if self.window is not None and getattr(self, "_hidden_window", False):
            self.window.show()
            self._hidden_window = False

    def _withdrawn(self, pending: Pending) -> None:
        if self.panel.pending is pending:
            self.panel.clear("The run stopped.")

    def _control(self, on: bool) -> None:
        # acting on this desktop: the window gets out of the screenshots while the agent has control
        if self.window is None or getattr(self.run and self.run.loop, "executor", None) is None \
                or self.run.loop.executor.platform != "desktop" or self.publisher is not None:
            return
        if on and self.window.isVisible():
            self.window.hide()
            self._hidden_window = True
        elif not on and getattr(self, "_hidden_window", False):
            self.window.show()
            self._hidden_window = False

    def _step(self, step) -> None:
        who = step.provenance.source
        out = step.info.get("tool_output")
        err = f"  ✗ {step.info['error']}" if step.info.get("error") else f"  → {exit_text(out)}" if out else ""
        what = call_summary(step.action) if is_tool(step.action) else \
            format_for_display(step.action, getattr(step.observation, "geometry", None))
        self.steps.addItem(f"{step.index + 1}. [{who}] {what}{err}")
        self.steps.scrollToBottom()
        if out is not None:
            self.step_output.set_output(out, f"Step {step.index + 1}")
        self._game_status()

    def _finished(self, result) -> None:
        self.last_result = result
        self.last_episode_id = result.episode.id
        self._control(False)
        verdict = outcome_text(result.episode.outcome) or game_verdict(self.executor)
        why = end_reason_text(result.reason)
        self.panel.clear(f"The run ended: {why}." + (f" {verdict}" if verdict else ""))
        self.decisions.add_episode(result.episode.id)
        queued = queue_for_sync(self.store, self.window, result.episode.id)
        self._notify(f"Run ended after {plural(result.steps, 'step')}: {why}. " + (f"{verdict} " if verdict else "")
                     + queued[0].upper() + queued[1:] + ".")
        self.publisher = None
        self._sync_buttons()
        self.run_finished.emit(result)

    def _failed(self, text: str) -> None:
        self._control(False)
        self.panel.clear("The run failed.")
        loop = self.run.loop if self.run else None
        if loop is not None and loop.episode is not None:
            self.last_episode_id = loop.episode.id
            self.decisions.add_episode(loop.episode.id)
            queue_for_sync(self.store, self.window, loop.episode.id)
        self._notify(f"The run failed: {text.splitlines()[0]}")
        self.publisher = None
        self._sync_buttons()

    # ------------------------------------------------------------ answers
    def _answered(self, pending, value) -> None:
        if pending.proposal_id is not None:  # a remote proposal
            try:
                self.watcher.decide(pending.proposal_id, value)
            except (SyncError, SupervisionError) as e:
                self._notify(f"The decision was not accepted: {e}")
                self.panel.show_pending(pending)
            return
        if self.supervisor is not None:
            self.supervisor.answer(pending, value)

    # ------------------------------------------------------------ watching a remote run
    def _follow_sync(self) -> None:
        """The app syncs to another server now (the Sync page): Watch a run uses it too, unless
        the person typed another server or token here."""
        url, token = sync_credentials(self.store, self.window)
        for field, was, now in ((self.server, self._synced_with[0], url), (self.token, self._synced_with[1], token)):
            if field.text().strip() == was:
                field.setText(now or "")
        self._synced_with = (url or "", token or "")

    def watch_from_form(self) -> None:
        if self.watcher is not None:
            self.unwatch()
            return
        try:
            self.watch(self.server.text().strip(), self.token.text().strip(), self.run_id.text().strip())
        except (SyncError, ValueError) as e:
            self.claim_label.setText(f"Cannot watch: {e}")

    def watch(self, url: str, token: str, run_id: str) -> None:
        if not url or not token or not run_id:
            raise ValueError("server, token and run id are all needed")
        self.watcher = RunWatcher(url, token, run_id, self.live_events.received.emit).start()
        self.panel.name = self.watcher.user or self.name
        self.watch_btn.setText("Stop watching")
        self.claim_btn.setEnabled(True)
        self.claim_label.setText(f"Watching run {run_id} as {self.watcher.user}.")

    def unwatch(self) -> None:
        if self.watcher is not None:
            w, self.watcher = self.watcher, None
            threading.Thread(target=w.close, daemon=True).start()  # closing waits on the network
        self.watch_btn.setText("Watch")
        self.claim_btn.setEnabled(False)
        self.claim_label.setText("Not watching.")
        if self.panel.pending is not None and self.panel.pending.proposal_id is not None:
            self.panel.clear()

    def claim(self) -> None:
        self.watcher.claim()

    def toggle_claim(self) -> None:
        if self.watcher is None:
            return
        try:
            if self.claimed_by == self.watcher.user:
                self.watcher.release()
            else:
                self.watcher.claim()
        except SyncError as e:
            self.claim_label.setText(str(e))

    def _live_event(self, ev) -> None:
        if self.watcher is None:
            return
        me = self.watcher.user
        if isinstance(ev, P.ClaimChanged):
            self.claimed_by = ev.by
            self.claim_btn.setText("Release" if ev.by == me else "Claim: I decide")
            self.claim_label.setText(f"Run {ev.run_id}: " + (f"{ev.by} decides" if ev.by else "nobody decides yet"))
            p = self.panel.pending
            if p is not None and p.proposal_id is not None:
                self.panel.show_pending(p, read_only=ev.by != me)
        elif isinstance(ev, P.ProposalReceived):
            try:
                request, mode = request_from_wire(ev.step, ev.screenshot_data)
            except SupervisionError as e:
                self.claim_label.setText(f"An unreadable proposal arrived: {e}")
                return
            pending = Pending(request, mode, proposal_id=ev.proposal_id, run_id=ev.run_id)
            pending.sent_at = ev.step.get("sent_at")
            self.panel.show_pending(pending, read_only=self.claimed_by != me)
        elif isinstance(ev, P.DecisionReceived):
            p = self.panel.pending
            if p is not None and p.proposal_id == ev.proposal_id:
                self.panel.clear(f"{ev.by} decided: {ev.decision}. Waiting for the agent…")
            self.steps.addItem(f"{ev.by}: {ev.decision}" + (f" ({ev.reason})" if ev.reason else ""))
        elif isinstance(ev, P.RunEnded):
            self.panel.clear(f"The run ended: {end_reason_text(ev.reason)}.")
            self.claim_label.setText(f"Run {ev.run_id} ended.")
        elif isinstance(ev, SyncError):
            self.claim_label.setText(f"Disconnected: {ev}")
            self.watcher = None
            self.watch_btn.setText("Watch")
            self.claim_btn.setEnabled(False)

    # ------------------------------------------------------------ lifetime
    def closeEvent(self, event) -> None:
        self.shutdown()
        super().closeEvent(event)

    def shutdown(self) -> None:
        """Stop the run and the watcher (the window is closing, or a test ends)."""
        if self.run is not None and self.run.running:
            self.run.stop("the window closed")
            self.run.wait(10)
        if self.watcher is not None:
            w, self.watcher = self.watcher, None
            w.close()
