"""The decoupled PPO objective (off-policy correction for asynchronous rollouts, as in AReaL):
behaviour importance weights and the loss against hand-computed numbers, and real torch steps
showing that stale data cannot push the policy past the clip."""
from __future__ import annotations

import math

import pytest
import torch

from trainer.rl import losses as L


def approx(xs, abs=1e-5):
    return pytest.approx(xs, abs=abs)


def test_behaviour_weights_hand_computed():
    prox = torch.log(torch.tensor([0.5, 0.2, 0.3, 0.1]))
    behav = torch.log(torch.tensor([0.5, 0.4, 0.1, 0.02]))  # w = pi_prox / pi_behav = [1, 0.5, 3, 5]
    out = L.behaviour_weights(prox, behav, cap=2.0)
    assert out["weights"].tolist() == approx([1.0, 0.5, 0.0, 0.0])  # above the cap: dropped, not clipped to 2
    assert out["kept"].tolist() == [True, True, False, False]
    assert float(out["imp_weight_mean"]) == pytest.approx(0.75)  # over the kept tokens
    assert float(out["imp_weight_truncated"]) == pytest.approx(0.5)
    masked = L.behaviour_weights(prox, behav, torch.tensor([False, True, True, True]), cap=2.0)
    assert masked["weights"].tolist() == approx([0.0, 0.5, 0.0, 0.0])
    assert float(masked["imp_weight_mean"]) == pytest.approx(0.5)
    assert float(masked["imp_weight_truncated"]) == pytest.approx(2 / 3)
    free = L.behaviour_weights(prox, behav, cap=None)
    assert float(free["imp_weight_mean"]) == pytest.approx(9.5 / 4) and float(free["imp_weight_truncated"]) == 0.0
    with pytest.raises(L.LossError, match="imp_weight_cap must be > 1"):
        L.behaviour_weights(prox, behav, cap=1.0)


def test_decoupled_policy_loss_hand_computed():
    """Ratio against the proximal policy, loss times w = pi_prox / pi_behav, w > cap dropped."""
    prox = torch.log(torch.tensor([0.5, 0.2, 0.3, 0.1]))
    behav = torch.log(torch.tensor([0.5, 0.4, 0.1, 0.02]))  # w = [1, 0.5, 3, 5]
    ratios = torch.tensor([1.1, 1.5, 0.5, 1.0])
    adv = torch.tensor([1.0, 1.0, -1.0, 1.0])
    lp = (prox + torch.log(ratios)).requires_grad_()
    out = L.ppo_policy_loss(lp, prox, adv, reduction="none", behaviour_log_probs=behav, imp_weight_cap=2.0)
    # token 1: clipped at 1.28, times w 0.5; tokens 2 and 3: w above the cap, dropped
    assert out["loss"].tolist() == approx([-1.1, -0.64, 0.0, 0.0])
    assert float(out["imp_weight_mean"]) == pytest.approx(0.75) and float(out["imp_weight_truncated"]) == 0.5
    mean = L.ppo_policy_loss(lp, prox, adv, behaviour_log_probs=behav, imp_weight_cap=2.0)["loss"]
    assert mean.item() == pytest.approx(-1.74 / 4)  # the token-mean still counts the dropped tokens
    mean.backward()
    assert lp.grad.tolist() == approx([-1.1 / 4, 0.0, 0.0, 0.0])
    # on-policy data (behaviour = proximal) is plain PPO
    plain = L.ppo_policy_loss(prox + torch.log(ratios), prox, adv)["loss"]
    same = L.ppo_policy_loss(prox + torch.log(ratios), prox, adv, behaviour_log_probs=prox.clone(), imp_weight_cap=2.0)
    assert same["loss"].item() == pytest.approx(plain.item()) and float(same["imp_weight_mean"]) == 1.0


def test_stale_data_with_a_flipped_advantage_cannot_push_the_ratio_past_the_clip():
    """A stale worker liked token 2 e^2 times more than the learner does now, and its advantage is
    positive. Clipping against the behaviour policy (plain PPO on stale data) starts at ratio e^-2,
    far under the clip, so SGD pushes the token up until it is ~5x likelier than the proximal
    policy; the decoupled loss clips against the proximal policy and stops at 1 + eps_high."""
    torch.manual_seed(0)

    def train(decoupled: bool) -> tuple[float, float]:
        logits = torch.zeros(5, requires_grad=True)
        prox = torch.log_softmax(logits.detach(), -1)[2:3]
        behav = prox + 2.0  # w = e^-2, under the cap
        opt = torch.optim.SGD([logits], lr=0.5)
        for _ in range(300):
            opt.zero_grad()
            lp = torch.log_softmax(logits, -1)[2:3]
            if decoupled:
                out = L.ppo_policy_loss(lp, prox, torch.ones(1), behaviour_log_probs=behav, imp_weight_cap=2.0)
            else:
                out = L.ppo_policy_loss(lp, behav, torch.ones(1))
            out["loss"].backward()
            opt.step()
        return torch.exp(torch.log_softmax(logits, -1)[2] - prox[0]).item(), float(logits.grad.abs().max())

    ratio, grad = train(decoupled=True)
    assert 1.28 <= ratio < 1.4 and grad == 0.0  # one small step past the clip at most, then no gradient
    stale_ratio, _ = train(decoupled=False)
    assert stale_ratio > 3.0


def test_a_token_whose_weight_passes_the_cap_gets_no_gradient():
    prox = torch.log(torch.tensor([0.2, 0.2]))
    behav = prox - torch.tensor([1.0, 0.5])  # w = [e, e^0.5]: the first passes the cap of 2
    lp = prox.clone().requires_grad_()
    out = L.ppo_policy_loss(lp, prox, torch.ones(2), reduction="sum", behaviour_log_probs=behav, imp_weight_cap=2.0)
    out["loss"].backward()
    assert lp.grad.tolist() == approx([0.0, -math.exp(0.5)])  # ratio 1: d(-A r w)/d log r = -w
    assert float(out["imp_weight_truncated"]) == 0.5 and float(out["imp_weight_mean"]) == pytest.approx(math.exp(0.5))
    lp.grad = None
    L.ppo_policy_loss(lp, prox, torch.ones(2), reduction="sum", behaviour_log_probs=behav, imp_weight_cap=3.0)["loss"].backward()
    assert lp.grad.tolist() == approx([-math.e, -math.exp(0.5)])  # a higher cap keeps it, at its full weight


