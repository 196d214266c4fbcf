"""The PPO math (trainer.rl) against plain Python loops and hand-computed numbers, plus real
torch optimisation steps where the claim is about gradients."""
from __future__ import annotations

import math
import random

import pytest
import torch

from trainer.rl import gae as G
from trainer.rl import losses as L
from trainer.rl import rewards as R


def ref_gae(rewards, values, gamma, lam, last_value, terminated):
    """The textbook loop over one chain of generated tokens, written independently of the module."""
    T = len(rewards)
    adv = [0.0] * T
    running = 0.0
    for t in reversed(range(T)):
        nv = values[t + 1] if t + 1 < T else (0.0 if terminated else last_value)
        delta = rewards[t] + gamma * nv - values[t]
        running = delta + gamma * lam * running
        adv[t] = running
    return adv


def approx(xs, abs=1e-5):
    return pytest.approx(xs, abs=abs)


# ------------------------------------------------------------------ GAE: hand-computed


def test_gamma_one_lambda_one_is_reward_to_go_minus_value():
    adv, ret = G.gae(torch.tensor([0.0, 0.0, 1.0]), torch.tensor([0.2, 0.5, 0.9]))
    assert adv.tolist() == approx([0.8, 0.5, 0.1])
    assert ret.tolist() == approx([1.0, 1.0, 1.0])


def test_lambda_zero_is_td0():
    adv, _ = G.gae(torch.tensor([1.0, 2.0]), torch.tensor([0.5, 0.25]), gamma=0.9, lam=0.0)
    assert adv.tolist() == approx([1.0 + 0.9 * 0.25 - 0.5, 2.0 - 0.25])


def test_hand_computed_gamma_and_lambda_half():
    # r = [1, 0, 2], V = [0, 1, 1], gamma = lam = 0.5, terminated
    # delta2 = 2 - 1 = 1;  delta1 = 0 + .5*1 - 1 = -.5;  delta0 = 1 + .5*1 - 0 = 1.5
    # A2 = 1;  A1 = -.5 + .25*1 = -.25;  A0 = 1.5 + .25*(-.25) = 1.4375
    adv, ret = G.gae(torch.tensor([1.0, 0.0, 2.0]), torch.tensor([0.0, 1.0, 1.0]), gamma=0.5, lam=0.5)
    assert adv.tolist() == approx([1.4375, -0.25, 1.0])
    assert ret.tolist() == approx([1.4375, 0.75, 2.0])


def test_truncated_and_terminated_differ_exactly_by_the_bootstrap():
    r, v = torch.tensor([0.0, 0.5, 0.0]), torch.tensor([0.1, 0.2, 0.3])
    gamma, lam, boot = 0.9, 0.8, 0.7
    a_term, _ = G.gae(r, v, gamma=gamma, lam=lam, last_value=boot, terminated=True)
    a_trunc, _ = G.gae(r, v, gamma=gamma, lam=lam, last_value=boot, terminated=False)
    # gamma * V(next) enters the last delta and is discounted by (gamma * lam) per step back
    expected = [gamma * boot * (gamma * lam) ** (2 - t) for t in range(3)]
    assert (a_trunc - a_term).tolist() == approx(expected)
    # a terminated trajectory ignores last_value entirely
    a_term2, _ = G.gae(r, v, gamma=gamma, lam=lam, last_value=123.0, terminated=True)
    assert torch.equal(a_term, a_term2)


def test_truncation_bootstrap_counts_generated_tokens_only():
    # generated tokens at 1, 2 and 5; observation tokens between turns do not discount
    mask = torch.tensor([0, 1, 1, 0, 0, 1, 0], dtype=torch.bool)
    r, v = torch.zeros(7), torch.tensor([0.0, 0.1, 0.2, 0.0, 0.0, 0.3, 0.0])
    gamma, lam, boot = 0.9, 0.5, 2.0
    a_term, _ = G.gae(r, v, mask, gamma=gamma, lam=lam, last_value=boot, terminated=True)
    a_trunc, _ = G.gae(r, v, mask, gamma=gamma, lam=lam, last_value=boot, terminated=False)
    diff = (a_trunc - a_term).tolist()
    g = gamma * boot
    assert diff == approx([0, g * (gamma * lam) ** 2, g * (gamma * lam), 0, 0, g, 0])


