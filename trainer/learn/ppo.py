"""Multi-turn PPO for a Qwen2.5-VL-class policy with a separate critic, read top to bottom.
(Over 500 lines: the critic, scoring, the two steps, the learner and the loop are one algorithm
read in order; the tensor plumbing is in trainer.learn.ppo_batch, the losses and GAE in trainer.rl.)

An episode is a list of turns; each turn is a prompt (screenshot + history, never trained on)
and the tokens the policy generated. Per trajectory the generated tokens of all its turns form one
sequence: the turn's (shaped) reward sits on its last generated token, the critic gives a value
before every generated token, and GAE runs over that sequence (trainer.rl.gae): the critic's
targets use lambda = 1 (decoupled GAE), the policy's advantages a length-adaptive lambda
1 - 1/(alpha * l). A truncated episode is bootstrapped from the value of the next prompt; a
terminated one is not. The policy loss is PPO's clipped objective with clip-higher
(eps_low < eps_high), token-mean over each minibatch (trainer.rl.losses), in its decoupled form
(AReaL): the ratio is taken against the proximal policy (the learner's at scoring time) and each
token weighted by pi_prox / pi_behav, the rollout's own log-probs, so data from stale workers
neither escapes the trust region nor counts as if it were on-policy.

Forwards and backwards run over padded micro-batches of turns under a token budget
(trainer.learn.ppo_batch, `micro_batch_tokens`), gradients accumulated up to each optimizer step.

The critic is the same backbone class with a scalar head on the last hidden state, initialised
from the policy's weights, and it is pretrained (fit to lambda = 1 returns of the frozen policy
for `value_pretrain_iters` batches) before the first policy update.

With `train_vision` off (the default) the vision tower stays as SFT left it, in the policy and in
the critic, so both see the same image features: each distinct screenshot of a batch is encoded
once (`ImageBank`) and every forward of the update reuses it. The turns of one episode share most
of their screenshots (the memory keeps the last few), and the vision tower was most of the cost
of a forward, so this about halves the learner's time (tests/bench/bench_rollouts.py, "learner").

Rollouts come from trainer.rollout.pool: worker processes (async or sync) or, with n_workers = 0, the
learner's own process.
"""
from __future__ import annotations

import copy
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch
from torch import nn

from agent.executors.terminal import TOOL_ACTIONS
from agent.vlm import pointer
from agent.vlm.model import build_inputs
from trainer.learn import distributed as D
from trainer.learn.lora import plain_state_dict
from trainer.learn.ppo_batch import (  # noqa: F401  (TurnBatch, ImageBank, build_turns, micro_batches are re-exported)
    ImageBank,
    Pack,
    PrefixKV,
    TurnBatch,
    build_turns,
    chain_turns,
    forward_kwargs,
    micro_batches,
    minibatches,
    pack_logprobs,
    packs,
    prefix_kv,
    prepare_turns,
    suffix_target,
)
from trainer.learn.ppo_config import PPOConfig, check_fsdp
from trainer.learn.sft import prepare_model
from trainer.rl import gae as rl_gae
from trainer.rl import losses as rl_losses
from trainer.rl import rewards as rl_rewards
from trainer.rollout.actors import VLMActor
from trainer.rollout.pool import RolloutPool, RolloutSource, WorkerSpec
from trainer.rollout.ray_pool import RayRolloutPool
from trainer.rollout.runner import EpisodeRunner
from trainer.rollout.specs import ActorSpec, EnvSpec, EpisodeSpec, MemorySpec
from trainer.sandbox.env_process import make_envs

KL_REF_CAP = 10.0  # per-token cap of the KL-to-start penalty's k3 estimate


# ---------------------------------------------------------------- the critic


