"""Scoring: an outcome for each episode from what is available, and rule checks for quality.

Outcome, first that applies (the source is kept in Outcome.source):
  1. a judgement already made by the sandbox verifier ("verifier") or by a person: the
     annotator's mark ("annotator") or the supervisor's ("supervisor");
  2. an outcome reward model (ORM, source "orm"): a policy-class VLM shown the last screenshots
     and the instruction and asked for yes or no (a local transformers directory through
     agent.vlm.model, or an OpenAI-compatible endpoint); an answer that is neither leaves it unknown;
  3. otherwise unknown (success None): routing decides what unjudged data is worth.

Rule checks (`rule_checks`) return reasons, one per problem found: a step without a screenshot,
an empty thought, an action that fails validation or does not survive format -> parse, a model
output that did not parse, steps after `finished`. Episode-level problems make it unusable.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from agent import coords
from agent.actions import validate
from agent.executors.base import Frame
from agent.grammar import format_normalized, parse_normalized, parse_response
from agent.policies.endpoint import EndpointPolicy
from agent.schema import Episode, Outcome
from agent.vlm.model import generate as vlm_generate
from agent.vlm.model import load_vlm

TRUSTED_SOURCES = ("verifier", "annotator", "supervisor")
TERMINAL_ACTIONS = ("finished", "call_user")

ORM_PROMPT = (
    "You are judging whether a computer-use agent completed a task. You see the last screenshots of "
    "its attempt, the final one last.\n\nTask: {instruction}\n\n"
    "Was the task completed? Answer with one word: Yes or No."
)


@dataclass
class Score:
    outcome: Outcome
    quality: float  # fraction of steps with no problem found (0..1)
    reasons: list[str] = field(default_factory=list)  # every problem found, step by step
    fatal: list[str] = field(default_factory=list)  # problems that make the episode unusable
    judge_raw: str | None = None  # the ORM's answer, when one was asked
    thoughtless: int = 0  # steps whose only problem is a missing thought (a person can add it)
    steps: int = 0

    @property
    def usable(self) -> float:
        """The share of steps usable once thoughts are written: what decides rejection."""
        return min(1.0, self.quality + (self.thoughtless / self.steps if self.steps else 0.0))


# ---------------------------------------------------------------- rule checks


def _round_trip(step) -> str | None:
    """None when the step's action survives format -> parse in model space, else why not."""
    w, h = step.observation.width, step.observation.height
    try:
        text = format_normalized(step.thought or "", [step.action], coords.SMART_RESIZE, w, h)
    except (coords.CoordinateError, KeyError, ValueError, TypeError) as e:
        return f"cannot be written in the grammar: {e}"
    parsed = parse_normalized(text, coords.SMART_RESIZE, w, h)
    if not parsed:
        return f"does not parse back: {parsed.reason}"
    back = parsed.actions[0]
    if back.name != step.action.name:
        return f"parses back as {back.name!r}"
    tol = 1.5 / min(w, h)  # model space is integer pixels: a point may move by a rounding step
    for a, b in zip(step.action.points(), back.points(), strict=True):
        if abs(a[0] - b[0]) > tol or abs(a[1] - b[1]) > tol:
            return f"point {a} parses back as {b}"
    return None


def step_problems(ep: Episode) -> dict[int, list[str]]:
    """{step index: problems} for the steps that have any."""
    out: dict[int, list[str]] = {}
    finished_at = None
    for pos, s in enumerate(ep.steps):
        problems = []
        if finished_at is not None:
            problems.append(f"comes after {ep.steps[finished_at].action.name} at step {ep.steps[finished_at].index + 1}")
        if not s.observation.screenshot:
            problems.append("no screenshot")
        if not (s.thought or "").strip():
            problems.append("empty thought")
        bad = validate(s.action)
        if bad:
            problems.append(f"invalid action: {bad}")
        else:
            rt = _round_trip(s)
            if rt:
                problems.append(f"action {s.action.name} {rt}")
        if s.raw_response is not None:
            parsed = parse_response(s.raw_response)
            if not parsed:
                problems.append(f"the model's output did not parse: {parsed.reason}")
        elif s.info.get("error"):
            problems.append(f"the step failed: {s.info['error']}")
        if s.action.name in TERMINAL_ACTIONS and finished_at is None:
            finished_at = pos
        if problems:
            out[s.index] = problems
    return out


def rule_checks(ep: Episode) -> tuple[list[str], list[str], float]:
    """(reasons, fatal reasons, quality) of an episode with its steps loaded."""
    return _rule_checks(ep, step_problems(ep) if ep.steps else {})


