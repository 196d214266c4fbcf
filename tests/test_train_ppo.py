"""PPO smoke test: value pretraining then two real PPO updates of the tiny VLM against the Qt
sandbox, with the critic; metrics finite and the weights actually move."""
from __future__ import annotations

import math

import pytest

from tests.vlm_fixtures import one_thread, tiny_any_dir, tiny_qwen3_dir, tiny_vlm_dir  # noqa: F401 - fixtures

pytest.importorskip("trainer.rl.gae", reason="trainer/rl (the PPO math) is not written yet")


def test_two_ppo_updates_with_value_pretraining(tiny_any_dir, tmp_path, one_thread):  # noqa: F811
    import torch

    from agent.vlm.model import load_vlm
    from trainer.learn.metrics import MetricsLog, read_metrics
    from trainer.learn.ppo import Critic, PPOConfig, train_ppo
    from trainer.rollout.specs import EnvSpec

    model, proc = load_vlm(tiny_any_dir, device="cpu")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    critic0 = Critic(model)
    # the critic starts from the policy's weights, with a zero head
    assert torch.equal(critic0.backbone.language_model.embed_tokens.weight, model.model.language_model.embed_tokens.weight)
    cfg = PPOConfig(updates=2, batch_episodes=2, epochs=1, minibatch_turns=4, n_workers=0, value_pretrain_iters=1,
                    value_pretrain_epochs=1, max_new_tokens=12)
    log = MetricsLog(tmp_path / "log", tensorboard=False)
    res = train_ppo(model, proc, cfg, model_dir=tiny_any_dir, work_dir=tmp_path / "w",
                    env=EnvSpec(width=224, height=168, families=["click_button"], max_steps=2), log=log,
                    progress=False)
    rows = read_metrics(log.path)
    assert [r["phase"] for r in rows] == ["value_pretrain", "ppo", "ppo"]
    for r in rows[1:]:
        for k in ("reward", "success_rate", "entropy", "approx_kl", "clipfrac", "explained_variance", "think_length",
                  "episode_length", "value_loss", "value_clipfrac", "policy_loss", "imp_weight_mean", "imp_weight_truncated"):
            assert isinstance(r[k], float) and math.isfinite(r[k]), k
        assert r["entropy"] > 0
        # short episodes (under 200 tokens) at the default alpha: lambda on its floor, and the log says so
        assert r["lambda_policy"] == pytest.approx(0.9) and r["lambda_at_floor"] == 1.0
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert res["critic"].head.weight.abs().sum() > 0  # value pretraining moved the head off zero


def _short_episodes(model, proc, n=2):
    from trainer.rollout.actors import VLMActor
    from trainer.rollout.runner import run_episode
    from trainer.sandbox.env import SandboxEnv

    env = SandboxEnv(width=224, height=168)
    try:
        actor = VLMActor(model, proc, max_new_tokens=10)
        return [run_episode(actor, env, s, family="click_button", max_steps=3) for s in range(n)]
    finally:
        env.close()


def test_image_bank_keeps_each_screenshot_once_and_scores_like_pixels(tiny_any_dir, one_thread):  # noqa: F811
    """Turns of an episode share screenshots (the memory's working steps): the bank holds each
    once, and log-probs and values through its features equal those through the pixels (for
    Qwen3-VL, DeepStack features included)."""
    import torch

    from agent.vlm.model import action_logprobs, load_vlm
    from trainer.learn.ppo import Critic, ImageBank, build_turns, turn_values

    model, proc = load_vlm(tiny_any_dir, device="cpu")
    trajs = _short_episodes(model, proc)
    plain = build_turns(trajs, proc)
    bank = ImageBank(chunk=2)
    banked = build_turns(trajs, proc, bank)
    images_in_turns = sum(int(tb.inputs["image_grid_thw"].shape[0]) for tb in plain)
    assert len(plain) >= 4 and len(bank.pixels) < images_in_turns  # shared screenshots are kept once
    assert len(bank.pixels) == len({k for tb in banked for k in tb.images})
    assert all("pixel_values" not in tb.inputs for tb in banked)
    bank.encode(model.model)
    bank.attach(banked)
    if model.config.model_type == "qwen3_vl":  # one DeepStack layer: each image carries its features
        assert all(len(bank.deepstack[k]) == 1 for k in bank.pixels)
        assert all(len(tb.inputs["image_deepstack"]) == len(tb.images) for tb in banked if tb.images)
    critic = Critic(model)
    with torch.no_grad():
        for a, b in zip(plain, banked, strict=True):
            lp_pixels = action_logprobs(model, a.inputs, a.target)[a.target]
            lp_bank = action_logprobs(model, b.inputs, b.target)[b.target]
            assert torch.allclose(lp_pixels, lp_bank, atol=1e-4), (lp_pixels - lp_bank).abs().max()
            assert torch.allclose(turn_values(critic, a), turn_values(critic, b), atol=1e-4)


