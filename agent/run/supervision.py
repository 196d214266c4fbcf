"""Live supervision over a connection, sans-I/O: a GateRequest goes out as a proposal message
(step dict + screenshot bytes), the supervisor's answer comes back as a decision message.

The agent side uses `RemoteSupervisor`, a gate Supervisor that does no I/O itself: it hands each
request to `publish(proposal_id, step, screenshot)` (the I/O layer sends it, e.g. through
agent.sync.live_link) and blocks the loop thread until the I/O layer calls `deliver(...)` with the
answer. The supervisor side turns a received proposal back into a GateRequest with
`request_from_wire` and its answer into a message with `answer_to_wire`.

Wire shapes (inside agent.protocol's proposal/decision messages):
- proposal step: {"mode": "decide"|"takeover", "instruction", "step_index", "why", "episode_id",
  "platform", "thought", "actions": [Action dicts, normalized], "raw_text", "space", "image_size",
  "policy_version", "geometry", "sent_at" (wall clock), "note"?}
- decision approve: step {"seconds"}; edit: {"thought"?, "actions"?, "seconds"};
  reject: reason + {"seconds"}; takeover: {"steps": [{"thought", "action"}], "resume", "seconds"}.
  A takeover with no steps and resume false ends the run (the protocol has no "stop" decision).
"""
from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from agent.errors import TandemError
from agent.executors.base import Frame, frame_from_image_bytes
from agent.policies.base import Proposal
from agent.run.gate import Decision, GateError, GateRequest, HumanStep, Takeover
from agent.schema import Action, SchemaError, ScreenGeometry
from agent.schema import _tool_output as valid_tool_output  # Observation.tool_output's own check

MODES = ("decide", "takeover")


class SupervisionError(TandemError, ValueError):
    """A proposal or decision message that cannot be used; the message says what was wrong."""


# ---------------------------------------------------------------- agent -> supervisors
def request_to_wire(request: GateRequest, mode: str = "decide", note: str | None = None) -> tuple[dict, bytes | None]:
    """(step dict, screenshot bytes or None) for a proposal message."""
    if mode not in MODES:
        raise SupervisionError(f"mode must be one of {MODES}, got {mode!r}")
    p, frame = request.proposal, request.observation
    shot, size, geometry = None, None, None
    if frame is not None:
        geometry = frame.geometry.to_dict()
        if frame.has_image:
            shot, _ = frame.encode("jpeg")  # 6 ms at 1920x1080 and 5-10x smaller than PNG: latency matters
            size = list(frame.size)
    step = {
        "mode": mode, "instruction": request.instruction, "step_index": request.step_index, "why": request.why,
        "episode_id": request.episode_id, "platform": request.platform,
        "thought": p.thought if p is not None else "",
        "actions": [a.to_dict() for a in (p.actions if p is not None else [])],
        "raw_text": p.raw_text if p is not None else "", "space": p.space if p is not None else None,
        "image_size": size or (list(p.image_size) if p is not None and p.image_size else None),
        "policy_version": p.policy_version if p is not None else None,
        "geometry": geometry, "sent_at": time.time(),
    }
    if note:
        step["note"] = note
    told = getattr(frame, "tool_output", None)
    if told is not None:  # the last tool call's result: supervisors see it too
        step["tool_output"] = dict(told)
    return step, shot


def request_from_wire(step: dict, screenshot: bytes | None) -> tuple[GateRequest, str]:
    """(GateRequest, mode) from a received proposal; SupervisionError names a bad field."""
    if not isinstance(step, dict):
        raise SupervisionError(f"a proposal step must be an object, got {type(step).__name__}")
    mode = step.get("mode", "decide")
    if mode not in MODES:
        raise SupervisionError(f"proposal mode must be one of {MODES}, got {mode!r}")
    try:
        actions = [Action.from_dict(a) for a in step.get("actions") or []]
        geometry = ScreenGeometry.from_dict(step["geometry"]) if step.get("geometry") else None
        told = valid_tool_output(step.get("tool_output"), "proposal")
    except (SchemaError, KeyError, TypeError) as e:
        raise SupervisionError(f"proposal: {e}") from None
    frame = None
    if screenshot is not None:
        try:
            frame = frame_from_image_bytes(screenshot, geometry)
        except Exception as e:  # PIL raises many types for bad bytes
            raise SupervisionError(f"proposal screenshot is not an image: {e}") from None
    elif geometry is not None:
        frame = Frame(geometry=geometry, text="")
    if frame is not None:
        frame.tool_output = told
    size = step.get("image_size")
    proposal = Proposal(str(step.get("thought") or ""), actions, str(step.get("raw_text") or ""),
                        space=step.get("space") or "smart-resize", image_size=tuple(size) if size else None,
                        policy_version=step.get("policy_version"))
    req = GateRequest(instruction=str(step.get("instruction") or ""), step_index=int(step.get("step_index") or 0),
                      proposal=proposal, observation=frame, why=str(step.get("why") or ""),
                      episode_id=step.get("episode_id"), platform=str(step.get("platform") or "desktop"))
    return req, mode


