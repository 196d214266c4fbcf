"""The agent loop: observe -> propose -> gate -> execute -> record.

Every executed step is written to the store as soon as it is done (screenshot blob first, then
the episode), so a crash or a kill switch loses at most the step in flight. Output that does not
parse is re-asked (the policy is told why) up to `max_reasks` times and never executed: agent.run.reask's
rule, which the trainer's episode runner follows too. A rejection re-asks with the supervisor's
reason. Everything the human does is kept: an edit
stores the corrected step with provenance "corrected" and the proposal beside it; rejected and
unparseable proposals go into the next step's info (and the episode's meta if the run ends
first); a takeover records the human's steps with provenance "human".

`run()` blocks; call it in a worker thread from a UI. `stop()` is safe from any thread (the kill
switch calls it): it sets the stop flag and makes the executor let go of held keys and buttons.
"""
from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from agent.actions import REGISTRY, validate
from agent.elements import Element
from agent.executors.base import ExecutionError
from agent.executors.terminal import tool_output
from agent.grammar import format_normalized
from agent.policies.base import PolicyError, Proposal
from agent.policies.memory import Memory, MemoryStep
from agent.run.gate import Decision, Gate, GateRequest, Takeover
from agent.run.reask import ReaskRule, reask_feedback  # noqa: F401  (reask_feedback: re-exported for callers)
from agent.schema import Action, Episode, Observation, Provenance, Step, monotonic
from agent.wording import stop_reason

TOOL_ACTIONS = ("run_command", "read_file", "write_file")


@dataclass
class LoopConfig:
    max_steps: int = 30
    max_seconds: float | None = None
    max_reasks: int = 2  # re-asks after an unparseable output, per step (agent.run.reask.ReaskRule)
    max_rejections: int = 5  # rejections in a row before the run ends
    # screenshots in the store: jpeg q90 (6 ms at 1920x1080) by default; png is lossless but costs
    # about 60 ms a frame at 1920x1080 with OpenCV here, more than the whole step budget of 50 ms
    image_format: str = "jpeg"
    kind: str | None = None  # autonomous | supervised; default from the gate


@dataclass
class RunResult:
    episode: Episode
    reason: str  # finished | call_user | step limit | time limit | stopped | unparseable | policy error: ...
    steps: int = 0
    stats: dict = field(default_factory=dict)


def reject_feedback(proposal: Proposal, reason: str, space: str) -> str:
    w, h = proposal.image_size or (1000, 1000)
    text = format_normalized(proposal.thought, proposal.actions, space, w, h) if proposal.actions else proposal.raw_text
    return f"The supervisor rejected your proposal:\n{text}\nReason: {reason}\nPropose a different next action."


def _jsonable(d: dict) -> dict:
    out = {}
    for k, v in d.items():
        try:
            json.dumps(v)
            out[k] = v
        except (TypeError, ValueError):
            out[k] = repr(v)
    return out


class _End(Exception):
    def __init__(self, reason: str, truncated: bool = False):
        super().__init__(reason)
        self.reason, self.truncated = reason, truncated