def test_image_bank_refuses_pixels_its_grid_does_not_account_for(tiny_vlm_dir):  # noqa: F811
    import torch

    from trainer.learn.ppo import ImageBank

    inputs = {"pixel_values": torch.zeros(20, 8), "image_grid_thw": torch.tensor([[1, 2, 8]])}
    with pytest.raises(ValueError, match="20 rows but image_grid_thw accounts for 16"):
        ImageBank().add(inputs)


@pytest.mark.parametrize("train_vision", [False, True])
def test_learner_update_trains_the_vision_tower_only_when_asked(tiny_vlm_dir, one_thread, train_vision):  # noqa: F811
    import torch

    from agent.vlm.model import load_vlm
    from trainer.learn.ppo import Learner, PPOConfig

    model, proc = load_vlm(tiny_vlm_dir, device="cpu")
    trajs = _short_episodes(model, proc)
    for t in trajs:  # a reward to learn from, so the advantages are not all zero
        t.turns[-1].reward = 1.0 if t.seed % 2 else 0.0
    vis0 = {k: v.clone() for k, v in model.model.visual.state_dict().items()}
    lm0 = {k: v.clone() for k, v in model.model.language_model.state_dict().items()}
    learner = Learner(model, proc, PPOConfig(epochs=1, lr=1e-2, critic_lr=1e-2, minibatch_turns=2,
                                            train_vision=train_vision))
    m = learner.update(trajs)
    learner.close()
    assert m["learner_tokens"] > 0 and m["learner_tokens_per_s"] > 0
    # the rollout's log-probs line up with the learner's: on-policy data weighs w = pi_prox / pi_behav = 1
    assert m["imp_weight_truncated"] == 0.0 and abs(m["imp_weight_mean"] - 1.0) < 1e-3
    vis_moved = any(not torch.equal(vis0[k], v) for k, v in model.model.visual.state_dict().items())
    lm_moved = any(not torch.equal(lm0[k], v) for k, v in model.model.language_model.state_dict().items())
    assert lm_moved
    assert vis_moved == train_vision
    # the critic's vision tower stays the policy's when frozen (it shares the policy's features)
    same = all(torch.equal(a, b) for a, b in zip(model.model.visual.parameters(), learner.critic.backbone.visual.parameters(), strict=True))
    assert same != train_vision
    assert all(p.requires_grad for p in model.parameters())  # close() gives the model back trainable


def test_target_kl_stops_the_policy_passes_of_an_update(tiny_vlm_dir, one_thread):  # noqa: F811
    """The first minibatch sees the batch's own policy (KL 0) and steps; with a big step and a
    tiny target the next one is over the target, so the update stops there, critic passes go on."""
    import torch

    from agent.vlm.model import load_vlm
    from trainer.learn.ppo import Learner, PPOConfig

    model, proc = load_vlm(tiny_vlm_dir, device="cpu")
    trajs = _short_episodes(model, proc, n=3)
    for t in trajs:
        t.turns[-1].reward = 1.0 if t.seed % 2 else 0.0
    results = {}
    for target in (None, 1e-4):
        m, p = load_vlm(tiny_vlm_dir, device="cpu")
        before = {k: v.clone() for k, v in m.state_dict().items()}
        torch.manual_seed(0)
        learner = Learner(m, p, PPOConfig(epochs=3, lr=5e-2, minibatch_turns=1, target_kl=target))
        results[target] = learner.update(trajs)
        learner.close()
        assert any(not torch.equal(before[k], v) for k, v in m.state_dict().items())  # the first step was taken
    assert results[None]["policy_epochs"] == 3
    assert results[1e-4]["policy_epochs"] == 0  # stopped within the first pass
    # the rate counts the tokens the passes went through: all of them three times, or part of one pass
    n_tok = results[None]["learner_tokens"]
    assert results[None]["policy_tokens"] == 3 * n_tok
    assert 0 < results[1e-4]["policy_tokens"] < n_tok and results[1e-4]["learner_tokens"] == n_tok
    assert results[1e-4]["value_loss"] > 0  # the critic's passes still ran