class Critic(nn.Module):
    """The policy's backbone (a copy) plus a scalar head on the last hidden state."""

    def __init__(self, policy):
        super().__init__()
        self.backbone = copy.deepcopy(policy.model)  # Qwen2_5_VLModel / Qwen3VLModel: vision tower + language model
        hidden = policy.config.text_config.hidden_size
        # beside the backbone (a learner on a GPU), in float32: values are regression targets
        self.head = nn.Linear(hidden, 1, device=self.backbone.device)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, inputs: dict, prefix: PrefixKV | None = None) -> torch.Tensor:
        """Values [B, T]: V at position t is the value of the context up to and including t (with
        a shared prefix, T covers what follows it)."""
        out = self.backbone(**forward_kwargs(self.backbone, inputs, prefix), use_cache=False)
        with torch.autocast(self.head.weight.device.type, enabled=False):  # values are regression targets: float32
            # a copy, not a view: FSDP2 warns about views returned by a sharded module
            return self.head(out.last_hidden_state.float()).squeeze(-1).clone()

    def save(self, out_dir, state_dict=None) -> Path:
        """state_dict: the weights to write instead of the module's own (gathered from FSDP2 shards)."""
        from safetensors.torch import save_file

        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        state = self.state_dict() if state_dict is None else state_dict
        save_file({k: v.contiguous().cpu() for k, v in state.items()}, str(out / "critic.safetensors"))
        return out


# ---------------------------------------------------------------- turns and values (their tensors: trainer.learn.ppo_batch)


def freeze_vision(*models) -> list[tuple[torch.nn.Parameter, bool]]:
    """requires_grad off for each model's vision tower; returns what to restore."""
    saved = []
    for m in models:
        for p in m.visual.parameters():
            saved.append((p, p.requires_grad))
            p.requires_grad_(False)
    return saved


def turn_values(critic, tb, prefix: PrefixKV | None = None) -> torch.Tensor:
    """The critic's value before each generated token (read at the position that predicts it),
    flat in row order; tb: a TurnBatch or a ppo_batch.Pack, its target beside the critic; prefix:
    its rows' shared start under the critic (prefix_kv), or None."""
    v = critic(tb.inputs, prefix)
    target = suffix_target(tb.target, prefix)
    before = torch.zeros_like(target)
    before[:, :-1] = target[:, 1:]
    return v[before]


@torch.no_grad()
def bootstrap_value(critic, traj, processor) -> float:
    if not traj.truncated or traj.final_messages is None:
        return 0.0

    return float(critic(build_inputs(processor, traj.final_messages, add_generation_prompt=True))[0, -1])


def shaped_turn_rewards(traj, cfg: PPOConfig) -> list[float]:
    """Per generated turn: the env's reward minus the penalties, plus the progress and click terms."""
    shaped = [rl_rewards.shape_turn_reward(t.reward, parsed=t.parse_error is None, format_penalty=cfg.format_penalty,
                                           step_penalty=cfg.step_penalty) for t in traj.turns]
    if cfg.progress_reward:
        gains = rl_rewards.progress_rewards([t.progress for t in traj.turns], start=traj.start_progress)
        shaped = [r + cfg.progress_reward * g for r, g in zip(shaped, gains, strict=True)]
    if cfg.click_reward:
        near = rl_rewards.click_rewards([t.point for t in traj.turns], [t.expert_point for t in traj.turns],
                                        cfg.click_sigma)
        shaped = [r + cfg.click_reward * c for r, c in zip(shaped, near, strict=True)]
    if cfg.no_effect_penalty:
        idle = rl_rewards.no_effect_penalties([t.changed for t in traj.turns], cfg.no_effect_penalty)
        shaped = [r - p for r, p in zip(shaped, idle, strict=True)]
    return [r for r, t in zip(shaped, traj.turns, strict=True) if t.response_ids]


