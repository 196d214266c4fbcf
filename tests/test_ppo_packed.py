"""The packed PPO learner (trainer.learn.ppo_batch): turns grouped under a token budget, one padded
forward per micro-batch, gradients accumulated up to the optimizer step. Its results must not
depend on the budget: packed and one-turn-per-forward (budget 0) give the same log-probs,
values, advantages, losses and weights after real steps. Also the decoupled objective's
weights through a real policy step.

The shared prompt prefix (PPOConfig.share_prefix: forwarded once, its keys and values reused by
every row) must not change them either.

Run as a script for the learner's speed, against one turn per forward without sharing in the same
run (a budget with an "s" shares the prefix):
    python -m tests.test_ppo_packed [--model assets/default_model] [--batch 8] [--budgets 0,0s,2048s,8192]
"""
from __future__ import annotations

import dataclasses
import random
from types import SimpleNamespace

import pytest

from tests.vlm_fixtures import one_thread, tiny_any_dir, tiny_qwen3_dir, tiny_vlm_dir  # noqa: F401 - fixtures
from trainer.rollout.actors import Actor

ALL = 10**6  # a budget that puts every turn of these small batches in one micro-batch


def _episodes(model, proc, n=3):
    from tests.test_train_ppo import _short_episodes

    trajs = _short_episodes(model, proc, n=n)
    for t in trajs:  # a reward to learn from, so the advantages are not all zero
        t.turns[-1].reward = 1.0 if t.seed % 2 else -1.0
    return trajs


class _ScoredScript(Actor):
    """Replies that parse (a click that misses, so episodes run to the step limit), scored by the
    model as a sampled reply would be: its token ids (the stop included) and their log-probs."""

    def __init__(self, model, proc):
        self.model, self.proc = model, proc

    def generate(self, messages, *, greedy=False):
        import torch

        from agent.vlm.model import action_logprobs, build_inputs, extend_inputs, stop_token_ids
        from trainer.rollout.actors import ActorOutput

        k = sum(1 for m in messages if m["role"] == "assistant")
        text = f"Thought: I try the corner {k}.\nAction: click(start_box='({3 + k},{4 + k})')"
        ids = self.proc.tokenizer.encode(text, add_special_tokens=False) + stop_token_ids(self.proc)[:1]
        full, target = extend_inputs(build_inputs(self.proc, messages, add_generation_prompt=True), ids)
        with torch.no_grad():
            lp = action_logprobs(self.model, full, target)[target]
        return ActorOutput(text, ids, lp.tolist())


def _chained_episodes(model, proc, n=3, steps=3):
    """Episodes whose turns chain: each reply parses, so working memory appends it and the next
    screenshot, and every prompt extends the turn before's prompt and reply."""
    from trainer.rollout.runner import run_episode
    from trainer.sandbox.env import SandboxEnv

    env = SandboxEnv(width=224, height=168, observation="pixels")  # each prompt extends the one before
    try:
        trajs = [run_episode(_ScoredScript(model, proc), env, s, family="check_boxes", max_steps=steps) for s in range(n)]
    finally:
        env.close()
    for t in trajs:
        t.turns[-1].reward = 1.0 if t.seed % 2 else -1.0
    return trajs


def test_micro_batches_group_sorted_turns_under_the_token_budget():
    import torch

    from trainer.learn.ppo_batch import budget_for, micro_batches

    turns = [SimpleNamespace(inputs={"input_ids": torch.zeros(1, w)}, w=w) for w in (5, 9, 3, 7, 7, 12)]
    assert [[t.w for t in g] for g in micro_batches(turns, 0)] == [[5], [9], [3], [7], [7], [12]]  # sequential
    # rows x longest row <= 20; the 12-token turn would make 2 x 12 with the 9: alone
    assert [[t.w for t in g] for g in micro_batches(turns, 20)] == [[3, 5], [7, 7], [9], [12]]
    assert [[t.w for t in g] for g in micro_batches(turns, 10)] == [[3, 5], [7], [7], [9], [12]]  # over budget: alone
    with pytest.raises(ValueError, match="micro_batch_tokens must be >= 0"):
        micro_batches(turns, -1)
    # None: sequential on a CPU (packing measured slower there), packed on an accelerator
    assert (budget_for(None, "cpu"), budget_for(None, "cuda"), budget_for(300, "cpu")) == (2048, 8192, 300)