def test_an_update_makes_the_rewarded_reply_likelier_and_the_penalised_one_less_likely(tiny_vlm_dir, one_thread):  # noqa: F811
    """The direction of learning, end to end through scoring, GAE, whitening and the clipped
    loss: one reply rewarded +1, another -1 (one turn each, critic head at zero so the
    advantages carry the rewards' signs); after one update the first reply's tokens are likelier
    under the policy and the second's less likely."""
    import torch

    from agent.vlm.model import action_logprobs, load_vlm
    from trainer.learn.ppo import Learner, PPOConfig, prepare_turns
    from trainer.rollout.actors import VLMActor
    from trainer.rollout.runner import run_episode
    from trainer.sandbox.env import SandboxEnv

    model, proc = load_vlm(tiny_vlm_dir, device="cpu")
    torch.manual_seed(0)
    env = SandboxEnv(width=224, height=168)
    try:
        actor = VLMActor(model, proc, max_new_tokens=10)
        trajs = [run_episode(actor, env, s, family="click_button", max_steps=1) for s in (1, 2)]
    finally:
        env.close()
    assert all(len(t.turns) == 1 and t.turns[0].response_ids for t in trajs)
    trajs[0].turns[0].reward, trajs[1].turns[0].reward = 1.0, -1.0
    cfg = PPOConfig(epochs=1, lr=1e-3, minibatch_turns=2, format_penalty=0.0, policy_alpha=1.0)

    def mean_logprobs():
        with torch.no_grad():
            return [float(action_logprobs(model, tb.inputs, tb.target)[tb.target].mean())
                    for tb in prepare_turns(trajs, proc, model, cfg)]

    before = mean_logprobs()
    learner = Learner(model, proc, cfg)
    learner.update(trajs)
    learner.close()
    after = mean_logprobs()
    assert after[0] > before[0] + 1e-3, (before, after)
    assert after[1] < before[1] - 1e-3, (before, after)


def test_kl_coef_holds_the_policy_near_where_it_started(tiny_vlm_dir, one_thread):  # noqa: F811
    """With kl_coef the learner keeps a frozen copy of the start policy and adds a per-token k3
    KL penalty to it: the same aggressive updates then end closer to the start (measured on the
    batch's own tokens), the copy itself never moves, and with kl_coef 0 no copy is kept."""
    import torch

    from agent.vlm.model import action_logprobs, load_vlm
    from trainer.learn.ppo import KL_REF_CAP, Learner, PPOConfig, prepare_turns
    from trainer.rl.losses import kl_estimate

    model, proc = load_vlm(tiny_vlm_dir, device="cpu")
    trajs = _short_episodes(model, proc, n=3)
    for t in trajs:
        t.turns[-1].reward = 1.0 if t.seed % 2 else -1.0
    start_lp = None
    drift, kl_logged = {}, {}
    for coef in (0.0, 5.0):
        m, p = load_vlm(tiny_vlm_dir, device="cpu")
        cfg = PPOConfig(epochs=4, lr=3e-3, minibatch_turns=2, format_penalty=0.0, kl_coef=coef)
        turns = prepare_turns(trajs, p, m, cfg)
        with torch.no_grad():
            lps = [action_logprobs(m, tb.inputs, tb.target)[tb.target] for tb in turns]
        start_lp = start_lp or lps
        torch.manual_seed(0)
        learner = Learner(m, p, cfg)
        assert (learner.ref is None) == (coef == 0.0)
        ref_before = None if learner.ref is None else {k: v.clone() for k, v in learner.ref.state_dict().items()}
        rows = [learner.update(trajs) for _ in range(3)]
        if learner.ref is not None:
            assert all(torch.equal(ref_before[k], v) for k, v in learner.ref.state_dict().items())
            kl_logged[coef] = [r["kl_ref"] for r in rows]
        else:
            assert "kl_ref" not in rows[-1]
        learner.close()
        with torch.no_grad():
            now = [action_logprobs(m, tb.inputs, tb.target)[tb.target] for tb in prepare_turns(trajs, p, m, cfg)]
        drift[coef] = float(torch.cat([kl_estimate(a, b) for a, b in zip(now, start_lp, strict=True)]).mean())
    assert kl_logged[5.0][0] >= 0.0 and max(kl_logged[5.0]) > 0.0  # the penalty saw the policy move
    assert max(kl_logged[5.0]) <= KL_REF_CAP  # per token, so the mean is under the cap too
    assert drift[5.0] < 0.7 * drift[0.0], drift


