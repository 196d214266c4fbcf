"""Token-level GAE over multi-turn trajectories (pure torch, no I/O).

A multi-turn trajectory is one token sequence in which observation / prompt tokens (screenshots,
tool output, chat template) alternate with the tokens the policy generated. Only generated tokens
are actions, so `mask` marks them and the recurrence runs over them alone: a masked token is
skipped, and the "next value" of the last generated token of turn t is the value at the first
generated token of turn t+1. Discounting is per generated token (gamma applies once per step of
that chain, never across skipped observation tokens).

Shapes: every per-token tensor is [T] (one trajectory) or [B, T] (a padded batch, padding masked
out). Per-trajectory arguments (`last_value`, `terminated`, `lam`) are scalars or [B].

The end of a trajectory is one of two things, never merged (CleanRL issue #198):
- terminated: a real end; the value after the last generated token is 0.
- truncated (time limit, token budget): the episode would have gone on; bootstrap from
  `last_value`, the critic's value of the next state (the prompt the policy would have seen).

Decoupled GAE (VAPO): the critic regresses onto lambda_critic = 1 returns (unbiased targets), the
policy uses a smaller, length-adaptive lambda for lower-variance advantages.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from trainer.errors import TrainerError

Tensor = torch.Tensor

# Length-adaptive lambda bounds. With alpha = 0.05 the raw formula falls below 0.9 for any
# trajectory under 200 generated tokens (and below 0 under 20), which is most GUI episodes here;
# with the reward on a turn's last token, lambda = 0.9 already scales it by 0.9**64 ~ 1e-3 at the
# start of a 64-token turn, so a lower lambda would leave early tokens with almost nothing but the
# critic's opinion. VAPO tuned the formula for thousand-token sequences where the floor never bites.
# The ceiling (reached only past 200,000 tokens) keeps the policy's lambda strictly below the
# critic's 1, so its advantages always trade a little bias for variance.
LAMBDA_MIN = 0.9
LAMBDA_MAX = 0.9999


class GAEError(TrainerError, ValueError):
    """Inputs to GAE that do not fit together; the message names the offending argument."""


def adaptive_lambda(length, alpha: float = 0.05, lam_min: float = LAMBDA_MIN, lam_max: float = LAMBDA_MAX):
    """Length-adaptive policy lambda = 1 - 1/(alpha * l), clamped to [lam_min, lam_max].

    `length` is the number of generated tokens of a trajectory: an int (returns a float) or a
    tensor of lengths [B] (returns a float tensor [B], one lambda per sequence). Longer
    trajectories get a lambda nearer 1, so a reward at the end still reaches their first tokens.
    """
    if alpha <= 0:
        raise GAEError(f"alpha must be > 0, got {alpha!r}")
    if not 0.0 <= lam_min <= lam_max <= 1.0:
        raise GAEError(f"need 0 <= lam_min <= lam_max <= 1, got lam_min={lam_min!r}, lam_max={lam_max!r}")
    if isinstance(length, Tensor):
        ln = length.to(torch.float64)
        if (ln < 0).any():
            raise GAEError(f"lengths must be >= 0, got {length.tolist()}")
        # l = 0 gives -inf, clamped to lam_min: an empty sequence has no advantages anyway.
        lam = 1.0 - 1.0 / (alpha * ln)
        return lam.clamp(lam_min, lam_max).to(torch.float32)
    if length < 0:
        raise GAEError(f"length must be >= 0, got {length!r}")
    if length == 0:
        return float(lam_min)
    return float(min(lam_max, max(lam_min, 1.0 - 1.0 / (alpha * length))))


def _per_row(x, batch: int, name: str, dtype, device) -> Tensor:
    """A scalar or [B] argument as a [B] tensor."""
    t = torch.as_tensor(x, dtype=dtype, device=device)
    if t.dim() == 0:
        return t.expand(batch)
    if t.shape != (batch,):
        raise GAEError(f"{name} must be a scalar or have shape [{batch}], got shape {list(t.shape)}")
    return t


def gae(rewards: Tensor, values: Tensor, mask: Tensor | None = None, *, gamma: float = 1.0, lam=1.0,
        last_value=0.0, terminated=True) -> tuple[Tensor, Tensor]:
    """Generalized advantage estimation over the generated tokens of each trajectory.

    rewards, values, mask: [T] or [B, T]. mask is 1 on generated tokens, 0 on observation and
        padding tokens (None: every token is generated). Rewards on masked tokens are an error,
        since they would be silently lost.
    gamma: per-generated-token discount. lam: float or [B] (per-sequence lambda).
    last_value: scalar or [B], the value of the state after the last generated token; used only
        where the trajectory was truncated. terminated: bool or [B] bool.
    Returns (advantages, returns), both shaped like rewards, 0 on masked tokens;
    returns = advantages + values on generated tokens.

    delta_t = r_t + gamma * V(next) - V_t,   A_t = delta_t + gamma * lam * A(next)
    where next is the next generated token, or the end of the trajectory.
    """
    if rewards.shape != values.shape:
        raise GAEError(f"rewards and values must have the same shape, got {list(rewards.shape)} and {list(values.shape)}")
    if rewards.dim() not in (1, 2):
        raise GAEError(f"rewards must be [T] or [B, T], got shape {list(rewards.shape)}")
    single = rewards.dim() == 1
    r = rewards.unsqueeze(0) if single else rewards
    v = values.unsqueeze(0) if single else values
    r, v = r.detach().float(), v.detach().float()  # targets, never part of a graph
    if mask is None:
        m = torch.ones_like(r, dtype=torch.bool)
    else:
        if mask.shape != rewards.shape:
            raise GAEError(f"mask must have the shape of rewards {list(rewards.shape)}, got {list(mask.shape)}")
        m = (mask.unsqueeze(0) if single else mask).bool()
    if not (torch.isfinite(r).all() and torch.isfinite(v).all()):
        raise GAEError("rewards or values contain NaN or inf")
    if (r.masked_select(~m) != 0).any():
        raise GAEError("rewards sit on masked (non-generated) tokens; put each turn's reward on its last generated token")
    if gamma < 0 or gamma > 1:
        raise GAEError(f"gamma must be in [0, 1], got {gamma!r}")
    batch, length = r.shape
    lam_b = _per_row(lam, batch, "lam", torch.float32, r.device)
    if ((lam_b < 0) | (lam_b > 1)).any():
        raise GAEError(f"lam must be in [0, 1], got {lam_b.tolist()}")
    term = _per_row(terminated, batch, "terminated", torch.bool, r.device)
    boot = _per_row(last_value, batch, "last_value", torch.float32, r.device)
    if not torch.isfinite(boot[~term]).all():
        raise GAEError(f"last_value must be finite where a trajectory was truncated, got {boot.tolist()}")

    # The carry is what follows the current token on the chain of generated tokens: at the end
    # of the trajectory, 0 if it terminated and the bootstrap value if it was truncated.
    next_value = torch.where(term, torch.zeros_like(boot), boot)
    next_adv = torch.zeros(batch, device=r.device)
    adv = torch.zeros_like(r)
    for t in range(length - 1, -1, -1):
        mt = m[:, t]
        delta = r[:, t] + gamma * next_value - v[:, t]
        a = delta + gamma * lam_b * next_adv
        adv[:, t] = torch.where(mt, a, torch.zeros_like(a))
        # A masked token passes the carry through untouched: it is not a step of the chain.
        next_value = torch.where(mt, v[:, t], next_value)
        next_adv = torch.where(mt, a, next_adv)
    ret = torch.where(m, adv + v, torch.zeros_like(adv))
    if single:
        return adv[0], ret[0]
    return adv, ret


def decoupled_gae(rewards: Tensor, values: Tensor, mask: Tensor | None = None, *, gamma: float = 1.0,
                  lam_policy=None, lam_critic: float = 1.0, alpha: float = 0.05, last_value=0.0,
                  terminated=True) -> tuple[Tensor, Tensor]:
    """Advantages for the policy and returns for the critic, each with its own lambda.

    Shapes as in `gae`. lam_policy: float, [B], or None for the length-adaptive
    1 - 1/(alpha * l) with l the number of generated tokens of each trajectory.
    Returns (advantages from GAE(lam_policy), returns = GAE(lam_critic) + values).
    """
    if lam_policy is None:
        m = torch.ones_like(rewards, dtype=torch.bool) if mask is None else mask.bool()
        lengths = m.sum(-1)
        lam_policy = adaptive_lambda(lengths if lengths.dim() else int(lengths), alpha)
    adv, _ = gae(rewards, values, mask, gamma=gamma, lam=lam_policy, last_value=last_value, terminated=terminated)
    _, ret = gae(rewards, values, mask, gamma=gamma, lam=lam_critic, last_value=last_value, terminated=terminated)
    return adv, ret


def place_turn_rewards(turn_rewards: Sequence[float] | Tensor, turn_lengths: Sequence[int]) -> Tensor:
    """Per-token rewards [sum(turn_lengths)] for turns whose generated tokens are concatenated:
    turn k's reward on its last token, 0 elsewhere. A turn with no tokens cannot carry a reward."""
    tr = torch.as_tensor(turn_rewards, dtype=torch.float32).reshape(-1)
    lengths = [int(n) for n in turn_lengths]
    if tr.numel() != len(lengths):
        raise GAEError(f"{tr.numel()} turn rewards for {len(lengths)} turns")
    for k, n in enumerate(lengths):
        if n <= 0:
            raise GAEError(f"turn {k} has {n} generated tokens: drop it (or merge its reward) before placing rewards")
    out = torch.zeros(sum(lengths))
    if lengths:
        ends = torch.tensor(lengths).cumsum(0) - 1
        out[ends] = tr
    return out


