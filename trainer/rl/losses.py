"""PPO losses and the diagnostics a practitioner watches, as pure tensor functions.

Shapes: per-token tensors are [N] (flattened tokens) or [B, T] (padded sequences), with an
optional bool `mask` of the same shape marking the generated tokens that count (None: all).
Reductions (verl's names):
- "token-mean": every counted token weighs the same, whatever its sequence's length (DAPO,
  VAPO; the default: a long reasoning turn is not diluted into one vote per sequence).
- "seq-mean": mean over sequences of each sequence's token mean ([B, T] only; sequences with no
  counted token are left out).
- "sum": the plain sum, for a caller that accumulates gradients over micro-batches and divides
  by the token count of the whole minibatch itself.
- "none": no reduction, the per-token tensor with masked tokens at 0, for a caller that weighs
  tokens further (a trajectory's staleness weight) before it sums.
"""
from __future__ import annotations

import torch

from trainer.errors import TrainerError

Tensor = torch.Tensor

REDUCTIONS = ("token-mean", "seq-mean", "sum", "none")
# exp() of a log-ratio beyond this overflows float32 / explodes gradients; verl clamps the same.
_MAX_LOG_RATIO = 20.0


class LossError(TrainerError, ValueError):
    """Loss inputs that do not fit together; the message names the offending argument."""


def _mask_for(x: Tensor, mask: Tensor | None) -> Tensor:
    if mask is None:
        return torch.ones_like(x, dtype=torch.bool)
    if mask.shape != x.shape:
        raise LossError(f"mask has shape {list(mask.shape)}, expected {list(x.shape)}")
    return mask.bool()


def _same_shape(**tensors: Tensor) -> None:
    shapes = {k: list(t.shape) for k, t in tensors.items()}
    if len({tuple(s) for s in shapes.values()}) > 1:
        raise LossError(f"shapes differ: {shapes}")


def aggregate(x: Tensor, mask: Tensor | None = None, reduction: str = "token-mean") -> Tensor:
    """Reduce a per-token tensor [N] or [B, T] to a scalar over the masked tokens."""
    m = _mask_for(x, mask)
    # where(), not x * m: a masked token holding inf or NaN must not poison the result.
    x = torch.where(m, x, torch.zeros_like(x))
    if reduction == "none":
        return x
    if reduction == "sum":
        return x.sum()
    if reduction == "token-mean":
        return x.sum() / m.sum().clamp(min=1)
    if reduction == "seq-mean":
        if x.dim() != 2:
            raise LossError(f"reduction 'seq-mean' needs [B, T] tensors, got shape {list(x.shape)}")
        counted = m.sum(-1)
        per_seq = x.sum(-1) / counted.clamp(min=1)
        has = counted > 0
        return per_seq[has].sum() / has.sum().clamp(min=1)
    raise LossError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")


def masked_mean(x: Tensor, mask: Tensor | None = None) -> Tensor:
    """Mean of x over the masked tokens (0 when none are)."""
    return aggregate(x, mask, "token-mean")


def _log_ratio(log_probs: Tensor, old_log_probs: Tensor) -> Tensor:
    return (log_probs - old_log_probs.detach()).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)


@torch.no_grad()
def behaviour_weights(proximal_log_probs: Tensor, behaviour_log_probs: Tensor, mask: Tensor | None = None, *,
                      cap: float | None = 2.0) -> dict[str, Tensor]:
    """Decoupled PPO's importance weight w = pi_prox / pi_behav per token (AReaL, arXiv 2505.24298).

    Asynchronous rollouts are sampled by a behaviour policy some versions behind the learner. The
    decoupled objective takes the clipped ratio against the proximal policy (the learner's own at
    the start of the update), so the trust region is centred where the learner is, not where a
    stale worker was; w corrects for the tokens having been drawn from the behaviour policy.
    A token with w > cap is dropped from the loss (weight 0, still counted in a token-mean's
    denominator), as AReaL's behav_imp_weight_cap does, rather than clipped to the cap: a token
    that much likelier under the learner than under the policy that sampled it is a rare draw
    whose weight would be mostly variance. cap None: no truncation; otherwise cap > 1.

    Returns (all detached) {"weights": w like the inputs, 0 on masked and dropped tokens,
    "kept": bool mask of the tokens that count with their weight, "imp_weight_mean": mean w over
    the kept tokens (1 when none), "imp_weight_truncated": share of counted tokens dropped}.
    """
    _same_shape(proximal_log_probs=proximal_log_probs, behaviour_log_probs=behaviour_log_probs)
    if cap is not None and cap <= 1.0:
        raise LossError(f"imp_weight_cap must be > 1 (w = 1 is on-policy data), got {cap!r}")
    m = _mask_for(proximal_log_probs, mask)
    log_w = torch.where(m, proximal_log_probs - behaviour_log_probs, 0.0).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    w = torch.exp(log_w)
    kept = m if cap is None else m & (w <= cap)
    n_kept = kept.sum()
    return {"weights": torch.where(kept, w, 0.0), "kept": kept,
            "imp_weight_mean": torch.where(kept, w, 0.0).sum() / n_kept if n_kept > 0 else torch.ones(()),
            "imp_weight_truncated": (m & ~kept).sum() / m.sum().clamp(min=1)}


