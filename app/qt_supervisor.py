"""A gate Supervisor answered by a widget: the agent loop's thread asks, the main thread answers.

`decide()` / `take_over()` run on the loop's worker thread. They emit `asked(Pending)` (Qt queues
it to the main thread, where a widget shows the request) and wait on a threading.Event until
the widget calls `answer(pending, value)` on the main thread. No widget is touched off the main
thread. A stop (the loop's stop event: the kill switch, the Stop button) ends a wait with a
"stop" decision; `withdrawn(Pending)` then tells the widget to take the request down.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from PySide6.QtCore import QObject, Signal

from agent.run.gate import Decision, GateError, GateRequest, Takeover


@dataclass(eq=False)
class Pending:
    """One open question: a request, what is asked (decide | takeover), and when it was asked."""

    request: GateRequest
    mode: str
    asked_at: float = field(default_factory=time.perf_counter)  # perf_counter, for latency
    event: threading.Event = field(default_factory=threading.Event)
    value: object = None
    proposal_id: str | None = None  # remote proposals: the id to answer
    run_id: str | None = None


class QtSupervisor(QObject):
    asked = Signal(object)  # Pending
    withdrawn = Signal(object)  # Pending

    def __init__(self, name: str = "supervisor", stop_event: threading.Event | None = None, parent=None):
        super().__init__(parent)
        self.name = name
        self.stop_event = stop_event
        self.current: Pending | None = None

    # ------------------------------------------------------------ loop thread
    def _wait(self, request: GateRequest, mode: str):
        pending = Pending(request, mode)
        self.current = pending
        self.asked.emit(pending)
        while not pending.event.wait(0.05):
            if self.stop_event is not None and self.stop_event.is_set():
                self.current = None
                self.withdrawn.emit(pending)
                return Decision("stop", reason="stopped while waiting for a decision")
        self.current = None
        return pending.value

    def decide(self, request: GateRequest) -> Decision:
        value = self._wait(request, "decide")
        if isinstance(value, Takeover):  # the widget composed the takeover at once
            self._takeover = value
            return Decision("takeover", decided_by=value.by)
        return value

    def take_over(self, request: GateRequest) -> Takeover:
        stored = getattr(self, "_takeover", None)
        if stored is not None:
            self._takeover = None
            return stored
        value = self._wait(request, "takeover")
        if isinstance(value, Decision):  # a stop while taking over
            return Takeover([], resume=False, by=value.decided_by)
        return value

    # ------------------------------------------------------------ main thread
    def answer(self, pending: Pending, value) -> None:
        """Give the loop its answer: a Decision for 'decide' (or a Takeover), a Takeover for 'takeover'."""
        if pending.event.is_set():
            return
        if pending.mode == "decide" and not isinstance(value, (Decision, Takeover)):
            raise GateError(f"a proposal needs a Decision or a Takeover, got {type(value).__name__}")
        if pending.mode == "takeover" and not isinstance(value, (Takeover, Decision)):
            raise GateError(f"a takeover needs a Takeover, got {type(value).__name__}")
        pending.value = value
        pending.event.set()
