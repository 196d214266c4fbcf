"""The acting side of a policy for rollouts: a local VLM that answers a chat with its raw text,
the generated token ids and their log-probs (what PPO needs), and takes new weights from the
learner. A thin layer over agent.vlm, so rollouts see the model exactly as the agent does."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ActorOutput:
    text: str
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    pointer: list[int] | None = None  # per click site, the element-list entry chosen (agent.pointer)
    # the prompt the model read (agent.vlm.Generation's): a learner scores the turn from these ids
    # instead of tokenizing the chat again; image_keys name its screenshots in order (None: not recorded)
    prompt_ids: list[int] | None = None
    image_keys: list[str] | None = None


class VLMActor:
    """`generate(messages)` answers one chat (agent.vlm.generate, batch of one, every screenshot
    encoded again: the sequential path); `generate_batch(chats)` answers many in one batched
    generation, each distinct screenshot preprocessed and encoded once while the weights stay
    (agent.vlm_batch.ImageCache)."""

    def __init__(self, model, processor, *, temperature: float = 1.0, max_new_tokens: int = 64):
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0 for sampling rollouts, got {temperature}")
        from agent.vlm_batch import ImageCache

        self.model, self.processor = model, processor
        self.temperature, self.max_new_tokens = temperature, max_new_tokens
        self.cache = ImageCache()

    @classmethod
    def load(cls, model_dir, device: str = "cpu", **kw) -> VLMActor:
        from agent.vlm import load_vlm

        model, processor = load_vlm(model_dir, device=device)
        return cls(model, processor, **kw)

    def generate(self, messages, *, greedy: bool = False) -> ActorOutput:
        from agent.vlm import generate

        g = generate(self.model, self.processor, messages, max_new_tokens=self.max_new_tokens,
                     temperature=0.0 if greedy else self.temperature, details=True)
        # agent.vlm.generate never emits vision placeholders, so every reply can be scored again
        return ActorOutput(g.text, list(g.token_ids), list(g.logprobs), g.pointer, g.prompt_ids, g.image_keys)

    def generate_batch(self, chats, *, greedy: bool = False, slots: list | None = None) -> list[ActorOutput]:
        """slots: one key per chat (the environment slot it plays) so each slot's last turn is
        kept and the next turn computes only its new tokens (agent.vlm_batch.generate_batch)."""
        from agent.vlm_batch import generate_batch

        gens = generate_batch(self.model, self.processor, chats, max_new_tokens=self.max_new_tokens,
                              temperature=0.0 if greedy else self.temperature, cache=self.cache, slots=slots)
        return [ActorOutput(g.text, list(g.token_ids), list(g.logprobs), g.pointer, g.prompt_ids, g.image_keys)
                for g in gens]

    def load_weights(self, path) -> None:
        from safetensors.torch import load_file

        self.load_state(load_file(str(path)), f"weights {path}")

    def load_state(self, state: dict, name: str = "the published weights") -> None:
        """New weights from a state dict (a file's, or one sent through Ray's object store)."""
        missing, unexpected = self.model.load_state_dict(state, strict=False)
        if unexpected or [k for k in missing if "lm_head" not in k]:  # lm_head may be tied
            raise RuntimeError(f"{name} do not fit the model: missing {missing[:3]}, unexpected {unexpected[:3]}")
        self.model.eval()
        self.cache.clear_features()  # features of the old vision tower


class PolicyActor:
    """Any agent Policy (an OpenAI-compatible endpoint, say) as an actor: its raw reply, no token
    ids or log-probs (nothing to train on, everything to evaluate), one chat at a time."""

    def __init__(self, policy):
        self.policy = policy

    def generate(self, messages, *, greedy: bool = True) -> ActorOutput:
        return ActorOutput(self.policy.generate(messages))


class RandomActor:
    """The random policy behind the actor interface: each reply is one action drawn from
    `env.action_space` (the sandbox's mix of clicks, drags, scrolls, typing, keys and waits),
    written as UI-TARS text in the env's coordinate space, so the one episode runner plays it
    like any model. A baseline, and a fuzzer for an environment's adapter."""

    def __init__(self, env, *, seed: int = 0):
        self.env = env
        env.action_space.seed(seed)

    def generate(self, messages, *, greedy: bool = False) -> ActorOutput:
        from agent.grammar import format_normalized

        env = self.env
        action = env.action_space.sample()
        return ActorOutput(format_normalized("", [action], env.coords_space, env.width, env.height))
