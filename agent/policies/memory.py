"""Hierarchical memory for the agent loop, fitted into a token budget.

Working memory: the last N steps in full (the screenshot the step acted on, then the response
that was executed). Episodic memory: older steps as one-line summaries (the thought's first
sentence and the action), the layout UI-TARS-1.5 was trained with (recent screenshots, older
steps as text). The result is a list of chat messages in one neutral form that each policy
converts:

    {"role": "system" | "user" | "assistant", "content": str | [part, ...]}
    part = {"type": "text", "text": str} | {"type": "image", "frame": Frame}

Token counting is injected (a tokenizer's, or the default of about 4 characters a token);
an image costs what Qwen2.5-VL spends on it: one token per 28x28 patch of the smart-resized image.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from agent import coords
from agent.elements import format_lines
from agent.grammar import TOOL_OUTPUT_LIMIT, format_normalized, format_tool_output
from agent.schema import Action

SYSTEM_TEXT = "You are a helpful assistant."


def approx_tokens(text: str) -> int:
    """Tokenizer-agnostic estimate: about 4 characters a token."""
    return (len(text) + 3) // 4


def qwen_image_tokens(width: int, height: int) -> int:
    h, w = coords.smart_resize(height, width)
    return (h // 28) * (w // 28)


class _SizeOnly:
    """What episodic memory keeps of an old screenshot: its size (for model-space coordinates)."""

    has_image = False  # never sent as an image
    text = None
    elements = None
    tool_output = None

    def __init__(self, size):
        self.size = size


@dataclass
class MemoryStep:
    """One executed step as the policy should remember it (after any human correction)."""

    thought: str
    actions: list[Action]  # normalized: what was actually executed
    frame: object = None  # the Frame the step acted on (its screenshot); None for text steps
    note: str | None = None  # a tool's output, a supervisor's remark
    source: str = "agent"  # agent | human | corrected


def summarize_thought(thought: str, limit: int = 160) -> str:
    """The thought's first sentence, cut to `limit` characters."""
    t = " ".join((thought or "").split())
    m = re.match(r"(.+?[.!?])(\s|$)", t)
    s = m.group(1) if m else t
    return s if len(s) <= limit else s[: limit - 1] + "…"