def turn_spans(mask: Tensor) -> list[tuple[int, int]]:
    """The turns of one trajectory as [start, end) spans: maximal runs of 1s in a [T] mask
    (generated tokens), which observation tokens separate."""
    if mask.dim() != 1:
        raise GAEError(f"turn_spans takes one trajectory's mask [T], got shape {list(mask.shape)}")
    m = mask.bool().to(torch.int8)
    edges = torch.diff(m, prepend=m.new_zeros(1), append=m.new_zeros(1))
    starts = (edges == 1).nonzero().flatten().tolist()
    ends = (edges == -1).nonzero().flatten().tolist()
    return list(zip(starts, ends, strict=True))


def rewards_from_mask(turn_rewards: Sequence[float] | Tensor, mask: Tensor) -> Tensor:
    """Per-token rewards [T] for one trajectory laid out as [prompt, gen, obs, gen, ...]: turn k's
    reward on the last token of the k-th run of generated tokens in `mask` [T]."""
    tr = torch.as_tensor(turn_rewards, dtype=torch.float32).reshape(-1)
    spans = turn_spans(mask)
    if tr.numel() != len(spans):
        raise GAEError(f"{tr.numel()} turn rewards but the mask has {len(spans)} runs of generated tokens")
    out = torch.zeros(mask.shape[0])
    if spans:
        out[torch.tensor([e - 1 for _, e in spans])] = tr
    return out
