"""The acting side of a policy for rollouts, behind one interface (`Actor`) that the episode
runner (trainer.rollout.runner) plays: a local VLM that answers a chat with its raw text, the generated
token ids and their log-probs (what PPO needs) and takes new weights from the learner (a thin
layer over agent.vlm.model, so rollouts see the model exactly as the agent does); any agent Policy (an
endpoint); the scripted expert (`ExpertActor`, the sandbox's expert or MiniWoB++'s DOM oracle)
and the random policy (`RandomActor`), so expert and random play by the same rules as a model."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from agent import coords
from agent.grammar import format_normalized, parse_normalized
from agent.policies.local import processor_extent
from agent.schema import Action
from agent.vlm.batch import ImageCache, generate_batch
from agent.vlm.model import generate, load_vlm
from trainer.rollout.specs import INFERENCE_DTYPES

Slot = tuple  # the runner's key of an environment slot: (worker, index of the env in the runner's list)


@dataclass
class ActorOutput:
    text: str
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    pointer: list[int] | None = None  # per click site, the element-list entry chosen (agent.vlm.pointer)
    # the prompt the model read (agent.vlm.model.Generation's): a learner scores the turn from these ids
    # instead of tokenizing the chat again; image_keys name its screenshots in order (None: not recorded)
    prompt_ids: list[int] | None = None
    image_keys: list[str] | None = None


class Actor(Protocol):
    """What the episode runner asks of a policy. `generate_batch` answers one chat per slot (each
    the chat of the env at `slots[i]`); an actor that keeps each slot's last turn computes only a
    turn's new tokens. Subclass it for the defaults: chats answered one by one with `generate`, no
    per-episode state, the coordinate extent of the env's own space."""

    def generate(self, messages: list, *, greedy: bool = False) -> ActorOutput: ...

    def generate_batch(self, chats: list, *, greedy: bool = False, slots: list[Slot] | None = None) -> list[ActorOutput]:
        return [self.generate(c, greedy=greedy) for c in chats]

    def start_episode(self, slot: Slot, seed: int) -> None:
        """A new episode (on task seed `seed`) starts in `slot`."""

    def slipped(self, slot: Slot) -> list[int]:
        """The turns of the slot's episode that were injected mistakes (ExpertActor), not to be imitated."""
        return []

    def model_extent(self, width: int, height: int) -> tuple[int, int] | None:
        """The (width, height) the actor's coordinates span for a width x height screenshot, where
        it is not the env's space's own (agent.grammar.parse_reply); None where it is."""
        return None