def _rule_checks(ep: Episode, bad: dict) -> tuple[list[str], list[str], float]:
    if not ep.steps:
        return ["no steps"], ["no steps"], 0.0
    reasons = [f"step {i + 1}: {p}" for i, ps in bad.items() for p in ps]  # read by people: from 1
    fatal = []
    if all(not s.observation.screenshot for s in ep.steps):
        fatal.append("no step has a screenshot")
    if not (ep.instruction or "").strip():
        fatal.append("empty instruction")
    return reasons, fatal, 1.0 - len(bad) / len(ep.steps)


# ---------------------------------------------------------------- the outcome reward model


def parse_judgement(text: str) -> bool | None:
    """True for a yes, False for a no (the first of them that appears), None for neither."""
    m = re.search(r"\b(yes|no|true|false|success|failure|completed|failed)\b", str(text or ""), re.IGNORECASE)
    if not m:
        return None
    return m.group(1).lower() in ("yes", "true", "success", "completed")


class OutcomeRewardModel:
    """A VLM asked whether the task was done. `generate(messages) -> str` is any policy-class
    model: `local(dir)` or `endpoint(url, model)` give real ones."""

    def __init__(self, generate, *, name: str = "orm", last_screenshots: int = 2):
        if last_screenshots < 1:
            raise ValueError(f"last_screenshots must be at least 1, got {last_screenshots}")
        self.generate, self.name, self.last_screenshots = generate, name, last_screenshots

    @classmethod
    def local(cls, model_dir, *, max_new_tokens: int = 8, **kw) -> OutcomeRewardModel:
        """A transformers checkpoint directory, loaded on first use (agent.vlm.model)."""
        loaded = {}

        def generate(messages):
            if not loaded:
                loaded["m"] = load_vlm(model_dir, device="cpu")
            model, processor = loaded["m"]
            return vlm_generate(model, processor, messages, max_new_tokens=max_new_tokens)

        return cls(generate, name=f"orm:{model_dir}", **kw)

    @classmethod
    def endpoint(cls, base_url: str, model: str, api_key: str | None = None, **kw) -> OutcomeRewardModel:
        """An OpenAI-compatible chat-completions server (vLLM, SGLang, hosted)."""
        pol = EndpointPolicy(base_url, model, api_key, max_tokens=8, max_images=kw.get("last_screenshots", 2))
        return cls(pol.generate, name=f"orm:{model}@{base_url}", **kw)

    def messages(self, ep: Episode, image_of) -> list[dict]:
        shots = [s for s in ep.steps if s.observation.screenshot][-self.last_screenshots:]
        if not shots:
            raise ValueError(f"episode {ep.id}: no screenshot to judge")
        parts = [{"type": "image", "frame": Frame(geometry=s.observation.geometry, encoded=image_of(s.observation.screenshot))}
                 for s in shots]
        last = ep.steps[-1]
        if last.observation.post_screenshot:  # the screen after the last action, when it was kept
            parts.append({"type": "image", "frame": Frame(geometry=last.observation.geometry,
                                                          encoded=image_of(last.observation.post_screenshot))})
        parts.append({"type": "text", "text": ORM_PROMPT.format(instruction=ep.instruction)})
        return [{"role": "user", "content": parts}]

    def judge(self, ep: Episode, image_of) -> tuple[bool | None, str]:
        raw = str(self.generate(self.messages(ep, image_of)) or "")
        return parse_judgement(raw), raw


# ---------------------------------------------------------------- scoring


def score_episode(ep: Episode, *, image_of=None, orm: OutcomeRewardModel | None = None) -> Score:
    """The episode's outcome and quality. image_of(hash) -> bytes is needed only for the ORM."""
    bad = step_problems(ep) if ep.steps else {}
    reasons, fatal, quality = _rule_checks(ep, bad)
    thoughtless = sum(1 for ps in bad.values() if ps == ["empty thought"])
    o = ep.outcome
    judge_raw = None
    if o.success is not None and o.source in TRUSTED_SOURCES:
        outcome = Outcome(o.success, o.reward if o.reward is not None else float(o.success), o.source)
    elif orm is not None and not fatal:
        if image_of is None:
            raise ValueError("scoring with an outcome reward model needs image_of (e.g. store.get_blob)")
        try:
            success, judge_raw = orm.judge(ep, image_of)
        except Exception as e:  # a judge that fails leaves the outcome unknown, with the reason
            success, judge_raw = None, None
            reasons.append(f"outcome reward model failed: {type(e).__name__}: {e}")
        if success is None and judge_raw is not None:
            reasons.append(f"outcome reward model answered neither yes nor no: {judge_raw[:60]!r}")
        outcome = Outcome(success, None if success is None else float(success), "orm" if success is not None else None)
    else:
        outcome = Outcome(o.success, o.reward, o.source)
    return Score(outcome, quality, reasons, fatal, judge_raw, thoughtless, len(ep.steps))
