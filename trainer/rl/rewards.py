"""Reward shaping for multi-turn GUI episodes: per-turn rewards from the outcome and penalties.

Each turn's shaped reward (placed on its last generated token by trainer.rl.gae):
    outcome_weight * outcome      (last turn only: from a verifier, else an outcome reward model)
  - format_penalty                (the output does not parse into executable actions)
  - step_penalty                  (every turn, so shorter solutions win)
  - length penalty                (linear in thought tokens beyond a budget, capped)
Every term is a penalty rather than a per-turn bonus: a bonus paid each turn would reward
dawdling, as the agent could collect it by taking more turns.
"""
from __future__ import annotations

import math
import numbers
import re
from dataclasses import dataclass
from typing import Callable, Sequence

from agent.grammar import parse_response


class RewardError(ValueError):
    """A reward input or setting that makes no sense; the message names it and its value."""


@dataclass(frozen=True)
class RewardConfig:
    outcome_weight: float = 1.0
    format_penalty: float = 0.1  # subtracted when a turn's output does not parse
    step_penalty: float = 0.01  # subtracted every turn
    thought_budget: int = 256  # thought tokens free of charge per turn
    length_penalty_per_token: float = 0.0  # per thought token over budget; 0 turns it off
    length_penalty_cap: float = 0.1  # the most the length penalty takes from one turn

    def __post_init__(self):
        for name in ("format_penalty", "step_penalty", "length_penalty_per_token", "length_penalty_cap"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise RewardError(f"{name} is a penalty and must be a finite number >= 0, got {value!r}")
        if not math.isfinite(self.outcome_weight):
            raise RewardError(f"outcome_weight must be finite, got {self.outcome_weight!r}")
        if self.thought_budget < 0:
            raise RewardError(f"thought_budget must be >= 0, got {self.thought_budget!r}")


def format_ok(text: str, platform: str | None = None) -> bool:
    """Does the output parse into executable actions? (parse_response's ParseError is falsy.)"""
    return bool(parse_response(text, platform=platform))


_ACTION_LINE = re.compile(r"^[ \t]*Action[ \t]*[:：]", re.MULTILINE)


def reasoning_text(text: str) -> str:
    """Everything the model wrote before its Action section (thought and reflection); the whole
    text when there is no Action section, since all of it was spent thinking."""
    m = _ACTION_LINE.search(text)
    return text[: m.start()] if m else text


def thought_length(text: str, count_tokens: Callable[[str], int] | None = None) -> int:
    """Tokens of reasoning in one output. Pass the tokenizer's count (e.g.
    `lambda s: len(tok(s).input_ids)`); without one, whitespace-separated words approximate it."""
    reasoning = reasoning_text(text)
    n = len(reasoning.split()) if count_tokens is None else count_tokens(reasoning)
    if not isinstance(n, numbers.Integral) or isinstance(n, bool) or n < 0:
        raise RewardError(f"count_tokens must return an int >= 0, got {n!r}")
    return int(n)


def length_penalty(thought_tokens: int, budget: int, per_token: float, cap: float) -> float:
    """The amount (>= 0) to subtract: per_token for every thought token over budget, at most cap."""
    if thought_tokens < 0:
        raise RewardError(f"thought_tokens must be >= 0, got {thought_tokens!r}")
    return min(cap, max(0, thought_tokens - budget) * per_token)


def shape_turn_reward(reward: float, *, parsed: bool = True, format_penalty: float = 0.1, step_penalty: float = 0.0,
                      thought_tokens: int = 0, thought_budget: int = 0, length_per_token: float = 0.0,
                      length_cap: float = 0.0) -> float:
    """One turn's shaped reward: its own reward (the weighted outcome on the final turn, usually 0
    before it) minus the penalties that apply to it."""
    if not math.isfinite(reward):
        raise RewardError(f"turn reward must be finite, got {reward!r}")
    r = float(reward) - step_penalty - length_penalty(thought_tokens, thought_budget, length_per_token, length_cap)
    if not parsed:
        r -= format_penalty
    return r


def progress_rewards(progress: list[float], start: float = 0.0) -> list[float]:
    """Potential-based shaping from a verifier's partial progress (the fraction of subgoals met
    after each turn): each turn earns its change, so the terms sum to final - start and the
    order of good policies is kept (Ng et al., 1999), while multi-step tasks reward each subgoal
    when it is met instead of only at the end."""
    out, prev = [], float(start)
    for i, p in enumerate(progress):
        if not math.isfinite(p) or not 0.0 <= p <= 1.0:
            raise RewardError(f"progress after turn {i} must be in [0, 1], got {p!r}")
        out.append(float(p) - prev)
        prev = float(p)
    return out


def click_rewards(points, targets, sigma: float = 0.05) -> list[float]:
    """A dense grounding reward per turn: exp(-d^2 / (2 sigma^2)) for the distance d between the
    turn's click and the click the task's expert would make in the same state (both normalized
    to the screenshot, so sigma is a fraction of it); 0 where either is missing (no click, an
    unparseable reply, no expert move). A success pays once; this pays every near miss a little,
    as Gaussian point rewards for GUI grounding RL do."""
    if not sigma > 0:
        raise RewardError(f"click sigma must be > 0, got {sigma!r}")
    if len(points) != len(targets):
        raise RewardError(f"{len(points)} clicks but {len(targets)} expert targets")
    out = []
    for p, t in zip(points, targets):
        if p is None or t is None:
            out.append(0.0)
            continue
        d2 = (float(p[0]) - float(t[0])) ** 2 + (float(p[1]) - float(t[1])) ** 2
        out.append(math.exp(-d2 / (2 * sigma * sigma)))
    return out


def no_effect_penalties(changed, penalty: float) -> list[float]:
    """Per turn, the amount (>= 0) to subtract for an action that left the screen exactly as it
    was: a click on nothing, a re-click of what is already selected, a repeat of a move that did
    nothing. `changed[i]` is True (the screen changed), False (it did not) or None (no action ran:
    an unparseable reply, or the turn that ended the episode), which costs nothing here. It needs
    no expert and no labels, only two screenshots, so it holds on any task: an agent that cannot
    yet tell which element is meant still learns to act on elements and not to repeat itself."""
    if not (math.isfinite(penalty) and penalty >= 0):
        raise RewardError(f"no-effect penalty must be a finite number >= 0, got {penalty!r}")
    out = []
    for i, c in enumerate(changed):
        if c is not None and not isinstance(c, bool):
            raise RewardError(f"changed[{i}] must be True, False or None, got {c!r}")
        out.append(penalty if c is False else 0.0)
    return out


def _score(value, source: str) -> float:
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    try:
        s = float(value)
    except (TypeError, ValueError):
        raise RewardError(f"the {source} returned {value!r} ({type(value).__name__}), not a number or bool") from None
    if not math.isfinite(s):
        raise RewardError(f"the {source} returned {s!r}, not a finite number")
    return s


def outcome_score(verifier: Callable[..., float | bool] | None = None, orm: Callable[..., float] | None = None,
                  **context) -> tuple[float, str]:
    """The episode's outcome and where it came from. The verifier, when there is one, is ground
    truth and wins; else the outcome reward model, whose score must be a probability in [0, 1].
    Both are called with `**context` (e.g. episode=..., final_screen=...)."""
    if verifier is not None:
        return _score(verifier(**context), "verifier"), "verifier"
    if orm is not None:
        s = _score(orm(**context), "outcome reward model")
        if not 0.0 <= s <= 1.0:
            raise RewardError(f"outcome reward model returned {s}, outside [0, 1]")
        return s, "orm"
    raise RewardError("no verifier and no outcome reward model: the outcome cannot be scored")


def episode_turn_rewards(responses: Sequence[str], outcome: float, cfg: RewardConfig = RewardConfig(), *,
                         thought_tokens: Sequence[int] | None = None,
                         count_tokens: Callable[[str], int] | None = None,
                         platform: str | None = None) -> list[float]:
    """Shaped rewards for every turn of an episode, in order; the weighted outcome lands on the
    last turn. `responses` are the model's outputs per turn. thought_tokens: per-turn reasoning
    lengths if already known; else measured with `count_tokens` (see thought_length).
    For a truncated episode pass the outcome so far (usually 0): the learner bootstraps the rest."""
    if not math.isfinite(outcome):
        raise RewardError(f"outcome must be finite, got {outcome!r}")
    if not responses:
        return []
    if thought_tokens is None:
        thought_tokens = [thought_length(text, count_tokens) for text in responses]
    if len(thought_tokens) != len(responses):
        raise RewardError(f"{len(thought_tokens)} thought lengths for {len(responses)} turns")
    last = len(responses) - 1
    return [
        shape_turn_reward(
            cfg.outcome_weight * float(outcome) if k == last else 0.0,
            parsed=format_ok(text, platform), format_penalty=cfg.format_penalty, step_penalty=cfg.step_penalty,
            thought_tokens=int(n), thought_budget=cfg.thought_budget, length_per_token=cfg.length_penalty_per_token,
            length_cap=cfg.length_penalty_cap,
        )
        for k, (text, n) in enumerate(zip(responses, thought_tokens))
    ]
