"""The policy interface: propose the next thought and actions.

`Policy.propose(instruction, memory, observation, feedback=None) -> Proposal`. A policy builds
the UI-TARS prompt (agent.grammar.system_prompt) and the chat messages (agent.policies.memory), asks its
model for text (`generate`, the one method a back end writes), and parses the text with
agent.grammar.parse_reply. Bad model output is a Proposal with `parse_error` set, never an
exception; `PolicyError` is raised only when no text could be had at all (an endpoint that stays
down after its retries, a replay file that ran out), which ends a run.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from agent import coords
from agent.errors import TandemError
from agent.grammar import action_space_text, parse_reply, system_prompt
from agent.policies.memory import Memory
from agent.schema import Action


class PolicyError(TandemError):
    """No response could be obtained from the model; the message says why."""


@dataclass
class Proposal:
    thought: str
    actions: list[Action]  # normalized to the screenshot (0..1); empty when parse_error is set
    raw_text: str
    parse_error: str | None = None
    space: str = coords.SMART_RESIZE
    image_size: tuple[int, int] | None = None  # the screenshot the coordinates refer to
    seconds: float = 0.0  # time spent generating
    policy_version: str | None = None
    info: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.parse_error is None


def build_prompt(instruction: str, platforms: tuple[str, ...], language: str = "English") -> str:
    """UI-TARS-1.5's computer (or mobile) prompt; the terminal tools are added to the action
    space when the run has them (the report's GUI-SDK)."""
    gui = platforms[0]
    text = system_prompt(instruction, gui, language)
    extra = [p for p in platforms[1:] if p != gui]
    if extra:
        base = action_space_text(gui)
        seen = set(base.splitlines())
        more = [line for p in extra for line in action_space_text(p).splitlines() if line not in seen]
        text = text.replace(base, base + "\n" + "\n".join(dict.fromkeys(more)), 1)
    return text


class Policy:
    """Base class: subclasses implement `generate(messages) -> str`."""

    name = "policy"

    def __init__(self, *, space: str = coords.SMART_RESIZE, platform: str = "desktop", tools: bool = False,
                 language: str = "English", version: str | None = None):
        if space not in coords.SPACES:
            raise ValueError(f"unknown coordinate space {space!r}; expected one of {', '.join(coords.SPACES)}")
        self.space = space
        self.platforms = (platform, "terminal") if tools and platform != "terminal" else (platform,)
        self.language = language
        self.version = version or self.name
        self.last_messages: list[dict] | None = None

    def prompt(self, instruction: str) -> str:
        return build_prompt(instruction, self.platforms, self.language)

    def propose(self, instruction: str, memory: Memory, observation, feedback: str | None = None) -> Proposal:
        messages = memory.build_messages(self.prompt(instruction), observation, space=self.space, feedback=feedback)
        self.last_messages = messages
        t0 = time.perf_counter()
        raw = self.generate(messages)
        seconds = time.perf_counter() - t0
        return self.parse(raw, observation, seconds=seconds)

    def generate(self, messages: list[dict]) -> str:
        raise NotImplementedError

    def parse(self, raw, observation, *, seconds: float = 0.0) -> Proposal:
        if observation is not None and observation.has_image:
            w, h = observation.size
        else:  # text observations: no points are possible; any extent works
            w, h = 1000, 1000
        common = {"space": self.space, "image_size": (w, h), "seconds": seconds, "policy_version": self.version}
        text = raw if isinstance(raw, str) else repr(raw)
        parsed = parse_reply(raw, self.space, w, h, platforms=self.platforms, extent=self.model_extent(w, h))
        if not parsed:
            return Proposal("", [], text, parse_error=parsed.reason, **common)
        return Proposal(parsed.thought, list(parsed.actions), text, None, **common)

    def model_extent(self, width: int, height: int) -> tuple[int, int] | None:
        """The (width, height) the model's coordinates span for a width x height screenshot when
        that is not the coordinate space's own (agent.coords.model_extent); None when it is."""
        return None

    def close(self) -> None:
        pass