@torch.no_grad()
def score(policy, critic, trajs, turns: list[TurnBatch], processor, cfg: PPOConfig, ref=None) -> dict:
    """Proximal log-probs (and the reference's, given one), values, then decoupled GAE per
    trajectory; fills the TurnBatches. Forwards run over micro-batches of turns (trainer.learn.ppo_batch)."""
    dev = policy.device  # everything below lives beside the model (a learner on a GPU)
    kv_p, kv_c = prefix_kv(policy, turns, cfg.share_prefix), prefix_kv(critic.backbone, turns, cfg.share_prefix)
    kv_r = prefix_kv(ref, turns, cfg.share_prefix) if ref is not None else None
    for p in packs(turns, policy.config, dev, cfg.micro_batch_tokens, cfg.chain_turns):
        p.scatter("old_lp", pack_logprobs(policy, p, cfg.temperature, prefix=kv_p))
        if ref is not None:
            p.scatter("ref_lp", pack_logprobs(ref, p, cfg.temperature, prefix=kv_r))
        p.scatter("values", turn_values(critic, p, kv_c))
    rescored = 0
    for tb in turns:
        if tb.behaviour_lp is not None:
            tb.behaviour_lp = tb.behaviour_lp.to(dev)
            rescored += behaviour_after_rewrite(tb)
    stats = {"returns": [], "values": [], "lambdas": []}
    for i, tr in enumerate(trajs):
        mine = [tb for tb in turns if tb.traj == i]
        if not mine:
            continue
        lengths = [tb.tokens for tb in mine]
        # GAE runs on the CPU: a loop over tokens, cheaper there than as a GPU kernel launch per token
        rewards = rl_gae.place_turn_rewards(shaped_turn_rewards(tr, cfg), lengths)
        values = torch.cat([tb.values for tb in mine]).cpu()
        lam = rl_gae.adaptive_lambda(len(rewards), cfg.policy_alpha)
        stats["lambdas"].append(lam)
        adv_p, ret_c = rl_gae.decoupled_gae(rewards, values, gamma=cfg.gamma, lam_policy=lam, lam_critic=cfg.critic_lambda,
                                            last_value=bootstrap_value(critic, tr, processor), terminated=tr.terminated)
        for tb, a, r in zip(mine, adv_p.split(lengths), ret_c.split(lengths), strict=True):
            tb.adv, tb.ret = a.to(dev), r.to(dev)
        stats["returns"].append(ret_c)
        stats["values"].append(values)
    if cfg.whiten_advantages:
        all_adv = torch.cat([tb.adv for tb in turns])
        mean, std = all_adv.mean(), all_adv.std().clamp(min=1e-6) if all_adv.numel() > 1 else torch.ones((), device=dev)
        for tb in turns:  # whiten over the batch
            tb.adv = (tb.adv - mean) / std
    ret, val = torch.cat(stats["returns"]), torch.cat(stats["values"])
    # the policy's lambda as used: at alpha 0.05 it sits on its floor (0.9) below 200 tokens an episode,
    # so "length-adaptive" is constant for short GUI episodes; logged so a run shows which regime it is in
    return {"explained_variance": float(rl_losses.explained_variance(val, ret)),
            "lambda_policy": sum(stats["lambdas"]) / max(1, len(stats["lambdas"])),
            "lambda_at_floor": sum(x <= rl_gae.LAMBDA_MIN for x in stats["lambdas"]) / max(1, len(stats["lambdas"])),
            "behaviour_rescored": rescored / max(1, sum(tb.tokens for tb in turns))}


def behaviour_after_rewrite(tb: TurnBatch) -> int:
    """Give the tokens after the pointer's first rewritten site (agent.vlm.pointer.rewritten_from),
    or from a type content copied from the instruction (agent.vlm.typed_copy), whichever comes
    first, the proximal log-probs as their behaviour log-probs, so decoupled PPO weighs them 1: the
    actor recorded theirs after its own digits or text, which the reply no longer holds. Returns how
    many. (A content the model wrote right itself is counted too: the actor does not say which it
    copied, and the two log-probs differ only by the policy's staleness.)"""
    if tb.old_lp is None or tb.behaviour_lp is None:
        return 0
    n_prompt = int(tb.target.shape[1]) - tb.tokens
    starts = [pointer.rewritten_from(tb.pointer, n_prompt) if tb.pointer is not None else None, tb.copied]
    start = min((s for s in starts if s is not None), default=None)
    if start is None or start >= tb.tokens:
        return 0
    tb.behaviour_lp = tb.behaviour_lp.clone()
    tb.behaviour_lp[start:] = tb.old_lp[start:].to(tb.behaviour_lp.dtype)
    return tb.tokens - start


# ---------------------------------------------------------------- the updates