def test_dual_clip_bounds_the_loss_of_a_bad_token_whose_ratio_ran_away(tiny_vlm_dir, one_thread):  # noqa: F811
    """Every token made e^5 times likelier than when it was sampled, with a negative advantage:
    without dual clip the policy step pushes them down hard; with it (c = 3) their loss is the
    constant -A*c, so no gradient reaches the weights, and every token counts as dual-clipped."""
    import torch

    from agent.vlm.model import load_vlm
    from trainer.learn.ppo import Critic, PPOConfig, policy_step, prepare_turns, score

    model, proc = load_vlm(tiny_vlm_dir, device="cpu")
    trajs = _short_episodes(model, proc, n=2)
    results = {}
    for dual in (None, 3.0):
        m, p = load_vlm(tiny_vlm_dir, device="cpu")
        cfg = PPOConfig(lr=1e-2, minibatch_turns=2, dual_clip=dual)
        turns = prepare_turns(trajs, p, m, cfg)
        score(m, Critic(m), trajs, turns, p, cfg)
        for tb in turns:
            tb.old_lp = tb.old_lp - 5.0  # ratio e^5 ~ 148, far past c
            tb.adv = -torch.ones_like(tb.old_lp)
        before = {k: v.clone() for k, v in m.state_dict().items()}
        m.train()
        opt = torch.optim.AdamW([q for q in m.parameters() if q.requires_grad], lr=cfg.lr, weight_decay=0.0)
        out = policy_step(m, opt, turns, cfg)
        moved = sum(float((before[k] - v).abs().sum()) for k, v in m.state_dict().items())
        results[dual] = (out, moved)
    assert results[None][1] > 0 and "clipfrac_dual" not in results[None][0]
    assert results[3.0][1] == 0.0
    assert results[3.0][0]["clipfrac_dual"] == 1.0


def test_whitening_the_advantages_can_be_turned_off(tiny_vlm_dir, one_thread):  # noqa: F811
    """PPOConfig.whiten_advantages (a flag of `train ppo` by its field alone): on, the batch's
    advantages have mean 0 and std 1; off, they are GAE's own, of which the whitened are the
    affine image, so only their scale and offset differ."""
    import torch

    import main
    from agent.vlm.model import load_vlm
    from trainer.config_flags import from_args
    from trainer.learn.ppo import Critic, PPOConfig, prepare_turns, score
    from trainer.rollout.actors import VLMActor
    from trainer.rollout.runner import run_episode
    from trainer.sandbox.env import SandboxEnv

    model, proc = load_vlm(tiny_vlm_dir, device="cpu")
    torch.manual_seed(0)
    env = SandboxEnv(width=224, height=168)
    try:
        actor = VLMActor(model, proc, max_new_tokens=10)
        trajs = [run_episode(actor, env, s, family="click_button", max_steps=2) for s in (1, 2, 3)]
    finally:
        env.close()
    trajs[0].turns[-1].reward = 1.0  # one success among failures: advantages of both signs
    critic = Critic(model)
    adv = {}
    for whiten in (True, False):
        cfg = PPOConfig(whiten_advantages=whiten, format_penalty=0.0)
        turns = prepare_turns(trajs, proc, model, cfg)
        score(model, critic, trajs, turns, proc, cfg)
        adv[whiten] = torch.cat([tb.adv for tb in turns])
    on, off = adv[True], adv[False]
    assert abs(float(on.mean())) < 1e-5 and abs(float(on.std()) - 1.0) < 1e-4
    assert not torch.allclose(on, off, atol=1e-3)
    assert torch.allclose((off - off.mean()) / off.std(), on, atol=1e-4)
    args = main.build_parser().parse_args(["train", "ppo", "--model", "m", "--out", "o", "--no-whiten-advantages"])
    assert from_args(PPOConfig, args).whiten_advantages is False