@dataclass
class Memory:
    working_steps: int = 3  # screenshots of history kept in full (UI-TARS-1.5 uses up to 5 with the current)
    token_budget: int = 16_000
    count_tokens: Callable[[str], int] = approx_tokens
    image_tokens: Callable[[int, int], int] = qwen_image_tokens
    note_limit: int = TOOL_OUTPUT_LIMIT  # characters of a tool's output (or a note) kept in working memory
    # what a working-memory step shows: "auto" its element list when its frame has one (its screenshot
    # otherwise), "screenshots" always the screenshot; never both, to save tokens
    history_view: str = "auto"
    steps: list[MemoryStep] = field(default_factory=list)
    last_report: dict = field(default_factory=dict)  # what the last build kept and dropped

    def add(self, step: MemoryStep) -> None:
        self.steps.append(step)
        # steps past working memory are only summarized: keep their screenshot's size, drop its
        # pixels (a 1920x1080 frame is 6 MB; a long run would otherwise hold them all)
        old = len(self.steps) - 1 - self.working_steps
        if old >= 0 and self.steps[old].frame is not None and self.steps[old].frame.has_image:
            f = self.steps[old].frame
            self.steps[old].frame = _SizeOnly(f.size)

    def clear(self) -> None:
        self.steps.clear()

    def __len__(self) -> int:
        return len(self.steps)

    # ---------------------------------------------------------------- pieces
    def _response_text(self, s: MemoryStep, space: str) -> str:
        f = s.frame
        w, h = f.size if f is not None and (f.has_image or isinstance(f, _SizeOnly)) else (1000, 1000)
        return format_normalized(s.thought, s.actions, space, w, h)

    def _summary_line(self, n: int, s: MemoryStep, space: str) -> str:
        action = self._response_text(MemoryStep("", s.actions, s.frame), space).removeprefix("Action: ")
        who = "" if s.source == "agent" else f" [{s.source}]"
        thought = summarize_thought(s.thought)
        return f"{n}. {thought + ' -> ' if thought else ''}{action}{who}"

    def _note(self, s: MemoryStep) -> str | None:
        if not s.note:
            return None
        t = s.note if len(s.note) <= self.note_limit else s.note[: self.note_limit] + "\n[... cut ...]"
        return f"Output:\n{t}"

    def _image_cost(self, frame) -> int:
        if frame is None or not frame.has_image:
            return 0
        w, h = frame.size
        return self.image_tokens(w, h)

    @staticmethod
    def _elements_text(frame, space: str) -> str | None:
        """The frame's element list as model text (agent.elements), or None when it has none."""
        items = getattr(frame, "elements", None)
        if items is None:
            return None
        w, h = frame.size
        return format_lines(items, space, w, h)

    def _tool_parts(self, frame) -> list[dict]:
        """The output of the tool action before this frame (agent.grammar.format_tool_output),
        first in what the frame shows: it answers the previous action."""
        out = getattr(frame, "tool_output", None)
        return [] if out is None else [{"type": "text", "text": format_tool_output(out, self.note_limit)}]

    @staticmethod
    def _text_parts(frame, told: list) -> list[dict]:
        """A text frame's own text, unless it is the tool output already told (the terminal's frame)."""
        return [{"type": "text", "text": frame.text}] if frame is not None and frame.text and not told else []

    def _history_parts(self, s: MemoryStep, space: str) -> list[dict]:
        """What a working-memory step shows of its frame: the tool output it came with, then its
        list or its screenshot (never both)."""
        f = s.frame
        if f is None:
            return []
        told = self._tool_parts(f)
        listed = self._elements_text(f, space) if self.history_view == "auto" else None
        if listed is not None:
            return told + [{"type": "text", "text": listed}]
        if f.has_image:
            return told + [{"type": "image", "frame": f}]
        return told + self._text_parts(f, told)

    def _parts_cost(self, parts: list[dict]) -> int:
        return sum(self._image_cost(p["frame"]) if p["type"] == "image" else self.count_tokens(p["text"]) for p in parts)

    # ---------------------------------------------------------------- build
    def build_messages(self, prompt: str, frame, *, space: str = coords.SMART_RESIZE, feedback: str | None = None,
                       system: str = SYSTEM_TEXT) -> list[dict]:
        """Messages for the next proposal: the prompt, episodic summaries, working steps, then
        the current observation (and feedback on the last attempt, when there is any)."""
        ct = self.count_tokens
        told = self._tool_parts(frame)
        current: list[dict] = list(told)
        if frame is not None and frame.has_image:
            current.append({"type": "image", "frame": frame})
        current += self._text_parts(frame, told)
        listed = self._elements_text(frame, space) if frame is not None else None
        if listed is not None:
            current.append({"type": "text", "text": listed})
        if feedback:
            current.append({"type": "text", "text": feedback})
        used = ct(system) + ct(prompt) + self._image_cost(frame) + sum(ct(p["text"]) for p in current if p["type"] == "text")

        # working memory: newest first, while the budget holds
        n = len(self.steps)
        working: list[int] = []
        for i in range(n - 1, max(-1, n - 1 - self.working_steps), -1):
            s = self.steps[i]
            note = self._note(s)
            cost = self._parts_cost(self._history_parts(s, space)) + ct(self._response_text(s, space)) + (ct(note) if note else 0)
            if used + cost > self.token_budget:
                break
            used += cost
            working.append(i)
        working.reverse()
        first_working = working[0] if working else n

        # episodic memory: one line each for the older steps, newest kept first
        lines: list[str] = []
        header = "Earlier steps (summaries):"
        used += ct(header)
        for i in range(first_working - 1, -1, -1):
            line = self._summary_line(i + 1, self.steps[i], space)
            if used + ct(line) > self.token_budget:
                break
            used += ct(line)
            lines.append(line)
        lines.reverse()
        omitted = first_working - len(lines)

        messages: list[dict] = [{"role": "system", "content": system}]
        intro = prompt
        if lines or omitted:
            episodic = ([f"({omitted} earlier steps omitted)"] if omitted else []) + lines
            intro = f"{prompt}\n{header}\n" + "\n".join(episodic)
        messages.append({"role": "user", "content": intro})
        for i in working:
            s = self.steps[i]
            parts = self._history_parts(s, space)
            if len(parts) == 1 and parts[0]["type"] == "text":
                messages.append({"role": "user", "content": parts[0]["text"]})
            elif parts:
                messages.append({"role": "user", "content": parts})
            messages.append({"role": "assistant", "content": self._response_text(s, space)})
            note = self._note(s)
            if note:
                messages.append({"role": "user", "content": note})
        if current:
            messages.append({"role": "user", "content": current})
        self.last_report = {"working": len(working), "episodic": len(lines), "omitted": omitted, "tokens": used,
                            "over_budget": used > self.token_budget}
        return messages


def count_images(messages: list[dict]) -> int:
    return sum(1 for m in messages if isinstance(m["content"], list) for p in m["content"] if p["type"] == "image")


def message_text(messages: list[dict]) -> str:
    """All text of the messages, for tests and logs."""
    out = []
    for m in messages:
        c = m["content"]
        out.append(c if isinstance(c, str) else "\n".join(p["text"] for p in c if p["type"] == "text"))
    return "\n".join(out)