# ---------------------------------------------------------------- supervisors -> agent
def answer_to_wire(answer) -> tuple[str, dict | None, str | None]:
    """(decision kind, step dict, reason) for a Decision or a Takeover."""
    if isinstance(answer, Takeover):
        steps = [{"thought": h.thought, "action": h.action.to_dict()} for h in answer.steps]
        return "takeover", {"steps": steps, "resume": bool(answer.resume)}, None
    if not isinstance(answer, Decision):
        raise SupervisionError(f"an answer must be a Decision or a Takeover, got {type(answer).__name__}")
    extra = {"seconds": answer.seconds} if answer.seconds is not None else {}
    if answer.kind == "approve":
        return "approve", extra, None
    if answer.kind == "reject":
        return "reject", extra, answer.reason
    if answer.kind == "edit":
        step: dict = dict(extra)
        if answer.thought is not None:
            step["thought"] = answer.thought
        if answer.actions is not None:
            step["actions"] = [a.to_dict() for a in answer.actions]
        return "edit", step, None
    if answer.kind == "stop":  # no "stop" on the wire: take over, do nothing, do not hand back
        return "takeover", {"steps": [], "resume": False, "stop": answer.reason or "stopped by the supervisor"}, None
    raise SupervisionError(f"a {answer.kind!r} decision cannot be sent on its own; send the Takeover")


def answer_from_wire(kind: str, step: dict | None, reason: str | None, by: str | None):
    """A Decision (approve, edit, reject) or a Takeover; SupervisionError when it is not usable."""
    step = step or {}
    seconds = step.get("seconds")
    seconds = float(seconds) if isinstance(seconds, (int, float)) and not isinstance(seconds, bool) else None
    try:
        if kind == "approve":
            return Decision.approve(by=by, seconds=seconds)
        if kind == "reject":
            return Decision.reject(reason or "", by=by, seconds=seconds)
        if kind == "edit":
            actions = [Action.from_dict(a) for a in step["actions"]] if step.get("actions") is not None else None
            return Decision.edit(actions, step.get("thought"), by=by, seconds=seconds)
        if kind == "takeover":
            steps = [HumanStep(str(s.get("thought") or ""), Action.from_dict(s["action"])) for s in step.get("steps") or []]
            return Takeover(steps, resume=bool(step.get("resume", True)), by=by)
    except (GateError, SchemaError, KeyError, TypeError, AttributeError) as e:
        raise SupervisionError(f"{kind} decision from {by or 'a supervisor'} is not usable: {e}") from None
    raise SupervisionError(f"unknown decision {kind!r}")


# ---------------------------------------------------------------- the agent side's supervisor
@dataclass
class _Open:
    proposal_id: str
    request: GateRequest
    mode: str
    event: threading.Event
    answer: object = None


class RemoteSupervisor:
    """A gate Supervisor whose humans are elsewhere. `publish(proposal_id, step, screenshot)`
    sends a proposal (it is called on the loop thread and must not block for long); the I/O
    layer calls `deliver(proposal_id, kind, step, reason, by)` when a decision arrives (any
    thread). `stop_event` (the loop's) or `cancel()` ends a wait with a stop decision."""

    def __init__(self, publish: Callable[[str, dict, bytes | None], None], *, stop_event: threading.Event | None = None,
                 timeout: float | None = None, poll: float = 0.05):
        self.publish = publish
        self.stop_event = stop_event
        self.timeout = timeout
        self.poll = poll
        self._lock = threading.Lock()
        self._open: _Open | None = None
        self._takeover: Takeover | None = None  # the steps of a takeover decision, for take_over()
        self._cancelled: str | None = None
        self.errors: list[str] = []  # unusable answers (the proposal was re-sent each time)

    def cancel(self, reason: str = "the connection to the supervisors ended") -> None:
        self._cancelled = reason
        with self._lock:
            if self._open is not None:
                self._open.event.set()

    def deliver(self, proposal_id: str, kind: str, step: dict | None, reason: str | None, by: str | None) -> bool:
        """An answer arrived; False when no open proposal has that id (a stale answer)."""
        with self._lock:
            op = self._open
            if op is None or op.proposal_id != proposal_id:
                return False
            try:
                op.answer = answer_from_wire(kind, step, reason, by)
            except SupervisionError as e:
                op.answer = e
            op.event.set()
            return True

    def _ask(self, request: GateRequest, mode: str):
        note = None
        t0 = time.monotonic()
        while True:
            op = _Open(uuid.uuid4().hex[:16], request, mode, threading.Event())
            with self._lock:
                self._open = op
            step, shot = request_to_wire(request, mode, note)
            self.publish(op.proposal_id, step, shot)
            while not op.event.wait(self.poll):
                if self.stop_event is not None and self.stop_event.is_set():
                    self._cancelled = self._cancelled or "stopped"
                    break
                if self.timeout is not None and time.monotonic() - t0 > self.timeout:
                    self._cancelled = f"no supervisor answered within {self.timeout:g} s"
                    break
            with self._lock:
                self._open = None
            if self._cancelled is not None and op.answer is None:
                reason, self._cancelled = self._cancelled, None
                return Decision("stop", reason=reason)
            if isinstance(op.answer, SupervisionError):
                self.errors.append(str(op.answer))
                note = f"the last answer could not be used: {op.answer}"
                continue
            return op.answer

    def decide(self, request: GateRequest) -> Decision:
        answer = self._ask(request, "decide")
        if isinstance(answer, Takeover):
            if not answer.steps and not answer.resume:
                return Decision("stop", reason="the supervisor stopped the run", decided_by=answer.by)
            self._takeover = answer
            return Decision("takeover", decided_by=answer.by)
        return answer

    def take_over(self, request: GateRequest) -> Takeover:
        if self._takeover is not None:
            answer, self._takeover = self._takeover, None
            return answer
        answer = self._ask(request, "takeover")  # the agent called the user: ask for the human's steps
        if isinstance(answer, Takeover):
            return answer
        by = getattr(answer, "decided_by", None)
        return Takeover([], resume=getattr(answer, "kind", "") == "approve", by=by)