def test_masked_tokens_get_zero_and_do_not_break_the_chain():
    # [prompt, gen, gen, obs, obs, gen, gen]: the next value of token 2 is V at token 5
    mask = torch.tensor([0, 1, 1, 0, 0, 1, 1], dtype=torch.bool)
    values = torch.tensor([9.0, 0.1, 0.2, 9.0, 9.0, 0.3, 0.4])  # 9s are the critic's junk on obs tokens
    rewards = torch.tensor([0.0, 0.0, 0.5, 0.0, 0.0, 0.0, 1.0])
    adv, ret = G.gae(rewards, values, mask, gamma=0.95, lam=0.9)
    compact_adv, compact_ret = G.gae(rewards[mask], values[mask], gamma=0.95, lam=0.9)
    assert adv[mask].tolist() == approx(compact_adv.tolist())
    assert ret[mask].tolist() == approx(compact_ret.tolist())
    assert (adv[~mask] == 0).all() and (ret[~mask] == 0).all()
    # token 2's delta uses V(5) = 0.3, not the junk at token 3
    a2_expected = 0.5 + 0.95 * 0.3 - 0.2 + 0.95 * 0.9 * float(compact_adv[2])
    assert float(adv[2]) == pytest.approx(a2_expected, abs=1e-6)


# ------------------------------------------------------------------ GAE: against the loop


@pytest.mark.parametrize("seed", range(10))
def test_gae_matches_reference_loop(seed):
    rng = random.Random(seed)
    T = rng.randint(1, 30)
    r = [rng.uniform(-1, 1) for _ in range(T)]
    v = [rng.uniform(-1, 1) for _ in range(T)]
    gamma, lam, last, term = rng.uniform(0.8, 1), rng.uniform(0, 1), rng.uniform(-1, 1), rng.random() < 0.5
    adv, ret = G.gae(torch.tensor(r), torch.tensor(v), gamma=gamma, lam=lam, last_value=last, terminated=term)
    ref = ref_gae(r, v, gamma, lam, last, term)
    assert adv.tolist() == approx(ref)
    assert ret.tolist() == approx([a + b for a, b in zip(ref, v, strict=True)])


@pytest.mark.parametrize("seed", range(6))
def test_batched_masked_gae_matches_loop_over_generated_tokens(seed):
    rng = random.Random(seed)
    torch.manual_seed(seed)
    B, T = 4, 25
    values = torch.randn(B, T)
    mask = torch.tensor([[rng.random() < 0.6 for _ in range(T)] for _ in range(B)])
    mask[3] = False  # a row of pure padding
    rewards = torch.where(mask, torch.rand(B, T) * 2 - 1, torch.zeros(B, T))
    lams = torch.tensor([rng.uniform(0.5, 1) for _ in range(B)])
    last = torch.randn(B)
    term = torch.tensor([True, False, rng.random() < 0.5, False])
    adv, ret = G.gae(rewards, values, mask, gamma=0.95, lam=lams, last_value=last, terminated=term)
    for b in range(B):
        idx = mask[b].nonzero().flatten()
        ref = ref_gae(rewards[b, idx].tolist(), values[b, idx].tolist(), 0.95, float(lams[b]), float(last[b]),
                      bool(term[b]))
        assert adv[b, idx].tolist() == approx(ref)
        assert ret[b, idx].tolist() == approx([a + x for a, x in zip(ref, values[b, idx].tolist(), strict=True)])
        assert (adv[b, ~mask[b]] == 0).all() and (ret[b, ~mask[b]] == 0).all()
        # the batch is exactly the rows one by one
        a1, _ = G.gae(rewards[b], values[b], mask[b], gamma=0.95, lam=float(lams[b]), last_value=float(last[b]),
                      terminated=bool(term[b]))
        assert torch.allclose(a1, adv[b], atol=1e-6)


def test_gae_outputs_are_targets_without_graph():
    v = torch.tensor([0.1, 0.2], requires_grad=True)
    adv, ret = G.gae(torch.tensor([0.0, 1.0]), v)
    assert not adv.requires_grad and not ret.requires_grad


def test_gae_rejects_bad_input_with_a_clear_message():
    r, v = torch.zeros(3), torch.zeros(3)
    with pytest.raises(G.GAEError, match="same shape"):
        G.gae(r, torch.zeros(4))
    with pytest.raises(G.GAEError, match="masked"):
        G.gae(torch.tensor([1.0, 0.0, 0.0]), v, torch.tensor([0, 1, 1]))
    with pytest.raises(G.GAEError, match="mask"):
        G.gae(r, v, torch.ones(4))
    with pytest.raises(G.GAEError, match="lam"):
        G.gae(r, v, lam=1.5)
    with pytest.raises(G.GAEError, match="gamma"):
        G.gae(r, v, gamma=-0.1)
    with pytest.raises(G.GAEError, match="NaN"):
        G.gae(torch.tensor([0.0, float("nan"), 0.0]), v)
    with pytest.raises(G.GAEError, match=r"last_value must be a scalar or have shape \[2\]"):
        G.gae(torch.zeros(2, 3), torch.zeros(2, 3), last_value=torch.zeros(3))
    with pytest.raises(G.GAEError, match="last_value must be finite"):
        G.gae(r, v, last_value=float("nan"), terminated=False)
    with pytest.raises(G.GAEError, match=r"\[T\] or \[B, T\]"):
        G.gae(torch.zeros(1, 2, 3), torch.zeros(1, 2, 3))
    # NaN bootstrap is fine where the trajectory terminated (it is never read)
    adv, _ = G.gae(r, v, last_value=float("nan"), terminated=True)
    assert torch.isfinite(adv).all()