def critic_step(critic, opt, turns, cfg: PPOConfig, clip: bool = True) -> tuple[float, float]:
    """One pass of value regression over `turns` in minibatches (gradients accumulated over
    their micro-batches); returns (mean loss, share of tokens where value clipping held the
    critic back: high means value_clip is too tight for how far the returns moved)."""
    losses, clipped, counted = [], 0.0, 0
    for mb in minibatches(turns, cfg.minibatch_turns, cfg.chain_turns):
        n = sum(tb.tokens for tb in mb)
        opt.zero_grad(set_to_none=True)
        total = 0.0
        with _amp(critic.head.weight.device, cfg):
            kv = prefix_kv(critic.backbone, mb, cfg.share_prefix, grad=True)  # once per minibatch
        # with several learner processes each takes its share of the micro-batches (trainer.learn.distributed)
        for p, scale in _my_packs(mb, critic.backbone.config, critic.head.weight.device, cfg):
            with _amp(critic.head.weight.device, cfg):
                v = turn_values(critic, p, kv)
            ret, old = p.cat("ret"), p.cat("values")
            use_clip = cfg.value_clip if clip else None
            loss = rl_losses.value_loss(v, ret, old, clip=use_clip, reduction="sum") / n
            (loss * scale).backward()
            if not scale:  # FSDP2's padding step: every rank runs the same forwards and backwards
                continue
            total += float(loss.detach())
            if use_clip:
                clipped += float(rl_losses.value_clipfrac(v.detach(), ret, old, clip=use_clip)) * v.numel()
                counted += v.numel()
        if kv is not None:
            kv.backward()  # the micro-batches' gradients through the shared prefix, once
        D.all_reduce_grads(critic.parameters())  # summed over learner processes (none with one)
        nn.utils.clip_grad_norm_(critic.parameters(), cfg.max_grad_norm)
        opt.step()
        losses.append(total)
    part = D.all_sum_dict({"loss": sum(losses), "clipped": clipped, "counted": counted})  # over learner processes
    clipped, counted = part["clipped"], part["counted"]
    return part["loss"] / max(1, len(losses)), (clipped / counted if counted else 0.0)


def _policy_loss(policy, p: Pack, cfg: PPOConfig, prefix: PrefixKV | None = None) -> tuple[torch.Tensor, dict]:
    """A micro-batch's policy loss summed over its tokens (each weighted by its trajectory's
    weight), and its metrics as sums over tokens, so a pass can report token means."""
    lp, ent = pack_logprobs(policy, p, cfg.temperature, return_entropy=True, prefix=prefix)
    behaviour = None
    if cfg.behaviour_correction:
        if any(tb.behaviour_lp is None for tb in p.turns):
            raise ValueError("behaviour_correction needs the rollout's log-probs of every generated token "
                             "(Turn.logprobs, one per response id); some turns lack them")
        behaviour = p.cat("behaviour_lp")
    out = rl_losses.ppo_policy_loss(lp, p.cat("old_lp"), p.cat("adv"), clip_low=cfg.clip_low, clip_high=cfg.clip_high,
                                    clip_ratio_c=cfg.dual_clip, reduction="none", behaviour_log_probs=behaviour,
                                    imp_weight_cap=cfg.imp_weight_cap)
    per_token = out["loss"] - cfg.ent_coef * ent
    n = lp.numel()
    m = {"policy_loss": float(out["loss"].detach().sum()), "entropy": float(ent.detach().sum()),
         "approx_kl": float(out["approx_kl"]) * n, "clipfrac": float(out["clipfrac"]) * n}
    if cfg.kl_coef:  # keeps the policy near where it started (k3: unbiased, never negative)
        # capped per token, as verl's low_var_kl: tokens come from the behaviour policy, so a
        # token the policy has since pushed far below the start gives exp(log r) in the
        # thousands (seen: batch means of 2e4), and its gradient would swamp the batch's
        kl_ref = rl_losses.kl_estimate(lp, p.cat("ref_lp"), "k3").clamp(max=KL_REF_CAP)
        per_token = per_token + cfg.kl_coef * kl_ref
        m["kl_ref"] = float(kl_ref.detach().sum())
    if cfg.dual_clip:
        m["clipfrac_dual"] = float(out["clipfrac_dual"]) * n
    if behaviour is not None:
        kept = (1.0 - float(out["imp_weight_truncated"])) * n
        m |= {"imp_weight_mean": float(out["imp_weight_mean"]) * kept, "imp_kept": kept,
              "imp_weight_truncated": float(out["imp_weight_truncated"]) * n}
    return (per_token * p.token_weights()).sum(), m