def ppo_policy_loss(log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor, mask: Tensor | None = None, *,
                    clip_low: float = 0.2, clip_high: float = 0.28, clip_ratio_c: float | None = None,
                    reduction: str = "token-mean", behaviour_log_probs: Tensor | None = None,
                    imp_weight_cap: float | None = None) -> dict[str, Tensor]:
    """PPO's clipped surrogate with clip-higher and optional dual clip; per-token inputs [N] or [B, T].

    ratio = exp(log_probs - old_log_probs), clipped to [1 - clip_low, 1 + clip_high]. A larger upper
    bound (clip-higher, DAPO) lets a low-probability token with positive advantage grow further
    in one update, which keeps entropy from collapsing; the lower bound stays tight.
    Dual clip (verl, clip_ratio_c > 1, e.g. 3): for negative advantages the per-token loss is
    bounded by -A * c, so a bad token whose ratio has already exploded cannot dominate the batch.
    With behaviour_log_probs (the log-probs the rollout sampled with), old_log_probs are the
    proximal policy's and each token's clipped loss is multiplied by behaviour_weights' w, tokens
    with w > imp_weight_cap dropped (the decoupled objective of AReaL).

    Returns {"loss": scalar with grad ([N] / [B, T] for reduction "none"), "clipfrac": share of
    counted tokens where the clip is active (their gradient is zero), "clipfrac_dual": share
    bounded by the dual clip, "approx_kl": k3 KL(old || new), "ratio_mean"}, with behaviour
    log-probs also "imp_weight_mean" and "imp_weight_truncated"; all but "loss" are detached.
    """
    _same_shape(log_probs=log_probs, old_log_probs=old_log_probs, advantages=advantages)
    if not 0.0 <= clip_low < 1.0:
        raise LossError(f"clip_low must be in [0, 1), got {clip_low!r}")
    if clip_high < 0.0:
        raise LossError(f"clip_high must be >= 0, got {clip_high!r}")
    if clip_ratio_c is not None and clip_ratio_c <= 1.0:
        raise LossError(f"clip_ratio_c (dual clip) must be > 1, got {clip_ratio_c!r}")
    m = _mask_for(log_probs, mask)
    # Junk (inf, NaN) in the targets of masked tokens would turn their zero gradient into NaN.
    adv = torch.where(m, advantages.detach(), 0.0)
    log_ratio = _log_ratio(log_probs, torch.where(m, old_log_probs.detach(), 0.0))
    ratio = torch.exp(log_ratio)
    loss_unclipped = -adv * ratio
    loss_clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    # Pessimistic (upper) bound of the two; where the clipped branch wins, its gradient is zero.
    loss = torch.maximum(loss_unclipped, loss_clipped)
    clipped = loss_clipped > loss_unclipped
    dual = torch.zeros_like(clipped)
    if clip_ratio_c is not None:
        bound = -adv * clip_ratio_c
        dual = (adv < 0) & (loss > bound)
        loss = torch.where(dual, bound, loss)
    imp = {}
    if behaviour_log_probs is not None:
        _same_shape(log_probs=log_probs, behaviour_log_probs=behaviour_log_probs)
        imp = behaviour_weights(old_log_probs, behaviour_log_probs, m, cap=imp_weight_cap)
        loss = loss * imp.pop("weights")
        imp.pop("kept")
    with torch.no_grad():
        metrics = {
            "clipfrac": masked_mean(clipped.float(), m),
            "clipfrac_dual": masked_mean(dual.float(), m),
            "approx_kl": masked_mean(kl_estimate(old_log_probs, log_probs, "k3"), m),
            "ratio_mean": masked_mean(ratio, m),
        }
    return {"loss": aggregate(loss, m, reduction), **metrics, **imp}