# ------------------------------------------------------------------ decoupled and adaptive lambda


def test_adaptive_lambda_formula_and_clamp():
    assert G.adaptive_lambda(1000, 0.05) == pytest.approx(0.98)
    assert G.adaptive_lambda(400, 0.05) == pytest.approx(0.95)
    assert G.adaptive_lambda(100, 0.05) == G.LAMBDA_MIN  # 1 - 1/5 = 0.8 < floor 0.9
    assert G.adaptive_lambda(100, 0.05, lam_min=0.0) == pytest.approx(0.8)
    assert G.adaptive_lambda(5, 0.05) == G.LAMBDA_MIN  # 1 - 1/0.25 = -3
    assert G.adaptive_lambda(0) == G.LAMBDA_MIN
    assert G.adaptive_lambda(10**9, 0.05) == G.LAMBDA_MAX
    per_seq = G.adaptive_lambda(torch.tensor([0, 100, 400, 1000]), 0.05)
    assert per_seq.tolist() == approx([0.9, 0.9, 0.95, 0.98])
    # monotone: longer trajectories never get a smaller lambda
    lams = [G.adaptive_lambda(n) for n in range(1, 3000, 37)]
    assert lams == sorted(lams)
    with pytest.raises(G.GAEError, match="alpha"):
        G.adaptive_lambda(10, alpha=0.0)
    with pytest.raises(G.GAEError, match="length"):
        G.adaptive_lambda(-1)
    with pytest.raises(G.GAEError, match="lam_min"):
        G.adaptive_lambda(10, lam_min=0.99, lam_max=0.9)


def test_decoupled_gae_uses_lambda_one_for_returns_and_adaptive_for_advantages():
    r = G.place_turn_rewards([0.0, 1.0], [3, 2])
    assert r.tolist() == [0, 0, 0, 0, 1]
    v = torch.tensor([0.1, 0.3, 0.2, 0.6, 0.4])
    adv, ret = G.decoupled_gae(r, v, lam_policy=0.5)
    assert ret.tolist() == approx([1.0] * 5)  # lambda = 1, gamma = 1: Monte-Carlo returns
    assert adv.tolist() == approx(ref_gae(r.tolist(), v.tolist(), 1.0, 0.5, 0.0, True))
    assert not torch.allclose(adv, ret - v)
    # None: the length-adaptive lambda of this 5-token trajectory
    adv_auto, _ = G.decoupled_gae(r, v, alpha=0.05)
    assert adv_auto.tolist() == approx(ref_gae(r.tolist(), v.tolist(), 1.0, G.adaptive_lambda(5, 0.05), 0.0, True))


def test_decoupled_gae_gives_each_sequence_its_own_lambda():
    torch.manual_seed(0)
    B, T = 2, 300
    mask = torch.zeros(B, T, dtype=torch.bool)
    mask[0, :250] = True  # 250 generated tokens -> lambda 0.92
    mask[1, :40] = True  # 40 -> floor 0.9
    values = torch.where(mask, torch.randn(B, T), torch.zeros(B, T))
    rewards = torch.zeros(B, T)
    rewards[0, 249], rewards[1, 39] = 1.0, -1.0
    adv, ret = G.decoupled_gae(rewards, values, mask, gamma=0.99, alpha=0.05, last_value=torch.tensor([0.0, 0.5]),
                               terminated=torch.tensor([True, False]))
    for b, (n, lam, last, term) in enumerate([(250, 0.92, 0.0, True), (40, 0.9, 0.5, False)]):
        vb, rb = values[b, :n].tolist(), rewards[b, :n].tolist()
        assert adv[b, :n].tolist() == approx(ref_gae(rb, vb, 0.99, lam, last, term), abs=1e-4)
        assert ret[b, :n].tolist() == approx([a + x for a, x in zip(ref_gae(rb, vb, 0.99, 1.0, last, term), vb, strict=True)],
                                             abs=1e-4)


# ------------------------------------------------------------------ placing turn rewards


def test_place_turn_rewards_and_errors():
    assert G.place_turn_rewards([0.5, -1.0, 2.0], [1, 3, 2]).tolist() == [0.5, 0, 0, -1.0, 0, 2.0]
    assert G.place_turn_rewards([], []).tolist() == []
    with pytest.raises(G.GAEError, match="2 turn rewards for 3 turns"):
        G.place_turn_rewards([1.0, 2.0], [1, 2, 3])
    with pytest.raises(G.GAEError, match="turn 1 has 0 generated tokens"):
        G.place_turn_rewards([1.0, 0.0], [1, 0])