class VLMActor(Actor):
    """`generate(messages)` answers one chat (agent.vlm.model.generate, batch of one, every screenshot
    encoded again: the sequential path); `generate_batch(chats)` answers many in one batched
    generation, each distinct screenshot preprocessed and encoded once while the weights stay
    (agent.vlm.batch.ImageCache).

    inference_dtype ("fp32" or "bf16"; None: whatever the model is in) says what the model's
    weights must be in; `load` loads them so. A bf16 actor is always a copy of its own: new
    weights (`load_state`, the learner's float32 master weights) are cast into it, never the
    other way round."""

    def __init__(self, model, processor, *, temperature: float = 1.0, max_new_tokens: int = 64,
                 inference_dtype: str | None = None):
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0 for sampling rollouts, got {temperature}")
        if inference_dtype is not None:
            if inference_dtype not in INFERENCE_DTYPES:
                raise ValueError(f"inference_dtype must be one of {INFERENCE_DTYPES}, got {inference_dtype!r}")
            have = str(model.dtype).removeprefix("torch.")
            if have != {"fp32": "float32", "bf16": "bfloat16"}[inference_dtype]:
                raise ValueError(f"inference_dtype {inference_dtype!r}, but the model's weights are {have}: load it "
                                 "in that dtype (VLMActor.load, agent.vlm.model.load_vlm's dtype)")

        self.model, self.processor = model, processor
        self.temperature, self.max_new_tokens = temperature, max_new_tokens
        self.inference_dtype = inference_dtype or ("bf16" if str(model.dtype) == "torch.bfloat16" else "fp32")
        self.cache = ImageCache()

    @classmethod
    def load(cls, model_dir, device: str = "cpu", inference_dtype: str = "fp32", **kw) -> VLMActor:
        if inference_dtype not in INFERENCE_DTYPES:
            raise ValueError(f"inference_dtype must be one of {INFERENCE_DTYPES}, got {inference_dtype!r}")
        model, processor = load_vlm(model_dir, device=device, dtype=inference_dtype)
        return cls(model, processor, inference_dtype=inference_dtype, **kw)

    def generate(self, messages, *, greedy: bool = False) -> ActorOutput:
        g = generate(self.model, self.processor, messages, max_new_tokens=self.max_new_tokens,
                     temperature=0.0 if greedy else self.temperature, details=True)
        # agent.vlm.model.generate never emits vision placeholders, so every reply can be scored again
        return ActorOutput(g.text, list(g.token_ids), list(g.logprobs), g.pointer, g.prompt_ids, g.image_keys)

    def generate_batch(self, chats, *, greedy: bool = False, slots: list | None = None) -> list[ActorOutput]:
        """slots: one key per chat (the environment slot it plays) so each slot's last turn is
        kept and the next turn computes only its new tokens (agent.vlm.batch.generate_batch)."""
        gens = generate_batch(self.model, self.processor, chats, max_new_tokens=self.max_new_tokens,
                              temperature=0.0 if greedy else self.temperature, cache=self.cache, slots=slots)
        return [ActorOutput(g.text, list(g.token_ids), list(g.logprobs), g.pointer, g.prompt_ids, g.image_keys)
                for g in gens]

    def model_extent(self, width: int, height: int) -> tuple[int, int] | None:
        return processor_extent(self.processor, coords.SMART_RESIZE, width, height)

    def load_weights(self, path) -> None:
        from safetensors.torch import load_file

        self.load_state(load_file(str(path)), f"weights {path}")

    def load_state(self, state: dict, name: str = "the published weights") -> None:
        """New weights from a state dict (a file's, or one sent through Ray's object store). They
        are copied into this model's own parameters, each cast to its dtype (a bf16 copy takes the
        learner's float32 weights rounded; the float32 pointer head stays float32), so whoever
        sent them keeps theirs as they were."""
        missing, unexpected = self.model.load_state_dict(state, strict=False)
        if unexpected or [k for k in missing if "lm_head" not in k]:  # lm_head may be tied
            raise RuntimeError(f"{name} do not fit the model: missing {missing[:3]}, unexpected {unexpected[:3]}")
        self.model.eval()
        self.cache.clear_features()  # features of the old vision tower


class PolicyActor(Actor):
    """Any agent Policy (an OpenAI-compatible endpoint, say) as an actor: its raw reply, no token
    ids or log-probs (nothing to train on, everything to evaluate), one chat at a time."""

    def __init__(self, policy):
        self.policy = policy

    def generate(self, messages, *, greedy: bool = True) -> ActorOutput:
        return ActorOutput(self.policy.generate(messages))

    def model_extent(self, width: int, height: int) -> tuple[int, int] | None:
        return self.policy.model_extent(width, height)


def _envs(envs) -> list:
    out = list(envs) if isinstance(envs, (list, tuple)) else [envs]
    if not out:
        raise ValueError("an expert or random actor needs the environments it plays (one per runner slot)")
    return out


