"""Reward shaping for multi-turn GUI episodes, as trainer.learn.ppo.shaped_turn_rewards uses it. Each
turn's shaped reward (placed on its last generated token by trainer.rl.gae.place_turn_rewards):
    the env's reward              (the verifier's outcome on the turn that reached it)
  - format_penalty                (the output does not parse into executable actions)
  - step_penalty                  (every turn, so shorter solutions win)
  + progress shaping, a dense click term, - a no-effect penalty   (each optional)
The fixed terms are penalties rather than per-turn bonuses: a bonus paid each turn would reward
dawdling, as the agent could collect it by taking more turns; the progress term is potential-
based, so it changes no optimal policy.
"""
from __future__ import annotations

import math

from trainer.errors import TrainerError


class RewardError(TrainerError, ValueError):
    """A reward input or setting that makes no sense; the message names it and its value."""


def shape_turn_reward(reward: float, *, parsed: bool = True, format_penalty: float = 0.1, step_penalty: float = 0.0) -> float:
    """One turn's shaped reward: its own reward (the weighted outcome on the final turn, usually 0
    before it) minus the penalties that apply to it."""
    if not math.isfinite(reward):
        raise RewardError(f"turn reward must be finite, got {reward!r}")
    r = float(reward) - step_penalty
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
    for p, t in zip(points, targets, strict=True):
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