def test_packed_scoring_equals_one_turn_per_forward(tiny_any_dir, one_thread):  # noqa: F811
    """Right padding, the 3D rope index over padded rows, image features (and Qwen3-VL's
    DeepStack features) concatenated in row order, and the shared prompt prefix (its keys and
    values from one forward, each row's rope positions those of the whole row): every turn's
    proximal and reference log-probs, values, advantages and returns come out as from its own
    forward."""
    import torch

    from agent.vlm.model import load_vlm
    from trainer.learn.ppo import Critic, PPOConfig, micro_batches, prepare_turns, score
    from trainer.learn.ppo_batch import MIN_SHARED_PREFIX, shared_prefix

    model, proc = load_vlm(tiny_any_dir, device="cpu")
    trajs = _episodes(model, proc)
    critic = Critic(model)
    scored = {}
    for budget, share in ((0, False), (0, True), (ALL, False), (ALL, True)):
        cfg = PPOConfig(micro_batch_tokens=budget, share_prefix=share)
        turns = prepare_turns(trajs, proc, model, cfg)
        score(model, critic, trajs, turns, proc, cfg, ref=model)
        scored[budget, share] = turns
    groups = micro_batches(scored[ALL, False], ALL)
    widths = {tb.inputs["input_ids"].shape[1] for tb in groups[0]}
    assert len(groups) == 1 and len(groups[0]) >= 4 and len(widths) > 1  # one forward, padded rows
    prefix = shared_prefix(scored[0, True])
    assert prefix is not None and prefix.shape[1] >= MIN_SHARED_PREFIX  # the shared path did run
    if model.config.model_type == "qwen3_vl":
        assert all("image_deepstack" in tb.inputs for tb in scored[ALL, False])
    for other in ((0, True), (ALL, False), (ALL, True)):
        for a, b in zip(scored[0, False], scored[other], strict=True):
            for name in ("old_lp", "ref_lp", "values", "adv", "ret"):
                x, y = getattr(a, name), getattr(b, name)
                assert x.shape == y.shape and torch.allclose(x, y, atol=1e-5), (other, name, (x - y).abs().max())


def test_a_shared_prefix_is_text_all_turns_share_and_leaves_each_row_its_first_prediction():
    import torch

    from trainer.learn.ppo_batch import shared_prefix

    def turn(ids, vision_at=None, prompt=None):
        t = torch.tensor([ids])
        mm = torch.zeros_like(t)
        if vision_at is not None:
            mm[0, vision_at:vision_at + 2] = 1
        target = torch.zeros_like(t, dtype=torch.bool)
        target[0, prompt if prompt is not None else len(ids) - 2:] = True
        return SimpleNamespace(inputs={"input_ids": t, "mm_token_type_ids": mm}, target=target)

    common = list(range(100, 140))  # 40 shared tokens
    a, b = turn(common + [1, 2, 3, 4]), turn(common + [5, 6, 7])
    assert shared_prefix([a, b]).tolist() == [common]
    assert shared_prefix([a]) is None  # one turn: nothing to share
    assert shared_prefix([a, b, turn(common[:10] + [9] * 30)]) is None  # under MIN_SHARED_PREFIX: unshared
    assert shared_prefix([a, turn(common + [5, 6, 7], vision_at=30)]).shape[1] == 30  # stops at an image
    # a prompt that is the common start itself keeps its last token, which predicts the first generated one
    assert shared_prefix([a, turn(common + [8, 9], prompt=40)]).shape[1] == 39


def test_a_pack_of_turns_with_pixels_scores_like_each_turn(tiny_vlm_dir, one_thread):  # noqa: F811
    """With the vision tower trained, the turns carry pixel_values: collated, they are
    concatenated in row order with their image_grid_thw (and with a shared prefix, they go with
    the suffix)."""
    import torch

    from agent.vlm.model import action_logprobs, load_vlm
    from trainer.learn.ppo import PPOConfig, prepare_turns
    from trainer.learn.ppo_batch import Pack, pack_logprobs, pad_token_id, prefix_kv

    model, proc = load_vlm(tiny_vlm_dir, device="cpu")
    turns = prepare_turns(_episodes(model, proc, n=2), proc, model, PPOConfig(train_vision=True))
    p = Pack.build(turns, pad_token_id(model.config))
    assert p.inputs["input_ids"].shape[0] == len(turns) and "pixel_values" in p.inputs
    assert p.inputs["image_grid_thw"].shape[0] == sum(tb.inputs["image_grid_thw"].shape[0] for tb in turns)
    with torch.no_grad():
        packed = p.split(action_logprobs(model, p.inputs, p.target)[p.target])
        kv = prefix_kv(model, turns, share=True)  # the pixels go with the suffix: the prefix is text
        shared = p.split(pack_logprobs(model, p, prefix=kv))
        for tb, lp, lp_shared in zip(turns, packed, shared, strict=True):
            alone = action_logprobs(model, tb.inputs, tb.target)[tb.target]
            assert torch.allclose(alone, lp, atol=1e-5), (alone - lp).abs().max()
            assert torch.allclose(alone, lp_shared, atol=1e-5), (alone - lp_shared).abs().max()