def policy_step(policy, opt, turns, cfg: PPOConfig) -> dict:
    """One pass of the clipped policy loss over `turns`: per minibatch, the token-mean over its
    generated tokens, gradients accumulated over its micro-batches, then one optimizer step.
    Metrics are token means over the pass (imp_weight_mean over the tokens it kept)."""
    sums: dict[str, float] = {}
    stopped, tokens = False, 0
    for mb in minibatches(turns, cfg.minibatch_turns, cfg.chain_turns):
        n = sum(tb.tokens for tb in mb)  # token-mean over the minibatch
        tokens += n  # forward and backward were paid for, even when the step is not taken
        opt.zero_grad(set_to_none=True)
        mb_kl = 0.0
        with _amp(policy.device, cfg):
            kv = prefix_kv(policy, mb, cfg.share_prefix, grad=True)  # once per minibatch
        for p, scale in _my_packs(mb, policy.config, policy.device, cfg):
            with _amp(policy.device, cfg):
                loss, m = _policy_loss(policy, p, cfg, kv)
            (loss / n * scale).backward()
            if not scale:  # FSDP2's padding step
                continue
            mb_kl += m["approx_kl"] / n
            for k, v in m.items():
                sums[k] = sums.get(k, 0.0) + v
        if kv is not None:
            kv.backward()  # the micro-batches' gradients through the shared prefix, once
        mb_kl = D.all_sum_dict({"kl": mb_kl})["kl"]  # every process takes the same stop decision
        D.all_reduce_grads(policy.parameters())
        if cfg.target_kl is not None and mb_kl > cfg.target_kl:
            opt.zero_grad(set_to_none=True)  # this minibatch's step is not taken, nor any after it
            stopped = True
            break
        nn.utils.clip_grad_norm_(policy.parameters(), cfg.max_grad_norm)
        opt.step()
    sums = D.all_sum_dict(sums)
    kept = sums.pop("imp_kept", None)
    out = {k: v / max(1, tokens) for k, v in sums.items()}
    if kept is not None:  # a mean over the tokens the cap kept, not over all
        out["imp_weight_mean"] = sums["imp_weight_mean"] / kept if kept else 1.0
    return {**out, "kl_stopped": stopped, "tokens": tokens}


def _my_packs(turns, config, device, cfg: PPOConfig):
    """(micro-batch, loss scale) for this rank's share of a minibatch's micro-batches: every
    world-th one (scale 1: gradients are summed over replicas), or under FSDP2 an even share
    padded with zero-scale repeats, scaled by the world size (FSDP2 averages gradients)."""
    ps = packs(turns, config, device, cfg.micro_batch_tokens, cfg.chain_turns)
    world = D.rank_world()[1]
    if cfg.shard == "fsdp" and world > 1:
        return ((p, float(world) if real else 0.0) for p, real in D.even_share(ps))
    return ((p, 1.0) for p in D.my_share(ps))


def _amp(device, cfg: PPOConfig):
    """bf16 autocast on `device` when cfg.bf16 (else a no-op context); backward runs outside it."""
    return torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=cfg.bf16)