class ExpertActor(Actor):
    """The scripted expert behind the actor interface (the sandbox's expert, MiniWoB++'s DOM
    oracle: each env's `expert_response()`), so demonstrations and the expert's measured success
    are prompted, parsed and stepped exactly like the policy's own rollouts. `envs`: the runner's
    environments (or one env), in the runner's order: slot i answers for envs[i].

    With `slip` > 0 each turn may, with that chance and at most once per episode, be a mistake
    instead of the expert's answer (UI-TARS's error-correction data; DART-style noise
    injection): a click at a random point under the expert's thought, or the expert's reply cut
    off so it does not parse. The expert then carries on from the state the slip left (a wrong
    option ticked, a re-ask for a readable answer), so SFT sees how to recover from the states a
    policy's own mistakes lead to, which pure expert demonstrations never visit. The slipped turns
    are listed per slot (`slipped(slot)`, the runner copies them into the Trajectory) and are not
    trained on. Slips are drawn from a generator seeded by (seed, the episode's task seed), so the
    same tickets give the same demonstrations however many envs play them."""

    def __init__(self, envs, *, slip: float = 0.0, seed: int = 0):
        if not 0.0 <= slip <= 1.0:
            raise ValueError(f"slip must be a probability in [0, 1], got {slip}")
        self.envs, self.slip, self.seed = _envs(envs), slip, seed
        self._episodes: dict[int, tuple] = {}  # slot index -> (rng, turn, slipped)

    def start_episode(self, slot: Slot, seed: int) -> None:
        import random

        self._episodes[slot[1]] = (random.Random(f"slip:{self.seed}:{seed}"), [0], [])

    def slipped(self, slot: Slot) -> list[int]:
        return list(self._episodes[slot[1]][2]) if slot[1] in self._episodes else []

    def generate(self, messages, *, greedy: bool = False) -> ActorOutput:
        return self.generate_batch([messages], greedy=greedy, slots=[(-1, 0)])[0]

    def generate_batch(self, chats, *, greedy: bool = False, slots: list[Slot] | None = None) -> list[ActorOutput]:
        keys = slots or [(-1, i) for i in range(len(chats))]
        return [ActorOutput(self._reply(k[1])) for k in keys]

    def _reply(self, i: int) -> str:
        env = self.envs[i]
        if i not in self._episodes:
            self.start_episode((-1, i), 0)
        rng, turn, slipped = self._episodes[i]
        n, turn[0] = turn[0], turn[0] + 1
        if self.slip and not slipped and rng.random() < self.slip:
            slipped.append(n)
            return self._slip_text(env, rng)
        return env.expert_response()

    @staticmethod
    def _slip_text(env, rng) -> str:
        thought, _ = env.expert_action()
        if rng.random() < 0.5:  # a click at a random point, under the thought of the right one
            point = (rng.uniform(0.03, 0.97), rng.uniform(0.03, 0.97))  # normalized, as actions hold them
            return format_normalized(thought, [Action("click", {"start_box": point})], env.coords_space, env.width,
                                     env.height)
        text = env.expert_response()  # cut inside the Action, as a reply that ran out of tokens is
        start = text.find("Action:") + len("Action:")
        for _ in range(8):
            cut = text[: rng.randrange(start, len(text) - 1)]
            if not parse_normalized(cut, env.coords_space, env.width, env.height, platform="sandbox"):
                return cut
        return text[:start]  # "Action:" with nothing after it never parses


class RandomActor(Actor):
    """The random policy behind the actor interface: each reply is one action drawn from the
    env's action space (the sandbox's mix of clicks, drags, scrolls, typing, keys and waits),
    written as UI-TARS text in the env's coordinate space, so the one episode runner plays it
    like any model. A baseline, and a fuzzer for an environment's adapter. Each episode draws
    from a generator seeded by (seed, its task seed): the same tickets, the same actions, however
    many envs play them."""

    def __init__(self, envs, *, seed: int = 0):
        self.envs, self.seed = _envs(envs), seed
        self._spaces: dict[int, object] = {}  # slot index -> the action space drawing its episode

    def start_episode(self, slot: Slot, seed: int) -> None:
        import copy

        space = copy.copy(self.envs[slot[1]].action_space)
        space.seed(self.seed * 1_000_003 + int(seed))
        self._spaces[slot[1]] = space

    def generate(self, messages, *, greedy: bool = False) -> ActorOutput:
        return self.generate_batch([messages], greedy=greedy, slots=[(-1, 0)])[0]

    def generate_batch(self, chats, *, greedy: bool = False, slots: list[Slot] | None = None) -> list[ActorOutput]:
        out = []
        for k in slots or [(-1, i) for i in range(len(chats))]:
            env = self.envs[k[1]]
            if k[1] not in self._spaces:
                self.start_episode(k, 0)
            action = self._spaces[k[1]].sample()
            out.append(ActorOutput(format_normalized("", [action], env.coords_space, env.width, env.height)))
        return out