def _sgd_updates(model_dir, trajs, configs: dict) -> dict:
    """Per name: (metrics, policy and critic state after one update, start weights) from fresh
    weights, the same shuffling, SGD optimizers (so the weights compare the accumulated gradients
    themselves: Adam's first step is about lr * sign(g), which would blow float-summation noise on a
    near-zero gradient up to lr)."""
    import torch

    from agent.vlm.model import load_vlm
    from trainer.learn.ppo import Learner

    runs = {}
    for name, cfg in configs.items():
        m, p = load_vlm(model_dir, device="cpu")
        start = {k: v.clone() for k, v in m.state_dict().items()}
        learner = Learner(m, p, cfg)
        learner.opt_p = torch.optim.SGD([q for q in m.parameters() if q.requires_grad], lr=0.05)
        learner.opt_c = torch.optim.SGD([q for q in learner.critic.parameters() if q.requires_grad], lr=0.05)
        random.seed(0)
        metrics = learner.update(trajs)
        learner.close()
        runs[name] = (metrics, m.state_dict(), learner.critic.state_dict(), start)
    return runs


def _assert_same_updates(runs: dict, keys) -> None:
    """Every run's metrics `keys` within 1e-4 of the first run's, and its weights too."""
    (base_metrics, base_policy, base_critic, _), *_ = runs.values()
    for name, (metrics, policy, critic, _) in list(runs.items())[1:]:
        for k in keys:
            assert metrics[k] == pytest.approx(base_metrics[k], abs=1e-4), (name, k)
        for mine, theirs in ((policy, base_policy), (critic, base_critic)):
            worst = max(float((mine[k] - v).abs().max()) for k, v in theirs.items())
            assert worst < 1e-4, (name, worst)


def test_packed_update_matches_the_sequential_update(tiny_any_dir, one_thread):  # noqa: F811
    """A whole update (score, GAE, two epochs of policy and critic minibatches) from the same
    weights with the same shuffling, one turn per forward, a few micro-batches per minibatch, and
    every minibatch in one forward, each with and without the shared prompt prefix (its gradient
    sent through its one forward): the same metrics and the same weights."""
    from agent.vlm.model import load_vlm
    from trainer.learn.ppo import PPOConfig

    model, proc = load_vlm(tiny_any_dir, device="cpu")
    trajs = _episodes(model, proc)
    variants = ((0, False), (0, True), (1200, True), (ALL, False), (ALL, True))
    runs = _sgd_updates(tiny_any_dir, trajs, {
        (budget, share): PPOConfig(epochs=2, minibatch_turns=3, micro_batch_tokens=budget, kl_coef=0.1, dual_clip=3.0,
                                   ent_coef=0.01, share_prefix=share) for budget, share in variants})
    _, seq_policy, _, start = runs[0, False]
    moved = max(float((seq_policy[k] - v).abs().max()) for k, v in start.items())
    assert moved > 1e-3  # the steps were real, so agreeing within 1e-4 means something
    _assert_same_updates(runs, ("policy_loss", "entropy", "approx_kl", "clipfrac", "clipfrac_dual", "kl_ref",
                                "value_loss", "explained_variance", "imp_weight_mean", "imp_weight_truncated",
                                "policy_epochs", "policy_tokens"))