def batch_metrics(trajs, tokenizer=None) -> dict:
    """The batch's rollout metrics; with `tokenizer` also "think_tokens", the thought's tokens per turn
    (the reply before its "Action:"; think_length counts its words)."""
    import re

    turns = [t for tr in trajs for t in tr.turns]
    thought_texts = [re.sub(r"^\s*Thought:\s*", "", re.split(r"\nAction", t.text)[0]) for t in turns]
    thoughts = [len(text.split()) for text in thought_texts]
    asked = [t for t in turns if t.expert_point is not None]  # turns whose state has an expert click
    near = rl_rewards.click_rewards([t.point for t in asked], [t.expert_point for t in asked])
    acted = [t.changed for t in turns if t.changed is not None]
    return {
        "reward": sum(sum(t.reward for t in tr.turns) for tr in trajs) / len(trajs),
        "success_rate": sum(tr.success for tr in trajs) / len(trajs),
        "episode_length": sum(len(tr.turns) for tr in trajs) / len(trajs),
        "think_length": sum(thoughts) / max(1, len(thoughts)),
        "tokens_per_turn": sum(len(t.response_ids) for t in turns) / max(1, len(turns)),
        "parse_error_rate": sum(t.parse_error is not None for t in turns) / max(1, len(turns)),
        "truncated_rate": sum(tr.truncated for tr in trajs) / len(trajs),
        # how near the rollouts' clicks come to the expert's (rl.rewards.click_rewards, sigma 0.05): grounding
        "click_score": sum(near) / len(near) if near else float("nan"),
        # of the turns whose action ran and did not end the episode, the share that changed nothing on screen
        "no_effect_rate": sum(c is False for c in acted) / len(acted) if acted else float("nan"),
        **({"think_tokens": sum(len(tokenizer(text, add_special_tokens=False)["input_ids"]) for text in thought_texts)
            / max(1, len(thought_texts))} if tokenizer is not None else {}),
        # the share of turns that called a terminal or file tool, and of turns that saw a tool's output
        "tool_rate": sum(any(a.name in TOOL_ACTIONS for a in t.actions) for t in turns) / max(1, len(turns)),
        "tool_output_rate": sum(t.tool_output is not None for t in turns) / max(1, len(turns)),
    }


# ---------------------------------------------------------------- the learner


class Learner:
    """The learner's side of PPO: the policy, its critic (made here from the policy's weights)
    and their optimizers. `value_pretrain(trajs)` fits the critic alone; `update(trajs)` is one
    PPO update (score, then `epochs` passes of policy and critic steps) and returns its metrics.
    With cfg.train_vision off, both vision towers are frozen until `close()`."""

    def __init__(self, policy, processor, cfg: PPOConfig):
        self.policy, self.processor, self.cfg = policy, processor, cfg
        self.critic = Critic(policy)
        # frozen, the two vision towers stay equal, so the critic can use the policy's image features
        self._frozen = [] if cfg.train_vision else freeze_vision(policy.model, self.critic.backbone)
        self.ref = None  # the start policy, frozen, for the KL penalty
        if cfg.kl_coef:
            self.ref = copy.deepcopy(policy).eval().requires_grad_(False)
        if cfg.shard == "fsdp" and D.rank_world()[1] > 1:  # before the optimizers: they hold the shards
            for m, vision in ((policy, policy.model.visual), (self.critic, self.critic.backbone.visual),
                              (self.ref, self.ref.model.visual if self.ref is not None else None)):
                if m is not None:
                    D.shard_keeping_whole(m, [vision])
        self.opt_p = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=cfg.lr, weight_decay=0.0)
        self.opt_c = torch.optim.AdamW([p for p in self.critic.parameters() if p.requires_grad], lr=cfg.critic_lr,
                                       weight_decay=0.0)

    def _scored(self, trajs, with_ref: bool = True) -> tuple[list[TurnBatch], dict]:
        """The batch's turns with proximal log-probs (and the start policy's, for the policy's
        KL penalty), values and advantages; explained variance."""
        self.policy.eval()
        with _amp(self.policy.device, self.cfg):
            turns = prepare_turns(trajs, self.processor, self.policy, self.cfg)
            ref = self.ref if with_ref else None
            return turns, score(self.policy, self.critic, trajs, turns, self.processor, self.cfg, ref)

    def value_pretrain(self, trajs) -> dict:
        cfg = self.cfg
        turns, sc = self._scored(trajs, with_ref=False)  # the critic alone: no policy loss, no penalty
        vl = [critic_step(self.critic, self.opt_c, turns, cfg, clip=False)[0] for _ in range(cfg.value_pretrain_epochs)]
        return {"value_loss": vl[-1], **sc}

    def update(self, trajs) -> dict:
        cfg, policy = self.cfg, self.policy
        t0 = time.perf_counter()
        turns, sc = self._scored(trajs)
        policy.train()
        stopped_at, policy_tokens = None, 0
        for epoch in range(cfg.epochs):
            if stopped_at is None:
                pm = policy_step(policy, self.opt_p, turns, cfg)
                policy_tokens += pm.pop("tokens")
                if pm.pop("kl_stopped"):
                    stopped_at = epoch
            vl, vclip = critic_step(self.critic, self.opt_c, turns, cfg)
        policy.eval()
        n_tok = sum(int(tb.target.sum()) for tb in turns)
        seconds = time.perf_counter() - t0  # scoring included: all the learner's work on this batch
        return {**pm, "value_loss": vl, "value_clipfrac": vclip, **sc, "learner_seconds": seconds,
                "policy_epochs": cfg.epochs if stopped_at is None else stopped_at,  # full passes taken
                "learner_tokens": n_tok,  # the batch's generated tokens
                "policy_tokens": policy_tokens,  # of those, times the passes they went through (fewer once KL stops)
                "learner_tokens_per_s": policy_tokens / max(seconds, 1e-9)}

    def close(self) -> None:
        for p, flag in self._frozen:
            p.requires_grad_(flag)
        self._frozen = []


