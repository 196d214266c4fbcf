"""PPO's settings (trainer.learn.ppo's PPOConfig), apart from the algorithm so that reading them, and
deriving `train ppo`'s flags from them (trainer.config_flags), needs no torch."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from trainer.config_flags import check, knob
from trainer.learn.sft import ScaleConfig

ENGINES, MODES, INFERENCE = ("local", "ray"), ("async", "sync"), ("own", "shared")
INFERENCE_DTYPES = ("fp32", "bf16")  # trainer.rollout.specs's (kept here too: reading a config needs no sandbox)


@dataclass
class PPOConfig(ScaleConfig):
    """One PPO run; the flags of `train ppo` are these fields (trainer.config_flags), and `train
    default` and `flywheel run` hold one as their `ppo` settings. validate() names a bad one."""
    NAME: ClassVar[str] = "ppo"
    updates: int = knob(10, "PPO updates (0: value pretraining only; the flywheel then skips its PPO stage)")
    batch_episodes: int = knob(8, "episodes per update", flag="batch")
    epochs: int = knob(2, "passes over each batch")
    minibatch_turns: int = knob(8, "turns per minibatch (one optimizer step each)")
    lr: float = knob(2e-4, "learning rate of the policy")
    critic_lr: float = knob(1e-3, "learning rate of the critic")
    clip_low: float = knob(0.2, "PPO's clip range below 1 (ratio >= 1 - clip_low)")
    clip_high: float = knob(0.28, "PPO's clip range above 1 (clip-higher: >= clip_low)")
    # dual clip (rl.losses.ppo_policy_loss's clip_ratio_c, > 1, e.g. 3): a negative-advantage token's loss is
    # bounded by -A * c, so one token whose ratio ran away cannot dominate the batch; None: off
    dual_clip: float | None = knob(None, "dual-clip PPO: bound a negative-advantage token's loss at -A*C (C > 1, e.g. 3; "
                                         "default off)", metavar="C")
    value_clip: float | None = knob(0.5, "clip range of the critic's values around the batch's (none: no clipping)")
    ent_coef: float = knob(0.0, "weight of the entropy bonus")
    kl_coef: float = knob(0.0, "weight of a per-token KL penalty (k3) to the policy PPO started from (0: none, no "
                               "copy kept)")
    gamma: float = knob(1.0, "discount per generated token")
    critic_lambda: float = knob(1.0, "GAE lambda of the critic's targets (decoupled GAE)")
    # off: the policy loss sees GAE's advantages on the rewards' own scale, so an update's step size follows the
    # batch's returns (a batch of near-equal outcomes moves the policy little instead of being blown up to std 1)
    whiten_advantages: bool = knob(True, "whiten the batch's advantages (mean 0, std 1) before the policy loss")
    # length-adaptive lambda = 1 - 1/(alpha * l), clamped to [0.9, 0.9999]: at 0.05 every episode under 200
    # generated tokens gets the floor 0.9 (most GUI episodes here: see "lambda_at_floor" in the metrics);
    # 0.2 makes it vary over 50-5,000 tokens
    policy_alpha: float = knob(0.05, "alpha of the length-adaptive policy lambda 1 - 1/(alpha * l)")
    value_pretrain_iters: int = knob(2, "critic-only iterations before PPO", flag="value-pretrain", metavar="K")
    value_pretrain_epochs: int = knob(4, "passes over each value-pretraining batch")
    temperature: float = knob(1.0, "sampling temperature of the rollouts")
    max_new_tokens: int = knob(64, "tokens the policy may generate per turn")
    # the rollout copies' dtype; the learner's master weights stay float32 and are cast for each copy they
    # are published to. fp32 by default: see the README's "bf16 inference" result for what bf16 changes
    inference_dtype: str = knob("fp32", "dtype of the policy copies that play the rollouts (each worker's, or one in "
                                        "this process with workers 0); the learner stays float32",
                                choices=INFERENCE_DTYPES)
    # an unparseable turn costs this. It does not end the episode (the agent is asked again)
    # while a wrong click may, so the penalty must outweigh what a retry can still win, or the
    # policy is paid to stall. On the default model, at 0.1 the share of unparseable turns climbed
    # from 0.33 to 0.69 in 12 updates; at 0.5 with target_kl 0.1 it stayed at 0.23-0.44 over 10,
    # though it still climbed in runs whose replies grew longer (policy_alpha 1.0 kept them flat).
    format_penalty: float = knob(0.5, "reward subtracted for a turn whose output does not parse (must outweigh a "
                                      "retry's chance)")
    step_penalty: float = knob(0.0, "reward subtracted per turn")
    progress_reward: float = knob(0.0, "weight of shaping by the verifier's partial progress (each subgoal met earns "
                                       "its share)")
    click_reward: float = knob(0.0, "weight of a dense grounding reward (rl.rewards.click_rewards): each click earns "
                                    "exp(-d^2/2s^2) for its distance d to where the task's expert would click")
    click_sigma: float = knob(0.05, "the click reward's width s, a fraction of the screenshot")
    # subtracted for a turn whose action left the screen exactly as it was (rl.rewards.no_effect_penalties)
    no_effect_penalty: float = knob(0.0, "reward subtracted for a turn whose action left the screen exactly as it was "
                                         "(a click on nothing, a re-click of what is selected)")
    end_on_parse_error: bool = knob(False, "a rollout ends at an output that does not parse (default: the agent is "
                                           "asked again)")
    max_grad_norm: float = knob(1.0, "max gradient norm of a policy or critic step")
    n_workers: int = knob(2, "rollout worker processes (0: in the learner's process)", flag="workers")
    engine: str = knob("local", "rollout workers: local processes (trainer.rollout.pool) or Ray actors "
                                "(trainer.rollout.ray_pool), here or on a cluster (--ray-address)", choices=ENGINES)
    ray_address: str | None = knob(None, "with engine ray: the cluster to join (auto, or HEAD:6379 after `ray start "
                                         "--head`); default: start a local Ray")
    # with engine "ray": each rollout actor generates with its own policy copy ("own"), or one inference actor
    # does for all of them ("shared", with inference_gpus GPUs from Ray) - trainer.rollout.ray_pool
    inference: str = knob("own", "with engine ray: each rollout actor generates with its own policy copy (own), or "
                                 "one inference actor generates for all of them while they step sandboxes (shared)",
                          choices=INFERENCE)
    inference_gpus: float = knob(0.0, "with inference shared: GPUs the inference actor asks Ray for (0: a CPU)")
    # sandbox envs per rollout worker (or in the learner's process), each in a process of its own,
    # stepped together with one batched generation per round (trainer.rollout.runner.EpisodeRunner)
    n_envs: int = knob(16, "sandbox environments per rollout worker, played together with one batched generation "
                           "per round", flag="envs")
    mode: str = knob("async", "rollouts while the learner trains (async) or between its updates (sync)", choices=MODES)
    max_staleness: int = knob(1, "async: the most policy versions a batch's episodes may lag")
    staleness_decay: float = knob(1.0, "async: weight of an episode per version of lag")
    seed: int = knob(0, "random seed")
    max_minutes: float | None = knob(None, "wall-clock budget (stops after the update that crosses it)", flag="minutes")
    train_vision: bool = knob(False, "train the vision tower too (default: frozen, each screenshot encoded once per "
                                     "batch)")
    # stop an update's policy passes at the first minibatch whose approx_kl to the batch's policy
    # exceeds this (None: never); one update of the default model once jumped to 3.7 without it
    target_kl: float | None = knob(None, "stop an update's policy passes once a minibatch's approx_kl exceeds this")
    # turns per forward: padded micro-batches of at most this many tokens (rows x longest row, prompt
    # included; trainer.learn.ppo_batch), gradients accumulated up to each minibatch's optimizer step.
    # 0: one turn per forward (the sequential path). Results do not depend on it (up to float sums).
    # None: by device (ppo_batch.budget_for): 2048 on a CPU (1.5x with share_prefix, measured), 8192 on a GPU
    micro_batch_tokens: int | None = knob(None, "tokens per padded micro-batch of turns (0: one turn per forward; "
                                                "none: by device)")
    # the prompt start all turns of a pass share (system message + UI-TARS prompt, ~300 tokens) is forwarded
    # once per model and pass (score: the batch; policy/critic steps: each minibatch) and its keys and values
    # reused by every micro-batch (trainer.learn.ppo_batch.PrefixKV); exact, gradients included. Off, or when the
    # turns share fewer than ppo_batch.MIN_SHARED_PREFIX tokens: every row forwards its whole prompt
    share_prefix: bool = knob(True, "forward the turns' shared prompt start once per pass (exact)")
    # turns of one episode whose sequences extend one another (prompt and reply the start of the next
    # turn's prompt) share one row (trainer.learn.ppo_batch.chain_turns): exact, each turn's tokens computed
    # once; minibatches are then filled with shuffled chains (split where one overflows) instead of
    # shuffled turns, so an episode's turns tend to share a minibatch
    chain_turns: bool = knob(True, "one row for the turns of an episode that extend one another (exact)")
    # decoupled PPO (AReaL): ratio against the proximal policy (this batch's, from score()), each token's
    # loss weighted by pi_prox / pi_behav of the rollout that sampled it; a weight above the cap drops
    # the token (rl.losses.behaviour_weights). Off: the ratio's reference is the proximal policy alone.
    behaviour_correction: bool = knob(True, "decoupled PPO: weight each token by pi_prox / pi_behav of its rollout")
    imp_weight_cap: float | None = knob(2.0, "drop a token whose pi_prox / pi_behav exceeds this (> 1; none: no cap)")
    # the memory fields (bf16, grad_checkpointing, lora_*, shard) are ScaleConfig's, as `train sft` has them.
    # grad_checkpointing turns share_prefix off (transformers drops the cache a shared prefix needs while
    # checkpointing). LoRA adapters go on the policy and on the critic's copy of the backbone; with bf16 the
    # frozen base is bf16 (float32 under FSDP2, whose layer buffers hold one dtype); rollout workers get the
    # merged weights (trainer.learn.lora.plain_state_dict). shard "fsdp" shards policy, critic and reference per
    # decoder layer (the frozen vision tower stays whole), needs rollout workers (rank 0 cannot generate
    # alone with a sharded model) and shares no prefix.

    def validate(self) -> None:
        """Raise config_flags.ConfigError naming the first setting that cannot work."""
        super().validate()
        for name in ("batch_episodes", "epochs", "minibatch_turns", "value_pretrain_epochs",
                     "max_new_tokens", "n_envs"):
            check(getattr(self, name) >= 1, f"ppo.{name}", "must be at least 1", getattr(self, name))
        for name in ("updates", "value_pretrain_iters", "n_workers", "max_staleness"):
            check(getattr(self, name) >= 0, f"ppo.{name}", "must be >= 0", getattr(self, name))
        for name in ("lr", "critic_lr", "clip_low", "policy_alpha", "temperature", "click_sigma", "max_grad_norm",
                     "staleness_decay"):
            check(getattr(self, name) > 0, f"ppo.{name}", "must be > 0", getattr(self, name))
        for name in ("format_penalty", "step_penalty", "progress_reward", "click_reward", "no_effect_penalty",
                     "kl_coef", "ent_coef", "inference_gpus"):
            check(getattr(self, name) >= 0, f"ppo.{name}", "must be >= 0", getattr(self, name))
        check(self.clip_high >= self.clip_low, "ppo.clip_high", f"must be >= clip_low ({self.clip_low})", self.clip_high)
        check(0 < self.gamma <= 1, "ppo.gamma", "must be in (0, 1]", self.gamma)
        check(0 <= self.critic_lambda <= 1, "ppo.critic_lambda", "must be in [0, 1]", self.critic_lambda)
        check(self.dual_clip is None or self.dual_clip > 1, "ppo.dual_clip", "must be > 1", self.dual_clip)
        check(self.value_clip is None or self.value_clip > 0, "ppo.value_clip", "must be > 0", self.value_clip)
        check(self.target_kl is None or self.target_kl > 0, "ppo.target_kl", "must be > 0", self.target_kl)
        check(self.max_minutes is None or self.max_minutes > 0, "ppo.max_minutes", "must be > 0", self.max_minutes)
        check(self.micro_batch_tokens is None or self.micro_batch_tokens >= 0, "ppo.micro_batch_tokens",
              "must be >= 0 (0: one turn per forward)", self.micro_batch_tokens)
        check(self.imp_weight_cap is None or self.imp_weight_cap > 1, "ppo.imp_weight_cap", "must be > 1 (none: no cap)",
              self.imp_weight_cap)
        check(self.inference_dtype in INFERENCE_DTYPES, "ppo.inference_dtype", f"must be one of {INFERENCE_DTYPES}",
              self.inference_dtype)
        ray = self.engine == "ray"
        check(not ray or self.n_workers >= 1, "ppo.n_workers", "must be at least 1 with engine 'ray' (Ray actors)",
              self.n_workers)
        check(ray or not self.ray_address, "ppo.ray_address", "is for engine 'ray'", self.ray_address)
        check(ray or self.inference == "own", "ppo.inference", "'shared' is for engine 'ray'", self.inference)
        check(self.inference == "shared" or not self.inference_gpus, "ppo.inference_gpus", "is for inference 'shared'",
              self.inference_gpus)


def check_fsdp(cfg: PPOConfig) -> None:
    """Raise ValueError, naming the flag, for what FSDP2 PPO cannot run with."""
    if cfg.n_workers < 1:
        raise ValueError("--shard fsdp needs rollout workers (--workers 1 or more): the learner's sharded model "
                         "cannot generate on rank 0 alone")
    if cfg.train_vision:
        raise ValueError("--shard fsdp keeps the vision tower whole and frozen; --train-vision is not supported with it")