def test_turns_that_extend_one_another_share_a_row_and_score_as_alone(tiny_any_dir, one_thread):  # noqa: F811
    """An episode's prompts extend the turn before's prompt and reply: chained, its turns are one
    row (the last turn's), and every turn's proximal and reference log-probs, values, advantages
    and returns are those of its own row; chaining leaves minibatches their size and every turn
    in exactly one of them."""
    import torch

    from agent.vlm.model import load_vlm
    from trainer.learn.ppo import Critic, PPOConfig, prepare_turns, score
    from trainer.learn.ppo_batch import Chain, chain_turns, members_of, minibatches

    model, proc = load_vlm(tiny_any_dir, device="cpu")
    trajs = _chained_episodes(model, proc)
    critic = Critic(model)
    scored = {}
    for budget, share, chain in ((0, False, False), (0, False, True), (ALL, True, True)):
        cfg = PPOConfig(micro_batch_tokens=budget, share_prefix=share, chain_turns=chain)
        turns = prepare_turns(trajs, proc, model, cfg)
        score(model, critic, trajs, turns, proc, cfg, ref=model)
        scored[budget, share, chain] = turns
    plain = scored[0, False, False]
    rows = chain_turns(plain)
    chains = [r for r in rows if isinstance(r, Chain)]
    assert len(chains) == len(trajs) and all(len(c.members) == 3 for c in chains)  # each episode is one row
    assert sum(len(members_of(r)) for r in rows) == len(plain)
    for other in ((0, False, True), (ALL, True, True)):
        for a, b in zip(plain, scored[other], strict=True):
            for name in ("old_lp", "ref_lp", "values", "adv", "ret"):
                x, y = getattr(a, name), getattr(b, name)
                assert x.shape == y.shape and torch.allclose(x, y, atol=1e-5), (other, name, (x - y).abs().max())
    # a turn of another episode, a prompt rewritten in its middle, or another screenshot breaks a chain
    first, second = plain[0], plain[1]
    assert first.traj == second.traj and [len(members_of(r)) for r in chain_turns([first, second])] == [2]
    assert [len(members_of(r)) for r in chain_turns([first, plain[3]])] == [1, 1]
    ids = second.inputs["input_ids"].clone()
    ids[0, 5] += 1
    rewritten = dataclasses.replace(second, inputs={**second.inputs, "input_ids": ids})
    other_image = dataclasses.replace(second, images=["another screenshot"] + second.images[1:])
    for broken in (rewritten, other_image):
        assert [len(members_of(r)) for r in chain_turns([first, broken])] == [1, 1]
    random.seed(1)
    mbs = list(minibatches(plain, 4, chain=True))
    assert [len(mb) for mb in mbs] == [4, 4, 1]
    assert sorted(id(tb) for mb in mbs for tb in mb) == sorted(id(tb) for tb in plain)


def test_chained_update_matches_the_unchained_one(tiny_vlm_dir, one_thread):  # noqa: F811
    """A whole update over chaining episodes, one minibatch so the shuffle cannot differ: turn by
    turn, and chained (one row per forward, and all rows in one forward with the shared prefix),
    give the same metrics and weights."""
    from agent.vlm.model import load_vlm
    from trainer.learn.ppo import PPOConfig

    model, proc = load_vlm(tiny_vlm_dir, device="cpu")
    trajs = _chained_episodes(model, proc)
    variants = ((0, False, False), (0, False, True), (ALL, True, True))
    runs = _sgd_updates(tiny_vlm_dir, trajs, {
        v: PPOConfig(epochs=2, minibatch_turns=ALL, micro_batch_tokens=v[0], share_prefix=v[1], chain_turns=v[2],
                     kl_coef=0.1, ent_coef=0.01) for v in variants})
    _assert_same_updates(runs, ("policy_loss", "entropy", "approx_kl", "kl_ref", "value_loss", "imp_weight_mean",
                                "policy_tokens"))


