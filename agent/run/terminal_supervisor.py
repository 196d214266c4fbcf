"""A supervisor that answers the gate in a terminal (when there is no window).

Shows the proposal with its screen pixels and reads one line:
    a / Enter   approve
    e           edit: type the corrected action in the UI-TARS grammar with SCREEN pixel
                coordinates, e.g. click(start_box='(640,400)'); Enter alone keeps the action;
                then an optional new thought
    r REASON    reject (the policy is asked again and told the reason)
    t           take over: type actions (screen pixels) one per line, an empty line ends;
                then "resume? [Y/n]"
    s [REASON]  stop the run
"""
from __future__ import annotations

import sys
import time

from agent import coords
from agent.grammar import format_action, parse_response
from agent.run.gate import Decision, GateError, HumanStep, Takeover
from agent.schema import Action


class TerminalSupervisor:
    def __init__(self, stdin=None, stdout=None, name: str | None = None):
        self.stdin = stdin or sys.stdin
        self.stdout = stdout or sys.stdout
        self.name = name or "terminal"

    def _say(self, text: str) -> None:
        self.stdout.write(text + "\n")
        self.stdout.flush()

    def _ask(self, prompt: str) -> str:
        self.stdout.write(prompt)
        self.stdout.flush()
        line = self.stdin.readline()
        if not line:  # end of input: nobody is there to approve anything
            return "s end of input"
        return line.rstrip("\n")

    def _screen(self, action: Action, frame) -> str:
        if frame is None or not action.points():
            return format_action(action)
        return format_action(action.map_points(lambda p: coords.normalized_to_screen(p, frame.geometry)))

    def _read_action(self, frame, prompt: str) -> Action | None | str:
        """An action typed in screen pixels -> normalized; '' -> None; an error -> its text."""
        line = self._ask(prompt).strip()
        if not line:
            return None
        parsed = parse_response("Action: " + line)
        if not parsed:
            return f"cannot read that action: {parsed.reason}"
        a = parsed.actions[0]
        if frame is not None and a.points():
            try:
                a = a.map_points(lambda p: coords.screen_to_normalized(p, frame.geometry))
            except coords.CoordinateError as e:
                return str(e)
        return a

    def decide(self, request) -> Decision:
        p, frame = request.proposal, request.observation
        self._say(f"\n--- step {request.step_index + 1} needs you ({request.why})")
        if p.thought:
            self._say(f"thought: {p.thought}")
        for a in p.actions:
            self._say(f"action:  {self._screen(a, frame)}   [screen pixels]")
        t0 = time.monotonic()
        while True:
            line = self._ask("[a]pprove, [e]dit, [r]eject REASON, [t]ake over, [s]top? ").strip()
            cmd, _, rest = line.partition(" ")
            cmd = cmd.lower()
            try:
                if cmd in ("", "a", "approve"):
                    return Decision.approve(by=self.name, seconds=round(time.monotonic() - t0, 3))
                if cmd in ("r", "reject"):
                    reason = rest.strip() or self._ask("reason: ").strip()
                    return Decision.reject(reason, by=self.name, seconds=round(time.monotonic() - t0, 3))
                if cmd in ("s", "stop"):
                    return Decision("stop", reason=rest.strip() or None, decided_by=self.name)
                if cmd in ("t", "take", "takeover"):
                    return Decision("takeover", decided_by=self.name)
                if cmd in ("e", "edit"):
                    actions = []
                    for a in p.actions:
                        new = self._read_action(frame, f"action [{self._screen(a, frame)}]: ")
                        if isinstance(new, str):
                            raise GateError(new)
                        actions.append(new or a)
                    thought = self._ask("thought [Enter keeps it]: ").strip() or None
                    return Decision.edit(actions, thought, by=self.name, seconds=round(time.monotonic() - t0, 3))
                self._say(f"unknown answer {line!r}")
            except GateError as e:
                self._say(f"not accepted: {e}")

    def take_over(self, request) -> Takeover:
        self._say(f"\n--- you have control ({request.why}). Type actions in screen pixels, one per line; an empty line ends.")
        steps = []
        while True:
            a = self._read_action(request.observation, "action: ")
            if a is None:
                break
            if isinstance(a, str):
                self._say(f"not accepted: {a}")
                continue
            thought = self._ask("why (optional): ").strip()
            steps.append(HumanStep(thought, a))
        resume = self._ask("give control back to the agent? [Y/n] ").strip().lower() not in ("n", "no", "s end of input")
        return Takeover(steps, resume=resume, by=self.name)