# ---------------------------------------------------------------- the loop


def train_ppo(policy, processor, cfg: PPOConfig, *, model_dir, work_dir, env: EnvSpec, families=None, log=None,
              memory: MemorySpec | None = None, progress: bool = True, on_update=None) -> dict:
    """Value pretraining, then `cfg.updates` PPO updates, episodes played in sandboxes made from `env`
    with the agent's `memory` (MemorySpec's defaults when None). Returns the critic and a summary; with
    LoRA (cfg.lora_r) `policy` ends with its adapters in place, unmerged, and "peft" is the
    wrapper that saves them.

    Inside a torch.distributed process group (trainer.learn.distributed.launch), rank 0 alone runs the
    rollouts, publishes weights and logs; every batch (and rank 0's Python RNG state, which
    shuffles the minibatches) is broadcast, each rank runs its share of every minibatch's
    micro-batches, and gradients are summed before each optimizer step, so all ranks keep equal
    weights. Scoring (old log-probs, values, GAE) is repeated on every rank."""
    import random

    from tqdm import tqdm

    if not isinstance(env, EnvSpec):
        raise TypeError(f"train_ppo's env must be a trainer.rollout.specs.EnvSpec, got {type(env).__name__}")
    memory = memory if memory is not None else MemorySpec()

    torch.manual_seed(cfg.seed)
    fsdp = cfg.shard == "fsdp" and D.rank_world()[1] > 1
    if fsdp:
        check_fsdp(cfg)
    if fsdp or cfg.grad_checkpointing:
        # FSDP2: a prefix's backward would bypass its gather hooks; checkpointing: transformers drops the
        # cache a shared prefix needs. Either way every row forwards whole
        cfg = replace(cfg, share_prefix=False)
    # checkpointing on; LoRA's adapters go into `policy` itself (base frozen), so everything below trains
    # them through it; under FSDP2 the base stays float32 (its per-layer buffers hold one dtype)
    trained = prepare_model(policy, cfg, bf16_base=not fsdp)
    peft_model = trained if cfg.lora_r else None  # peft's wrapper of `policy`: it saves the adapter
    work_dir = Path(work_dir)
    actor = ActorSpec(temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens,
                      inference_dtype=cfg.inference_dtype)
    rank, world = D.rank_world()
    progress = progress and rank == 0

    # -- rollouts: worker processes, or this process; either way `n_envs` envs per batched generation
    pool: RolloutSource | None = None
    envs = []
    if rank > 0:
        collect = None  # batches come from rank 0
    elif cfg.n_workers > 0:
        spec = WorkerSpec(str(model_dir), str(work_dir / "weights"), env=env, memory=memory, actor=actor,
                          episode=EpisodeSpec(end_on_parse_error=cfg.end_on_parse_error),
                          n_envs=cfg.n_envs, inference=cfg.inference, inference_gpus=cfg.inference_gpus)
        if cfg.engine == "ray":
            pool = RayRolloutPool(spec, cfg.n_workers, mode=cfg.mode, max_staleness=cfg.max_staleness,
                                  staleness_decay=cfg.staleness_decay, seed_start=cfg.seed * 100_000,
                                  families=families, address=cfg.ray_address).start(policy)
        else:
            pool = RolloutPool(spec, cfg.n_workers, mode=cfg.mode, max_staleness=cfg.max_staleness,
                               staleness_decay=cfg.staleness_decay, seed_start=cfg.seed * 100_000,
                               families=families).start(policy)
        collect = lambda: pool.collect(cfg.batch_episodes)
    else:
        # fp32: the learner's own model plays; bf16: a copy of its own, the master weights cast into it per batch
        copy = cfg.inference_dtype != "fp32"
        local = (VLMActor.load(model_dir, **actor.kwargs()) if copy else
                 VLMActor(policy, processor, temperature=actor.temperature, max_new_tokens=actor.max_new_tokens))
        envs = make_envs(min(cfg.n_envs, cfg.batch_episodes), **env.kwargs())
        runner = EpisodeRunner(local, envs, memory_kw=memory.kwargs(), end_on_parse_error=cfg.end_on_parse_error)
        seeds = iter(range(cfg.seed * 100_000, 10**9))

        def collect():
            policy.eval()
            if copy:
                local.load_state(plain_state_dict(policy), "the learner's weights")
            local.cache.clear_features()  # the weights changed in place: cached features and prefixes with them
            fams = families or [None]
            return runner.run_all([(s, fams[s % len(fams)]) for s in (next(seeds) for _ in range(cfg.batch_episodes))])

    def batch():
        """The next batch of trajectories, the same on every rank."""
        trajs, state = D.broadcast_object((collect(), random.getstate()) if rank == 0 else None)
        random.setstate(state)
        return trajs

    learner = Learner(policy, processor, cfg)  # after the rollout side is up: close() is in the finally
    history = []
    step = -1  # the last update taken
    t_start = time.perf_counter()
    try:
        # -- value pretraining: fit the critic to lambda=1 returns of the frozen policy
        for k in tqdm(range(cfg.value_pretrain_iters), desc="value pretraining", disable=not progress or None):
            trajs = batch()
            row = {**learner.value_pretrain(trajs), **batch_metrics(trajs, getattr(processor, "tokenizer", None))}
            if log is not None:
                log.log(k, "value_pretrain", **row)
            history.append({"phase": "value_pretrain", **row})

        # -- PPO updates
        for update in tqdm(range(cfg.updates), desc="ppo", disable=not progress or None):
            t0 = time.perf_counter()
            trajs = batch()
            t_roll = time.perf_counter() - t0
            row = {**batch_metrics(trajs, getattr(processor, "tokenizer", None)), **learner.update(trajs),
                   "rollout_seconds": t_roll}
            state = D.full_state_dict(policy, cfg.shard)  # FSDP2: gathered by every rank, kept by rank 0
            if state and peft_model is not None:  # rank 0 holds the gathered state; the others an empty one

                state = plain_state_dict(policy, state)  # the workers' plain model: adapters added in
            if pool is not None:
                row["version"] = pool.publish(policy if state is None else state)
                row["dropped_stale"] = pool.stats["dropped"]
                lags = pool.stats["lags"][-len(trajs):]
                row["mean_lag"] = sum(lags) / max(1, len(lags))
                for k in ("requests_per_generation", "rows_per_generation"):  # a shared inference actor's batching
                    if k in pool.stats:
                        row[k] = pool.stats[k]
            step = update
            if log is not None:
                log.log(update, "ppo", **row)
            history.append({"phase": "ppo", **row})
            if on_update is not None:
                on_update(update, row)
            if D.broadcast_object(cfg.max_minutes is not None and time.perf_counter() - t_start > 60 * cfg.max_minutes):
                break
    finally:
        learner.close()
        if pool is not None:
            pool.close()
        for env in envs:
            env.close()
        if cfg.grad_checkpointing:
            policy.activation_checkpointing_disable()
    return {"critic": learner.critic, "history": history, "updates": step + 1, "config": asdict(cfg),
            "peft": peft_model}