@torch.no_grad()
def clipfrac(log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor, mask: Tensor | None = None, *,
             clip_low: float = 0.2, clip_high: float = 0.28) -> Tensor:
    """Share of counted tokens whose clipped branch is active (no gradient), as in verl.
    (CleanRL counts |ratio - 1| > eps whatever the advantage's sign; that also counts tokens the
    clip does not stop, e.g. a ratio below 1 - eps with a positive advantage.)"""
    _same_shape(log_probs=log_probs, old_log_probs=old_log_probs, advantages=advantages)
    ratio = torch.exp(_log_ratio(log_probs, old_log_probs))
    active = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high) > -advantages * ratio
    return masked_mean(active.float(), _mask_for(log_probs, mask))


def value_loss(values: Tensor, returns: Tensor, old_values: Tensor | None = None, mask: Tensor | None = None, *,
               clip: float | None = None, reduction: str = "token-mean") -> Tensor:
    """0.5 * (V - R)^2, or with `clip` the pessimistic 0.5 * max((V - R)^2, (V_clip - R)^2) where
    V_clip = old + clamp(V - old, -clip, clip) keeps the critic near the values the advantages
    were computed from. values, returns, old_values: [N] or [B, T]. Returns a scalar with grad."""
    _same_shape(values=values, returns=returns)
    m = _mask_for(values, mask)
    ret = torch.where(m, returns.detach(), 0.0)  # junk on masked tokens must not make NaN gradients
    loss = (values - ret) ** 2
    if clip is not None:
        if old_values is None:
            raise LossError("value clipping needs old_values (the values the returns were computed with)")
        if clip <= 0:
            raise LossError(f"value clip must be > 0, got {clip!r}")
        _same_shape(values=values, old_values=old_values)
        old = torch.where(m, old_values.detach(), 0.0)
        v_clip = old + (values - old).clamp(-clip, clip)
        loss = torch.maximum(loss, (v_clip - ret) ** 2)
    return 0.5 * aggregate(loss, m, reduction)


@torch.no_grad()
def value_clipfrac(values: Tensor, returns: Tensor, old_values: Tensor, mask: Tensor | None = None, *,
                   clip: float) -> Tensor:
    """Share of counted tokens where the clipped value term is the larger (no gradient there)."""
    _same_shape(values=values, returns=returns, old_values=old_values)
    v_clip = old_values + (values - old_values).clamp(-clip, clip)
    active = (v_clip - returns) ** 2 > (values - returns) ** 2
    return masked_mean(active.float(), _mask_for(values, mask))


def kl_estimate(log_q: Tensor, log_p: Tensor, kind: str = "k3") -> Tensor:
    """Per-token estimate of KL(q || p) from tokens sampled from q (Schulman, "Approximating KL
    divergence"), with log r = log_p - log_q:
    k1 = -log r (unbiased, high variance, can be negative); k2 = (log r)^2 / 2 (biased, low
    variance); k3 = (r - 1) - log r (unbiased, low variance, never negative).
    For a KL-to-reference penalty pass (current, reference) log-probs of the sampled tokens."""
    _same_shape(log_q=log_q, log_p=log_p)
    log_r = (log_p - log_q).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    if kind == "k1":
        return -log_r
    if kind == "k2":
        return 0.5 * log_r**2
    if kind == "k3":
        return torch.exp(log_r) - 1.0 - log_r
    raise LossError(f"kind must be 'k1', 'k2' or 'k3', got {kind!r}")


@torch.no_grad()
def approx_kl(log_probs: Tensor, old_log_probs: Tensor, mask: Tensor | None = None, kind: str = "k3") -> Tensor:
    """How far the policy moved: KL(old || new) over the counted tokens, which were sampled from
    the old policy (CleanRL logs k1 as old_approx_kl and k3 as approx_kl). Detached scalar."""
    return masked_mean(kl_estimate(old_log_probs, log_probs, kind), _mask_for(log_probs, mask))


@torch.no_grad()
def explained_variance(values: Tensor, returns: Tensor, mask: Tensor | None = None) -> Tensor:
    """1 - Var(returns - values) / Var(returns) over the counted tokens: 1 is a perfect critic,
    0 no better than a constant, negative worse. NaN when the returns do not vary (undefined)."""
    _same_shape(values=values, returns=returns)
    m = _mask_for(values, mask)
    v, r = values.float()[m], returns.float()[m]
    if r.numel() == 0:
        return torch.tensor(float("nan"))
    var = r.var(unbiased=False)
    if var == 0:
        return torch.tensor(float("nan"))
    return 1.0 - (r - v).var(unbiased=False) / var