def test_rewards_from_mask_puts_each_reward_on_the_last_token_of_its_turn():
    mask = torch.tensor([0, 0, 1, 1, 1, 0, 0, 1, 0, 1, 1])
    assert G.turn_spans(mask) == [(2, 5), (7, 8), (9, 11)]
    r = G.rewards_from_mask([0.1, 0.2, 0.3], mask)
    assert r.tolist() == approx([0, 0, 0, 0, 0.1, 0, 0, 0.2, 0, 0, 0.3])
    with pytest.raises(G.GAEError, match="2 turn rewards but the mask has 3 runs"):
        G.rewards_from_mask([0.1, 0.2], mask)
    with pytest.raises(G.GAEError, match=r"\[T\]"):
        G.turn_spans(torch.ones(2, 3))


def test_interleaved_layout_equals_concatenated_generated_tokens():
    """Two layouts of the same episode: the full sequence with prompts and observations, and the
    generated tokens alone (what the learner concatenates). Same advantages on the same tokens."""
    lengths, turn_r = [4, 2, 3], [0.0, -0.1, 1.0]
    mask = torch.tensor([0, 0, 1, 1, 1, 1, 0, 0, 0, 1, 1, 0, 1, 1, 1], dtype=torch.bool)
    torch.manual_seed(1)
    full_values = torch.randn(15)
    full = G.decoupled_gae(G.rewards_from_mask(turn_r, mask), full_values, mask, gamma=0.99, lam_policy=0.95,
                           last_value=0.3, terminated=False)
    compact = G.decoupled_gae(G.place_turn_rewards(turn_r, lengths), full_values[mask], gamma=0.99, lam_policy=0.95,
                              last_value=0.3, terminated=False)
    for a, b in zip(full, compact, strict=True):
        assert a[mask].tolist() == approx(b.tolist())


# ------------------------------------------------------------------ policy loss


def test_clip_higher_asymmetry_for_positive_advantages():
    adv, old = torch.ones(3), torch.zeros(3)
    ratios = torch.tensor([1.1, 1.25, 1.5])  # inside 1+eps_low, between 1+eps_low and 1+eps_high, beyond
    logp = torch.log(ratios).requires_grad_()
    out = L.ppo_policy_loss(logp, old, adv, clip_low=0.2, clip_high=0.28, reduction="sum")
    assert out["loss"].item() == pytest.approx(-(1.1 + 1.25 + 1.28))
    assert float(out["clipfrac"]) == pytest.approx(1 / 3)
    out["loss"].backward()
    # d(-A r)/d log r = -A r: the 1.25 token still learns, the 1.5 token does not
    assert logp.grad.tolist() == approx([-1.1, -1.25, 0.0])
    sym = L.ppo_policy_loss(torch.log(ratios), old, adv, clip_low=0.2, clip_high=0.2, reduction="sum")
    assert sym["loss"].item() == pytest.approx(-(1.1 + 1.2 + 1.2))
    assert float(sym["clipfrac"]) == pytest.approx(2 / 3)


def test_negative_advantages_clip_below_and_not_above():
    adv = torch.full((3,), -1.0)
    ratios = torch.tensor([0.5, 0.9, 1.5])
    logp = torch.log(ratios).requires_grad_()
    out = L.ppo_policy_loss(logp, torch.zeros(3), adv, reduction="sum")
    # 0.5 < 1 - eps_low: clipped at 0.8 (no push further down); 1.5 is not clipped (pessimistic)
    assert out["loss"].item() == pytest.approx(0.8 + 0.9 + 1.5)
    out["loss"].backward()
    assert logp.grad.tolist() == approx([0.0, 0.9, 1.5])
    # a positive advantage with a ratio below 1 - eps_low is not clipped: it may climb back
    up = L.ppo_policy_loss(torch.log(torch.tensor([0.5])), torch.zeros(1), torch.ones(1), reduction="sum")
    assert up["loss"].item() == pytest.approx(-0.5) and float(up["clipfrac"]) == 0.0


def test_dual_clip_bounds_the_loss_for_negative_advantages():
    adv = torch.tensor([-2.0, -2.0, -2.0, 2.0])
    ratios = torch.tensor([10.0, 2.0, 0.5, 10.0])
    logp = torch.log(ratios).requires_grad_()
    plain = L.ppo_policy_loss(logp, torch.zeros(4), adv, reduction="sum")
    assert plain["loss"].item() == pytest.approx(20.0 + 4.0 + 1.6 - 2.0 * 1.28)
    dual = L.ppo_policy_loss(logp, torch.zeros(4), adv, clip_ratio_c=3.0, reduction="sum")
    # only the exploded negative-advantage token is bounded, at -A * c = 6
    assert dual["loss"].item() == pytest.approx(6.0 + 4.0 + 1.6 - 2.0 * 1.28)
    assert float(dual["clipfrac_dual"]) == pytest.approx(1 / 4)
    dual["loss"].backward()
    assert logp.grad.tolist() == approx([0.0, 4.0, 0.0, 0.0])
    with pytest.raises(L.LossError, match="clip_ratio_c"):
        L.ppo_policy_loss(logp, torch.zeros(4), adv, clip_ratio_c=0.5)


