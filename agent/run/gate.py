"""The gate between a proposal and its execution: where a human comes in.

Modes: "auto" (never asks), "risky" (asks before risky actions: terminal and files, destructive
hotkeys, typing into a password field when the observation says one is focused, typing or
pressing keys in a terminal window, Enter where the focused window cannot be read, and anything
after the agent called the user), "all" (asks before every step). Risk is judged per action:
the loop reads the focus again before each action of a reply (agent.run.loop).

The human side is the `Supervisor` interface, so a terminal prompt, the desktop app and a remote
supervisor over the sync connection all answer the same way:

    decide(request: GateRequest) -> Decision      approve | edit | reject | takeover | stop
    take_over(request: GateRequest) -> Takeover   the human's own steps, and whether to resume

A Decision's actions are in the schema's normalized space (0..1 of the screenshot).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from agent.actions import canonical_keys, is_risky, validate
from agent.errors import TandemError
from agent.schema import Action

if TYPE_CHECKING:  # for the annotations only: the gate does not depend on policies or executors
    from agent.executors.base import Frame
    from agent.policies.base import Proposal

GATE_MODES = ("auto", "risky", "all")
DECISIONS = ("approve", "edit", "reject", "takeover", "stop")


# application classes (WM_CLASS) of terminal emulators, lower case; a window whose class or title
# names one of these, or whose title says "terminal", runs what is typed into it. The fast path and
# the only one off Linux: on Linux the desktop executor also tells a terminal by its process (a
# shell under it, a pseudo-terminal open: agent.host.terminal_process), whatever it is called.
TERMINAL_APPS = ("xterm", "uxterm", "rxvt", "urxvt", "gnome-terminal", "konsole", "xfce4-terminal", "terminator",
                 "tilix", "alacritty", "kitty", "wezterm", "foot", "lxterminal", "mate-terminal", "qterminal",
                 "terminology", "st-256color", "org.gnome.console", "kgx", "ptyxis", "ghostty", "tabby", "guake",
                 "tilda", "yakuake", "blackbox", "cool-retro-term", "sakura", "roxterm", "mlterm", "contour",
                 "zutty", "cosmic-term", "iterm", "warp", "mintty", "conemu", "windowsterminal", "powershell",
                 "cmd.exe", "terminal")


def terminal_window(observation) -> str | None:
    """The terminal the observation's focused window is (its class or title, and why it is a
    terminal when its process shows it), or None."""
    fw = getattr(observation, "extra", {}).get("focused_window") if observation is not None else None
    if not fw:
        return None
    for field_ in (fw.get("app"), fw.get("title")):
        low = (field_ or "").lower()
        if any(t in low for t in TERMINAL_APPS):
            return field_
    if fw.get("terminal"):
        return f"{fw.get('app') or fw.get('title') or 'a window'}: {fw['terminal']}"
    return None


def _submits(action: Action) -> bool:
    """Does the action end a line (Enter), where a shell would run it?"""
    if action.name == "type":
        return "\n" in action.args.get("content", "") or "\r" in action.args.get("content", "")
    return action.name == "hotkey" and "enter" in canonical_keys(action.args.get("key", "")).split()


class GateError(TandemError, ValueError):
    pass


@dataclass
class GateRequest:
    """What a supervisor sees: the proposal, the screen it was made for, and why it is asked."""

    instruction: str
    step_index: int
    proposal: Proposal | None
    observation: Frame | None
    why: str  # "every step is reviewed", "risky: run_command", "the agent asked for help"
    episode_id: str | None = None
    platform: str = "desktop"


@dataclass
class Decision:
    kind: str
    thought: str | None = None  # edit: the corrected thought (None keeps the proposal's)
    actions: list[Action] | None = None  # edit: the corrected actions (None keeps the proposal's)
    reason: str | None = None  # reject: why (the policy is told); stop: why
    decided_by: str | None = None
    seconds: float | None = None  # how long the human took

    def __post_init__(self):
        if self.kind not in DECISIONS:
            raise GateError(f"decision must be one of {', '.join(DECISIONS)}, got {self.kind!r}")
        if self.kind == "edit":
            if self.thought is None and self.actions is None:
                raise GateError("an edit must change the thought or the actions")
            for a in self.actions or []:
                problem = validate(a, normalized=True)
                if problem:
                    raise GateError(f"edited action is not valid: {problem}")
        if self.kind == "reject" and not (self.reason or "").strip():
            raise GateError("a rejection needs a reason: the policy is asked again and told why")

    @classmethod
    def approve(cls, by: str | None = None, **kw) -> Decision:
        return cls("approve", decided_by=by, **kw)

    @classmethod
    def edit(cls, actions: list[Action] | None = None, thought: str | None = None, by: str | None = None, **kw) -> Decision:
        return cls("edit", thought=thought, actions=actions, decided_by=by, **kw)

    @classmethod
    def reject(cls, reason: str, by: str | None = None, **kw) -> Decision:
        return cls("reject", reason=reason, decided_by=by, **kw)


@dataclass
class HumanStep:
    """One step the human did during a takeover. `executed`: the human already acted (the app's
    recorder saw it); otherwise the loop executes `action` for them (a terminal supervisor types
    it). `frame`: the screen the human acted on, when known."""

    thought: str
    action: Action
    executed: bool = False
    frame: object = None


@dataclass
class Takeover:
    steps: list[HumanStep] = field(default_factory=list)
    resume: bool = True  # hand control back to the agent afterwards
    by: str | None = None


class Supervisor(Protocol):
    def decide(self, request: GateRequest) -> Decision: ...

    def take_over(self, request: GateRequest) -> Takeover: ...


class Gate:
    def __init__(self, mode: str = "auto", supervisor: Supervisor | None = None):
        if mode not in GATE_MODES:
            raise GateError(f"gate mode must be one of {', '.join(GATE_MODES)}, got {mode!r}")
        if mode != "auto" and supervisor is None:
            raise GateError(f"gate mode {mode!r} asks a human, but no supervisor was given")
        self.mode = mode
        self.supervisor = supervisor

    def why_ask(self, proposal, observation, *, after_call_user: bool = False) -> str | None:
        """The reason to ask a human about this proposal, or None to let it run."""
        if self.mode == "auto":
            return None
        if self.mode == "all":
            return "every step is reviewed"
        if after_call_user:
            return "the agent called the user earlier in this run"
        for a in proposal.actions:
            why = self.risk(a, observation)
            if why:
                return why
        return None

    @staticmethod
    def risk(action: Action, observation) -> str | None:
        """Why this one action is risky on this screen (its focus facts), or None. The loop asks
        it again before each action of a reply, with the focus read anew (agent.run.loop)."""
        if is_risky(action):
            return f"risky action: {action.name}" + (f" {action.args.get('key')!r}" if action.name == "hotkey" else "")
        if action.name not in ("type", "hotkey"):
            return None
        extra = getattr(observation, "extra", None) or {}
        if action.name == "type" and extra.get("password_focused"):
            return "typing into a password field"
        if term := terminal_window(observation):
            if action.name == "type":
                return f"typing into a terminal window ({term}): the text may run as a command"
            return f"pressing keys in a terminal window ({term}): they may run a command"
        if extra.get("focus_unknown") and _submits(action):
            return f"pressing Enter where the focused window is unknown ({extra['focus_unknown']}): it may be a terminal"
        return None

    def review(self, request: GateRequest) -> Decision:
        if self.supervisor is None:
            raise GateError(f"step {request.step_index + 1} needs a human ({request.why}) but the gate has no supervisor")
        decision = self.supervisor.decide(request)
        if not isinstance(decision, Decision):
            raise GateError(f"the supervisor answered {decision!r}, not a Decision")
        return decision