class AgentLoop:
    def __init__(self, policy, executor, *, store=None, gate: Gate | None = None, memory: Memory | None = None,
                 tools=None, config: LoopConfig | None = None, on_step: Callable | None = None,
                 on_control: Callable[[bool], None] | None = None, on_event: Callable[[str, dict], None] | None = None):
        self.policy = policy
        self.executor = executor
        self.store = store
        self.gate = gate or Gate("auto")
        self.memory = memory if memory is not None else Memory()
        self.tools = tools
        self.config = config or LoopConfig()
        # never executed, re-asked with feedback, the run ends after max_reasks; executed steps only are counted
        self.reask = ReaskRule(max_reasks=self.config.max_reasks, charge_step=False)
        self.on_step = on_step
        self.on_control = on_control
        self.on_event = on_event
        self.stop_event = getattr(executor, "stop_event", None) or threading.Event()
        if hasattr(executor, "stop_event"):
            executor.stop_event = self.stop_event
        # cleared once, here: a stop or kill switch pressed between now and run()'s first step
        # (the switch is armed right after the loop is made) ends the run instead of being lost
        self.stop_event.clear()
        self._stop_reason = "stopped"
        self._has_control = False
        self._rejections = 0  # rejections in a row (an executed action ends the row)
        self.episode: Episode | None = None
        self.stats: dict[str, list[float]] = {"propose": [], "execute": [], "record": []}

    # ---------------------------------------------------------------- control
    def stop(self, reason: str = "stopped") -> None:
        """Stop the run (any thread): no further action is executed; held keys are released."""
        self._stop_reason = reason
        self.stop_event.set()
        for ex in (self.executor, self.tools):
            if ex is not None:
                try:
                    ex.release()
                except Exception:  # releasing is best effort; the stop flag is already set
                    pass

    def _control(self, on: bool) -> None:
        if on != self._has_control:
            self._has_control = on
            if self.on_control:
                self.on_control(on)

    def _emit(self, kind: str, **payload) -> None:
        if self.on_event:
            self.on_event(kind, payload)

    def _check(self, index: int, t0: float) -> None:
        if self.stop_event.is_set():
            raise _End(self._stop_reason, truncated=True)
        if index >= self.config.max_steps:
            raise _End("step limit", truncated=True)
        if self.config.max_seconds is not None and monotonic() - t0 > self.config.max_seconds:
            raise _End("time limit", truncated=True)

    # ---------------------------------------------------------------- run
    def run(self, instruction: str) -> RunResult:
        cfg = self.config
        kind = cfg.kind or ("autonomous" if self.gate.mode == "auto" and self.gate.supervisor is None else "supervised")
        ep = Episode(instruction=instruction, kind=kind, platform=self.executor.platform, producer=self.policy.version,
                     policy_version=self.policy.version,
                     meta={"gate": self.gate.mode, "coords": self.policy.space, "end_reason": None})
        self.episode = ep
        self._save()
        t0 = monotonic()
        self._control(True)
        frame, _ = self.executor.reset()
        after_call_user = False
        pending: dict = {"parse_failures": [], "rejections": []}
        feedback = None
        reason, truncate = "finished", False
        try:
            while True:
                self._check(len(ep.steps), t0)
                proposal, decision, gate_why = self._propose(instruction, frame, feedback, pending, after_call_user, t0)
                feedback = None
                if decision.kind == "takeover":
                    frame, resume = self._take_over(instruction, frame, proposal, gate_why)
                    if not resume:
                        raise _End("the human ended the run after taking over")
                    continue
                actions, thought = self._decided(proposal, decision)
                raw, info, k = proposal.raw_text, {**pending, "gate": gate_why}, 0
                while k < len(actions):
                    self._check(len(ep.steps), t0)
                    if gate_why is None:
                        # nobody has seen this reply: judge its next action on the focus as it is
                        # now, after the previous action ran (a click may have focused a terminal)
                        frame = self._focus_now(frame)
                        rest = dataclasses.replace(proposal, actions=actions[k:])
                        gate_why = self.gate.why_ask(rest, frame, after_call_user=after_call_user)
                        self._check(len(ep.steps), t0)
                        if gate_why is not None:
                            decision = self._ask(instruction, frame, rest, gate_why, pending)
                            if decision.kind == "reject":
                                feedback = reject_feedback(rest, decision.reason, self.policy.space)
                                break
                            if decision.kind == "takeover":
                                frame, resume = self._take_over(instruction, frame, rest, gate_why)
                                if not resume:
                                    raise _End("the human ended the run after taking over")
                                break
                            started = raw is None  # an action of this reply ran and recorded its thought
                            proposal, (actions, edited) = rest, self._decided(rest, decision)
                            thought = "" if started and edited == rest.thought else edited
                            info, k = {**pending, "gate": gate_why}, 0
                    action = actions[k]
                    prov = self._provenance(proposal, decision, k, thought)
                    frame, terminated, error = self._execute_and_record(frame, thought, action, prov, raw, info,
                                                                        source=prov.source)
                    pending = {"parse_failures": [], "rejections": []}
                    thought, raw, info, k, self._rejections = "", None, {}, k + 1, 0
                    if error:
                        feedback = f"The last action could not be executed: {error}"
                        break
                    if terminated:
                        if action.name == "call_user" and self.gate.supervisor is not None:
                            req = self._request(instruction, frame, proposal, "the agent asked for help")
                            frame, resume = self._take_over(instruction, frame, proposal, req.why, request=req)
                            if not resume:
                                raise _End("call_user")
                            after_call_user = True
                            break
                        raise _End(action.name)
        except _End as e:
            reason, truncate = e.reason, e.truncated
        except PolicyError as e:
            reason, truncate = f"policy error: {e}", True
        except BaseException as e:  # a bug or a failing supervisor: close the record, then let it surface
            self._control(False)
            self._finish(f"crashed: {type(e).__name__}: {e}", True, pending)
            raise
        finally:
            self._control(False)
        return self._finish(reason, truncate, pending)

    # ---------------------------------------------------------------- pieces
    def _request(self, instruction, frame, proposal, why) -> GateRequest:
        return GateRequest(instruction=instruction, step_index=len(self.episode.steps), proposal=proposal,
                           observation=frame, why=why, episode_id=self.episode.id, platform=self.executor.platform)

    def _propose(self, instruction, frame, feedback, pending, after_call_user, t0):
        """Ask until a proposal parses and the gate lets it through (or a limit ends the run)."""
        failures = 0
        while True:
            self._check(len(self.episode.steps), t0)
            t = time.perf_counter()
            proposal = self.policy.propose(instruction, self.memory, frame, feedback)
            self.stats["propose"].append(time.perf_counter() - t)
            self._emit("proposal", proposal=proposal, observation=frame)
            if self.stop_event.is_set():
                raise _End(self._stop_reason, truncated=True)
            if not proposal.ok:
                failures += 1
                pending["parse_failures"].append({"raw": proposal.raw_text, "reason": proposal.parse_error})
                if self.reask.gives_up(failures):
                    raise _End(f"unparseable output {failures} times in a row: {proposal.parse_error}", truncated=True)
                feedback = self.reask.feedback(proposal.parse_error)
                continue
            why = self.gate.why_ask(proposal, frame, after_call_user=after_call_user)
            if why is None:
                return proposal, Decision.approve(), None
            decision = self._ask(instruction, frame, proposal, why, pending)
            if decision.kind == "reject":
                feedback = reject_feedback(proposal, decision.reason, self.policy.space)
                continue
            return proposal, decision, why

    def _ask(self, instruction, frame, proposal, why, pending) -> Decision:
        """The supervisor's decision on a proposal. A stop ends the run; a rejection is kept in
        `pending` (for the next step's info) and too many in a row end the run."""
        self._control(False)
        asked = monotonic()
        decision = self.gate.review(self._request(instruction, frame, proposal, why))
        if decision.seconds is None:
            decision.seconds = round(monotonic() - asked, 3)
        self._emit("decision", decision=decision)
        if self.stop_event.is_set():
            raise _End(self._stop_reason, truncated=True)
        if decision.kind == "stop":
            raise _End(stop_reason(decision.reason), truncated=True)
        if decision.kind == "reject":
            self._rejections += 1
            pending["rejections"].append({"thought": proposal.thought, "actions": [a.to_dict() for a in proposal.actions],
                                          "raw": proposal.raw_text, "reason": decision.reason, "by": decision.decided_by})
            if self._rejections > self.config.max_rejections:
                raise _End(f"{self._rejections} proposals rejected in a row", truncated=True)
            return decision
        self._control(True)
        return decision

    @staticmethod
    def _decided(proposal: Proposal, decision: Decision) -> tuple[list[Action], str]:
        """(actions, thought) to carry out: the proposal's, or the human's edit of them."""
        edit = decision.kind == "edit"
        return (decision.actions if edit and decision.actions is not None else proposal.actions,
                decision.thought if edit and decision.thought is not None else proposal.thought)

    def _focus_now(self, frame):
        """The frame with the focused window read again, where the executor can (the desktop)."""
        refresh = getattr(self.executor, "focus_now", None)
        return refresh(frame) if refresh is not None and self.gate.mode != "auto" else frame

    def _provenance(self, proposal: Proposal, decision: Decision, k: int, thought: str) -> Provenance:
        human = decision.decided_by is not None or decision.seconds is not None
        if decision.kind == "edit":
            return Provenance("corrected", proposal_thought=proposal.thought,
                              proposal_action=proposal.actions[k] if k < len(proposal.actions) else None,
                              policy_version=proposal.policy_version, decision="edit", decided_by=decision.decided_by,
                              decision_seconds=decision.seconds)
        return Provenance("agent", policy_version=proposal.policy_version, decision="approve" if human else None,
                          decided_by=decision.decided_by, decision_seconds=decision.seconds)

    def _observation(self, frame) -> Observation:
        extra = _jsonable(dict(frame.extra))
        if frame.has_image:
            data, mime = frame.encode(self.config.image_format)
            h = self.store.put_blob(data) if self.store is not None else None
            w, hgt = frame.size
            extra["mime"] = mime
        else:
            h, (w, hgt) = None, (frame.geometry.physical_width, frame.geometry.physical_height)
            if frame.text is not None and getattr(frame, "tool_output", None) is None:
                extra["text"] = frame.text  # a text observation (the terminal's first frame); a tool's result is tool_output
        items = getattr(frame, "elements", None)
        elements = None if items is None else [e if isinstance(e, Element) else Element.from_dict(e) for e in items]
        return Observation(screenshot=h, width=w, height=hgt, geometry=frame.geometry, time=frame.time, extra=extra,
                           elements=elements, elements_source=getattr(frame, "elements_source", None),
                           tool_output=getattr(frame, "tool_output", None))

    def _execute_and_record(self, frame, thought, action: Action, prov: Provenance, raw, info: dict, *, source: str):
        """Execute one action, record the step; returns (next frame, terminated, error or None)."""
        t_rec = time.perf_counter()
        obs = self._observation(frame)
        record_s = time.perf_counter() - t_rec
        info = {k: v for k, v in info.items() if v}
        problem = validate(action, normalized=True)
        t_start = monotonic()
        error = None
        terminated = False
        tool_out = None
        try:
            if problem:
                raise ExecutionError(problem)
            if action.name in TOOL_ACTIONS:
                if self.tools is None:
                    raise ExecutionError(f"{action.name} needs the terminal tools, which this run does not have")
                tframe, _, _, _, tinfo = self.tools.step(action)
                info.update(_jsonable(tinfo))
                tool_out = tframe.tool_output
                next_frame = self.executor.observe()
            else:
                next_frame, _, terminated, _, einfo = self.executor.step(action)
                info.update(_jsonable(einfo))
        except ExecutionError as e:
            error = str(e)
            info["error"] = error
            next_frame = self.executor.observe() if not self.stop_event.is_set() else frame
            if action.name in TOOL_ACTIONS:  # the model reads why its tool call did not run beside the next frame
                tool_out = tool_output(action, error=error)
        if tool_out is not None:
            # the step keeps its result (Supervise and the step viewer show it); the next
            # observation carries it too: that is where the model sees it
            info["tool_output"] = tool_out
            next_frame = dataclasses.replace(next_frame, tool_output=tool_out)
        t_end = monotonic()
        self.stats["execute"].append(t_end - t_start)
        step = Step(index=len(self.episode.steps), observation=obs, thought=thought, action=action, provenance=prov,
                    t_start=t_start, t_end=t_end, terminated=terminated, raw_response=raw, info=info)
        t_rec = time.perf_counter()
        self.episode.steps.append(step)
        self._save()
        self.stats["record"].append(record_s + time.perf_counter() - t_rec)
        note = f"Error: {error}" if error and tool_out is None else None  # a tool's error is in its output
        self.memory.add(MemoryStep(thought, [action], frame, note=note, source=source))
        self._emit("step", step=step)
        if self.on_step:
            self.on_step(step)
        return next_frame, terminated, error

    def _take_over(self, instruction, frame, proposal, why, request: GateRequest | None = None):
        """The human acts; their steps are recorded. Returns (frame, resume)."""
        self._control(False)
        req = request or self._request(instruction, frame, proposal, why or "the supervisor took over")
        result = self.gate.supervisor.take_over(req)
        if not isinstance(result, Takeover):
            raise _End(f"the supervisor's take_over answered {result!r}, not a Takeover")
        for hs in result.steps:
            if self.stop_event.is_set():
                raise _End(self._stop_reason, truncated=True)
            prov = Provenance("human", decision="takeover", decided_by=result.by)
            if hs.executed:  # the human already acted; record what they did on the screen they saw
                acted_on = hs.frame or frame
                terminated = REGISTRY[hs.action.name].terminal
                self.episode.steps.append(Step(index=len(self.episode.steps), observation=self._observation(acted_on),
                                               thought=hs.thought, action=hs.action, provenance=prov,
                                               t_start=monotonic(), t_end=monotonic(), terminated=terminated))
                self._save()
                self.memory.add(MemoryStep(hs.thought, [hs.action], acted_on, source="human"))
                frame = self.executor.observe()
            else:
                frame, terminated, _ = self._execute_and_record(frame, hs.thought, hs.action, prov, None, {}, source="human")
            if terminated:  # the human finished the task (or gave up): the run ends here
                raise _End(f"{hs.action.name} (by the human)")
        frame = self.executor.observe()
        if result.resume:
            self._control(True)
        return frame, result.resume

    def _save(self) -> None:
        if self.store is not None:
            self.store.save_episode(self.episode)

    def _finish(self, reason: str, truncate: bool, pending: dict) -> RunResult:
        ep = self.episode
        if ep.steps and truncate and not ep.steps[-1].terminated:
            ep.steps[-1].truncated = True
        leftovers = {k: v for k, v in pending.items() if v}
        if leftovers:
            ep.meta["unexecuted"] = leftovers
        verdict = getattr(self.executor, "outcome", None)  # an executor that can check the task (the sandbox)
        outcome = verdict() if callable(verdict) else None
        # a verdict, or a score without one (a game is scored, not passed: its reward is the normalized score)
        if outcome is not None and (outcome.success is not None or outcome.reward is not None):
            ep.outcome = outcome
            if getattr(outcome, "text", ""):  # what it said in words ("Game over: score 12 (normalized 140).")
                ep.meta["outcome_text"] = outcome.text
        ep.meta["end_reason"] = reason
        ep.updated_at = time.time()
        self._save()
        self._emit("end", reason=reason)
        return RunResult(ep, reason, len(ep.steps), {k: list(v) for k, v in self.stats.items()})