def test_masked_tokens_do_not_contribute_to_loss_or_gradient():
    logp = torch.tensor([[math.log(1.1), 50.0, 0.0], [0.0, 0.0, 0.0]], requires_grad=True)
    old = torch.zeros(2, 3)
    adv = torch.tensor([[1.0, float("inf"), 3.0], [2.0, -1.0, 7.0]])
    mask = torch.tensor([[1, 0, 1], [1, 1, 0]], dtype=torch.bool)
    out = L.ppo_policy_loss(logp, old, adv, mask)
    # token mean over the 4 counted tokens: -(1*1.1) - 3 - 2 + 1
    assert out["loss"].item() == pytest.approx((-1.1 - 3.0 - 2.0 + 1.0) / 4)
    out["loss"].backward()
    assert logp.grad[~mask].tolist() == [0.0, 0.0]
    assert logp.grad[0, 0] == pytest.approx(-1.1 / 4) and logp.grad[1, 1] == pytest.approx(1.0 / 4)
    assert float(out["clipfrac"]) == 0.0 and torch.isfinite(out["ratio_mean"])


def test_junk_targets_on_masked_tokens_leave_gradients_finite():
    mask = torch.tensor([True, False, False])
    lp = torch.zeros(3, requires_grad=True)
    adv = torch.tensor([1.0, float("inf"), float("nan")])
    old = torch.tensor([0.0, float("nan"), float("-inf")])
    out = L.ppo_policy_loss(lp, old, adv, mask, clip_ratio_c=3.0)
    out["loss"].backward()
    assert out["loss"].item() == pytest.approx(-1.0) and lp.grad.tolist() == [-1.0, 0.0, 0.0]
    v = torch.zeros(3, requires_grad=True)
    loss = L.value_loss(v, torch.tensor([1.0, float("nan"), float("inf")]), old, mask, clip=0.2)
    loss.backward()
    assert loss.item() == pytest.approx(0.5) and v.grad.tolist() == [-1.0, 0.0, 0.0]