def test_stale_behaviour_log_probs_past_the_cap_leave_the_policy_where_it_was(tiny_vlm_dir, one_thread):  # noqa: F811
    """Rollout log-probs 3 nats under the learner's (w = e^3, past the cap of 2): every token is
    dropped, so the step moves nothing and the pass logs them all as truncated; with the
    correction off the same step moves the policy. On-policy data logs w = 1."""
    import torch

    from agent.vlm.model import load_vlm
    from trainer.learn.ppo import Critic, PPOConfig, policy_step, prepare_turns, score

    model, proc = load_vlm(tiny_vlm_dir, device="cpu")
    trajs = _episodes(model, proc, n=2)
    out = {}
    for correct, shift in ((True, 0.0), (True, 3.0), (False, 3.0)):
        m, p = load_vlm(tiny_vlm_dir, device="cpu")
        cfg = PPOConfig(lr=1e-2, minibatch_turns=2, behaviour_correction=correct, imp_weight_cap=2.0)
        turns = prepare_turns(trajs, p, m, cfg)
        score(m, Critic(m), trajs, turns, p, cfg)
        for tb in turns:
            tb.behaviour_lp = tb.behaviour_lp - shift
        before = {k: v.clone() for k, v in m.state_dict().items()}
        m.train()
        opt = torch.optim.AdamW([q for q in m.parameters() if q.requires_grad], lr=cfg.lr, weight_decay=0.0)
        stats = policy_step(m, opt, turns, cfg)
        out[(correct, shift)] = (stats, sum(float((before[k] - v).abs().sum()) for k, v in m.state_dict().items()))
    on_policy, _ = out[(True, 0.0)]
    assert on_policy["imp_weight_truncated"] == 0.0 and abs(on_policy["imp_weight_mean"] - 1.0) < 1e-3
    stale, moved = out[(True, 3.0)]
    assert stale["imp_weight_truncated"] == 1.0 and moved == 0.0
    assert "imp_weight_mean" not in out[(False, 3.0)][0] and out[(False, 3.0)][1] > 0


def test_the_learner_refuses_a_negative_budget_and_a_cap_that_drops_on_policy_tokens(tiny_vlm_dir):  # noqa: F811
    from agent.vlm.model import load_vlm
    from trainer.learn.ppo import Learner, PPOConfig

    model, proc = load_vlm(tiny_vlm_dir, device="cpu")
    with pytest.raises(ValueError, match="micro_batch_tokens must be >= 0"):
        Learner(model, proc, PPOConfig(micro_batch_tokens=-1))
    with pytest.raises(ValueError, match="imp_weight_cap must be > 1"):
        Learner(model, proc, PPOConfig(imp_weight_cap=1.0))


# ---------------------------------------------------------------- the learner's speed (run as a script)


def _bench(argv=None) -> None:
    """One thread, one batch of episodes of the given model, a fresh Learner per budget, updates
    interleaved round by round so machine noise hits every budget alike; median tokens/s."""
    import argparse
    import os
    import statistics

    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    import torch

    from agent.vlm.model import load_vlm
    from trainer.learn.ppo import Learner, PPOConfig
    from trainer.rollout.actors import VLMActor
    from trainer.rollout.runner import run_episode
    from trainer.sandbox.env import SandboxEnv

    ap = argparse.ArgumentParser(prog="python -m tests.test_ppo_packed")
    ap.add_argument("--model", default="assets/default_model")
    ap.add_argument("--batch", type=int, default=8, help="episodes (up to 6 steps each)")
    ap.add_argument("--budgets", default="0,0s,1024s,2048s,4096s",
                    help="micro_batch_tokens, an 's' after one shares the prompt prefix; the first is the baseline")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    model, proc = load_vlm(a.model, device="cpu")
    families = ["click_button", "radio", "list_pick", "form", "settings_chain", "scroll_find"]
    env = SandboxEnv(width=224, height=168, observation="pixels")  # each prompt extends the one before
    try:
        actor = VLMActor(model, proc, max_new_tokens=24)
        trajs = [run_episode(actor, env, s, family=families[s % len(families)], max_steps=6) for s in range(a.batch)]
    finally:
        env.close()
    budgets = a.budgets.split(",")
    learners = {}
    for b in budgets:
        m, p = load_vlm(a.model, device="cpu")
        learners[b] = Learner(m, p, PPOConfig(epochs=a.epochs, lr=1e-4, micro_batch_tokens=int(b.rstrip("s")),
                                              share_prefix=b.endswith("s")))
        learners[b].update(trajs)  # warm-up
    rates = {b: [] for b in budgets}
    for _ in range(a.rounds):
        for b in budgets:
            rates[b].append(learners[b].update(trajs)["learner_tokens_per_s"])
    n_turns = sum(len(t.turns) for t in trajs)
    print(f"{a.model}: {a.batch} episodes, {n_turns} turns, {a.epochs} epoch(s), {a.threads} thread(s)")
    base = statistics.median(rates[budgets[0]])
    for b in budgets:
        med = statistics.median(rates[b])
        shared = "shared prefix" if b.endswith("s") else "unshared"
        print(f"micro_batch_tokens {b.rstrip('s'):>6} {shared:>13}: {med:7.0f} learner tokens/s  {med / base:5.2f}x")


if __name__ == "__main__":
    _bench()
