"""The flywheel's settings (FlywheelConfig): its own, plus its CT, SFT and PPO stages' configs.
Apart from the iteration so that `flywheel run`'s flags (derived from the fields,
trainer.config_flags) come without the store, the sandbox or a model."""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import ClassVar

from trainer.config_flags import (
    ConfigError,
    check,
    check_choices,
    from_dict,
    knob,
    nested,
    tie,
    validate_nested,
    with_values,
)
from trainer.flywheel import FlywheelError
from trainer.flywheel.evaluation import seeds_per_family
from trainer.flywheel.routing import RoutingConfig
from trainer.learn.ppo_config import INFERENCE_DTYPES, PPOConfig
from trainer.learn.sft import ScaleConfig, SFTConfig
from trainer.recipe.default_model import RecipeConfig
from trainer.sandbox.families import FAMILIES
from trainer.sandbox.games import registry as game_registry

CONFIG_KEY = "flywheel.config"


def default_families() -> list[str]:
    return next(f for f in fields(RecipeConfig) if f.name == "families").default_factory()  # not a whole recipe


SCALE = tuple(f.name for f in fields(ScaleConfig))  # the flywheel trains in one process, float32, every weight


@dataclass
class FlywheelConfig:
    """One flywheel's settings: its own plus its CT, SFT and PPO stages' configs (their max_steps /
    updates of 0 skip a stage). `flywheel run`'s flags are these fields (trainer.config_flags); the
    store keeps them (setting "flywheel.config") nested, and still loads the flat form saved before."""
    NAME: ClassVar[str] = "flywheel"
    width: int = knob(336, "sandbox screen width (the shipped default model's, pixel-exact for it)")
    height: int = knob(252, "sandbox screen height")
    families: list[str] = knob(help="comma-separated sandbox families", factory=default_families)
    # the games are a pool of their own: scored, not passed, so they never join the families' success rates
    games: list[str] = knob(help="comma-separated browser games as a task pool beside the families: PPO also plays "
                                 "them (reward: normalized score gained) and the candidate's normalized game scores are "
                                 "reported apart, never part of promotion (default: none)", factory=list)
    game_episodes: int = knob(2, "held-out episodes per game in the candidate's game evaluation (the same seeds "
                                 "every iteration)")
    eval_episodes: int = knob(200, "held-out episodes each model plays per iteration, on fresh seeds (rounded up to "
                                   "whole seeds per family)")
    miniwob_episodes: int = knob(5, "MiniWoB++ episodes per task for the candidate: a transfer check, never part of "
                                    "promotion (0: skip)")
    rollouts: int = knob(12, "on-policy episodes the current model plays per iteration")
    rollout_temperature: float = knob(1.0, "sampling temperature of those episodes")
    ct: SFTConfig = nested(lambda: SFTConfig(lr=5e-4, max_steps=15), "CT on the CT pool", prefix="ct-",
                           renamed={"max_steps": "--ct-steps"}, helps={"max_steps": "CT optimizer steps (0: skip CT)"},
                           skip=SCALE, tied=("seed",))
    # SFT continues a trained model: at the from-scratch rate (2e-3) one round took the shipped model from 55.3% to
    # 36.1% held out; at 5e-4, on the same data and seeds, to 50.5% (measured, README Results)
    sft: SFTConfig = nested(lambda: SFTConfig(lr=5e-4, max_steps=100, warmup_steps=5), "SFT on the SFT pool",
                            prefix="sft-", renamed={"max_steps": "--sft-steps"},
                            helps={"max_steps": "SFT optimizer steps (0: skip SFT)"}, skip=SCALE, tied=("seed",))
    dpo_steps: int = knob(20, "DPO steps on preference pairs from supervisors' corrections (0: skip)")
    dpo_beta: float = knob(0.1, "DPO beta")
    dpo_lr: float = knob(2e-4, "DPO learning rate")
    dpo_nll: float = knob(1.0, "weight of the chosen reply's mean token NLL beside the DPO loss (RPO; 0: DPO alone)")
    # PPO: rollouts in this process (workers 0) are best on 2 cores; its seed is the flywheel's plus the iteration.
    # Sampling, step size and the KL to the model it starts from as the default model's recipe has them (lr 1e-4,
    # temperature 0.5, k3 KL 0.05, target_kl 0.1, policy_alpha 1.0; there the KL kept the reply format). In one
    # flywheel iteration the earlier lr 2e-4, temperature 1, no KL did as well (50.0% vs 50.9%, 112 episodes)
    ppo: PPOConfig = nested(lambda: PPOConfig(updates=3, batch_episodes=6, lr=1e-4, n_workers=0, value_pretrain_iters=1,
                                              max_new_tokens=48, temperature=0.5, kl_coef=0.05, target_kl=0.1,
                                              policy_alpha=1.0),
                            "PPO on the sandbox", prefix="ppo-", bare=("ray_address",),
                            helps={"updates": "PPO updates (0: skip PPO)"}, skip=SCALE,
                            tied=("seed", "max_new_tokens", "inference_dtype"))
    max_new_tokens: int = knob(48, "tokens a model may generate per turn (rollouts, PPO, evaluation)")
    inference_dtype: str = knob("fp32", "dtype of the models that play (rollouts, PPO's rollouts, evaluation); "
                                        "training keeps float32 weights", choices=INFERENCE_DTYPES)
    max_steps: int | None = knob(None, "cap on an episode's steps (none: each family's own limit)")
    min_gain: float = knob(0.0, "promote only if the paired 95%% interval of the gain lies above this")
    base: str = knob("default", "the first model: the shipped default model when it fits the screen size (default), or "
                                "random weights (scratch)", choices=("default", "scratch"))
    # none: the cores other work leaves free (agent.threads), so 2 busy cores give 1 thread, not 2 that wait on each other
    threads: int | None = knob(None, "torch threads (none: the cores other work leaves free)")
    seed: int = knob(0, "random seed")
    routing: dict = knob(help="RoutingConfig fields", factory=dict, cli=False)

    # keys of configs saved before the stages nested, where "<stage>_<field>" does not name the field
    LEGACY: ClassVar[dict] = {"ct_steps": "ct.max_steps", "sft_steps": "sft.max_steps", "batch": ("ct.batch_size", "sft.batch_size"),
                              "ppo_batch": "ppo.batch_episodes", "ppo_workers": "ppo.n_workers",
                              "ray_address": "ppo.ray_address"}

    def __post_init__(self):
        tie(self)
        self.validate()

    def validate(self) -> None:
        """Raise config_flags.ConfigError naming the first setting that cannot work."""
        check_choices(self)
        check(self.threads is None or int(self.threads) >= 1, "flywheel.threads", "must be at least 1", self.threads)
        for name in ("eval_episodes", "max_new_tokens", "game_episodes"):
            check(int(getattr(self, name)) >= 1, f"flywheel.{name}", "must be at least 1", getattr(self, name))
        for name in ("miniwob_episodes", "dpo_steps", "rollouts"):
            check(int(getattr(self, name)) >= 0, f"flywheel.{name}", "must be >= 0", getattr(self, name))
        check(self.max_steps is None or self.max_steps >= 1, "flywheel.max_steps", "must be at least 1", self.max_steps)
        check(self.dpo_beta > 0 and self.dpo_lr > 0, "flywheel.dpo_beta", "and dpo_lr must be > 0",
              (self.dpo_beta, self.dpo_lr))
        check(self.dpo_nll >= 0, "flywheel.dpo_nll", "must be >= 0", self.dpo_nll)
        check(bool(self.families), "flywheel.families", "is empty", self.families)

        unknown = [f for f in self.families if f not in FAMILIES]
        if unknown:
            raise ConfigError("flywheel.families", f"has an unknown sandbox family {unknown[0]!r}; known: "
                                                   f"{', '.join(FAMILIES)}")
        if self.games:
            try:
                game_registry.parse_games(",".join(self.games))
            except game_registry.GameError as e:
                raise ConfigError("flywheel.games", str(e)) from None
        validate_nested(self)

        try:
            RoutingConfig.from_dict(self.routing)
        except FlywheelError as e:
            raise ConfigError("flywheel.routing", str(e)) from None

    @property
    def eval_seeds(self) -> int:
        """Held-out seeds per family in one evaluation."""
        return seeds_per_family(self.eval_episodes, self.families)

    @property
    def env_kw(self) -> dict:
        kw = {"width": self.width, "height": self.height}
        if self.max_steps:
            kw["max_steps"] = self.max_steps
        return kw

    @classmethod
    def from_dict(cls, d: dict) -> FlywheelConfig:
        """A saved config: nested (asdict), or flat as saved before the stages nested."""
        d = dict(d)
        if "eval_seeds" in d:  # configs saved before evaluations were counted in episodes
            d.setdefault("eval_episodes", int(d.pop("eval_seeds")) * len(d.get("families") or default_families()))
        return from_dict(cls, d, legacy=cls.LEGACY)

    @classmethod
    def load(cls, store, **overrides) -> FlywheelConfig:
        """The store's saved config (setting "flywheel.config") with overrides ({dotted field: value},
        None: keep) applied; config_flags.ConfigError names a bad or unknown setting."""
        cfg = cls.from_dict(store.get_setting(CONFIG_KEY) or {})
        return with_values(cfg, {k: v for k, v in overrides.items() if v is not None})