def test_token_mean_seq_mean_and_sum():
    per_token = torch.tensor([[1.0, 1.0, 1.0, 1.0], [3.0, 0.0, 0.0, 0.0], [5.0, 5.0, 5.0, 5.0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0], [0, 0, 0, 0]], dtype=torch.bool)
    zero = torch.zeros(3, 4)
    kw = dict(mask=mask, clip_low=0.5, clip_high=10.0)
    # with ratio 1 the per-token loss is -A
    assert float(L.ppo_policy_loss(zero, zero, -per_token, **kw)["loss"]) == pytest.approx(7 / 5)
    assert float(L.ppo_policy_loss(zero, zero, -per_token, reduction="seq-mean", **kw)["loss"]) == pytest.approx(2.0)
    assert float(L.ppo_policy_loss(zero, zero, -per_token, reduction="sum", **kw)["loss"]) == pytest.approx(7.0)
    assert float(L.aggregate(per_token, torch.zeros(3, 4, dtype=torch.bool))) == 0.0
    none = L.ppo_policy_loss(zero, zero, -per_token, reduction="none", **kw)["loss"]
    assert none.tolist() == [[1.0, 1.0, 1.0, 1.0], [3.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]  # masked at 0
    with pytest.raises(L.LossError, match="seq-mean"):
        L.aggregate(torch.ones(3), reduction="seq-mean")
    with pytest.raises(L.LossError, match="reduction must be one of"):
        L.aggregate(torch.ones(3), reduction="mean")


def test_policy_loss_shape_errors_name_the_shapes():
    with pytest.raises(L.LossError, match="shapes differ"):
        L.ppo_policy_loss(torch.zeros(3), torch.zeros(3), torch.zeros(4))
    with pytest.raises(L.LossError, match="mask has shape"):
        L.ppo_policy_loss(torch.zeros(3), torch.zeros(3), torch.zeros(3), torch.ones(2))
    with pytest.raises(L.LossError, match="clip_low"):
        L.ppo_policy_loss(torch.zeros(3), torch.zeros(3), torch.zeros(3), clip_low=1.0)


def test_standalone_clipfrac_agrees_with_the_loss():
    torch.manual_seed(0)
    logp, old, adv = torch.randn(200) * 0.3, torch.zeros(200), torch.randn(200)
    mask = torch.rand(200) < 0.7
    out = L.ppo_policy_loss(logp, old, adv, mask)
    assert float(L.clipfrac(logp, old, adv, mask)) == pytest.approx(float(out["clipfrac"]))
    assert 0.0 < float(out["clipfrac"]) < 1.0


def test_real_steps_push_the_ratio_up_to_one_plus_eps_high_and_stop():
    """Positive advantage on a token: SGD on the clipped loss raises its probability until the
    ratio passes 1 + eps_high, after which the gradient is exactly zero and it stays put."""
    torch.manual_seed(0)
    logits = torch.zeros(5, requires_grad=True)
    old_lp = torch.log_softmax(logits.detach(), -1)[2:3]
    opt = torch.optim.SGD([logits], lr=0.05)
    for _ in range(200):
        opt.zero_grad()
        lp = torch.log_softmax(logits, -1)[2:3]
        L.ppo_policy_loss(lp, old_lp, torch.ones(1), clip_low=0.2, clip_high=0.28)["loss"].backward()
        opt.step()
    ratio = torch.exp(torch.log_softmax(logits, -1)[2] - old_lp[0]).item()
    assert 1.28 <= ratio < 1.30  # passed the upper clip by at most one small step
    assert logits.grad.abs().max() == 0.0


# ------------------------------------------------------------------ value loss


def test_value_loss_hand_computed():
    old = torch.tensor([0.5])
    # unclipped (1-0)^2 = 1; clipped 0.7 -> 0.49; max 1 -> 0.5
    assert float(L.value_loss(torch.tensor([1.0]), torch.tensor([0.0]), old, clip=0.2)) == pytest.approx(0.5)
    # unclipped (0.9-1)^2 = 0.01; clipped 0.7 -> 0.09: the pessimistic 0.09 -> 0.045
    assert float(L.value_loss(torch.tensor([0.9]), torch.tensor([1.0]), old, clip=0.2)) == pytest.approx(0.045)
    # without clipping: plain 0.5 * MSE, token-mean
    assert float(L.value_loss(torch.tensor([0.9, 0.0]), torch.tensor([1.0, 1.0]))) == pytest.approx(
        0.5 * (0.01 + 1.0) / 2)


def test_value_loss_gradient_and_mask():
    v = torch.tensor([0.9, 0.0, 5.0], requires_grad=True)
    ret, old = torch.tensor([1.0, 1.0, 0.0]), torch.tensor([0.5, 0.5, 0.0])
    mask = torch.tensor([True, True, False])
    loss = L.value_loss(v, ret, old, mask, clip=0.2, reduction="sum")
    assert loss.item() == pytest.approx(0.5 * (0.09 + 1.0))
    loss.backward()
    # token 0: the clipped term wins (no gradient); token 1: unclipped, d/dv 0.5(v-1)^2 = v-1 = -1
    assert v.grad.tolist() == approx([0.0, -1.0, 0.0])
    assert float(L.value_clipfrac(v.detach(), ret, old, mask, clip=0.2)) == pytest.approx(0.5)
    with pytest.raises(L.LossError, match="old_values"):
        L.value_loss(v, ret, clip=0.2)


def test_real_value_steps_fit_the_returns():
    torch.manual_seed(0)
    head = torch.nn.Linear(3, 1)
    x, ret = torch.randn(64, 3), torch.randn(64)
    opt = torch.optim.Adam(head.parameters(), lr=0.05)
    start = L.value_loss(head(x).squeeze(-1), ret).item()
    for _ in range(100):
        opt.zero_grad()
        L.value_loss(head(x).squeeze(-1), ret).backward()
        opt.step()
    v = head(x).squeeze(-1).detach()
    assert float(L.value_loss(v, ret)) < start
    ev = float(L.explained_variance(v, ret))
    # the least-squares linear fit: its explained variance is what a perfect optimiser reaches
    X = torch.cat([x, torch.ones(64, 1)], 1)
    best = X @ torch.linalg.lstsq(X, ret.unsqueeze(1)).solution.squeeze(1)
    assert ev == pytest.approx(float(L.explained_variance(best, ret)), abs=1e-3)


# ------------------------------------------------------------------ entropy, KL, explained variance


def test_kl_estimators_hand_computed():
    a = torch.tensor([-1.0, -2.0])
    assert float(L.approx_kl(a, a)) == 0.0
    b = a + torch.tensor([0.1, -0.1])  # new log-probs; log r = +-0.1
    k3 = ((math.exp(0.1) - 1 - 0.1) + (math.exp(-0.1) - 1 + 0.1)) / 2
    assert float(L.approx_kl(b, a)) == pytest.approx(k3)
    assert float(L.approx_kl(b, a, kind="k1")) == pytest.approx(0.0, abs=1e-6)  # -0.1 and +0.1 cancel
    assert float(L.approx_kl(b, a, kind="k2")) == pytest.approx(0.005)
    assert float(L.approx_kl(b, a, torch.tensor([True, False]), kind="k1")) == pytest.approx(-0.1)
    with pytest.raises(L.LossError, match="kind"):
        L.approx_kl(a, a, kind="k4")


def test_k3_estimates_the_true_kl_from_samples():
    torch.manual_seed(0)
    q_logits, p_logits = torch.randn(6), torch.randn(6) * 0.5
    log_q, log_p = torch.log_softmax(q_logits, -1), torch.log_softmax(p_logits, -1)
    true_kl = float((log_q.exp() * (log_q - log_p)).sum())
    x = torch.distributions.Categorical(logits=q_logits).sample((200_000,))
    for kind in ("k1", "k3"):  # both unbiased
        est = float(L.kl_estimate(log_q[x], log_p[x], kind).mean())
        assert est == pytest.approx(true_kl, rel=0.05)
    assert (L.kl_estimate(log_q[x], log_p[x], "k3") >= 0).all()


def test_explained_variance():
    t = torch.tensor([1.0, 2.0, 3.0])
    assert float(L.explained_variance(t, t)) == 1.0
    assert float(L.explained_variance(torch.full((3,), 2.0), t)) == pytest.approx(0.0)
    assert float(L.explained_variance(-t, t)) < 0
    assert math.isnan(float(L.explained_variance(t, torch.ones(3))))
    # masked: the junk token is left out
    v = torch.tensor([1.0, 2.0, 3.0, 100.0])
    r = torch.tensor([1.0, 2.0, 3.0, -100.0])
    assert float(L.explained_variance(v, r, torch.tensor([1, 1, 1, 0], dtype=torch.bool))) == 1.0


# ------------------------------------------------------------------ rewards

def test_shape_turn_reward():
    assert R.shape_turn_reward(1.0) == 1.0
    assert R.shape_turn_reward(1.0, parsed=False, format_penalty=0.2, step_penalty=0.05) == pytest.approx(0.75)
    with pytest.raises(R.RewardError, match="finite"):
        R.shape_turn_reward(float("nan"))


def test_progress_rewards_pay_each_subgoal_once_and_sum_to_the_final_progress():
    assert R.progress_rewards([0.0, 0.5, 0.5, 1.0]) == approx([0.0, 0.5, 0.0, 0.5])
    # undoing a subgoal costs what it earned: the sum is final minus start whatever the path
    gains = R.progress_rewards([1 / 3, 2 / 3, 1 / 3, 1.0])
    assert gains == approx([1 / 3, 1 / 3, -1 / 3, 2 / 3]) and sum(gains) == approx(1.0)
    assert R.progress_rewards([0.5], start=0.25) == approx([0.25])
    assert R.progress_rewards([]) == []
    with pytest.raises(R.RewardError, match="progress after turn 1 must be in"):
        R.progress_rewards([0.2, 1.5])


def test_ppo_turn_rewards_add_progress_shaping_and_the_format_penalty():
    from trainer.learn.ppo import PPOConfig, shaped_turn_rewards
    from trainer.rollout.pool import Trajectory, Turn

    turns = [Turn([], [5, 2], [-0.1, -0.1], "a", 0.0, None, 0.5),  # a subgoal met
             Turn([], [5, 2], [-0.1, -0.1], "junk", 0.0, "no 'Action:' section", 0.5),
             Turn([], [5, 2], [-0.1, -0.1], "b", 1.0, None, 1.0)]  # the task done
    tr = Trajectory(seed=1, family="check_boxes", instruction="x", turns=turns)
    assert shaped_turn_rewards(tr, PPOConfig(format_penalty=0.5)) == approx([0.0, -0.5, 1.0])
    assert shaped_turn_rewards(tr, PPOConfig(format_penalty=0.5, progress_reward=1.0)) == approx([0.5, -0.5, 1.5])
    tr.start_progress = 0.25  # subgoals that held before the first action earn nothing
    assert shaped_turn_rewards(tr, PPOConfig(format_penalty=0.5, progress_reward=2.0)) == approx([0.5, -0.5, 2.0])


def test_click_rewards_are_a_gaussian_of_the_distance_to_the_experts_click():
    sigma = 0.05
    got = R.click_rewards([(0.5, 0.5), (0.55, 0.5), (0.53, 0.54), None, (0.1, 0.1), (0.9, 0.9)],
                          [(0.5, 0.5), (0.5, 0.5), (0.5, 0.5), (0.5, 0.5), None, (0.1, 0.1)], sigma)
    d2 = 0.03 ** 2 + 0.04 ** 2  # a 3-4-5 triangle: 0.05 = one sigma away
    assert got == approx([1.0, math.exp(-0.5), math.exp(-d2 / (2 * sigma ** 2)), 0.0, 0.0, math.exp(-1.28 / 0.005)])
    assert got[1] == approx(got[2])  # only the distance counts, not its direction
    assert R.click_rewards([], []) == []
    with pytest.raises(R.RewardError, match="click sigma must be > 0, got 0"):
        R.click_rewards([(0, 0)], [(0, 0)], 0)
    with pytest.raises(R.RewardError, match="2 clicks but 1 expert targets"):
        R.click_rewards([(0, 0), (1, 1)], [(0, 0)])


def test_ppo_turn_rewards_add_the_click_term_per_turn():
    from trainer.learn.ppo import PPOConfig, shaped_turn_rewards
    from trainer.rollout.pool import Trajectory, Turn

    turns = [Turn([], [5, 2], [-0.1], "a", 0.0, None, 0.0, point=(0.2, 0.3), expert_point=(0.25, 0.3)),
             Turn([], [5, 2], [-0.1], "junk", 0.0, "no 'Action:' section", 0.0, expert_point=(0.25, 0.3)),
             Turn([], [5, 2], [-0.1], "b", 1.0, None, 1.0, point=(0.6, 0.6), expert_point=(0.6, 0.6))]
    tr = Trajectory(seed=1, family="radio", instruction="x", turns=turns)
    assert shaped_turn_rewards(tr, PPOConfig(format_penalty=0.5)) == approx([0.0, -0.5, 1.0])
    assert shaped_turn_rewards(tr, PPOConfig(format_penalty=0.5, click_reward=0.5)) == approx(
        [0.5 * math.exp(-0.5), -0.5, 1.5])
    # the batch's click_score: the mean over the turns that had an expert click (the junk one scores 0)
    from trainer.learn.ppo import batch_metrics

    assert batch_metrics([tr])["click_score"] == approx((math.exp(-0.5) + 0.0 + 1.0) / 3)
    tr.turns = [Turn([], [5], [-0.1], "c", 0.0, None, 0.0, point=(0.1, 0.1))]  # no expert: nothing to score
    assert math.isnan(batch_metrics([tr])["click_score"])


def test_shaped_rewards_through_gae_credit_the_successful_turns():
    """The pieces together: a 2-turn successful episode and a failed one with an unparseable turn.
    With a zero critic and gamma = lambda = 1 every token's advantage is its reward-to-go."""
    def turns(outcome, parsed):  # the outcome on the last turn, the penalties on each
        last = len(parsed) - 1
        return [R.shape_turn_reward(outcome if k == last else 0.0, parsed=ok, format_penalty=0.1, step_penalty=0.01)
                for k, ok in enumerate(parsed)]
    lengths = [3, 2]
    ok = G.place_turn_rewards(turns(1.0, [True, True]), lengths)
    bad = G.place_turn_rewards(turns(0.0, [False, True]), lengths)
    adv, ret = G.decoupled_gae(torch.stack([ok, bad]), torch.zeros(2, 5), lam_policy=1.0)
    assert adv[0].tolist() == approx([0.98, 0.98, 0.98, 0.99, 0.99])
    assert adv[1].tolist() == approx([-0.12, -0.12, -0.12, -0.01, -0.01])
    assert torch.equal(adv, ret)


def test_no_effect_penalties_charge_only_actions_that_left_the_screen_as_it_was():
    assert R.no_effect_penalties([True, False, None, False], 0.2) == approx([0.0, 0.2, 0.0, 0.2])
    assert R.no_effect_penalties([], 0.2) == []
    assert R.no_effect_penalties([False], 0.0) == [0.0]
    with pytest.raises(R.RewardError, match="no-effect penalty must be a finite number >= 0, got -0.1"):
        R.no_effect_penalties([False], -0.1)
    with pytest.raises(R.RewardError, match=r"changed\[1\] must be True, False or None, got 0"):
        R.no_effect_penalties([True, 0], 0.1)  # 0 is not "unchanged": a caller mixing up types is told


def test_ppo_turn_rewards_subtract_the_no_effect_penalty():
    from trainer.learn.ppo import PPOConfig, shaped_turn_rewards
    from trainer.rollout.pool import Trajectory, Turn

    turns = [Turn([], [5, 2], [-0.1], "click on nothing", 0.0, None, 0.0, changed=False),
             Turn([], [5, 2], [-0.1], "junk", 0.0, "no 'Action:' section", 0.0),
             Turn([], [5, 2], [-0.1], "a click that ticked a box", 0.0, None, 0.5, changed=True),
             Turn([], [5, 2], [-0.1], "the winning click", 1.0, None, 1.0)]
    tr = Trajectory(seed=1, family="check_boxes", instruction="x", turns=turns)
    assert shaped_turn_rewards(tr, PPOConfig(format_penalty=0.5)) == approx([0.0, -0.5, 0.0, 1.0])
    assert shaped_turn_rewards(tr, PPOConfig(format_penalty=0.5, no_effect_penalty=0.25)) == approx(
        [-0.25, -0.5, 0.0, 1.0])
    from trainer.learn.ppo import batch_metrics

    assert batch_metrics([tr])["no_effect_rate"] == approx(0.5)  # of the two turns judged, one did nothing
    tr.turns = turns[1:2]
    assert math.isnan(batch_metrics([tr])["no_effect_rate"])
