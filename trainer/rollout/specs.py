"""What a rollout worker is made of, as typed, frozen, picklable values: the environment it plays
(EnvSpec), its policy copy's sampling (ActorSpec), the agent's memory (MemorySpec) and the episode
rules (EpisodeSpec). They travel from the PPO loop through both rollout pools to a worker process
or a Ray actor as they are, and each checks itself when made, so a bad setting is named where it
is written, not three layers down where a keyword dict meets a constructor."""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from agent import coords
from agent.policies.memory import Memory
from trainer.errors import TrainerError
from trainer.sandbox.env import OBSERVATIONS, SPLITS
from trainer.sandbox.games import registry
from trainer.sandbox.games.spec import HEIGHT as GAME_HEIGHT
from trainer.sandbox.games.spec import REWARD_SCALES
from trainer.sandbox.games.spec import WIDTH as GAME_WIDTH


class SpecError(TrainerError, ValueError):
    """A worker spec's field holds a value its component cannot use; the message names the field."""


def _kwargs(spec) -> dict:
    return {f.name: getattr(spec, f.name) for f in fields(spec)}


# the dtypes a rollout or evaluation copy of the policy may run in (the learner's master weights stay float32)
INFERENCE_DTYPES = ("fp32", "bf16")


@dataclass(frozen=True)
class EnvSpec:
    """trainer.sandbox.env.SandboxEnv's settings (every env of every worker is made from one)."""
    width: int = 320
    height: int = 240
    families: tuple[str, ...] | None = None  # None: every family
    split: str = "train"
    max_steps: int | None = None  # None: each task's own limit
    coords_space: str = coords.SMART_RESIZE
    observation: str = "elements"
    tools: bool = False  # the terminal and file tools over a workspace per episode, beside the GUI

    def __post_init__(self):
        if self.width < 1 or self.height < 1:
            raise SpecError(f"EnvSpec.width and .height must be positive, got {self.width}x{self.height}")
        if self.families is not None:
            object.__setattr__(self, "families", tuple(self.families))  # a list from a caller stays hashable
        if self.split not in SPLITS:
            raise SpecError(f"EnvSpec.split must be one of {SPLITS}, got {self.split!r}")
        if self.max_steps is not None and self.max_steps < 1:
            raise SpecError(f"EnvSpec.max_steps must be at least 1 (or None), got {self.max_steps}")
        if self.observation not in OBSERVATIONS:
            raise SpecError(f"EnvSpec.observation must be one of {OBSERVATIONS}, got {self.observation!r}")
        if not isinstance(self.tools, bool):
            raise SpecError(f"EnvSpec.tools must be True or False, got {self.tools!r}")

    def kwargs(self) -> dict:
        """SandboxEnv's (and trainer.sandbox.env_process.make_envs's) keyword arguments."""
        out = _kwargs(self)
        out["families"] = list(self.families) if self.families is not None else None
        return out


@dataclass(frozen=True)
class ActorSpec:
    """A worker's policy copy (trainer.rollout.actors.VLMActor): how it samples, and the dtype its
    weights are held in (the learner publishes float32 weights; a bf16 copy takes them cast)."""
    temperature: float = 1.0
    max_new_tokens: int = 64
    inference_dtype: str = "fp32"

    def __post_init__(self):
        if not self.temperature > 0:
            raise SpecError(f"ActorSpec.temperature must be > 0 for sampling rollouts, got {self.temperature}")
        if self.max_new_tokens < 1:
            raise SpecError(f"ActorSpec.max_new_tokens must be at least 1, got {self.max_new_tokens}")
        if self.inference_dtype not in INFERENCE_DTYPES:
            raise SpecError(f"ActorSpec.inference_dtype must be one of {INFERENCE_DTYPES}, got {self.inference_dtype!r}")

    def kwargs(self) -> dict:
        return asdict(self)


_HISTORY_VIEWS = ("auto", "screenshots")


@dataclass(frozen=True)
class MemorySpec:
    """The agent's hierarchical memory (agent.policies.memory.Memory) per episode; the defaults are Memory's."""
    working_steps: int = Memory.working_steps
    token_budget: int = Memory.token_budget
    note_limit: int = Memory.note_limit
    history_view: str = Memory.history_view

    def __post_init__(self):
        for name in ("working_steps", "token_budget", "note_limit"):
            if getattr(self, name) < 0:
                raise SpecError(f"MemorySpec.{name} must be >= 0, got {getattr(self, name)}")
        if self.history_view not in _HISTORY_VIEWS:
            raise SpecError(f"MemorySpec.history_view must be one of {_HISTORY_VIEWS}, got {self.history_view!r}")

    def kwargs(self) -> dict:
        """Memory's keyword arguments (trainer.rollout.runner.EpisodeRunner's memory_kw)."""
        return _kwargs(self)


@dataclass(frozen=True)
class EpisodeSpec:
    """The episode rules a worker's trainer.rollout.runner.EpisodeRunner plays by."""
    end_on_parse_error: bool = False  # a reply that does not parse ends the episode (no re-ask)
    platform: str = "desktop"  # the prompt's platform (agent.policies.build_prompt)

    def kwargs(self) -> dict:
        """EpisodeRunner's keyword arguments."""
        return _kwargs(self)


@dataclass(frozen=True)
class GameEnvSpec(EnvSpec):
    """trainer.sandbox.games.env.GameEnv's settings: what rollout workers play for `train ppo --suite
    games` (trainer.sandbox.env_process.make_envs makes GameEnvs from its kwargs, one Chromium each).
    The screen is the games' canvas; `families` is unused (the tickets name "games/<name>");
    reward_scale "reference": a step's reward is the score gained over the game's reference mean
    (norms.json), so a reference player's episode earns 1 whatever the game's raw scale."""
    width: int = GAME_WIDTH
    height: int = GAME_HEIGHT
    observation: str = "pixels"
    games: tuple[str, ...] = ()
    reward_scale: str = "reference"

    def __post_init__(self):
        super().__post_init__()

        object.__setattr__(self, "games", tuple(self.games))
        if not self.games:
            raise SpecError("GameEnvSpec.games must name at least one game")
        try:
            specs = [registry.game(g) for g in self.games]
        except registry.GameError as e:
            raise SpecError(f"GameEnvSpec.games: {e}") from None
        object.__setattr__(self, "games", tuple(s.name for s in specs))  # 'games/snake' -> 'snake'
        wrong = [s.name for s in specs if (s.width, s.height) != (self.width, self.height)]
        if wrong:
            raise SpecError(f"GameEnvSpec.width x height is {self.width}x{self.height}, but the canvas of "
                            f"{', '.join(wrong)} is not")
        if self.reward_scale not in REWARD_SCALES:
            raise SpecError(f"GameEnvSpec.reward_scale must be one of {REWARD_SCALES}, got {self.reward_scale!r}")

    def kwargs(self) -> dict:
        """GameEnv's keyword arguments (the key "games" tells make_envs to make GameEnvs)."""
        return {"games": list(self.games), "max_steps": self.max_steps, "observation": self.observation,
                "coords_space": self.coords_space, "reward_scale": self.reward_scale}
